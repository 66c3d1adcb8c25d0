/*
 * pool.c — reference-counted output buffers, the pool that recycles them, and the batch
 * of named tensors (implements mml/batch.h).
 *
 * Design:
 *   - Threads: the collation thread allocates; any thread (the consumer, a DLPack deleter
 *     running during garbage collection or after interpreter shutdown) releases.  Buffer
 *     reference counts are C11 atomics; the pool's cache list is guarded by one mutex
 *     (the only lock here, never held while calling out except to the allocator).
 *   - Ownership: the pool is itself reference counted: its creator holds one reference and
 *     every live buffer one more, so a buffer released after mml_pool_close still finds
 *     its pool (and its allocator) and the last one out frees the pool.
 *   - Reuse: a released buffer goes to the cache (unless the pool is closed or the cache
 *     is over max_cached_bytes, then it is freed).  Allocation takes the smallest cached
 *     buffer that fits (small buffers: at most twice the request); a buffer whose fence
 *     (an async copy still reading it) is pending is skipped.  Sizes are rounded up to
 *     4 KiB (2 MiB for large buffers) so batches of different shapes share buffers.
 *   - Memory that stays mapped: the host allocator (mml_host_allocator) gives each
 *     buffer of MAP_MIN bytes or more its own 2 MiB-aligned anonymous mapping with
 *     MADV_HUGEPAGE.  Its pages are faulted in (and zeroed by the kernel) once, on first
 *     write, and from then on they are the pool's: a released buffer keeps them while it is
 *     cached, and a request MOVES them where they are needed (mremap with
 *     MREMAP_DONTUNMAP: page tables move, 2 MiB at a time, nothing is copied or zeroed).
 *     A request takes the cached mapping that holds the most pages (and is large enough);
 *     pages beyond the request go to the reservoir (one reserved address range, a stack
 *     of spare pages); a shortfall comes from the reservoir, then from other cached
 *     buffers.  So the pool's resident bytes are the most that batches ever needed at one
 *     time (not each buffer's largest batch, which made the pool drift to N buffers x the
 *     largest batch), and steady-state iteration maps and zeroes nothing.  Where the
 *     kernel cannot move pages (before Linux 5.7) the pool falls back to keeping each
 *     buffer's pages in it and growing the largest cached one with mremap.
 *   - Growth in place (mml_pool_alloc_cap / mml_pool_grow): a buffer may be a mapping
 *     larger than its size, holding pages for its size only; growing it takes pages for
 *     the rest the same way (reservoir, then other cached mappings, else faults), so a
 *     batch's uint8 rows become its float rows in the same buffer (loader_collator.c).
 *   - Trim to the recent working set (growable pools that move pages): the pool keeps
 *     the pages of the most bytes live at one time over the last WS_EPOCHS x WS_EPOCH
 *     (256) large requests -- about 128 batches of a loader (pixel rows + pixel_values) --
 *     and when it holds more than that by WS_SLACK (a batch far larger than the recent
 *     ones has gone by), the request that sees it trims the cache down to that working
 *     set (spare pages first).  So one giant batch's pages do not stay mapped for the
 *     rest of the run, while a working set that recurs within the window (the steady
 *     state) keeps everything it needs and maps nothing.  The trim runs on the thread
 *     that allocates (a worker or the collation thread), never in a release.
 *   - HOOK (mml_pool_set_hook): a hook learns every change of the pool's live and cached
 *     bytes, one call per public call that made one (alloc, grow, release, trim), after
 *     the lock is dropped and after what the call freed is freed, so a memory budget that
 *     follows it never counts less than is mapped and is told of every release (a release
 *     is what wakes its waiters).  mml_pool_evict frees cached bytes without calling it
 *     (the budget asked for them: tests/c/base/test-ledger.c, the pool as a cache).
 *   - COUNTS (mml_pool_stats): buffers made by the allocator, requests served from the
 *     cache, buffers freed (and of those, freed at a release because the cache was full or
 *     closed), and cached buffers a request passed over because their fence was pending
 *     (with the most seen at one request: how far the copies reading them lagged).  A pool
 *     whose allocs and frees stay put over a run is in its steady state, whatever its byte
 *     figures do (benchmarks/bench_cuda.py's warm-up reads them).
 *   - mml_mapped: the same kind of mapping as one thread's scratch (decoder state that
 *     scales with the image), kept across uses so reuse costs no fault either.
 */
#include "mml/batch.h"

#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* The recent working set (TRIM above): epochs of WS_EPOCH large requests, WS_EPOCHS kept,
 * and the hysteresis beyond it before the cache is trimmed. */
enum { WS_EPOCH = 32, WS_EPOCHS = 8 };
#define WS_SLACK ((size_t)64 << 20)

struct mml_pool {
  pthread_mutex_t mu;
  mml_allocator alloc;
  int has_alloc;
  int growable;     /* the host allocator: large buffers are mappings (mremap) */
  atomic_int moves; /* growable and the kernel moves pages (MREMAP_DONTUNMAP) */
  size_t max_cached;
  size_t cached, live;         /* bytes, guarded by mu */
  size_t live_peak, held_peak; /* high-water marks of live and live + cached (mu) */
  /* the recent working set (growable pools that move pages; mu): the most bytes live at
   * once in each of the last WS_EPOCHS epochs of WS_EPOCH large requests (SIZE_MAX: not
   * seen yet) and in the current one */
  size_t ws_ring[WS_EPOCHS], ws_cur;
  unsigned ws_n, ws_i;
  mml_buf *free_list; /* cached buffers, guarded by mu */
  /* the reservoir: spare pages at the start of one reserved range, guarded by mu */
  uint8_t *rv;
  void *rv_base;
  size_t rv_len, rv_cap, rv_res;
  int closed;      /* guarded by mu */
  atomic_int refs; /* creator + live buffers */
  /* the change hook (mml_pool_set_hook; HOOK below): fn and arg guarded by mu, hook_on
   * read without it to skip the lock when none is set; calls under way (mu) */
  mml_pool_hook_fn hook;
  void *hook_arg;
  atomic_int hook_on;
  int hook_calls;
  pthread_cond_t hook_cv;
  /* COUNTS (mml_pool_stats): relaxed atomics, figures only; pending_max written under mu */
  atomic_ullong n_allocs, n_reuses, n_frees, n_release_frees, n_pending_skips, n_pending_max;
};

/* What one public call changed (HOOK): live and cached bytes before each of its critical
 * sections, and the sum of their changes. */
typedef struct pool_ev {
  size_t l0, c0;
  int64_t dl, dc;
} pool_ev;

static void ev_lock(mml_pool *p, pool_ev *ev) {
  pthread_mutex_lock(&p->mu);
  ev->l0 = p->live;
  ev->c0 = p->cached;
}

static void ev_unlock(mml_pool *p, pool_ev *ev) {
  ev->dl += (int64_t)p->live - (int64_t)ev->l0;
  ev->dc += (int64_t)p->cached - (int64_t)ev->c0;
  pthread_mutex_unlock(&p->mu);
}

/* After the call freed what it freed: the hook, with no lock held. */
static void ev_report(mml_pool *p, const pool_ev *ev) {
  if ((!ev->dl && !ev->dc) || !atomic_load_explicit(&p->hook_on, memory_order_acquire)) return;
  pthread_mutex_lock(&p->mu);
  mml_pool_hook_fn fn = p->hook;
  void *arg = p->hook_arg;
  if (fn) p->hook_calls++;
  pthread_mutex_unlock(&p->mu);
  if (!fn) return;
  fn(arg, ev->dl, ev->dc);
  pthread_mutex_lock(&p->mu);
  if (--p->hook_calls == 0) pthread_cond_broadcast(&p->hook_cv);
  pthread_mutex_unlock(&p->mu);
}

void mml_pool_set_hook(mml_pool *p, mml_pool_hook_fn fn, void *arg) {
  pthread_mutex_lock(&p->mu);
  p->hook = fn;
  p->hook_arg = arg;
  atomic_store_explicit(&p->hook_on, fn != NULL, memory_order_release);
  while (p->hook_calls) pthread_cond_wait(&p->hook_cv, &p->mu); /* the old one's calls end */
  pthread_mutex_unlock(&p->mu);
}

size_t mml_dtype_size(mml_dtype dt) {
  switch (dt) {
    case MML_DT_UINT8:
    case MML_DT_BOOL:
      return 1;
    case MML_DT_BFLOAT16:
      return 2;
    case MML_DT_INT32:
    case MML_DT_FLOAT32:
      return 4;
    case MML_DT_INT64:
      return 8;
  }
  return 1;
}

const char *mml_dtype_name(mml_dtype dt) {
  switch (dt) {
    case MML_DT_UINT8:
      return "uint8";
    case MML_DT_INT32:
      return "int32";
    case MML_DT_INT64:
      return "int64";
    case MML_DT_FLOAT32:
      return "float32";
    case MML_DT_BOOL:
      return "bool";
    case MML_DT_BFLOAT16:
      return "bfloat16";
  }
  return "uint8";
}

/* Host buffers: a 64-byte header before the data says how to free it. */
enum { MAP_MIN = 1 << 20, HUGE = 2 << 20, HDR = 64 };
typedef struct host_hdr {
  void *base; /* what malloc or mmap returned */
  size_t len; /* mapping length; 0: malloc'd */
  size_t cap; /* usable bytes from data (mappings) */
  size_t res; /* bytes from data whose pages this buffer holds (pool accounting, mu) */
} host_hdr;

static host_hdr *hdr_of(void *data) { return (host_hdr *)((uint8_t *)data - HDR); }

static size_t huge_round(size_t n) { return (n + HUGE - 1) & ~(size_t)(HUGE - 1); }

static mml_status host_alloc(void *self, size_t n, void **out, mml_err *err) {
  (void)self;
  if (n < MAP_MIN) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n + HDR) != 0 || !p)
      return mml_err_set(err, MML_ENOMEM, "cannot allocate a %zu-byte buffer", n);
    *(host_hdr *)p = (host_hdr){p, 0};
    *out = (uint8_t *)p + HDR;
    return MML_OK;
  }
  size_t len = huge_round(n) + HUGE; /* room to align the data to 2 MiB */
  void *base =
      mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return mml_err_set(err, MML_ENOMEM, "cannot map a %zu-byte buffer", n);
  uint8_t *data = (uint8_t *)(((uintptr_t)base + HDR + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
#ifdef MADV_HUGEPAGE
  /* advice: fewer, larger faults; the whole mapping, so it stays one VMA (mremap needs) */
  madvise(base, len, MADV_HUGEPAGE);
#endif
  *(host_hdr *)(data - HDR) = (host_hdr){base, len, huge_round(n), 0};
  *out = data;
  return MML_OK;
}

static void host_free(void *self, void *p) {
  (void)self;
  if (!p) return;
  host_hdr h = *(host_hdr *)((uint8_t *)p - HDR);
  if (h.len)
    munmap(h.base, h.len);
  else
    free(h.base);
}

/* Grows a mapped host buffer to n bytes in place or moved (its pages keep their
 * contents and stay resident); 0 when it cannot. */
static int host_grow(void **p, size_t n) {
  host_hdr h = *(host_hdr *)((uint8_t *)*p - HDR);
  if (!h.len) return 0;
  size_t off = (size_t)((uint8_t *)*p - (uint8_t *)h.base);
  size_t len = huge_round(n) + HUGE;
  void *nb = mremap(h.base, h.len, len, MREMAP_MAYMOVE);
  if (nb == MAP_FAILED) return 0;
  uint8_t *data = (uint8_t *)nb + off;
#ifdef MADV_HUGEPAGE
  madvise(nb, len, MADV_HUGEPAGE);
#endif
  *(host_hdr *)(data - HDR) = (host_hdr){nb, len, huge_round(n), h.res};
  *p = data;
  return 1;
}

/* Scratch memory that stays mapped (mml/batch.h): always a mapping, grown in place.
 * mapped_now / mapped_peak: the process's mapped scratch bytes (capacities), for
 * memory accounting (relaxed atomics: figures, not synchronisation). */
static atomic_size_t mapped_now, mapped_peak;

static void mapped_add(size_t add, size_t sub) {
  size_t now = atomic_fetch_add_explicit(&mapped_now, add, memory_order_relaxed) + add;
  atomic_fetch_sub_explicit(&mapped_now, sub, memory_order_relaxed);
  size_t pk = atomic_load_explicit(&mapped_peak, memory_order_relaxed);
  while (now > pk && !atomic_compare_exchange_weak_explicit(
                         &mapped_peak, &pk, now, memory_order_relaxed, memory_order_relaxed)) {
  }
}

void mml_mapped_usage(size_t *now, size_t *peak) {
  if (now) *now = atomic_load_explicit(&mapped_now, memory_order_relaxed);
  if (peak) *peak = atomic_load_explicit(&mapped_peak, memory_order_relaxed);
}

mml_status mml_mapped_reserve(mml_mapped *m, size_t n) {
  if (n <= m->cap) return MML_OK;
  if (n < MAP_MIN) n = MAP_MIN;
  void *p = m->data;
  if (p && host_grow(&p, n)) {
    mapped_add(huge_round(n), m->cap);
    m->data = p;
    m->cap = huge_round(n);
    return MML_OK;
  }
  mml_err e;
  if (host_alloc(NULL, n, &p, &e)) return MML_ENOMEM;
  mml_mapped_free(m);
  m->data = p;
  m->cap = huge_round(n);
  mapped_add(m->cap, 0);
  return MML_OK;
}

void mml_mapped_free(mml_mapped *m) {
  if (m->data) mapped_add(0, m->cap);
  host_free(NULL, m->data);
  m->data = NULL;
  m->cap = 0;
}

void mml_host_allocator(mml_allocator *out) {
  memset(out, 0, sizeof *out);
  out->kind = MML_MEM_HOST;
  out->device = -1;
  out->alloc = host_alloc;
  out->free = host_free;
}

mml_status mml_pool_new(const mml_allocator *alloc, size_t max_cached_bytes, mml_pool **out,
                        mml_err *err) {
  mml_pool *p = calloc(1, sizeof *p);
  if (!p) return mml_err_set(err, MML_ENOMEM, "cannot allocate a buffer pool");
  if (pthread_mutex_init(&p->mu, NULL) != 0) {
    free(p);
    return mml_err_set(err, MML_ENOMEM, "cannot create the pool mutex");
  }
  pthread_cond_init(&p->hook_cv, NULL);
  if (alloc && alloc->alloc) {
    p->alloc = *alloc;
    p->has_alloc = 1;
  } else {
    mml_host_allocator(&p->alloc);
  }
  p->growable = p->alloc.alloc == host_alloc;
  atomic_init(&p->moves, p->growable);
  p->max_cached = max_cached_bytes ? max_cached_bytes : ((size_t)1 << 30);
  atomic_init(&p->refs, 1);
  *out = p;
  return MML_OK;
}

/* After live grew (mu held): the high-water marks. */
static void note_peaks_locked(mml_pool *p) {
  if (p->live > p->live_peak) p->live_peak = p->live;
  if (p->live > p->ws_cur) p->ws_cur = p->live;
  if (p->live + p->cached > p->held_peak) p->held_peak = p->live + p->cached;
}

static void count(atomic_ullong *c) { atomic_fetch_add_explicit(c, 1, memory_order_relaxed); }

/* A request passed over `pending` cached buffers whose fence was pending (mu held). */
static void count_pending_locked(mml_pool *p, unsigned long long pending) {
  if (!pending) return;
  atomic_fetch_add_explicit(&p->n_pending_skips, pending, memory_order_relaxed);
  if (pending > atomic_load_explicit(&p->n_pending_max, memory_order_relaxed))
    atomic_store_explicit(&p->n_pending_max, pending, memory_order_relaxed);
}

static void buf_destroy(mml_pool *p, mml_buf *b) {
  count(&p->n_frees);
  if (b->fence && b->fence_free) b->fence_free(b->fence);
  p->alloc.free(p->alloc.self, b->data);
  free(b);
}

static void pool_unref(mml_pool *p) {
  if (atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) != 1) return;
  /* Last reference: nothing can reach the pool any more. */
  mml_buf *b = p->free_list;
  while (b) {
    mml_buf *n = b->next;
    buf_destroy(p, b);
    b = n;
  }
  if (p->rv_base) munmap(p->rv_base, p->rv_len);
  pthread_cond_destroy(&p->hook_cv);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

void mml_pool_close(mml_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->closed = 1;
  p->hook = NULL; /* no call after close: the hook's owner may go */
  atomic_store_explicit(&p->hook_on, 0, memory_order_release);
  while (p->hook_calls) pthread_cond_wait(&p->hook_cv, &p->mu);
  mml_buf *list = p->free_list;
  p->free_list = NULL;
  p->cached = 0;
  if (p->rv_res) madvise(p->rv, p->rv_res, MADV_DONTNEED); /* the spare pages go now */
  p->rv_res = 0;
  pthread_mutex_unlock(&p->mu);
  while (list) {
    mml_buf *n = list->next;
    buf_destroy(p, list);
    list = n;
  }
  pool_unref(p);
}

static int fence_pending(mml_buf *b) {
  if (!b->fence) return 0;
  if (b->fence_done && !b->fence_done(b->fence)) return 1;
  if (b->fence_free) b->fence_free(b->fence);
  b->fence = NULL;
  b->fence_done = NULL;
  b->fence_free = NULL;
  return 0;
}

/* Bytes of resident memory a cached buffer stands for. */
static size_t held(const mml_pool *p, mml_buf *b) {
  if (!p->growable) return b->size;
  host_hdr *h = hdr_of(b->data);
  return h->len ? h->res : b->size;
}

/* The cached buffer a request of `want` bytes takes: the smallest that fits (a small one
 * at most twice the request), else (growable pools, large requests) the largest large
 * one, to grow (*grow = 1).  Unlinked from the cache; mu held. */
static mml_buf *take_cached_locked(mml_pool *p, size_t want, int *grow) {
  mml_buf *best = NULL, **best_link = NULL, *big = NULL, **big_link = NULL;
  unsigned long long pending = 0;
  for (mml_buf **link = &p->free_list; *link; link = &(*link)->next) {
    mml_buf *b = *link;
    if (fence_pending(b)) {
      pending++;
      continue;
    }
    if (b->size >= want && (want >= MAP_MIN || b->size / 2 <= want)) {
      if (!best || b->size < best->size) best = b, best_link = link;
    } else if (b->size < want && b->size >= MAP_MIN && (!big || b->size > big->size)) {
      big = b, big_link = link;
    }
  }
  count_pending_locked(p, pending);
  *grow = 0;
  if (!best && big && p->growable && want >= MAP_MIN) {
    best = big, best_link = big_link;
    *grow = 1;
  }
  if (best) {
    *best_link = best->next;
    p->cached -= held(p, best);
  }
  return best;
}

/* ---- page moves (growable pools; mu held) ------------------------------------------ */

enum { RV_MAX_SHIFT = 36 }; /* the reservoir's address range: at most 64 GiB */

/* Moves the pages of [src, src + n) to dst (2 MiB aligned, n a multiple of 2 MiB): the
 * page tables move, the source stays mapped and empty.  Returns the bytes moved; less
 * than n when the kernel refuses, and then moves are off for good. */
static size_t move_pages(mml_pool *p, uint8_t *dst, uint8_t *src, size_t n) {
#ifdef MREMAP_DONTUNMAP
  const int fl = MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP;
  if (!n || mremap(src, n, n, fl, dst) != MAP_FAILED) return n;
  size_t done = 0; /* several mappings (pages moved in earlier): 2 MiB at a time */
  while (done < n && mremap(src + done, HUGE, HUGE, fl, dst + done) != MAP_FAILED) done += HUGE;
  if (done < n) atomic_store(&p->moves, 0);
  return done;
#else
  (void)dst, (void)src, (void)n;
  atomic_store(&p->moves, 0);
  return 0;
#endif
}

static int rv_ready(mml_pool *p) {
  if (p->rv) return 1;
  size_t cap = huge_round(p->max_cached);
  if (cap > (size_t)1 << RV_MAX_SHIFT) cap = (size_t)1 << RV_MAX_SHIFT;
  void *base =
      mmap(NULL, cap + HUGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return 0;
  p->rv_base = base;
  p->rv_len = cap + HUGE;
  p->rv_cap = cap;
  p->rv = (uint8_t *)(((uintptr_t)base + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
  return 1;
}

/* Frees the reservoir's top pages until it holds at most `keep` bytes. */
static void rv_drop(mml_pool *p, size_t keep) {
  if (p->rv_res <= keep) return;
  size_t k = huge_round(p->rv_res - keep);
  if (k > p->rv_res) k = p->rv_res;
  madvise(p->rv + p->rv_res - k, k, MADV_DONTNEED);
  p->rv_res -= k;
  p->cached -= k;
}

/* Parks the pages of [src, src + n) in the reservoir; what does not fit is freed. */
static void rv_push(mml_pool *p, uint8_t *src, size_t n) {
  size_t room = atomic_load(&p->moves) && rv_ready(p) ? p->rv_cap - p->rv_res : 0;
  size_t moved =
      atomic_load(&p->moves) ? move_pages(p, p->rv + p->rv_res, src, n < room ? n : room) : 0;
  p->rv_res += moved;
  p->cached += moved;
  if (moved < n) madvise(src + moved, n - moved, MADV_DONTNEED);
}

/* Moves up to n bytes of the reservoir's pages to dst; returns the bytes moved. */
static size_t rv_pop(mml_pool *p, uint8_t *dst, size_t n) {
  size_t k = n < p->rv_res ? n : p->rv_res;
  if (!k || !atomic_load(&p->moves)) return 0;
  size_t moved = move_pages(p, dst, p->rv + p->rv_res - k, k);
  p->rv_res -= k;
  p->cached -= k;
  if (moved < k) rv_drop(p, 0); /* moves are off: the spares go */
  return moved;
}

/* The cached mapping a large request takes: of `cap` bytes or more (cap >= want), holding
 * the most pages of the request (then the smallest); unlinked.  Mappings left empty and
 * too small go to *drop. */
static mml_buf *take_mapping_locked(mml_pool *p, size_t want, size_t cap, mml_buf **drop) {
  mml_buf *best = NULL, **best_link = NULL;
  size_t best_use = 0;
  unsigned long long pending = 0;
  for (mml_buf **link = &p->free_list; *link;) {
    mml_buf *b = *link;
    host_hdr *h = hdr_of(b->data);
    if (!h->len || fence_pending(b)) {
      pending += h->len != 0;
      link = &b->next;
    } else if (h->cap < want && !h->res) { /* useless: nothing to give, too small */
      *link = b->next;
      b->next = *drop;
      *drop = b;
    } else {
      size_t use = h->res < want ? h->res : want;
      if (h->cap >= cap &&
          (!best || use > best_use || (use == best_use && h->cap < hdr_of(best->data)->cap)))
        best = b, best_link = link, best_use = use;
      link = &b->next;
    }
  }
  count_pending_locked(p, pending);
  if (best) {
    *best_link = best->next;
    p->cached -= hdr_of(best->data)->res;
  }
  return best;
}

/* b (a mapping, unlinked) gets exactly `want` bytes of pages where the pool has them:
 * its excess goes to the reservoir, a shortfall comes from the reservoir, then from other
 * cached mappings; the rest faults in when written. */
static void fill_locked(mml_pool *p, mml_buf *b, size_t want) {
  host_hdr *h = hdr_of(b->data);
  uint8_t *d = b->data;
  if (h->res > want) {
    rv_push(p, d + want, h->res - want);
    h->res = want;
  }
  if (h->res < want) h->res += rv_pop(p, d + h->res, want - h->res);
  for (mml_buf *c = p->free_list; c && h->res < want && atomic_load(&p->moves); c = c->next) {
    host_hdr *ch = hdr_of(c->data);
    if (!ch->len || !ch->res || fence_pending(c)) continue;
    size_t k = ch->res < want - h->res ? ch->res : want - h->res;
    uint8_t *src = (uint8_t *)c->data + ch->res - k;
    size_t m = move_pages(p, d + h->res, src, k);
    if (!m) break;
    if (m < k) madvise(src + m, k - m, MADV_DONTNEED);
    ch->res -= k;
    p->cached -= k;
    h->res += m;
  }
  h->res = want; /* what is still missing faults in (zeroed) when written */
}

/* The recent working set (TRIM in the design comment): after a large request (mu held),
 * the bytes the cache may keep, or SIZE_MAX when it holds no more than the recent
 * working set needs (with WS_SLACK of hysteresis) or that set is not known yet. */
static size_t ws_keep_locked(mml_pool *p) {
  if (++p->ws_n == WS_EPOCH) {
    p->ws_ring[p->ws_i++ % WS_EPOCHS] = p->ws_cur;
    p->ws_cur = p->live;
    p->ws_n = 0;
  }
  if (p->ws_i < WS_EPOCHS) return SIZE_MAX; /* fewer than WS_EPOCHS epochs seen */
  size_t ws = p->ws_cur;
  for (int k = 0; k < WS_EPOCHS; k++)
    if (p->ws_ring[k] > ws) ws = p->ws_ring[k];
  if (p->live + p->cached <= ws + WS_SLACK) return SIZE_MAX;
  return ws > p->live ? ws - p->live : 0;
}

/* A large request of a growable pool that moves pages: `want` bytes of pages in a mapping
 * of `cap` bytes (cap >= want: mml_pool_grow may take it up to cap in place). */
static mml_status alloc_mapping(mml_pool *p, size_t want, size_t cap, mml_buf **out, mml_err *err) {
  mml_buf *drop = NULL;
  pool_ev ev = {0};
  ev_lock(p, &ev);
  mml_buf *b = take_mapping_locked(p, want, cap, &drop);
  ev_unlock(p, &ev);
  while (drop) {
    mml_buf *n = drop->next;
    buf_destroy(p, drop);
    drop = n;
  }
  if (b) count(&p->n_reuses);
  if (!b) {
    if (!(b = calloc(1, sizeof *b))) {
      ev_report(p, &ev);
      return mml_err_set(err, MML_ENOMEM, "cannot allocate a buffer header");
    }
    mml_status st = p->alloc.alloc(p->alloc.self, cap, &b->data, err);
    if (st) {
      free(b);
      ev_report(p, &ev);
      return st;
    }
    count(&p->n_allocs);
    b->kind = p->alloc.kind;
    b->device = p->alloc.device;
    b->pool = p;
  }
  ev_lock(p, &ev);
  fill_locked(p, b, want);
  b->size = want;
  p->live += want;
  note_peaks_locked(p);
  size_t keep = ws_keep_locked(p);
  ev_unlock(p, &ev);
  ev_report(p, &ev);
  if (keep != SIZE_MAX) mml_pool_trim(p, keep);
  *out = b;
  return MML_OK;
}

mml_status mml_pool_alloc(mml_pool *p, size_t n, mml_buf **out, mml_err *err) {
  size_t want = n >= MAP_MIN ? huge_round(n) : (n + 4095) & ~(size_t)4095;
  if (want < n) return mml_err_set(err, MML_ENOMEM, "buffer size %zu overflows", n);
  if (!want) want = 4096;
  if (n >= MAP_MIN && atomic_load(&p->moves)) { /* want: whole 2 MiB pages */
    mml_status st = alloc_mapping(p, want, want, out, err);
    if (st) return st;
    atomic_store_explicit((atomic_int *)&(*out)->refcnt, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
    return MML_OK;
  }
  int grow;
  pool_ev ev = {0};
  ev_lock(p, &ev);
  mml_buf *best = take_cached_locked(p, want, &grow);
  ev_unlock(p, &ev);
  if (best && grow) { /* outside mu: mremap may take a while */
    if (host_grow(&best->data, want)) {
      best->size = want;
    } else {
      buf_destroy(p, best);
      best = NULL;
    }
  }
  if (best) {
    count(&p->n_reuses);
    ev_lock(p, &ev);
    p->live += best->size;
    note_peaks_locked(p);
    ev_unlock(p, &ev);
  }
  if (!best) {
    best = calloc(1, sizeof *best);
    if (!best) {
      ev_report(p, &ev);
      return mml_err_set(err, MML_ENOMEM, "cannot allocate a buffer header");
    }
    mml_status st = p->alloc.alloc(p->alloc.self, want, &best->data, err);
    if (st) {
      free(best);
      ev_report(p, &ev);
      return st;
    }
    count(&p->n_allocs);
    best->size = want;
    best->kind = p->alloc.kind;
    best->device = p->alloc.device;
    best->pool = p;
    ev_lock(p, &ev);
    p->live += want;
    note_peaks_locked(p);
    ev_unlock(p, &ev);
  }
  ev_report(p, &ev);
  if (p->growable && hdr_of(best->data)->len) hdr_of(best->data)->res = huge_round(best->size);
  best->next = NULL;
  atomic_store_explicit((atomic_int *)&best->refcnt, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
  *out = best;
  return MML_OK;
}

mml_status mml_pool_alloc_cap(mml_pool *p, size_t n, size_t cap, mml_buf **out, mml_err *err) {
  if (cap <= n) return mml_pool_alloc(p, n, out, err);
  if (cap < MAP_MIN) return mml_pool_alloc(p, cap, out, err); /* small: all of it now */
  if (!atomic_load(&p->moves)) return mml_pool_alloc(p, n, out, err);
  size_t want = huge_round(n ? n : 1), capw = huge_round(cap);
  if (capw < cap) return mml_err_set(err, MML_ENOMEM, "buffer size %zu overflows", cap);
  mml_status st = alloc_mapping(p, want, capw, out, err);
  if (st) return st;
  atomic_store_explicit((atomic_int *)&(*out)->refcnt, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
  return MML_OK;
}

size_t mml_buf_capacity(const mml_buf *b) {
  if (!b->pool->growable) return b->size;
  const host_hdr *h = hdr_of(b->data);
  return h->len && h->cap > b->size ? h->cap : b->size;
}

mml_status mml_pool_grow(mml_buf *b, size_t n, mml_err *err) {
  if (n <= b->size) return MML_OK;
  if (n > mml_buf_capacity(b))
    return mml_err_set(err, MML_EINVAL, "pool: a %zu-byte buffer of capacity %zu cannot hold %zu",
                       b->size, mml_buf_capacity(b), n);
  mml_pool *p = b->pool;
  size_t want = huge_round(n);
  if (want > hdr_of(b->data)->cap) want = hdr_of(b->data)->cap;
  pool_ev ev = {0};
  ev_lock(p, &ev);
  fill_locked(p, b, want); /* b is live, so in no list */
  p->live += want - b->size;
  b->size = want;
  note_peaks_locked(p);
  size_t keep = atomic_load(&p->moves) ? ws_keep_locked(p) : SIZE_MAX; /* a large request */
  ev_unlock(p, &ev);
  ev_report(p, &ev);
  if (keep != SIZE_MAX) mml_pool_trim(p, keep);
  return MML_OK;
}

void mml_buf_retain(mml_buf *b) {
  if (b) atomic_fetch_add_explicit((atomic_int *)&b->refcnt, 1, memory_order_relaxed);
}

int mml_buf_refs(const mml_buf *b) {
  return atomic_load_explicit((atomic_int *)&b->refcnt, memory_order_acquire);
}

void mml_buf_release(mml_buf *b) {
  if (!b) return;
  if (atomic_fetch_sub_explicit((atomic_int *)&b->refcnt, 1, memory_order_acq_rel) != 1) return;
  mml_pool *p = b->pool;
  int keep = 0;
  pool_ev ev = {0};
  ev_lock(p, &ev);
  p->live -= b->size;
  size_t h = held(p, b);
  if (!p->closed && p->cached + h <= p->max_cached) {
    b->next = p->free_list;
    p->free_list = b;
    p->cached += h;
    keep = 1;
  }
  ev_unlock(p, &ev);
  if (!keep) {
    count(&p->n_release_frees);
    buf_destroy(p, b);
  }
  ev_report(p, &ev); /* before the pool may go with its last reference */
  pool_unref(p);
}

/* Frees cached buffers, smallest first, until at most `keep` bytes stay cached; what it
 * changed is added to *ev.  Returns the bytes still cached. */
static size_t trim_ev(mml_pool *p, size_t keep, pool_ev *ev) {
  ev_lock(p, ev);
  if (p->cached > keep) /* the spare pages first */
    rv_drop(p, p->rv_res > p->cached - keep ? p->rv_res - (p->cached - keep) : 0);
  while (p->cached > keep) {
    mml_buf *best = NULL, **best_link = NULL;
    for (mml_buf **link = &p->free_list; *link; link = &(*link)->next)
      if ((!best || held(p, *link) < held(p, best)) && !fence_pending(*link))
        best = *link, best_link = link;
    if (!best) break;
    *best_link = best->next;
    p->cached -= held(p, best);
    ev_unlock(p, ev);
    buf_destroy(p, best);
    ev_lock(p, ev);
  }
  size_t left = p->cached;
  ev_unlock(p, ev);
  return left;
}

size_t mml_pool_trim(mml_pool *p, size_t keep) {
  pool_ev ev = {0};
  size_t left = trim_ev(p, keep, &ev);
  ev_report(p, &ev);
  return left;
}

size_t mml_pool_evict(mml_pool *p, size_t want) {
  size_t cached;
  mml_pool_usage(p, &cached, NULL);
  pool_ev ev = {0};
  trim_ev(p, want < cached ? cached - want : 0, &ev);
  return ev.dc < 0 ? (size_t)-ev.dc : 0;
}

void mml_pool_peaks(mml_pool *p, size_t *live_peak, size_t *held_peak) {
  pthread_mutex_lock(&p->mu);
  if (live_peak) *live_peak = p->live_peak;
  if (held_peak) *held_peak = p->held_peak;
  pthread_mutex_unlock(&p->mu);
}

void mml_pool_stats_get(mml_pool *p, mml_pool_stats *out) {
  memset(out, 0, sizeof *out);
  out->allocs = atomic_load_explicit(&p->n_allocs, memory_order_relaxed);
  out->reuses = atomic_load_explicit(&p->n_reuses, memory_order_relaxed);
  out->frees = atomic_load_explicit(&p->n_frees, memory_order_relaxed);
  out->release_frees = atomic_load_explicit(&p->n_release_frees, memory_order_relaxed);
  out->pending_skips = atomic_load_explicit(&p->n_pending_skips, memory_order_relaxed);
  out->pending_max = atomic_load_explicit(&p->n_pending_max, memory_order_relaxed);
  pthread_mutex_lock(&p->mu);
  for (mml_buf *b = p->free_list; b; b = b->next) out->cached_bufs++;
  out->cached = p->cached;
  out->live = p->live;
  pthread_mutex_unlock(&p->mu);
}

void mml_pool_usage(mml_pool *p, size_t *cached, size_t *live) {
  pthread_mutex_lock(&p->mu);
  if (cached) *cached = p->cached;
  if (live) *live = p->live;
  pthread_mutex_unlock(&p->mu);
}

/* The byte size of a tensor of that shape, checked (a new slot must also be free). */
static mml_status tensor_bytes(const mml_batch *b, const char *name, mml_dtype dt, int ndim,
                               const int64_t *shape, size_t *out, mml_err *err) {
  if (b->ntensors >= MML_MAX_TENSORS)
    return mml_err_set(err, MML_EINTERNAL, "too many tensors in a batch (adding %s)", name);
  if (ndim < 0 || ndim > MML_MAX_DIMS)
    return mml_err_set(err, MML_EINTERNAL, "tensor %s: %d dimensions", name, ndim);
  size_t n = mml_dtype_size(dt);
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return mml_err_set(err, MML_EINTERNAL, "tensor %s: negative dim", name);
    if (shape[i] && n > SIZE_MAX / (size_t)shape[i])
      return mml_err_set(err, MML_ENOMEM, "tensor %s: size overflows", name);
    n *= (size_t)shape[i];
  }
  *out = n;
  return MML_OK;
}

static void tensor_fill(mml_batch *b, const char *name, mml_dtype dt, int ndim,
                        const int64_t *shape, mml_buf *buf, size_t offset) {
  mml_tensor *t = &b->tensors[b->ntensors++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->dtype = dt;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
  t->buf = buf;
  t->offset = offset;
}

mml_status mml_batch_add(mml_batch *b, mml_pool *pool, const char *name, mml_dtype dt, int ndim,
                         const int64_t *shape, void **data, mml_err *err) {
  size_t n;
  mml_buf *buf;
  mml_status st = tensor_bytes(b, name, dt, ndim, shape, &n, err);
  if (!st && (st = mml_pool_alloc(pool, n, &buf, err))) mml_err_prefix(err, "tensor %s", name);
  if (st) return st;
  tensor_fill(b, name, dt, ndim, shape, buf, 0);
  if (data) *data = buf->data;
  return MML_OK;
}

mml_status mml_batch_add_view(mml_batch *b, const char *name, mml_dtype dt, int ndim,
                              const int64_t *shape, mml_buf *buf, size_t offset, mml_err *err) {
  size_t n;
  mml_status st = tensor_bytes(b, name, dt, ndim, shape, &n, err);
  if (st) return st;
  if (!buf || offset > buf->size || n > buf->size - offset)
    return mml_err_set(err, MML_EINTERNAL, "tensor %s: %zu bytes at %zu exceed its buffer", name, n,
                       offset);
  mml_buf_retain(buf);
  tensor_fill(b, name, dt, ndim, shape, buf, offset);
  return MML_OK;
}

mml_tensor *mml_batch_find(mml_batch *b, const char *name) {
  for (int i = 0; i < b->ntensors; i++)
    if (!strcmp(b->tensors[i].name, name)) return &b->tensors[i];
  return NULL;
}

int64_t mml_tensor_numel(const mml_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

void mml_batch_clear(mml_batch *b) {
  for (int i = 0; i < b->ntensors; i++) mml_buf_release(b->tensors[i].buf);
  memset(b, 0, sizeof *b);
}
