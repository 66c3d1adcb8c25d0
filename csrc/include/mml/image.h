/*
 * mml/image.h — header probe and decode of JPEG (libjpeg-turbo), PNG (libpng), WebP
 * (libwebp), GIF (giflib, first frame), BMP and TIFF (libtiff, first page) into RGB8 with
 * the semantics of the transformers PIL backend (Pillow's Image.open + convert_to_rgb):
 * alpha and palette transparency composited onto white, palette and grayscale expanded,
 * 16-bit reduced the way Pillow does, CMYK/YCCK converted as Pillow does.  The format is
 * chosen by magic bytes, never by file name.  EXIF orientation is not applied (the HF
 * processor does not either).
 *
 * Threads: a decoder is per-thread scratch (not shared); probe is stateless.
 */
#ifndef MML_IMAGE_H
#define MML_IMAGE_H

#include "mml/common.h"

typedef enum {
  MML_FMT_UNKNOWN = 0,
  MML_FMT_JPEG,
  MML_FMT_PNG,
  MML_FMT_WEBP,
  MML_FMT_GIF,
  MML_FMT_BMP,
  MML_FMT_TIFF
} mml_image_format;

/* "jpeg", "png", "webp", "gif", "bmp", "tiff" ("" for MML_FMT_UNKNOWN). */
const char *mml_image_format_name(mml_image_format f);

typedef struct mml_image_info {
  int width, height;
  mml_image_format format;
  /* Bytes of decoder scratch the decode of this image maps beyond a few rows (0: rows
   * only), an upper bound from the header, rounded to 2 MiB as mml_mapped rounds: a
   * multi-scan JPEG's whole-image coefficient arrays (image_jpeg_mem.c), the whole image of
   * an interlaced PNG and of the formats decoded whole (WebP, GIF, RLE BMP, TIFF, with
   * what libwebp / libtiff allocate beside it).  max_memory charges it (loader_place.c). */
  int64_t scratch;
  /* A multi-scan JPEG's scans (SOS markers, found by walking its segments and entropy
   * data; only as many as `len` bytes hold); 0 for other images. */
  int scans;
} mml_image_info;

/* Reads width/height from the header without decoding (JPEG SOF, PNG IHDR, WebP VP8/VP8L/
 * VP8X, GIF screen and first image descriptor, BMP info header, TIFF first IFD).
 * MML_EUNSUPPORTED for other formats (the message names the format the bytes look like
 * and shows the first bytes in hex) and for unsupported variants of known ones,
 * MML_EDECODE for a broken or truncated header. */
mml_status mml_image_probe(const uint8_t *data, size_t len, mml_image_info *info, mml_err *err);

/* An RGB8 image view: `pixels` rows of `stride` bytes, 3 bytes per pixel. */
typedef struct mml_rgb8 {
  uint8_t *pixels;
  int width, height;
  size_t stride;
} mml_rgb8;

typedef struct mml_decoder mml_decoder; /* per-thread decode scratch, reused */

mml_status mml_decoder_new(mml_decoder **out);
void mml_decoder_free(mml_decoder *d); /* NULL is fine */
/* Every decode on d refuses images of more than max_pixels (width*height, from the header
 * and again from the size the library reports, before any row): MML_ETOOBIG.  New
 * decoders start at MML_DEFAULT_MAX_IMAGE_PIXELS; 0 lifts the limit. */
#define MML_DEFAULT_MAX_IMAGE_PIXELS ((int64_t)178956970) /* Pillow's bomb error threshold */
void mml_decoder_set_max_pixels(mml_decoder *d, int64_t max_pixels);

/* Every decode on d refuses a JPEG of more than max_scans scans: MML_ESCANS, before any
 * decoding when the probe counts them, else when libjpeg reaches the scan after the
 * limit.  Each scan of a progressive JPEG visits every block of its components, so a
 * file of a few hundred KB with thousands of scans costs minutes (issue 29); encoders
 * write 10 or so.  New decoders start at MML_DEFAULT_MAX_JPEG_SCANS; 0 lifts the limit. */
#define MML_DEFAULT_MAX_JPEG_SCANS 100
void mml_decoder_set_max_scans(mml_decoder *d, int max_scans);

/* Every decode on d stops with MML_ECANCELLED soon after `c` is set (NULL: never): the
 * JPEG decoder checks it once per row and per scan's MCU row (libjpeg's progress hook),
 * the PNG decoder whenever libpng reads input and once per row, the others per row or
 * strip.  `c` must outlive its use by d. */
void mml_decoder_set_cancel(mml_decoder *d, const mml_cancel *c);

/* A multi-scan (progressive) JPEG is decoded through whole-image coefficient arrays (3
 * bytes per pixel at 4:2:0) in a region the decoder keeps mapped for the next image while
 * it is at most `bytes` (new decoders: 8 MiB, about 2.7 megapixels; image_jpeg_mem.c); a
 * larger one is unmapped after its image, and the next one maps it afresh: a page fault
 * and the kernel's zeroing per page.  Setting it trims the region now if it is larger. */
void mml_decoder_set_jpeg_keep(mml_decoder *d, size_t bytes);

/* How strict and which reference the decoder follows; kept until changed ({0}: defaults). */
typedef struct mml_decode_opts {
  /* 0: as Pillow — a libjpeg error anywhere (also after the last scanline, up to EOI) or
   * truncation refuses the image, "Corrupt JPEG data" warnings alone do not (libjpeg's
   * recovery is decoded, bit-exact with Pillow); 1: those warnings refuse it too. */
  int strict_jpeg;
  /* How alpha and palette transparency become RGB (the reference routes differ):
   *   MML_ALPHA_COMPOSITE  transformers' convert_to_rgb: anything with alpha or
   *                        transparency is alpha_composite'd onto white (the default)
   *   MML_ALPHA_DROP       Image.convert("RGB") (transformers' load_image): alpha ignored,
   *                        transparent palette entries keep their colour
   *   MML_ALPHA_PASTE      qwen-vl-utils' to_rgb: images Pillow opens as RGBA are pasted
   *                        onto white with the alpha as mask (Pillow's paste rounding),
   *                        others (LA, P, tRNS) convert("RGB") */
  int alpha;
} mml_decode_opts;

enum { MML_ALPHA_COMPOSITE = 0, MML_ALPHA_DROP = 1, MML_ALPHA_PASTE = 2 };

/* The EXIF orientation (1..8; 1 when absent or invalid) as Pillow's getexif() finds it
 * after Image.open: the first APP1 Exif segment of a JPEG, a PNG eXIf chunk, a WebP EXIF
 * chunk.  A TIFF gives 1: Pillow applies a TIFF's own Orientation tag when it loads the
 * image (and drops the tag), and so does the TIFF decoder here, for every route.
 * (Pillow's fallback to an XMP tiff:Orientation is not read.) */
int mml_image_orientation(const uint8_t *data, size_t len);

/* Pillow's Image.transpose for orientation o (ImageOps.exif_transpose's table):
 * 2 FLIP_LEFT_RIGHT, 3 ROTATE_180, 4 FLIP_TOP_BOTTOM, 5 TRANSPOSE, 6 ROTATE_270,
 * 7 TRANSVERSE, 8 ROTATE_90 (counter-clockwise).  dst holds width*height*3 bytes and
 * receives the turned image, rows of 3*W' bytes (W' = height for o >= 5). */
void mml_rgb8_transpose(const mml_rgb8 *src, int o, uint8_t *dst);

void mml_decoder_set_opts(mml_decoder *d, const mml_decode_opts *o);

/* Frees the decoder's whole-image buffers (interlaced PNG, formats decoded whole,
 * mml_image_decode's output) of more than `keep` bytes: the next image that needs one maps
 * it afresh.  Rows and the multi-scan JPEG region (trimmed after every image) stay. */
void mml_decoder_trim(mml_decoder *d, size_t keep);

/* With MML_ALPHA_PASTE: whether the image being (or last) decoded carries a transparent
 * colour that Pillow keeps through convert("RGB") and a resize (palette PNG/GIF with one
 * transparent index, gray/RGB PNG tRNS), which the processor then turns white — after
 * qwen-vl-utils' resize, so the caller applies it to resized pixels.  Known from begin(). */
int mml_decoder_color_key(const mml_decoder *d, uint8_t rgb[3]);

/* Decodes into memory owned by `d` (valid until the next call on `d`).  No allocation in
 * steady state once the scratch has grown to the largest image seen.  `scale_denom`
 * (1, 2, 4, 8) asks libjpeg-turbo for a reduced-size IDCT (JPEG only; other formats
 * decode at full size whatever it is; 1 = exact).
 * Corrupt or truncated data: MML_EDECODE with the reason in err. */
mml_status mml_image_decode(mml_decoder *d, const uint8_t *data, size_t len, int scale_denom,
                            mml_rgb8 *out, mml_err *err);

/* Streaming form of the decoder: instead of one RGB8 image, each converted RGB8 row goes
 * to a sink as soon as it is final (rows in increasing y, each once, after begin()), so a
 * caller can resize while rows are hot and never hold the full-size image.  Interlaced PNG,
 * WebP, GIF, bottom-up or RLE BMP and TIFF are decoded whole first (into `d`), then
 * streamed.  A sink error stops the decode and is
 * returned as is. */
typedef struct mml_row_sink {
  mml_status (*begin)(void *ctx, int width, int height, mml_err *err);
  /* `rgb` holds width*3 bytes, valid only during the call. */
  mml_status (*row)(void *ctx, int y, const uint8_t *rgb, mml_err *err);
  void *ctx;
  /* Optional (NULL, or returning NULL: the decoder's own buffer): where the decoder may
   * put row y when it needs no conversion, so the sink saves a copy — it then receives
   * that pointer in row().  The buffer must hold width*3 + 16 bytes. */
  uint8_t *(*row_buf)(void *ctx, int y);
} mml_row_sink;

mml_status mml_image_decode_rows(mml_decoder *d, const uint8_t *data, size_t len, int scale_denom,
                                 const mml_row_sink *sink, mml_err *err);

#endif
