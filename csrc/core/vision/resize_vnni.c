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
 * Wide downscales (past ~2x: 16 outputs' taps span more than 128 bytes, or more than 16
 * taps) take the wide variant: a group is 5 outputs with all three channels in its dword
 * lanes (lane 3j + c: channel c of output j; lane 15 unused), so one tap group of a group
 * spans 12 * scale + 12 bytes, within one 128-byte window up to ~9x (beyond that, up to
 * 64 taps, a tap group takes more windows, one permute each, blended by byte-lane masks).
 * Its table holds, per group and tap group, the three weight-digit vectors and one index
 * vector per window; each tap group's table is loaded once for the 8 rows of a call, whose
 * 24 accumulators (3 digit sums per row, combined at the end) stay in registers.  No
 * transposes: a byte shuffle makes the 15 results planar (5 bytes a channel).
 *
 * Invariants (tests/test_vision.py test_resize_vnni_*, and the parity tests that run the
 * other paths with MML_DISABLE_AVX512):
 *   1. Bytes out equal resize.c's portable passes for every size these paths take.
 *   2. Only with AVX-512 F/BW/VL/VBMI/VNNI (and MML_DISABLE_AVX512 unset).  Horizontal: only
 *      where mml_resample_vnni_prepare built the axis's table: out >= 16, every group of
 *      16 outputs reads within a 128-byte window (downscales up to about 2x), at most 16
 *      taps.  Vertical: rows of n >= 64 bytes, at most 32 taps (past 16:
 *      row_v_body_wide, the digit sums kept apart).  Every weight fits three
 *      signed byte digits (checked; else resize.c's pass).
 *   3. Horizontal: nothing is read outside a row's in * 3 bytes (masked loads) and nothing
 *      written outside dst[c * plane + x], x < out.  Vertical: bytes [off, off + n) of the
 *      rows read, dst[0, n) written.
 *   4. Wide variant (test_resize_vnni_wide_widths_match_pillow): only where the narrow
 *      table does not apply, out >= 16, at most 64 taps, every weight three signed byte
 *      digits; lanes without taps in a tap group have digits 0 (whatever they gather is
 *      multiplied by 0); the same bytes as invariant 1.
 *
 * Threads: the table is part of the axis (per-thread scratch); the row functions are pure.
 */
#include <stdlib.h>
#include <string.h>

#include "resize.h"

#define VG 16     /* outputs per group */
#define VBYTES 64 /* one vector of the table */
#define MAX_TAPG 4
#define VMAX_TAPG 8 /* the vertical pass: up to 32 taps (downscales up to ~8x) */
_Static_assert(VMAX_TAPG * 3 == MML_VNNI_VWORDS, "resize.h's per-output digit words");
#define WG 5         /* the wide variant: outputs per group (3 channels each: 15 dword lanes) */
#define WMAX_TAPG 16 /* the wide variant: up to 64 taps (downscales up to ~15x) */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <stdatomic.h>
#define MML_HAVE_VNNI_PATH 1
#define VNNI_FN __attribute__((target("avx2,avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")))

int mml_cpu_avx512_vnni(void) {
  static _Atomic int has = -1;
  int v = atomic_load_explicit(&has, memory_order_relaxed);
  if (v < 0) {
    v = mml_cpu_avx512() && __builtin_cpu_supports("avx512vl") &&
                __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512vnni")
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
static inline int wgroup_x0(int g, int groups, int out) {
  return g == groups - 1 ? out - WG : g * WG;
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

/* Tap group q of output xx: its bytes [*lo, *hi] in the row (channel 0 of its first tap to
 * channel 2 of its last); 0 when that output has no tap there. */
static int quad_span(const mml_resample_axis *a, int xx, int q, int *lo, int *hi) {
  const int xmin = a->bounds[2 * xx], n = a->bounds[2 * xx + 1];
  if (4 * q >= n) return 0;
  const int last = 4 * q + 3 < n ? 4 * q + 3 : n - 1;
  *lo = 3 * (xmin + 4 * q);
  *hi = 3 * (xmin + last) + 2;
  return 1;
}

/* The windows of tap group q of the wide group starting at output x0: the previous tap
 * group's last window when every output's bytes fit in it (the kernel then reuses its
 * loads), else outputs in order, a new window (at the output's first byte) whenever one
 * leaves the current window.  win[j]: output j's window (-1: no taps there); base[w]:
 * window w's first byte; *prev: the last window's base (-1: none yet). */
static int plan_windows(const mml_resample_axis *a, int x0, int q, int win[WG], int base[WG],
                        int *prev) {
  int nw = 0, fits = *prev >= 0;
  for (int j = 0; j < WG && fits; j++) {
    int lo, hi;
    if (quad_span(a, x0 + j, q, &lo, &hi) && (lo < *prev || hi - *prev > 2 * VBYTES - 1)) fits = 0;
  }
  for (int j = 0; j < WG; j++) {
    int lo, hi;
    win[j] = -1;
    if (!quad_span(a, x0 + j, q, &lo, &hi)) continue;
    if (!nw)
      base[nw++] = fits ? *prev : lo;
    else if (lo < base[nw - 1] || hi - base[nw - 1] > 2 * VBYTES - 1)
      base[nw++] = lo;
    win[j] = nw - 1;
  }
  if (nw) *prev = base[nw - 1];
  return nw;
}

/* The wide variant's tables (invariants 2 and 4); leaves wgroups 0 where it does not apply.
 * Lane 3j + c (dword) of a group is channel c of its output j; lane 15 is unused. */
static mml_status wide_prepare(mml_resample_axis *a, int taps, mml_err *err) {
  const int tapg = (taps + 3) / 4, groups = (a->out + WG - 1) / WG;
  if (tapg > WMAX_TAPG || a->out < WG) return MML_OK;
  size_t nwin = 0;
  int win[WG], base[WG];
  for (int g = 0; g < groups; g++) {
    int prev = -1;
    for (int q = 0; q < tapg; q++)
      nwin += (size_t)plan_windows(a, wgroup_x0(g, groups, a->out), q, win, base, &prev);
  }
  const size_t nvec = (size_t)groups * tapg * 3 + nwin, need = nvec * VBYTES,
               nq = (size_t)groups * tapg;
  if (need > a->cap_wt) {
    free(a->wt);
    a->cap_wt = 0;
    if (posix_memalign((void **)&a->wt, 64, need)) {
      a->wt = NULL;
      return mml_err_set(err, MML_ENOMEM, "resize: out of memory for %zu bytes of weights", need);
    }
    a->cap_wt = need;
  }
  if (nwin > a->cap_wwin) {
    mml_vwin *w = realloc(a->wwin, nwin * sizeof *w);
    if (!w) return mml_err_set(err, MML_ENOMEM, "resize: out of memory");
    a->wwin = w;
    a->cap_wwin = nwin;
  }
  if (nq > a->cap_wnw) {
    uint8_t *w = realloc(a->wnw, nq);
    if (!w) return mml_err_set(err, MML_ENOMEM, "resize: out of memory");
    a->wnw = w;
    a->cap_wnw = nq;
  }
  uint8_t *t = a->wt;
  mml_vwin *wp = a->wwin;
  memset(t, 0, need);
  for (int g = 0; g < groups; g++) {
    const int x0 = wgroup_x0(g, groups, a->out);
    int prev = -1;
    for (int q = 0; q < tapg; q++) {
      const int nw = plan_windows(a, x0, q, win, base, &prev);
      a->wnw[(size_t)g * tapg + q] = (uint8_t)nw;
      uint8_t *dig = t, *idx = t + 3 * VBYTES; /* digits d0, d1, d2; then one per window */
      for (int w = 0; w < nw; w++) {
        wp[w].base = base[w];
        wp[w].mask = 0;
        wp[w].pad = 0;
      }
      for (int j = 0; j < WG; j++) {
        if (win[j] < 0) continue; /* digits 0: whatever window 0 gives the lanes is not used */
        const int xx = x0 + j, xmin = a->bounds[2 * xx], n = a->bounds[2 * xx + 1];
        const int32_t *k = &a->k[(size_t)xx * a->ksize];
        wp[win[j]].mask |= (uint64_t)0xfff << (12 * j);
        for (int i = 0; i < 4; i++) {
          const int tap = 4 * q + i;
          int8_t d[3] = {0, 0, 0};
          if (tap < n && !digits(k[tap], d)) return MML_OK;
          /* a weight-0 tap reads the tap group's first tap */
          const int off = 3 * (xmin + (tap < n ? tap : 4 * q)) - base[win[j]];
          for (int c = 0; c < 3; c++) {
            const int at = 4 * (3 * j + c) + i;
            for (int e = 0; e < 3; e++) dig[e * VBYTES + at] = (uint8_t)d[e];
            idx[(size_t)win[j] * VBYTES + at] = (uint8_t)(off + c);
          }
        }
      }
      t += (size_t)(3 + nw) * VBYTES;
      wp += nw;
    }
  }
  a->wtapg = tapg;
  a->wgroups = groups;
  return MML_OK;
}

mml_status mml_resample_vnni_prepare(mml_resample_axis *a, mml_err *err) {
  a->vgroups = 0;
  a->wgroups = 0;
  if (!mml_cpu_avx512_vnni() || a->out < VG) return MML_OK;
  int taps = 0; /* the most any output reads (ksize can be one more) */
  for (int x = 0; x < a->out; x++)
    if (a->bounds[2 * x + 1] > taps) taps = a->bounds[2 * x + 1];
  const int tapg = (taps + 3) / 4, groups = (a->out + VG - 1) / VG;
  if (tapg > MAX_TAPG) return wide_prepare(a, taps, err);
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
      if (3 * (xmin + n - 1) + 2 - base > 127 || xmin * 3 < base) /* too wide */
        return wide_prepare(a, taps, err);
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
/* The wide variant, one group (5 outputs) of nrows rows: tap group by tap group, its
 * table loaded once for all the rows (in registers; nrows is a constant in the caller, so
 * the row loops unroll and the 3 * nrows accumulators stay in registers).  Per row, each
 * window's 128 bytes gathered by one two-source permute (all three channels: lane 3j + c),
 * the windows after the first blended in by their byte-lane masks; the three digit sums
 * are kept apart and combined at the end, ((32 + S2) << 8 + S1) << 8 + S0: the same int32
 * value as the narrow pass's chain.  A byte shuffle makes the 15 results planar. */
VNNI_FN __attribute__((always_inline)) static inline void wide_group(
    const __m512i **tpp, const mml_vwin **wpp, const uint8_t *nw, int tapg,
    const uint8_t *const *src, long len, const int nrows, uint8_t *const *dst, size_t plane,
    int x0) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i *tp = *tpp;
  const mml_vwin *wp = *wpp;
  __m512i acc[MML_HROWS][3];
#pragma GCC unroll 8
  for (int r = 0; r < MML_HROWS; r++) acc[r][0] = acc[r][1] = acc[r][2] = zero;
  for (int q = 0; q < tapg; q++) {
    const int n = nw[q];
    const __m512i d0 = _mm512_load_si512((const void *)tp),
                  d1 = _mm512_load_si512((const void *)(tp + 1)),
                  d2 = _mm512_load_si512((const void *)(tp + 2));
    tp += 3;
    if (!n) continue;
    const __m512i idx = _mm512_load_si512((const void *)tp);
    const long b = wp[0].base;
    if (n == 1 && b + 2 * VBYTES <= len) { /* the common case: one window, inside the rows */
#pragma GCC unroll 8
      for (int r = 0; r < nrows; r++) {
        const uint8_t *row = src[r] + b;
        const __m512i px = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)row), idx,
                                                    _mm512_loadu_si512((const void *)(row + 64)));
        acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], px, d0);
        acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], px, d1);
        acc[r][2] = _mm512_dpbusd_epi32(acc[r][2], px, d2);
      }
    } else {
#pragma GCC unroll 8
      for (int r = 0; r < nrows; r++) {
        const uint8_t *row = src[r];
        __m512i px = _mm512_permutex2var_epi8(load_upto(row + b, len - b), idx,
                                              load_upto(row + b + 64, len - b - 64));
        for (int i = 1; i < n; i++) {
          const long bi = wp[i].base;
          const __m512i v = _mm512_permutex2var_epi8(load_upto(row + bi, len - bi),
                                                     _mm512_load_si512((const void *)(tp + i)),
                                                     load_upto(row + bi + 64, len - bi - 64));
          px = _mm512_mask_blend_epi8((__mmask64)wp[i].mask, px, v);
        }
        acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], px, d0);
        acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], px, d1);
        acc[r][2] = _mm512_dpbusd_epi32(acc[r][2], px, d2);
      }
    }
    tp += n;
    wp += n;
  }
  *tpp = tp;
  *wpp = wp;
  const __m512i half = _mm512_set1_epi32(32);
  const __m128i planar =
      _mm_setr_epi8(0, 3, 6, 9, 12, 1, 4, 7, 10, 13, 2, 5, 8, 11, 14, (char)0x80);
#pragma GCC unroll 8
  for (int r = 0; r < nrows; r++) {
    __m512i v = _mm512_slli_epi32(_mm512_add_epi32(half, acc[r][2]), 8);
    v = _mm512_slli_epi32(_mm512_add_epi32(v, acc[r][1]), 8);
    v = _mm512_max_epi32(_mm512_srai_epi32(_mm512_add_epi32(v, acc[r][0]), 22), zero);
    const __m128i o = _mm_shuffle_epi8(_mm512_cvtusepi32_epi8(v), planar);
    /* channel c: bytes 5c .. 5c + 4 of o, to d + c * plane by one masked store each (the
     * store's base 5c bytes before, within the row: plane >= out >= x0 + 5) */
    uint8_t *d = dst[r] + x0;
    _mm_mask_storeu_epi8(d, 0x1f, o);
    _mm_mask_storeu_epi8(d + plane - 5, 0x1f << 5, o);
    _mm_mask_storeu_epi8(d + 2 * plane - 10, 0x1f << 10, o);
  }
}

VNNI_FN static void rows_h_wide(const mml_resample_axis *a, const uint8_t *const *src, int nrows,
                                uint8_t *const *dst, size_t plane) {
  const long len = (long)a->in * 3;
  const int tapg = a->wtapg, groups = a->wgroups;
  const __m512i *tp = (const __m512i *)a->wt;
  const mml_vwin *wp = a->wwin;
  for (int g = 0; g < groups; g++) {
    const int x0 = wgroup_x0(g, groups, a->out);
    /* a later group's bytes, prefetched (rows just written by the decoder) */
    if (g + 4 < groups) {
      const long pf = 3L * a->bounds[2 * wgroup_x0(g + 4, groups, a->out)];
      for (int r = 0; r < nrows; r++) _mm_prefetch((const char *)(src[r] + pf), _MM_HINT_T0);
    }
    const uint8_t *nw = a->wnw + (size_t)g * tapg;
    if (nrows == MML_HROWS)
      wide_group(&tp, &wp, nw, tapg, src, len, MML_HROWS, dst, plane, x0);
    else
      wide_group(&tp, &wp, nw, tapg, src, len, nrows, dst, plane, x0);
  }
}

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

/* The vertical pass past 16 taps (downscales past ~4x: the exact path at the recipe caps),
 * up to 4 * VMAX_TAPG: tap group by tap group, the three digit sums of each of the 4
 * vectors kept apart (12 accumulators, as the wide horizontal pass does) and combined at
 * the end, ((32 + S2) << 8 + S1) << 8 + S0: the same int32 value as row_v_body's chain
 * (wrapping integer sums are exact in any order), so the bytes are row_v_body's.  Only
 * one tap group's 4 interleaved vectors are live at a time (row_v_body keeps all of them:
 * 4 per tap group, more than the 32 registers past 4 tap groups). */
VNNI_FN __attribute__((always_inline)) static inline void row_v_body_wide(
    const uint32_t (*w)[3], const uint8_t *const *r, int n, uint8_t *restrict dst, const int tapg) {
  const __m512i half = _mm512_set1_epi32(32), zero = _mm512_setzero_si512();
  for (int i = 0;; i += 64) {
    if (i > n - 64) i = n - 64;
    __m512i s[4][3];
    for (int v = 0; v < 4; v++) s[v][0] = s[v][1] = s[v][2] = zero;
    for (int q = 0; q < tapg; q++) {
      const __m512i r0 = _mm512_loadu_si512((const void *)(r[4 * q] + i));
      const __m512i r1 = _mm512_loadu_si512((const void *)(r[4 * q + 1] + i));
      const __m512i r2 = _mm512_loadu_si512((const void *)(r[4 * q + 2] + i));
      const __m512i r3 = _mm512_loadu_si512((const void *)(r[4 * q + 3] + i));
      const __m512i a = _mm512_unpacklo_epi8(r0, r1), b = _mm512_unpackhi_epi8(r0, r1);
      const __m512i c = _mm512_unpacklo_epi8(r2, r3), d = _mm512_unpackhi_epi8(r2, r3);
      const __m512i x[4] = {_mm512_unpacklo_epi16(a, c), _mm512_unpackhi_epi16(a, c),
                            _mm512_unpacklo_epi16(b, d), _mm512_unpackhi_epi16(b, d)};
      for (int dg = 0; dg < 3; dg++) {
        const __m512i wd = _mm512_set1_epi32((int)w[q][dg]);
        for (int v = 0; v < 4; v++) s[v][dg] = _mm512_dpbusd_epi32(s[v][dg], x[v], wd);
      }
    }
    __m512i acc[4];
    for (int v = 0; v < 4; v++) {
      __m512i t = _mm512_slli_epi32(_mm512_add_epi32(half, s[v][2]), 8);
      t = _mm512_slli_epi32(_mm512_add_epi32(t, s[v][1]), 8);
      acc[v] = _mm512_srai_epi32(_mm512_add_epi32(t, s[v][0]), 22);
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
    case 4:
      row_v_body(w, r, n, dst, 4);
      break;
    case 5:
      row_v_body_wide(w, r, n, dst, 5);
      break;
    case 6:
      row_v_body_wide(w, r, n, dst, 6);
      break;
    case 7:
      row_v_body_wide(w, r, n, dst, 7);
      break;
    default:
      row_v_body_wide(w, r, n, dst, VMAX_TAPG);
      break;
  }
}
#endif

/* Output y's packed digits, w[q][d]; 0 when a weight does not fit three byte digits. */
static int v_digits(const mml_resample_axis *a, int y, uint32_t w[VMAX_TAPG][3]) {
  const int cnt = a->bounds[2 * y + 1], tapg = (cnt + 3) / 4;
  const int32_t *k = &a->k[(size_t)y * a->ksize];
  memset(w, 0, sizeof(uint32_t) * VMAX_TAPG * 3);
  for (int j = 0; j < tapg * 4 && j < cnt; j++) {
    int8_t d[3] = {0, 0, 0};
    if (!digits(k[j], d)) return 0;
    for (int i = 0; i < 3; i++) w[j / 4][i] |= (uint32_t)(uint8_t)d[i] << (8 * (j % 4));
  }
  return 1;
}

mml_status mml_resample_vnni_prepare_v(mml_resample_axis *a, mml_err *err) {
  a->vw_n = 0;
  if (!mml_cpu_avx512_vnni()) return MML_OK;
  const size_t per = MML_VNNI_VWORDS + 1, need = (size_t)a->out * per;
  if (need > a->cap_vw) {
    uint32_t *v = realloc(a->vw, need * sizeof *v);
    if (!v) return mml_err_set(err, MML_ENOMEM, "resize: out of memory for %zu weight words", need);
    a->vw = v;
    a->cap_vw = need;
  }
  for (int y = 0; y < a->out; y++) {
    uint32_t *v = a->vw + (size_t)y * per;
    const int tapg = (a->bounds[2 * y + 1] + 3) / 4;
    v[MML_VNNI_VWORDS] = tapg <= VMAX_TAPG && v_digits(a, y, (uint32_t(*)[3])v);
  }
  a->vw_n = a->out;
  return MML_OK;
}

int mml_resample_row_v_vnni(const mml_resample_axis *a, int y, const uint8_t *const *rows,
                            size_t off, int n, uint8_t *restrict dst) {
#ifdef MML_HAVE_VNNI_PATH
  const int cnt = a->bounds[2 * y + 1], tapg = (cnt + 3) / 4;
  if (n < 64 || tapg > VMAX_TAPG || !mml_cpu_avx512_vnni()) return 0;
  uint32_t own[VMAX_TAPG][3];
  const uint32_t(*w)[3] = own;
  if (a->vw_n == a->out) { /* made once per axis (mml_resample_vnni_prepare_v) */
    const uint32_t *v = a->vw + (size_t)y * (MML_VNNI_VWORDS + 1);
    if (!v[MML_VNNI_VWORDS]) return 0;
    w = (const uint32_t(*)[3])v;
  } else if (!v_digits(a, y, own)) {
    return 0;
  }
  const uint8_t *r[4 * VMAX_TAPG];
  for (int j = 0; j < tapg * 4; j++)
    r[j] = rows[j < cnt ? j : 0] + off; /* a weight-0 tap reads the first row */
  row_v_vnni(w, r, n, dst, tapg);
  return 1;
#else
  (void)a, (void)y, (void)rows, (void)off, (void)n, (void)dst;
  return 0;
#endif
}

int mml_resample_rows_h_vnni(const mml_resample_axis *a, const uint8_t *const *src, int nrows,
                             uint8_t *const *dst, size_t plane) {
#ifdef MML_HAVE_VNNI_PATH
  if (a->vgroups) {
    rows_h_vnni(a, src, nrows, dst, plane);
    return 1;
  }
  if (a->wgroups) {
    rows_h_wide(a, src, nrows, dst, plane);
    return 1;
  }
  return 0;
#else
  (void)a, (void)src, (void)nrows, (void)dst, (void)plane;
  return 0;
#endif
}
