/*
 * image_tiff.c — TIFF and BigTIFF through libtiff: the first page (IFD 0), as Pillow's
 * TiffImagePlugin gives it, for the layouts Pillow maps to an 8-bit mode and that real
 * photos and scans use (any compression libtiff decodes — none, LZW, Deflate, PackBits,
 * JPEG, CCITT ... — with predictors, strips or tiles, contiguous or separate planes):
 *   gray (min-is-black or min-is-white) 1/2/4/8 bit   scaled (x255, x85, x17), inverted for
 *                                                     min-is-white
 *   gray 16 bit (min-is-black)                        mode I;16: RGB = min(v, 255)
 *   gray + unassociated alpha, 8 bit                  LA, composited onto white
 *   palette 1/2/4/8 bit                               the colour map's high bytes
 *   RGB 8/16 bit, + a 4th sample: unspecified (ignored), associated alpha (un-premultiplied
 *   as Pillow's "RGBa" unpacker: min(255, c*255/a)) or unassociated alpha; 16 bit keeps
 *   the high byte; alpha composited onto white
 *   CMYK 8 bit                                        Pillow's cmyk2rgb
 *   YCbCr in JPEG compression                         libjpeg's RGB (JPEGCOLORMODE_RGB),
 *                                                     as Pillow asks libtiff
 * Everything else (float or signed samples, other bit depths, YCbCr without JPEG, CIE Lab,
 * old-style JPEG, ...) is refused as unsupported, naming the layout.
 *
 * An Orientation tag is applied on decode, as Pillow's TiffImagePlugin does on load (its
 * size is the turned one); the probe reports the turned size too.  The probe parses the
 * first IFD by hand (ImageWidth/ImageLength/Orientation), so it needs the bytes up to that
 * IFD, which some writers put at the end of the file.
 *
 * Threads: reentrant; libtiff messages go to per-handle handlers (TIFFOpenOptions), never
 * to the process-wide ones or stderr.  Memory: the raw samples of the page are read into
 * `whole` (strips or tiles, bounded by max_image_pixels through the plan); libtiff's own
 * per-image allocations are capped.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <tiffio.h>

#include "image_fmt.h"

/* ---------------------------------------------------------------- probe */

static uint64_t rd(const uint8_t *p, int n, int be) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v |= (uint64_t)p[be ? i : n - 1 - i] << (8 * (n - 1 - i));
  return v;
}

int mml_tiff_ifd0_tag(const uint8_t *p, size_t len, unsigned want, uint64_t *val,
                      const char **why) {
  *why = "truncated header";
  if (len < 8 || !((p[0] == 'I' && p[1] == 'I') || (p[0] == 'M' && p[1] == 'M'))) return -2;
  const int be = p[0] == 'M', big = rd(p + 2, 2, be) == 43;
  if (big && (len < 16 || rd(p + 4, 2, be) != 8)) return *why = "bad BigTIFF header", -2;
  const uint64_t ifd = big ? rd(p + 8, 8, be) : rd(p + 4, 4, be);
  const int cnt_size = big ? 8 : 2, ent = big ? 20 : 12, vsz = big ? 8 : 4;
  *why = "first IFD past the bytes given";
  if (ifd < 8 || ifd > len || len - ifd < (uint64_t)cnt_size) return -2;
  uint64_t n = rd(p + ifd, cnt_size, be);
  *why = "truncated first IFD";
  if (n > (len - ifd - cnt_size) / ent) return -2;
  for (uint64_t i = 0; i < n; i++) {
    const uint8_t *e = p + ifd + cnt_size + i * ent;
    if (rd(e, 2, be) != want) continue;
    unsigned type = (unsigned)rd(e + 2, 2, be);
    const uint8_t *v = e + 4 + vsz;
    if (type != 3 && type != 4 && type != 16) continue;
    *val = type == 3 ? rd(v, 2, be) : type == 4 ? rd(v, 4, be) : rd(v, 8, be);
    return 0;
  }
  return -1;
}

mml_status mml_tiff_probe(const uint8_t *p, size_t len, mml_image_info *info, mml_err *err) {
  uint64_t w = 0, h = 0;
  const char *why;
  int a = mml_tiff_ifd0_tag(p, len, 256, &w, &why),
      b = a == -2 ? a : mml_tiff_ifd0_tag(p, len, 257, &h, &why);
  if (a == -2 || b == -2) {
    if (len >= 8 && !strcmp(why, "first IFD past the bytes given")) {
      const int be = p[0] == 'M', big = rd(p + 2, 2, be) == 43;
      uint64_t ifd = big && len >= 16 ? rd(p + 8, 8, be) : rd(p + 4, 4, be);
      return mml_err_set(err, MML_EDECODE, "TIFF: first IFD at byte %llu, past the %zu bytes given",
                         (unsigned long long)ifd, len);
    }
    return mml_err_set(err, MML_EDECODE, "TIFF: %s", why);
  }
  if (w == 0 || h == 0 || w > 0x7fffffff || h > 0x7fffffff)
    return mml_err_set(err, MML_EDECODE, "TIFF: bad or missing size %llux%llu in the first IFD",
                       (unsigned long long)w, (unsigned long long)h);
  uint64_t o = 1;
  mml_tiff_ifd0_tag(p, len, 274, &o, &why); /* Pillow's size is after the Orientation */
  info->width = (int)(o >= 5 && o <= 8 ? h : w);
  info->height = (int)(o >= 5 && o <= 8 ? w : h);
  info->format = MML_FMT_TIFF;
  /* the page's raw samples in `whole` (SamplesPerPixel, up to 2 bytes each unless the one
   * sample's BitsPerSample says less), libtiff's strip or tile buffers (at most the file),
   * and with an Orientation the converted and the turned RGB8 copies */
  uint64_t spp = 1, bps = 16;
  mml_tiff_ifd0_tag(p, len, 277, &spp, &why);
  if (spp == 1) mml_tiff_ifd0_tag(p, len, 258, &bps, &why);
  if (spp < 1 || spp > 16) spp = 16;
  const int64_t px = (int64_t)w * (int64_t)h, bytes = bps <= 8 ? 1 : bps <= 16 ? 2 : 8;
  info->scratch =
      mml_round_2mib(px * (int64_t)spp * bytes + (int64_t)len + (o > 1 && o <= 8 ? 6 * px : 0));
  return MML_OK;
}

/* ---------------------------------------------------------------- libtiff on memory */

typedef struct mem {
  const uint8_t *p;
  tmsize_t len, off;
  char msg[256];
} mem;

static tmsize_t m_read(thandle_t h, void *buf, tmsize_t n) {
  mem *m = h;
  if (n < 0) return 0;
  tmsize_t k = m->off >= m->len ? 0 : m->len - m->off < n ? m->len - m->off : n;
  if (k) memcpy(buf, m->p + m->off, (size_t)k);
  m->off += k;
  return k;
}
static tmsize_t m_write(thandle_t h, void *buf, tmsize_t n) {
  (void)h, (void)buf, (void)n;
  return 0;
}
static toff_t m_seek(thandle_t h, toff_t off, int whence) {
  mem *m = h;
  int64_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? m->off : m->len;
  int64_t to = base + (int64_t)off;
  if (to < 0) return (toff_t)-1;
  m->off = (tmsize_t)to;
  return (toff_t)to;
}
static int m_close(thandle_t h) {
  (void)h;
  return 0;
}
static toff_t m_size(thandle_t h) { return (toff_t)((mem *)h)->len; }
static int m_map(thandle_t h, void **base, toff_t *size) {
  mem *m = h;
  *base = (void *)m->p;
  *size = (toff_t)m->len;
  return 1;
}
static void m_unmap(thandle_t h, void *base, toff_t size) { (void)h, (void)base, (void)size; }

static int on_error(TIFF *t, void *ud, const char *module, const char *fmt, va_list ap) {
  (void)t, (void)module;
  mem *m = ud;
  if (!m->msg[0]) vsnprintf(m->msg, sizeof m->msg, fmt, ap); /* the first error is the cause */
  return 1;
}
static int on_warning(TIFF *t, void *ud, const char *module, const char *fmt, va_list ap) {
  (void)t, (void)ud, (void)module, (void)fmt, (void)ap;
  return 1;
}

/* ---------------------------------------------------------------- layouts */

enum kind { K_GRAY, K_GRAY16, K_GA, K_PAL, K_RGB, K_CMYK };

typedef struct page {
  int w, h, bps, spp, separate;
  enum kind kind;
  int invert; /* min-is-white */
  int alpha;  /* 0 none, 1 associated, 2 unassociated */
  uint8_t pal[256][3];
} page;

static const char *photo_name(int ph) {
  switch (ph) {
    case 0:
      return "min-is-white";
    case 1:
      return "min-is-black";
    case 2:
      return "RGB";
    case 3:
      return "palette";
    case 4:
      return "mask";
    case 5:
      return "separated (CMYK)";
    case 6:
      return "YCbCr";
    case 8:
      return "CIE L*a*b*";
    case 9:
      return "ICC L*a*b*";
    case 10:
      return "ITU L*a*b*";
    case 32844:
      return "LogL";
    case 32845:
      return "LogLuv";
  }
  return "unknown";
}

static mml_status layout(TIFF *t, page *pg, mml_err *err) {
  uint32_t w = 0, h = 0;
  uint16_t bps = 1, spp = 1, ph = 0, fmt = SAMPLEFORMAT_UINT, planar = PLANARCONFIG_CONTIG,
           comp = 1;
  TIFFGetField(t, TIFFTAG_IMAGEWIDTH, &w);
  TIFFGetField(t, TIFFTAG_IMAGELENGTH, &h);
  TIFFGetFieldDefaulted(t, TIFFTAG_BITSPERSAMPLE, &bps);
  TIFFGetFieldDefaulted(t, TIFFTAG_SAMPLESPERPIXEL, &spp);
  TIFFGetFieldDefaulted(t, TIFFTAG_SAMPLEFORMAT, &fmt);
  TIFFGetFieldDefaulted(t, TIFFTAG_PLANARCONFIG, &planar);
  TIFFGetFieldDefaulted(t, TIFFTAG_COMPRESSION, &comp);
  if (!TIFFGetField(t, TIFFTAG_PHOTOMETRIC, &ph))
    return mml_err_set(err, MML_EUNSUPPORTED, "TIFF: no photometric interpretation");
  uint16_t nextra = 0, *extra = NULL;
  TIFFGetFieldDefaulted(t, TIFFTAG_EXTRASAMPLES, &nextra, &extra);
  memset(pg, 0, sizeof *pg);
  pg->w = (int)w, pg->h = (int)h, pg->bps = bps, pg->spp = spp;
  pg->separate = planar == PLANARCONFIG_SEPARATE && spp > 1;
  int ok = 0;
  if (fmt == SAMPLEFORMAT_UINT && comp != COMPRESSION_OJPEG) {
    const int x = nextra == 1 && extra ? extra[0] : -1; /* the one extra sample's kind */
    switch (ph) {
      case PHOTOMETRIC_MINISWHITE:
      case PHOTOMETRIC_MINISBLACK:
        pg->invert = ph == PHOTOMETRIC_MINISWHITE;
        if (spp == 1 && (bps == 1 || bps == 2 || bps == 4 || bps == 8)) ok = 1, pg->kind = K_GRAY;
        if (spp == 1 && bps == 16 && !pg->invert) ok = 1, pg->kind = K_GRAY16;
        if (spp == 2 && bps == 8 && !pg->invert && x == EXTRASAMPLE_UNASSALPHA)
          ok = 1, pg->kind = K_GA, pg->alpha = 2;
        break;
      case PHOTOMETRIC_PALETTE: {
        uint16_t *r, *g, *b;
        if (spp == 1 && (bps == 1 || bps == 2 || bps == 4 || bps == 8) &&
            TIFFGetField(t, TIFFTAG_COLORMAP, &r, &g, &b)) {
          ok = 1, pg->kind = K_PAL;
          for (int i = 0; i < (1 << bps); i++)
            pg->pal[i][0] = r[i] >> 8, pg->pal[i][1] = g[i] >> 8, pg->pal[i][2] = b[i] >> 8;
        }
        break;
      }
      case PHOTOMETRIC_RGB:
        if ((bps == 8 || bps == 16) && (spp == 3 || (spp == 4 && x >= 0 && x <= 2)))
          ok = 1, pg->kind = K_RGB, pg->alpha = spp == 4 ? x : 0;
        break;
      case PHOTOMETRIC_SEPARATED:
        if (bps == 8 && spp == 4) ok = 1, pg->kind = K_CMYK;
        break;
      case PHOTOMETRIC_YCBCR:
        if (comp == COMPRESSION_JPEG && bps == 8 && spp == 3 && !pg->separate) {
          TIFFSetField(t, TIFFTAG_JPEGCOLORMODE, JPEGCOLORMODE_RGB);
          ok = 1, pg->kind = K_RGB;
        }
        break;
    }
  }
  if (!ok)
    return mml_err_set(err, MML_EUNSUPPORTED,
                       "TIFF: %s with %u sample(s) of %u bit(s)%s%s%s is not supported",
                       photo_name(ph), spp, bps,
                       fmt == SAMPLEFORMAT_IEEEFP ? " (float)"
                       : fmt == SAMPLEFORMAT_INT  ? " (signed)"
                                                  : "",
                       nextra ? " and extra samples" : "",
                       comp == COMPRESSION_OJPEG ? " (old-style JPEG)"
                       : ph == PHOTOMETRIC_YCBCR ? " (YCbCr needs JPEG compression)"
                                                 : "");
  return MML_OK;
}

/* Reads the raw samples of the whole page into `buf`: contiguous, `row` bytes per line;
 * separate planes, plane after plane of `row` bytes per line each. */
static mml_status cancelled(mml_err *err) {
  return mml_err_set(err, MML_ECANCELLED, "TIFF: decode cancelled");
}

static mml_status read_page(TIFF *t, const page *pg, size_t row, mml_bytes *buf,
                            const mml_cancel *cancel, mml_err *err) {
  const int planes = pg->separate ? pg->spp : 1;
  const size_t plane = row * (size_t)pg->h;
  if (plane / row != (size_t)pg->h || mml_bytes_reserve(buf, plane * planes))
    return mml_err_set(err, MML_ENOMEM, "TIFF: out of memory for a %dx%d image", pg->w, pg->h);
  const int px_bits = pg->bps * (pg->separate ? 1 : pg->spp);
  if (TIFFIsTiled(t)) {
    uint32_t tw = 0, th = 0;
    TIFFGetField(t, TIFFTAG_TILEWIDTH, &tw);
    TIFFGetField(t, TIFFTAG_TILELENGTH, &th);
    tmsize_t ts = TIFFTileSize(t), trow = TIFFTileRowSize(t);
    if (!tw || !th || ts <= 0 || trow <= 0 || (tw * (uint64_t)px_bits) % 8)
      return mml_err_set(err, MML_EUNSUPPORTED, "TIFF: unsupported tile layout %ux%u", tw, th);
    mml_bytes tile = {0};
    if (mml_bytes_reserve(&tile, (size_t)ts))
      return mml_err_set(err, MML_ENOMEM, "TIFF: out of memory for a tile");
    mml_status st = MML_OK;
    for (int s = 0; s < planes && st == MML_OK; s++)
      for (uint32_t ty = 0; ty < (uint32_t)pg->h && st == MML_OK; ty += th)
        for (uint32_t tx = 0; tx < (uint32_t)pg->w; tx += tw) {
          if (mml_cancelled(cancel)) {
            st = cancelled(err);
            break;
          }
          if (TIFFReadTile(t, tile.data, tx, ty, 0, (uint16_t)s) < 0) {
            st = mml_err_set(err, MML_EDECODE, "TIFF: cannot read tile at %u,%u", tx, ty);
            break;
          }
          size_t x0 = (size_t)tx * px_bits / 8, n = (size_t)trow;
          if (x0 + n > row) n = row - x0;
          for (uint32_t y = 0; y < th && ty + y < (uint32_t)pg->h; y++)
            memcpy(buf->data + s * plane + (ty + y) * row + x0, tile.data + y * (size_t)trow, n);
        }
    mml_bytes_free(&tile);
    return st;
  }
  uint32_t rps = 0;
  TIFFGetFieldDefaulted(t, TIFFTAG_ROWSPERSTRIP, &rps);
  if (rps == 0 || rps > (uint32_t)pg->h) rps = (uint32_t)pg->h;
  const uint32_t per_plane = ((uint32_t)pg->h + rps - 1) / rps;
  for (int s = 0; s < planes; s++)
    for (uint32_t k = 0; k < per_plane; k++) {
      if (mml_cancelled(cancel)) return cancelled(err);
      uint32_t y0 = k * rps, rows = (uint32_t)pg->h - y0 < rps ? (uint32_t)pg->h - y0 : rps;
      tmsize_t got = TIFFReadEncodedStrip(t, (uint32_t)s * per_plane + k,
                                          buf->data + s * plane + y0 * row, (tmsize_t)(rows * row));
      if (got < (tmsize_t)(rows * row))
        return mml_err_set(err, MML_EDECODE, "TIFF: cannot read strip %u", s * per_plane + k);
    }
  return MML_OK;
}

static inline uint8_t cmyk_channel(uint32_t c, uint32_t k) {
  uint32_t nk = 255u - k, t = c * nk + 128u;
  int v = (int)nk - (int)(((t >> 8) + t) >> 8);
  return (uint8_t)(v < 0 ? 0 : v);
}

/* Sample s of pixel x of a line (pointers per plane for separate, else one). */
static inline unsigned sample(const page *pg, const uint8_t *const *ln, int x, int s) {
  if (pg->bps == 8) return pg->separate ? ln[s][x] : ln[0][x * pg->spp + s];
  if (pg->bps == 16) {
    const uint16_t *q = (const uint16_t *)(pg->separate ? ln[s] : ln[0]);
    return pg->separate ? q[x] : q[x * pg->spp + s];
  }
  const int per = 8 / pg->bps; /* spp == 1 */
  return ln[0][x / per] >> (8 - pg->bps * (x % per + 1)) & ((1u << pg->bps) - 1);
}

/* Line y of the page (pointers per plane for separate, else one) -> RGB8 at o3. */
static void tiff_line_to_rgb(const page *pg, const uint8_t *const *ln, int alpha, uint8_t *o3) {
  static const uint8_t gray_scale[9] = {0, 255, 85, 0, 17, 0, 0, 0, 1};
  for (int x = 0; x < pg->w; x++, o3 += 3) {
    switch (pg->kind) {
      case K_GRAY: {
        unsigned v = sample(pg, ln, x, 0) * gray_scale[pg->bps];
        o3[0] = o3[1] = o3[2] = (uint8_t)(pg->invert ? 255 - v : v);
        break;
      }
      case K_GRAY16: {
        unsigned v = sample(pg, ln, x, 0);
        o3[0] = o3[1] = o3[2] = (uint8_t)(v > 255 ? 255 : v);
        break;
      }
      case K_GA:
        o3[0] = o3[1] = o3[2] =
            mml_alpha_px(alpha, 0, sample(pg, ln, x, 0), sample(pg, ln, x, 1)); /* LA */
        break;
      case K_PAL:
        memcpy(o3, pg->pal[sample(pg, ln, x, 0)], 3);
        break;
      case K_RGB: {
        const int sh = pg->bps == 16 ? 8 : 0;
        unsigned c[3];
        for (int s = 0; s < 3; s++) c[s] = sample(pg, ln, x, s) >> sh;
        if (pg->alpha) {
          unsigned a = sample(pg, ln, x, 3) >> sh;
          for (int s = 0; s < 3; s++) {
            unsigned v = c[s];
            if (pg->alpha == 1)
              v = a == 0 ? 0 : a == 255 ? v : v * 255 / a > 255 ? 255 : v * 255 / a;
            o3[s] = mml_alpha_px(alpha, 1, v, a); /* Pillow's mode RGBA */
          }
        } else {
          o3[0] = (uint8_t)c[0], o3[1] = (uint8_t)c[1], o3[2] = (uint8_t)c[2];
        }
        break;
      }
      case K_CMYK: {
        unsigned k = sample(pg, ln, x, 3);
        for (int s = 0; s < 3; s++) o3[s] = cmyk_channel(sample(pg, ln, x, s), k);
        break;
      }
    }
  }
}

mml_status mml_tiff_decode(const uint8_t *p, size_t len, mml_img_bufs *b, const mml_row_sink *sink,
                           mml_err *err) {
  mml_image_info info;
  mml_status st = mml_tiff_probe(p, len, &info, err);
  if (st != MML_OK) return st;
  mem m = {p, (tmsize_t)len, 0, ""};
  TIFFOpenOptions *o = TIFFOpenOptionsAlloc();
  if (!o) return mml_err_set(err, MML_ENOMEM, "TIFF: out of memory");
  TIFFOpenOptionsSetErrorHandlerExtR(o, on_error, &m);
  TIFFOpenOptionsSetWarningHandlerExtR(o, on_warning, &m);
  TIFFOpenOptionsSetMaxSingleMemAlloc(o, (tmsize_t)1 << 31);
  TIFF *t = TIFFClientOpenExt("image", "rm", &m, m_read, m_write, m_seek, m_close, m_size, m_map,
                              m_unmap, o);
  TIFFOpenOptionsFree(o);
  if (!t) return mml_err_set(err, MML_EDECODE, "TIFF: %s", m.msg[0] ? m.msg : "cannot open");
  page pg;
  uint16_t orient = 1;
  mml_bytes turned = {0}, flat = {0};
  if ((st = layout(t, &pg, err)) != MML_OK) goto done;
  TIFFGetFieldDefaulted(t, TIFFTAG_ORIENTATION, &orient);
  if (orient < 1 || orient > 8) orient = 1;
  if (orient >= 5 ? (pg.w != info.height || pg.h != info.width)
                  : (pg.w != info.width || pg.h != info.height)) {
    st = mml_err_set(err, MML_EDECODE, "TIFF: size differs from the first IFD's");
    goto done;
  }
  const size_t row = (size_t)TIFFScanlineSize64(t);
  const size_t need = ((size_t)pg.w * pg.bps * (pg.separate ? 1 : pg.spp) + 7) / 8;
  if (row < need) {
    st = mml_err_set(err, MML_EDECODE, "TIFF: bad scanline size");
    goto done;
  }
  if ((st = read_page(t, &pg, row, b->whole, b->cancel, err)) != MML_OK) {
    if (m.msg[0]) mml_err_set(err, st, "TIFF: %s", m.msg);
    goto done;
  }
  if (mml_bytes_reserve(b->row, (size_t)pg.w * 3)) {
    st = mml_err_set(err, MML_ENOMEM, "TIFF: out of memory for a %d-pixel row", pg.w);
    goto done;
  }
  /* an Orientation tag: all rows converted first, then turned (Pillow transposes on load) */
  if (orient > 1 && (mml_bytes_reserve(&flat, (size_t)pg.w * pg.h * 3) ||
                     mml_bytes_reserve(&turned, (size_t)pg.w * pg.h * 3))) {
    st = mml_err_set(err, MML_ENOMEM, "TIFF: out of memory for a %dx%d image", pg.w, pg.h);
    goto done;
  }
  if (orient == 1 && (st = sink->begin(sink->ctx, pg.w, pg.h, err)) != MML_OK) goto done;
  const size_t plane = row * (size_t)pg.h;
  for (int y = 0; y < pg.h; y++) {
    const uint8_t *ln[4];
    for (int s = 0; s < 4; s++) ln[s] = b->whole->data + (pg.separate ? s * plane : 0) + y * row;
    tiff_line_to_rgb(&pg, ln, b->alpha, b->row->data);
    if (orient > 1)
      memcpy(flat.data + (size_t)y * pg.w * 3, b->row->data, (size_t)pg.w * 3);
    else if ((st = sink->row(sink->ctx, y, b->row->data, err)) != MML_OK)
      goto done;
  }
  if (orient > 1) {
    const mml_rgb8 src = {flat.data, pg.w, pg.h, (size_t)pg.w * 3};
    mml_rgb8_transpose(&src, orient, turned.data);
    const int ow = orient >= 5 ? pg.h : pg.w, oh = orient >= 5 ? pg.w : pg.h;
    if ((st = sink->begin(sink->ctx, ow, oh, err)) != MML_OK) goto done;
    for (int y = 0; y < oh; y++)
      if ((st = sink->row(sink->ctx, y, turned.data + (size_t)y * ow * 3, err)) != MML_OK)
        goto done;
  }
done:
  mml_bytes_free(&flat);
  mml_bytes_free(&turned);
  TIFFClose(t);
  return st;
}
