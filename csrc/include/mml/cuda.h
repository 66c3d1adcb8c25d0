/*
 * mml/cuda.h — the CUDA runtime loaded at run time with dlopen (no link-time dependency):
 * the module builds and imports without CUDA.  Provides page-locked host allocation,
 * device allocation, a loader-owned stream, async host-to-device copies and events.
 *
 * Threads: mml_cuda_load is idempotent and thread-safe; the rest is thread-safe as the
 * CUDA runtime is.  Functions taking `device` make it current for the call and restore
 * the calling thread's previous current device afterwards, so calling them from the
 * trainer's thread never moves PyTorch to another device.
 *
 * Which library: $MML_CUDART when set (a path); otherwise a libcudart already loaded in
 * the process (PyTorch's, found with RTLD_NOLOAD, so both share one runtime); otherwise
 * the candidates given by mml_cuda_set_candidates (the binding passes the libcudart of
 * the nvidia-cuda-runtime wheel PyTorch uses); otherwise libcudart.so.12, .so.13, .so.11,
 * .so from the dynamic loader's search path.  MML_CUDA_DISABLE=1
 * makes the load fail as if no runtime were present (tests of the fallbacks on GPU hosts).
 */
#ifndef MML_CUDA_H
#define MML_CUDA_H

#include "mml/common.h"

/* MML_ECUDA with a reason when no usable runtime/device is present.  The first call's
 * outcome is kept: later calls return it again (with the same reason). */
mml_status mml_cuda_load(mml_err *err);
int mml_cuda_available(void);
int mml_cuda_device_count(void);

mml_status mml_cuda_host_alloc(size_t n, void **out, mml_err *err); /* pinned */
void mml_cuda_host_free(void *p);
mml_status mml_cuda_malloc(int device, size_t n, void **out, mml_err *err);
void mml_cuda_free(int device, void *p);

typedef struct mml_cuda_stream mml_cuda_stream; /* opaque cudaStream_t wrapper */
typedef struct mml_cuda_event mml_cuda_event;   /* opaque cudaEvent_t wrapper */

/* A non-blocking stream (does not synchronise with the legacy default stream). */
mml_status mml_cuda_stream_new(int device, mml_cuda_stream **out, mml_err *err);
void mml_cuda_stream_free(mml_cuda_stream *s); /* waits for its work first; NULL is fine */
mml_status mml_cuda_stream_sync(mml_cuda_stream *s, mml_err *err); /* blocks until idle */
mml_status mml_cuda_memcpy_h2d_async(int device, void *dst, const void *src, size_t n,
                                     mml_cuda_stream *s, mml_err *err);
/* Events are created without timing (cheapest to record and query). */
mml_status mml_cuda_event_new(int device, mml_cuda_event **out, mml_err *err);
void mml_cuda_event_free(mml_cuda_event *e); /* NULL is fine */
mml_status mml_cuda_event_record(mml_cuda_event *e, mml_cuda_stream *s, mml_err *err);
/* 1 when done, 0 when pending.  A failed query (a broken context) reports done: nothing
 * will run on that context any more, so nothing can still read the memory. */
int mml_cuda_event_query(mml_cuda_event *e);
mml_status mml_cuda_event_sync(mml_cuda_event *e, mml_err *err);
/* Makes a foreign stream (a cudaStream_t as integer, as DLPack passes it) wait for e. */
mml_status mml_cuda_stream_wait_raw(int device, uintptr_t stream, mml_cuda_event *e, mml_err *err);

/* --- additions ------------------------------------------------------------------- */

/* Raw stream handles the runtime understands (DLPack passes these integers too). */
#define MML_CUDA_STREAM_LEGACY ((uintptr_t)1)     /* cudaStreamLegacy */
#define MML_CUDA_STREAM_PER_THREAD ((uintptr_t)2) /* cudaStreamPerThread */

/* Records e on a foreign stream given as a raw handle (0/1: legacy default stream). */
mml_status mml_cuda_event_record_raw(mml_cuda_event *e, uintptr_t stream, mml_err *err);
/* The device e was created on. */
int mml_cuda_event_device(const mml_cuda_event *e);
/* The calling thread's current device of the loaded runtime (0 when unavailable). */
int mml_cuda_current_device(void);
/* Makes `device` the calling thread's current device (nothing without the runtime). */
void mml_cuda_set_current_device(int device);
/* Where the runtime came from ("(fake)" for an installed table), or NULL. */
const char *mml_cuda_library(void);

/* Paths to try (in order) before the default names, for a load that has not happened yet
 * (later calls replace the list; after the first load they change nothing).  Copied. */
void mml_cuda_set_candidates(const char *const *paths, int n);

/* Checks that `path` can be opened and has every function mmloader uses, then closes it:
 * OK or MML_ECUDA with the reason (not found, or the missing symbol).  Changes nothing. */
mml_status mml_cuda_probe(const char *path, mml_err *err);

/* The runtime functions used, with the runtime's ABI: cudaError_t and cudaMemcpyKind are
 * C enums (int); streams and events are pointers.  Filled by dlsym on load. */
typedef struct mml_cuda_api {
  int (*GetDeviceCount)(int *count);
  int (*GetDevice)(int *device);
  int (*SetDevice)(int device);
  int (*HostAlloc)(void **p, size_t n, unsigned flags);
  int (*FreeHost)(void *p);
  int (*Malloc)(void **p, size_t n);
  int (*Free)(void *p);
  int (*StreamCreateWithFlags)(void **stream, unsigned flags);
  int (*StreamDestroy)(void *stream);
  int (*StreamSynchronize)(void *stream);
  int (*MemcpyAsync)(void *dst, const void *src, size_t n, int kind, void *stream);
  int (*EventCreateWithFlags)(void **event, unsigned flags);
  int (*EventRecord)(void *event, void *stream);
  int (*EventQuery)(void *event);
  int (*EventSynchronize)(void *event);
  int (*EventDestroy)(void *event);
  int (*StreamWaitEvent)(void *stream, void *event, unsigned flags);
  const char *(*GetErrorString)(int error);
} mml_cuda_api;

/* For tests only: replaces the loaded runtime with `api` (a fake runtime that runs on the
 * CPU), or with nothing when api is NULL (the next mml_cuda_load loads again).  Not
 * thread-safe: call it while no other thread uses CUDA.  Does not unload a real library. */
void mml_cuda_install_api(const mml_cuda_api *api);

#endif
