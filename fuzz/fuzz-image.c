/* fuzz-image.c — one decoder wrapper per target: FUZZ_FORMAT selects the format whose
 * magic bytes are forced onto the input's front, so the mutations explore that decoder
 * (the probe, then libjpeg-turbo / libpng through our conversion code) rather than the
 * format dispatch.  Every decoded size obeys the pixel limit.
 *
 * Adding a format (WebP, GIF, BMP, TIFF, ...): one row in k_formats and one line
 * `FORMATS += name` in fuzz/Makefile, plus seeds in fuzz/corpus/image-<name>/. */
#include "fuzz.h"
#include "mml/image.h"

typedef struct fmt {
  const char *name;
  const char *magic;
  size_t len;
} fmt;
static const fmt k_formats[] = {
    {"jpeg", "\xff\xd8\xff", 3}, {"png", "\x89PNG\r\n\x1a\n", 8},
    {"webp", "RIFF", 4}, /* then a size and "WEBP": from the seeds */
    {"gif", "GIF8", 4},          {"bmp", "BM", 2},
    {"tiff", "II*", 3},
    /* a new decoder: a row here, FORMATS in the Makefile, seeds in make_seeds.py */
};

#ifndef FUZZ_FORMAT
#define FUZZ_FORMAT "jpeg"
#endif

enum { MAX_PIXELS = 1 << 22 };

static mml_status sink_begin(void *ctx, int w, int h, mml_err *err) {
  if ((int64_t)w * h > MAX_PIXELS) abort(); /* the limit must hold before any row */
  *(int *)ctx = w;
  return MML_OK;
}
static mml_status sink_row(void *ctx, int y, const uint8_t *rgb, mml_err *err) {
  volatile uint8_t x = rgb[0] ^ rgb[*(int *)ctx * 3 - 1]; /* the whole row is readable */
  (void)x;
  return MML_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static mml_decoder *d;
  static const fmt *f;
  if (!d) {
    if (mml_decoder_new(&d)) abort();
    mml_decoder_set_max_pixels(d, MAX_PIXELS);
    for (size_t i = 0; i < sizeof k_formats / sizeof *k_formats; i++)
      if (!strcmp(k_formats[i].name, FUZZ_FORMAT)) f = &k_formats[i];
    if (!f) abort();
  }
  if (size > (1 << 20)) return 0;
  uint8_t *buf = malloc(size + f->len);
  if (!buf) return 0;
  memcpy(buf, f->magic, f->len);
  memcpy(buf + f->len, data, size);
  size_t n = size + f->len;
  mml_err e = {0};
  mml_image_info info;
  if (mml_image_probe(buf, n, &info, &e)) fuzz_check_msg(&e);
  int scale = 1 << (size ? data[0] % 4 : 0);
  int w = 0;
  mml_row_sink sink = {sink_begin, sink_row, &w, NULL};
  if (mml_image_decode_rows(d, buf, n, scale, &sink, &e)) fuzz_check_msg(&e);
  mml_rgb8 img;
  if (mml_image_decode(d, buf, n, 1, &img, &e) == MML_OK) {
    if ((int64_t)img.width * img.height > MAX_PIXELS) abort();
  } else {
    fuzz_check_msg(&e);
  }
  free(buf);
  return 0;
}
