/*
 * image_webp.c — WebP (lossy VP8, lossless VP8L, extended VP8X with alpha, animated)
 * through libwebp, with Pillow's semantics: Pillow decodes every WebP through
 * WebPAnimDecoder in MODE_RGBA (non-premultiplied) and reports mode RGBA when the
 * bitstream features say alpha, else RGB (alpha ignored).  For a still image the first
 * (only) frame of WebPAnimDecoder is exactly WebPDecode's output (the first frame is a key
 * frame: decoded onto a cleared canvas, no blending), so still images are decoded with
 * WebPDecode straight into our reused buffer; animated files go through WebPAnimDecoder
 * and give their first frame, as Pillow's Image.open does.  RGBA is then composited onto
 * white (convert_to_rgb).
 *
 * Cancellation (ARCHITECTURE 4.8): libwebp's one-call decoders have no progress hook, so
 * every decode runs through its incremental decoder (WebPIDecode), fed FEED more bytes
 * at a time and checking b->cancel between feeds: a decode stops within one feed's work
 * (at most a few ms of rows) with MML_ECANCELLED.  The incremental decoder is libwebp's
 * same decoder (same pixels, tests compare with Pillow).  An animation's first frame is
 * decoded the way WebPAnimDecoderGetNext decodes a key frame: its fragment (from the
 * demuxer) into a canvas cleared to transparent black, at the frame's offset, in MODE_RGBA
 * with the canvas's stride; the first frame is always a key frame, so nothing is blended.
 * Feeding does not help when the first partition holds nearly every byte (a flat lossy
 * image: 213,934 of 214,212 bytes at 9000x9000): libwebp decodes no row before it is
 * complete, then every row in the last feed's call (close() waited 0.2-1.3 s for it).
 * So an image of ASIDE_PIXELS and more is decoded on a thread of its own that close()
 * can abandon (decode_to, image_aside.c): the worker returns within milliseconds, the
 * thread finishes and frees its copies and the buffer; the pixels are the same call's.
 *
 * Threads: reentrant; libwebp keeps no global state after its one-time DSP init (which it
 * guards itself).  Memory: still images reuse `whole`; WebPAnimDecoder allocates its own
 * canvas per animated image.
 */
#include <string.h>

#include <webp/decode.h>
#include <webp/demux.h>

#include "image_fmt.h"

enum { FEED = 4 << 10 }; /* bytes given to the incremental decoder between cancel checks */
/* Images of this many pixels and more are decoded aside (decode_to): ~0.2 s of libwebp on a
 * quiet core, what one call may take when the first partition holds nearly every byte. */
#define ASIDE_PIXELS ((int64_t)1 << 22)

static const char *vp8_status(VP8StatusCode s) {
  switch (s) {
    case VP8_STATUS_OK:
      return "ok";
    case VP8_STATUS_OUT_OF_MEMORY:
      return "out of memory";
    case VP8_STATUS_INVALID_PARAM:
      return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR:
      return "bitstream error";
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      return "unsupported feature";
    case VP8_STATUS_SUSPENDED:
      return "suspended";
    case VP8_STATUS_USER_ABORT:
      return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA:
      return "truncated data";
  }
  return "unknown error";
}

static mml_status features(const uint8_t *p, size_t len, WebPBitstreamFeatures *f, mml_err *err) {
  VP8StatusCode s = WebPGetFeatures(p, len, f);
  if (s != VP8_STATUS_OK)
    return mml_err_set(err, MML_EDECODE, "WebP: bad header (%s)", vp8_status(s));
  if (f->width < 1 || f->height < 1)
    return mml_err_set(err, MML_EDECODE, "WebP: bad size %dx%d", f->width, f->height);
  return MML_OK;
}

mml_status mml_webp_probe(const uint8_t *p, size_t len, mml_image_info *info, mml_err *err) {
  WebPBitstreamFeatures f;
  mml_status st = features(p, len, &f, err);
  if (st != MML_OK) return st;
  info->width = f.width;
  info->height = f.height;
  info->format = MML_FMT_WEBP;
  /* a still image decodes into `whole` (3 or 4 bytes a pixel), a lossless one through
   * libwebp's own ARGB image beside it; an animation through WebPAnimDecoder's canvases
   * (the current and the previous frame, ARGB) */
  const int64_t px = (int64_t)f.width * f.height;
  info->scratch =
      mml_round_2mib(f.has_animation ? 3 * 4 * px
                                     : px * (f.has_alpha ? 4 : 3) +
                                           (f.format == 1 ? (f.has_alpha ? px : 0) : 4 * px));
  return MML_OK;
}

/* Streams `h` rows of RGBA (alpha: composite onto white; else alpha ignored) or RGB. */
static mml_status emit(const uint8_t *px, int w, int h, size_t stride, int bpp, int alpha,
                       mml_img_bufs *b, const mml_row_sink *sink, mml_err *err) {
  mml_status st = sink->begin(sink->ctx, w, h, err);
  if (st != MML_OK) return st;
  if (bpp == 4 && mml_bytes_reserve(b->row, (size_t)w * 3))
    return mml_err_set(err, MML_ENOMEM, "WebP: out of memory for a %d-pixel row", w);
  for (int y = 0; y < h; y++) {
    if (mml_cancelled(b->cancel)) return mml_err_set(err, MML_ECANCELLED, "WebP: decode cancelled");
    const uint8_t *s = px + (size_t)y * stride;
    if (bpp == 4) {
      uint8_t *o = b->row->data;
      if (alpha) {
        mml_rgba_row_to_rgb(b->alpha, s, o, w); /* Pillow's mode RGBA */
      } else {
        for (int x = 0; x < w; x++, s += 4, o += 3) memcpy(o, s, 3);
      }
      s = b->row->data;
    }
    if ((st = sink->row(sink->ctx, y, s, err)) != MML_OK) return st;
  }
  return MML_OK;
}

/* 1 when a RIFF container promises more bytes than p[0..len) holds, for itself or for a
 * chunk up to the image's (VP8/VP8L): what WebPDecode refuses as truncated (it has all
 * the data) and the incremental decoder, expecting more, does not check. */
static int cut_short(const uint8_t *p, size_t len) {
  if (len < 12 || memcmp(p, "RIFF", 4) || memcmp(p + 8, "WEBP", 4)) return 0;
  const uint64_t end = (uint64_t)mml_le32(p + 4) + 8;
  if (end > len) return 1;
  for (uint64_t off = 12; off + 8 <= end;) {
    const uint64_t sz = mml_le32(p + off + 4);
    if (off + 8 + sz > end) return 1;
    if (!memcmp(p + off, "VP8 ", 4) || !memcmp(p + off, "VP8L", 4)) return 0;
    off += 8 + sz + (sz & 1);
  }
  return 0;
}

/* Decodes p[0..len) into cfg->output (external memory), FEED bytes at a time. */
static VP8StatusCode idecode(const uint8_t *p, size_t len, WebPDecoderConfig *cfg,
                             const mml_cancel *cancel) {
  if (cut_short(p, len)) return VP8_STATUS_NOT_ENOUGH_DATA;
  WebPIDecoder *idec = WebPIDecode(NULL, 0, cfg);
  if (!idec) return VP8_STATUS_OUT_OF_MEMORY;
  VP8StatusCode s = VP8_STATUS_NOT_ENOUGH_DATA;
  for (size_t n = 0; n < len;) {
    if (mml_cancelled(cancel)) {
      s = VP8_STATUS_USER_ABORT;
      break;
    }
    n = len - n > FEED ? n + FEED : len;
    if ((s = WebPIUpdate(idec, p, n)) != VP8_STATUS_SUSPENDED) break;
  }
  if (s == VP8_STATUS_SUSPENDED) s = VP8_STATUS_NOT_ENOUGH_DATA; /* all fed, not finished */
  WebPIDelete(idec);
  return s;
}

/* A decode run aside (mml_image_aside): its config, and where its output starts in the
 * buffer (an animation's first frame: at its offset on the canvas). */
typedef struct webp_job {
  WebPDecoderConfig cfg;
  size_t off;
} webp_job;

static int webp_aside(void *arg, const uint8_t *in, size_t len, uint8_t *out,
                      const mml_cancel *cancel) {
  webp_job *j = arg;
  j->cfg.output.u.RGBA.rgba = out + j->off;
  VP8StatusCode s = idecode(in, len, &j->cfg, cancel);
  WebPFreeDecBuffer(&j->cfg.output);
  return (int)s;
}

/* Decodes p[0..len) into whole->data + off (cfg's output there).  An image of
 * ASIDE_PIXELS and more on a thread of its own that close() can abandon (image_aside.c;
 * then `whole` is left empty), else here. */
static VP8StatusCode decode_to(const uint8_t *p, size_t len, WebPDecoderConfig *cfg,
                               mml_bytes *whole, size_t off, int64_t px, const mml_cancel *cancel) {
  if (px >= ASIDE_PIXELS && !cut_short(p, len)) {
    webp_job j = {*cfg, off};
    int rc = 0, r = mml_image_aside(webp_aside, &j, sizeof j, p, len, whole, cancel, &rc);
    if (r < 0) return VP8_STATUS_USER_ABORT;
    if (r > 0) {
      *cfg = j.cfg;
      return (VP8StatusCode)rc;
    }
  }
  cfg->output.u.RGBA.rgba = whole->data + off;
  VP8StatusCode s = idecode(p, len, cfg, cancel);
  WebPFreeDecBuffer(&cfg->output);
  return s;
}

static mml_status decode_failed(VP8StatusCode s, mml_err *err) {
  if (s == VP8_STATUS_USER_ABORT) return mml_err_set(err, MML_ECANCELLED, "WebP: decode cancelled");
  return mml_err_set(err, MML_EDECODE, "WebP: %s", vp8_status(s));
}

/* The first frame of an animation onto its canvas (as WebPAnimDecoderGetNext). */
static mml_status first_frame(const WebPIterator *it, const WebPBitstreamFeatures *f,
                              mml_img_bufs *b, mml_err *err) {
  const size_t stride = (size_t)f->width * 4, size = stride * (size_t)f->height;
  if (it->x_offset < 0 || it->y_offset < 0 || it->width < 1 || it->height < 1 ||
      it->x_offset + it->width > f->width || it->y_offset + it->height > f->height)
    return mml_err_set(err, MML_EDECODE, "WebP: the first frame lies outside the canvas");
  if (mml_bytes_reserve(b->whole, size))
    return mml_err_set(err, MML_ENOMEM, "WebP: out of memory for a %dx%d canvas", f->width,
                       f->height);
  /* a key frame: the canvas cleared to transparent, where the frame does not cover it */
  uint8_t *c = b->whole->data;
  const size_t x0 = (size_t)it->x_offset * 4, x1 = x0 + (size_t)it->width * 4;
  memset(c, 0, (size_t)it->y_offset * stride);
  for (int y = it->y_offset; y < it->y_offset + it->height; y++) {
    memset(c + (size_t)y * stride, 0, x0);
    memset(c + (size_t)y * stride + x1, 0, stride - x1);
  }
  memset(c + (size_t)(it->y_offset + it->height) * stride, 0,
         (size_t)(f->height - it->y_offset - it->height) * stride);
  WebPDecoderConfig cfg;
  if (!WebPInitDecoderConfig(&cfg))
    return mml_err_set(err, MML_EINTERNAL, "WebP: libwebp ABI mismatch");
  cfg.output.colorspace = MODE_RGBA;
  cfg.output.is_external_memory = 1;
  cfg.output.u.RGBA.stride = (int)stride;
  cfg.output.u.RGBA.size = stride * (size_t)it->height;
  VP8StatusCode s = decode_to(it->fragment.bytes, it->fragment.size, &cfg, b->whole,
                              (size_t)it->y_offset * stride + (size_t)it->x_offset * 4,
                              (int64_t)it->width * it->height, b->cancel);
  if (s != VP8_STATUS_OK) return decode_failed(s, err);
  if (cfg.output.width != it->width || cfg.output.height != it->height)
    return mml_err_set(err, MML_EDECODE, "WebP: the first frame's size differs from its header");
  return MML_OK;
}

static mml_status decode_animated(const uint8_t *p, size_t len, const WebPBitstreamFeatures *f,
                                  mml_img_bufs *b, const mml_row_sink *sink, mml_err *err) {
  WebPData wd = {p, len};
  WebPDemuxer *dmx = WebPDemux(&wd);
  if (!dmx) return mml_err_set(err, MML_EDECODE, "WebP: cannot parse the animation");
  WebPIterator it;
  mml_status st;
  if ((int)WebPDemuxGetI(dmx, WEBP_FF_CANVAS_WIDTH) != f->width ||
      (int)WebPDemuxGetI(dmx, WEBP_FF_CANVAS_HEIGHT) != f->height)
    st = mml_err_set(err, MML_EDECODE, "WebP: animation canvas does not match its header");
  else if (!WebPDemuxGetFrame(dmx, 1, &it))
    st = mml_err_set(err, MML_EDECODE, "WebP: cannot decode the first frame");
  else {
    st = first_frame(&it, f, b, err);
    WebPDemuxReleaseIterator(&it);
  }
  WebPDemuxDelete(dmx);
  if (st) return st;
  return emit(b->whole->data, f->width, f->height, (size_t)f->width * 4, 4, f->has_alpha, b, sink,
              err);
}

mml_status mml_webp_decode(const uint8_t *p, size_t len, mml_img_bufs *b, const mml_row_sink *sink,
                           mml_err *err) {
  WebPBitstreamFeatures f;
  mml_status st = features(p, len, &f, err);
  if (st != MML_OK) return st;
  if (f.has_animation) return decode_animated(p, len, &f, b, sink, err);
  const int w = f.width, h = f.height, bpp = f.has_alpha ? 4 : 3;
  const size_t stride = (size_t)w * (size_t)bpp, size = stride * (size_t)h;
  if (mml_bytes_reserve(b->whole, size))
    return mml_err_set(err, MML_ENOMEM, "WebP: out of memory for a %dx%d image", w, h);
  WebPDecoderConfig cfg;
  if (!WebPInitDecoderConfig(&cfg))
    return mml_err_set(err, MML_EINTERNAL, "WebP: libwebp ABI mismatch");
  cfg.output.colorspace = f.has_alpha ? MODE_RGBA : MODE_RGB;
  cfg.output.is_external_memory = 1;
  cfg.output.u.RGBA.stride = (int)stride;
  cfg.output.u.RGBA.size = size;
  VP8StatusCode s = decode_to(p, len, &cfg, b->whole, 0, (int64_t)w * h, b->cancel);
  if (s != VP8_STATUS_OK) return decode_failed(s, err);
  if (cfg.output.width != w || cfg.output.height != h)
    return mml_err_set(err, MML_EDECODE, "WebP: decoded size differs from the header");
  return emit(b->whole->data, w, h, stride, bpp, f.has_alpha, b, sink, err);
}
