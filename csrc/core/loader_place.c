/*
 * loader_place.c — plan before decode: the loader's planner places planned samples into
 * batches ahead of the collator, so every image is decoded straight into its slice of
 * its batch's pixel_values buffer (written once, never copied in the normal course).
 *
 * DATA FLOW
 *   worker:   record -> image bytes -> headers (mml_sample_plan: grids, tokens, ids,
 *             labels, max_length) -> slot PLANNED (or DONE when failed / text-only)
 *   planner:  (the collation thread, this file) walks planned slots in stream order and
 *             runs the collator's own composition step (mml_compose_fits/add/full) on
 *             their token counts, so it composes exactly the batches the collator will:
 *             each batch is a `ticket`; a ticket's pixel_values buffer is taken from the
 *             pool as soon as its size is known (padded: when the ticket is complete;
 *             packed: at its first image, with the pack's bound pack_length * merge^2
 *             rows), and each member's decode is queued with its destination
 *             (buffer + first row * row bytes)
 *   worker:   decodes the queued sample into its destination -> slot DONE (videos go
 *             into the sample's own rows, which the collator copies: a sample with
 *             videos and no images is queued for decode without a destination)
 *   collator: takes DONE slots strictly in order, exactly as before (the same
 *             composition code, on the same counts), attaching the head ticket's buffer
 *             as the batch's pixel_values; emission only writes the small tensors.
 *
 * LATE FAILURES.  A sample that planned but fails to decode (corrupt data past the
 * header) is skipped as before, and composition must be what it was: the collator skips
 * it in order (counted and reported exactly as before), then rewinds the planner to the
 * sample after it: the head ticket keeps what the collator already took (copied into a
 * fresh buffer), every later placement is dropped and redone.  Samples already decoded
 * at their old place are copied to their new one (memcpy, the only pixel copy, counted
 * in moved_rows); queued ones just get the new destination; running ones copy when they
 * finish.  Batches are therefore bitwise what they were, whatever fails and when.  The
 * same rewind serves a padded epoch's wrap (the plan of seq changes) and a padded ticket
 * that had to be given a buffer before it was complete (the window ran out or the epoch
 * ended): it is then re-buffered as it grows.
 *
 * BUFFERS.  A buffer, once a ticket's, only receives writes at the offsets that ticket
 * gave; a ticket that changes (rewind, growth) moves to a fresh buffer, so no move can
 * overwrite rows a running decode still writes.  Every holder (ticket, task dest/home, a
 * running decode, the collator, the batch's tensor) holds its own reference; the buffer
 * returns to the pool with the last one.
 *
 * IMAGE BYTES.  A sample's encoded images are read into byte buffers that outlive it: once
 * decoded (or failed) its buffers become spares, and the next read takes the smallest
 * spare that holds its file, so those pages stay mapped instead of being freed and
 * faulted in again (ld_bytes_take / ld_bytes_return_locked).
 *
 * MEMORY CAP (max_memory).  The budget counts the pool's buffers (live: batches being
 * built, queued, or held by the consumer; cached: kept mapped for reuse), the window's
 * byte buffers (spares included, with each sample's video rows: planned ones before they
 * exist) and a fixed scratch reserve per worker.  A ticket's buffer is taken only
 * when it fits (cached buffers are freed first); otherwise the ticket waits (pending),
 * and so do the tickets after it, and the planner retries as the consumer releases
 * batches.  Workers start reading a sample only with room for the largest sample seen
 * per read in flight.  A sample that alone cannot fit is an error naming it; so is a
 * next() whose batch cannot get room while the consumer holds everything else.
 *
 * Locking: everything here runs with the loader's mu held, on the collation thread
 * (ld_place_decoded_locked on a worker, also under mu); mu -> pool is the lock order.
 */
#include <stdlib.h>
#include <string.h>

#include "loader_int.h"

static ticket *tk_at(mml_loader *L, int64_t id) { return &L->tks[id % L->ntk]; }
static task *slot_of(mml_loader *L, int64_t seq) { return &L->tasks[seq % L->window]; }

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
  L->rows_bound = mml_collator_rows_bound(L->collator, merge);
  L->row_bytes =
      (size_t)L->ccfg.pixel_cols * mml_dtype_size(mml_pixel_format_dtype(L->ccfg.pixel_format));
  /* A pack's buffer is its bound (decodes start at once, nothing ever moves): host pages
   * are only resident once written.  Pinned or caller-allocated memory is all resident,
   * and a bound that is a large part of max_memory would starve the rest: then a pack's
   * buffer is sized when the pack is complete, like a padded batch's. */
  if (L->pinned || L->cfg.allocator ||
      (L->cfg.max_memory > 0 && L->rows_bound > 0 &&
       (int64_t)((size_t)L->rows_bound * L->row_bytes) > L->cfg.max_memory / 4))
    L->rows_bound = -1;
  return MML_OK;
}

static void ticket_drop(ticket *k) {
  mml_buf_release(k->buf);
  memset(k, 0, sizeof *k);
}

void ld_place_free(mml_loader *L) {
  if (!L->tks) return;
  for (int i = 0; i < L->ntk; i++) ticket_drop(&L->tks[i]);
  free(L->tks);
  L->tks = NULL;
}

void ld_place_clear(task *t) {
  mml_buf_release(t->dest);
  mml_buf_release(t->home);
  t->dest = t->home = NULL;
  t->tk = -1;
}

static void unplace(task *t) {
  t->tk = -1;
  mml_buf_release(t->dest);
  t->dest = NULL;
}

/* A decoded sample's rows go where they now belong (the only copy of pixels; rare). */
static void move_home(mml_loader *L, task *t) {
  size_t n = (size_t)t->sample.pixel_rows * L->row_bytes;
  memcpy((uint8_t *)t->dest->data + t->dest_off, (uint8_t *)t->home->data + t->home_off, n);
  L->moved_rows += (uint64_t)t->sample.pixel_rows;
  mml_buf_release(t->home);
  mml_buf_retain(t->dest);
  t->home = t->dest;
  t->home_off = t->dest_off;
}

static void queue_decode(mml_loader *L, task *t) {
  t->dec = DEC_QUEUED;
  t->next_dec = NULL;
  if (L->dec_tail)
    L->dec_tail->next_dec = t;
  else
    L->dec_head = t;
  L->dec_tail = t;
  pthread_cond_signal(&L->work_cv);
}

/* t's rows go to byte `off` of buf: decode queued, or (decoded) moved, or (running) moved
 * by the worker when it finishes. */
static void set_dest(mml_loader *L, task *t, mml_buf *buf, size_t off) {
  mml_buf_retain(buf);
  mml_buf_release(t->dest);
  t->dest = buf;
  t->dest_off = off;
  if (t->state == SLOT_PLANNED) {
    if (t->dec == DEC_NONE) queue_decode(L, t);
  } else if (t->home && (t->home != buf || t->home_off != off)) {
    move_home(L, t);
  }
}

/* The ticket's uncommitted members (seq from head_seq to place_seq) get their places in
 * k->buf. */
static void assign_members(mml_loader *L, int64_t id) {
  ticket *k = tk_at(L, id);
  int64_t s0 = k->first_seq > L->head_seq ? k->first_seq : L->head_seq;
  for (int64_t s = s0; s < L->place_seq; s++) {
    task *t = slot_of(L, s);
    if (t->tk == id && t->sample.pixel_rows > 0)
      set_dest(L, t, k->buf, (size_t)t->row * L->row_bytes);
  }
}

/* Whether `prefetch` batches with pixels are ahead of the consumer, for ticket id's first
 * buffer: finished ones (output and pending queues) and tickets with a buffer (being
 * decoded).  The ticket holding the collator's next sample counts finished batches only:
 * they drain without it (the consumer, the emitting workers), tickets only through it (a
 * pack is complete only once the next sample is decoded and does not fit). */
static int prefetch_full(mml_loader *L, int64_t id) {
  int64_t n = L->out_count + (L->pend_tail - L->pend_head);
  if (tk_at(L, id)->first_seq > L->head_seq)
    for (int64_t j = L->tk_head; j <= L->tk_tail; j++) n += tk_at(L, j)->buf != NULL;
  return n >= L->cfg.prefetch;
}

/* Gives ticket `id` a fresh buffer of cap_rows rows: the rows the collator already took
 * are copied (and the collator `c` composing it switches to it), the rest placed anew.
 * A ticket's first buffer waits while `prefetch` batches are ahead of the consumer (the
 * depth a DataLoader's prefetch_factor x workers means), and for max_memory's room. */
static int rebuffer(mml_loader *L, int64_t id, int64_t cap_rows, mml_collator *c) {
  ticket *k = tk_at(L, id);
  int earlier = 0; /* tickets get room in order: the head first */
  for (int64_t j = L->tk_head; j < id; j++) earlier |= tk_at(L, j)->pending_rows > 0;
  if (earlier || (!k->buf && prefetch_full(L, id)) ||
      !ld_mem_room_locked(L, (int64_t)((size_t)cap_rows * L->row_bytes))) {
    k->pending_rows = cap_rows;
    L->mem_blocked = 1;
    return 0;
  }
  k->pending_rows = 0;
  mml_buf *nb = NULL;
  mml_err err;
  mml_status st = mml_pool_alloc(L->pool, (size_t)cap_rows * L->row_bytes, &nb, &err);
  if (st) {
    mml_err_prefix(&err, "pixel_values of a batch (%lld rows)", (long long)cap_rows);
    ld_set_fatal_locked(L, st, &err);
    return 0;
  }
  if (k->done_rows > 0 && k->buf) {
    memcpy(nb->data, k->buf->data, (size_t)k->done_rows * L->row_bytes);
    L->moved_rows += (uint64_t)k->done_rows;
  }
  if (k->done_rows > 0 && c) mml_collator_attach_pixels(c, nb);
  mml_buf_release(k->buf);
  k->buf = nb;
  k->cap_rows = cap_rows;
  assign_members(L, id);
  return 1;
}

/* The ticket is complete by plan: a padded one gets its exact buffer now. */
static void close_ticket(mml_loader *L, int64_t id, mml_collator *c) {
  ticket *k = tk_at(L, id);
  k->closed = 1;
  if (!k->buf && k->rows > 0) rebuffer(L, id, k->rows, c);
}

/* Where placing stopped for good (final: the epoch ends, or has its batches) or until
 * the collator takes samples: a padded ticket still open gets a buffer of its rows so
 * far (re-buffered if it grows) when it is final, or the collator waits for it (it is
 * the head ticket: only its decodes let the window move). */
static void stall(mml_loader *L, mml_collator *c, int final) {
  if (L->tk_tail < L->tk_head || (!final && L->tk_tail != L->tk_head)) return;
  ticket *k = tk_at(L, L->tk_tail);
  if (!k->buf && k->rows > 0) rebuffer(L, L->tk_tail, k->rows, c);
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
    ticket_drop(k);
    k->epoch = epoch;
    k->first_seq = L->place_seq;
  }
  int64_t id = L->tk_tail, rows = t->sample.pixel_rows;
  t->tk = id;
  t->row = k->rows;
  k->rows += rows;
  mml_compose_add(L->collator, &k->comp, tokens);
  L->place_seq++;
  if (rows > 0) {
    if (!k->buf && L->rows_bound > 0)
      rebuffer(L, id, L->rows_bound, c);      /* packed */
    else if (k->buf && k->rows > k->cap_rows) /* grew past its buffer */
      rebuffer(L, id, L->rows_bound > 0 ? L->rows_bound : k->rows, c);
    else if (k->buf)
      set_dest(L, t, k->buf, (size_t)t->row * L->row_bytes);
  } else if (t->sample.vpixels_pending && t->state == SLOT_PLANNED && t->dec == DEC_NONE) {
    queue_decode(L, t); /* videos only: their pixels are the sample's own */
  }
  /* the global plan ends batches at planned positions (as coll_add_locked) */
  if (L->gp ? ld_plan_batch_end_locked(L, epoch, pos) : mml_compose_full(L->collator, &k->comp))
    close_ticket(L, id, c);
  return 1;
}

/* Tickets waiting for room try again, in order. */
static void retry_pending(mml_loader *L, mml_collator *c) {
  L->mem_blocked = 0;
  for (int64_t id = L->tk_head; id <= L->tk_tail; id++) {
    ticket *k = tk_at(L, id);
    if (!k->pending_rows || rebuffer(L, id, k->pending_rows, c)) continue;
    if (id == L->tk_head) L->mem_head_fails++;
    break;
  }
  if (!L->mem_blocked || (L->tk_tail >= L->tk_head && !tk_at(L, L->tk_head)->pending_rows))
    L->mem_head_fails = 0;
  if (L->mem_head_fails < 3 || !L->consumer_waiting || L->out_count ||
      L->pend_head != L->pend_tail || L->emitting)
    return;
  /* the consumer waits for this batch and holds everything else: it cannot fit */
  size_t cached, live;
  mml_pool_usage(L->pool, &cached, &live);
  mml_err e;
  mml_err_set(&e, MML_ENOMEM,
              "max_memory=%lld cannot hold the next batch's %lld bytes of pixel_values beside "
              "%zu bytes of batch buffers still alive (batches the consumer holds) and %lld "
              "bytes of samples in flight: release earlier batches, or raise max_memory",
              (long long)L->cfg.max_memory,
              (long long)((size_t)tk_at(L, L->tk_head)->pending_rows * L->row_bytes), live,
              (long long)L->win_bytes);
  ld_set_fatal_locked(L, MML_ENOMEM, &e);
}

void ld_place_locked(mml_loader *L, int64_t epoch, int64_t bie, mml_collator *c) {
  if (!L->placing || L->fatal) return;
  if (L->mem_blocked) retry_pending(L, c);
  if (L->place_seq < L->head_seq) L->place_seq = L->head_seq;
  while (!L->fatal) {
    int64_t p = L->place_seq;
    if (p >= L->head_seq + L->window || (L->limit_seq >= 0 && p >= L->limit_seq)) {
      stall(L, c, 0); /* only the collator taking samples lets more in */
      return;
    }
    if (p >= L->next_seq) return; /* a worker will start it */
    task *t = slot_of(L, p);
    if (t->gen != L->gen || t->seq != p || t->state == SLOT_BUSY) return; /* being planned */
    int64_t e, pos;
    ld_plan_at_locked(L, p, &e, &pos);
    if (e != epoch || (L->gp && pos >= ld_plan_rank_len_locked(L, e))) {
      stall(L, c, 1); /* the collator ends the epoch first */
      return;
    }
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
      return;
    }
  }
}

void ld_place_reset_locked(mml_loader *L) {
  for (int64_t id = L->tk_head; id <= L->tk_tail; id++) ticket_drop(tk_at(L, id));
  L->tk_head = L->tk_tail + 1;
  for (int i = 0; i < L->window; i++) unplace(&L->tasks[i]);
  L->place_seq = L->head_seq;
}

void ld_place_rewind_locked(mml_loader *L, mml_collator *c, int64_t seq) {
  if (!L->placing) return;
  for (int64_t s = seq; s < L->place_seq; s++) unplace(slot_of(L, s));
  for (int64_t id = L->tk_head + 1; id <= L->tk_tail; id++) ticket_drop(tk_at(L, id));
  if (L->tk_tail >= L->tk_head) L->tk_tail = L->tk_head;
  L->place_seq = seq;
  if (L->tk_tail < L->tk_head) return;
  ticket *k = tk_at(L, L->tk_head);
  mml_compose cs = mml_collator_compose_state(c);
  if (cs.count == 0) { /* nothing of it was taken: it is gone */
    ticket_drop(k);
    L->tk_tail = L->tk_head - 1;
    return;
  }
  k->comp = cs;
  k->rows = k->done_rows;
  k->closed = 0;
  k->pending_rows = 0;
  /* The buffer keeps the rows taken; decodes may still write at old offsets past them,
   * so it takes nothing more: the next image re-buffers the ticket. */
  k->cap_rows = k->done_rows;
  if (k->done_rows == 0) {
    mml_buf_release(k->buf);
    k->buf = NULL;
  }
}

int ld_place_ready(const mml_loader *L, const task *t) {
  if (!L->placing || t->sample.status != MML_OK) return 1;
  if (t->tk < 0) return 0;
  if (t->sample.pixel_rows == 0) return 1;
  return t->dest && t->home == t->dest && t->home_off == t->dest_off;
}

mml_status ld_place_take_locked(mml_loader *L, mml_collator *c, int64_t tk, mml_buf *dest,
                                size_t dest_off, int64_t rows, mml_err *err) {
  if (!L->placing) return MML_OK;
  if (tk != L->tk_head || L->tk_tail < L->tk_head)
    return mml_err_set(err, MML_EINTERNAL, "planner: sample planned in batch %lld, taken into %lld",
                       (long long)tk, (long long)L->tk_head);
  ticket *k = tk_at(L, tk);
  if (rows > 0) {
    mml_buf *have = mml_collator_attached_pixels(c);
    if (dest != k->buf || dest_off != (size_t)k->done_rows * L->row_bytes ||
        (have && have != k->buf))
      return mml_err_set(err, MML_EINTERNAL, "planner: pixel rows of a sample out of place");
    if (!have) mml_collator_attach_pixels(c, k->buf);
  }
  k->done_rows += rows;
  return MML_OK;
}

void ld_place_pop_locked(mml_loader *L) {
  if (!L->placing || L->tk_tail < L->tk_head) return;
  ticket_drop(tk_at(L, L->tk_head));
  L->tk_head++;
}

/* ---- memory cap ---------------------------------------------------------------------- */

static int64_t scratch_bytes(const mml_loader *L) {
  return (int64_t)L->cfg.num_threads * MML_SCRATCH_RESERVE;
}

/* Bytes of a sample's planned video pixels (float32 rows of pixel_cols). */
static int64_t video_bytes(const mml_loader *L, const mml_sample *s) {
  return s->vpixel_rows * (int64_t)L->ccfg.pixel_cols * (int64_t)sizeof(float);
}

/* Encoded items a parsed task holds in imgs[]: images, frames, member videos. */
static int media_items(const task *t) {
  if (!t->rec_parsed) return 0;
  return t->rec.nimages + mml_record_frames(&t->rec) + t->rec.nvideos;
}

int ld_mem_room_locked(mml_loader *L, int64_t need) {
  if (!L->cfg.max_memory) return 1;
  if (need >= (1 << 20)) need = (need + (2 << 20) - 1) & ~(int64_t)((2 << 20) - 1); /* pool */
  size_t cached, live;
  mml_pool_usage(L->pool, &cached, &live);
  int64_t fixed = (int64_t)live + L->win_bytes + scratch_bytes(L);
  if (fixed + need > L->cfg.max_memory) return 0;
  int64_t keep = L->cfg.max_memory - fixed - need;
  if ((int64_t)cached > keep) cached = mml_pool_trim(L->pool, (size_t)keep);
  return (int64_t)cached <= keep;
}

int ld_mem_may_read_locked(mml_loader *L) {
  if (!L->cfg.max_memory || L->next_seq == L->head_seq) return 1; /* always one in flight */
  int64_t est = L->max_sample_bytes ? L->max_sample_bytes : L->cfg.max_object_bytes;
  return ld_mem_room_locked(L, est * (L->in_flight + 1));
}

mml_status ld_mem_check_sample(const mml_loader *L, const task *t, mml_err *err) {
  if (!L->cfg.max_memory) return MML_OK;
  int64_t enc = (int64_t)t->rec_bytes.len, px = t->sample.pixel_rows * (int64_t)L->row_bytes;
  px += video_bytes(L, &t->sample);
  for (int i = 0; i < media_items(t); i++) enc += (int64_t)t->imgs[i].len;
  int64_t room = L->cfg.max_memory - scratch_bytes(L);
  if (px + enc <= room) return MML_OK;
  return mml_err_set(err, MML_ENOMEM,
                     "the sample needs %lld bytes of pixel_values(_videos) and %lld encoded "
                     "bytes, more "
                     "than the %lld bytes max_memory=%lld leaves beside %d workers' scratch",
                     (long long)px, (long long)enc, (long long)room, (long long)L->cfg.max_memory,
                     L->cfg.num_threads);
}

void ld_mem_count_task_locked(mml_loader *L, task *t) {
  int64_t held = (int64_t)(t->rec_bytes.cap + t->path.cap), used = (int64_t)t->rec_bytes.len;
  for (int i = 0; i < t->imgs_cap; i++) held += (int64_t)t->imgs[i].cap;
  if (t->rec_parsed)
    for (int i = 0; i < media_items(t) && i < t->imgs_cap; i++) used += (int64_t)t->imgs[i].len;
  /* video pixels (the sample's own buffer): planned ones are counted before they exist */
  int64_t vpx = video_bytes(L, &t->sample);
  held += vpx > (int64_t)t->sample.vpixels.cap ? vpx : (int64_t)t->sample.vpixels.cap;
  used += vpx;
  L->win_bytes += held - t->held;
  t->held = held;
  if (used > L->max_sample_bytes) L->max_sample_bytes = used;
}

/* ---- image byte buffers -------------------------------------------------------------- */

/* Spares are kept up to 64 MiB (an eighth of max_memory when set: they count in it). */
static int64_t spare_limit(const mml_loader *L) {
  int64_t lim = (int64_t)64 << 20;
  return L->cfg.max_memory && L->cfg.max_memory / 8 < lim ? L->cfg.max_memory / 8 : lim;
}

void ld_bytes_take(mml_loader *L, task *t, mml_bytes *b, size_t need) {
  if (b->cap >= need) return;
  pthread_mutex_lock(&L->mu);
  int best = -1;
  for (int k = 0; k < L->nspare; k++) {
    size_t cap = L->spare[k].cap, bc = best < 0 ? 0 : L->spare[best].cap;
    if (best < 0 || (cap >= need ? bc < need || cap < bc : bc < need && cap > bc)) best = k;
  }
  if (best >= 0 && L->spare[best].cap > b->cap) {
    mml_bytes s = L->spare[best];
    int64_t delta = (int64_t)s.cap - (int64_t)b->cap; /* moves from the spares to t */
    if (b->cap)
      L->spare[best] = *b;
    else
      L->spare[best] = L->spare[--L->nspare];
    L->spare_bytes -= delta;
    t->held += delta; /* win_bytes, the sum of both, is unchanged */
    *b = s;
    b->len = 0;
  }
  pthread_mutex_unlock(&L->mu);
}

void ld_bytes_return_locked(mml_loader *L, task *t) {
  for (int i = 0; i < t->imgs_cap; i++) {
    mml_bytes *b = &t->imgs[i];
    if (!b->cap) continue;
    if (L->nspare < MML_SPARE_BUFS && L->spare_bytes + (int64_t)b->cap <= spare_limit(L)) {
      L->spare[L->nspare++] = *b;
      L->spare_bytes += (int64_t)b->cap;
      t->held -= (int64_t)b->cap;
    } else {
      mml_bytes_free(b);
    }
    *b = (mml_bytes){0};
  }
  ld_mem_count_task_locked(L, t);
}

void ld_bytes_free_spares(mml_loader *L) {
  for (int k = 0; k < L->nspare; k++) mml_bytes_free(&L->spare[k]);
  L->win_bytes -= L->spare_bytes;
  L->nspare = 0;
  L->spare_bytes = 0;
}

void ld_place_decoded_locked(mml_loader *L, task *t, mml_buf *buf, size_t off) {
  mml_buf_release(t->home);
  t->home = buf; /* the worker's reference */
  t->home_off = off;
  if (t->dest && (t->dest != buf || t->dest_off != off)) move_home(L, t);
}
