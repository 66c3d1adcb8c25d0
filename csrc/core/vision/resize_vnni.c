/*
 * resize_vnni.c — both bicubic passes (resize.c's arithmetic, Pillow's bit for bit) with
 * AVX-512 VNNI byte dot products: the horizontal pass on interleaved RGB rows with VBMI
 * byte permutes, one row at a time with no transposes, and the vertical pass 64 bytes a
 * step.
 *
 * Why: resize.c's passes multiply int32 lanes (vpmulld: two uops on Intel cores), and its
 * horizontal pass needs 8 rows transposed in and its results transposed back to planar; at
 * the model's limits (sizes that change by a few pixels) the two passes and the transposes
 * were ~40% of the decode's own time.  vpdpbusd multiplies 4 unsigned bytes by 4 signed
 * bytes and adds the 4 products to a dword: one instruction for 4 taps of 16 outputs.  The
 * weights have 22 fractional bits (up to 2^22, signed), so each is split into three signed
 * byte digits, w = d2 * 2^16 + d1 * 2^8 + d0, and the digit sums are combined by shifts:
 *
 *   acc = 32 + sum(px * d2);  acc = (acc << 8) + sum(px * d1);  acc = (acc << 8) + sum(px * d0)
 *       = 2^21 + sum(px * w)
 *
 * which is Pillow's int32 sum (the same value: integer arithmetic is exact in any order);
 * then >> 22 and clip8.  Horizontal: for 16 consecutive outputs of one row and channel, a
 * two-source byte permute (vpermi2b) gathers each output's taps from a 128-byte window of
 * the row into one dword lane (4 taps a lane; more taps take more tap groups; a per-axis
 * table holds the permute indices and weight digits of every group of 16), clip8 is max 0
 * and an unsigned saturating narrow, stored planar like resize.c's pass.  Vertical: the 4
 * rows of a tap group interleaved byte by byte put one output's 4 taps in each dword.
 *
 * Invariants (tests/test_vision.py test_resize_vnni_*, and the parity tests that run the
 * other paths with MML_DISABLE_AVX512):
 *   1. Bytes out equal resize.c's portable passes for every size these paths take.
 *   2. Only with AVX-512 F/BW/VBMI/VNNI (and MML_DISABLE_AVX512 unset).  Horizontal: only
 *      where mml_resample_vnni_prepare built the axis's table: out >= 16, every group of
 *      16 outputs reads within a 128-byte window (downscales up to about 2x), at most 16
 *      taps.  Vertical: rows of n >= 64 bytes, at most 16 taps.  Every weight fits three
 *      signed byte digits (checked; else resize.c's pass).
 *   3. Horizontal: nothing is read outside a row's in * 3 bytes (masked loads) and nothing
 *      written outside dst[c * plane + x], x < out.  Vertical: bytes [off, off + n) of the
 *      rows read, dst[0, n) written.
 *
 * Threads: the table is part of the axis (per-thread scratch); the row functions are pure.
 */
#include <stdlib.h>
#include <string.h>

#include "resize.h"

#define VG 16     /* outputs per group */
#define VBYTES 64 /* one vector of the table */
#define MAX_TAPG 4

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <stdatomic.h>
#define MML_HAVE_VNNI_PATH 1
#define VNNI_FN __attribute__((target("avx2,avx512f,avx512bw,avx512vbmi,avx512vnni")))

int mml_cpu_avx512_vnni(void) {
  static _Atomic int has = -1;
  int v = atomic_load_explicit(&has, memory_order_relaxed);
  if (v < 0) {
    v = mml_cpu_avx512() && __builtin_cpu_supports("avx512vbmi") &&
                __builtin_cpu_supports("avx512vnni")
            ? 1
            : 0;
    atomic_store_explicit(&has, v, memory_order_relaxed);
  }
  return v;
}
#else
int mml_cpu_avx512_vnni(void) { return 0; }
#endif

/* The first output of group g (the last group is placed to end at out, overlapping). */
static inline int group_x0(int g, int groups, int out) {
  return g == groups - 1 ? out - VG : g * VG;
}

/* w as three signed byte digits; 0 when it does not fit. */
static int digits(int32_t w, int8_t d[3]) {
  int32_t d0 = (int8_t)(uint8_t)(w & 0xff), r = (w - d0) / 256;
  int32_t d1 = (int8_t)(uint8_t)(r & 0xff), d2 = (r - d1) / 256;
  if (d2 < -128 || d2 > 127) return 0;
  d[0] = (int8_t)d0;
  d[1] = (int8_t)d1;
  d[2] = (int8_t)d2;
  return 1;
}

mml_status mml_resample_vnni_prepare(mml_resample_axis *a, mml_err *err) {
  a->vgroups = 0;
  if (!mml_cpu_avx512_vnni() || a->out < VG) return MML_OK;
  int taps = 0; /* the most any output reads (ksize can be one more) */
  for (int x = 0; x < a->out; x++)
    if (a->bounds[2 * x + 1] > taps) taps = a->bounds[2 * x + 1];
  const int tapg = (taps + 3) / 4, groups = (a->out + VG - 1) / VG;
  if (tapg > MAX_TAPG) return MML_OK;
  const size_t per = (size_t)tapg * 4 * VBYTES, need = (size_t)groups * per;
  if (need > a->cap_vt) {
    free(a->vt);
    a->cap_vt = 0;
    if (posix_memalign((void **)&a->vt, 64, need)) {
      a->vt = NULL;
      return mml_err_set(err, MML_ENOMEM, "resize: out of memory for %zu bytes of weights", need);
    }
    a->cap_vt = need;
  }
  if ((size_t)groups > a->cap_vbase) {
    int *b = realloc(a->vbase, (size_t)groups * sizeof *b);
    if (!b) return mml_err_set(err, MML_ENOMEM, "resize: out of memory");
    a->vbase = b;
    a->cap_vbase = (size_t)groups;
  }
  for (int g = 0; g < groups; g++) {
    const int x0 = group_x0(g, groups, a->out), base = 3 * a->bounds[2 * x0];
    uint8_t *t = a->vt + (size_t)g * per;
    memset(t, 0, per);
    for (int j = 0; j < VG; j++) {
      const int xx = x0 + j, xmin = a->bounds[2 * xx], n = a->bounds[2 * xx + 1];
      if (3 * (xmin + n - 1) + 2 - base > 127 || xmin * 3 < base) return MML_OK; /* too wide */
      const int32_t *k = &a->k[(size_t)xx * a->ksize];
      for (int q = 0; q < tapg * 4; q++) {
        uint8_t *v = t + (size_t)(q / 4) * 4 * VBYTES; /* tap group: index, d0, d1, d2 */
        int8_t d[3] = {0, 0, 0};
        if (q < n && !digits(k[q], d)) return MML_OK;
        const int at = j * 4 + q % 4;
        v[at] = (uint8_t)(3 * (xmin + (q < n ? q : 0)) - base); /* a weight-0 tap reads tap 0 */
        for (int i = 0; i < 3; i++) v[(1 + i) * VBYTES + at] = (uint8_t)d[i];
      }
    }
    a->vbase[g] = base;
  }
  a->vtapg = tapg;
  a->vgroups = groups;
  return MML_OK;
}

#ifdef MML_HAVE_VNNI_PATH
/* Bytes [0, len) of a 64-byte load from `at` (the rest zero, never read from memory). */
VNNI_FN static inline __m512i load_upto(const uint8_t *at, long len) {
  if (len >= 64) return _mm512_loadu_si512((const void *)at);
  if (len <= 0) return _mm512_setzero_si512();
  return _mm512_maskz_loadu_epi8(((__mmask64)1 << len) - 1, at);
}

/* One group of one row: the taps of channel c gathered, multiplied digit by digit and
 * combined as above.  t: the group's table, in registers (tapg is a constant). */
VNNI_FN static inline void group_h(const __m512i *t, const int tapg, __m512i lo, __m512i hi,
                                   uint8_t *restrict dst, size_t plane) {
  const __m512i half = _mm512_set1_epi32(32), zero = _mm512_setzero_si512();
  for (int c = 0; c < 3; c++) {
    const __m512i cc = _mm512_set1_epi8((char)c);
    __m512i px[MAX_TAPG];
    for (int q = 0; q < tapg; q++)
      px[q] = _mm512_permutex2var_epi8(lo, _mm512_add_epi8(t[4 * q], cc), hi);
    __m512i acc = half;
    for (int q = 0; q < tapg; q++) acc = _mm512_dpbusd_epi32(acc, px[q], t[4 * q + 3]);
    acc = _mm512_slli_epi32(acc, 8);
    for (int q = 0; q < tapg; q++) acc = _mm512_dpbusd_epi32(acc, px[q], t[4 * q + 2]);
    acc = _mm512_slli_epi32(acc, 8);
    for (int q = 0; q < tapg; q++) acc = _mm512_dpbusd_epi32(acc, px[q], t[4 * q + 1]);
    acc = _mm512_max_epi32(_mm512_srai_epi32(acc, 22), zero);
    _mm_storeu_si128((__m128i *)(dst + c * plane), _mm512_cvtusepi32_epi8(acc));
  }
}

/* Group by group, each group's table loaded once for all the rows (the table is several
 * times a row's bytes: read once a row, it was most of the pass's memory traffic); tapg
 * is a constant in each caller, so the tap loops unroll. */
VNNI_FN __attribute__((always_inline)) static inline void rows_h_body(
    const mml_resample_axis *a, const uint8_t *const *src, int nrows, uint8_t *const *dst,
    size_t plane, const int tapg) {
  const long len = (long)a->in * 3;
  for (int g = 0; g < a->vgroups; g++) {
    const long base = a->vbase[g];
    const __m512i *tp = (const __m512i *)a->vt + (size_t)g * tapg * 4;
    __m512i t[4 * MAX_TAPG];
    for (int i = 0; i < 4 * tapg; i++) t[i] = _mm512_load_si512((const void *)(tp + i));
    const int x0 = group_x0(g, a->vgroups, a->out);
    /* The rows were just written by the decoder, 8 of them (plus its own buffers) more
     * than L1 holds, and 8 interleaved streams are not what the hardware prefetchers
     * follow: without this prefetch, 8 groups ahead, the pass spent most of its time
     * waiting on these loads inside the pipeline (perf), though it was 2.6x the AVX2
     * pass alone. */
    const long ahead = g + 8 < a->vgroups ? a->vbase[g + 8] + 127 : 0;
    for (int r = 0; r < nrows; r++) {
      _mm_prefetch((const char *)(src[r] + ahead), _MM_HINT_T0);
      const __m512i lo = load_upto(src[r] + base, len - base);
      const __m512i hi = load_upto(src[r] + base + 64, len - base - 64);
      group_h(t, tapg, lo, hi, dst[r] + x0, plane);
    }
  }
}

VNNI_FN static void rows_h_vnni(const mml_resample_axis *a, const uint8_t *const *src, int nrows,
                                uint8_t *const *dst, size_t plane) {
  switch (a->vtapg) {
    case 1:
      rows_h_body(a, src, nrows, dst, plane, 1);
      break;
    case 2:
      rows_h_body(a, src, nrows, dst, plane, 2);
      break;
    case 3:
      rows_h_body(a, src, nrows, dst, plane, 3);
      break;
    default:
      rows_h_body(a, src, nrows, dst, plane, 4);
      break;
  }
}
#endif

#ifdef MML_HAVE_VNNI_PATH
/* Vertical pass: 64 outputs a step; the 4 rows of a tap group interleaved byte by byte
 * (two unpack levels, within 128-bit lanes) give 4 vectors whose dword lanes hold one
 * output's 4 taps, and the saturating packs after the shift undo the in-lane interleave,
 * so the 64 bytes come out in order.  w[q][d]: digit d of tap group q's 4 weights. */
VNNI_FN __attribute__((always_inline)) static inline void row_v_body(const uint32_t (*w)[3],
                                                                     const uint8_t *const *r, int n,
                                                                     uint8_t *restrict dst,
                                                                     const int tapg) {
  const __m512i half = _mm512_set1_epi32(32);
  __m512i wd[MAX_TAPG][3];
  for (int q = 0; q < tapg; q++)
    for (int d = 0; d < 3; d++) wd[q][d] = _mm512_set1_epi32((int)w[q][d]);
  for (int i = 0;; i += 64) {
    if (i > n - 64) i = n - 64;
    __m512i x[MAX_TAPG][4];
    for (int q = 0; q < tapg; q++) {
      const __m512i r0 = _mm512_loadu_si512((const void *)(r[4 * q] + i));
      const __m512i r1 = _mm512_loadu_si512((const void *)(r[4 * q + 1] + i));
      const __m512i r2 = _mm512_loadu_si512((const void *)(r[4 * q + 2] + i));
      const __m512i r3 = _mm512_loadu_si512((const void *)(r[4 * q + 3] + i));
      const __m512i a = _mm512_unpacklo_epi8(r0, r1), b = _mm512_unpackhi_epi8(r0, r1);
      const __m512i c = _mm512_unpacklo_epi8(r2, r3), d = _mm512_unpackhi_epi8(r2, r3);
      x[q][0] = _mm512_unpacklo_epi16(a, c);
      x[q][1] = _mm512_unpackhi_epi16(a, c);
      x[q][2] = _mm512_unpacklo_epi16(b, d);
      x[q][3] = _mm512_unpackhi_epi16(b, d);
    }
    __m512i acc[4];
    for (int v = 0; v < 4; v++) {
      acc[v] = half;
      for (int q = 0; q < tapg; q++) acc[v] = _mm512_dpbusd_epi32(acc[v], x[q][v], wd[q][2]);
      acc[v] = _mm512_slli_epi32(acc[v], 8);
      for (int q = 0; q < tapg; q++) acc[v] = _mm512_dpbusd_epi32(acc[v], x[q][v], wd[q][1]);
      acc[v] = _mm512_slli_epi32(acc[v], 8);
      for (int q = 0; q < tapg; q++) acc[v] = _mm512_dpbusd_epi32(acc[v], x[q][v], wd[q][0]);
      acc[v] = _mm512_srai_epi32(acc[v], 22);
    }
    const __m512i lo = _mm512_packs_epi32(acc[0], acc[1]), hi = _mm512_packs_epi32(acc[2], acc[3]);
    _mm512_storeu_si512((void *)(dst + i), _mm512_packus_epi16(lo, hi));
    if (i == n - 64) break;
  }
}

VNNI_FN static void row_v_vnni(const uint32_t (*w)[3], const uint8_t *const *r, int n,
                               uint8_t *restrict dst, int tapg) {
  switch (tapg) {
    case 1:
      row_v_body(w, r, n, dst, 1);
      break;
    case 2:
      row_v_body(w, r, n, dst, 2);
      break;
    case 3:
      row_v_body(w, r, n, dst, 3);
      break;
    default:
      row_v_body(w, r, n, dst, 4);
      break;
  }
}
#endif

int mml_resample_row_v_vnni(const mml_resample_axis *a, int y, const uint8_t *const *rows,
                            size_t off, int n, uint8_t *restrict dst) {
#ifdef MML_HAVE_VNNI_PATH
  const int cnt = a->bounds[2 * y + 1], tapg = (cnt + 3) / 4;
  if (n < 64 || tapg > MAX_TAPG || !mml_cpu_avx512_vnni()) return 0;
  const int32_t *k = &a->k[(size_t)y * a->ksize];
  uint32_t w[MAX_TAPG][3] = {{0}};
  const uint8_t *r[4 * MAX_TAPG];
  for (int j = 0; j < tapg * 4; j++) {
    int8_t d[3] = {0, 0, 0};
    if (j < cnt && !digits(k[j], d)) return 0;
    for (int i = 0; i < 3; i++) w[j / 4][i] |= (uint32_t)(uint8_t)d[i] << (8 * (j % 4));
    r[j] = rows[j < cnt ? j : 0] + off; /* a weight-0 tap reads the first row */
  }
  row_v_vnni((const uint32_t(*)[3])w, r, n, dst, tapg);
  return 1;
#else
  (void)a, (void)y, (void)rows, (void)off, (void)n, (void)dst;
  return 0;
#endif
}

int mml_resample_rows_h_vnni(const mml_resample_axis *a, const uint8_t *const *src, int nrows,
                             uint8_t *const *dst, size_t plane) {
#ifdef MML_HAVE_VNNI_PATH
  if (!a->vgroups) return 0;
  rows_h_vnni(a, src, nrows, dst, plane);
  return 1;
#else
  (void)a, (void)src, (void)nrows, (void)dst, (void)plane;
  return 0;
#endif
}
