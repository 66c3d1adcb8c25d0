/*
 * ledger.c — one ordered byte ledger for a memory cap (implements mml/ledger.h).
 *
 * WHY.  A cap enforced by several gates, each guessing what earlier work will need, hangs
 * when the guesses disagree: later work takes the room earlier work needs and every gate
 * waits.  Here every byte the cap covers is a charge against one budget, granted in stream
 * order, so later work never takes room that earlier work needs; one rule (L7) turns the
 * one wait that can never end into an error, and one explainer (L8) words it.
 *
 * MODEL.
 *   - Holders (MML_HOLD_*).  ENGINE: work running, which gives its credit back or hands it
 *     over by itself (L5).  CONSUMER: finished work waiting for the stream (batches queued,
 *     handed off or held by the consumer), back only as the consumer takes and releases
 *     them.  FIXED: set aside while its owner lives (a reserve, a reader's room, buffers
 *     kept for reuse: mml_ledger_count_fixed), never back while the consumer waits.
 *   - Caches (pooled pages, spare buffers): counted in the same budget but evictable: the
 *     ledger asks their owners for bytes (evict callbacks, in registration order, L4).
 *   - A charge (mml_charge) is (seq, bytes), seq its place in the stream; granted, its
 *     bytes are ENGINE credit.  A request is granted or waits; a try (L12) is granted or
 *     refused; a count (L13) records bytes already taken.  A revocable grant may be asked
 *     back (L10) until its owner settles it.  A charge's `own` is ENGINE credit its owner
 *     already holds that comes back only after it is granted (a parked read's bytes).
 *   - Waiting charges form one list in (seq, arrival) order; the first is the head: the
 *     only waiting charge that can be granted or fail by L7 (the rest wait for it, L1).
 *   - The consumer's wait: the owner reads mml_ledger_consumer_changes under its own lock,
 *     looks for what the consumer waits for, and declares (mml_ledger_consumer_wait) only
 *     if the count has not moved; every end of ENGINE work and every poke or stale event
 *     of the owner moves it and ends the declaration, so L7 never acts on a stale look.
 *     With it the owner declares the ENGINE credit of work that can go on only after the
 *     head is granted (mml_ledger_consumer_behind): credit "behind" the head.
 *
 * THREADS.  Any thread may call any function.  One mutex guards everything.  Blocking
 * acquires and waits on the change count (L11) sleep on cv, the consumer's wait on ccv.
 * Wake and revoke callbacks are collected under the mutex and run after it is released,
 * each once; they may run on a thread that holds its owner's lock, so they only signal
 * (never take the owner's lock, never call into the ledger); the name callback (cfg.name)
 * may run under the ledger's lock, so it reads nothing its owner's lock guards.  Lock
 * order: the owner's lock -> the ledger -> a cache's own lock (evict runs under the
 * ledger's); nobody calls into the ledger with a cache's lock held.
 *
 * INVARIANTS (tests/c/base/test-ledger.c cites them)
 *   L1. A charge is granted only when no charge before it in (seq, arrival) order waits.
 *   L2. A charge waits only while one before it waits or it does not fit.
 *       Every change that could let the head fit grants, in order, all that fit.
 *   L3. held + cached <= cap after every grant and cache growth; only a count (L13) exceeds it.
 *   L4. Caches are evicted before anyone waits; a cache grows only when no charge waits.
 *   L5. (Callers) charges are asked in stream order; ENGINE credit never waits for the stream.
 *       So while the engine holds credit a waiting head is progress, not a deadlock.
 *   L6. No polling: a waiting charge's grant or failure broadcasts cv and runs its wake once.
 *   L7. The head fails (MML_ENOMEM) when it does not fit, the consumer declared its wait,
 *       nothing is asked back (L10) and no ENGINE credit is held but its own and behind it.
 *       Why: then only the consumer and FIXED hold credit, and neither gives any back.
 *   L8. One explainer (mml_ledger_explain) words every out-of-memory failure: the work's name
 *       and what (its charge's), its bytes, each holder's credit, the cache, the cap that fits.
 *       ENGINE credit L7 did not wait for (the head's own, behind it) is work waiting, not running.
 *   L9. Without a cap (0) every request is granted at once; counts are still kept.
 *  L10. A head that does not fit asks back later revocable grants, latest first, to its shortfall.
 *       Asked back, they stay ENGINE credit until given back; one its owner keeps is final.
 *  L11. The change count moves (with a broadcast) at each grant, failure, ask-back, poke, shutdown.
 *       So a thread that read it before it looked and waits on it misses nothing after its look.
 *  L12. A try is granted exactly when a request would be granted at once; refused, nothing held.
 *       mml_ledger_room is the same answer without the grant.
 *  L13. A count is never refused or queued: caches make way, then it counts, even past the cap.
 *       Never hidden: the peak includes it and counted_over / over_most record it.
 *  L14. The consumer is woken at once by its owner's poke, L7's failure and the shutdown; by an
 *       end of ENGINE work or a stale event only where L7 could then decide for the head.
 *       Why: a declaration changes nothing elsewhere, and waking it at every end of work
 *       (~20 a batch under a tight cap) cost throughput.
 *
 * THE LOADER'S USE.  One ledger per loader with max_memory, cap = max_memory
 * (csrc/core/loader/loader_admit.c: A6-A11 say what is charged and how it balances).
 *   M1. A read's bytes once their size is known: ld_admit_read_locked, at the read's seq; a
 *       request that waits (the task parked, R1-R2), revocable while it can be read again
 *       (R5-R6); L7 decides for the earliest parked read (C4).
 *   M2. A ticket plane's buffer: ld_admit_ticket_locked (from loader_place.c rebuffer /
 *       retry_pending), at the ticket's first sample's seq; a request that waits (T1-T6),
 *       its grant moving the collator's event count (W2); L7 decides (C3).
 *   M3. A decode's scratch beyond the reserve (and its re-read's bytes): asked when the
 *       decode is queued (ld_admit_decode_queued_locked), at the sample's seq; a request that
 *       waits (the decode stays queued, D1-D5), its sample's media bytes its `own`; L7
 *       decides (D4, C5).
 *   M4. A batch's expansion (compact rows' float pages): ld_admit_expand_locked, at its
 *       ticket's first sample's seq once its rows are final, held to its emission; and the
 *       emission's other tensors (and pages not charged so): ld_mem_emit_take_locked, at the
 *       same seq (pend_item.seq); requests that wait (the batch stays queued, E1-E5); L7
 *       decides (E4).
 *   M5. The pool: ledger_pool_hook counts live bytes as CONSUMER credit (covered by M2 / M4's
 *       grants) and kept pages as the "pooled pages" cache (mml_pool_evict); next() waits
 *       by mml_ledger_consumer_wait (loader.c; loader_admit.c C1-C7).
 *   M6. Spare byte buffers: the "spare byte buffers" cache (loader_bytes.c, ld_bytes_evict);
 *       remote video bytes ahead and videos kept open: ENGINE counts in their task's bytes
 *       (ld_mem_count_task_locked), taken only when ld_mem_room_locked has room.
 *   FIXED: the workers' scratch reserve (ld_ledger_open), the Parquet room
 *   (ld_ledger_start_locked), each slot's record, path and Parquet-row buffers
 *   (ld_mem_count_task_cover_locked).
 *   M1-M4 are requests that wait; the one try left is T5's out-of-turn read.  Still holds (room
 *   kept for earlier work, added to mml_ledger_room's question): none; M6's bytes ahead keep
 *   none for the next batch.
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
  mml_status fail_st; /* the latest failure (mml_ledger_error) */
  mml_err fail_err;
  mml_ledger_oom fail_oom; /* its parts (mml_ledger_oom_failed) */
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

static void oom_now_locked(mml_ledger *g, int64_t seq, int64_t need, int alone, mml_ledger_oom *o) {
  memset(o, 0, sizeof *o);
  o->seq = seq;
  o->need = need;
  o->alone = alone;
  o->cap = g->cfg.cap;
  memcpy(o->held, g->held, sizeof o->held);
  o->cached = cached_locked(g);
}

void mml_ledger_oom_now(mml_ledger *g, int64_t seq, int64_t need, int alone, mml_ledger_oom *o) {
  pthread_mutex_lock(&g->mu);
  oom_now_locked(g, seq, need, alone, o);
  pthread_mutex_unlock(&g->mu);
}

int mml_ledger_oom_failed(mml_ledger *g, mml_ledger_oom *o) {
  pthread_mutex_lock(&g->mu);
  const int any = g->fail_st == MML_ENOMEM;
  if (any) *o = g->fail_oom;
  pthread_mutex_unlock(&g->mu);
  return any;
}

/* The one out-of-memory message (L8), from its parts; the name callback (cfg.name) runs
 * here, under the ledger's lock or not: the owner's must read nothing that its own lock
 * guards (THREADS above). */
mml_status mml_ledger_explain(mml_ledger *g, const mml_ledger_oom *o, mml_err *err) {
  char name[MML_CHARGE_NAME + 2] = "";
  if (o->name[0])
    snprintf(name, sizeof name, "%s", o->name);
  else if (o->seq >= 0 && g->cfg.name)
    g->cfg.name(g->cfg.name_arg, o->seq, name, MML_CHARGE_NAME);
  if (!name[0] && o->seq >= 0)
    snprintf(name, sizeof name, "stream position %lld", (long long)o->seq);
  const int64_t cons = o->held[MML_HOLD_CONSUMER], eng = o->held[MML_HOLD_ENGINE];
  const int64_t fixed = o->held[MML_HOLD_FIXED];
  const int64_t fit = (o->alone ? fixed : cons + eng + fixed) + o->need + o->then;
  const char *hint = o->alone ? NULL : o->hint ? o->hint : g->cfg.hint;
  if (hint && !hint[0]) hint = NULL;
  /* ENGINE credit: work running, or work that waits for this one (L7's failure: no work
   * runs then, so naming the latter as running would say what is not true) */
  const int64_t waits = o->waiting < eng ? o->waiting : eng;
  char work[96];
  if (waits > 0 && waits < eng)
    snprintf(work, sizeof work, "%lld bytes of work running, %lld bytes of work waiting for them",
             (long long)(eng - waits), (long long)waits);
  else
    snprintf(work, sizeof work, "%lld bytes of work %s", (long long)eng,
             waits > 0 ? "waiting for them" : "running");
  char then[64] = "";
  if (o->then > 0)
    snprintf(then, sizeof then, " (and the %lld bytes it asks next)", (long long)o->then);
  mml_err_set(err, MML_ENOMEM,
              "%s%s%s=%lld cannot hold the %lld bytes of %s%s beside %lld bytes of finished "
              "work waiting for the consumer (%s), %s, %lld bytes set aside for the loader's "
              "lifetime and %lld bytes cached: %s >= %lld would hold it%s%s",
              name, name[0] ? ": " : "", g->cfg.what, (long long)o->cap, (long long)o->need,
              o->what ? o->what : "work", then, (long long)cons,
              o->split ? o->split : "batches it holds or has yet to take", work, (long long)fixed,
              (long long)o->cached, g->cfg.what, (long long)fit, hint ? "; " : "",
              hint ? hint : "");
  return MML_ENOMEM;
}

/* The message of charge c, refused now (L7, or too large alone). */
static mml_status explain_locked(mml_ledger *g, const mml_charge *c, int alone, mml_ledger_oom *o,
                                 mml_err *err) {
  oom_now_locked(g, c->seq, c->bytes, alone, o);
  if (!alone) o->waiting = c->own + g->cons_behind; /* L7: what it did not wait for */
  memcpy(o->name, c->name, sizeof o->name);
  o->name[sizeof o->name - 1] = 0;
  o->what = c->what;
  return mml_ledger_explain(g, o, err);
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

static void fail_locked(mml_ledger *g, mml_charge *c, mml_status st, const mml_err *e,
                        const mml_ledger_oom *o) {
  c->state = MML_CHARGE_FAILED;
  c->status = st;
  if (st == MML_ENOMEM) {
    g->fail_st = st;
    g->fail_err = *e;
    g->fail_oom = *o;
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
      mml_ledger_oom o;
      explain_locked(g, c, 0, &o, &e);
      unlink_locked(g, c);
      fail_locked(g, c, MML_ENOMEM, &e, &o);
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
    mml_ledger_oom o;
    explain_locked(g, c, 1, &o, &e);
    fail_locked(g, c, MML_ENOMEM, &e, &o);
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
