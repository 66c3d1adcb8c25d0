/*
 * video_frames.c — a video's frames planned and turned into pixel_values_videos rows
 * (contract and reference pipeline: mml/video_frames.h).
 *
 * Per frame, in order (the last listed frame again for the padding frame): decode (the
 * qwen-vl-utils route's to_rgb: RGBA pasted onto white), Pillow-exact bicubic to the
 * fetch_image size (byte planes, no interleaved copy; written from the bytes when no
 * step resizes further, else widened to float32 planes, into which a video file's RGB24
 * frame is split too), then torch's antialiased bicubic on the floats when the video budget or the processor changes the size (video_resize.c; the budget step is
 * rounded back to integers as torchvision's resize of a uint8 video does), then
 * (x - m) / s with m = float(mean * 255), s = float(std * 255) as the torchvision backend
 * fuses rescale and normalise, scattered straight into the rows of the frame's temporal
 * patch in the pixel format (bfloat16: that value rounded; uint8: the integral values
 * before normalising, which exist only when the processor keeps the size).  Only one
 * frame is alive at a time, whatever the frame count.  The tail from the qwen-vl-utils
 * size on (mml_video_frame_write) is shared with video files.
 *
 * Threads: the scratch belongs to one worker; the cfg is shared and immutable.
 */
#include "mml/video_frames.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mml/image.h"
#include "mml/video_resize.h"
#include "../vision/resize.h" /* mml_cpu_avx2 */
#include "mml/video_sample.h"

struct mml_video_scratch {
  mml_decoder *dec;
  float *a, *b;               /* float planes up to the qwen-vl-utils size */
  float *d;                   /* float planes after the processor's resize */
  size_t a_cap, b_cap, d_cap; /* in floats */
  uint8_t *u;                 /* a listed frame's byte planes at the fetch_image size */
  size_t u_cap;
  mml_vision_scratch *vs; /* recipe llama-factory: its Pillow frame resizes (made when needed) */
  uint8_t *lf, *lf2;      /* and their result (interleaved) / the processor's (planes) */
  size_t lf_cap, lf2_cap;
};

mml_status mml_video_scratch_new(mml_video_scratch **out) {
  mml_video_scratch *s = calloc(1, sizeof *s);
  if (!s || mml_decoder_new(&s->dec) != MML_OK) {
    free(s);
    return MML_ENOMEM;
  }
  *out = s;
  return MML_OK;
}

void mml_video_scratch_free(mml_video_scratch *s) {
  if (!s) return;
  mml_decoder_free(s->dec);
  free(s->a);
  free(s->b);
  free(s->d);
  free(s->u);
  mml_vision_scratch_free(s->vs);
  free(s->lf);
  free(s->lf2);
  free(s);
}

static mml_status fit(float **p, size_t *cap, size_t n, mml_err *err) {
  if (n <= *cap) return MML_OK;
  float *q = realloc(*p, n * sizeof *q);
  if (!q) return mml_err_set(err, MML_ENOMEM, "video: out of memory for %zu floats", n);
  *p = q;
  *cap = n;
  return MML_OK;
}

/* Qwen3VLVideoProcessor's smart_resize (frames enter the budget). */
static mml_status qwen3_resize(int64_t t, int height, int width, int tf, int factor,
                               int64_t min_pixels, int64_t max_pixels, int *oh, int *ow,
                               mml_err *err) {
  if (t < tf)
    return mml_err_set(err, MML_ERECORD, "video: %lld frames, fewer than %d", (long long)t, tf);
  double H = height, W = width, f = factor;
  if (height < factor || width < factor) {
    double sc = fmax(f / H, f / W);
    H = (double)(int64_t)(H * sc);
    W = (double)(int64_t)(W * sc);
  }
  if (fmax(H, W) / fmin(H, W) > 200)
    return mml_err_set(err, MML_EASPECT, "absolute aspect ratio must be smaller than 200, got %g",
                       fmax(H, W) / fmin(H, W));
  double h = nearbyint(H / f) * f, w = nearbyint(W / f) * f;
  double tb = nearbyint((double)t / tf) * tf;
  if (tb * h * w > (double)max_pixels) {
    double beta = sqrt((double)t * H * W / (double)max_pixels);
    h = fmax(f, floor(H / beta / f) * f);
    w = fmax(f, floor(W / beta / f) * f);
  } else if (tb * h * w < (double)min_pixels) {
    double beta = sqrt((double)min_pixels / ((double)t * H * W));
    h = ceil(H * beta / f) * f;
    w = ceil(W * beta / f) * f;
  }
  if (!(h >= f && w >= f) || h > (1 << 30) || w > (1 << 30))
    return mml_err_set(err, MML_EINVAL, "video: %dx%d resizes to %.0fx%.0f", width, height, w, h);
  *oh = (int)h;
  *ow = (int)w;
  return MML_OK;
}

/* The processor's resize of the qwen-vl-utils-sized video, then the grid. */
static mml_status plan_finish(const mml_vision_cfg *cfg, mml_video_plan *p, mml_err *err) {
  const int f = cfg->patch_size * cfg->merge_size, T = cfg->temporal_patch_size;
  const int M = cfg->merge_size;
  mml_status st =
      cfg->video_family == MML_VIDEO_QWEN3
          ? qwen3_resize(p->nframes, p->qvu_h, p->qvu_w, T, f, cfg->video_min_pixels,
                         cfg->video_max_pixels, &p->dst_h, &p->dst_w, err)
          : mml_smart_resize(p->qvu_h, p->qvu_w, f, cfg->video_min_pixels, cfg->video_max_pixels,
                             MML_RESIZE_TRANSFORMERS, &p->dst_h, &p->dst_w, err);
  if (st) return st;
  if (cfg->pixel_format == MML_PIXEL_UINT8 && (p->dst_w != p->qvu_w || p->dst_h != p->qvu_h))
    return mml_err_set(err, MML_EVIDEO,
                       "pixel_format=uint8 cannot hold this video: the processor resizes its "
                       "%dx%d frames to %dx%d, whose values are not bytes (use float32 or "
                       "bfloat16, or video limits that keep the size)",
                       p->qvu_w, p->qvu_h, p->dst_w, p->dst_h);
  p->grid_t = (int)((p->nframes + T - 1) / T);
  p->grid_h = p->dst_h / cfg->patch_size;
  p->grid_w = p->dst_w / cfg->patch_size;
  p->rows = (int64_t)p->grid_t * p->grid_h * p->grid_w;
  p->group_tokens = (int64_t)p->grid_h * p->grid_w / (M * M);
  p->tokens = p->group_tokens * p->grid_t;
  p->second_per_grid = (float)((double)T / p->sample_fps);
  return MML_OK;
}

/* Frame j of a frame list: its header, within max_image_pixels. */
static mml_status probe_frame(const mml_vision_cfg *cfg, const mml_bytes *frames, int j,
                              mml_image_info *info, mml_err *err) {
  mml_status st = mml_image_probe(frames[j].data, frames[j].len, info, err);
  if (st) return mml_err_prefix(err, "frame %d", j), st;
  if (cfg->max_image_pixels > 0 && (int64_t)info->width * info->height > cfg->max_image_pixels)
    return mml_err_set(err, MML_ETOOBIG, "frame %d: %dx%d is above max_image_pixels=%lld", j,
                       info->width, info->height, (long long)cfg->max_image_pixels);
  return MML_OK;
}

/* recipe="llama-factory", a frame list (its Qwen2VLPlugin._regularize_videos of nested
 * images): every listed frame (no sampling, no video_maxlen), the last repeated to an even
 * count, each read and pre-resized as its images are (mode rules included) within
 * video_max/min_pixels, then the processor's resize as for its video files.  Its fps is
 * video_fps (second_per_grid_ts 2 / video_fps; Qwen3-VL timestamps at indices 0..n-1 over
 * video_fps).  The frames must share one size (its processor stacks them). */
static mml_status lf_plan_list(const mml_vision_cfg *cfg, const mml_video_ref *v,
                               const mml_bytes *frames, mml_video_plan *p, double *ts,
                               mml_err *err) {
  const int64_t n = v->nframes;
  if (n < 1) return mml_err_set(err, MML_ERECORD, "bad record: a video of no frames");
  for (int j = 0; j < v->nframes; j++) {
    mml_image_info info;
    mml_status st = probe_frame(cfg, frames, j, &info, err);
    if (st) return st;
    if (j == 0) {
      p->src_w = p->list_w = info.width;
      p->src_h = p->list_h = info.height;
    } else if (info.width != p->src_w || info.height != p->src_h) {
      return mml_err_set(err, MML_ERECORD,
                         "bad record: frame %d is %dx%d, frame 0 %dx%d (LLaMA-Factory's processor "
                         "stacks a video's frames: one size)",
                         j, info.width, info.height, p->src_w, p->src_h);
    }
  }
  mml_status st = mml_lf_pre_sizes(p->src_w, p->src_h, cfg->lf_video_max_pixels,
                                   cfg->lf_video_min_pixels, &p->lf_pre_n, &p->lf_pre_cap,
                                   p->lf_pre_w, p->lf_pre_h, &p->qvu_w, &p->qvu_h, err);
  if (st) return st;
  p->lf = 1;
  p->listed = n;
  p->nframes = n + (n & 1);
  p->smp.n = n;
  p->fps = p->sample_fps = cfg->lf_video_fps; /* its fps_per_video */
  if ((st = plan_finish(cfg, p, err))) return st;
  p->src_pixels = n * (int64_t)p->src_w * p->src_h;
  if (ts && cfg->video_family == MML_VIDEO_QWEN3) { /* its frames_indices: range(n) */
    int64_t *idx = malloc((size_t)n * sizeof *idx);
    if (!idx)
      return mml_err_set(err, MML_ENOMEM, "video: out of memory for %lld frame indices",
                         (long long)n);
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    mml_video_timestamps(idx, n, cfg->lf_video_fps, cfg->merge_size, ts);
    free(idx);
  }
  return MML_OK;
}

mml_status mml_video_plan_list(const mml_vision_cfg *cfg, const mml_video_ref *v,
                               const mml_bytes *frames, mml_video_plan *p, double *ts,
                               mml_err *err) {
  memset(p, 0, sizeof *p);
  if (cfg->lf) return lf_plan_list(cfg, v, frames, p, ts, err);
  const int f = cfg->patch_size * cfg->merge_size;
  p->listed = v->nframes;
  for (int j = 0; j < v->nframes; j++) {
    mml_image_info info;
    mml_status st = probe_frame(cfg, frames, j, &info, err);
    if (st) return st;
    int lh, lw;
    if ((st = mml_video_list_frame_size(&v->keys, f, info.height, info.width, &lh, &lw, err)))
      return mml_err_prefix(err, "frame %d", j), st;
    if (j == 0) {
      p->src_w = info.width, p->src_h = info.height, p->list_w = lw, p->list_h = lh;
    } else if (info.width != p->src_w || info.height != p->src_h) {
      /* sizes after fetch_image must agree for torch.stack; equal sources are required
       * here because each frame's pixels are resized from its own size */
      if (lw != p->list_w || lh != p->list_h)
        return mml_err_set(err, MML_ERECORD,
                           "bad record: frame %d resizes to %dx%d but frame 0 to %dx%d "
                           "(qwen-vl-utils cannot stack them)",
                           j, lw, lh, p->list_w, p->list_h);
    }
    p->src_pixels += (int64_t)info.width * info.height;
  }
  p->nframes = (v->nframes + 1) / 2 * 2; /* ceil_by_factor(len, FRAME_FACTOR) */
  mml_status st = mml_video_frame_size(&v->keys, f, p->nframes, p->list_h, p->list_w, &p->qvu_h,
                                       &p->qvu_w, err);
  if (st) return st;
  /* qwen-vl-utils' fake metadata: fps = raw_fps, frames_indices = range(nframes),
   * total_num_frames = nframes / sample_fps * raw_fps; the processor's sampled_fps is
   * len(frames_indices) / total_num_frames * fps */
  double sfps = v->keys.sample_fps > 0 ? v->keys.sample_fps : MML_VIDEO_FPS;
  p->fps = v->keys.raw_fps > 0 ? v->keys.raw_fps : sfps;
  double total = (double)p->nframes / sfps * p->fps;
  p->sample_fps = (double)p->nframes / total * p->fps;
  if ((st = plan_finish(cfg, p, err))) return st;
  if (ts) {
    const int T = cfg->temporal_patch_size;
    for (int g = 0; g < p->grid_t; g++) { /* frames_indices = range(nframes) */
      int64_t a = (int64_t)g * T, b = a + T - 1 < p->nframes ? a + T - 1 : p->nframes - 1;
      ts[g] = ((double)a / p->fps + (double)b / p->fps) / 2;
    }
  }
  return MML_OK;
}

/* float32 -> bfloat16, round to nearest even (the values are finite). */
static uint16_t bf16_rne(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* Scatters frame k (float planes, dst size) into its temporal slot of `out`: ROW(o, sr, c)
 * writes the P values of one patch row, o[px] from sr[px] of channel c. */
#define SCATTER(TYPE, ROW) SCATTER_SRC(float, TYPE, ROW)
#define SCATTER_SRC(STYPE, TYPE, ROW)                                      \
  do {                                                                     \
    TYPE *base = (TYPE *)out + (size_t)g * p->grid_h * p->grid_w * cols;   \
    for (int bh = 0; bh < bh_n; bh++)                                      \
      for (int bw = 0; bw < bw_n; bw++)                                    \
        for (int mh = 0; mh < M; mh++)                                     \
          for (int mw = 0; mw < M; mw++) {                                 \
            size_t row = (((size_t)bh * bw_n + bw) * M + mh) * M + mw;     \
            TYPE *r = base + row * cols;                                   \
            int y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;            \
            for (int c = 0; c < 3; c++) {                                  \
              TYPE *o = r + ((size_t)c * T + t) * P * P;                   \
              const STYPE *src = planes + c * plane;                       \
              for (int py = 0; py < P; py++) {                             \
                const STYPE *sr = src + (size_t)(y0 + py) * p->dst_w + x0; \
                ROW((o + py * P), sr, c);                                  \
              }                                                            \
            }                                                              \
          }                                                                \
  } while (0)

#define NORM(x, c) (((x)-m[c]) / s[c])
/* one patch row, value by value */
#define EACH(o, sr, c, VALUE) \
  for (int px = 0; px < P; px++) (o)[px] = VALUE((sr)[px], c)
#define ROW_NORM(o, sr, c) EACH(o, sr, c, NORM)
#define ROW_NORM16(o, sr, c) EACH(o, sr, c, NORM16)
#define ROW_LUT32(o, sr, c) EACH(o, sr, c, LUT32)
#define ROW_LUT16(o, sr, c) EACH(o, sr, c, LUT16)
#define ROW_BYTE(o, sr, c) EACH(o, sr, c, BYTE)
#define NORM16(x, c) bf16_rne(NORM(x, c))
/* integral values in [0, 255] (no processor resize): the same quotients from a table */
#define LUT32(x, c) lut[c][(int)(x)]
#define LUT16(x, c) lut16[c][(int)(x)]
#define BYTE(x, c) ((uint8_t)(x)) /* integral in [0, 255]: the plan refuses other uint8 videos */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MML_SCATTER_AVX2 1
#define AVX2FN __attribute__((target("avx2")))

/* The same values 8 at a time (IEEE subtract and divide per lane; bfloat16 rounding and
 * byte conversion as the scalar code does them).  A row of P >= 8 values is covered by
 * vectors at 0, 8, ... and one ending at P (overlapping: it writes the same values). */
#define VROW(o, sr, c, STORE8)                                             \
  do {                                                                     \
    for (int px = 0; px + 8 <= P; px += 8) STORE8((o) + px, (sr) + px, c); \
    if (P % 8) STORE8((o) + P - 8, (sr) + P - 8, c);                       \
  } while (0)

AVX2FN static inline __m256 norm8(const float *x, __m256 m, __m256 s) {
  return _mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(x), m), s);
}

AVX2FN static inline __m128i bf16x8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v), one = _mm256_set1_epi32(1);
  __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)),
                               _mm256_and_si256(_mm256_srli_epi32(u, 16), one));
  r = _mm256_srli_epi32(r, 16);
  r = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(r);
}

AVX2FN static inline __m128i bytes8(const float *x) {
  __m256i r = _mm256_cvttps_epi32(_mm256_loadu_ps(x));
  r = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  __m128i h = _mm256_castsi256_si128(r);
  return _mm_packus_epi16(h, h);
}

#define F32_8(o, x, c) _mm256_storeu_ps((o), norm8((x), vm[c], vs[c]))
#define BF16_8(o, x, c) _mm_storeu_si128((__m128i *)(o), bf16x8(norm8((x), vm[c], vs[c])))
#define U8_8(o, x, c) _mm_storel_epi64((__m128i *)(o), bytes8(x))
#define VROW_F32(o, sr, c) VROW(o, sr, c, F32_8)
#define VROW_BF16(o, sr, c) VROW(o, sr, c, BF16_8)
#define VROW_U8(o, sr, c) VROW(o, sr, c, U8_8)

/* The same from byte planes: 8 bytes widened to the floats the float planes would hold. */
AVX2FN static inline __m256 norm8b(const uint8_t *x, __m256 m, __m256 s) {
  __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)x)));
  return _mm256_div_ps(_mm256_sub_ps(v, m), s);
}
#define F32B_8(o, x, c) _mm256_storeu_ps((o), norm8b((x), vm[c], vs[c]))
#define BF16B_8(o, x, c) _mm_storeu_si128((__m128i *)(o), bf16x8(norm8b((x), vm[c], vs[c])))
#define U8B_8(o, x, c) _mm_storel_epi64((__m128i *)(o), _mm_loadl_epi64((const __m128i *)(x)))
#define VROW_F32B(o, sr, c) VROW(o, sr, c, F32B_8)
#define VROW_BF16B(o, sr, c) VROW(o, sr, c, BF16B_8)
#define VROW_U8B(o, sr, c) VROW(o, sr, c, U8B_8)

/* scatter() below for P >= 8 on AVX2 CPUs: the same values. */
AVX2FN static void scatter_avx2(const mml_vision_cfg *cfg, const mml_video_plan *p,
                                const float *planes, int64_t g, int64_t t, const float *m,
                                const float *s, void *out) {
  const int P = cfg->patch_size, M = cfg->merge_size, T = cfg->temporal_patch_size;
  const size_t cols = (size_t)mml_vision_video_cols(cfg);
  const int bh_n = p->grid_h / M, bw_n = p->grid_w / M;
  const size_t plane = (size_t)p->dst_w * p->dst_h;
  __m256 vm[3], vs[3];
  for (int c = 0; c < 3; c++) vm[c] = _mm256_set1_ps(m[c]), vs[c] = _mm256_set1_ps(s[c]);
  if (cfg->pixel_format == MML_PIXEL_UINT8)
    SCATTER(uint8_t, VROW_U8);
  else if (cfg->pixel_format == MML_PIXEL_BFLOAT16)
    SCATTER(uint16_t, VROW_BF16);
  else
    SCATTER(float, VROW_F32);
}

/* scatter_bytes() below for P >= 8 on AVX2 CPUs: the same values. */
AVX2FN static void scatter_bytes_avx2(const mml_vision_cfg *cfg, const mml_video_plan *p,
                                      const uint8_t *planes, int64_t g, int64_t t, const float *m,
                                      const float *s, void *out) {
  const int P = cfg->patch_size, M = cfg->merge_size, T = cfg->temporal_patch_size;
  const size_t cols = (size_t)mml_vision_video_cols(cfg);
  const int bh_n = p->grid_h / M, bw_n = p->grid_w / M;
  const size_t plane = (size_t)p->dst_w * p->dst_h;
  __m256 vm[3], vs[3];
  for (int c = 0; c < 3; c++) vm[c] = _mm256_set1_ps(m[c]), vs[c] = _mm256_set1_ps(s[c]);
  if (cfg->pixel_format == MML_PIXEL_UINT8)
    SCATTER_SRC(uint8_t, uint8_t, VROW_U8B);
  else if (cfg->pixel_format == MML_PIXEL_BFLOAT16)
    SCATTER_SRC(uint8_t, uint16_t, VROW_BF16B);
  else
    SCATTER_SRC(uint8_t, float, VROW_F32B);
}
#endif

/* Normalises one frame (float planes, dst size) into its temporal slot of `out` in
 * cfg->pixel_format: (x - m) / s in float32 (the torchvision backend's fused rescale and
 * normalise, m = float32(mean) * 255, s = float32(std) * 255), that value rounded to
 * bfloat16, or the integral value itself as a byte. */
static void scatter(const mml_vision_cfg *cfg, const mml_video_plan *p, const float *planes,
                    int64_t k, void *out) {
  const int P = cfg->patch_size, M = cfg->merge_size, T = cfg->temporal_patch_size;
  const size_t cols = (size_t)mml_vision_video_cols(cfg);
  const int64_t g = k / T, t = k % T;
  const int bh_n = p->grid_h / M, bw_n = p->grid_w / M;
  const size_t plane = (size_t)p->dst_w * p->dst_h;
  float m[3], s[3];
  for (int c = 0; c < 3; c++) { /* torch: float32 tensors of mean / std times 255.0 */
    m[c] = cfg->mean[c] * 255.0f;
    s[c] = cfg->std[c] * 255.0f;
  }
#ifdef MML_SCATTER_AVX2
  if (P >= 8 && mml_cpu_avx2()) {
    scatter_avx2(cfg, p, planes, g, t, m, s, out);
    return;
  }
#endif
  if (cfg->pixel_format == MML_PIXEL_UINT8) {
    SCATTER(uint8_t, ROW_BYTE);
    return;
  }
  if (p->dst_w != p->qvu_w || p->dst_h != p->qvu_h) { /* resized: values between the bytes */
    if (cfg->pixel_format == MML_PIXEL_BFLOAT16)
      SCATTER(uint16_t, ROW_NORM16);
    else
      SCATTER(float, ROW_NORM);
    return;
  }
  float lut[3][256];
  uint16_t lut16[3][256];
  for (int c = 0; c < 3; c++)
    for (int v = 0; v < 256; v++) {
      lut[c][v] = NORM((float)v, c);
      lut16[c][v] = bf16_rne(lut[c][v]);
    }
  if (cfg->pixel_format == MML_PIXEL_BFLOAT16)
    SCATTER(uint16_t, ROW_LUT16);
  else
    SCATTER(float, ROW_LUT32);
}
/* scatter() of a frame the processor does not resize, from its byte planes (the values
 * the float planes would hold): the same output. */
static void scatter_bytes(const mml_vision_cfg *cfg, const mml_video_plan *p, const uint8_t *planes,
                          int64_t k, void *out) {
  const int P = cfg->patch_size, M = cfg->merge_size, T = cfg->temporal_patch_size;
  const size_t cols = (size_t)mml_vision_video_cols(cfg);
  const int64_t g = k / T, t = k % T;
  const int bh_n = p->grid_h / M, bw_n = p->grid_w / M;
  const size_t plane = (size_t)p->dst_w * p->dst_h;
  float m[3], s[3];
  for (int c = 0; c < 3; c++) {
    m[c] = cfg->mean[c] * 255.0f;
    s[c] = cfg->std[c] * 255.0f;
  }
#ifdef MML_SCATTER_AVX2
  if (P >= 8 && mml_cpu_avx2()) {
    scatter_bytes_avx2(cfg, p, planes, g, t, m, s, out);
    return;
  }
#endif
  if (cfg->pixel_format == MML_PIXEL_UINT8) {
    SCATTER_SRC(uint8_t, uint8_t, ROW_BYTE);
    return;
  }
  float lut[3][256];
  uint16_t lut16[3][256];
  for (int c = 0; c < 3; c++)
    for (int v = 0; v < 256; v++) {
      lut[c][v] = NORM((float)v, c);
      lut16[c][v] = bf16_rne(lut[c][v]);
    }
  if (cfg->pixel_format == MML_PIXEL_BFLOAT16)
    SCATTER_SRC(uint8_t, uint16_t, ROW_LUT16);
  else
    SCATTER_SRC(uint8_t, float, ROW_LUT32);
}
#undef SCATTER_SRC
#undef SCATTER
#undef NORM
#undef NORM16
#undef LUT32
#undef LUT16
#undef BYTE

mml_status mml_video_frame_write(const mml_vision_cfg *cfg, mml_video_scratch *s,
                                 const mml_video_plan *p, const float *planes, int64_t k, void *out,
                                 mml_err *err) {
  if (k < 0 || k >= p->nframes)
    return mml_err_set(err, MML_EINVAL, "video: frame %lld of %lld", (long long)k,
                       (long long)p->nframes);
  if (p->dst_w != p->qvu_w || p->dst_h != p->qvu_h) { /* the processor's own resize */
    mml_status st = fit(&s->d, &s->d_cap, (size_t)3 * p->dst_w * p->dst_h, err);
    if (!st)
      st = mml_resize_aa_bicubic_f32(planes, 3, p->qvu_w, p->qvu_h, s->d, p->dst_w, p->dst_h, err);
    if (st) return st;
    planes = s->d;
  }
  scatter(cfg, p, planes, k, out);
  return MML_OK;
}

/* Room for the float planes of every step of one frame. */
static mml_status planes_fit(mml_video_scratch *s, const mml_video_plan *p, mml_err *err) {
  const size_t lpx = (size_t)p->list_w * p->list_h, qpx = (size_t)p->qvu_w * p->qvu_h,
               dpx = (size_t)p->dst_w * p->dst_h;
  size_t big = lpx > qpx ? lpx : qpx;
  if (dpx > big) big = dpx;
  mml_status st = fit(&s->a, &s->a_cap, 3 * big, err);
  return st ? st : fit(&s->b, &s->b_cap, 3 * big, err);
}

/* One frame as float planes of list_w x list_h in s->a from there on: fetch_video's budget
 * resize (rounded back to integers, as torchvision resizes a uint8 video), the
 * processor's resize, then its rows of temporal slot k. */
static mml_status planes_tail(const mml_vision_cfg *cfg, mml_video_scratch *s,
                              const mml_video_plan *p, int64_t k, void *out, mml_err *err) {
  float *a = s->a;
  if (p->qvu_w != p->list_w || p->qvu_h != p->list_h) { /* fetch_video's budget: rounded back */
    mml_status st =
        mml_resize_aa_bicubic_f32_u8(a, 3, p->list_w, p->list_h, s->b, p->qvu_w, p->qvu_h, err);
    if (st) return st;
    a = s->b;
  }
  return mml_video_frame_write(cfg, s, p, a, k, out, err);
}

/* A listed frame's byte planes (list_w x list_h in s->u): written from the bytes when
 * neither resize follows (the same values), else widened to float planes for planes_tail. */
static mml_status bytes_tail(const mml_vision_cfg *cfg, mml_video_scratch *s,
                             const mml_video_plan *p, int64_t k, void *out, mml_err *err) {
  const size_t n = (size_t)3 * p->list_w * p->list_h;
  if (p->qvu_w == p->list_w && p->qvu_h == p->list_h && p->dst_w == p->qvu_w &&
      p->dst_h == p->qvu_h) {
    if (k < 0 || k >= p->nframes)
      return mml_err_set(err, MML_EINVAL, "video: frame %lld of %lld", (long long)k,
                         (long long)p->nframes);
    scatter_bytes(cfg, p, s->u, k, out);
    return MML_OK;
  }
  for (size_t i = 0; i < n; i++) s->a[i] = (float)s->u[i];
  return planes_tail(cfg, s, p, k, out, err);
}

/* A decoded frame of list_w x list_h interleaved RGB8 rows (`stride` bytes apart): its
 * float planes, then planes_tail. */
static mml_status frame_tail(const mml_vision_cfg *cfg, mml_video_scratch *s,
                             const mml_video_plan *p, const uint8_t *rgb, size_t stride, int64_t k,
                             void *out, mml_err *err) {
  const size_t lpx = (size_t)p->list_w * p->list_h;
  for (int y = 0; y < p->list_h; y++) {
    const uint8_t *r = rgb + (size_t)y * stride;
    float *a0 = s->a + (size_t)y * p->list_w, *a1 = a0 + lpx, *a2 = a1 + lpx;
    for (int x = 0; x < p->list_w; x++) {
      a0[x] = (float)r[3 * x];
      a1[x] = (float)r[3 * x + 1];
      a2[x] = (float)r[3 * x + 2];
    }
  }
  return planes_tail(cfg, s, p, k, out, err);
}

typedef struct file_ctx {
  const mml_vision_cfg *cfg;
  mml_video_scratch *s;
  const mml_video_plan *p;
  void *out;
} file_ctx;

static mml_status lf_frame(const file_ctx *c, const mml_video_frame *f, mml_err *err);

/* recipe="llama-factory", a frame list (lf_plan_list): each listed frame read as its
 * images are (convert("RGB"): alpha dropped; no EXIF turn; the mode rules of its
 * pre-resize), then lf_frame (which also fills the repeated last slot). */
static mml_status lf_process_list(const mml_vision_cfg *cfg, mml_video_scratch *s,
                                  const mml_bytes *frames, const mml_video_plan *p, void *out,
                                  mml_err *err) {
  const mml_decode_opts opts = {.strict_jpeg = cfg->strict_jpeg, .alpha = MML_ALPHA_DROP};
  mml_decoder_set_opts(s->dec, &opts);
  file_ctx c = {cfg, s, p, out};
  for (int64_t k = 0; k < p->listed; k++) {
    const mml_bytes *fr = &frames[k];
    if (mml_cancelled(cfg->cancel))
      return mml_err_set(err, MML_ECANCELLED, "cancelled between a video's frames");
    mml_rgb8 img;
    mml_status st = mml_lf_check_mode(fr->data, fr->len, p->lf_pre_cap > 0, "video frame", err);
    if (!st) st = mml_image_decode(s->dec, fr->data, fr->len, 1, &img, err);
    if (!st && (img.width != p->src_w || img.height != p->src_h))
      st = mml_err_set(err, MML_EDECODE, "decoded to %dx%d, not as planned", img.width, img.height);
    const mml_video_frame f = {(int)k, k, 0, img.pixels, img.width, img.height, img.stride};
    if (!st) st = lf_frame(&c, &f, err);
    if (st) return mml_err_prefix(err, "frame %lld", (long long)k), st;
  }
  return MML_OK;
}

mml_status mml_video_process_list(const mml_vision_cfg *cfg, mml_video_scratch *s,
                                  mml_vision_scratch *vs, const mml_video_ref *v,
                                  const mml_bytes *frames, const mml_video_plan *p, void *out,
                                  mml_err *err) {
  const mml_decode_opts opts = {.strict_jpeg = cfg->strict_jpeg, .alpha = MML_ALPHA_PASTE};
  mml_decoder_set_opts(s->dec, &opts);
  mml_decoder_set_max_pixels(s->dec, cfg->max_image_pixels);
  mml_decoder_set_max_scans(s->dec, cfg->max_jpeg_scans);
  mml_decoder_set_cancel(s->dec, cfg->cancel);
  mml_status st;
  if ((st = planes_fit(s, p, err))) return st;
  if (p->lf) return lf_process_list(cfg, s, frames, p, out, err);
  const size_t lpx = (size_t)p->list_w * p->list_h;
  if (s->u_cap < 3 * lpx) {
    uint8_t *u = realloc(s->u, 3 * lpx);
    if (!u)
      return mml_err_set(err, MML_ENOMEM, "video: out of memory for a %dx%d frame", p->list_w,
                         p->list_h);
    s->u = u, s->u_cap = 3 * lpx;
  }
  for (int64_t k = 0; k < p->nframes; k++) {
    int j = (int)(k < p->listed ? k : p->listed - 1);
    mml_rgb8 img;
    if ((st = mml_image_decode(s->dec, frames[j].data, frames[j].len, 1, &img, err)))
      return mml_err_prefix(err, "frame %d", j), st;
    if (img.width != p->src_w || img.height != p->src_h) { /* frames of other sizes */
      int lh, lw;
      if ((st = mml_video_list_frame_size(&v->keys, cfg->patch_size * cfg->merge_size, img.height,
                                          img.width, &lh, &lw, err)))
        return st;
      if (lh != p->list_h || lw != p->list_w)
        return mml_err_set(err, MML_EDECODE, "frame %d decoded to %dx%d, not as planned", j,
                           img.width, img.height);
    }
    if ((st = mml_resize_bicubic_rgb8_planes(vs, &img, p->list_w, p->list_h, cfg->pillow_h_first,
                                             s->u, err)))
      return mml_err_prefix(err, "frame %d", j), st;
    if ((st = bytes_tail(cfg, s, p, k, out, err))) return st;
  }
  return MML_OK;
}

/* 1 when the element's own sampling keys are valid, so that qwen-vl-utils refusing the
 * sampling means the video has too few frames (in range) for them. */
static int keys_sane(const mml_video_keys *k) {
  if (k->has_start && k->has_end && !(k->video_start < k->video_end)) return 0;
  if (k->nframes > 0) return nearbyint((double)k->nframes / MML_VIDEO_FRAME_FACTOR) >= 1;
  return !k->max_frames || k->max_frames >= MML_VIDEO_FRAME_FACTOR;
}

/* recipe="llama-factory": LLaMA-Factory's sampling and per-frame Pillow resize, then the
 * processor's resize (mml/video_frames.h). */
static mml_status lf_plan_file(const mml_vision_cfg *cfg, const mml_video_info *info,
                               mml_video_plan *p, double *ts, mml_err *err) {
  if (cfg->video_family == MML_VIDEO_QWEN3 && !(info->stream_avg_fps > 0))
    return mml_err_set(err, MML_EVIDEO,
                       "recipe=\"llama-factory\": the stream has no average frame rate, which "
                       "LLaMA-Factory's Qwen3-VL timestamps divide by (not reproduced)");
  if (info->stream_frames != info->nframes)
    return mml_err_set(err, MML_EVIDEO,
                       "recipe=\"llama-factory\": the stream header counts %lld frames, %lld "
                       "decode; LLaMA-Factory samples by the header's count (not reproduced)",
                       (long long)info->stream_frames, (long long)info->nframes);
  int64_t n;
  mml_status st = mml_lf_video_count(info->stream_frames, info->stream_duration_s,
                                     cfg->lf_video_fps, cfg->lf_video_maxlen, &n, err);
  if (st) return st;
  p->file = p->lf = 1;
  p->smp = (mml_video_sampling){0, info->nframes - 1, info->nframes, n, 0};
  p->src_w = p->list_w = info->width;
  p->src_h = p->list_h = info->height;
  p->listed = n;
  p->nframes = n + (n & 1); /* the last frame repeated to an even count */
  p->probe_nframes = info->nframes;
  p->probe_fps = info->fps;
  int ncap;
  if ((st = mml_lf_pre_sizes(info->width, info->height, cfg->lf_video_max_pixels,
                             cfg->lf_video_min_pixels, &p->lf_pre_n, &ncap, p->lf_pre_w,
                             p->lf_pre_h, &p->qvu_w, &p->qvu_h, err)))
    return st;
  p->fps = info->fps;
  p->sample_fps = (double)n / info->stream_duration_s; /* its fps_per_video */
  if ((st = plan_finish(cfg, p, err))) return st;
  p->src_pixels = n * (int64_t)p->src_w * p->src_h;
  if (ts && cfg->video_family == MML_VIDEO_QWEN3) { /* its Qwen3VLPlugin's timestamps */
    int64_t *idx = malloc((size_t)n * sizeof *idx);
    if (!idx)
      return mml_err_set(err, MML_ENOMEM, "video: out of memory for %lld frame indices",
                         (long long)n);
    mml_lf_video_indices(info->stream_frames, n, idx);
    mml_lf_video_timestamps(idx, n, info->stream_avg_fps, cfg->lf_video_fps, cfg->merge_size, ts);
    free(idx);
  }
  return MML_OK;
}

/* recipe="qwen-vl-finetune": the frames its apply_chat_template reads (transformers'
 * torchvision read_video: every decoded frame at the stream's average rate), sampled as
 * the checkpoint's video processor samples them (mml_qft_video_indices), the last one
 * repeated to an even count, resized by the processor alone (native uint8, as lf). */
static mml_status qft_plan_file(const mml_vision_cfg *cfg, const mml_video_info *info,
                                mml_video_plan *p, double *ts, mml_err *err) {
  const int qwen3 = cfg->video_family == MML_VIDEO_QWEN3;
  int64_t n;
  mml_status st =
      mml_qft_video_indices(qwen3, info->nframes, info->fps, cfg->qft_video_fps,
                            cfg->qft_video_min_frames, cfg->qft_video_max_frames, &n, NULL, err);
  if (st) return st;
  p->file = p->qft = 1;
  p->smp = (mml_video_sampling){0, info->nframes - 1, info->nframes, n, 0};
  p->src_w = p->list_w = p->qvu_w = info->width;
  p->src_h = p->list_h = p->qvu_h = info->height;
  p->listed = n;
  p->nframes = n + (n & 1); /* the processor repeats the last frame to an even count */
  p->probe_nframes = info->nframes;
  p->probe_fps = info->fps;
  p->fps = info->fps;
  /* its own second_per_grid_ts (LazySupervisedDataset._get_item): temporal_patch_size /
   * the video processor's fps, whatever frames were kept */
  p->sample_fps = cfg->qft_video_fps;
  if ((st = plan_finish(cfg, p, err))) return st;
  p->src_pixels = n * (int64_t)p->src_w * p->src_h;
  if (ts && qwen3) { /* Qwen3VLProcessor._calculate_timestamps(frames_indices, fps) */
    int64_t *idx = malloc((size_t)n * sizeof *idx);
    if (!idx)
      return mml_err_set(err, MML_ENOMEM, "video: out of memory for %lld frame indices",
                         (long long)n);
    (void)mml_qft_video_indices(qwen3, info->nframes, info->fps, cfg->qft_video_fps,
                                cfg->qft_video_min_frames, cfg->qft_video_max_frames, &n, idx, err);
    mml_video_timestamps(idx, n, info->fps, cfg->temporal_patch_size, ts);
    free(idx);
  }
  return MML_OK;
}

mml_status mml_video_plan_file(const mml_vision_cfg *cfg, const mml_video_keys *keys,
                               const mml_video_info *info, mml_video_plan *p, double *ts,
                               mml_err *err) {
  memset(p, 0, sizeof *p);
  if (cfg->lf) return lf_plan_file(cfg, info, p, ts, err);
  if (cfg->qft) return qft_plan_file(cfg, info, p, ts, err);
  p->file = 1;
  mml_status st = mml_video_sample(keys, info->nframes, info->fps, &p->smp, err);
  if (st == MML_ERECORD && info->nframes > 0 && info->fps > 0 && keys_sane(keys)) {
    char why[sizeof err->msg];
    snprintf(why, sizeof why, "%s", err->msg);
    return mml_err_set(err, MML_EVIDEOSHORT,
                       "%lld frames at %g fps (%.3f s) are too few for this video element (%s)",
                       (long long)info->nframes, info->fps, (double)info->nframes / info->fps, why);
  }
  if (st) return st;
  p->src_w = p->list_w = info->width;
  p->src_h = p->list_h = info->height;
  p->nframes = p->listed = p->smp.n;
  p->probe_nframes = info->nframes;
  p->probe_fps = info->fps;
  const int f = cfg->patch_size * cfg->merge_size;
  if ((st = mml_video_frame_size(keys, f, p->nframes, p->src_h, p->src_w, &p->qvu_h, &p->qvu_w,
                                 err)))
    return st;
  p->fps = info->fps;
  p->sample_fps = p->smp.sample_fps; /* = the processor's sampled_fps of qwen-vl-utils' metadata */
  if ((st = plan_finish(cfg, p, err))) return st;
  p->src_pixels = p->nframes * (int64_t)p->src_w * p->src_h;
  if (ts) {
    int64_t *idx = malloc((size_t)p->nframes * sizeof *idx);
    if (!idx)
      return mml_err_set(err, MML_ENOMEM, "video: out of memory for %lld frame indices",
                         (long long)p->nframes);
    mml_video_indices(&p->smp, idx);
    mml_video_timestamps(idx, p->nframes, p->fps, cfg->temporal_patch_size, ts);
    free(idx);
  }
  return MML_OK;
}

/* recipe llama-factory, frame k: its Pillow resizes (bicubic, Pillow 11's pass order),
 * torch's uint8 resize to the processor's size (torchvision v2 on the uint8 video), then
 * the rows of temporal slot k, and of k + 1 for the repeated last frame. */
static mml_status lf_frame(const file_ctx *c, const mml_video_frame *f, mml_err *err) {
  mml_video_scratch *s = c->s;
  const mml_video_plan *p = c->p;
  mml_status st;
  if (!s->vs && mml_vision_scratch_new(&s->vs))
    return mml_err_set(err, MML_ENOMEM, "video: out of memory for a resize scratch");
  size_t big = 16, qpx = (size_t)p->qvu_w * p->qvu_h, dpx = (size_t)p->dst_w * p->dst_h;
  for (int i = 0; i < p->lf_pre_n; i++)
    if ((size_t)p->lf_pre_w[i] * p->lf_pre_h[i] * 3 + 16 > big)
      big = (size_t)p->lf_pre_w[i] * p->lf_pre_h[i] * 3 + 16;
  uint8_t *q;
  if (2 * big > s->lf_cap) {
    if (!(q = realloc(s->lf, 2 * big)))
      return mml_err_set(err, MML_ENOMEM, "video: out of memory for a %dx%d frame", p->qvu_w,
                         p->qvu_h);
    s->lf = q, s->lf_cap = 2 * big;
  }
  if (3 * (qpx + dpx) > s->lf2_cap) {
    if (!(q = realloc(s->lf2, 3 * (qpx + dpx))))
      return mml_err_set(err, MML_ENOMEM, "video: out of memory for a %dx%d frame", p->dst_w,
                         p->dst_h);
    s->lf2 = q, s->lf2_cap = 3 * (qpx + dpx);
  }
  mml_rgb8 img = {(uint8_t *)f->rgb, f->width, f->height, f->stride};
  for (int i = 0; i < p->lf_pre_n; i++) { /* its Pillow resizes */
    uint8_t *b = s->lf + (i & 1) * big;
    const int w = p->lf_pre_w[i], h = p->lf_pre_h[i];
    if ((st = mml_resize_bicubic_rgb8_order(s->vs, &img, w, h, 1, b, err))) return st;
    img = (mml_rgb8){b, w, h, (size_t)w * 3};
  }
  uint8_t *u = s->lf2, *d8 = u;
  for (int y = 0; y < p->qvu_h; y++) /* the PIL frame as the uint8 video's planes */
    for (int x = 0; x < p->qvu_w; x++)
      for (int ch = 0; ch < 3; ch++)
        u[ch * qpx + (size_t)y * p->qvu_w + x] = img.pixels[y * img.stride + 3 * (size_t)x + ch];
  if (dpx != qpx || p->dst_w != p->qvu_w) { /* the processor's resize, native uint8 */
    d8 = u + 3 * qpx;
    if ((st = mml_resize_aa_bicubic_u8(u, 3, p->qvu_w, p->qvu_h, d8, p->dst_w, p->dst_h, err)))
      return st;
  }
  if ((st = fit(&s->d, &s->d_cap, 3 * dpx, err))) return st;
  for (size_t i = 0; i < 3 * dpx; i++) s->d[i] = (float)d8[i];
  scatter(c->cfg, p, s->d, f->k, c->out);
  if (f->k == p->listed - 1 && p->nframes > p->listed) scatter(c->cfg, p, s->d, f->k + 1, c->out);
  return MML_OK;
}

static mml_status on_frame(void *ctx, const mml_video_frame *f, mml_err *err) {
  const file_ctx *c = ctx;
  if (f->width != c->p->src_w || f->height != c->p->src_h)
    return mml_err_set(err, MML_EVIDEOCORRUPT, "frame %lld is %dx%d, the stream's is %dx%d",
                       (long long)f->index, f->width, f->height, c->p->src_w, c->p->src_h);
  if (c->p->lf || c->p->qft) return lf_frame(c, f, err);
  return frame_tail(c->cfg, c->s, c->p, f->rgb, f->stride, f->k, c->out, err);
}

mml_status mml_video_process_file(const mml_vision_cfg *cfg, mml_video_scratch *s, mml_video *v,
                                  const mml_video_plan *p, void *out, mml_err *err) {
  mml_video_info info;
  mml_status st = mml_video_probe(v, &info, err);
  if (st) return st;
  if (!p->file || info.nframes != p->probe_nframes || info.fps != p->probe_fps ||
      info.width != p->src_w || info.height != p->src_h)
    return mml_err_set(err, MML_EVIDEOCORRUPT,
                       "the file changed since it was planned: %lld frames at %g fps, %dx%d "
                       "(planned: %lld at %g, %dx%d)",
                       (long long)info.nframes, info.fps, info.width, info.height,
                       (long long)p->probe_nframes, p->probe_fps, p->src_w, p->src_h);
  const int64_t n = p->smp.n; /* decoded; the recipes pad to nframes after */
  if ((p->lf || p->qft ? p->nframes != n + (n & 1) : p->nframes != n) || p->nframes > INT_MAX)
    return mml_err_set(err, MML_EINTERNAL, "video plan: %lld frames for %lld kept",
                       (long long)p->nframes, (long long)p->smp.n);
  if ((st = planes_fit(s, p, err))) return st;
  int64_t *idx = malloc((size_t)n * sizeof *idx);
  if (!idx)
    return mml_err_set(err, MML_ENOMEM, "video: out of memory for %lld frame indices",
                       (long long)n);
  int64_t m = n;
  if (p->lf)
    mml_lf_video_indices(p->smp.count, n, idx);
  else if (p->qft)
    st = mml_qft_video_indices(cfg->video_family == MML_VIDEO_QWEN3, p->smp.count, info.fps,
                               cfg->qft_video_fps, cfg->qft_video_min_frames,
                               cfg->qft_video_max_frames, &m, idx, err);
  else
    mml_video_indices(&p->smp, idx);
  if (!st && m != n)
    st = mml_err_set(err, MML_EINTERNAL, "video plan: %lld frames kept, %lld planned", (long long)m,
                     (long long)n);
  if (st) {
    free(idx);
    return st;
  }
  file_ctx c = {cfg, s, p, out};
  st = mml_video_decode(v, idx, (int)n, on_frame, &c, err);
  free(idx);
  return st;
}
