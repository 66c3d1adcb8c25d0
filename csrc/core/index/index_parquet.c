/*
 * index_parquet.c — a local Parquet file (the Hugging Face Hub's shards: `datasets`'
 * Image/Video features as {bytes, path} structs) indexed as a WebDataset-like shard.
 *
 * DESIGN
 *   1. The file is read row group by row group through the Parquet reader
 *      (parquet/: the footer, then one ranged read per column chunk), only the columns
 *      a record's parse reads (mml_record_keys).
 *   2. Each row becomes a group of members in the shard's spill file (the unlinked
 *      $TMPDIR copy compressed shards use): "<key>.json", the row as a JSON record, then
 *      each embedded blob "<key>.<k>.<ext>", which the record names.  The key is "row
 *      group G, row R" (R: the file's row), so a skip names shard, row group and row:
 *      "train-00000.parquet[row group 0, row 12]".
 *   3. From there the shard is a WebDataset shard (layout MML_LAYOUT_WDS, compression
 *      MML_COMPRESS_PARQUET, fd the spill file): records and images are positioned reads
 *      of the spill file, so sampling, resume, mixtures and the plan are the JSON path's.
 *   4. Limits: rows <= max_records; the spill file <= max_text_bytes (like a
 *      decompressed shard's copy); column chunks, pages and the footer <= max_chunk_bytes
 *      (the loader's max_object_bytes).  A row group's decoded columns are the memory
 *      high-water mark, released before the next.
 *   5. Cancellation: checked per row group and every 64 rows.
 *
 * Threads: one thread builds; the shard is read-only afterwards.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "index_int.h"
#include "mml/parquet.h"
#include "mml/record.h"

typedef struct pq_ctx {
  mml_index_builder *b;
  mml_pq_read_fn read; /* the Parquet file's ranged reads */
  void *read_ctx;
  int64_t out;     /* bytes written to the spill file */
  int64_t max_out; /* 0: none */
  char name[256];
} pq_ctx;

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

/* Appends one member to the spill file and the group. */
static mml_status put_member(pq_ctx *c, const char *name, const void *p, size_t n, mml_err *err) {
  mml_index_shard *sh = shard_of(c->b);
  if (c->max_out > 0 && c->out + (int64_t)n > c->max_out)
    return mml_err_set(err, MML_ERECORD,
                       "data shard %s: its rows pass max_shard_bytes=%lld bytes of records and "
                       "media; refused (raise max_shard_bytes for a genuine shard this large)",
                       sh->path, (long long)c->max_out);
  mml_status st = ix_spill_write(c->b, p, n, err);
  if (!st && ix_tar_member(c->b, name, c->out, (int64_t)n)) st = ix_oom(c->b, err);
  c->out += (int64_t)n;
  return st;
}

static mml_status on_row(void *ctx, int64_t row, const char *key, const char *json, size_t len,
                         const mml_pq_blob *blobs, int nblobs, mml_err *err) {
  (void)row;
  pq_ctx *c = ctx;
  snprintf(c->name, sizeof c->name, "%s.json", key);
  mml_status st = put_member(c, c->name, json, len, err);
  for (int k = 0; !st && k < nblobs; k++)
    st = put_member(c, blobs[k].name, blobs[k].data, blobs[k].len, err);
  return st;
}

static mml_status build(pq_ctx *c, int64_t size, mml_err *err) {
  mml_index_builder *b = c->b;
  mml_index_shard *sh = shard_of(b);
  mml_pq_limits lim = {.max_chunk_bytes = b->ix->limits.max_chunk_bytes,
                       .max_rows = b->ix->limits.max_records};
  mml_pq_file *f;
  char name[4200];
  snprintf(name, sizeof name, "data shard %s", sh->path);
  mml_status st = mml_pq_open(name, size, c->read, c->read_ctx, mml_record_keys, &lim, &f, err);
  if (st) return st;
  for (int g = 0; !st && g < mml_pq_row_groups(f); g++) {
    if (mml_cancelled(b->ix->cancel))
      st = mml_err_set(err, MML_ECANCELLED, "data shard %s: indexing cancelled", sh->path);
    else
      st = mml_pq_read_row_group(f, g, on_row, c, b->ix->cancel, err);
  }
  mml_pq_close(f);
  return st;
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
  char dir[4096];
  if ((sh->fd = ix_spill_open(dir, sizeof dir)) < 0)
    st = mml_err_set(err, MML_EIO,
                     "data shard %s: cannot create a file for its decoded rows in %s: %s (TMPDIR "
                     "chooses the folder)",
                     path, dir, strerror(errno));
  pq_ctx c = {.b = b, .read = read, .read_ctx = read_ctx, .max_out = ix->limits.max_text_bytes};
  if (!st) st = build(&c, size, err);
  if (st) {
    mml_index_abort(b);
    return st;
  }
  b->raw_off = size; /* the shard's size as stored */
  return mml_index_end(b, err);
}

mml_status ix_add_parquet(mml_index *ix, const char *path, int fd, int64_t size, mml_err *err) {
  local_file lf = {fd, path};
  return mml_index_add_parquet(ix, path, size, read_at, &lf, err);
}
