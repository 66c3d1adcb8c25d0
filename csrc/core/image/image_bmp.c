/*
 * image_bmp.c — Windows/OS2 BMP, written by hand (the format is a header and raw or RLE
 * rows), accepting exactly what Pillow's BmpImagePlugin accepts and giving its pixels:
 *   headers    12 (OS/2 core), 40, 52, 56, 64, 108, 124 bytes; negative height = top-down
 *   depths     1/4/8 (palette; not 2, which Pillow refuses), 16 (5-5-5, or 5-6-5 with bit fields: v*255/31, v*255/63),
 *              24, 32 (BI_RGB: the 4th byte is ignored; bit fields: Pillow's eight mask
 *              layouts, those with an alpha mask composited onto white)
 *   RLE8/RLE4  decoded as Pillow's BmpRleDecoder does (rows that end early are padded
 *              with index 0, a bitmap that ends early is an error as in Pillow)
 *   palettes   `colors` entries (BGRX, BGR for OS/2); an index past them reads black;
 *              a gray ramp palette makes Pillow read the data as mode L or 1, which is
 *              the same pixels except for odd depth/palette pairs it misreads — those
 *              are refused rather than reproduced
 * Pixel data starts at the file header's offset (Pillow's rules when it is 0 or points
 * at the palette).  Truncated pixel data is an error, as in Pillow.
 *
 * Threads: reentrant.  Memory: RLE indices are decoded into `whole`; raw rows are read in
 * place from the input (bottom-up files need no copy).
 */
#include <string.h>

#include "image_fmt.h"

enum { BMP_RAW = 0, BMP_RLE8 = 1, BMP_RLE4 = 2, BMP_BITFIELDS = 3 };

typedef struct bmp {
  uint32_t hs; /* info header size */
  int64_t w, h;
  int bits, compression;
  int top_down;
  uint32_t colors;
  int pad;       /* palette entry size: 4, or 3 for OS/2 */
  size_t offset; /* pixel data */
  /* pixel layouts */
  int kind;  /* 'P' palette, 'L' gray index, '5' 5-5-5, '6' 5-6-5, '3' BGR, '4' 32-bit */
  int ch[4]; /* 32-bit: byte index of R, G, B, A (A < 0: none) */
  const uint8_t *palette;
} bmp;

/* The file and info headers: size, depth, compression, palette entry size and the bit
 * field masks; *pos: where Pillow's file pointer is after them. */
static mml_status parse_header(const uint8_t *p, size_t len, bmp *b, uint32_t masks[4], size_t *pos,
                               mml_err *err) {
  if (len < 18) return mml_err_set(err, MML_EDECODE, "BMP: truncated header");
  b->hs = mml_le32(p + 14);
  const uint32_t hs = b->hs;
  if (hs != 12 && hs != 40 && hs != 52 && hs != 56 && hs != 64 && hs != 108 && hs != 124)
    return mml_err_set(err, MML_EUNSUPPORTED, "BMP: unsupported header type (%u)", hs);
  if (len < 14 + (size_t)hs) return mml_err_set(err, MML_EDECODE, "BMP: truncated header");
  const uint8_t *hd = p + 18;
  *pos = 14 + hs;
  if (hs == 12) {
    b->w = mml_le16(hd);
    b->h = mml_le16(hd + 2);
    b->bits = mml_le16(hd + 6);
    b->compression = BMP_RAW;
    b->pad = 3;
  } else {
    b->top_down = hd[7] == 0xFF;
    b->w = mml_le32(hd);
    b->h = b->top_down ? (int64_t)4294967296LL - mml_le32(hd + 4) : (int64_t)mml_le32(hd + 4);
    b->bits = mml_le16(hd + 10);
    b->compression = (int)mml_le32(hd + 12);
    b->colors = mml_le32(hd + 28);
    b->pad = 4;
    if (b->compression == BMP_BITFIELDS) {
      if (hs - 4 >= 48) {
        for (int i = 0; i < (hs - 4 >= 52 ? 4 : 3); i++) masks[i] = mml_le32(hd + 36 + 4 * i);
      } else { /* a 40-byte header: the three masks follow it */
        if (len < *pos + 12) return mml_err_set(err, MML_EDECODE, "BMP: truncated bit fields");
        for (int i = 0; i < 3; i++) masks[i] = mml_le32(p + *pos + 4 * i);
        *pos += 12;
      }
    }
  }
  if (b->w <= 0 || b->h <= 0 || b->w > 0x7fffffff || b->h > 0x7fffffff)
    return mml_err_set(err, MML_EDECODE, "BMP: bad size %lldx%lld", (long long)b->w,
                       (long long)b->h);
  return MML_OK;
}

/* Bit fields: the mask layouts Pillow reads (kind '6' for 5-6-5, channel bytes for 32-bit). */
static mml_status parse_bitfields(bmp *b, const uint32_t masks[4], mml_err *err) {
  static const uint32_t k32[8][4] = {
      {0xFF0000, 0xFF00, 0xFF, 0x0},        {0xFF000000, 0xFF0000, 0xFF00, 0x0},
      {0xFF000000, 0xFF00, 0xFF, 0x0},      {0xFF000000, 0xFF0000, 0xFF00, 0xFF},
      {0xFF, 0xFF00, 0xFF0000, 0xFF000000}, {0xFF0000, 0xFF00, 0xFF, 0xFF000000},
      {0xFF000000, 0xFF00, 0xFF, 0xFF0000}, {0x0, 0x0, 0x0, 0x0}};
  const int bits = b->bits;
  int ok = 0;
  if (bits == 32) {
    for (int i = 0; i < 8 && !ok; i++) ok = !memcmp(masks, k32[i], 4 * sizeof *masks);
    if (ok && masks[0] == 0) { /* all zero: Pillow reads BGRA */
      b->ch[3] = 3;
    } else if (ok) {
      for (int c = 0; c < 4; c++) {
        b->ch[c] = -1;
        for (int byte = 0; byte < 4 && masks[c]; byte++)
          if (masks[c] == 0xFFu << (8 * byte)) b->ch[c] = byte;
      }
    }
  } else if (bits == 24) {
    ok = masks[0] == 0xFF0000 && masks[1] == 0xFF00 && masks[2] == 0xFF;
  } else if (bits == 16) {
    if (masks[0] == 0xF800 && masks[1] == 0x7E0 && masks[2] == 0x1F)
      ok = 1, b->kind = '6';
    else
      ok = masks[0] == 0x7C00 && masks[1] == 0x3E0 && masks[2] == 0x1F;
  }
  if (!ok)
    return mml_err_set(err, MML_EUNSUPPORTED,
                       "BMP: unsupported bit fields layout (%d-bit, masks %x %x %x %x)", bits,
                       masks[0], masks[1], masks[2], masks[3]);
  return MML_OK;
}

/* The palette at *pos (moved past it), and Pillow's gray test (kind 'L'). */
static mml_status parse_palette(const uint8_t *p, size_t len, bmp *b, size_t *pos, mml_err *err) {
  const int bits = b->bits;
  if (b->colors == 0 || b->colors > 65536)
    return mml_err_set(err, MML_EUNSUPPORTED, "BMP: unsupported palette size (%u)", b->colors);
  if (len < *pos + (size_t)b->pad * b->colors)
    return mml_err_set(err, MML_EDECODE, "BMP: truncated palette");
  b->palette = p + *pos;
  *pos += (size_t)b->pad * b->colors;
  /* Pillow's gray test: entry i is (i, i, i), or (0,0,0), (255,255,255) for 2 colours */
  int gray = 1;
  for (uint32_t i = 0; i < b->colors && gray; i++) {
    uint32_t v = b->colors == 2 ? (i ? 255 : 0) : i;
    const uint8_t *e = b->palette + (size_t)i * b->pad;
    gray = v <= 255 && e[0] == v && e[1] == v && e[2] == v;
  }
  int rle = b->compression != BMP_RAW;
  if (gray) {
    if (b->colors <= 2 ? (bits != 1 || rle) : (bits != 8 && !rle))
      return mml_err_set(err, MML_EUNSUPPORTED,
                         "BMP: %d-bit%s pixels with a %u-entry gray palette (read as another "
                         "depth by Pillow)",
                         bits, rle ? " RLE" : "", b->colors);
    b->kind = 'L';
  }
  return MML_OK;
}

static mml_status parse(const uint8_t *p, size_t len, bmp *b, mml_err *err) {
  memset(b, 0, sizeof *b);
  size_t pos = 0; /* where Pillow's file pointer is after the header */
  uint32_t masks[4] = {0, 0, 0, 0};
  mml_status st = parse_header(p, len, b, masks, &pos, err);
  if (st != MML_OK) return st;
  const uint32_t hs = b->hs;
  int bits = b->bits;
  if (!b->colors) b->colors = bits < 32 ? 1u << bits : 0;
  b->offset = mml_le32(p + 10);
  if (b->offset == 14 + hs && bits <= 8) b->offset += (size_t)b->pad * b->colors;
  if (bits != 1 && bits != 4 && bits != 8 && bits != 16 && bits != 24 && bits != 32) /* Pillow's */
    return mml_err_set(err, MML_EUNSUPPORTED, "BMP: unsupported pixel depth (%d)", bits);
  b->kind = bits <= 8 ? 'P' : bits == 16 ? '5' : bits == 24 ? '3' : '4';
  b->ch[0] = 2, b->ch[1] = 1, b->ch[2] = 0, b->ch[3] = -1; /* BGRX */
  if (b->compression == BMP_BITFIELDS) {
    if ((st = parse_bitfields(b, masks, err)) != MML_OK) return st;
  } else if (b->compression == BMP_RLE8 || b->compression == BMP_RLE4) {
    if (bits > 8)
      return mml_err_set(err, MML_EUNSUPPORTED, "BMP: RLE compression of %d-bit pixels", bits);
  } else if (b->compression != BMP_RAW) {
    return mml_err_set(err, MML_EUNSUPPORTED, "BMP: unsupported compression (%d)", b->compression);
  }
  if (b->kind == 'P' && (st = parse_palette(p, len, b, &pos, err)) != MML_OK) return st;
  if (!b->offset) b->offset = pos;
  return MML_OK;
}

mml_status mml_bmp_probe(const uint8_t *p, size_t len, mml_image_info *info, mml_err *err) {
  bmp b;
  mml_status st = parse(p, len, &b, err);
  if (st != MML_OK) return st;
  info->width = (int)b.w;
  info->height = (int)b.h;
  info->format = MML_FMT_BMP;
  if (b.compression == BMP_RLE8 || b.compression == BMP_RLE4) /* indices decoded into `whole` */
    info->scratch = mml_round_2mib((int64_t)info->width * info->height);
  return MML_OK;
}

/* Pillow's BmpRleDecoder, step by step (indices, one byte per pixel, in file row order). */
static mml_status rle_decode(const uint8_t *p, size_t len, const bmp *b, uint8_t *out,
                             mml_err *err) {
  const size_t xs = (size_t)b->w, dest = xs * (size_t)b->h;
  const int rle4 = b->compression == BMP_RLE4;
  size_t n = 0, x = 0, i = b->offset;
  while (n < dest) {
    if (i + 2 > len) break;
    unsigned num = p[i], byte = p[i + 1];
    i += 2;
    if (num) { /* encoded run */
      if (x + num > xs) num = x < xs ? (unsigned)(xs - x) : 0;
      for (unsigned k = 0; k < num && n < dest; k++)
        out[n++] = rle4 ? (k % 2 ? byte & 15 : byte >> 4) : (uint8_t)byte;
      x += num;
    } else if (byte == 0) { /* end of line */
      while (n % xs) out[n++] = 0;
      x = 0;
    } else if (byte == 1) { /* end of bitmap */
      break;
    } else if (byte == 2) { /* delta */
      if (i + 2 > len) break;
      size_t skip = (size_t)p[i] + (size_t)p[i + 1] * xs;
      i += 2;
      if (skip > dest - n) skip = dest - n;
      memset(out + n, 0, skip);
      n += skip;
      x = n % xs;
    } else { /* absolute run of `byte` pixels */
      size_t cnt = dest - n < byte ? dest - n : byte;
      size_t nbytes = rle4 ? (cnt + 1) / 2 : cnt, got = len - i < nbytes ? len - i : nbytes;
      for (size_t k = 0; k < got; k++) {
        if (rle4) {
          out[n++] = p[i + k] >> 4;
          if (k * 2 + 1 < cnt) out[n++] = p[i + k] & 15;
        } else {
          out[n++] = p[i + k];
        }
      }
      i += got;
      if (got < nbytes || n == dest) break;
      x += byte;
      if (i % 2) i++; /* word alignment, by file position as Pillow's fd.tell() */
    }
  }
  if (n < dest)
    return mml_err_set(err, MML_EDECODE, "BMP: RLE data ends after %zu of %zu pixels", n, dest);
  return MML_OK;
}

mml_status mml_bmp_decode(const uint8_t *p, size_t len, mml_img_bufs *bufs,
                          const mml_row_sink *sink, mml_err *err) {
  bmp b;
  mml_status st = parse(p, len, &b, err);
  if (st != MML_OK) return st;
  const int w = (int)b.w, h = (int)b.h,
            rle = b.compression == BMP_RLE8 || b.compression == BMP_RLE4;
  uint8_t lut[256][3];
  memset(lut, 0, sizeof lut);
  for (int i = 0; i < 256; i++) {
    if (b.kind == 'L') {
      lut[i][0] = lut[i][1] = lut[i][2] = b.colors <= 2 ? (i ? 255 : 0) : (uint8_t)i;
    } else if (b.kind == 'P' && (uint32_t)i < b.colors) {
      const uint8_t *e = b.palette + (size_t)i * b.pad;
      lut[i][0] = e[2], lut[i][1] = e[1], lut[i][2] = e[0];
    }
  }
  size_t stride = (((size_t)w * b.bits + 31) >> 3) & ~(size_t)3;
  size_t rowbytes = ((size_t)w * b.bits + 7) / 8;
  const uint8_t *base;
  if (rle) {
    if ((size_t)h > SIZE_MAX / (size_t)w || mml_bytes_reserve(bufs->whole, (size_t)w * h))
      return mml_err_set(err, MML_ENOMEM, "BMP: out of memory for a %dx%d image", w, h);
    if ((st = rle_decode(p, len, &b, bufs->whole->data, err)) != MML_OK) return st;
    base = bufs->whole->data;
    stride = rowbytes = (size_t)w;
  } else {
    /* Pillow needs every row but not the padding after the last one in the file */
    const size_t avail = b.offset <= len ? len - b.offset : 0;
    if (avail < rowbytes || (size_t)(h - 1) > (avail - rowbytes) / stride)
      return mml_err_set(err, MML_EDECODE,
                         "BMP: truncated pixel data (%zu bytes for %d rows of %zu)", avail, h,
                         stride);
    base = p + b.offset;
  }
  if (mml_bytes_reserve(bufs->row, (size_t)w * 4))
    return mml_err_set(err, MML_ENOMEM, "BMP: out of memory for a %d-pixel row", w);
  if ((st = sink->begin(sink->ctx, w, h, err)) != MML_OK) return st;
  const int bits = rle ? 8 : b.bits;
  for (int y = 0; y < h; y++) {
    const uint8_t *s = base + (size_t)(b.top_down ? y : h - 1 - y) * stride;
    uint8_t *o = bufs->row->data;
    if (b.kind == 'P' || b.kind == 'L') {
      const int per = 8 / bits, mask = (1 << bits) - 1;
      for (int x = 0; x < w; x++, o += 3) {
        int idx = bits == 8 ? s[x] : s[x / per] >> (8 - bits * (x % per + 1)) & mask;
        memcpy(o, lut[idx], 3);
      }
    } else if (b.kind == '5' || b.kind == '6') {
      for (int x = 0; x < w; x++, o += 3) {
        unsigned v = mml_le16(s + 2 * x);
        o[2] = (uint8_t)((v & 31) * 255 / 31);
        if (b.kind == '5') {
          o[1] = (uint8_t)((v >> 5 & 31) * 255 / 31);
          o[0] = (uint8_t)((v >> 10 & 31) * 255 / 31);
        } else {
          o[1] = (uint8_t)((v >> 5 & 63) * 255 / 63);
          o[0] = (uint8_t)((v >> 11 & 31) * 255 / 31);
        }
      }
    } else if (b.kind == '3') {
      for (int x = 0; x < w; x++, o += 3, s += 3) o[0] = s[2], o[1] = s[1], o[2] = s[0];
    } else {
      const int r = b.ch[0], g = b.ch[1], bl = b.ch[2], a = b.ch[3];
      for (int x = 0; x < w; x++, o += 3, s += 4) {
        if (a < 0) {
          o[0] = s[r], o[1] = s[g], o[2] = s[bl];
        } else {
          o[0] = mml_alpha_px(bufs->alpha, 1, s[r], s[a]); /* Pillow's mode RGBA */
          o[1] = mml_alpha_px(bufs->alpha, 1, s[g], s[a]);
          o[2] = mml_alpha_px(bufs->alpha, 1, s[bl], s[a]);
        }
      }
    }
    if ((st = sink->row(sink->ctx, y, bufs->row->data, err)) != MML_OK) return st;
  }
  return MML_OK;
}
