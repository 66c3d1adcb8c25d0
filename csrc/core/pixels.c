/*
 * pixels.c — uint8 patch rows (pixel_format uint8, mml/vision.h) expanded into the float32
 * or bfloat16 rows of the float formats, on the CPU: each value one lookup in a
 * per-channel 256-entry table (the values the normalisation writes), each image frame
 * repeated into the T temporal slots.  The GPU path is torch's (mmloader.torch); this is
 * the CPU one behind mmloader.torch.expand_pixels.
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

mml_status mml_pixels_expand(const uint8_t *src, int64_t rows, int patch_size, int frames, int T,
                             const float table[3][256], int format, void *dst, mml_err *err) {
  if (rows < 0 || patch_size < 1 || T < 1 || (frames != 1 && frames != T) || !table ||
      (rows && (!src || !dst)) || (format != MML_PIXEL_FLOAT32 && format != MML_PIXEL_BFLOAT16))
    return mml_err_set(err, MML_EINVAL,
                       "expand: bad arguments (rows %lld, patch %d, frames %d of T %d, format %d)",
                       (long long)rows, patch_size, frames, T, format);
  const size_t PP = (size_t)patch_size * patch_size, in_cols = 3 * PP * (size_t)frames;
  if (format == MML_PIXEL_FLOAT32) {
    EXPAND(float, table);
  } else {
    uint16_t t16[3][256];
    for (int c = 0; c < 3; c++)
      for (int v = 0; v < 256; v++) t16[c][v] = to_bf16(table[c][v]);
    EXPAND(uint16_t, t16);
  }
  return MML_OK;
}
#undef EXPAND
