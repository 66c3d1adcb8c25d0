/*
 * image_exif.c — the EXIF orientation of an encoded image, found where Pillow's getexif()
 * finds it (for transformers' load_image, which applies ImageOps.exif_transpose): the first
 * APP1 "Exif" segment before a JPEG's scan, a PNG eXIf chunk (anywhere: Pillow loads the
 * image to see chunks after IDAT), a WebP EXIF chunk.  Only chunk and segment headers are
 * walked; the value is tag 0x0112 of the EXIF block's first IFD.  Also the transposition
 * itself (used by the vision path and by the TIFF decoder, which applies a TIFF's own
 * orientation on every route as Pillow does on load).
 *
 * Threads: pure.
 */
#include <string.h>

#include "image_fmt.h"

static int orientation_of(const uint8_t *tiff, size_t n) {
  if (n >= 6 && !memcmp(tiff, "Exif\0\0", 6)) tiff += 6, n -= 6;
  uint64_t v = 1;
  const char *why;
  if (mml_tiff_ifd0_tag(tiff, n, 0x0112, &v, &why) != 0 || v < 1 || v > 8) return 1;
  return (int)v;
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int mml_image_orientation(const uint8_t *p, size_t len) {
  if (len >= 4 && p[0] == 0xFF && p[1] == 0xD8) { /* JPEG: segments up to SOS */
    size_t i = 2;
    while (i + 4 <= len) {
      if (p[i] != 0xFF) return 1;
      uint8_t m = p[i + 1];
      if (m == 0xFF) {
        i++;
        continue;
      }
      if (m == 0xD8 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {
        i += 2;
        continue;
      }
      if (m == 0xDA || m == 0xD9) return 1;
      size_t seg = (size_t)p[i + 2] << 8 | p[i + 3];
      if (seg < 2 || i + 2 + seg > len) return 1;
      if (m == 0xE1 && seg >= 8 && !memcmp(p + i + 4, "Exif\0\0", 6))
        return orientation_of(p + i + 4, seg - 2);
      i += 2 + seg;
    }
    return 1;
  }
  if (len >= 8 && !memcmp(p, "\x89PNG\r\n\x1a\n", 8)) { /* PNG chunks */
    for (size_t i = 8; i + 12 <= len;) {
      uint32_t n = be32(p + i);
      if (n > len - i - 12) return 1;
      if (!memcmp(p + i + 4, "eXIf", 4)) return orientation_of(p + i + 8, n);
      if (!memcmp(p + i + 4, "IEND", 4)) return 1;
      i += 12 + (size_t)n;
    }
    return 1;
  }
  if (len >= 12 && !memcmp(p, "RIFF", 4) && !memcmp(p + 8, "WEBP", 4)) { /* RIFF chunks */
    for (size_t i = 12; i + 8 <= len;) {
      uint32_t n = mml_le32(p + i + 4);
      if (n > len - i - 8) return 1;
      if (!memcmp(p + i, "EXIF", 4)) return orientation_of(p + i + 8, n);
      i += 8 + (size_t)n + (n & 1);
    }
    return 1;
  }
  return 1; /* TIFF: applied by its decoder, as Pillow's TiffImagePlugin does */
}

void mml_rgb8_transpose(const mml_rgb8 *src, int o, uint8_t *dst) {
  const int W = src->width, H = src->height, ow = o >= 5 ? H : W, oh = o >= 5 ? W : H;
  for (int y = 0; y < oh; y++) {
    uint8_t *d = dst + (size_t)y * ow * 3;
    for (int x = 0; x < ow; x++, d += 3) {
      int sx, sy;
      switch (o) {
        case 2:
          sx = W - 1 - x, sy = y;
          break;
        case 3:
          sx = W - 1 - x, sy = H - 1 - y;
          break;
        case 4:
          sx = x, sy = H - 1 - y;
          break;
        case 5:
          sx = y, sy = x;
          break;
        case 6:
          sx = y, sy = H - 1 - x;
          break;
        case 7:
          sx = W - 1 - y, sy = H - 1 - x;
          break;
        case 8:
          sx = W - 1 - y, sy = x;
          break;
        default:
          sx = x, sy = y;
          break;
      }
      memcpy(d, src->pixels + (size_t)sy * src->stride + (size_t)sx * 3, 3);
    }
  }
}
