/*
 * loader_parquet.c — rows of Parquet shards for the workers, the planning pass and the
 * index builder: a cache of decoded row groups, and a row copied out of it.
 *
 * DESIGN
 *   A Parquet shard's sample is a row, addressed (shard, row group, row) (index_parquet.c).
 *   When a sample needs its record, its row group is decoded (its read columns' chunks
 *   read by range: a local pread or a ranged GET through the loader's fetcher) into a
 *   cache entry holding every row's JSON record and embedded blobs; the sample copies its
 *   row out (ld_pq_row) and lets the entry go.  Its images are then copied from that row
 *   as a WebDataset sample's members are read from its tar.
 *
 * Invariants (tests/test_parquet.py cites them as P1..P5):
 *   P1. One decode per row group in flight: a sample that needs a row group being decoded
 *       waits for that decode (one condition variable) instead of reading it again.
 *   P2. Bounded: decoded entries no sample is copying from are evicted, least recently
 *       used first, once the cache holds more than its room (a quarter of max_memory,
 *       else 512 MiB); entries in use are never evicted, so at most one entry per
 *       thread copying plus the room are held.
 *   P3. Same bytes as the decoded copy it replaces: a row's JSON and blobs are exactly
 *       what mml_pq_read_row_group gives, named "<key>.<k>.<ext>" as members were.
 *   P4. A failed decode is every waiter's error (naming shard, row group, column); a
 *       cancelled or failed fetch is not kept (the next sample tries again), a malformed
 *       row group is (its other rows fail at once, with the same message).
 *   P5. Interruptible: decodes stop soon after the cancel flag they are given is set
 *       (per column chunk and every 64 rows; ranged GETs within ~50 ms).
 *
 * Threads: any thread; one mutex (mu) guards the entry list, the idle handles and the
 * counters; nothing is read or decoded with it held.  Lock order: L->mu is never taken
 * with mu held (the fetcher is obtained before).  Each decode uses its own reader handle
 * (mml_pq_clone of the shard's, kept idle per shard for reuse).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loader_int.h"
#include "mml/fetch_sync.h"

enum { E_LOADING = 0, E_READY, E_FAILED };

typedef struct pq_blob_at {
  size_t name, data, len; /* offsets into the entry's bytes */
} pq_blob_at;

typedef struct pq_entry {
  int shard, g, state, refs, keep_failed;
  uint64_t used; /* LRU tick */
  int64_t row0, nrows;
  mml_bytes data;    /* per row: its JSON (NUL), then its blobs' names (NUL) and bytes */
  size_t *json;      /* nrows: offset of the row's JSON; its length in json_len */
  size_t *json_len;  /* nrows */
  int64_t *blob0;    /* nrows + 1: the row's first blob in blobs */
  pq_blob_at *blobs; /* nblobs */
  int64_t nblobs, blobs_cap, rows_done;
  mml_status st;
  mml_err err;
  struct pq_entry *next;
} pq_entry;

typedef struct pq_reader {
  ld_pq_cache *c;
  int shard;
  mml_fetcher *f; /* remote shards */
  const mml_cancel *cancel;
  mml_pq_file *pf;
  struct pq_reader *next;
} pq_reader;

struct ld_pq_cache {
  mml_loader *L;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pq_entry *entries;
  pq_reader **idle; /* per shard: handles not in use */
  int *fd;          /* per shard: the local file (-1: not open or remote) */
  int nshards;
  int64_t bytes, room, peak;
  uint64_t tick, decodes, read_bytes;
};

/* ---- reads -------------------------------------------------------------------------- */

static mml_status local_fd(ld_pq_cache *c, int shard, int *fd, mml_err *err) {
  const char *path = c->L->ix.shards[shard].path;
  pthread_mutex_lock(&c->mu);
  if (c->fd[shard] < 0) c->fd[shard] = open(path, O_RDONLY | O_CLOEXEC);
  *fd = c->fd[shard];
  int e = errno;
  pthread_mutex_unlock(&c->mu);
  if (*fd < 0) return mml_err_set(err, MML_EIO, "data shard %s: %s", path, strerror(e));
  return MML_OK;
}

static mml_status read_range(void *ctx, int64_t off, int64_t len, mml_bytes *out, mml_err *err) {
  pq_reader *r = ctx;
  ld_pq_cache *c = r->c;
  const char *path = c->L->ix.shards[r->shard].path;
  mml_status st;
  if (mml_cancelled(r->cancel))
    return mml_err_set(err, MML_ECANCELLED, "data shard %s: reading cancelled", path);
  if (r->f) {
    st = mml_fetch_get_cancellable(r->f, path, off, len, r->cancel, out, err);
    if (st) return mml_err_prefix(err, "data shard %s", path), st;
    if ((int64_t)out->len != len)
      return mml_err_set(err, MML_EFETCH,
                         "data shard %s: a ranged read of %lld bytes at byte %lld returned %lld",
                         path, (long long)len, (long long)off, (long long)out->len);
  } else {
    int fd;
    if ((st = local_fd(c, r->shard, &fd, err))) return st;
    mml_bytes_clear(out);
    if (mml_bytes_reserve(out, (size_t)len + 1))
      return mml_err_set(err, MML_ENOMEM, "data shard %s: out of memory for %lld bytes", path,
                         (long long)len);
    size_t got = 0;
    while ((int64_t)got < len) {
      ssize_t n = pread(fd, out->data + got, (size_t)len - got, off + (off_t)got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        return mml_err_set(err, n < 0 ? MML_EIO : MML_ERECORD,
                           "data shard %s: reading %lld bytes at byte %lld: %s", path,
                           (long long)len, (long long)off,
                           n < 0 ? strerror(errno) : "the file ends");
      got += (size_t)n;
    }
    out->len = got;
  }
  pthread_mutex_lock(&c->mu);
  c->read_bytes += (uint64_t)len;
  pthread_mutex_unlock(&c->mu);
  return MML_OK;
}

/* A reader handle of the shard: an idle one, else a clone of the index's. */
static mml_status take_reader(ld_pq_cache *c, int shard, const mml_cancel *cancel, pq_reader **out,
                              mml_err *err) {
  mml_fetcher *f = NULL;
  const mml_index_shard *sh = &c->L->ix.shards[shard];
  if (mml_path_is_remote(sh->path)) {
    mml_status st = ld_get_fetcher(c->L, &f, err);
    if (st) return st;
  }
  pthread_mutex_lock(&c->mu);
  pq_reader *r = c->idle[shard];
  if (r) c->idle[shard] = r->next;
  pthread_mutex_unlock(&c->mu);
  if (!r) {
    if (!(r = calloc(1, sizeof *r))) return mml_err_set(err, MML_ENOMEM, "out of memory");
    r->c = c, r->shard = shard;
    mml_status st = mml_pq_clone(mml_index_shard_parquet(sh), read_range, r, &r->pf, err);
    if (st) {
      free(r);
      return st;
    }
  }
  r->f = f, r->cancel = cancel;
  *out = r;
  return MML_OK;
}

static void give_reader(ld_pq_cache *c, pq_reader *r) {
  pthread_mutex_lock(&c->mu);
  r->next = c->idle[r->shard];
  c->idle[r->shard] = r;
  pthread_mutex_unlock(&c->mu);
}

/* ---- entries ------------------------------------------------------------------------- */

static void entry_free(pq_entry *e) {
  mml_bytes_free(&e->data);
  free(e->json);
  free(e->json_len);
  free(e->blob0);
  free(e->blobs);
  free(e);
}

static int64_t entry_bytes(const pq_entry *e) {
  return (int64_t)e->data.cap + e->nrows * (int64_t)(2 * sizeof(size_t) + sizeof(int64_t)) +
         e->blobs_cap * (int64_t)sizeof(pq_blob_at);
}

static mml_status on_row(void *ctx, int64_t row, const char *key, const char *json, size_t len,
                         const mml_pq_blob *blobs, int nblobs, mml_err *err) {
  (void)key;
  pq_entry *e = ctx;
  int64_t i = row - e->row0;
  if (i != e->rows_done || i >= e->nrows)
    return mml_err_set(err, MML_EINTERNAL, "Parquet row %lld out of order", (long long)row);
  if (e->nblobs + nblobs > e->blobs_cap) {
    int64_t nc = e->blobs_cap ? 2 * e->blobs_cap : 16;
    while (nc < e->nblobs + nblobs) nc *= 2;
    pq_blob_at *b = realloc(e->blobs, (size_t)nc * sizeof *b);
    if (!b) return mml_err_set(err, MML_ENOMEM, "out of memory for a Parquet row group");
    e->blobs = b, e->blobs_cap = nc;
  }
  e->json[i] = e->data.len;
  e->json_len[i] = len;
  e->blob0[i] = e->nblobs;
  if (mml_bytes_append(&e->data, json, len + 1))
    return mml_err_set(err, MML_ENOMEM, "out of memory for a Parquet row group");
  for (int k = 0; k < nblobs; k++) {
    pq_blob_at *b = &e->blobs[e->nblobs++];
    b->name = e->data.len;
    if (mml_bytes_append(&e->data, blobs[k].name, strlen(blobs[k].name) + 1))
      return mml_err_set(err, MML_ENOMEM, "out of memory for a Parquet row group");
    b->data = e->data.len, b->len = blobs[k].len;
    if (mml_bytes_append(&e->data, blobs[k].data, blobs[k].len))
      return mml_err_set(err, MML_ENOMEM, "out of memory for a Parquet row group");
  }
  e->blob0[i + 1] = e->nblobs;
  e->rows_done++;
  return MML_OK;
}

/* Decodes row group e->g of e->shard into e (mu not held). */
static mml_status decode(ld_pq_cache *c, pq_entry *e, const mml_cancel *cancel, mml_err *err) {
  const mml_pq_file *pf = mml_index_shard_parquet(&c->L->ix.shards[e->shard]);
  e->row0 = mml_pq_row_group_first(pf, e->g);
  e->nrows = mml_pq_row_group_first(pf, e->g + 1) - e->row0;
  if (!(e->json = calloc((size_t)e->nrows + 1, sizeof *e->json)) ||
      !(e->json_len = calloc((size_t)e->nrows + 1, sizeof *e->json_len)) ||
      !(e->blob0 = calloc((size_t)e->nrows + 1, sizeof *e->blob0)))
    return mml_err_set(err, MML_ENOMEM, "out of memory for a Parquet row group");
  /* the rows' JSON and blobs take about the read chunks' decoded size: reserved once
   * (a hint from the footer, capped by what a column chunk may decode to in all) */
  int64_t hint = mml_pq_row_group_bytes(pf, e->g) + e->nrows * 64;
  int64_t most = c->L->cfg.max_object_bytes;
  if (hint > 0 && hint <= most && mml_bytes_reserve(&e->data, (size_t)hint))
    return mml_err_set(err, MML_ENOMEM, "out of memory for a Parquet row group");
  pq_reader *r = NULL;
  mml_status st = take_reader(c, e->shard, cancel, &r, err);
  if (st) return st;
  st = mml_pq_read_row_group(r->pf, e->g, on_row, e, cancel, err);
  if (!st && e->rows_done != e->nrows)
    st = mml_err_set(err, MML_ERECORD, "data shard %s: row group %d: %lld rows of %lld",
                     c->L->ix.shards[e->shard].path, e->g, (long long)e->rows_done,
                     (long long)e->nrows);
  give_reader(c, r);
  return st;
}

/* Drops entries nobody uses, least recently used first, while above the room (mu). */
static void evict_locked(ld_pq_cache *c) {
  while (c->bytes > c->room) {
    pq_entry **victim = NULL;
    for (pq_entry **p = &c->entries; *p; p = &(*p)->next)
      if (!(*p)->refs && (*p)->state != E_LOADING && (!victim || (*p)->used < (*victim)->used))
        victim = p;
    if (!victim) return;
    pq_entry *e = *victim;
    *victim = e->next;
    c->bytes -= entry_bytes(e);
    entry_free(e);
  }
}

static void unlink_locked(ld_pq_cache *c, pq_entry *e) {
  for (pq_entry **p = &c->entries; *p; p = &(*p)->next)
    if (*p == e) {
      *p = e->next;
      c->bytes -= entry_bytes(e);
      entry_free(e);
      return;
    }
}

static void release(ld_pq_cache *c, pq_entry *e) {
  pthread_mutex_lock(&c->mu);
  if (--e->refs == 0 && e->state == E_FAILED && !e->keep_failed) unlink_locked(c, e);
  evict_locked(c);
  pthread_mutex_unlock(&c->mu);
}

/* Row group g of shard, decoded and held (released with release()). */
static mml_status acquire(ld_pq_cache *c, int shard, int g, const mml_cancel *cancel,
                          pq_entry **out, mml_err *err) {
  pthread_mutex_lock(&c->mu);
  pq_entry *e = c->entries;
  while (e && !(e->shard == shard && e->g == g && (e->state != E_FAILED || e->keep_failed)))
    e = e->next;
  if (e) { /* P1: decoded, or being decoded by another thread */
    e->refs++;
    while (e->state == E_LOADING) pthread_cond_wait(&c->cv, &c->mu);
    e->used = ++c->tick;
    mml_status st = e->state == E_FAILED ? e->st : MML_OK;
    if (st && err) *err = e->err;
    pthread_mutex_unlock(&c->mu);
    if (st) {
      release(c, e);
      return st;
    }
    *out = e;
    return MML_OK;
  }
  if (!(e = calloc(1, sizeof *e))) {
    pthread_mutex_unlock(&c->mu);
    return mml_err_set(err, MML_ENOMEM, "out of memory");
  }
  e->shard = shard, e->g = g, e->refs = 1, e->state = E_LOADING;
  e->next = c->entries;
  c->entries = e;
  c->decodes++;
  pthread_mutex_unlock(&c->mu);
  mml_err e_err;
  mml_status st = decode(c, e, cancel, &e_err);
  pthread_mutex_lock(&c->mu);
  e->state = st ? E_FAILED : E_READY;
  e->st = st, e->err = e_err;
  /* P4: a malformed row group stays refused; a cancelled or failed read is tried again */
  e->keep_failed = st == MML_ERECORD;
  if (st) { /* its partial rows are not kept */
    mml_bytes_free(&e->data);
    e->nblobs = e->blobs_cap = 0;
    free(e->blobs), e->blobs = NULL;
  }
  e->used = ++c->tick;
  c->bytes += entry_bytes(e);
  if (c->bytes > c->peak) c->peak = c->bytes;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  if (st) {
    if (err) *err = e_err;
    release(c, e);
    return st;
  }
  *out = e;
  return MML_OK;
}

/* ---- the API ---------------------------------------------------------------------------- */

mml_status ld_pq_cache_new(mml_loader *L, mml_err *err) {
  int any = 0;
  for (int k = 0; k < L->ix.nshards; k++) any |= mml_index_shard_parquet(&L->ix.shards[k]) != NULL;
  if (!any) return MML_OK;
  ld_pq_cache *c = calloc(1, sizeof *c);
  if (!c || !(c->idle = calloc((size_t)L->ix.nshards, sizeof *c->idle)) ||
      !(c->fd = malloc((size_t)L->ix.nshards * sizeof *c->fd))) {
    if (c) free(c->idle);
    free(c);
    return mml_err_set(err, MML_ENOMEM, "out of memory");
  }
  for (int k = 0; k < L->ix.nshards; k++) c->fd[k] = -1;
  c->L = L;
  c->nshards = L->ix.nshards;
  c->room = L->cfg.max_memory > 0 ? L->cfg.max_memory / 4 : LD_PQ_DEFAULT_ROOM;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  L->pqc = c;
  return MML_OK;
}

void ld_pq_cache_free(mml_loader *L) {
  ld_pq_cache *c = L->pqc;
  if (!c) return;
  while (c->entries) {
    pq_entry *e = c->entries;
    c->entries = e->next;
    entry_free(e);
  }
  for (int k = 0; k < c->nshards; k++) {
    while (c->idle[k]) {
      pq_reader *r = c->idle[k];
      c->idle[k] = r->next;
      mml_pq_close(r->pf);
      free(r);
    }
    if (c->fd[k] >= 0) close(c->fd[k]);
  }
  free(c->idle);
  free(c->fd);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
  L->pqc = NULL;
}

void ld_pq_cache_stats(const mml_loader *L, ld_pq_stats *s) {
  memset(s, 0, sizeof *s);
  ld_pq_cache *c = L->pqc;
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  s->row_groups_decoded = c->decodes;
  s->bytes_read = c->read_bytes;
  s->cache_bytes = c->bytes;
  s->cache_peak_bytes = c->peak;
  s->cache_room = c->room;
  pthread_mutex_unlock(&c->mu);
}

mml_status ld_pq_read_row(mml_loader *L, int shard, int64_t row, const mml_cancel *cancel,
                          ld_pq_row *out, mml_err *err) {
  ld_pq_cache *c = L->pqc;
  const mml_pq_file *pf = mml_index_shard_parquet(&L->ix.shards[shard]);
  if (!c || !pf) return mml_err_set(err, MML_EINTERNAL, "shard %d is not a Parquet shard", shard);
  out->shard = -1;
  pq_entry *e;
  mml_status st = acquire(c, shard, mml_pq_row_group_of(pf, row), cancel, &e, err);
  if (st) return st;
  int64_t i = row - e->row0;
  int64_t b0 = e->blob0[i], b1 = e->blob0[i + 1];
  size_t n = e->json_len[i] + 1;
  for (int64_t b = b0; b < b1; b++) n += e->blobs[b].len + (e->blobs[b].data - e->blobs[b].name);
  mml_bytes_clear(&out->buf);
  out->n = 0;
  if (b1 - b0 > out->cap) {
    void *p = realloc(out->blob, (size_t)(b1 - b0) * sizeof *out->blob);
    if (p) out->blob = p, out->cap = (int)(b1 - b0);
  }
  if (mml_bytes_reserve(&out->buf, n) || b1 - b0 > out->cap) {
    release(c, e);
    return mml_err_set(err, MML_ENOMEM, "out of memory for a Parquet row");
  }
  mml_bytes_append(&out->buf, e->data.data + e->json[i], e->json_len[i] + 1);
  out->json_len = e->json_len[i];
  for (int64_t b = b0; b < b1; b++) { /* name NUL bytes, as stored */
    const pq_blob_at *s = &e->blobs[b];
    size_t at = out->buf.len;
    mml_bytes_append(&out->buf, e->data.data + s->name, s->data - s->name + s->len);
    out->blob[out->n].name = at;
    out->blob[out->n].data = at + (s->data - s->name);
    out->blob[out->n].len = s->len;
    out->n++;
  }
  release(c, e);
  out->shard = shard;
  out->row = row;
  return MML_OK;
}

void ld_pq_row_free(ld_pq_row *r) {
  mml_bytes_free(&r->buf);
  free(r->blob);
  memset(r, 0, sizeof *r);
}

/* As mml_index_member matches a member: its full name, what follows the key, or its
 * file name (no folders here). */
int ld_pq_row_member(const ld_pq_row *r, const char *ref, const uint8_t **data, size_t *len) {
  for (int k = 0; r->shard >= 0 && k < r->n; k++) {
    const char *name = (const char *)r->buf.data + r->blob[k].name;
    /* the key is "row group G, row R": what follows it starts after the row number */
    const char *tail = strrchr(name, ',');
    tail = tail ? strchr(tail, '.') : NULL;
    if (!strcmp(name, ref) || (tail && !strcmp(tail + 1, ref))) {
      *data = r->buf.data + r->blob[k].data;
      *len = r->blob[k].len;
      return 1;
    }
  }
  return 0;
}

int ld_pq_row_names(const ld_pq_row *r, int (*is_kind)(const char *), const char **names, int max) {
  int n = 0;
  for (int k = 0; r->shard >= 0 && k < r->n; k++) {
    const char *name = (const char *)r->buf.data + r->blob[k].name;
    if (!is_kind(name)) continue;
    if (n < max) names[n] = name;
    n++;
  }
  return n;
}

mml_status ld_pq_blob_copy(const ld_pq_row *r, const char *ref, mml_bytes *out, int *found,
                           mml_err *err) {
  const uint8_t *p;
  size_t n;
  *found = ld_pq_row_member(r, ref, &p, &n);
  if (!*found) return MML_OK;
  mml_bytes_clear(out);
  if (mml_bytes_reserve(out, n + 1) || mml_bytes_append(out, p, n))
    return mml_err_set(err, MML_ENOMEM, "out of memory for a %zu-byte Parquet blob", n);
  out->data[n] = 0;
  return MML_OK;
}
