/*
 * loader_bytes.c — the loader's spare image byte buffers (IMAGE BYTES in loader_place.c):
 * a finished sample's encoded-image buffers are kept (up to a limit) and the next read
 * takes the smallest that holds its file, so their pages stay mapped instead of being
 * freed and faulted in again.  Their capacity counts in win_bytes (max_memory).
 *
 * Locking: the spares are guarded by the loader's mu (ld_bytes_take takes it; the
 * others run with it held, or at destruction); a task's own buffers belong to the thread
 * holding its slot.
 */
#include <stdlib.h>
#include <string.h>

#include "loader_int.h"

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
    ld_ledger_spare_drop(L, delta);
    ld_ledger_charge(L, t->seq, delta);
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
      ld_ledger_spare_put(L, (int64_t)b->cap);
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
  ld_ledger_spare_drop(L, L->spare_bytes);
  L->nspare = 0;
  L->spare_bytes = 0;
}
