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
 * Threads: reentrant; libwebp keeps no global state after its one-time DSP init (which it
 * guards itself).  Memory: still images reuse `whole`; WebPAnimDecoder allocates its own
 * canvas per animated image.
 */
#include <string.h>

#include <webp/decode.h>
#include <webp/demux.h>

#include "image_fmt.h"

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

static mml_status decode_animated(const uint8_t *p, size_t len, const WebPBitstreamFeatures *f,
                                  mml_img_bufs *b, const mml_row_sink *sink, mml_err *err) {
  WebPAnimDecoderOptions o;
  if (!WebPAnimDecoderOptionsInit(&o))
    return mml_err_set(err, MML_EINTERNAL, "WebP: libwebp ABI mismatch");
  o.color_mode = MODE_RGBA;
  o.use_threads = 0;
  WebPData wd = {p, len};
  WebPAnimDecoder *dec = WebPAnimDecoderNew(&wd, &o);
  if (!dec) return mml_err_set(err, MML_EDECODE, "WebP: cannot parse the animation");
  WebPAnimInfo ai;
  uint8_t *px = NULL;
  int ts = 0;
  mml_status st;
  if (!WebPAnimDecoderGetInfo(dec, &ai) || (int)ai.canvas_width != f->width ||
      (int)ai.canvas_height != f->height)
    st = mml_err_set(err, MML_EDECODE, "WebP: animation canvas does not match its header");
  else if (!WebPAnimDecoderGetNext(dec, &px, &ts))
    st = mml_err_set(err, MML_EDECODE, "WebP: cannot decode the first frame");
  else
    st = emit(px, f->width, f->height, (size_t)f->width * 4, 4, f->has_alpha, b, sink, err);
  WebPAnimDecoderDelete(dec);
  return st;
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
  cfg.output.u.RGBA.rgba = b->whole->data;
  cfg.output.u.RGBA.stride = (int)stride;
  cfg.output.u.RGBA.size = size;
  VP8StatusCode s = WebPDecode(p, len, &cfg);
  WebPFreeDecBuffer(&cfg.output);
  if (s != VP8_STATUS_OK) return mml_err_set(err, MML_EDECODE, "WebP: %s", vp8_status(s));
  if (cfg.output.width != w || cfg.output.height != h)
    return mml_err_set(err, MML_EDECODE, "WebP: decoded size differs from the header");
  return emit(b->whole->data, w, h, stride, bpp, f.has_alpha, b, sink, err);
}
