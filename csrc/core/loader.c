/*
 * loader.c — the engine: worker threads, the sample window, in-order collation, the
 * bounded batch queue, epochs, seeking and stats (see mml/loader.h).
 *
 * DESIGN
 *   Sequence numbers.  Work is numbered by `seq` = 0, 1, 2, ...; a "plan" maps seq to a
 *   stream coordinate (epoch, pos): nominal plans walk pos 0..n_rank-1 and roll over to
 *   the next epoch; a wrap plan (padded mode filling an epoch short of samples after
 *   skips) walks pos = n_rank, n_rank+1, ... within one epoch.  Every change of plan
 *   (seek, epoch end, wrap) bumps `gen` and restarts numbering at head_seq; work of an
 *   older generation is discarded when it completes.
 *
 *   Threads.
 *     workers (num_threads): first emit a finished batch if one is queued (build its
 *       tensors: mostly copying pixels), else take ready tasks (remote bytes arrived),
 *       else dispatch the next seq if it lies in the window [head_seq, head_seq + window)
 *       and its slot is free; run the per-sample pipeline; mark the slot DONE.  A task
 *       waiting on the network holds no thread: the fetch completion (I/O thread) puts
 *       it on the ready list.
 *     collator (1): consumes the slot of head_seq strictly in order, decides epoch
 *       boundaries and batch composition (mml_collator_fits/add/full on one of `ncoll`
 *       collator instances), and hands each complete batch to the workers for emission,
 *       continuing on the next instance meanwhile.  Finished items (batches, and with
 *       on_error="raise" sample errors) wait in `pend` in stream order and move into the
 *       output queue of `prefetch` items as it has room; a full `pend` stops the
 *       collator (backpressure).  Batch composition is sequential, so the output does
 *       not depend on which instance or worker emitted a batch.
 *     consumer (the caller of mml_loader_next): pops items; never does sample work.
 *   Task slots: tasks[seq % window].  A slot is owned by exactly one party at a time:
 *   EMPTY (free), BUSY (a worker or an outstanding fetch), DONE (waiting for collation).
 *
 *   Locking: one mutex `mu` guards all shared state; condition variables work_cv
 *   (workers), coll_cv (collator) and out_cv (consumer).  Sample work, reads, fetch
 *   submission and collation run outside it.  Lock order: mu -> pool (batches are
 *   released under mu on seek/close) and mu -> fetcher internals are never nested the
 *   other way round: fetch completions (the fetcher's I/O thread) take mu, so mu is never
 *   held while calling into a running fetcher (creating it runs no completions).
 *
 *   Ownership: the loader owns the tasks, the collator, the pool's creator reference and
 *   the fetcher; a delivered batch's buffers belong to the consumer (and outlive the
 *   loader).  Shutdown: stop flag + broadcast, join workers and collator, then free the
 *   fetcher (its cancelled completions only touch tasks, which are still allocated).
 *
 *   Determinism: a task's result depends only on (epoch, pos) and the config; the
 *   collator sees results in seq order; so batches never depend on timing.
 */
#include "mml/loader.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mml/device.h"
#include "mml/index.h"
#include "mml/sampler.h"

enum { SLOT_EMPTY = 0, SLOT_BUSY, SLOT_DONE };
enum { STAGE_NEW = 0, STAGE_RECORD, STAGE_IMAGES };
enum { ITEM_BATCH = 0, ITEM_ERROR, ITEM_DROP };
enum { WARN_BACKLOG = 32 };

typedef struct task task;

typedef struct fetch_ref {
  task *t;
  int which; /* -1: the record, else image index */
} fetch_ref;

struct task {
  mml_loader *L;
  /* guarded by mu */
  int state;
  uint64_t gen;
  int64_t seq;
  int pending;             /* outstanding fetches + 1 while submitting */
  mml_status fetch_st;     /* first fetch failure */
  mml_err fetch_err;
  task *next_ready;
  /* owned by whoever holds the slot (BUSY) */
  int stage;
  mml_sample sample;
  mml_bytes rec_bytes;
  mml_record rec;
  int rec_parsed;
  mml_bytes *imgs;
  fetch_ref *refs;
  int imgs_cap;
  mml_bytes path;
};

/* What one task_run call did, added to the stats by the worker (the task itself may
 * already belong to another worker when task_run returns). */
typedef struct run_acc {
  uint64_t bytes;
  double read_s;
} run_acc;

typedef struct out_item {
  int kind;
  int64_t epoch;
  mml_batch batch;
  mml_err err;
} out_item;

enum { PEND_EMPTY = 0, PEND_QUEUED, PEND_EMITTING, PEND_READY };
typedef struct pend_item {
  int state;
  int coll;          /* PEND_QUEUED/EMITTING: the collator instance to emit from */
  mml_cursor after;  /* batch items: the cursor once consumed */
  out_item it;       /* PEND_READY: the item (kind ITEM_DROP: nothing, after a failure) */
} pend_item;

struct mml_loader {
  mml_loader_cfg cfg;       /* strings below are owned copies */
  char **data;
  char *image_root;
  char **roots;             /* per shard image root */
  int *remote;              /* per shard: 1 when remote */
  mml_index ix;
  mml_sampler sm;
  int64_t n_rank, per_epoch; /* per_epoch: batches (padded) or -1 (packed) */
  int window;
  mml_template *tmpl;
  mml_pipeline pl;
  mml_pool *pool;
  mml_allocator alloc;      /* behind pool: host, pinned, or the caller's */
  int pinned;
  int guard_device;         /* pinned: device whose default stream guards released batches */
  int consumer_device;      /* pinned: and this stream of that device, when not 0 */
  uintptr_t consumer_stream; /* (consumer thread only) */
  mml_device_stage *stage;  /* device >= 0: copies finished batches to the GPU */
  mml_collate_cfg ccfg;
  mml_collator *collator;   /* colls[0]; workers also call its const, reentrant check */
  mml_collator **colls;     /* ncoll instances: batches are composed one at a time by the
                               collation thread and emitted (tensors built) by workers */
  int ncoll;

  pthread_mutex_t mu;
  pthread_cond_t work_cv, coll_cv, out_cv;
  int started, stop, closed;
  pthread_t *threads;
  int nthreads_started;
  pthread_t coll_thread;
  int coll_started;

  mml_fetcher *fetcher;     /* created on first remote use (under mu) */
  mml_status fetcher_st;
  mml_err fetcher_err;

  /* plan and window, guarded by mu */
  uint64_t gen;
  int64_t base_epoch, base_pos, base_seq;
  int base_wrap;
  int64_t head_seq, next_seq;
  mml_cursor start;         /* where the collator starts for the current gen */
  task *tasks;
  task *ready_head, *ready_tail;
  int in_flight;

  /* emission, guarded by mu: completed items wait in `pend` (in stream order) until
   * they fit in the output queue; batch items are emitted by a worker first */
  pend_item *pend;
  int npend;                /* capacity */
  int64_t pend_head, pend_tail;
  int jobs_queued;          /* pend items waiting for a worker to emit them */
  int emitting;             /* emits running now */
  int dropping;             /* drop_output_locked is waiting for emits (mu released) */
  int *coll_busy;           /* 1 while a worker emits from colls[i] */

  /* output queue, guarded by mu */
  out_item *outq;
  int out_head, out_count;
  mml_status fatal;
  mml_err fatal_err;

  /* consumer side, guarded by mu */
  int64_t consumer_epoch;
  mml_cursor delivered;

  /* warnings and stats, guarded by mu */
  mml_err warn[WARN_BACKLOG];
  int warn_head, warn_count;
  double first_next, wait_s;
  double read_s, vision_s, text_s, collate_s;
  double decode_s; /* the decoder's part of vision_s */
  uint64_t samples, good, skipped, batches, bytes_read, images;
  uint64_t skip_by_status[MML_STATUS_COUNT];
  int64_t real_tokens, token_slots;
};

/* ------------------------------------------------------------------------------------ */
/* small helpers                                                                        */

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

static char *dirname_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return strdup(".");
  size_t n = (size_t)(slash - path);
  if (n == 0) n = 1; /* "/x.jsonl" -> "/" */
  char *d = malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, path, n);
  d[n] = 0;
  return d;
}

static void deadline_after(struct timespec *ts, double s) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  time_t whole = (time_t)s;
  long ns = (long)((s - (double)whole) * 1e9);
  ts->tv_sec += whole;
  ts->tv_nsec += ns;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

static void plan_at_locked(const mml_loader *L, int64_t seq, int64_t *epoch, int64_t *pos) {
  int64_t k = L->base_pos + (seq - L->base_seq);
  if (L->base_wrap) {
    *epoch = L->base_epoch;
    *pos = k;
  } else {
    *epoch = L->base_epoch + k / L->n_rank;
    *pos = k % L->n_rank;
  }
}

/* Starts a new plan at (epoch, pos) from head_seq; discards finished work of the old one. */
static void rebase_locked(mml_loader *L, int64_t epoch, int64_t pos, int wrap) {
  L->gen++;
  L->base_epoch = epoch;
  L->base_pos = pos;
  L->base_wrap = wrap;
  L->base_seq = L->head_seq;
  L->next_seq = L->head_seq;
  for (int i = 0; i < L->window; i++)
    if (L->tasks[i].state == SLOT_DONE) L->tasks[i].state = SLOT_EMPTY;
  pthread_cond_broadcast(&L->work_cv);
}

/* The engine-side start of a cursor: an epoch that is complete starts the next one. */
static void normalize_cursor(const mml_loader *L, const mml_cursor *c, mml_cursor *out,
                             int *wrap) {
  *out = *c;
  *wrap = 0;
  int done = L->per_epoch >= 0 ? c->batch_in_epoch >= L->per_epoch : c->pos >= L->n_rank;
  if (done) {
    out->epoch = c->epoch + 1;
    out->pos = 0;
    out->batch_in_epoch = 0;
  } else if (c->pos >= L->n_rank) {
    *wrap = 1;
  }
}


static void push_warning_locked(mml_loader *L, const mml_err *e) {
  if (L->warn_count == WARN_BACKLOG) return; /* counted in stats, message dropped */
  L->warn[(L->warn_head + L->warn_count) % WARN_BACKLOG] = *e;
  L->warn_count++;
}

/* ------------------------------------------------------------------------------------ */
/* fetch completions (I/O thread)                                                       */

static mml_status get_fetcher(mml_loader *L, mml_fetcher **out, mml_err *err) {
  pthread_mutex_lock(&L->mu);
  if (!L->fetcher && L->fetcher_st == MML_OK)
    L->fetcher_st = mml_fetcher_new(&L->cfg.fetch, &L->fetcher, &L->fetcher_err);
  mml_status st = L->fetcher_st;
  if (st) *err = L->fetcher_err;
  *out = L->fetcher;
  pthread_mutex_unlock(&L->mu);
  return st;
}

static void ready_push_locked(mml_loader *L, task *t) {
  t->next_ready = NULL;
  if (L->ready_tail) L->ready_tail->next_ready = t;
  else L->ready_head = t;
  L->ready_tail = t;
  pthread_cond_signal(&L->work_cv);
}

static void on_fetch(void *ctx, mml_status st, mml_bytes *body, const mml_err *err);

/* ------------------------------------------------------------------------------------ */
/* the per-sample task (workers)                                                        */

static void task_fail(task *t, mml_status st, const mml_err *e, const mml_loader *L) {
  mml_sample *s = &t->sample;
  s->status = st;
  char where[1100];
  mml_index_name_sample(&L->ix, s->shard, s->index, s->line, where, sizeof where);
  if (e && e->msg[0]) s->err = *e;
  else mml_err_set(&s->err, st, "%s", mml_status_message(st));
  s->err.status = st;
  mml_err_prefix(&s->err, "%s", where);
}

static mml_status task_imgs_fit(task *t, int n) {
  if (n <= t->imgs_cap) return MML_OK;
  int nc = t->imgs_cap ? t->imgs_cap : 4;
  while (nc < n) nc *= 2;
  mml_bytes *p = realloc(t->imgs, (size_t)nc * sizeof *p);
  if (!p) return MML_ENOMEM;
  memset(p + t->imgs_cap, 0, (size_t)(nc - t->imgs_cap) * sizeof *p);
  t->imgs = p;
  fetch_ref *r = realloc(t->refs, (size_t)nc * sizeof *r);
  if (!r) return MML_ENOMEM;
  t->refs = r;
  t->imgs_cap = nc;
  return MML_OK;
}

/* Runs the task as far as it can without waiting.  Returns 1 when the sample is finished
 * (good or failed), 0 when it waits for fetches. */
static int task_run(mml_loader *L, mml_sample_scratch *sc, task *t, run_acc *acc) {
  mml_sample *s = &t->sample;
  mml_err err;
  mml_err_clear(&err);
  mml_status st;
  if (t->stage == STAGE_NEW) {
    int64_t off, len;
    mml_index_locate(&L->ix, s->index, &s->shard, &off, &len, &s->line);
    t->stage = STAGE_RECORD;
    if (L->remote[s->shard]) {
      mml_fetcher *f;
      if ((st = get_fetcher(L, &f, &err))) goto fail;
      if (task_imgs_fit(t, 1)) {
        st = mml_err_set(&err, MML_ENOMEM, "out of memory");
        goto fail;
      }
      t->refs[0].t = t;
      t->refs[0].which = -1;
      pthread_mutex_lock(&L->mu);
      t->pending = 1;
      t->fetch_st = MML_OK;
      pthread_mutex_unlock(&L->mu);
      st = mml_fetch_submit(f, L->ix.shards[s->shard].path, off, len, on_fetch, &t->refs[0],
                            &err);
      if (st) goto fail;
      return 0;
    }
    double t0 = mml_now();
    st = mml_index_read(&L->ix.shards[s->shard], off, len, &t->rec_bytes, &err);
    acc->read_s += mml_now() - t0;
    if (st) goto fail;
    acc->bytes += t->rec_bytes.len;
  }
  if (t->stage == STAGE_RECORD) {
    if (t->fetch_st) {
      st = t->fetch_st;
      err = t->fetch_err;
      goto fail;
    }
    size_t n = mml_index_record_len(&L->ix.shards[s->shard], t->rec_bytes.data,
                                    t->rec_bytes.len);
    if (t->rec_parsed) mml_record_free(&t->rec);
    memset(&t->rec, 0, sizeof t->rec);
    t->rec_parsed = 1;
    double t0 = mml_now();
    st = mml_record_parse((const char *)t->rec_bytes.data, n, &t->rec, &err);
    acc->read_s += mml_now() - t0;
    if (st) goto fail;
    int ni = t->rec.nimages;
    if (task_imgs_fit(t, ni + 1)) {
      st = mml_err_set(&err, MML_ENOMEM, "out of memory");
      goto fail;
    }
    t->stage = STAGE_IMAGES;
    const char *root = L->roots[s->shard];
    int nremote = 0;
    mml_fetcher *f = NULL;
    for (int i = 0; i < ni; i++) {
      if ((st = mml_sample_image_path(root, t->rec.images[i], &t->path, &err))) goto fail;
      const char *p = (const char *)t->path.data;
      mml_bytes_clear(&t->imgs[i]);
      if (mml_path_is_remote(p)) {
        if (!f && (st = get_fetcher(L, &f, &err))) goto fail;
        if (!nremote) {
          pthread_mutex_lock(&L->mu);
          t->pending = 1; /* guard: completions cannot finish the task while submitting */
          t->fetch_st = MML_OK;
          pthread_mutex_unlock(&L->mu);
        }
        nremote++;
        t->refs[i + 1].t = t;
        t->refs[i + 1].which = i;
        pthread_mutex_lock(&L->mu);
        t->pending++;
        pthread_mutex_unlock(&L->mu);
        st = mml_fetch_submit(f, p, 0, -1, on_fetch, &t->refs[i + 1], &err);
        if (st) {
          pthread_mutex_lock(&L->mu);
          t->pending--;
          if (!t->fetch_st) {
            t->fetch_st = st;
            t->fetch_err = err;
          }
          pthread_mutex_unlock(&L->mu);
          break;
        }
      } else {
        double t0 = mml_now();
        st = mml_read_file(p, 0, -1, &t->imgs[i], &err);
        acc->read_s += mml_now() - t0;
        if (st) {
          mml_err_prefix(&err, "image %s", t->rec.images[i]);
          if (!nremote) goto fail;
          pthread_mutex_lock(&L->mu);
          if (!t->fetch_st) {
            t->fetch_st = st;
            t->fetch_err = err;
          }
          pthread_mutex_unlock(&L->mu);
          break;
        }
        acc->bytes += t->imgs[i].len;
      }
    }
    if (nremote) {
      pthread_mutex_lock(&L->mu);
      int last = --t->pending == 0;
      pthread_mutex_unlock(&L->mu);
      if (!last) return 0; /* a completion will re-queue the task */
    }
  }
  /* STAGE_IMAGES: every image's bytes are here */
  if (t->fetch_st) {
    st = t->fetch_st;
    err = t->fetch_err;
    goto fail;
  }
  st = mml_sample_build(&L->pl, sc, &t->rec, t->imgs, s, &err);
  if (st) goto fail;
  st = mml_collator_check(L->collator, s, &err); /* e.g. too long for seq/pack length */
  if (st) goto fail;
  s->status = MML_OK;
  return 1;
fail:
  task_fail(t, st, &err, L);
  return 1;
}


static void on_fetch(void *ctx, mml_status st, mml_bytes *body, const mml_err *err) {
  fetch_ref *r = ctx;
  task *t = r->t;
  mml_loader *L = t->L;
  pthread_mutex_lock(&L->mu);
  if (st == MML_OK) {
    mml_bytes *dst = r->which < 0 ? &t->rec_bytes : &t->imgs[r->which];
    mml_bytes_free(dst);
    *dst = *body; /* take the memory */
    memset(body, 0, sizeof *body);
    L->bytes_read += dst->len;
  } else if (!t->fetch_st) {
    t->fetch_st = st;
    if (err) t->fetch_err = *err;
    else mml_err_set(&t->fetch_err, st, "%s", mml_status_message(st));
    if (r->which >= 0) mml_err_prefix(&t->fetch_err, "image %s", t->rec.images[r->which]);
  }
  if (--t->pending == 0) ready_push_locked(L, t);
  pthread_mutex_unlock(&L->mu);
}

/* ------------------------------------------------------------------------------------ */
/* worker threads                                                                       */

static void emit_job_locked(mml_loader *L);

static void *worker_main(void *arg) {
  mml_loader *L = arg;
  mml_sample_scratch sc;
  mml_err err;
  int have_scratch = mml_sample_scratch_init(&sc, &err) == MML_OK;
  pthread_mutex_lock(&L->mu);
  for (;;) {
    task *t = NULL;
    while (!L->stop) {
      if (L->jobs_queued) { /* emitting a finished batch unblocks the output first */
        emit_job_locked(L);
        continue;
      }
      if (L->ready_head) {
        t = L->ready_head;
        L->ready_head = t->next_ready;
        if (!L->ready_head) L->ready_tail = NULL;
        if (t->gen != L->gen) { /* work of an abandoned plan */
          t->state = SLOT_EMPTY;
          L->in_flight--;
          pthread_cond_broadcast(&L->work_cv);
          t = NULL;
          continue;
        }
        break;
      }
      if (L->next_seq < L->head_seq + L->window &&
          L->tasks[L->next_seq % L->window].state == SLOT_EMPTY) {
        t = &L->tasks[L->next_seq % L->window];
        t->state = SLOT_BUSY;
        t->gen = L->gen;
        t->seq = L->next_seq++;
        t->stage = STAGE_NEW;
        t->fetch_st = MML_OK;
        t->pending = 0;
        mml_sample_reset(&t->sample);
        plan_at_locked(L, t->seq, &t->sample.epoch, &t->sample.pos);
        t->sample.index = mml_sampler_at(&L->sm, t->sample.epoch, t->sample.pos);
        L->in_flight++;
        break;
      }
      pthread_cond_wait(&L->work_cv, &L->mu);
    }
    if (L->stop) break;
    pthread_mutex_unlock(&L->mu);

    int finished;
    run_acc acc = {0, 0};
    sc.vision_s = sc.text_s = 0;
    double decode0 = have_scratch ? mml_vision_scratch_decode_s(sc.vision) : 0;
    if (have_scratch) {
      finished = task_run(L, &sc, t, &acc);
    } else {
      task_fail(t, MML_ENOMEM, &err, L);
      finished = 1;
    }

    pthread_mutex_lock(&L->mu);
    L->read_s += acc.read_s;
    L->vision_s += sc.vision_s;
    if (have_scratch) L->decode_s += mml_vision_scratch_decode_s(sc.vision) - decode0;
    L->text_s += sc.text_s;
    L->bytes_read += acc.bytes;
    if (finished) {
      if (t->sample.status == MML_OK) L->images += (uint64_t)t->sample.nimages;
      L->in_flight--;
      if (t->gen == L->gen) {
        t->state = SLOT_DONE;
        if (t->seq == L->head_seq) pthread_cond_signal(&L->coll_cv);
      } else {
        t->state = SLOT_EMPTY;
        pthread_cond_broadcast(&L->work_cv);
      }
    }
  }
  pthread_mutex_unlock(&L->mu);
  if (have_scratch) mml_sample_scratch_free(&sc);
  return NULL;
}

/* ------------------------------------------------------------------------------------ */
/* the collation thread                                                                 */

static void set_fatal_locked(mml_loader *L, mml_status st, const mml_err *e) {
  if (L->fatal) return;
  L->fatal = st;
  L->fatal_err = *e;
  L->fatal_err.status = st;
  pthread_cond_broadcast(&L->out_cv);
}

/* Builds the batch, then (device >= 0) queues its copy to the GPU and hands out the
 * device batch instead; the host batch's buffers carry the copy's fence. */
static mml_status emit_batch(mml_loader *L, mml_collator *C, mml_batch *out, mml_err *err) {
  mml_status st = mml_collator_emit(C, out, err);
  if (st || !L->stage) return st;
  mml_batch dev;
  memset(&dev, 0, sizeof dev);
  st = mml_device_stage_copy(L->stage, out, &dev, err);
  mml_batch_clear(out);
  if (!st) *out = dev;
  return st;
}

/* Moves finished items, in stream order, from `pend` into the output queue while it has
 * room.  Called by whoever changes either: workers (an emit finished), the collator (an
 * error item), the consumer (popped one). */
static void move_ready_locked(mml_loader *L) {
  int moved = 0;
  while (L->pend_head < L->pend_tail) {
    pend_item *p = &L->pend[L->pend_head % L->npend];
    if (p->state != PEND_READY) break;
    if (p->it.kind != ITEM_DROP) {
      if (L->out_count == L->cfg.prefetch) break;
      L->outq[(L->out_head + L->out_count) % L->cfg.prefetch] = p->it;
      L->out_count++;
    }
    memset(p, 0, sizeof *p);
    L->pend_head++;
    moved = 1;
  }
  if (moved) {
    pthread_cond_broadcast(&L->out_cv);
    pthread_cond_broadcast(&L->coll_cv); /* pend has room */
  }
}

/* Drops everything queued or pending (seek, close); waits for running emits first. */
static void drop_output_locked(mml_loader *L) {
  /* While this waits (mu released) a seek's new gen is already visible: `dropping` keeps
   * the collator from starting on it, or the drop below would discard its new batches and
   * clear coll_busy under an instance that still holds samples. */
  L->dropping++;
  while (L->emitting) pthread_cond_wait(&L->out_cv, &L->mu);
  L->dropping--;
  while (L->out_count) {
    out_item *it = &L->outq[L->out_head];
    mml_batch_clear(&it->batch);
    L->out_head = (L->out_head + 1) % L->cfg.prefetch;
    L->out_count--;
  }
  L->out_head = 0;
  for (; L->pend_head < L->pend_tail; L->pend_head++) {
    pend_item *p = &L->pend[L->pend_head % L->npend];
    mml_batch_clear(&p->it.batch);
    memset(p, 0, sizeof *p);
  }
  L->pend_head = L->pend_tail = 0;
  L->jobs_queued = 0;
  for (int i = 0; i < L->ncoll; i++) L->coll_busy[i] = 0;
  pthread_cond_broadcast(&L->coll_cv);
}

/* Reserves the next pend slot in stream order; waits for room.  NULL when the item must
 * be abandoned (stop, or a seek replaced the plan: gen changed). */
static pend_item *pend_reserve_locked(mml_loader *L, uint64_t my_gen) {
  while (!L->stop && L->gen == my_gen && L->pend_tail - L->pend_head == L->npend)
    pthread_cond_wait(&L->coll_cv, &L->mu);
  if (L->stop || L->gen != my_gen) return NULL;
  pend_item *p = &L->pend[L->pend_tail % L->npend];
  memset(p, 0, sizeof *p);
  L->pend_tail++;
  return p;
}

/* The batch in colls[*ci] is complete: queue it for emission by a worker and move on to
 * the next instance (waiting until no worker is still emitting from it).  Returns 0 when
 * abandoned (stop or seek). */
static int hand_off_locked(mml_loader *L, uint64_t my_gen, int *ci, int64_t epoch,
                           mml_cursor after) {
  pend_item *p = pend_reserve_locked(L, my_gen);
  if (!p) return 0;
  p->state = PEND_QUEUED;
  p->coll = *ci;
  p->after = after;
  p->it.kind = ITEM_BATCH;
  p->it.epoch = epoch;
  L->coll_busy[*ci] = 1;
  L->jobs_queued++;
  pthread_cond_signal(&L->work_cv);
  *ci = (*ci + 1) % L->ncoll;
  while (!L->stop && L->gen == my_gen && L->coll_busy[*ci])
    pthread_cond_wait(&L->coll_cv, &L->mu);
  return !L->stop && L->gen == my_gen;
}

/* A worker emits the oldest queued batch (called with mu held, returns with it held). */
static void emit_job_locked(mml_loader *L) {
  pend_item *p = NULL;
  for (int64_t k = L->pend_head; k < L->pend_tail; k++) {
    pend_item *q = &L->pend[k % L->npend];
    if (q->state == PEND_QUEUED) {
      p = q;
      break;
    }
  }
  if (!p) return; /* cannot happen while jobs_queued > 0 */
  p->state = PEND_EMITTING;
  L->jobs_queued--;
  L->emitting++;
  int ci = p->coll;
  mml_batch b;
  memset(&b, 0, sizeof b);
  mml_err err;
  mml_err_clear(&err);
  pthread_mutex_unlock(&L->mu);
  double t0 = mml_now();
  mml_status st = emit_batch(L, L->colls[ci], &b, &err);
  double dt = mml_now() - t0;
  pthread_mutex_lock(&L->mu);
  L->collate_s += dt;
  L->emitting--;
  L->coll_busy[ci] = 0;
  if (st) {
    set_fatal_locked(L, st, &err);
    p->it.kind = ITEM_DROP;
  } else {
    b.after = p->after;
    p->it.batch = b;
  }
  p->state = PEND_READY;
  move_ready_locked(L);
  pthread_cond_broadcast(&L->coll_cv); /* the instance is free */
  if (!L->emitting) pthread_cond_broadcast(&L->out_cv); /* a seek may wait for this */
}

static void *collator_main(void *arg) {
  mml_loader *L = arg;
  mml_err err;
  mml_err_clear(&err);
  mml_sample s;
  memset(&s, 0, sizeof s);
  pthread_mutex_lock(&L->mu);
  uint64_t my_gen = L->gen - 1; /* forces a sync */
  int64_t epoch = 0, bie = 0, since_good = 0;
  int ci = 0; /* the instance composing the current batch (never busy) */
  while (!L->stop) {
    if (L->fatal) {
      pthread_cond_wait(&L->coll_cv, &L->mu);
      continue;
    }
    if (L->gen != my_gen) { /* a seek (it dropped pending output): start over */
      my_gen = L->gen;
      while ((L->emitting || L->dropping) && !L->stop) pthread_cond_wait(&L->coll_cv, &L->mu);
      for (int i = 0; i < L->ncoll; i++) mml_collator_reset(L->colls[i]);
      ci = 0;
      epoch = L->start.epoch;
      bie = L->start.batch_in_epoch;
      since_good = 0;
      continue;
    }
    mml_collator *C = L->colls[ci];
    int64_t e, p;
    plan_at_locked(L, L->head_seq, &e, &p);
    if (L->per_epoch >= 0) { /* padded */
      if (bie >= L->per_epoch) { /* the epoch is complete: the next starts at pos 0 */
        epoch++;
        bie = 0;
        since_good = 0;
        if (e != epoch || p != 0) {
          rebase_locked(L, epoch, 0, 0);
          my_gen = L->gen;
          continue;
        }
      } else if (e != epoch) { /* ran out of positions: fill from the epoch's start */
        rebase_locked(L, epoch, L->n_rank, 1);
        my_gen = L->gen;
        continue;
      }
    } else if (e != epoch) { /* packed: the epoch ended; its last pack goes out */
      if (mml_collator_count(C) > 0) {
        if (!hand_off_locked(L, my_gen, &ci, epoch, (mml_cursor){epoch, L->n_rank, bie + 1}))
          continue;
      }
      epoch = e;
      bie = 0;
      since_good = 0;
      continue;
    }
    task *t = &L->tasks[L->head_seq % L->window];
    if (t->state != SLOT_DONE || t->gen != my_gen) {
      pthread_cond_wait(&L->coll_cv, &L->mu);
      continue;
    }
    mml_sample_swap(&s, &t->sample);
    t->state = SLOT_EMPTY;
    L->head_seq++;
    pthread_cond_broadcast(&L->work_cv);
    L->samples++;
    if (s.status != MML_OK) {
      L->skipped++;
      L->skip_by_status[s.status < MML_STATUS_COUNT ? s.status : MML_EINTERNAL]++;
      if (!L->cfg.on_error_raise) push_warning_locked(L, &s.err); /* raise mode: raised instead */
      since_good++;
      if (L->cfg.on_error_raise) {
        pend_item *pi = pend_reserve_locked(L, my_gen);
        if (!pi) continue;
        pi->it.kind = ITEM_ERROR;
        pi->it.epoch = epoch;
        pi->it.err = s.err;
        pi->state = PEND_READY;
        move_ready_locked(L);
      }
      int64_t min_n = L->cfg.min_error_samples > 0 ? L->cfg.min_error_samples : 100;
      if ((int64_t)L->samples >= min_n &&
          (double)L->skipped > L->cfg.max_error_rate * (double)L->samples) {
        mml_err e2;
        mml_err_set(&e2, MML_ETOOMANYERR,
                    "%llu of %llu samples failed, above max_error_rate=%g; last: %s",
                    (unsigned long long)L->skipped, (unsigned long long)L->samples,
                    L->cfg.max_error_rate, s.err.msg);
        set_fatal_locked(L, MML_ETOOMANYERR, &e2);
      } else if (L->per_epoch >= 0 && since_good > L->n_rank) {
        mml_err e2;
        mml_err_set(&e2, MML_ETOOMANYERR,
                    "epoch %lld: no usable sample in %lld positions; last: %s",
                    (long long)epoch, (long long)since_good, s.err.msg);
        set_fatal_locked(L, MML_ETOOMANYERR, &e2);
      }
      continue;
    }
    L->good++;
    since_good = 0;
    if (!mml_collator_fits(C, &s)) { /* the current batch is complete without s */
      if (!hand_off_locked(L, my_gen, &ci, epoch, (mml_cursor){epoch, s.pos, bie + 1}))
        continue;
      bie++;
      C = L->colls[ci];
    }
    int64_t pos = s.pos;
    pthread_mutex_unlock(&L->mu);
    double t0 = mml_now();
    mml_status st = mml_collator_add(C, &s, &err); /* moves buffers: cheap */
    int full = !st && mml_collator_full(C);
    double dt = mml_now() - t0;
    pthread_mutex_lock(&L->mu);
    L->collate_s += dt;
    if (st) {
      set_fatal_locked(L, st, &err);
      continue;
    }
    if (full) {
      if (!hand_off_locked(L, my_gen, &ci, epoch, (mml_cursor){epoch, pos + 1, bie + 1}))
        continue;
      bie++;
    }
  }
  pthread_mutex_unlock(&L->mu);
  mml_sample_free(&s);
  return NULL;
}

/* ------------------------------------------------------------------------------------ */
/* construction                                                                         */

static int has_glob(const char *s) { return strpbrk(s, "*?[") != NULL; }

/* A remote shard is streamed into the index in ranged GETs of INDEX_CHUNK bytes (a
 * shorter reply is the end), so indexing holds one chunk, never the object. */
enum { INDEX_CHUNK = 8 << 20 };

static mml_status add_shard(mml_loader *L, const char *path, mml_err *err) {
  mml_layout layout = (mml_layout)L->cfg.data_format;
  if (!mml_path_is_remote(path)) return mml_index_add_file(&L->ix, path, layout, err);
  mml_fetcher *f;
  mml_status st = get_fetcher(L, &f, err);
  if (st) return st;
  mml_index_builder *b;
  if ((st = mml_index_begin(&L->ix, path, layout, &b, err))) return st;
  mml_bytes body = {0};
  for (int64_t off = 0;; off += INDEX_CHUNK) {
    if ((st = mml_fetch_get(f, path, off, INDEX_CHUNK, &body, err))) {
      mml_err_prefix(err, "data shard %s", path);
      break;
    }
    if ((st = mml_index_feed(b, body.data, body.len, err))) break;
    if (body.len != INDEX_CHUNK) break; /* the end (or a server that sent it all) */
  }
  mml_bytes_free(&body);
  if (st) {
    mml_index_abort(b);
    return st;
  }
  return mml_index_end(b, err);
}

static mml_status add_data(mml_loader *L, const char *path, mml_err *err) {
  if (!(mml_path_is_remote(path) && !strncmp(path, "s3://", 5) && has_glob(path)))
    return add_shard(L, path, err);
  /* s3://bucket/prefix*glob: the fetcher lists up to the first wildcard, matches the key */
  mml_fetcher *f;
  mml_status st = get_fetcher(L, &f, err);
  if (st) return st;
  char **urls = NULL;
  size_t n = 0;
  st = mml_fetch_list(f, path, NULL, &urls, &n, err);
  if (st) return st;
  if (n == 0) st = mml_err_set(err, MML_ECONFIG, "no data shard matches %s", path);
  for (size_t i = 0; !st && i < n; i++) st = add_shard(L, urls[i], err);
  mml_fetch_list_free(urls, n);
  return st;
}

static mml_status validate(const mml_loader_cfg *c, mml_err *err) {
  if (!c->data || c->ndata < 1) return mml_err_set(err, MML_ECONFIG, "no data given");
  if (c->num_threads < 1) return mml_err_set(err, MML_ECONFIG, "num_threads must be >= 1");
  if (c->prefetch < 1) return mml_err_set(err, MML_ECONFIG, "prefetch must be >= 1");
  if (c->window < 0) return mml_err_set(err, MML_ECONFIG, "window must be >= 0");
  if (c->collate.micro_batch_size < 1)
    return mml_err_set(err, MML_ECONFIG, "micro_batch_size must be >= 1");
  if (!(c->max_error_rate >= 0 && c->max_error_rate <= 1))
    return mml_err_set(err, MML_ECONFIG, "max_error_rate must be in [0, 1]");
  if (!c->tokenizer) return mml_err_set(err, MML_ECONFIG, "no tokenizer");
  if (c->collate.pack && c->collate.pack_length <= 0 && c->collate.seq_length <= 0)
    return mml_err_set(err, MML_ECONFIG, "packing needs pack_length or seq_length");
  return MML_OK;
}

mml_status mml_loader_new(const mml_loader_cfg *cfg, mml_loader **out, mml_err *err) {
  mml_status st = validate(cfg, err);
  if (st) return st;
  mml_loader *L = calloc(1, sizeof *L);
  if (!L) return mml_err_set(err, MML_ENOMEM, "out of memory");
  L->cfg = *cfg;
  pthread_mutex_init(&L->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&L->work_cv, &ca);
  pthread_cond_init(&L->coll_cv, &ca);
  pthread_cond_init(&L->out_cv, &ca);
  pthread_condattr_destroy(&ca);
  L->closed = 1; /* until fully built: free() must not join anything */

  L->data = calloc((size_t)cfg->ndata, sizeof *L->data);
  if (!L->data) goto oom;
  for (int i = 0; i < cfg->ndata; i++)
    if (!(L->data[i] = strdup(cfg->data[i]))) goto oom;
  L->cfg.data = (const char *const *)L->data;
  if (cfg->image_root && cfg->image_root[0]) {
    if (!(L->image_root = strdup(cfg->image_root))) goto oom;
    size_t n = strlen(L->image_root);
    while (n > 1 && L->image_root[n - 1] == '/') L->image_root[--n] = 0;
  }
  L->cfg.image_root = L->image_root;
  L->cfg.fetch.access_key = dup_or_null(cfg->fetch.access_key);
  L->cfg.fetch.secret_key = dup_or_null(cfg->fetch.secret_key);
  L->cfg.fetch.session_token = dup_or_null(cfg->fetch.session_token);
  L->cfg.fetch.region = dup_or_null(cfg->fetch.region);
  L->cfg.fetch.endpoint = dup_or_null(cfg->fetch.endpoint);

  for (int i = 0; i < cfg->ndata; i++)
    if ((st = add_data(L, L->data[i], err))) goto fail;
  if (L->ix.n == 0) {
    st = mml_err_set(err, MML_ECONFIG, "the data holds no samples (%d shard(s), all empty)",
                     L->ix.nshards);
    goto fail;
  }
  if ((st = mml_sampler_init(&L->sm, L->ix.n, cfg->seed, cfg->shuffle, cfg->dp_rank,
                             cfg->dp_size, err)))
    goto fail;
  L->n_rank = L->sm.n_rank;
  int mbs = cfg->collate.micro_batch_size;
  if (cfg->collate.pack) {
    L->per_epoch = -1;
  } else {
    L->per_epoch = L->n_rank / mbs;
    if (L->per_epoch == 0) {
      st = mml_err_set(err, MML_ECONFIG,
                       "each rank holds %lld samples, fewer than micro_batch_size=%d",
                       (long long)L->n_rank, mbs);
      goto fail;
    }
  }
  L->roots = calloc((size_t)L->ix.nshards, sizeof *L->roots);
  L->remote = calloc((size_t)L->ix.nshards, sizeof *L->remote);
  if (!L->roots || !L->remote) goto oom;
  for (int i = 0; i < L->ix.nshards; i++) {
    L->remote[i] = mml_index_shard_remote(&L->ix.shards[i]);
    L->roots[i] = L->image_root ? strdup(L->image_root) : dirname_of(L->ix.shards[i].path);
    if (!L->roots[i]) goto oom;
  }

  if ((st = mml_template_new(cfg->template_style, cfg->label_mode, cfg->tokenizer, &L->tmpl,
                             err)) ||
      (st = mml_template_set_image_space(L->tmpl, cfg->image_space, err)))
    goto fail;
  L->pl.vision = &L->cfg.vision;
  L->pl.tmpl = L->tmpl;
  L->pl.max_length = cfg->max_length;

  L->ccfg = cfg->collate;
  const mml_tokenizer *tok = cfg->tokenizer;
  if (L->ccfg.pad_id < 0) {
    L->ccfg.pad_id = mml_tokenizer_token_to_id(tok, "<|endoftext|>", 13);
    if (L->ccfg.pad_id < 0) L->ccfg.pad_id = 0;
  }
  L->ccfg.image_pad_id = mml_tokenizer_token_to_id(tok, "<|image_pad|>", 13);
  L->ccfg.vision_start_id = mml_tokenizer_token_to_id(tok, "<|vision_start|>", 16);
  L->ccfg.spatial_merge = cfg->vision.merge_size;
  L->ccfg.pixel_cols =
      3 * cfg->vision.temporal_patch_size * cfg->vision.patch_size * cfg->vision.patch_size;
  if (cfg->collate.pack && L->ccfg.pack_length <= 0) L->ccfg.pack_length = cfg->collate.seq_length;

  if (cfg->allocator) {
    L->alloc = *cfg->allocator;
  } else if (cfg->pin_memory || cfg->to_device) { /* device copies read pinned buffers */
    mml_err e2;
    L->pinned = mml_pinned_allocator(&L->alloc, &e2) == MML_OK; /* else plain host memory */
    /* the trainer's device (the constructing thread's current one) for the release guard */
    L->guard_device = L->pinned ? mml_cuda_current_device() : 0;
  } else {
    mml_host_allocator(&L->alloc);
  }
  if (cfg->to_device && (st = mml_device_stage_new(cfg->device, 0, &L->stage, err))) goto fail;
  /* Released batch buffers are kept for reuse up to 512 MiB (a large buffer allocated
   * afresh costs its page faults); beyond that they go back to the system. */
  if ((st = mml_pool_new(&L->alloc, (size_t)512 << 20, &L->pool, err))) goto fail;
  /* Emission (building a batch's tensors, mostly copying pixels) runs on workers, one
   * batch per collator instance, so one collation thread does not cap throughput. */
  L->ncoll = 1 + cfg->num_threads / 4;
  if (L->ncoll > 8) L->ncoll = 8;
  L->colls = calloc((size_t)L->ncoll, sizeof *L->colls);
  L->coll_busy = calloc((size_t)L->ncoll, sizeof *L->coll_busy);
  L->npend = L->ncoll + 1;
  L->pend = calloc((size_t)L->npend, sizeof *L->pend);
  if (!L->colls || !L->coll_busy || !L->pend) goto oom;
  for (int i = 0; i < L->ncoll; i++) {
    if ((st = mml_collator_new(&L->ccfg, L->pool, &L->colls[i], err))) {
      if (st == MML_EINVAL) st = MML_ECONFIG;
      goto fail;
    }
  }
  L->collator = L->colls[0];

  int w = cfg->window;
  if (w <= 0) {
    w = 2 * (cfg->collate.pack ? 8 : mbs);
    if (w < 4 * cfg->num_threads) w = 4 * cfg->num_threads;
    if (w < 16) w = 16;
  }
  L->window = w;
  L->tasks = calloc((size_t)w, sizeof *L->tasks);
  L->outq = calloc((size_t)cfg->prefetch, sizeof *L->outq);
  if (!L->tasks || !L->outq) goto oom;
  for (int i = 0; i < w; i++) L->tasks[i].L = L;

  mml_cursor zero = {0, 0, 0};
  L->closed = 0;
  L->gen = 1;
  mml_loader_seek(L, &zero, err);
  *out = L;
  return MML_OK;
oom:
  st = mml_err_set(err, MML_ENOMEM, "out of memory building the loader");
fail:
  mml_loader_free(L);
  return st;
}

/* ------------------------------------------------------------------------------------ */
/* threads: start and stop                                                              */

static mml_status start_locked(mml_loader *L, mml_err *err) {
  if (L->started) return MML_OK;
  L->started = 1;
  L->threads = calloc((size_t)L->cfg.num_threads, sizeof *L->threads);
  if (!L->threads) return mml_err_set(err, MML_ENOMEM, "out of memory");
  for (int i = 0; i < L->cfg.num_threads; i++) {
    if (pthread_create(&L->threads[i], NULL, worker_main, L) != 0)
      return mml_err_set(err, MML_ENOMEM, "cannot start worker thread %d", i);
    L->nthreads_started++;
  }
  if (pthread_create(&L->coll_thread, NULL, collator_main, L) != 0)
    return mml_err_set(err, MML_ENOMEM, "cannot start the collation thread");
  L->coll_started = 1;
  return MML_OK;
}

static void stop_threads(mml_loader *L) {
  pthread_mutex_lock(&L->mu);
  L->stop = 1;
  pthread_cond_broadcast(&L->work_cv);
  pthread_cond_broadcast(&L->coll_cv);
  pthread_cond_broadcast(&L->out_cv);
  pthread_mutex_unlock(&L->mu);
  for (int i = 0; i < L->nthreads_started; i++) pthread_join(L->threads[i], NULL);
  L->nthreads_started = 0;
  if (L->coll_started) pthread_join(L->coll_thread, NULL);
  L->coll_started = 0;
  /* Cancels outstanding fetches; their completions only touch tasks, still alive. */
  mml_fetcher_free(L->fetcher);
  L->fetcher = NULL;
}

void mml_loader_close(mml_loader *L) {
  if (!L) return;
  pthread_mutex_lock(&L->mu);
  int was = L->closed;
  L->closed = 1;
  pthread_mutex_unlock(&L->mu);
  if (was) return;
  stop_threads(L);
  pthread_mutex_lock(&L->mu);
  drop_output_locked(L);
  pthread_mutex_unlock(&L->mu);
}

void mml_loader_free(mml_loader *L) {
  if (!L) return;
  mml_loader_close(L);
  mml_fetcher_free(L->fetcher); /* a fetcher created while building the index */
  L->fetcher = NULL;
  if (L->outq) {
    for (int i = 0; i < L->cfg.prefetch; i++) mml_batch_clear(&L->outq[i].batch);
    free(L->outq);
  }
  if (L->tasks) {
    for (int i = 0; i < L->window; i++) {
      task *t = &L->tasks[i];
      mml_sample_free(&t->sample);
      mml_bytes_free(&t->rec_bytes);
      if (t->rec_parsed) mml_record_free(&t->rec);
      for (int j = 0; j < t->imgs_cap; j++) mml_bytes_free(&t->imgs[j]);
      free(t->imgs);
      free(t->refs);
      mml_bytes_free(&t->path);
    }
    free(L->tasks);
  }
  free(L->threads);
  if (L->pend) {
    for (int i = 0; i < L->npend; i++) mml_batch_clear(&L->pend[i].it.batch);
    free(L->pend);
  }
  if (L->colls)
    for (int i = 0; i < L->ncoll; i++)
      if (L->colls[i]) mml_collator_free(L->colls[i]);
  free(L->colls);
  free(L->coll_busy);
  mml_device_stage_free(L->stage); /* waits for queued copies */
  mml_pool_close(L->pool);
  if (L->tmpl) mml_template_free(L->tmpl);
  if (L->roots)
    for (int i = 0; i < L->ix.nshards; i++) free(L->roots[i]);
  free(L->roots);
  free(L->remote);
  mml_index_free(&L->ix);
  if (L->data)
    for (int i = 0; i < L->cfg.ndata; i++) free(L->data[i]);
  free(L->data);
  free(L->image_root);
  free((char *)L->cfg.fetch.access_key);
  free((char *)L->cfg.fetch.secret_key);
  free((char *)L->cfg.fetch.session_token);
  free((char *)L->cfg.fetch.region);
  free((char *)L->cfg.fetch.endpoint);
  pthread_cond_destroy(&L->work_cv);
  pthread_cond_destroy(&L->coll_cv);
  pthread_cond_destroy(&L->out_cv);
  pthread_mutex_destroy(&L->mu);
  free(L);
}

/* ------------------------------------------------------------------------------------ */
/* consumer API                                                                         */

void mml_loader_set_consumer_stream(mml_loader *L, int device, uintptr_t stream) {
  L->consumer_device = device;
  L->consumer_stream = stream;
}

int64_t mml_loader_num_samples(const mml_loader *L) { return L->ix.n; }
int64_t mml_loader_samples_per_rank(const mml_loader *L) { return L->n_rank; }
int64_t mml_loader_batches_per_epoch(const mml_loader *L) { return L->per_epoch; }
uint64_t mml_loader_data_hash(const mml_loader *L) { return mml_index_hash(&L->ix); }

mml_status mml_loader_seek(mml_loader *L, const mml_cursor *c, mml_err *err) {
  if (c->epoch < 0 || c->pos < 0 || c->batch_in_epoch < 0 ||
      (L->per_epoch >= 0 && c->batch_in_epoch > L->per_epoch) ||
      (L->per_epoch < 0 && c->pos > L->n_rank))
    return mml_err_set(err, MML_ESTATE,
                       "cursor (epoch %lld, pos %lld, batch %lld) is outside this loader's "
                       "stream (%lld samples per rank, %lld batches per epoch)",
                       (long long)c->epoch, (long long)c->pos, (long long)c->batch_in_epoch,
                       (long long)L->n_rank, (long long)L->per_epoch);
  pthread_mutex_lock(&L->mu);
  if (L->closed) {
    pthread_mutex_unlock(&L->mu);
    return mml_err_set(err, MML_ECLOSED, "the loader is closed");
  }
  mml_cursor start;
  int wrap;
  normalize_cursor(L, c, &start, &wrap);
  L->start = start;
  rebase_locked(L, start.epoch, start.pos, wrap);
  /* pending work of the old plan is abandoned; the ready list keeps its tasks until a
   * worker drops them (their gen is old) */
  drop_output_locked(L);
  L->fatal = MML_OK;
  L->consumer_epoch = c->epoch;
  L->delivered = *c;
  pthread_cond_broadcast(&L->coll_cv);
  pthread_mutex_unlock(&L->mu);
  return MML_OK;
}

mml_cursor mml_loader_cursor(const mml_loader *L) {
  pthread_mutex_lock((pthread_mutex_t *)&L->mu);
  mml_cursor c = L->delivered;
  pthread_mutex_unlock((pthread_mutex_t *)&L->mu);
  return c;
}

mml_status mml_loader_next(mml_loader *L, mml_batch *out, double timeout_s, mml_err *err) {
  double t0 = mml_now();
  struct timespec dl;
  if (timeout_s >= 0) deadline_after(&dl, timeout_s);
  mml_status st;
  pthread_mutex_lock(&L->mu);
  if (L->first_next == 0) L->first_next = t0;
  if (!L->closed && !L->started) {
    if ((st = start_locked(L, err))) {
      set_fatal_locked(L, st, err);
    }
  }
  for (;;) {
    if (L->closed) {
      st = mml_err_set(err, MML_ECLOSED, "the loader is closed");
      break;
    }
    if (L->out_count) {
      out_item *it = &L->outq[L->out_head];
      if (!L->cfg.cycle && it->epoch > L->consumer_epoch) {
        L->consumer_epoch = it->epoch;
        L->delivered = (mml_cursor){it->epoch, 0, 0};
        st = MML_EEND;
        break;
      }
      out_item item = *it;
      memset(it, 0, sizeof *it);
      L->out_head = (L->out_head + 1) % L->cfg.prefetch;
      L->out_count--;
      move_ready_locked(L); /* room for the next finished item */
      it = &item;
      if (it->kind == ITEM_ERROR) {
        if (err) *err = it->err;
        st = it->err.status ? it->err.status : MML_EINTERNAL;
        break;
      }
      *out = it->batch;
      if (L->pinned && !L->stage) { /* no reuse before the consumer's default-stream copies */
        mml_err e2;
        mml_device_guard_pinned(out, L->guard_device, 0, &e2);
        if (L->consumer_stream)
          mml_device_guard_pinned(out, L->consumer_device, L->consumer_stream, &e2);
      }
      L->consumer_epoch = out->after.epoch;
      L->delivered = out->after;
      L->batches++;
      L->real_tokens += out->real_tokens;
      L->token_slots += out->token_slots;
      st = MML_OK;
      break;
    }
    if (L->fatal) {
      if (err) *err = L->fatal_err;
      st = L->fatal;
      break;
    }
    if (timeout_s < 0) {
      pthread_cond_wait(&L->out_cv, &L->mu);
    } else if (pthread_cond_timedwait(&L->out_cv, &L->mu, &dl) == ETIMEDOUT) {
      st = MML_ETIMEDOUT;
      break;
    }
  }
  L->wait_s += mml_now() - t0;
  pthread_mutex_unlock(&L->mu);
  return st;
}

int mml_loader_take_warnings(mml_loader *L, mml_err *out, int max) {
  pthread_mutex_lock(&L->mu);
  int n = 0;
  while (n < max && L->warn_count) {
    out[n++] = L->warn[L->warn_head];
    L->warn_head = (L->warn_head + 1) % WARN_BACKLOG;
    L->warn_count--;
  }
  pthread_mutex_unlock(&L->mu);
  return n;
}

void mml_loader_get_stats(mml_loader *L, mml_loader_stats *o) {
  memset(o, 0, sizeof *o);
  pthread_mutex_lock(&L->mu);
  o->wait_s = L->wait_s;
  o->wall_s = L->first_next > 0 ? mml_now() - L->first_next : 0;
  o->read_s = L->read_s;
  o->vision_s = L->vision_s;
  o->decode_s = L->decode_s;
  o->text_s = L->text_s;
  o->collate_s = L->collate_s;
  o->queue_depth = L->out_count;
  o->prefetch = L->cfg.prefetch;
  o->window = L->window;
  o->in_flight = L->in_flight;
  o->num_threads = L->cfg.num_threads;
  o->samples = L->samples;
  o->good_samples = L->good;
  o->skipped = L->skipped;
  o->batches = L->batches;
  o->bytes_read = L->bytes_read;
  o->images = L->images;
  o->real_tokens = L->real_tokens;
  o->token_slots = L->token_slots;
  for (int s = 0; s < MML_STATUS_COUNT; s++) {
    if (!L->skip_by_status[s]) continue;
    const char *r = mml_status_skip_reason((mml_status)s);
    if (!r) r = "other";
    int k = 0;
    while (k < o->nreasons && strcmp(o->reason[k], r)) k++;
    if (k == o->nreasons) {
      if (k == MML_MAX_REASONS) continue;
      o->reason[k] = r;
      o->nreasons++;
    }
    o->reason_count[k] += L->skip_by_status[s];
  }
  o->pinned = L->pinned;
  o->device = L->stage ? mml_device_stage_device(L->stage) : -1;
  mml_fetcher *f = L->fetcher; /* freed only by close, on this (the consumer's) thread */
  pthread_mutex_unlock(&L->mu);
  o->remote = f != NULL;
  mml_pool_usage(L->pool, &o->pool_cached, &o->pool_live);
  /* outside mu: the fetcher's I/O thread takes mu in completions (lock order) */
  if (f) mml_fetch_get_stats(f, &o->fetch);
}
