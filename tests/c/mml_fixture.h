/*
 * mml_fixture.h — fixtures shared by the C tests (fixture.c implements them):
 * - the on-disk fixture of the tests that run a loader (test-loader.c, test-dsindex.c):
 *   the bundled tokenizer and a dataset folder the test file writes, made once per
 *   process (run-tests runs each test in its own, so no test relies on another having
 *   run) and removed at exit;
 * - a scripted HTTP server on 127.0.0.1 (test-fetch.c, test-hardening.c);
 * - an HTTP server of one object's byte ranges (test-video.c).
 */
#ifndef MML_FIXTURE_H
#define MML_FIXTURE_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "mml/tokenizer.h"

typedef struct mml_fixture {
  const char *name;             /* the folder is /tmp/mml-test-<name>-XXXXXX */
  int (*make)(const char *dir); /* writes the dataset into dir; 0: done */
  char dir[64];                 /* set once ready */
  mml_tokenizer *tok;           /* the tokenizer, once ready */
  int state;                    /* 0 not made yet, 1 ready, -1 failed */
} mml_fixture;

/* Makes fx ready once (later calls return the first result): loads the tokenizer (MML_TEST_TOKENIZER, else the
 * bundled one relative to tests/c), makes the folder, calls fx->make; removed at exit.
 * 0: ready; -1 with the reason on stderr. */
int mml_fixture_ready(mml_fixture *fx);

/* Writes a w x h JPEG (4:2:0, quality 85) of a pattern that depends on seed.  0: done. */
int mml_test_write_jpeg(const char *path, int w, int h, int seed);
uint8_t *mml_test_rgb(int w, int h, unsigned seed);
unsigned char *mml_test_jpeg(int w, int h, int progressive, unsigned long *len);

/* A scripted HTTP server: connection i gets replies[i] (raw bytes: status line, headers,
 * body; NULL: accepted and held silent until stop) after its request head, then is
 * closed.  One thread serves the n connections in order. */
typedef struct mml_test_server {
  int fd, port;
  const char *const *replies;
  const size_t *lens;
  int n;
  int served, stop; /* atomics: written by one thread, read by the other */
  pthread_t th;
} mml_test_server;
/* 0: listening on s->port. */
int mml_test_server_start(mml_test_server *s, const char *const *replies, const size_t *lens,
                          int n);
void mml_test_server_stop(mml_test_server *s);

/* Serves data (len bytes) at every path: HEAD (its size), GET with "Range: bytes=a-b"
 * (206 and the slice) or without (200, all of it); one request per connection, in the
 * order they come, until stop.  requests counts those served. */
typedef struct mml_test_range_server {
  int fd, port;
  const unsigned char *data;
  size_t len;
  int requests, stop; /* atomics */
  pthread_t th;
} mml_test_range_server;
int mml_test_range_server_start(mml_test_range_server *s, const void *data, size_t len);
void mml_test_range_server_stop(mml_test_range_server *s);
#endif
