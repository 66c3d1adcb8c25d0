/*
 * image.c — the image decoder's front: format detection by magic bytes (never by file
 * name), the refusal of unknown formats (naming what the bytes look like and showing the
 * first bytes in hex), dispatch to the per-format decoders (image_webp.c, image_gif.c,
 * image_bmp.c, image_tiff.c, see image_fmt.h), and the JPEG (libjpeg API of libjpeg-turbo)
 * and PNG (libpng) decoders themselves, into RGB8 rows, with the pixel semantics of the
 * transformers PIL backend:
 * Pillow's Image.open + convert_to_rgb(), which is
 *
 *   has_alpha = "A" in bands or "transparency" in info
 *   has_alpha ? alpha_composite(white, im.convert("RGBA")).convert("RGB") : im.convert("RGB")
 *
 * so images with an alpha channel or a tRNS chunk are composited onto white with Pillow's
 * integer formula (AlphaComposite.c, exact for every (value, alpha) pair — the tests check
 * all 65536).  Per source type, matching what Pillow does (each checked by tests):
 *   JPEG gray/YCbCr/RGB  libjpeg defaults (islow IDCT, fancy upsampling) — what Pillow uses
 *                        (gray: libjpeg-turbo writes R = G = B itself, Pillow's L -> RGB)
 *   JPEG CMYK/YCCK       Pillow reads them as inverted ("CMYK;I", Adobe convention) and
 *                        converts with r = 255-k' - (c'*(255-k'))/255 (MULDIV255 rounding)
 *   PNG gray 1/2/4 bit   scaled to 0..255 (x255, x85, x17)
 *   PNG gray 16 bit      mode "I;16": RGB = min(v, 255) (clips, does not scale)
 *   PNG 16-bit RGB(A)/LA high byte of each sample
 *   PNG tRNS (non-palette) a pixel is transparent when its *converted* 8-bit value equals
 *                        the tRNS value as written (so 16-bit or sub-8-bit tRNS values
 *                        mostly never match — Pillow's behaviour)
 *   PNG palette + tRNS   per-index alpha, then composited
 * Colour management (gAMA, iCCP, sRGB) and EXIF orientation are ignored, as Pillow does.
 *
 * Decoding streams rows to a sink (mml_image_decode_rows) so the caller can resize while rows are
 * hot.  Truncated data is an error (Pillow raises "image file is truncated"), and so is
 * a libjpeg error after the last scanline (Pillow finishes the decompression); libjpeg's
 * "corrupt data" warnings alone are not, as in Pillow, unless strict_jpeg is set.
 *
 * Threads: an mml_decoder belongs to one thread at a time; probe is pure.
 * Memory: the decoder's buffers grow to the largest image and are reused; libjpeg and
 * libpng still make their own internal allocations per image.
 */
#include "mml/image.h"

#include "image_fmt.h"

#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>

#include "image_jpeg_mem.h"

/* ---------------------------------------------------------------- probe */

static const uint8_t k_png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The whole-image coefficient arrays libjpeg requests for a multi-scan image (jdcoefct.c:
 * per component, its blocks rounded up to whole MCUs of its sampling factors, 128 bytes
 * each; image_jpeg_mem.c maps them), from the SOF's component table `c` (3 bytes each). */
static int64_t jpeg_coef_bytes(const uint8_t *c, int nc, int w, int h) {
  int hmax = 1, vmax = 1;
  for (int k = 0; k < nc; k++) {
    int hs = c[3 * k + 1] >> 4, vs = c[3 * k + 1] & 15;
    if (hs < 1 || hs > 4 || vs < 1 || vs > 4) return 0; /* libjpeg refuses it */
    if (hs > hmax) hmax = hs;
    if (vs > vmax) vmax = vs;
  }
  int64_t total = 0;
  for (int k = 0; k < nc; k++) {
    int64_t hs = c[3 * k + 1] >> 4, vs = c[3 * k + 1] & 15;
    int64_t wb = ((int64_t)w * hs + 8 * hmax - 1) / (8 * hmax); /* width_in_blocks */
    int64_t hb = ((int64_t)h * vs + 8 * vmax - 1) / (8 * vmax);
    wb = (wb + hs - 1) / hs * hs;
    hb = (hb + vs - 1) / vs * vs;
    total += wb * hb * 128;
  }
  return mml_round_2mib(total);
}

/* Whether the first scan (SOS after byte `i`) of a sequential JPEG holds fewer than all
 * `nc` components: libjpeg then buffers the whole image's coefficients as for a
 * progressive one (has_multiple_scans). */
static int jpeg_first_scan_partial(const uint8_t *p, size_t len, size_t i, int nc) {
  for (;;) {
    while (i < len && p[i] != 0xFF) i++;
    while (i < len && p[i] == 0xFF) i++;
    if (i >= len) return 0;
    uint8_t m = p[i++];
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD8)) continue;
    if (m == 0xD9 || i + 3 > len) return 0;
    if (m == 0xDA) return p[i + 2] < nc;
    i += (size_t)p[i] << 8 | p[i + 1];
  }
}

/* The scans (SOS markers) of a JPEG from byte i on, as libjpeg finds them: a segment is
 * skipped by its length; a scan's entropy-coded data, and garbage between segments, up to
 * the next 0xFF that starts a marker (0xFF 0x00 is a stuffed byte, RSTn and 0xFF fill
 * bytes are not segments).  Stops at EOI or the end of the data; O(len). */
static int jpeg_count_scans(const uint8_t *p, size_t len, size_t i) {
  int n = 0;
  while (i + 1 < len) {
    if (p[i] != 0xFF) {
      const uint8_t *f = memchr(p + i, 0xFF, len - i);
      if (!f) break;
      i = (size_t)(f - p);
      continue;
    }
    uint8_t m = p[i + 1];
    if (m == 0xFF) { /* a fill byte before the marker */
      i++;
      continue;
    }
    i += 2;
    if (m == 0xD9) break;
    if (m == 0x00 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) continue; /* no segment */
    if (i + 2 > len) break;
    size_t seg = (size_t)p[i] << 8 | p[i + 1];
    if (seg < 2) break; /* libjpeg refuses it */
    n += m == 0xDA;
    i += seg;
  }
  return n;
}

static mml_status probe_jpeg(const uint8_t *p, size_t len, mml_image_info *info, mml_err *err) {
  size_t i = 2;
  for (;;) {
    /* markers are 0xFF, any number of 0xFF fill bytes, then the code */
    while (i < len && p[i] != 0xFF) i++; /* tolerate garbage between segments */
    while (i < len && p[i] == 0xFF) i++;
    if (i >= len) return mml_err_set(err, MML_EDECODE, "JPEG: no SOF marker before end of data");
    uint8_t m = p[i++];
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD8)) continue; /* standalone markers */
    if (m == 0xD9 || m == 0xDA)
      return mml_err_set(err, MML_EDECODE, "JPEG: no SOF marker before image data");
    if (i + 2 > len) return mml_err_set(err, MML_EDECODE, "JPEG: truncated header");
    size_t seg = (size_t)p[i] << 8 | p[i + 1];
    if (seg < 2) return mml_err_set(err, MML_EDECODE, "JPEG: bad segment length");
    int sof = m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
    if (sof) {
      if (seg < 8 || i + 8 > len) return mml_err_set(err, MML_EDECODE, "JPEG: truncated SOF");
      int prec = p[i + 2];
      int h = p[i + 3] << 8 | p[i + 4], w = p[i + 5] << 8 | p[i + 6], nc = p[i + 7];
      if (w == 0 || h == 0)
        return mml_err_set(err, MML_EDECODE, "JPEG: zero width or height (%dx%d)", w, h);
      if (prec != 8)
        return mml_err_set(err, MML_EUNSUPPORTED, "JPEG: %d-bit samples not supported", prec);
      if (nc != 1 && nc != 3 && nc != 4)
        return mml_err_set(err, MML_EUNSUPPORTED, "JPEG: %d components not supported", nc);
      info->width = w;
      info->height = h;
      info->format = MML_FMT_JPEG;
      if (seg < 8 + 3 * (size_t)nc || i + 8 + 3 * (size_t)nc > len)
        return MML_OK; /* libjpeg says */
      int progressive = m == 0xC2 || m == 0xC6 || m == 0xCA || m == 0xCE;
      if (!progressive && !jpeg_first_scan_partial(p, len, i + seg, nc)) return MML_OK;
      info->scratch = jpeg_coef_bytes(p + i + 8, nc, w, h);
      info->scans = jpeg_count_scans(p, len, i + seg); /* a single-scan one has no others */
      return MML_OK;
    }
    i += seg;
  }
}

/* What bytes that are no supported image look like: other image formats, and what scraped
 * "images" often really are (an HTML error page, a video, a JSON reply). */
static const char *looks_like(const uint8_t *p, size_t n) {
  static const struct {
    size_t off;
    const char *magic;
    size_t len;
    const char *name;
  } k[] = {
      {4, "ftypavif", 8, "AVIF"},
      {4, "ftypavis", 8, "AVIF"},
      {4, "ftypheic", 8, "HEIF/HEIC"},
      {4, "ftypheix", 8, "HEIF/HEIC"},
      {4, "ftypheim", 8, "HEIF/HEIC"},
      {4, "ftypheis", 8, "HEIF/HEIC"},
      {4, "ftyphevc", 8, "HEIF/HEIC"},
      {4, "ftypmif1", 8, "HEIF"},
      {4, "ftypmsf1", 8, "HEIF"},
      {4, "ftypjp2 ", 8, "JPEG 2000"},
      {4, "ftypqt  ", 8, "QuickTime video"},
      {4, "ftyp", 4, "MP4 video"},
      {0, "\0\0\0\x0cjP  \r\n\x87\n", 12, "JPEG 2000"},
      {0, "\xff\x4f\xff\x51", 4, "JPEG 2000 codestream"},
      {0, "\xff\x0a", 2, "JPEG XL"},
      {0, "\0\0\0\x0cJXL \r\n\x87\n", 12, "JPEG XL"},
      {0, "\xff\xd8", 2, "JPEG (damaged start of image)"},
      {0, "\x89PNG", 4, "PNG (damaged signature)"},
      {0, "8BPS", 4, "Photoshop PSD"},
      {0, "\0\0\1\0", 4, "ICO"},
      {0, "\0\0\2\0", 4, "CUR"},
      {0, "qoif", 4, "QOI"},
      {0, "DDS ", 4, "DDS"},
      {0, "#?RADIANCE", 10, "Radiance HDR"},
      {0, "\x76\x2f\x31\x01", 4, "OpenEXR"},
      {0, "%PDF", 4, "PDF"},
      {0, "\x1a\x45\xdf\xa3", 4, "Matroska/WebM video"},
      {8, "AVI ", 4, "AVI video"},
      {8, "WAVE", 4, "WAV audio"},
      {0, "OggS", 4, "Ogg"},
      {0, "ID3", 3, "MP3 audio"},
      {0, "PK\3\4", 4, "ZIP archive"},
      {0, "\x1f\x8b", 2, "gzip data"},
      {0, "\x28\xb5\x2f\xfd", 4, "zstd data"},
      {257, "ustar", 5, "tar archive"},
  };
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
    if (n >= k[i].off + k[i].len && !memcmp(p + k[i].off, k[i].magic, k[i].len)) return k[i].name;
  if (n >= 2 && p[0] == 'P' && p[1] >= '1' && p[1] <= '7') return "PNM (PBM/PGM/PPM/PAM)";
  size_t i = 0; /* text: skip a UTF-8 byte-order mark and white space */
  if (n >= 3 && p[0] == 0xef && p[1] == 0xbb && p[2] == 0xbf) i = 3;
  while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r' || p[i] == '\n')) i++;
  const char *t = (const char *)p + i;
  size_t m = n - i;
#define HAS(lit) (m >= sizeof lit - 1 && !strncasecmp(t, lit, sizeof lit - 1))
  if (HAS("<svg") || (HAS("<?xml") && memmem(t, m < 512 ? m : 512, "<svg", 4))) return "SVG";
  if (HAS("<!doctype html") || HAS("<html") || HAS("<head") || HAS("<body"))
    return "HTML (an error page?)";
  if (HAS("<?xml")) return "XML";
  if (m && (t[0] == '{' || t[0] == '[')) return "JSON";
  if (HAS("data:")) return "a data: URI stored as file content";
#undef HAS
  return NULL;
}

static mml_status unknown_format(const uint8_t *p, size_t n, mml_err *err) {
  if (n == 0) return mml_err_set(err, MML_EUNSUPPORTED, "not an image: no data (0 bytes)");
  char hex[3 * 16 + 1] = "";
  size_t k = n < 16 ? n : 16;
  for (size_t i = 0; i < k; i++) snprintf(hex + (i ? 3 * i - 1 : 0), 4, i ? " %02x" : "%02x", p[i]);
  const char *what = looks_like(p, n);
  return mml_err_set(err, MML_EUNSUPPORTED,
                     "unsupported image format: %s%s (%zu bytes, starting %s%s); supported: "
                     "JPEG, PNG, WebP, GIF, BMP, TIFF",
                     what ? "looks like " : "unknown", what ? what : "", n, hex,
                     n > k ? " ..." : "");
}

const char *mml_image_format_name(mml_image_format f) {
  static const char *const k[] = {"", "jpeg", "png", "webp", "gif", "bmp", "tiff"};
  return (unsigned)f < sizeof k / sizeof k[0] ? k[f] : "";
}

mml_status mml_image_probe(const uint8_t *data, size_t len, mml_image_info *info, mml_err *err) {
  memset(info, 0, sizeof *info);
  if (!data) return mml_err_set(err, MML_EINVAL, "image probe: no data");
  if (len >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF)
    return probe_jpeg(data, len, info, err);
  if (len >= 8 && !memcmp(data, k_png_sig, 8)) {
    if (len < 24 || memcmp(data + 12, "IHDR", 4))
      return mml_err_set(err, MML_EDECODE, "PNG: missing or truncated IHDR");
    uint32_t w = be32(data + 16), h = be32(data + 20);
    if (w == 0 || h == 0 || w > 0x7fffffffu || h > 0x7fffffffu)
      return mml_err_set(err, MML_EDECODE, "PNG: bad size %ux%u", w, h);
    info->width = (int)w;
    info->height = (int)h;
    info->format = MML_FMT_PNG;
    if (len >= 29 && data[28]) { /* interlaced: all passes land in `whole` (png_feed_rows) */
      const int ctype = data[25], depth = data[24];
      const int bpp = ctype == 0 ? (depth == 16 ? 2 : 1) : ctype == 2 ? 3 : ctype == 4 ? 2 : 4;
      info->scratch = mml_round_2mib((int64_t)w * h * bpp);
    }
    return MML_OK;
  }
  if (len >= 12 && !memcmp(data, "RIFF", 4) && !memcmp(data + 8, "WEBP", 4))
    return mml_webp_probe(data, len, info, err);
  if (len >= 6 && (!memcmp(data, "GIF87a", 6) || !memcmp(data, "GIF89a", 6)))
    return mml_gif_probe(data, len, info, err);
  if (len >= 2 && data[0] == 'B' && data[1] == 'M') return mml_bmp_probe(data, len, info, err);
  if (len >= 4 && (!memcmp(data, "II*\0", 4) || !memcmp(data, "MM\0*", 4) ||
                   !memcmp(data, "II+\0", 4) || !memcmp(data, "MM\0+", 4)))
    return mml_tiff_probe(data, len, info, err);
  return unknown_format(data, len, err);
}

/* ---------------------------------------------------------------- decoder state */

struct jerr_mgr {
  struct jpeg_error_mgr pub;
  jmp_buf jb;
  int strict; /* mml_decode_opts.strict_jpeg */
  char msg[JMSG_LENGTH_MAX];
};

struct mml_decoder {
  struct jpeg_decompress_struct jd;
  struct jerr_mgr je;
  mml_bytes raw;   /* one row as the library delivers it */
  mml_bytes row;   /* one RGB8 row */
  mml_bytes whole; /* a whole image: interlaced PNG (all passes land here), formats
                    * decoded whole (image_fmt.h) */
  mml_bytes image; /* mml_image_decode's output */
  int img_w, img_h;
  int64_t max_pixels; /* width*height limit of every decode (0: none) */
  int alpha;          /* mml_decode_opts.alpha */
  int max_scans;      /* JPEG scans limit of every decode (0: none) */
  const mml_cancel *cancel;
  struct jpeg_progress_mgr progress; /* jpeg_progress: the scan limit and `cancel` */
  mml_status jpeg_stop; /* why jpeg_progress stopped the decode (MML_OK: a libjpeg error) */
  int key;              /* the last image has a colour key (mml_decoder_color_key) */
  uint8_t kc[3];
  mml_jpeg_keep *keep; /* multi-scan coefficients in memory that stays mapped */
  size_t jpeg_keep;    /* ... while at most this many bytes (mml_decoder_set_jpeg_keep) */
};

static void jerr_exit(j_common_ptr c) {
  struct jerr_mgr *e = (struct jerr_mgr *)c->err;
  c->err->format_message(c, e->msg);
  longjmp(e->jb, 1);
}

/* Warnings: "premature end of data" is fatal (Pillow refuses truncated images); in strict
 * mode so is every warning about corrupt entropy data or a broken progression (not the
 * ones about metadata such as a bad ICC marker or an unknown JFIF revision). */
static void jerr_emit(j_common_ptr c, int level) {
  if (level >= 0) return;
  struct jerr_mgr *e = (struct jerr_mgr *)c->err;
  int code = c->err->msg_code;
  if (code == JWRN_JPEG_EOF) jerr_exit(c);
  if (!e->strict || code == JWRN_BOGUS_ICC) return;
  char m[JMSG_LENGTH_MAX];
  c->err->format_message(c, m);
  if (!strncmp(m, "Corrupt JPEG data", 17) || code == JWRN_BOGUS_PROGRESSION ||
      code == JWRN_NOT_SEQUENTIAL)
    jerr_exit(c);
}

static void jerr_output(j_common_ptr c) { (void)c; }

/* scans: the count, or 0 when the decoder reached the scan after the limit */
static mml_status scans_error(int scans, int max, mml_err *err) {
  if (!scans) return mml_err_set(err, MML_ESCANS, "JPEG: more scans than max_jpeg_scans=%d", max);
  return mml_err_set(err, MML_ESCANS, "JPEG: %d scans, above max_jpeg_scans=%d", scans, max);
}

/* libjpeg's progress hook: called once per output row, and while a multi-scan image's
 * input is absorbed once per MCU row of every scan (so every few ms however hostile the
 * file): stops the decode past the scan limit or once the decoder's cancel flag is set. */
static void jpeg_progress(j_common_ptr c) {
  mml_decoder *d = (mml_decoder *)(void *)c; /* jd is its first member */
  if (d->max_scans > 0 && d->jd.input_scan_number > d->max_scans)
    d->jpeg_stop = MML_ESCANS;
  else if (mml_cancelled(d->cancel))
    d->jpeg_stop = MML_ECANCELLED;
  else
    return;
  longjmp(d->je.jb, 1);
}

mml_status mml_decoder_new(mml_decoder **out) {
  mml_decoder *d = calloc(1, sizeof *d);
  if (!d) return MML_ENOMEM;
  d->jd.err = jpeg_std_error(&d->je.pub);
  d->je.pub.error_exit = jerr_exit;
  d->je.pub.emit_message = jerr_emit;
  d->je.pub.output_message = jerr_output;
  if (setjmp(d->je.jb)) { /* jpeg_create_decompress only fails on out-of-memory */
    free(d);
    return MML_ENOMEM;
  }
  jpeg_create_decompress(&d->jd);
  d->progress.progress_monitor = jpeg_progress;
  d->jd.progress = &d->progress;
  if (mml_jpeg_keep_install(&d->jd, &d->keep)) {
    jpeg_destroy_decompress(&d->jd);
    free(d);
    return MML_ENOMEM;
  }
  d->max_pixels = MML_DEFAULT_MAX_IMAGE_PIXELS;
  d->max_scans = MML_DEFAULT_MAX_JPEG_SCANS;
  d->jpeg_keep = MML_JPEG_KEEP;
  *out = d;
  return MML_OK;
}

void mml_decoder_set_max_pixels(mml_decoder *d, int64_t max_pixels) {
  d->max_pixels = max_pixels > 0 ? max_pixels : 0;
}

void mml_decoder_set_max_scans(mml_decoder *d, int max_scans) {
  d->max_scans = max_scans > 0 ? max_scans : 0;
}

void mml_decoder_set_cancel(mml_decoder *d, const mml_cancel *c) { d->cancel = c; }

void mml_decoder_set_jpeg_keep(mml_decoder *d, size_t bytes) {
  d->jpeg_keep = bytes;
  mml_jpeg_keep_trim(d->keep, bytes);
}

void mml_decoder_set_opts(mml_decoder *d, const mml_decode_opts *o) {
  d->je.strict = o && o->strict_jpeg;
  d->alpha = o ? o->alpha : MML_ALPHA_COMPOSITE;
}

void mml_decoder_trim(mml_decoder *d, size_t keep) {
  if (!d) return;
  if (d->whole.cap > keep) mml_bytes_free(&d->whole);
  if (d->image.cap > keep) mml_bytes_free(&d->image);
}

void mml_decoder_free(mml_decoder *d) {
  if (!d) return;
  jpeg_destroy_decompress(&d->jd);
  mml_jpeg_keep_free(d->keep);
  mml_bytes_free(&d->raw);
  mml_bytes_free(&d->row);
  mml_bytes_free(&d->whole);
  mml_bytes_free(&d->image);
  free(d);
}

/* ---------------------------------------------------------------- pixel conversions */

/* Pillow's cmyk2rgb on inverted ("CMYK;I") samples s: c = 255 - s. */
static inline uint8_t cmyk_inv_channel(uint32_t sc, uint32_t sk) {
  uint32_t c = 255u - sc, nk = sk; /* nk = 255 - k = 255 - (255 - sk) */
  uint32_t t = c * nk + 128u;
  int v = (int)nk - (int)((((t >> 8) + t) >> 8));
  return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* ---------------------------------------------------------------- JPEG */

static mml_status decode_jpeg(mml_decoder *d, const uint8_t *data, size_t len, int scale,
                              const mml_row_sink *sink, mml_err *err) {
  struct jpeg_decompress_struct *ci = &d->jd;
  mml_status st = MML_OK;
  d->jpeg_stop = MML_OK;
  if (setjmp(d->je.jb)) {
    jpeg_abort_decompress(ci);
    mml_jpeg_keep_trim(d->keep, d->jpeg_keep);
    if (d->jpeg_stop == MML_ESCANS) return scans_error(0, d->max_scans, err);
    if (d->jpeg_stop == MML_ECANCELLED)
      return mml_err_set(err, MML_ECANCELLED, "JPEG: decode cancelled (the loader is closing)");
    return mml_err_set(err, MML_EDECODE, "JPEG: %s", d->je.msg);
  }
  jpeg_mem_src(ci, (unsigned char *)data, (unsigned long)len);
  jpeg_read_header(ci, TRUE);
  int nc = ci->num_components;
  if (nc == 1) {
    ci->out_color_space = JCS_GRAYSCALE;
#if defined(LIBJPEG_TURBO_VERSION_NUMBER) && LIBJPEG_TURBO_VERSION_NUMBER >= 1005000
    /* libjpeg-turbo replicates the gray sample into R, G and B itself (gray_rgb_convert):
     * the bytes of the nc == 1 loop below, written straight into the sink's row */
    ci->out_color_space = JCS_RGB;
    nc = 3;
#endif
  } else if (nc == 3) {
    ci->out_color_space = JCS_RGB;
  } else if (nc == 4) {
    ci->out_color_space = JCS_CMYK; /* YCCK is turned into CMYK by libjpeg */
  } else {
    jpeg_abort_decompress(ci);
    return mml_err_set(err, MML_EUNSUPPORTED, "JPEG: %d components not supported", nc);
  }
  ci->scale_num = 1;
  ci->scale_denom = (unsigned)scale;
  ci->dct_method = JDCT_ISLOW;
  ci->do_fancy_upsampling = TRUE;
  jpeg_start_decompress(ci);
  int w = (int)ci->output_width, h = (int)ci->output_height;
  if ((st = sink->begin(sink->ctx, w, h, err)) != MML_OK) goto done;
  if (mml_bytes_reserve(&d->raw, (size_t)w * 4) || mml_bytes_reserve(&d->row, (size_t)w * 3)) {
    st = mml_err_set(err, MML_ENOMEM, "JPEG: out of memory for a %d-pixel row", w);
    goto done;
  }
  while (ci->output_scanline < ci->output_height) {
    int y = (int)ci->output_scanline;
    JSAMPROW r = nc == 3 ? d->row.data : d->raw.data;
    uint8_t *b = nc == 3 && sink->row_buf ? sink->row_buf(sink->ctx, y) : NULL;
    if (b) r = b; /* straight into the sink's memory */
    if (jpeg_read_scanlines(ci, &r, 1) != 1) {
      st = mml_err_set(err, MML_EDECODE, "JPEG: decoder stalled at row %d", y);
      goto done;
    }
    uint8_t *o = d->row.data;
    const uint8_t *s = d->raw.data;
    if (nc == 1) {
      for (int x = 0; x < w; x++) o[3 * x] = o[3 * x + 1] = o[3 * x + 2] = s[x];
    } else if (nc == 4) {
      for (int x = 0; x < w; x++, s += 4, o += 3) {
        o[0] = cmyk_inv_channel(s[0], s[3]);
        o[1] = cmyk_inv_channel(s[1], s[3]);
        o[2] = cmyk_inv_channel(s[2], s[3]);
      }
    }
    if ((st = sink->row(sink->ctx, y, nc == 3 ? r : d->row.data, err)) != MML_OK) goto done;
  }
  /* read on to EOI: Pillow finishes the decompression and refuses what fails there (e.g.
   * a bad marker after corrupt data that libjpeg had papered over with gray) */
  jpeg_finish_decompress(ci);
  mml_jpeg_keep_trim(d->keep, d->jpeg_keep);
  return MML_OK;
done:
  jpeg_abort_decompress(ci);
  mml_jpeg_keep_trim(d->keep, d->jpeg_keep);
  return st;
}

/* ---------------------------------------------------------------- PNG */

struct png_src {
  const uint8_t *p;
  size_t len, off;
  char msg[256];
  const mml_cancel *cancel;
  uint32_t h;     /* the image's rows once its header is read (0 before) */
  int interlaced; /* Adam7 */
  int tail;       /* libpng asked for input after the last row: stopped there */
  int cancelled;  /* `cancel` was found set */
};

/* Whether libpng has delivered every row (png_read_finish_row has moved past the last
 * row of the last pass) and so only reads on to the end of the deflate stream. */
static int png_rows_done(png_structp png, const struct png_src *s) {
  if (!s->h) return 0;
  if (s->interlaced) return png_get_current_pass_number(png) >= 7;
  return png_get_current_row_number(png) >= s->h;
}

/* libpng's input.  Stops (longjmp) once the cancel flag is set, and when libpng asks for
 * more after the last row: it then inflates the rest of the stream to find its end, and
 * a few KB more of the file can inflate to GB (issue 29: 20 s for 1 MB) — Pillow stops
 * at the last row, and so does this decoder (png_row). */
static void png_read_mem(png_structp png, png_bytep out, size_t n) {
  struct png_src *s = png_get_io_ptr(png);
  if (mml_cancelled(s->cancel)) {
    s->cancelled = 1;
    png_error(png, "decode cancelled");
  }
  if (png_rows_done(png, s)) {
    s->tail = 1;
    png_error(png, "data after the last row (not read)");
  }
  if (n > s->len - s->off) png_error(png, "truncated data");
  memcpy(out, s->p + s->off, n);
  s->off += n;
}

static void png_on_error(png_structp png, png_const_charp msg) {
  struct png_src *s = png_get_error_ptr(png);
  snprintf(s->msg, sizeof s->msg, "%s", msg);
  png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) {
  (void)png;
  (void)msg;
}

enum px_kind { PX_G8, PX_G16, PX_GA8, PX_RGB8, PX_RGBA8 };

struct png_conv {
  enum px_kind kind;
  int alpha;           /* MML_ALPHA_* policy */
  int trns;            /* non-palette tRNS present */
  unsigned tr, tg, tb; /* tRNS value as written in the file */
};

static void png_row_to_rgb(const struct png_conv *c, const uint8_t *s, uint8_t *o, int w) {
  switch (c->kind) {
    case PX_G8:
      for (int x = 0; x < w; x++, o += 3) {
        uint8_t v = s[x];
        if (c->trns && v == c->tr) v = 255;
        o[0] = o[1] = o[2] = v;
      }
      break;
    case PX_G16:
      for (int x = 0; x < w; x++, o += 3) {
        unsigned v16 = (unsigned)s[2 * x] << 8 | s[2 * x + 1];
        uint8_t v = v16 > 255 ? 255 : (uint8_t)v16;
        if (c->trns && v == c->tr) v = 255;
        o[0] = o[1] = o[2] = v;
      }
      break;
    case PX_GA8: /* Pillow's mode LA */
      for (int x = 0; x < w; x++, o += 3)
        o[0] = o[1] = o[2] = mml_alpha_px(c->alpha, 0, s[2 * x], s[2 * x + 1]);
      break;
    case PX_RGB8:
      if (!c->trns) {
        memcpy(o, s, (size_t)w * 3);
        break;
      }
      for (int x = 0; x < w; x++, s += 3, o += 3) {
        int t = s[0] == c->tr && s[1] == c->tg && s[2] == c->tb;
        o[0] = t ? 255 : s[0];
        o[1] = t ? 255 : s[1];
        o[2] = t ? 255 : s[2];
      }
      break;
    case PX_RGBA8: /* mode RGBA, or (composite policy only) palette + tRNS */
      mml_rgba_row_to_rgb(c->alpha, s, o, w);
      break;
  }
}

/* The transformations for the colour type, the pixel conversion, and a transparent colour
 * key.  Runs inside decode_png's setjmp (libpng errors longjmp there). */
static void png_plan_conv(mml_decoder *d, png_structp png, png_infop info, int ctype, int depth,
                          struct png_conv *conv) {
  const int composite = d->alpha == MML_ALPHA_COMPOSITE;
  /* copy tRNS before any transformation can rescale libpng's copy of it */
  png_bytep t_alpha = NULL;
  int n_trans = 0;
  png_color_16p t_color = NULL;
  int has_trns = png_get_valid(png, info, PNG_INFO_tRNS) &&
                 png_get_tRNS(png, info, &t_alpha, &n_trans, &t_color);
  /* Where Pillow keeps a transparent colour in info["transparency"] after convert("RGB")
   * (the other routes), the processor's convert_to_rgb still turns that colour white */
  int key = 0;
  unsigned kr = 0, kg = 0, kb = 0;
  switch (ctype) {
    case PNG_COLOR_TYPE_PALETTE:
      png_set_palette_to_rgb(png); /* = png_set_expand: also turns a tRNS into alpha */
      if (has_trns && composite) {
        png_set_tRNS_to_alpha(png);
        conv->kind = PX_RGBA8;
        break;
      }
      if (has_trns) png_set_strip_alpha(png);
      conv->kind = PX_RGB8;
      /* Pillow keeps an index only for one fully transparent entry among opaque ones */
      int idx = -1, simple = has_trns;
      for (int k = 0; k < n_trans && simple; k++) {
        if (t_alpha[k] == 0 && idx < 0)
          idx = k;
        else if (t_alpha[k] != 255)
          simple = 0;
      }
      png_colorp pal = NULL;
      int npal = 0;
      if (simple && idx >= 0 && png_get_PLTE(png, info, &pal, &npal)) {
        key = 1;
        if (idx < npal) kr = pal[idx].red, kg = pal[idx].green, kb = pal[idx].blue;
      }
      break;
    case PNG_COLOR_TYPE_GRAY:
      if (depth < 8) png_set_expand_gray_1_2_4_to_8(png);
      conv->kind = depth == 16 ? PX_G16 : PX_G8;
      if (has_trns && t_color) key = 1, kr = kg = kb = t_color->gray;
      break;
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      conv->kind = PX_GA8;
      break;
    case PNG_COLOR_TYPE_RGB:
      conv->kind = PX_RGB8;
      if (has_trns && t_color) key = 1, kr = t_color->red, kg = t_color->green, kb = t_color->blue;
      break;
    case PNG_COLOR_TYPE_RGB_ALPHA:
      conv->kind = PX_RGBA8;
      break;
    default:
      png_error(png, "unknown color type");
  }
  if (key && d->alpha == MML_ALPHA_PASTE) { /* qwen-vl-utils: white after its resize */
    if (kr < 256 && kg < 256 && kb < 256) {
      d->key = 1;
      d->kc[0] = (uint8_t)kr, d->kc[1] = (uint8_t)kg, d->kc[2] = (uint8_t)kb;
    }
  } else if (key) { /* before any resize: the processor and load_image routes */
    conv->trns = 1;
    conv->tr = kr, conv->tg = kg, conv->tb = kb;
  }
}

/* One png_read_row under its own setjmp: libpng's errors (and png_read_mem's stops) land
 * here, and the row is complete when the stop is png_read_mem's after the last row (the
 * row is copied out before libpng reads on).  Once stopped so, libpng is never called
 * again (the rows left of an interlaced image were complete).  1: failed (png_fail). */
static int png_row(png_structp png, png_bytep row, struct png_src *src) {
  if (src->tail) return 0;
  if (mml_cancelled(src->cancel)) {
    src->cancelled = 1;
    return 1;
  }
  jmp_buf outer;
  memcpy(outer, png_jmpbuf(png), sizeof outer);
  int failed = 0;
  if (setjmp(png_jmpbuf(png)))
    failed = !src->tail;
  else
    png_read_row(png, row, NULL);
  memcpy(png_jmpbuf(png), outer, sizeof outer);
  return failed;
}

static mml_status png_fail(const struct png_src *src, mml_err *err) {
  if (src->cancelled) return mml_err_set(err, MML_ECANCELLED, "PNG: decode cancelled");
  return mml_err_set(err, MML_EDECODE, "PNG: %s", src->msg);
}

/* Reads the rows (all passes of an interlaced image first) and hands them to the sink. */
static mml_status png_feed_rows(mml_decoder *d, png_structp png, struct png_src *src,
                                const struct png_conv *conv, int w, int h, int passes,
                                size_t rowbytes, const mml_row_sink *sink, mml_err *err) {
  mml_status st;
  if (passes > 1) {
    if ((size_t)h > SIZE_MAX / rowbytes || mml_bytes_reserve(&d->whole, (size_t)h * rowbytes))
      return mml_err_set(err, MML_ENOMEM, "PNG: out of memory for an interlaced %dx%d image", w, h);
    for (int p = 0; p < passes; p++)
      for (int y = 0; y < h; y++)
        if (png_row(png, d->whole.data + (size_t)y * rowbytes, src)) return png_fail(src, err);
    for (int y = 0; y < h; y++) {
      png_row_to_rgb(conv, d->whole.data + (size_t)y * rowbytes, d->row.data, w);
      if ((st = sink->row(sink->ctx, y, d->row.data, err)) != MML_OK) return st;
    }
    return MML_OK;
  }
  if (mml_bytes_reserve(&d->raw, rowbytes))
    return mml_err_set(err, MML_ENOMEM, "PNG: out of memory for a %d-pixel row", w);
  const int plain = conv->kind == PX_RGB8 && !conv->trns && rowbytes == (size_t)w * 3;
  for (int y = 0; y < h; y++) {
    uint8_t *b = plain && sink->row_buf ? sink->row_buf(sink->ctx, y) : NULL;
    if (b) { /* RGB8 as is: straight into the sink's memory */
      if (png_row(png, b, src)) return png_fail(src, err);
    } else {
      if (png_row(png, d->raw.data, src)) return png_fail(src, err);
      png_row_to_rgb(conv, d->raw.data, d->row.data, w);
      b = d->row.data;
    }
    if ((st = sink->row(sink->ctx, y, b, err)) != MML_OK) return st;
  }
  return MML_OK;
}

static mml_status decode_png(mml_decoder *d, const uint8_t *data, size_t len,
                             const mml_row_sink *sink, mml_err *err) {
  struct png_src src = {data, len, 0, "unknown error", .cancel = d->cancel};
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_on_error, png_on_warning);
  if (!png) return mml_err_set(err, MML_ENOMEM, "PNG: out of memory");
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, NULL, NULL);
    return mml_err_set(err, MML_ENOMEM, "PNG: out of memory");
  }
  volatile mml_status st = MML_OK;
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, NULL);
    return png_fail(&src, err);
  }
  png_set_read_fn(png, &src, png_read_mem);
  png_read_info(png, info);
  png_uint_32 w32, h32;
  int depth, ctype, interlace;
  png_get_IHDR(png, info, &w32, &h32, &depth, &ctype, &interlace, NULL, NULL);
  int w = (int)w32, h = (int)h32;
  src.h = h32;
  src.interlaced = interlace != PNG_INTERLACE_NONE;
  struct png_conv conv = {.alpha = d->alpha};
  png_plan_conv(d, png, info, ctype, depth, &conv);
  if (depth == 16 && conv.kind != PX_G16) png_set_strip_16(png);
  int passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  size_t rowbytes = png_get_rowbytes(png, info);
  if ((st = sink->begin(sink->ctx, w, h, err)) != MML_OK) goto done;
  if (mml_bytes_reserve(&d->row, (size_t)w * 3)) {
    st = mml_err_set(err, MML_ENOMEM, "PNG: out of memory for a %d-pixel row", w);
    goto done;
  }
  st = png_feed_rows(d, png, &src, &conv, w, h, passes, rowbytes, sink, err);
done:
  png_destroy_read_struct(&png, &info, NULL);
  return st;
}

/* ---------------------------------------------------------------- entry points */

int mml_decoder_color_key(const mml_decoder *d, uint8_t rgb[3]) {
  if (d->key) memcpy(rgb, d->kc, 3);
  return d->key;
}

/* The pixel limit on the size a decoder actually reports (which a crafted file may make
 * differ from what the probe read), before the caller's sink sees any row. */
typedef struct limit_sink {
  const mml_row_sink *inner;
  int64_t max_pixels;
} limit_sink;

static mml_status check_pixels(int64_t max, int w, int h, mml_err *err) {
  int64_t px = (int64_t)w * h;
  if (max > 0 && px > max)
    return mml_err_set(err, MML_ETOOBIG, "%dx%d image (%lld pixels) exceeds max_image_pixels=%lld",
                       w, h, (long long)px, (long long)max);
  return MML_OK;
}

static mml_status limit_begin(void *ctx, int w, int h, mml_err *err) {
  limit_sink *l = ctx;
  mml_status st = check_pixels(l->max_pixels, w, h, err);
  return st ? st : l->inner->begin(l->inner->ctx, w, h, err);
}
static mml_status limit_row(void *ctx, int y, const uint8_t *rgb, mml_err *err) {
  limit_sink *l = ctx;
  return l->inner->row(l->inner->ctx, y, rgb, err);
}
static uint8_t *limit_row_buf(void *ctx, int y) {
  limit_sink *l = ctx;
  return l->inner->row_buf ? l->inner->row_buf(l->inner->ctx, y) : NULL;
}

mml_status mml_image_decode_rows(mml_decoder *d, const uint8_t *data, size_t len, int scale_denom,
                                 const mml_row_sink *user_sink, mml_err *err) {
  d->key = 0;
  mml_image_info info;
  mml_status st = mml_image_probe(data, len, &info, err);
  if (st != MML_OK) return st;
  /* every decoder (the formats added beside JPEG and PNG too) runs behind this check */
  if ((st = check_pixels(d->max_pixels, info.width, info.height, err))) return st;
  if (d->max_scans > 0 && info.scans > d->max_scans)
    return scans_error(info.scans, d->max_scans, err); /* before any decoding */
  if (mml_cancelled(d->cancel)) return mml_err_set(err, MML_ECANCELLED, "decode cancelled");
  limit_sink lim = {user_sink, d->max_pixels};
  const mml_row_sink limited = {limit_begin, limit_row, &lim, limit_row_buf};
  const mml_row_sink *sink = &limited;
  if (scale_denom != 1 && scale_denom != 2 && scale_denom != 4 && scale_denom != 8)
    return mml_err_set(err, MML_EINVAL, "decode: scale_denom %d is not 1, 2, 4 or 8", scale_denom);
  mml_img_bufs b = {&d->whole, &d->row, d->alpha, &d->key, d->kc, d->cancel};
  switch (info.format) {
    case MML_FMT_JPEG:
      return decode_jpeg(d, data, len, scale_denom, sink, err);
    case MML_FMT_PNG:
      return decode_png(d, data, len, sink, err);
    case MML_FMT_WEBP:
      return mml_webp_decode(data, len, &b, sink, err);
    case MML_FMT_GIF:
      return mml_gif_decode(data, len, &b, sink, err);
    case MML_FMT_BMP:
      return mml_bmp_decode(data, len, &b, sink, err);
    case MML_FMT_TIFF:
      return mml_tiff_decode(data, len, &b, sink, err);
    default:
      return mml_err_set(err, MML_EINTERNAL, "decode: no decoder for format %d", info.format);
  }
}

static mml_status full_begin(void *ctx, int w, int h, mml_err *err) {
  mml_decoder *d = ctx;
  if ((size_t)h > SIZE_MAX / 3 / (size_t)w ||
      mml_bytes_reserve(&d->image, (size_t)w * (size_t)h * 3))
    return mml_err_set(err, MML_ENOMEM, "decode: out of memory for a %dx%d image", w, h);
  d->img_w = w;
  d->img_h = h;
  return MML_OK;
}

static mml_status full_row(void *ctx, int y, const uint8_t *rgb, mml_err *err) {
  mml_decoder *d = ctx;
  (void)err;
  memcpy(d->image.data + (size_t)y * (size_t)d->img_w * 3, rgb, (size_t)d->img_w * 3);
  return MML_OK;
}

mml_status mml_image_decode(mml_decoder *d, const uint8_t *data, size_t len, int scale_denom,
                            mml_rgb8 *out, mml_err *err) {
  memset(out, 0, sizeof *out);
  mml_row_sink sink = {full_begin, full_row, d};
  mml_status st = mml_image_decode_rows(d, data, len, scale_denom, &sink, err);
  if (st != MML_OK) return st;
  out->pixels = d->image.data;
  out->width = d->img_w;
  out->height = d->img_h;
  out->stride = (size_t)d->img_w * 3;
  return MML_OK;
}
