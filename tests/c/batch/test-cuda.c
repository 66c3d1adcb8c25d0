/*
 * test-cuda.c — the CUDA layer without a GPU.
 *
 * 1. The real loader path: with MML_CUDA_DISABLE, with a missing library and with a
 *    library lacking the runtime's symbols, loading fails cleanly with MML_ECUDA and the
 *    allocators fall back (pinned -> ordinary host memory) or refuse (device).
 * 2. Everything above the runtime (allocators, fences, the device stage, device scoping)
 *    against the fake runtime of fake_cudart.h installed with mml_cuda_install_api:
 *    "device" memory is host memory and every stream is a thread running its queue in
 *    order, so a missing wait or a buffer reused too early shows up as wrong bytes (and,
 *    under TSan, as a race).  Gated streams make "the copy has not run yet" a state the
 *    test controls rather than a timing.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_cudart.h"
#include "mml/cuda.h"
#include "mml/device.h"
#include "mml_test.h"

static const mml_cuda_api k_fake = {fk_GetDeviceCount,
                                    fk_GetDevice,
                                    fk_SetDevice,
                                    fk_HostAlloc,
                                    fk_FreeHost,
                                    fk_Malloc,
                                    fk_Free,
                                    fk_StreamCreateWithFlags,
                                    fk_StreamDestroy,
                                    fk_StreamSynchronize,
                                    fk_MemcpyAsync,
                                    fk_EventCreateWithFlags,
                                    fk_EventRecord,
                                    fk_EventQuery,
                                    fk_EventSynchronize,
                                    fk_EventDestroy,
                                    fk_StreamWaitEvent,
                                    fk_GetErrorString};

/* The stage's own stream, reached through the fake (the stage keeps it opaque). */
static fk_stream *g_last_stream_created;
static int fk_StreamCreate_track(void **out, unsigned flags) {
  int rc = fk_StreamCreateWithFlags(out, flags);
  g_last_stream_created = *out;
  return rc;
}

static void install_fake(void) {
  mml_cuda_api api = k_fake;
  api.StreamCreateWithFlags = fk_StreamCreate_track;
  mml_cuda_install_api(&api);
}

/* The fake runtime, installed and loaded (each test runs in its own process).  0: ready. */
static int use_fake(void) {
  install_fake();
  return mml_cuda_load(NULL) == MML_OK ? 0 : -1;
}

/* A host batch of two tensors from `pool`, filled with bytes derived from `seed`. */
static int make_batch(mml_pool *pool, mml_batch *b, int seed, mml_err *err) {
  memset(b, 0, sizeof *b);
  int64_t s1[2] = {3, 1000}, s2[1] = {777};
  void *d1, *d2;
  if (mml_batch_add(b, pool, "pixel_values", MML_DT_FLOAT32, 2, s1, &d1, err) ||
      mml_batch_add(b, pool, "input_ids", MML_DT_INT64, 1, s2, &d2, err))
    return -1;
  for (int i = 0; i < 3000; i++) ((float *)d1)[i] = (float)(seed * 10000 + i);
  for (int i = 0; i < 777; i++) ((int64_t *)d2)[i] = (int64_t)seed * 1000003 + i;
  b->nsamples = seed;
  b->after.pos = seed;
  return 0;
}

/* 1 when the device batch holds the bytes make_batch(seed) wrote. */
static int batch_matches(const mml_batch *d, int seed) {
  const mml_tensor *t1 = &d->tensors[0], *t2 = &d->tensors[1];
  const float *p1 = (const float *)((const char *)t1->buf->data + t1->offset);
  const int64_t *p2 = (const int64_t *)((const char *)t2->buf->data + t2->offset);
  for (int i = 0; i < 3000; i++)
    if (p1[i] != (float)(seed * 10000 + i)) return 0;
  for (int i = 0; i < 777; i++)
    if (p2[i] != (int64_t)seed * 1000003 + i) return 0;
  return 1;
}

/* --- tests: no runtime --------------------------------------------------------------- */

TEST(load_disabled) {
  setenv("MML_CUDA_DISABLE", "1", 1);
  mml_err err = {0};
  CHECK_EQ_INT(mml_cuda_load(&err), MML_ECUDA);
  CHECK(strstr(err.msg, "MML_CUDA_DISABLE") != NULL);
  CHECK_EQ_INT(mml_cuda_available(), 0);
  CHECK_EQ_INT(mml_cuda_device_count(), 0);
  CHECK(mml_cuda_library() == NULL);
  void *p = NULL;
  CHECK_EQ_INT(mml_cuda_host_alloc(64, &p, &err), MML_ECUDA);
  CHECK_EQ_INT(mml_cuda_malloc(0, 64, &p, &err), MML_ECUDA);
  mml_cuda_stream *s = NULL;
  CHECK_EQ_INT(mml_cuda_stream_new(0, &s, &err), MML_ECUDA);
  mml_cuda_host_free(NULL);
  mml_cuda_stream_free(NULL);
  mml_cuda_event_free(NULL);

  /* pinned falls back to ordinary memory, and says why */
  mml_allocator a;
  mml_err_clear(&err);
  CHECK_EQ_INT(mml_pinned_allocator(&a, &err), MML_ECUDA);
  CHECK(strstr(err.msg, "ordinary host memory") != NULL);
  CHECK_EQ_INT(a.kind, MML_MEM_HOST);
  mml_pool *pool = NULL;
  CHECK_OK(mml_pool_new(&a, 0, &pool, &err), err);
  mml_batch b;
  CHECK(make_batch(pool, &b, 3, &err) == 0);
  CHECK_EQ_INT(b.tensors[0].buf->kind, MML_MEM_HOST);
  CHECK_EQ_INT(((uintptr_t)b.tensors[0].buf->data) % 64, 0);
  CHECK_OK(mml_device_guard_pinned(&b, 0, 0, &err), err); /* nothing to guard */
  CHECK(b.tensors[0].buf->fence == NULL);
  mml_batch_clear(&b);
  mml_pool_close(pool);

  CHECK_EQ_INT(mml_device_allocator(0, &a, &err), MML_ECUDA);
  mml_device_stage *st = NULL;
  CHECK_EQ_INT(mml_device_stage_new(0, 0, &st, &err), MML_ECUDA);
  CHECK(st == NULL);
  unsetenv("MML_CUDA_DISABLE");
  mml_cuda_install_api(NULL);
}

TEST(probe_bad_libraries) {
  mml_err err = {0};
  CHECK_EQ_INT(mml_cuda_probe("/nonexistent/libcudart.so.12", &err), MML_ECUDA);
  CHECK(strstr(err.msg, "cannot load /nonexistent/libcudart.so.12") != NULL);
  CHECK_EQ_INT(mml_cuda_probe("libm.so.6", &err), MML_ECUDA);
  CHECK(strstr(err.msg, "missing symbol cudaGetDeviceCount") != NULL);
}

TEST(load_bad_env_path) {
  setenv("MML_CUDART", "/nonexistent/libcudart.so", 1);
  mml_err err = {0};
  CHECK_EQ_INT(mml_cuda_load(&err), MML_ECUDA);
  CHECK(strstr(err.msg, "MML_CUDART=/nonexistent/libcudart.so") != NULL);
  mml_err err2 = {0}; /* the outcome is kept */
  CHECK_EQ_INT(mml_cuda_load(&err2), MML_ECUDA);
  CHECK_EQ_STR(err.msg, err2.msg);
  unsetenv("MML_CUDART");
  mml_cuda_install_api(NULL);
}

/* The pool's side of a fence, with a fence that is a plain flag. */
static atomic_int g_flag_done, g_flag_freed;
static int flag_done(void *f) { return atomic_load((atomic_int *)f); }
static void flag_free(void *f) {
  (void)f;
  atomic_fetch_add(&g_flag_freed, 1);
}

TEST(pool_honours_fence) {
  mml_err err = {0};
  mml_pool *pool = NULL;
  CHECK_OK(mml_pool_new(NULL, 0, &pool, &err), err);
  mml_buf *a = NULL, *b = NULL, *c = NULL;
  CHECK_OK(mml_pool_alloc(pool, 10000, &a, &err), err);
  atomic_store(&g_flag_done, 0);
  atomic_store(&g_flag_freed, 0);
  a->fence = &g_flag_done;
  a->fence_done = flag_done;
  a->fence_free = flag_free;
  void *adata = a->data;
  mml_buf_release(a);
  CHECK_OK(mml_pool_alloc(pool, 10000, &b, &err), err);
  CHECK(b->data != adata); /* fenced: not reused */
  atomic_store(&g_flag_done, 1);
  CHECK_OK(mml_pool_alloc(pool, 10000, &c, &err), err);
  CHECK(c->data == adata); /* done: reused, fence dropped */
  CHECK_EQ_INT(atomic_load(&g_flag_freed), 1);
  CHECK(c->fence == NULL);
  mml_buf_release(b);
  mml_buf_release(c);
  mml_pool_close(pool);
}

/* --- tests: fake runtime ------------------------------------------------------------- */

TEST(fake_load_and_allocators) {
  install_fake();
  mml_err err = {0};
  CHECK_OK(mml_cuda_load(&err), err);
  CHECK_EQ_INT(mml_cuda_device_count(), 2);
  CHECK_EQ_STR(mml_cuda_library(), "(fake)");
  mml_allocator a;
  CHECK_OK(mml_pinned_allocator(&a, &err), err);
  CHECK_EQ_INT(a.kind, MML_MEM_PINNED);
  CHECK_EQ_INT(mml_device_allocator(2, &a, &err), MML_ECUDA);
  CHECK(strstr(err.msg, "cuda:2 does not exist") != NULL);
  CHECK_OK(mml_device_allocator(1, &a, &err), err);
  mml_pool *pool;
  CHECK_OK(mml_pool_new(&a, 0, &pool, &err), err);
  mml_buf *b;
  long before = atomic_load(&fk_device_live);
  CHECK_OK(mml_pool_alloc(pool, 100, &b, &err), err);
  CHECK_EQ_INT(b->kind, MML_MEM_DEVICE);
  CHECK_EQ_INT(b->device, 1);
  CHECK_EQ_INT(atomic_load(&fk_device_live), before + 1);
  mml_buf_release(b);
  mml_pool_close(pool);
  CHECK_EQ_INT(atomic_load(&fk_device_live), before);
  CHECK_EQ_INT(mml_cuda_current_device(), 0); /* allocating on 1 left this thread on 0 */
}

TEST(stage_copies_and_keeps_device) {
  if (use_fake()) FAIL_AT("the fake CUDA runtime did not load");
  mml_err err = {0};
  mml_allocator pa;
  CHECK_OK(mml_pinned_allocator(&pa, &err), err);
  mml_pool *pinned;
  CHECK_OK(mml_pool_new(&pa, 0, &pinned, &err), err);
  fk_SetDevice(1); /* the caller is on another device: the stage must not move it */
  mml_device_stage *st;
  CHECK_OK(mml_device_stage_new(0, 0, &st, &err), err);
  mml_batch h, d;
  CHECK(make_batch(pinned, &h, 7, &err) == 0);
  CHECK_EQ_INT(h.tensors[0].buf->kind, MML_MEM_PINNED);
  CHECK_OK(mml_device_stage_copy(st, &h, &d, &err), err);
  CHECK_EQ_INT(mml_cuda_current_device(), 1);
  CHECK_EQ_INT(d.ntensors, 2);
  CHECK_EQ_STR(d.tensors[1].name, "input_ids");
  CHECK_EQ_INT(d.tensors[0].shape[1], 1000);
  CHECK_EQ_INT(d.tensors[0].buf->kind, MML_MEM_DEVICE);
  CHECK_EQ_INT(d.nsamples, 7);
  CHECK_EQ_INT(d.after.pos, 7);
  for (int i = 0; i < d.ntensors; i++) CHECK_OK(mml_fence_wait(d.tensors[i].buf, &err), err);
  CHECK(batch_matches(&d, 7));
  mml_batch_clear(&h);
  mml_batch_clear(&d);
  mml_device_stage_free(st);
  mml_pool_close(pinned);
  fk_SetDevice(0);
}

/* A pinned buffer is not handed out again while the copy that reads it is pending. */
TEST(pinned_not_reused_before_copy) {
  if (use_fake()) FAIL_AT("the fake CUDA runtime did not load");
  mml_err err = {0};
  mml_allocator pa;
  CHECK_OK(mml_pinned_allocator(&pa, &err), err);
  mml_pool *pinned;
  CHECK_OK(mml_pool_new(&pa, 0, &pinned, &err), err);
  mml_device_stage *st;
  CHECK_OK(mml_device_stage_new(0, 0, &st, &err), err);
  fk_stream *ss = g_last_stream_created;
  mml_batch h, d, h2;
  CHECK(make_batch(pinned, &h, 1, &err) == 0);
  void *first = h.tensors[0].buf->data;
  fk_gate(ss, 1);
  CHECK_OK(mml_device_stage_copy(st, &h, &d, &err), err);
  mml_batch_clear(&h);                          /* the producer is done with it; the copy is not */
  CHECK(make_batch(pinned, &h2, 2, &err) == 0); /* would overwrite batch 1 if reused */
  CHECK(h2.tensors[0].buf->data != first);
  CHECK(h2.tensors[1].buf->data != first);
  fk_gate(ss, 0);
  for (int i = 0; i < d.ntensors; i++) CHECK_OK(mml_fence_wait(d.tensors[i].buf, &err), err);
  CHECK(batch_matches(&d, 1));
  mml_batch h3;
  CHECK(make_batch(pinned, &h3, 3, &err) == 0); /* copy done: reused now */
  CHECK(h3.tensors[0].buf->data == first || h3.tensors[1].buf->data == first);
  mml_batch_clear(&h2);
  mml_batch_clear(&h3);
  mml_batch_clear(&d);
  mml_device_stage_free(st);
  mml_pool_close(pinned);
}

/* The consumer's stream waits for the copy (no host wait), and a device buffer is not
 * reused while work the consumer queued before releasing it is pending. */
TEST(consumer_stream_waits_and_holds) {
  if (use_fake()) FAIL_AT("the fake CUDA runtime did not load");
  mml_err err = {0};
  mml_allocator pa;
  CHECK_OK(mml_pinned_allocator(&pa, &err), err);
  mml_pool *pinned;
  CHECK_OK(mml_pool_new(&pa, 0, &pinned, &err), err);
  mml_device_stage *st;
  CHECK_OK(mml_device_stage_new(0, 0, &st, &err), err);
  fk_stream *ss = g_last_stream_created;
  void *cs = consumer_stream();
  mml_batch h, d;
  CHECK(make_batch(pinned, &h, 4, &err) == 0);
  fk_gate(ss, 1);
  CHECK_OK(mml_device_stage_copy(st, &h, &d, &err), err);
  mml_batch_clear(&h);
  size_t n = 3000 * sizeof(float);
  float *seen = malloc(n);
  memset(seen, 0xEE, n);
  mml_buf *db = d.tensors[0].buf;
  CHECK_OK(mml_fence_export(db, 0, (uintptr_t)cs, &err), err);
  int nev, nstr;
  mml_fence_counts(db, &nev, &nstr);
  CHECK_EQ_INT(nev, 1);
  CHECK_EQ_INT(nstr, 1);
  /* the consumer's "kernel": reads the device tensor on its stream */
  fk_MemcpyAsync(seen, db->data, n, 1, cs);
  fk_quiesce(cs); /* it can run no further: it waits for the gated copy */
  unsigned char raw[4];
  memcpy(raw, seen, 4);
  CHECK(raw[0] == 0xEE && raw[3] == 0xEE);
  fk_gate(ss, 0);
  fk_StreamSynchronize(cs);
  for (int i = 0; i < 3000; i++)
    if (seen[i] != (float)(4 * 10000 + i)) FAIL_AT("consumer read stale data at %d", i);

  /* hold: the consumer queues another read, then drops the tensor */
  void *old = db->data;
  fk_gate(cs, 1);
  memset(seen, 0xEE, n);
  fk_MemcpyAsync(seen, db->data, n, 1, cs);
  mml_batch_clear(&d);
  mml_batch h2, d2;
  CHECK(make_batch(pinned, &h2, 5, &err) == 0);
  CHECK_OK(mml_device_stage_copy(st, &h2, &d2, &err), err);
  CHECK(d2.tensors[0].buf->data != old && d2.tensors[1].buf->data != old);
  fk_gate(cs, 0);
  fk_StreamSynchronize(cs);
  for (int i = 0; i < 3000; i++)
    if (seen[i] != (float)(4 * 10000 + i)) FAIL_AT("consumer read recycled data at %d", i);
  mml_batch_clear(&h2);
  mml_batch_clear(&d2);
  free(seen);
  mml_device_stage_free(st);
  mml_pool_close(pinned);
  fk_StreamDestroy(cs);
}

/* pin_memory without a device stage: a trainer's non_blocking copy on its stream. */
TEST(pinned_guard_holds_until_consumer_copy) {
  if (use_fake()) FAIL_AT("the fake CUDA runtime did not load");
  mml_err err = {0};
  mml_allocator pa;
  CHECK_OK(mml_pinned_allocator(&pa, &err), err);
  mml_pool *pinned;
  CHECK_OK(mml_pool_new(&pa, 0, &pinned, &err), err);
  void *cs = consumer_stream();
  mml_batch h;
  CHECK(make_batch(pinned, &h, 6, &err) == 0);
  CHECK_OK(mml_device_guard_pinned(&h, 0, (uintptr_t)cs, &err), err);
  int nev, nstr;
  mml_fence_counts(h.tensors[0].buf, &nev, &nstr);
  CHECK_EQ_INT(nev, 0);
  CHECK_EQ_INT(nstr, 2); /* legacy default stream + the consumer's */
  size_t n = 3000 * sizeof(float);
  float *dev = malloc(n);
  void *old = h.tensors[0].buf->data;
  fk_gate(cs, 1);
  fk_MemcpyAsync(dev, old, n, 1, cs); /* tensor.cuda(non_blocking=True) */
  mml_batch_clear(&h);
  mml_batch h2;
  CHECK(make_batch(pinned, &h2, 7, &err) == 0);
  CHECK(h2.tensors[0].buf->data != old && h2.tensors[1].buf->data != old);
  fk_gate(cs, 0);
  fk_StreamSynchronize(cs);
  for (int i = 0; i < 3000; i++)
    if (dev[i] != (float)(6 * 10000 + i)) FAIL_AT("trainer copied recycled data at %d", i);
  mml_batch_clear(&h2);
  free(dev);
  mml_pool_close(pinned);
  fk_StreamDestroy(cs);
}

TEST(export_no_sync) {
  if (use_fake()) FAIL_AT("the fake CUDA runtime did not load");
  mml_err err = {0};
  mml_allocator da;
  CHECK_OK(mml_device_allocator(0, &da, &err), err);
  mml_pool *pool;
  CHECK_OK(mml_pool_new(&da, 0, &pool, &err), err);
  mml_buf *b;
  CHECK_OK(mml_pool_alloc(pool, 10, &b, &err), err);
  CHECK_OK(mml_fence_export(b, 0, MML_NO_SYNC, &err), err);
  CHECK(b->fence == NULL);
  CHECK_OK(mml_fence_export(b, 0, 0, &err), err); /* 0: the legacy default stream */
  CHECK_OK(mml_fence_export(b, 0, MML_CUDA_STREAM_LEGACY, &err), err);
  int nev, nstr;
  mml_fence_counts(b, &nev, &nstr);
  CHECK_EQ_INT(nstr, 1);
  mml_buf_release(b);
  mml_pool_close(pool);
}

TEST(stage_copy_failure_leaves_nothing) {
  if (use_fake()) FAIL_AT("the fake CUDA runtime did not load");
  mml_err err = {0};
  mml_allocator pa;
  CHECK_OK(mml_pinned_allocator(&pa, &err), err);
  mml_pool *pinned;
  CHECK_OK(mml_pool_new(&pa, 0, &pinned, &err), err);
  mml_device_stage *st;
  CHECK_OK(mml_device_stage_new(0, 0, &st, &err), err);
  mml_batch h, d;
  CHECK(make_batch(pinned, &h, 8, &err) == 0);
  long dev_before = atomic_load(&fk_device_live);
  atomic_store(&fk_fail_malloc, 1);
  CHECK_EQ_INT(mml_device_stage_copy(st, &h, &d, &err), MML_ENOMEM);
  CHECK(strstr(err.msg, "copy to cuda:0") != NULL);
  CHECK_EQ_INT(d.ntensors, 0);
  mml_batch_clear(&h);
  mml_device_stage_free(st);
  mml_pool_close(pinned);
  CHECK(atomic_load(&fk_device_live) <= dev_before);
}

/* Many batches through two producer threads and a consumer stream: nothing leaks, the
 * pools stay bounded, every batch arrives intact. */
typedef struct {
  mml_pool *pinned;
  mml_device_stage *st;
  void *cs;
  int first, count, bad;
} worker_arg;

static void *worker(void *p) {
  worker_arg *w = p;
  mml_err err = {0};
  size_t n = 3000 * sizeof(float);
  float *seen = malloc(n);
  for (int k = 0; k < w->count; k++) {
    mml_batch h, d;
    if (make_batch(w->pinned, &h, w->first + k, &err) ||
        mml_device_stage_copy(w->st, &h, &d, &err)) {
      w->bad++;
      mml_batch_clear(&h);
      continue;
    }
    mml_batch_clear(&h);
    /* the consumer reads on its stream after waiting for the copy, then drops the batch */
    if (mml_fence_export(d.tensors[0].buf, 0, (uintptr_t)w->cs, &err)) w->bad++;
    fk_MemcpyAsync(seen, d.tensors[0].buf->data, n, 1, w->cs);
    fk_StreamSynchronize(w->cs);
    if (seen[5] != (float)((w->first + k) * 10000 + 5)) w->bad++;
    mml_batch_clear(&d);
  }
  free(seen);
  return NULL;
}

TEST(many_batches_no_leak) {
  if (use_fake()) FAIL_AT("the fake CUDA runtime did not load");
  mml_err err = {0};
  long pinned0 = atomic_load(&fk_pinned_live), dev0 = atomic_load(&fk_device_live);
  long ev0 = atomic_load(&fk_events_live), str0 = atomic_load(&fk_streams_live);
  mml_allocator pa;
  CHECK_OK(mml_pinned_allocator(&pa, &err), err);
  mml_pool *pinned;
  CHECK_OK(mml_pool_new(&pa, 0, &pinned, &err), err);
  mml_device_stage *st;
  CHECK_OK(mml_device_stage_new(0, 0, &st, &err), err);
  worker_arg w[2] = {{pinned, st, consumer_stream(), 100, 150, 0},
                     {pinned, st, consumer_stream(), 1000, 150, 0}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, worker, &w[i]);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  CHECK_EQ_INT(w[0].bad + w[1].bad, 0);
  size_t cached, live;
  mml_pool_usage(mml_device_stage_pool(st), &cached, &live);
  CHECK_EQ_INT(live, 0);
  CHECK(cached <= 64 * 16384); /* bounded: a handful of buffers, not one per batch */
  mml_pool_usage(pinned, &cached, &live);
  CHECK_EQ_INT(live, 0);
  CHECK(cached <= 64 * 16384);
  mml_device_stage_free(st); /* consumer streams must outlive the buffers they used */
  mml_pool_close(pinned);
  for (int i = 0; i < 2; i++) fk_StreamDestroy(w[i].cs);
  CHECK_EQ_INT(atomic_load(&fk_pinned_live), pinned0);
  CHECK_EQ_INT(atomic_load(&fk_device_live), dev0);
  CHECK_EQ_INT(atomic_load(&fk_events_live), ev0);
  CHECK_EQ_INT(atomic_load(&fk_streams_live), str0);
}

/* The copy's event is destroyed (its last reference dropped) while a consumer stream still
 * has a wait on it queued.  The runtime allows this (a wait captures the event when it is
 * queued; cudaEventDestroy of an event with pending work returns at once and the runtime
 * frees it later), and it happens whenever a consumer stream lags: the fake must keep
 * the event alive for its queued ops, or the consumer's worker touches freed memory
 * (ASan: heap-use-after-free; without ASan, "unaligned fastbin chunk" aborts). */
TEST(event_destroyed_while_consumer_waits) {
  if (use_fake()) FAIL_AT("the fake CUDA runtime did not load");
  mml_err err = {0};
  long ev0 = atomic_load(&fk_events_live);
  mml_allocator pa;
  CHECK_OK(mml_pinned_allocator(&pa, &err), err);
  mml_pool *pinned;
  CHECK_OK(mml_pool_new(&pa, 0, &pinned, &err), err);
  mml_device_stage *st;
  CHECK_OK(mml_device_stage_new(0, 0, &st, &err), err);
  fk_stream *ss = g_last_stream_created;
  void *cs = consumer_stream();
  mml_batch h, d;
  CHECK(make_batch(pinned, &h, 11, &err) == 0);
  fk_gate(ss, 1); /* the copy is pending, so the export queues a wait on cs */
  CHECK_OK(mml_device_stage_copy(st, &h, &d, &err), err);
  mml_batch_clear(&h);
  fk_gate(cs, 1); /* the consumer lags: its wait stays queued */
  CHECK_OK(mml_fence_export(d.tensors[0].buf, 0, (uintptr_t)cs, &err), err);
  fk_gate(ss, 0);
  fk_StreamSynchronize(ss);
  mml_batch_clear(&d);
  mml_pool_close(pinned); /* the host buffers' fences drop the (completed) copy event */
  /* The next copy looks at the cached device buffers: their fences drop it too (the one
   * exported to cs stays pending on its release event), and that was its last reference. */
  mml_batch h2, d2;
  mml_pool *hp;
  CHECK_OK(mml_pool_new(NULL, 0, &hp, &err), err);
  CHECK(make_batch(hp, &h2, 12, &err) == 0);
  CHECK_OK(mml_device_stage_copy(st, &h2, &d2, &err), err);
  CHECK_OK(mml_fence_wait(d2.tensors[0].buf, &err), err);
  CHECK(batch_matches(&d2, 12));
  fk_gate(cs, 0); /* the wait queued on cs runs now */
  fk_StreamSynchronize(cs);
  mml_batch_clear(&h2);
  mml_batch_clear(&d2);
  mml_pool_close(hp);
  mml_device_stage_free(st); /* waits for the release event recorded on cs */
  fk_StreamDestroy(cs);
  CHECK_EQ_INT(atomic_load(&fk_events_live), ev0);
}

/* A pool closed while a copy is still reading a pinned buffer frees it only after. */
TEST(close_waits_for_pending_copy) {
  if (use_fake()) FAIL_AT("the fake CUDA runtime did not load");
  mml_err err = {0};
  mml_allocator pa;
  CHECK_OK(mml_pinned_allocator(&pa, &err), err);
  mml_pool *pinned;
  CHECK_OK(mml_pool_new(&pa, 0, &pinned, &err), err);
  mml_device_stage *st;
  CHECK_OK(mml_device_stage_new(0, 0, &st, &err), err);
  fk_stream *ss = g_last_stream_created;
  mml_batch h, d;
  CHECK(make_batch(pinned, &h, 9, &err) == 0);
  fk_gate(ss, 1);
  CHECK_OK(mml_device_stage_copy(st, &h, &d, &err), err);
  mml_batch_clear(&h);
  fk_gate(ss, 0);         /* the close below would wait forever on a closed gate */
  mml_pool_close(pinned); /* frees the cached pinned buffers: after the copy */
  for (int i = 0; i < d.ntensors; i++) CHECK_OK(mml_fence_wait(d.tensors[i].buf, &err), err);
  CHECK(batch_matches(&d, 9));
  mml_batch_clear(&d);
  mml_device_stage_free(st);
  mml_cuda_install_api(NULL);
}
