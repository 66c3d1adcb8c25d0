/* fuzz-resize.c — smart_resize on arbitrary sizes and limits (overflow, aspect ratio,
 * rounding), then, for small results, the Pillow-exact bicubic resize in both pass orders
 * and the whole vision path from RGB (normalise + patchify) on a generated image. */
#include "fuzz.h"
#include "mml/vision.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static mml_vision_scratch *s;
  if (!s && mml_vision_scratch_new(&s)) abort();
  fuzz_in in = {data, size};
  int h = (int)(int32_t)fuzz_u64(&in, 4), w = (int)(int32_t)fuzz_u64(&in, 4);
  int factor = (int)(int32_t)fuzz_u64(&in, 2);
  int64_t minp = (int64_t)fuzz_u64(&in, 8), maxp = (int64_t)fuzz_u64(&in, 8);
  int legacy = (int)fuzz_u64(&in, 1) & 1;
  int oh = 0, ow = 0;
  mml_err e = {0};
  if (mml_smart_resize(h, w, factor, minp, maxp, legacy, &oh, &ow, &e) != MML_OK) {
    fuzz_check_msg(&e);
  } else if (oh < 1 || ow < 1 || (factor > 0 && (oh % factor || ow % factor))) {
    abort();
  }
  /* a small real resize: source and target sizes from the input, pixels from the rest */
  int sw = 1 + (int)fuzz_u64(&in, 1) % 96, sh = 1 + (int)fuzz_u64(&in, 1) % 96;
  int dw = 1 + (int)fuzz_u64(&in, 1) % 128, dh = 1 + (int)fuzz_u64(&in, 1) % 128;
  int order = (int)fuzz_u64(&in, 1) & 1;
  size_t n = (size_t)sw * sh * 3;
  uint8_t *src = malloc(n), *dst = malloc((size_t)dw * dh * 3);
  if (!src || !dst) abort();
  for (size_t i = 0; i < n; i++) src[i] = in.n ? in.p[i % in.n] : (uint8_t)i;
  mml_rgb8 img = {src, sw, sh, (size_t)sw * 3};
  if (mml_resize_bicubic_rgb8_order(s, &img, dw, dh, order, dst, &e)) fuzz_check_msg(&e);
  mml_vision_cfg cfg;
  if (mml_vision_preset("qwen2.5-vl", &cfg, &e) == MML_OK) {
    cfg.min_pixels = 28 * 28;
    cfg.max_pixels = 28 * 28 * 16;
    mml_vision_plan plan;
    if (mml_vision_plan_size(&cfg, sw, sh, &plan, &e) == MML_OK) {
      float *out = malloc((size_t)plan.rows * plan.cols * sizeof *out);
      if (!out) abort();
      if (mml_vision_process_rgb(&cfg, s, &img, &plan, out, &e)) fuzz_check_msg(&e);
      free(out);
    } else {
      fuzz_check_msg(&e);
    }
  }
  free(src);
  free(dst);
  return 0;
}
