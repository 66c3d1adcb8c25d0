/*
 * vision.c — Qwen-VL image preprocessing, matching transformers' Qwen2VLImageProcessor
 * with the PIL backend value for value:
 *
 *   plan      header only: size -> smart_resize -> grid (t, h, w), rows, tokens; the
 *             decompression-bomb limit is enforced here, before any pixel is decoded
 *   process   decode rows -> horizontal bicubic pass on groups of 8 rows (uint8, planar
 *             output) -> vertical pass one output row at a time, written straight into a
 *             planar block of P*M rows -> normalise + patchify the block into pixel_values
 *
 * Normalisation uses the reference's exact arithmetic: float32(double(v) * (1/255)), then
 * (x - float32(mean)) / float32(std) in float32 — as a 256-entry table per channel in the
 * portable path, as the same IEEE operations in AVX2, or (when FMA is there) as a
 * division-free form that is used only after it matched the table bit for bit for all 256
 * values of every channel — so results are bit-identical and no float image is
 * materialised.  Each patch of a block is written once, in memory order (non-temporal
 * stores when the output is 32-byte aligned): pixel_values is written sequentially, and
 * a block's patches are written a share per row of the next block (two blocks alternate)
 * so the output stores overlap decoding instead of stalling on memory bandwidth.
 * Intermediates are a few rows (ring, pending group, two blocks); scratch (decoder,
 * coefficients, rows, normalisation table) is per thread and grows to the largest image
 * seen; steady state allocates nothing of ours.
 *
 * Layout (SPEC-QWEN.md): a single image is T identical frames, grid_t = 1;
 *   row = ((bh*(gw/M) + bw)*M + mh)*M + mw,  col = ((c*T + t)*P + py)*P + px.
 *
 * Threads: mml_vision_cfg is read-only and may be shared; a scratch is used by one thread
 * at a time.
 */
#include "mml/vision.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mml/image.h"
#include "resize.h"

struct mml_vision_scratch {
  mml_decoder *dec;
  mml_resample_axis ax, ay;
  mml_bytes ring; /* rows the vertical pass still needs (see resize_job) */
  mml_bytes pend; /* rows waiting for the horizontal pass */
  mml_bytes tbuf; /* transposed rows for the horizontal pass */
  mml_bytes rows; /* planar output rows of the plain resize (mml_resize_bicubic_rgb8) */
  const uint8_t **rp; /* row pointers for one vertical output */
  size_t rp_cap;
  mml_bytes block;    /* two blocks of P*M planar output rows for patchify */
  mml_bytes turned;   /* an EXIF-transposed image (the load_image route) */
  float *ptmp;        /* one patch, aligned, for non-temporal output stores */
  size_t ptmp_cap;
  /* normalisation of the last config seen: the reference values per channel and byte,
   * and whether the division-free vector formula reproduces all of them */
  int norm_valid, norm_fast;
  float norm_mean[3], norm_std[3];
  float lut[3][256];
  uint16_t lut16[3][256]; /* lut rounded to bfloat16 */
  double decode_s; /* time inside the decoder itself (mml_vision_scratch_decode_s) */
};

/* ---------------------------------------------------------------- config */

mml_status mml_vision_preset(const char *name, mml_vision_cfg *cfg, mml_err *err) {
  memset(cfg, 0, sizeof *cfg);
  cfg->merge_size = 2;
  cfg->temporal_patch_size = 2;
  cfg->max_image_pixels = MML_DEFAULT_MAX_IMAGE_PIXELS; /* Pillow's bomb error threshold */
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

mml_status mml_vision_cfg_check(const mml_vision_cfg *cfg, mml_err *err) {
  if (cfg->patch_size < 1 || cfg->patch_size > 1024)
    return mml_err_set(err, MML_ECONFIG, "patch_size must be in [1, 1024], got %d", cfg->patch_size);
  if (cfg->merge_size < 1 || cfg->merge_size > 64)
    return mml_err_set(err, MML_ECONFIG, "merge_size must be in [1, 64], got %d", cfg->merge_size);
  if (cfg->temporal_patch_size < 1 || cfg->temporal_patch_size > 64)
    return mml_err_set(err, MML_ECONFIG, "temporal_patch_size must be in [1, 64], got %d",
                       cfg->temporal_patch_size);
  if (cfg->min_pixels < 1 || cfg->max_pixels < cfg->min_pixels)
    return mml_err_set(err, MML_ECONFIG,
                       "need 0 < min_pixels <= max_pixels, got %lld and %lld",
                       (long long)cfg->min_pixels, (long long)cfg->max_pixels);
  if (cfg->max_pixels > ((int64_t)1 << 50))
    return mml_err_set(err, MML_ECONFIG, "max_pixels %lld is too large", (long long)cfg->max_pixels);
  if (cfg->max_image_pixels < 0)
    return mml_err_set(err, MML_ECONFIG, "max_image_pixels must be >= 0 (0: no limit)");
  for (int c = 0; c < 3; c++) {
    if (!(cfg->std[c] != 0.0f) || !isfinite(cfg->std[c]) || !isfinite(cfg->mean[c]))
      return mml_err_set(err, MML_ECONFIG, "image_std/image_mean must be finite and std != 0");
  }
  if (cfg->pixel_format < MML_PIXEL_FLOAT32 || cfg->pixel_format > MML_PIXEL_UINT8)
    return mml_err_set(err, MML_ECONFIG, "pixel_format %d is not float32, bfloat16 or uint8",
                       cfg->pixel_format);
  return MML_OK;
}

/* ---------------------------------------------------------------- smart_resize */

mml_status mml_smart_resize(int height, int width, int factor, int64_t min_pixels,
                            int64_t max_pixels, int legacy, int *out_h, int *out_w,
                            mml_err *err) {
  if (height < 1 || width < 1 || factor < 1)
    return mml_err_set(err, MML_EINVAL, "smart_resize: bad size %dx%d or factor %d", width,
                       height, factor);
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
    return mml_err_set(err, MML_EINVAL, "smart_resize: %dx%d resizes to an oversized image",
                       width, height);
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

mml_status mml_vision_plan_size(const mml_vision_cfg *cfg, int width, int height,
                                mml_vision_plan *plan, mml_err *err) {
  memset(plan, 0, sizeof *plan);
  mml_status st = mml_vision_cfg_check(cfg, err);
  if (st != MML_OK) return st;
  int h, w;
  const int variant = cfg->route == MML_ROUTE_QWEN_VL_UTILS ? MML_RESIZE_QWEN_VL_UTILS
                                                            : cfg->legacy_resize;
  st = mml_smart_resize(height, width, cfg->patch_size * cfg->merge_size, cfg->min_pixels,
                        cfg->max_pixels, variant, &h, &w, err);
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

mml_status mml_vision_plan_bytes_budget(const mml_vision_cfg *cfg, const uint8_t *data,
                                        size_t len, const mml_image_budget *b,
                                        mml_vision_plan *plan, mml_err *err) {
  mml_image_info info;
  memset(plan, 0, sizeof *plan);
  mml_status st = mml_image_probe(data, len, &info, err);
  if (st != MML_OK) return st;
  int64_t px = (int64_t)info.width * info.height;
  if (cfg->max_image_pixels > 0 && px > cfg->max_image_pixels)
    return mml_err_set(err, MML_ETOOBIG,
                       "%dx%d image (%lld pixels) exceeds max_image_pixels=%lld", info.width,
                       info.height, (long long)px, (long long)cfg->max_image_pixels);
  const int orient = cfg->route == MML_ROUTE_LOAD_IMAGE ? mml_image_orientation(data, len) : 1;
  const int swap = orient >= 5; /* transpose, rotations by 90 degrees, transverse */
  const int W = swap ? info.height : info.width, H = swap ? info.width : info.height;
  if (b && (b->min_pixels || b->max_pixels || (b->resized_height && b->resized_width))) {
    if ((st = mml_vision_cfg_check(cfg, err))) return st;
    int h, w;
    if ((st = budget_size(cfg, W, H, b, &h, &w, err))) return st;
    plan_fill(cfg, W, H, w, h, plan);
  } else if ((st = mml_vision_plan_size(cfg, W, H, plan, err))) {
    return st;
  }
  plan->format = info.format;
  plan->orientation = orient;
  if (cfg->fast && info.format == MML_FMT_JPEG && orient == 1) {
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
  free(s->ptmp);
  free(s);
}

/* ---------------------------------------------------------------- the resize pipeline */

/* A streaming two-pass resize.  Decoded rows arrive in order; each output row is produced
 * as soon as the input rows it reads are there, written planar where the consumer says
 * (row_out) and announced in order.  The horizontal pass runs on groups of MML_HROWS rows
 * (resize.c vectorises across them) and writes planar rows, so rows wait in `pend` until a
 * group is full or no more rows will come.  Rows the vertical pass still needs live in a
 * ring: horizontally resized rows (planar) when the horizontal pass runs first, source rows
 * (interleaved) when the vertical pass runs first (Pillow 13's choice, resize.h), source
 * rows split to planar when there is no horizontal pass. */
typedef struct row_out {
  /* Planar destination of output row y: channel c of pixel x goes to dst + c*plane + x.
   * Up to MML_HROWS rows may be asked for before the first of them is announced. */
  uint8_t *(*dst)(void *ctx, int y);
  void (*done)(void *ctx, int y); /* row y is written; rows come in increasing y */
  void *ctx;
  size_t plane;
} row_out;

typedef struct resize_job {
  mml_vision_scratch *s;
  int dst_w, dst_h;
  int expect_w, expect_h; /* 0: accept the decoder's size (fast JPEG decode) */
  int h_first_always;     /* Pillow <= 12 order */
  row_out out;
  int src_w, src_h;
  int need_h, need_v, vfirst;
  int ring_n;
  size_t slot;    /* bytes per ring row */
  size_t pstride; /* bytes per pend row (a source-width row and MML_ROW_SLACK) */
  int row_end;    /* source rows from here on are not read */
  int next;       /* next vertical output row (or next row when there is no vertical pass) */
  int pend_n, pend_y0; /* rows waiting for the horizontal pass and the first one's index */
} resize_job;

static mml_status job_begin(void *ctx, int w, int h, mml_err *err) {
  resize_job *j = ctx;
  mml_vision_scratch *s = j->s;
  if ((j->expect_w && w != j->expect_w) || (j->expect_h && h != j->expect_h))
    return mml_err_set(err, MML_EDECODE, "decoded size %dx%d differs from the header's %dx%d", w,
                       h, j->expect_w, j->expect_h);
  j->src_w = w;
  j->src_h = h;
  j->need_h = w != j->dst_w;
  j->need_v = h != j->dst_h;
  j->vfirst = j->need_h && j->need_v && !j->h_first_always &&
              mml_resample_vertical_first(w, h, j->dst_w, j->dst_h);
  j->next = j->pend_n = j->pend_y0 = 0;
  j->row_end = h;
  mml_status st;
  size_t in_row = (size_t)w * 3, out_row = (size_t)j->dst_w * 3;
  j->pstride = in_row + MML_ROW_SLACK;
  if (j->need_h) {
    if ((st = mml_resample_axis_prepare(&s->ax, w, j->dst_w, err)) != MML_OK) return st;
    if (mml_bytes_reserve(&s->pend, MML_HROWS * j->pstride) ||
        mml_bytes_reserve(&s->tbuf, mml_resample_tbuf_size(w)))
      return mml_err_set(err, MML_ENOMEM, "resize: out of memory for %d-pixel rows", w);
    memset(s->pend.data, 0, MML_HROWS * j->pstride); /* the slack is read, never used */
  }
  if (j->need_v) {
    if ((st = mml_resample_axis_prepare(&s->ay, h, j->dst_h, err)) != MML_OK) return st;
    int first;
    mml_resample_axis_rows(&s->ay, j->dst_h - 1, &first, &j->row_end);
    j->ring_n = mml_resample_axis_taps(&s->ay) + MML_HROWS;
    j->slot = (j->vfirst || !j->need_h ? in_row : out_row) + MML_ROW_SLACK; /* see job_row_buf */
    if (mml_bytes_reserve(&s->ring, (size_t)j->ring_n * j->slot))
      return mml_err_set(err, MML_ENOMEM, "resize: out of memory for %d rows of %zu bytes",
                         j->ring_n, j->slot);
    if ((size_t)j->ring_n > s->rp_cap) {
      const uint8_t **rp = realloc(s->rp, (size_t)j->ring_n * sizeof *rp);
      if (!rp) return mml_err_set(err, MML_ENOMEM, "resize: out of memory");
      s->rp = rp;
      s->rp_cap = (size_t)j->ring_n;
    }
  }
  return MML_OK;
}

static uint8_t *ring_row(const resize_job *j, int r) {
  return j->s->ring.data + (size_t)(r % j->ring_n) * j->slot;
}

/* Interleaved RGB -> planar (channel c of pixel x at dst + c*plane + x). */
static void split_planar(const uint8_t *restrict rgb, int w, uint8_t *restrict dst, size_t plane) {
  uint8_t *restrict r = dst, *restrict g = dst + plane, *restrict b = dst + 2 * plane;
  for (int x = 0; x < w; x++) {
    r[x] = rgb[3 * x];
    g[x] = rgb[3 * x + 1];
    b[x] = rgb[3 * x + 2];
  }
}

static void drain(resize_job *j, int last);

/* Runs the horizontal pass on the pending rows.  Horizontal-first: results go to the ring
 * and ready vertical outputs are drained; otherwise the results are output rows. */
static void flush_h(resize_job *j) {
  mml_vision_scratch *s = j->s;
  if (!j->pend_n) return;
  const uint8_t *src[MML_HROWS] = {0};
  uint8_t *dst[MML_HROWS] = {0};
  const int ring = j->need_v && !j->vfirst, n = j->pend_n, y0 = j->pend_y0;
  for (int r = 0; r < n; r++) {
    src[r] = s->pend.data + (size_t)r * j->pstride;
    dst[r] = ring ? ring_row(j, y0 + r) : j->out.dst(j->out.ctx, y0 + r);
  }
  mml_resample_rows_h(&s->ax, src, n, dst, ring ? (size_t)j->dst_w : j->out.plane, s->tbuf.data);
  j->pend_n = 0;
  if (ring) {
    drain(j, y0 + n - 1);
  } else {
    for (int r = 0; r < n; r++) j->out.done(j->out.ctx, y0 + r);
  }
}

static uint8_t *pend_slot(resize_job *j, int y) {
  if (!j->pend_n) j->pend_y0 = y;
  return j->s->pend.data + (size_t)(j->pend_n++) * j->pstride;
}

/* Produces every vertical output whose input rows (up to `last`) are all in the ring. */
static void drain(resize_job *j, int last) {
  mml_vision_scratch *s = j->s;
  while (j->next < j->dst_h) {
    int f, l;
    mml_resample_axis_rows(&s->ay, j->next, &f, &l);
    if (l - 1 > last) break;
    for (int r = f; r < l; r++) s->rp[r - f] = ring_row(j, r);
    if (j->vfirst) {
      mml_resample_row_v(&s->ay, j->next, s->rp, 0, j->src_w * 3, pend_slot(j, j->next));
      j->next++;
      if (j->pend_n == MML_HROWS || j->next == j->dst_h) flush_h(j);
    } else { /* planar ring rows of dst_w pixels */
      uint8_t *d = j->out.dst(j->out.ctx, j->next);
      for (int c = 0; c < 3; c++)
        mml_resample_row_v(&s->ay, j->next, s->rp, (size_t)c * j->dst_w, j->dst_w,
                           d + c * j->out.plane);
      j->out.done(j->out.ctx, j->next);
      j->next++;
    }
  }
}

/* mml_row_sink.row_buf: where job_row will keep source row y (a pend or ring slot, both
 * with MML_ROW_SLACK bytes to spare), so the decoder can write it there; NULL when the row
 * is dropped or split.  No state changes: job_row makes the same choice. */
static uint8_t *job_row_buf(void *ctx, int y) {
  resize_job *j = ctx;
  if (!j->need_h) return NULL;
  uint8_t *pend = j->s->pend.data + (size_t)j->pend_n * j->pstride;
  if (!j->need_v) return pend;
  if (j->next >= j->dst_h || y >= j->row_end) return NULL;
  int f, l;
  mml_resample_axis_rows(&j->s->ay, j->next, &f, &l);
  if (y < f && !j->pend_n) return NULL;
  return j->vfirst ? ring_row(j, y) : pend;
}

static mml_status job_row(void *ctx, int y, const uint8_t *rgb, mml_err *err) {
  resize_job *j = ctx;
  (void)err;
  size_t in_row = (size_t)j->src_w * 3;
  if (!j->need_v) {
    if (!j->need_h) {
      split_planar(rgb, j->src_w, j->out.dst(j->out.ctx, y), j->out.plane);
      j->out.done(j->out.ctx, y);
    } else {
      uint8_t *d = pend_slot(j, y);
      if (d != rgb) memcpy(d, rgb, in_row);
      if (j->pend_n == MML_HROWS || y == j->src_h - 1) flush_h(j);
    }
    j->next = y + 1;
    return MML_OK;
  }
  if (j->next >= j->dst_h || y >= j->row_end) return MML_OK;
  int f, l;
  mml_resample_axis_rows(&j->s->ay, j->next, &f, &l);
  if (y < f && !j->pend_n) return MML_OK; /* no output still to come reads this row */
  if (j->need_h && !j->vfirst) {
    uint8_t *d = pend_slot(j, y);
    if (d != rgb) memcpy(d, rgb, in_row);
    if (j->pend_n == MML_HROWS || y == j->row_end - 1) flush_h(j);
  } else {
    uint8_t *d = ring_row(j, y);
    if (j->vfirst) {
      if (d != rgb) memcpy(d, rgb, in_row);
    } else {
      split_planar(rgb, j->src_w, d, (size_t)j->src_w);
    }
    drain(j, y);
  }
  return MML_OK;
}

static mml_status job_done(const resize_job *j, mml_err *err) {
  if (j->next != j->dst_h || j->pend_n)
    return mml_err_set(err, MML_EINTERNAL, "resize produced %d of %d rows", j->next, j->dst_h);
  return MML_OK;
}

static mml_status feed_rgb(resize_job *j, const mml_rgb8 *img, mml_err *err) {
  if (!img || !img->pixels || img->width < 1 || img->height < 1 ||
      img->stride < (size_t)img->width * 3)
    return mml_err_set(err, MML_EINVAL, "bad RGB8 image");
  mml_status st = job_begin(j, img->width, img->height, err);
  if (st != MML_OK) return st;
  for (int y = 0; y < img->height; y++) job_row(j, y, img->pixels + (size_t)y * img->stride, err);
  return job_done(j, err);
}

/* ---------------------------------------------------------------- normalise + patchify */

typedef struct patch_ctx patch_ctx;
/* A writer: every patch of block row bh, patch columns [bw0, bw1), in one pixel format. */
typedef void (*patch_writer)(patch_ctx *g, int bh, int bw0, int bw1);

struct patch_ctx {
  int P, M, gw;
  int S, slot0, nslots; /* frame slots per output row; the ones this image fills */
  uint8_t *out;         /* first output row */
  size_t row_bytes;     /* bytes per output row: 3*S*P*P values */
  patch_writer write;   /* the writer of the format (patch_ctx_init) */
  uint8_t *block;   /* 2 x 3 planes x P*M output rows of W+16 bytes (scratch) */
  size_t half;      /* bytes of one block */
  float *ptmp;      /* one patch row (row_bytes), 64-byte aligned, or NULL */
  int fast;         /* the AVX2 float32 writer may use norm8_fast (verified for this config) */
  int pend_bh, pend_bw; /* block row still being written (-1: none), next patch column */
  float mean[3], std[3];
  const float (*lut)[256];     /* [3][256] reference values (scratch) */
  const uint16_t (*lut16)[256]; /* [3][256] the same, rounded to bfloat16 (scratch) */
  /* qwen-vl-utils route: a colour the processor turns white after that route's resize
   * (mml_decoder_color_key), asked of `dec` at the first output row */
  const mml_decoder *dec;
  int key;                 /* -1: not asked yet, 0: none, 1: kc */
  uint8_t kc[3];
};

/* float32 -> bfloat16, round to nearest even (the values are finite). */
static uint16_t bf16_rne(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static void build_lut(const float mean[3], const float std[3], float lut[3][256],
                      uint16_t lut16[3][256]) {
  for (int c = 0; c < 3; c++) {
    const float m = mean[c], sd = std[c];
    for (int v = 0; v < 256; v++) {
      float x = (float)((double)v * (1.0 / 255.0));
      lut[c][v] = (x - m) / sd;
      lut16[c][v] = bf16_rne(lut[c][v]);
    }
  }
}

/* The source bytes of patch row (c, py) of the patch at block column x0 (planar block). */
static const uint8_t *patch_src(const patch_ctx *g, int bh, int c, int mh, int py, int x0) {
  const size_t W = (size_t)g->gw * g->P + 16;
  return g->block + (size_t)(bh & 1) * g->half + (size_t)c * g->P * g->M * W +
         (size_t)(mh * g->P + py) * W + x0;
}

/* Output row r of block row bh, patch column bw, merge position (mh, mw). */
static uint8_t *patch_row(const patch_ctx *g, int bh, int bw, int mh, int mw) {
  const int64_t r = ((int64_t)(bh * (g->gw / g->M) + bw) * g->M + mh) * g->M + mw;
  return g->out + r * (int64_t)g->row_bytes;
}

/* Runs BODY for every patch row (c, py) of every patch of block row bh in [bw0, bw1), in
 * output memory order, with `row` the output row, `s` the P source bytes and `k` the
 * value index of (c, slot0, py, 0) in the row. */
#define FOR_PATCH_ROWS(g, bh, bw0, bw1, BODY)                                      \
  for (int bw = (bw0); bw < (bw1); bw++)                                          \
    for (int mh = 0; mh < (g)->M; mh++)                                           \
      for (int mw = 0; mw < (g)->M; mw++) {                                       \
        uint8_t *row = patch_row((g), (bh), bw, mh, mw);                          \
        const int x0 = (bw * (g)->M + mw) * (g)->P;                               \
        for (int c = 0; c < 3; c++)                                               \
          for (int py = 0; py < (g)->P; py++) {                                   \
            const uint8_t *restrict s = patch_src((g), (bh), c, mh, py, x0);      \
            const size_t k = ((size_t)(c * (g)->S + (g)->slot0) * (g)->P + py) * (g)->P; \
            BODY                                                                  \
          }                                                                       \
      }

/* Writes P table values to each of the image's frame slots of one patch row.  PCONST is
 * a compile-time constant in the common cases (14, 16) so the loops unroll. */
#define SLOT_ROW(TYPE, PCONST)                                                    \
  do {                                                                            \
    TYPE v[PCONST];                                                               \
    for (int px = 0; px < (PCONST); px++) v[px] = l[s[px]];                       \
    for (int t = 0; t < g->nslots; t++) {                                         \
      TYPE *restrict d = d0 + (size_t)t * PP;                                     \
      for (int px = 0; px < (PCONST); px++) d[px] = v[px];                        \
    }                                                                             \
  } while (0)

#define TABLE_WRITER(NAME, TYPE, LUT)                                             \
  static void NAME(patch_ctx *g, int bh, int bw0, int bw1) {                      \
    const int P = g->P, PP = P * P;                                               \
    FOR_PATCH_ROWS(g, bh, bw0, bw1, {                                             \
      const TYPE *l = g->LUT[c];                                                  \
      TYPE *d0 = (TYPE *)row + k;                                                 \
      if (P == 14)                                                                \
        SLOT_ROW(TYPE, 14);                                                       \
      else if (P == 16)                                                           \
        SLOT_ROW(TYPE, 16);                                                       \
      else                                                                        \
        for (int t = 0; t < g->nslots; t++)                                       \
          for (int px = 0; px < P; px++) d0[(size_t)t * PP + px] = l[s[px]];      \
    })                                                                            \
  }

/* float32: the reference values through the table (portable). */
TABLE_WRITER(write_f32, float, lut)
/* bfloat16: the same values rounded to nearest even. */
TABLE_WRITER(write_bf16, uint16_t, lut16)

/* uint8: the resized bytes themselves, in the same (c, slot, py, px) order. */
static void write_u8(patch_ctx *g, int bh, int bw0, int bw1) {
  const int P = g->P, PP = P * P;
  FOR_PATCH_ROWS(g, bh, bw0, bw1, {
    for (int t = 0; t < g->nslots; t++) memcpy(row + k + (size_t)t * PP, s, (size_t)P);
  })
}
#undef TABLE_WRITER
#undef SLOT_ROW

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* Eight normalised values from eight bytes, with exactly the reference's operations:
 * float32(double(v) * (1/255)), then (x - mean) / std in float32. */
__attribute__((target("avx2"))) static inline __m256 norm8(const uint8_t *s, __m256d inv255,
                                                           __m256 mean, __m256 sd) {
  int32_t lo4, hi4;
  memcpy(&lo4, s, 4);
  memcpy(&hi4, s + 4, 4);
  __m256d lo = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(lo4))), inv255);
  __m256d hi = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(hi4))), inv255);
  __m256 f = _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
  return _mm256_div_ps(_mm256_sub_ps(f, mean), sd);
}

/* The same values without double precision or division: each quotient is a product with
 * the float reciprocal plus one FMA correction step.  That is correctly rounded for almost
 * all operands but not provably for all, so it is only used when norm_fast_exact() found
 * it equal, bit for bit, to the reference for all 256 byte values of every channel. */
__attribute__((target("avx2,fma"))) static inline __m256 norm8_fast(const uint8_t *s,
                                                                    __m256 mean, __m256 sd,
                                                                    __m256 rsd) {
  const __m256 c255 = _mm256_set1_ps(255.0f), r255 = _mm256_set1_ps(1.0f / 255.0f);
  __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)s)));
  __m256 q = _mm256_mul_ps(v, r255);
  __m256 x = _mm256_fmadd_ps(_mm256_fnmadd_ps(q, c255, v), r255, q);
  __m256 a = _mm256_sub_ps(x, mean);
  __m256 y = _mm256_mul_ps(a, rsd);
  return _mm256_fmadd_ps(_mm256_fnmadd_ps(y, sd, a), rsd, y);
}

__attribute__((target("avx2,fma"))) static int norm_fast_exact(const float mean[3],
                                                               const float std[3],
                                                               const float lut[3][256]) {
  uint8_t bytes[256];
  for (int v = 0; v < 256; v++) bytes[v] = (uint8_t)v;
  for (int c = 0; c < 3; c++) {
    const __m256 m = _mm256_set1_ps(mean[c]), sd = _mm256_set1_ps(std[c]);
    const __m256 rsd = _mm256_set1_ps(1.0f / std[c]);
    for (int v = 0; v < 256; v += 8) {
      float got[8];
      _mm256_storeu_ps(got, norm8_fast(bytes + v, m, sd, rsd));
      if (memcmp(got, &lut[c][v], sizeof got)) return 0;
    }
  }
  return 1;
}

/* The AVX2 float32 writer for 8 <= P <= 16: each patch row is two overlapping groups of
 * eight values (px 0..7 and P-8..P-1), stored to the image's slots.  A patch is assembled
 * in an aligned scratch row and written with non-temporal stores when the image fills
 * whole, aligned rows (pixel_values is far larger than the caches, so this saves reading
 * every output line before writing it). */
__attribute__((target("avx2,fma"))) static void write_f32_avx2(patch_ctx *g, int bh, int bw0,
                                                               int bw1) {
  const int P = g->P, PP = P * P;
  const __m256d inv255 = _mm256_set1_pd(1.0 / 255.0);
  __m256 mean[3], sd[3], rsd[3];
  for (int c = 0; c < 3; c++) {
    mean[c] = _mm256_set1_ps(g->mean[c]);
    sd[c] = _mm256_set1_ps(g->std[c]);
    rsd[c] = _mm256_set1_ps(1.0f / g->std[c]);
  }
  const int fast = g->fast;
  const size_t nf = g->row_bytes / sizeof(float);
  const int stream = g->ptmp && g->nslots == g->S && ((uintptr_t)g->out % 32) == 0 &&
                     g->row_bytes % 32 == 0;
  for (int bw = bw0; bw < bw1; bw++)
    for (int mh = 0; mh < g->M; mh++)
      for (int mw = 0; mw < g->M; mw++) {
        float *dst = (float *)patch_row(g, bh, bw, mh, mw);
        float *o = stream ? g->ptmp : dst;
        const int x0 = (bw * g->M + mw) * P;
        for (int c = 0; c < 3; c++)
          for (int py = 0; py < P; py++) {
            const uint8_t *s = patch_src(g, bh, c, mh, py, x0);
            __m256 f0, f1;
            if (fast) {
              f0 = norm8_fast(s, mean[c], sd[c], rsd[c]);
              f1 = norm8_fast(s + P - 8, mean[c], sd[c], rsd[c]);
            } else {
              f0 = norm8(s, inv255, mean[c], sd[c]);
              f1 = norm8(s + P - 8, inv255, mean[c], sd[c]);
            }
            float *d = o + ((size_t)(c * g->S + g->slot0) * P + py) * P;
            for (int t = 0; t < g->nslots; t++, d += PP) {
              _mm256_storeu_ps(d, f0);
              _mm256_storeu_ps(d + P - 8, f1);
            }
          }
        if (stream)
          for (size_t i = 0; i < nf; i += 8) _mm256_stream_ps(dst + i, _mm256_load_ps(o + i));
      }
  if (stream) _mm_sfence();
}
#define MML_HAVE_AVX2_PATCH 1
#endif
#undef FOR_PATCH_ROWS

/* Writes patch columns [bw0, bw1) of block row bh. */
static void write_patches(patch_ctx *g, int bh, int bw0, int bw1) {
  if (bw0 < bw1) g->write(g, bh, bw0, bw1);
}

/* Writes what is left of the waiting block. */
static void finish_pending(patch_ctx *g) {
  if (g->pend_bh < 0) return;
  write_patches(g, g->pend_bh, g->pend_bw, g->gw / g->M);
  g->pend_bh = -1;
}

/* row_out for patchify: output rows go straight into the planar block.  A full block is
 * not written out at once: its patches are written a share per output row of the next
 * block (two blocks alternate), so the stream of output stores is spread over the whole
 * decode and resize instead of stalling on memory bandwidth in bursts. */
static uint8_t *patch_dst(void *ctx, int y) {
  patch_ctx *g = ctx;
  const int PM = g->P * g->M, b = y / PM;
  if (g->pend_bh >= 0 && b >= g->pend_bh + 2) finish_pending(g); /* its half is reused */
  return g->block + (size_t)(b & 1) * g->half + (size_t)(y % PM) * (g->gw * g->P + 16);
}

static void patch_done(void *ctx, int y) {
  patch_ctx *g = ctx;
  const int PM = g->P * g->M, in_block = y % PM + 1, bw_n = g->gw / g->M;
  if (g->key < 0) g->key = mml_decoder_color_key(g->dec, g->kc);
  if (g->key) { /* the keyed colour of the resized row becomes white */
    const size_t stride = (size_t)g->gw * g->P + 16, plane = (size_t)PM * stride;
    uint8_t *r = g->block + (size_t)((y / PM) & 1) * g->half + (size_t)(y % PM) * stride;
    for (int x = 0; x < g->gw * g->P; x++)
      if (r[x] == g->kc[0] && r[plane + x] == g->kc[1] && r[2 * plane + x] == g->kc[2])
        r[x] = r[plane + x] = r[2 * plane + x] = 255;
  }
  if (g->pend_bh >= 0) {
    int to = (int)(((int64_t)bw_n * in_block + PM - 1) / PM);
    write_patches(g, g->pend_bh, g->pend_bw, to);
    if (to > g->pend_bw) g->pend_bw = to;
  }
  if (in_block == PM) {
    finish_pending(g);
    g->pend_bh = y / PM;
    g->pend_bw = 0;
  }
}

/* The normalisation tables of cfg's mean and std (rebuilt only when they change). */
static void scratch_tables(mml_vision_scratch *s, const float mean[3], const float std[3]) {
  if (s->norm_valid && !memcmp(s->norm_mean, mean, sizeof s->norm_mean) &&
      !memcmp(s->norm_std, std, sizeof s->norm_std))
    return;
  build_lut(mean, std, s->lut, s->lut16);
  s->norm_fast = 0;
#ifdef MML_HAVE_AVX2_PATCH
  s->norm_fast = mml_cpu_fma() && norm_fast_exact(mean, std, s->lut);
#endif
  memcpy(s->norm_mean, mean, sizeof s->norm_mean);
  memcpy(s->norm_std, std, sizeof s->norm_std);
  s->norm_valid = 1;
}

/* Picks the writer of cfg->pixel_format (the AVX2 one for float32 where it runs). */
static void pick_writer(patch_ctx *g, mml_vision_scratch *s, int format) {
  g->write = format == MML_PIXEL_UINT8 ? write_u8 : format == MML_PIXEL_BFLOAT16 ? write_bf16
                                                                                 : write_f32;
  g->fast = 0;
  g->ptmp = NULL;
#ifdef MML_HAVE_AVX2_PATCH
  if (format == MML_PIXEL_FLOAT32 && mml_cpu_avx2() && g->P >= 8 && g->P <= 16) {
    g->write = write_f32_avx2;
    g->fast = s->norm_fast;
    size_t need = g->row_bytes / sizeof(float) + 16;
    if (s->ptmp_cap < need) {
      free(s->ptmp);
      s->ptmp_cap = 0;
      if (posix_memalign((void **)&s->ptmp, 64, need * sizeof(float))) s->ptmp = NULL;
      else s->ptmp_cap = need;
    }
    g->ptmp = s->ptmp; /* NULL (allocation failed): plain stores */
  }
#endif
}

static mml_status patch_ctx_init(patch_ctx *g, mml_vision_scratch *s, const mml_vision_cfg *cfg,
                                 const mml_vision_plan *plan, const mml_pixel_dst *dst,
                                 mml_err *err) {
  size_t half = ((size_t)plan->dst_w + 16) * 3 * cfg->patch_size * cfg->merge_size, n = 2 * half;
  if (mml_bytes_reserve(&s->block, n))
    return mml_err_set(err, MML_ENOMEM, "vision: out of memory for a %zu-byte block", n);
  memset(g, 0, sizeof *g);
  g->block = s->block.data;
  g->half = half;
  g->P = cfg->patch_size;
  g->M = cfg->merge_size;
  g->gw = plan->grid_w;
  g->out = dst->out;
  g->S = dst->slots;
  g->slot0 = dst->slot0;
  g->nslots = dst->nslots;
  g->row_bytes = (size_t)3 * g->S * g->P * g->P * mml_dtype_size(mml_vision_pixel_dtype(cfg));
  for (int c = 0; c < 3; c++) {
    g->mean[c] = cfg->mean[c];
    g->std[c] = cfg->std[c];
  }
  g->pend_bh = -1;
  scratch_tables(s, g->mean, g->std);
  g->lut = (const float(*)[256])s->lut;
  g->lut16 = (const uint16_t(*)[256])s->lut16;
  pick_writer(g, s, cfg->pixel_format);
  return MML_OK;
}

static row_out patch_out(patch_ctx *g) {
  return (row_out){patch_dst, patch_done, g, (size_t)g->P * g->M * (g->gw * g->P + 16)};
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
      plan->dst_h % (P * M) || plan->grid_w != plan->dst_w / P ||
      plan->grid_h != plan->dst_h / P || plan->rows != (int64_t)plan->grid_h * plan->grid_w)
    return mml_err_set(err, MML_EINVAL, "vision: plan does not fit this configuration");
  if (dst->slots < 1 || dst->slots > cfg->temporal_patch_size || dst->slot0 < 0 ||
      dst->nslots < 1 || dst->slot0 + dst->nslots > dst->slots)
    return mml_err_set(err, MML_EINVAL, "vision: frame slots [%d, %d) of %d do not fit T=%d",
                       dst->slot0, dst->slot0 + dst->nslots, dst->slots,
                       cfg->temporal_patch_size);
  return MML_OK;
}

/* A still image's destination: all frame slots of its rows (one for uint8). */
static mml_status image_dst(const mml_vision_cfg *cfg, const mml_vision_plan *plan, void *out,
                            mml_pixel_dst *dst, mml_err *err) {
  const int slots = cfg->pixel_format == MML_PIXEL_UINT8 ? 1 : cfg->temporal_patch_size;
  *dst = (mml_pixel_dst){out, slots, 0, slots};
  if (plan && plan->cols != mml_vision_pixel_cols(cfg))
    return mml_err_set(err, MML_EINVAL, "vision: plan has %d columns, the %s format %d",
                       plan->cols, mml_dtype_name(mml_vision_pixel_dtype(cfg)),
                       mml_vision_pixel_cols(cfg));
  return check_plan(cfg, plan, dst, err);
}

/* The row sink of process_bytes, timed: the decoder's own time is the decode call's time
 * less the time spent in these callbacks (resize and patchify of the rows it hands out). */
typedef struct timed_job {
  resize_job *j;
  double in_rows;
} timed_job;

static mml_status timed_begin(void *ctx, int w, int h, mml_err *err) {
  return job_begin(((timed_job *)ctx)->j, w, h, err);
}

static mml_status timed_row(void *ctx, int y, const uint8_t *rgb, mml_err *err) {
  timed_job *t = ctx;
  double t0 = mml_now();
  mml_status st = job_row(t->j, y, rgb, err);
  t->in_rows += mml_now() - t0;
  return st;
}

static uint8_t *timed_row_buf(void *ctx, int y) {
  return job_row_buf(((timed_job *)ctx)->j, y);
}

mml_status mml_vision_process_bytes(const mml_vision_cfg *cfg, mml_vision_scratch *s,
                                    const uint8_t *data, size_t len,
                                    const mml_vision_plan *plan, void *out, mml_err *err) {
  mml_pixel_dst dst;
  mml_status st = image_dst(cfg, plan, out, &dst, err);
  if (st != MML_OK) return st;
  const mml_decode_opts opts = {
      .strict_jpeg = cfg->strict_jpeg,
      .alpha = cfg->route == MML_ROUTE_LOAD_IMAGE     ? MML_ALPHA_DROP
               : cfg->route == MML_ROUTE_QWEN_VL_UTILS ? MML_ALPHA_PASTE
                                                       : MML_ALPHA_COMPOSITE};
  mml_decoder_set_opts(s->dec, &opts);
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
  if ((st = patch_ctx_init(&g, s, cfg, plan, &dst, err)) != MML_OK) return st;
  if (cfg->route == MML_ROUTE_QWEN_VL_UTILS) g.dec = s->dec, g.key = -1;
  resize_job j = {.s = s, .dst_w = plan->dst_w, .dst_h = plan->dst_h,
                  .expect_w = scale == 1 ? plan->src_w : 0, .expect_h = scale == 1 ? plan->src_h : 0,
                  .h_first_always = cfg->pillow_h_first, .out = patch_out(&g)};
  timed_job tj = {&j, 0.0};
  mml_row_sink sink = {timed_begin, timed_row, &tj, timed_row_buf};
  double t0 = mml_now();
  mml_decoder_set_max_pixels(s->dec, cfg->max_image_pixels);
  st = mml_image_decode_rows(s->dec, data, len, scale, &sink, err);
  s->decode_s += mml_now() - t0 - tj.in_rows;
  if (st == MML_OK) st = job_done(&j, err);
  if (st == MML_OK) finish_pending(&g);
  return st;
}

mml_status mml_vision_process_rgb_dst(const mml_vision_cfg *cfg, mml_vision_scratch *s,
                                      const mml_rgb8 *img, const mml_vision_plan *plan,
                                      const mml_pixel_dst *dst, mml_err *err) {
  mml_status st = check_plan(cfg, plan, dst, err);
  if (st != MML_OK) return st;
  patch_ctx g;
  if ((st = patch_ctx_init(&g, s, cfg, plan, dst, err)) != MML_OK) return st;
  resize_job j = {.s = s, .dst_w = plan->dst_w, .dst_h = plan->dst_h, .expect_w = plan->src_w,
                  .expect_h = plan->src_h, .h_first_always = cfg->pillow_h_first,
                  .out = patch_out(&g)};
  st = feed_rgb(&j, img, err);
  if (st == MML_OK) finish_pending(&g);
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
  resize_job j = {.s = s, .dst_w = dst_w, .dst_h = dst_h, .h_first_always = h_first_always,
                  .out = {copy_dst, copy_done, &c, (size_t)dst_w}};
  return feed_rgb(&j, src, err);
}

mml_status mml_resize_bicubic_rgb8(mml_vision_scratch *s, const mml_rgb8 *src, int dst_w,
                                   int dst_h, uint8_t *dst, mml_err *err) {
  return mml_resize_bicubic_rgb8_order(s, src, dst_w, dst_h, 0, dst, err);
}
