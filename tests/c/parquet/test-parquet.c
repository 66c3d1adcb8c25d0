/*
 * test-parquet.c — core tests of the Parquet reader (csrc/core/parquet): hostile footers
 * are refused with MML_ERECORD naming the file, never read out of bounds (mml/parquet.h
 * "Limits"; parquet_thrift.c invariants 1-3).  Files written by datasets and pyarrow,
 * every codec, page version and encoding, are tested from Python (tests/test_parquet.py);
 * random bytes by fuzz/fuzz-parquet.c.
 */
#include <stdlib.h>
#include <string.h>

#include "mml/parquet.h"
#include "mml_test.h"

typedef struct mem {
  const uint8_t *p;
  size_t n;
} mem;

static mml_status read_mem(void *ctx, int64_t off, int64_t len, mml_bytes *out, mml_err *err) {
  const mem *m = ctx;
  if (off < 0 || len < 0 || (uint64_t)off > m->n || (uint64_t)len > m->n - (uint64_t)off)
    return mml_err_set(err, MML_EIO, "read outside the file");
  mml_bytes_clear(out);
  return mml_bytes_append(out, m->p + off, (size_t)len) ? MML_ENOMEM : MML_OK;
}

/* Opening `n` bytes fails with MML_ERECORD naming the file and `why`. */
static void refused(const uint8_t *p, size_t n, const char *why) {
  mem m = {p, n};
  mml_pq_file *f = NULL;
  mml_err err = {0};
  mml_pq_limits lim = {.max_chunk_bytes = 1 << 20};
  CHECK_EQ_INT(mml_pq_open("h.parquet", (int64_t)n, read_mem, &m, NULL, &lim, &f, &err),
               MML_ERECORD);
  CHECK(f == NULL);
  CHECK(strstr(err.msg, "h.parquet") != NULL);
  CHECK(strstr(err.msg, why) != NULL);
}

TEST(parquet_hostile_footers_refused) {
  refused((const uint8_t *)"PAR1PAR1", 8, "too short");
  refused((const uint8_t *)"PAR1xxxxxxxxxxxxPARE", 20, "encrypted");
  refused((const uint8_t *)"PAR1xxxxxxxxxxxxNOPE", 20, "not a Parquet file");
  /* a footer longer than the file */
  refused((const uint8_t *)"PAR1xxxxxxxx\xff\xff\x00\x00PAR1", 20, "footer claims");
  /* a footer whose Thrift list claims more elements than bytes left */
  uint8_t b[32] = "PAR1";
  const uint8_t meta[] = {0x19, 0xfc, 0xff, 0xff, 0x0f, 0x00}; /* field 1: list of 2^31 structs */
  memcpy(b + 4, meta, sizeof meta);
  b[10] = (uint8_t)sizeof meta, b[11] = b[12] = b[13] = 0;
  memcpy(b + 14, "PAR1", 4);
  refused(b, 18, "malformed Parquet footer");
}
