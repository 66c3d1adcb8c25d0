/*
 * fake_cudart.c — the fake runtime of fake_cudart.h under the CUDA runtime's own names, as
 * a shared library.  tests/test_cuda.py builds it (cc -shared -fPIC) and points MML_CUDART
 * at it to run the loader's device path end to end on a machine without a GPU.  Not part
 * of mmloader; not built by the Makefile (it builds test-*.c only).
 */
#include "fake_cudart.h"

#define EXPORT __attribute__((visibility("default")))

EXPORT int cudaGetDeviceCount(int *n) { return fk_GetDeviceCount(n); }
EXPORT int cudaGetDevice(int *d) { return fk_GetDevice(d); }
EXPORT int cudaSetDevice(int d) { return fk_SetDevice(d); }
EXPORT int cudaHostAlloc(void **p, size_t n, unsigned f) { return fk_HostAlloc(p, n, f); }
EXPORT int cudaFreeHost(void *p) { return fk_FreeHost(p); }
EXPORT int cudaMalloc(void **p, size_t n) { return fk_Malloc(p, n); }
EXPORT int cudaFree(void *p) { return fk_Free(p); }
static void *_Atomic g_last_stream;
EXPORT int cudaStreamCreateWithFlags(void **s, unsigned f) {
  int rc = fk_StreamCreateWithFlags(s, f);
  atomic_store(&g_last_stream, *s);
  return rc;
}
EXPORT int cudaStreamDestroy(void *s) { return fk_StreamDestroy(s); }
EXPORT int cudaStreamSynchronize(void *s) { return fk_StreamSynchronize(s); }
EXPORT int cudaMemcpyAsync(void *d, const void *s, size_t n, int k, void *st) {
  return fk_MemcpyAsync(d, s, n, k, st);
}
EXPORT int cudaEventCreateWithFlags(void **e, unsigned f) { return fk_EventCreateWithFlags(e, f); }
EXPORT int cudaEventRecord(void *e, void *s) { return fk_EventRecord(e, s); }
EXPORT int cudaEventQuery(void *e) { return fk_EventQuery(e); }
EXPORT int cudaEventSynchronize(void *e) { return fk_EventSynchronize(e); }
EXPORT int cudaEventDestroy(void *e) { return fk_EventDestroy(e); }
EXPORT int cudaStreamWaitEvent(void *s, void *e, unsigned f) { return fk_StreamWaitEvent(s, e, f); }
EXPORT const char *cudaGetErrorString(int e) { return fk_GetErrorString(e); }

/* Test hooks (ctypes): live allocations, consumer streams, gates, queued ops, the last stream
 * made. */
EXPORT long fake_cudart_live_device(void) { return atomic_load(&fk_device_live); }
EXPORT long fake_cudart_live_pinned(void) { return atomic_load(&fk_pinned_live); }
EXPORT long fake_cudart_live_events(void) { return atomic_load(&fk_events_live); }
EXPORT void *fake_cudart_stream_new(void) { return consumer_stream(); }
EXPORT void fake_cudart_gate(void *s, int closed) { fk_gate(s, closed); }
EXPORT void fake_cudart_quiesce(void *s) { fk_quiesce(s); }
EXPORT void fake_cudart_sync(void *s) { fk_StreamSynchronize(s); }
EXPORT long fake_cudart_queued(void *s) { return fk_queued(s); }
EXPORT void *fake_cudart_last_stream(void) { return atomic_load(&g_last_stream); }
EXPORT int fake_cudart_memcpy(void *d, const void *s, size_t n, void *st) {
  return fk_MemcpyAsync(d, s, n, 1, st);
}
