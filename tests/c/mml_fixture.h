/*
 * mml_fixture.h — the on-disk fixture of the C tests that run a loader (test-loader.c,
 * test-dsindex.c): the bundled tokenizer and a dataset folder the test file writes, made
 * once per process (run-tests runs each test in its own, so no test relies on another
 * having run) and removed at exit.  fixture.c implements it.
 */
#ifndef MML_FIXTURE_H
#define MML_FIXTURE_H
#include "mml/tokenizer.h"

typedef struct mml_fixture {
  const char *name;              /* the folder is /tmp/mml-test-<name>-XXXXXX */
  int (*make)(const char *dir);  /* writes the dataset into dir; 0: done */
  char dir[64];                  /* set once ready */
  mml_tokenizer *tok;            /* the tokenizer, once ready */
  int state;                     /* 0 not made yet, 1 ready, -1 failed */
} mml_fixture;

/* Makes fx ready once (later calls return the first result): loads the tokenizer (MML_TEST_TOKENIZER, else the
 * bundled one relative to tests/c), makes the folder, calls fx->make; removed at exit.
 * 0: ready; -1 with the reason on stderr. */
int mml_fixture_ready(mml_fixture *fx);

/* Writes a w x h JPEG (4:2:0, quality 85) of a pattern that depends on seed.  0: done. */
int mml_test_write_jpeg(const char *path, int w, int h, int seed);
#endif
