/*
 * loader_collator.c — the loader's collation thread and its output side.
 *
 * The collator (one thread) consumes the slot of head_seq strictly in order, decides
 * epoch boundaries (coll_epoch_locked) and batch composition (mml_collator_fits/add/full
 * on one of `ncoll` collator instances), and hands each complete batch to the workers for
 * emission (ld_emit_job_locked builds its tensors), continuing on the next instance
 * meanwhile.  Finished items (batches, and with on_error="raise" sample errors) wait in
 * `pend` in stream order and move into the output queue of `prefetch` items as it has
 * room (ld_move_ready_locked); a full `pend` stops the collator (backpressure).  Batch
 * composition is sequential, so the output does not depend on which instance or worker
 * emitted a batch.  A failed sample is counted and warned about, or delivered in order as
 * an error, and the error-rate limits are checked (coll_failed_locked).
 *
 * Plan before decode: the planner (loader_place.c) runs here too, ahead of this
 * in-order pass, composing the same batches from planned counts so that workers decode
 * every image straight into its batch's pixel_values; a sample is taken here once its
 * pixels are in place (ld_place_ready), and the head ticket's buffer becomes the batch's
 * pixel_values (ld_place_take_locked).  A placed sample that failed at decode rewinds
 * the planner (ld_place_rewind_locked) after it is skipped exactly as before.
 *
 * Compact pixels (loader_place.c COMPACT): the emitting worker grows the buffer of the
 * batch's uint8 image rows to its float rows (or swaps it for a float buffer:
 * compact_swap), builds the tensors, hands the instance back (coll_busy 0, so
 * composition goes on) and only then expands the rows (in place: back to front); the
 * item becomes READY after the expansion, so the consumer never sees it unwritten, and
 * a seek waits for it (it counts in `emitting`).  While the output queue is empty the
 * other workers take chunks of that expansion before any decode (loader_expand.c: the
 * same bytes, whoever writes them).  The emission gate
 * (ld_emit_gated_locked) decides when a queued batch may be emitted (so expanded): always
 * when none is ahead of the consumer (being emitted or in the output queue), and else
 *   G1: while fewer than `prefetch` are ahead and their expanded bytes with this one's stay
 *      within the output queue's byte budget (out_budget).  A decoded batch is expanded
 *      as soon as a worker is free, before any later decode: the consumer takes batches
 *      in order, so finishing the oldest first never makes a batch later, and the
 *      expansion (~11 ms per 188 MB alone, 40-240 ms on a loaded machine) is done while
 *      the trainer still has up to `prefetch` steps of slack.  Issue 34: the rule before
 *      (G2's, below) kept at most two expanded, the rest of `prefetch` waiting as uint8
 *      rows, so one slow batch (a large photo) drained the two and the trainer waited for
 *      an expansion that a worker, busy decoding, started late
 *      (benchmarks/bench_never_late.py: output queue median 2, never full, wait-time
 *      ratio 2.7-4.6% on a quiet machine).  Memory: `prefetch` float batches ahead is what
 *      guarantee 5 allows (pixel_format "float32-decode" holds as much); the pool's
 *      working set grows to them once (pool.c TRIM), then maps nothing.
 *   G2 (max_memory): the bytes.  Each emission's float rows and tensors are one charge
 *      at its batch's seq, asked before it runs (the memory ledger's grant: loader_admit.c
 *      ld_mem_emit_take_locked, E1-E4), so under max_memory G1 holds too and the ledger
 *      decides whether the room is there; a charge that waits keeps the batch queued as
 *      uint8 rows (the worker decodes instead) until the ledger grants it.  Before the ledger
 *      decided it, G2 was a rule of its own: two ahead at most, the second within the
 *      most the one-ahead case had live (fbytes_hw) and within the pool's cached pages.
 * The worker that finds the gate shut decodes instead; the consumer's pop
 * (ld_move_ready_locked) wakes one.  Emission stays on the workers: a thread of its own
 * for it expanded while both workers decoded on the 2 cores, so each expansion took
 * longer inside its one step, and the trainer waited more.
 *
 * Locking: everything here runs with the loader's mu held, except mml_collator_add and
 * the emission itself (the instance being emitted is marked busy in coll_busy).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loader_int.h"

void ld_set_fatal_locked(mml_loader *L, mml_status st, const mml_err *e) {
  if (L->fatal) return;
  L->fatal = st;
  L->fatal_err = *e;
  L->fatal_err.status = st;
  pthread_cond_broadcast(&L->out_cv);
  ld_consumer_wake_locked(L, 1);   /* C2: next() raises it */
  ld_room_gates_changed_locked(L); /* W5: a worker waiting for room stops waiting */
  ld_coll_wake_locked(L, 1);       /* W2: so does the collator */
}

/* Compact pixels (loader_place.c COMPACT): the batch's uint8 image rows become float32 /
 * bfloat16 rows as the collator's pixel_values (the tensor views them).  In place where
 * their buffer can grow to the float bytes (loader_place.c gives it the capacity): it
 * grows now, *u8 == *f, and the rows are expanded back to front; otherwise a float
 * buffer of the pool replaces it and *u8 keeps the uint8 rows.  Expanded into *f once
 * the collator instance is free (ld_emit_job_locked).  Nothing to do (both NULL)
 * without compact image rows. */
static mml_status compact_swap(mml_loader *L, mml_collator *C, mml_buf **u8, mml_buf **f,
                               int64_t *rows, mml_err *err) {
  mml_buf *b = mml_collator_attached_pixels(C, 0);
  *rows = mml_collator_rows(C);
  if (!L->compact || !b || *rows <= 0) return MML_OK;
  if (b->size < (size_t)*rows * L->row_bytes[PL_IMG])
    return mml_err_set(err, MML_EINTERNAL, "collator: %lld uint8 pixel rows in a %zu-byte buffer",
                       (long long)*rows, b->size);
  const size_t fb = (size_t)*rows * L->expand_row_bytes;
  if (mml_buf_capacity(b) >= fb) { /* the collator's reference is the only one left */
    mml_status st = mml_pool_grow(b, fb, err);
    if (st) return st;
    mml_buf_retain(b);
    mml_buf_retain(b);
    *u8 = *f = b;
    return MML_OK;
  }
  mml_status st = mml_pool_alloc(L->pool, fb, f, err);
  if (st) {
    mml_err_prefix(err, "pixel_values of a batch (%lld rows)", (long long)*rows);
    return st;
  }
  mml_buf_retain(b);
  *u8 = b;
  mml_collator_attach_pixels(C, 0, *f);
  return MML_OK;
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

/* Emits from instance ci; compact image rows are expanded after the instance is handed
 * back (the collator composes the next batch meanwhile).  mu not held. */
static mml_status emit_expand(mml_loader *L, int ci, mml_batch *b, int64_t *expanded, int *inplace,
                              int *freed, int64_t *grant, mml_err *err) {
  mml_collator *C = L->colls[ci];
  mml_buf *u8 = NULL, *f = NULL;
  int64_t rows = 0;
  /* the float rows and the other tensors become live in the pool: the ledger's grant for
   * them, made before (ld_mem_emit_take_locked), pays for that growth (the pool's hook
   * hands it over), so they are never counted twice (loader_admit.c A6); what it did not
   * use goes back */
  ld_ledger_cover_begin(L, *grant);
  mml_status st = compact_swap(L, C, &u8, &f, &rows, err);
  if (!st) st = emit_batch(L, C, b, err);
  ld_ledger_cover_end(L);
  *grant = 0;
  if (u8) {
    pthread_mutex_lock(&L->mu);
    L->coll_busy[ci] = 0;
    ld_coll_wake_locked(L, 1); /* the instance is free */
    pthread_mutex_unlock(&L->mu);
    *freed = 1; /* the collator may hand it out again before this emit ends */
    if (!st) st = ld_expand_shared(L, u8, f, rows, err); /* with idle workers: loader_expand.c */
    if (!st) *expanded = rows, *inplace = u8 == f;
  }
  mml_buf_release(u8);
  mml_buf_release(f);
  return st;
}

/* The bytes of a batch's tensors. */
static size_t batch_bytes(const mml_batch *b) {
  size_t n = 0;
  for (int t = 0; t < b->ntensors; t++) {
    size_t e = mml_dtype_size(b->tensors[t].dtype);
    for (int d = 0; d < b->tensors[t].ndim; d++) e *= (size_t)b->tensors[t].shape[d];
    n += e;
  }
  return n;
}

/* Room for one more item in the output queue: below `prefetch` items and, past the first,
 * below the byte budget (so a huge prefetch is bounded by memory, not only by count); the
 * ring grows when it is full below `prefetch` (a failed growth is just no room yet). */
static int out_room_locked(mml_loader *L) {
  if (L->out_count >= L->cfg.prefetch) return 0;
  if (L->out_count > 0 && L->out_bytes >= L->out_budget) return 0;
  if (L->out_count < L->out_cap) return 1;
  int nc = L->out_cap < L->cfg.prefetch / 2 ? 2 * L->out_cap : L->cfg.prefetch;
  out_item *q = calloc((size_t)nc, sizeof *q);
  if (!q) return 0;
  for (int i = 0; i < L->out_count; i++) q[i] = *ld_out_at(L, i);
  free(L->outq);
  L->outq = q;
  L->out_cap = nc;
  L->out_head = 0;
  return 1;
}

void ld_out_pop_locked(mml_loader *L, out_item *it) {
  out_item *head = &L->outq[L->out_head];
  *it = *head;
  memset(head, 0, sizeof *head);
  L->out_head = (L->out_head + 1) % L->out_cap;
  L->out_count--;
  L->out_bytes -= it->bytes;
}

void ld_move_ready_locked(mml_loader *L) {
  int moved = 0;
  while (L->pend_head < L->pend_tail) {
    pend_item *p = &L->pend[L->pend_head % L->npend];
    if (p->state != PEND_READY) break;
    if (p->it.kind != ITEM_DROP) {
      if (!out_room_locked(L)) break;
      p->it.bytes = p->it.kind == ITEM_BATCH ? batch_bytes(&p->it.batch) : 0;
      if (p->it.kind == ITEM_BATCH) ld_ledger_queued_locked(L, &p->it.batch); /* A10 */
      *ld_out_at(L, L->out_count) = p->it;
      L->out_count++;
      L->out_bytes += p->it.bytes;
    }
    memset(p, 0, sizeof *p);
    L->pend_head++;
    moved = 1;
  }
  if (moved) {
    pthread_cond_broadcast(&L->out_cv);
    ld_consumer_wake_locked(L, 0); /* C2: a batch (or an item) for next() */
    ld_coll_wake_locked(L, 1);     /* pend has room */
  }
  if (L->jobs_queued && !ld_emit_gated_locked(L)) ld_work_wake(L, 0);
  ld_room_gates_changed_locked(L); /* W5: out_count, pend states, emitting */
}

/* The expanded bytes of the batches ahead of the consumer (emitting or queued for it)
 * and of the next one to emit. */
static void ahead_bytes_locked(const mml_loader *L, size_t *ahead, size_t *next) {
  *ahead = *next = 0;
  for (int i = 0; i < L->out_count; i++) *ahead += ld_out_at(L, i)->fbytes;
  int found = 0;
  for (int64_t k = L->pend_head; k < L->pend_tail; k++) {
    const pend_item *q = &L->pend[k % L->npend];
    if (q->state == PEND_EMITTING) *ahead += q->it.fbytes;
    if (q->state == PEND_QUEUED && !found) *next = q->it.fbytes, found = 1;
  }
}

int ld_emit_gated_locked(const mml_loader *L) {
  if (!L->compact) return 0;
  int n = L->out_count + L->emitting;
  if (n == 0) return 0;
  size_t ahead, next;
  ahead_bytes_locked(L, &ahead, &next);
  /* G1: up to `prefetch` ahead, within the output queue's bytes; under max_memory the
   * ledger's grant decides the room too (G2) */
  return n >= L->cfg.prefetch || ahead + next > L->out_budget;
}

void ld_drop_output_locked(mml_loader *L) {
  /* While this waits (mu released) a seek's new gen is already visible: `dropping` keeps
   * the collator from starting on it, or the drop below would discard its new batches and
   * clear coll_busy under an instance that still holds samples. */
  L->dropping++;
  while (L->emitting) pthread_cond_wait(&L->out_cv, &L->mu);
  L->dropping--;
  while (L->out_count) {
    out_item it;
    ld_out_pop_locked(L, &it);
    mml_batch_clear(&it.batch);
  }
  L->out_head = 0;
  for (; L->pend_head < L->pend_tail; L->pend_head++) {
    pend_item *p = &L->pend[L->pend_head % L->npend];
    ld_admit_emit_cancel_locked(L, p); /* its emission's charge leaves the ledger (E3) */
    mml_batch_clear(&p->it.batch);
    memset(p, 0, sizeof *p);
  }
  L->pend_head = L->pend_tail = 0;
  L->jobs_queued = 0;
  for (int i = 0; i < L->ncoll; i++) L->coll_busy[i] = 0;
  ld_coll_wake_locked(L, 1);
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
  p->it.handed = mml_now();
  const mml_buf *px = L->compact ? mml_collator_attached_pixels(L->colls[*ci], 0) : NULL;
  if (px) {
    p->it.fbytes = (size_t)mml_collator_rows(L->colls[*ci]) * L->expand_row_bytes;
    /* in place (compact_swap), the uint8 rows' pages are part of it */
    p->fneed = mml_buf_capacity(px) < p->it.fbytes ? p->it.fbytes
               : px->size < p->it.fbytes           ? p->it.fbytes - px->size
                                                   : 0;
    p->fpool = ld_admit_expansion_bytes(L, mml_collator_rows(L->colls[*ci]), (int64_t)px->size,
                                        (int64_t)mml_buf_capacity(px));
  }
  if (L->cfg.max_memory) p->sneed = mml_collator_emit_bytes(L->colls[*ci]);
  ld_admit_expand_hand_off_locked(L, p); /* its ticket's expansion charge (E1) */
  /* its emission's seq (M4): its own first sample, before every ticket still placed (a
   * later ticket's charge waiting in the ledger must not hold an earlier batch back, L1) */
  p->seq =
      L->placing && L->tk_tail >= L->tk_head ? L->tks[L->tk_head % L->ntk].first_seq : L->head_seq;
  L->coll_busy[*ci] = 1;
  L->jobs_queued++;
  ld_work_wake(L, 0);
  ld_consumer_stale_locked(L); /* loader_admit.c C2, C6: an emission queued: not idle */
  ld_place_pop_locked(L);
  *ci = (*ci + 1) % L->ncoll;
  while (!L->stop && L->gen == my_gen && L->coll_busy[*ci]) pthread_cond_wait(&L->coll_cv, &L->mu);
  return !L->stop && L->gen == my_gen;
}

void ld_emit_job_locked(mml_loader *L, int64_t *grant) {
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
  mml_status st = MML_OK;
  int64_t expanded = 0;
  int freed = 0, inplace = 0;
  if (L->cfg.plan_only) /* a planning pass: the composition (cursor) is the result */
    mml_collator_reset(L->colls[ci]);
  else
    st = emit_expand(L, ci, &b, &expanded, &inplace, &freed, grant, &err);
  double dt = mml_now() - t0;
  pthread_mutex_lock(&L->mu);
  L->collate_s += dt;
  L->expanded_rows += (uint64_t)expanded;
  if (inplace) L->inplace_rows += (uint64_t)expanded;
  L->emitting--;
  if (!freed) L->coll_busy[ci] = 0;
  if (st) {
    ld_set_fatal_locked(L, st, &err);
    p->it.kind = ITEM_DROP;
  } else {
    b.after = p->after;
    p->it.batch = b;
    if (!expanded) p->it.fbytes = 0;
  }
  p->state = PEND_READY;
  ld_move_ready_locked(L);
  ld_coll_wake_locked(L, 1);                            /* the instance is free */
  if (!L->emitting) pthread_cond_broadcast(&L->out_cv); /* a seek may wait for this */
}

void ld_push_warning_locked(mml_loader *L, const mml_err *e) {
  if (L->warn_count == WARN_BACKLOG) return; /* counted in stats, message dropped */
  L->warn[(L->warn_head + L->warn_count) % WARN_BACKLOG] = *e;
  L->warn_count++;
}

void ld_release_oldest_skip_locked(mml_loader *L) {
  if (!L->skip_count) return;
  const mml_err *e = &L->skips[L->skip_head].err;
  ld_source_count_skip_locked(L, L->skips[L->skip_head].source, e->status);
  L->skipped++;
  L->skip_by_status[e->status < MML_STATUS_COUNT ? e->status : MML_EINTERNAL]++;
  if (!L->cfg.on_error_raise) ld_push_warning_locked(L, e); /* raise mode: raised instead */
  L->skip_head = (L->skip_head + 1) % SKIP_LOG;
  L->skip_count--;
}

void ld_release_skips_locked(mml_loader *L, int64_t epoch, int64_t pos) {
  while (L->skip_count) {
    const struct skip_entry *k = &L->skips[L->skip_head];
    if (k->epoch > epoch || (k->epoch == epoch && k->pos >= pos)) break;
    ld_release_oldest_skip_locked(L);
  }
}

static void log_skip_locked(mml_loader *L, const mml_sample *s) {
  if (L->skip_count == SKIP_LOG) ld_release_oldest_skip_locked(L); /* far ahead: count now */
  struct skip_entry *k = &L->skips[(L->skip_head + L->skip_count) % SKIP_LOG];
  k->epoch = s->epoch;
  k->pos = s->pos;
  k->source = s->source;
  k->err = s->err;
  k->err.status = s->status;
  L->skip_count++;
}

/* What the collation thread carries from one sample to the next. */
typedef struct coll_state {
  uint64_t gen;       /* the plan it follows */
  int64_t epoch, bie; /* the epoch being composed and its batches so far */
  int64_t since_good; /* failed samples since the last good one */
  int ci;             /* the instance composing the current batch (never busy) */
  mml_sample s;
  mml_err err;
  /* the sample's placement, taken from its slot: its ticket, where its rows are (the
   * dest references of each plane) */
  int64_t tk;
  place_at at[PLANES];
} coll_state;

/* A seek replaced the plan (it dropped pending output): start over at its cursor. */
static void coll_restart_locked(mml_loader *L, coll_state *c) {
  c->gen = L->gen;
  while ((L->emitting || L->dropping) && !L->stop) pthread_cond_wait(&L->coll_cv, &L->mu);
  for (int i = 0; i < L->ncoll; i++) mml_collator_reset(L->colls[i]);
  ld_place_reset_locked(L);
  c->ci = 0;
  c->epoch = L->start.epoch;
  c->bie = L->start.batch_in_epoch;
  c->since_good = 0;
}

/* Epoch boundaries at head_seq.  Returns 1 when the plan or the epoch changed (look
 * again), 0 when head_seq belongs to the epoch being composed. */
static int coll_epoch_locked(mml_loader *L, coll_state *c) {
  int64_t e, p;
  ld_plan_at_locked(L, L->head_seq, &e, &p);
  if (L->per_epoch >= 0) {        /* padded */
    if (c->bie >= L->per_epoch) { /* the epoch is complete: the next starts at pos 0 */
      c->epoch++;
      c->bie = 0;
      c->since_good = 0;
      if (e == c->epoch && p == 0) return 0;
      ld_rebase_locked(L, c->epoch, 0, 0);
      ld_place_rewind_locked(L, L->colls[c->ci], L->head_seq);
      c->gen = L->gen;
      return 1;
    }
    if (e == c->epoch) return 0;
    ld_rebase_locked(L, c->epoch, L->n_rank, 1); /* ran out of positions: fill from the start */
    ld_place_rewind_locked(L, L->colls[c->ci], L->head_seq); /* the seqs mean other samples */
    c->gen = L->gen;
    return 1;
  }
  if (L->gp && e == c->epoch && p >= ld_plan_rank_len_locked(L, e)) {
    /* past this rank's plan (its last batch went out at the plan's boundary) */
    if (p == 0 && !L->fatal) {
      mml_err e2;
      mml_err_set(&e2, MML_ECONFIG, "epoch %lld of the global plan has no batch", (long long)e);
      ld_set_fatal_locked(L, MML_ECONFIG, &e2);
    }
    if (L->fatal) return 1;
    c->epoch++;
    c->bie = 0;
    c->since_good = 0;
    ld_rebase_locked(L, c->epoch, 0, 0);
    c->gen = L->gen;
    return 1;
  }
  if (e == c->epoch) return 0;
  /* packed: the epoch ended; its last pack goes out */
  if (mml_collator_count(L->colls[c->ci]) > 0 &&
      !hand_off_locked(L, c->gen, &c->ci, c->epoch, (mml_cursor){c->epoch, L->n_rank, c->bie + 1}))
    return 1;
  c->epoch = e;
  c->bie = 0;
  c->since_good = 0;
  return 1;
}

/* Global plan: a failed sample that ends its planned batch closes it (every rank yields
 * one batch per step); a batch whose every sample failed cannot be replaced: fatal. */
static void coll_plan_boundary_locked(mml_loader *L, coll_state *c) {
  const mml_sample *s = &c->s;
  if (!ld_plan_batch_end_locked(L, c->epoch, s->pos)) return;
  if (mml_collator_count(L->colls[c->ci]) == 0) {
    mml_err e2;
    mml_err_set(&e2, MML_ETOOMANYERR,
                "epoch %lld: every sample of this rank's planned batch %lld failed, so the "
                "ranks cannot stay in step; last: %s",
                (long long)c->epoch, (long long)c->bie, s->err.msg);
    ld_set_fatal_locked(L, MML_ETOOMANYERR, &e2);
    return;
  }
  if (hand_off_locked(L, c->gen, &c->ci, c->epoch, (mml_cursor){c->epoch, s->pos + 1, c->bie + 1}))
    c->bie++;
}

/* A failed sample: logged (counted and warned about when the consumer passes it) or
 * delivered as an error (on_error="raise"), and the error limits checked.  A padded
 * epoch's fill pass (pos >= n_rank) revisits the epoch's samples: a failure there was
 * counted and reported on the first pass already. */
static void coll_failed_locked(mml_loader *L, coll_state *c) {
  const mml_sample *s = &c->s;
  if (L->limit_seq >= 0) { /* seek_ahead: a skipped sample needs one more to replace it */
    L->limit_seq++;
    ld_work_wake(L, 1);
  }
  int again = s->pos >= L->n_rank;
  if (!again) {
    L->coll_skipped++;
    log_skip_locked(L, s);
  }
  c->since_good++;
  if (L->cfg.on_error_raise && !again) {
    pend_item *pi = pend_reserve_locked(L, c->gen);
    if (!pi) return;
    pi->it.kind = ITEM_ERROR;
    pi->it.epoch = c->epoch;
    pi->it.err = s->err;
    pi->state = PEND_READY;
    ld_move_ready_locked(L);
  }
  if (L->gp && !L->fatal) coll_plan_boundary_locked(L, c);
  int64_t min_n = L->cfg.min_error_samples > 0 ? L->cfg.min_error_samples : 100;
  if ((int64_t)L->samples >= min_n &&
      (double)L->coll_skipped > L->cfg.max_error_rate * (double)L->samples) {
    mml_err e2;
    mml_err_set(&e2, MML_ETOOMANYERR,
                "%llu of %llu samples failed, above max_error_rate=%g; last: %s",
                (unsigned long long)L->coll_skipped, (unsigned long long)L->samples,
                L->cfg.max_error_rate, s->err.msg);
    ld_set_fatal_locked(L, MML_ETOOMANYERR, &e2);
  } else if (L->per_epoch >= 0 && c->since_good > L->n_rank) {
    mml_err e2;
    mml_err_set(&e2, MML_ETOOMANYERR, "epoch %lld: no usable sample in %lld positions; last: %s",
                (long long)c->epoch, (long long)c->since_good, s->err.msg);
    ld_set_fatal_locked(L, MML_ETOOMANYERR, &e2);
  }
}

/* A good sample joins the batch being composed; complete batches are handed off. */
static void coll_add_locked(mml_loader *L, coll_state *c) {
  L->good++;
  c->since_good = 0;
  mml_collator *C = L->colls[c->ci];
  if (!mml_collator_fits(C, &c->s)) { /* the current batch is complete without s */
    if (!hand_off_locked(L, c->gen, &c->ci, c->epoch, (mml_cursor){c->epoch, c->s.pos, c->bie + 1}))
      return;
    c->bie++;
    C = L->colls[c->ci];
  }
  int64_t pos = c->s.pos;
  mml_status pst = ld_place_take_locked(L, C, c->tk, c->at, &c->s, &c->err);
  if (pst) {
    ld_set_fatal_locked(L, pst, &c->err);
    return;
  }
  /* the collator instance holds the sample's buffers now (attached): its own references
   * go before the hand-off below, which may wait for the emission and the consumer's
   * release of this very batch (loader_admit.c A10) */
  for (int p = 0; p < PLANES; p++) {
    mml_buf_release(c->at[p].dest);
    c->at[p].dest = NULL;
  }
  pthread_mutex_unlock(&L->mu);
  double t0 = mml_now();
  mml_status st = mml_collator_add(C, &c->s, &c->err); /* moves buffers: cheap */
  int full = !st && mml_collator_full(C);
  double dt = mml_now() - t0;
  pthread_mutex_lock(&L->mu);
  L->collate_s += dt;
  if (st) {
    ld_set_fatal_locked(L, st, &c->err);
    return;
  }
  if (L->gp) full = ld_plan_batch_end_locked(L, c->epoch, pos);
  if (full &&
      hand_off_locked(L, c->gen, &c->ci, c->epoch, (mml_cursor){c->epoch, pos + 1, c->bie + 1}))
    c->bie++;
}

void *ld_collator_main(void *arg) {
  mml_loader *L = arg;
  coll_state c;
  memset(&c, 0, sizeof c);
  mml_err_clear(&c.err);
  uint64_t faults = 0;
  pthread_mutex_lock(&L->mu);
  c.gen = L->gen - 1; /* forces a restart */
  while (!L->stop) {
    ld_count_faults_locked(L, &faults);
    if (L->fatal) {
      pthread_cond_wait(&L->coll_cv, &L->mu);
      continue;
    }
    if (L->gen != c.gen) {
      coll_restart_locked(L, &c);
      continue;
    }
    if (coll_epoch_locked(L, &c)) continue;
    const uint64_t seen = ld_coll_look_locked(L);       /* W2: before the look */
    ld_place_locked(L, c.epoch, c.bie, L->colls[c.ci]); /* plan ahead: queue decodes */
    task *t = &L->tasks[L->head_seq % L->window];
    if (t->state != SLOT_DONE || t->gen != c.gen || !ld_place_ready(L, t)) {
      /* a buffer it waits for: woken as room comes back (loader_admit.c W1, W2) */
      ld_coll_wait_locked(L, seen, L->mem_blocked || L->expand_waits);
      continue;
    }
    ld_coll_looked_locked(L);
    mml_sample_swap(&c.s, &t->sample);
    c.tk = t->tk;
    for (int p = 0; p < PLANES; p++) { /* its references move here */
      c.at[p] = t->at[p];
      c.at[p].home = NULL;
      t->at[p].dest = NULL;
    }
    ld_place_clear(t);
    t->state = SLOT_EMPTY;
    L->head_seq++;
    L->collating = 1;  /* loader_admit.c C2: a batch it completes is handed off below */
    L->place_held = 0; /* placement may go on (loader_admit.c C2) */
    ld_work_wake(L, 1);
    L->samples++;
    ld_source_count_locked(L, &c.s);
    if (c.s.status != MML_OK) {
      if (c.s.status == MML_ENOMEM && L->cfg.max_memory) /* it can never fit: stop here */
        ld_set_fatal_locked(L, MML_ENOMEM, &c.s.err);
      else
        coll_failed_locked(L, &c);
      /* it was in a planned batch: the batches from here on are planned again without it */
      if (c.tk >= 0 && !L->fatal && c.gen == L->gen)
        ld_place_rewind_locked(L, L->colls[c.ci], L->head_seq);
    } else {
      coll_add_locked(L, &c);
    }
    for (int p = 0; p < PLANES; p++) {
      mml_buf_release(c.at[p].dest);
      c.at[p].dest = NULL;
    }
    L->collating = 0;
    ld_consumer_stale_locked(L); /* C2, C6: a sample taken and added: the engine may be idle */
  }
  pthread_mutex_unlock(&L->mu);
  mml_sample_free(&c.s);
  return NULL;
}
