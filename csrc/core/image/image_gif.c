/*
 * image_gif.c — GIF (87a/89a) through giflib: the first frame, as Pillow's Image.open
 * gives it (frame 0 in mode P, or L without a colour table):
 *   - the image is the logical screen, grown to the first frame's extent when the frame
 *     reaches past it;
 *   - the canvas starts filled with the transparency index (when a graphic control
 *     extension before the frame sets one) or with index 0, and the frame's pixels
 *     (de-interlaced) are written at its offset;
 *   - pixels go through the frame's local colour table, else the global one, else are
 *     gray levels; an index past the table's end reads as black (Pillow's palette is
 *     zero beyond its entries) — checked by the tests;
 *   - pixels equal to the transparency index are composited onto white (convert_to_rgb),
 *     i.e. become white; with the other alpha policies convert("RGB") keeps the index's
 *     colour as the image's transparency, which the processor then whitens wherever it
 *     occurs: before any resize (load_image), or after qwen-vl-utils' resize (reported
 *     as a colour key).
 * Later frames are never decoded (no work or memory for long animations).
 *
 * Threads: reentrant (giflib keeps its state in the GifFileType).  Memory: the index
 * canvas lives in `whole`; giflib allocates its own small state per image.
 */
#include <string.h>

#include <gif_lib.h>

#include "image_fmt.h"

/* ---------------------------------------------------------------- probe */

mml_status mml_gif_probe(const uint8_t *p, size_t len, mml_image_info *info, mml_err *err) {
  if (len < 13) return mml_err_set(err, MML_EDECODE, "GIF: truncated header");
  uint32_t w = mml_le16(p + 6), h = mml_le16(p + 8);
  size_t i = 13;
  if (p[10] & 0x80) i += (size_t)3 << ((p[10] & 7) + 1);
  for (;;) {
    if (i >= len) return mml_err_set(err, MML_EDECODE, "GIF: truncated before the first image");
    uint8_t b = p[i++];
    if (b == 0x2C) { /* image descriptor */
      if (i + 8 > len) return mml_err_set(err, MML_EDECODE, "GIF: truncated image descriptor");
      uint32_t x1 = (uint32_t)mml_le16(p + i) + mml_le16(p + i + 4);
      uint32_t y1 = (uint32_t)mml_le16(p + i + 2) + mml_le16(p + i + 6);
      if (x1 > w) w = x1;
      if (y1 > h) h = y1;
      break;
    }
    if (b == 0x21) { /* extension: label, then sub-blocks up to a zero length */
      i++;
      while (i < len && p[i]) i += (size_t)p[i] + 1;
      i++;
      continue;
    }
    if (b == 0x3B) return mml_err_set(err, MML_EDECODE, "GIF: no image before the trailer");
    return mml_err_set(err, MML_EDECODE, "GIF: bad block 0x%02x at byte %zu", b, i - 1);
  }
  if (w == 0 || h == 0) return mml_err_set(err, MML_EDECODE, "GIF: bad size %ux%u", w, h);
  info->width = (int)w;
  info->height = (int)h;
  info->format = MML_FMT_GIF;
  info->scratch = mml_round_2mib((int64_t)info->width * info->height); /* the canvas */
  return MML_OK;
}

/* ---------------------------------------------------------------- decode */

struct gif_src {
  const uint8_t *p;
  size_t len, off;
};

static int gif_read(GifFileType *g, GifByteType *buf, int n) {
  struct gif_src *s = g->UserData;
  size_t k = n < 0 ? 0 : (size_t)n;
  if (k > s->len - s->off) k = s->len - s->off;
  memcpy(buf, s->p + s->off, k);
  s->off += k;
  return (int)k;
}

static mml_status gif_fail(GifFileType *g, mml_err *err, const char *what) {
  int e = g ? g->Error : 0;
  const char *why = GifErrorString(e);
  return mml_err_set(err, MML_EDECODE, "GIF: %s (%s)", what, why ? why : "unknown error");
}

/* Reads the blocks up to the first image descriptor; *trans: the transparent index of a
 * graphics control extension before it, -1 when none. */
static mml_status gif_first_image(GifFileType *g, int *trans, mml_err *err) {
  *trans = -1;
  for (;;) {
    GifRecordType rt;
    if (DGifGetRecordType(g, &rt) == GIF_ERROR)
      return gif_fail(g, err, "bad block before the first image");
    if (rt == IMAGE_DESC_RECORD_TYPE) break;
    if (rt == TERMINATE_RECORD_TYPE)
      return mml_err_set(err, MML_EDECODE, "GIF: no image before the trailer");
    if (rt != EXTENSION_RECORD_TYPE) continue;
    int code;
    GifByteType *ext;
    if (DGifGetExtension(g, &code, &ext) == GIF_ERROR)
      return gif_fail(g, err, "bad extension block");
    /* ext[0] is the sub-block's length; Pillow reads flags and index from the first one */
    if (code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4 && (ext[1] & 1)) *trans = ext[4];
    while (ext)
      if (DGifGetExtensionNext(g, &ext) == GIF_ERROR)
        return gif_fail(g, err, "bad extension block");
  }
  if (DGifGetImageDesc(g) == GIF_ERROR) return gif_fail(g, err, "bad image descriptor");
  return MML_OK;
}

/* The palette as RGB per index, with the transparency policy applied (or, for
 * qwen-vl-utils, the colour key left to the caller). */
static void gif_palette(const GifFileType *g, int trans, mml_img_bufs *b, uint8_t lut[256][3]) {
  const GifImageDesc *id = &g->Image;
  const ColorMapObject *cm = id->ColorMap ? id->ColorMap : g->SColorMap;
  memset(lut, 0, 256 * 3);
  for (int i = 0; i < 256; i++) {
    if (!cm) {
      lut[i][0] = lut[i][1] = lut[i][2] = (uint8_t)i;
    } else if (i < cm->ColorCount) {
      lut[i][0] = cm->Colors[i].Red;
      lut[i][1] = cm->Colors[i].Green;
      lut[i][2] = cm->Colors[i].Blue;
    }
  }
  if (trans >= 0 && b->alpha == MML_ALPHA_COMPOSITE) {
    memset(lut[trans], 255, 3);
  } else if (trans >= 0) { /* convert("RGB") keeps the index's colour as info["transparency"] */
    uint8_t k[3];
    memcpy(k, lut[trans], 3);
    if (b->alpha == MML_ALPHA_DROP) { /* load_image: the processor whitens it before resizing */
      for (int i = 0; i < 256; i++)
        if (!memcmp(lut[i], k, 3)) memset(lut[i], 255, 3);
    } else { /* qwen-vl-utils: after its resize (the caller does it) */
      *b->key = 1;
      memcpy(b->kc, k, 3);
    }
  }
}

mml_status mml_gif_decode(const uint8_t *p, size_t len, mml_img_bufs *b, const mml_row_sink *sink,
                          mml_err *err) {
  mml_image_info info;
  mml_status st = mml_gif_probe(p, len, &info, err);
  if (st != MML_OK) return st;
  struct gif_src src = {p, len, 0};
  int gerr = 0;
  GifFileType *g = DGifOpen(&src, gif_read, &gerr);
  if (!g) {
    const char *why = GifErrorString(gerr);
    return mml_err_set(err, MML_EDECODE, "GIF: cannot open (%s)", why ? why : "unknown error");
  }
  int trans = -1;
  if ((st = gif_first_image(g, &trans, err)) != MML_OK) goto done;
  const GifImageDesc *id = &g->Image;
  const int W = info.width, H = info.height;
  const int fx = id->Left, fy = id->Top, fw = id->Width, fh = id->Height;
  if (fw < 0 || fh < 0 || fx + fw > W || fy + fh > H) { /* the probe saw another header */
    st = mml_err_set(err, MML_EDECODE, "GIF: image descriptor differs from the header");
    goto done;
  }
  if ((size_t)H > SIZE_MAX / (size_t)W || mml_bytes_reserve(b->whole, (size_t)W * H) ||
      mml_bytes_reserve(b->row, (size_t)W * 3)) {
    st = mml_err_set(err, MML_ENOMEM, "GIF: out of memory for a %dx%d image", W, H);
    goto done;
  }
  uint8_t *canvas = b->whole->data;
  memset(canvas, trans >= 0 ? trans : 0, (size_t)W * H);
  static const int off[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
  const int passes = id->Interlace ? 4 : 1;
  for (int pass = 0; pass < passes && fw > 0; pass++) {
    for (int y = id->Interlace ? off[pass] : 0; y < fh; y += id->Interlace ? step[pass] : 1) {
      if (mml_cancelled(b->cancel)) {
        st = mml_err_set(err, MML_ECANCELLED, "GIF: decode cancelled");
        goto done;
      }
      if (DGifGetLine(g, canvas + (size_t)(fy + y) * W + fx, fw) == GIF_ERROR) {
        st = gif_fail(g, err, "corrupt or truncated image data");
        goto done;
      }
    }
  }
  uint8_t lut[256][3];
  gif_palette(g, trans, b, lut);
  if ((st = sink->begin(sink->ctx, W, H, err)) != MML_OK) goto done;
  for (int y = 0; y < H; y++) {
    const uint8_t *s = canvas + (size_t)y * W;
    uint8_t *o = b->row->data;
    for (int x = 0; x < W; x++, o += 3) memcpy(o, lut[s[x]], 3);
    if ((st = sink->row(sink->ctx, y, b->row->data, err)) != MML_OK) goto done;
  }
done:
  DGifCloseFile(g, &gerr);
  return st;
}
