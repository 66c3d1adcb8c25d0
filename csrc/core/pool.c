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
 *     write; while the pool keeps the buffer they stay mapped, so a batch written into a
 *     reused buffer costs no page fault and no zeroing.  When no cached buffer is large
 *     enough, the largest cached one grows in place (mremap keeps its resident pages,
 *     only the new tail faults) instead of mapping a new one: in steady state the
 *     buffers reach the largest batch's size and the pool maps nothing new.
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

struct mml_pool {
  pthread_mutex_t mu;
  mml_allocator alloc;
  int has_alloc;
  int growable; /* the host allocator: large buffers are mappings (mremap) */
  size_t max_cached;
  size_t cached, live; /* bytes, guarded by mu */
  mml_buf *free_list;  /* cached buffers, guarded by mu */
  int closed;          /* guarded by mu */
  atomic_int refs;     /* creator + live buffers */
};

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
} host_hdr;

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
  void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return mml_err_set(err, MML_ENOMEM, "cannot map a %zu-byte buffer", n);
  uint8_t *data = (uint8_t *)(((uintptr_t)base + HDR + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
#ifdef MADV_HUGEPAGE
  /* advice: fewer, larger faults; the whole mapping, so it stays one VMA (mremap needs) */
  madvise(base, len, MADV_HUGEPAGE);
#endif
  *(host_hdr *)(data - HDR) = (host_hdr){base, len};
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
  *(host_hdr *)(data - HDR) = (host_hdr){nb, len};
  *p = data;
  return 1;
}

/* Scratch memory that stays mapped (mml/batch.h): always a mapping, grown in place. */
mml_status mml_mapped_reserve(mml_mapped *m, size_t n) {
  if (n <= m->cap) return MML_OK;
  if (n < MAP_MIN) n = MAP_MIN;
  void *p = m->data;
  if (p && host_grow(&p, n)) {
    m->data = p;
    m->cap = huge_round(n);
    return MML_OK;
  }
  mml_err e;
  if (host_alloc(NULL, n, &p, &e)) return MML_ENOMEM;
  mml_mapped_free(m);
  m->data = p;
  m->cap = huge_round(n);
  return MML_OK;
}

void mml_mapped_free(mml_mapped *m) {
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
  if (alloc && alloc->alloc) {
    p->alloc = *alloc;
    p->has_alloc = 1;
  } else {
    mml_host_allocator(&p->alloc);
  }
  p->growable = p->alloc.alloc == host_alloc;
  p->max_cached = max_cached_bytes ? max_cached_bytes : ((size_t)1 << 30);
  atomic_init(&p->refs, 1);
  *out = p;
  return MML_OK;
}

static void buf_destroy(mml_pool *p, mml_buf *b) {
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
  pthread_mutex_destroy(&p->mu);
  free(p);
}

void mml_pool_close(mml_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->closed = 1;
  mml_buf *list = p->free_list;
  p->free_list = NULL;
  p->cached = 0;
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

/* The cached buffer a request of `want` bytes takes: the smallest that fits (a small one
 * at most twice the request), else (growable pools, large requests) the largest large
 * one, to grow (*grow = 1).  Unlinked from the cache; mu held. */
static mml_buf *take_cached_locked(mml_pool *p, size_t want, int *grow) {
  mml_buf *best = NULL, **best_link = NULL, *big = NULL, **big_link = NULL;
  for (mml_buf **link = &p->free_list; *link; link = &(*link)->next) {
    mml_buf *b = *link;
    if (fence_pending(b)) continue;
    if (b->size >= want && (want >= MAP_MIN || b->size / 2 <= want)) {
      if (!best || b->size < best->size) best = b, best_link = link;
    } else if (b->size < want && b->size >= MAP_MIN && (!big || b->size > big->size)) {
      big = b, big_link = link;
    }
  }
  *grow = 0;
  if (!best && big && p->growable && want >= MAP_MIN) {
    best = big, best_link = big_link;
    *grow = 1;
  }
  if (best) {
    *best_link = best->next;
    p->cached -= best->size;
  }
  return best;
}

mml_status mml_pool_alloc(mml_pool *p, size_t n, mml_buf **out, mml_err *err) {
  size_t want = n >= MAP_MIN ? huge_round(n) : (n + 4095) & ~(size_t)4095;
  if (want < n) return mml_err_set(err, MML_ENOMEM, "buffer size %zu overflows", n);
  if (!want) want = 4096;
  int grow;
  pthread_mutex_lock(&p->mu);
  mml_buf *best = take_cached_locked(p, want, &grow);
  pthread_mutex_unlock(&p->mu);
  if (best && grow) { /* outside mu: mremap may take a while */
    if (host_grow(&best->data, want)) {
      best->size = want;
    } else {
      buf_destroy(p, best);
      best = NULL;
    }
  }
  if (best) {
    pthread_mutex_lock(&p->mu);
    p->live += best->size;
    pthread_mutex_unlock(&p->mu);
  }
  if (!best) {
    best = calloc(1, sizeof *best);
    if (!best) return mml_err_set(err, MML_ENOMEM, "cannot allocate a buffer header");
    mml_status st = p->alloc.alloc(p->alloc.self, want, &best->data, err);
    if (st) {
      free(best);
      return st;
    }
    best->size = want;
    best->kind = p->alloc.kind;
    best->device = p->alloc.device;
    best->pool = p;
    pthread_mutex_lock(&p->mu);
    p->live += want;
    pthread_mutex_unlock(&p->mu);
  }
  best->next = NULL;
  atomic_store_explicit((atomic_int *)&best->refcnt, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
  *out = best;
  return MML_OK;
}

void mml_buf_retain(mml_buf *b) {
  if (b) atomic_fetch_add_explicit((atomic_int *)&b->refcnt, 1, memory_order_relaxed);
}

void mml_buf_release(mml_buf *b) {
  if (!b) return;
  if (atomic_fetch_sub_explicit((atomic_int *)&b->refcnt, 1, memory_order_acq_rel) != 1) return;
  mml_pool *p = b->pool;
  int keep = 0;
  pthread_mutex_lock(&p->mu);
  p->live -= b->size;
  if (!p->closed && p->cached + b->size <= p->max_cached) {
    b->next = p->free_list;
    p->free_list = b;
    p->cached += b->size;
    keep = 1;
  }
  pthread_mutex_unlock(&p->mu);
  if (!keep) buf_destroy(p, b);
  pool_unref(p);
}

size_t mml_pool_trim(mml_pool *p, size_t keep) {
  pthread_mutex_lock(&p->mu);
  while (p->cached > keep) {
    mml_buf *best = NULL, **best_link = NULL;
    for (mml_buf **link = &p->free_list; *link; link = &(*link)->next)
      if ((!best || (*link)->size < best->size) && !fence_pending(*link))
        best = *link, best_link = link;
    if (!best) break;
    *best_link = best->next;
    p->cached -= best->size;
    pthread_mutex_unlock(&p->mu);
    buf_destroy(p, best);
    pthread_mutex_lock(&p->mu);
  }
  size_t left = p->cached;
  pthread_mutex_unlock(&p->mu);
  return left;
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
