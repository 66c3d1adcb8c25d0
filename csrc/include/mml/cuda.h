/*
 * mml/cuda.h — the CUDA runtime loaded at run time with dlopen (no link-time dependency):
 * the module builds and imports without CUDA.  Provides page-locked host allocation,
 * device allocation, a loader-owned stream, async host-to-device copies and events.
 *
 * Threads: mml_cuda_load is idempotent and thread-safe; the rest is thread-safe as the
 * CUDA runtime is.
 */
#ifndef MML_CUDA_H
#define MML_CUDA_H

#include "mml/common.h"

/* MML_ECUDA with a reason when no usable runtime/device is present. */
mml_status mml_cuda_load(mml_err *err);
int mml_cuda_available(void);
int mml_cuda_device_count(void);

mml_status mml_cuda_host_alloc(size_t n, void **out, mml_err *err);   /* pinned */
void mml_cuda_host_free(void *p);
mml_status mml_cuda_malloc(int device, size_t n, void **out, mml_err *err);
void mml_cuda_free(int device, void *p);

typedef struct mml_cuda_stream mml_cuda_stream; /* opaque cudaStream_t wrapper */
typedef struct mml_cuda_event mml_cuda_event;   /* opaque cudaEvent_t wrapper */

mml_status mml_cuda_stream_new(int device, mml_cuda_stream **out, mml_err *err);
void mml_cuda_stream_free(mml_cuda_stream *s);
mml_status mml_cuda_memcpy_h2d_async(int device, void *dst, const void *src, size_t n,
                                     mml_cuda_stream *s, mml_err *err);
mml_status mml_cuda_event_new(int device, mml_cuda_event **out, mml_err *err);
void mml_cuda_event_free(mml_cuda_event *e);
mml_status mml_cuda_event_record(mml_cuda_event *e, mml_cuda_stream *s, mml_err *err);
/* 1 when done, 0 when pending. */
int mml_cuda_event_query(mml_cuda_event *e);
mml_status mml_cuda_event_sync(mml_cuda_event *e, mml_err *err);
/* Makes a foreign stream (a cudaStream_t as integer, as DLPack passes it) wait for e. */
mml_status mml_cuda_stream_wait_raw(int device, uintptr_t stream, mml_cuda_event *e, mml_err *err);

#endif
