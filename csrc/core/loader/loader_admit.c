/*
 * loader_admit.c -- the loader's use of the memory ledger under max_memory (ledger.c THE
 * LOADER'S USE): the charges it asks (a read's bytes, a ticket plane's buffer, a decode's
 * scratch, an emission's rows and tensors), what makes way for the oldest work, when next()
 * may declare its wait so that the ledger's deadlock rule (L7) can decide, and the
 * explainer's inputs.  Its callers ask once each: the workers (loader_worker.c:
 * ld_mem_may_read_locked, ld_admit_read_locked, ld_mem_scratch_take_locked,
 * ld_mem_emit_take_locked), the planner (loader_place.c, which decides none:
 * ld_admit_ticket_locked, ld_admit_make_way_locked, ld_admit_bound_stuck_locked,
 * ld_admit_pack_bound_ok, ld_admit_decodes_in_order), the video reader
 * (ld_mem_room_locked: loader_video.c) and the task's byte count
 * (ld_mem_count_task_locked).  Without max_memory every answer is yes.
 *
 * THE BUDGET.  max_memory covers the pool's buffers (live: batches being built, queued or
 * held by the consumer; cached: pages kept for reuse), the window's byte buffers (spares,
 * remote video bytes ahead, videos kept open), the workers' scratch reserve and the Parquet
 * room; A6-A11 say how each is charged and how the ledger balances.  Holds left (room kept
 * for earlier work that asks later in time, which in-order grants cannot put first):
 * none.  The read gate asks room for the reads in flight and the next, at the most one
 * sample has held (R7).  Bytes held ahead (loader_video.c) keep no room for the next batch:
 * make-way gives them back to whichever charge waits at the head (C8).
 *
 * DECODER SCRATCH.  An image whose decode maps more than the worker's reserve (a multi-scan
 * JPEG's coefficients, a whole-image buffer: mml_vision_plan.scratch) gives its sample a
 * scratch_need, counted in "can it ever fit" (A4) and charged once its decode is queued
 * (D1-D5).
 * COMPACT: tickets count uint8 rows; what their float rows add is charged once their rows
 * are final, until their emission (E1).
 *
 * READ AGAIN.  Samples are read before the needs of earlier ones are known (a plan comes
 * from the bytes), so earlier work can find its room taken by later samples' media bytes,
 * which come back only after their own decodes.  Those that can be read again (planned,
 * decode not begun, no video; fetched ones are fetched again, R7) make way, latest first
 * (ld_admit_drop_bytes_ahead_locked; stats samples_reread): freed, and their decode reads
 * them again first, charging them with its scratch (task.reread).  Revocable reads (R5) are
 * asked back by the ledger itself (L10).
 *
 * INVARIANTS (the tests that hold them on the line below each)
 *   A1. The pool never holds more than max_memory.
 *       test-loader-stress.c S3; tests/test_memory.py's RSS tests.
 *   A2. Admission never changes the batches: a capped epoch is bitwise the uncapped one.
 *       test-loader-stress.c S2; tests/test_batch_digest.py.
 *   A3. A wait nothing can end is an MML_ENOMEM naming the sample and a cap that fits: no hang.
 *       test-loader-stress.c S1; tests/test_memory_stress.py.
 *   A4. A sample that alone cannot fit is an error at its plan (ld_mem_check_sample).
 *       tests/test_memory.py test_one_image_whose_scratch_cannot_fit_is_named.
 *   A5. Earlier work never waits on later samples' media bytes that can be read again (READ AGAIN).
 *       tests/test_memory.py test_reads_ahead_make_way_for_an_earlier_decode.
 *   A6. The ledger balances: at rest it holds exactly the pool's, the window's, the reserve's,
 *       the grants' and the Parquet room's bytes (ld_ledger_check_locked).
 *       test-loader-stress.c S5; a debug build's assert at free.
 *   A7. Every growth of the pool is paid for by a charge made before it (a ticket's, an
 *       emission's: ld_ledger_cover_begin); what the hook had to charge itself is an error.
 *       test-loader-stress.c S5; tests/c/batch/test-collate.c emit_counted.
 *   A8. The ledger alone decides: requests that wait for reads (R1), tickets (T1), a
 *       decode's scratch (D1) and emissions (E1); growth already taken is a count (L13).
 *       test-loader-stress.c MML_STRESS_SHOW_OVER reports counts past the cap.
 *   A9. No hold is left: the room questions (the read gate's, bytes ahead's) ask
 *       mml_ledger_room for their bytes alone (ld_mem_room_locked); the loader's own
 *       sums only feed messages.
 *       No test of its own: the answers are the ledger's (test-ledger.c, L12).
 *  A10. The pool's live bytes are the consumer's: no engine reference to a batch's buffers
 *       outlives its entry into the consumer's queue (ld_ledger_queued_locked; but a ticket's
 *       old buffer a running decode still writes, while the consumer cannot declare: C2).
 *       Why: the hook counts live bytes as CONSUMER credit, which L7 does not wait for.
 *       test-loader-stress.c S5; tests/test_video_files.py test_max_memory_counts_videos_kept_open.
 *  A11. An empty or DONE slot holds no media bytes: a slot emptied without its decode goes
 *       through ld_task_give_back_locked (charge back, videos closed, bytes to the spares).
 *       test-loader-stress.c loader_max_memory_seek_gives_bytes_back, S5.
 *
 * TICKETS (ledger.c M2).  A ticket plane's buffer is one charge in the ledger (tk_plane.ch,
 * ld_admit_ticket_locked), kept while the plane is pending:
 *   T1. It asks at the ticket's first sample's seq for the buffer alone; it may wait.
 *       Its grant or failure wakes the collation thread (ticket_wake), which maps the buffer
 *       (retry_pending -> rebuffer) or raises the explainer's message (C3).
 *       tests/c/base/test-ledger.c ledger_withdraw_to_resize_grants_behind_first; S1.
 *   T2. A seek, a rewind, a close, another size or a lost turn withdraws a waiting charge or
 *       gives back a grant not mapped yet (ld_admit_ticket_cancel_locked).
 *       test-loader-stress.c S5 (a grant not mapped counts in A6's balance).
 *   T3. Before a plane asks again or anew, the charges of the planes after it leave first
 *       (and the expansions of its ticket, for its image plane, and of later tickets: E1).
 *       Why: a grant behind it, not mapped while it waits, held the room it needed.
 *       test-loader-stress.c S1 (more out-of-memory errors without).
 *   T4. Earlier work refused room (an expansion, an emission, a decode's scratch) takes back
 *       later tickets' grants not mapped yet and their expansions (tickets_give_back_locked).
 *       test-loader-stress.c S1.
 *   T5. With only parked reads running and the consumer waiting, a read asks out of turn when
 *       a ticket charge waits (mem_blocked): that charge cannot be granted before it ends.
 *       Why a try, not a request: in turn it waits behind that charge (L1), a deadlock; out of
 *       turn and waiting, it would hold that charge behind it, which T6's give-back must grant.
 *       tests/c/base/test-ledger.c ledger_waiting_read_parks_and_asks_out_of_turn.
 *   T6. T5's try refused, the read gives back what it took once per ticket head; the consumer
 *       is poked and L7 decides for the ticket (t5_refused_locked; C4, C7).
 *       test-loader-stress.c loader_max_memory_parked_reads_asked_again_end (seed 32).
 *
 * READS (ledger.c M1).  A read's bytes are one charge in the ledger (task.rch,
 * ld_admit_read_locked), asked once their size is known:
 *   R1. At the read's seq, for its buffer's growth (ld_bytes_take, B4); granted or it waits.
 *       While it waits, make-way runs (C8); no read goes ahead without a grant.
 *       test-ledger.c ledger_waiting_read_parks_and_asks_out_of_turn.
 *   R2. The worker never blocks on it: the task is parked (room_head, room_at) and a worker's
 *       look (ld_admit_parked_locked) runs it on once the change count (L11) says it moved.
 *       Why: with one worker, the decode or emission that gives the room back must still run.
 *       test-loader-stress.c S1 (schedules draw 1-3 workers).
 *   R3. With only parked reads in the engine and the consumer waiting, L7 decides for the
 *       earliest (C4): its charge fails and its read raises the explainer's message.
 *       tests/test_memory.py test_a_read_that_cannot_fit_beside_the_kept_batches_is_an_error.
 *   R4. A charge leaves with its need (ld_admit_read_drop_locked): a read run again that no
 *       longer needs it, a task finishing with one.  test-loader-stress.c S5.
 *   R5. A read of a sample with no video and no fetch pending asks revocably (L10), settled when
 *       its decode begins; asked back, a worker gives it back (ld_admit_revoked_locked) or
 *       keeps it (mml_ledger_keep).  test-ledger.c ledger_revokes_later_reads_for_the_head,
 *       ledger_keep_asks_back_the_next; test-loader-stress.c S5.
 *   R6. A parked read asked back restarts from its first item (restart_parked_locked), at its
 *       first ask and then only for a later head than at its last restart.
 *       Why: unbounded restarts livelocked (MML_STRESS_SEED=539); once per sample hung.
 *       test-loader-stress.c loader_max_memory_parked_reads_asked_again_end.
 *   R7. The read gate keeps no room for earlier work: fetched bytes make way too, fetched
 *       again by their decode, which fails the sample if they changed (ld_task_media_sum).
 *       Why: room kept for the scratch and the largest batch did not stop fetches ahead
 *       from taking what an earlier batch asked later (OutOfMemoryError where it fit).
 *       tests/test_memory.py test_fetched_reads_ahead_make_way_for_an_earlier_decode.
 *
 * DECODES (ledger.c M3).  A decode's scratch and its re-read's bytes are one charge in the
 * ledger (task.sch):
 *   D1. Asked at its sample's seq once its decode is queued with every destination
 *       (ld_admit_decode_queued_locked, from loader_place.c set_dest in the critical section
 *       that mapped its ticket's buffer); a worker's look takes the answer
 *       (ld_mem_scratch_take_locked): granted, it runs; waiting, it stays queued; failed, D4.
 *       Why: its grant waits for no later work, and no later ticket asks before it.
 *       test-loader-stress.c S1, S5;
 *       tests/test_memory.py test_batches_complete_later_get_their_scratch_in_turn.
 *   D2. While it waits, each worker's look makes way (C8); asked at its queueing, only the
 *       later tickets' grants not mapped yet give way (T4: granted in the step that granted
 *       its ticket).  Why: READ AGAIN at each queueing dropped bytes that a running decode's
 *       end would have made room for.
 *       tests/test_memory.py test_reads_ahead_make_way_for_an_earlier_decode.
 *   D3. It leaves with its decode's places: unrun, unplaced (a rewind: asked again when
 *       placed), a seek, a slot given back or close withdraws it or gives its grant back
 *       (ld_admit_scratch_drop_locked); A6 counts grants not taken.  test-loader-stress.c S5.
 *   D4. Its sample's media bytes are its own (mml_charge.own): at the head with the engine
 *       idle (C5), L7 fails it with the explainer's message after the sample's name.
 *       tests/test_memory.py
 *       test_a_decode_whose_scratch_cannot_fit_beside_the_kept_batches_fails_at_once.
 *   D5. Its sample's bytes dropped (READ AGAIN, a read asked back: R5) give its charge back
 *       with them; a worker's look asks again for scratch and re-read (drop_media_locked).
 *       Why: kept, it held room that the earlier work which took the bytes needs, for a
 *       decode that can start only after that work.
 *       tests/test_memory.py test_reads_ahead_make_way_for_an_earlier_decode.
 *
 * EXPANSIONS AND EMISSIONS (ledger.c M4).  A batch's compact rows' expansion is one charge
 * with its ticket (ticket.xch, ld_admit_expand_locked), held until its emission; the emission
 * asks one more (pend_item.ch, ld_mem_emit_take_locked) when a worker finds its batch the
 * oldest queued, G1 open:
 *   E1. The expansion (its float rows' pages beyond its uint8 buffer) asks at the ticket's first
 *       sample's seq once its rows are final and its image buffer mapped -- closed, before a
 *       later ticket asks (close_ticket, rebuffer), or a later ticket placed -- and once its
 *       decodes that still ask (scratch, a re-read) have their grants; granted, it is carried
 *       to the emission at hand-off (xcarry).  So no work asked after it takes its room (L1);
 *       while it waits for those decodes a later ticket may (T4 takes back a grant not mapped).
 *       The emission asks at the same seq for its other tensors and any float rows' pages not
 *       carried; granted, or it waits and the batch stays queued (no worker blocks).
 *       tests/test_memory.py test_a_batch_whose_expansion_fits_in_place_is_delivered; S1.
 *   E2. While either waits, each look makes way (C8): later tickets' grants not mapped and
 *       their expansions (T4) and, at the head, videos ahead and later samples' bytes that
 *       can be read again -- for an expansion, after the sample its batch waits for last.
 *       test-loader-stress.c S1.
 *   E3. Their grants move the change count (L11); a seek, a rewind, a close or another buffer
 *       withdraws them or gives back a grant not taken (ld_admit_expand_cancel_locked,
 *       ld_admit_emit_cancel_locked).  test-loader-stress.c S5 (A6 counts grants not taken).
 *   E4. Waiting at the head, neither is engine work, nor is what the collator does behind an
 *       emission (C2); L7 fails it with the explainer's message (X1), the consumer's split and
 *       the pixel_format that needs no expansion (expand_failed_locked); while an expansion
 *       waits the collator waits for room (expand_waits), so its failure reaches it.
 *       tests/test_memory.py test_an_emission_that_cannot_fit_is_the_deadlock_rules_error; S1.
 *   E5. A batch's buffers are CONSUMER credit (A10); its expansion's grant is ENGINE credit
 *       back only at its emission: behind the head (C7), the emission charge's own (xcarry).
 *       tests/test_memory.py test_an_emission_that_cannot_fit_is_the_deadlock_rules_error; S1.
 *
 * WAKING (no polling: whatever gives room back or changes a gate's input wakes the waiter).
 * The workers wait on the ledger's change count (W4), the collator on its own event count:
 *   W1. Room coming back pokes both while a thread looks or waits for room (ld_room_wake,
 *       never taking mu: the pool's hook runs with mu held or not; room_waiting_work / _coll):
 *       a batch released, a cache trimmed, ENGINE credit released, a buffer into the spares.
 *       test-ledger.c ledger_wait_change_loses_no_owner_event.
 *   W2. The collator's wait for a buffer has no bound and loses no wake: coll_events (leaf lock
 *       coll_mu) read under mu before its look; events without mu poke from before its look
 *       (ticket_wake, ld_room_wake), events under mu once its wait began (ld_coll_wake_locked,
 *       next() kept from declaring, ld_consumer_stale_locked).
 *       test-loader-collator-wait.c CW1-CW3 (no poll; a release, close end it); stress S1.
 *   W3. A wake changes when a waiter looks, never what it decides.
 *       test-loader-stress.c S2; tests/test_batch_digest.py.
 *   W4. A worker reads the ledger's change count under mu before it looks for work or room
 *       (ld_work_look_locked) and, finding nothing it may do, waits until it moves
 *       (ld_work_wait_locked); whatever queues work or may let one go on pokes (ld_work_wake).
 *       tests/test_loader_lifecycle.py (close() and Ctrl-C end the waits; stats room_waits).
 *   W5. A worker's wait for room has no bound: each input of a room gate pokes when it changes
 *       while a worker waits for room (ld_room_gates_changed_locked: room_waiters) -- room (W1),
 *       a read ending, a task parked for its epoch, a decode ending, the output queue and
 *       pending emissions moving, next() starting to wait, a fatal error, head_seq, a seek,
 *       close, placement changing mem_blocked or place_seq; the rest only grows, or shrinks
 *       when a decode starts.  A T5 try's grant (it moves no change count) is run by the look
 *       that made it (ld_admit_parked_locked).
 *       test-loader-stress.c S1 (MML_STRESS_SEED=1802 hung without that last rule).
 *
 * THE CONSUMER'S WAIT (ledger.c L7, M5).  With max_memory next() waits in
 * mml_ledger_consumer_wait, not on out_cv:
 *   C1. FIXED credit is the scratch reserve, the Parquet room and each slot's record, path and
 *       Parquet-row buffers; a slot's media bytes are ENGINE.  So held[ENGINE] reaches 0 when
 *       no work holds bytes.  test-ledger.c ledger_deadlock_rule_with_and_without_fixed_credit.
 *   C2. next() declares only if nothing ended since its look and the engine runs nothing
 *       without credit (ld_admit_engine_idle_locked): no read in flight but parked ones (C4);
 *       no sample read and not placed, unless placement stopped for the window or the epoch
 *       (place_held); no decode running or queued but those whose charge waits (C5); no
 *       sample done for the collator unless its ticket waits; no add in progress
 *       (`collating`); no batch handed off, emitting or queued but an emission whose charge
 *       waits (E4); every waiting ticket charge the size the collator would ask now.  Events
 *       it waits for wake it at once (ld_consumer_wake_locked); events that change only
 *       whether it may declare end its declaration (ld_consumer_stale_locked, C6).
 *       test-ledger.c ledger_consumer_woken_only_where_deadlock_rule_decides; stress S6;
 *       tests/test_memory.py test_consumer_waits_in_stats.
 *   C3. L7 decides for a ticket's charge (its failure is the loader's error, X1).  An open pack
 *       waiting for buffers of its bound keeps next() from declaring; in L7's state but for
 *       it (ld_admit_bound_stuck_locked) the planner asks for its rows so far and pokes.
 *       test-loader-stress.c S1; tests/test_video_files.py test_max_memory_counts_videos_kept_open.
 *   C4. A read parked for room (R2) is in flight but holds no credit for what it waits for:
 *       the engine is idle with only such reads in flight when the earliest is the head, or
 *       an emission's or expansion's charge waits at the head before them (E4), or a
 *       ticket's charge waits and that read's out-of-turn try was refused (T5, T6)
 *       (parked_reads_only_locked).  Its own bytes are its charge's own (mml_charge.own); a
 *       read the gate holds back with nothing in flight goes ahead (read_room_or_ahead).
 *       tests/test_memory.py test_a_read_that_cannot_fit_beside_the_kept_batches_is_an_error;
 *       test-loader-stress.c loader_max_memory_stuck_read_ends.
 *   C5. A queued decode whose scratch charge waits (D1) is no engine work; its request makes
 *       next() look again (ld_consumer_stale_locked).  test-loader-stress.c S1.
 *   C6. next() is woken where its answer can change (L14): its events at once; ends of ENGINE
 *       work and stale events only where L7 could fail the head (C7's count refreshed at
 *       each); next()'s own poke wakes only the workers.
 *       Why: waking at each end of work cost ~20 waits a batch under a 176 MiB cap.
 *       test-ledger.c ledger_consumer_woken_only_where_deadlock_rule_decides; stress S6.
 *   C7. With the engine idle, the ENGINE credit its slots hold (planned samples' media bytes,
 *       parked reads' taken bytes, waiting decodes' own) comes back only after the head, but
 *       for what make-way gives back: next() declares the rest as behind the head
 *       (ld_admit_behind_locked, mml_ledger_consumer_behind), which L7 does not wait for.
 *       The planner's look ends with make-way done while a ticket waits (ld_place_locked).
 *       Why: placed after its make-way, they waited for a look that never came (SEED=1008 hung).
 *       test-ledger.c ledger_deadlock_rule_with_credit_behind_the_head; stress S1.
 *   C8. Make-way (make_way_locked) runs for whichever charge waits at the head -- a ticket's,
 *       a read's, a decode's scratch, an expansion's, an emission's -- and gives back what C7
 *       leaves out of the credit behind it: videos kept open ahead of decodes not queued in
 *       the head batch nor running (ld_video_ahead: the head batch's own too) and the bytes
 *       that can be read again of samples after the needed ticket and the charge.
 *       Why: a decode's re-read at the head waited for videos kept open after it (a hang);
 *       the head batch's own, kept while there was room, made a rerun at the explainer's
 *       max_memory fail (X3).
 *       test-loader-stress.c loader_max_memory_videos_ahead_make_way_end;
 *       tests/test_video_files.py test_max_memory_next_batch_never_waits_on_bytes_held_ahead.
 *
 * THE EXPLAINER (ledger.c L8).
 *   X1. Every out-of-memory message of the loader is composed by mml_ledger_explain (ticket,
 *       read, scratch and emission charges failed, a sample too large alone): the work's
 *       name, its bytes, the consumer's credit split into batches it holds and batches built
 *       ahead of it, what runs or waits for it (L8), is set aside and cached, the max_memory
 *       that would hold it, the hint (tests/test_memory.py, tests/test_video_files.py match
 *       its words).
 *   X2. A charge carries its work's name and what, copied in before its request (ticket,
 *       read and scratch charges), so the ledger names it on any thread without the loader's lock
 *       (ledger.c THREADS; test-ledger.c ledger_explainer_names_the_charge).
 *   X3. A batch buffer's failure names the max_memory that holds the whole batch: beside its
 *       buffer, what the batch asks next (ticket_then_bytes: its other planes' buffers, its
 *       expansion, its other tensors by mml_compose_emit_bytes), so a rerun at that figure
 *       delivers it; the plan's composition is the batch's (asserted at its hand-off).
 *       tests/test_video_files.py test_max_memory_next_batch_never_waits_on_bytes_held_ahead
 *       (reruns at exactly it); test-loader-stress.c S1 (the assert, in a debug build).
 *
 * Locking: everything here runs with the loader's mu held (ld_room_wake excepted: W1);
 * mu -> pool is the lock order.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader_int.h"
#include "mml/datauri.h"

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
  if (!L->placing || L->tk_tail <= L->tk_head || ld_place_needed_ticket(L) <= L->tk_head) return 0;
  const task *t = slot_of(L, L->head_seq);
  return t->seq == L->head_seq && t->gen == L->gen && t->state == SLOT_PLANNED && t->tk >= 0 &&
         ld_place_has_dests(t);
}

/* Whether charge c (NULL: none; C8: the head ticket's, asked again by the planner) is
 * granted: its state read under the ledger's lock, as another thread's step may grant a
 * waiting charge at any time, right after its request too (ledger.c THREADS). */
static int granted(mml_loader *L, const mml_charge *c) {
  return c && mml_ledger_state(L->ledger, c) == MML_CHARGE_GRANTED;
}

/* The ledger's charge for plane p's buffer of cap_rows rows: what mml_pool_alloc_cap /
 * mml_pool_alloc map for it (rebuffer; compact: small ones float at once, a larger one a
 * mapping of its float capacity with whole 2 MiB pages for its uint8 rows, however few). */
static int64_t ticket_charge_bytes(const mml_loader *L, int p, int64_t cap_rows) {
  const int64_t n = cap_rows * (int64_t)L->row_bytes[p];
  const int64_t f = p == PL_IMG && L->compact ? cap_rows * (int64_t)L->expand_row_bytes : 0;
  return !f ? mml_pool_bytes(n) : f < (1 << 20) ? mml_pool_bytes(f) : mml_round_2mib(n);
}

/* T1: a ticket charge granted (or failed) wakes the collation thread, which maps the
 * buffer at its next look (retry_pending); run by the ledger after its lock is released,
 * on any thread, with mu held or not: it never takes mu (ledger.c THREADS). */
static void ticket_wake(void *arg) {
  mml_loader *L = arg;
  atomic_fetch_add(&L->room_events, 1); /* T6: a refused out-of-turn try is stale */
  ld_coll_poke(L);
}

/* One of the loader's charges leaves the ledger: withdrawn where it waits (later tries are
 * no longer refused behind it: L1; W5), given back where it was granted and not taken
 * (W1: room comes back); IDLE again. */
static void charge_leave_locked(mml_loader *L, mml_charge *c) {
  mml_ledger_withdraw(L->ledger, c); /* a waiting one; then its state is final */
  if (mml_ledger_state(L->ledger, c) == MML_CHARGE_GRANTED) {
    mml_ledger_give_back(L->ledger, c); /* revocable or not */
    ld_room_wake(L);                    /* W1 */
  } else {
    ld_room_withdrawn_locked(L);
  }
  c->state = MML_CHARGE_IDLE;
  c->revocable = 0;
}

void ld_admit_ticket_cancel_locked(mml_loader *L, tk_plane *q) {
  if (!q->charged) return;
  q->charged = 0;
  charge_leave_locked(L, &q->ch); /* T2 */
}

/* T3: the charges of the planes after plane p of ticket id leave the ledger before that
 * plane asks again or anew: none of them may be granted while it is withdrawn for a new
 * size (a withdrawal grants what waits behind), nor keep a grant it has not mapped while
 * it waits (retry_pending stops at the first plane that waits: that grant would hold room
 * the earlier plane needs, and nothing would map it). */
static void cancel_after(mml_loader *L, int64_t id, int p) {
  for (int64_t j = id; j <= L->tk_tail; j++) {
    for (int r = j == id ? p + 1 : 0; r < PLANES; r++)
      ld_admit_ticket_cancel_locked(L, &tk_at(L, j)->pl[r]);
    if (j > id || p == PL_IMG) ld_admit_expand_cancel_locked(L, tk_at(L, j)); /* E3 */
  }
}

/* T4: the grants of tickets after `seq` that their planes have not mapped yet give their
 * bytes back for earlier work that found no room (an emission, a decode's scratch): the
 * collation thread maps a grant only at its next look, and while it waits for that very
 * work (an instance being emitted: hand_off_locked) the grant would hold room the work
 * needs (tests/test_memory.py test_same_batches_with_a_cap raised OutOfMemoryError at an
 * emission).  Their planes stay pending and ask again at the collator's next look. */
static int64_t tickets_give_back_locked(mml_loader *L, int64_t seq) {
  int64_t n = 0;
  for (int64_t id = L->tk_head; L->ledger && id <= L->tk_tail; id++)
    for (int p = 0; p < PLANES; p++) {
      tk_plane *q = &tk_at(L, id)->pl[p];
      if (q->charged && q->ch.seq > seq &&
          mml_ledger_state(L->ledger, &q->ch) == MML_CHARGE_GRANTED) {
        n += q->ch.bytes;
        ld_admit_ticket_cancel_locked(L, q);
      }
    }
  for (int64_t id = L->tk_head; L->ledger && id <= L->tk_tail; id++) { /* expansions (E1) */
    ticket *k = tk_at(L, id);
    if (k->xon && k->xch.seq > seq && mml_ledger_state(L->ledger, &k->xch) == MML_CHARGE_GRANTED) {
      n += k->xch.bytes;
      ld_admit_expand_cancel_locked(L, k);
    }
  }
  return n;
}

static void ticket_sample_name(mml_loader *L, int64_t id, char *where, size_t cap);

/* A charge of ticket id (its buffer's, T1; its expansion's, E1) filled in before its
 * request: at the ticket's first sample's seq, named after it (X2), waking the collator. */
static void ticket_charge_init(mml_loader *L, mml_charge *c, int64_t id, int64_t seq, int64_t bytes,
                               const char *what) {
  memset(c, 0, sizeof *c);
  c->seq = seq;
  c->bytes = bytes;
  c->wake = ticket_wake;
  c->wake_arg = L;
  ticket_sample_name(L, id, c->name, sizeof c->name); /* X2 */
  c->what = what;
}
static void sample_name(const mml_loader *L, const mml_sample *s, char *out, size_t cap);
static int64_t batches_ahead_locked(mml_loader *L, int64_t live);
static int64_t expand_behind_locked(mml_loader *L, const mml_ledger_stats *s);

/* X1: the consumer's credit split into the batches it holds and those built ahead of it
 * (only the loader tells them apart: what `del batch` would give back). */
static void oom_split_locked(mml_loader *L, mml_ledger_oom *o, char *split, size_t cap) {
  size_t cached, live;
  mml_pool_usage(L->pool, &cached, &live);
  /* the expansions charged (E1) are ENGINE credit, but batches being built: told as such */
  int64_t x = expand_behind_locked(L, NULL);
  if (x > o->held[MML_HOLD_ENGINE]) x = o->held[MML_HOLD_ENGINE];
  o->held[MML_HOLD_ENGINE] -= x;
  o->held[MML_HOLD_CONSUMER] += x;
  o->waiting = o->waiting > x ? o->waiting - x : 0; /* L8: it was behind the head (C7) */
  const int64_t cons = o->held[MML_HOLD_CONSUMER];
  int64_t ahead = batches_ahead_locked(L, (int64_t)live) + x;
  if (ahead > cons) ahead = cons;
  snprintf(split, cap,
           "%lld bytes of batches the consumer holds, %lld bytes of batches being built or "
           "emitted ahead of it",
           (long long)(cons - ahead), (long long)ahead);
  o->split = split;
  if (cons == ahead) o->hint = ""; /* the consumer holds no batch: `del batch` frees nothing */
}

/* X1: the message of charge c refused: its failure's parts when the ledger's latest
 * failure is c's, else the figures now; with the loader's words. */
static mml_status charge_oom_locked(mml_loader *L, const mml_charge *c, int64_t then, mml_err *e) {
  mml_ledger_oom o;
  if (!mml_ledger_oom_failed(L->ledger, &o) || o.seq != c->seq || o.need != c->bytes) {
    mml_ledger_oom_now(L->ledger, c->seq, c->bytes, c->bytes > L->cfg.max_memory, &o);
    snprintf(o.name, sizeof o.name, "%s", c->name);
    o.what = c->what;
  }
  o.then = then;
  char split[256];
  oom_split_locked(L, &o, split, sizeof split);
  return mml_ledger_explain(L->ledger, &o, e);
}

int64_t ld_admit_expansion_bytes(const mml_loader *L, int64_t rows, int64_t size,
                                 int64_t capacity) {
  const int64_t fb = rows * (int64_t)L->expand_row_bytes;
  if (capacity >= fb) return size < fb ? mml_round_2mib(fb - size) : 0;
  return mml_pool_bytes(fb);
}

/* X3: what ticket id's batch asks after plane p's buffer of cap_rows rows: its other
 * planes' buffers not mapped yet, its expansion (compact: E1) unless granted, and its
 * other tensors (its emission's, E1) -- so that the max_memory the message names holds
 * the whole batch, not its buffer alone. */
static int64_t ticket_then_bytes(mml_loader *L, int64_t id, int p, int64_t cap_rows) {
  const ticket *k = tk_at(L, id);
  int64_t n = mml_compose_emit_bytes(L->collator, &k->comp, 1);
  for (int o = 0; o < PLANES; o++) {
    const tk_plane *q = &k->pl[o];
    const int64_t cap = o == p ? cap_rows : !q->buf || q->rows > q->cap_rows ? q->rows : 0;
    if (o != p && cap > 0) n += ticket_charge_bytes(L, o, cap);
    if (o == PL_IMG && L->compact && q->rows > 0 && !(k->xon && granted(L, &k->xch))) {
      const int64_t c = cap ? cap : q->cap_rows;
      n += ld_admit_expansion_bytes(L, q->rows, c * (int64_t)L->row_bytes[o],
                                    c * (int64_t)L->expand_row_bytes);
    }
  }
  return n;
}

/* A ticket's charge failed (L7, or too large alone): the loader's error (X1, C3). */
static void ticket_failed_locked(mml_loader *L, int64_t id, int p, int64_t cap_rows,
                                 const mml_charge *c) {
  mml_err e;
  const int64_t then = ticket_then_bytes(L, id, p, cap_rows);
  ld_set_fatal_locked(L, charge_oom_locked(L, c, then, &e), &e);
}

/* X2: what a ticket plane's charge is for, in messages. */
static const char *const ticket_what[PLANES] = {"a batch's pixel_values",
                                                "a batch's pixel_values_videos"};

int ld_admit_ticket_locked(mml_loader *L, int64_t id, int p, int64_t cap_rows, int turn,
                           int64_t *grant) {
  *grant = 0;
  ticket *k = tk_at(L, id);
  tk_plane *q = &k->pl[p];
  if (!L->ledger) {
    if (!turn) return 0;
  } else {
    /* M2 (T1-T3): the buffer's bytes are ONE charge at the ticket's first sample's seq:
     * granted at once when nothing before it waits and it fits, else it WAITS in the
     * ledger -- later work is refused meanwhile (L1) -- and its grant wakes the collation
     * thread (ticket_wake).  The grant covers the buffer rebuffer maps
     * (ld_ledger_cover_begin) */
    const int64_t bytes = ticket_charge_bytes(L, p, cap_rows);
    if (q->charged) {
      const int s = mml_ledger_state(L->ledger, &q->ch);
      if (s == MML_CHARGE_WAITING && turn && q->ch.bytes == bytes && q->ch.seq == k->first_seq)
        return 0; /* still waiting: its grant wakes the collator */
      if (s == MML_CHARGE_GRANTED && turn && q->ch.bytes >= bytes) {
        q->charged = 0;
        q->ch.state = MML_CHARGE_IDLE;
        ld_ledger_release(L, q->ch.bytes - bytes); /* more than it maps now */
        *grant = bytes;
      } else if (s == MML_CHARGE_FAILED) { /* the deadlock rule (L7), or a shutdown */
        q->charged = 0;
        q->ch.state = MML_CHARGE_IDLE;
        if (q->ch.status == MML_ENOMEM) ticket_failed_locked(L, id, p, cap_rows, &q->ch);
        return 0;
      } else { /* not its turn now, or another size: it leaves, after those behind it */
        cancel_after(L, id, p);
        ld_admit_ticket_cancel_locked(L, q);
      }
    }
    if (!*grant) {
      if (!turn) return 0;
      cancel_after(L, id, p); /* T3 */
      ticket_charge_init(L, &q->ch, id, k->first_seq, bytes, ticket_what[p]);
      mml_err e;
      const mml_status st = mml_ledger_request(L->ledger, &q->ch, &e);
      if (st) {
        /* too large alone (it can never fit), failed at once by
         * L7 (the consumer's wait declared), or shut down: no charge; the first two are
         * the loader's error, the explainer's message naming the sample (C3) */
        q->ch.state = MML_CHARGE_IDLE;
        if (st == MML_ENOMEM) ticket_failed_locked(L, id, p, cap_rows, &q->ch);
        return 0;
      }
      if (!granted(L, &q->ch)) {
        q->charged = 1; /* waiting (T1) */
        return 0;
      }
      q->ch.state = MML_CHARGE_IDLE;
      *grant = bytes;
    }
  }
  return 1;
}

static int64_t scratch_bytes(const mml_loader *L);

/* Bytes the pool maps for a buffer of `need` bytes: 2 MiB pages from 1 MiB on, 4 KiB
 * pages below (mml_pool_alloc's own rounding: counted as less, a small buffer took the
 * pool a few KiB over max_memory). */
static int64_t pool_bytes(int64_t need) {
  if (need <= 0) return 0;
  return need >= (1 << 20) ? mml_round_2mib(need) : (need + 4095) & ~(int64_t)4095;
}

/* ---- expansions (E1): charged with their tickets ---------------------------------------- */

static int make_way_locked(mml_loader *L, const mml_charge *c, int64_t seq, int64_t need);
static void expand_failed_locked(mml_loader *L, const mml_charge *c, int named);

/* E1: the pool bytes ticket k's expansion adds to its image buffer
 * (ld_admit_expansion_bytes) once its rows are final (closed, or a later ticket exists)
 * and that buffer is the one they are in; else 0. */
static int64_t expand_bytes(mml_loader *L, int64_t id) {
  const ticket *k = tk_at(L, id);
  const tk_plane *q = &k->pl[PL_IMG];
  if (!(k->closed || id < L->tk_tail) || !q->buf || q->pending_rows || q->rows <= 0 ||
      q->rows > q->cap_rows)
    return 0;
  return ld_admit_expansion_bytes(L, q->rows, (int64_t)q->buf->size,
                                  (int64_t)mml_buf_capacity(q->buf));
}

/* E1: a sample placed in ticket id -- or, for a pack, the next ticket's first sample, which
 * the collator takes before it hands the pack off -- will still ask the ledger for its
 * decode (its scratch, or its bytes read again) and has not been granted it: asked after
 * the expansion, at its later seq, it would wait behind it while the expansion's batch
 * waits for that very decode (a pack kept one batch fewer under its cap). */
static int64_t expand_last_seq(mml_loader *L, int64_t id);
static int decode_asks_to_come(mml_loader *L, int64_t id) {
  for (int64_t s = tk_at(L, id)->first_seq, last = expand_last_seq(L, id); s <= last; s++) {
    const task *t = slot_of(L, s);
    if (t->seq == s && t->gen == L->gen && t->state == SLOT_PLANNED && t->dec != DEC_RUNNING &&
        (t->scratch_need > 0 || t->reread) &&
        !(t->sch_on && mml_ledger_state(L->ledger, &t->sch) == MML_CHARGE_GRANTED))
      return 1;
  }
  return 0;
}

/* The last sample ticket id's emission waits for: its own last, or for a pack the next
 * ticket's first -- for the tail pack, closed, the sample that closed it, placed next into
 * a ticket of its own (close_ticket asks before that ticket exists) -- (what may make way
 * for its expansion comes after it, E2). */
static int64_t expand_last_seq(mml_loader *L, int64_t id) {
  const int64_t end = id < L->tk_tail ? tk_at(L, id + 1)->first_seq : L->place_seq;
  const int packed = L->rows_bound[PL_IMG] != 0;
  return end - 1 + (packed && (id < L->tk_tail || tk_at(L, id)->closed));
}

void ld_admit_expand_cancel_locked(mml_loader *L, ticket *k) {
  if (!k->xon) return;
  k->xon = 0;
  charge_leave_locked(L, &k->xch); /* E3 */
}

/* Returns 1 when ticket id's expansion is final and still to be asked (a decode of it will
 * ask first), 0 otherwise. */
static int expand_ask_locked(mml_loader *L, int64_t id) {
  ticket *k = tk_at(L, id);
  const int64_t want = expand_bytes(L, id);
  if (k->xon) {
    const int s = mml_ledger_state(L->ledger, &k->xch);
    if (s == MML_CHARGE_FAILED) { /* L7 (the consumer waits, nothing can give room back) */
      k->xon = 0;
      k->xch.state = MML_CHARGE_IDLE;
      if (k->xch.status == MML_ENOMEM) expand_failed_locked(L, &k->xch, 1);
      return 0;
    }
    const int waits = s == MML_CHARGE_WAITING;
    if (k->xch.bytes == want && k->xch.seq == k->first_seq &&
        !(waits && decode_asks_to_come(L, id))) {
      if (waits) (void)make_way_locked(L, &k->xch, expand_last_seq(L, id), want); /* E2 */
      return 0;
    }
    ld_admit_expand_cancel_locked(L, k); /* another size, or a decode of it asks: anew */
  }
  if (!want || L->fatal || L->stop) return 0;
  if (decode_asks_to_come(L, id)) return 1;
  /* E1: ONE charge at the ticket's first sample's seq, beside its buffer's: granted at once
   * when nothing before it waits and it fits, else it WAITS -- later work waits behind it
   * (L1) -- and its grant or failure pokes the collator (ticket_wake).  Granted, it stays
   * ENGINE credit until its emission maps the float rows with it (hand-off: xcarry) */
  ticket_charge_init(L, &k->xch, id, k->first_seq, want,
                     "the expanded pixel_values of a batch (its float rows beyond its uint8 "
                     "rows, charged from its plan to its emission)");
  mml_err e;
  const mml_status st = mml_ledger_request(L->ledger, &k->xch, &e);
  if (st) { /* above max_memory alone, failed at once by L7, or shut down */
    k->xch.state = MML_CHARGE_IDLE;
    if (st == MML_ENOMEM) expand_failed_locked(L, &k->xch, 1);
    return 0;
  }
  k->xon = 1;
  if (!granted(L, &k->xch)) {
    (void)make_way_locked(L, &k->xch, expand_last_seq(L, id), want); /* E2 */
    ld_consumer_stale_locked(L); /* C2, E4: a charge waits: the engine may be idle */
  }
  return 0;
}

void ld_admit_expand_locked(mml_loader *L, int64_t id) {
  if (!L->ledger || !L->compact || id < L->tk_head || id > L->tk_tail) return;
  (void)expand_ask_locked(L, id);
}

int ld_admit_expand_all_locked(mml_loader *L) {
  int waits = 0;
  if (!L->ledger || !L->compact) return 0;
  for (int64_t id = L->tk_head; id <= L->tk_tail && !L->fatal; id++) {
    const int later = expand_ask_locked(L, id); /* in stream order: none after one to come */
    const ticket *k = tk_at(L, id);
    waits |= k->xon && mml_ledger_state(L->ledger, &k->xch) == MML_CHARGE_WAITING;
    if (later) break;
  }
  return waits;
}

void ld_admit_expand_hand_off_locked(mml_loader *L, pend_item *p) {
  p->xcarry = 0;
  if (!L->ledger || !L->placing || L->tk_tail < L->tk_head) return;
  ticket *k = tk_at(L, L->tk_head);
  /* X3: the plan's composition is the batch's (a buffer's failure counted from it) */
  assert(p->sneed == mml_compose_emit_bytes(L->collator, &k->comp, 1));
  if (!k->xon) return;
  const int s = mml_ledger_state(L->ledger, &k->xch);
  if (s != MML_CHARGE_GRANTED) { /* waiting: its emission asks at the same seq (E1) */
    const int failed = s == MML_CHARGE_FAILED && k->xch.status == MML_ENOMEM;
    ld_admit_expand_cancel_locked(L, k);
    if (failed) expand_failed_locked(L, &k->xch, 1);
    return;
  }
  k->xon = 0;
  k->xch.state = MML_CHARGE_IDLE;
  p->xcarry = k->xch.bytes < p->fpool ? k->xch.bytes : p->fpool;
  ld_ledger_release(L, k->xch.bytes - p->xcarry); /* more than its rows took */
}

/* Bytes the planes of the tickets up to the needed one (the one the consumer's next batch
 * waits on: needed_ticket) wait for. */
static int64_t head_pending_bytes(mml_loader *L) {
  int64_t n = 0;
  for (int64_t id = L->tk_head, nt = ld_place_needed_ticket(L); id <= nt; id++)
    for (int p = 0; p < PLANES; p++)
      n += tk_at(L, id)->pl[p].pending_rows * (int64_t)L->row_bytes[p];
  return n;
}

static int64_t needed_last_seq(mml_loader *L);

/* C8: what makes way for a charge waiting at `seq` for `need` bytes -- a ticket's (c NULL:
 * the planner's, for the head, `seq` the needed ticket's last), a read's, a decode's
 * scratch, an expansion's (`seq` the sample its batch waits for last: E2), an emission's --
 * at each look while it waits, until it is granted: later tickets' grants not mapped yet
 * (T4); when c is the ledger's head (its seq and bytes) also spare byte buffers and
 * the videos kept open ahead (ld_video_ahead: what ld_admit_behind_locked leaves out of
 * the credit behind the head); then the media bytes that can be read again of the
 * samples after `seq` (READ AGAIN).  Never those of samples before it: their decodes come
 * first and read them again at once (a read at the head dropping them, and their decodes'
 * re-reads dropping its bytes, took turns until L7 failed the read's re-read: tests/
 * test_memory.py test_a_read_that_cannot_fit_beside_the_kept_batches_is_an_error).  1 when
 * it gave something back (what it gives back grants c when it fits: L2). */
static int make_way_locked(mml_loader *L, const mml_charge *c, int64_t seq, int64_t need) {
  int64_t freed = tickets_give_back_locked(L, seq);
  if (granted(L, c)) return 1;
  mml_ledger_stats s = {.head_seq = -1};
  if (c) mml_ledger_get_stats(L->ledger, &s);
  if (!c || (s.head_seq == c->seq && s.head_need == c->bytes)) { /* c is the head (its seq) */
    if (ld_bytes_spares(L)) ld_bytes_free_spares(L), freed = 1;
    if (L->video_open_bytes || L->video_held) freed += ld_release_videos_ahead_locked(L);
    if (freed > 0 && (!c || granted(L, c))) return 1;
  }
  return ld_admit_drop_bytes_ahead_locked(L, seq, need) > 0 || freed > 0;
}

int ld_admit_make_way_locked(mml_loader *L) {
  /* the head waits for room, not its turn (rebuffer: prefetch, decodes ahead): bytes later
   * batches' samples hold ahead of their use make way (make_way_locked, after the needed
   * ticket) */
  const int64_t h = L->tk_tail >= L->tk_head ? ld_place_needed_ticket(L) : L->tk_head;
  const int short_of_room = L->cfg.max_memory && L->ledger && L->tk_tail >= h &&
                            head_pending_bytes(L) &&
                            (ld_place_has_buf(tk_at(L, h)) || !ld_place_turn_waits_locked(L, h));
  return short_of_room && make_way_locked(L, NULL, needed_last_seq(L), head_pending_bytes(L));
}

/* Of the pool's `live` bytes, the buffers of batches not handed to the consumer yet:
 * tickets' buffers and pending emissions' (the rest are batches the consumer holds or has
 * yet to take). */
static int64_t batches_ahead_locked(mml_loader *L, int64_t live) {
  int64_t ahead = 0;
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
  return ahead < live ? ahead : live;
}

/* The name of the sample a ticket's charge is for (empty when its slot holds
 * another sample now): the ticket's first sample, or the collator's next one when the
 * collator took its first ones already (an open pack's). */
static void ticket_sample_name(mml_loader *L, int64_t id, char *where, size_t cap) {
  const int64_t s0 = tk_at(L, id)->first_seq;
  const task *t = slot_of(L, s0 > L->head_seq ? s0 : L->head_seq);
  where[0] = 0;
  if (t->seq < L->head_seq || t->gen != L->gen) return;
  sample_name(L, &t->sample, where, cap);
}

/* A sample's name for messages ("data.jsonl:12"): its end kept when it is too long. */
static void sample_name(const mml_loader *L, const mml_sample *s, char *out, size_t cap) {
  char full[1100];
  mml_index_name_sample(&L->ix, s->shard, s->index, s->line, full, sizeof full);
  const size_t n = strlen(full);
  if (n < cap)
    memcpy(out, full, n + 1);
  else
    snprintf(out, cap, "...%s", full + n - (cap - 4));
}

/* ---- reads, decoder scratch, emissions, the window's bytes ----------------------------- */

static int64_t scratch_bytes(const mml_loader *L) {
  return (int64_t)L->cfg.num_threads * MML_SCRATCH_RESERVE;
}

/* Encoded items a parsed task holds in imgs[]: images, frames, member videos. */
static int media_items(const task *t) {
  if (!t->rec_parsed) return 0;
  return t->rec.nimages + mml_record_frames(&t->rec) + t->rec.nvideos;
}

int ld_mem_room_locked(mml_loader *L, int64_t need) {
  if (!L->cfg.max_memory) return 1;
  /* A9: the ledger's answer (its held is the loader's memory, A6: the pool's live bytes,
   * the window's, the scratch reserve and grants, emissions, reads, the Parquet room; its
   * caches, pooled pages and spare byte buffers, make way inside it) */
  if (!L->ledger) return 0;
  return mml_ledger_room(L->ledger, INT64_MAX, pool_bytes(need));
}

/* The read the consumer's batch may need (only_consumer_waits, not head_final): room for
 * one sample beside what is live, caches (spare byte buffers, videos kept open ahead)
 * freed first.  When it cannot fit and nothing else can free room or use it -- no ticket
 * waits for room (mem_blocked), no decode is queued, every sample read is placed -- the
 * read goes ahead: its bytes, once their size is known, are a charge that waits in the
 * ledger (R1-R2), the head, and the ledger's deadlock rule decides whether it can ever
 * fit (C4, L7).  Held back with nothing in flight, no rule could decide: a packed epoch
 * hung here (the head pack's samples all taken, the sample that ends it planned into the
 * next pack, which gets a buffer only once complete, and no read fitting beside the head
 * pack's buffer: tests/c/loader/test-loader-stress.c loader_max_memory_stuck_read_ends). */
static int read_room_or_ahead(mml_loader *L, int64_t est) {
  if (ld_mem_room_locked(L, est)) return 1;
  if (ld_bytes_spares(L)) ld_bytes_free_spares(L);
  if (ld_release_videos_ahead_locked(L) > 0 || ld_mem_room_locked(L, est))
    return ld_mem_room_locked(L, est);
  return !(L->mem_blocked || L->dec_head || L->place_seq < L->next_seq || L->fatal);
}

int ld_mem_may_read_locked(mml_loader *L) {
  if (!L->cfg.max_memory || L->next_seq == L->head_seq) return 1; /* always one in flight */
  int64_t est = L->max_sample_bytes ? L->max_sample_bytes : L->cfg.max_object_bytes;
  /* Nothing read, decoding, queued or emitting and the consumer waiting: the batch it
   * waits for may need this sample (holding it back hung the loader when two large batches
   * did not fit beside the rest); the steps after the read still check the cap and name
   * what cannot fit. */
  if (only_consumer_waits(L) && !head_final(L)) return read_room_or_ahead(L, est);
  /* R7: no room kept for earlier work's scratch or batch buffers: what these reads take,
   * files' or fetched, makes way for it when it asks (READ AGAIN) */
  return ld_mem_room_locked(L, est * (L->in_flight + 1));
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
  t->scratch_need = scratch_need(L, t, &img);
  int64_t room = L->cfg.max_memory - scratch_bytes(L) - ld_pq_reserved(L);
  if (px + enc + t->scratch_need <= room) return MML_OK;
  /* X1: the one explainer; unnamed (seq -1): the sample's error is prefixed with its name */
  char what[400];
  int n = snprintf(what, sizeof what, "the sample, which needs %lld bytes of pixel_values(_videos)",
                   (long long)px);
  if (t->scratch_need > 0) {
    const mml_vision_plan *pl = &t->plans[img];
    n += snprintf(
        what + n, sizeof what - (size_t)n, ", %lld bytes of decoder scratch (image %d, a %dx%d %s)",
        (long long)t->scratch_need, img, pl->src_w, pl->src_h, mml_image_format_name(pl->format));
  }
  snprintf(what + n, sizeof what - (size_t)n, " and %lld encoded bytes,", (long long)enc);
  mml_ledger_oom o;
  mml_ledger_oom_now(L->ledger, -1, px + enc + t->scratch_need, 1, &o);
  o.what = what;
  return mml_ledger_explain(L->ledger, &o, err);
}

/* Whether t's media can be read again by its decode: it has no video (a video kept open
 * may read its bytes).  Files, shard members, Parquet blobs and data: URIs are read again;
 * fetched bytes are fetched again, and must be the same (R7). */
static int rereadable(const mml_loader *L, const task *t) {
  (void)L;
  return t->rec_parsed && !t->rec.nvideos;
}

/* R5: t's charges all settled or forgotten: rc[] is free for its next reads -- but not
 * while the charge asked now (rc[nrc], rch_on) is in the ledger: the ledger holds its
 * address and LD_RCH(t) must still name it (rewound under it, a parked read's look
 * took a taken grant for its waiting charge and gave it back twice: A6 unbalanced in 1
 * of ~10 runs of MML_STRESS_SEED=1266); the settled entries below it are skipped. */
static void reads_rewind_locked(task *t) {
  if (!t->rch_on) t->nrc = 0;
  atomic_store(&t->revoked, 0);
}

/* R5: t's reads' grants still revocable (rc[0..nrc), c->revocable: not settled) leave
 * the ledger's list of grants it may ask back.  Their bytes are t->held's already (its
 * count covered their growth with them: ld_mem_count_task_cover_locked), so the caller
 * frees the buffers and counts them, which releases what was freed, and the ledger only
 * forgets the charges (mml_ledger_keep: no bytes move, and one asked back is no longer
 * counted as coming back): a grant's bytes are never released twice (A6). */
static void reads_forget_locked(mml_loader *L, task *t) {
  for (int k = 0; k < t->nrc; k++) {
    mml_charge *c = &t->rc[k];
    if (!c->revocable) continue; /* settled: forgotten already */
    mml_ledger_keep(L->ledger, c);
    c->revocable = 0;
  }
  reads_rewind_locked(t);
}

/* READ AGAIN for one planned sample: its media bytes freed (its reads' grants with them,
 * R5) and read again by its decode, which takes room for them first.  Returns the bytes
 * freed (0: it holds none). */
static int64_t drop_media_locked(mml_loader *L, task *t) {
  const int64_t before = L->win_bytes;
  int64_t n = 0;
  if (t->fetched_bytes) t->reread_sum = ld_task_media_sum(t); /* R7 */
  for (int i = 0; i < media_items(t) && i < t->imgs_cap; i++) {
    const int64_t c = ld_bytes_cap(t->imgs[i].len + 1); /* what the re-read maps */
    if (t->imgs[i].len)
      n += t->fetched_bytes && (int64_t)t->imgs[i].cap > c ? (int64_t)t->imgs[i].cap : c;
    mml_bytes_free(&t->imgs[i]);
  }
  if (n) {
    t->reread = 1;
    t->reread_bytes = n;
    L->samples_reread++;
    /* D5: its decode's charge (asked when it was queued) is now the wrong size, and a
     * grant kept while the decode waits for its re-read's room would hold room the earlier
     * work that took its bytes needs: it goes back with them, asked anew at a worker's look */
    ld_admit_scratch_drop_locked(L, t);
  }
  ld_mem_count_task_locked(L, t); /* released: the head may be granted (L2) */
  reads_forget_locked(L, t);      /* after the release: the head asks no more than it must */
  return before - L->win_bytes;
}

int64_t ld_admit_drop_bytes_ahead_locked(mml_loader *L, int64_t after, int64_t want) {
  int64_t freed = 0;
  for (int64_t s = L->next_seq - 1; s > after && s >= L->head_seq; s--) {
    if (freed >= want) break;
    task *t = slot_of(L, s);
    if (t->seq == s && t->gen == L->gen && t->state == SLOT_PLANNED && t->dec != DEC_RUNNING &&
        !t->reread && rereadable(L, t))
      freed += drop_media_locked(L, t);
  }
  return freed;
}

/* R6: parked read t, asked back, gives back what its reads took and reads again from its
 * first media item: its charge asked now leaves the ledger (withdrawn, or given back), its
 * media bytes are freed and counted (which releases their grants), the ledger forgets the
 * grants (as READ AGAIN: nothing released twice, A6), and the sample's byte count loses
 * what it had read (its reads count them again). */
static void restart_parked_locked(mml_loader *L, task *t) {
  ld_admit_read_drop_locked(L, t);
  const int nmedia = t->rec.nimages + mml_record_frames(&t->rec);
  for (int i = 0; i < t->room_at && i < nmedia && i < t->imgs_cap; i++)
    if (!mml_is_data_uri(mml_record_media_ref(&t->rec, i))) t->sample.bytes -= t->imgs[i].len;
  for (int i = 0; i < media_items(t) && i < t->imgs_cap; i++) mml_bytes_free(&t->imgs[i]);
  ld_mem_count_task_locked(L, t); /* released: the head may be granted (L2) */
  reads_forget_locked(L, t);      /* after the release (as drop_media_locked) */
  t->room_at = 0;                 /* its next look runs it from the first item */
  if (t->restarted++) L->reads_restarted_again++;
  L->samples_reread++;
}

/* R6: whether parked read t, asked back, gives back what its reads took: at its first ask,
 * and again only once the ledger's head -- the earliest charge waiting, the one that asks
 * -- is before t and later in the stream than at t's last restart (t->restart_head, set
 * here).  A head later than before means work before it was granted since: progress, so
 * no livelock (with no bound MML_STRESS_SEED=539 livelocked: the same head asked the same
 * read again and again), and a sample restarts at most once per seq before it. */
static int may_restart_locked(mml_loader *L, task *t) {
  mml_ledger_stats s;
  mml_ledger_get_stats(L->ledger, &s);
  if (t->restarted && (s.head_seq < 0 || s.head_seq >= t->seq || s.head_seq <= t->restart_head))
    return 0;
  t->restart_head = s.head_seq;
  return 1;
}

static void read_revoke(void *arg) {
  /* L10, run by the ledger on any thread, mu held or not: never takes mu (ledger.c THREADS);
   * the ledger moved its change count, which wakes the workers (W4) */
  task *t = arg;
  atomic_store(&t->revoked, 1);
  atomic_store(&t->L->reads_revoked, 1);
  /* a worker that looked after the ledger's change and before these flags were set
   * waits on the change count: it must move again (ld_room_wake pokes while one looks or
   * waits; the ledger runs this after releasing its lock, so the poke may take it) */
  ld_room_wake(t->L);
}

int ld_admit_reads_settle_locked(mml_loader *L, task *t, int decode) {
  int asked = 0;
  for (int k = 0; k < t->nrc; k++) {
    mml_charge *c = &t->rc[k];
    if (!c->revocable) continue;
    if (mml_ledger_settle(L->ledger, c)) {
      c->revocable = 0; /* final: plain bytes of t->held */
    } else if (!decode || !rereadable(L, t)) {
      mml_ledger_keep(L->ledger, c); /* its bytes cannot be read again: kept (L10) */
      c->revocable = 0;
    } else {
      asked = 1;
    }
  }
  if (asked) { /* asked back before its decode began: its decode reads them again */
    drop_media_locked(L, t);
    return 0;
  }
  reads_rewind_locked(t);
  return 1;
}

void ld_admit_revoked_task_locked(mml_loader *L, task *t) {
  if (!atomic_load(&t->revoked) || !L->ledger) return;
  if (!t->nrc && !t->rch_on) { /* settled since its charge was asked back: nothing to give */
    atomic_store(&t->revoked, 0);
    return;
  }
  if (t->state == SLOT_PLANNED && t->dec != DEC_RUNNING) {
    if (!t->reread && rereadable(L, t))
      drop_media_locked(L, t); /* READ AGAIN: its decode reads them again */
    else
      ld_admit_reads_settle_locked(L, t, 0);
  } else if (t->state == SLOT_BUSY && t->room_at >= 0 && rereadable(L, t) && !t->pending &&
             !t->room_nremote && may_restart_locked(L, t)) {
    restart_parked_locked(L, t); /* R6: its next look reads it again from the first item */
  } else if (t->state == SLOT_BUSY && t->room_at >= 0) {
    /* parked, asked again by no later head than at its last restart (or not rereadable):
     * a grant its read has not taken yet goes back at once (it may be the one asked back;
     * the task asks anew when it runs on: ld_admit_parked_locked); the grants its reads
     * took are kept (restarts asked by the same head livelocked: R6) */
    if (t->rch_on && mml_ledger_state(L->ledger, LD_RCH(t)) == MML_CHARGE_GRANTED)
      ld_admit_read_drop_locked(L, t);
    ld_admit_reads_settle_locked(L, t, 0);
  } else if (t->state != SLOT_BUSY) { /* no decode will read them (a plan abandoned) */
    ld_admit_reads_settle_locked(L, t, 0);
  }
  /* else a worker runs it: looked at when it parks or finishes */
}

void ld_admit_revoked_locked(mml_loader *L) {
  if (!atomic_exchange(&L->reads_revoked, 0)) return;
  for (int i = 0; i < L->window; i++) ld_admit_revoked_task_locked(L, &L->tasks[i]);
}

/* T5: nothing but reads parked for room is in the engine (every task in flight is one),
 * nothing is queued for a worker that can run (ld_admit_parked_locked is looked at after
 * take_decode_locked found no queued decode that can start) and the consumer waits for a
 * batch with none to take: no work but those reads can let placement go on. */
static int only_parked_reads_run(const mml_loader *L) {
  return L->consumer_waiting && !L->out_count && !L->decoding && !L->emitting &&
         L->pend_head == L->pend_tail && !L->ready_head && L->in_flight == L->reads_parked;
}

/* R1: a read's grant is its bytes' charge until they are counted in held (read_cover);
 * a revocable one stays in the ledger, one of rc[0..nrc), until its decode begins (R5). */
static int read_granted(mml_loader *L, task *t, int64_t grow) {
  mml_charge *c = LD_RCH(t);
  t->rch_on = 0;
  if (c->revocable && c->state == MML_CHARGE_GRANTED)
    t->nrc++;
  else
    c->state = MML_CHARGE_IDLE, c->revocable = 0;
  t->read_cover += grow;
  L->read_extra += grow;
  return 1;
}

/* A read's charge leaves the ledger: withdrawn while it waits, given back once granted
 * (R4: a read parked and run again that no longer needs it -- a spare taken since holds
 * its bytes, or it failed -- and a task finishing with one). */
void ld_admit_read_drop_locked(mml_loader *L, task *t) {
  if (!t->rch_on) return;
  t->rch_on = 0;
  charge_leave_locked(L, LD_RCH(t)); /* R4 */
}

mml_status ld_admit_read_alone_locked(mml_loader *L, int64_t grow, mml_err *err) {
  mml_ledger_oom o; /* X1; unnamed (seq -1): the sample's error is prefixed with its name */
  mml_ledger_oom_now(L->ledger, -1, grow, 1, &o);
  o.what = "the buffer an image of the sample is read into";
  return mml_ledger_explain(L->ledger, &o, err);
}

int ld_admit_read_locked(mml_loader *L, task *t, int64_t grow) {
  if (!L->ledger || grow <= 0 || t->reread) return 1; /* a re-read: its grant covers it */
  if (t->rch_on) { /* R2: parked, and run again: its charge's answer */
    mml_charge *c = LD_RCH(t);
    const int s = mml_ledger_state(L->ledger, c);
    if (s == MML_CHARGE_GRANTED && c->bytes == grow) return read_granted(L, t, grow);
    if (s == MML_CHARGE_FAILED) { /* the deadlock rule (L7), or a shutdown */
      t->rch_on = 0;
      c->state = MML_CHARGE_IDLE;
      mml_err e;
      if (c->status == MML_ENOMEM)
        ld_set_fatal_locked(L, charge_oom_locked(L, c, 0, &e), &e); /* X1 */
      return 0;
    }
    ld_admit_read_drop_locked(L, t); /* another size now, or its plan abandoned: asked anew */
  }
  if (L->stop || L->fatal || t->gen != L->gen) return 0;
  /* R5: the charges stay in place while any is in the ledger */
  const int want = media_items(t) + 1;
  if (t->nrc >= t->rc_cap || (!t->nrc && t->rc_cap < want)) {
    if (t->nrc) ld_admit_reads_settle_locked(L, t, 0); /* all final: rc[] moves */
    mml_charge *rc = realloc(t->rc, (size_t)want * sizeof *rc);
    if (!rc) {
      mml_err e;
      mml_err_set(&e, MML_ENOMEM, "out of memory for a read's ledger charge");
      ld_set_fatal_locked(L, MML_ENOMEM, &e);
      return 0;
    }
    t->rc = rc;
    t->rc_cap = want;
  }
  /* R1: its size is known now: ONE charge at its seq, granted at once when nothing
   * earlier waits and it fits (the ledger's caches -- pooled pages, spare byte buffers --
   * make way inside it), else it WAITS in the ledger: later tries are refused meanwhile
   * (L1), and the task is parked (R2).  R5: revocable while its bytes can be read again
   * (no fetch of its stage pending, no video) */
  mml_charge *c = LD_RCH(t);
  memset(c, 0, sizeof *c);
  c->seq = t->seq;
  c->bytes = grow;
  /* R3: what it already holds (its media bytes so far, a spare taken for this item, its
   * reads' grants not counted yet) comes back only after this charge: L7 does not wait */
  c->own = t->held - t->held_fixed + t->read_cover;
  sample_name(L, &t->sample, c->name, sizeof c->name); /* X2 */
  c->what = "its media being read";
  if (rereadable(L, t) && !t->pending) {
    c->revocable = 1;
    c->revoke = read_revoke;
    c->wake_arg = t;
  }
  mml_err e;
  if (mml_ledger_request(L->ledger, c, &e)) {
    c->state = MML_CHARGE_IDLE; /* above max_memory alone (or shut down) */
    c->revocable = 0;
    return L->stop ? 0 : -2;
  }
  t->rch_on = 1;
  if (granted(L, c)) return read_granted(L, t, grow);
  /* room from later samples' bytes that can be read again (READ AGAIN: their decodes
   * come after this read's), as the head ticket's; their release grants it when it fits */
  if (make_way_locked(L, c, t->seq, grow) && granted(L, c)) return read_granted(L, t, grow);
  return -1;
}

void ld_admit_park_locked(mml_loader *L, task *t, int i, int nremote) {
  t->room_at = i;
  t->room_nremote = nremote;
  t->next_ready = L->room_head;
  L->room_head = t;
  L->reads_parked++;
  ld_room_gates_changed_locked(L);    /* W5, C2: T5 and C4 look at the reads parked */
  ld_admit_revoked_task_locked(L, t); /* R5: asked back while it read */
}

/* T6: the out-of-turn try (T5) of t, the earliest parked read, was refused: the read cannot
 * go on before the ticket's charge at the ledger's head, in turn or out of it.  Once per
 * head it gives back what its reads took (R6's restart: the head may fit without them);
 * else its wait is marked (t5_refused, until room comes back or a charge is withdrawn) and
 * the consumer, which may declare its wait now (C4), is poked. */
static void t5_refused_locked(mml_loader *L, task *t) {
  mml_ledger_stats s;
  mml_ledger_get_stats(L->ledger, &s);
  if (t->t5_head != s.head_seq && s.head_seq < t->seq &&
      t->held - t->held_fixed + t->read_cover > 0 && rereadable(L, t) && !t->pending &&
      !t->room_nremote) {
    t->t5_head = s.head_seq;
    restart_parked_locked(L, t); /* its next look reads it again, its charge anew */
    return;
  }
  const uint64_t seen = ld_admit_decode_events_locked(L);
  if (L->t5_refused == seen + 1 && L->t5_refused_seq == t->seq) return;
  L->t5_refused = seen + 1;
  L->t5_refused_seq = t->seq;
  ld_consumer_stale_locked(L); /* C4, C6: the engine may be idle now */
}

task *ld_admit_parked_locked(mml_loader *L, int *waiting) {
  *waiting = 0;
  task *first = NULL; /* the earliest still waiting */
  for (task **p = &L->room_head; *p;) {
    task *t = *p;
    if (!L->stop && !L->fatal && t->gen == L->gen &&
        mml_ledger_state(L->ledger, LD_RCH(t)) == MML_CHARGE_WAITING) {
      if (!first || t->seq < first->seq) first = t;
      p = &t->next_ready;
      continue;
    }
    /* granted or failed (its read takes the answer: ld_admit_read_locked), or no longer
     * wanted (its read fails at once and finish_task_locked drops it) */
    *p = t->next_ready;
    L->reads_parked--;
    t->resume_at = t->room_at; /* the worker's now: it reads on from there (task_run) */
    t->room_at = -1;
    return t;
  }
  if (!first) return NULL;
  *waiting = 1;
  /* room made for it, as the read's request made (C7: at the head, videos kept open ahead
   * and what can be read again after the needed ticket too) */
  if (make_way_locked(L, LD_RCH(first), first->seq, LD_RCH(first)->bytes)) return NULL;
  /* T5: nothing but reads runs and the consumer waits, so a ticket charge waiting in the
   * ledger cannot be granted before this read ends: L1 would only hold the read behind
   * it, and the read may be what lets placement shrink or close that ticket (mem_stuck):
   * it asks out of turn, before every waiting charge (a try at seq -1, settled).  Where no
   * ticket charge waits, the ledger's deadlock rule decides for the earliest read (C4) */
  if (!L->mem_blocked || !only_parked_reads_run(L)) return NULL;
  mml_charge c = {.seq = -1, .bytes = LD_RCH(first)->bytes};
  if (!mml_ledger_try(L->ledger, &c)) {
    t5_refused_locked(L, first); /* T6 */
    return NULL;
  }
  mml_charge *rc = LD_RCH(first);
  mml_ledger_withdraw(L->ledger, rc);
  if (mml_ledger_state(L->ledger, rc) == MML_CHARGE_GRANTED) {
    ld_ledger_release(L, c.bytes); /* granted in turn meanwhile: that grant is kept */
  } else { /* withdrawn: the try's grant is its charge now (settled: a try's) */
    rc->state = MML_CHARGE_GRANTED;
    rc->revocable = 0;
  }
  /* W5: granted by a try, which moves no change count: this look runs it (its next pass) */
  return ld_admit_parked_locked(L, waiting);
}

/* D1: its charge granted: the decode takes it (scratch_extra until it is given back). */
static int scratch_granted_locked(mml_loader *L, task *t, int64_t need) {
  t->sch_on = 0;
  t->sch.state = MML_CHARGE_IDLE;
  t->scratch_granted = t->scratch_need;
  t->reread_granted = need - t->scratch_need;
  L->scratch_extra += need;
  return 1;
}

/* D4: its charge failed (L7, or too large alone): the loader's error (X1). */
static void scratch_failed_locked(mml_loader *L, const mml_charge *c) {
  mml_err e;
  ld_set_fatal_locked(L, charge_oom_locked(L, c, 0, &e), &e);
}

/* D2: what makes way for a decode's charge that waits, at each look (make_way_locked).
 * 1 when it is granted now. */
static int scratch_make_way_locked(mml_loader *L, task *t, int64_t need) {
  return make_way_locked(L, &t->sch, t->seq, need) && granted(L, &t->sch);
}

/* D1: ONE charge at t's seq for its scratch and its re-read's bytes (`need`), asked once
 * its decode is queued (ld_admit_decode_queued_locked) or, given back since (D5), at a
 * worker's look: 1 when granted (now, or by the room `way` gave back), 0 when it waits or
 * failed (the loader's error set: D4). */
static int scratch_ask_locked(mml_loader *L, task *t, int64_t need,
                              int (*way)(mml_loader *, task *, int64_t)) {
  if (L->fatal || L->stop) return 0;
  mml_charge *c = &t->sch;
  /* granted at once when nothing before it waits and it fits (the caches it knows make way
   * inside it), else it WAITS: later tries are refused meanwhile (L1), the decode stays
   * queued and the workers go on (its grant moves the change count, L11).  Its sample's
   * media bytes come back only after it: its own (c->own), not waited for by L7 (D4) */
  memset(c, 0, sizeof *c);
  c->seq = t->seq;
  c->bytes = need;
  c->own = t->held - t->held_fixed + t->read_cover;
  sample_name(L, &t->sample, c->name, sizeof c->name); /* X2 */
  c->what = t->reread ? "its images' bytes (dropped for earlier work, read again) and the "
                        "decoder scratch its image needs"
                      : "the decoder scratch its image needs";
  mml_err e;
  const mml_status st = mml_ledger_request(L->ledger, c, &e);
  if (st) { /* above max_memory alone, failed at once by L7, or shut down */
    c->state = MML_CHARGE_IDLE;
    if (st == MML_ENOMEM) scratch_failed_locked(L, c);
    return 0;
  }
  t->sch_on = 1;
  if (granted(L, c) || way(L, t, need)) return 1;
  ld_consumer_stale_locked(L); /* C2, C6: a decode waits in the ledger: the engine may be idle */
  return 0;
}

static int64_t scratch_charge_bytes(const task *t) {
  return t->scratch_need + (t->reread ? t->reread_bytes : 0);
}

/* D1: what makes way for a decode's charge that waits when it is asked at its queueing:
 * the grants of later tickets not mapped yet (T4: one granted in the ledger's step that
 * granted t's ticket, before t's charge was asked), and no more: the decodes running give
 * theirs back by themselves, and READ AGAIN at each queueing re-read samples a decode
 * ending would have made room for (D2 makes way at the workers' looks). */
static int scratch_queued_way_locked(mml_loader *L, task *t, int64_t need) {
  (void)need;
  return tickets_give_back_locked(L, t->seq) > 0 && granted(L, &t->sch);
}

void ld_admit_decode_queued_locked(mml_loader *L, task *t) {
  /* D1: in the planner's critical section that gave t its last destination (the ticket's
   * mapping), so no later ticket's charge is asked before it */
  const int64_t need = scratch_charge_bytes(t);
  if (!L->ledger || need <= 0 || t->sch_on || t->dec != DEC_QUEUED) return;
  (void)scratch_ask_locked(L, t, need, scratch_queued_way_locked);
}

int ld_mem_scratch_take_locked(mml_loader *L, task *t) {
  const int64_t need = scratch_charge_bytes(t);
  if (!L->ledger || need <= 0) return 1;
  mml_charge *c = &t->sch;
  if (t->sch_on) { /* D1: asked at its queueing or an earlier look: the ledger's answer */
    const int s = mml_ledger_state(L->ledger, c);
    if (s == MML_CHARGE_GRANTED && c->bytes == need) return scratch_granted_locked(L, t, need);
    if (s == MML_CHARGE_FAILED) { /* the deadlock rule (L7), or a shutdown */
      t->sch_on = 0;
      c->state = MML_CHARGE_IDLE;
      if (c->status == MML_ENOMEM) scratch_failed_locked(L, c);
      return 0;
    }
    if (s == MML_CHARGE_WAITING && c->bytes == need && !L->fatal)
      return scratch_make_way_locked(L, t, need) ? scratch_granted_locked(L, t, need) : 0;
    ld_admit_scratch_drop_locked(L, t); /* another size now (read again since): asked anew */
  }
  return scratch_ask_locked(L, t, need, scratch_make_way_locked)
             ? scratch_granted_locked(L, t, need)
             : 0;
}

void ld_admit_scratch_drop_locked(mml_loader *L, task *t) {
  if (!t->sch_on) return;
  t->sch_on = 0;
  charge_leave_locked(L, &t->sch); /* D3 */
}

/* The oldest queued batch, the one ld_emit_job_locked emits next (NULL: none). */
static pend_item *emit_next_locked(mml_loader *L) {
  for (int64_t k = L->pend_head; k < L->pend_tail; k++) {
    pend_item *q = &L->pend[k % L->npend];
    if (q->state == PEND_QUEUED) return q;
  }
  return NULL;
}

/* E4: charge c of an expansion or an emission failed (L7, or too large alone): the
 * loader's error, the explainer's message (X1) -- its failure's parts when the ledger's
 * latest failure is c's, else the figures now -- with the consumer's split and, for compact
 * rows, the pixel_format that needs no expansion; an emission's unnamed (`named` 0: a whole
 * batch's, its slots are reused), an expansion's named after its ticket (X2). */
static void expand_failed_locked(mml_loader *L, const mml_charge *c, int named) {
  mml_ledger_oom o;
  if (!mml_ledger_oom_failed(L->ledger, &o) || o.seq != c->seq || o.need != c->bytes) {
    mml_ledger_oom_now(L->ledger, c->seq, c->bytes, c->bytes > L->cfg.max_memory, &o);
    snprintf(o.name, sizeof o.name, "%s", c->name);
    o.what = c->what;
  }
  if (!named) { /* not named by its seq (X1): "the batch the consumer waits for" says it */
    o.seq = -1;
    o.name[0] = 0;
  }
  char split[256], hint[160];
  oom_split_locked(L, &o, split, sizeof split);
  if (L->compact) { /* "release earlier batches" only where the consumer holds some */
    snprintf(hint, sizeof hint,
             "%sset pixel_format=\"%s\" (float rows written at decode: nothing to expand)",
             o.hint ? "" : "release earlier batches, or ", decode_name(L));
    o.hint = hint;
  }
  mml_err e;
  ld_set_fatal_locked(L, mml_ledger_explain(L->ledger, &o, &e), &e);
}

/* E3: the emission takes its grant (`need`) and its ticket's expansion (xcarry): ENGINE
 * credit until the pool's hook hands it over as its rows become live (emit_extra). */
static int64_t emit_takes_locked(mml_loader *L, pend_item *q, int64_t need) {
  const int64_t n = need + q->xcarry;
  q->xcarry = 0;
  L->emit_extra += n;
  return n;
}

int64_t ld_mem_emit_take_locked(mml_loader *L) {
  if (!L->cfg.max_memory) return 0;
  if (L->fatal) return -1;
  /* the oldest queued batch's, which ld_emit_job_locked emits: its float rows' pages (in
   * place: F - U bytes more) and its other tensors' buffers, all charged before the
   * emission maps them (the pool's hook finds them covered) */
  pend_item *q = emit_next_locked(L);
  if (!q || !L->ledger) return 0;
  const int64_t f = L->compact ? q->fpool - q->xcarry : 0; /* its ticket's expansion: E1 */
  const int64_t need = (f > 0 ? f : 0) + q->sneed;
  if (need <= 0) return emit_takes_locked(L, q, 0);
  const int asked = !q->charged;
  if (asked) { /* E1: ONE charge at its batch's first sample's seq, asked once */
    memset(&q->ch, 0, sizeof q->ch);
    q->ch.seq = q->seq;
    q->ch.bytes = need;
    q->ch.own = q->xcarry; /* E5 */
    q->ch.what =
        "the expanded pixel_values and other tensors of the batch the consumer "
        "waits for (its emission)"; /* X2 */
    mml_err e;
    const mml_status st = mml_ledger_request(L->ledger, &q->ch, &e);
    if (st) { /* above max_memory alone, failed at once by L7, or shut down */
      q->ch.state = MML_CHARGE_IDLE;
      if (st == MML_ENOMEM) expand_failed_locked(L, &q->ch, 0);
      return -1;
    }
    q->charged = 1;
  }
  int s = mml_ledger_state(L->ledger, &q->ch);
  if (s == MML_CHARGE_WAITING) { /* E2: the room it makes grants it when it fits (L2) */
    (void)make_way_locked(L, &q->ch, q->seq, need);
    s = mml_ledger_state(L->ledger, &q->ch);
  }
  if (s == MML_CHARGE_WAITING) {
    /* E4, C2: a queued emission whose charge waits is no work: the engine may be idle */
    if (asked) ld_consumer_stale_locked(L);
    return -1;
  }
  q->charged = 0;
  q->ch.state = MML_CHARGE_IDLE;
  if (s == MML_CHARGE_FAILED) { /* L7 (the consumer waits, nothing else can give room back) */
    if (q->ch.status == MML_ENOMEM) expand_failed_locked(L, &q->ch, 0);
    return -1;
  }
  return emit_takes_locked(L, q, need); /* E3: granted */
}

void ld_admit_emit_cancel_locked(mml_loader *L, pend_item *q) {
  if (q->xcarry) ld_ledger_release(L, q->xcarry); /* E3: its ticket's expansion */
  q->xcarry = 0;
  if (!q->charged || !L->ledger) return;
  q->charged = 0;
  charge_leave_locked(L, &q->ch); /* E3 */
}

void ld_mem_scratch_give_locked(mml_loader *L, task *t) {
  L->scratch_extra -= t->scratch_granted + t->reread_granted;
  ld_ledger_release(L, t->scratch_granted + t->reread_granted);
  t->scratch_granted = t->reread_granted = 0;
}

void ld_mem_count_task_locked(mml_loader *L, task *t) { ld_mem_count_task_cover_locked(L, t, 0); }

void ld_mem_count_task_cover_locked(mml_loader *L, task *t, int64_t cover) {
  cover += t->read_cover; /* charged before its bytes were read (ld_admit_read_locked) */
  L->read_extra -= t->read_cover;
  t->read_cover = 0;
  int64_t vheld = t->vhead_bytes + t->vpre_bytes; /* remote video bytes ahead of their use */
  for (int v = 0; v < t->vcap; v++) vheld += t->vhead[v].open_bytes; /* and videos kept open */
  /* the slot's own buffers, kept for its next sample: FIXED credit (ledger.c L7) */
  const int64_t fixed = (int64_t)(t->rec_bytes.cap + t->path.cap + t->pqrow.buf.cap);
  int64_t held = fixed + vheld;
  int64_t used = (int64_t)t->rec_bytes.len + vheld;
  for (int i = 0; i < t->imgs_cap; i++) held += (int64_t)t->imgs[i].cap;
  if (t->rec_parsed)
    for (int i = 0; i < media_items(t) && i < t->imgs_cap; i++) used += (int64_t)t->imgs[i].len;
  L->win_bytes += held - t->held;
  if (L->ledger && fixed > t->held_fixed)
    (void)mml_ledger_count_fixed(L->ledger, fixed - t->held_fixed);
  else if (L->ledger && fixed < t->held_fixed)
    mml_ledger_release(L->ledger, t->held_fixed - fixed, MML_HOLD_FIXED);
  /* the media bytes' growth is charged, beyond what `cover` (ENGINE credit granted for it:
   * a re-read's grant, a read's) already holds; what the cover does not use goes back
   * (nothing counted twice) */
  const int64_t media = held - fixed, was = t->held - t->held_fixed;
  const int64_t grow = media > was ? media - was : 0;
  const int64_t covered = grow < cover ? grow : cover;
  ld_ledger_count(L, grow - covered);
  ld_ledger_release(L, (media < was ? was - media : 0) + cover - covered);
  t->held = held;
  t->held_fixed = fixed;
  if (used > L->max_sample_bytes) L->max_sample_bytes = used;
}

/* ---- THE LEDGER ------------------------------------------------------------------------ */

/* The pool's changes (every allocation, growth, release and trim, on the thread that made
 * it, possibly under mu): its live bytes are batches' buffers -- the consumer's class
 * (a batch being built is the consumer's, L5; no engine reference outlives its entry into
 * the consumer's queue, A10) -- and what a release keeps mapped becomes the pooled pages'
 * cache. */
/* ENGINE credit already granted for the pool's next growths on this thread (an
 * emission's grant for its float rows: ld_ledger_cover_begin): the hook hands it over
 * instead of charging them again. */
static _Thread_local struct {
  mml_loader *L;
  int64_t bytes;
} pool_cover;

static void ledger_pool_hook(void *arg, int64_t d_live, int64_t d_cached) {
  mml_loader *L = arg;
  if (d_cached < 0) /* first: cached pages reused for an allocation are not counted twice */
    mml_ledger_cache_drop(L->ledger, L->led_pool, -d_cached);
  if (d_live > 0) {
    /* cached pages reused come back as live (their cache drop came first); the rest is
     * growth, paid for by what was charged before it on this thread (cover), else
     * charged now and counted as uncovered */
    const int64_t reused = d_cached < 0 ? (-d_cached < d_live ? -d_cached : d_live) : 0;
    int64_t covered = 0;
    if (pool_cover.L == L) {
      covered = d_live - reused < pool_cover.bytes ? d_live - reused : pool_cover.bytes;
      pool_cover.bytes -= covered;
    }
    const int64_t counted = d_live - covered; /* it happened: counted (ledger.c L13) */
    if (counted) (void)mml_ledger_count(L->ledger, -1, counted);
    if (counted > reused) atomic_fetch_add(&L->led_uncovered, counted - reused);
    mml_ledger_hand_over(L->ledger, d_live);
  } else if (d_live < 0) {
    const int64_t kept = d_cached > 0 ? (d_cached < -d_live ? d_cached : -d_live) : 0;
    mml_ledger_cache_put(L->ledger, L->led_pool, kept, MML_HOLD_CONSUMER);
    mml_ledger_release(L->ledger, -d_live - kept, MML_HOLD_CONSUMER);
    d_cached -= kept;
  }
  if (d_cached > 0) (void)mml_ledger_count(L->ledger, L->led_pool, d_cached);
  /* W1: a release (the consumer's batch: its buffers, the ledger's hand-back) or the cache
   * trimming itself gives room back; with or without mu held here, never taking it */
  if (d_live < 0 || (d_live == 0 && d_cached < 0)) ld_room_wake(L);
}

static int64_t ledger_pool_evict(void *arg, int64_t want) {
  return (int64_t)mml_pool_evict(((mml_loader *)arg)->pool, (size_t)want);
}

mml_status ld_ledger_open(mml_loader *L, mml_err *err) {
  if (!L->cfg.max_memory) return MML_OK;
  /* cap = max_memory: a try (ledger.c L12) is refused when it does not fit; what is
   * counted after it was taken (L13: the pool's hook, a task's byte buffers) is recorded
   * even past the cap, in the peak (memory_peak) and counted_over (A6, A8) */
  /* the deadlock rule's message (L7, L8) ends with how to hold less */
  const mml_ledger_cfg lc = {L->cfg.max_memory, NULL, NULL, "max_memory",
                             "or hold fewer batches: a `for batch in loader` loop keeps the "
                             "previous batch alive while it asks for the next (`del batch` at "
                             "the end of the loop body releases it)"};
  mml_status st = mml_ledger_new(&lc, &L->ledger, err);
  if (st) return st;
  L->led_pool = mml_ledger_add_cache(L->ledger, "pooled pages", ledger_pool_evict, L);
  L->led_spare = mml_ledger_add_cache(L->ledger, "spare byte buffers", ld_bytes_evict, L);
  /* the workers' scratch reserve: FIXED credit (ledger.c L7 does not wait for it) */
  (void)mml_ledger_count_fixed(L->ledger, scratch_bytes(L));
  mml_pool_set_hook(L->pool, ledger_pool_hook, L);
  return MML_OK;
}

void ld_ledger_start_locked(mml_loader *L) {
  /* the Parquet row groups' room, set aside while the reader is open: FIXED credit */
  if (L->ledger && ld_pq_reserved(L) > 0)
    (void)mml_ledger_count_fixed(L->ledger, ld_pq_reserved(L));
}

void ld_ledger_unhook(mml_loader *L) {
  if (L->ledger && L->pool) mml_pool_set_hook(L->pool, NULL, NULL);
}

void ld_ledger_free(mml_loader *L) {
  mml_ledger_free(L->ledger);
  L->ledger = NULL;
}

void ld_ledger_count(mml_loader *L, int64_t bytes) {
  /* counted past the cap if it must be (ledger.c L13): the ledger's caches (pooled pages,
   * spare byte buffers) make way first, as for a grant (a read's bytes past its estimate
   * beside the pool's cached pages were memory over the cap) */
  if (L->ledger && bytes > 0) (void)mml_ledger_count(L->ledger, -1, bytes);
}

void ld_ledger_cover_begin(mml_loader *L, int64_t bytes) {
  pool_cover.L = L->ledger ? L : NULL;
  pool_cover.bytes = bytes;
}

void ld_ledger_cover_end(mml_loader *L) {
  const int64_t left = pool_cover.L == L ? pool_cover.bytes : 0;
  pool_cover.L = NULL;
  pool_cover.bytes = 0;
  ld_ledger_release(L, left);
}

void ld_ledger_release(mml_loader *L, int64_t bytes) {
  if (!L->ledger) return;
  mml_ledger_release(L->ledger, bytes, MML_HOLD_ENGINE);
  if (bytes > 0) ld_room_wake(L); /* W1: a decode's scratch, a read's bytes, a grant's rest */
}

void ld_room_wake(mml_loader *L) {
  /* W1: no mu (a pool release may hold it or not).  A worker (W4) or the collator (W2)
   * counted after this load read its count after the event, so its look saw it; one
   * counted before it gets the poke, which changes the count it waits on */
  atomic_fetch_add(&L->room_events, 1);
  if (!L->ledger) return; /* no cap: nothing waits for room */
  if (atomic_load(&L->room_waiting_work) > 0) mml_ledger_poke(L->ledger);
  if (atomic_load(&L->room_waiting_coll) > 0) ld_coll_poke(L);
}

void ld_coll_poke(mml_loader *L) {
  pthread_mutex_lock(&L->coll_mu); /* W2: a leaf lock, taken from any thread */
  L->coll_events++;
  pthread_cond_broadcast(&L->coll_room_cv);
  pthread_mutex_unlock(&L->coll_mu);
}

uint64_t ld_coll_look_locked(mml_loader *L) {
  atomic_fetch_add(&L->room_waiting_coll, 1); /* W2: counted from before its look */
  pthread_mutex_lock(&L->coll_mu);
  const uint64_t seen = L->coll_events;
  pthread_mutex_unlock(&L->coll_mu);
  return seen;
}

void ld_coll_wait_locked(mml_loader *L, uint64_t seen, int room) {
  if (!room) { /* for work: every event of it signals coll_cv under mu */
    ld_coll_looked_locked(L);
    pthread_cond_wait(&L->coll_cv, &L->mu);
    return;
  }
  L->collator_room_waits++;
  L->coll_waits_room = 1;       /* W2: events under mu poke from here on */
  pthread_mutex_unlock(&L->mu); /* W2: on its own count, no bound */
  pthread_mutex_lock(&L->coll_mu);
  while (L->coll_events == seen) pthread_cond_wait(&L->coll_room_cv, &L->coll_mu);
  pthread_mutex_unlock(&L->coll_mu);
  pthread_mutex_lock(&L->mu);
  L->coll_waits_room = 0;
  ld_coll_looked_locked(L);
}

void ld_coll_looked_locked(mml_loader *L) { atomic_fetch_sub(&L->room_waiting_coll, 1); }

void ld_coll_wake_locked(mml_loader *L, int all) {
  if (all)
    pthread_cond_broadcast(&L->coll_cv);
  else
    pthread_cond_signal(&L->coll_cv);
  ld_coll_room_wake_locked(L);
}

void ld_coll_room_wake_locked(mml_loader *L) {
  /* W2: under mu, so before the collator's look (which sees it) or after its wait began */
  if (L->coll_waits_room) ld_coll_poke(L);
}

void ld_work_wake(mml_loader *L, int all) {
  if (L->ledger) { /* W4: the workers wait on the ledger's change count */
    mml_ledger_poke(L->ledger);
  } else if (all) {
    pthread_cond_broadcast(&L->work_cv);
  } else {
    pthread_cond_signal(&L->work_cv);
  }
}

uint64_t ld_work_look_locked(mml_loader *L) {
  return L->ledger ? mml_ledger_changes(L->ledger) : 0; /* W4: before the look */
}

void ld_work_wait_locked(mml_loader *L, uint64_t seen, int room) {
  if (room) L->room_waits++;
  if (!L->ledger) { /* no cap: no wait for room either */
    if (room)
      ld_wait_5ms(&L->work_cv, &L->mu);
    else
      pthread_cond_wait(&L->work_cv, &L->mu);
    return;
  }
  /* W5: no bound: every change a room gate reads pokes while a worker waits for room */
  L->room_waiters += room; /* W5: the gates' inputs poke only while one waits */
  pthread_mutex_unlock(&L->mu);
  mml_ledger_wait_change(L->ledger, seen);
  pthread_mutex_lock(&L->mu);
  L->room_waiters -= room;
}

void ld_room_gates_wake_workers_locked(mml_loader *L) {
  /* W5: under mu, as the waiter's count: a worker counted here may be past its look, and
   * the poke changes the count it waits on; one not counted looks after this change */
  if (L->ledger && L->room_waiters > 0) mml_ledger_poke(L->ledger);
}

void ld_room_gates_changed_locked(mml_loader *L) {
  ld_room_gates_wake_workers_locked(L);
  ld_consumer_stale_locked(L); /* C2: the engine may be idle now */
}

void ld_room_withdrawn_locked(mml_loader *L) {
  L->withdrawals++; /* T6: a read's out-of-turn try may be granted now */
  ld_room_gates_changed_locked(L);
}

uint64_t ld_admit_decode_events_locked(mml_loader *L) {
  return atomic_load(&L->room_events) + L->withdrawals;
}

void ld_consumer_wake_locked(mml_loader *L, int all) {
  /* C2: under mu, as consumer_waiting: a consumer waiting here read the count before its
   * look, so the poke makes it look again; one not waiting looks after this change */
  if (L->ledger && (all || L->consumer_waiting)) mml_ledger_consumer_poke(L->ledger);
}

void ld_consumer_stale_locked(mml_loader *L) {
  if (!L->ledger || !L->consumer_waiting) return; /* C2: under mu, as ld_consumer_wake_locked */
  ld_coll_room_wake_locked(L); /* W2: what keeps next() from declaring may be the collator's */
  if (ld_consumer_would_ask_locked(L)) /* C6: next() has an epoch to ask for */
    mml_ledger_consumer_poke(L->ledger);
  else { /* C6: only whether it may declare changed: woken where L7 can decide, judged with
          * what is behind the head now (C7) */
    mml_ledger_consumer_behind(L->ledger,
                               ld_admit_engine_idle_locked(L) ? ld_admit_behind_locked(L) : 0);
    mml_ledger_consumer_stale(L->ledger);
  }
}

/* D1: t's scratch charge waits in the ledger. */
static int scratch_waits(mml_loader *L, const task *t) {
  return t->sch_on && mml_ledger_state(L->ledger, &t->sch) == MML_CHARGE_WAITING;
}

/* D4: a queued decode's scratch charge waits at `seq`: the ledger's head may be it. */
static int scratch_waits_at(mml_loader *L, int64_t seq) {
  for (const task *t = L->dec_head; t; t = t->next_dec)
    if (t->seq == seq && t->gen == L->gen && scratch_waits(L, t)) return 1;
  return 0;
}

/* E4: the output pending holds nothing but queued emissions, the first of which waits in
 * the ledger for its charge: its seq (INT64_MAX: nothing pending), or -1 when some of it is
 * work (an emission running or not asked yet, an item ready to move). */
static int64_t emit_waits_locked(mml_loader *L) {
  if (L->pend_head == L->pend_tail) return INT64_MAX;
  if (L->emitting) return -1;
  for (int64_t k = L->pend_head; k < L->pend_tail; k++)
    if (L->pend[k % L->npend].state != PEND_QUEUED) return -1;
  const pend_item *q = &L->pend[L->pend_head % L->npend];
  return q->charged && mml_ledger_state(L->ledger, &q->ch) == MML_CHARGE_WAITING ? q->seq : -1;
}

/* C4, C7, E2: when the ledger's head (stats s) is a ticket's waiting expansion, the last sample
 * its batch waits for (expand_last_seq: its make-way keeps that sample's bytes); else -1. */
static int64_t head_expand_last_locked(mml_loader *L, const mml_ledger_stats *s) {
  for (int64_t id = L->tk_head; L->placing && L->tks && id <= L->tk_tail; id++) {
    ticket *k = tk_at(L, id);
    if (k->xon && k->xch.seq == s->head_seq && k->xch.bytes == s->head_need &&
        mml_ledger_state(L->ledger, &k->xch) == MML_CHARGE_WAITING)
      return expand_last_seq(L, id);
  }
  return -1;
}

/* C4: every task in flight is a read parked for room (R2) whose charge WAITS in the ledger,
 * and either an emission's or an expansion's charge waits at the ledger's head before them
 * (E4), or no ticket's charge waits and the earliest of those reads is the ledger's head,
 * or one waits (T5's case) and the earliest read's out-of-turn try was refused since room
 * last came back (T6): its seq (INT64_MAX: no task in flight), or -1 when some work in
 * flight is not such a read or it may still go on. */
static int64_t parked_reads_only_locked(mml_loader *L) {
  if (!L->in_flight) return INT64_MAX;
  if (L->in_flight != L->reads_parked || L->ready_head) return -1;
  int64_t first = INT64_MAX;
  for (const task *t = L->room_head; t; t = t->next_ready) {
    if (t->gen != L->gen || !t->rch_on ||
        mml_ledger_state(L->ledger, LD_RCH(t)) != MML_CHARGE_WAITING)
      return -1;
    if (t->seq < first) first = t->seq;
  }
  mml_ledger_stats s;
  mml_ledger_get_stats(L->ledger, &s);
  const int64_t e = emit_waits_locked(L); /* E4: a waiting emission heads them all */
  if (e >= 0 && e < INT64_MAX && s.head_seq == e) return first;
  /* E4: so does a waiting expansion before them (its rows final: they wait for it, L1;
   * without this, next() never declared and the stress test's seed 4102 hung) */
  if (s.head_seq >= 0 && s.head_seq < first && head_expand_last_locked(L, &s) >= 0) return first;
  if (!L->mem_blocked) /* the head: the earliest of them, or a decode's charge before it (D4) */
    return s.head_seq == first ||
                   (s.head_seq >= 0 && s.head_seq < first && scratch_waits_at(L, s.head_seq))
               ? first
               : -1;
  /* T6: a ticket's charge waits, and the earliest read's out-of-turn try was refused since
   * the last room event or withdrawal: that read can go on only after the head */
  return s.head_seq >= 0 && s.head_seq <= first && L->t5_refused_seq == first &&
                 L->t5_refused == ld_admit_decode_events_locked(L) + 1
             ? first
             : -1;
}

/* C5: a queued decode is work unless its scratch charge waits in the ledger (D1: the
 * ledger's own to decide); one that leaves the queue unrun (unplaced, or its plan
 * abandoned) is work: a worker's look. */
static int decodes_may_run_locked(mml_loader *L) {
  for (const task *t = L->dec_head; t; t = t->next_dec)
    if (t->gen != L->gen || !ld_place_has_dests(t) || !scratch_waits(L, t)) return 1;
  return 0;
}

/* C2: no work of the engine runs, or is queued, without ledger credit (an open pack's
 * bound aside: bound_waits_locked) -- no read in flight (its bytes are charged once their
 * size is known; the record's are the slot's FIXED credit) but reads parked whose charges
 * wait, the head's among them (C4: a waiting charge is the ledger's to decide), no sample
 * read that placement has yet to place (a text-only one holds nothing and may close or
 * shrink a ticket; placement stops at the first parked read) unless placement stopped for
 * the window or the epoch (place_held), no decode queued (but those waiting for room: C5)
 * or running, no sample done that the collator has yet to take or is adding (`collating`),
 * no batch handed off and not yet queued for the consumer, none queued for it -- and every
 * ticket charge that waits is the one the collator would ask now (C3).  1 then; 2 where the
 * batches handed off wait behind an emission whose charge waits at the ledger's head (E4:
 * the collator's state does not count); 0: work runs. */
static int engine_idle_but_bound_locked(mml_loader *L) {
  const int64_t parked = parked_reads_only_locked(L), emits = emit_waits_locked(L);
  if (parked < 0 || L->decoding || L->emitting || emits < 0 || L->out_count || L->fatal ||
      L->stop || decodes_may_run_locked(L))
    return 0;
  /* E4: an emission's charge waits at the ledger's head: what the collator does (take,
   * place, map, hand off) is behind it and gives nothing back before it */
  if (emits < INT64_MAX) return 2;
  if (L->collating || (L->placing && !L->place_held &&
                       L->place_seq < (parked < L->next_seq ? parked : L->next_seq)))
    return 0;
  /* the collator's next sample done: it takes it, unless its ticket waits for a buffer */
  const task *t = slot_of(L, L->head_seq);
  if (t->seq == L->head_seq && t->gen == L->gen && t->state == SLOT_DONE &&
      (!L->placing || ld_place_ready(L, t)))
    return 0;
  /* the first ticket charge that waits (the one L7 may fail: those behind it wait for it)
   * whose size the collator would ask anew is not the one to decide on; the collator's
   * next look asks again, which pokes (ld_admit_ticket_cancel_locked) */
  for (int64_t id = L->tk_head; L->placing && id <= L->tk_tail; id++)
    for (int p = 0; p < PLANES; p++) {
      const tk_plane *q = &tk_at(L, id)->pl[p];
      if (q->charged && mml_ledger_state(L->ledger, &q->ch) == MML_CHARGE_WAITING)
        return q->ch.seq == tk_at(L, id)->first_seq &&
               q->ch.bytes == ticket_charge_bytes(L, p, q->pending_rows);
    }
  return 1;
}

/* An open pack the consumer waits for waits for buffers of its bound: placement may still
 * ask less for it (its rows so far: loader_place.c mem_stuck); L7 failing the bound's
 * charge first raised an error where the rows fit (the stress test's seeds 79 and 314). */
static int bound_waits_locked(mml_loader *L) {
  for (int64_t id = L->tk_head; L->placing && id <= L->tk_tail && id <= ld_place_needed_ticket(L);
       id++)
    for (int p = 0; p < PLANES; p++) {
      const tk_plane *q = &tk_at(L, id)->pl[p];
      if (q->pending_rows > q->rows &&
          (q->buf ? q->rows > q->cap_rows : q->rows > 0)) /* loader_place.c rows_now */
        return 1;
    }
  return 0;
}

int ld_admit_engine_idle_locked(mml_loader *L) {
  const int idle = engine_idle_but_bound_locked(L);
  return idle == 2 || (idle && !bound_waits_locked(L)); /* 2: E4 (the consumer waits for it) */
}

/* A task's bytes held ahead of their use for its videos (loader_video.c): what
 * ld_release_videos_ahead_locked gives back. */
static int64_t task_video_bytes(const task *t) {
  int64_t n = t->vhead_bytes + t->vpre_bytes;
  for (int v = 0; v < t->vcap; v++) n += t->vhead[v].open_bytes;
  return n;
}

/* The last seq of the needed ticket (the one holding the collator's next sample), -1
 * when no ticket is open: what comes after it may make way for it (READ AGAIN). */
static int64_t needed_last_seq(mml_loader *L) {
  const int64_t h = L->tk_tail >= L->tk_head ? ld_place_needed_ticket(L) : L->tk_head;
  return L->tk_tail >= h ? (h < L->tk_tail ? tk_at(L, h + 1)->first_seq : L->place_seq) - 1 : -1;
}

/* D4: t's decode's charge is the ledger's head (stats s). */
static int is_scratch_head(mml_loader *L, const task *t, const mml_ledger_stats *s) {
  return t->seq == s->head_seq && t->gen == L->gen && t->dec == DEC_QUEUED &&
         t->sch.bytes == s->head_need && scratch_waits(L, t);
}

/* C7, E5: expansions' ENGINE credit comes back only as their batches' rows at emission:
 * behind the head -- tickets' grants and queued batches' carries, but the carry of an
 * emission whose charge is the head (its own; s NULL: all of it, X1). */
static int64_t expand_behind_locked(mml_loader *L, const mml_ledger_stats *s) {
  int64_t n = 0;
  for (int64_t id = L->tk_head; L->placing && L->tks && id <= L->tk_tail; id++) {
    ticket *k = tk_at(L, id);
    if (k->xon && mml_ledger_state(L->ledger, &k->xch) == MML_CHARGE_GRANTED) n += k->xch.bytes;
  }
  for (int64_t j = L->pend_head; L->pend && j < L->pend_tail; j++) {
    pend_item *q = &L->pend[j % L->npend];
    if (!(s && q->charged && q->seq == s->head_seq && q->ch.bytes == s->head_need &&
          mml_ledger_state(L->ledger, &q->ch) == MML_CHARGE_WAITING))
      n += q->xcarry;
  }
  return n;
}

int64_t ld_admit_behind_locked(mml_loader *L) {
  /* C7: nothing runs, so every slot's media bytes (a planned sample's, read and waiting for
   * its ticket's buffer; a parked read's taken ones; a waiting decode's, but the head's:
   * C5, D4) wait behind the head -- less what make-way gives back at the head's next look,
   * or before the planner's look ends for a ticket's (C8, make_way_locked; ld_place_locked:
   * videos kept open ahead (ld_video_ahead), the media bytes of samples after the needed
   * ticket and the head's charge -- an expansion's: the sample its batch waits for last,
   * E2 -- that can be read again) */
  /* the head's own task, a parked read's, is its charge's own credit (C4: mml_charge.own);
   * behind a ticket's charge a parked read's taken bytes are behind it (T6) */
  const int64_t parked = parked_reads_only_locked(L);
  mml_ledger_stats s;
  mml_ledger_get_stats(L->ledger, &s);
  int64_t last = needed_last_seq(L);
  const int64_t xl = head_expand_last_locked(L, &s); /* E2 makes way only after it */
  if (xl > last) last = xl;
  int64_t n = 0;
  for (int i = 0; L->tasks && i < L->window; i++) {
    const task *t = &L->tasks[i];
    if (t->seq == parked && t->gen == L->gen && parked == s.head_seq) continue;
    if (is_scratch_head(L, t, &s)) continue; /* its sample's bytes: its charge's own (D4) */
    int64_t b = t->held - t->held_fixed + t->read_cover; /* a parked read's taken grants */
    const int planned = t->gen == L->gen && t->state == SLOT_PLANNED && t->dec != DEC_RUNNING;
    if (planned && ld_video_ahead(L, t)) b -= task_video_bytes(t); /* C8 closes them */
    if (planned && t->seq > last && t->seq > s.head_seq && t->seq >= L->head_seq && !t->reread &&
        rereadable(L, t))
      b = 0; /* READ AGAIN (C8: after the head's charge too) */
    n += b;
  }
  return n + expand_behind_locked(L, &s);
}

int ld_admit_pack_bound_ok(const mml_loader *L, int64_t bytes) {
  return !L->cfg.max_memory || bytes <= L->cfg.max_memory / 4;
}

int ld_admit_decodes_in_order(const mml_loader *L) { return L->cfg.max_memory != 0; }

void ld_admit_bound_asked_locked(mml_loader *L) {
  ld_consumer_stale_locked(L); /* C2, C6: its wait may be declared now */
}

int ld_admit_bound_stuck_locked(mml_loader *L) {
  /* the state in which L7 would decide but for the bound: the consumer waits, nothing else
   * runs, and no ENGINE credit can come back but that of work behind the head (C7; a
   * revoked read's comes back, L10) */
  if (!L->ledger || !L->consumer_waiting || !bound_waits_locked(L) ||
      engine_idle_but_bound_locked(L) != 1)
    return 0;
  mml_ledger_stats s;
  mml_ledger_get_stats(L->ledger, &s);
  int64_t own = 0; /* a decode's charge at the head: its sample's bytes (D4) */
  for (const task *t = L->dec_head; t && !own; t = t->next_dec)
    if (is_scratch_head(L, t, &s)) own = t->sch.own;
  return s.held[MML_HOLD_ENGINE] <= ld_admit_behind_locked(L) + own && !s.revoking;
}

void ld_ledger_spare_put(mml_loader *L, int64_t bytes) {
  if (!L->ledger) return;
  mml_ledger_cache_put(L->ledger, L->led_spare, bytes, MML_HOLD_ENGINE);
  if (bytes > 0) ld_room_wake(L); /* W1: held bytes became an evictable cache */
}

void ld_ledger_spare_drop(mml_loader *L, int64_t bytes) {
  if (L->ledger) mml_ledger_cache_drop(L->ledger, L->led_spare, bytes);
}

void ld_ledger_queued_locked(mml_loader *L, const mml_batch *b) {
  /* A10: every reference to its buffers is one of its tensors' (the consumer's from here
   * on); a device stage holds its own while it copies, and has no ledger of its own here */
  if (!L->ledger || L->stage) return;
  for (int i = 0; i < b->ntensors; i++) {
    const mml_buf *x = b->tensors[i].buf;
    int views = 0;
    for (int j = 0; j < b->ntensors; j++) views += b->tensors[j].buf == x;
    if (x && mml_buf_refs(x) > views) {
      L->led_engine_refs++;
      return;
    }
  }
}

/* E3: the bytes of emissions' charges granted and not taken yet. */
static int64_t emit_grants_locked(mml_loader *L) {
  int64_t n = 0;
  for (int64_t k = L->pend_head; L->pend && k < L->pend_tail; k++) {
    pend_item *q = &L->pend[k % L->npend];
    if (q->charged && mml_ledger_state(L->ledger, &q->ch) == MML_CHARGE_GRANTED) n += q->ch.bytes;
  }
  return n;
}

mml_status ld_ledger_check_locked(mml_loader *L, mml_err *err) {
  if (!L->ledger) return MML_OK;
  size_t cached, live;
  mml_pool_usage(L->pool, &cached, &live);
  int64_t win = 0, spares = 0, scratch = 0, slots = 0, idle = 0;
  for (int i = 0; i < L->window; i++) {
    const task *t = &L->tasks[i];
    win += t->held;
    slots += t->held_fixed;
    scratch += t->scratch_granted + t->reread_granted;
    if (t->state == SLOT_EMPTY || t->state == SLOT_DONE) idle += t->held - t->held_fixed; /* A11 */
  }
  int64_t tickets = 0; /* charges granted, their buffers not mapped yet (T2) */
  for (int64_t id = L->tk_head; L->tks && id <= L->tk_tail; id++)
    for (int p = 0; p < PLANES; p++) {
      tk_plane *q = &tk_at(L, id)->pl[p];
      if (q->charged && mml_ledger_state(L->ledger, &q->ch) == MML_CHARGE_GRANTED)
        tickets += q->ch.bytes;
    }
  tickets += expand_behind_locked(L, NULL); /* expansions held (E1), carried ones too */
  int64_t reads = 0, sgrants = 0; /* reads' charges granted, not taken by their reads yet (R2) */
  for (int i = 0; L->tasks && i < L->window; i++) {
    task *t = &L->tasks[i];
    if (t->rch_on && mml_ledger_state(L->ledger, LD_RCH(t)) == MML_CHARGE_GRANTED)
      reads += LD_RCH(t)->bytes;
    if (t->sch_on && mml_ledger_state(L->ledger, &t->sch) == MML_CHARGE_GRANTED)
      sgrants += t->sch.bytes; /* D3: decodes' charges granted, not taken yet */
  }
  const int64_t emits = emit_grants_locked(L); /* not taken yet (E3) */
  pthread_mutex_lock(&L->spare_mu);
  for (int k = 0; k < L->nspare; k++) spares += (int64_t)L->spare[k].cap;
  const int64_t spare_bytes = L->spare_bytes;
  pthread_mutex_unlock(&L->spare_mu);
  const int64_t want = (int64_t)(live + cached) + win + spares + scratch_bytes(L) + scratch +
                       L->emit_extra + emits + L->read_extra + ld_pq_reserved(L) + tickets + reads +
                       sgrants;
  mml_ledger_stats s;
  mml_ledger_get_stats(L->ledger, &s);
  const int64_t have =
      s.held[MML_HOLD_ENGINE] + s.held[MML_HOLD_CONSUMER] + s.held[MML_HOLD_FIXED] + s.cached;
  const int64_t fixed = scratch_bytes(L) + ld_pq_reserved(L) + slots; /* C1 */
  const int64_t uncovered = atomic_load(&L->led_uncovered);
  if (uncovered)
    return mml_err_set(err, MML_EINTERNAL,
                       "the pool grew by %lld bytes that no charge made before the allocation "
                       "paid for (A7)",
                       (long long)uncovered);
  if (idle)
    return mml_err_set(err, MML_EINTERNAL,
                       "slots that no work holds (empty, or done and waiting for the collator) "
                       "hold %lld bytes of media: ENGINE credit that comes back only when the "
                       "slot is used again (A11)",
                       (long long)idle);
  if (L->led_engine_refs)
    return mml_err_set(err, MML_EINTERNAL,
                       "%lld batches were queued for the consumer while the engine still held "
                       "a reference to their buffers: CONSUMER credit the consumer did not "
                       "hold (A10)",
                       (long long)L->led_engine_refs);
  if (have == want && win == L->win_bytes && spares == spare_bytes && scratch == L->scratch_extra &&
      s.held[MML_HOLD_FIXED] == fixed)
    return MML_OK;
  return mml_err_set(
      err, MML_EINTERNAL,
      "the memory ledger holds %lld bytes (engine %lld, consumer %lld, fixed "
      "%lld of %lld, cached %lld) where the loader has %lld: pool live %zu + "
      "cached %zu, window %lld (counted %lld) + spares %lld, scratch reserve "
      "%lld + granted %lld (counted %lld) + decodes' grants not taken %lld, "
      "emissions %lld + granted %lld, Parquet room %lld, tickets %lld, reads %lld + "
      "granted %lld",
      (long long)have, (long long)s.held[MML_HOLD_ENGINE], (long long)s.held[MML_HOLD_CONSUMER],
      (long long)s.held[MML_HOLD_FIXED], (long long)fixed, (long long)s.cached, (long long)want,
      live, cached, (long long)win, (long long)L->win_bytes, (long long)spares,
      (long long)scratch_bytes(L), (long long)scratch, (long long)L->scratch_extra,
      (long long)sgrants, (long long)L->emit_extra, (long long)emits, (long long)ld_pq_reserved(L),
      (long long)tickets, (long long)L->read_extra, (long long)reads);
}

void ld_ledger_assert_quiet(mml_loader *L) {
#ifndef NDEBUG
  if (!L->ledger || !L->pool || !L->tasks) return;
  size_t cached, live;
  mml_pool_usage(L->pool, &cached, &live);
  if (live) return; /* a batch the consumer holds may be released meanwhile */
  mml_err e;
  const mml_status st = ld_ledger_check_locked(L, &e);
  if (st) fprintf(stderr, "mmloader: %s\n", e.msg);
  assert(st == MML_OK);
#else
  (void)L;
#endif
}

int64_t ld_ledger_peak(mml_loader *L) {
  if (!L->ledger) return 0;
  mml_ledger_stats s;
  mml_ledger_get_stats(L->ledger, &s);
  return s.peak;
}
