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
  int alpha;                /* MML_ALPHA_*: mml_decode_opts.alpha */
  int *key;                 /* out, before sink->begin: a colour key for after the resize */
  uint8_t *kc;              /* its 3 bytes (mml_decoder_color_key) */
  const mml_cancel *cancel; /* checked per row or strip: MML_ECANCELLED once set */
} mml_img_bufs;

#define MML_DECLARE_FORMAT(name)                                                                   \
  mml_status mml_##name##_probe(const uint8_t *p, size_t len, mml_image_info *info, mml_err *err); \
  mml_status mml_##name##_decode(const uint8_t *p, size_t len, mml_img_bufs *b,                    \
                                 const mml_row_sink *sink, mml_err *err);
MML_DECLARE_FORMAT(webp)
MML_DECLARE_FORMAT(gif)
MML_DECLARE_FORMAT(bmp)
MML_DECLARE_FORMAT(tiff)
#undef MML_DECLARE_FORMAT

/* A decode run aside (image_aside.c): fn(arg, in, len, out, cancel) decodes in[0..len)
 * into out (the caller's buffer `out`, as the caller prepared it), checking cancel where it
 * can, and returns its result.  mml_image_aside runs it on a thread of its own with copies
 * of arg (arg_size bytes, copied back when it finishes) and of the input, and returns 1
 * once it finished (*rc: its result; *out holds the output), -1 at once when `cancel` is
 * set first (the job and *out's buffer are abandoned to its thread, which frees them; *out
 * is left empty), 0 when it could not run it (too many abandoned, no memory, no thread:
 * *out untouched, the caller decodes itself). */
typedef int (*mml_aside_fn)(void *arg, const uint8_t *in, size_t len, uint8_t *out,
                            const mml_cancel *cancel);
int mml_image_aside(mml_aside_fn fn, void *arg, size_t arg_size, const uint8_t *in, size_t len,
                    mml_bytes *out, const mml_cancel *cancel, int *rc);
/* Abandoned jobs alive now (tests). */
int mml_image_aside_abandoned(void);

/* Pillow's alpha_composite of (v, a) over opaque white, then the RGB channel: exact for
 * every (v, a) pair (tests check all 65536). */
static inline uint8_t mml_over_white(uint32_t v, uint32_t a) {
  if (a == 0) return 255;
  uint32_t t = (v * a + 255u * (255u - a)) * 128u + (0x80u << 7);
  return (uint8_t)(((((t >> 8) + t) >> 8)) >> 7);
}

/* Value v with alpha a under an alpha policy (MML_ALPHA_*); rgba: Pillow opens the image
 * as mode RGBA (not LA, P or a tRNS colour), which is all qwen-vl-utils pastes.  Pillow's
 * paste onto white with the alpha as mask (Paste.c: DIV255(255*(255-a) + v*a)) rounds
 * exactly as alpha_composite does for every (v, a) pair, so one formula serves both. */
static inline uint8_t mml_alpha_px(int policy, int rgba, uint32_t v, uint32_t a) {
  if (policy == MML_ALPHA_COMPOSITE || (policy == MML_ALPHA_PASTE && rgba))
    return mml_over_white(v, a);
  return (uint8_t)v;
}

/* One RGBA8 row (of an image Pillow opens as RGBA) to RGB8 under an alpha policy. */
static inline void mml_rgba_row_to_rgb(int policy, const uint8_t *s, uint8_t *o, int w) {
  for (int x = 0; x < w; x++, s += 4, o += 3) {
    o[0] = mml_alpha_px(policy, 1, s[0], s[3]);
    o[1] = mml_alpha_px(policy, 1, s[1], s[3]);
    o[2] = mml_alpha_px(policy, 1, s[2], s[3]);
  }
}

/* Unsigned value (SHORT/LONG/LONG8) of `tag` in the first IFD of the TIFF structure in
 * p[0..len) (a TIFF file or an EXIF block); 0 when found, -1 when not, -2 on a bad or
 * truncated structure (*why says which). */
int mml_tiff_ifd0_tag(const uint8_t *p, size_t len, unsigned tag, uint64_t *val, const char **why);

static inline uint16_t mml_le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t mml_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#endif
