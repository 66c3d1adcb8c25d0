/*
 * loader_bytes.c — the loader's spare image byte buffers (IMAGE BYTES in loader_place.c):
 * a finished sample's encoded-image buffers are kept (up to a limit) and the next read
 * takes the smallest that holds its file, so their pages stay mapped instead of being
 * freed and faulted in again.  Under max_memory they are a cache of the memory ledger
 * (csrc/core/base/ledger.c): counted in its budget, freed on its request.
 *
 * INVARIANTS
 *   B1. The spares (spare[], nspare, spare_bytes) are guarded by their own lock,
 *       spare_mu, never by mu alone: the ledger's evict callback (ld_bytes_evict) runs
 *       under the ledger's lock, which the loader takes under mu, so evicting spares
 *       guarded by mu would deadlock.  Lock order: mu -> ledger -> spare_mu; nothing
 *       calls into the ledger with spare_mu held.
 *   B2. spare_bytes is the spares' capacity, not counted in win_bytes (the tasks' byte
 *       buffers): the room max_memory leaves is computed from both (ld_bytes_spares).
 *   B3. The ledger's cache count follows the spares: every move into the spares is a
 *       cache_put after spare_mu is dropped, every move out (a read takes one, all are
 *       freed) a cache_drop, and an eviction is subtracted by the ledger itself; between
 *       a move and its ledger call the count may lag (ledger.c allows it to dip).
 *   B4. Under max_memory the bytes a read is about to add to its buffer (its size known
 *       from the file, beyond the spare taken: the capacity mml_bytes_reserve will give
 *       it) are charged and allocated before the read (ld_admit_read_locked:
 *       loader_admit.c A7, R1), not only counted after it; when the charge must wait,
 *       nothing is allocated and the task is parked (*parked: R2) until it is granted.
 *
 * Locking: spare_mu guards the spares; a task's own buffers belong to the thread holding
 * its slot, and its count (t->held) is changed under mu.
 */
#include <stdlib.h>
#include <string.h>

#include "loader_int.h"

/* Spares are kept up to 64 MiB (an eighth of max_memory when set: they count in it). */
static int64_t spare_limit(const mml_loader *L) {
  int64_t lim = (int64_t)64 << 20;
  return L->cfg.max_memory && L->cfg.max_memory / 8 < lim ? L->cfg.max_memory / 8 : lim;
}

int64_t ld_bytes_spares(mml_loader *L) {
  pthread_mutex_lock(&L->spare_mu);
  const int64_t n = L->spare_bytes;
  pthread_mutex_unlock(&L->spare_mu);
  return n;
}

mml_status ld_bytes_take(mml_loader *L, task *t, mml_bytes *b, size_t need, int *parked,
                         mml_err *err) {
  *parked = 0;
  if (b->cap >= need) return MML_OK;
  pthread_mutex_lock(&L->mu);
  pthread_mutex_lock(&L->spare_mu);
  int best = -1;
  for (int k = 0; k < L->nspare; k++) {
    size_t cap = L->spare[k].cap, bc = best < 0 ? 0 : L->spare[best].cap;
    if (best < 0 || (cap >= need ? bc < need || cap < bc : bc < need && cap > bc)) best = k;
  }
  int64_t delta = 0; /* moves from the spares to t */
  if (best >= 0 && L->spare[best].cap > b->cap) {
    mml_bytes s = L->spare[best];
    delta = (int64_t)s.cap - (int64_t)b->cap;
    if (b->cap)
      L->spare[best] = *b;
    else
      L->spare[best] = L->spare[--L->nspare];
    L->spare_bytes -= delta;
    *b = s;
    b->len = 0;
  }
  pthread_mutex_unlock(&L->spare_mu); /* B1: before the ledger */
  if (delta) {
    t->held += delta;
    L->win_bytes += delta;
    ld_ledger_spare_drop(L, delta);
    ld_ledger_count(L, delta);
  }
  mml_status st = MML_OK;
  if (b->cap >= need) ld_admit_read_drop_locked(L, t); /* R4: a parked read's, unneeded now */
  if (b->cap < need && L->cfg.max_memory) { /* B4: charged, then allocated, before the read */
    const int64_t grow = ld_bytes_cap(need) - (int64_t)b->cap;
    const int go = ld_admit_read_locked(L, t, grow);
    if (go == -1) {
      *parked = 1; /* its charge waits in the ledger: the task is parked (loader_admit.c R2) */
    } else if (go == -2) { /* above max_memory alone: the sample fails (A4's kind) */
      st = ld_admit_read_alone_locked(L, grow, err);
    } else if (!go && L->fatal) {
      st = L->fatal; /* it can never have room: the loader's error says why */
      *err = L->fatal_err;
    } else if (!go) {
      st = mml_err_set(err, MML_ECANCELLED, "stopped while its bytes waited for max_memory room");
    } else {
      mml_bytes_free(b);                /* a new buffer, not a copy (as mml_read_file_max does) */
      (void)mml_bytes_reserve(b, need); /* a failure is the read's to report */
    }
  }
  pthread_mutex_unlock(&L->mu);
  return st;
}

void ld_bytes_return_locked(mml_loader *L, task *t) {
  int64_t kept = 0;
  for (int i = 0; i < t->imgs_cap; i++) {
    mml_bytes *b = &t->imgs[i];
    if (!b->cap) continue;
    pthread_mutex_lock(&L->spare_mu);
    const int keep =
        L->nspare < MML_SPARE_BUFS && L->spare_bytes + (int64_t)b->cap <= spare_limit(L);
    if (keep) {
      L->spare[L->nspare++] = *b;
      L->spare_bytes += (int64_t)b->cap;
      kept += (int64_t)b->cap;
    }
    pthread_mutex_unlock(&L->spare_mu);
    if (!keep) mml_bytes_free(b);
    *b = (mml_bytes){0};
  }
  t->held -= kept; /* B2: no longer the window's */
  L->win_bytes -= kept;
  ld_ledger_spare_put(L, kept);
  ld_mem_count_task_locked(L, t);
}

/* Frees spares until `want` bytes are freed (all: INT64_MAX); returns the bytes freed. */
static int64_t free_spares(mml_loader *L, int64_t want) {
  int64_t freed = 0;
  pthread_mutex_lock(&L->spare_mu);
  while (L->nspare > 0 && freed < want) {
    mml_bytes *b = &L->spare[--L->nspare];
    freed += (int64_t)b->cap;
    L->spare_bytes -= (int64_t)b->cap;
    mml_bytes_free(b);
  }
  pthread_mutex_unlock(&L->spare_mu);
  return freed;
}

void ld_bytes_free_spares(mml_loader *L) {
  const int64_t freed = free_spares(L, INT64_MAX);
  ld_ledger_spare_drop(L, freed);
  if (freed > 0 && L->ledger) ld_room_wake(L); /* a cache shrinking (loader_admit.c W1) */
}

int64_t ld_bytes_evict(void *arg, int64_t want) { return free_spares(arg, want); }
