/*
 * mml/batch.h — reference-counted output buffers, their pool, and the batch of named
 * tensors handed to the consumer.
 *
 * Ownership: a buffer is created by a pool and holds a reference to it; every tensor that
 * views the buffer (a batch slot, a Python Tensor, a DLPack capsule) holds one reference.
 * mml_buf_release is pure C, thread-safe (atomics) and callable after the loader and the
 * interpreter are gone; the last release returns the memory to the pool (or frees it when
 * the pool is closed or over its cache limit).  A buffer with a pending `fence` (an async
 * copy still reading it) is not reused until the fence reports done.
 */
#ifndef MML_BATCH_H
#define MML_BATCH_H

#include "mml/common.h"

typedef enum {
  MML_DT_UINT8 = 0,
  MML_DT_INT32,
  MML_DT_INT64,
  MML_DT_FLOAT32,
  MML_DT_BOOL,
  MML_DT_BFLOAT16, /* the upper 16 bits of a float32 (DLPack kDLBfloat) */
} mml_dtype;
size_t mml_dtype_size(mml_dtype dt);
const char *mml_dtype_name(mml_dtype dt); /* "uint8", "int32", ... (NumPy names; "bfloat16") */

typedef enum { MML_MEM_HOST = 0, MML_MEM_PINNED, MML_MEM_DEVICE } mml_mem_kind;

/* Allocator behind a pool: plain malloc, cudaHostAlloc, cudaMalloc. */
typedef struct mml_allocator {
  mml_mem_kind kind;
  int device;
  mml_status (*alloc)(void *self, size_t n, void **out, mml_err *err);
  void (*free)(void *self, void *p);
  void *self;
} mml_allocator;

typedef struct mml_pool mml_pool;
typedef struct mml_buf mml_buf;

struct mml_buf {
  void *data;
  size_t size; /* usable bytes (>= requested) */
  mml_mem_kind kind;
  int device;
  /* Optional fence: while fence_done(fence) returns 0 the memory may still be read by an
   * async copy; the pool will not hand it out again. */
  void *fence;
  int (*fence_done)(void *fence);
  void (*fence_free)(void *fence);
  /* private to pool.c below */
  mml_pool *pool;
  int refcnt; /* atomic */
  mml_buf *next;
};

/* A pool keeps up to max_cached_bytes of released buffers for reuse (0: default 1 GiB).
 * alloc may be NULL for plain host memory.  The pool is reference counted: the creator
 * holds one reference, every live buffer another. */
mml_status mml_pool_new(const mml_allocator *alloc, size_t max_cached_bytes, mml_pool **out,
                        mml_err *err);
/* Drops the creator's reference; cached buffers are freed, live ones stay valid. */
void mml_pool_close(mml_pool *p);
/* A buffer of at least n bytes with refcount 1 (reuses a cached one when it fits). */
mml_status mml_pool_alloc(mml_pool *p, size_t n, mml_buf **out, mml_err *err);
/* Like mml_pool_alloc, but the buffer may later grow in place (data stays put, contents
 * kept) up to cap bytes: a host mapping of cap bytes that holds pages for n (where the
 * pool moves pages; otherwise a plain mml_pool_alloc, whose capacity may be just its
 * size), or below MAP_MIN (1 MiB) a buffer of cap bytes at once. */
mml_status mml_pool_alloc_cap(mml_pool *p, size_t n, size_t cap, mml_buf **out, mml_err *err);
/* The most bytes b can grow to in place (its size when it cannot grow). */
size_t mml_buf_capacity(const mml_buf *b);
/* Grows live buffer b in place to n bytes (n <= mml_buf_capacity; counted live at once):
 * pages from the pool's cache where it has them, the rest fault in when written.  Its one
 * holder calls it (nothing else may read b->size meanwhile).  MML_EINVAL past capacity. */
mml_status mml_pool_grow(mml_buf *b, size_t n, mml_err *err);
void mml_buf_retain(mml_buf *b);
void mml_buf_release(mml_buf *b); /* NULL is fine */
/* The references held on b now: a figure for checks (another holder may change it at any
 * time unless the caller knows every holder is waiting). */
int mml_buf_refs(const mml_buf *b);
/* Bytes currently cached / live, for stats and tests. */
void mml_pool_usage(mml_pool *p, size_t *cached, size_t *live);
/* What a pool did since it was made (pool.c COUNTS): a steady state allocates and frees
 * nothing. */
typedef struct mml_pool_stats {
  uint64_t allocs;        /* buffers the allocator made (malloc/mmap, cudaHostAlloc, cudaMalloc) */
  uint64_t reuses;        /* requests served from the cache */
  uint64_t frees;         /* buffers given back to the allocator (trims, a full cache, close) */
  uint64_t release_frees; /* of those, at a release: the cache was full (or closed) */
  uint64_t pending_skips; /* cached buffers requests passed over: their fence was pending */
  uint64_t pending_max;   /* the most such buffers at one request */
  uint64_t cached_bufs;   /* buffers in the cache now */
  size_t cached, live;    /* bytes now, as mml_pool_usage */
} mml_pool_stats;
void mml_pool_stats_get(mml_pool *p, mml_pool_stats *out);
/* High-water marks since the pool was made: the most bytes live at one time, and the most
 * live + cached (the pool's resident peak). */
void mml_pool_peaks(mml_pool *p, size_t *live_peak, size_t *held_peak);
/* Frees cached buffers, smallest first, until at most `keep` bytes stay cached (buffers
 * whose fence is pending stay); returns the bytes still cached. */
size_t mml_pool_trim(mml_pool *p, size_t keep);
/* Frees at least `want` cached bytes where it can (as mml_pool_trim, without calling the
 * hook: a memory budget's eviction, mml/ledger.h); returns the bytes freed. */
size_t mml_pool_evict(mml_pool *p, size_t want);
/* Told of every change of the pool's live and cached bytes (d_live, d_cached: one
 * allocation, growth, release or trim), after the pool's lock is dropped and after what
 * it freed is unmapped, on the thread that made it (any thread: a release may run in a
 * DLPack deleter), possibly under that thread's own locks.  It must not call into the
 * pool.  No call happens after mml_pool_close. */
typedef void (*mml_pool_hook_fn)(void *arg, int64_t d_live, int64_t d_cached);
/* Sets the hook (NULL: none); returns once calls of the previous one have ended. */
void mml_pool_set_hook(mml_pool *p, mml_pool_hook_fn fn, void *arg);

/* Scratch memory that stays mapped: one 2 MiB-aligned MADV_HUGEPAGE mapping (never
 * malloc), grown with mremap (contents kept), unmapped only by mml_mapped_free.  For a
 * thread's large scratch that is reused image after image: its pages fault once. */
typedef struct mml_mapped {
  uint8_t *data;
  size_t cap;
} mml_mapped;
mml_status mml_mapped_reserve(mml_mapped *m, size_t n); /* cap >= n */
void mml_mapped_free(mml_mapped *m);                    /* {0} is fine */
/* Bytes mapped by every mml_mapped of the process now, and the most at one time (memory
 * accounting: decoder scratch that scales with the image, e.g. a progressive JPEG's
 * coefficients). */
void mml_mapped_usage(size_t *now, size_t *peak);

#define MML_MAX_DIMS 4
#define MML_MAX_TENSORS 16

typedef struct mml_tensor {
  char name[32];
  mml_dtype dtype;
  int ndim;
  int64_t shape[MML_MAX_DIMS]; /* row-major contiguous */
  mml_buf *buf;                /* one reference held by this slot */
  size_t offset;               /* byte offset of element 0 in buf */
} mml_tensor;

/* Where the sample stream stands; the state a consumer resumes from. */
typedef struct mml_cursor {
  int64_t epoch;          /* data epoch of `pos` */
  int64_t pos;            /* next stream position within the epoch (may exceed the epoch
                             length when a padded-mode epoch wraps to fill after skips) */
  int64_t batch_in_epoch; /* batches delivered in this epoch */
} mml_cursor;

typedef struct mml_batch {
  mml_tensor tensors[MML_MAX_TENSORS];
  int ntensors;
  mml_cursor after;                 /* the cursor once this batch has been consumed */
  int nsamples;                     /* real samples in the batch */
  int64_t real_tokens, token_slots; /* for packing/padding efficiency */
} mml_batch;

/* Adds a tensor slot of the given shape backed by a fresh buffer from `pool`; returns its
 * data pointer through *data. */
mml_status mml_batch_add(mml_batch *b, mml_pool *pool, const char *name, mml_dtype dt, int ndim,
                         const int64_t *shape, void **data, mml_err *err);
/* Adds a tensor slot viewing `buf` from byte `offset` (one reference taken); MML_EINTERNAL
 * when the shape does not fit in the buffer. */
mml_status mml_batch_add_view(mml_batch *b, const char *name, mml_dtype dt, int ndim,
                              const int64_t *shape, mml_buf *buf, size_t offset, mml_err *err);
mml_tensor *mml_batch_find(mml_batch *b, const char *name);
int64_t mml_tensor_numel(const mml_tensor *t);
/* Releases every slot's buffer reference and zeroes the batch. */
void mml_batch_clear(mml_batch *b);

#endif
