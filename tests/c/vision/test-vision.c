/*
 * test-vision.c — core tests of image probe/decode and Qwen-VL preprocessing: smart_resize
 * worked values (SPEC-QWEN.md), planning from headers, the decompression-bomb guard, bad
 * input (truncated, corrupt, empty), agreement of the streaming pipeline with a plain
 * reference (decode whole image, resize, normalise, patchify by the spec's formula), and
 * two threads with their own scratch sharing one config (run under TSan by the Makefile),
 * and the pixel formats (the image folder's JPEG coefficient memory: image/test-image.c).
 * Pixel parity with Pillow/transformers is tested from Python (tests/test_vision.py).
 */
#include <math.h>
#include <png.h>
#include <pthread.h>
#include <stdio.h>
#include <turbojpeg.h>

#include "mml/image.h"
#include "mml/vision.h"
#include "mml_fixture.h"
#include "mml_test.h"

/* A smooth test pattern with some texture, w x h RGB8. */
TEST(smart_resize_worked_values) {
  static const struct {
    int h, w, f;
    int64_t mn, mx;
    int eh, ew;
  } cases[] = {
      {1365, 2048, 28, 3136, 12845056, 1372, 2044},  {480, 640, 28, 3136, 12845056, 476, 644},
      {70, 70, 28, 3136, 12845056, 56, 56},          {100, 100, 28, 3136, 12845056, 112, 112},
      {28, 5000, 28, 3136, 12845056, 28, 5012},      {3000, 4000, 28, 3136, 12845056, 2996, 4004},
      {1365, 2048, 28, 3136, 1003520, 812, 1204},    {1080, 1920, 28, 3136, 1003520, 728, 1316},
      {1365, 2048, 32, 65536, 16777216, 1376, 2048}, {224, 224, 32, 65536, 16777216, 256, 256},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    mml_err err = {0};
    int h = 0, w = 0;
    CHECK_OK(mml_smart_resize(cases[i].h, cases[i].w, cases[i].f, cases[i].mn, cases[i].mx, 0, &h,
                              &w, &err),
             err);
    CHECK_EQ_INT(h, cases[i].eh);
    CHECK_EQ_INT(w, cases[i].ew);
  }
}

TEST(smart_resize_errors_and_legacy) {
  mml_err err = {0};
  int h, w;
  CHECK_EQ_INT(mml_smart_resize(10, 2011, 28, 3136, 12845056, 0, &h, &w, &err), MML_EASPECT);
  CHECK_EQ_INT(mml_smart_resize(10, 2000, 28, 3136, 12845056, 0, &h, &w, &err), MML_OK);
  /* legacy rejects sizes below the factor; the current one accepts them */
  CHECK_EQ_INT(mml_smart_resize(10, 2000, 28, 3136, 12845056, 1, &h, &w, &err), MML_EINVAL);
  CHECK_EQ_INT(mml_smart_resize(0, 10, 28, 3136, 12845056, 0, &h, &w, &err), MML_EINVAL);
  /* 28x5600 (200:1) squeezed under a tiny max: current clamps to the factor */
  CHECK_OK(mml_smart_resize(28, 5600, 28, 784, 28 * 28 * 10, 0, &h, &w, &err), err);
  CHECK_EQ_INT(h, 28);
  CHECK_EQ_INT(mml_smart_resize(28, 5600, 28, 784, 28 * 28 * 10, 1, &h, &w, &err), MML_EINVAL);
}

TEST(presets) {
  mml_vision_cfg cfg;
  mml_err err = {0};
  CHECK_OK(mml_vision_preset("qwen2.5-vl", &cfg, &err), err);
  CHECK_EQ_INT(cfg.patch_size, 14);
  CHECK_EQ_INT(cfg.max_pixels, 12845056);
  CHECK_OK(mml_vision_preset("qwen3-vl", &cfg, &err), err);
  CHECK_EQ_INT(cfg.patch_size, 16);
  CHECK_EQ_INT(cfg.min_pixels, 65536);
  CHECK_EQ_INT(mml_vision_preset("qwen9", &cfg, &err), MML_ECONFIG);
  CHECK_OK(mml_vision_preset("qwen2-vl", &cfg, &err), err);
  cfg.std[1] = 0;
  CHECK_EQ_INT(mml_vision_cfg_check(&cfg, &err), MML_ECONFIG);
}

TEST(probe_and_plan) {
  unsigned long len;
  unsigned char *jpg = mml_test_jpeg(2048, 1365, 0, &len);
  CHECK(jpg != NULL);
  mml_err err = {0};
  mml_image_info info;
  CHECK_OK(mml_image_probe(jpg, len, &info, &err), err);
  CHECK_EQ_INT(info.width, 2048);
  CHECK_EQ_INT(info.height, 1365);
  CHECK_EQ_INT(info.format, MML_FMT_JPEG);
  mml_vision_cfg cfg;
  mml_vision_preset("qwen2.5-vl", &cfg, &err);
  mml_vision_plan plan;
  CHECK_OK(mml_vision_plan_bytes(&cfg, jpg, len, &plan, &err), err);
  CHECK_EQ_INT(plan.dst_h, 1372);
  CHECK_EQ_INT(plan.dst_w, 2044);
  CHECK_EQ_INT(plan.grid_h, 98);
  CHECK_EQ_INT(plan.grid_w, 146);
  CHECK_EQ_INT(plan.rows, 98 * 146);
  CHECK_EQ_INT(plan.cols, 1176);
  CHECK_EQ_INT(plan.tokens, 98 * 146 / 4);
  CHECK_EQ_INT(plan.decode_scale, 1);
  /* decompression bomb: rejected from the header */
  cfg.max_image_pixels = 2048 * 1365 - 1;
  CHECK_EQ_INT(mml_vision_plan_bytes(&cfg, jpg, len, &plan, &err), MML_ETOOBIG);
  cfg.max_image_pixels = 0;
  cfg.max_pixels = 1003520;
  cfg.fast = 1;
  CHECK_OK(mml_vision_plan_bytes(&cfg, jpg, len, &plan, &err), err);
  CHECK_EQ_INT(plan.decode_scale, 1); /* 2048 -> 1204 is not a halving */
  cfg.max_pixels = 200000;            /* -> 364x532: 2048/532 < 4 */
  CHECK_OK(mml_vision_plan_bytes(&cfg, jpg, len, &plan, &err), err);
  CHECK_EQ_INT(plan.decode_scale, 2);
  cfg.max_pixels = 100000; /* -> 252x364 */
  CHECK_OK(mml_vision_plan_bytes(&cfg, jpg, len, &plan, &err), err);
  CHECK_EQ_INT(plan.decode_scale, 4);
  tjFree(jpg);
  static const uint8_t junk[] =
      "\0\0\0\x1c"
      "ftypavif";
  CHECK_EQ_INT(mml_image_probe(junk, sizeof junk, &info, &err), MML_EUNSUPPORTED);
  CHECK(strstr(err.msg, "looks like AVIF") && strstr(err.msg, "00 00 00 1c 66 74 79 70"));
  CHECK_EQ_INT(mml_image_probe(junk, 0, &info, &err), MML_EUNSUPPORTED);
  static const uint8_t gif_short[] = "GIF89a....";
  CHECK_EQ_INT(mml_image_probe(gif_short, sizeof gif_short, &info, &err), MML_EDECODE);
  static const uint8_t png_short[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0};
  CHECK_EQ_INT(mml_image_probe(png_short, sizeof png_short, &info, &err), MML_EDECODE);
}

/* Reference: the spec's formula applied to a fully decoded + resized image. */
static void reference_pixels(const mml_vision_cfg *cfg, const mml_vision_plan *plan,
                             const uint8_t *img, float *out) {
  const int P = cfg->patch_size, M = cfg->merge_size, T = cfg->temporal_patch_size;
  const int gh = plan->grid_h, gw = plan->grid_w;
  for (int bh = 0; bh < gh / M; bh++)
    for (int bw = 0; bw < gw / M; bw++)
      for (int mh = 0; mh < M; mh++)
        for (int mw = 0; mw < M; mw++) {
          int64_t row = ((int64_t)(bh * (gw / M) + bw)) * M * M + mh * M + mw;
          for (int c = 0; c < 3; c++)
            for (int t = 0; t < T; t++)
              for (int py = 0; py < P; py++)
                for (int px = 0; px < P; px++) {
                  int col = ((c * T + t) * P + py) * P + px;
                  int y = (bh * M + mh) * P + py, x = (bw * M + mw) * P + px;
                  uint8_t v = img[((size_t)y * plan->dst_w + x) * 3 + c];
                  float f = (float)((double)v * (1.0 / 255.0));
                  out[row * plan->cols + col] = (f - cfg->mean[c]) / cfg->std[c];
                }
        }
}

static void check_pipeline(int w, int h, int progressive, const char *preset, int64_t max_px) {
  unsigned long len;
  unsigned char *jpg = mml_test_jpeg(w, h, progressive, &len);
  CHECK(jpg != NULL);
  mml_err err = {0};
  mml_vision_cfg cfg;
  mml_vision_preset(preset, &cfg, &err);
  if (max_px) cfg.max_pixels = max_px;
  mml_vision_plan plan;
  CHECK_OK(mml_vision_plan_bytes(&cfg, jpg, len, &plan, &err), err);
  mml_vision_scratch *s = NULL;
  CHECK_OK(mml_vision_scratch_new(&s), err);
  size_t n = (size_t)plan.rows * plan.cols;
  float *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want);
  CHECK(mml_vision_scratch_decode_s(s) == 0.0);
  double t0 = mml_now();
  CHECK_OK(mml_vision_process_bytes(&cfg, s, jpg, len, &plan, got, &err), err);
  /* decode time is counted, and is a part of the call's time */
  double dec = mml_vision_scratch_decode_s(s);
  CHECK(dec > 0.0 && dec <= mml_now() - t0);
  /* reference path: whole-image decode, whole-image resize, formula */
  mml_decoder *d = NULL;
  mml_decoder_new(&d);
  mml_rgb8 img;
  CHECK_OK(mml_image_decode(d, jpg, len, 1, &img, &err), err);
  uint8_t *rs = malloc((size_t)plan.dst_w * plan.dst_h * 3);
  CHECK_OK(mml_resize_bicubic_rgb8(s, &img, plan.dst_w, plan.dst_h, rs, &err), err);
  reference_pixels(&cfg, &plan, rs, want);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += memcmp(&got[i], &want[i], sizeof(float)) != 0;
  CHECK_EQ_INT(bad, 0);
  /* the RGB entry point gives the same bytes */
  mml_vision_plan p2;
  CHECK_OK(mml_vision_plan_size(&cfg, img.width, img.height, &p2, &err), err);
  CHECK_OK(mml_vision_process_rgb(&cfg, s, &img, &p2, want, &err), err);
  CHECK(memcmp(got, want, n * sizeof *got) == 0);
  free(rs);
  free(got);
  free(want);
  mml_decoder_free(d);
  mml_vision_scratch_free(s);
  tjFree(jpg);
}

TEST(pipeline_matches_reference) {
  check_pipeline(640, 480, 0, "qwen2.5-vl", 0);         /* up in x, down in y */
  check_pipeline(300, 900, 1, "qwen2.5-vl", 0);         /* progressive; vertical pass first */
  check_pipeline(2048, 1365, 0, "qwen2.5-vl", 1003520); /* downscale both */
  check_pipeline(20, 30, 0, "qwen3-vl", 0);             /* below the factor: upscale */
  check_pipeline(1000, 7, 0, "qwen2-vl", 0);            /* 143:1 */
}

TEST(vision_bad_input) {
  unsigned long len;
  unsigned char *jpg = mml_test_jpeg(320, 240, 0, &len);
  mml_err err = {0};
  mml_vision_cfg cfg;
  mml_vision_preset("qwen2.5-vl", &cfg, &err);
  mml_vision_plan plan;
  CHECK_OK(mml_vision_plan_bytes(&cfg, jpg, len, &plan, &err), err);
  mml_vision_scratch *s = NULL;
  mml_vision_scratch_new(&s);
  float *out = malloc((size_t)plan.rows * plan.cols * sizeof *out);
  /* truncated: every cut must fail cleanly (or succeed when only trailing bytes are cut) */
  for (unsigned long cut = 0; cut < len; cut += len / 23 + 1) {
    mml_status st = mml_vision_process_bytes(&cfg, s, jpg, cut, &plan, out, &err);
    CHECK(st == MML_EDECODE || st == MML_EUNSUPPORTED || (cut + 2 >= len && st == MML_OK));
  }
  /* corrupt entropy data: no crash; either decodes (libjpeg resyncs) or fails */
  unsigned char *bad = malloc(len);
  memcpy(bad, jpg, len);
  for (unsigned long i = len / 2; i < len - 2; i += 7) bad[i] ^= 0x5a;
  mml_status st = mml_vision_process_bytes(&cfg, s, bad, len, &plan, out, &err);
  CHECK(st == MML_OK || st == MML_EDECODE);
  /* still works afterwards */
  CHECK_OK(mml_vision_process_bytes(&cfg, s, jpg, len, &plan, out, &err), err);
  /* a plan for another image is refused */
  plan.cols = 7;
  CHECK_EQ_INT(mml_vision_process_bytes(&cfg, s, jpg, len, &plan, out, &err), MML_EINVAL);
  free(bad);
  free(out);
  mml_vision_scratch_free(s);
  tjFree(jpg);
}

/* An RGBA (or gray, interlace-free) PNG written with libpng's simplified API. */
static uint8_t *make_png(int w, int h, int rgba, size_t *len) {
  uint8_t *rgb = mml_test_rgb(w, h, 9);
  uint8_t *px = malloc((size_t)w * h * 4);
  for (size_t i = 0; i < (size_t)w * h; i++) {
    memcpy(px + 4 * i, rgb + 3 * i, 3);
    px[4 * i + 3] = (uint8_t)(i * 37);
  }
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = (png_uint_32)w;
  img.height = (png_uint_32)h;
  img.format = rgba ? PNG_FORMAT_RGBA : PNG_FORMAT_GRAY;
  png_alloc_size_t n = 0;
  uint8_t *gray = malloc((size_t)w * h);
  for (size_t i = 0; i < (size_t)w * h; i++) gray[i] = px[4 * i + 1];
  const void *src = rgba ? (const void *)px : (const void *)gray;
  uint8_t *out = NULL;
  if (png_image_write_to_memory(&img, NULL, &n, 0, src, 0, NULL)) {
    out = malloc(n);
    if (!png_image_write_to_memory(&img, out, &n, 0, src, 0, NULL)) {
      free(out);
      out = NULL;
    }
  }
  *len = n;
  free(rgb);
  free(px);
  free(gray);
  return out;
}

/* Random corruption and truncation of JPEG and PNG data: every call returns a status (never
 * crashes or reads out of bounds — run under ASan by the Makefile). */
TEST(fuzz_corrupt_images) {
  mml_err err = {0};
  mml_vision_cfg cfg;
  mml_vision_preset("qwen2.5-vl", &cfg, &err);
  mml_vision_scratch *s = NULL;
  mml_vision_scratch_new(&s);
  unsigned long jlen;
  unsigned char *jpg = mml_test_jpeg(97, 61, 1, &jlen);
  size_t plen, glen;
  uint8_t *png = make_png(83, 45, 1, &plen), *gpng = make_png(40, 30, 0, &glen);
  CHECK(jpg && png && gpng);
  const uint8_t *srcs[3] = {jpg, png, gpng};
  size_t lens[3] = {jlen, plen, glen};
  uint32_t rng = 12345;
  int ok = 0, failed = 0;
  for (int iter = 0; iter < 600; iter++) {
    int which = iter % 3;
    size_t len = lens[which];
    uint8_t *buf = malloc(len);
    memcpy(buf, srcs[which], len);
    int flips = 1 + (iter / 3) % 8;
    for (int f = 0; f < flips; f++) {
      rng = rng * 1664525u + 1013904223u;
      size_t at = (rng >> 8) % len;
      rng = rng * 1664525u + 1013904223u;
      buf[at] ^= (uint8_t)(1u << ((rng >> 16) & 7));
    }
    rng = rng * 1664525u + 1013904223u;
    size_t cut = iter % 5 == 0 ? (rng >> 8) % len : len;
    mml_vision_plan plan;
    if (mml_vision_plan_bytes(&cfg, buf, cut, &plan, &err) == MML_OK && plan.rows < 100000) {
      float *out = malloc((size_t)plan.rows * plan.cols * sizeof *out);
      mml_status st = mml_vision_process_bytes(&cfg, s, buf, cut, &plan, out, &err);
      CHECK(st == MML_OK || st == MML_EDECODE || st == MML_EUNSUPPORTED);
      if (st == MML_OK)
        ok++;
      else
        failed++;
      free(out);
    } else {
      failed++;
    }
    free(buf);
  }
  CHECK(ok > 0 && failed > 0);
  /* the clean files still decode */
  for (int i = 0; i < 3; i++) {
    mml_vision_plan plan;
    CHECK_OK(mml_vision_plan_bytes(&cfg, srcs[i], lens[i], &plan, &err), err);
    float *out = malloc((size_t)plan.rows * plan.cols * sizeof *out);
    CHECK_OK(mml_vision_process_bytes(&cfg, s, srcs[i], lens[i], &plan, out, &err), err);
    free(out);
  }
  /* a header that claims 100000 x 100000 pixels is refused before any decoding */
  uint8_t bomb[64];
  memcpy(bomb, png, 33);
  bomb[16] = 0, bomb[17] = 1, bomb[18] = 0x86, bomb[19] = 0xA0; /* width 100000 */
  bomb[20] = 0, bomb[21] = 1, bomb[22] = 0x86, bomb[23] = 0xA0; /* height 100000 */
  mml_vision_plan plan;
  CHECK_EQ_INT(mml_vision_plan_bytes(&cfg, bomb, 33, &plan, &err), MML_ETOOBIG);
  tjFree(jpg);
  free(png);
  free(gpng);
  mml_vision_scratch_free(s);
}

struct worker {
  const mml_vision_cfg *cfg;
  const unsigned char *jpg;
  unsigned long len;
  const float *want;
  size_t n;
  int ok;
};

static void *worker_main(void *arg) {
  struct worker *w = arg;
  mml_vision_scratch *s = NULL;
  mml_err err = {0};
  if (mml_vision_scratch_new(&s) != MML_OK) return NULL;
  float *out = malloc(w->n * sizeof *out);
  w->ok = 1;
  for (int i = 0; i < 4; i++) {
    mml_vision_plan plan;
    if (mml_vision_plan_bytes(w->cfg, w->jpg, w->len, &plan, &err) ||
        mml_vision_process_bytes(w->cfg, s, w->jpg, w->len, &plan, out, &err) ||
        memcmp(out, w->want, w->n * sizeof *out))
      w->ok = 0;
  }
  free(out);
  mml_vision_scratch_free(s);
  return NULL;
}

TEST(threads_share_config) {
  unsigned long len;
  unsigned char *jpg = mml_test_jpeg(500, 333, 0, &len);
  mml_err err = {0};
  mml_vision_cfg cfg;
  mml_vision_preset("qwen2.5-vl", &cfg, &err);
  mml_vision_plan plan;
  CHECK_OK(mml_vision_plan_bytes(&cfg, jpg, len, &plan, &err), err);
  size_t n = (size_t)plan.rows * plan.cols;
  float *want = malloc(n * sizeof *want);
  mml_vision_scratch *s = NULL;
  mml_vision_scratch_new(&s);
  CHECK_OK(mml_vision_process_bytes(&cfg, s, jpg, len, &plan, want, &err), err);
  struct worker w[2] = {{&cfg, jpg, len, want, n, 0}, {&cfg, jpg, len, want, n, 0}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker_main, &w[i]);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  CHECK(w[0].ok && w[1].ok);
  free(want);
  mml_vision_scratch_free(s);
  tjFree(jpg);
}

/* The bfloat16 and uint8 writers against the float32 output, and the frame slots a video's
 * temporal patch is written through (mml_vision_process_rgb_dst). */
static uint16_t bf16_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

TEST(pixel_formats_and_frame_slots) {
  unsigned long len;
  unsigned char *jpg = mml_test_jpeg(203, 150, 0, &len);
  CHECK(jpg != NULL);
  mml_err err = {0};
  mml_vision_cfg cfg;
  mml_vision_preset("qwen2.5-vl", &cfg, &err);
  const int P = cfg.patch_size, T = cfg.temporal_patch_size, PP = P * P;
  mml_vision_plan plan;
  CHECK_OK(mml_vision_plan_bytes(&cfg, jpg, len, &plan, &err), err);
  mml_vision_scratch *s = NULL;
  CHECK_OK(mml_vision_scratch_new(&s), err);
  const size_t rows = (size_t)plan.rows, cols = (size_t)3 * T * PP;
  float *f = malloc(rows * cols * 4);
  CHECK_OK(mml_vision_process_bytes(&cfg, s, jpg, len, &plan, f, &err), err);
  mml_vision_cfg cb = cfg, cu = cfg;
  cb.pixel_format = MML_PIXEL_BFLOAT16;
  cu.pixel_format = MML_PIXEL_UINT8;
  CHECK_EQ_INT(mml_vision_row_bytes(&cb), cols * 2);
  CHECK_EQ_INT(mml_vision_row_bytes(&cu), 3 * PP);
  CHECK_EQ_INT(mml_vision_pixel_dtype(&cu), MML_DT_UINT8);
  mml_vision_plan pb, pu;
  CHECK_OK(mml_vision_plan_bytes(&cb, jpg, len, &pb, &err), err);
  CHECK_OK(mml_vision_plan_bytes(&cu, jpg, len, &pu, &err), err);
  CHECK_EQ_INT(pu.cols, 3 * PP);
  CHECK_EQ_INT(pu.rows, plan.rows);
  uint16_t *b = malloc(rows * cols * 2);
  uint8_t *u = malloc(rows * 3 * PP);
  CHECK_OK(mml_vision_process_bytes(&cb, s, jpg, len, &pb, b, &err), err);
  CHECK_OK(mml_vision_process_bytes(&cu, s, jpg, len, &pu, u, &err), err);
  size_t bad_b = 0, bad_u = 0;
  for (size_t r = 0; r < rows; r++)
    for (int c = 0; c < 3; c++)
      for (int t = 0; t < T; t++)
        for (int k = 0; k < PP; k++) {
          size_t i = r * cols + (size_t)(c * T + t) * PP + k;
          bad_b += b[i] != bf16_of(f[i]);
          float x = (float)((double)u[r * 3 * PP + (size_t)c * PP + k] * (1.0 / 255.0));
          float want = (x - cfg.mean[c]) / cfg.std[c];
          bad_u += memcmp(&want, &f[i], 4) != 0;
        }
  CHECK_EQ_INT(bad_b, 0);
  CHECK_EQ_INT(bad_u, 0);
  /* a plan made for another format is refused (its column count differs) */
  CHECK_EQ_INT(mml_vision_process_bytes(&cu, s, jpg, len, &plan, u, &err), MML_EINVAL);

  /* frame slots: frame 1 of T written alone leaves slot 0 of every row as it was */
  mml_decoder *d = NULL;
  mml_decoder_new(&d);
  mml_rgb8 img;
  CHECK_OK(mml_image_decode(d, jpg, len, 1, &img, &err), err);
  mml_vision_plan pr;
  CHECK_OK(mml_vision_plan_size(&cfg, img.width, img.height, &pr, &err), err);
  float *v = malloc(rows * cols * 4);
  memset(v, 0xA5, rows * cols * 4);
  mml_pixel_dst dst = {v, T, 1, 1};
  CHECK_OK(mml_vision_process_rgb_dst(&cfg, s, &img, &pr, &dst, &err), err);
  uint8_t *vu = malloc(rows * 3 * T * PP);
  memset(vu, 0xA5, rows * 3 * T * PP);
  mml_pixel_dst du = {vu, T, 0, 1};
  CHECK_OK(mml_vision_process_rgb_dst(&cu, s, &img, &pr, &du, &err), err);
  size_t bad_slot = 0, kept = 0;
  for (size_t r = 0; r < rows; r++)
    for (int c = 0; c < 3; c++)
      for (int k = 0; k < PP; k++) {
        size_t i0 = r * cols + (size_t)(c * T) * PP + k, i1 = i0 + PP;
        bad_slot += memcmp(&v[i1], &f[i1], 4) != 0;
        bad_slot += vu[i0] != u[r * 3 * PP + (size_t)c * PP + k];
        kept += ((const uint8_t *)&v[i0])[0] == 0xA5 && vu[i1] == 0xA5;
      }
  CHECK_EQ_INT(bad_slot, 0);
  CHECK_EQ_INT(kept, rows * 3 * PP);
  mml_pixel_dst wrong = {v, T, 1, 2};
  CHECK_EQ_INT(mml_vision_process_rgb_dst(&cfg, s, &img, &pr, &wrong, &err), MML_EINVAL);
  mml_decoder_free(d);
  free(v);
  free(vu);
  free(f);
  free(b);
  free(u);
  tjFree(jpg);
  mml_vision_scratch_free(s);
}

/* mml_pixels_expand against the writers and a scalar reference: an image's uint8 rows
 * expand to exactly the float32 / bfloat16 rows the float formats write for it (the AVX2
 * path where it runs, into aligned rows: streamed, and into misaligned ones), and random
 * rows of other shapes (P*P under 8: portable; not a multiple of 8: the overlapping last
 * group; frames == T: rows keeping their frames) to table[c][byte] in every slot. */
static void expand_reference(const uint8_t *u, int64_t rows, int P, int F, int T,
                             const float tab[3][256], int bf16, uint8_t *out) {
  const size_t PP = (size_t)P * P, esz = bf16 ? 2 : 4;
  for (int64_t r = 0; r < rows; r++)
    for (int c = 0; c < 3; c++)
      for (int t = 0; t < T; t++)
        for (size_t k = 0; k < PP; k++) {
          float v = tab[c][u[(size_t)r * 3 * F * PP + ((size_t)c * F + (F == 1 ? 0 : t)) * PP + k]];
          uint16_t h = bf16_of(v);
          memcpy(out + (((size_t)r * 3 + c) * T + t) * PP * esz + k * esz, bf16 ? (void *)&h : &v,
                 esz);
        }
}

TEST(pixels_expand_is_the_writers_bits) {
  unsigned long len;
  unsigned char *jpg = mml_test_jpeg(301, 219, 0, &len);
  mml_err err = {0};
  mml_vision_cfg cf, cb, cu;
  mml_vision_preset("qwen2.5-vl", &cf, &err);
  cb = cu = cf;
  cb.pixel_format = MML_PIXEL_BFLOAT16;
  cu.pixel_format = MML_PIXEL_UINT8;
  const int P = cf.patch_size, T = cf.temporal_patch_size;
  mml_vision_plan pf, pb, pu;
  CHECK_OK(mml_vision_plan_bytes(&cf, jpg, len, &pf, &err), err);
  CHECK_OK(mml_vision_plan_bytes(&cb, jpg, len, &pb, &err), err);
  CHECK_OK(mml_vision_plan_bytes(&cu, jpg, len, &pu, &err), err);
  mml_vision_scratch *s = NULL;
  CHECK_OK(mml_vision_scratch_new(&s), err);
  const size_t rows = (size_t)pf.rows, fb = rows * mml_vision_row_bytes(&cf);
  uint8_t *want = malloc(fb), *want16 = malloc(fb / 2), *u = malloc(rows * 3 * P * P);
  uint8_t *got = NULL;
  CHECK(posix_memalign((void **)&got, 64, fb + 64) == 0);
  CHECK_OK(mml_vision_process_bytes(&cf, s, jpg, len, &pf, want, &err), err);
  CHECK_OK(mml_vision_process_bytes(&cb, s, jpg, len, &pb, want16, &err), err);
  CHECK_OK(mml_vision_process_bytes(&cu, s, jpg, len, &pu, u, &err), err);
  float tab[3][256];
  mml_vision_pixel_table(&cf, tab);
  for (int off = 0; off <= 4; off += 4) { /* aligned (streamed), then not */
    CHECK_OK(mml_pixels_expand(u, (int64_t)rows, P, 1, T, (const float(*)[256])tab,
                               MML_PIXEL_FLOAT32, got + off, &err),
             err);
    CHECK(memcmp(got + off, want, fb) == 0);
    CHECK_OK(mml_pixels_expand(u, (int64_t)rows, P, 1, T, (const float(*)[256])tab,
                               MML_PIXEL_BFLOAT16, got + off, &err),
             err);
    CHECK(memcmp(got + off, want16, fb / 2) == 0);
  }
  const int shapes[][3] = {{2, 1, 2}, {3, 1, 2}, {14, 2, 2}, {16, 1, 2}, {5, 3, 3}, {16, 1, 1}};
  unsigned seed = 7;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const int p = shapes[i][0], F = shapes[i][1], t = shapes[i][2];
    const int64_t n = 37;
    const size_t in = (size_t)n * 3 * F * p * p, out = (size_t)n * 3 * t * p * p * 4;
    uint8_t *src = malloc(in), *ref = malloc(out), *dst = NULL;
    CHECK(posix_memalign((void **)&dst, 64, out) == 0);
    for (size_t k = 0; k < in; k++) src[k] = (uint8_t)((seed = seed * 1103515245u + 12345u) >> 16);
    for (int bf16 = 0; bf16 <= 1; bf16++) {
      memset(dst, 0xA5, out);
      expand_reference(src, n, p, F, t, (const float(*)[256])tab, bf16, ref);
      CHECK_OK(mml_pixels_expand(src, n, p, F, t, (const float(*)[256])tab,
                                 bf16 ? MML_PIXEL_BFLOAT16 : MML_PIXEL_FLOAT32, dst, &err),
               err);
      CHECK(memcmp(dst, ref, bf16 ? out / 2 : out) == 0);
    }
    free(src);
    free(ref);
    free(dst);
  }
  CHECK_EQ_INT(
      mml_pixels_expand(u, 1, P, 3, T, (const float(*)[256])tab, MML_PIXEL_FLOAT32, got, &err),
      MML_EINVAL);
  free(want);
  free(want16);
  free(u);
  free(got);
  tjFree(jpg);
  mml_vision_scratch_free(s);
}

/* uint8 patch rows of a still image (u8_lines with AVX-512; u8_scatter without, or with
 * MML_DISABLE_AVX512=1) hold exactly the bytes behind the float32 writer's values, at any
 * destination offset from a cache line (a run's first and last lines are partial), and
 * nothing before or after the rows is written: P 14 and 16 (the presets), P 5 and 9 (the
 * generic loops; under P = 8 u8_scatter's 16-byte copies once wrote past the channel, and
 * past the last row), widths whose rows start at every phase of a line. */
TEST(pixels_u8_rows_any_offset_are_the_float_bytes) {
  const int sizes[][2] = {{203, 150}, {301, 219}, {640, 97}, {97, 400}};
  const int patches[] = {14, 16, 5, 9};
  const int offs[] = {0, 1, 7, 16, 33, 63};
  mml_err err = {0};
  mml_vision_scratch *s = NULL;
  CHECK_OK(mml_vision_scratch_new(&s), err);
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
    unsigned long len;
    unsigned char *jpg = mml_test_jpeg(sizes[si][0], sizes[si][1], 0, &len);
    CHECK(jpg != NULL);
    for (size_t pi = 0; pi < sizeof patches / sizeof patches[0]; pi++) {
      mml_vision_cfg cf, cu;
      mml_vision_preset(patches[pi] == 16 ? "qwen3-vl" : "qwen2.5-vl", &cf, &err);
      cf.patch_size = patches[pi];
      cu = cf;
      cu.pixel_format = MML_PIXEL_UINT8;
      mml_vision_plan pf, pu;
      CHECK_OK(mml_vision_plan_bytes(&cf, jpg, len, &pf, &err), err);
      CHECK_OK(mml_vision_plan_bytes(&cu, jpg, len, &pu, &err), err);
      const int P = cf.patch_size, T = cf.temporal_patch_size, PP = P * P;
      const size_t rows = (size_t)pf.rows, ub = rows * 3 * PP;
      float *f = malloc(rows * 3 * T * PP * 4);
      CHECK_OK(mml_vision_process_bytes(&cf, s, jpg, len, &pf, f, &err), err);
      uint8_t *buf = NULL;
      CHECK(posix_memalign((void **)&buf, 64, ub + 256) == 0);
      for (size_t oi = 0; oi < sizeof offs / sizeof offs[0]; oi++) {
        const int off = 64 + offs[oi];
        memset(buf, 0xA5, ub + 256);
        CHECK_OK(mml_vision_process_bytes(&cu, s, jpg, len, &pu, buf + off, &err), err);
        size_t bad = 0, guard = 0;
        for (int i = 0; i < off; i++) guard += buf[i] != 0xA5;
        for (size_t i = off + ub; i < ub + 256; i++) guard += buf[i] != 0xA5;
        for (size_t r = 0; r < rows; r++)
          for (int c = 0; c < 3; c++)
            for (int k = 0; k < PP; k++) {
              const uint8_t u = buf[off + r * 3 * PP + (size_t)c * PP + k];
              const float x = (float)((double)u * (1.0 / 255.0)),
                          want = (x - cf.mean[c]) / cf.std[c];
              for (int t = 0; t < T; t++)
                bad += memcmp(&want, &f[r * 3 * T * PP + (size_t)(c * T + t) * PP + k], 4) != 0;
            }
        CHECK_EQ_INT(guard, 0);
        CHECK_EQ_INT(bad, 0);
      }
      free(buf);
      free(f);
    }
    tjFree(jpg);
  }
  mml_vision_scratch_free(s);
}

/* float32 and bfloat16 rows of a still image (float_lines with AVX-512; float_rows or the
 * tables without, or with MML_DISABLE_AVX512=1, or at a destination that is not a
 * multiple of the value size) are exactly the reference's values of the image's uint8
 * rows, (float32(double(v) * (1/255)) - mean) / std (rounded to nearest even for
 * bfloat16), at any destination offset from a cache line that is a multiple of the value
 * size (a run's first and last lines are partial), and nothing before or after the rows is written: P 14 and 16 (the
 * presets), P 3, 5 and 9 (the generic loops; a line holding three channels at P 3), T 2
 * and 1, with the presets' mean and std (the division-free form) and with a subnormal std,
 * for which that form is not exact (so the writers divide). */
static void check_float_rows(mml_vision_scratch *s, const unsigned char *jpg, unsigned long len,
                             const mml_vision_cfg *base) {
  const int offs[] = {0, 2, 4, 12, 30, 36, 60, 62};
  mml_err err = {0};
  mml_vision_cfg cu = *base;
  cu.pixel_format = MML_PIXEL_UINT8;
  mml_vision_plan pu;
  CHECK_OK(mml_vision_plan_bytes(&cu, jpg, len, &pu, &err), err);
  const int P = base->patch_size, T = base->temporal_patch_size, PP = P * P;
  const size_t rows = (size_t)pu.rows, cols = (size_t)3 * T * PP;
  uint8_t *u = malloc(rows * 3 * PP);
  CHECK_OK(mml_vision_process_bytes(&cu, s, jpg, len, &pu, u, &err), err);
  float *want = malloc(rows * cols * 4);
  for (size_t r = 0; r < rows; r++)
    for (int c = 0; c < 3; c++)
      for (int k = 0; k < PP; k++) {
        const float x = (float)((double)u[r * 3 * PP + (size_t)c * PP + k] * (1.0 / 255.0));
        const float v = (x - base->mean[c]) / base->std[c];
        for (int t = 0; t < T; t++) want[r * cols + (size_t)(c * T + t) * PP + k] = v;
      }
  uint8_t *buf = NULL;
  CHECK(posix_memalign((void **)&buf, 64, rows * cols * 4 + 256) == 0);
  for (int bf16 = 0; bf16 <= 1; bf16++) {
    mml_vision_cfg cf = *base;
    cf.pixel_format = bf16 ? MML_PIXEL_BFLOAT16 : MML_PIXEL_FLOAT32;
    mml_vision_plan pf;
    CHECK_OK(mml_vision_plan_bytes(&cf, jpg, len, &pf, &err), err);
    const size_t esz = bf16 ? 2 : 4, fb = rows * cols * esz;
    for (size_t oi = 0; oi < sizeof offs / sizeof offs[0]; oi++) {
      const size_t off = 64 + (size_t)offs[oi];
      if (off % esz) continue; /* the values are aligned (the portable writer's stores) */
      memset(buf, 0xA5, fb + 256);
      CHECK_OK(mml_vision_process_bytes(&cf, s, jpg, len, &pf, buf + off, &err), err);
      size_t bad = 0, guard = 0;
      for (size_t i = 0; i < off; i++) guard += buf[i] != 0xA5;
      for (size_t i = off + fb; i < fb + 256; i++) guard += buf[i] != 0xA5;
      for (size_t i = 0; i < rows * cols; i++) {
        const uint16_t h = bf16_of(want[i]);
        bad +=
            memcmp(buf + off + i * esz, bf16 ? (const void *)&h : (const void *)&want[i], esz) != 0;
      }
      CHECK_EQ_INT(guard, 0);
      CHECK_EQ_INT(bad, 0);
    }
  }
  free(buf);
  free(want);
  free(u);
}

TEST(pixels_float_rows_any_offset_are_the_reference) {
  const int sizes[][2] = {{203, 150}, {301, 219}, {97, 400}};
  const int patches[] = {14, 16, 3, 5, 9};
  mml_err err = {0};
  mml_vision_scratch *s = NULL;
  CHECK_OK(mml_vision_scratch_new(&s), err);
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
    unsigned long len;
    unsigned char *jpg = mml_test_jpeg(sizes[si][0], sizes[si][1], 0, &len);
    CHECK(jpg != NULL);
    for (size_t pi = 0; pi < sizeof patches / sizeof patches[0]; pi++)
      for (int divide = 0; divide <= 1; divide++) {
        mml_vision_cfg cf;
        mml_vision_preset(patches[pi] == 16 ? "qwen3-vl" : "qwen2.5-vl", &cf, &err);
        cf.patch_size = patches[pi];
        if (divide) cf.std[1] = 1e-39f; /* subnormal: 1/std is infinite */
        if (si == 0 && pi == 0) cf.temporal_patch_size = 1;
        check_float_rows(s, jpg, len, &cf);
      }
    tjFree(jpg);
  }
  mml_vision_scratch_free(s);
}

/* mml_pixels_expand_inplace: uint8 rows at the start of a buffer become exactly the rows
 * mml_pixels_expand writes elsewhere, for every row count from 0 (each run boundary and
 * row 0 from its copy), on the streamed (P 14, 16: aligned rows) and plain (P 3, 5) loops,
 * float32 and bfloat16, T 1 and 2; a large row (over the stack copy) too. */
TEST(pixels_expand_in_place_is_expand) {
  mml_err err = {0};
  float tab[3][256];
  for (int c = 0; c < 3; c++)
    for (int v = 0; v < 256; v++) tab[c][v] = ((float)v * (1.0f / 255) - 0.4f - 0.05f * c) / 0.27f;
  const int shapes[][2] = {{14, 2}, {16, 2}, {14, 1}, {3, 2}, {5, 1}, {40, 2}};
  unsigned seed = 11;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const int p = shapes[i][0], t = shapes[i][1];
    const int64_t nmax = p == 40 ? 5 : 70;
    const size_t U = 3 * (size_t)p * p, F4 = U * t * 4;
    uint8_t *src = malloc((size_t)nmax * U), *ref = NULL, *buf = NULL;
    CHECK(posix_memalign((void **)&ref, 64, (size_t)nmax * F4 + 1) == 0);
    CHECK(posix_memalign((void **)&buf, 64, (size_t)nmax * F4 + 1) == 0);
    for (size_t k = 0; k < (size_t)nmax * U; k++)
      src[k] = (uint8_t)((seed = seed * 1103515245u + 12345u) >> 16);
    for (int bf16 = 0; bf16 <= 1; bf16++) {
      const int fmt = bf16 ? MML_PIXEL_BFLOAT16 : MML_PIXEL_FLOAT32;
      const size_t F = bf16 ? F4 / 2 : F4;
      for (int64_t n = 0; n <= nmax; n++) {
        CHECK_OK(mml_pixels_expand(src, n, p, 1, t, (const float(*)[256])tab, fmt, ref, &err), err);
        memset(buf, 0x5A, (size_t)nmax * F4 + 1);
        memcpy(buf, src, (size_t)n * U);
        CHECK_OK(mml_pixels_expand_inplace(buf, n, p, t, (const float(*)[256])tab, fmt, &err), err);
        CHECK(memcmp(buf, ref, (size_t)n * F) == 0);
        for (size_t k = (size_t)n * F; k <= (size_t)nmax * F4; k++) /* nothing past the rows */
          if (buf[k] != 0x5A) CHECK(buf[k] == 0x5A);
      }
    }
    free(src);
    free(ref);
    free(buf);
  }
  CHECK_EQ_INT(
      mml_pixels_expand_inplace(NULL, 1, 14, 2, (const float(*)[256])tab, MML_PIXEL_FLOAT32, &err),
      MML_EINVAL);
  CHECK_EQ_INT(
      mml_pixels_expand_inplace(NULL, 0, 14, 2, (const float(*)[256])tab, MML_PIXEL_UINT8, &err),
      MML_EINVAL);
}

/* loader_expand.c X1: the in-place expansion split as the loader shares it -- the rows
 * from mml_pixels_inplace_free_from on cut into pieces expanded in any order (here back
 * to front, pieces of 1-7 rows), then mml_pixels_expand_inplace on the rows before them --
 * is exactly the whole in-place expansion, for every row count, float32 and bfloat16,
 * T 1 and 2, streamed and plain loops; and the free rows' outputs lie past every input. */
TEST(pixels_expand_in_place_split) {
  mml_err err = {0};
  float tab[3][256];
  for (int c = 0; c < 3; c++)
    for (int v = 0; v < 256; v++) tab[c][v] = ((float)v * (1.0f / 255) - 0.45f + 0.03f * c) / 0.26f;
  const int shapes[][2] = {{14, 2}, {16, 1}, {3, 2}};
  unsigned seed = 5;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const int p = shapes[i][0], t = shapes[i][1];
    const int64_t nmax = 90;
    const size_t U = 3 * (size_t)p * p, F4 = U * t * 4;
    uint8_t *src = malloc((size_t)nmax * U), *ref = NULL, *buf = NULL;
    CHECK(posix_memalign((void **)&ref, 64, (size_t)nmax * F4) == 0);
    CHECK(posix_memalign((void **)&buf, 64, (size_t)nmax * F4) == 0);
    for (size_t k = 0; k < (size_t)nmax * U; k++)
      src[k] = (uint8_t)((seed = seed * 1103515245u + 12345u) >> 16);
    for (int bf16 = 0; bf16 <= 1; bf16++) {
      const int fmt = bf16 ? MML_PIXEL_BFLOAT16 : MML_PIXEL_FLOAT32;
      const size_t F = bf16 ? F4 / 2 : F4;
      for (int64_t n = 0; n <= nmax; n++) {
        const int64_t from = mml_pixels_inplace_free_from(n, p, t, fmt);
        CHECK(from >= 0 && from <= n);
        CHECK(n <= 1 ? from == n : (size_t)from * F >= (size_t)n * U); /* past every input */
        CHECK_OK(mml_pixels_expand(src, n, p, 1, t, (const float(*)[256])tab, fmt, ref, &err), err);
        memcpy(buf, src, (size_t)n * U);
        for (int64_t b = n, step = 1; b > from; step = step % 7 + 1) {
          const int64_t a = b - step > from ? b - step : from;
          CHECK_OK(mml_pixels_expand(buf + (size_t)a * U, b - a, p, 1, t, (const float(*)[256])tab,
                                     fmt, buf + (size_t)a * F, &err),
                   err);
          b = a;
        }
        CHECK_OK(mml_pixels_expand_inplace(buf, from, p, t, (const float(*)[256])tab, fmt, &err),
                 err);
        CHECK(memcmp(buf, ref, (size_t)n * F) == 0);
      }
    }
    free(src);
    free(ref);
    free(buf);
  }
  CHECK(mml_pixels_inplace_free_from(100, 14, 2, MML_PIXEL_UINT8) == 100);
}
