/*
 * image_fmt.h — internal contract between image.c (format detection by magic bytes, JPEG,
 * PNG, the public entry points) and the decoders of the other formats, one file each:
 * image_webp.c (libwebp), image_gif.c (giflib), image_bmp.c (by hand), image_tiff.c
 * (libtiff).  Not installed; the public contract is mml/image.h.
 *
 * Every probe reads the header only and fills width/height/format exactly as the decoder
 * will deliver them (the vision plan relies on it).  Every decoder produces RGB8 rows with
 * the pixel semantics of Pillow's Image.open + transformers' convert_to_rgb (alpha and
 * palette transparency composited onto white with Pillow's alpha_composite formula) and
 * streams them to the sink in increasing y.  Buffers are the caller's (the per-thread
 * mml_decoder's): `whole` holds a whole decoded image when the format needs one, `row`
 * one RGB8 row; both grow and are reused.
 *
 * Threads: all functions are reentrant; the buffers belong to one thread at a time.
 */
#ifndef MML_IMAGE_FMT_H
#define MML_IMAGE_FMT_H

#include "mml/image.h"

typedef struct mml_img_bufs {
  mml_bytes *whole;
  mml_bytes *row;
} mml_img_bufs;

#define MML_DECLARE_FORMAT(name)                                                           \
  mml_status mml_##name##_probe(const uint8_t *p, size_t len, mml_image_info *info,        \
                                mml_err *err);                                             \
  mml_status mml_##name##_decode(const uint8_t *p, size_t len, const mml_img_bufs *b,      \
                                 const mml_row_sink *sink, mml_err *err);
MML_DECLARE_FORMAT(webp)
MML_DECLARE_FORMAT(gif)
MML_DECLARE_FORMAT(bmp)
MML_DECLARE_FORMAT(tiff)
#undef MML_DECLARE_FORMAT

/* Pillow's alpha_composite of (v, a) over opaque white, then the RGB channel: exact for
 * every (v, a) pair (tests check all 65536). */
static inline uint8_t mml_over_white(uint32_t v, uint32_t a) {
  if (a == 0) return 255;
  uint32_t t = (v * a + 255u * (255u - a)) * 128u + (0x80u << 7);
  return (uint8_t)(((((t >> 8) + t) >> 8)) >> 7);
}

/* One RGBA8 row composited onto white into RGB8. */
static inline void mml_rgba_row_over_white(const uint8_t *s, uint8_t *o, int w) {
  for (int x = 0; x < w; x++, s += 4, o += 3) {
    o[0] = mml_over_white(s[0], s[3]);
    o[1] = mml_over_white(s[1], s[3]);
    o[2] = mml_over_white(s[2], s[3]);
  }
}

static inline uint16_t mml_le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t mml_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#endif
