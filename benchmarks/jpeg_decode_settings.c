/*
 * jpeg_decode_settings.c — what libjpeg-turbo's decoder settings cost at each scale, on the
 * JPEG files given: the question of issue 34 whether fast_decode's scaled decode could be
 * made cheaper by the settings Pillow's draft mode or other decoders use (DCT method,
 * fancy upsampling, output colour space, the M/8 scales besides 1/2, 1/4, 1/8).
 *
 *   cc -O2 -Wall -Wextra -o /tmp/jds benchmarks/jpeg_decode_settings.c -ljpeg
 *   /tmp/jds 5 photo*.jpg
 *
 * Each row: one setting, every file decoded once per repeat (jpeg_read_header to
 * jpeg_finish_decompress, rows into one reused buffer, nothing else), CPU time of this
 * process per image, the median over the repeats; the settings interleaved within each
 * repeat.  mmloader's decoder (csrc/core/image/image.c) uses the first setting at every
 * scale: islow IDCT, fancy upsampling, RGB out (gray files: gray out here).
 *
 * Invariants: 1. a file libjpeg refuses is named and ends the run (exit status 1);
 * 2. nothing else is timed than libjpeg's own calls.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <jpeglib.h>

typedef struct {
  const char *name;
  unsigned num, denom;
  J_DCT_METHOD dct;
  boolean fancy;
  J_COLOR_SPACE out; /* for 3-component files */
} setting;

static const setting k_settings[] = {
    {"1/1 islow fancy RGB (exact path)", 1, 1, JDCT_ISLOW, TRUE, JCS_RGB},
    {"1/1 ifast no-fancy RGB", 1, 1, JDCT_IFAST, FALSE, JCS_RGB},
    {"1/2 islow fancy RGB (fast_decode)", 1, 2, JDCT_ISLOW, TRUE, JCS_RGB},
    {"1/2 ifast fancy RGB", 1, 2, JDCT_IFAST, TRUE, JCS_RGB},
    {"1/2 ifast no-fancy RGB", 1, 2, JDCT_IFAST, FALSE, JCS_RGB},
    {"1/2 islow fancy RGBX", 1, 2, JDCT_ISLOW, TRUE, JCS_EXT_RGBX},
    {"3/8 islow fancy RGB", 3, 8, JDCT_ISLOW, TRUE, JCS_RGB},
    {"1/4 islow fancy RGB (fast_decode)", 1, 4, JDCT_ISLOW, TRUE, JCS_RGB},
    {"1/4 ifast no-fancy RGB", 1, 4, JDCT_IFAST, FALSE, JCS_RGB},
    {"1/8 islow fancy RGB (fast_decode)", 1, 8, JDCT_ISLOW, TRUE, JCS_RGB},
};
#define NSET (sizeof k_settings / sizeof k_settings[0])
#define MAXREP 64

typedef struct {
  struct jpeg_error_mgr pub;
  jmp_buf jb;
} jerr;

static void on_error(j_common_ptr c) { longjmp(((jerr *)c->err)->jb, 1); }

static double cpu_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* CPU seconds of one decode; -1 when libjpeg refuses the file. */
static double decode(const unsigned char *data, unsigned long len, const setting *s,
                     unsigned char *row, size_t row_cap) {
  struct jpeg_decompress_struct ci;
  jerr je;
  ci.err = jpeg_std_error(&je.pub);
  je.pub.error_exit = on_error;
  jpeg_create_decompress(&ci);
  if (setjmp(je.jb)) {
    jpeg_destroy_decompress(&ci);
    return -1;
  }
  double t = cpu_s();
  jpeg_mem_src(&ci, data, len);
  jpeg_read_header(&ci, TRUE);
  ci.scale_num = s->num;
  ci.scale_denom = s->denom;
  ci.dct_method = s->dct;
  ci.do_fancy_upsampling = s->fancy;
  if (ci.num_components == 3) ci.out_color_space = s->out;
  jpeg_start_decompress(&ci);
  if ((size_t)ci.output_width * (size_t)ci.output_components > row_cap) longjmp(je.jb, 1);
  JSAMPROW r = row;
  while (ci.output_scanline < ci.output_height) jpeg_read_scanlines(&ci, &r, 1);
  jpeg_finish_decompress(&ci);
  t = cpu_s() - t;
  jpeg_destroy_decompress(&ci);
  return t;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s REPEATS FILE.jpg...\n", argv[0]);
    return 2;
  }
  int reps = atoi(argv[1]), nf = argc - 2;
  if (reps < 1 || reps > MAXREP) reps = 3;
  unsigned char **data = calloc((size_t)nf, sizeof *data);
  unsigned long *len = calloc((size_t)nf, sizeof *len);
  const size_t row_cap = (size_t)65536 * 4;
  unsigned char *row = malloc(row_cap);
  if (!data || !len || !row) return 1;
  for (int i = 0; i < nf; i++) {
    FILE *f = fopen(argv[i + 2], "rb");
    long n = -1;
    if (f && !fseek(f, 0, SEEK_END) && (n = ftell(f)) > 0 && !fseek(f, 0, SEEK_SET) &&
        (data[i] = malloc((size_t)n)) && fread(data[i], 1, (size_t)n, f) == (size_t)n) {
      len[i] = (unsigned long)n;
    } else {
      fprintf(stderr, "%s: cannot read\n", argv[i + 2]);
      return 1;
    }
    fclose(f);
  }
  static double ms[NSET][MAXREP];
  for (int r = 0; r < reps; r++)
    for (size_t s = 0; s < NSET; s++) {
      double sum = 0;
      for (int i = 0; i < nf; i++) {
        double t = decode(data[i], len[i], &k_settings[s], row, row_cap);
        if (t < 0) {
          fprintf(stderr, "%s: libjpeg refused it (%s)\n", argv[i + 2], k_settings[s].name);
          return 1;
        }
        sum += t;
      }
      ms[s][r] = sum / nf * 1e3;
    }
  double full = 0;
  for (size_t s = 0; s < NSET; s++) {
    qsort(ms[s], (size_t)reps, sizeof(double), cmp_double);
    double m = ms[s][reps / 2];
    if (s == 0) full = m;
    printf("%-36s %7.2f ms/image  (full / this %.2fx)\n", k_settings[s].name, m, full / m);
  }
  return 0;
}
