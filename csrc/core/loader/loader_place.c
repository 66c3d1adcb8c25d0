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
 * copy when they finish.  Batches are therefore bitwise what they were, whatever fails and when.  The
 * same rewind serves a padded epoch's wrap (the plan of seq changes) and a padded ticket
 * that had to be given a buffer before it was complete (the window ran out or the epoch
 * ended): it is then re-buffered as it grows.
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
 * place_compact says when else not).  The PL_IMG plane holds uint8 patch rows in flight (pixel_format uint8's layout:
 * one frame per row, 1 byte per value, an eighth of float32's bytes): workers decode
 * images into them (the source's pl_u8), every move above copies them, and when the
 * batch is emitted (loader_collator.c emit_expand, on the emitting worker) they are
 * expanded through the normalisation's exact table (mml_pixels_expand) into float rows,
 * which become pixel_values: in place, the plane's buffer having been taken with the
 * capacity of its float rows (mml_pool_alloc_cap: pages for the uint8 rows only) and
 * grown at emission (mml_pool_grow), so the expanding batch holds no second buffer;
 * where the pool cannot grow it (a kernel that cannot move pages) into a float buffer
 * of the pool, the uint8 one going back.  So the batches still being decoded -- most of
 * `prefetch` when the consumer keeps up -- hold an eighth of their float bytes.  The
 * values are the writers' (the table is theirs, vision_patch.c), so batches are bitwise
 * the same.  Videos keep their float rows (a resized video's values are not bytes).
 *
 * IMAGE BYTES.  A sample's encoded images are read into byte buffers that outlive it: once
 * decoded (or failed) its buffers become spares, and the next read takes the smallest
 * spare that holds its file, so those pages stay mapped instead of being freed and
 * faulted in again (ld_bytes_take / ld_bytes_return_locked: loader_bytes.c).
 *
 * MEMORY CAP (max_memory).  The budget counts the pool's buffers (live: batches being
 * built, queued, or held by the consumer; cached: kept mapped for reuse; image and video
 * rows alike), the window's byte buffers (spares included; a remote video's first block
 * and its preloaded packets, and the videos kept open from probe to decode, too:
 * loader_video.c) and a fixed scratch reserve per worker.  What is held ahead of its use
 * (those video bytes) is taken only with room left for the largest batch buffer asked for
 * so far (ld_mem_room_ahead_locked), and when the head ticket still cannot get its
 * buffer, later batches' samples close their kept videos and the spares are freed
 * (retry_pending: only when it waits for room, not for its turn), so the next batch never
 * waits on bytes that are not its own.  A ticket plane's buffer is taken only when it fits
 * (cached buffers are freed first); otherwise the ticket waits (pending), and so do the
 * tickets after it, and the planner retries as the consumer releases batches.  Workers
 * start reading a sample only with room for the largest sample seen per read in flight.
 * A sample that alone cannot fit is an error naming it; so is a next() whose batch cannot
 * get room while the consumer holds everything else and no sample is in flight (the
 * message names the max_memory that would have held it): the batch of the needed ticket,
 * the one holding the collator's next sample (the head, or the pack after an open head
 * pack), looked at once placement went as far as it can (mem_stuck).  The head and the
 * needed ticket hold room only for what comes before them, known exactly: the queued
 * emissions and the head's own (ticket_hold); later tickets hold the largest expansion.
 *
 * DECODER SCRATCH under max_memory.  The per-worker reserve holds what stays mapped
 * between images; an image whose decode maps more (a multi-scan JPEG's coefficients, a
 * whole-image buffer: mml_vision_plan.scratch) makes its sample's scratch_need: it counts
 * in "can it ever fit", its decode takes it before starting (scratch_extra while it runs)
 * and it is held free meanwhile by tickets (the largest need placed up to them) and reads
 * (the largest seen, and one batch buffer).  COMPACT under max_memory: tickets count
 * uint8 rows, an emission takes what its float rows add (fneed; emit_extra), and other uses
 * keep the largest expanded batch free less those expanded ahead (expand_hold).
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

/* The pixel_format that writes this loader's float rows directly ("float32-decode"). */
static const char *decode_name(const mml_loader *L) {
  return mml_pixels_name(L->cfg.pixels == MML_PIXELS_BFLOAT16 ? MML_PIXELS_BFLOAT16_DECODE
                                                              : MML_PIXELS_FLOAT32_DECODE);
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
   * and a bound that is a large part of max_memory would starve the rest: then a pack's
   * buffer is sized when the pack is complete, like a padded batch's. */
  for (int p = 0; p < PLANES; p++) {
    L->rows_bound[p] = mml_collator_rows_bound(L->collator, merge);
    const size_t rb = p == PL_IMG && L->compact ? L->expand_row_bytes : L->row_bytes[p];
    if (L->pinned || L->cfg.allocator ||
        (L->cfg.max_memory > 0 && L->rows_bound[p] > 0 &&
         (int64_t)((size_t)L->rows_bound[p] * rb) > L->cfg.max_memory / 4))
      L->rows_bound[p] = -1;
  }
  return MML_OK;
}

static void ticket_drop(ticket *k) {
  for (int p = 0; p < PLANES; p++) mml_buf_release(k->pl[p].buf);
  memset(k, 0, sizeof *k);
}

void ld_place_free(mml_loader *L) {
  if (!L->tks) return;
  for (int i = 0; i < L->ntk; i++) ticket_drop(&L->tks[i]);
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
  pthread_cond_signal(&L->work_cv);
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
  if (n == MML_LPT_MAX || L->cfg.max_memory) { /* stream order: too many, or P1 */
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
static int has_buf(const ticket *k) {
  for (int p = 0; p < PLANES; p++)
    if (k->pl[p].buf) return 1;
  return 0;
}

/* The ticket the collator's next sample is in: the head ticket, or the one after it while
 * the head is a pack or a batch still open in the collator (complete only once that next
 * sample is decoded and does not fit). */
static int64_t needed_ticket(mml_loader *L) {
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
    for (int64_t j = L->tk_head; j <= L->tk_tail; j++) n += has_buf(tk_at(L, j));
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

/* Nothing read, decoding, queued or emitting, and the consumer waiting in next(): no work
 * in the engine can free room or use room held for it. */
static int only_consumer_waits(const mml_loader *L) {
  return !L->in_flight && !L->decoding && L->consumer_waiting && !L->out_count && !L->emitting &&
         L->pend_head == L->pend_tail;
}

/* The batch the consumer waits for needs no more reads: the head ticket's plan is final
 * (the collator's next sample is in a later ticket) and that sample has its places, so
 * only its decode is missing.  A read then is for a later batch, and taking the room the
 * head's expansion needs (as a read for the waiting consumer may) raised OutOfMemoryError
 * at its emission (MML_STRESS_SEED=1000).  Without its places (a pack sized once complete)
 * the next reads may be what completes it (MML_STRESS_SEED=1035 hung when they waited). */
static int head_final(mml_loader *L) {
  if (!L->placing || L->tk_tail <= L->tk_head || needed_ticket(L) <= L->tk_head) return 0;
  const task *t = slot_of(L, L->head_seq);
  return t->seq == L->head_seq && t->gen == L->gen && t->state == SLOT_PLANNED && t->tk >= 0 &&
         ld_place_has_dests(t);
}

/* Compact under max_memory: the room kept free for expansions (uint8 rows becoming float
 * rows at emission): the largest expanded batch (the next one: a batch the consumer holds
 * is live already, in the pool's bytes; holding two here hung the loader when two did not
 * fit beside the rest), less the expanded batches already live ahead of the consumer
 * (ready, in the output queue or waiting for it; an emission running holds its grant,
 * emit_extra). */
static int64_t expand_hold(const mml_loader *L) {
  if (!L->compact || !L->cfg.max_memory || !L->fbytes_max) return 0;
  int64_t h = mml_round_2mib(L->fbytes_max);
  for (int i = 0; i < L->out_count; i++) h -= (int64_t)ld_out_at(L, i)->fbytes;
  for (int64_t k = L->pend_head; k < L->pend_tail; k++) {
    const pend_item *q = &L->pend[k % L->npend];
    if (q->state == PEND_READY) h -= (int64_t)q->it.fbytes;
  }
  return h > 0 ? h : 0;
}

/* Pool bytes of plane p's buffer of cap_rows rows (compact: small ones float at once). */
static int64_t ticket_bytes(const mml_loader *L, int p, int64_t cap_rows) {
  const int64_t f = p == PL_IMG && L->compact ? cap_rows * (int64_t)L->expand_row_bytes : 0;
  return f && f < (1 << 20) ? f : cap_rows * (int64_t)L->row_bytes[p];
}

/* The room ticket id's buffers leave free for earlier work: the scratch the decodes
 * placed in it and the tickets before it will need, and room for an expansion.  For a
 * later ticket that is the largest expanded batch so far (expand_hold); for the head
 * ticket and the needed one (needed_ticket) what comes before them is known, and never
 * more: the expansions of the batches queued for emission (fneed) and the head's own,
 * its float rows beyond the pages its buffer has (as hand_off_locked counts fneed in
 * loader_collator.c), from its rows once its plan is final (a later ticket is needed),
 * else from the most rows its image buffer (`cap_rows` when that is the buffer asked
 * for: plane p of the head) can take; the scratch and the expansion never at once.  The largest expanded batch -- a pack bound's
 * float rows -- held against them hung the loader (MML_STRESS_SEED=1000: the next pack's
 * video rows waited for room that the head, a small pack, could only use after them). */
static int64_t pool_bytes(int64_t need);
static int64_t ticket_hold(mml_loader *L, int64_t id, int p, int64_t cap_rows) {
  const int64_t hold = ld_mem_scratch_hold_locked(L, id), eh = expand_hold(L);
  const int64_t need_id = needed_ticket(L);
  if (!eh || (id != L->tk_head && id != need_id)) return hold + eh;
  int64_t exact = 0;
  for (int64_t k = L->pend_head; k < L->pend_tail; k++) {
    const pend_item *q = &L->pend[k % L->npend];
    if (q->state == PEND_QUEUED) exact += pool_bytes((int64_t)q->fneed);
  }
  const tk_plane *q = &tk_at(L, L->tk_head)->pl[PL_IMG];
  const int anew = id == L->tk_head && p == PL_IMG; /* its buffer is the one asked for */
  int64_t rows = anew ? cap_rows : q->buf ? q->cap_rows : q->pending_rows;
  if (need_id != L->tk_head || rows < q->rows) rows = q->rows; /* final, or no buffer yet */
  const int64_t f = rows * (int64_t)L->expand_row_bytes;
  int64_t add = f; /* a float buffer beside it, or in place: what its pages lack */
  if (!anew && q->buf && (int64_t)mml_buf_capacity(q->buf) >= f)
    add = (int64_t)q->buf->size < f ? f - (int64_t)q->buf->size : 0;
  exact += pool_bytes(add);
  if (exact > eh) exact = eh;
  /* the scratch is given back (trimmed) when its decode ends, before the batch it is in can
   * be handed off and expanded: one after the other, the larger of the two is kept free */
  return hold > exact ? hold : exact;
}

/* max_memory room for `need` bytes of plane p (cap_rows rows) of ticket id's, beside what
 * it leaves free for earlier work (ticket_hold). */
static int ticket_room(mml_loader *L, int64_t id, int p, int64_t cap_rows, int64_t need) {
  const int64_t hold = ticket_hold(L, id, p, cap_rows);
  if (ld_mem_room_hold_locked(L, need, hold)) return 1;
  if (!L->nspare) return 0;
  ld_bytes_free_spares(L); /* spare image buffers are only a speed-up */
  return ld_mem_room_hold_locked(L, need, hold);
}

/* Gives plane p of ticket `id` a fresh buffer of cap_rows rows: the rows the collator
 * already took are copied (and the collator `c` composing it switches to it), the rest
 * placed anew.  A ticket's first buffer waits while `prefetch` batches are ahead of the
 * consumer (the depth a DataLoader's prefetch_factor x workers means), and for
 * max_memory's room. */
static int rebuffer(mml_loader *L, int64_t id, int p, int64_t cap_rows, mml_collator *c) {
  ticket *k = tk_at(L, id);
  tk_plane *q = &k->pl[p];
  int earlier = 0; /* tickets get room in order: the head first */
  for (int64_t j = L->tk_head; j < id; j++)
    for (int r = 0; r < PLANES; r++) earlier |= tk_at(L, j)->pl[r].pending_rows > 0;
  if (p == PL_IMG && L->compact &&
      (int64_t)((size_t)cap_rows * L->expand_row_bytes) > L->fbytes_max)
    L->fbytes_max = (int64_t)((size_t)cap_rows * L->expand_row_bytes); /* expand_hold */
  int64_t all = 0; /* the ticket's buffers with this one (what bytes ahead leave room for) */
  for (int r = 0; r < PLANES; r++)
    all += (r == p                  ? cap_rows
            : k->pl[r].buf          ? k->pl[r].cap_rows
            : k->pl[r].pending_rows ? k->pl[r].pending_rows
                                    : k->pl[r].rows) *
           (int64_t)L->row_bytes[r];
  if (all > L->batch_buf_peak) L->batch_buf_peak = all;
  if (earlier || (!has_buf(k) && (prefetch_full(L, id) || decodes_ahead(L, id))) ||
      !ticket_room(L, id, p, cap_rows, ticket_bytes(L, p, cap_rows))) {
    q->pending_rows = cap_rows;
    L->mem_blocked = 1;
    return 0;
  }
  q->pending_rows = 0;
  if ((int64_t)((size_t)cap_rows * L->row_bytes[p]) > L->tk_bytes_max)
    L->tk_bytes_max = (int64_t)((size_t)cap_rows * L->row_bytes[p]);
  mml_buf *nb = NULL;
  mml_err err;
  /* compact image rows: room to become their float rows in place (loader_collator.c) */
  mml_status st = p == PL_IMG && L->compact
                      ? mml_pool_alloc_cap(L->pool, (size_t)cap_rows * L->row_bytes[p],
                                           (size_t)cap_rows * L->expand_row_bytes, &nb, &err)
                      : mml_pool_alloc(L->pool, (size_t)cap_rows * L->row_bytes[p], &nb, &err);
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
}

/* Where placing stopped for good (final: the epoch ends, or has its batches) or until
 * the collator takes samples: a padded ticket still open gets buffers of its rows so
 * far (re-buffered if it grows) when it is final, or the collator waits for it (it is
 * the needed ticket: only its decodes let the window move; a pack's ticket after an open
 * head pack, with window 2, hung here when it was not the head). */
static void stall(mml_loader *L, mml_collator *c, int final) {
  if (L->tk_tail < L->tk_head || (!final && L->tk_tail != needed_ticket(L))) return;
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
    ticket_drop(k);
    k->epoch = epoch;
    k->first_seq = L->place_seq;
  }
  int64_t id = L->tk_tail;
  t->tk = id;
  for (int p = 0; p < PLANES; p++) {
    t->at[p].row = k->pl[p].rows;
    k->pl[p].rows += plane_rows(&t->sample, p);
  }
  mml_compose_add(L->collator, &k->comp, tokens);
  L->place_seq++;
  for (int p = 0; p < PLANES; p++)
    if (plane_rows(&t->sample, p) > 0) place_rows(L, t, id, p, c);
  /* the global plan ends batches at planned positions (as coll_add_locked) */
  if (L->gp ? ld_plan_batch_end_locked(L, epoch, pos) : mml_compose_full(L->collator, &k->comp))
    close_ticket(L, id, c);
  return 1;
}

static int64_t scratch_bytes(const mml_loader *L);

/* Bytes the pool maps for a buffer of `need` bytes (2 MiB pages from 1 MiB on). */
static int64_t pool_bytes(int64_t need) { return need >= (1 << 20) ? mml_round_2mib(need) : need; }

/* Bytes the planes of the tickets up to the needed one (the one the consumer's next batch
 * waits on: needed_ticket) wait for. */
static int64_t head_pending_bytes(mml_loader *L) {
  int64_t n = 0;
  for (int64_t id = L->tk_head, nt = needed_ticket(L); id <= nt; id++)
    for (int p = 0; p < PLANES; p++)
      n += tk_at(L, id)->pl[p].pending_rows * (int64_t)L->row_bytes[p];
  return n;
}

/* Tickets waiting for room try again, in order. */
static void retry_pending(mml_loader *L, mml_collator *c) {
  L->mem_blocked = 0;
  int failed = 0;
  for (int64_t id = L->tk_head; id <= L->tk_tail && !failed; id++) {
    ticket *k = tk_at(L, id);
    for (int p = 0; p < PLANES && !failed; p++)
      failed = k->pl[p].pending_rows && !rebuffer(L, id, p, k->pl[p].pending_rows, c);
    if (failed && id <= needed_ticket(L)) L->mem_head_fails++;
  }
  /* the head waits for room, not its turn (rebuffer: prefetch, decodes ahead): bytes later
   * batches' samples hold ahead of their use, and spare byte buffers (a cache), make way */
  const int64_t spares = L->spare_bytes,
                h = L->tk_tail >= L->tk_head ? needed_ticket(L) : L->tk_head;
  const int short_of_room = L->cfg.max_memory && L->tk_tail >= h && head_pending_bytes(L) &&
                            (has_buf(tk_at(L, h)) || !(prefetch_full(L, h) || decodes_ahead(L, h)));
  if (short_of_room && spares) ld_bytes_free_spares(L);
  if (short_of_room && (ld_release_videos_ahead_locked(L) > 0 || spares)) {
    L->mem_head_fails = 0;
    retry_pending(L, c);
    return;
  }
}

/* The one out-of-memory explainer of the stuck rules (mem_stuck, a decode's scratch, an
 * emission): `need` bytes of `what` for sample t (NULL: not one sample's) cannot be held
 * beside what is live, split into the batches the consumer holds (the pool's live bytes
 * less those below), the batches being built or emitted ahead of it (tickets' buffers,
 * prefetched: not the consumer's), the samples read ahead and the workers' scratch;
 * `fit` is the max_memory that would hold it, `hint` how to need less. */
static void mem_explain(mml_loader *L, const task *t, const char *what, int64_t need, int64_t fit,
                        const char *hint, mml_err *e) {
  char where[1100] = "";
  if (t) {
    const mml_sample *s = &t->sample;
    mml_index_name_sample(&L->ix, s->shard, s->index, s->line, where, sizeof where - 2);
    strcat(where, ": ");
  }
  size_t cached, live;
  mml_pool_usage(L->pool, &cached, &live);
  int64_t ahead = 0; /* buffers of batches not handed to the consumer yet */
  for (int64_t id = L->tk_head; id <= L->tk_tail; id++)
    for (int p = 0; p < PLANES; p++)
      if (tk_at(L, id)->pl[p].buf) ahead += pool_bytes((int64_t)tk_at(L, id)->pl[p].buf->size);
  for (int64_t k = L->pend_head; k < L->pend_tail; k++) {
    const pend_item *q = &L->pend[k % L->npend];
    for (int p = 0; p < PLANES && q->state == PEND_QUEUED; p++) {
      const mml_buf *b = mml_collator_attached_pixels(L->colls[q->coll], p);
      if (b && (p == PL_IMG || b != mml_collator_attached_pixels(L->colls[q->coll], PL_IMG)))
        ahead += pool_bytes((int64_t)b->size);
    }
  }
  if (ahead > (int64_t)live) ahead = (int64_t)live;
  mml_err_set(e, MML_ENOMEM,
              "%smax_memory=%lld cannot hold the %lld bytes of %s beside %lld bytes of batches "
              "the consumer holds, %lld bytes of batches being built or emitted ahead of it "
              "(prefetched), %lld bytes of samples read ahead and %lld bytes of %d workers' "
              "decode scratch: max_memory >= %lld would hold it; %s",
              where, (long long)L->cfg.max_memory, (long long)need, what,
              (long long)((int64_t)live - ahead), (long long)ahead, (long long)L->win_bytes,
              (long long)(scratch_bytes(L) + L->scratch_extra + L->emit_extra), L->cfg.num_threads,
              (long long)fit, hint);
}

/* After placing: the needed ticket still waits for room (retry_pending counted its failed
 * tries), the consumer waits for its batch and holds everything else, and no sample is
 * being read or planned: it cannot fit.  Looked at only once placement went as far as it
 * could (a sample placed after the retry may end the epoch, which sizes an open pack's
 * buffers by its rows instead of its bound: MML_STRESS_SEED=1000). */
static void mem_stuck(mml_loader *L, mml_collator *c) {
  if (!L->mem_blocked || (L->tk_tail >= L->tk_head && !head_pending_bytes(L)))
    L->mem_head_fails = 0;
  if (L->mem_head_fails < 3 || !L->consumer_waiting || L->out_count ||
      L->pend_head != L->pend_tail || L->emitting || L->in_flight)
    return;
  /* An open pack waiting for buffers of its bound first asks for its rows so far (as a
   * full window does: stall), re-buffered if it grows: those rows are needed whatever
   * joins it, and nothing can join while the reads wait for room (MML_STRESS_SEED=1000) */
  const int64_t nt = needed_ticket(L);
  int shrunk = 0;
  for (int p = 0; p < PLANES; p++) {
    const tk_plane *q = &tk_at(L, nt)->pl[p];
    if (q->pending_rows > q->rows && rows_now(q)) {
      shrunk = 1;
      rebuffer(L, nt, p, q->rows, c);
    }
  }
  if (shrunk) {
    L->mem_head_fails = 0;
    return;
  }
  /* the consumer waits for this batch and holds everything else, and no sample is being
   * read or planned (one may still free bytes of its own: a remote video's first block
   * at its probe): it cannot fit */
  size_t cached, live;
  mml_pool_usage(L->pool, &cached, &live);
  mml_err e;
  const int64_t next = head_pending_bytes(L), need = pool_bytes(next);
  const int64_t hold = ld_mem_scratch_hold_locked(L, nt);
  const int64_t eh = ticket_hold(L, nt, -1, 0) - hold;
  const int64_t s0 = tk_at(L, nt)->first_seq;
  const task *t = slot_of(L, s0 > L->head_seq ? s0 : L->head_seq);
  mem_explain(L, t->seq >= L->head_seq && t->gen == L->gen ? t : NULL,
              "pixel_values(_videos) the batch the consumer waits for needs (in the pool's pages)",
              need,
              (int64_t)live + L->win_bytes + L->max_sample_bytes + scratch_bytes(L) +
                  L->scratch_extra + L->emit_extra + hold + eh + need,
              "or hold fewer batches: a `for batch in loader` loop keeps the previous batch "
              "alive while it asks for the next (`del batch` at the end of the loop body "
              "releases it)",
              &e);
  if (eh > 0) {
    size_t n = strlen(e.msg);
    snprintf(e.msg + n, sizeof e.msg - n,
             " (%lld bytes are kept free for expanding compact uint8 rows into float rows: "
             "pixel_format=\"%s\" writes float rows directly)",
             (long long)eh, decode_name(L));
  }
  if (hold > 0) {
    size_t n = strlen(e.msg);
    snprintf(e.msg + n, sizeof e.msg - n,
             " (the %lld bytes of decoder scratch its largest image needs are kept free beside "
             "the %d workers' reserve of %lld)",
             (long long)hold, L->cfg.num_threads,
             (long long)L->cfg.num_threads * MML_SCRATCH_RESERVE);
  }
  ld_set_fatal_locked(L, MML_ENOMEM, &e);
}

static void place_locked(mml_loader *L, int64_t epoch, int64_t bie, mml_collator *c);

void ld_place_locked(mml_loader *L, int64_t epoch, int64_t bie, mml_collator *c) {
  if (!L->placing || L->fatal) return;
  place_locked(L, epoch, bie, c);
  if (L->cfg.max_memory && !L->fatal) mem_stuck(L, c);
}

static void place_locked(mml_loader *L, int64_t epoch, int64_t bie, mml_collator *c) {
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
  k->closed = 0;
  for (int p = 0; p < PLANES; p++) {
    tk_plane *q = &k->pl[p];
    q->rows = q->done_rows;
    q->pending_rows = 0;
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
  ticket_drop(tk_at(L, L->tk_head));
  L->tk_head++;
}

/* ---- memory cap ---------------------------------------------------------------------- */

static int64_t scratch_bytes(const mml_loader *L) {
  return (int64_t)L->cfg.num_threads * MML_SCRATCH_RESERVE;
}

/* Encoded items a parsed task holds in imgs[]: images, frames, member videos. */
static int media_items(const task *t) {
  if (!t->rec_parsed) return 0;
  return t->rec.nimages + mml_record_frames(&t->rec) + t->rec.nvideos;
}

/* The most decoder scratch one decode placed in tickets up to `upto` (and not running:
 * those hold their grants) will take: kept free by every other use of the room, so that
 * once the decodes running now end one of these can always start.  Samples placed later
 * are held by their tickets' buffers' room (ticket_room), samples not placed yet by their
 * reads' (ld_mem_may_read_locked counts what is placed). */
int64_t ld_mem_scratch_hold_locked(mml_loader *L, int64_t upto) {
  if (!L->cfg.max_memory || !L->scratch_max) return 0;
  int64_t hold = 0;
  const int64_t end = upto == INT64_MAX ? L->next_seq : L->place_seq;
  for (int64_t s = L->head_seq; s < end; s++) {
    const task *t = slot_of(L, s);
    if (t->seq == s && t->gen == L->gen && t->state == SLOT_PLANNED && t->dec != DEC_RUNNING &&
        (upto == INT64_MAX || (t->tk >= 0 && t->tk <= upto)) && t->scratch_need > hold)
      hold = t->scratch_need;
  }
  return hold;
}

int ld_mem_room_locked(mml_loader *L, int64_t need) {
  return ld_mem_room_hold_locked(L, need,
                                 ld_mem_scratch_hold_locked(L, INT64_MAX) + expand_hold(L));
}

int ld_mem_room_hold_locked(mml_loader *L, int64_t need, int64_t hold) {
  if (!L->cfg.max_memory) return 1;
  need = pool_bytes(need);
  size_t cached, live;
  mml_pool_usage(L->pool, &cached, &live);
  int64_t fixed =
      (int64_t)live + L->win_bytes + scratch_bytes(L) + L->scratch_extra + L->emit_extra + hold;
  if (fixed + need > L->cfg.max_memory) return 0;
  int64_t keep = L->cfg.max_memory - fixed - need;
  if ((int64_t)cached > keep) cached = mml_pool_trim(L->pool, (size_t)keep);
  return (int64_t)cached <= keep;
}

int ld_mem_room_ahead_locked(mml_loader *L, int64_t bytes, int64_t own_batch) {
  if (!L->cfg.max_memory) return 1;
  int64_t next = L->batch_buf_peak > own_batch ? L->batch_buf_peak : own_batch;
  return ld_mem_room_locked(L, bytes + pool_bytes(next));
}

/* The read the consumer's batch may need (only_consumer_waits, not head_final): room for
 * one sample beside what is live, caches (spare byte buffers, videos kept open ahead)
 * freed first.  When it cannot fit and nothing else can free room or use it -- no ticket
 * waits for room (mem_stuck's rule: mem_blocked), no decode is queued, every sample read
 * is placed -- 20 looks in a row (5 ms apart) mean it never will: an error naming what is
 * held.  Without it a packed epoch hung here: the head pack's samples all taken, the
 * sample that ends it planned into the next pack, which gets a buffer only once complete
 * (its bound above a quarter of the cap), and no read fitting beside the head pack's
 * buffer (tests/c/loader/test-loader-stress.c loader_max_memory_stuck_read_ends). */
static int read_room_or_stuck(mml_loader *L, int64_t est) {
  if (ld_mem_room_hold_locked(L, est, 0)) {
    L->read_stuck = 0;
    return 1;
  }
  if (L->nspare) ld_bytes_free_spares(L);
  if (ld_release_videos_ahead_locked(L) > 0 || ld_mem_room_hold_locked(L, est, 0)) {
    L->read_stuck = 0;
    return ld_mem_room_hold_locked(L, est, 0);
  }
  if (L->mem_blocked || L->dec_head || L->place_seq < L->next_seq || L->fatal) {
    L->read_stuck = 0;
    return 0;
  }
  if (++L->read_stuck < 20) return 0;
  size_t cached, live;
  mml_pool_usage(L->pool, &cached, &live);
  const task *t = slot_of(L, L->head_seq);
  mml_err e;
  mem_explain(
      L, t->seq == L->head_seq && t->gen == L->gen ? t : NULL,
      "the next sample to read, which the batch the consumer waits for may need", est,
      (int64_t)live + L->win_bytes + scratch_bytes(L) + L->scratch_extra + L->emit_extra + est,
      "or hold fewer batches: a `for batch in loader` loop keeps the previous batch "
      "alive while it asks for the next (`del batch` at the end of the loop body "
      "releases it)",
      &e);
  ld_set_fatal_locked(L, MML_ENOMEM, &e);
  return 0;
}

int ld_mem_may_read_locked(mml_loader *L) {
  if (!L->cfg.max_memory || L->next_seq == L->head_seq) return 1; /* always one in flight */
  int64_t est = L->max_sample_bytes ? L->max_sample_bytes : L->cfg.max_object_bytes;
  /* Nothing read, decoding, queued or emitting and the consumer waiting: no earlier work
   * can use the room held below, and the batch it waits for may need this sample (holding
   * it back hung the loader when two large batches did not fit beside the rest); the
   * steps after the read still check the cap and name what cannot fit. */
  if (only_consumer_waits(L) && !head_final(L)) return read_room_or_stuck(L, est);
  L->read_stuck = 0;
  /* Once samples need scratch: beside the most one has needed (the one read may need as
   * much) and the largest batch buffer taken or samples' pixel rows planned (the next one
   * built; a batch the consumer holds is live already): samples read ahead must not take
   * the room that the batches before them need, as they can only be decoded after those. */
  int64_t hold = ld_mem_scratch_hold_locked(L, INT64_MAX);
  if (hold < L->scratch_max) hold = L->scratch_max;
  const int expands = L->compact && (L->fbytes_max || L->pxf_max); /* image rows seen */
  if (!hold && !expands) return ld_mem_room_locked(L, est * (L->in_flight + 1));
  const int64_t tk = mml_round_2mib(L->tk_bytes_max > L->px_max ? L->tk_bytes_max : L->px_max);
  int64_t eh = expand_hold(L); /* before any batch: a sample's expanded rows */
  if (L->compact && !L->fbytes_max) eh = mml_round_2mib(L->pxf_max);
  return ld_mem_room_hold_locked(L, est * (L->in_flight + 1) + tk, hold + eh);
}

/* The decoder scratch t's images need beyond a worker's reserve (0 without max_memory,
 * or when they decode in a few rows): the most of their plans' (one decodes at a time). */
static int64_t scratch_need(const mml_loader *L, const task *t, int *which) {
  int64_t need = 0;
  if (which) *which = -1;
  if (!L->cfg.max_memory || !t->rec_parsed) return 0;
  for (int i = 0; i < t->rec.nimages && i < t->imgs_cap; i++)
    if (t->plans[i].scratch > need) {
      need = t->plans[i].scratch;
      if (which) *which = i;
    }
  return need;
}

mml_status ld_mem_check_sample(const mml_loader *L, task *t, mml_err *err) {
  if (!L->cfg.max_memory) return MML_OK;
  int64_t enc = (int64_t)t->rec_bytes.len, px = 0;
  for (int p = 0; p < PLANES; p++) px += plane_rows(&t->sample, p) * (int64_t)L->row_bytes[p];
  if (L->compact) /* its expansion: the uint8 rows and the float rows at once */
    px += t->sample.pixel_rows * (int64_t)L->expand_row_bytes;
  for (int i = 0; i < media_items(t); i++) enc += (int64_t)t->imgs[i].len;
  int img = -1;
  t->scratch_need = scratch_need(L, t, &img); /* L->scratch_max: finish_task_locked */
  int64_t room = L->cfg.max_memory - scratch_bytes(L);
  if (px + enc + t->scratch_need <= room) return MML_OK;
  if (t->scratch_need > 0) {
    const mml_vision_plan *pl = &t->plans[img];
    return mml_err_set(
        err, MML_ENOMEM,
        "the sample needs %lld bytes of pixel_values(_videos), %lld encoded bytes and %lld bytes "
        "of decoder scratch (image %d, a %dx%d %s), more than the %lld bytes max_memory=%lld "
        "leaves beside %d workers' scratch reserve",
        (long long)px, (long long)enc, (long long)t->scratch_need, img, pl->src_w, pl->src_h,
        mml_image_format_name(pl->format), (long long)room, (long long)L->cfg.max_memory,
        L->cfg.num_threads);
  }
  return mml_err_set(err, MML_ENOMEM,
                     "the sample needs %lld bytes of pixel_values(_videos) and %lld encoded "
                     "bytes, more "
                     "than the %lld bytes max_memory=%lld leaves beside %d workers' scratch",
                     (long long)px, (long long)enc, (long long)room, (long long)L->cfg.max_memory,
                     L->cfg.num_threads);
}

int ld_mem_scratch_take_locked(mml_loader *L, task *t) {
  if (!L->cfg.max_memory || t->scratch_need <= 0) return 1;
  if (L->fatal) return 0;
  /* the room held for the decodes placed is theirs: this one's among them */
  int ok = ld_mem_room_hold_locked(L, t->scratch_need, 0);
  if (!ok && L->nspare) { /* spare image buffers are only a speed-up */
    ld_bytes_free_spares(L);
    ok = ld_mem_room_hold_locked(L, t->scratch_need, 0);
  }
  if (ok) {
    t->scratch_granted = t->scratch_need;
    L->scratch_extra += t->scratch_granted;
    L->scratch_stuck = 0;
    return 1;
  }
  /* Room comes back as decodes end and the consumer releases batches; with none running,
   * nothing read or planned and the consumer waiting in next() for nothing ready, 20 looks
   * in a row (5 ms apart) mean it cannot fit (not expected: the room is held for it). */
  if (!only_consumer_waits(L)) {
    L->scratch_stuck = 0;
    return 0;
  }
  if (++L->scratch_stuck < 20) return 0;
  size_t cached, live;
  mml_pool_usage(L->pool, &cached, &live);
  mml_err e;
  mem_explain(L, t, "decoder scratch its image needs", t->scratch_need,
              (int64_t)live + L->win_bytes + scratch_bytes(L) + L->scratch_extra + L->emit_extra +
                  t->scratch_need,
              "release earlier batches", &e);
  ld_set_fatal_locked(L, MML_ENOMEM, &e);
  return 0;
}

int64_t ld_mem_emit_take_locked(mml_loader *L) {
  if (!L->compact || !L->cfg.max_memory) return 0;
  if (L->fatal) return -1;
  int64_t need = -1; /* the oldest queued batch's, which ld_emit_job_locked emits */
  for (int64_t k = L->pend_head; k < L->pend_tail && need < 0; k++) {
    const pend_item *q = &L->pend[k % L->npend];
    if (q->state == PEND_QUEUED) need = (int64_t)q->fneed; /* in place: F - U bytes more */
  }
  if (need <= 0) return 0;
  int ok = ld_mem_room_hold_locked(L, need, 0);
  if (!ok && (L->nspare || L->video_open_bytes || L->video_held)) {
    /* caches make way for the oldest work before it waits, as for the head ticket
     * (retry_pending): the spare byte buffers, and the bytes later samples hold ahead of
     * their decode (their decodes read them again) */
    ld_bytes_free_spares(L);
    ld_release_videos_ahead_locked(L);
    ok = ld_mem_room_hold_locked(L, need, 0);
  }
  if (ok) {
    L->emit_extra += need;
    L->emit_stuck = 0;
    return need;
  }
  /* As for a decode's scratch: nothing else can free room and the consumer waits. */
  if (L->decoding || L->in_flight || !L->consumer_waiting || L->out_count || L->emitting) {
    L->emit_stuck = 0;
    return -1;
  }
  if (++L->emit_stuck < 20) return -1;
  size_t cached, live;
  mml_pool_usage(L->pool, &cached, &live);
  mml_err e;
  char hint[96];
  snprintf(hint, sizeof hint, "release earlier batches, or set pixel_format=\"%s\"",
           decode_name(L));
  mem_explain(L, NULL, "expanded pixel_values the next batch adds", need,
              (int64_t)live + L->win_bytes + scratch_bytes(L) + L->scratch_extra + L->emit_extra +
                  pool_bytes(need),
              hint, &e);
  ld_set_fatal_locked(L, MML_ENOMEM, &e);
  return -1;
}

void ld_mem_scratch_give_locked(mml_loader *L, task *t) {
  L->scratch_extra -= t->scratch_granted;
  t->scratch_granted = 0;
}

void ld_mem_count_task_locked(mml_loader *L, task *t) {
  int64_t vheld = t->vhead_bytes + t->vpre_bytes; /* remote video bytes ahead of their use */
  for (int v = 0; v < t->vcap; v++) vheld += t->vhead[v].open_bytes; /* and videos kept open */
  int64_t held = (int64_t)(t->rec_bytes.cap + t->path.cap + t->pqrow.buf.cap) + vheld;
  int64_t used = (int64_t)t->rec_bytes.len + vheld;
  for (int i = 0; i < t->imgs_cap; i++) held += (int64_t)t->imgs[i].cap;
  if (t->rec_parsed)
    for (int i = 0; i < media_items(t) && i < t->imgs_cap; i++) used += (int64_t)t->imgs[i].len;
  L->win_bytes += held - t->held;
  t->held = held;
  if (used > L->max_sample_bytes) L->max_sample_bytes = used;
}

void ld_place_decoded_locked(mml_loader *L, task *t, int p, mml_buf *buf, size_t off) {
  place_at *a = &t->at[p];
  mml_buf_release(a->home);
  a->home = buf; /* the worker's reference */
  a->home_off = off;
  if (a->dest && (a->dest != buf || a->dest_off != off)) move_home(L, t, p);
}
