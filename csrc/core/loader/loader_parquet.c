/*
 * loader_parquet.c — rows of Parquet shards for the workers, the planning pass and the
 * index builder: a cache of row groups being read, and a row copied out of it.
 *
 * DESIGN
 *   A Parquet shard's sample is a row, addressed (shard, row group, row) (index_parquet.c).
 *   A row group in the cache is an entry: a reader handle that has begun the group
 *   (mml_pq_group_begin) and the rows it has assembled so far, in order, each row's JSON
 *   and its blobs (views of the reader's page buffers, no copy).  A sample that needs row
 *   r copies it out (ld_pq_read_row) once the entry has it; when it does not yet, the
 *   sample's thread advances the reader itself up to row r (mml_pq_group_rows: only the
 *   pages up to r's are read, by range: a local pread or a ranged GET through the
 *   loader's fetcher) unless another thread is advancing it, then it waits for that one.
 *   So the first sample of a row group waits for its own pages, not the whole group's
 *   image bytes, and the group's decoding is spread over the threads that need its rows.
 *   Its images are then copied from that row as a WebDataset sample's members are read
 *   from its tar.
 *
 * Invariants (tests/test_parquet.py cites them as P1..P5):
 *   P1. One reader per row group: a row is assembled once (rows in order, by whichever
 *       thread needs the next one first); a sample whose row is not assembled yet waits
 *       (one condition variable) while another thread advances the reader, else advances
 *       it itself.  Rows never come out of order, so the cache's content does not depend
 *       on thread count or timing.
 *   P2. Bounded: entries nobody is copying from or advancing are evicted, least recently
 *       used first, once the cache holds more than its room (a quarter of max_memory,
 *       else 512 MiB); an evicted group begun again reads its pages again.  Entries in
 *       use are never evicted, so at most one entry per thread plus the room are held.
 *       Under max_memory the room is set aside out of the cap (ld_pq_reserved: admission
 *       counts it as held), so the cache and everything admission admits fit the cap
 *       together.
 *   P3. Same bytes as the whole-group decode it replaces: a row's JSON and blobs are
 *       exactly what mml_pq_read_row_group gives, named "<key>.<k>.<ext>" as members were.
 *   P4. A failure stops the group at the row it surfaced at: that row and every later one
 *       get its error (naming shard, row group, column); rows before it stay delivered.
 *       A cancelled or failed fetch is not kept (the next sample begins the group
 *       again), a malformed group is (its later rows fail at once, with the same message).
 *   P5. Interruptible: readers stop soon after the cancel flag they are given is set
 *       (every read checks it, every 64 rows; ranged GETs within ~50 ms).
 *
 * Threads: any thread; one mutex (mu) guards the entry list, each entry's state, rows
 * published and advancing flag, the idle handles and the counters; nothing is read or
 * decoded with it held.  A row is written only by the advancing thread before it is
 * published (rows_done), and never changed after.  Lock order: L->mu is never taken
 * with mu held (the fetcher is obtained before).  Each entry uses its own reader handle
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
  size_t name;         /* offset into the row's text */
  const uint8_t *data; /* in the entry's reader's page buffers */
  size_t len;
} pq_blob_at;

typedef struct pq_row_at {
  char *text; /* its JSON (NUL), then its blobs' names (NUL each) */
  size_t json_len;
  pq_blob_at *blobs; /* nblobs */
  int nblobs;
} pq_row_at;

typedef struct pq_reader pq_reader;

typedef struct pq_entry {
  int shard, g, state, refs, keep_failed, advancing;
  uint64_t used; /* LRU tick */
  int64_t row0, nrows, rows_done;
  pq_row_at *rows; /* nrows; the first rows_done published */
  pq_reader *r;    /* the reader that has begun the group (NULL until the first row) */
  int64_t bytes;   /* counted in the cache's bytes */
  mml_status st;
  mml_err err;
  struct pq_entry *next;
} pq_entry;

struct pq_reader {
  ld_pq_cache *c;
  int shard;
  mml_fetcher *f; /* remote shards */
  const mml_cancel *cancel;
  mml_pq_file *pf;
  struct pq_reader *next;
};

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

/* Frees e, its reader's group buffers released and the reader kept idle (mu held, or e
 * unreachable). */
static void entry_free_locked(ld_pq_cache *c, pq_entry *e) {
  for (int64_t i = 0; e->rows && i < e->rows_done; i++) {
    free(e->rows[i].text);
    free(e->rows[i].blobs);
  }
  free(e->rows);
  if (e->r) {
    mml_pq_group_end(e->r->pf);
    e->r->next = c->idle[e->r->shard];
    c->idle[e->r->shard] = e->r;
  }
  free(e);
}

/* The bytes e holds now: its rows and its reader's group buffers (advancing thread). */
static int64_t entry_bytes(const pq_entry *e) {
  int64_t n = e->nrows * (int64_t)sizeof(pq_row_at);
  for (int64_t i = 0; i < e->rows_done; i++)
    n +=
        (int64_t)(e->rows[i].json_len + 1) + e->rows[i].nblobs * (int64_t)(sizeof(pq_blob_at) + 32);
  return n + (e->r ? mml_pq_group_held(e->r->pf) : 0);
}

/* Row i of e, stored as it is delivered (its blobs' bytes stay in the reader's pages). */
static mml_status on_row(void *ctx, int64_t row, const char *key, const char *json, size_t len,
                         const mml_pq_blob *blobs, int nblobs, mml_err *err) {
  (void)key;
  pq_entry *e = ctx;
  int64_t i = row - e->row0;
  if (i != e->rows_done || i >= e->nrows)
    return mml_err_set(err, MML_EINTERNAL, "Parquet row %lld out of order", (long long)row);
  size_t n = len + 1;
  for (int k = 0; k < nblobs; k++) n += strlen(blobs[k].name) + 1;
  pq_row_at *r = &e->rows[i];
  if (!(r->text = malloc(n)) ||
      (nblobs && !(r->blobs = malloc((size_t)nblobs * sizeof *r->blobs)))) {
    free(r->text);
    r->text = NULL;
    return mml_err_set(err, MML_ENOMEM, "out of memory for a Parquet row");
  }
  memcpy(r->text, json, len + 1);
  r->json_len = len;
  size_t at = len + 1;
  for (int k = 0; k < nblobs; k++) {
    size_t nl = strlen(blobs[k].name) + 1;
    memcpy(r->text + at, blobs[k].name, nl);
    r->blobs[k] = (pq_blob_at){at, blobs[k].data, blobs[k].len};
    at += nl;
  }
  r->nblobs = nblobs;
  return MML_OK;
}

typedef struct advance_ctx {
  ld_pq_cache *c;
  pq_entry *e;
} advance_ctx;

/* Publishes each row as it is assembled (waiters for it wake). */
static mml_status publish_row(void *ctx, int64_t row, const char *key, const char *json, size_t len,
                              const mml_pq_blob *blobs, int nblobs, mml_err *err) {
  advance_ctx *a = ctx;
  mml_status st = on_row(a->e, row, key, json, len, blobs, nblobs, err);
  if (st) return st;
  pthread_mutex_lock(&a->c->mu);
  a->e->rows_done++;
  pthread_cond_broadcast(&a->c->cv);
  pthread_mutex_unlock(&a->c->mu);
  return MML_OK;
}

/* Advances e's reader up to row `upto` (exclusive; the file's row numbers), beginning
 * the group first (mu not held; e->advancing is this thread's). */
static mml_status advance(ld_pq_cache *c, pq_entry *e, int64_t upto, const mml_cancel *cancel,
                          mml_err *err) {
  mml_status st = MML_OK;
  if (!e->r) {
    pq_reader *r = NULL;
    if ((st = take_reader(c, e->shard, cancel, &r, err))) return st;
    if ((st = mml_pq_group_begin(r->pf, e->g, err))) {
      give_reader(c, r);
      return st;
    }
    pthread_mutex_lock(&c->mu);
    e->r = r;
    pthread_mutex_unlock(&c->mu);
  } else {
    mml_fetcher *f = NULL;
    if (mml_path_is_remote(c->L->ix.shards[e->shard].path) && (st = ld_get_fetcher(c->L, &f, err)))
      return st;
    e->r->f = f, e->r->cancel = cancel;
  }
  advance_ctx a = {c, e};
  return mml_pq_group_rows(e->r->pf, upto, publish_row, &a, cancel, err);
}

/* Drops entries nobody uses, least recently used first, while above the room (mu). */
static void evict_locked(ld_pq_cache *c) {
  while (c->bytes > c->room) {
    pq_entry **victim = NULL;
    for (pq_entry **p = &c->entries; *p; p = &(*p)->next)
      if (!(*p)->refs && !(*p)->advancing && (!victim || (*p)->used < (*victim)->used)) victim = p;
    if (!victim) return;
    pq_entry *e = *victim;
    *victim = e->next;
    c->bytes -= e->bytes;
    entry_free_locked(c, e);
  }
}

static void unlink_locked(ld_pq_cache *c, pq_entry *e) {
  for (pq_entry **p = &c->entries; *p; p = &(*p)->next)
    if (*p == e) {
      *p = e->next;
      c->bytes -= e->bytes;
      entry_free_locked(c, e);
      return;
    }
}

static void release(ld_pq_cache *c, pq_entry *e) {
  pthread_mutex_lock(&c->mu);
  if (--e->refs == 0 && e->state == E_FAILED && !e->keep_failed) unlink_locked(c, e);
  evict_locked(c);
  pthread_mutex_unlock(&c->mu);
}

/* A new entry for row group g of shard, listed (mu held). */
static pq_entry *entry_new_locked(ld_pq_cache *c, int shard, int g) {
  const mml_pq_file *pf = mml_index_shard_parquet(&c->L->ix.shards[shard]);
  pq_entry *e = calloc(1, sizeof *e);
  if (!e) return NULL;
  e->shard = shard, e->g = g, e->state = E_LOADING;
  e->row0 = mml_pq_row_group_first(pf, g);
  e->nrows = mml_pq_row_group_first(pf, g + 1) - e->row0;
  if (!(e->rows = calloc((size_t)e->nrows + 1, sizeof *e->rows))) {
    free(e);
    return NULL;
  }
  e->bytes = entry_bytes(e);
  c->bytes += e->bytes;
  if (c->bytes > c->peak) c->peak = c->bytes;
  e->next = c->entries;
  c->entries = e;
  c->decodes++;
  return e;
}

/* Row `row` of shard's row group g assembled, its entry held (released with release()). */
static mml_status acquire(ld_pq_cache *c, int shard, int g, int64_t row, const mml_cancel *cancel,
                          pq_entry **out, mml_err *err) {
  pthread_mutex_lock(&c->mu);
  pq_entry *e = c->entries;
  while (e && !(e->shard == shard && e->g == g && (e->state != E_FAILED || e->keep_failed)))
    e = e->next;
  if (!e && !(e = entry_new_locked(c, shard, g))) {
    pthread_mutex_unlock(&c->mu);
    return mml_err_set(err, MML_ENOMEM, "out of memory");
  }
  e->refs++;
  mml_status st = MML_OK;
  for (;;) { /* P1 */
    if (row - e->row0 < e->rows_done) break;
    if (e->state == E_FAILED) {
      st = e->st;
      if (err) *err = e->err;
      break;
    }
    if (e->advancing) {
      pthread_cond_wait(&c->cv, &c->mu);
      continue;
    }
    e->advancing = 1;
    int64_t before = e->bytes;
    pthread_mutex_unlock(&c->mu);
    mml_err a_err;
    mml_status ast = advance(c, e, row + 1, cancel, &a_err);
    int64_t now = entry_bytes(e);
    pthread_mutex_lock(&c->mu);
    e->advancing = 0;
    e->bytes = now;
    c->bytes += now - before;
    if (c->bytes > c->peak) c->peak = c->bytes;
    if (ast) {
      e->state = E_FAILED;
      e->st = ast, e->err = a_err;
      /* P4: a malformed row group stays refused; a cancelled or failed read is tried again */
      e->keep_failed = ast == MML_ERECORD;
    } else if (e->rows_done == e->nrows) {
      e->state = E_READY;
    }
    pthread_cond_broadcast(&c->cv);
  }
  e->used = ++c->tick;
  pthread_mutex_unlock(&c->mu);
  if (st) {
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
    entry_free_locked(c, e);
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

int64_t ld_pq_reserved(const mml_loader *L) {
  return L->pqc && L->cfg.max_memory > 0 ? L->pqc->room : 0; /* P2; room is fixed at creation */
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
  mml_status st = acquire(c, shard, mml_pq_row_group_of(pf, row), row, cancel, &e, err);
  if (st) return st;
  const pq_row_at *ra = &e->rows[row - e->row0]; /* published: read without mu */
  size_t n = ra->json_len + 1;
  for (int k = 0; k < ra->nblobs; k++)
    n += strlen(ra->text + ra->blobs[k].name) + 1 + ra->blobs[k].len;
  mml_bytes_clear(&out->buf);
  out->n = 0;
  if (ra->nblobs > out->cap) {
    void *p = realloc(out->blob, (size_t)ra->nblobs * sizeof *out->blob);
    if (p) out->blob = p, out->cap = ra->nblobs;
  }
  if (mml_bytes_reserve(&out->buf, n) || ra->nblobs > out->cap) {
    release(c, e);
    return mml_err_set(err, MML_ENOMEM, "out of memory for a Parquet row");
  }
  mml_bytes_append(&out->buf, ra->text, ra->json_len + 1);
  out->json_len = ra->json_len;
  for (int k = 0; k < ra->nblobs; k++) { /* name NUL bytes, as stored */
    const char *name = ra->text + ra->blobs[k].name;
    size_t nl = strlen(name) + 1, at = out->buf.len;
    mml_bytes_append(&out->buf, name, nl);
    mml_bytes_append(&out->buf, ra->blobs[k].data, ra->blobs[k].len);
    out->blob[out->n].name = at;
    out->blob[out->n].data = at + nl;
    out->blob[out->n].len = ra->blobs[k].len;
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
