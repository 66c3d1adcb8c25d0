/*
 * device.c — pinned and device allocators for mml_pool, buffer fences made of CUDA
 * events, and the device stage (host batch -> device batch on a loader-owned stream).
 *
 * Threads and ordering:
 *   - The device stage is called by whichever worker finishes a batch.  Its enqueue
 *     section (copies, then one event record) runs under the stage mutex so a batch's
 *     copies and its event are contiguous on the stream.  Nothing here waits for the GPU
 *     except mml_fence_wait and mml_device_stage_free.
 *   - A fence (gpu_fence) has its own mutex.  Writers: the device stage (adds the copy
 *     event), the Python thread in __dlpack__ (adds a consumer stream), the pool (queries
 *     and frees it, only after the buffer's last reference is gone: the refcount's
 *     acquire/release orders those accesses after every writer).
 *   - "Release streams" are armed lazily: the first fence_done after the last release
 *     records one event on each of them.  Recording at that moment (not earlier) is what
 *     makes it cover every kernel the consumer queued before dropping the buffer.
 *
 * Ownership: a fence holds one reference on each shared event in it; a shared event is
 * destroyed with its last reference.  On any failure to arm (a stream handle the runtime
 * rejects) the fence reports done: we cannot wait on what we cannot name, and blocking
 * forever would leak the buffer instead.
 */
#include "mml/device.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* --- allocators -------------------------------------------------------------------- */

static mml_status pinned_alloc(void *self, size_t n, void **out, mml_err *err) {
  (void)self;
  return mml_cuda_host_alloc(n, out, err);
}
static void pinned_free(void *self, void *p) {
  (void)self;
  mml_cuda_host_free(p);
}

mml_status mml_pinned_allocator(mml_allocator *out, mml_err *err) {
  mml_status st = mml_cuda_load(err);
  if (st != MML_OK) {
    mml_host_allocator(out);
    mml_err_prefix(err, "pinned memory unavailable, using ordinary host memory");
    return st;
  }
  memset(out, 0, sizeof *out);
  out->kind = MML_MEM_PINNED;
  out->alloc = pinned_alloc;
  out->free = pinned_free;
  return MML_OK;
}

static mml_status device_alloc(void *self, size_t n, void **out, mml_err *err) {
  return mml_cuda_malloc((int)(intptr_t)self, n, out, err);
}
static void device_free(void *self, void *p) { mml_cuda_free((int)(intptr_t)self, p); }

mml_status mml_device_allocator(int device, mml_allocator *out, mml_err *err) {
  mml_status st = mml_cuda_load(err);
  if (st != MML_OK) return st;
  int n = mml_cuda_device_count();
  if (device < 0 || device >= n)
    return mml_err_set(err, MML_ECUDA, "CUDA device cuda:%d does not exist (%d visible)", device,
                       n);
  memset(out, 0, sizeof *out);
  out->kind = MML_MEM_DEVICE;
  out->device = device;
  out->alloc = device_alloc;
  out->free = device_free;
  out->self = (void *)(intptr_t)device;
  return MML_OK;
}

/* --- shared events ------------------------------------------------------------------- */

struct mml_shared_event {
  atomic_int refcnt;
  atomic_int done;
  mml_cuda_event *ev;
};

mml_status mml_shared_event_new(int device, mml_shared_event **out, mml_err *err) {
  mml_shared_event *e = calloc(1, sizeof *e);
  if (!e) return mml_err_set(err, MML_ENOMEM, "cannot allocate an event");
  mml_status st = mml_cuda_event_new(device, &e->ev, err);
  if (st) {
    free(e);
    return st;
  }
  atomic_init(&e->refcnt, 1);
  atomic_init(&e->done, 0);
  *out = e;
  return MML_OK;
}

static void shared_event_retain(mml_shared_event *e) {
  atomic_fetch_add_explicit(&e->refcnt, 1, memory_order_relaxed);
}

void mml_shared_event_release(mml_shared_event *e) {
  if (e && atomic_fetch_sub_explicit(&e->refcnt, 1, memory_order_acq_rel) == 1) {
    mml_cuda_event_free(e->ev);
    free(e);
  }
}

mml_cuda_event *mml_shared_event_get(mml_shared_event *e) { return e->ev; }

int mml_shared_event_done(mml_shared_event *e) {
  if (atomic_load_explicit(&e->done, memory_order_acquire)) return 1;
  if (!mml_cuda_event_query(e->ev)) return 0;
  atomic_store_explicit(&e->done, 1, memory_order_release);
  return 1;
}

/* --- fences -------------------------------------------------------------------------- */

#define FENCE_EVENTS 8
#define FENCE_STREAMS 8

typedef struct gpu_fence {
  pthread_mutex_t lock;
  mml_shared_event *ev[FENCE_EVENTS]; /* pending events (one reference each) */
  int nev;
  struct {
    int device;
    uintptr_t stream;
  } rel[FENCE_STREAMS]; /* streams to record on once the buffer is released */
  int nrel;
} gpu_fence;

/* Drops completed events; returns how many remain.  Lock held. */
static int prune_locked(gpu_fence *f) {
  int k = 0;
  for (int i = 0; i < f->nev; i++) {
    if (mml_shared_event_done(f->ev[i]))
      mml_shared_event_release(f->ev[i]);
    else
      f->ev[k++] = f->ev[i];
  }
  f->nev = k;
  return k;
}

/* Adds a reference to e; makes room by pruning, then by waiting for the oldest. */
static void add_event_locked(gpu_fence *f, mml_shared_event *e) {
  for (int i = 0; i < f->nev; i++)
    if (f->ev[i] == e) return;
  if (f->nev == FENCE_EVENTS && prune_locked(f) == FENCE_EVENTS) {
    mml_cuda_event_sync(f->ev[0]->ev, NULL);
    mml_shared_event_release(f->ev[0]);
    memmove(f->ev, f->ev + 1, (FENCE_EVENTS - 1) * sizeof f->ev[0]);
    f->nev--;
  }
  shared_event_retain(e);
  f->ev[f->nev++] = e;
}

static int gpu_fence_done(void *p) {
  gpu_fence *f = p;
  pthread_mutex_lock(&f->lock);
  for (int i = 0; i < f->nrel; i++) { /* arm: the buffer has just been released */
    mml_shared_event *e = NULL;
    if (mml_shared_event_new(f->rel[i].device, &e, NULL) != MML_OK) continue;
    if (mml_cuda_event_record_raw(e->ev, f->rel[i].stream, NULL) == MML_OK) add_event_locked(f, e);
    mml_shared_event_release(e);
  }
  f->nrel = 0;
  int done = prune_locked(f) == 0;
  pthread_mutex_unlock(&f->lock);
  return done;
}

/* Called by the pool when it frees the buffer or reuses it.  A buffer freed while its fence
 * is pending (pool closed or cache full) must not be returned to the runtime while a copy
 * or a consumer kernel may still touch it: arm, then wait. */
static void gpu_fence_free(void *p) {
  gpu_fence *f = p;
  if (!f) return;
  if (!gpu_fence_done(f))
    for (int i = 0; i < f->nev; i++) mml_cuda_event_sync(f->ev[i]->ev, NULL);
  for (int i = 0; i < f->nev; i++) mml_shared_event_release(f->ev[i]);
  pthread_mutex_destroy(&f->lock);
  free(f);
}

/* Serialises the creation of fences on buffers: two exporters of one buffer must not both
 * install one. */
static pthread_mutex_t g_fence_create = PTHREAD_MUTEX_INITIALIZER;

static mml_status fence_of(mml_buf *b, gpu_fence **out, mml_err *err) {
  mml_status st = MML_OK;
  pthread_mutex_lock(&g_fence_create);
  if (!b->fence) {
    gpu_fence *f = calloc(1, sizeof *f);
    if (!f || pthread_mutex_init(&f->lock, NULL) != 0) {
      free(f);
      st = mml_err_set(err, MML_ENOMEM, "cannot allocate a buffer fence");
    } else {
      b->fence = f;
      b->fence_done = gpu_fence_done;
      b->fence_free = gpu_fence_free;
    }
  } else if (b->fence_done != gpu_fence_done) {
    st = mml_err_set(err, MML_EINTERNAL, "buffer already carries a fence of another kind");
  }
  if (st == MML_OK) *out = b->fence;
  pthread_mutex_unlock(&g_fence_create);
  return st;
}

mml_status mml_fence_add_event(mml_buf *b, mml_shared_event *ev, mml_err *err) {
  gpu_fence *f;
  mml_status st = fence_of(b, &f, err);
  if (st) return st;
  pthread_mutex_lock(&f->lock);
  add_event_locked(f, ev);
  pthread_mutex_unlock(&f->lock);
  return MML_OK;
}

mml_status mml_fence_on_release(mml_buf *b, int device, uintptr_t stream, mml_err *err) {
  if (stream == 0) stream = MML_CUDA_STREAM_LEGACY;
  gpu_fence *f;
  mml_status st = fence_of(b, &f, err);
  if (st) return st;
  pthread_mutex_lock(&f->lock);
  int have = 0;
  for (int i = 0; i < f->nrel && !have; i++)
    have = f->rel[i].device == device && f->rel[i].stream == stream;
  if (!have && f->nrel == FENCE_STREAMS)
    st =
        mml_err_set(err, MML_ECUDA, "a buffer was exported to more than %d streams", FENCE_STREAMS);
  else if (!have) {
    f->rel[f->nrel].device = device;
    f->rel[f->nrel].stream = stream;
    f->nrel++;
  }
  pthread_mutex_unlock(&f->lock);
  return st;
}

mml_status mml_fence_export(mml_buf *b, int device, uintptr_t stream, mml_err *err) {
  if (stream == MML_NO_SYNC) return MML_OK;
  if (stream == 0) stream = MML_CUDA_STREAM_LEGACY;
  gpu_fence *f;
  mml_status st = fence_of(b, &f, err);
  if (st) return st;
  pthread_mutex_lock(&f->lock);
  prune_locked(f);
  for (int i = 0; i < f->nev && st == MML_OK; i++)
    st = mml_cuda_stream_wait_raw(device, stream, f->ev[i]->ev, err);
  pthread_mutex_unlock(&f->lock);
  if (st) return st;
  return mml_fence_on_release(b, device, stream, err);
}

mml_status mml_fence_wait(mml_buf *b, mml_err *err) {
  if (!b->fence || b->fence_done != gpu_fence_done) return MML_OK;
  gpu_fence *f = b->fence;
  mml_status st = MML_OK;
  pthread_mutex_lock(&f->lock);
  for (int i = 0; i < f->nev && st == MML_OK; i++) st = mml_cuda_event_sync(f->ev[i]->ev, err);
  if (st == MML_OK) prune_locked(f);
  pthread_mutex_unlock(&f->lock);
  return st;
}

void mml_fence_counts(mml_buf *b, int *events, int *streams) {
  *events = *streams = 0;
  if (!b->fence || b->fence_done != gpu_fence_done) return;
  gpu_fence *f = b->fence;
  pthread_mutex_lock(&f->lock);
  *events = prune_locked(f);
  *streams = f->nrel;
  pthread_mutex_unlock(&f->lock);
}

mml_status mml_device_guard_pinned(mml_batch *b, int device, uintptr_t stream, mml_err *err) {
  if (!mml_cuda_available()) return MML_OK;
  for (int i = 0; i < b->ntensors; i++) {
    mml_buf *buf = b->tensors[i].buf;
    if (!buf || buf->kind != MML_MEM_PINNED) continue;
    mml_status st = mml_fence_on_release(buf, device, MML_CUDA_STREAM_LEGACY, err);
    if (st == MML_OK && stream && stream != MML_NO_SYNC && stream != MML_CUDA_STREAM_LEGACY)
      st = mml_fence_on_release(buf, device, stream, err);
    if (st) return st;
  }
  return MML_OK;
}

/* --- the device stage ---------------------------------------------------------------- */

struct mml_device_stage {
  int device;
  mml_cuda_stream *stream;
  mml_pool *pool;
  pthread_mutex_t lock; /* the enqueue section of mml_device_stage_copy */
};

mml_status mml_device_stage_new(int device, size_t max_cached_bytes, mml_device_stage **out,
                                mml_err *err) {
  mml_allocator a;
  mml_status st = mml_device_allocator(device, &a, err);
  if (st) return st;
  mml_device_stage *s = calloc(1, sizeof *s);
  if (!s) return mml_err_set(err, MML_ENOMEM, "cannot allocate the device stage");
  s->device = device;
  if (pthread_mutex_init(&s->lock, NULL) != 0) {
    free(s);
    return mml_err_set(err, MML_ENOMEM, "cannot create the device stage lock");
  }
  if ((st = mml_cuda_stream_new(device, &s->stream, err)) ||
      (st = mml_pool_new(&a, max_cached_bytes, &s->pool, err))) {
    mml_device_stage_free(s);
    return st;
  }
  *out = s;
  return MML_OK;
}

void mml_device_stage_free(mml_device_stage *s) {
  if (!s) return;
  mml_cuda_stream_free(s->stream); /* waits for queued copies */
  mml_pool_close(s->pool);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

int mml_device_stage_device(const mml_device_stage *s) { return s->device; }
mml_pool *mml_device_stage_pool(mml_device_stage *s) { return s->pool; }

mml_status mml_device_stage_copy(mml_device_stage *s, const mml_batch *host, mml_batch *dev,
                                 mml_err *err) {
  memset(dev, 0, sizeof *dev);
  dev->after = host->after;
  dev->nsamples = host->nsamples;
  dev->real_tokens = host->real_tokens;
  dev->token_slots = host->token_slots;
  mml_shared_event *ev = NULL;
  mml_status st = mml_shared_event_new(s->device, &ev, err);
  if (st) return st;
  int queued = 0;
  pthread_mutex_lock(&s->lock);
  for (int i = 0; i < host->ntensors && st == MML_OK; i++) {
    const mml_tensor *t = &host->tensors[i];
    size_t n = (size_t)mml_tensor_numel(t) * mml_dtype_size(t->dtype);
    mml_tensor *d = &dev->tensors[dev->ntensors];
    *d = *t;
    d->buf = NULL;
    d->offset = 0;
    if ((st = mml_pool_alloc(s->pool, n ? n : 1, &d->buf, err))) break;
    dev->ntensors++;
    if (n && !t->buf) {
      st = mml_err_set(err, MML_EINTERNAL, "tensor %s has no buffer", t->name);
      break;
    }
    st = mml_cuda_memcpy_h2d_async(s->device, d->buf->data, (const char *)t->buf->data + t->offset,
                                   n, s->stream, err);
    if (st == MML_OK && n) queued = 1;
  }
  if (st == MML_OK) st = mml_cuda_event_record(ev->ev, s->stream, err);
  if (st != MML_OK && queued) /* host buffers may still be read: wait, then give up */
    mml_cuda_stream_sync(s->stream, NULL);
  pthread_mutex_unlock(&s->lock);
  for (int i = 0; i < dev->ntensors && st == MML_OK; i++)
    st = mml_fence_add_event(dev->tensors[i].buf, ev, err);
  for (int i = 0; i < host->ntensors && st == MML_OK; i++)
    if (host->tensors[i].buf) st = mml_fence_add_event(host->tensors[i].buf, ev, err);
  if (st != MML_OK) {
    if (!queued || mml_cuda_event_sync(ev->ev, NULL) != MML_OK)
      mml_cuda_stream_sync(s->stream, NULL);
    mml_batch_clear(dev);
    mml_err_prefix(err, "copy to cuda:%d", s->device);
  }
  mml_shared_event_release(ev);
  return st;
}
