/*
 * vision.c — Qwen-VL image preprocessing, matching transformers' Qwen2VLImageProcessor
 * with the PIL backend value for value:
 *
 *   plan      header only: size -> smart_resize -> grid (t, h, w), rows, tokens; the
 *             decompression-bomb limit is enforced here, before any pixel is decoded
 *   process   decode rows -> horizontal bicubic pass on groups of 8 rows, 32 when the
 *             vertical pass follows (uint8, planar output; resize.h MML_HROWS_RING) ->
 *             vertical pass one output row at a time, written straight into a
 *             planar block of P*M rows -> normalise + patchify the block into pixel_values
 *             (uint8 of a still image with AVX-512: through the block too, each output
 *             line written once from a register, vision_patch.c u8_lines; otherwise each
 *             output row is scattered into its patch rows as it comes, no block:
 *             u8_scatter)
 *
 * Normalisation uses the reference's exact arithmetic: float32(double(v) * (1/255)), then
 * (x - float32(mean)) / float32(std) in float32 — as a 256-entry table per channel in the
 * portable path, as the same IEEE operations in AVX2, or (when FMA is there) as a
 * division-free form that is used only after it matched the table bit for bit for all 256
 * values of every channel — so results are bit-identical and no float image is
 * materialised.  Each patch of a block is written once, in memory order (non-temporal
 * stores when the output is 32-byte aligned; a still image's float rows with AVX-512 a
 * whole 64-byte line at a time from registers, vision_patch.c float_lines): pixel_values
 * is written sequentially, and a block's patches are written a share per row of the next
 * block (two blocks alternate) so the output stores overlap decoding instead of stalling
 * on memory bandwidth.
 * Intermediates are a few rows (ring, pending group, two blocks); scratch (decoder,
 * coefficients, rows, normalisation table) is per thread and grows to the largest image
 * seen; steady state allocates nothing of ours.
 *
 * Layout (SPEC-QWEN.md): a single image is T identical frames, grid_t = 1;
 *   row = ((bh*(gw/M) + bw)*M + mh)*M + mw,  col = ((c*T + t)*P + py)*P + px.
 * Formats (cfg->pixel_format): float32 as above, bfloat16 (the same values rounded to
 * nearest even), uint8 (the resized bytes, one frame per row: col = (c*P + py)*P + px);
 * one writer each in vision_patch.c, writing where the caller says (mml_pixel_dst).
 *
 * Threads: mml_vision_cfg is read-only and may be shared; a scratch is used by one thread
 * at a time.
 *
 * Files: vision.c (this: configuration, smart_resize, planning, scratch, the process
 * entry points), vision_resize.c (the streaming resize), vision_patch.c (normalise +
 * patchify), vision_int.h (their private types).
 */
#include "vision_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <x86intrin.h>
#endif

/* ---------------------------------------------------------------- config */

mml_status mml_vision_preset(const char *name, mml_vision_cfg *cfg, mml_err *err) {
  memset(cfg, 0, sizeof *cfg);
  cfg->merge_size = 2;
  cfg->temporal_patch_size = 2;
  cfg->max_image_pixels = MML_DEFAULT_MAX_IMAGE_PIXELS; /* Pillow's bomb error threshold */
  cfg->max_jpeg_scans = MML_DEFAULT_MAX_JPEG_SCANS;
  if (name && (!strcmp(name, "qwen2-vl") || !strcmp(name, "qwen2.5-vl"))) {
    static const float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
    static const float std[3] = {0.26862954f, 0.26130258f, 0.27577711f};
    cfg->patch_size = 14;
    cfg->min_pixels = 3136;
    cfg->max_pixels = 12845056;
    memcpy(cfg->mean, mean, sizeof mean);
    memcpy(cfg->std, std, sizeof std);
    return MML_OK;
  }
  if (name && !strcmp(name, "qwen3-vl")) {
    cfg->patch_size = 16;
    cfg->min_pixels = 65536;
    cfg->max_pixels = 16777216;
    for (int c = 0; c < 3; c++) cfg->mean[c] = cfg->std[c] = 0.5f;
    return MML_OK;
  }
  return mml_err_set(err, MML_ECONFIG,
                     "unknown vision preset \"%s\" (qwen2-vl, qwen2.5-vl or qwen3-vl)",
                     name ? name : "(null)");
}

int mml_vision_pixel_cols(const mml_vision_cfg *cfg) {
  const int frames = cfg->pixel_format == MML_PIXEL_UINT8 ? 1 : cfg->temporal_patch_size;
  return 3 * frames * cfg->patch_size * cfg->patch_size;
}

mml_dtype mml_pixel_format_dtype(int format) {
  return format == MML_PIXEL_UINT8      ? MML_DT_UINT8
         : format == MML_PIXEL_BFLOAT16 ? MML_DT_BFLOAT16
                                        : MML_DT_FLOAT32;
}

mml_dtype mml_vision_pixel_dtype(const mml_vision_cfg *cfg) {
  return mml_pixel_format_dtype(cfg->pixel_format);
}

size_t mml_vision_row_bytes(const mml_vision_cfg *cfg) {
  return (size_t)mml_vision_pixel_cols(cfg) * mml_dtype_size(mml_vision_pixel_dtype(cfg));
}

int mml_vision_video_cols(const mml_vision_cfg *cfg) {
  return 3 * cfg->temporal_patch_size * cfg->patch_size * cfg->patch_size;
}

size_t mml_vision_video_row_bytes(const mml_vision_cfg *cfg) {
  return (size_t)mml_vision_video_cols(cfg) * mml_dtype_size(mml_vision_pixel_dtype(cfg));
}

mml_status mml_vision_cfg_check(const mml_vision_cfg *cfg, mml_err *err) {
  if (cfg->patch_size < 1 || cfg->patch_size > 1024)
    return mml_err_set(err, MML_ECONFIG, "patch_size must be in [1, 1024], got %d",
                       cfg->patch_size);
  if (cfg->merge_size < 1 || cfg->merge_size > 64)
    return mml_err_set(err, MML_ECONFIG, "merge_size must be in [1, 64], got %d", cfg->merge_size);
  if (cfg->temporal_patch_size < 1 || cfg->temporal_patch_size > 64)
    return mml_err_set(err, MML_ECONFIG, "temporal_patch_size must be in [1, 64], got %d",
                       cfg->temporal_patch_size);
  if (cfg->min_pixels < 1 || cfg->max_pixels < cfg->min_pixels)
    return mml_err_set(err, MML_ECONFIG, "need 0 < min_pixels <= max_pixels, got %lld and %lld",
                       (long long)cfg->min_pixels, (long long)cfg->max_pixels);
  if (cfg->max_pixels > ((int64_t)1 << 50))
    return mml_err_set(err, MML_ECONFIG, "max_pixels %lld is too large",
                       (long long)cfg->max_pixels);
  if (cfg->max_image_pixels < 0)
    return mml_err_set(err, MML_ECONFIG, "max_image_pixels must be >= 0 (0: no limit)");
  for (int c = 0; c < 3; c++) {
    if (!(cfg->std[c] != 0.0f) || !isfinite(cfg->std[c]) || !isfinite(cfg->mean[c]))
      return mml_err_set(err, MML_ECONFIG, "image_std/image_mean must be finite and std != 0");
  }
  if (cfg->pixel_format < MML_PIXEL_FLOAT32 || cfg->pixel_format > MML_PIXEL_UINT8)
    return mml_err_set(err, MML_ECONFIG, "pixel_format %d is not float32, bfloat16 or uint8",
                       cfg->pixel_format);
  if (cfg->qft && (!(cfg->qft_video_fps > 0) || cfg->qft_video_min_frames < 1 ||
                   cfg->qft_video_max_frames < cfg->qft_video_min_frames ||
                   cfg->video_min_pixels < 1 || cfg->video_max_pixels < cfg->video_min_pixels))
    return mml_err_set(err, MML_ECONFIG,
                       "recipe=\"qwen-vl-finetune\": need video_fps > 0, 1 <= video_min_frames "
                       "<= video_max_frames and 1 <= video_min_pixels <= video_max_pixels (got "
                       "%g, %lld, %lld, %lld, %lld)",
                       cfg->qft_video_fps, (long long)cfg->qft_video_min_frames,
                       (long long)cfg->qft_video_max_frames, (long long)cfg->video_min_pixels,
                       (long long)cfg->video_max_pixels);
  return MML_OK;
}

/* ---------------------------------------------------------------- smart_resize */

mml_status mml_smart_resize(int height, int width, int factor, int64_t min_pixels,
                            int64_t max_pixels, int legacy, int *out_h, int *out_w, mml_err *err) {
  if (height < 1 || width < 1 || factor < 1)
    return mml_err_set(err, MML_EINVAL, "smart_resize: bad size %dx%d or factor %d", width, height,
                       factor);
  if (legacy == MML_RESIZE_LEGACY && (height < factor || width < factor))
    return mml_err_set(err, MML_EINVAL,
                       "height:%d or width:%d must be larger than factor:%d (legacy smart_resize)",
                       height, width, factor);
  int mx = height > width ? height : width, mn = height > width ? width : height;
  if ((double)mx / (double)mn > 200)
    return mml_err_set(err, MML_EASPECT,
                       "absolute aspect ratio must be smaller than 200, got %g (%dx%d)",
                       (double)mx / (double)mn, width, height);
  const double f = factor, H = height, W = width, HW = (double)((int64_t)height * width);
  double h_bar = nearbyint(H / f) * f; /* Python round(): half to even */
  double w_bar = nearbyint(W / f) * f;
  if (legacy == MML_RESIZE_QWEN_VL_UTILS) { /* max(factor, round_by_factor(...)) */
    if (h_bar < f) h_bar = f;
    if (w_bar < f) w_bar = f;
  }
  if (h_bar * w_bar > (double)max_pixels) {
    double beta = sqrt(HW / (double)max_pixels);
    h_bar = floor(H / beta / f) * f;
    w_bar = floor(W / beta / f) * f;
    if (legacy == MML_RESIZE_TRANSFORMERS) {
      if (h_bar < f) h_bar = f;
      if (w_bar < f) w_bar = f;
    }
  } else if (h_bar * w_bar < (double)min_pixels) {
    double beta = sqrt((double)min_pixels / HW);
    h_bar = ceil(H * beta / f) * f;
    w_bar = ceil(W * beta / f) * f;
  }
  if (!(h_bar >= 1 && w_bar >= 1))
    return mml_err_set(err, MML_EINVAL, "smart_resize: %dx%d resizes to an empty image", width,
                       height);
  if (h_bar > 1 << 30 || w_bar > 1 << 30)
    return mml_err_set(err, MML_EINVAL, "smart_resize: %dx%d resizes to an oversized image", width,
                       height);
  *out_h = (int)h_bar;
  *out_w = (int)w_bar;
  return MML_OK;
}

/* ---------------------------------------------------------------- planning */

static void plan_fill(const mml_vision_cfg *cfg, int width, int height, int w, int h,
                      mml_vision_plan *plan) {
  const int P = cfg->patch_size, M = cfg->merge_size;
  plan->src_w = width;
  plan->src_h = height;
  plan->dst_w = w;
  plan->dst_h = h;
  plan->grid_t = 1;
  plan->grid_h = h / P;
  plan->grid_w = w / P;
  plan->rows = (int64_t)plan->grid_h * plan->grid_w;
  plan->cols = mml_vision_pixel_cols(cfg);
  plan->tokens = plan->rows / ((int64_t)M * M);
  plan->decode_scale = 1;
  plan->orientation = 1;
}

/* recipe llama-factory: the Pillow resizes before the processor's (prescale.c) into the
 * plan, and the size they leave (*w, *h); untouched without the recipe. */
static mml_status lf_pre(const mml_vision_cfg *cfg, int width, int height, mml_vision_plan *plan,
                         int *w, int *h, mml_err *err) {
  if (!cfg->lf) return MML_OK;
  return mml_lf_pre_sizes(width, height, cfg->lf_max_pixels, cfg->lf_min_pixels, &plan->pre_n,
                          &plan->pre_cap, plan->pre_w, plan->pre_h, w, h, err);
}

mml_status mml_vision_plan_size(const mml_vision_cfg *cfg, int width, int height,
                                mml_vision_plan *plan, mml_err *err) {
  memset(plan, 0, sizeof *plan);
  mml_status st = mml_vision_cfg_check(cfg, err);
  if (st != MML_OK) return st;
  int h, w, pw = width, ph = height;
  if ((st = lf_pre(cfg, width, height, plan, &pw, &ph, err)) != MML_OK) return st;
  const int variant =
      cfg->route == MML_ROUTE_QWEN_VL_UTILS ? MML_RESIZE_QWEN_VL_UTILS : cfg->legacy_resize;
  st = mml_smart_resize(ph, pw, cfg->patch_size * cfg->merge_size, cfg->min_pixels, cfg->max_pixels,
                        variant, &h, &w, err);
  if (st != MML_OK) return st;
  plan_fill(cfg, width, height, w, h, plan);
  return MML_OK;
}

/* The target size qwen-vl-utils' fetch_image gives an image of width x height under a
 * per-image budget (see mml_vision_plan_bytes_budget). */
static mml_status budget_size(const mml_vision_cfg *cfg, int width, int height,
                              const mml_image_budget *b, int *h, int *w, mml_err *err) {
  const int64_t f = (int64_t)cfg->patch_size * cfg->merge_size;
  if (b->resized_height > 0 && b->resized_width > 0)
    return mml_smart_resize((int)b->resized_height, (int)b->resized_width, (int)f, 4 * f * f,
                            16384 * f * f, MML_RESIZE_QWEN_VL_UTILS, h, w, err);
  int64_t mn = b->min_pixels > 0 ? b->min_pixels : cfg->min_pixels;
  int64_t mx = b->max_pixels > 0 ? b->max_pixels : cfg->max_pixels;
  if (mn > mx)
    return mml_err_set(err, MML_ERECORD,
                       "bad record: the image's min_pixels %lld exceeds its max_pixels %lld",
                       (long long)mn, (long long)mx);
  return mml_smart_resize(height, width, (int)f, mn, mx, MML_RESIZE_QWEN_VL_UTILS, h, w, err);
}

mml_status mml_vision_plan_bytes_budget(const mml_vision_cfg *cfg, const uint8_t *data, size_t len,
                                        const mml_image_budget *b, mml_vision_plan *plan,
                                        mml_err *err) {
  mml_image_info info;
  memset(plan, 0, sizeof *plan);
  mml_status st = mml_image_probe(data, len, &info, err);
  if (st != MML_OK) return st;
  int64_t px = (int64_t)info.width * info.height;
  if (cfg->max_image_pixels > 0 && px > cfg->max_image_pixels)
    return mml_err_set(err, MML_ETOOBIG, "%dx%d image (%lld pixels) exceeds max_image_pixels=%lld",
                       info.width, info.height, (long long)px, (long long)cfg->max_image_pixels);
  if (cfg->max_jpeg_scans > 0 && info.scans > cfg->max_jpeg_scans)
    return mml_err_set(err, MML_ESCANS, "JPEG: %d scans, above max_jpeg_scans=%d", info.scans,
                       cfg->max_jpeg_scans);
  const int orient = cfg->route == MML_ROUTE_LOAD_IMAGE ? mml_image_orientation(data, len) : 1;
  const int swap = orient >= 5; /* transpose, rotations by 90 degrees, transverse */
  const int W = swap ? info.height : info.width, H = swap ? info.width : info.height;
  if (b && (b->min_pixels || b->max_pixels || (b->resized_height && b->resized_width))) {
    if ((st = mml_vision_cfg_check(cfg, err))) return st;
    int h, w, pw = W, ph = H;
    if ((st = lf_pre(cfg, W, H, plan, &pw, &ph, err))) return st;
    if ((st = budget_size(cfg, pw, ph, b, &h, &w, err))) return st;
    plan_fill(cfg, W, H, w, h, plan); /* keeps the pre-resizes */
  } else if ((st = mml_vision_plan_size(cfg, W, H, plan, err))) {
    return st;
  }
  plan->format = info.format;
  plan->orientation = orient;
  plan->scratch = info.scratch; /* turned: the decoded image and its turned copy too */
  if (orient > 1) plan->scratch += mml_round_2mib(px * 6);
  if (plan->pre_n > 0) { /* decoded whole, and two pre-resized images (prescale.c) */
    int64_t big = 0;
    for (int i = 0; i < plan->pre_n; i++)
      if ((int64_t)plan->pre_w[i] * plan->pre_h[i] > big)
        big = (int64_t)plan->pre_w[i] * plan->pre_h[i];
    plan->scratch += mml_round_2mib(px * 3 + big * 6);
  }
  if (cfg->fast && info.format == MML_FMT_JPEG && orient == 1 && plan->pre_n == 0) {
    for (int d = 8; d >= 2; d /= 2) {
      if ((int64_t)plan->dst_w * d <= info.width && (int64_t)plan->dst_h * d <= info.height) {
        plan->decode_scale = d;
        break;
      }
    }
  }
  return MML_OK;
}

mml_status mml_vision_plan_bytes(const mml_vision_cfg *cfg, const uint8_t *data, size_t len,
                                 mml_vision_plan *plan, mml_err *err) {
  return mml_vision_plan_bytes_budget(cfg, data, len, NULL, plan, err);
}

/* ---------------------------------------------------------------- scratch */

mml_status mml_vision_scratch_new(mml_vision_scratch **out) {
  mml_vision_scratch *s = calloc(1, sizeof *s);
  if (!s) return MML_ENOMEM;
  if (mml_decoder_new(&s->dec) != MML_OK) {
    free(s);
    return MML_ENOMEM;
  }
  *out = s;
  return MML_OK;
}

double mml_vision_scratch_decode_s(const mml_vision_scratch *s) { return s ? s->decode_s : 0.0; }

void mml_vision_scratch_trim(mml_vision_scratch *s, size_t keep) {
  if (!s) return;
  mml_decoder_trim(s->dec, keep);
  if (s->turned.cap > keep) mml_bytes_free(&s->turned);
  if (s->pre.cap > keep) mml_bytes_free(&s->pre);
}

void mml_vision_scratch_set_jpeg_keep(mml_vision_scratch *s, size_t bytes) {
  if (s) mml_decoder_set_jpeg_keep(s->dec, bytes);
}

void mml_vision_scratch_free(mml_vision_scratch *s) {
  if (!s) return;
  mml_decoder_free(s->dec);
  mml_resample_axis_free(&s->ax);
  mml_resample_axis_free(&s->ay);
  mml_bytes_free(&s->ring);
  mml_bytes_free(&s->pend);
  mml_bytes_free(&s->tbuf);
  mml_bytes_free(&s->rows);
  free(s->rp);
  mml_bytes_free(&s->block);
  mml_bytes_free(&s->turned);
  mml_bytes_free(&s->pre);
  free(s->ptmp);
  free(s);
}
/* Checks cfg, the plan's geometry and the destination. */
static mml_status check_plan(const mml_vision_cfg *cfg, const mml_vision_plan *plan,
                             const mml_pixel_dst *dst, mml_err *err) {
  mml_status st = mml_vision_cfg_check(cfg, err);
  if (st != MML_OK) return st;
  const int P = cfg->patch_size, M = cfg->merge_size;
  if (!plan || !dst || !dst->out)
    return mml_err_set(err, MML_EINVAL, "vision: no plan or output buffer");
  if (plan->dst_w < P * M || plan->dst_h < P * M || plan->dst_w % (P * M) ||
      plan->dst_h % (P * M) || plan->grid_w != plan->dst_w / P || plan->grid_h != plan->dst_h / P ||
      plan->rows != (int64_t)plan->grid_h * plan->grid_w)
    return mml_err_set(err, MML_EINVAL, "vision: plan does not fit this configuration");
  if (dst->slots < 1 || dst->slots > cfg->temporal_patch_size || dst->slot0 < 0 ||
      dst->nslots < 1 || dst->slot0 + dst->nslots > dst->slots)
    return mml_err_set(err, MML_EINVAL, "vision: frame slots [%d, %d) of %d do not fit T=%d",
                       dst->slot0, dst->slot0 + dst->nslots, dst->slots, cfg->temporal_patch_size);
  return MML_OK;
}

/* A still image's destination: all frame slots of its rows (one for uint8). */
static mml_status image_dst(const mml_vision_cfg *cfg, const mml_vision_plan *plan, void *out,
                            mml_pixel_dst *dst, mml_err *err) {
  const int slots = cfg->pixel_format == MML_PIXEL_UINT8 ? 1 : cfg->temporal_patch_size;
  *dst = (mml_pixel_dst){out, slots, 0, slots};
  if (plan && plan->cols != mml_vision_pixel_cols(cfg))
    return mml_err_set(err, MML_EINVAL, "vision: plan has %d columns, the %s format %d", plan->cols,
                       mml_dtype_name(mml_vision_pixel_dtype(cfg)), mml_vision_pixel_cols(cfg));
  return check_plan(cfg, plan, dst, err);
}

/* The row sink of process_bytes, timed: the decoder's own time is the decode call's time
 * less the time spent in these callbacks (resize and patchify of the rows it hands out).
 * Each row is timed, so the callbacks read a cheap counter (row_ticks) and only its ratio
 * over the whole call is used: decode_s += call time * (1 - ticks in rows / ticks of
 * the call). */
typedef struct timed_job {
  resize_job *j;
  uint64_t in_rows;
} timed_job;

/* The TSC on x86-64 (~19 ns a read here against ~53 for clock_gettime, twice per decoded
 * row), else the monotonic clock in nanoseconds. */
static inline uint64_t row_ticks(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  return __rdtsc();
#else
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
#endif
}

static mml_status timed_begin(void *ctx, int w, int h, mml_err *err) {
  return mml_resize_job_begin(((timed_job *)ctx)->j, w, h, err);
}

static mml_status timed_row(void *ctx, int y, const uint8_t *rgb, mml_err *err) {
  timed_job *t = ctx;
  const uint64_t t0 = row_ticks();
  mml_status st = mml_resize_job_row(t->j, y, rgb, err);
  const uint64_t t1 = row_ticks();
  if (t1 > t0) t->in_rows += t1 - t0; /* a step back (another core's counter): not counted */
  return st;
}

static uint8_t *timed_row_buf(void *ctx, int y) {
  return mml_resize_job_row_buf(((timed_job *)ctx)->j, y);
}

mml_status mml_vision_process_bytes(const mml_vision_cfg *cfg, mml_vision_scratch *s,
                                    const uint8_t *data, size_t len, const mml_vision_plan *plan,
                                    void *out, mml_err *err) {
  mml_pixel_dst dst;
  mml_status st = image_dst(cfg, plan, out, &dst, err);
  if (st != MML_OK) return st;
  const mml_decode_opts opts = {
      .strict_jpeg = cfg->strict_jpeg,
      .alpha = cfg->route == MML_ROUTE_LOAD_IMAGE || cfg->lf ? MML_ALPHA_DROP
               : cfg->route == MML_ROUTE_QWEN_VL_UTILS       ? MML_ALPHA_PASTE
                                                             : MML_ALPHA_COMPOSITE};
  mml_decoder_set_opts(s->dec, &opts);
  mml_decoder_set_max_pixels(s->dec, cfg->max_image_pixels);
  mml_decoder_set_max_scans(s->dec, cfg->max_jpeg_scans);
  mml_decoder_set_cancel(s->dec, cfg->cancel);
  if (plan->pre_n > 0) return mml_lf_process(cfg, s, data, len, plan, &dst, err);
  if (plan->orientation > 1) { /* whole image, turned, then the RGB path */
    mml_rgb8 img, t;
    double t0 = mml_now();
    if ((st = mml_image_decode(s->dec, data, len, 1, &img, err)) != MML_OK) return st;
    s->decode_s += mml_now() - t0;
    if (mml_bytes_reserve(&s->turned, (size_t)img.width * img.height * 3))
      return mml_err_set(err, MML_ENOMEM, "vision: out of memory for a %dx%d image", img.width,
                         img.height);
    mml_rgb8_transpose(&img, plan->orientation, s->turned.data);
    t.pixels = s->turned.data;
    t.width = plan->orientation >= 5 ? img.height : img.width;
    t.height = plan->orientation >= 5 ? img.width : img.height;
    t.stride = (size_t)t.width * 3;
    return mml_vision_process_rgb_dst(cfg, s, &t, plan, &dst, err);
  }
  int scale = plan->decode_scale > 1 ? plan->decode_scale : 1;
  patch_ctx g;
  if ((st = mml_patch_init(&g, s, cfg, plan, &dst, err)) != MML_OK) return st;
  if (cfg->route == MML_ROUTE_QWEN_VL_UTILS) g.dec = s->dec, g.key = -1;
  resize_job j = {.s = s,
                  .dst_w = plan->dst_w,
                  .dst_h = plan->dst_h,
                  .expect_w = scale == 1 ? plan->src_w : 0,
                  .expect_h = scale == 1 ? plan->src_h : 0,
                  .h_first_always = cfg->pillow_h_first,
                  .out = mml_patch_out(&g)};
  timed_job tj = {&j, 0};
  mml_row_sink sink = {timed_begin, timed_row, &tj, timed_row_buf};
  double t0 = mml_now();
  const uint64_t k0 = row_ticks();
  st = mml_image_decode_rows(s->dec, data, len, scale, &sink, err);
  const uint64_t k1 = row_ticks();
  const double call = mml_now() - t0;
  const double rows = k1 > k0 ? (double)tj.in_rows / (double)(k1 - k0) : 0.0;
  s->decode_s += call * (rows < 1.0 ? 1.0 - rows : 0.0);
  if (st == MML_OK) st = mml_resize_job_done(&j, err);
  if (st == MML_OK) mml_patch_finish(&g);
  return st;
}

mml_status mml_vision_process_rgb_dst(const mml_vision_cfg *cfg, mml_vision_scratch *s,
                                      const mml_rgb8 *img, const mml_vision_plan *plan,
                                      const mml_pixel_dst *dst, mml_err *err) {
  mml_status st = check_plan(cfg, plan, dst, err);
  if (st != MML_OK) return st;
  patch_ctx g;
  if ((st = mml_patch_init(&g, s, cfg, plan, dst, err)) != MML_OK) return st;
  resize_job j = {.s = s,
                  .dst_w = plan->dst_w,
                  .dst_h = plan->dst_h,
                  .expect_w = plan->src_w,
                  .expect_h = plan->src_h,
                  .h_first_always = cfg->pillow_h_first,
                  .out = mml_patch_out(&g)};
  st = mml_resize_job_feed(&j, img, err);
  if (st == MML_OK) mml_patch_finish(&g);
  return st;
}

mml_status mml_vision_process_rgb(const mml_vision_cfg *cfg, mml_vision_scratch *s,
                                  const mml_rgb8 *img, const mml_vision_plan *plan, void *out,
                                  mml_err *err) {
  mml_pixel_dst dst;
  mml_status st = image_dst(cfg, plan, out, &dst, err);
  return st != MML_OK ? st : mml_vision_process_rgb_dst(cfg, s, img, plan, &dst, err);
}

/* row_out for the plain resize: planar rows in scratch, interleaved into the output. */
typedef struct copy_ctx {
  uint8_t *dst, *rows;
  int w;
} copy_ctx;

static uint8_t *copy_dst(void *ctx, int y) {
  copy_ctx *c = ctx;
  return c->rows + (size_t)(y % MML_HROWS) * 3 * c->w;
}

static void copy_done(void *ctx, int y) {
  copy_ctx *c = ctx;
  const uint8_t *p = copy_dst(ctx, y);
  uint8_t *d = c->dst + (size_t)y * 3 * c->w;
  for (int x = 0; x < c->w; x++)
    for (int ch = 0; ch < 3; ch++) d[3 * x + ch] = p[(size_t)ch * c->w + x];
}

mml_status mml_resize_bicubic_rgb8_order(mml_vision_scratch *s, const mml_rgb8 *src, int dst_w,
                                         int dst_h, int h_first_always, uint8_t *dst,
                                         mml_err *err) {
  if (dst_w < 1 || dst_h < 1 || !dst)
    return mml_err_set(err, MML_EINVAL, "resize: bad target %dx%d", dst_w, dst_h);
  if (mml_bytes_reserve(&s->rows, (size_t)MML_HROWS * 3 * dst_w))
    return mml_err_set(err, MML_ENOMEM, "resize: out of memory for %d-pixel rows", dst_w);
  copy_ctx c = {dst, s->rows.data, dst_w};
  resize_job j = {.s = s,
                  .dst_w = dst_w,
                  .dst_h = dst_h,
                  .h_first_always = h_first_always,
                  .out = {copy_dst, copy_done, &c, (size_t)dst_w}};
  return mml_resize_job_feed(&j, src, err);
}

/* row_out for the planar resize: planar rows in scratch, copied into the planes. */
typedef struct planes_ctx {
  uint8_t *dst, *rows;
  int w, h;
} planes_ctx;

static uint8_t *planes_dst(void *ctx, int y) {
  planes_ctx *c = ctx;
  return c->rows + (size_t)(y % MML_HROWS) * 3 * c->w;
}

static void planes_done(void *ctx, int y) {
  planes_ctx *c = ctx;
  const uint8_t *p = planes_dst(ctx, y);
  const size_t plane = (size_t)c->w * c->h;
  for (int ch = 0; ch < 3; ch++)
    memcpy(c->dst + ch * plane + (size_t)y * c->w, p + (size_t)ch * c->w, (size_t)c->w);
}

mml_status mml_resize_bicubic_rgb8_planes(mml_vision_scratch *s, const mml_rgb8 *src, int dst_w,
                                          int dst_h, int h_first_always, uint8_t *planes,
                                          mml_err *err) {
  if (dst_w < 1 || dst_h < 1 || !planes)
    return mml_err_set(err, MML_EINVAL, "resize: bad target %dx%d", dst_w, dst_h);
  if (mml_bytes_reserve(&s->rows, (size_t)MML_HROWS * 3 * dst_w))
    return mml_err_set(err, MML_ENOMEM, "resize: out of memory for %d-pixel rows", dst_w);
  planes_ctx c = {planes, s->rows.data, dst_w, dst_h};
  resize_job j = {.s = s,
                  .dst_w = dst_w,
                  .dst_h = dst_h,
                  .h_first_always = h_first_always,
                  .out = {planes_dst, planes_done, &c, (size_t)dst_w}};
  return mml_resize_job_feed(&j, src, err);
}

mml_status mml_resize_bicubic_rgb8(mml_vision_scratch *s, const mml_rgb8 *src, int dst_w, int dst_h,
                                   uint8_t *dst, mml_err *err) {
  return mml_resize_bicubic_rgb8_order(s, src, dst_w, dst_h, 0, dst, err);
}