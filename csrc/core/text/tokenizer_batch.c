/*
 * tokenizer_batch.c — a pool of per-thread encode state and the threaded batch encoder
 * (mml_tok_pool, mml_tokenizer_encode_batch; see mml/tokenizer.h).
 *
 * Pool.  A slot is a scratch (word cache, BPE buffers) plus an id buffer; both keep their
 * capacity between uses, so steady-state encodes allocate nothing.  The pool is a stack
 * of at most `max` idle slots behind one mutex, held only to pop or push: a get on an
 * empty pool makes a new slot, a put on a full pool frees it.  A slot is used by one
 * thread at a time (whoever got it), so scratch caches are never shared.
 *
 * Batch.  The calling thread plus nthreads-1 new threads each take one slot and pull
 * text indices from one atomic counter, appending each text's ids to their own slot's id
 * buffer and recording (owner slot, offset, length) for that index.  Results therefore
 * come back in input order whatever thread encoded what (mml_tok_batch_ids(b, i)), with
 * no copy of the ids.  Threads never touch another's slot; the per-index records are
 * written by one thread each and read after the joins.  On the first failure a flag stops
 * every thread before it takes another index; an index taken is always encoded, and
 * indices are taken in order, so every index below a failing one is encoded and the error
 * kept (the lowest failing index, under a mutex) is the same whatever the timing; it is
 * prefixed "texts[i]".  If a thread cannot be created the others (and the
 * caller) do its share.  The batch owns its slots until mml_tok_batch_free returns them
 * to the pool; the tokenizer and texts are only read, and must outlive the call.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "mml/tokenizer.h"

#define BATCH_MAX_THREADS 256

struct mml_tok_pool {
  pthread_mutex_t mu; /* guards slots/n */
  mml_tok_slot **slots;
  int n, max;
};

mml_status mml_tok_pool_new(int max, mml_tok_pool **out) {
  *out = NULL;
  mml_tok_pool *p = calloc(1, sizeof *p);
  if (!p) return MML_ENOMEM;
  p->max = max > 0 ? max : 1;
  if (!(p->slots = calloc((size_t)p->max, sizeof *p->slots))) {
    free(p);
    return MML_ENOMEM;
  }
  pthread_mutex_init(&p->mu, NULL);
  *out = p;
  return MML_OK;
}

static void slot_free(mml_tok_slot *s) {
  if (!s) return;
  mml_tok_scratch_free(s->scratch);
  mml_ids_free(&s->ids);
  free(s);
}

void mml_tok_pool_free(mml_tok_pool *p) {
  if (!p) return;
  for (int i = 0; i < p->n; i++) slot_free(p->slots[i]);
  pthread_mutex_destroy(&p->mu);
  free(p->slots);
  free(p);
}

mml_tok_slot *mml_tok_pool_get(mml_tok_pool *p) {
  mml_tok_slot *s = NULL;
  pthread_mutex_lock(&p->mu);
  if (p->n) s = p->slots[--p->n];
  pthread_mutex_unlock(&p->mu);
  if (s) return s;
  s = calloc(1, sizeof *s);
  if (s && mml_tok_scratch_new(&s->scratch) != MML_OK) {
    free(s);
    s = NULL;
  }
  return s;
}

void mml_tok_pool_put(mml_tok_pool *p, mml_tok_slot *s) {
  if (!s) return;
  mml_ids_clear(&s->ids);
  pthread_mutex_lock(&p->mu);
  if (p->n < p->max) {
    p->slots[p->n++] = s;
    s = NULL;
  }
  pthread_mutex_unlock(&p->mu);
  slot_free(s);
}

/* ---- the batch --------------------------------------------------------------------- */

struct mml_tok_batch {
  mml_tok_pool *pool;
  size_t n, nw;
  uint32_t *owner; /* per text: the slot holding its ids, where, how many */
  size_t *off, *len;
  mml_tok_slot **slots; /* per worker */
};

typedef struct {
  const mml_tokenizer *t;
  const char *const *texts;
  const size_t *lens;
  mml_tok_batch *b;
  atomic_size_t next;
  atomic_int failed;
  pthread_mutex_t err_mu; /* guards st, err, err_index */
  mml_status st;
  mml_err err;
  size_t err_index;
} batch_run;

typedef struct {
  batch_run *run;
  uint32_t w;
} batch_arg;

static void batch_fail(batch_run *r, size_t i, mml_status st, const mml_err *err) {
  pthread_mutex_lock(&r->err_mu);
  if (!r->st || i < r->err_index) {
    r->st = st;
    r->err_index = i;
    r->err = *err;
    if (!r->err.msg[0]) mml_err_set(&r->err, st, "%s", mml_status_message(st));
  }
  pthread_mutex_unlock(&r->err_mu);
  atomic_store(&r->failed, 1);
}

static void *batch_worker(void *p) {
  batch_arg *a = p;
  batch_run *r = a->run;
  mml_tok_batch *b = r->b;
  mml_tok_slot *slot = b->slots[a->w];
  while (!atomic_load(&r->failed)) {
    size_t i = atomic_fetch_add(&r->next, 1); /* an index taken is always encoded */
    if (i >= b->n) break;
    mml_err err = {0};
    size_t before = slot->ids.len;
    mml_status st =
        mml_tokenizer_encode(r->t, slot->scratch, r->texts[i], r->lens[i], &slot->ids, &err);
    if (st) {
      batch_fail(r, i, st, &err);
      break;
    }
    b->owner[i] = a->w;
    b->off[i] = before;
    b->len[i] = slot->ids.len - before;
  }
  return NULL;
}

void mml_tok_batch_free(mml_tok_batch *b) {
  if (!b) return;
  if (b->slots)
    for (size_t w = 0; w < b->nw; w++) mml_tok_pool_put(b->pool, b->slots[w]);
  free(b->owner);
  free(b->off);
  free(b->len);
  free(b->slots);
  free(b);
}

/* The batch with its per-text records and nw slots from the pool; NULL: out of memory. */
static mml_tok_batch *batch_new(mml_tok_pool *pool, size_t n, size_t nw) {
  mml_tok_batch *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->pool = pool;
  b->n = n;
  b->owner = malloc((n + 1) * sizeof *b->owner);
  b->off = malloc((n + 1) * sizeof *b->off);
  b->len = malloc((n + 1) * sizeof *b->len);
  b->slots = calloc(nw, sizeof *b->slots);
  int ok = b->owner && b->off && b->len && b->slots;
  if (b->slots) b->nw = nw;
  for (size_t w = 0; ok && w < nw; w++) ok = (b->slots[w] = mml_tok_pool_get(pool)) != NULL;
  if (!ok) {
    mml_tok_batch_free(b);
    return NULL;
  }
  return b;
}

/* Runs the workers: the caller is worker 0, threads 1..nw-1 are created (those that
 * cannot be are left out: the others do their share) and joined. */
static mml_status batch_threads(batch_run *r, size_t nw) {
  pthread_t *tids = calloc(nw, sizeof *tids);
  batch_arg *args = calloc(nw, sizeof *args);
  if (!tids || !args) {
    free(tids);
    free(args);
    return MML_ENOMEM;
  }
  for (size_t w = 0; w < nw; w++) args[w] = (batch_arg){r, (uint32_t)w};
  size_t started = 1;
  for (size_t w = 1; w < nw; w++) {
    if (pthread_create(&tids[w], NULL, batch_worker, &args[w]) != 0) break;
    started++;
  }
  batch_worker(&args[0]);
  for (size_t w = 1; w < started; w++) pthread_join(tids[w], NULL);
  free(tids);
  free(args);
  return MML_OK;
}

mml_status mml_tokenizer_encode_batch(const mml_tokenizer *t, mml_tok_pool *pool,
                                      const char *const *texts, const size_t *lens, size_t n,
                                      size_t nthreads, mml_tok_batch **out, mml_err *err) {
  *out = NULL;
  size_t nw = nthreads ? nthreads : mml_cpu_threads();
  if (nw > n) nw = n;
  if (nw > BATCH_MAX_THREADS) nw = BATCH_MAX_THREADS;
  if (nw == 0) nw = 1;
  mml_tok_batch *b = batch_new(pool, n, nw);
  if (!b) return mml_err_set(err, MML_ENOMEM, "encode_batch: out of memory for %zu texts", n);
  batch_run r = {.t = t, .texts = texts, .lens = lens, .b = b};
  atomic_init(&r.next, 0);
  atomic_init(&r.failed, 0);
  pthread_mutex_init(&r.err_mu, NULL);
  mml_status st = batch_threads(&r, nw);
  pthread_mutex_destroy(&r.err_mu);
  if (st) {
    mml_tok_batch_free(b);
    return mml_err_set(err, st, "encode_batch: out of memory for %zu threads", nw);
  }
  if (r.st) {
    if (err) {
      *err = r.err;
      mml_err_prefix(err, "texts[%zu]", r.err_index);
    }
    mml_tok_batch_free(b);
    return r.st;
  }
  *out = b;
  return MML_OK;
}

size_t mml_tok_batch_size(const mml_tok_batch *b) { return b->n; }

const int32_t *mml_tok_batch_ids(const mml_tok_batch *b, size_t i, size_t *len) {
  *len = b->len[i];
  const int32_t *ids = b->slots[b->owner[i]]->ids.data;
  return ids ? ids + b->off[i] : ids; /* NULL: no id at all in that slot */
}
