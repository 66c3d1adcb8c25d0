/*
 * pixels.c — uint8 patch rows (pixel_format uint8, mml/vision.h) expanded into the float32
 * or bfloat16 rows of the float formats, on the CPU: each value one lookup in a
 * per-channel 256-entry table (the values the normalisation writes), each image frame
 * repeated into the T temporal slots.  The GPU path is torch's (mmloader.torch); this is
 * the CPU one behind mmloader.torch.expand_pixels and the loader's compact in-flight
 * batches (loader_collator.c: a batch's images are decoded as uint8 rows and expanded
 * here just before emission).
 *
 * Three loops, the same lookups.  With AVX-512 VBMI (expand_stream_vbmi) the lookups are
 * byte permutes, 64 values at a time, and every 64-byte line of the output is written
 * straight from the lookup's registers with a non-temporal store (vbmi_lines): the output
 * is far larger than the caches, so this saves reading every output line before writing
 * it, and with no scratch row the lookups of later lines run while earlier lines drain to
 * memory.  Without it, where the output rows are 16-byte multiples at a 16-byte aligned
 * address (pool buffers, P = 14 or 16), each row is assembled in an aligned scratch row
 * (one scalar lookup per value of a frame, copied to the other slots) and streamed out
 * (expand_stream: float32, 40000 rows of P 14, 11 ms against 31 ms for the plain loop,
 * and 20 ms for AVX2 gathers from the table, slower on Zen4 than scalar lookups).
 * Otherwise the plain loop.
 *
 * Why no scratch row with VBMI (issue 34; the same bytes): the loop before this one
 * looked up into an aligned scratch row and streamed the row out of it.  Its stores into
 * the scratch queued behind the non-temporal ones, so the lookups and the streaming took
 * their sum; perf of the Loader end to end at 768x768 (fast_decode, float32, 2 threads)
 * had two thirds of the loop's samples on the scratch stores and 1.1-1.3 ms a sample in
 * it; written from registers, 0.7-0.9 ms (benchmarks/e2e_cap_ab.py's figures:
 * docs/benchmarks.md, "End to end at the caps").
 *
 * In place (mml_pixels_expand_inplace): the uint8 rows at the start of a buffer that holds
 * their float rows, expanded back to front in runs of rows whose outputs lie past every
 * input still unread (the same loops on each run, so the same values); row 0 from a copy.
 * The first run (mml_pixels_inplace_free_from: 7/8 of the rows for float32 with T = 2)
 * may be cut into pieces done in any order or at once (loader_expand.c).
 *
 * Pure function of its arguments; reentrant.
 */
#include <stdlib.h>
#include <string.h>

#include "mml/vision.h"
#include "resize.h" /* mml_cpu_avx512_vbmi */

static uint16_t to_bf16(float f) { /* round to nearest even; the values are finite */
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* One channel's P*P*frames values of every row, for each destination slot. */
#define EXPAND(TYPE, LUT)                                                             \
  do {                                                                                \
    TYPE *d = dst;                                                                    \
    for (int64_t r = 0; r < rows; r++, src += in_cols)                                \
      for (int c = 0; c < 3; c++)                                                     \
        for (int t = 0; t < T; t++, d += PP) {                                        \
          const uint8_t *s = src + ((size_t)c * frames + (frames == 1 ? 0 : t)) * PP; \
          const TYPE *l = LUT[c];                                                     \
          for (size_t k = 0; k < PP; k++) d[k] = l[s[k]];                             \
        }                                                                             \
  } while (0)

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MML_HAVE_STREAM_EXPAND 1
enum { EXPAND_TMP = 16384 }; /* bytes of the aligned scratch row (larger rows: plain stores) */

/* One output row into o: each channel's PP values of its frame looked up once, into slot
 * 0 (or each slot, for rows keeping their frames), then copied to the other slots. */
#define ROW(TYPE, LUT)                                                                             \
  do {                                                                                             \
    TYPE *d = (TYPE *)o;                                                                           \
    for (int c = 0; c < 3; c++, d += (size_t)T * PP) {                                             \
      const TYPE *l = LUT[c];                                                                      \
      for (int t = 0; t < (frames == 1 ? 1 : T); t++) {                                            \
        const uint8_t *s = src + ((size_t)c * frames + t) * PP;                                    \
        for (size_t k = 0; k < PP; k++) d[(size_t)t * PP + k] = l[s[k]];                           \
      }                                                                                            \
      for (int t = 1; frames == 1 && t < T; t++) memcpy(d + (size_t)t * PP, d, PP * sizeof(TYPE)); \
    }                                                                                              \
  } while (0)

/* Rows assembled in an aligned scratch row and streamed out (dst and the row size are
 * 16-byte multiples; the caller checked). */
static void expand_stream(const uint8_t *src, int64_t rows, size_t PP, int frames, int T,
                          const float table[3][256], const uint16_t t16[3][256], int bf16,
                          uint8_t *dst) {
  _Alignas(64) uint8_t o[EXPAND_TMP];
  const size_t in_cols = 3 * PP * (size_t)frames, rb = 3 * PP * (size_t)T * (bf16 ? 2 : 4);
  for (int64_t r = 0; r < rows; r++, src += in_cols, dst += rb) {
    if (bf16)
      ROW(uint16_t, t16);
    else
      ROW(float, table);
    for (size_t i = 0; i < rb; i += 16)
      _mm_stream_si128((__m128i *)(dst + i), _mm_load_si128((const __m128i *)(o + i)));
  }
  _mm_sfence();
}
#undef ROW

/* The same rows with the lookups done 64 at a time by AVX-512 VBMI byte permutes: the
 * table of a channel is held as its values' byte planes (4 for float32, 2 for bfloat16;
 * 256 bytes each, four registers), vpermt2b looks 64 indices up in each half of a plane
 * (7 index bits) and bit 7 picks the half; byte unpacks then interleave the planes into
 * values.  Unpacks work within 128-bit lanes, so the indices are first permuted (`perm`)
 * so that the unpacked values come out in order.  The same bytes as the scalar lookups. */
#define MML_TARGET_VBMI __attribute__((target("avx2,avx512f,avx512bw,avx512vbmi")))
/* One channel's table lookup of 64 indices (planes: that channel's np byte planes, 256
 * bytes each): v[q] gets the values of indices (64 / np)q .. (64 / np)q + 64 / np - 1 in
 * order (np = 4: 16 float32 a vector; np = 2: 32 bfloat16). */
MML_TARGET_VBMI static inline __attribute__((always_inline)) void vbmi_lookup(
    __m512i idx, const uint8_t *pc, __m512i perm, const int bf16, __m512i v[4]) {
  const int np = bf16 ? 2 : 4;
  idx = _mm512_permutexvar_epi8(perm, idx);
  const __mmask64 hi = _mm512_movepi8_mask(idx);
  __m512i b[4];
  for (int p = 0; p < np; p++) {
    const uint8_t *pl = pc + (size_t)p * 256;
    b[p] = _mm512_mask_blend_epi8(
        hi,
        _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)pl), idx,
                                 _mm512_loadu_si512((const void *)(pl + 64))),
        _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)(pl + 128)), idx,
                                 _mm512_loadu_si512((const void *)(pl + 192))));
  }
  if (bf16) {
    v[0] = _mm512_unpacklo_epi8(b[0], b[1]);
    v[1] = _mm512_unpackhi_epi8(b[0], b[1]);
  } else {
    const __m512i w0 = _mm512_unpacklo_epi8(b[0], b[1]), w1 = _mm512_unpackhi_epi8(b[0], b[1]);
    const __m512i w2 = _mm512_unpacklo_epi8(b[2], b[3]), w3 = _mm512_unpackhi_epi8(b[2], b[3]);
    v[0] = _mm512_unpacklo_epi16(w0, w2);
    v[1] = _mm512_unpackhi_epi16(w0, w2);
    v[2] = _mm512_unpacklo_epi16(w1, w3);
    v[3] = _mm512_unpackhi_epi16(w1, w3);
  }
}

/* The value at position g of the output (rows of S = 3T slots of PP values each: slot u
 * of a row holds channel u / T of frame u % T, or of the one frame) from the planes. */
static uint32_t value_at(const uint8_t *src, uint64_t g, size_t PP, int frames, int T,
                         const uint8_t *planes) {
  const size_t rv = 3 * (size_t)T * PP, r = g / rv, w = g % rv, u = w / PP, k = w % PP;
  const size_t c = u / (size_t)T, f = frames == 1 ? 0 : u % (size_t)T;
  const uint8_t b = src[r * 3 * PP * (size_t)frames + (c * (size_t)frames + f) * PP + k];
  const uint8_t *pc = planes + c * 1024;
  return pc[b] | (uint32_t)pc[256 + b] << 8 | (uint32_t)pc[512 + b] << 16 |
         (uint32_t)pc[768 + b] << 24;
}

/* The values of the `valid` (<= 64) positions of the output from row r, slot (c, t),
 * index k of the slot on: one load of indices (or, crossing into the next slot, two
 * masked loads), looked up in the slot's channel (and the next slot's, blended, where the
 * channel changes).  v as vbmi_lookup's. */
MML_TARGET_VBMI static inline __attribute__((always_inline)) void vbmi_block(
    const uint8_t *src, size_t r, size_t c, size_t t, size_t k, size_t valid, size_t PP, int frames,
    int T, const uint8_t *planes, __m512i perm, const int bf16, __m512i v[4]) {
  const size_t in_cols = 3 * PP * (size_t)frames, in = PP - k; /* left in the slot */
  const uint8_t *sp = src + r * in_cols + (c * (size_t)frames + (frames == 1 ? 0 : t)) * PP + k;
  if (in >= valid) { /* one slot */
    const __m512i idx = valid == 64 ? _mm512_loadu_si512((const void *)sp)
                                    : _mm512_maskz_loadu_epi8(~0ull >> (64 - valid), sp);
    vbmi_lookup(idx, planes + c * 1024, perm, bf16, v);
    return;
  }
  size_t c2 = c, t2 = t + 1, r2 = r; /* the next slot */
  if (t2 == (size_t)T) t2 = 0, c2++;
  if (c2 == 3) c2 = 0, r2++;
  const uint8_t *sp2 = src + r2 * in_cols + (c2 * (size_t)frames + (frames == 1 ? 0 : t2)) * PP;
  const __mmask64 m1 = ~0ull >> (64 - in), m2 = (~0ull >> (64 - valid)) & ~m1;
  __m512i idx = _mm512_maskz_loadu_epi8(m1, sp);
  idx = _mm512_mask_loadu_epi8(idx, m2, sp2 - in);
  vbmi_lookup(idx, planes + c * 1024, perm, bf16, v);
  if (c2 != c) {
    __m512i w[4];
    vbmi_lookup(idx, planes + c2 * 1024, perm, bf16, w);
    for (size_t q = 0; q < (bf16 ? 2u : 4u); q++)
      v[q] = bf16 ? _mm512_mask_blend_epi16((__mmask32)(m2 >> (32 * q)), v[q], w[q])
                  : _mm512_mask_blend_epi32((__mmask16)(m2 >> (16 * q)), v[q], w[q]);
  }
}

/* The rows written a cache line at a time straight from the lookups' registers, with
 * non-temporal stores: the output is taken as one run of values, cut into blocks of 64
 * (4 cache lines of float32, 2 of bfloat16) from dst's first 64-byte boundary; a block's
 * 64 indices are one load from the source (or, where the block crosses into the next
 * slot, two masked loads: the rest of this slot's bytes and the start of the next), looked
 * up in the slot's channel (and the next slot's, blended, where the channel changes).
 * The values before the first boundary and after the last are written one by one.  No
 * scratch row: the lookups of later lines run while earlier lines drain to memory. */
MML_TARGET_VBMI static inline __attribute__((always_inline)) void vbmi_lines(
    const uint8_t *src, int64_t rows, size_t PP, int frames, int T, const uint8_t *planes,
    const int bf16, uint8_t *dst) {
  const size_t esz = bf16 ? 2 : 4, vpl = 64 / esz, np = bf16 ? 2 : 4, rv = 3 * PP * (size_t)T;
  const uint64_t n = (uint64_t)rows * rv;
  uint64_t head = ((64 - ((uintptr_t)dst & 63)) & 63) / esz;
  if (head > n) head = n;
  const uint64_t lines = (n - head) / vpl, body_end = head + lines * vpl;
  for (uint64_t g = 0; g < head; g++) {
    const uint32_t v = value_at(src, g, PP, frames, T, planes);
    memcpy(dst + g * esz, &v, esz);
  }
  for (uint64_t g = body_end; g < n; g++) {
    const uint32_t v = value_at(src, g, PP, frames, T, planes);
    memcpy(dst + g * esz, &v, esz);
  }
  if (!lines) return;
  /* unpacked vector q's 128-bit lane L holds positions 16L + (16/np)q + j (j < 16/np) of
   * the indices; it must hold values (64/np)q + (16/np)L + j */
  uint8_t pm[64];
  for (int L = 0; L < 4; L++)
    for (int q = 0; q < (int)np; q++)
      for (int j = 0; j < 16 / (int)np; j++)
        pm[16 * L + (16 / np) * q + j] = (uint8_t)((64 / np) * q + (16 / np) * L + j);
  const __m512i perm = _mm512_loadu_si512((const void *)pm);
  /* the block's first value: row r, slot (c, t), index k in the slot */
  size_t r = head / rv, k = head % rv, c, t;
  {
    const size_t u = k / PP;
    k %= PP;
    c = u / (size_t)T;
    t = u % (size_t)T;
  }
  uint8_t *d = dst + head * esz;
  /* whole blocks: np lines each, stored from registers (the loop over q unrolls) */
  uint64_t left = lines;
  for (; left >= np; left -= np, d += 64 * np) {
    __m512i v[4];
    vbmi_block(src, r, c, t, k, 64, PP, frames, T, planes, perm, bf16, v);
    for (size_t q = 0; q < np; q++) _mm512_stream_si512((__m512i *)(d + 64 * q), v[q]);
    k += 64;
    if (k >= PP) { /* PP >= 64: into the next slot once at most */
      k -= PP;
      if (++t == (size_t)T) t = 0, c++;
      if (c == 3) c = 0, r++;
    }
  }
  if (left) { /* the last lines: fewer than a block */
    __m512i v[4];
    vbmi_block(src, r, c, t, k, (size_t)left * vpl, PP, frames, T, planes, perm, bf16, v);
    for (size_t q = 0; q < np; q++)
      if (q < left) _mm512_stream_si512((__m512i *)(d + 64 * q), v[q]);
  }
  _mm_sfence();
}

/* bf16 a compile-time constant in each, so the loops over planes and vectors unroll. */
MML_TARGET_VBMI static void expand_stream_vbmi(const uint8_t *src, int64_t rows, size_t PP,
                                               int frames, int T, const uint8_t *planes, int bf16,
                                               uint8_t *dst) {
  if (bf16)
    vbmi_lines(src, rows, PP, frames, T, planes, 1, dst);
  else
    vbmi_lines(src, rows, PP, frames, T, planes, 0, dst);
}
#undef MML_TARGET_VBMI
#endif

mml_status mml_pixels_expand(const uint8_t *src, int64_t rows, int patch_size, int frames, int T,
                             const float table[3][256], int format, void *dst, mml_err *err) {
  if (rows < 0 || patch_size < 1 || T < 1 || (frames != 1 && frames != T) || !table ||
      (rows && (!src || !dst)) || (format != MML_PIXEL_FLOAT32 && format != MML_PIXEL_BFLOAT16))
    return mml_err_set(err, MML_EINVAL,
                       "expand: bad arguments (rows %lld, patch %d, frames %d of T %d, format %d)",
                       (long long)rows, patch_size, frames, T, format);
  const size_t PP = (size_t)patch_size * patch_size, in_cols = 3 * PP * (size_t)frames;
  const int bf16 = format == MML_PIXEL_BFLOAT16;
  uint16_t t16[3][256];
  if (bf16)
    for (int c = 0; c < 3; c++)
      for (int v = 0; v < 256; v++) t16[c][v] = to_bf16(table[c][v]);
#ifdef MML_HAVE_STREAM_EXPAND
  const size_t rb = 3 * PP * (size_t)T * (bf16 ? 2 : 4);
  if (rb % 16 == 0 && (uintptr_t)dst % 16 == 0 && PP >= 64 && mml_cpu_avx512_vbmi()) {
    _Alignas(64) uint8_t planes[3][4][256]; /* byte b of each value, per channel */
    for (int c = 0; c < 3; c++)
      for (int v = 0; v < 256; v++) {
        uint32_t u;
        if (bf16) {
          u = t16[c][v];
        } else {
          memcpy(&u, &table[c][v], sizeof u);
        }
        for (int b = 0; b < 4; b++) planes[c][b][v] = (uint8_t)(u >> (8 * b));
      }
    expand_stream_vbmi(src, rows, PP, frames, T, &planes[0][0][0], bf16, dst);
    return MML_OK;
  }
  if (rb <= EXPAND_TMP && rb % 16 == 0 && (uintptr_t)dst % 16 == 0) {
    expand_stream(src, rows, PP, frames, T, table, (const uint16_t(*)[256])t16, bf16, dst);
    return MML_OK;
  }
#endif
  if (!bf16)
    EXPAND(float, table);
  else
    EXPAND(uint16_t, t16);
  return MML_OK;
}
#undef EXPAND

int64_t mml_pixels_inplace_free_from(int64_t rows, int patch_size, int T, int format) {
  if (rows <= 1 || patch_size < 1 || T < 1 ||
      (format != MML_PIXEL_FLOAT32 && format != MML_PIXEL_BFLOAT16))
    return rows;
  const size_t esz = format == MML_PIXEL_BFLOAT16 ? 2 : 4;
  const size_t U = 3 * (size_t)patch_size * patch_size, F = U * (size_t)T * esz; /* F >= 2U */
  return (int64_t)(((size_t)rows * U + F - 1) / F);
}

mml_status mml_pixels_expand_inplace(void *buf, int64_t rows, int patch_size, int T,
                                     const float table[3][256], int format, mml_err *err) {
  const size_t esz = format == MML_PIXEL_BFLOAT16 ? 2 : 4;
  if (rows < 0 || patch_size < 1 || T < 1 || (rows && !buf) ||
      (format != MML_PIXEL_FLOAT32 && format != MML_PIXEL_BFLOAT16))
    return mml_err_set(err, MML_EINVAL,
                       "expand in place: bad arguments (rows %lld, patch %d, T %d, format %d)",
                       (long long)rows, patch_size, T, format);
  const size_t U = 3 * (size_t)patch_size * patch_size, F = U * (size_t)T * esz; /* F >= 2U */
  uint8_t *b = buf;
  int64_t r1 = rows;
  mml_status st = MML_OK;
  /* rows [r0, r1) at once, front to back: their outputs start at r0 * F >= r1 * U, past
   * every input byte still unread (rows < r1), whatever order the kernel writes in */
  while (r1 > 1 && !st) {
    int64_t r0 = mml_pixels_inplace_free_from(r1, patch_size, T, format);
    st = mml_pixels_expand(b + (size_t)r0 * U, r1 - r0, patch_size, 1, T, table, format,
                           b + (size_t)r0 * F, err);
    r1 = r0;
  }
  if (r1 == 1 && !st) { /* row 0's output covers its input: from a copy */
    uint8_t small[4096], *tmp = U <= sizeof small ? small : malloc(U);
    if (!tmp) return mml_err_set(err, MML_ENOMEM, "expand in place: cannot allocate a row");
    memcpy(tmp, b, U);
    st = mml_pixels_expand(tmp, 1, patch_size, 1, T, table, format, b, err);
    if (tmp != small) free(tmp);
  }
  return st;
}
