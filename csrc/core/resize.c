/*
 * resize.c — Pillow-exact bicubic resampling of RGB8 (the algorithm of Pillow's
 * libImaging/Resample.c for 8-bit images, re-derived and checked byte for byte against
 * Pillow by tests/test_vision.py):
 *
 *   scale = in / out, filterscale = max(scale, 1), support = 2 * filterscale
 *   output i: center = (i + 0.5) * scale
 *             xmin = max(0, (int)(center - support + 0.5)), xmax = min(in, (int)(center + support + 0.5))
 *             w_j = K((j + xmin - center + 0.5) / filterscale), normalised to sum 1,
 *             then round-half-away-from-zero to 22 fractional bits
 *   value  = clip8((1 << 21) + sum w_j * in[xmin + j]) >> 22)
 *
 * with the bicubic kernel K (a = -0.5) evaluated in the same operation order as Pillow so
 * the double weights, and hence the fixed-point weights, are identical.  Each pass rounds
 * to uint8; a pass whose size does not change is skipped; the order of the passes is
 * Pillow 13's (mml_resample_vertical_first in resize.h) — the caller runs them.
 *
 * Threads: axes are per-thread scratch; the row functions are pure.
 */
#include "resize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PRECISION_BITS 22

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define MML_HOT __attribute__((target_clones("avx2", "default")))
#else
#define MML_HOT
#endif

static double bicubic(double x) {
  const double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

mml_status mml_resample_axis_prepare(mml_resample_axis *a, int in, int out, mml_err *err) {
  if (a->in == in && a->out == out && a->k) return MML_OK;
  if (in < 1 || out < 1) return mml_err_set(err, MML_EINVAL, "resize: bad sizes %d -> %d", in, out);
  double scale = (double)in / out;
  double filterscale = scale < 1.0 ? 1.0 : scale;
  double support = 2.0 * filterscale;
  int ksize = (int)ceil(support) * 2 + 1;
  size_t nk = (size_t)out * (size_t)ksize;
  if (nk > a->cap_k) {
    int32_t *k = realloc(a->k, nk * sizeof *k);
    if (k) a->k = k;
    double *pre = realloc(a->pre, nk * sizeof *pre);
    if (pre) a->pre = pre;
    if (!k || !pre) {
      a->in = a->out = 0;
      return mml_err_set(err, MML_ENOMEM, "resize: out of memory for %zu coefficients", nk);
    }
    a->cap_k = nk;
  }
  if ((size_t)out * 2 > a->cap_b) {
    int *b = realloc(a->bounds, (size_t)out * 2 * sizeof *b);
    if (!b) {
      a->in = a->out = 0;
      return mml_err_set(err, MML_ENOMEM, "resize: out of memory for %d bounds", out);
    }
    a->bounds = b;
    a->cap_b = (size_t)out * 2;
  }
  double ss = 1.0 / filterscale;
  for (int xx = 0; xx < out; xx++) {
    double center = (xx + 0.5) * scale;
    double ww = 0.0;
    int xmin = (int)(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = (int)(center + support + 0.5);
    if (xmax > in) xmax = in;
    xmax -= xmin;
    double *k = &a->pre[(size_t)xx * ksize];
    int x;
    for (x = 0; x < xmax; x++) {
      double w = bicubic((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (x = 0; x < xmax; x++)
      if (ww != 0.0) k[x] /= ww;
    for (; x < ksize; x++) k[x] = 0;
    a->bounds[xx * 2] = xmin;
    a->bounds[xx * 2 + 1] = xmax;
  }
  for (size_t i = 0; i < nk; i++) {
    double p = a->pre[i];
    a->k[i] = p < 0 ? (int32_t)(-0.5 + p * (1 << PRECISION_BITS))
                    : (int32_t)(0.5 + p * (1 << PRECISION_BITS));
  }
  a->in = in;
  a->out = out;
  a->ksize = ksize;
  return MML_OK;
}

void mml_resample_axis_free(mml_resample_axis *a) {
  free(a->k);
  free(a->pre);
  free(a->bounds);
  memset(a, 0, sizeof *a);
}

static inline uint8_t clip8(int32_t v) {
  v >>= PRECISION_BITS; /* arithmetic shift, as in Pillow */
  return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

void mml_resample_row_h(const mml_resample_axis *a, const uint8_t *restrict src,
                        uint8_t *restrict dst) {
  const int ksize = a->ksize;
  for (int xx = 0; xx < a->out; xx++) {
    const int xmin = a->bounds[xx * 2], n = a->bounds[xx * 2 + 1];
    const int32_t *k = &a->k[(size_t)xx * ksize];
    const uint8_t *s = src + (size_t)xmin * 3;
    int32_t r = 1 << (PRECISION_BITS - 1), g = r, b = r;
    for (int j = 0; j < n; j++) {
      r += s[3 * j] * k[j];
      g += s[3 * j + 1] * k[j];
      b += s[3 * j + 2] * k[j];
    }
    dst[3 * xx] = clip8(r);
    dst[3 * xx + 1] = clip8(g);
    dst[3 * xx + 2] = clip8(b);
  }
}

MML_HOT
void mml_resample_row_v(const mml_resample_axis *a, int y, const uint8_t *const *rows, int n,
                        int32_t *restrict acc, uint8_t *restrict dst) {
  const int cnt = a->bounds[y * 2 + 1];
  const int32_t *k = &a->k[(size_t)y * a->ksize];
  for (int i = 0; i < n; i++) acc[i] = 1 << (PRECISION_BITS - 1);
  for (int j = 0; j < cnt; j++) {
    const uint8_t *restrict row = rows[j];
    const int32_t w = k[j];
    for (int i = 0; i < n; i++) acc[i] += row[i] * w;
  }
  for (int i = 0; i < n; i++) {
    int32_t v = acc[i] >> PRECISION_BITS;
    dst[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
  }
}
