/*
 * test-image.c — core tests of the image folder's own machinery (csrc/core/image): multi-scan
 * JPEG coefficients in memory that stays mapped between images (image_jpeg_mem.c), and
 * decodes run aside on a thread close() can abandon (image_aside.c).  The
 * decoders' probe/decode paths and bad input are tested through the vision pipeline
 * (vision/test-vision.c) and test-hardening.c; pixel parity with Pillow from Python.
 */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <turbojpeg.h>

#include <jpeglib.h>

#include "mml/image.h"
#include "mml_fixture.h"
#include "mml_test.h"

#include "../../../csrc/core/image/image_fmt.h"
#include "../../../csrc/core/image/image_jpeg_mem.h"

/* Multi-scan JPEGs decode through image_jpeg_mem.c's coefficient arrays: the pixels are
 * libjpeg's own (tjDecompress2, the stock memory manager) image after image, also after an
 * error mid-image; the region is kept between images up to MML_JPEG_KEEP and unmapped
 * after a larger one. */
static int decode_rows(struct jpeg_decompress_struct *jd, jmp_buf *jb, const uint8_t *p,
                       unsigned long n, uint8_t *out) {
  if (setjmp(*jb)) {
    jpeg_abort_decompress(jd);
    return -1;
  }
  jpeg_mem_src(jd, p, n);
  jpeg_read_header(jd, TRUE);
  jd->out_color_space = JCS_RGB;
  jd->dct_method = JDCT_ISLOW;
  jpeg_start_decompress(jd);
  while (jd->output_scanline < jd->output_height) {
    JSAMPROW r = out + (size_t)jd->output_scanline * jd->output_width * 3;
    jpeg_read_scanlines(jd, &r, 1);
  }
  jpeg_finish_decompress(jd);
  return 0;
}

typedef struct {
  struct jpeg_error_mgr pub;
  jmp_buf jb;
} test_jerr;
static void test_jerr_exit(j_common_ptr c) { longjmp(((test_jerr *)c->err)->jb, 1); }
static void test_jerr_quiet(j_common_ptr c) { (void)c; }
static void test_jerr_warn(j_common_ptr c, int level) { /* premature end: an error here */
  if (level < 0) test_jerr_exit(c);
}

TEST(jpeg_coefficients_stay_mapped) {
  struct jpeg_decompress_struct jd;
  test_jerr je;
  jd.err = jpeg_std_error(&je.pub);
  je.pub.error_exit = test_jerr_exit;
  je.pub.output_message = test_jerr_quiet;
  je.pub.emit_message = test_jerr_warn;
  jpeg_create_decompress(&jd);
  mml_jpeg_keep *k = NULL;
  CHECK_EQ_INT(mml_jpeg_keep_install(&jd, &k), MML_OK);
  /* progressive sizes around the kept limit (3 bytes of coefficients per pixel at 4:2:0),
   * a baseline one, and a truncated progressive one that fails mid-image */
  static const int sizes[][3] = {{300, 200, 1},   {1200, 900, 1}, {640, 480, 0}, {-1, 0, 1},
                                 {3000, 2000, 1}, {333, 251, 1},  {300, 200, 1}};
  tjhandle tj = tjInitDecompress();
  size_t kept_small = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    int w = sizes[i][0] < 0 ? 800 : sizes[i][0], h = sizes[i][0] < 0 ? 600 : sizes[i][1];
    unsigned long len;
    unsigned char *jpg = mml_test_jpeg(w, h, sizes[i][2], &len);
    CHECK(jpg != NULL);
    uint8_t *got = malloc((size_t)w * h * 3), *want = malloc((size_t)w * h * 3);
    if (sizes[i][0] < 0) {
      CHECK_EQ_INT(decode_rows(&jd, &je.jb, jpg, len / 2, got), -1); /* premature end */
    } else {
      CHECK_EQ_INT(decode_rows(&jd, &je.jb, jpg, len, got), 0);
      CHECK_EQ_INT(tjDecompress2(tj, jpg, len, want, w, 0, h, TJPF_RGB, TJFLAG_ACCURATEDCT), 0);
      CHECK(memcmp(got, want, (size_t)w * h * 3) == 0);
    }
    mml_jpeg_keep_trim(k, MML_JPEG_KEEP);
    size_t coef = (size_t)w * h * 3;
    if (sizes[i][2] && coef <= MML_JPEG_KEEP / 2) {
      CHECK(mml_jpeg_keep_bytes(k) > 0); /* kept for the next image */
      if (!kept_small) kept_small = mml_jpeg_keep_bytes(k);
    }
    if (sizes[i][2] && coef > MML_JPEG_KEEP * 2) CHECK_EQ_INT(mml_jpeg_keep_bytes(k), 0);
    free(got);
    free(want);
    tjFree(jpg);
  }
  CHECK(kept_small > 0 && kept_small <= MML_JPEG_KEEP);
  tjDestroy(tj);
  jpeg_destroy_decompress(&jd);
  mml_jpeg_keep_free(k);
}

/* A decoder's own bound on the kept region (mml_decoder_set_jpeg_keep): a progressive image
 * above MML_JPEG_KEEP keeps its region mapped for the next image when the bound allows
 * (the Loader without max_memory), the same pixels; setting the bound lower unmaps it. */
TEST(jpeg_keep_bound_per_decoder) {
  unsigned long len;
  unsigned char *jpg = mml_test_jpeg(3000, 2000, 1, &len); /* ~18 MB of coefficients */
  CHECK(jpg != NULL);
  mml_decoder *d = NULL;
  CHECK_EQ_INT(mml_decoder_new(&d), MML_OK);
  mml_err err;
  mml_rgb8 a, b;
  size_t m0, m1, m2;
  mml_mapped_usage(&m0, NULL);
  CHECK_EQ_INT(mml_image_decode(d, jpg, len, 2, &a, &err), MML_OK);
  mml_mapped_usage(&m1, NULL);
  CHECK(m1 == m0); /* the default bound: unmapped after the image */
  uint8_t *first = malloc((size_t)a.width * a.height * 3);
  memcpy(first, a.pixels, (size_t)a.width * a.height * 3);
  mml_decoder_set_jpeg_keep(d, (size_t)64 << 20);
  for (int i = 0; i < 2; i++) {
    CHECK_EQ_INT(mml_image_decode(d, jpg, len, 2, &b, &err), MML_OK);
    mml_mapped_usage(&m2, NULL);
    CHECK(m2 >= m0 + (size_t)3000 * 2000 * 3); /* kept */
    CHECK(b.width == a.width && b.height == a.height);
    CHECK(memcmp(first, b.pixels, (size_t)a.width * a.height * 3) == 0);
  }
  mml_decoder_set_jpeg_keep(d, MML_JPEG_KEEP);
  mml_mapped_usage(&m2, NULL);
  CHECK(m2 == m0);
  free(first);
  mml_decoder_free(d);
  tjFree(jpg);
}

/* image_aside.c: a job that finishes hands its output and argument back (invariant 3);
 * one cancelled is abandoned at once and frees itself (1); at most MML_ASIDE_ABANDONED
 * are alive, past that the caller decodes itself (2). */
static int add_one(void *arg, const uint8_t *in, size_t len, uint8_t *out, const mml_cancel *c) {
  (void)c;
  for (size_t i = 0; i < len; i++) out[i] = (uint8_t)(in[i] + 1);
  ++*(int *)arg;
  return 7;
}

static int g_release; /* the held jobs below end once set */

static int held(void *arg, const uint8_t *in, size_t len, uint8_t *out, const mml_cancel *c) {
  (void)arg, (void)in, (void)len, (void)c;
  while (!__atomic_load_n(&g_release, __ATOMIC_ACQUIRE)) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  out[0] = 1; /* the job's own buffer, still its own */
  return 0;
}

static int wait_abandoned_gone(void) {
  for (int i = 0; i < 5000 && mml_image_aside_abandoned(); i++) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  return mml_image_aside_abandoned();
}

TEST(image_aside_runs_abandons_and_bounds) {
  uint8_t in[64];
  for (int i = 0; i < 64; i++) in[i] = (uint8_t)i;
  mml_bytes out = {0};
  CHECK(!mml_bytes_reserve(&out, 64));
  mml_cancel none = {0, NULL}, set = {1, NULL};
  int k = 41, rc = 0;
  CHECK_EQ_INT(mml_image_aside(add_one, &k, sizeof k, in, 64, &out, &none, &rc), 1);
  CHECK_EQ_INT(rc, 7);
  CHECK_EQ_INT(k, 42); /* the argument's copy came back */
  CHECK(out.data && out.cap >= 64 && out.data[0] == 1 && out.data[63] == 64);
  for (int j = 0; j < 2; j++) { /* two abandoned, alive until released */
    CHECK_EQ_INT(mml_image_aside(held, &k, sizeof k, in, 64, &out, &set, &rc), -1);
    CHECK(out.data == NULL && out.cap == 0); /* the buffer went with the job */
    CHECK(!mml_bytes_reserve(&out, 64));
  }
  CHECK_EQ_INT(mml_image_aside_abandoned(), 2);
  uint8_t *keep = out.data;
  CHECK_EQ_INT(mml_image_aside(held, &k, sizeof k, in, 64, &out, &set, &rc), 0);
  CHECK(out.data == keep); /* not run: the caller decodes itself, into its own buffer */
  __atomic_store_n(&g_release, 1, __ATOMIC_RELEASE);
  CHECK_EQ_INT(wait_abandoned_gone(), 0); /* they freed themselves (ASan: no leak) */
  mml_bytes_free(&out);
}
