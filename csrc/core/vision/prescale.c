/*
 * prescale.c — LLaMA-Factory's image pre-resize (recipe="llama-factory"): the Pillow
 * resizes its mm_plugin runs on each image before the processor (LLaMA-Factory 0.9.5,
 * data/mm_plugin.py: BasePlugin._preprocess_image, then Qwen2VLPlugin._preprocess_image),
 * reproduced bit for bit:
 *
 *   1. image_max_pixels / image_min_pixels: f = sqrt(cap / (w*h)) in doubles (Python's int
 *      true division is correctly rounded, as the double division of these exact values
 *      is), each side int(side * f) (truncation); image.resize((w', h')) with no
 *      resample argument: Pillow's default BICUBIC for modes other than "1" and "P";
 *   2. the image is then convert("RGB")'d (alpha dropped: the decoder's MML_ALPHA_DROP),
 *      and Qwen2VLPlugin resizes a side under 28 up to 28 and a ratio over 200 to 180;
 *   3. Pillow's bicubic resample of 8-bit images is the one vision.c runs for the
 *      processor (resize.c, checked byte for byte against Pillow), with the horizontal
 *      pass first as Pillow 11 (LLaMA-Factory's pin) always does; a step whose size is
 *      the image's own is Pillow's copy (no step);
 *   4. step 1 runs on the image in the mode Pillow opened it in.  Bicubic works per
 *      channel, so an "L" image resized and then made RGB equals the RGB decode resized;
 *      other modes differ ("P" and "1" resize NEAREST, "RGBA"/"LA" premultiply alpha,
 *      "CMYK" converts after, "I;16" keeps 16 bits), so an image in one of them that step
 *      1 would resize is refused (MML_EUNSUPPORTED naming the mode), never approximated;
 *      the mode is read from the header as Pillow sets it (JPEG components, PNG colour
 *      type and depth, WebP alpha flag); GIF, BMP and TIFF files are refused there too;
 *   5. the processor's resize (smart_resize of the pre-resized size, planned by
 *      vision.c's mml_vision_plan_size) then runs on the result as on any decoded image.
 *
 * Memory: the image is decoded whole (decoder scratch), each step writes into one of two
 * scratch buffers; plan->scratch counts them (vision.c).  Cancellation is checked between
 * steps.  Threads: the scratch is the caller's thread's; the functions are reentrant.
 */
#include <math.h>
#include <string.h>

#include "vision_int.h"

mml_status mml_lf_pre_sizes(int width, int height, int64_t max_pixels, int64_t min_pixels, int *n,
                            int *n_cap, int *ws, int *hs, int *out_w, int *out_h, mml_err *err) {
  int64_t w = width, h = height;
  int k = 0;
  *n = *n_cap = 0;
  for (int cap = 0; cap < 2; cap++) { /* 1. */
    const int64_t px = cap == 0 ? max_pixels : min_pixels;
    if (px <= 0 || (cap == 0 ? w * h <= px : w * h >= px)) continue;
    const double f = sqrt((double)px / (double)(w * h));
    const int64_t nw = (int64_t)((double)w * f), nh = (int64_t)((double)h * f);
    if (nw < 1 || nh < 1 || nw > (1 << 30) || nh > (1 << 30))
      return mml_err_set(err, MML_EINVAL,
                         "recipe=\"llama-factory\": its image_%s_pixels resize takes the %lldx%lld "
                         "image to %lldx%lld (Pillow refuses an empty side)",
                         cap ? "min" : "max", (long long)w, (long long)h, (long long)nw,
                         (long long)nh);
    if (nw != w || nh != h) ws[k] = (int)nw, hs[k] = (int)nh, k++;
    w = nw, h = nh;
  }
  *n_cap = k;
  if (w < 28 || h < 28) { /* 2. */
    w = w < 28 ? 28 : w, h = h < 28 ? 28 : h;
    ws[k] = (int)w, hs[k] = (int)h, k++;
  }
  if (w > 200 * h) {
    w = h * 180;
    ws[k] = (int)w, hs[k] = (int)h, k++;
  }
  if (h > 200 * w) {
    h = w * 180;
    ws[k] = (int)w, hs[k] = (int)h, k++;
  }
  *n = k;
  *out_w = (int)w, *out_h = (int)h;
  return MML_OK;
}

/* Pillow's mode for the image (4.): its name, and 1 when bicubic on the RGB decode is
 * what Pillow's resize in that mode gives (RGB, L). */
static int jpeg_components(const uint8_t *d, size_t len) {
  size_t i = 2;
  while (i + 4 <= len) {
    if (d[i] != 0xFF) return 0;
    const uint8_t m = d[i + 1];
    if (m == 0xFF) { /* fill byte */
      i++;
      continue;
    }
    if (m == 0xD8 || (m >= 0xD0 && m <= 0xD7) || m == 0x01) {
      i += 2;
      continue;
    }
    if (m == 0xDA || m == 0xD9) return 0; /* scan before any frame header */
    const size_t seg = ((size_t)d[i + 2] << 8) | d[i + 3];
    if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC)
      return i + 9 < len ? d[i + 9] : 0;
    if (seg < 2) return 0;
    i += 2 + seg;
  }
  return 0;
}

static const char *pil_mode(const uint8_t *d, size_t len, mml_image_format f, int *same) {
  *same = 0;
  if (f == MML_FMT_JPEG) {
    const int nc = jpeg_components(d, len);
    *same = nc == 1 || nc == 3;
    return nc == 1 ? "L" : nc == 3 ? "RGB" : nc == 4 ? "CMYK" : "unknown JPEG";
  }
  if (f == MML_FMT_PNG && len > 25 && !memcmp(d + 12, "IHDR", 4)) {
    const int depth = d[24], ct = d[25];
    if (ct == 0 && depth == 1) return "1";
    if (ct == 0) {
      *same = depth <= 8;
      return depth <= 8 ? "L" : "I;16";
    }
    *same = ct == 2;
    return ct == 2 ? "RGB" : ct == 3 ? "P" : ct == 4 ? "LA" : ct == 6 ? "RGBA" : "unknown PNG";
  }
  if (f == MML_FMT_WEBP && len > 24) {
    int alpha = 1;
    if (!memcmp(d + 12, "VP8 ", 4)) alpha = 0;
    if (!memcmp(d + 12, "VP8L", 4)) alpha = (d[24] >> 4) & 1; /* bit 28 after the 0x2f */
    if (!memcmp(d + 12, "VP8X", 4)) alpha = (d[20] >> 4) & 1;
    *same = !alpha;
    return alpha ? "RGBA" : "RGB";
  }
  return mml_image_format_name(f);
}

mml_status mml_lf_check_mode(const uint8_t *data, size_t len, int resized, const char *what,
                             mml_err *err) {
  int same;
  mml_image_info info;
  mml_status st = mml_image_probe(data, len, &info, err);
  if (st != MML_OK) return st;
  const char *mode = pil_mode(data, len, info.format, &same);
  /* step 1 resizes in Pillow's mode; later steps run on the RGB image */
  if (resized && !same)
    return mml_err_set(err, MML_EUNSUPPORTED,
                       "recipe=\"llama-factory\": a %dx%d %s Pillow opens in mode %s: "
                       "LLaMA-Factory's %s_max_pixels/%s_min_pixels resize in that mode "
                       "is not reproduced",
                       info.width, info.height, what, mode, *what == 'i' ? "image" : "video",
                       *what == 'i' ? "image" : "video");
  return MML_OK;
}

mml_status mml_lf_process(const mml_vision_cfg *cfg, mml_vision_scratch *s, const uint8_t *data,
                          size_t len, const mml_vision_plan *plan, const mml_pixel_dst *dst,
                          mml_err *err) {
  mml_status st = mml_lf_check_mode(data, len, plan->pre_cap > 0, "image", err);
  if (st != MML_OK) return st;
  mml_rgb8 img;
  st = mml_image_decode(s->dec, data, len, 1, &img, err);
  if (st != MML_OK) return st;
  if (img.width != plan->src_w || img.height != plan->src_h)
    return mml_err_set(err, MML_EDECODE, "image decoded to %dx%d, its header says %dx%d", img.width,
                       img.height, plan->src_w, plan->src_h);
  mml_bytes *buf[2] = {&s->turned, &s->pre};
  for (int i = 0; i < plan->pre_n; i++) {
    if (mml_cancelled(cfg->cancel))
      return mml_err_set(err, MML_ECANCELLED, "cancelled during an image's pre-resize");
    const int w = plan->pre_w[i], h = plan->pre_h[i];
    mml_bytes *b = buf[i & 1];
    if (mml_bytes_reserve(b, (size_t)w * h * 3 + MML_ROW_SLACK))
      return mml_err_set(err, MML_ENOMEM, "vision: out of memory for a %dx%d image", w, h);
    if ((st = mml_resize_bicubic_rgb8_order(s, &img, w, h, 1, b->data, err)) != MML_OK) return st;
    img = (mml_rgb8){b->data, w, h, (size_t)w * 3};
  }
  mml_vision_plan p = *plan;
  p.src_w = img.width, p.src_h = img.height, p.pre_n = 0;
  return mml_vision_process_rgb_dst(cfg, s, &img, &p, dst, err);
}
