/*
 * video_resize_u8.c — torch's native uint8 antialiased bicubic resize
 * (torch.nn.functional.interpolate(x_uint8, size, mode="bicubic", antialias=True,
 * align_corners=False) on CPU), which torchvision's v2 resize runs on uint8 video tensors:
 * what transformers' video processors do to the PIL frames LLaMA-Factory hands them
 * (recipe="llama-factory").  aten/src/ATen/native/cpu/UpSampleKernel.cpp
 * (HelperInterpCubic, _compute_index_ranges_int16_weights) and its AVX2 passes:
 *
 *   1. per axis, in doubles: scale = in / out, support = 2 * scale (scale >= 1) else 2,
 *      invscale = 1 / scale or 1, taps = ceil(support) * 2 + 1; output i: center =
 *      scale * (i + 0.5), xmin = max(0, (int64)(center - support + 0.5)), xsize =
 *      min((int64)(center + support + 0.5), in) - xmin clamped to [0, taps];
 *      w_j = K((j + xmin - center + 0.5) * invscale), Keys' cubic a = -0.5 in torch's
 *      operation order (cubic_convolution1/2), normalised by their sum;
 *   2. the axis's precision p: the largest p < 22 with (int)(0.5 + wmax * 2^(p+1)) < 2^15
 *      (wmax: the largest normalised weight of the axis); weights become int16
 *      (int)(w * 2^p +- 0.5);
 *   3. out = clamp(((1 << (p - 1)) + sum w_j * in[xmin + j]) >> p, 0, 255) (arithmetic
 *      shift), the horizontal pass first, then the vertical one on its uint8 result; a
 *      pass whose size does not change is skipped (the sum is exact in any order, so the
 *      scalar loops here give the vector kernels' bytes).
 *
 * Threads: pure; the caller owns the buffers (scratch is allocated per call).
 */
#include <math.h>
#include <stdlib.h>

#include "mml/video_resize.h"

static double cubic(double x) {
  const double a = -0.5;
  x = fabs(x);
  if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0;
}

typedef struct u8_axis {
  int taps, prec;
  int64_t *xmin, *xsize;
  int16_t *w;
} u8_axis;

static void axis_free(u8_axis *a) {
  free(a->xmin);
  free(a->xsize);
  free(a->w);
}

static mml_status axis_make(u8_axis *a, int in, int out, mml_err *err) {
  const double scale = (double)in / out, support = scale >= 1.0 ? 2.0 * scale : 2.0;
  const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  a->taps = (int)ceil(support) * 2 + 1;
  a->xmin = malloc((size_t)out * sizeof *a->xmin);
  a->xsize = malloc((size_t)out * sizeof *a->xsize);
  a->w = malloc((size_t)out * a->taps * sizeof *a->w);
  double *wd = malloc((size_t)out * a->taps * sizeof *wd);
  if (!a->xmin || !a->xsize || !a->w || !wd) {
    free(wd);
    return mml_err_set(err, MML_ENOMEM, "video: out of memory for resize weights");
  }
  double wmax = 0.0;
  for (int i = 0; i < out; i++) { /* 1. */
    const double center = scale * (i + 0.5);
    int64_t xmin = (int64_t)(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int64_t hi = (int64_t)(center + support + 0.5);
    int64_t xsize = (hi < in ? hi : in) - xmin;
    xsize = xsize < 0 ? 0 : xsize > a->taps ? a->taps : xsize;
    double *w = wd + (size_t)i * a->taps, total = 0.0;
    for (int j = 0; j < xsize; j++) total += (w[j] = cubic((j + xmin - center + 0.5) * invscale));
    for (int j = 0; j < a->taps; j++) {
      if (j >= xsize)
        w[j] = 0.0;
      else if (total != 0.0)
        w[j] /= total;
      if (j < xsize && total != 0.0 && w[j] > wmax) wmax = w[j];
    }
    a->xmin[i] = xmin, a->xsize[i] = xsize;
  }
  int p = 0;
  for (p = 0; p < 22; p++) /* 2. */
    if ((int)(0.5 + wmax * (1 << (p + 1))) >= (1 << 15)) break;
  a->prec = p;
  for (size_t k = 0; k < (size_t)out * a->taps; k++) {
    const double v = wd[k] * (1 << p);
    a->w[k] = (int16_t)(v < 0 ? (int)(-0.5 + v) : (int)(0.5 + v));
  }
  free(wd);
  return MML_OK;
}

static inline uint8_t out8(int64_t acc, int prec) {
  int64_t v = acc >> prec; /* 3.: arithmetic shift */
  return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* One pass over n lines: line l reads src + l * lstride, element x at x * estride. */
static void pass(const u8_axis *a, int out, const uint8_t *src, size_t lstride, size_t estride,
                 uint8_t *dst, size_t dlstride, size_t destride, int n) {
  for (int l = 0; l < n; l++) {
    const uint8_t *s = src + (size_t)l * lstride;
    uint8_t *d = dst + (size_t)l * dlstride;
    for (int i = 0; i < out; i++) {
      const int16_t *w = a->w + (size_t)i * a->taps;
      const uint8_t *x = s + (size_t)a->xmin[i] * estride;
      int64_t acc = a->prec > 0 ? (int64_t)1 << (a->prec - 1) : 0;
      for (int64_t j = 0; j < a->xsize[i]; j++) acc += (int64_t)w[j] * x[(size_t)j * estride];
      d[(size_t)i * destride] = out8(acc, a->prec);
    }
  }
}

mml_status mml_resize_aa_bicubic_u8(const uint8_t *src, int planes, int sw, int sh, uint8_t *dst,
                                    int dw, int dh, mml_err *err) {
  if (!src || !dst || planes < 1 || sw < 1 || sh < 1 || dw < 1 || dh < 1)
    return mml_err_set(err, MML_EINVAL, "video: bad uint8 resize %dx%d -> %dx%d", sw, sh, dw, dh);
  const int need_h = sw != dw, need_v = sh != dh;
  u8_axis ax = {0}, ay = {0};
  uint8_t *mid = NULL;
  mml_status st = MML_OK;
  if (need_h) st = axis_make(&ax, sw, dw, err);
  if (!st && need_v) st = axis_make(&ay, sh, dh, err);
  if (!st && need_h && need_v && !(mid = malloc((size_t)planes * dw * sh)))
    st = mml_err_set(err, MML_ENOMEM, "video: out of memory for a %dx%d frame", dw, sh);
  for (int c = 0; !st && c < planes; c++) {
    const uint8_t *s = src + (size_t)c * sw * sh;
    uint8_t *d = dst + (size_t)c * dw * dh;
    if (need_h && need_v) {
      uint8_t *m = mid + (size_t)c * dw * sh;
      pass(&ax, dw, s, (size_t)sw, 1, m, (size_t)dw, 1, sh);
      pass(&ay, dh, m, 1, (size_t)dw, d, 1, (size_t)dw, dw);
    } else if (need_h) {
      pass(&ax, dw, s, (size_t)sw, 1, d, (size_t)dw, 1, sh);
    } else if (need_v) {
      pass(&ay, dh, s, 1, (size_t)sw, d, 1, (size_t)dw, sw);
    } else {
      for (size_t k = 0; k < (size_t)sw * sh; k++) d[k] = s[k];
    }
  }
  free(mid);
  axis_free(&ax);
  axis_free(&ay);
  return st;
}
