/*
 * ledger.c — one ordered byte ledger for a memory cap (implements mml/ledger.h).
 *
 * WHY.  A memory cap enforced by several gates, each guessing what earlier work will need
 * ("holds"), hangs when the guesses disagree: later work takes room that earlier work
 * needs, and every gate waits.  Here every byte the cap covers is one charge against one
 * budget, granted in stream order, so later work can never take room earlier work needs,
 * and no guess is needed.
 *
 * MODEL.  Credit is held by the ENGINE (work running) or for the CONSUMER (finished work
 * waiting for the stream: batches the consumer holds or will take), or is FIXED: set
 * aside for as long as its owner lives, which no work gives back while the consumer
 * waits (mml_ledger_count_fixed; the loader's: the workers' scratch reserve, held for the
 * loader's lifetime; the Parquet row groups' room, while the reader is open; each window
 * slot's record, path and Parquet-row buffers, kept for the slot's next sample -- but not
 * a slot's media bytes, which its decode gives back or moves into the spares -- or, its
 * plan abandoned, the slot's emptying does: loader_admit.c A11 -- nor the spares, a
 * cache).  Caches (pooled pages, spare buffers, preloads, open videos) are a second kind,
 * counted in the same budget but evictable: their owners free bytes on request.  A charge is (seq, bytes): seq is its place in the stream.  Waiting charges
 * form one list sorted by (seq, arrival); the first is the head.
 *
 * THREADS.  Any thread may call any function.  One mutex guards everything; blocking
 * acquires wait on one condition variable; asynchronous requests (a thread that must not
 * block, such as the loader's collation thread) get their wake callback, run after the
 * mutex is released, exactly once.  Lock order: ledger -> a cache's own lock (evict runs
 * under the ledger's lock); nobody calls into the ledger with a cache's lock held.
 *
 * INVARIANTS (tests/c/base/test-ledger.c cites them as L1..L14)
 *   L1. Grants are in stream order: a charge is granted only when no charge before it in
 *       (seq, arrival) order is waiting.
 *   L2. A charge waits only while one before it waits or it does not fit: every change
 *       that could let the head fit (release, hand-over, cache drop, withdraw, a new
 *       head) grants every charge that fits, in order, before the mutex is released.
 *   L3. Never above the cap: held (both holders) + cached <= cap after every grant and
 *       every cache growth; caches grow otherwise only by cache_put, which moves bytes
 *       already held.
 *   L4. Caches are reclaimed before anyone waits: when the head fits with caches evicted,
 *       they are evicted (in registration order) and it is granted; a charge waits only
 *       when held + need > cap.  A cache grows (cache_grow) only when no charge waits.
 *   L5. The callers' part: charges are requested in stream order (a unit of work asks
 *       for its bytes before any later unit asks), and ENGINE credit comes back or is
 *       handed over to the CONSUMER class by the work itself, without waiting for the
 *       stream; work that finished and waits for the stream holds CONSUMER credit.  So
 *       while the engine holds credit a waiting head is progress, not a deadlock, and
 *       CONSUMER credit belongs to work before the head.
 *   L6. Wakeups, no polling: each grant or failure of a waiting charge broadcasts the
 *       condition variable and runs its wake callback once, after the mutex is released;
 *       no charge waits with a timeout (mml_ledger_wait_change_for bounds only an
 *       owner's wait on the change count, L11, for its own stall rule).
 *   L7. The one deadlock rule: the head fails (MML_ENOMEM) when it does not fit, no
 *       ENGINE credit is held, and the consumer waits for the stream: only the consumer
 *       holds credit and it will not give any back (FIXED credit never comes back while
 *       it waits, so it is not waited for; nor is the head's own, c->own: ENGINE credit
 *       its owner holds that comes back only after the head is granted, such as the bytes
 *       a parked read already read).  ENGINE credit the owner declared as work BEHIND the
 *       head (mml_ledger_consumer_behind: work that can go on only after the head is
 *       granted, such as the bytes of the head batch's own samples, read and waiting for
 *       its buffer) is not waited for either, once nothing more can be asked back (L10:
 *       the head asks back first) and nothing asked back is still coming.  The consumer's
 *       wait holds from its
 *       declaration (made after it looked, under the lock its producers finish work
 *       under) to the next end of ENGINE work (hand-over, release, cache_put), which may
 *       be what it waits for, or the owner's next event: its look is stale, and it looks
 *       again and declares again when L14 wakes it.  mml_ledger_consumer_wait is that
 *       loop without a lost wakeup: the consumer reads mml_ledger_consumer_changes under
 *       its owner's lock before it looks, and declares only if the count has not moved
 *       since; every end of ENGINE work, every mml_ledger_consumer_poke (the owner's
 *       events for the consumer: a batch queued, an error, a close) and every
 *       mml_ledger_consumer_stale (the owner's events that change only whether it may
 *       declare: work started that holds no credit, work that may have left it idle) move
 *       it and end the declaration; a failure by this rule and the shutdown move it too.
 *       The owner declares only while none of its work runs without credit (work holding
 *       nothing -- a read whose size is not known, a sample done and not yet collated --
 *       ends by itself, and this rule cannot see it); a charge that waits is the ledger's
 *       own to decide (the loader's reads parked for room and ticket buffers:
 *       loader_admit.c C3, C4, C7).
 *   L8. One explainer composes every out-of-memory message: the work's name, its bytes,
 *       what the consumer holds, what is in flight and cached, and the cap that would fit.
 *   L9. Without a cap (0) every request is granted at once; counts are still kept.
 *  L10. Revocable grants of a later seq than the head are asked back, latest first and
 *       only as many as the head needs beyond what is already being given back, when it
 *       does not fit; their bytes stay ENGINE credit (L7 waits for them) until given
 *       back.  A settled grant is never asked back; one asked back that its owner
 *       cannot give back is kept (mml_ledger_keep: settled, and the head asks others),
 *       as is one whose bytes its owner released by itself (then keep moves no bytes).
 *  L11. No lost wakeup between the ledger and its owner's events: the change count
 *       (mml_ledger_changes) grows, under the mutex and with a broadcast, with every grant
 *       or failure of a waiting charge, every grant asked back, every poke and the
 *       shutdown, so a thread that read it before it looked for work and blocks in
 *       mml_ledger_wait_change wakes for anything that happened after it looked;
 *       mml_ledger_wait_change_for is the same wait for at most a given time (1 when the
 *       count changed, 0 when the time ran out).
 *  L12. A try (mml_ledger_try) is a request that may not wait: granted exactly when a
 *       request would be granted at once (nothing before it waits, and it fits with
 *       caches evicted), else refused with nothing queued and nothing held -- the answer
 *       "no room now" for callers that hold locks a waiter must not hold (the loader's mu).
 *       mml_ledger_room is the same answer without the grant (room for `bytes` now).
 *  L13. A count (mml_ledger_count) records bytes already taken (a pool growth seen by its
 *       hook, a buffer that grew): caches make way for it first (L4), then it is counted
 *       even past the cap, never refused and never queued.  L3 stays honest because a
 *       count is the only way past the cap and it is never hidden: the peak includes it
 *       and the stats count each count that left the total above the cap (counted_over,
 *       over_most), which the loader's memory_peak and the stress test report.  A caller
 *       that can ask before it takes uses a try, not a count.
 *  L14. The consumer is woken only where its answer can change: by its owner's poke (a
 *       batch queued, an error, a close), a failure by L7 and the shutdown, at once; by
 *       an end of ENGINE work or its owner's stale event only while the head does not
 *       fit and no ENGINE credit is held but its own (L7) -- the one state in which its declaration
 *       changes anything (L7) -- at that event or at the first grant step that finds that
 *       state after it (consumer_chance_locked, in step_locked: every change of the head,
 *       of ENGINE credit or of room runs it).  A consumer that looked after the last such
 *       event stays blocked (its look is current: nothing to look at again), one that
 *       looked before is woken once.  So next() wakes ~once a batch, not once per end of
 *       work (~20 a batch at a 176 MiB cap, which cost throughput: issue 33), and no
 *       wakeup is lost: an event between its look and its wait moved the count it passed.
 *
 * THE LOADER'S USE (the plan).  One ledger per loader with max_memory, cap = max_memory.
 * Today the ledger alone decides an emission's grant (M4) and a decode's scratch (M3), by
 * tries (L12) under the loader's mu; a ticket's buffer (M2, with its hold) and a read's
 * bytes once their size is known (M1, the task parked meanwhile) are requests that WAIT
 * in the ledger; the other admission
 * points keep their holds
 * (room kept for earlier work) added to the ledger's answer for room (mml_ledger_room);
 * what is recorded after it was taken (the pool's hook, a task's buffers) is counted
 * (L13): csrc/core/loader/loader_admit.c A6-A9 and THE LEDGER say what is charged, what
 * decides and how the stress test checks that it balances.  The plan: every admission
 * point becomes one charge at its stream seq that decides:
 *   M1. a read (ld_mem_may_read_locked): at dispatch (next_seq order, under mu: L5's
 *       order), for the bytes read; then t->held's growth at the same seq.  (Now: a
 *       waiting request at the read's seq once its size is known, the task parked while
 *       it waits, loader_admit.c R1-R4; the gate keeps its hold: step 2 (ii).)
 *   M2. a ticket plane's buffer (rebuffer, retry_pending): seq = the ticket's first
 *       sample; `earlier`, scratch_hold, expand_hold and mem_head_fails go (L1, L7).
 *       prefetch_full and decodes_ahead stay: they are turns, not bytes.  (Now: a
 *       waiting request of the buffer and its hold, step 3; `earlier` only for turns.)
 *   M3. a decode's scratch beyond the reserve (ld_mem_scratch_take_locked): seq = the
 *       sample's, released after its trim (done: a try, the ledger's answer alone);
 *       scratch_stuck goes (L7) with step 4.
 *   M4. an emission's float rows (ld_mem_emit_take_locked, fneed): seq = the batch's
 *       first sample (done: a try, the ledger's answer alone; G1 holds under max_memory
 *       and fbytes_hw is gone with G2's old rule); emit_stuck goes with step 4.
 *   M5. pooled pages: a cache through mml_pool_set_hook / mml_pool_evict (tested here);
 *       batches in the output queue or the consumer's are CONSUMER credit (hand-over when
 *       queued); next() waits by mml_ledger_consumer_wait (L7; step 4 (i)).
 *   M6. spare byte buffers (cap/8), remote video bytes ahead and videos kept open (cap/4,
 *       ld_mem_room_ahead_locked, batch_buf_peak): caches (cache_grow; evict =
 *       ld_bytes_free_spares, ld_release_videos_ahead_locked).
 * Two things the loader must do.  (a) L5 with parts: a sample's later parts (M3, its
 * growth past the estimate) can be blocked by reads of later samples granted before
 * them, whose credit returns only after their own later parts: so reads are revocable
 * charges (L10), settled when their decode begins; a revoked read frees its bytes and
 * the slot is read again (the loader's part exists without the ledger: loader_admit.c READ
 * AGAIN drops a planned sample's media bytes and its decode reads them again).  (b) Waking: a wake callback may run under mu (a pool
 * release under mu), so it must not take mu; workers wait with mml_ledger_wait after
 * dropping mu (nothing else to do), and the collation thread blocks only on the head
 * ticket's charge (withdrawn by a seek or close), looking at later tickets' charges when
 * it wakes for its own reasons (a decode done), so no wakeup can be lost.  A worker must
 * not block on a read's charge while decode or emission jobs may come for it (with one
 * worker the decode that frees the room would never run): it waits by L11 instead --
 * mml_ledger_changes read under mu before it looks for work, mml_ledger_wait_change after
 * dropping mu, and every place that queues work for the workers pokes.
 * What charging it in accounting form showed the flip must also do: (c) the spare byte
 * buffers were guarded by mu, and an evict callback runs under this ledger's lock, which
 * the loader takes under mu: they need a lock of their own before they can be an
 * evictable cache (done: loader_bytes.c B1-B3, registered with ld_bytes_evict).  (d) The
 * name callback (L8) runs on any thread under this lock: it must not read the loader's
 * task slots (today the loader passes none).  (e) Nothing may be charged twice: a
 * re-read's grant becomes the read's own charge again (done:
 * ld_mem_count_task_cover_locked), an emission's grant pays for the pool growth of its
 * float rows and small tensors (done: ld_ledger_cover_begin, the pool hook hands it
 * over), and a ticket's charge is what the pool maps (done: ld_admit_ticket_locked's grant,
 * made before the allocation and covering it; the hook counts cached pages an allocation
 * reuses as no growth, so they are not charged twice, and ld_mem_room_hold_locked has
 * trimmed the cache to what the charge leaves room for).
 *
 * THE FLIP'S ORDER (issue 33's; each step green on test-loader-stress.c's schedules, at
 * >= 1000 plain and 40 under each sanitizer, before the next).  Done before it: the spare
 * byte buffers under their own lock ((c)); nothing charged twice ((e)).
 *   1. The ledger gets cap = max_memory and every growth of the pool is covered by a
 *      charge made BEFORE the allocation.  Done (loader_admit.c A7): a ticket's buffer at
 *      its first sample's seq, an emission's float rows and its small tensors
 *      (mml_collator_emit_bytes) in its grant; the pool hook charging anything itself is
 *      an error S5 finds (none in 2000 schedules).  Also a read's image bytes are charged
 *      and mapped before the read, once its size is known (the capacity the buffer will
 *      have: ld_bytes_cap), after making room (spares, later samples' bytes read again),
 *      else waiting while the consumer or another worker's decode or emission can give
 *      room back (read_may_wait, 5 ms looks as the old gates), and failing with the
 *      explainer when nothing at all can (reads_stuck).  memory_peak above max_memory:
 *      0-2 of 1000 schedules (seeds 1-2000, at most +0.2%; 11 of 1000 before).
 *      (i) The cap itself: done.  The ledger has cap = max_memory; the callers that
 *      cannot wait (under mu) ask by a try (L12) or ask for room (mml_ledger_room), and
 *      what only records a growth that happened (the pool's hook, ld_mem_count_task, a
 *      read that goes ahead) is a count (L13: past the cap if it must, never hidden: the
 *      peak is memory_peak).  The ledger's answer ALONE decides the emission's grant (M4:
 *      ld_mem_emit_take_locked), a decode's scratch (M3: ld_mem_scratch_take_locked) and a
 *      read's bytes once its size is known (ld_admit_read_locked): each was the formula
 *      "held + need <= cap, caches trimmed", which the ledger's fits_locked is (A6 makes
 *      its held the formula's); 1000 schedules: 60 out of memory against 59 on the tree
 *      before, 0 failed, 1 over the cap.  With the emission's bytes the ledger's, the
 *      emission gate's max_memory rule (G2: two ahead, fbytes_hw) is gone: G1 (`prefetch`
 *      ahead) holds under a cap too (loader_collator.c; seeds 1-2000: 58 + 60 out of
 *      memory, 0 failed, 3 + 0 over, at most +0.1%).  A ticket plane's buffer (M2) is
 *      ticket_room's formula AND the ledger's try at the ticket's first sample's seq (the
 *      grant covers the pool's growth; 59, 0, 1).  Every "is there room" the remaining
 *      formulas ask (ld_mem_room_hold_locked: ticket_room, the read gate, bytes held
 *      ahead) is the ledger's answer for the bytes plus the gate's hold: the loader's own
 *      sum of its memory decides nothing now (loader_admit.c A9; 58, 0, 2).
 *      LEFT of (i): the HOLDS -- ticket_hold's (scratch_hold + expand_hold: inside the
 *      ticket's waiting charge since step 3), the read
 *      gate's (M1: ld_mem_may_read_locked: estimate x reads in flight, scratch, a batch
 *      buffer, an expansion) and those of bytes held ahead (M6: ld_mem_room_ahead_locked).
 *      They keep room for EARLIER work, which a try cannot do (nothing waits in the
 *      ledger, so L1 orders nothing): they go when charges can wait (steps 2-3).  The
 *      stall detectors (emit_stuck, scratch_stuck, reads_stuck, read_stuck,
 *      mem_head_fails) stay: L7 cannot replace them while the scratch reserve, the
 *      Parquet room and the window's bytes are ENGINE credit that does not come back
 *      while the consumer waits (held[ENGINE] is never 0) and a try is never the waiting
 *      head; step 4 needs those fixed charges in a class of their own and charges that
 *      wait.
 *      (ii) a read that only work queued for its own worker could make room for still went
 *      ahead over the cap (a count: the rest of the over-cap schedules): gone with step 2
 *      (ii), reads parked while their charges wait;
 *      (iii) a task's record and path buffers and the video bytes kept open are counted
 *      after they grow, not charged before.
 *      (iv) Waking: done (loader_admit.c W1-W3).  Every event that gives room back -- the
 *      consumer's release of a batch's buffers and the pooled pages trimming themselves
 *      (the pool's hook), every ENGINE credit released (a decode's scratch, a read's
 *      bytes, a grant's rest), a buffer moved into the spares, the spares freed --
 *      broadcasts work_cv and coll_cv while a thread waits for room there
 *      (ld_room_wake: it never takes mu, (b)); the stall detectors restart their count
 *      when room came back between two looks (room_events), so wakes never hasten them.
 *      Seeds 1-2000 beside the tree before it, same hour: 57 + 61 out of memory (64 + 59
 *      before), 0 failed, 2 + 1 over the cap (3 + 1 before).  LEFT: the waits keep
 *      their 5 ms bound (ld_wait_room_locked), for two reasons.  A release made without
 *      mu (the consumer's, on its own thread) can fall between a waiter's look under mu
 *      and its wait, and no broadcast made without mu can close that window (only a
 *      wait on a count the event changes under the waited-on lock can: L11, step 2).  And the stall
 *      detectors count looks (20, or 3 for mem_head_fails) with nothing running: with
 *      untimed waits and nothing giving room back, no look would come and the error
 *      (A3) would never be raised; they go with L7 (step 4).
 *   2. Reads become revocable charges at dispatch (M1 with L10); workers wait by L11
 *      (mml_ledger_changes read under mu before looking for work, mml_ledger_wait_change
 *      after dropping mu), never on a read's charge; every work_cv broadcast and pool
 *      release pokes (the pool release's and the other room events' call site is
 *      ld_room_wake, W1: it pokes the ledger there, and the waits lose their 5 ms bound).
 *      (i) The workers' waits by L11: done (loader_admit.c W4).  With a ledger every
 *      worker wait -- for work, for room to read, for a decode's scratch, for an
 *      emission's grant, a read's wait for its bytes -- reads mml_ledger_changes under mu
 *      before it looks (ld_work_look_locked) and waits on the change count after dropping
 *      mu (ld_work_wait_locked); everything that queued work or broadcast work_cv pokes
 *      instead (ld_work_wake), and so does every room event while a worker looks or waits
 *      (ld_room_wake; room_waiting_work counts workers from before their look), so W2's
 *      first reason -- a release made without mu falling between a look and the wait --
 *      is gone for the workers: such a release now wakes them at once.  The wait for
 *      work has no bound (it had none on work_cv either).  A wait for ROOM is unbounded
 *      too unless the consumer waits in next() with no batch to take and no decode or
 *      emission running (loader_admit.c W5: elsewhere no stall detector can fire, and
 *      every input of the room gates pokes when it changes; a 130 MiB cap with two
 *      batches held: 4-11 waits in 0.5 s against 111-216 with the bound).  LEFT: in that
 *      state a wait for room keeps its 5 ms bound (mml_ledger_wait_change_for), for two
 *      reasons.  (1) The stall detectors (read_stuck, reads_stuck -- gone with step 2 (iii)
 *      --, scratch_stuck, emit_stuck) still decide "nothing can give room back" by 20 looks with nothing
 *      running and no room event;
 *      L7 cannot decide it for them while the scratch reserve, the Parquet room and the
 *      window's bytes are ENGINE credit (held[ENGINE] never reaches 0) and no charge
 *      waits in the ledger (tries: none is ever the head), so an untimed wait with
 *      nothing giving room back would never look again: a hang instead of A3's error.
 *      (2) Some inputs of the detectors' own rules change without a poke (a ticket's
 *      place, placement's progress: head_final, mem_blocked, place_seq), and a look is
 *      what notices those while the consumer waits.  (1) needs reads that wait in the
 *      ledger (step (ii)) before L7 can run for them at all, and step 4's class for the
 *      fixed charges so that it can decide.
 *      (ii) Reads as charges that wait: done (loader_admit.c READS, R1-R5).  A
 *      read's bytes, once their size is known, are ONE request at the read's seq (it
 *      was a try in a loop of 5 ms looks): granted at once when nothing earlier waits and
 *      it fits, else it WAITS in the ledger, so every later try is refused meanwhile (L1)
 *      and later reads queue behind it.  The worker never blocks on it: the task is
 *      parked at the media item it reads (holding its slot, in flight) and the worker
 *      does other work; the grant moves the change count (L11), and a worker's look
 *      finds it granted and runs the task on (no wake callback needed: (b)).  What went,
 *      and why:
 *      - read_may_wait and its 5 ms looks: it decided whether the worker could afford
 *        to block (no work queued for it); a parked read blocks no worker.
 *      - the over-cap "read goes ahead" count (step 1 (ii)): it went ahead only because
 *        the worker waiting in the loop would have blocked the decode or emission queued
 *        for it; parked, that work runs, so a read is never counted past the cap.
 *      What stays, and why:
 *      - the read gate's hold (ld_mem_may_read_locked): the grants it keeps room for --
 *        a decode's scratch (M3), an emission's expansion (M4) -- are EARLIER in the
 *        stream but ask LATER in time than a later sample's read, so L5 does not hold
 *        for them and in-order grants cannot put them first (the reason ticket_hold
 *        stays, step 3).  It goes when those are charged at their stream place (step 4).
 *      - reads_stuck (R3, over the parked reads) and read_stuck (the gate's) stayed
 *        until (iii) below: L7 could not decide for them while the scratch reserve, the
 *        Parquet room and the window's bytes were ENGINE credit and next() did not
 *        declare its wait again after each end of ENGINE work (step 4 (i) did both), nor
 *        while a parked read kept what it had read.
 *      - T5 (the read asking out of turn when a ticket charge waits): the read's charge,
 *        in order behind that ticket's, would wait for it (L1) while the ticket may wait
 *        for this very read to be placed (mem_stuck).
 *      - READ AGAIN as the loader's own way to make room (ld_admit_drop_bytes_ahead_locked:
 *        a read that waits, a decode's scratch and an emission's try, the head ticket's
 *        make_way): tries are never the head, so L10 asks back nothing for them.
 *      Revocable (M1 with L10: loader_admit.c R5): a read whose bytes can be read again
 *      without the network asks revocably; its grant stays in the ledger until its
 *      decode begins (settled there).  A head that does not fit (a ticket's charge, an
 *      earlier read's) has the latest such grants asked back, only as many as it needs;
 *      the revoke callback flags the task (never mu: (b)) and a worker's look gives the
 *      bytes back (a planned sample's READ AGAIN; a parked read's grant not taken yet).
 *      One that cannot be given back -- fetched bytes since, no decode to read them
 *      again, what a parked read has read -- is kept (mml_ledger_keep, L10: the head
 *      asks the next).  Why the ledger asks, when READ AGAIN already made way for the
 *      waiters that look (make_way, a read's wait, a scratch or emission try): those
 *      looks reach only samples after the needed ticket and only when a look comes; the
 *      ledger sees every head that does not fit, at every step, and asks for exactly
 *      its shortfall -- the samples placed in the head ticket included, whose media
 *      bytes come back only after that ticket's buffer (L5 broken: L7 waits for them
 *      forever).  Revoked, they come back by themselves, which step 4 needs before L7
 *      can replace mem_head_fails.
 *      (iii) The reads' stall detectors replaced by L7: done (loader_admit.c R3, R6, C4,
 *      C5).  read_stuck and reads_stuck decided "nothing can give room back" by 20 looks
 *      (5 ms apart) with nothing running; they and their look counting are gone, and the
 *      ledger's deadlock rule decides where the head is the earliest parked read.  What
 *      it needed: (1) a parked read's bytes come back when asked: it gives back what its
 *      reads took and reads again from its first item, at its first ask and again only
 *      for a later head than at its last restart (R6: without a bound it livelocked,
 *      MML_STRESS_SEED=539; once per sample, a later head that needed the bytes of a read
 *      asked back twice waited for next()'s timeout); (2) a decode queued behind, waiting for
 *      room, is no engine work (C5) while no room came back and no waiting charge left
 *      since the look that refused it; (3) the collator's next sample being the parked
 *      read (or such a decode) lets the consumer declare although the batch it waits
 *      for has a buffer, the collator's add being work of its own (C4); (4) the read gate
 *      with nothing in flight lets the read go ahead instead of counting looks, so its
 *      charge can be the head.  T5 stays, asked on the first look (only_parked_reads_run).
 *      Seeds 1-2000 beside main 1e60b06 at the same hour: 56 + 63 out of memory (main 59
 *      + 65), 0 failed, 0 over the cap.
 *   3. The collation thread blocks only on the head ticket's charge.  Done in part
 *      (loader_admit.c T1-T3): a ticket plane's buffer is ONE request at the ticket's
 *      first sample's seq for its bytes and ticket_hold's room, which WAITS in the ledger
 *      when it does not fit (it was ticket_room's formula and a try), so that L1 refuses
 *      every later try meanwhile (reads, decodes' scratch, later emissions, video bytes
 *      ahead); its grant (or failure) wakes the collation thread (ticket_wake, never
 *      taking mu: (b)), which maps the buffer at its next look; granted, the hold goes
 *      back at once.  A seek, a rewind, a close (the ticket dropped) or a new size
 *      withdraws it, or gives back a grant not mapped yet; the charges of planes after
 *      it leave first (T3: a withdrawal grants what waits behind, and such a grant, not
 *      mapped while the earlier plane waits, held the room that plane needed: seeds 1-100
 *      gave 13-18 out of memory, 9 on main).  Earlier work that finds no room (an
 *      emission's try, a decode's scratch) takes back later tickets' grants not mapped
 *      yet (T4: the collation thread maps a grant at its next look, and it may be waiting
 *      for that very emission).  A read that finds no room while only reads run and the
 *      consumer waits asks out of turn when a ticket charge waits (T5: that charge
 *      cannot be granted first; 10 of 1000 schedules raised the read's error without).
 *      An emission's try (M4) is at its
 *      batch's own first sample (pend_item.seq), not the collator's next one, so no
 *      waiting ticket holds an earlier batch back.  next() declares the consumer's wait
 *      to the ledger (M5) under mu after it looked and withdraws it when the wait ends.
 *      What went, and why:
 *      - ticket_room (the formula beside the try): the request is the same question,
 *        asked once, and it can wait; its freeing of the spares is the ledger's eviction
 *        of that cache (L4).
 *      - `earlier` for ROOM: a ticket behind one whose charge waits asks the ledger,
 *        which queues it behind (L1).  It stays for TURNS: a ticket behind one that waits
 *        for its turn (prefetch_full, decodes_ahead: no charge) still waits.
 *      What stays, and why:
 *      - scratch_hold and expand_hold (ticket_hold), now inside the ticket's charge: the
 *        work they keep room for is EARLIER in the stream but asks LATER in time -- a
 *        decode's scratch when it begins (M3), an emission's float rows when it is
 *        emitted (M4), both after later tickets asked for their buffers -- so L5 does not
 *        hold for them and in-order grants cannot put them first.  They go when those
 *        are charged at their place before later tickets ask (a sample's scratch_need
 *        when it is placed, a batch's expansion when it is handed off).
 *      - the collator's 5 ms bound (ld_wait_room_locked, W2): the grant's wake runs
 *        without mu (on the thread that released room, holding mu or not), so it can
 *        fall between the collator's look and its wait; only a wait by L11 closes that
 *        (the collator waiting in mml_ledger_wait_change, and every event it also waits
 *        for -- a decode done, an item taken, a seek, a stop -- poking the ledger).
 *      - (gone with step 4 (ii)) mem_head_fails / ld_admit_head_stuck_locked: L7 cannot
 *        decide while the scratch
 *        reserve and the Parquet room are ENGINE credit (held[ENGINE] never reaches 0,
 *        step 1 (i)).  A ticket charge that FAILS (L7 once it can) already raises the
 *        explainer's message as the loader's error (ld_admit_ticket_locked); and L7 needs
 *        the consumer to declare again after each end of ENGINE work, which next() did
 *        not do then (it waited on out_cv, which no end of work signals; now it does:
 *        step 4 (i)).
 *      With this, a ticket's charge is the one loader charge that can be the waiting
 *      head (step 2 (i)'s "no charge waits" is no longer so): L7 will apply to it first.
 *      Beside main 4dc1b02 at the same hour (seeds 1-2000, 1000 plain each): 55 + 65-68
 *      out of memory (main 54-56 + 60-62), 0 failed, 0 + 1 over the cap (+0.3%; main
 *      1 + 0); every error "the batch the consumer waits for" but 2 of 2000.
 *   4. Delete the stall detectors (scratch_stuck, emit_stuck, mem_head_fails; read_stuck and
 *      reads_stuck went with step 2 (iii)) and the 5 ms polls (read_may_wait's went with step 2 (ii)), the
 *      holds and the gates the charges replaced; loader_place.c returns to placement only;
 *      the one explainer (L8) composes every out-of-memory message; the name callback (d).
 *      (i) What L7 needs to decide: done (loader_admit.c C1-C4).  The FIXED class: the
 *      workers' scratch reserve, the Parquet room and each slot's own record, path and
 *      Parquet-row buffers are FIXED credit (they come back only when the loader or the
 *      reader ends), so held[ENGINE] reaches 0 once no work holds bytes.  What does NOT
 *      qualify, and why: a slot's media bytes (its decode gives them back or moves them
 *      into the spares: work that ends by itself), the spares and pooled pages (caches,
 *      evicted before anyone waits), videos kept open or bytes held ahead (their decode
 *      or ld_release_videos_ahead_locked gives them back).  next() waits by
 *      mml_ledger_consumer_wait: the consumer's count read under mu before it looks,
 *      declared only when nothing ended since and no work of the engine runs without
 *      credit (ld_admit_engine_idle_locked); every end of ENGINE work and every event
 *      of the engine (a read started among them) ends the declaration, and it is woken
 *      where its answer can change (L14: its own events at once, the others only where
 *      L7 can decide for the head; at first every one of them woke it, ~20 a batch at a
 *      176 MiB cap, and that cost throughput under the tightest cap: loader_admit.c C6),
 *      so it declares again from a fresh look (no polling: the stress test's S6 bounds
 *      next()'s waits per batch, stats consumer_waits counts them; with next() waking
 *      itself it looped ~10^6 times a batch).  L7 now decides where the head is the earliest
 *      parked read's charge and nothing else runs (C4: reads parked since step 2 (ii)
 *      count in in_flight but wait in the ledger).  NOT for a ticket's charge: declared
 *      there too, L7 failed one where the batches fit (tests/test_video_files.py
 *      test_max_memory_counts_videos_kept_open, every run: 4 MiB of the pool's live
 *      bytes, which the pool's hook counts as CONSUMER credit, with nothing queued or
 *      handed off, no ticket's buffer mapped and the consumer holding nothing; earlier,
 *      11 of seeds 1001-2000 before the idle rule covered an open pack's bound).  The
 *      pool's live bytes must be split into the consumer's and the engine's before L7
 *      can decide for tickets.  (Found with step (ii): the 4 MiB were a batch's buffer that
 *      the consumer had released, held by the collator thread's reference to its last
 *      sample's destination through the hand-off's wait: loader_admit.c A10.)  A decode's scratch or an emission that finds no room
 *      while only parked reads are in flight is counted by scratch_stuck / emit_stuck (it
 *      hung before: seed 385, once in 1000 under load).  Seeds 1-2000 beside main at the
 *      same hour: see the commit.
 *      LEFT then (done since: (ii) below): mem_head_fails / ld_admit_head_stuck_locked,
 *      for the media bytes of samples placed in the needed ticket (ENGINE credit that
 *      comes back only after the head) and the declaration not made for tickets (the
 *      pool's live bytes above).  The workers' detectors (scratch_stuck, emit_stuck) and
 *      their 5 ms looks stay because their charges are tries (never the waiting head): a
 *      decode's scratch and an emission must become charges that wait at their seq (the
 *      task or the batch parked meanwhile, as reads are: R2) before L7 can decide for
 *      them, and the media bytes a waiting decode's own sample holds are ENGINE credit L7
 *      waits for although only that decode gives them back (they must then count apart,
 *      as credit held by the waiting charge itself, as mml_charge.own does for a parked
 *      read).  NEXT: (iii) scratch and emission charges that wait, for scratch_stuck and
 *      emit_stuck; then the holds, the one explainer.
 *      (ii) The pool's live bytes are the consumer's: done (loader_admit.c A10).  The
 *      hook's CONSUMER credit was every live byte; with nothing queued, handed off or
 *      mapped and the consumer holding nothing, 4 MiB stayed live: the collator thread's
 *      reference to the last sample's destination, kept through the hand-off, whose wait
 *      (one collator instance: for that batch's emission) can outlast the consumer's
 *      release of the batch.  It goes before the hand-off now, so no engine reference
 *      outlives a batch's entry into the consumer's queue, and every live byte is a
 *      mapped ticket's buffer, a batch handed off or queued, or the consumer's: CONSUMER
 *      credit (L5) without a split.  ld_ledger_queued_locked checks it at each queueing
 *      (S5 reports a batch queued with another reference: 13 in 20 schedules before).
 *      Then L7 for ticket charges: done (loader_admit.c C2, C3, C7).  The consumer
 *      declares its wait with no task in flight too, where the head is a ticket's charge,
 *      and mem_head_fails / ld_admit_head_stuck_locked and their 3 looks are gone: a
 *      ticket's charge that cannot fit fails by L7 with this file's explainer's message,
 *      after the sample's name and the split of the consumer's credit into the batches it
 *      holds and those built ahead of it (ld_admit_ticket_locked: only the loader can
 *      split it), and how to hold less (the hint).  L7 asks back first (L10) and fails
 *      only when nothing was asked back and nothing asked back is still coming.  What
 *      declaring for tickets showed L7 needed (each a hang of the stress test or of
 *      tests/test_video_files.py without it): the head batch's own samples' bytes (read,
 *      waiting for its buffer; the ledger asks back only later seqs) and a parked read's
 *      taken ones are ENGINE credit that comes back only after the head (slots emptied by
 *      a rebase kept theirs too, until loader_admit.c A11 gave them back):
 *      the owner declares them as behind it (mml_ledger_consumer_behind; C7), beside the
 *      head's own (mml_charge.own), and refreshes that count at each of its stale events
 *      so that L14's wake judges L7's state with it; a sample done whose ticket waits for
 *      its buffer is not work for the collator; samples read past where placement
 *      stopped for the window or the epoch (place_held) wait for the collator, behind the
 *      head, and placement stops at the epoch's end whatever the state of the next
 *      epoch's first sample (one parked until the consumer asks for its epoch,
 *      loader_video.c 2, held placement "being read" and the consumer never declared:
 *      tests/test_video_files.py
 *      test_max_memory_kept_batch_error_with_a_later_epochs_samples_parked); the
 *      collator adding a sample without mu (`collating`) is work; a waiting charge whose
 *      hold is stale is asked again before L7 decides on it; and an open pack waiting for
 *      its bound asks for its rows so far in exactly L7's state
 *      (ld_admit_bound_stuck_locked, no look counted).  Where nothing runs, what L7
 *      could not get back and waited for until next_timeout_s is counted behind the head
 *      (fetched media of planned samples, a waiting decode's own sample bytes, a later
 *      parked read's taken bytes: C7); and a ticket's charge at the head with a parked
 *      read behind it that kept its bytes (asked back twice by that head) and whose
 *      out-of-turn try cannot fit: the read gives them back once per head, then the
 *      consumer declares and they count behind the ticket (loader_admit.c T6, C4, C7;
 *      test-loader-stress.c loader_max_memory_parked_reads_asked_again_end, MML_STRESS_SEED
 *      32).  LEFT: for a parked read's charge, videos kept open ahead and media that can
 *      be read again after the needed ticket, which only the planner's make-way gives
 *      back, for a ticket's charge (C7); scratch_stuck and emit_stuck (their 20 looks: a
 *      decode's scratch and an emission are tries, never the waiting head; step (iii));
 *      the collator's 5 ms bound (W2).
 */
#include "mml/ledger.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct ledger_cache {
  const char *name;
  mml_ledger_evict_fn evict;
  void *arg;
  int64_t bytes;
} ledger_cache;

struct mml_ledger {
  pthread_mutex_t mu;
  pthread_cond_t cv;  /* blocking acquires (L6) */
  pthread_cond_t ccv; /* the consumer's wait (L7: mml_ledger_consumer_wait) */
  mml_ledger_cfg cfg;
  int64_t held[MML_HOLDERS];
  ledger_cache cache[MML_LEDGER_CACHES];
  int ncache;
  mml_charge *head, *tail;   /* waiting, in (seq, arrival) order */
  mml_charge *rhead, *rtail; /* granted revocable charges, in seq order (L10) */
  int64_t revoking;          /* their bytes asked back, not yet given back */
  int64_t nwaiting;
  int consumer_waiting, shut;
  mml_status fail_st; /* the first failure (mml_ledger_error) */
  mml_err fail_err;
  int64_t peak;
  uint64_t grants, waits, evicted, revoked;
  uint64_t tries_refused, counted_over; /* L12, L13 */
  int64_t over_most;                    /* L13: the most a count took the total over */
  uint64_t changes;                     /* L11 */
  uint64_t cons_changes; /* L7: what made the consumer's look stale (ends of ENGINE work, the
                            owner's events for it) */
  uint64_t cons_woken;   /* L7: cons_changes when the consumer was last woken: it blocks
                            while this is not past the count it looked at */
  int64_t cons_behind;   /* L7: ENGINE credit of work behind the head, as last declared */
  int cons_blocked;      /* the consumer blocks in mml_ledger_consumer_wait */
};

static int64_t cached_locked(const mml_ledger *g) {
  int64_t n = 0;
  for (int i = 0; i < g->ncache; i++) n += g->cache[i].bytes;
  return n;
}

/* Credit held by every class (ENGINE, CONSUMER, FIXED): what the cap holds beside caches. */
static int64_t held_locked(const mml_ledger *g) {
  return g->held[MML_HOLD_ENGINE] + g->held[MML_HOLD_CONSUMER] + g->held[MML_HOLD_FIXED];
}

static int64_t total_locked(const mml_ledger *g) { return held_locked(g) + cached_locked(g); }

static void note_peak_locked(mml_ledger *g) {
  const int64_t t = total_locked(g);
  if (t > g->peak) g->peak = t;
}

mml_status mml_ledger_new(const mml_ledger_cfg *cfg, mml_ledger **out, mml_err *err) {
  *out = NULL;
  if (cfg->cap < 0)
    return mml_err_set(err, MML_EINVAL, "%s=%lld: must be >= 0 (0: no cap)",
                       cfg->what ? cfg->what : "cap", (long long)cfg->cap);
  mml_ledger *g = calloc(1, sizeof *g);
  if (!g) return mml_err_set(err, MML_ENOMEM, "out of memory for the memory ledger");
  g->cfg = *cfg;
  if (!g->cfg.what) g->cfg.what = "max_memory";
  pthread_mutex_init(&g->mu, NULL);
  pthread_condattr_t ca; /* CLOCK_MONOTONIC: mml_ledger_wait_change_for's bound */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&g->cv, &ca);
  pthread_cond_init(&g->ccv, &ca);
  pthread_condattr_destroy(&ca);
  *out = g;
  return MML_OK;
}

void mml_ledger_free(mml_ledger *g) {
  if (!g) return;
  pthread_cond_destroy(&g->cv);
  pthread_cond_destroy(&g->ccv);
  pthread_mutex_destroy(&g->mu);
  free(g);
}

int mml_ledger_add_cache(mml_ledger *g, const char *name, mml_ledger_evict_fn evict, void *arg) {
  pthread_mutex_lock(&g->mu);
  int id = -1;
  if (g->ncache < MML_LEDGER_CACHES) {
    id = g->ncache++;
    g->cache[id] = (ledger_cache){name ? name : "cache", evict, arg, 0};
  }
  pthread_mutex_unlock(&g->mu);
  return id;
}

/* ---- the explainer (L8) ------------------------------------------------------------- */

/* The one out-of-memory message: `need` bytes of the work at `seq` cannot be held beside
 * what is held now; `rule` says why it never will be. */
static mml_status explain_locked(mml_ledger *g, int64_t seq, int64_t need, int alone,
                                 mml_err *err) {
  char name[256] = "";
  if (g->cfg.name) g->cfg.name(g->cfg.name_arg, seq, name, sizeof name);
  if (!name[0]) snprintf(name, sizeof name, "stream position %lld", (long long)seq);
  const int64_t cons = g->held[MML_HOLD_CONSUMER], eng = g->held[MML_HOLD_ENGINE];
  const int64_t fixed = g->held[MML_HOLD_FIXED];
  const int64_t fit = alone ? need + fixed : cons + eng + fixed + need;
  mml_err_set(err, MML_ENOMEM,
              "%s=%lld cannot hold the %lld bytes %s needs beside %lld bytes of finished "
              "work waiting for the consumer (batches it holds or has yet to take), %lld "
              "bytes of work running, %lld bytes set aside for the loader's lifetime and "
              "%lld bytes cached: %s >= %lld would hold it%s%s",
              g->cfg.what, (long long)g->cfg.cap, (long long)need, name, (long long)cons,
              (long long)eng, (long long)fixed, (long long)cached_locked(g), g->cfg.what,
              (long long)fit, !alone && g->cfg.hint ? "; " : "",
              !alone && g->cfg.hint ? g->cfg.hint : "");
  return MML_ENOMEM;
}

/* ---- the waiting list and the grant step (L1, L2, L4, L6, L7) ------------------------ */

static void unlink_locked(mml_ledger *g, mml_charge *c) {
  if (c->prev)
    c->prev->next = c->next;
  else
    g->head = c->next;
  if (c->next)
    c->next->prev = c->prev;
  else
    g->tail = c->prev;
  c->prev = c->next = NULL;
  g->nwaiting--;
}

/* Sorted insert: after every charge whose seq is <= c's (arrival breaks ties, L1). */
static void link_locked(mml_ledger *g, mml_charge *c) {
  mml_charge *after = g->tail;
  while (after && after->seq > c->seq) after = after->prev;
  c->prev = after;
  c->next = after ? after->next : g->head;
  if (c->next)
    c->next->prev = c;
  else
    g->tail = c;
  if (after)
    after->next = c;
  else
    g->head = c;
  g->nwaiting++;
}

/* Asks the caches (in registration order) for `over` bytes; returns what is still over. */
static int64_t evict_locked(mml_ledger *g, int64_t over) {
  for (int i = 0; i < g->ncache && over > 0; i++) {
    ledger_cache *k = &g->cache[i];
    if (k->bytes <= 0 || !k->evict) continue;
    /* what it freed is subtracted as is: a cache's count may dip below zero while an
     * owner's cache_put (made after its own lock is dropped) is on its way */
    const int64_t freed = k->evict(k->arg, over < k->bytes ? over : k->bytes);
    if (freed > 0) {
      k->bytes -= freed;
      over -= freed;
      g->evicted += (uint64_t)freed;
    }
  }
  return over;
}

/* 1 when `need` fits, evicting caches (in order) only when that makes it fit (L4). */
static int fits_locked(mml_ledger *g, int64_t need) {
  if (!g->cfg.cap) return 1;
  const int64_t held = held_locked(g);
  if (held + need > g->cfg.cap) return 0;
  return evict_locked(g, held + need + cached_locked(g) - g->cfg.cap) <= 0;
}

static void grant_locked(mml_ledger *g, mml_charge *c) {
  c->state = MML_CHARGE_GRANTED;
  g->held[MML_HOLD_ENGINE] += c->bytes;
  g->grants++;
  note_peak_locked(g);
  c->revoking = 0;
  c->rprev = c->rnext = NULL;
  if (!c->revocable) return;
  mml_charge *after = g->rtail; /* sorted by seq (L10: latest first) */
  while (after && after->seq > c->seq) after = after->rprev;
  c->rprev = after;
  c->rnext = after ? after->rnext : g->rhead;
  if (c->rnext)
    c->rnext->rprev = c;
  else
    g->rtail = c;
  if (after)
    after->rnext = c;
  else
    g->rhead = c;
}

static int revocable_linked(const mml_ledger *g, const mml_charge *c) {
  return c->rprev || c->rnext || g->rhead == c;
}

static void revocable_unlink(mml_ledger *g, mml_charge *c) {
  if (!revocable_linked(g, c)) return;
  if (c->rprev)
    c->rprev->rnext = c->rnext;
  else
    g->rhead = c->rnext;
  if (c->rnext)
    c->rnext->rprev = c->rprev;
  else
    g->rtail = c->rprev;
  c->rprev = c->rnext = NULL;
}

static void fail_locked(mml_ledger *g, mml_charge *c, mml_status st, const mml_err *e) {
  c->state = MML_CHARGE_FAILED;
  c->status = st;
  if (st == MML_ENOMEM) {
    g->fail_st = st;
    g->fail_err = *e;
  }
}

/* The wake callbacks of charges granted or failed, copied under the mutex (the charge
 * may be gone once its owner sees its state) and run after it is released (L6). */
enum { WAKE_BATCH = 32 };
typedef struct wake_list {
  int n;
  mml_charge_wake_fn fn[WAKE_BATCH];
  void *arg[WAKE_BATCH];
} wake_list;

static void woke_locked(mml_charge *c, wake_list *w) {
  if (!c->wake) return;
  w->fn[w->n] = c->wake;
  w->arg[w->n++] = c->wake_arg;
}

static void wake_run(const wake_list *w) {
  for (int i = 0; i < w->n; i++) w->fn[i](w->arg[i]);
}

/* The head does not fit: revocable grants of later seqs are asked back, latest first,
 * until what is being given back makes room for it (L10). */
static void revoke_locked(mml_ledger *g, const mml_charge *head, wake_list *w) {
  int64_t short_by = held_locked(g) - g->revoking + head->bytes - g->cfg.cap;
  for (mml_charge *r = g->rtail; r && short_by > 0 && r->seq > head->seq && w->n < WAKE_BATCH;
       r = r->rprev) {
    if (r->revoking) continue;
    r->revoking = 1;
    g->revoking += r->bytes;
    g->revoked++;
    g->changes++; /* L11 (step_locked broadcasts when it asked any back) */
    short_by -= r->bytes;
    if (r->revoke) {
      w->fn[w->n] = r->revoke;
      w->arg[w->n++] = r->wake_arg;
    }
  }
}

/* ---- the consumer's wait (L7) ---------------------------------------------------------
 * What the consumer's wait decides, beside its owner's events (a batch, an error, a
 * close: mml_ledger_consumer_poke), is whether to declare, and a declaration changes
 * anything only where L7 can fail the head: a head that does not fit with no ENGINE
 * credit held.  So an event that only makes its look stale (an end of ENGINE work, the
 * owner's mml_ledger_consumer_stale) ends the declaration and moves cons_changes, and the
 * consumer is woken for it only once the grant step finds that head (consumer_chance_locked). */

/* The consumer looks again now: its owner's event, the shutdown or L7's failure (which
 * keeps the declaration: the consumer still waits, and the next head is L7's too). */
static void consumer_wake_locked(mml_ledger *g) {
  g->cons_changes++;
  g->cons_woken = g->cons_changes;
  if (g->cons_blocked) pthread_cond_broadcast(&g->ccv);
}

/* The consumer's look is stale: its declaration ends, and it is woken when L7 can decide.
 * L7: every end of ENGINE work (a release, a grant given back, a hand-over, a cache_put of
 * the engine's) may be what the consumer waits for; the grant step that follows wakes it
 * if L7 can decide for the head. */
static void consumer_stale_locked(mml_ledger *g) {
  g->consumer_waiting = 0;
  g->cons_changes++;
}

/* No ENGINE credit is held but head c's own (c->own) and that of the work the owner
 * declared behind the head (cons_behind): L7's case, where c does not fit and nothing more
 * can be asked back. */
static int no_engine_but_own_locked(const mml_ledger *g, const mml_charge *c) {
  return g->held[MML_HOLD_ENGINE] <= c->own + g->cons_behind;
}

/* The head does not fit and no ENGINE credit is held: a consumer whose look is older
 * than the latest stale-making event looks again (one that looked since stays blocked:
 * its wait ends only once cons_woken is past the count it read). */
static void consumer_chance_locked(mml_ledger *g) {
  if (g->cons_woken == g->cons_changes) return;
  g->cons_woken = g->cons_changes;
  if (g->cons_blocked) pthread_cond_broadcast(&g->ccv);
}

/* Grants waiting charges in order while the head fits; applies the deadlock rule to a
 * head that does not.  Returns 1 when it stopped with `w` full (more may be grantable:
 * the caller runs `w` and steps again). */
static int step_locked(mml_ledger *g, wake_list *w) {
  int changed = 0;
  while (g->head && w->n < WAKE_BATCH) {
    mml_charge *c = g->head;
    if (fits_locked(g, c->bytes)) {
      unlink_locked(g, c);
      grant_locked(g, c);
    } else {
      const uint64_t before = g->changes;
      revoke_locked(g, c, w); /* L10 first: what is asked back may let it fit */
      const int asked = g->changes != before || g->revoking;
      if (asked || !g->consumer_waiting || !no_engine_but_own_locked(g, c)) {
        /* L7 would decide for this head if the consumer declared: one whose look is stale
         * looks again (and declares if nothing of its owner runs without credit) */
        if (!asked && no_engine_but_own_locked(g, c)) consumer_chance_locked(g);
        changed |= g->changes != before;
        break;
      }
      mml_err e; /* L7: only the consumer holds credit, and work behind the head */
      explain_locked(g, c->seq, c->bytes, 0, &e);
      unlink_locked(g, c);
      fail_locked(g, c, MML_ENOMEM, &e);
      consumer_wake_locked(g); /* the consumer's wait ends: the stream ends in this error */
    }
    woke_locked(c, w);
    g->changes++; /* L11 */
    changed = 1;
  }
  if (changed) pthread_cond_broadcast(&g->cv);
  return g->head && w->n == WAKE_BATCH;
}

/* Runs the grant step after a change, then the callbacks after the unlock. */
static void step_and_unlock(mml_ledger *g) {
  for (;;) {
    wake_list w;
    w.n = 0;
    const int more = step_locked(g, &w);
    pthread_mutex_unlock(&g->mu);
    wake_run(&w);
    if (!more) return;
    pthread_mutex_lock(&g->mu);
  }
}

/* ---- requests ------------------------------------------------------------------------ */

static mml_status request_locked(mml_ledger *g, mml_charge *c, mml_err *err) {
  c->prev = c->next = NULL;
  c->status = MML_OK;
  if (g->shut) {
    c->state = MML_CHARGE_FAILED;
    c->status = MML_ECANCELLED;
    return mml_err_set(err, MML_ECANCELLED, "the memory ledger is shut down (closed)");
  }
  if (c->bytes < 0) c->bytes = 0;
  if (g->cfg.cap && c->bytes > g->cfg.cap) {
    mml_err e;
    explain_locked(g, c->seq, c->bytes, 1, &e);
    fail_locked(g, c, MML_ENOMEM, &e);
    if (err) *err = e;
    return MML_ENOMEM;
  }
  /* granted at once only with nothing before it waiting (L1) */
  if ((!g->head || g->head->seq > c->seq) && fits_locked(g, c->bytes)) {
    grant_locked(g, c);
    return MML_OK;
  }
  c->state = MML_CHARGE_WAITING;
  g->waits++;
  link_locked(g, c);
  return MML_OK;
}

/* A charge that failed: its status and message. */
static mml_status failed_locked(mml_ledger *g, const mml_charge *c, mml_err *err) {
  if (c->status == MML_ENOMEM && err)
    *err = g->fail_err;
  else
    mml_err_set(err, c->status, "the memory ledger is shut down (closed)");
  return c->status;
}

/* Queues c and, when it waits, runs the grant step without c's own wake (the caller
 * sees the state it returns with); the mutex is held on return. */
static mml_status request_step_locked(mml_ledger *g, mml_charge *c, mml_err *err) {
  mml_status st = request_locked(g, c, err);
  if (st || c->state != MML_CHARGE_WAITING) return st;
  /* it may be the head now: the deadlock rule applies to it at once (L7) */
  const mml_charge_wake_fn wake = c->wake;
  c->wake = NULL;
  for (;;) {
    wake_list w;
    w.n = 0;
    const int more = step_locked(g, &w);
    if (!w.n && !more) break;
    pthread_mutex_unlock(&g->mu);
    wake_run(&w);
    pthread_mutex_lock(&g->mu);
    if (!more) break;
  }
  c->wake = wake;
  return c->state == MML_CHARGE_FAILED ? failed_locked(g, c, err) : MML_OK;
}

mml_status mml_ledger_request(mml_ledger *g, mml_charge *c, mml_err *err) {
  pthread_mutex_lock(&g->mu);
  mml_status st = request_step_locked(g, c, err);
  pthread_mutex_unlock(&g->mu);
  return st;
}

static mml_status wait_locked(mml_ledger *g, mml_charge *c, mml_err *err) {
  while (c->state == MML_CHARGE_WAITING) pthread_cond_wait(&g->cv, &g->mu);
  return c->state == MML_CHARGE_FAILED ? failed_locked(g, c, err) : MML_OK;
}

mml_status mml_ledger_acquire(mml_ledger *g, mml_charge *c, mml_err *err) {
  pthread_mutex_lock(&g->mu);
  const mml_charge_wake_fn wake = c->wake;
  c->wake = NULL; /* the condition variable wakes this thread */
  mml_status st = request_step_locked(g, c, err);
  if (!st) st = wait_locked(g, c, err);
  c->wake = wake;
  pthread_mutex_unlock(&g->mu);
  return st;
}

mml_status mml_ledger_wait(mml_ledger *g, mml_charge *c, mml_err *err) {
  pthread_mutex_lock(&g->mu);
  mml_status st = c->state == MML_CHARGE_IDLE ? MML_EINVAL : wait_locked(g, c, err);
  pthread_mutex_unlock(&g->mu);
  if (st == MML_EINVAL) mml_err_set(err, st, "mml_ledger_wait: the charge was not requested");
  return st;
}

/* L12 under the lock, which it releases: whether `bytes` at `seq` is granted at once
 * (nothing earlier waits; it fits, caches evicted), and then grants c when c is given. */
static int at_once_unlock(mml_ledger *g, int64_t seq, int64_t bytes, mml_charge *c) {
  const int turn = !g->shut && (!g->head || g->head->seq > seq);
  if (turn && fits_locked(g, bytes)) {
    if (c) {
      c->revocable = 0; /* a try's grant is settled */
      grant_locked(g, c);
    }
    pthread_mutex_unlock(&g->mu);
    return 1;
  }
  if (c) {
    c->state = MML_CHARGE_IDLE;
    g->tries_refused++;
  }
  if (!turn) {
    pthread_mutex_unlock(&g->mu);
    return 0;
  }
  step_and_unlock(g); /* caches it evicted may let a later head fit (L2) */
  return 0;
}

int mml_ledger_try(mml_ledger *g, mml_charge *c) {
  pthread_mutex_lock(&g->mu);
  c->prev = c->next = NULL;
  c->status = MML_OK;
  if (c->bytes < 0) c->bytes = 0;
  /* L12: what a request granted at once, nothing else: no turn taken, nothing queued */
  return at_once_unlock(g, c->seq, c->bytes, c);
}

int mml_ledger_room(mml_ledger *g, int64_t seq, int64_t bytes) {
  if (bytes < 0) bytes = 0;
  pthread_mutex_lock(&g->mu);
  return at_once_unlock(g, seq, bytes, NULL); /* L12's answer without the grant */
}

int64_t mml_ledger_count(mml_ledger *g, int id, int64_t bytes) {
  if (bytes <= 0) return 0;
  pthread_mutex_lock(&g->mu);
  if (id >= g->ncache) {
    pthread_mutex_unlock(&g->mu);
    return 0;
  }
  /* L13: caches make way first (as much as they can: L4), then it is counted */
  if (id < 0 && g->cfg.cap) (void)evict_locked(g, total_locked(g) + bytes - g->cfg.cap);
  if (id < 0)
    g->held[MML_HOLD_ENGINE] += bytes;
  else
    g->cache[id].bytes += bytes;
  note_peak_locked(g);
  const int64_t over = g->cfg.cap ? total_locked(g) - g->cfg.cap : 0;
  if (over > 0) {
    g->counted_over++;
    if (over > g->over_most) g->over_most = over;
  }
  pthread_mutex_unlock(&g->mu);
  return over > 0 ? over : 0;
}

void mml_ledger_withdraw(mml_ledger *g, mml_charge *c) {
  pthread_mutex_lock(&g->mu);
  if (c->state != MML_CHARGE_WAITING) {
    pthread_mutex_unlock(&g->mu);
    return;
  }
  unlink_locked(g, c);
  c->state = MML_CHARGE_IDLE;
  step_and_unlock(g); /* the next one may be the head now */
}

int mml_ledger_state(mml_ledger *g, const mml_charge *c) {
  pthread_mutex_lock(&g->mu);
  const int s = c->state;
  pthread_mutex_unlock(&g->mu);
  return s;
}

/* ---- releases, caches, the consumer ------------------------------------------------- */

void mml_ledger_release(mml_ledger *g, int64_t bytes, int holder) {
  if (bytes <= 0 || holder < 0 || holder >= MML_HOLDERS) return;
  pthread_mutex_lock(&g->mu);
  g->held[holder] -= bytes;
  if (holder == MML_HOLD_ENGINE) consumer_stale_locked(g); /* L7: work ended */
  step_and_unlock(g);
}

int64_t mml_ledger_count_fixed(mml_ledger *g, int64_t bytes) {
  if (bytes <= 0) return 0;
  pthread_mutex_lock(&g->mu);
  /* L13's count, in the FIXED class (L7 does not wait for it: it never comes back while
   * the consumer waits): caches make way first, then it is counted even past the cap */
  if (g->cfg.cap) (void)evict_locked(g, total_locked(g) + bytes - g->cfg.cap);
  g->held[MML_HOLD_FIXED] += bytes;
  note_peak_locked(g);
  const int64_t over = g->cfg.cap ? total_locked(g) - g->cfg.cap : 0;
  if (over > 0) {
    g->counted_over++;
    if (over > g->over_most) g->over_most = over;
  }
  pthread_mutex_unlock(&g->mu);
  return over > 0 ? over : 0;
}

void mml_ledger_give_back(mml_ledger *g, mml_charge *c) {
  pthread_mutex_lock(&g->mu);
  if (c->state != MML_CHARGE_GRANTED) {
    pthread_mutex_unlock(&g->mu);
    return;
  }
  revocable_unlink(g, c);
  if (c->revoking) g->revoking -= c->bytes;
  c->revoking = 0;
  c->state = MML_CHARGE_IDLE;
  g->held[MML_HOLD_ENGINE] -= c->bytes;
  consumer_stale_locked(g); /* L7: work ended */
  step_and_unlock(g);
}

int mml_ledger_settle(mml_ledger *g, mml_charge *c) {
  pthread_mutex_lock(&g->mu);
  const int ok = c->state == MML_CHARGE_GRANTED && !c->revoking;
  if (ok) revocable_unlink(g, c);
  pthread_mutex_unlock(&g->mu);
  return ok;
}

void mml_ledger_keep(mml_ledger *g, mml_charge *c) {
  pthread_mutex_lock(&g->mu);
  if (c->state != MML_CHARGE_GRANTED) {
    pthread_mutex_unlock(&g->mu);
    return;
  }
  revocable_unlink(g, c);
  const int was = c->revoking;
  if (was) g->revoking -= c->bytes;
  c->revoking = 0;
  if (!was) {
    pthread_mutex_unlock(&g->mu);
    return;
  }
  step_and_unlock(g); /* L10: the head, short again, asks others back */
}

void mml_ledger_hand_over(mml_ledger *g, int64_t bytes) {
  if (bytes <= 0) return;
  pthread_mutex_lock(&g->mu);
  g->held[MML_HOLD_ENGINE] -= bytes;
  g->held[MML_HOLD_CONSUMER] += bytes;
  consumer_stale_locked(g); /* L7: it may be what the consumer waits for */
  step_and_unlock(g);
}

void mml_ledger_consumer_waiting(mml_ledger *g, int waiting) {
  pthread_mutex_lock(&g->mu);
  g->consumer_waiting = waiting != 0;
  step_and_unlock(g);
}

uint64_t mml_ledger_consumer_changes(mml_ledger *g) {
  pthread_mutex_lock(&g->mu);
  const uint64_t n = g->cons_changes;
  pthread_mutex_unlock(&g->mu);
  return n;
}

void mml_ledger_consumer_poke(mml_ledger *g) {
  pthread_mutex_lock(&g->mu);
  g->consumer_waiting = 0; /* L7: declared from a look this event made stale */
  consumer_wake_locked(g);
  pthread_mutex_unlock(&g->mu);
}

void mml_ledger_consumer_stale(mml_ledger *g) {
  pthread_mutex_lock(&g->mu);
  consumer_stale_locked(g);
  if (g->head && no_engine_but_own_locked(g, g->head)) {
    step_and_unlock(g); /* the head's L7 case now: the consumer looks again */
    return;
  }
  pthread_mutex_unlock(&g->mu);
}

void mml_ledger_consumer_behind(mml_ledger *g, int64_t bytes) {
  pthread_mutex_lock(&g->mu);
  g->cons_behind = bytes > 0 ? bytes : 0;
  pthread_mutex_unlock(&g->mu);
}

int mml_ledger_consumer_wait(mml_ledger *g, uint64_t seen, int declare,
                             const struct timespec *until) {
  pthread_mutex_lock(&g->mu);
  if (declare && g->cons_changes == seen && !g->shut) {
    /* L7: declared only when nothing ended since the consumer's look (the count it read
     * before it); the deadlock rule applies to the head at once */
    g->consumer_waiting = 1;
    for (;;) {
      wake_list w;
      w.n = 0;
      const int more = step_locked(g, &w);
      if (!w.n && !more) break;
      pthread_mutex_unlock(&g->mu);
      wake_run(&w);
      pthread_mutex_lock(&g->mu);
      if (!more) break;
    }
  }
  int rc = 0;
  g->cons_blocked++;
  while (g->cons_woken <= seen && !g->shut && rc != ETIMEDOUT)
    rc =
        until ? pthread_cond_timedwait(&g->ccv, &g->mu, until) : pthread_cond_wait(&g->ccv, &g->mu);
  g->cons_blocked--;
  const int changed = g->cons_woken > seen || g->shut;
  g->consumer_waiting = 0; /* the wait ended: withdrawn (an end of work cleared it already) */
  pthread_mutex_unlock(&g->mu);
  return changed;
}

void mml_ledger_cache_put(mml_ledger *g, int id, int64_t bytes, int holder) {
  if (bytes <= 0 || id < 0 || holder < 0 || holder >= MML_HOLDERS) return;
  pthread_mutex_lock(&g->mu);
  if (id < g->ncache) {
    g->held[holder] -= bytes;
    g->cache[id].bytes += bytes;
    if (holder == MML_HOLD_ENGINE) consumer_stale_locked(g); /* L7: work ended */
  }
  step_and_unlock(g); /* evictable now: the head may fit (L4) */
}

int mml_ledger_cache_grow(mml_ledger *g, int id, int64_t bytes) {
  if (bytes <= 0) return 1;
  pthread_mutex_lock(&g->mu);
  int ok = id >= 0 && id < g->ncache && !g->shut && !g->head &&
           (!g->cfg.cap || total_locked(g) + bytes <= g->cfg.cap);
  if (ok) {
    g->cache[id].bytes += bytes;
    note_peak_locked(g);
  }
  pthread_mutex_unlock(&g->mu);
  return ok;
}

void mml_ledger_cache_drop(mml_ledger *g, int id, int64_t bytes) {
  if (bytes <= 0 || id < 0) return;
  pthread_mutex_lock(&g->mu);
  if (id < g->ncache) g->cache[id].bytes -= bytes;
  step_and_unlock(g);
}

void mml_ledger_shutdown(mml_ledger *g) {
  pthread_mutex_lock(&g->mu);
  g->shut = 1;
  g->changes++; /* L11 */
  consumer_wake_locked(g);
  for (;;) {
    wake_list w;
    w.n = 0;
    while (g->head && w.n < WAKE_BATCH) {
      mml_charge *c = g->head;
      unlink_locked(g, c);
      c->state = MML_CHARGE_FAILED;
      c->status = MML_ECANCELLED;
      woke_locked(c, &w);
    }
    pthread_cond_broadcast(&g->cv);
    const int more = g->head != NULL;
    pthread_mutex_unlock(&g->mu);
    wake_run(&w);
    if (!more) return;
    pthread_mutex_lock(&g->mu);
  }
}

uint64_t mml_ledger_changes(mml_ledger *g) {
  pthread_mutex_lock(&g->mu);
  const uint64_t n = g->changes;
  pthread_mutex_unlock(&g->mu);
  return n;
}

void mml_ledger_poke(mml_ledger *g) {
  pthread_mutex_lock(&g->mu);
  g->changes++;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

void mml_ledger_wait_change(mml_ledger *g, uint64_t seen) {
  pthread_mutex_lock(&g->mu);
  while (g->changes == seen) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

int mml_ledger_wait_change_for(mml_ledger *g, uint64_t seen, int64_t ns) {
  struct timespec until; /* the condition variable's clock is CLOCK_MONOTONIC */
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += (time_t)(ns / 1000000000);
  until.tv_nsec += (long)(ns % 1000000000);
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&g->mu);
  int rc = 0;
  while (g->changes == seen && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&g->cv, &g->mu, &until);
  const int changed = g->changes != seen;
  pthread_mutex_unlock(&g->mu);
  return changed;
}

mml_status mml_ledger_error(mml_ledger *g, mml_err *err) {
  pthread_mutex_lock(&g->mu);
  const mml_status st = g->fail_st;
  if (st && err) *err = g->fail_err;
  pthread_mutex_unlock(&g->mu);
  return st;
}

void mml_ledger_get_stats(mml_ledger *g, mml_ledger_stats *o) {
  pthread_mutex_lock(&g->mu);
  o->cap = g->cfg.cap;
  for (int h = 0; h < MML_HOLDERS; h++) o->held[h] = g->held[h];
  o->cached = cached_locked(g);
  o->peak = g->peak;
  o->waiting = g->nwaiting;
  o->grants = g->grants;
  o->waits = g->waits;
  o->evicted_bytes = g->evicted;
  o->revoked = g->revoked;
  o->tries_refused = g->tries_refused;
  o->counted_over = g->counted_over;
  o->over_most = g->over_most;
  o->consumer_waiting = g->consumer_waiting;
  o->revoking = g->revoking;
  o->head_seq = g->head ? g->head->seq : -1;
  o->head_need = g->head ? g->head->bytes : 0;
  pthread_mutex_unlock(&g->mu);
}
