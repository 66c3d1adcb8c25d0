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
 * Speed: integer sums are exact in any order, so the passes are free to vectorise.  The
 * horizontal pass works on 8 rows at once, transposed so one output pixel of all 8 rows is
 * 32 uint8 lanes; the vertical pass runs 32 outputs at a time with all taps in registers.
 * Both have AVX2 versions (intrinsics, picked at run time with __builtin_cpu_supports) and
 * portable C versions; saturating packs give exactly clip8.
 *
 * Threads: axes are per-thread scratch; the row functions are pure.
 */
#include "resize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PRECISION_BITS 22

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

#define HL (4 * MML_HROWS) /* lanes: RGBX of MML_HROWS rows; X is ignored */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MML_HAVE_AVX2_PATH 1

int mml_cpu_avx2(void) {
  static int has = -1; /* benign race: every thread computes the same value */
  if (has < 0) {
    const char *off = getenv("MML_DISABLE_AVX2"); /* tests of the portable paths */
    has = (!off || !*off || *off == '0') && __builtin_cpu_supports("avx2") ? 1 : 0;
  }
  return has;
}

/* One output pixel of all MML_HROWS rows per step: 32 lanes in four registers. */
__attribute__((target("avx2"))) static void rows_h_avx2(const mml_resample_axis *a,
                                                         const uint8_t *restrict tbuf, int nrows,
                                                         uint8_t *const *dst) {
  const __m256i half = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const int ksize = a->ksize;
  for (int xx = 0; xx < a->out; xx++) {
    const int xmin = a->bounds[xx * 2], n = a->bounds[xx * 2 + 1];
    const int32_t *k = &a->k[(size_t)xx * ksize];
    const uint8_t *col = tbuf + (size_t)xmin * HL;
    __m256i s0 = half, s1 = half, s2 = half, s3 = half;
    for (int j = 0; j < n; j++, col += HL) {
      const __m256i w = _mm256_set1_epi32(k[j]);
      __m128i lo = _mm_loadu_si128((const __m128i *)col);
      __m128i hi = _mm_loadu_si128((const __m128i *)(col + 16));
      s0 = _mm256_add_epi32(s0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(lo), w));
      s1 = _mm256_add_epi32(s1, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)), w));
      s2 = _mm256_add_epi32(s2, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(hi), w));
      s3 = _mm256_add_epi32(s3, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)), w));
    }
    s0 = _mm256_srai_epi32(s0, PRECISION_BITS);
    s1 = _mm256_srai_epi32(s1, PRECISION_BITS);
    s2 = _mm256_srai_epi32(s2, PRECISION_BITS);
    s3 = _mm256_srai_epi32(s3, PRECISION_BITS);
    __m256i p = _mm256_packus_epi16(_mm256_packs_epi32(s0, s1), _mm256_packs_epi32(s2, s3));
    uint8_t o[HL];
    _mm256_storeu_si256((__m256i *)o, _mm256_permutevar8x32_epi32(p, order));
    for (int r = 0; r < nrows; r++) memcpy(dst[r] + 3 * xx, o + 4 * r, 3);
  }
}
#else
int mml_cpu_avx2(void) { return 0; }
#endif

void mml_resample_rows_h(const mml_resample_axis *a, const uint8_t *const *src, int nrows,
                         uint8_t *const *dst, uint8_t *restrict tbuf) {
  const int in = a->in, ksize = a->ksize;
  for (int r = 0; r < MML_HROWS; r++) {
    uint8_t *restrict t = tbuf + 4 * r;
    if (r < nrows) {
      const uint8_t *restrict s = src[r];
      for (int x = 0; x < in; x++) memcpy(t + (size_t)x * HL, s + 3 * x, 4); /* 1 byte slack */
    } else {
      for (int x = 0; x < in; x++) memset(t + (size_t)x * HL, 0, 4);
    }
  }
#ifdef MML_HAVE_AVX2_PATH
  if (mml_cpu_avx2()) {
    rows_h_avx2(a, tbuf, nrows, dst);
    return;
  }
#endif
  for (int xx = 0; xx < a->out; xx++) {
    const int xmin = a->bounds[xx * 2], n = a->bounds[xx * 2 + 1];
    const int32_t *k = &a->k[(size_t)xx * ksize];
    const uint8_t *restrict col = tbuf + (size_t)xmin * HL;
    int32_t acc[HL];
    for (int l = 0; l < HL; l++) acc[l] = 1 << (PRECISION_BITS - 1);
    for (int j = 0; j < n; j++, col += HL) {
      const int32_t w = k[j];
      for (int l = 0; l < HL; l++) acc[l] += col[l] * w;
    }
    uint8_t o[HL];
    for (int l = 0; l < HL; l++) o[l] = clip8(acc[l]);
    for (int r = 0; r < nrows; r++) memcpy(dst[r] + 3 * xx, o + 4 * r, 3);
  }
}

/* The vertical pass: 32 outputs at a time with all taps accumulated in registers.  An AVX2
 * version (intrinsics, chosen at run time) and a portable one; same integer arithmetic. */
#ifdef MML_HAVE_AVX2_PATH
__attribute__((target("avx2"))) static void row_v_avx2(const int32_t *k, int cnt,
                                                        const uint8_t *const *rows, int n,
                                                        uint8_t *restrict dst, int *done) {
  const __m256i half = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i s0 = half, s1 = half, s2 = half, s3 = half;
    for (int j = 0; j < cnt; j++) {
      const uint8_t *row = rows[j] + i;
      const __m256i w = _mm256_set1_epi32(k[j]);
      __m128i lo = _mm_loadu_si128((const __m128i *)row);
      __m128i hi = _mm_loadu_si128((const __m128i *)(row + 16));
      s0 = _mm256_add_epi32(s0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(lo), w));
      s1 = _mm256_add_epi32(s1, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)), w));
      s2 = _mm256_add_epi32(s2, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(hi), w));
      s3 = _mm256_add_epi32(s3, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)), w));
    }
    s0 = _mm256_srai_epi32(s0, PRECISION_BITS);
    s1 = _mm256_srai_epi32(s1, PRECISION_BITS);
    s2 = _mm256_srai_epi32(s2, PRECISION_BITS);
    s3 = _mm256_srai_epi32(s3, PRECISION_BITS);
    /* saturating packs clip exactly like clip8 (values are within int16 after the shift) */
    __m256i p = _mm256_packus_epi16(_mm256_packs_epi32(s0, s1), _mm256_packs_epi32(s2, s3));
    _mm256_storeu_si256((__m256i *)(dst + i), _mm256_permutevar8x32_epi32(p, order));
  }
  *done = i;
}
#endif

void mml_resample_row_v(const mml_resample_axis *a, int y, const uint8_t *const *rows, int n,
                        int32_t *restrict acc, uint8_t *restrict dst) {
  (void)acc;
  const int cnt = a->bounds[y * 2 + 1];
  const int32_t *k = &a->k[(size_t)y * a->ksize];
  int i = 0;
#ifdef MML_HAVE_AVX2_PATH
  if (mml_cpu_avx2()) row_v_avx2(k, cnt, rows, n, dst, &i);
#endif
  for (; i < n; i++) {
    int32_t s = 1 << (PRECISION_BITS - 1);
    for (int j = 0; j < cnt; j++) s += rows[j][i] * k[j];
    dst[i] = clip8(s);
  }
}
