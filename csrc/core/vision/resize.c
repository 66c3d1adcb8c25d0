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
 * horizontal pass works on 8 rows at once, transposed so one input pixel of all 8 rows is
 * 24 uint8 lanes, channel-major (R of rows 0-7, G, B: three full 8-lane accumulators, no
 * padding lane to multiply or load), and the transposes in and out are vector shuffles;
 * the output is planar, which is what patchify wants.  The vertical pass runs 32 outputs
 * at a time with all taps in registers.  Both have AVX2 versions (intrinsics, picked at
 * run time with __builtin_cpu_supports) and portable C versions; saturating packs give
 * exactly clip8.  The vertical passes are one body (resize_vpass.h) compiled for AVX2 and
 * for AVX-512 (mml_cpu_avx512), faster even on Zen 4's split 512-bit units; the horizontal
 * pass's AVX-512 version was not (a 16-lane R+G accumulator: ~5% slower there), so it
 * stays AVX2.  Split RGB -> planar (unresized
 * widths) is AVX2 byte shuffles.  (Tried and measured no faster on this AMD EPYC: a
 * vpdpbusd vertical pass with the weights in three signed byte digits; int32 columns for the horizontal
 * pass, which moved the widening from the taps into the transpose; in the horizontal
 * pass, two neighbouring output pixels sharing their five columns' widened loads, as
 * the vertical pair does: ~10% slower; the transpose back to rows by AVX-512 VBMI
 * two-source byte permutes (4 permutes + 4 unpacks + 24 8-byte stores per 8 pixels):
 * ~20% slower, although that transpose is ~30% of the AVX2 pass's time; packing four
 * pixels' accumulators per channel so one byte shuffle + dword unpack gives each row's 8
 * pixels (fewer shuffles): ~10% slower with AVX2's 16 registers, no faster with 32.  On
 * an Intel Xeon with AVX-512 (2026-12), where vpmulld is two uops: the horizontal pass on
 * 16-bit multiply-adds (vpmaddwd) over columns widened into int16 pairs of neighbours,
 * each weight split exactly as (w >> 15) * 2^15 + (w & 0x7fff): bitwise equal, 2-3%
 * slower end to end (the widened columns are 4x the bytes; the pass is not bound by the
 * multiplies).)
 *
 * Where the CPU has AVX-512 VBMI + VNNI, both passes first try resize_vnni.c (byte dot
 * products on weights split into three byte digits: no int32 multiplies, no transposes),
 * which takes the sizes it can (widths >= 16 and downscales up to ~15x for the horizontal
 * pass, rows of 64 bytes or more for the vertical) and leaves the others to the code here.
 *
 * Threads: axes are per-thread scratch; the row functions are pure.
 */
#include "resize.h"

#include <math.h>
#include <stdatomic.h>
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

mml_status mml_resample_axis_prepare(mml_resample_axis *a, int in, int out, int rows_h,
                                     mml_err *err) {
  if (a->in == in && a->out == out && a->k && (a->rows_h || !rows_h)) return MML_OK;
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
  a->rows_h = rows_h;
  a->vgroups = a->wgroups = 0;
  a->vw_n = 0;
  mml_status st = rows_h ? mml_resample_vnni_prepare(a, err) : mml_resample_vnni_prepare_v(a, err);
  if (st != MML_OK) a->in = a->out = 0;
  return st;
}

void mml_resample_axis_free(mml_resample_axis *a) {
  free(a->k);
  free(a->pre);
  free(a->bounds);
  free(a->vt);
  free(a->vbase);
  free(a->wt);
  free(a->wnw);
  free(a->wwin);
  free(a->vw);
  memset(a, 0, sizeof *a);
}

static inline uint8_t clip8(int32_t v) {
  v >>= PRECISION_BITS; /* arithmetic shift, as in Pillow */
  return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

#define HL (3 * MML_HROWS) /* lanes of a column: channel c of row r is lane c * MML_HROWS + r */

/* Portable transpose: column x of tbuf holds pixel x of every row, channel-major. */
static void transpose_in_c(const uint8_t *const *src, int nrows, int in, uint8_t *restrict tbuf) {
  for (int r = 0; r < MML_HROWS; r++) {
    const uint8_t *restrict s = src[r < nrows ? r : 0]; /* missing rows: any data */
    for (int x = 0; x < in; x++)
      for (int c = 0; c < 3; c++) tbuf[(size_t)x * HL + c * MML_HROWS + r] = s[3 * x + c];
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MML_HAVE_AVX2_PATH 1

/* Computed once per process; threads may race to compute it, but every one finds the same
 * value, and the relaxed atomics make that race well defined (and quiet under TSan). */
int mml_cpu_avx2(void) {
  static _Atomic int has = -1;
  int v = atomic_load_explicit(&has, memory_order_relaxed);
  if (v < 0) {
    const char *off = getenv("MML_DISABLE_AVX2"); /* tests of the portable paths */
    v = (!off || !*off || *off == '0') && __builtin_cpu_supports("avx2") ? 1 : 0;
    atomic_store_explicit(&has, v, memory_order_relaxed);
  }
  return v;
}

int mml_cpu_fma(void) {
  static _Atomic int has = -1;
  int v = atomic_load_explicit(&has, memory_order_relaxed);
  if (v < 0) {
    v = mml_cpu_avx2() && __builtin_cpu_supports("fma") ? 1 : 0;
    atomic_store_explicit(&has, v, memory_order_relaxed);
  }
  return v;
}

/* 1 when mml_cpu_avx2() and the CPU has AVX-512 F/BW (MML_DISABLE_AVX512 unset or "0": tests
 * of the AVX2 paths on AVX-512 machines). */
int mml_cpu_avx512(void) {
  static _Atomic int has = -1;
  int v = atomic_load_explicit(&has, memory_order_relaxed);
  if (v < 0) {
    const char *off = getenv("MML_DISABLE_AVX512");
    v = mml_cpu_avx2() && (!off || !*off || *off == '0') && __builtin_cpu_supports("avx512f") &&
                __builtin_cpu_supports("avx512bw")
            ? 1
            : 0;
    atomic_store_explicit(&has, v, memory_order_relaxed);
  }
  return v;
}

/* 1 when mml_cpu_avx512() and the CPU has AVX-512 VBMI (byte permutes: pixels.c). */
int mml_cpu_avx512_vbmi(void) {
  static _Atomic int has = -1;
  int v = atomic_load_explicit(&has, memory_order_relaxed);
  if (v < 0) {
    v = mml_cpu_avx512() && __builtin_cpu_supports("avx512vbmi") ? 1 : 0;
    atomic_store_explicit(&has, v, memory_order_relaxed);
  }
  return v;
}

#define MML_TARGET_AVX512 __attribute__((target("avx2,avx512f,avx512bw")))

/* Transposes 4 pixels of 8 rows per step: each row's 12 bytes become 4 RGBX dwords (one
 * shuffle per two rows), a 4x4 dword transpose per 128-bit lane gives the 4 columns as
 * RGBX of rows 0-3 | rows 4-7, and a byte shuffle plus a dword permute make each column
 * channel-major (R0-7 G0-7 B0-7, then 8 unused bytes that the next column's store
 * overwrites: columns are stored in increasing order, the last one into the tbuf's 8 bytes
 * of slack).  The last step is placed to end at the last pixel (overlapping the previous
 * one, rewriting its columns with the same bytes). */
__attribute__((target("avx2"))) static void transpose_in_avx2(const uint8_t *const *src, int nrows,
                                                              int in, uint8_t *restrict tbuf) {
  if (in < 4) {
    transpose_in_c(src, nrows, in, tbuf);
    return;
  }
  const uint8_t *s[MML_HROWS];
  for (int r = 0; r < MML_HROWS; r++) s[r] = src[r < nrows ? r : 0];
  const __m256i rgbx = _mm256_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1, 0, 1,
                                        2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1);
  const __m256i chan = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4,
                                        8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m256i halves = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
#define COLUMN(v) _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8((v), chan), halves)
  for (int x = 0;; x += 4) {
    if (x > in - 4) x = in - 4;
    const size_t o = (size_t)x * 3; /* reads o .. o+15: within the row and its slack */
    __m256i y[4];
    for (int q = 0; q < 4; q++)
      y[q] = _mm256_shuffle_epi8(
          _mm256_inserti128_si256(
              _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(s[q] + o))),
              _mm_loadu_si128((const __m128i *)(s[q + 4] + o)), 1),
          rgbx); /* lane 0: row q, lane 1: row q+4; 4 RGBX pixels each */
    __m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]), t1 = _mm256_unpackhi_epi32(y[0], y[1]);
    __m256i t2 = _mm256_unpacklo_epi32(y[2], y[3]), t3 = _mm256_unpackhi_epi32(y[2], y[3]);
    uint8_t *t = tbuf + (size_t)x * HL;
    _mm256_storeu_si256((__m256i *)t, COLUMN(_mm256_unpacklo_epi64(t0, t2)));
    _mm256_storeu_si256((__m256i *)(t + HL), COLUMN(_mm256_unpackhi_epi64(t0, t2)));
    _mm256_storeu_si256((__m256i *)(t + 2 * HL), COLUMN(_mm256_unpacklo_epi64(t1, t3)));
    _mm256_storeu_si256((__m256i *)(t + 3 * HL), COLUMN(_mm256_unpackhi_epi64(t1, t3)));
    if (x == in - 4) break;
  }
#undef COLUMN
}

/* w * (8 bytes at p, zero-extended) added to s. */
#define MAC8(s, p, w)   \
  s = _mm256_add_epi32( \
      s, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p))), w))

/* Shift, clip and pack four accumulators of 8 int32 into 32 bytes.  Saturating packs clip
 * exactly like clip8 (values are within int16 after the shift); the result's dwords hold
 * s0..s3's halves in the order s0.lo s1.lo s2.lo s3.lo | s0.hi s1.hi s2.hi s3.hi.
 * (Callers with three accumulators pass the third twice.) */
__attribute__((target("avx2"))) static inline __m256i pack4_avx2(__m256i s0, __m256i s1, __m256i s2,
                                                                 __m256i s3) {
  s0 = _mm256_srai_epi32(s0, PRECISION_BITS);
  s1 = _mm256_srai_epi32(s1, PRECISION_BITS);
  s2 = _mm256_srai_epi32(s2, PRECISION_BITS);
  s3 = _mm256_srai_epi32(s3, PRECISION_BITS);
  return _mm256_packus_epi16(_mm256_packs_epi32(s0, s1), _mm256_packs_epi32(s2, s3));
}

/* One output pixel of all MML_HROWS rows: 24 lanes in three accumulators (R, G, B of rows
 * 0-7).  Dword c of the result's 128-bit lane l holds channel c of rows 4l..4l+3 (dword 3
 * repeats B).  Four taps (the common case for sizes that change by less than half) are
 * unrolled. */
__attribute__((target("avx2"))) static inline __m256i pixel_h_avx2(const int32_t *k, int n,
                                                                   const uint8_t *col) {
  const __m256i half = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));
  __m256i s0 = half, s1 = half, s2 = half;
  if (n == 4) {
    for (int j = 0; j < 4; j++, col += HL) {
      const __m256i w = _mm256_set1_epi32(k[j]);
      MAC8(s0, col, w);
      MAC8(s1, col + 8, w);
      MAC8(s2, col + 16, w);
    }
  } else {
    for (int j = 0; j < n; j++, col += HL) {
      const __m256i w = _mm256_set1_epi32(k[j]);
      MAC8(s0, col, w);
      MAC8(s1, col + 8, w);
      MAC8(s2, col + 16, w);
    }
  }
  return pack4_avx2(s0, s1, s2, s2);
}

/* Output pixels in steps of 8 (the last step overlaps the previous one; recomputing a
 * pixel gives the same bytes).  Each step transposes the 8 results back to rows: per half
 * of 4 pixels a 4x4 dword transpose per 128-bit lane gathers one channel's dwords (4 rows
 * each), a byte shuffle turns each into 4 rows of 4 pixels, and a dword unpack of the two
 * halves gives 8 pixels of a row: one 8-byte store per row and channel. */
__attribute__((target("avx2"), always_inline)) static inline void rows_h_body(
    const mml_resample_axis *a, const uint8_t *restrict tbuf, const int nrows, uint8_t *const *dst,
    size_t plane) {
  const int ksize = a->ksize, out = a->out;
  const __m256i planar = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0,
                                          4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  if (out < 8) {
    for (int xx = 0; xx < out; xx++) {
      uint8_t o[32];
      _mm256_storeu_si256((__m256i *)o,
                          pixel_h_avx2(&a->k[(size_t)xx * ksize], a->bounds[xx * 2 + 1],
                                       tbuf + (size_t)a->bounds[xx * 2] * HL));
      for (int r = 0; r < nrows; r++) /* channel c of row r: lane r / 4, dword c, byte r % 4 */
        for (int c = 0; c < 3; c++) dst[r][c * plane + xx] = o[16 * (r >> 2) + 4 * c + (r & 3)];
    }
    return;
  }
  for (int x0 = 0;; x0 += 8) {
    if (x0 > out - 8) x0 = out - 8;
    __m256i p[8];
    for (int i = 0; i < 8; i++) {
      const int xx = x0 + i;
      p[i] = pixel_h_avx2(&a->k[(size_t)xx * ksize], a->bounds[xx * 2 + 1],
                          tbuf + (size_t)a->bounds[xx * 2] * HL);
    }
    /* q[h][c], lane l: dword j is row 4l+j of pixels x0+4h .. x0+4h+3 in channel c */
    __m256i q[2][3];
    for (int h = 0; h < 2; h++) {
      __m256i t0 = _mm256_unpacklo_epi32(p[4 * h], p[4 * h + 1]);
      __m256i t1 = _mm256_unpackhi_epi32(p[4 * h], p[4 * h + 1]);
      __m256i t2 = _mm256_unpacklo_epi32(p[4 * h + 2], p[4 * h + 3]);
      __m256i t3 = _mm256_unpackhi_epi32(p[4 * h + 2], p[4 * h + 3]);
      q[h][0] = _mm256_shuffle_epi8(_mm256_unpacklo_epi64(t0, t2), planar);
      q[h][1] = _mm256_shuffle_epi8(_mm256_unpackhi_epi64(t0, t2), planar);
      q[h][2] = _mm256_shuffle_epi8(_mm256_unpacklo_epi64(t1, t3), planar);
    }
    for (int c = 0; c < 3; c++) {
      /* lane l: 8 pixels of rows 4l, 4l+1 (lo) and of rows 4l+2, 4l+3 (hi) */
      const __m256i lo = _mm256_unpacklo_epi32(q[0][c], q[1][c]);
      const __m256i hi = _mm256_unpackhi_epi32(q[0][c], q[1][c]);
      for (int l = 0; l < 2; l++) {
        const __m128i v[2] = {l ? _mm256_extracti128_si256(lo, 1) : _mm256_castsi256_si128(lo),
                              l ? _mm256_extracti128_si256(hi, 1) : _mm256_castsi256_si128(hi)};
        for (int j = 0; j < 4; j++) {
          const int r = 4 * l + j;
          if (r >= nrows) break;
          const __m128i e = j & 1 ? _mm_unpackhi_epi64(v[j >> 1], v[j >> 1]) : v[j >> 1];
          _mm_storel_epi64((__m128i *)(dst[r] + c * plane + x0), e);
        }
      }
    }
    if (x0 == out - 8) break;
  }
}

/* nrows is MML_HROWS but in an image's last rows: a constant there, so the stores of the
 * transpose back unroll without a test per row. */
__attribute__((target("avx2"))) static void rows_h_avx2(const mml_resample_axis *a,
                                                        const uint8_t *restrict tbuf, int nrows,
                                                        uint8_t *const *dst, size_t plane) {
  if (nrows == MML_HROWS)
    rows_h_body(a, tbuf, MML_HROWS, dst, plane);
  else
    rows_h_body(a, tbuf, nrows, dst, plane);
}
#else
int mml_cpu_avx2(void) { return 0; }
int mml_cpu_fma(void) { return 0; }
int mml_cpu_avx512(void) { return 0; }
int mml_cpu_avx512_vbmi(void) { return 0; }
#endif

void mml_resample_rows_h(const mml_resample_axis *a, const uint8_t *const *src, int nrows,
                         uint8_t *const *dst, size_t plane, uint8_t *restrict tbuf) {
  const int ksize = a->ksize;
  for (; nrows > MML_HROWS; nrows -= MML_HROWS, src += MML_HROWS, dst += MML_HROWS)
    mml_resample_rows_h(a, src, MML_HROWS, dst, plane, tbuf);
  if (mml_resample_rows_h_vnni(a, src, nrows, dst, plane)) return;
#ifdef MML_HAVE_AVX2_PATH
  if (mml_cpu_avx2()) {
    transpose_in_avx2(src, nrows, a->in, tbuf);
    rows_h_avx2(a, tbuf, nrows, dst, plane);
    return;
  }
#endif
  transpose_in_c(src, nrows, a->in, tbuf);
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
    for (int r = 0; r < nrows; r++)
      for (int c = 0; c < 3; c++) dst[r][c * plane + xx] = clip8(acc[c * MML_HROWS + r]);
  }
}

/* The vertical passes (resize_vpass.h), one copy per vector width: AVX2 (8 int32 lanes:
 * 32 outputs per step for one row, 16 for each of a pair) and AVX-512 (16 lanes, twice
 * that).  Zen 4 runs each 512-bit op as two 256-bit halves, yet the AVX-512 copy measured
 * 15-20% faster there than the AVX2 one (half the instructions for the front end; the
 * 128-bit widening loads).  Four accumulators are packed as in pack4_avx2 (dword c of
 * 128-bit lane l is accumulator c's values 4l..4l+3) and one dword permute puts them in
 * order.  The portable loops are in mml_resample_row_v. */
#ifdef MML_HAVE_AVX2_PATH
#define VX(name) name##_avx2
#define VFN __attribute__((target("avx2")))
#define V __m256i
#define VN 8
#define V_SET1 _mm256_set1_epi32
#define V_ADD _mm256_add_epi32
#define V_MUL _mm256_mullo_epi32
#define V_WIDEN(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define V_PACK4(s0, s1, s2, s3) \
  _mm256_permutevar8x32_epi32(pack4_avx2(s0, s1, s2, s3), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
#define V_STORE(p, v) _mm256_storeu_si256((__m256i *)(p), (v))
#define V_STORE_LO(p, v) _mm_storeu_si128((__m128i *)(p), _mm256_castsi256_si128(v))
#define V_STORE_HI(p, v) _mm_storeu_si128((__m128i *)(p), _mm256_extracti128_si256((v), 1))
#include "resize_vpass.h" /* it #undefs the macros above */

MML_TARGET_AVX512 static inline __m512i pack4_avx512(__m512i s0, __m512i s1, __m512i s2,
                                                     __m512i s3) {
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  s0 = _mm512_srai_epi32(s0, PRECISION_BITS);
  s1 = _mm512_srai_epi32(s1, PRECISION_BITS);
  s2 = _mm512_srai_epi32(s2, PRECISION_BITS);
  s3 = _mm512_srai_epi32(s3, PRECISION_BITS);
  return _mm512_permutexvar_epi32(
      order, _mm512_packus_epi16(_mm512_packs_epi32(s0, s1), _mm512_packs_epi32(s2, s3)));
}

#define VX(name) name##_avx512
#define VFN MML_TARGET_AVX512
#define V __m512i
#define VN 16
#define V_SET1 _mm512_set1_epi32
#define V_ADD _mm512_add_epi32
#define V_MUL _mm512_mullo_epi32
#define V_WIDEN(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define V_PACK4 pack4_avx512
#define V_STORE(p, v) _mm512_storeu_si512((void *)(p), (v))
#define V_STORE_LO(p, v) _mm256_storeu_si256((__m256i *)(p), _mm512_castsi512_si256(v))
#define V_STORE_HI(p, v) _mm256_storeu_si256((__m256i *)(p), _mm512_extracti64x4_epi64((v), 1))
#include "resize_vpass.h" /* it #undefs the macros above */
#endif

void mml_resample_rows_v2(const mml_resample_axis *a, int y, const uint8_t *const *rows, size_t off,
                          int n, uint8_t *restrict dst0, uint8_t *restrict dst1) {
  if (n >= 64 && mml_cpu_avx512_vnni()) { /* two rows, each with VNNI (resize_vnni.c) */
    const int d = a->bounds[2 * (y + 1)] - a->bounds[2 * y];
    if (mml_resample_row_v_vnni(a, y, rows, off, n, dst0) &&
        mml_resample_row_v_vnni(a, y + 1, rows + d, off, n, dst1))
      return;
  }
#ifdef MML_HAVE_AVX2_PATH
  if (n >= 32 && mml_resample_pair_fits(a, y) && mml_cpu_avx512()) {
    rows_v2_avx512(&a->k[(size_t)y * a->ksize], &a->k[(size_t)(y + 1) * a->ksize], rows, off, n,
                   dst0, dst1);
    return;
  }
  if (n >= 16 && mml_resample_pair_fits(a, y) && mml_cpu_avx2()) {
    rows_v2_avx2(&a->k[(size_t)y * a->ksize], &a->k[(size_t)(y + 1) * a->ksize], rows, off, n, dst0,
                 dst1);
    return;
  }
#endif
  const int d = a->bounds[2 * (y + 1)] - a->bounds[2 * y];
  mml_resample_row_v(a, y, rows, off, n, dst0);
  mml_resample_row_v(a, y + 1, rows + d, off, n, dst1);
}

void mml_resample_row_v(const mml_resample_axis *a, int y, const uint8_t *const *rows, size_t off,
                        int n, uint8_t *restrict dst) {
  const int cnt = a->bounds[y * 2 + 1];
  const int32_t *k = &a->k[(size_t)y * a->ksize];
  if (mml_resample_row_v_vnni(a, y, rows, off, n, dst)) return;
#ifdef MML_HAVE_AVX2_PATH
  if (n >= 64 && mml_cpu_avx512()) {
    row_v_avx512(k, cnt, rows, off, n, dst);
    return;
  }
  if (n >= 32 && mml_cpu_avx2()) {
    row_v_avx2(k, cnt, rows, off, n, dst);
    return;
  }
#endif
  for (int i = 0; i < n; i++) {
    int32_t s = 1 << (PRECISION_BITS - 1);
    for (int j = 0; j < cnt; j++) s += rows[j][off + i] * k[j];
    dst[i] = clip8(s);
  }
}

/* Interleaved RGB -> planar.  AVX2: 32 pixels (96 bytes) per step, 16 per 128-bit lane:
 * each channel's 16 bytes are gathered from the lane's three 16-byte pieces by byte
 * shuffles (mask [c][v]: piece v's bytes of channel c, -1 elsewhere) and ORed; the last
 * step is placed to end at the last pixel (overlapping the previous one). */
static const int8_t split_mask[3][3][16] = {
    {{0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},
     {-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1, -1, -1, -1},
     {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13}},
    {{1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},
     {-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1},
     {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14}},
    {{2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},
     {-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1},
     {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15}}};

#ifdef MML_HAVE_AVX2_PATH
__attribute__((target("avx2"))) static void split_planar_avx2(const uint8_t *restrict rgb, int w,
                                                              uint8_t *restrict dst, size_t plane) {
  __m256i m[3][3];
  for (int c = 0; c < 3; c++)
    for (int v = 0; v < 3; v++)
      m[c][v] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)split_mask[c][v]));
  for (int x = 0;; x += 32) {
    if (x > w - 32) x = w - 32;
    const uint8_t *s = rgb + (size_t)x * 3;
    __m256i in[3];
    for (int v = 0; v < 3; v++)
      in[v] = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(s + 16 * v))),
          _mm_loadu_si128((const __m128i *)(s + 48 + 16 * v)), 1);
    for (int c = 0; c < 3; c++) {
      const __m256i o = _mm256_or_si256(
          _mm256_or_si256(_mm256_shuffle_epi8(in[0], m[c][0]), _mm256_shuffle_epi8(in[1], m[c][1])),
          _mm256_shuffle_epi8(in[2], m[c][2]));
      _mm256_storeu_si256((__m256i *)(dst + c * plane + x), o);
    }
    if (x == w - 32) break;
  }
}
#endif

void mml_rgb8_split_planar(const uint8_t *restrict rgb, int w, uint8_t *restrict dst,
                           size_t plane) {
#ifdef MML_HAVE_AVX2_PATH
  if (w >= 32 && mml_cpu_avx2()) {
    split_planar_avx2(rgb, w, dst, plane);
    return;
  }
#endif
  uint8_t *restrict r = dst, *restrict g = dst + plane, *restrict b = dst + 2 * plane;
  for (int x = 0; x < w; x++) {
    r[x] = rgb[3 * x];
    g[x] = rgb[3 * x + 1];
    b[x] = rgb[3 * x + 2];
  }
}
