/*
 * index_parquet.c — a Parquet file (the Hugging Face Hub's shards: `datasets`'
 * Image/Video features as {bytes, path} structs) as a shard whose samples are its rows.
 *
 * DESIGN
 *   1. Only the footer is read (mml_pq_open: two ranged reads), with the columns a
 *      record's parse reads (mml_record_keys); every read column chunk's metadata is
 *      checked there, so a file the reader cannot read is refused when it is indexed.
 *   2. A sample is a row, addressed as (shard, row group, row): its offset in the index
 *      is its row number in the file (row groups are found by binary search over their
 *      first rows, mml_pq_row_group_of).  No row is decoded here and nothing is written
 *      to $TMPDIR: the loader's workers decode a row group when a sample needs it
 *      (loader_parquet.c), through clones of the shard's handle (shard.pq).
 *   3. The shard reads as a WebDataset shard without members (layout MML_LAYOUT_WDS,
 *      compression MML_COMPRESS_PARQUET, data_end = rows): samples are named
 *      "train-00000.parquet[row group 0, row 12]", as a member group is named by key.
 *   4. Limits: rows <= max_records; the footer, column chunks and pages <=
 *      max_chunk_bytes (the loader's max_object_bytes).
 *
 * Threads: one thread builds; the shard's handle is only read afterwards (its metadata).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "index_int.h"
#include "mml/parquet.h"
#include "mml/record.h"

typedef struct local_file {
  int fd;
  const char *path;
} local_file;

static mml_status read_at(void *ctx, int64_t off, int64_t len, mml_bytes *out, mml_err *err) {
  const local_file *c = ctx;
  const char *path = c->path;
  mml_bytes_clear(out);
  if (mml_bytes_reserve(out, (size_t)len + 1))
    return mml_err_set(err, MML_ENOMEM, "%s: out of memory for %lld bytes", path, (long long)len);
  size_t got = 0;
  while ((int64_t)got < len) {
    ssize_t r = pread(c->fd, out->data + got, (size_t)len - got, off + (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return mml_err_set(err, MML_EIO, "%s: read failed: %s", path, strerror(errno));
    if (r == 0)
      return mml_err_set(err, MML_ERECORD, "%s: the file ends at byte %lld, before %lld", path,
                         (long long)(off + (int64_t)got), (long long)(off + len));
    got += (size_t)r;
  }
  out->len = got;
  return MML_OK;
}

mml_status mml_index_add_parquet(mml_index *ix, const char *path, int64_t size, mml_pq_read_fn read,
                                 void *read_ctx, mml_err *err) {
  mml_index_builder *b;
  mml_status st = mml_index_begin(ix, path, MML_LAYOUT_WDS, &b, err);
  if (st) return st;
  mml_index_shard *sh = shard_of(b);
  sh->layout = MML_LAYOUT_WDS;
  sh->compression = MML_COMPRESS_PARQUET;
  b->sniffed = 1; /* no byte goes through the text layers */
  b->tar_end = 1;
  mml_pq_limits lim = {.max_chunk_bytes = ix->limits.max_chunk_bytes,
                       .max_rows = ix->limits.max_records};
  char name[4200];
  snprintf(name, sizeof name, "data shard %s", path);
  st = mml_pq_open_mapped(name, size, read, read_ctx, mml_record_keys, ix->pq_map, &lim, &sh->pq,
                          err);
  int64_t rows = st ? 0 : mml_pq_rows(sh->pq);
  if (!st && ix->n + rows > ix->cap) { /* one offset per row: its row number */
    int64_t nc = ix->cap ? ix->cap : 1024;
    while (nc < ix->n + rows) nc *= 2;
    int64_t *p = realloc(ix->offsets, (size_t)nc * sizeof *p);
    if (!p)
      st = ix_oom(b, err);
    else
      ix->offsets = p, ix->cap = nc;
  }
  if (st) {
    mml_index_abort(b);
    return st;
  }
  for (int64_t r = 0; r < rows; r++) ix->offsets[ix->n + r] = r;
  ix->n += rows;
  sh->count = rows;
  sh->data_end = rows;
  b->raw_off = size; /* the shard's size as stored */
  return mml_index_end(b, err);
}

mml_status ix_add_parquet(mml_index *ix, const char *path, int fd, int64_t size, mml_err *err) {
  local_file lf = {fd, path};
  return mml_index_add_parquet(ix, path, size, read_at, &lf, err);
}
