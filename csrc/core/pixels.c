/*
 * pixels.c — uint8 patch rows (pixel_format uint8, mml/vision.h) expanded into the float32
 * or bfloat16 rows of the float formats, on the CPU: each value one lookup in a
 * per-channel 256-entry table (the values the normalisation writes), each image frame
 * repeated into the T temporal slots.  The GPU path is torch's (mmloader.torch); this is
 * the CPU one behind mmloader.torch.expand_pixels and the loader's compact in-flight
 * batches (loader_collator.c: a batch's images are decoded as uint8 rows and expanded
 * here just before emission).
 *
 * Two loops, the same lookups: where the output rows are 16-byte multiples at a 16-byte
 * aligned address (pool buffers, P = 14 or 16), each row is assembled in an aligned
 * scratch row (one lookup per value of a frame, copied to the other slots) and written
 * with non-temporal stores: the output is far larger than the caches, so this saves
 * reading every output line before writing it (float32, 40000 rows of P 14: 11 ms against
 * 31 ms for the plain loop, and 20 ms for AVX2 gathers from the table, slower on Zen4 than
 * scalar lookups).  Otherwise the plain loop.
 *
 * Pure function of its arguments; reentrant.
 */
#include <string.h>

#include "mml/vision.h"

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
#include <emmintrin.h>
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
