/*
 * fuzz.h — shared helpers of the libFuzzer targets (fuzz/fuzz-*.c): each target is one
 * LLVMFuzzerTestOneInput over a public core entry point, built with
 * -fsanitize=fuzzer,address,undefined against every core file (fuzz/Makefile).  A
 * target never trusts its input: whatever it returns is fine, only sanitizer reports,
 * crashes, leaks and timeouts are findings.  Each finding becomes a regression case in
 * tests/c/test-hardening.c (and its input a seed in fuzz/corpus/<target>/).
 */
#ifndef MML_FUZZ_H
#define MML_FUZZ_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mml/common.h"
#include "mml/message.h"
#include "mml/tokenizer.h"

#ifndef MML_FUZZ_ROOT
#define MML_FUZZ_ROOT "."
#endif

/* The bundled tiny tokenizer, loaded once (aborts when missing: a broken build). */
static inline const mml_tokenizer *fuzz_tokenizer(void) {
  static mml_tokenizer *tok;
  if (!tok) {
    mml_err e = {0};
    if (mml_tokenizer_load(MML_FUZZ_ROOT "/mmloader/data/tiny-tokenizer.json", &tok, &e)) {
      fprintf(stderr, "fuzz: cannot load the tiny tokenizer: %s\n", e.msg);
      abort();
    }
  }
  return tok;
}

/* Reads little-endian integers off the front of the input (zeros past its end). */
typedef struct fuzz_in {
  const uint8_t *p;
  size_t n;
} fuzz_in;
static inline uint64_t fuzz_u64(fuzz_in *in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) {
    uint64_t b = in->n ? *in->p++ : 0;
    if (in->n) in->n--;
    v |= b << (8 * i);
  }
  return v;
}

/* Fails loudly (a finding) when a core message is not valid UTF-8 or not terminated. */
static inline void fuzz_check_msg(const mml_err *e) {
  size_t n = strnlen(e->msg, sizeof e->msg);
  if (n == sizeof e->msg || !mml_utf8_valid(e->msg, n)) {
    fprintf(stderr, "fuzz: invalid message: %.*s\n", (int)n, e->msg);
    abort();
  }
}
#endif
