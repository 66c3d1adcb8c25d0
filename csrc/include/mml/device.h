/*
 * mml/device.h — pinned and device memory for mml_pool, buffer fences backed by CUDA
 * events, and the device stage that copies finished host batches to a GPU.
 *
 * Lifetime rule (the one thing to remember): a pinned or device buffer goes back into use
 * only after (a) every copy that reads or writes it has completed and (b) the work the
 * consumer queued on the streams it named before releasing the buffer has completed.
 * (a) is an event recorded after the copy; (b) is an event recorded, when the pool first
 * asks after the last release, on each stream the consumer used: the stream passed to
 * __dlpack__(stream=...) for device tensors, and the legacy default stream (PyTorch's
 * default stream) for pinned host batches that a trainer may copy with
 * .cuda(non_blocking=True).  Work queued on other streams, after the release, is not
 * covered: keep the tensor alive until such work is done (as torch's record_stream asks).
 *
 * Fences are mml_buf.fence objects (see mml/batch.h); the pool queries them only after
 * the buffer's last reference is gone, and frees them with fence_free.
 *
 * Threads: every function here is thread-safe.  A fence has its own mutex.
 */
#ifndef MML_DEVICE_H
#define MML_DEVICE_H

#include "mml/batch.h"
#include "mml/cuda.h"

/* --- allocators for mml_pool_new ---------------------------------------------------- */

/* Plain host memory (64-byte aligned malloc). */
void mml_host_allocator(mml_allocator *out);
/* Page-locked host memory (cudaHostAlloc, portable).  Without a usable CUDA runtime it
 * fills *out with the plain host allocator instead and returns MML_ECUDA with the reason
 * in err: *out is usable either way, so the caller may warn once and carry on. */
mml_status mml_pinned_allocator(mml_allocator *out, mml_err *err);
/* Device memory on `device` (cudaMalloc).  MML_ECUDA when there is no such device. */
mml_status mml_device_allocator(int device, mml_allocator *out, mml_err *err);

/* --- fences --------------------------------------------------------------------------- */

/* An event shared by several buffers' fences (one copy event covers a whole batch). */
typedef struct mml_shared_event mml_shared_event;
mml_status mml_shared_event_new(int device, mml_shared_event **out, mml_err *err);
void mml_shared_event_release(mml_shared_event *e); /* NULL is fine */
mml_cuda_event *mml_shared_event_get(mml_shared_event *e);
/* 1 when the event has completed (the answer is cached once it is 1). */
int mml_shared_event_done(mml_shared_event *e);

/* Adds `ev` to the fence of b (creating the fence when b has none).  While `ev` is pending
 * the pool will not reuse b.  MML_EINTERNAL if b carries a fence of another kind. */
mml_status mml_fence_add_event(mml_buf *b, mml_shared_event *ev, mml_err *err);
/* Asks that, once b's last reference is gone, an event be recorded on `stream` (a raw
 * cudaStream_t; MML_CUDA_STREAM_LEGACY for the default stream) of `device`, and that b
 * not be reused before it completes.  Duplicate streams are recorded once. */
mml_status mml_fence_on_release(mml_buf *b, int device, uintptr_t stream, mml_err *err);
/* For a consumer about to use b on `stream`: makes that stream wait for every pending
 * event of b's fence (no host blocking) and registers it with mml_fence_on_release.
 * stream == MML_NO_SYNC does nothing (the consumer synchronises itself). */
#define MML_NO_SYNC ((uintptr_t)-1)
mml_status mml_fence_export(mml_buf *b, int device, uintptr_t stream, mml_err *err);
/* Blocks until every pending event of b's fence is done (host reads of device data in
 * tests, shutdown).  Does not arm release streams. */
mml_status mml_fence_wait(mml_buf *b, mml_err *err);
/* For tests: the number of pending events and release streams of b's fence. */
void mml_fence_counts(mml_buf *b, int *events, int *streams);

/* --- the device stage ----------------------------------------------------------------- */

typedef struct mml_device_stage mml_device_stage;

/* A stage copying to `device` on its own non-blocking stream, with a pool of device
 * buffers keeping up to max_cached_bytes for reuse (0: the pool's default). */
mml_status mml_device_stage_new(int device, size_t max_cached_bytes, mml_device_stage **out,
                                mml_err *err);
/* Queues the copy of every tensor of `host` into fresh device buffers and fills *dev with
 * the same tensors (names, dtypes, shapes, cursor, counts) on the device.  Returns before
 * the copy completes: each device buffer and each host buffer carries the copy's event in
 * its fence (so the consumer waits for it, and the host buffer is not reused before the
 * copy has read it).  The caller still owns `host` and releases it as usual.  On failure
 * *dev is left empty. */
mml_status mml_device_stage_copy(mml_device_stage *s, const mml_batch *host, mml_batch *dev,
                                 mml_err *err);
/* Waits for the stage's queued copies, then drops the pool's creator reference (device
 * buffers still viewed by tensors stay valid).  NULL is fine. */
void mml_device_stage_free(mml_device_stage *s);
int mml_device_stage_device(const mml_device_stage *s);
mml_pool *mml_device_stage_pool(mml_device_stage *s);

/* Marks every buffer of a delivered host batch so that it is not reused before work the
 * consumer queued on the default stream of `device` (and on `stream`, when not 0) before
 * the release has completed: for pinned batches a trainer copies with non_blocking=True.
 * Does nothing for buffers that are not pinned, or when CUDA is unavailable. */
mml_status mml_device_guard_pinned(mml_batch *b, int device, uintptr_t stream, mml_err *err);

#endif
