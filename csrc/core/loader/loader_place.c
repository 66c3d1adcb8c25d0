/*
 * loader_place.c — plan before decode: the loader's planner places planned samples into
 * batches ahead of the collator, so every image is decoded straight into its slice of
 * its batch's pixel_values buffer and every video into its slice of the batch's
 * pixel_values_videos buffer (written once, never copied in the normal course).
 *
 * DATA FLOW
 *   worker:   record -> image bytes -> headers (mml_sample_plan: grids, tokens, ids,
 *             labels, max_length) -> slot PLANNED (or DONE when failed / text-only)
 *   planner:  (the collation thread, this file) walks planned slots in stream order and
 *             runs the collator's own composition step (mml_compose_fits/add/full) on
 *             their token counts, so it composes exactly the batches the collator will:
 *             each batch is a `ticket` with two PLANES, PL_IMG (pixel_values rows) and
 *             PL_VID (pixel_values_videos rows), each with its own row width; a plane's
 *             buffer is taken from the pool as soon as its size is known (padded: when
 *             the ticket is complete; packed: at its first row in that plane, with the
 *             pack's bound pack_length * merge^2 rows), and each member's decode is
 *             queued once every plane it has rows in has given it a destination
 *             (buffer + first row * row bytes); a padded batch's members, all at once,
 *             largest decode first without max_memory (P1 at assign_members)
 *   worker:   decodes the queued sample's images and videos into their destinations
 *             -> slot DONE
 *   collator: takes DONE slots strictly in order, exactly as before (the same
 *             composition code, on the same counts), attaching the head ticket's buffers
 *             as the batch's pixel_values and pixel_values_videos; emission only writes
 *             the small tensors.
 *
 * LATE FAILURES.  A sample that planned but fails to decode (corrupt data past the
 * header) is skipped as before, and composition must be what it was: the collator skips
 * it in order (counted and reported exactly as before), then rewinds the planner to the
 * sample after it: the head ticket keeps what the collator already took (copied into a
 * fresh buffer), every later placement is dropped and redone.  Samples already decoded
 * at their old place are copied to their new one (memcpy, the only pixel copy, counted
 * in moved_rows, both planes); queued ones just get the new destination; running ones
 * copy when they finish.  Batches are therefore bitwise what they were, whatever fails
 * and when.  The same rewind serves a padded epoch's wrap (the plan of seq changes) and a
 * padded ticket that had to be given a buffer before it was complete (the window ran out
 * or the epoch ended): it is then re-buffered as it grows.
 *
 * BUFFERS.  A buffer, once a ticket plane's, only receives writes at the offsets that
 * ticket gave; a plane that changes (rewind, growth) moves to a fresh buffer, so no move
 * can overwrite rows a running decode still writes.  Every holder (ticket, task dest/home, a
 * running decode, the collator, the batch's tensor) holds its own reference; the buffer
 * returns to the pool with the last one.  A ticket's first buffer waits while the workers
 * have 2 x num_threads decodes queued or running (and while `prefetch` batches are
 * ahead), so buffers hold pages about to be written, whatever the window's size.
 *
 * COMPACT (pixel_format "float32" / "bfloat16", the default; not their "-decode" forms;
 * place_compact says when else not).  The PL_IMG plane holds uint8 patch rows in flight
 * (pixel_format uint8's layout: one frame per row, 1 byte per value, an eighth of
 * float32's bytes): workers decode images into them (the source's pl_u8), every move above
 * copies them, and when the batch is emitted (loader_collator.c emit_expand, on the
 * emitting worker, helped by idle workers: loader_expand.c) they are expanded through the
 * normalisation's exact table (mml_pixels_expand) into float rows, which become
 * pixel_values: in place, the plane's buffer having been taken with the capacity of its
 * float rows (mml_pool_alloc_cap: pages for the uint8 rows only) and grown at emission
 * (mml_pool_grow), so the expanding batch holds no second buffer; where the pool cannot
 * grow it (a kernel that cannot move pages) into a float buffer of the pool, the uint8 one
 * going back.  So the batches still being decoded -- most of `prefetch` when the consumer
 * keeps up -- hold an eighth of their float bytes.  The values are the writers' (the table
 * is theirs, vision_patch.c), so batches are bitwise the same.  Videos keep their float
 * rows (a resized video's values are not bytes).
 *
 * IMAGE BYTES.  A sample's encoded images are read into byte buffers that outlive it: once
 * decoded (or failed) its buffers become spares, and the next read takes the smallest
 * spare that holds its file, so those pages stay mapped instead of being freed and
 * faulted in again (ld_bytes_take / ld_bytes_return_locked: loader_bytes.c).
 *
 * MEMORY CAP (max_memory).  This file only places; every memory decision is
 * loader_admit.c's, asked through these calls: whether a pack's buffer may be its bound
 * (ld_admit_pack_bound_ok, at ld_place_new); whether decodes are queued in stream order
 * (ld_admit_decodes_in_order, P1); whether a ticket plane's buffer may be taken now
 * (ld_admit_ticket_locked from rebuffer, after the turn rules here -- tickets in their
 * turn in order, `prefetch`, decodes ahead: the plane's charge in the memory ledger,
 * which waits there when it does not fit and wakes the collation thread when granted,
 * loader_admit.c T1-T3; the grant pays for the allocation, made between
 * ld_ledger_cover_begin and _end: A7) and its charge's end (ld_admit_ticket_cancel_locked);
 * what makes way for the head ticket (ld_admit_make_way_locked, after which retry_pending asks
 * again); a queued decode's scratch charge, asked when its last destination is set
 * (ld_admit_decode_queued_locked: loader_admit.c D1) and left when it is unplaced
 * (ld_admit_scratch_drop_locked, D3); and whether an open pack the consumer waits for asks
 * for its rows so far instead of its bound (ld_admit_bound_stuck_locked, then
 * ld_admit_bound_asked_locked).
 * Whether the batch the consumer waits for can never get room is the ledger's deadlock
 * rule (ledger.c L7), which fails its charge.
 *
 * Locking: everything here runs with the loader's mu held, on the collation thread
 * (ld_place_decoded_locked on a worker, also under mu); mu -> pool is the lock order.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader_int.h"

static ticket *tk_at(mml_loader *L, int64_t id) { return &L->tks[id % L->ntk]; }
static task *slot_of(mml_loader *L, int64_t seq) { return &L->tasks[seq % L->window]; }

/* Rows of plane p a sample has: its images' or its videos'. */
static int64_t plane_rows(const mml_sample *s, int p) {
  return p == PL_IMG ? s->pixel_rows : s->vpixel_rows;
}

/* Compact pixels (COMPACT above): on for pixel_format float32 / bfloat16 unless
 * unsafe: pinned or the caller's memory and a device stage (their buffers are the batches
 * handed out), or sources whose images normalise differently (one table per batch).
 * Under max_memory the budget counts the uint8 rows and keeps room for the expansions
 * (MEMORY CAP below). */
static void place_compact(mml_loader *L) {
  L->compact = 0;
  if (!L->placing || !mml_pixels_compact(L->cfg.pixels) || L->pinned || L->cfg.allocator ||
      L->stage)
    return;
  for (int i = 1; i < L->nsrc; i++)
    if (memcmp(L->src[i].vision.mean, L->src[0].vision.mean, sizeof L->src[0].vision.mean) ||
        memcmp(L->src[i].vision.std, L->src[0].vision.std, sizeof L->src[0].vision.std))
      return;
  for (int i = 0; i < L->nsrc; i++) {
    ld_source *s = &L->src[i];
    s->vision_u8 = s->vision;
    s->vision_u8.pixel_format = MML_PIXEL_UINT8;
    s->pl_u8 = s->pl;
    s->pl_u8.vision = &s->vision_u8;
  }
  mml_vision_pixel_table(&L->src[0].vision, L->ptable);
  L->expand_row_bytes = L->row_bytes[PL_IMG];
  L->row_bytes[PL_IMG] = mml_vision_row_bytes(&L->src[0].vision_u8);
  L->compact = 1;
}

mml_status ld_place_new(mml_loader *L, mml_err *err) {
  L->placing = !L->cfg.plan_only;
  L->ntk = L->window + 2; /* each ticket but the open one holds a sample in the window */
  L->tks = calloc((size_t)L->ntk, sizeof *L->tks);
  if (!L->tks) return mml_err_set(err, MML_ENOMEM, "out of memory building the loader");
  L->tk_head = 0;
  L->tk_tail = -1;
  int merge = 1;
  for (int i = 0; i < L->nsrc; i++)
    if (L->src[i].vision.merge_size > merge) merge = L->src[i].vision.merge_size;
  const size_t elem = mml_dtype_size(mml_pixel_format_dtype(L->ccfg.pixel_format));
  const int vcols = L->ccfg.video_cols > 0 ? L->ccfg.video_cols : L->ccfg.pixel_cols;
  L->row_bytes[PL_IMG] = (size_t)L->ccfg.pixel_cols * elem;
  L->row_bytes[PL_VID] = (size_t)vcols * elem;
  place_compact(L);
  /* A pack's buffer is its bound (decodes start at once, nothing ever moves): host pages
   * are only resident once written.  Pinned or caller-allocated memory is all resident,
   * and admission may refuse a bound (ld_admit_pack_bound_ok): then a pack's buffer is
   * sized when the pack is complete, like a padded batch's. */
  for (int p = 0; p < PLANES; p++) {
    L->rows_bound[p] = mml_collator_rows_bound(L->collator, merge);
    const size_t rb = p == PL_IMG && L->compact ? L->expand_row_bytes : L->row_bytes[p];
    if (L->pinned || L->cfg.allocator ||
        (L->rows_bound[p] > 0 &&
         !ld_admit_pack_bound_ok(L, (int64_t)((size_t)L->rows_bound[p] * rb))))
      L->rows_bound[p] = -1;
  }
  return MML_OK;
}

static void ticket_drop(mml_loader *L, ticket *k) {
  ld_admit_expand_cancel_locked(L, k); /* its expansion's charge leaves too (E3) */
  for (int p = 0; p < PLANES; p++) {
    ld_admit_ticket_cancel_locked(L, &k->pl[p]); /* its charge leaves the ledger (T2) */
    mml_buf_release(k->pl[p].buf);
  }
  memset(k, 0, sizeof *k);
}

void ld_place_free(mml_loader *L) {
  if (!L->tks) return;
  for (int i = 0; i < L->ntk; i++) ticket_drop(L, &L->tks[i]);
  free(L->tks);
  L->tks = NULL;
}

static void unplace(task *t) {
  t->tk = -1;
  for (int p = 0; p < PLANES; p++) {
    mml_buf_release(t->at[p].dest);
    t->at[p].dest = NULL;
  }
}

void ld_place_clear(task *t) {
  unplace(t);
  for (int p = 0; p < PLANES; p++) {
    mml_buf_release(t->at[p].home);
    t->at[p].home = NULL;
  }
}

int ld_place_has_dests(const task *t) {
  for (int p = 0; p < PLANES; p++)
    if (plane_rows(&t->sample, p) > 0 && !t->at[p].dest) return 0;
  return 1;
}

/* A decoded sample's plane-p rows go where they now belong (the only copy of pixels;
 * rare). */
static void move_home(mml_loader *L, task *t, int p) {
  place_at *a = &t->at[p];
  int64_t rows = plane_rows(&t->sample, p);
  memcpy((uint8_t *)a->dest->data + a->dest_off, (uint8_t *)a->home->data + a->home_off,
         (size_t)rows * L->row_bytes[p]);
  L->moved_rows += (uint64_t)rows;
  mml_buf_release(a->home);
  mml_buf_retain(a->dest);
  a->home = a->dest;
  a->home_off = a->dest_off;
}

static void queue_decode(mml_loader *L, task *t) {
  t->dec = DEC_QUEUED;
  t->next_dec = NULL;
  if (L->dec_tail)
    L->dec_tail->next_dec = t;
  else
    L->dec_head = t;
  L->dec_tail = t;
  ld_work_wake(L, 0);
  ld_consumer_stale_locked(L); /* loader_admit.c C2, C6: work queued, the engine is not idle */
}

/* t's plane-p rows go to byte `off` of buf: its decode queued (once every plane it has
 * rows in has a place), or (decoded) moved, or (running) moved by the worker when it
 * finishes. */
static void set_dest(mml_loader *L, task *t, int p, mml_buf *buf, size_t off) {
  place_at *a = &t->at[p];
  mml_buf_retain(buf);
  mml_buf_release(a->dest);
  a->dest = buf;
  a->dest_off = off;
  if (t->state == SLOT_PLANNED) {
    if (t->dec == DEC_NONE && ld_place_has_dests(t)) queue_decode(L, t);
    /* its scratch charge, in this critical section (loader_admit.c D1; a decode unplaced
     * and placed again while queued asks anew: D3) */
    if (t->dec == DEC_QUEUED && ld_place_has_dests(t)) ld_admit_decode_queued_locked(L, t);
  } else if (a->home && (a->home != buf || a->home_off != off)) {
    move_home(L, t, p);
  }
}

/* The ticket's uncommitted members (seq from head_seq to place_seq) get their places in
 * plane p's buffer.  Invariant P1: without max_memory, when a ticket's members get their
 * buffer together (a padded batch complete by plan: close_ticket), their decodes are queued
 * largest first (task.decode_cost; ties in stream order), so a batch does not wait on a large
 * image whose decode started last while the other workers had nothing of the batch left to
 * do.  Where each sample's rows go is unchanged, and so are the batches, bit for bit.
 * Under max_memory the queue stays in stream order: a decode waiting for scratch room holds
 * back the later ones needing room (loader_worker.c), and with the collator's next sample
 * behind a larger one that waits, the room could wait on that very sample
 * (tests/test_memory_stress.py hung so, seed 2016). */
#define MML_LPT_MAX 256 /* members sorted at most; a larger batch is queued in stream order */
static void assign_members(mml_loader *L, int64_t id, int p) {
  ticket *k = tk_at(L, id);
  int64_t s0 = k->first_seq > L->head_seq ? k->first_seq : L->head_seq;
  task *order[MML_LPT_MAX];
  int64_t cost[MML_LPT_MAX];
  int n = 0;
  for (int64_t s = s0; s < L->place_seq; s++) {
    task *t = slot_of(L, s);
    if (t->tk == id && plane_rows(&t->sample, p) > 0) {
      if (n == MML_LPT_MAX) break;
      const int64_t c = t->decode_cost;
      int j = n++;
      for (; j > 0 && cost[j - 1] < c; j--) { /* insertion: stable, largest first */
        order[j] = order[j - 1];
        cost[j] = cost[j - 1];
      }
      order[j] = t;
      cost[j] = c;
    }
  }
  if (n == MML_LPT_MAX || ld_admit_decodes_in_order(L)) { /* stream order: too many, or P1 */
    for (int64_t s = s0; s < L->place_seq; s++) {
      task *t = slot_of(L, s);
      if (t->tk == id && plane_rows(&t->sample, p) > 0)
        set_dest(L, t, p, k->pl[p].buf, (size_t)t->at[p].row * L->row_bytes[p]);
    }
    return;
  }
  for (int i = 0; i < n; i++)
    set_dest(L, order[i], p, k->pl[p].buf, (size_t)order[i]->at[p].row * L->row_bytes[p]);
}

/* Whether ticket k holds a buffer in any plane. */
int ld_place_has_buf(const ticket *k) {
  for (int p = 0; p < PLANES; p++)
    if (k->pl[p].buf) return 1;
  return 0;
}

/* The ticket the collator's next sample is in: the head ticket, or the one after it while
 * the head is a pack or a batch still open in the collator (complete only once that next
 * sample is decoded and does not fit). */
int64_t ld_place_needed_ticket(mml_loader *L) {
  int64_t id = L->tk_head;
  while (id < L->tk_tail && tk_at(L, id + 1)->first_seq <= L->head_seq) id++;
  return id;
}

/* Whether `prefetch` batches with pixels are ahead of the consumer, for ticket id's first
 * buffer: finished ones (output and pending queues) and tickets with a buffer (being
 * decoded).  The ticket holding the collator's next sample counts finished batches only:
 * they drain without it (the consumer, the emitting workers), tickets only through it (a
 * pack is complete only once the next sample is decoded and does not fit). */
static int prefetch_full(mml_loader *L, int64_t id) {
  int64_t n = L->out_count + (L->pend_tail - L->pend_head);
  if (tk_at(L, id)->first_seq > L->head_seq)
    for (int64_t j = L->tk_head; j <= L->tk_tail; j++) n += ld_place_has_buf(tk_at(L, j));
  return n >= L->cfg.prefetch;
}

/* Whether the workers have decodes enough ahead of them for ticket id to wait for its first
 * buffer: at least 2 x num_threads samples queued or running.  A buffer is taken only
 * shortly before its pages are written: otherwise, with a large window (complete tickets
 * planned far ahead) and a consumer as fast as the workers, up to `prefetch` tickets hold
 * whole batches of pages that no worker reaches for a while.  The ticket holding the
 * collator's next sample never waits here.  Progress: every decode counted here marks its
 * slot DONE and wakes the collator, which retries. */
static int decodes_ahead(mml_loader *L, int64_t id) {
  if (tk_at(L, id)->first_seq <= L->head_seq) return 0;
  int64_t n = 0, want = 2 * (int64_t)L->cfg.num_threads;
  for (int64_t s = L->head_seq; s < L->place_seq && n < want; s++) {
    const task *t = slot_of(L, s);
    n += t->seq == s && t->gen == L->gen && t->state == SLOT_PLANNED && t->dec != DEC_NONE;
  }
  return n >= want;
}

int ld_place_turn_waits_locked(mml_loader *L, int64_t id) {
  return prefetch_full(L, id) || decodes_ahead(L, id);
}

/* Gives plane p of ticket `id` a fresh buffer of cap_rows rows: the rows the collator
 * already took are copied (and the collator `c` composing it switches to it), the rest
 * placed anew.  A ticket's first buffer waits while `prefetch` batches are ahead of the
 * consumer (the depth a DataLoader's prefetch_factor x workers means), and for
 * max_memory's room. */
static int rebuffer(mml_loader *L, int64_t id, int p, int64_t cap_rows, mml_collator *c) {
  ticket *k = tk_at(L, id);
  tk_plane *q = &k->pl[p];
  /* tickets get their turn in order: none while an earlier one waits for its turn; one
   * behind an earlier one waiting for room asks the ledger, which grants in order (L1:
   * its charge waits behind the earlier one's, T1) */
  int earlier = 0;
  for (int64_t j = L->tk_head; j < id; j++)
    for (int r = 0; r < PLANES; r++)
      earlier |= tk_at(L, j)->pl[r].pending_rows > 0 && !tk_at(L, j)->pl[r].charged;
  const int turn = !earlier && (ld_place_has_buf(k) || !ld_place_turn_waits_locked(L, id));
  int64_t grant = 0; /* the ledger's, for the buffer mapped below */
  if (!ld_admit_ticket_locked(L, id, p, cap_rows, turn, &grant)) {
    q->pending_rows = cap_rows;
    L->mem_blocked = 1;
    return 0;
  }
  q->pending_rows = 0;
  mml_buf *nb = NULL;
  mml_err err;
  /* granted before it is mapped: the grant pays for the pool's growth (its hook) */
  ld_ledger_cover_begin(L, grant);
  /* compact image rows: room to become their float rows in place (loader_collator.c) */
  mml_status st = p == PL_IMG && L->compact
                      ? mml_pool_alloc_cap(L->pool, (size_t)cap_rows * L->row_bytes[p],
                                           (size_t)cap_rows * L->expand_row_bytes, &nb, &err)
                      : mml_pool_alloc(L->pool, (size_t)cap_rows * L->row_bytes[p], &nb, &err);
  ld_ledger_cover_end(L);
  if (st) {
    mml_err_prefix(&err, "%s of a batch (%lld rows)",
                   p == PL_IMG ? "pixel_values" : "pixel_values_videos", (long long)cap_rows);
    ld_set_fatal_locked(L, st, &err);
    return 0;
  }
  if (q->done_rows > 0 && q->buf) {
    memcpy(nb->data, q->buf->data, (size_t)q->done_rows * L->row_bytes[p]);
    L->moved_rows += (uint64_t)q->done_rows;
  }
  if (q->done_rows > 0 && c) mml_collator_attach_pixels(c, p, nb);
  mml_buf_release(q->buf);
  q->buf = nb;
  q->cap_rows = cap_rows;
  assign_members(L, id, p);
  if (p == PL_IMG) ld_admit_expand_locked(L, id); /* its rows final: its expansion (E1) */
  return 1;
}

/* Whether plane q should be given a buffer of its rows so far: it has none, or waits for
 * a larger one (a pack's bound, asked for when it outgrew the buffer a rewind left it:
 * that request, kept where its plan became final, raised OutOfMemoryError in
 * MML_STRESS_SEED=1000 where its rows fitted). */
static int rows_now(const tk_plane *q) {
  return q->buf ? q->pending_rows > q->rows && q->rows > q->cap_rows : q->rows > 0;
}

/* The ticket is complete by plan: a padded one gets its exact buffers now. */
static void close_ticket(mml_loader *L, int64_t id, mml_collator *c) {
  ticket *k = tk_at(L, id);
  k->closed = 1;
  for (int p = 0; p < PLANES; p++)
    if (rows_now(&k->pl[p])) rebuffer(L, id, p, k->pl[p].rows, c);
  ld_admit_expand_locked(L, id); /* before any later ticket asks (E1) */
}

/* Where placing stopped for good (final: the epoch ends, or has its batches) or until
 * the collator takes samples: a padded ticket still open gets buffers of its rows so
 * far (re-buffered if it grows) when it is final, or the collator waits for it (it is
 * the needed ticket: only its decodes let the window move; a pack's ticket after an open
 * head pack, with window 2, hung here when it was not the head). */
static void stall(mml_loader *L, mml_collator *c, int final) {
  if (L->tk_tail < L->tk_head || (!final && L->tk_tail != ld_place_needed_ticket(L))) return;
  ticket *k = tk_at(L, L->tk_tail);
  for (int p = 0; p < PLANES; p++)
    if (rows_now(&k->pl[p])) rebuffer(L, L->tk_tail, p, k->pl[p].rows, c);
}

/* Sample t's plane-p rows join ticket `id` (at t->at[p].row): a place in its buffer now,
 * or once the buffer exists. */
static void place_rows(mml_loader *L, task *t, int64_t id, int p, mml_collator *c) {
  tk_plane *q = &tk_at(L, id)->pl[p];
  const int64_t bound = L->rows_bound[p];
  if (!q->buf && bound > 0)
    rebuffer(L, id, p, bound, c);           /* packed */
  else if (q->buf && q->rows > q->cap_rows) /* grew past its buffer */
    rebuffer(L, id, p, bound > 0 ? bound : q->rows, c);
  else if (q->buf)
    set_dest(L, t, p, q->buf, (size_t)t->at[p].row * L->row_bytes[p]);
}

/* One planned sample t (seq place_seq) joins the tail ticket, or a new one.  Returns 0
 * when it cannot be placed yet (the epoch has its batches: the collator ends it). */
static int place_one(mml_loader *L, task *t, int64_t epoch, int64_t pos, int64_t bie,
                     mml_collator *c) {
  int64_t tokens = mml_collator_sample_tokens(L->collator, &t->sample);
  ticket *k = L->tk_tail >= L->tk_head ? tk_at(L, L->tk_tail) : NULL;
  if (!k || k->closed || k->epoch != epoch || !mml_compose_fits(L->collator, &k->comp, tokens)) {
    if (k && !k->closed) close_ticket(L, L->tk_tail, c);
    int64_t open = L->tk_tail - L->tk_head + 1;
    if (L->per_epoch >= 0 && bie + open >= L->per_epoch) return 0;
    if (open + 1 > L->ntk) return 0; /* cannot happen: the window bounds tickets */
    k = tk_at(L, ++L->tk_tail);
    ticket_drop(L, k);
    k->epoch = epoch;
    k->first_seq = L->place_seq;
  }
  int64_t id = L->tk_tail;
  t->tk = id;
  for (int p = 0; p < PLANES; p++) {
    t->at[p].row = k->pl[p].rows;
    k->pl[p].rows += plane_rows(&t->sample, p);
  }
  mml_compose_add(L->collator, &k->comp, &t->sample);
  L->place_seq++;
  for (int p = 0; p < PLANES; p++)
    if (plane_rows(&t->sample, p) > 0) place_rows(L, t, id, p, c);
  /* the global plan ends batches at planned positions (as coll_add_locked) */
  if (L->gp ? ld_plan_batch_end_locked(L, epoch, pos) : mml_compose_full(L->collator, &k->comp))
    close_ticket(L, id, c);
  return 1;
}

/* Tickets waiting for room try again, in order, until one still waits. */
static void retry_pending_once(mml_loader *L, mml_collator *c) {
  L->mem_blocked = 0;
  int failed = 0;
  for (int64_t id = L->tk_head; id <= L->tk_tail && !failed; id++) {
    ticket *k = tk_at(L, id);
    for (int p = 0; p < PLANES && !failed; p++)
      failed = k->pl[p].pending_rows && !rebuffer(L, id, p, k->pl[p].pending_rows, c);
  }
}

/* ... and again each time admission made way for the head (ld_admit_make_way_locked). */
static void retry_pending(mml_loader *L, mml_collator *c) {
  do retry_pending_once(L, c);
  while (ld_admit_make_way_locked(L));
}

/* After placing: an open pack the consumer waits for whose planes wait for buffers of its
 * bound, where nothing else can give room back (ld_admit_bound_stuck_locked: the state in
 * which the ledger's deadlock rule, L7, would decide but for the bound), asks for its rows
 * so far (as a full window does: stall), re-buffered if it grows: those rows are needed
 * whatever joins it, and nothing can join while the reads wait for room
 * (MML_STRESS_SEED=1000).  If those do not fit either, L7 fails their charge once the
 * consumer declares its wait again (the poke): the explainer's error (loader_admit.c C3). */
static void mem_stuck(mml_loader *L, mml_collator *c) {
  if (!ld_admit_bound_stuck_locked(L)) return;
  const int64_t nt = ld_place_needed_ticket(L);
  for (int p = 0; p < PLANES; p++) {
    const tk_plane *q = &tk_at(L, nt)->pl[p];
    if (q->pending_rows > q->rows && rows_now(q)) rebuffer(L, nt, p, q->rows, c);
  }
  ld_admit_bound_asked_locked(L);
}

static void place_locked(mml_loader *L, int64_t epoch, int64_t bie, mml_collator *c);

void ld_place_locked(mml_loader *L, int64_t epoch, int64_t bie, mml_collator *c) {
  if (!L->placing || L->fatal) return;
  const int64_t was = L->place_seq;
  const int held = L->place_held, blocked = L->mem_blocked;
  place_locked(L, epoch, bie, c);
  /* loader_admit.c C7: while a ticket waits for room, the look ends with make-way done for
   * what it placed (next() counts those bytes as coming back: nothing else asks for them) */
  if (L->mem_blocked && !L->fatal) retry_pending(L, c);
  if (L->place_seq != was || L->place_held != held)
    ld_consumer_stale_locked(L); /* loader_admit.c C2, C6: the engine may be idle now */
  if (!L->fatal) mem_stuck(L, c);
  L->expand_waits = ld_admit_expand_all_locked(L); /* E1: those still to ask, in order */
  /* loader_admit.c W5: T5 reads mem_blocked, the read gate it and place_seq */
  if (L->place_seq != was || L->mem_blocked != blocked) ld_room_gates_wake_workers_locked(L);
}

static void place_locked(mml_loader *L, int64_t epoch, int64_t bie, mml_collator *c) {
  if (L->mem_blocked) retry_pending(L, c);
  if (L->place_seq < L->head_seq) L->place_seq = L->head_seq;
  L->place_held = 0;
  while (!L->fatal) {
    int64_t p = L->place_seq;
    if (p >= L->head_seq + L->window || (L->limit_seq >= 0 && p >= L->limit_seq)) {
      stall(L, c, 0); /* only the collator taking samples lets more in */
      L->place_held = 1;
      return;
    }
    if (p >= L->next_seq) return; /* a worker will start it */
    /* the epoch's end first, whatever the next sample's state: a later epoch's sample may
     * be parked until the consumer asks for its epoch (loader_video.c 2: busy, not in
     * flight), and placement stops here for the epoch, not for it (loader_admit.c C2) */
    int64_t e, pos;
    ld_plan_at_locked(L, p, &e, &pos);
    if (e != epoch || (L->gp && pos >= ld_plan_rank_len_locked(L, e))) {
      stall(L, c, 1); /* the collator ends the epoch first */
      L->place_held = 1;
      return;
    }
    task *t = slot_of(L, p);
    if (t->gen != L->gen || t->seq != p || t->state == SLOT_BUSY) return; /* being planned */
    if (t->sample.status != MML_OK) { /* failed before any pixel work: not in any batch */
      L->place_seq++;
      /* ... but a planned batch ending here ends (coll_plan_boundary_locked) */
      if (L->gp && L->tk_tail >= L->tk_head && !tk_at(L, L->tk_tail)->closed &&
          ld_plan_batch_end_locked(L, epoch, pos))
        close_ticket(L, L->tk_tail, c);
      continue;
    }
    if (!place_one(L, t, epoch, pos, bie, c)) {
      stall(L, c, 1);
      L->place_held = 1;
      return;
    }
  }
}

/* A queued decode unplaced cannot start until it is placed again, which may wait for later
 * work (a padded batch complete): its scratch charge leaves the ledger now, asked again
 * when it has its places (loader_admit.c D3). */
static void unplace_queued(mml_loader *L, task *t) {
  if (t->dec == DEC_QUEUED) ld_admit_scratch_drop_locked(L, t);
  unplace(t);
}

void ld_place_reset_locked(mml_loader *L) {
  for (int64_t id = L->tk_head; id <= L->tk_tail; id++) ticket_drop(L, tk_at(L, id));
  L->tk_head = L->tk_tail + 1;
  for (int i = 0; i < L->window; i++) unplace_queued(L, &L->tasks[i]);
  L->place_seq = L->head_seq;
}

void ld_place_rewind_locked(mml_loader *L, mml_collator *c, int64_t seq) {
  if (!L->placing) return;
  for (int64_t s = seq; s < L->place_seq; s++) unplace_queued(L, slot_of(L, s));
  for (int64_t id = L->tk_head + 1; id <= L->tk_tail; id++) ticket_drop(L, tk_at(L, id));
  if (L->tk_tail >= L->tk_head) L->tk_tail = L->tk_head;
  L->place_seq = seq;
  if (L->tk_tail < L->tk_head) return;
  ticket *k = tk_at(L, L->tk_head);
  mml_compose cs = mml_collator_compose_state(c);
  if (cs.count == 0) { /* nothing of it was taken: it is gone */
    ticket_drop(L, k);
    L->tk_tail = L->tk_head - 1;
    return;
  }
  k->comp = cs;
  k->closed = 0;
  ld_admit_expand_cancel_locked(L, k); /* its rows change (E3) */
  for (int p = 0; p < PLANES; p++) {
    tk_plane *q = &k->pl[p];
    q->rows = q->done_rows;
    q->pending_rows = 0;
    ld_admit_ticket_cancel_locked(L, q);
    /* The buffer keeps the rows taken; decodes may still write at old offsets past them,
     * so it takes nothing more: the next rows of this plane re-buffer it. */
    q->cap_rows = q->done_rows;
    if (q->done_rows == 0) {
      mml_buf_release(q->buf);
      q->buf = NULL;
    }
  }
}

int ld_place_ready(const mml_loader *L, const task *t) {
  if (!L->placing || t->sample.status != MML_OK) return 1;
  if (t->tk < 0) return 0;
  for (int p = 0; p < PLANES; p++) {
    const place_at *a = &t->at[p];
    if (plane_rows(&t->sample, p) > 0 &&
        !(a->dest && a->home == a->dest && a->home_off == a->dest_off))
      return 0;
  }
  return 1;
}

mml_status ld_place_take_locked(mml_loader *L, mml_collator *c, int64_t tk,
                                const place_at at[PLANES], const mml_sample *s, mml_err *err) {
  if (!L->placing) return MML_OK;
  if (tk != L->tk_head || L->tk_tail < L->tk_head)
    return mml_err_set(err, MML_EINTERNAL, "planner: sample planned in batch %lld, taken into %lld",
                       (long long)tk, (long long)L->tk_head);
  ticket *k = tk_at(L, tk);
  for (int p = 0; p < PLANES; p++) {
    tk_plane *q = &k->pl[p];
    int64_t rows = plane_rows(s, p);
    if (rows <= 0) continue;
    mml_buf *have = mml_collator_attached_pixels(c, p);
    if (at[p].dest != q->buf || at[p].dest_off != (size_t)q->done_rows * L->row_bytes[p] ||
        (have && have != q->buf))
      return mml_err_set(err, MML_EINTERNAL, "planner: %s rows of a sample out of place",
                         p == PL_IMG ? "pixel_values" : "pixel_values_videos");
    if (!have) mml_collator_attach_pixels(c, p, q->buf);
    q->done_rows += rows;
  }
  return MML_OK;
}

void ld_place_pop_locked(mml_loader *L) {
  if (!L->placing || L->tk_tail < L->tk_head) return;
  ticket_drop(L, tk_at(L, L->tk_head));
  L->tk_head++;
}

void ld_place_decoded_locked(mml_loader *L, task *t, int p, mml_buf *buf, size_t off) {
  place_at *a = &t->at[p];
  mml_buf_release(a->home);
  a->home = buf; /* the worker's reference */
  a->home_off = off;
  if (a->dest && (a->dest != buf || a->dest_off != off)) move_home(L, t, p);
}
