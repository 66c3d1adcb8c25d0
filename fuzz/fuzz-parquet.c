/* fuzz-parquet.c — the Parquet reader (mml/parquet.h) on untrusted file bytes: the
 * footer (Thrift compact FileMetaData, the schema tree), then every row group: column
 * chunks, page headers, decompression (snappy, gzip, zstd), levels, PLAIN and
 * dictionary values and the assembly of rows into JSON and blobs (odd row groups a few
 * rows at a time: pages decoded as the rows reach them).  Every column is read
 * (no selection) and the limits are small, as a loader's would be for such a file; each
 * row's JSON is checked to be as long as said and NUL-terminated, each blob named. */
#include "fuzz.h"
#include "mml/parquet.h"

typedef struct mem {
  const uint8_t *p;
  size_t n;
} mem;

static mml_status read_mem(void *ctx, int64_t off, int64_t len, mml_bytes *out, mml_err *err) {
  const mem *m = ctx;
  if (off < 0 || len < 0 || (uint64_t)off > m->n || (uint64_t)len > m->n - (uint64_t)off)
    return mml_err_set(err, MML_EIO, "read outside the input");
  mml_bytes_clear(out);
  if (mml_bytes_append(out, m->p + off, (size_t)len)) return mml_err_set(err, MML_ENOMEM, "oom");
  return MML_OK;
}

static mml_status on_row(void *ctx, int64_t row, const char *key, const char *json, size_t len,
                         const mml_pq_blob *blobs, int nblobs, mml_err *err) {
  (void)ctx, (void)row, (void)err;
  if (!key[0] || strlen(json) > len || json[len] != 0) abort();
  for (int k = 0; k < nblobs; k++)
    if (!blobs[k].name || !strstr(json, blobs[k].name)) abort(); /* the record names it */
  return MML_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mem m = {data, size};
  mml_pq_limits lim = {.max_chunk_bytes = 1 << 20, .max_rows = 1 << 16};
  mml_pq_file *f;
  mml_err err;
  if (mml_pq_open("fuzz.parquet", (int64_t)size, read_mem, &m, NULL, &lim, &f, &err)) return 0;
  mml_pq_file *c = NULL; /* rows are read through a clone, as the loader's workers do */
  if (mml_pq_clone(f, read_mem, &m, &c, &err)) c = NULL;
  for (int g = 0; c && g < mml_pq_row_groups(f); g++) {
    int64_t off, len, r0 = mml_pq_row_group_first(f, g);
    if (mml_pq_row_group_first(f, g + 1) > r0 && mml_pq_row_group_of(f, r0) != g) abort();
    mml_pq_row_group_range(f, g, &off, &len);
    if (g & 1) { /* odd groups a few rows at a time, as the loader's cache reads them */
      int64_t r1 = mml_pq_row_group_first(f, g + 1);
      mml_status st = mml_pq_group_begin(c, g, &err);
      for (int64_t r = r0; !st && r < r1; r += 3)
        st = mml_pq_group_rows(c, r + 3, on_row, NULL, NULL, &err);
      mml_pq_group_end(c);
      if (st) break;
    } else if (mml_pq_read_row_group(c, g, on_row, NULL, NULL, &err))
      break;
  }
  mml_pq_close(c);
  mml_pq_close(f);
  return 0;
}
