/*
 * fixture.c — the shared on-disk fixture of the loader C tests (mml_fixture.h).  One
 * thread (a test's main thread) makes it; the atexit handler removes every folder made.
 */
#include "mml_fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

static mml_fixture *g_made[8];
static int g_nmade;

static void remove_all(void) {
  for (int i = 0; i < g_nmade; i++) {
    mml_fixture *fx = g_made[i];
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", fx->dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", fx->dir);
    mml_tokenizer_free(fx->tok);
    fx->tok = NULL;
  }
  g_nmade = 0;
}

int mml_fixture_ready(mml_fixture *fx) {
  if (fx->state) return fx->state > 0 ? 0 : -1;
  fx->state = -1;
  if (g_nmade == (int)(sizeof g_made / sizeof g_made[0])) return -1;
  const char *tp = getenv("MML_TEST_TOKENIZER");
  if (!tp) tp = "../../mmloader/data/tiny-tokenizer.json";
  mml_tokenizer *tok = NULL;
  mml_err err;
  if (mml_tokenizer_load(tp, &tok, &err) != MML_OK) {
    fprintf(stderr, "cannot load tokenizer %s: %s\n", tp, err.msg);
    return -1;
  }
  snprintf(fx->dir, sizeof fx->dir, "/tmp/mml-test-%s-XXXXXX", fx->name);
  if (!mkdtemp(fx->dir)) {
    fprintf(stderr, "cannot make %s\n", fx->dir);
    mml_tokenizer_free(tok);
    return -1;
  }
  if (!g_nmade) atexit(remove_all);
  fx->tok = tok;
  g_made[g_nmade++] = fx; /* removed at exit even when make fails half-way */
  if (fx->make(fx->dir)) {
    fprintf(stderr, "cannot write the dataset in %s\n", fx->dir);
    return -1;
  }
  fx->state = 1;
  return 0;
}

int mml_test_write_jpeg(const char *path, int w, int h, int seed) {
  unsigned char *rgb = malloc((size_t)w * h * 3);
  if (!rgb) return -1;
  for (int i = 0; i < w * h * 3; i++) rgb[i] = (unsigned char)((i * 31 + seed * 17) ^ (i >> 7));
  tjhandle tj = tjInitCompress();
  unsigned char *out = NULL;
  unsigned long len = 0;
  int rc = tj && !tjCompress2(tj, rgb, w, 0, h, TJPF_RGB, &out, &len, TJSAMP_420, 85, 0) ? 0 : -1;
  FILE *f = rc ? NULL : fopen(path, "wb");
  if (!f || fwrite(out, 1, len, f) != len) rc = -1;
  if (f && fclose(f)) rc = -1;
  tjFree(out);
  if (tj) tjDestroy(tj);
  free(rgb);
  return rc;
}
