/*
 * video_resize.c — torch's antialiased bicubic interpolation of float32 planes
 * (torch.nn.functional.interpolate(x, size, mode="bicubic", antialias=True,
 * align_corners=False) on a float32 CPU tensor), which the video paths of qwen-vl-utils
 * (torchvision.transforms.functional.resize) and of transformers' video processors
 * (torchvision v2 resize of float videos) run.  torchvision cannot be installed beside
 * the CPU torch of the test environment; this reproduces the torch kernel it calls
 * (aten/src/ATen/native/cpu/UpSampleKernel.cpp, the separable AA path), and the tests
 * compare against F.interpolate directly.
 *
 * The kernel, as torch computes it in float32 (scalar_t = float):
 *   scale = in / out;  support = 2 * scale (scale >= 1) else 2;  invscale = 1 / scale or 1
 *   for output i: center = scale * (i + 0.5); xmin = max(0, (int)(center - support + 0.5));
 *   xsize = min(in, (int)(center + support + 0.5)) - xmin (clamped to ceil(support)*2+1);
 *   w_j = K((j + xmin - center + 0.5) * invscale), Keys cubic with a = -0.5, normalised
 *   by their float sum; out = src[xmin] * w_0, then out = fma(src[xmin + j], w_j, out)
 *   for j = 1 .. xsize-1, left to right (torch's CPU kernels are built with FMA
 *   contraction).
 * Width is resampled first, then height; an unchanged axis is skipped.
 * The weights are computed as torch's C++ writes them and compiled the way torch compiles
 * its CPU kernels: floating-point contraction on, with FMA in the copy used on CPUs that
 * have it (torch's AVX2 kernels are built with -mfma) and without in the other copy
 * (torch's default kernels); the kernel body lives in video_resize_kernel.h, included
 * once per copy.  That is what makes the results bitwise equal.
 *
 * Speed (AVX2 + FMA CPUs): every output element is its own chain of the same operations
 * in the same order, so 8 independent outputs go through one vector chain and each lane
 * gets exactly the scalar result.  Height: 8 neighbouring columns of one output row.
 * Width: 8 rows at a time, transposed into a small column-major block (8 floats per
 * source column) so each output column of the 8 rows is one vector chain, then transposed
 * back.  The _u8 variant clamps to [0, 255] and rounds half to even in the last pass
 * (torchvision's resize of a uint8 video), with the scalar code's exact semantics.
 *
 * Threads: pure; the caller owns every buffer.
 */
#include "mml/video_resize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../vision/resize.h" /* mml_cpu_fma */

#ifndef __clang__ /* GCC only: clang (the fuzz build) ignores it with a warning */
#pragma GCC optimize("fp-contract=fast")
#endif

typedef struct axis {
  int *xmin, *xsize;
  float *w; /* out * taps */
  int taps;
} axis;

static void axis_free(axis *ax) {
  free(ax->xmin);
  free(ax->xsize);
  free(ax->w);
}

/* torchvision's uint8 video resize: clamp (no NaN here), round half to even. */
static inline float round_u8(float b) {
  float v = b < 0.0f ? 0.0f : b > 255.0f ? 255.0f : b;
  return nearbyintf(v);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MML_VRESIZE_AVX2 1
#define K(name) name##_fma
#define KFN __attribute__((target("fma")))
#define KFMA(a, b, c) fmaf(a, b, c)
#include "video_resize_kernel.h"
#undef K
#undef KFN
#undef KFMA
#endif
#define K(name) name##_plain
#define KFN
#define KFMA(a, b, c) ((a) * (b) + (c))
#include "video_resize_kernel.h"
#undef K
#undef KFN
#undef KFMA

#ifdef MML_VRESIZE_AVX2
/* Below, every operation is spelled out: no contraction. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
#define AVX2FN __attribute__((target("avx2,fma")))

/* round_u8 on 8 lanes: the same comparisons (so -0.0 stays -0.0), then nearbyint. */
AVX2FN static inline __m256 round8(__m256 v) {
  const __m256 z = _mm256_setzero_ps(), hi = _mm256_set1_ps(255.0f);
  v = _mm256_blendv_ps(v, z, _mm256_cmp_ps(v, z, _CMP_LT_OQ));
  v = _mm256_blendv_ps(v, hi, _mm256_cmp_ps(v, hi, _CMP_GT_OQ));
  return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* The operations of one output as the contracted scalar loop of the kernel above runs
 * them (and torch's, built the same way): out = src[0] * w[0]; then the first `nadd`
 * further taps each as out + round(src * w) (the compiler vectorises that part of the
 * tap loop: products in a vector, added in order), the rest as fma(src, w, out).  The
 * horizontal loop is vectorised by 8 then 4 taps, the vertical one (strided) by 4. */
static inline int hadd(int n) { return n < 2 ? 0 : ((n - 1) & ~7) + (((n - 1) & 7) >= 4 ? 4 : 0); }
static inline int vadd(int n) { return n < 2 ? 0 : (n - 1) & ~3; }

AVX2FN static inline float dot1(const float *src, size_t stride, const float *w, int n, int nadd) {
  float out = src[0] * w[0];
  int j = 1;
  for (; j <= nadd; j++) {
    float p = src[(size_t)j * stride] * w[j];
    out = out + p;
  }
  for (; j < n; j++) out = fmaf(src[(size_t)j * stride], w[j], out);
  return out;
}

/* 8 outputs at once: lane l reads src[l + j * stride]. */
AVX2FN static inline __m256 dot8(const float *src, size_t stride, const float *w, int n, int nadd) {
  __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(src), _mm256_set1_ps(w[0]));
  int j = 1;
  for (; j <= nadd; j++)
    acc = _mm256_add_ps(
        acc, _mm256_mul_ps(_mm256_loadu_ps(src + (size_t)j * stride), _mm256_set1_ps(w[j])));
  for (; j < n; j++)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(src + (size_t)j * stride), _mm256_set1_ps(w[j]), acc);
  return acc;
}

AVX2FN static inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; i++) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

/* rows x cols floats (row stride ss) -> cols x rows (row stride ds), rows = 8 */
AVX2FN static void transpose_block(const float *s, size_t ss, int cols, float *d, size_t ds) {
  int c = 0;
  for (; c + 8 <= cols; c += 8) {
    __m256 v[8];
    for (int i = 0; i < 8; i++) v[i] = _mm256_loadu_ps(s + i * ss + c);
    transpose8(v);
    for (int i = 0; i < 8; i++) _mm256_storeu_ps(d + (size_t)(c + i) * ds, v[i]);
  }
  for (; c < cols; c++)
    for (int i = 0; i < 8; i++) d[(size_t)c * ds + i] = s[i * ss + c];
}

/* 8 x cols floats of a column-major block (8 per column) -> 8 rows of stride ds */
AVX2FN static void untranspose_block(const float *s, int cols, float *d, size_t ds) {
  int c = 0;
  for (; c + 8 <= cols; c += 8) {
    __m256 v[8];
    for (int i = 0; i < 8; i++) v[i] = _mm256_loadu_ps(s + (size_t)(c + i) * 8);
    transpose8(v);
    for (int i = 0; i < 8; i++) _mm256_storeu_ps(d + i * ds + c, v[i]);
  }
  for (; c < cols; c++)
    for (int i = 0; i < 8; i++) d[i * ds + c] = s[(size_t)c * 8 + i];
}

/* Width: nrows rows of sw -> dw; tb holds (sw + dw) * 8 floats. */
AVX2FN static void hpass_avx2(const float *src, size_t nrows, int sw, const axis *ax, float *dst,
                              int dw, float *tb, int round) {
  float *T = tb, *O = tb + (size_t)sw * 8;
  size_t r = 0;
  for (; r + 8 <= nrows; r += 8) {
    transpose_block(src + r * sw, (size_t)sw, sw, T, 8);
    for (int x = 0; x < dw; x++) {
      const int n = ax->xsize[x];
      __m256 acc = dot8(T + (size_t)ax->xmin[x] * 8, 8, ax->w + (size_t)x * ax->taps, n, hadd(n));
      _mm256_storeu_ps(O + (size_t)x * 8, round ? round8(acc) : acc);
    }
    untranspose_block(O, dw, dst + r * dw, (size_t)dw);
  }
  for (; r < nrows; r++) {
    const float *row = src + r * sw;
    float *orow = dst + r * dw;
    for (int x = 0; x < dw; x++) {
      const int n = ax->xsize[x];
      float v = dot1(row + ax->xmin[x], 1, ax->w + (size_t)x * ax->taps, n, hadd(n));
      orow[x] = round ? round_u8(v) : v;
    }
  }
}

/* Height of one plane: rows of w, 8 columns per vector. */
AVX2FN static void vpass_avx2(const float *plane, int w, const axis *ay, int dh, float *op,
                              int round) {
  for (int y = 0; y < dh; y++) {
    const float *wt = ay->w + (size_t)y * ay->taps, *col0 = plane + (size_t)ay->xmin[y] * w;
    const int n = ay->xsize[y], nadd = vadd(n);
    float *orow = op + (size_t)y * w;
    int x = 0;
    for (; x + 8 <= w; x += 8) {
      __m256 acc = dot8(col0 + x, (size_t)w, wt, n, nadd);
      _mm256_storeu_ps(orow + x, round ? round8(acc) : acc);
    }
    for (; x < w; x++) {
      float v = dot1(col0 + x, (size_t)w, wt, n, nadd);
      orow[x] = round ? round_u8(v) : v;
    }
  }
}
#ifndef __clang__
#pragma GCC pop_options
#endif
#endif

static mml_status resize(const float *src, int planes, int sw, int sh, float *dst, int dw, int dh,
                         int round, mml_err *err) {
  if (planes < 1 || sw < 1 || sh < 1 || dw < 1 || dh < 1 || !src || !dst)
    return mml_err_set(err, MML_EINVAL, "resize: bad sizes %dx%d -> %dx%d", sw, sh, dw, dh);
  const int need_h = sw != dw, need_v = sh != dh;
  const size_t nout = (size_t)planes * dw * dh;
  if (!need_h && !need_v) {
    for (size_t i = 0; i < nout; i++) dst[i] = round ? round_u8(src[i]) : src[i];
    return MML_OK;
  }
#ifdef MML_VRESIZE_AVX2
  const int simd = mml_cpu_fma(); /* AVX2 and FMA */
#else
  const int simd = 0;
#endif
  axis ax = {0}, ay = {0};
  float *mid = NULL, *tb = NULL;
  mml_status st = MML_OK;
#ifdef MML_VRESIZE_AVX2
#define AXIS(a, in, out) (simd ? axis_make_fma(a, in, out, err) : axis_make_plain(a, in, out, err))
#else
#define AXIS(a, in, out) axis_make_plain(a, in, out, err)
#endif
  if (need_h && (st = AXIS(&ax, sw, dw))) goto done;
  if (need_v && (st = AXIS(&ay, sh, dh))) goto done;
#undef AXIS
  const float *hsrc = src;
  if (need_h) { /* width first, into dst or (when height follows) a middle buffer */
    float *o = dst;
    if (need_v && !(o = mid = malloc((size_t)planes * dw * sh * sizeof(float)))) {
      st = mml_err_set(err, MML_ENOMEM, "resize: out of memory for a %dx%d plane", dw, sh);
      goto done;
    }
#ifdef MML_VRESIZE_AVX2
    if (simd) {
      if (!(tb = malloc(((size_t)sw + dw) * 8 * sizeof(float)))) {
        st = mml_err_set(err, MML_ENOMEM, "resize: out of memory for a %d-column block", sw);
        goto done;
      }
      hpass_avx2(src, (size_t)planes * sh, sw, &ax, o, dw, tb, round && !need_v);
    }
#endif
    if (!simd) hpass_plain(src, (size_t)planes * sh, sw, &ax, o, dw);
    hsrc = o;
  }
  if (need_v)
    for (int p = 0; p < planes; p++) {
      const float *plane = hsrc + (size_t)p * dw * sh;
      float *op = dst + (size_t)p * dw * dh;
#ifdef MML_VRESIZE_AVX2
      if (simd) vpass_avx2(plane, dw, &ay, dh, op, round);
#endif
      if (!simd) vpass_plain(plane, dw, &ay, dh, op);
    }
  if (!simd && round)
    for (size_t i = 0; i < nout; i++) dst[i] = round_u8(dst[i]);
done:
  free(mid);
  free(tb);
  axis_free(&ax);
  axis_free(&ay);
  return st;
}

mml_status mml_resize_aa_bicubic_f32(const float *src, int planes, int sw, int sh, float *dst,
                                     int dw, int dh, mml_err *err) {
  return resize(src, planes, sw, sh, dst, dw, dh, 0, err);
}

mml_status mml_resize_aa_bicubic_f32_u8(const float *src, int planes, int sw, int sh, float *dst,
                                        int dw, int dh, mml_err *err) {
  return resize(src, planes, sw, sh, dst, dw, dh, 1, err);
}
