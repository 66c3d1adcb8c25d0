/*
 * resize_vnni.c — the horizontal bicubic pass (resize.c's arithmetic, Pillow's bit for bit)
 * on interleaved RGB rows with AVX-512 VBMI byte permutes and VNNI byte dot products, one
 * row at a time, with no transposes.
 *
 * Why: resize.c's AVX2 pass multiplies int32 lanes (vpmulld: two uops on Intel cores) and
 * needs 8 rows transposed in and its results transposed back to planar; at the model's
 * limits (sizes that change by a few pixels) that pass and its transposes were a quarter
 * of the decode's own time.  Here, for 16 consecutive output pixels of one row and one
 * channel, a two-source byte permute (vpermi2b) gathers each output's taps from a 128-byte
 * window of the row into one dword lane (4 taps a lane; more taps take more tap groups),
 * and vpdpbusd multiplies them by the weights and sums the 4 products.  The weights have
 * 22 fractional bits (up to 2^22 and signed), so each is split into three signed byte
 * digits, w = d2 * 2^16 + d1 * 2^8 + d0, and the sums are combined by shifts:
 *
 *   acc = 32 + sum(px * d2);  acc = (acc << 8) + sum(px * d1);  acc = (acc << 8) + sum(px * d0)
 *       = 2^21 + sum(px * w)
 *
 * which is Pillow's int32 sum (the same value: integer arithmetic is exact in any order);
 * then >> 22 and clip8 (max 0, unsigned saturating narrow), stored planar like resize.c's
 * pass.
 *
 * Invariants (tests/test_vision.py, test_resize_vnni_* and the parity tests run with
 * MML_DISABLE_AVX512 for the other paths):
 *   1. Bytes out equal resize.c's portable pass for every size this path takes.
 *   2. The path is taken only when mml_resample_vnni_prepare built the axis's table: the
 *      CPU has AVX-512 F/BW/VBMI/VNNI (and MML_DISABLE_AVX512 is not set), out >= 16,
 *      every group of 16 outputs reads within a 128-byte window (downscales up to about
 *      2x), every weight fits three signed byte digits and at most 4 tap groups.
 *   3. Nothing is read outside a row's in * 3 bytes (masked loads) and nothing is written
 *      outside dst[c * plane + x], x < out.
 *
 * Threads: the table is part of the axis (per-thread scratch); the row function is pure.
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
    for (int r = 0; r < nrows; r++) {
      const __m512i lo = load_upto(src[r] + base, len - base);
      const __m512i hi = load_upto(src[r] + base + 64, len - base - 64);
      group_h(t, tapg, lo, hi, dst[r] + x0, plane);
    }
  }
}

VNNI_FN static void rows_h_vnni(const mml_resample_axis *a, const uint8_t *const *src, int nrows,
                                uint8_t *const *dst, size_t plane) {
  switch (a->vtapg) {
  case 1: rows_h_body(a, src, nrows, dst, plane, 1); break;
  case 2: rows_h_body(a, src, nrows, dst, plane, 2); break;
  case 3: rows_h_body(a, src, nrows, dst, plane, 3); break;
  default: rows_h_body(a, src, nrows, dst, plane, 4); break;
  }
}
#endif

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
