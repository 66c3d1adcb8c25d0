/*
 * mml/ledger.h — one ordered byte ledger for a memory cap (max_memory): every charge is
 * granted against one budget in stream order, caches are a second, evictable class
 * reclaimed before anyone waits, and a release wakes the waiters.  The design, the
 * threads and the numbered invariants are at the top of csrc/core/base/ledger.c.
 */
#ifndef MML_LEDGER_H
#define MML_LEDGER_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "mml/common.h"

typedef struct mml_ledger mml_ledger;

/* Who holds granted credit (ledger.c MODEL).  ENGINE: work running (a charge is granted to
 * it); CONSUMER: finished work that waits for the stream; FIXED: set aside for as long as
 * its owner lives (mml_ledger_count_fixed; given back with mml_ledger_release, which is then
 * no end of work).  The deadlock rule (L7) waits only for ENGINE credit. */
enum { MML_HOLD_ENGINE = 0, MML_HOLD_CONSUMER = 1, MML_HOLD_FIXED = 2, MML_HOLDERS = 3 };

/* A charge's state.  IDLE: not in the ledger; WAITING: queued for its turn or for room;
 * GRANTED: its bytes are held (by the engine until handed over); FAILED: it never will be
 * (too large alone, the deadlock rule, or the ledger shut down: mml_ledger_error). */
enum { MML_CHARGE_IDLE = 0, MML_CHARGE_WAITING, MML_CHARGE_GRANTED, MML_CHARGE_FAILED };

/* Called when a waiting charge is granted or fails, after the ledger's lock is released,
 * possibly on a thread that holds its owner's locks (a release under the loader's mu):
 * it must only signal, never call into the ledger or take a lock. */
typedef void (*mml_charge_wake_fn)(void *arg);

/* The most bytes of a work's name in a charge or a message ("data.jsonl:12"). */
enum { MML_CHARGE_NAME = 160 };

/* One request's place in the ledger; owned (and kept alive while WAITING or GRANTED) by
 * the caller.  Set seq and bytes (and wake for mml_ledger_request), zero the rest. */
typedef struct mml_charge {
  int64_t seq;       /* its place in the stream: smaller is granted first (ties: arrival) */
  int64_t bytes;     /* >= 0 */
  int state;         /* MML_CHARGE_* (read it with mml_ledger_state off the ledger's lock) */
  mml_status status; /* FAILED: why (MML_ENOMEM, MML_ECANCELLED) */
  mml_charge_wake_fn wake;
  void *wake_arg;
  /* revocable (set before the request): once granted, the ledger may ask for it back for
   * an earlier charge that does not fit (L10): `revoke` runs (with wake_arg, as wake
   * does) and the owner gives it back (mml_ledger_give_back) -- read-ahead that can be
   * dropped and read again.  mml_ledger_settle makes it final. */
  int revocable;
  mml_charge_wake_fn revoke;
  /* ENGINE credit its owner already holds that comes back only after this charge is
   * granted (a read's bytes so far, parked for the rest; set before the request): L7 does
   * not wait for it (ledger.c L7).  0: none. */
  int64_t own;
  /* for messages (L8; set before the request, or left empty): the work's name, copied in
   * by its requester ("data.jsonl:12"; empty: cfg.name's, or its stream position) and what
   * its bytes are (a string that outlives the charge; NULL: "work") */
  char name[MML_CHARGE_NAME];
  const char *what;
  int revoking;                     /* the ledger's: asked back */
  struct mml_charge *prev, *next;   /* the ledger's waiting list */
  struct mml_charge *rprev, *rnext; /* the ledger's granted revocable charges */
} mml_charge;

/* A cache (pooled pages, spare byte buffers, preloads, open videos): frees at least `want`
 * of its bytes if it can and returns the bytes it freed.  Called with the ledger's lock
 * held (lock order: ledger -> the cache's lock): it must not call into the ledger, and its
 * owner must not call into the ledger with that lock held. */
typedef int64_t (*mml_ledger_evict_fn)(void *arg, int64_t want);

/* Names the work of a seq for messages ("shard a.jsonl line 12"); may be NULL. */
typedef void (*mml_ledger_name_fn)(void *arg, int64_t seq, char *out, size_t cap);

typedef struct mml_ledger_cfg {
  int64_t cap; /* the budget in bytes; 0: no cap (every charge is granted at once) */
  mml_ledger_name_fn name;
  void *name_arg;
  const char *what; /* the option the cap comes from, for messages ("max_memory") */
  const char *hint; /* appended to the deadlock rule's message (how to hold less), or NULL */
} mml_ledger_cfg;

enum { MML_LEDGER_CACHES = 8 };

/* What the ledger holds now (mml_ledger_stats). */
typedef struct mml_ledger_stats {
  int64_t cap;
  int64_t held[MML_HOLDERS];
  int64_t cached;              /* all caches together */
  int64_t peak;                /* most held + cached at once */
  int64_t waiting;             /* charges waiting now */
  uint64_t grants, waits;      /* charges granted; of them, those that waited */
  uint64_t evicted_bytes;      /* cache bytes reclaimed for a charge */
  uint64_t revoked;            /* revocable charges asked back (L10) */
  int64_t revoking;            /* bytes asked back and not given back or kept yet (L10) */
  uint64_t tries_refused;      /* tries answered "no room" (L12) */
  uint64_t counted_over;       /* counts that left held + cached above the cap (L13) */
  int64_t over_most;           /* the most above the cap a count left it (L13) */
  int64_t head_seq, head_need; /* the first waiting charge (-1, 0: none) */
  int consumer_waiting;        /* the consumer's wait is declared now (L7) */
} mml_ledger_stats;

/* A new ledger (MML_ENOMEM; cap < 0: MML_EINVAL). */
mml_status mml_ledger_new(const mml_ledger_cfg *cfg, mml_ledger **out, mml_err *err);
/* Frees it; no charge may be WAITING (mml_ledger_shutdown first). NULL is fine. */
void mml_ledger_free(mml_ledger *g);

/* Registers a cache (before any charge; at most MML_LEDGER_CACHES): returns its id, -1
 * when full.  `name` is used in messages. */
int mml_ledger_add_cache(mml_ledger *g, const char *name, mml_ledger_evict_fn evict, void *arg);
/* Cache `id` grows by `bytes` that `holder` held (a released buffer kept for reuse): the
 * credit moves from the holder to the cache, in one step (the total does not change). */
void mml_ledger_cache_put(mml_ledger *g, int id, int64_t bytes, int holder);
/* Cache `id` grows by `bytes` nobody held (a preload, a buffer kept open): 1 when they
 * fit without evicting anything and no charge waits (then they are counted), else 0. */
int mml_ledger_cache_grow(mml_ledger *g, int id, int64_t bytes);
/* Cache `id` dropped `bytes` by itself (freed, or reused by a granted charge). */
void mml_ledger_cache_drop(mml_ledger *g, int id, int64_t bytes);

/* Non-blocking: queues charge c (IDLE, seq and bytes set).  Returns MML_OK with c GRANTED
 * or WAITING (then c->wake runs once it is granted or fails); MML_ENOMEM (c FAILED, *err
 * the explainer) when c alone is above the cap; MML_ECANCELLED after shutdown. */
mml_status mml_ledger_request(mml_ledger *g, mml_charge *c, mml_err *err);
/* Blocking: mml_ledger_request, then waits (no polling: a release, an eviction or the
 * consumer's state wakes it) until granted (MML_OK) or failed (MML_ENOMEM with the
 * explainer's message; MML_ECANCELLED after shutdown).  c->wake is not called. */
mml_status mml_ledger_acquire(mml_ledger *g, mml_charge *c, mml_err *err);
/* Blocks (no polling) until a charge that mml_ledger_request queued is no longer WAITING:
 * MML_OK when granted, else as mml_ledger_acquire. */
mml_status mml_ledger_wait(mml_ledger *g, mml_charge *c, mml_err *err);
/* Non-blocking and never queued (L12): c (IDLE, seq and bytes set) is granted now (1,
 * c GRANTED: ENGINE credit, released with mml_ledger_release or mml_ledger_give_back) when
 * no charge before it waits and it fits, caches evicted if that makes it fit; else 0 ("no
 * room now"; c IDLE, nothing held).  For callers that must not wait. */
int mml_ledger_try(mml_ledger *g, mml_charge *c);
/* The try's answer without the grant (L12): 1 when a try of `bytes` at `seq` would be
 * granted now (caches are evicted as for it), else 0; nothing is held either way. */
int mml_ledger_room(mml_ledger *g, int64_t seq, int64_t bytes);
/* Records `bytes` already taken (L13): id < 0, ENGINE credit (caches are evicted first to
 * make room for it); id >= 0, cache id's bytes (nobody held them).  Counted even past the
 * cap: returns how far above the cap the total is after it (0: within). */
int64_t mml_ledger_count(mml_ledger *g, int id, int64_t bytes);
/* Records `bytes` already taken, or set aside before anything asks, as FIXED credit (L13's
 * count in that class: caches make way first, counted even past the cap; returns how far
 * above the cap the total is after it).  The deadlock rule (L7) does not count it as
 * credit that will come back. */
int64_t mml_ledger_count_fixed(mml_ledger *g, int64_t bytes);
/* Withdraws a WAITING charge (a seek, a rewind): IDLE again; charges behind it may be
 * granted.  A GRANTED or FAILED charge is left alone (release it). */
void mml_ledger_withdraw(mml_ledger *g, mml_charge *c);
/* c's state now (takes the lock). */
int mml_ledger_state(mml_ledger *g, const mml_charge *c);

/* A granted charge's bytes go back (ENGINE credit) and it is IDLE again: a revoked one
 * given back, or any charge released whole. */
void mml_ledger_give_back(mml_ledger *g, mml_charge *c);
/* A granted revocable charge becomes final (its work began): 1; 0 when it was already
 * asked back (then it must be given back).  Settle it before handing it over. */
int mml_ledger_settle(mml_ledger *g, mml_charge *c);
/* A granted revocable charge leaves the list of grants that may be asked back, its bytes
 * still held: its owner cannot give it back (its work can no longer be dropped and done
 * again), or gave its bytes back by a release of its own (mml_ledger_release).  One
 * asked back is no longer counted as coming back, so the head asks back others (L10). */
void mml_ledger_keep(mml_ledger *g, mml_charge *c);
/* `holder` gives back `bytes` it held (a charge's, in whole or in part); wakes waiters. */
void mml_ledger_release(mml_ledger *g, int64_t bytes, int holder);
/* `bytes` of engine credit become the consumer's (the work finished; it waits for the
 * stream). */
void mml_ledger_hand_over(mml_ledger *g, int64_t bytes);
/* The consumer blocks waiting for the stream (1) or no longer does (0); while it waits,
 * the deadlock rule (L7) applies.  Declare it after looking for what it waits for, under
 * the lock the producers finish work under: the next end of ENGINE work (hand-over,
 * release, cache_put from the engine) clears it (that work may be what it waits for). */
void mml_ledger_consumer_waiting(mml_ledger *g, int waiting);
/* The consumer's wait by the ledger (L7 with L11's protocol, L14): the consumer reads
 * mml_ledger_consumer_changes under its owner's lock BEFORE it looks for what it waits
 * for; finding nothing, it drops that lock and calls mml_ledger_consumer_wait with the
 * count it read.  When `declare` is set and nothing changed since its look, the wait is
 * declared (the deadlock rule may fail the head at once).  The count moves, and the
 * declaration ends, at:
 * - mml_ledger_consumer_poke: the owner's events that change what the consumer finds (a
 *   batch queued, an error, a close); they wake it, as do L7's failure and the shutdown;
 * - every end of ENGINE work and every mml_ledger_consumer_stale (the owner's events that
 *   change only whether it may declare: work started that holds no credit, work that may
 *   have left the owner idle); they wake it only where L7 could decide (L14).
 * It blocks until woken (1: look again; at once when woken since its look), the shutdown,
 * or `until` (CLOCK_MONOTONIC, NULL: no bound) passes (0); the declaration ends with the
 * wait.  The owner declares only while none of its work runs without credit (work that
 * holds nothing yet still ends by itself: L7 cannot see it). */
uint64_t mml_ledger_consumer_changes(mml_ledger *g);
/* The ENGINE credit held by work that can go on only after the head is granted (its own
 * samples' bytes, read and waiting for its buffer; bytes kept by work that waits behind
 * it), as the owner counted it at its look, for its next declaration: the deadlock rule
 * (L7) fails the head when the ENGINE credit held is no more than this, nothing can be
 * asked back and nothing is being given back (L10).  0 (the default): no ENGINE credit. */
void mml_ledger_consumer_behind(mml_ledger *g, int64_t bytes);
void mml_ledger_consumer_poke(mml_ledger *g);
void mml_ledger_consumer_stale(mml_ledger *g);
int mml_ledger_consumer_wait(mml_ledger *g, uint64_t seen, int declare,
                             const struct timespec *until);

/* Waiting for the ledger OR the owner's own events, without polling and without a lost
 * wakeup (L11): a thread that must act on whichever comes first -- a charge of its granted
 * or failed, a revocable grant asked back, or work its owner queues -- reads the change
 * count under its owner's lock (mml_ledger_changes), looks for work (still under that
 * lock), drops the lock and blocks in mml_ledger_wait_change until the count differs; the
 * owner calls mml_ledger_poke under its lock whenever it queues work such a thread may
 * take.  The count grows with every grant or failure of a waiting charge, every revocable
 * grant asked back, every poke and the shutdown. */
uint64_t mml_ledger_changes(mml_ledger *g);
void mml_ledger_poke(mml_ledger *g);
/* Blocks until the change count differs from `seen` (at once when it does already). */
void mml_ledger_wait_change(mml_ledger *g, uint64_t seen);
/* The same, for at most `ns` nanoseconds: 1 when the count changed, 0 when the time ran
 * out (for an owner that must look again after a while: a stall rule that counts looks);
 * L11 holds as above. */
int mml_ledger_wait_change_for(mml_ledger *g, uint64_t seen, int64_t ns);

/* The one out-of-memory message (L8), in parts: the ledger's figures when the work was
 * refused (mml_ledger_oom_now, or a failure's: mml_ledger_oom_failed) and the owner's
 * words.  mml_ledger_explain composes it: "NAME: max_memory=CAP cannot hold the NEED bytes
 * of WHAT[ (and the THEN bytes it asks next)] beside C bytes of finished work waiting for
 * the consumer (SPLIT), E bytes of work running, F bytes set aside for the loader's lifetime
 * and K bytes cached: max_memory >= FIT would hold it; HINT" -- FIT is the credit held, NEED
 * and THEN, counting only the FIXED credit when the work cannot fit even alone (`alone`;
 * then no hint). */
typedef struct mml_ledger_oom {
  int64_t seq, need; /* the work's place in the stream and its bytes */
  int alone;
  int64_t cap, held[MML_HOLDERS], cached; /* the ledger's figures */
  int64_t waiting; /* of held[ENGINE]: work that goes on only after it (L7: own, behind) */
  int64_t then;    /* bytes the same work asks after it (a batch's other buffers): in FIT */
  char name[MML_CHARGE_NAME]; /* "": named by cfg.name or its seq; seq < 0 too: not named */
  const char *what;           /* NULL: "work" */
  const char *split;          /* the consumer's credit in the owner's words, or NULL */
  const char *hint;           /* NULL: cfg.hint; "": none */
} mml_ledger_oom;
/* *o: the ledger's figures now, for `need` bytes of work at `seq` (no words yet). */
void mml_ledger_oom_now(mml_ledger *g, int64_t seq, int64_t need, int alone, mml_ledger_oom *o);
/* *o: the latest out-of-memory failure's parts, as when it failed (its charge's name and
 * what); 0 when there was none. */
int mml_ledger_oom_failed(mml_ledger *g, mml_ledger_oom *o);
/* Composes the message into *err: MML_ENOMEM. */
mml_status mml_ledger_explain(mml_ledger *g, const mml_ledger_oom *o, mml_err *err);

/* Every waiting charge fails with MML_ECANCELLED and so does every later request (close,
 * Ctrl-C); releases still count.  Idempotent. */
void mml_ledger_shutdown(mml_ledger *g);
/* The latest out-of-memory failure (the explainer's message) into *err; MML_OK when none. */
mml_status mml_ledger_error(mml_ledger *g, mml_err *err);
void mml_ledger_get_stats(mml_ledger *g, mml_ledger_stats *out);

#endif
