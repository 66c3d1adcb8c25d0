/* fuzz-dsindex.c — a dataset index file (mml/dsindex.h) from untrusted bytes (an index may
 * come from a shared folder or a bucket): mml_dsx_parse on the input with its checksum
 * made valid (so mutations reach the structural checks behind it), then, when accepted,
 * the shard added to a loader index and every sample located, read back and named; and
 * mml_dsx_partial_parse on the raw input. */
#include "fuzz.h"
#include "mml/dsindex.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  memcpy(copy, data, size);
  if (size >= MML_DSX_HEADER) { /* the checksum at 120 over the file with it zeroed */
    memset(copy + 120, 0, 8);
    uint64_t sum = mml_hash_bytes(0, copy, size);
    memcpy(copy + 120, &sum, 8);
  }
  mml_err err;
  mml_dsx x;
  if (mml_dsx_parse(copy, size, "fuzz", &x, &err) == MML_OK) {
    mml_index ix = {0};
    if (mml_dsx_add_to_index(&x, &ix, "fuzz.jsonl", &err) == MML_OK) {
      for (int64_t i = 0; i < ix.n; i++) {
        int shard;
        int64_t off, len, where;
        mml_index_locate(&ix, i, &shard, &off, &len, &where);
        char name[256];
        mml_index_name_sample(&ix, shard, i, where, name, sizeof name);
        const char *imgs[8];
        mml_index_images(&ix, shard, i, imgs, 8);
        int64_t mo, ml;
        mml_index_member(&ix, shard, i, "jpg", &mo, &ml);
        if (off < 0 || len < 0) abort(); /* a range the loader would read */
      }
    }
    mml_index_free(&ix);
    mml_dsx_free(&x);
  }
  size_t used;
  if (mml_dsx_partial_parse(data, size, "fuzz", &x, &used, &err) == MML_OK) {
    if (used > size) abort();
    mml_dsx_free(&x);
  }
  free(copy);
  return 0;
}
