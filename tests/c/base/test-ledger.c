/* test-ledger.c — the byte ledger on its own (csrc/core/base/ledger.c, invariants L1..L14):
 * ordering, eviction, wakeups, the deadlock rule and its message, shutdown, and a
 * randomized stress test of a producer/consumer pipeline (libuv threadpool-test style:
 * real threads, no sleeps in the checks; run under TSan by the Makefile). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "mml/batch.h"
#include "mml/ledger.h"
#include "mml_test.h"

static mml_ledger *new_ledger(int64_t cap) {
  mml_ledger_cfg cfg = {0};
  cfg.cap = cap;
  mml_ledger *g = NULL;
  mml_err err;
  if (mml_ledger_new(&cfg, &g, &err)) return NULL;
  return g;
}

static mml_charge charge(int64_t seq, int64_t bytes) {
  mml_charge c = {0};
  c.seq = seq;
  c.bytes = bytes;
  return c;
}

/* wake callbacks record the order they ran in */
static int wake_log[64], wake_n;
static void log_wake(void *arg) { wake_log[wake_n++] = (int)(intptr_t)arg; }

/* L1, L2: a charge waits while an earlier one waits, even when it fits; an earlier seq
 * goes before a waiting later one; ties go by arrival; a release grants in order. */
TEST(ledger_grants_in_stream_order) {
  mml_ledger *g = new_ledger(100);
  mml_err err;
  mml_charge a = charge(0, 80), b = charge(5, 30), c = charge(7, 5), d = charge(3, 10),
             e = charge(5, 1);
  b.wake = c.wake = e.wake = log_wake;
  b.wake_arg = (void *)5, c.wake_arg = (void *)7, e.wake_arg = (void *)6;
  wake_n = 0;
  CHECK_OK(mml_ledger_request(g, &a, &err), err);
  CHECK_EQ_INT(a.state, MML_CHARGE_GRANTED);
  CHECK_OK(mml_ledger_request(g, &b, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &b), MML_CHARGE_WAITING); /* does not fit */
  CHECK_OK(mml_ledger_request(g, &c, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &c), MML_CHARGE_WAITING); /* fits, but b is before it */
  CHECK_OK(mml_ledger_request(g, &e, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &e), MML_CHARGE_WAITING); /* same seq as b: after it */
  CHECK_OK(mml_ledger_request(g, &d, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &d), MML_CHARGE_GRANTED); /* before b in the stream */
  mml_ledger_stats s;
  mml_ledger_get_stats(g, &s);
  CHECK_EQ_INT(s.held[MML_HOLD_ENGINE], 90);
  CHECK_EQ_INT(s.waiting, 3);
  CHECK_EQ_INT(s.head_seq, 5);
  mml_ledger_release(g, 80, MML_HOLD_ENGINE); /* 10 held: b (30), e (1), c (5) fit */
  CHECK_EQ_INT(wake_n, 3);
  CHECK_EQ_INT(wake_log[0], 5);
  CHECK_EQ_INT(wake_log[1], 6);
  CHECK_EQ_INT(wake_log[2], 7);
  mml_ledger_get_stats(g, &s);
  CHECK_EQ_INT(s.held[MML_HOLD_ENGINE], 46);
  CHECK_EQ_INT(s.waiting, 0);
  CHECK_EQ_INT(s.peak, 90);
  CHECK(s.peak <= s.cap); /* L3 */
  mml_ledger_release(g, 46, MML_HOLD_ENGINE);
  mml_ledger_free(g);
}

/* A release that lets only the head fit grants the head and leaves the rest waiting. */
TEST(ledger_release_grants_only_what_fits) {
  mml_ledger *g = new_ledger(100);
  mml_err err;
  mml_charge a = charge(0, 100), b = charge(1, 60), c = charge(2, 60);
  CHECK_OK(mml_ledger_request(g, &a, &err), err);
  CHECK_OK(mml_ledger_request(g, &b, &err), err);
  CHECK_OK(mml_ledger_request(g, &c, &err), err);
  mml_ledger_release(g, 50, MML_HOLD_ENGINE);
  CHECK_EQ_INT(mml_ledger_state(g, &b), MML_CHARGE_WAITING); /* 50 + 60 > 100 */
  mml_ledger_release(g, 50, MML_HOLD_ENGINE);
  CHECK_EQ_INT(mml_ledger_state(g, &b), MML_CHARGE_GRANTED);
  CHECK_EQ_INT(mml_ledger_state(g, &c), MML_CHARGE_WAITING);
  mml_ledger_withdraw(g, &c); /* a seek: IDLE again, nothing waits */
  CHECK_EQ_INT(mml_ledger_state(g, &c), MML_CHARGE_IDLE);
  mml_ledger_stats s;
  mml_ledger_get_stats(g, &s);
  CHECK_EQ_INT(s.waiting, 0);
  CHECK_EQ_INT(s.held[MML_HOLD_ENGINE], 60);
  mml_ledger_free(g);
}

/* Withdrawing the head lets the one behind it be granted (L2). */
TEST(ledger_withdraw_head_grants_next) {
  mml_ledger *g = new_ledger(100);
  mml_err err;
  mml_charge a = charge(0, 50), b = charge(1, 80), c = charge(2, 40);
  CHECK_OK(mml_ledger_request(g, &a, &err), err);
  CHECK_OK(mml_ledger_request(g, &b, &err), err);
  CHECK_OK(mml_ledger_request(g, &c, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &c), MML_CHARGE_WAITING);
  mml_ledger_withdraw(g, &b);
  CHECK_EQ_INT(mml_ledger_state(g, &c), MML_CHARGE_GRANTED);
  mml_ledger_free(g);
}

/* L2 with a withdrawal, as the loader's tickets use it (loader_admit.c T1-T3): a waiting
 * charge withdrawn to ask again for another size lets what waits behind it be granted at
 * once, before it asks again -- so the owner withdraws the later ones first; asked again
 * with nothing behind it, it is the head and its wake runs once when a release grants it. */
TEST(ledger_withdraw_to_resize_grants_behind_first) {
  mml_ledger *g = new_ledger(100);
  mml_err err;
  mml_charge a = charge(0, 60);
  CHECK(mml_ledger_try(g, &a));
  mml_charge h = charge(1, 50), l = charge(2, 30);
  h.wake = l.wake = log_wake;
  h.wake_arg = (void *)(intptr_t)1;
  l.wake_arg = (void *)(intptr_t)2;
  wake_n = 0;
  CHECK_OK(mml_ledger_request(g, &h, &err), err);
  CHECK_OK(mml_ledger_request(g, &l, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &l), MML_CHARGE_WAITING); /* fits, waits behind h (L1) */
  mml_ledger_withdraw(g, &h);                                /* to ask again for 40 */
  CHECK_EQ_INT(mml_ledger_state(g, &l), MML_CHARGE_GRANTED); /* granted on the way */
  CHECK_EQ_INT(wake_n, 1);
  h = charge(1, 40);
  h.wake = log_wake;
  h.wake_arg = (void *)(intptr_t)1;
  CHECK_OK(mml_ledger_request(g, &h, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_WAITING); /* l's grant holds its room */
  /* the owner's order: l leaves first (its grant given back), then h asks again */
  mml_ledger_withdraw(g, &h);
  mml_ledger_give_back(g, &l);
  l = charge(2, 30);
  l.wake = log_wake;
  l.wake_arg = (void *)(intptr_t)2;
  h = charge(1, 45);
  h.wake = log_wake;
  h.wake_arg = (void *)(intptr_t)1;
  CHECK_OK(mml_ledger_request(g, &h, &err), err);
  CHECK_OK(mml_ledger_request(g, &l, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_WAITING);
  wake_n = 0;
  mml_ledger_release(g, 20, MML_HOLD_ENGINE); /* 40 held: h fits, then l does not */
  CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_GRANTED);
  CHECK_EQ_INT(mml_ledger_state(g, &l), MML_CHARGE_WAITING);
  CHECK_EQ_INT(wake_n, 1);
  CHECK_EQ_INT(wake_log[0], 1);
  mml_ledger_withdraw(g, &l);
  mml_ledger_free(g);
}

/* a test cache: bytes it holds, what evict was asked for */
typedef struct tcache {
  atomic_llong bytes;
  atomic_llong asked, calls;
  int evictable;
} tcache;

static int64_t tcache_evict(void *arg, int64_t want) {
  tcache *k = arg;
  atomic_fetch_add(&k->calls, 1);
  atomic_fetch_add(&k->asked, want);
  if (!k->evictable) return 0;
  long long have = atomic_load(&k->bytes);
  for (;;) {
    long long take = have < want ? have : want;
    if (take <= 0) return 0;
    if (atomic_compare_exchange_weak(&k->bytes, &have, have - take)) return take;
  }
}

/* L4: caches are evicted before a charge waits, only as much as it needs, and only when
 * that makes it fit; a cache grows only into free room with nothing waiting. */
TEST(ledger_evicts_caches_before_waiting) {
  mml_ledger *g = new_ledger(100);
  mml_err err;
  tcache k = {0};
  k.evictable = 1;
  const int id = mml_ledger_add_cache(g, "pages", tcache_evict, &k);
  CHECK_EQ_INT(id, 0);
  mml_charge a = charge(0, 60);
  CHECK_OK(mml_ledger_request(g, &a, &err), err);
  mml_ledger_cache_put(g, id, 60, MML_HOLD_ENGINE); /* a released buffer kept */
  atomic_store(&k.bytes, 60);
  CHECK(mml_ledger_cache_grow(g, id, 30)); /* a preload into free room */
  atomic_fetch_add(&k.bytes, 30);
  CHECK(!mml_ledger_cache_grow(g, id, 11)); /* above the cap */
  mml_charge b = charge(1, 50);             /* 0 held, 90 cached: 40 must go */
  CHECK_OK(mml_ledger_request(g, &b, &err), err);
  CHECK_EQ_INT(b.state, MML_CHARGE_GRANTED);
  CHECK_EQ_INT(atomic_load(&k.asked), 40);
  CHECK_EQ_INT(atomic_load(&k.bytes), 50);
  mml_ledger_stats s;
  mml_ledger_get_stats(g, &s);
  CHECK_EQ_INT(s.cached, 50);
  CHECK_EQ_INT(s.evicted_bytes, 40);
  CHECK(s.held[MML_HOLD_ENGINE] + s.cached <= s.cap); /* L3 */
  mml_charge c = charge(2, 60); /* 50 held: cannot fit even with the cache gone */
  atomic_store(&k.calls, 0);
  CHECK_OK(mml_ledger_request(g, &c, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &c), MML_CHARGE_WAITING);
  CHECK_EQ_INT(atomic_load(&k.calls), 0);  /* not evicted for nothing */
  CHECK(!mml_ledger_cache_grow(g, id, 1)); /* a charge waits: caches do not grow */
  mml_ledger_release(g, 50, MML_HOLD_ENGINE);
  CHECK_EQ_INT(mml_ledger_state(g, &c), MML_CHARGE_GRANTED);
  mml_ledger_cache_drop(g, id, atomic_exchange(&k.bytes, 0));
  mml_ledger_get_stats(g, &s);
  CHECK_EQ_INT(s.cached, 0);
  CHECK_EQ_INT(s.held[MML_HOLD_ENGINE], 60);
  mml_ledger_free(g);
}

/* L12: a try is granted exactly when a request would be at once -- in order, with caches
 * evicted to fit -- and otherwise refused with nothing queued or held; mml_ledger_room
 * answers the same without granting. */
TEST(ledger_try_grants_only_at_once) {
  mml_ledger *g = new_ledger(100);
  mml_err err;
  tcache k = {0};
  k.evictable = 1;
  const int id = mml_ledger_add_cache(g, "pages", tcache_evict, &k);
  mml_charge a = charge(5, 60);
  CHECK(mml_ledger_try(g, &a));
  CHECK_EQ_INT(a.state, MML_CHARGE_GRANTED);
  mml_charge b = charge(6, 50); /* 60 held: does not fit */
  CHECK(!mml_ledger_try(g, &b));
  CHECK_EQ_INT(b.state, MML_CHARGE_IDLE);
  mml_ledger_stats s;
  mml_ledger_get_stats(g, &s);
  CHECK_EQ_INT(s.held[MML_HOLD_ENGINE], 60);
  CHECK_EQ_INT(s.waiting, 0); /* nothing queued */
  CHECK_EQ_INT(s.tries_refused, 1);
  /* a waiting charge before it refuses a try that fits (L1); one after it does not */
  mml_charge w = charge(3, 50);
  CHECK_OK(mml_ledger_request(g, &w, &err), err);
  CHECK_EQ_INT(w.state, MML_CHARGE_WAITING);
  mml_charge c = charge(4, 10);
  CHECK(!mml_ledger_try(g, &c));
  mml_charge d = charge(2, 10);
  CHECK(mml_ledger_try(g, &d));
  mml_ledger_release(g, 70, MML_HOLD_ENGINE); /* a and d */
  CHECK_EQ_INT(mml_ledger_state(g, &w), MML_CHARGE_GRANTED);
  /* caches make way for a try (L4) */
  mml_ledger_cache_put(g, id, 50, MML_HOLD_ENGINE); /* w's bytes, kept */
  atomic_store(&k.bytes, 50);
  mml_charge e = charge(7, 80);
  CHECK(mml_ledger_try(g, &e));
  CHECK_EQ_INT(atomic_load(&k.asked), 30);
  mml_ledger_get_stats(g, &s);
  CHECK(s.held[MML_HOLD_ENGINE] + s.cached <= s.cap); /* L3 */
  CHECK_EQ_INT(s.cached, 20);
  /* mml_ledger_room: the same answer, nothing granted (20 cached, 80 held) */
  mml_ledger_get_stats(g, &s);
  const uint64_t grants = s.grants;
  CHECK(mml_ledger_room(g, 9, 20)); /* the cache goes for it */
  CHECK(!mml_ledger_room(g, 9, 21));
  mml_ledger_get_stats(g, &s);
  CHECK_EQ_INT(s.grants, grants);
  CHECK_EQ_INT(s.held[MML_HOLD_ENGINE], 80);
  CHECK_EQ_INT(s.cached, 0);
  CHECK_EQ_INT(s.peak, 100);
  mml_charge v = charge(1, 90); /* waits: room for a later seq is refused, an earlier one not */
  CHECK_OK(mml_ledger_request(g, &v, &err), err);
  CHECK(!mml_ledger_room(g, 2, 1));
  CHECK(mml_ledger_room(g, 0, 1));
  mml_ledger_withdraw(g, &v);
  /* after shutdown: refused */
  mml_ledger_shutdown(g);
  mml_charge f = charge(8, 1);
  CHECK(!mml_ledger_try(g, &f));
  CHECK(!mml_ledger_room(g, 8, 1));
  mml_ledger_free(g);
}

/* The loader's parked read (loader_admit.c R1-R3, T5): a request with no wake callback
 * that waits behind an earlier waiting charge even though it fits (L1), refusing later
 * tries meanwhile; its owner, having read the change count before it looked, sees the
 * grant a release makes by the count moving (L11) and the state; and T5's swap -- an
 * out-of-turn try at seq -1 granted while the ticket waits, then the read's waiting
 * charge withdrawn (and, when a release granted it in turn meanwhile, given back). */
TEST(ledger_waiting_read_parks_and_asks_out_of_turn) {
  mml_ledger *g = new_ledger(100);
  mml_err err;
  mml_charge a = charge(0, 70), tk = charge(2, 40), r = charge(5, 20);
  CHECK_OK(mml_ledger_request(g, &a, &err), err);
  CHECK_OK(mml_ledger_request(g, &tk, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &tk), MML_CHARGE_WAITING);
  CHECK_OK(mml_ledger_request(g, &r, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &r), MML_CHARGE_WAITING); /* fits, but after tk (L1) */
  mml_charge later = charge(6, 1);
  CHECK(!mml_ledger_try(g, &later)); /* refused behind the parked read */
  /* T5: out of turn, before every waiting charge; then the waiting charge leaves */
  mml_charge t5 = charge(-1, r.bytes);
  CHECK(mml_ledger_try(g, &t5));
  mml_ledger_withdraw(g, &r);
  CHECK_EQ_INT(mml_ledger_state(g, &r), MML_CHARGE_IDLE);
  mml_ledger_stats s;
  mml_ledger_get_stats(g, &s);
  CHECK_EQ_INT(s.held[MML_HOLD_ENGINE], 90);
  CHECK_EQ_INT(s.waiting, 1); /* tk only */
  /* a read parked again; the owner reads the count, then a release grants tk and it */
  mml_charge r2 = charge(7, 25);
  CHECK_OK(mml_ledger_request(g, &r2, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &r2), MML_CHARGE_WAITING);
  const uint64_t seen = mml_ledger_changes(g);
  mml_ledger_release(g, 70 + 20, MML_HOLD_ENGINE); /* a's and the read's bytes */
  CHECK(mml_ledger_changes(g) != seen);
  CHECK(mml_ledger_wait_change_for(g, seen, 1000000)); /* at once: it moved */
  CHECK_EQ_INT(mml_ledger_state(g, &tk), MML_CHARGE_GRANTED);
  CHECK_EQ_INT(mml_ledger_state(g, &r2), MML_CHARGE_GRANTED);
  /* T5's swap when the read was granted in turn meanwhile: withdraw leaves the grant, and
   * the owner gives the try's bytes back */
  mml_charge t5b = charge(-1, r2.bytes);
  CHECK(mml_ledger_try(g, &t5b));
  mml_ledger_withdraw(g, &r2);
  CHECK_EQ_INT(mml_ledger_state(g, &r2), MML_CHARGE_GRANTED);
  mml_ledger_release(g, t5b.bytes, MML_HOLD_ENGINE);
  mml_ledger_get_stats(g, &s);
  CHECK_EQ_INT(s.held[MML_HOLD_ENGINE], 40 + 25);
  CHECK_EQ_INT(s.waiting, 0);
  mml_ledger_free(g);
}

/* L13: a count is never refused or queued; caches make way for it first, and what it
 * leaves above the cap is recorded (peak, counted_over, over_most). */
TEST(ledger_count_past_cap_is_recorded) {
  mml_ledger *g = new_ledger(100);
  tcache k = {0};
  k.evictable = 1;
  const int id = mml_ledger_add_cache(g, "pages", tcache_evict, &k);
  CHECK_EQ_INT(mml_ledger_count(g, -1, 40), 0);
  CHECK_EQ_INT(mml_ledger_count(g, id, 30), 0); /* a cache's growth */
  atomic_store(&k.bytes, 30);
  CHECK_EQ_INT(mml_ledger_count(g, -1, 50), 0); /* 20 evicted for it */
  CHECK_EQ_INT(atomic_load(&k.asked), 20);
  mml_ledger_stats s;
  mml_ledger_get_stats(g, &s);
  CHECK_EQ_INT(s.held[MML_HOLD_ENGINE], 90);
  CHECK_EQ_INT(s.cached, 10);
  CHECK_EQ_INT(s.counted_over, 0);
  CHECK_EQ_INT(mml_ledger_count(g, -1, 25), 15); /* the cache goes, then 15 over */
  mml_ledger_get_stats(g, &s);
  CHECK_EQ_INT(s.cached, 0);
  CHECK_EQ_INT(s.held[MML_HOLD_ENGINE], 115);
  CHECK_EQ_INT(s.peak, 115);
  CHECK_EQ_INT(s.counted_over, 1);
  CHECK_EQ_INT(s.over_most, 15);
  CHECK_EQ_INT(s.waiting, 0);
  mml_charge a = charge(0, 1); /* nothing fits while it is over */
  CHECK(!mml_ledger_try(g, &a));
  mml_ledger_release(g, 115, MML_HOLD_ENGINE);
  CHECK(mml_ledger_try(g, &a));
  mml_ledger_free(g);
}

/* A cache that cannot give bytes back leaves the charge waiting (and is asked again on the
 * next change); a drop by its owner then lets it in (L2, L4). */
TEST(ledger_unevictable_cache_drop_wakes) {
  mml_ledger *g = new_ledger(100);
  mml_err err;
  tcache k = {0};
  const int id = mml_ledger_add_cache(g, "open videos", tcache_evict, &k);
  CHECK(mml_ledger_cache_grow(g, id, 70));
  mml_charge a = charge(0, 40);
  CHECK_OK(mml_ledger_request(g, &a, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &a), MML_CHARGE_WAITING);
  mml_ledger_cache_drop(g, id, 30);
  CHECK_EQ_INT(mml_ledger_state(g, &a), MML_CHARGE_GRANTED);
  mml_ledger_free(g);
}

typedef struct blocker {
  mml_ledger *g;
  mml_charge c;
  mml_status st;
  mml_err err;
  atomic_int done;
} blocker;

static void *block_main(void *arg) {
  blocker *b = arg;
  b->st = mml_ledger_acquire(b->g, &b->c, &b->err);
  atomic_store(&b->done, 1);
  return NULL;
}

/* Waits (bounded) until `n` charges wait in the ledger. */
static int wait_waiting(mml_ledger *g, int64_t n) {
  for (int i = 0; i < 20000; i++) {
    mml_ledger_stats s;
    mml_ledger_get_stats(g, &s);
    if (s.waiting == n) return 1;
    usleep(100);
  }
  return 0;
}

/* L6: a blocked acquire is woken by the release that lets it fit, and by nothing else
 * (it stays blocked while a release leaves it short); no timeout is involved. */
TEST(ledger_release_wakes_blocked_acquire) {
  mml_ledger *g = new_ledger(100);
  mml_err err;
  mml_charge a = charge(0, 90);
  CHECK_OK(mml_ledger_request(g, &a, &err), err);
  blocker b = {0};
  b.g = g;
  b.c = charge(1, 50);
  pthread_t th;
  CHECK_EQ_INT(pthread_create(&th, NULL, block_main, &b), 0);
  CHECK(wait_waiting(g, 1));
  mml_ledger_release(g, 30, MML_HOLD_ENGINE); /* 60 + 50 > 100 */
  CHECK_EQ_INT(atomic_load(&b.done), 0);
  CHECK(wait_waiting(g, 1));
  mml_ledger_release(g, 10, MML_HOLD_ENGINE); /* 50 + 50: fits */
  pthread_join(th, NULL);
  CHECK_EQ_INT(b.st, MML_OK);
  CHECK_EQ_INT(b.c.state, MML_CHARGE_GRANTED);
  mml_ledger_free(g);
}

typedef struct change_waiter {
  mml_ledger *g;
  uint64_t seen;
  atomic_int done;
} change_waiter;

static void *change_wait_main(void *arg) {
  change_waiter *w = arg;
  mml_ledger_wait_change(w->g, w->seen);
  atomic_store(&w->done, 1);
  return NULL;
}

/* L11: a thread blocked in mml_ledger_wait_change wakes when a waiting charge is granted
 * (not for a release that leaves it short), when a revocable grant is asked back, and
 * when its owner pokes; a count already past `seen` returns at once. */
TEST(ledger_wait_change_wakes_on_grant_revoke_and_poke) {
  mml_ledger *g = new_ledger(100);
  mml_err err;
  mml_charge a = charge(0, 90), b = charge(1, 50);
  CHECK_OK(mml_ledger_request(g, &a, &err), err);
  CHECK_OK(mml_ledger_request(g, &b, &err), err);
  CHECK_EQ_INT(b.state, MML_CHARGE_WAITING);
  change_waiter w = {g, mml_ledger_changes(g), 0};
  pthread_t th;
  CHECK_EQ_INT(pthread_create(&th, NULL, change_wait_main, &w), 0);
  mml_ledger_release(g, 30, MML_HOLD_ENGINE); /* 60 + 50 > 100: no change */
  CHECK_EQ_INT(mml_ledger_changes(g), (long long)w.seen);
  CHECK_EQ_INT(atomic_load(&w.done), 0);
  mml_ledger_release(g, 10, MML_HOLD_ENGINE); /* b fits: granted */
  pthread_join(th, NULL);
  CHECK_EQ_INT(mml_ledger_state(g, &b), MML_CHARGE_GRANTED);
  /* a revocable grant asked back for an earlier charge wakes its owner's waiter */
  mml_charge r = charge(5, 40), h = charge(2, 50);
  r.revocable = 1;
  mml_ledger_release(g, 50, MML_HOLD_ENGINE); /* b's bytes: 50 held (a) */
  CHECK_OK(mml_ledger_request(g, &r, &err), err);
  CHECK_EQ_INT(r.state, MML_CHARGE_GRANTED);
  w.seen = mml_ledger_changes(g);
  atomic_store(&w.done, 0);
  CHECK_EQ_INT(pthread_create(&th, NULL, change_wait_main, &w), 0);
  CHECK_OK(mml_ledger_request(g, &h, &err), err); /* 50 + 40 + 50 > 100: r asked back */
  pthread_join(th, NULL);
  CHECK_EQ_INT(r.revoking, 1);
  mml_ledger_give_back(g, &r);
  CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_GRANTED);
  /* a poke wakes it; a count already changed does not block */
  w.seen = mml_ledger_changes(g);
  atomic_store(&w.done, 0);
  CHECK_EQ_INT(pthread_create(&th, NULL, change_wait_main, &w), 0);
  mml_ledger_poke(g);
  pthread_join(th, NULL);
  CHECK_EQ_INT(atomic_load(&w.done), 1);
  mml_ledger_wait_change(g, w.seen);
  mml_ledger_free(g);
}

typedef struct bounded_waiter {
  mml_ledger *g;
  uint64_t seen;
  int changed;
} bounded_waiter;

static void *bounded_wait_main(void *arg) {
  bounded_waiter *w = arg;
  w->changed = mml_ledger_wait_change_for(w->g, w->seen, 60LL * 1000000000);
  return NULL;
}

/* L11's bounded form: mml_ledger_wait_change_for returns 0 when its time runs out with the
 * count unchanged, 1 at once when the count is already past `seen`, and 1 when a poke
 * comes while it waits (long before its 60 s bound: the runner's timeout is shorter). */
TEST(ledger_wait_change_for_bounded) {
  mml_ledger *g = new_ledger(100);
  const uint64_t seen = mml_ledger_changes(g);
  CHECK_EQ_INT(mml_ledger_wait_change_for(g, seen, 1000000), 0); /* 1 ms, nothing changed */
  CHECK_EQ_INT(mml_ledger_changes(g), (long long)seen);
  mml_ledger_poke(g);
  CHECK_EQ_INT(mml_ledger_wait_change_for(g, seen, 60LL * 1000000000), 1); /* already */
  bounded_waiter w = {g, mml_ledger_changes(g), -1};
  pthread_t th;
  CHECK_EQ_INT(pthread_create(&th, NULL, bounded_wait_main, &w), 0);
  mml_ledger_poke(g);
  pthread_join(th, NULL);
  CHECK_EQ_INT(w.changed, 1);
  mml_ledger_free(g);
}

/* L11 under load: an owner queues work under its own lock and pokes; a taker reads the
 * count under that lock before it looks, and blocks in mml_ledger_wait_change when it
 * found nothing.  Meanwhile a third thread's charges are granted and released.  Every
 * item is taken: a lost wakeup would leave the taker blocked (the runner's timeout). */
typedef struct owner_q {
  pthread_mutex_t mu;
  mml_ledger *g;
  int queued, taken, total;
} owner_q;

static void *owner_take_main(void *arg) {
  owner_q *q = arg;
  for (;;) {
    pthread_mutex_lock(&q->mu);
    const uint64_t seen = mml_ledger_changes(q->g);
    if (q->queued) {
      q->queued--;
      q->taken++;
    }
    const int all = q->taken == q->total, none = !q->queued;
    pthread_mutex_unlock(&q->mu);
    if (all) return NULL;
    if (none) mml_ledger_wait_change(q->g, seen);
  }
}

static void *owner_churn_main(void *arg) {
  owner_q *q = arg;
  mml_err err;
  for (int i = 0; i < 2000; i++) {
    mml_charge c = charge(i, 1 + i % 7);
    if (mml_ledger_acquire(q->g, &c, &err)) return NULL;
    mml_ledger_release(q->g, c.bytes, MML_HOLD_ENGINE);
  }
  return NULL;
}

TEST(ledger_wait_change_loses_no_owner_event) {
  owner_q q = {PTHREAD_MUTEX_INITIALIZER, new_ledger(8), 0, 0, 20000};
  pthread_t taker, churn;
  CHECK_EQ_INT(pthread_create(&taker, NULL, owner_take_main, &q), 0);
  CHECK_EQ_INT(pthread_create(&churn, NULL, owner_churn_main, &q), 0);
  for (int i = 0; i < q.total; i++) {
    pthread_mutex_lock(&q.mu);
    q.queued++;
    mml_ledger_poke(q.g); /* under the owner's lock: owner -> ledger */
    pthread_mutex_unlock(&q.mu);
    if (i % 64 == 0) sched_yield();
  }
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 30; /* it takes milliseconds: 30 s is a lost wakeup, not a slow machine */
  const int joined = pthread_timedjoin_np(taker, NULL, &until) == 0;
  if (!joined) {
    pthread_mutex_lock(&q.mu);
    fprintf(stderr, "  the taker is blocked with %d items taken of %d: a lost wakeup (L11)\n",
            q.taken, q.total);
    pthread_mutex_unlock(&q.mu);
  }
  CHECK(joined);
  pthread_join(churn, NULL);
  CHECK_EQ_INT(q.taken, q.total);
  mml_ledger_free(q.g);
}

static void name_seq(void *arg, int64_t seq, char *out, size_t cap) {
  snprintf(out, cap, "%s line %lld", (const char *)arg, (long long)seq + 1);
}

/* L7, L8: the head fails only when it does not fit, nothing is running and the consumer
 * waits; the message names the work, what is held and the cap that would fit. */
TEST(ledger_deadlock_rule_and_explainer) {
  mml_ledger_cfg cfg = {0};
  cfg.cap = 100;
  cfg.name = name_seq;
  cfg.name_arg = "shard a.jsonl";
  cfg.hint = "or hold fewer batches";
  mml_ledger *g;
  mml_err err;
  CHECK_OK(mml_ledger_new(&cfg, &g, &err), err);
  mml_charge a = charge(0, 50), r = charge(1, 20), h = charge(2, 45);
  CHECK_OK(mml_ledger_request(g, &a, &err), err);
  CHECK_OK(mml_ledger_request(g, &r, &err), err);
  mml_ledger_hand_over(g, 50); /* a batch the consumer holds */
  h.wake = log_wake;
  wake_n = 0;
  CHECK_OK(mml_ledger_request(g, &h, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_WAITING);
  mml_ledger_consumer_waiting(g, 1); /* r is running: it will give its bytes back */
  CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_WAITING);
  mml_ledger_hand_over(g, 20); /* r finished: it may be what the consumer waits for */
  CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_WAITING);
  mml_ledger_consumer_waiting(g, 1); /* it looked again: nothing runs, nothing for it */
  CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_FAILED);
  CHECK_EQ_INT(wake_n, 1);
  CHECK_EQ_INT(mml_ledger_error(g, &err), MML_ENOMEM);
  CHECK(strstr(err.msg,
               "shard a.jsonl line 3: max_memory=100 cannot hold the 45 bytes of work "
               "beside"));
  CHECK(strstr(err.msg, "beside 70 bytes of finished work"));
  CHECK(strstr(err.msg, "max_memory >= 115 would hold it; or hold fewer batches"));
  /* a charge requested while it already holds: fails at once, its own status */
  mml_charge n = charge(3, 40);
  CHECK_EQ_INT(mml_ledger_request(g, &n, &err), MML_ENOMEM);
  CHECK_EQ_INT(n.state, MML_CHARGE_FAILED);
  /* the consumer not waiting: the same charge just waits for its release */
  mml_ledger_consumer_waiting(g, 0);
  mml_charge m = charge(4, 40);
  CHECK_OK(mml_ledger_request(g, &m, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &m), MML_CHARGE_WAITING);
  mml_ledger_release(g, 50, MML_HOLD_CONSUMER);
  CHECK_EQ_INT(mml_ledger_state(g, &m), MML_CHARGE_GRANTED);
  mml_ledger_free(g);
}

/* L7 with FIXED credit: bytes set aside for the owner's lifetime (a reserve) count
 * against the cap but are not credit that will come back, so the head fails once only
 * they and the consumer's are held; the same bytes held as ENGINE credit (work running)
 * keep it waiting.  Releasing FIXED credit is no end of work: the declaration stays. */
TEST(ledger_deadlock_rule_with_and_without_fixed_credit) {
  for (int fixed = 0; fixed < 2; fixed++) {
    mml_ledger *g = new_ledger(100);
    mml_err err;
    if (fixed)
      CHECK_EQ_INT(mml_ledger_count_fixed(g, 30), 0);
    else
      CHECK_EQ_INT(mml_ledger_count(g, -1, 30), 0);
    mml_charge a = charge(0, 40), h = charge(1, 40);
    CHECK_OK(mml_ledger_request(g, &a, &err), err);
    mml_ledger_hand_over(g, 40); /* a batch the consumer holds */
    CHECK_OK(mml_ledger_request(g, &h, &err), err);
    CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_WAITING); /* 30 + 40 + 40 > 100 */
    mml_ledger_consumer_waiting(g, 1);
    mml_ledger_stats s;
    mml_ledger_get_stats(g, &s);
    if (!fixed) { /* running work: it will give its 30 back */
      CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_WAITING);
      CHECK_EQ_INT(s.held[MML_HOLD_ENGINE], 30);
      CHECK_EQ_INT(s.consumer_waiting, 1);
      mml_ledger_release(g, 30, MML_HOLD_ENGINE); /* it did: room, granted */
      CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_GRANTED);
      mml_ledger_free(g);
      continue;
    }
    CHECK_EQ_INT(s.held[MML_HOLD_ENGINE], 0);
    CHECK_EQ_INT(s.held[MML_HOLD_FIXED], 30);
    CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_FAILED);
    CHECK_EQ_INT(mml_ledger_error(g, &err), MML_ENOMEM);
    CHECK(strstr(err.msg, "30 bytes set aside for the loader's lifetime"));
    CHECK(strstr(err.msg, "max_memory >= 110 would hold it"));
    /* a FIXED release is no end of work: the declaration holds (a head that does not
     * fit fails at once), and the room it gave lets in what fits now */
    mml_ledger_release(g, 30, MML_HOLD_FIXED);
    mml_ledger_get_stats(g, &s);
    CHECK_EQ_INT(s.held[MML_HOLD_FIXED], 0);
    CHECK_EQ_INT(s.consumer_waiting, 1);
    mml_charge m = charge(2, 70); /* 40 + 70 > 100 */
    CHECK_EQ_INT(mml_ledger_request(g, &m, &err), MML_ENOMEM);
    CHECK_EQ_INT(m.state, MML_CHARGE_FAILED);
    mml_charge k = charge(3, 60); /* 40 + 60 fits */
    CHECK_OK(mml_ledger_request(g, &k, &err), err);
    CHECK_EQ_INT(mml_ledger_state(g, &k), MML_CHARGE_GRANTED);
    mml_ledger_free(g);
  }
}

/* L7 with the head's own credit (c->own: a parked read's bytes so far, which come back
 * only after it): not waited for; ENGINE credit beyond it is. */
TEST(ledger_deadlock_rule_does_not_wait_for_the_heads_own_credit) {
  for (int other = 0; other < 2; other++) {
    mml_ledger *g = new_ledger(100);
    mml_err err;
    CHECK_EQ_INT(mml_ledger_count(g, -1, 30 + other), 0); /* the head's owner holds 30 */
    mml_charge a = charge(0, 40), h = charge(1, 40);
    CHECK_OK(mml_ledger_request(g, &a, &err), err);
    mml_ledger_hand_over(g, 40); /* a batch the consumer holds */
    h.own = 30;
    CHECK_OK(mml_ledger_request(g, &h, &err), err);
    CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_WAITING);
    mml_ledger_consumer_waiting(g, 1);
    if (other) { /* 1 byte of other work running: it may give room back */
      CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_WAITING);
      mml_ledger_release(g, 1, MML_HOLD_ENGINE); /* it ended: only the head's own is left */
      mml_ledger_consumer_waiting(g, 1);         /* the consumer looks again, declares */
    }
    CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_FAILED);
    CHECK_EQ_INT(mml_ledger_error(g, &err), MML_ENOMEM);
    CHECK(strstr(err.msg, "30 bytes of work waiting for them")); /* L8: nothing runs */
    mml_ledger_free(g);
  }
}

/* L7 with L11: the consumer's wait declared through its change count.  An end of ENGINE
 * work between its look and its wait moves the count: the wait returns at once and
 * declares nothing (a stale look never declares); a fresh look declares, and the deadlock
 * rule's failure ends the wait; an owner's poke ends a declaration. */
TEST(ledger_consumer_wait_never_declares_a_stale_look) {
  mml_ledger *g = new_ledger(100);
  mml_err err;
  mml_charge a = charge(0, 60), w = charge(1, 10), h = charge(2, 40);
  CHECK_OK(mml_ledger_request(g, &a, &err), err);
  mml_ledger_hand_over(g, 60);
  CHECK_OK(mml_ledger_request(g, &w, &err), err); /* work running */
  CHECK_OK(mml_ledger_request(g, &h, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_WAITING);
  const uint64_t seen = mml_ledger_consumer_changes(g); /* the consumer looks: nothing */
  mml_ledger_hand_over(g, 10); /* w finished meanwhile: perhaps what it waits for */
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += 30;                                            /* only a hang would reach it */
  CHECK_EQ_INT(mml_ledger_consumer_wait(g, seen, 1, &until), 1); /* at once: look again */
  CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_WAITING);     /* nothing was declared */
  mml_ledger_stats s;
  mml_ledger_get_stats(g, &s);
  CHECK_EQ_INT(s.consumer_waiting, 0);
  /* it looked again: nothing for it, nothing running: declared, the head fails, and the
   * failure ends the wait (the stream ends in that error) */
  CHECK_EQ_INT(mml_ledger_consumer_wait(g, mml_ledger_consumer_changes(g), 1, &until), 1);
  CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_FAILED);
  /* a bounded wait with nothing happening runs out (0) and withdraws its declaration */
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_nsec += 2000000;
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  CHECK_EQ_INT(mml_ledger_consumer_wait(g, mml_ledger_consumer_changes(g), 1, &until), 0);
  mml_ledger_get_stats(g, &s);
  CHECK_EQ_INT(s.consumer_waiting, 0);
  /* an owner's poke (work started that holds no credit: a read) makes the look stale and
   * ends a declaration: a head that does not fit waits instead of failing */
  mml_ledger_consumer_waiting(g, 1);
  mml_ledger_consumer_poke(g);
  mml_charge h2 = charge(3, 50); /* 70 held by the consumer + 50 > 100 */
  CHECK_OK(mml_ledger_request(g, &h2, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &h2), MML_CHARGE_WAITING);
  mml_ledger_get_stats(g, &s);
  CHECK_EQ_INT(s.consumer_waiting, 0);
  mml_ledger_withdraw(g, &h2);
  mml_ledger_free(g);
}

/* L7 with L11, threads: a consumer that waits by its change count is woken only where its
 * answer can change.  An end of ENGINE work, or its owner's stale event, ends its
 * declaration (the look is stale) but wakes it only once the head does not fit with no
 * ENGINE credit held, L7's case: then it looks, declares again and the head fails.  Its
 * owner's poke (a batch queued) wakes it at once.  So it wakes once for L7's case and once
 * for the failure, never per end of work (no polling, no busy loop). */
typedef struct cons_loop {
  mml_ledger *g;
  pthread_mutex_t mu; /* the owner's lock: the consumer looks under it */
  int got;            /* the owner's queue: something for the consumer (under mu) */
  int busy;           /* the owner runs work without credit: no declaration (under mu) */
  mml_charge *head;
  atomic_int wakes;
} cons_loop;

static void *cons_loop_main(void *arg) {
  cons_loop *C = arg;
  for (;;) {
    pthread_mutex_lock(&C->mu);
    const uint64_t seen = mml_ledger_consumer_changes(C->g); /* before the look */
    const int done = C->got || mml_ledger_state(C->g, C->head) == MML_CHARGE_FAILED;
    const int declare = !C->busy;
    pthread_mutex_unlock(&C->mu);
    if (done) return NULL;
    (void)mml_ledger_consumer_wait(C->g, seen, declare, NULL);
    atomic_fetch_add(&C->wakes, 1);
  }
}

/* The consumer has `wakes` wakeups and is blocked with its wait declared (or not). */
static int wait_blocked(mml_ledger *g, int declared, int wakes, atomic_int *n) {
  for (int i = 0; i < 20000; i++) {
    mml_ledger_stats s;
    mml_ledger_get_stats(g, &s);
    if (s.consumer_waiting == declared && atomic_load(n) == wakes) return 1;
    usleep(100);
  }
  return 0;
}

/* No wakeup comes within 20 ms (one would make it look and declare again). */
static int stays_asleep(mml_ledger *g, int wakes, atomic_int *n) {
  usleep(20000);
  mml_ledger_stats s;
  mml_ledger_get_stats(g, &s);
  return atomic_load(n) == wakes && !s.consumer_waiting;
}

TEST(ledger_consumer_woken_only_where_deadlock_rule_decides) {
  cons_loop C;
  memset(&C, 0, sizeof C);
  C.g = new_ledger(100);
  pthread_mutex_init(&C.mu, NULL);
  mml_err err;
  CHECK_EQ_INT(mml_ledger_count_fixed(C.g, 10), 0); /* a reserve: not waited for */
  mml_charge a = charge(0, 50), w = charge(1, 30), h = charge(2, 40);
  CHECK_OK(mml_ledger_request(C.g, &a, &err), err);
  mml_ledger_hand_over(C.g, 50);
  CHECK_OK(mml_ledger_request(C.g, &w, &err), err); /* work running: 30 */
  CHECK_OK(mml_ledger_request(C.g, &h, &err), err); /* 10 + 50 + 30 + 40 > 100 */
  C.head = &h;
  pthread_t th;
  CHECK_EQ_INT(pthread_create(&th, NULL, cons_loop_main, &C), 0);
  CHECK(wait_blocked(C.g, 1, 0, &C.wakes));
  mml_ledger_release(C.g, 10, MML_HOLD_ENGINE); /* an end of work: 20 still running */
  CHECK(stays_asleep(C.g, 0, &C.wakes));        /* declaration ended, L7 cannot decide */
  mml_ledger_hand_over(C.g, 10);                /* another: 10 still running */
  CHECK(stays_asleep(C.g, 0, &C.wakes));
  mml_ledger_consumer_stale(C.g); /* the owner's: work started, or the engine idle now */
  CHECK(stays_asleep(C.g, 0, &C.wakes));
  CHECK_EQ_INT(mml_ledger_state(C.g, &h), MML_CHARGE_WAITING);
  mml_ledger_release(C.g, 10, MML_HOLD_ENGINE); /* the last: nothing runs now, L7's case */
  pthread_join(th, NULL);
  CHECK_EQ_INT(mml_ledger_state(C.g, &h), MML_CHARGE_FAILED);
  CHECK_EQ_INT(atomic_load(&C.wakes), 2); /* L7's case and the failure: no more */
  /* the owner busy at the look (no declaration) in L7's case: its stale event when it
   * may be idle wakes the consumer, which declares and the head fails */
  mml_charge h3 = charge(4, 50); /* 10 + 60 + 50 > 100, nothing running */
  CHECK_OK(mml_ledger_request(C.g, &h3, &err), err);
  CHECK_EQ_INT(mml_ledger_state(C.g, &h3), MML_CHARGE_WAITING); /* nobody declared */
  C.head = &h3;
  C.busy = 1;
  atomic_store(&C.wakes, 0);
  CHECK_EQ_INT(pthread_create(&th, NULL, cons_loop_main, &C), 0);
  CHECK(wait_blocked(C.g, 0, 0, &C.wakes));
  CHECK(stays_asleep(C.g, 0, &C.wakes)); /* its look is fresh: nothing to look at again */
  pthread_mutex_lock(&C.mu);
  C.busy = 0;
  mml_ledger_consumer_stale(C.g);
  pthread_mutex_unlock(&C.mu);
  pthread_join(th, NULL);
  CHECK_EQ_INT(mml_ledger_state(C.g, &h3), MML_CHARGE_FAILED);
  CHECK_EQ_INT(atomic_load(&C.wakes), 2); /* the stale event in L7's case, the failure */
  /* the owner's own event (a batch queued under its lock, then a poke) ends a wait at
   * once, L7's case or not */
  mml_charge h2 = charge(3, 0);
  CHECK_OK(mml_ledger_request(C.g, &h2, &err), err);
  C.head = &h2;
  atomic_store(&C.wakes, 0);
  CHECK_EQ_INT(pthread_create(&th, NULL, cons_loop_main, &C), 0);
  CHECK(wait_blocked(C.g, 1, 0, &C.wakes));
  pthread_mutex_lock(&C.mu);
  C.got = 1;
  mml_ledger_consumer_poke(C.g);
  pthread_mutex_unlock(&C.mu);
  pthread_join(th, NULL);
  CHECK_EQ_INT(atomic_load(&C.wakes), 1);
  pthread_mutex_destroy(&C.mu);
  mml_ledger_free(C.g);
}

/* L8: a charge above the cap alone fails at once, naming the cap it needs. */
TEST(ledger_too_large_alone) {
  mml_ledger *g = new_ledger(100);
  mml_err err;
  mml_charge a = charge(9, 150);
  CHECK_EQ_INT(mml_ledger_request(g, &a, &err), MML_ENOMEM);
  CHECK_EQ_INT(a.state, MML_CHARGE_FAILED);
  CHECK(strstr(err.msg,
               "stream position 9: max_memory=100 cannot hold the 150 bytes of work "
               "beside"));
  CHECK(strstr(err.msg, "max_memory >= 150 would hold it"));
  mml_charge b = charge(10, 100);
  CHECK_OK(mml_ledger_acquire(g, &b, &err), err); /* the next one is not held up */
  mml_ledger_free(g);
}

/* L8: the name and the what a requester copies into its charge name the work in the
 * message (no name callback runs: none is set), and the owner composes its own messages
 * from a failure's parts or the figures now with the same explainer, its words (the
 * consumer's credit split, a hint, what the work asks next) in place of the ledger's. */
TEST(ledger_explainer_names_the_charge) {
  mml_ledger *g = new_ledger(100);
  mml_err err;
  mml_ledger_oom o;
  CHECK_EQ_INT(mml_ledger_oom_failed(g, &o), 0);
  (void)mml_ledger_count_fixed(g, 10);
  mml_charge a = charge(4, 120);
  snprintf(a.name, sizeof a.name, "%s", "data.jsonl:7");
  a.what = "its images' bytes";
  CHECK_EQ_INT(mml_ledger_request(g, &a, &err), MML_ENOMEM);
  CHECK(strstr(err.msg,
               "data.jsonl:7: max_memory=100 cannot hold the 120 bytes of its images' "
               "bytes beside 0 bytes of finished work"));
  CHECK(strstr(err.msg, "10 bytes set aside for the loader's lifetime"));
  CHECK(strstr(err.msg, "max_memory >= 130 would hold it"));
  CHECK_EQ_INT(mml_ledger_oom_failed(g, &o), 1);
  CHECK_EQ_INT(o.need, 120);
  CHECK_EQ_INT(o.held[MML_HOLD_FIXED], 10);
  CHECK(!strcmp(o.name, "data.jsonl:7"));
  mml_ledger_release(g, 10, MML_HOLD_FIXED); /* later changes leave the failure's figures */
  o.split = "30 bytes of batches the consumer holds";
  o.alone = 0;
  o.hint = "release earlier batches";
  CHECK_EQ_INT(mml_ledger_explain(g, &o, &err), MML_ENOMEM);
  CHECK(strstr(err.msg, "waiting for the consumer (30 bytes of batches the consumer holds)"));
  CHECK(strstr(err.msg, "max_memory >= 130 would hold it; release earlier batches"));
  o.hint = ""; /* none (the consumer holds no batch) */
  CHECK_EQ_INT(mml_ledger_explain(g, &o, &err), MML_ENOMEM);
  CHECK(strstr(err.msg, "max_memory >= 130 would hold it") && !strstr(err.msg, "; "));
  o.then = 25; /* what the same work asks next (a batch's other tensors): in the figure */
  CHECK_EQ_INT(mml_ledger_explain(g, &o, &err), MML_ENOMEM);
  CHECK(strstr(err.msg, "120 bytes of its images' bytes (and the 25 bytes it asks next) beside"));
  CHECK(strstr(err.msg, "max_memory >= 155 would hold it"));
  mml_ledger_oom_now(g, -1, 60, 1, &o); /* not named: its owner names it */
  o.what = "a sample";
  CHECK_EQ_INT(mml_ledger_explain(g, &o, &err), MML_ENOMEM);
  CHECK(!strncmp(err.msg, "max_memory=100 cannot hold the 60 bytes of a sample beside", 58));
  CHECK(strstr(err.msg, "max_memory >= 60 would hold it") && !strstr(err.msg, "; "));
  mml_ledger_free(g);
}

/* L9: no cap, nothing waits. */
TEST(ledger_no_cap_grants_everything) {
  mml_ledger *g = new_ledger(0);
  mml_err err;
  mml_charge c[4];
  for (int i = 0; i < 4; i++) {
    c[i] = charge(3 - i, (int64_t)1 << 40);
    CHECK_OK(mml_ledger_acquire(g, &c[i], &err), err);
  }
  mml_ledger_stats s;
  mml_ledger_get_stats(g, &s);
  CHECK_EQ_INT(s.held[MML_HOLD_ENGINE], (int64_t)4 << 40);
  CHECK_EQ_INT(s.waits, 0);
  mml_ledger_free(g);
}

/* Shutdown fails every blocked acquire with MML_ECANCELLED and every later request. */
TEST(ledger_shutdown_wakes_everyone) {
  mml_ledger *g = new_ledger(10);
  mml_err err;
  mml_charge a = charge(0, 10);
  CHECK_OK(mml_ledger_acquire(g, &a, &err), err);
  enum { N = 4 };
  blocker b[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    memset(&b[i], 0, sizeof b[i]);
    b[i].g = g;
    b[i].c = charge(1 + i, 5);
    CHECK_EQ_INT(pthread_create(&th[i], NULL, block_main, &b[i]), 0);
  }
  CHECK(wait_waiting(g, N));
  mml_ledger_shutdown(g);
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    CHECK_EQ_INT(b[i].st, MML_ECANCELLED);
  }
  mml_charge late = charge(9, 1);
  CHECK_EQ_INT(mml_ledger_request(g, &late, &err), MML_ECANCELLED);
  mml_ledger_free(g);
}

/* L10: reads ahead (revocable) of later samples are asked back, latest first and only as
 * many as the head needs, for an earlier sample's part that does not fit; a settled one
 * never is; what is given back lets the head in. */
static int revoke_log[16], revoke_n;
static void log_revoke(void *arg) { revoke_log[revoke_n++] = (int)(intptr_t)arg; }

/* L7 with credit behind the head (mml_ledger_consumer_behind): ENGINE credit the owner
 * declares as work that can go on only after the head (the head batch's own samples' bytes,
 * read and waiting for its buffer) does not keep the head waiting, ENGINE credit beyond it
 * does, and a revocable grant after the head is asked back first (L10): the head fails
 * only once nothing more can be asked back and nothing is being given back. */
TEST(ledger_deadlock_rule_with_credit_behind_the_head) {
  mml_ledger *g = new_ledger(100);
  mml_err err;
  mml_charge a = charge(0, 40), w = charge(5, 20), r = charge(6, 20), h = charge(4, 30);
  CHECK_OK(mml_ledger_request(g, &a, &err), err);
  mml_ledger_hand_over(g, 40);                    /* a batch the consumer holds */
  CHECK_OK(mml_ledger_request(g, &w, &err), err); /* bytes of the head's own sample */
  r.revocable = 1;                                /* a later sample's, read again later */
  r.revoke = log_revoke;
  r.wake_arg = (void *)(intptr_t)6;
  CHECK_OK(mml_ledger_request(g, &r, &err), err);
  revoke_n = 0;
  CHECK_OK(mml_ledger_request(g, &h, &err), err); /* 40 + 20 + 20 + 30 > 100 */
  CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_WAITING);
  CHECK_EQ_INT(revoke_n, 1);         /* L10: sample 6's asked back */
  mml_ledger_keep(g, &r);            /* which cannot be given back */
  mml_ledger_consumer_behind(g, 20); /* less than the 40 the engine holds */
  mml_ledger_consumer_waiting(g, 1);
  CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_WAITING);
  mml_ledger_consumer_waiting(g, 0);
  mml_ledger_consumer_behind(g, 40); /* all of it behind the head: nothing else comes back */
  mml_ledger_consumer_waiting(g, 1);
  CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_FAILED);
  CHECK_EQ_INT(mml_ledger_error(g, &err), MML_ENOMEM);
  CHECK(strstr(err.msg, "max_memory >= 110 would hold it"));
  CHECK(strstr(err.msg, ", 40 bytes of work waiting for them, ")); /* L8: none running */
  CHECK(!strstr(err.msg, "running"));
  /* a revocable grant still to ask back keeps the head waiting, whatever is behind it */
  mml_charge r2 = charge(7, 20), h2 = charge(4, 30);
  r2.revocable = 1;
  r2.revoke = log_revoke;
  r2.wake_arg = (void *)(intptr_t)7;
  mml_ledger_consumer_waiting(g, 0);
  mml_ledger_release(g, 20, MML_HOLD_ENGINE); /* w's bytes: 40 + 20 held */
  CHECK_OK(mml_ledger_request(g, &r2, &err), err);
  CHECK_OK(mml_ledger_request(g, &h2, &err), err); /* 40 + 20 + 20 + 30 > 100 */
  mml_ledger_consumer_behind(g, 40);
  mml_ledger_consumer_waiting(g, 1);
  CHECK_EQ_INT(mml_ledger_state(g, &h2), MML_CHARGE_WAITING); /* r2 is being asked back */
  mml_ledger_give_back(g, &r2);
  CHECK_EQ_INT(mml_ledger_state(g, &h2), MML_CHARGE_GRANTED);
  mml_ledger_free(g);
}

TEST(ledger_revokes_later_reads_for_the_head) {
  mml_ledger *g = new_ledger(100);
  mml_err err;
  mml_charge r[3];
  for (int i = 0; i < 3; i++) { /* reads of samples 4, 5, 6 */
    r[i] = charge(4 + i, 30);
    r[i].revocable = 1;
    r[i].revoke = log_revoke;
    r[i].wake_arg = (void *)(intptr_t)(4 + i);
    CHECK_OK(mml_ledger_request(g, &r[i], &err), err);
    CHECK_EQ_INT(r[i].state, MML_CHARGE_GRANTED);
  }
  CHECK(mml_ledger_settle(g, &r[0])); /* sample 4's decode began: final */
  revoke_n = 0;
  mml_charge s4 = charge(4, 40); /* sample 4's scratch: 90 + 40 > 100 */
  CHECK_OK(mml_ledger_request(g, &s4, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &s4), MML_CHARGE_WAITING);
  CHECK_EQ_INT(revoke_n, 1); /* 30 short: sample 6's read alone, the latest */
  CHECK_EQ_INT(revoke_log[0], 6);
  CHECK(!mml_ledger_settle(g, &r[2])); /* asked back: it must be given back */
  mml_charge s5 = charge(5, 0);        /* behind the head: nothing more is asked back */
  CHECK_OK(mml_ledger_request(g, &s5, &err), err);
  CHECK_EQ_INT(revoke_n, 1);
  mml_ledger_give_back(g, &r[2]);
  CHECK_EQ_INT(r[2].state, MML_CHARGE_IDLE);
  CHECK_EQ_INT(mml_ledger_state(g, &s4), MML_CHARGE_GRANTED);
  CHECK_EQ_INT(mml_ledger_state(g, &s5), MML_CHARGE_GRANTED);
  mml_ledger_stats st;
  mml_ledger_get_stats(g, &st);
  CHECK_EQ_INT(st.held[MML_HOLD_ENGINE], 30 + 30 + 40);
  CHECK_EQ_INT(st.revoked, 1);
  /* an earlier head than a settled read: the settled one is never asked back */
  CHECK(mml_ledger_settle(g, &r[1]));
  mml_charge s3 = charge(3, 10);
  CHECK_OK(mml_ledger_request(g, &s3, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &s3), MML_CHARGE_WAITING);
  CHECK_EQ_INT(revoke_n, 1);
  mml_ledger_give_back(g, &r[1]); /* sample 5's work ended: room */
  CHECK_EQ_INT(mml_ledger_state(g, &s3), MML_CHARGE_GRANTED);
  mml_ledger_free(g);
}

/* L10 with mml_ledger_keep, as the loader's reads use it (loader_admit.c R5): a read
 * asked back whose bytes cannot be read again (fetched meanwhile) is kept -- final, no
 * longer counted as coming back -- so the head asks the next latest one back; keeping
 * one that was not asked back only settles it (nothing more asked back). */
TEST(ledger_keep_asks_back_the_next) {
  mml_ledger *g = new_ledger(100);
  mml_err err;
  mml_charge r[3];
  for (int i = 0; i < 3; i++) { /* reads of samples 4, 5, 6 */
    r[i] = charge(4 + i, 30);
    r[i].revocable = 1;
    r[i].revoke = log_revoke;
    r[i].wake_arg = (void *)(intptr_t)(4 + i);
    CHECK_OK(mml_ledger_request(g, &r[i], &err), err);
  }
  revoke_n = 0;
  mml_charge h = charge(2, 30); /* 90 + 30 > 100: 20 short, sample 6's read asked back */
  CHECK_OK(mml_ledger_request(g, &h, &err), err);
  CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_WAITING);
  CHECK_EQ_INT(revoke_n, 1);
  CHECK_EQ_INT(revoke_log[0], 6);
  const uint64_t seen = mml_ledger_changes(g);
  mml_ledger_keep(g, &r[2]); /* it cannot give it back: sample 5's is asked instead */
  CHECK_EQ_INT(revoke_n, 2);
  CHECK_EQ_INT(revoke_log[1], 5);
  CHECK(mml_ledger_changes(g) != seen); /* L11: the owner's workers look again */
  CHECK_EQ_INT(mml_ledger_state(g, &r[2]), MML_CHARGE_GRANTED);
  CHECK(mml_ledger_settle(g, &r[2])); /* kept: final, not asked back again */
  mml_ledger_keep(g, &r[0]);          /* not asked back: only settled */
  CHECK_EQ_INT(revoke_n, 2);
  mml_ledger_give_back(g, &r[1]);
  CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_GRANTED);
  mml_ledger_stats st;
  mml_ledger_get_stats(g, &st);
  CHECK_EQ_INT(st.held[MML_HOLD_ENGINE], 30 + 30 + 30);
  CHECK_EQ_INT(st.revoked, 2);
  mml_ledger_free(g);
}

/* L7 with L10: bytes being given back count as the engine's, so the deadlock rule waits
 * for them instead of failing the head. */
TEST(ledger_revoking_is_not_a_deadlock) {
  mml_ledger *g = new_ledger(100);
  mml_err err;
  mml_charge a = charge(0, 60), r = charge(5, 40);
  r.revocable = 1;
  CHECK_OK(mml_ledger_request(g, &a, &err), err);
  mml_ledger_hand_over(g, 60); /* a batch the consumer holds */
  CHECK_OK(mml_ledger_request(g, &r, &err), err);
  mml_charge h = charge(1, 30);
  CHECK_OK(mml_ledger_request(g, &h, &err), err);
  mml_ledger_consumer_waiting(g, 1);
  CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_WAITING);
  CHECK_EQ_INT(r.revoking, 1);
  mml_ledger_give_back(g, &r);
  CHECK_EQ_INT(mml_ledger_state(g, &h), MML_CHARGE_GRANTED);
  mml_ledger_free(g);
}

/* ---- the pool as the ledger's cache ------------------------------------------------- */

typedef struct pool_ledger {
  mml_ledger *g;
  mml_pool *p;
  int id;
} pool_ledger;

/* The pool's changes into the ledger: a release gives the consumer's credit back (what
 * stays cached becomes the cache's), pages reused or trimmed leave the cache. */
static void pool_to_ledger(void *arg, int64_t d_live, int64_t d_cached) {
  pool_ledger *pl = arg;
  if (d_live < 0) {
    const int64_t kept = d_cached > 0 ? d_cached : 0;
    mml_ledger_cache_put(pl->g, pl->id, kept, MML_HOLD_CONSUMER);
    mml_ledger_release(pl->g, -d_live - kept, MML_HOLD_CONSUMER);
  } else if (d_cached < 0) {
    mml_ledger_cache_drop(pl->g, pl->id, -d_cached);
  }
}

static int64_t pool_evict(void *arg, int64_t want) {
  return (int64_t)mml_pool_evict(((pool_ledger *)arg)->p, (size_t)want);
}

typedef struct pool_taker {
  pool_ledger *pl;
  mml_charge c;
  mml_buf *buf;
  mml_status st;
} pool_taker;

static void *pool_take_main(void *arg) {
  pool_taker *t = arg;
  mml_err err;
  t->st = mml_ledger_acquire(t->pl->g, &t->c, &err);
  if (!t->st) t->st = mml_pool_alloc(t->pl->p, (size_t)t->c.bytes, &t->buf, &err);
  return NULL;
}

/* L4, L6 with the real pool: the consumer releasing a batch's buffer (mml_buf_release,
 * from its own thread) wakes the charge waiting for room, and the pool's cached pages are
 * evicted for it; nothing polls. */
TEST(ledger_pool_release_wakes_waiter) {
  const int64_t K = 64 << 10;
  pool_ledger pl;
  mml_err err;
  CHECK_OK(mml_pool_new(NULL, 0, &pl.p, &err), err);
  pl.g = new_ledger(3 * K);
  pl.id = mml_ledger_add_cache(pl.g, "pooled pages", pool_evict, &pl);
  mml_pool_set_hook(pl.p, pool_to_ledger, &pl);
  mml_charge ca = charge(0, K), cb = charge(1, K);
  mml_buf *a, *b;
  CHECK_OK(mml_ledger_acquire(pl.g, &ca, &err), err);
  CHECK_OK(mml_pool_alloc(pl.p, (size_t)K, &a, &err), err);
  CHECK_OK(mml_ledger_acquire(pl.g, &cb, &err), err);
  CHECK_OK(mml_pool_alloc(pl.p, (size_t)K, &b, &err), err);
  mml_ledger_hand_over(pl.g, 2 * K); /* two batches the consumer holds */
  pool_taker t = {0};
  t.pl = &pl;
  t.c = charge(2, 2 * K);
  pthread_t th;
  CHECK_EQ_INT(pthread_create(&th, NULL, pool_take_main, &t), 0);
  CHECK(wait_waiting(pl.g, 1));
  mml_buf_release(a); /* kept cached by the pool: evicted for the waiter */
  pthread_join(th, NULL);
  CHECK_EQ_INT(t.st, MML_OK);
  size_t cached, live;
  mml_pool_usage(pl.p, &cached, &live);
  mml_ledger_stats s;
  mml_ledger_get_stats(pl.g, &s);
  CHECK_EQ_INT(s.cached, (long long)cached);
  CHECK(s.evicted_bytes >= (uint64_t)K);
  CHECK_EQ_INT(s.held[MML_HOLD_CONSUMER], K);
  CHECK_EQ_INT(s.held[MML_HOLD_ENGINE], 2 * K);
  CHECK((int64_t)(live + cached) <= 3 * K); /* L3, as the pool counts it */
  CHECK(s.peak <= 3 * K);
  mml_ledger_hand_over(pl.g, 2 * K);
  mml_buf_release(b);
  mml_buf_release(t.buf);
  mml_ledger_get_stats(pl.g, &s);
  mml_pool_usage(pl.p, &cached, &live);
  CHECK_EQ_INT(s.held[MML_HOLD_CONSUMER] + s.held[MML_HOLD_ENGINE], 0);
  CHECK_EQ_INT(s.cached, (long long)cached);
  mml_pool_close(pl.p); /* no hook call after it */
  mml_ledger_free(pl.g);
}

/* ---- the randomized stress test --------------------------------------------------- */

/* One schedule: n samples (images small, videos large; some fail to decode), batches of
 * `per` samples, `nw` workers that request each sample's bytes in stream order (L5) and
 * hand them over once decoded, a consumer that takes batches in order with random delays
 * and keeps the previous one (or not) while it waits for the next, a cache that keeps
 * some released batches' pages and workers' preloads.  Checks: it ends (no hang), never
 * above the cap, every byte back, batches complete and in order, and an out-of-memory
 * failure only where the cap cannot hold what the consumer keeps plus the batch. */
enum { SN = 24 };
typedef struct sched {
  mml_ledger *g;
  int64_t cap;
  int n, per, nw, keep_prev;
  int64_t size[SN];
  int fails[SN];
  mml_charge ch[SN];
  unsigned seed;
  tcache cache;
  int cache_id;
  pthread_mutex_t mu; /* the test's dispatcher and done flags */
  pthread_cond_t cv;
  int next, done[SN], stop, oom, taken;
  mml_err oom_err;
  atomic_llong live, live_peak;
} sched;

static unsigned rnd(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return (*s >> 16) & 0x7fff;
}

static void live_add(sched *S, int64_t d) {
  long long v = atomic_fetch_add(&S->live, d) + d;
  long long p = atomic_load(&S->live_peak);
  while (v > p && !atomic_compare_exchange_weak(&S->live_peak, &p, v)) {
  }
}

static void *stress_worker(void *arg) {
  sched *S = arg;
  unsigned seed;
  pthread_mutex_lock(&S->mu);
  seed = S->seed += 7919;
  pthread_mutex_unlock(&S->mu);
  for (;;) {
    mml_err err;
    pthread_mutex_lock(&S->mu); /* dispatch: requests go in stream order (L5) */
    if (S->stop || S->next >= S->n) {
      pthread_mutex_unlock(&S->mu);
      return NULL;
    }
    const int s = S->next++;
    mml_status st = mml_ledger_request(S->g, &S->ch[s], &err);
    pthread_mutex_unlock(&S->mu);
    if (!st) st = mml_ledger_wait(S->g, &S->ch[s], &err);
    pthread_mutex_lock(&S->mu);
    if (st) {
      if (st == MML_ENOMEM && !S->oom) S->oom = 1, S->oom_err = err;
      S->stop = 1;
      pthread_cond_broadcast(&S->cv);
      pthread_mutex_unlock(&S->mu);
      return NULL;
    }
    pthread_mutex_unlock(&S->mu);
    live_add(S, S->size[s]);
    if (rnd(&seed) % 4 == 0 && mml_ledger_cache_grow(S->g, S->cache_id, 3)) /* a preload */
      atomic_fetch_add(&S->cache.bytes, 3);
    for (unsigned i = rnd(&seed) % 3; i > 0; i--) sched_yield(); /* decode */
    pthread_mutex_lock(&S->mu); /* work finishes under the consumer's lock (L7) */
    if (S->fails[s]) {          /* a decode failure: its bytes go back, the sample is skipped */
      live_add(S, -S->size[s]);
      mml_ledger_release(S->g, S->size[s], MML_HOLD_ENGINE);
    } else {
      mml_ledger_hand_over(S->g, S->size[s]);
    }
    S->done[s] = 1;
    pthread_cond_broadcast(&S->cv);
    pthread_mutex_unlock(&S->mu);
  }
}

/* Bytes of batch b's good samples. */
static int64_t batch_bytes(const sched *S, int b) {
  int64_t n = 0;
  for (int s = b * S->per; s < (b + 1) * S->per && s < S->n; s++) n += S->fails[s] ? 0 : S->size[s];
  return n;
}

/* The consumer gives a batch back (counted out of `live` first: L3's check): freed, or
 * its pages kept in the cache for reuse. */
static void give_back(sched *S, int64_t bytes, unsigned *seed) {
  if (!bytes) return;
  live_add(S, -bytes);
  if (seed && rnd(seed) % 2) {
    atomic_fetch_add(&S->cache.bytes, bytes); /* the owner's count first, as the pool */
    mml_ledger_cache_put(S->g, S->cache_id, bytes, MML_HOLD_CONSUMER);
  } else {
    mml_ledger_release(S->g, bytes, MML_HOLD_CONSUMER);
  }
}

/* The consumer: 1 when every batch came, 0 after a failure (S->oom says which). */
static int stress_consume(sched *S, unsigned *seed) {
  const int nb = (S->n + S->per - 1) / S->per;
  int64_t prev = 0;
  for (int b = 0; b < nb; b++) {
    const int end = (b + 1) * S->per < S->n ? (b + 1) * S->per : S->n;
    pthread_mutex_lock(&S->mu);
    for (;;) {
      int ready = 1;
      for (int s = b * S->per; s < end; s++) ready &= S->done[s];
      if (ready || S->stop) break;
      mml_ledger_consumer_waiting(S->g, 1);
      pthread_cond_wait(&S->cv, &S->mu);
      mml_ledger_consumer_waiting(S->g, 0);
    }
    const int stopped = S->stop;
    pthread_mutex_unlock(&S->mu);
    if (stopped) { /* the charges still waiting fail (a loader's fatal error closes it) */
      mml_ledger_shutdown(S->g);
      give_back(S, prev, NULL);
      return 0;
    }
    S->taken = b + 1;
    const int64_t cur = batch_bytes(S, b);
    if (!S->keep_prev) give_back(S, prev, seed);
    for (unsigned i = rnd(seed) % 4; i > 0; i--) sched_yield(); /* the training step */
    if (S->keep_prev) give_back(S, prev, seed);
    prev = cur;
  }
  give_back(S, prev, NULL);
  return 1;
}

/* The most the consumer keeps plus the batch it waits for: a cap at least this never
 * runs out (the deadlock rule must not fire). */
static int64_t stress_need(const sched *S) {
  const int nb = (S->n + S->per - 1) / S->per;
  int64_t need = 0;
  for (int b = 0; b < nb; b++) { /* it waits for b holding b - 1 */
    int64_t x = b ? batch_bytes(S, b - 1) : 0;
    for (int s = b * S->per; s < (b + 1) * S->per && s < S->n; s++) x += S->size[s];
    if (x > need) need = x;
  }
  return need;
}

static void stress_setup(sched *S, unsigned *seed) {
  memset(S, 0, sizeof *S);
  S->n = 6 + (int)(rnd(seed) % (SN - 5));
  S->per = 1 + (int)(rnd(seed) % 4);
  S->nw = 1 + (int)(rnd(seed) % 3);
  S->keep_prev = rnd(seed) % 2;
  S->seed = rnd(seed);
  int64_t largest = 0;
  for (int s = 0; s < S->n; s++) {
    S->size[s] = rnd(seed) % 5 ? 1 + rnd(seed) % 10 : 20 + rnd(seed) % 40; /* image, video */
    S->fails[s] = rnd(seed) % 10 == 0;
    S->ch[s] = charge(s, S->size[s]);
    if (S->size[s] > largest) largest = S->size[s];
  }
  /* caps from the largest sample up to twice what is ever needed */
  const int64_t hi = 2 * stress_need(S);
  S->cap = largest + (int64_t)(rnd(seed) % (unsigned)(hi - largest + 1));
  pthread_mutex_init(&S->mu, NULL);
  pthread_cond_init(&S->cv, NULL);
}

/* One schedule; 0 on a failed check (printed). */
static int stress_one(unsigned *seed, int *ooms) {
  static sched S;
  stress_setup(&S, seed);
  mml_ledger_cfg cfg = {0};
  cfg.cap = S.cap;
  mml_err err;
  if (mml_ledger_new(&cfg, &S.g, &err)) return 0;
  S.cache.evictable = 1;
  S.cache_id = mml_ledger_add_cache(S.g, "pages", tcache_evict, &S.cache);
  pthread_t th[4];
  for (int i = 0; i < S.nw; i++) pthread_create(&th[i], NULL, stress_worker, &S);
  const int whole = stress_consume(&S, seed);
  for (int i = 0; i < S.nw; i++) pthread_join(th[i], NULL);
  mml_ledger_stats st;
  mml_ledger_get_stats(S.g, &st);
  int ok = 1;
  /* a failure stopped the rest: the finished samples of batches never taken */
  int64_t stranded = 0;
  for (int s = S.taken * S.per; s < S.n; s++)
    if (S.done[s] && !S.fails[s]) stranded += S.size[s];
  if (st.peak > S.cap || atomic_load(&S.live_peak) > S.cap) ok = 0; /* L3 */
  if (st.held[MML_HOLD_ENGINE] != 0 || st.held[MML_HOLD_CONSUMER] != stranded) ok = 0;
  if (st.cached != atomic_load(&S.cache.bytes) || st.waiting) ok = 0;
  if (!whole && (!S.oom || S.cap >= stress_need(&S))) ok = 0; /* only where it cannot fit */
  if (!whole && !strstr(S.oom_err.msg, "would hold it")) ok = 0;
  *ooms += !whole;
  if (!ok)
    fprintf(stderr,
            "  schedule: n=%d per=%d workers=%d keep_prev=%d cap=%lld need=%lld whole=%d "
            "peak=%lld held=%lld/%lld stranded=%lld cached=%lld/%lld: %s\n",
            S.n, S.per, S.nw, S.keep_prev, (long long)S.cap, (long long)stress_need(&S), whole,
            (long long)st.peak, (long long)st.held[0], (long long)st.held[1], (long long)stranded,
            (long long)st.cached, (long long)atomic_load(&S.cache.bytes), S.oom_err.msg);
  mml_ledger_free(S.g);
  pthread_mutex_destroy(&S.mu);
  pthread_cond_destroy(&S.cv);
  return ok;
}

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
enum { STRESS_SCHEDULES = 2000 };
#else
enum { STRESS_SCHEDULES = 20000 };
#endif

/* L1..L7 under random schedules; a hang fails it within two minutes (SIGALRM: the
 * runner reports a timeout). */
TEST(ledger_stress_random_schedules) {
  alarm(120);
  unsigned seed = 12345;
  const char *env = getenv("MML_LEDGER_SEED");
  if (env) seed = (unsigned)strtoul(env, NULL, 10);
  int ooms = 0;
  for (int i = 0; i < STRESS_SCHEDULES; i++) {
    const unsigned at = seed;
    if (!stress_one(&seed, &ooms)) FAIL_AT("schedule %d (MML_LEDGER_SEED=%u) failed", i, at);
  }
  /* both outcomes were exercised: caps too small for the schedule and large enough */
  fprintf(stderr, "  %d schedules, %d ran out of memory\n", STRESS_SCHEDULES, ooms);
  CHECK(ooms > 0);
  CHECK(ooms < STRESS_SCHEDULES);
}
