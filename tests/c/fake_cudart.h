/*
 * fake_cudart.h — a CUDA runtime that runs on the CPU, for tests on machines without a GPU.
 *
 * "Device" memory is host memory (cudaMalloc fills it with 0xCD); every stream is a thread
 * running its queue in order (copies, event records, event waits); the legacy default
 * stream (handles 0, 1, 2) runs synchronously.  Streams have gates: a closed gate holds
 * the stream's work, which lets a test make "the copy has not run yet" a state instead of
 * a timing.  Included by tests/c/test-cuda.c (table installed with mml_cuda_install_api)
 * and by tests/c/fake_cudart.c (the same functions under their cuda* names, built as a
 * shared library that MML_CUDART can point at).
 *
 * Events follow the runtime's lifetime rules: cudaEventDestroy may be called while work
 * queued on a stream (a record, or a cudaStreamWaitEvent that captured the event) still
 * refers to it; the runtime then frees it once that work is done.  So an event is
 * reference counted: one reference for the handle, one for each queued op naming it.
 */
#ifndef MML_FAKE_CUDART_H
#define MML_FAKE_CUDART_H
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { FK_NDEV = 2, FK_NOT_READY = 600, FK_INVALID_DEVICE = 101, FK_OOM = 2 };

typedef struct fk_event {
  atomic_int refs; /* the handle + queued ops naming the event */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  long recorded, completed;
} fk_event;

typedef enum { OP_COPY, OP_RECORD, OP_WAIT } fk_kind;
typedef struct fk_op {
  fk_kind kind;
  void *dst;
  const void *src;
  size_t n;
  fk_event *ev;
  long gen;
  struct fk_op *next;
} fk_op;

typedef struct fk_stream {
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  fk_op *head, *tail;
  int busy, stop, gate_closed, waiting; /* waiting: blocked on an event or the gate */
} fk_stream;

static atomic_long fk_pinned_live, fk_device_live, fk_streams_live, fk_events_live;
static atomic_int fk_fail_malloc;
static _Thread_local int fk_cur_dev;

static int is_legacy(void *s) { return (uintptr_t)s <= 2; }

static void ev_retain(fk_event *e) { atomic_fetch_add(&e->refs, 1); }

static void ev_release(fk_event *e) {
  if (atomic_fetch_sub(&e->refs, 1) != 1) return;
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  free(e);
}

static void ev_complete(fk_event *e, long gen) {
  pthread_mutex_lock(&e->mu);
  if (gen > e->completed) e->completed = gen;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
}

static void ev_wait(fk_event *e, long gen) {
  pthread_mutex_lock(&e->mu);
  while (e->completed < gen) pthread_cond_wait(&e->cv, &e->mu);
  pthread_mutex_unlock(&e->mu);
}

static void *fk_worker(void *arg) {
  fk_stream *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->stop && (!s->head || s->gate_closed)) {
      s->waiting = s->head != NULL;
      pthread_cond_broadcast(&s->cv);
      pthread_cond_wait(&s->cv, &s->mu);
    }
    if (!s->head) break; /* stop requested and nothing left */
    fk_op *op = s->head;
    s->head = op->next;
    if (!s->head) s->tail = NULL;
    s->busy = 1;
    if (op->kind == OP_WAIT) {
      s->waiting = 1;
      pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    switch (op->kind) {
      case OP_COPY:
        memcpy(op->dst, op->src, op->n);
        break;
      case OP_RECORD:
        ev_complete(op->ev, op->gen);
        break;
      case OP_WAIT:
        ev_wait(op->ev, op->gen);
        break;
    }
    if (op->ev) ev_release(op->ev);
    free(op);
    pthread_mutex_lock(&s->mu);
    s->busy = 0;
    s->waiting = 0;
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static int fk_push(fk_stream *s, fk_op op) {
  fk_op *o = malloc(sizeof *o);
  if (!o) return FK_OOM;
  *o = op;
  o->next = NULL;
  if (o->ev) ev_retain(o->ev); /* dropped by the worker once the op has run */
  pthread_mutex_lock(&s->mu);
  if (s->tail)
    s->tail->next = o;
  else
    s->head = o;
  s->tail = o;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return 0;
}

static void fk_gate(void *stream, int closed) {
  fk_stream *s = stream;
  pthread_mutex_lock(&s->mu);
  s->gate_closed = closed;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* Ops queued on the stream and not yet started (a closed gate holds them all). */
static inline long fk_queued(void *stream) {
  fk_stream *s = stream;
  long n = 0;
  pthread_mutex_lock(&s->mu);
  for (fk_op *o = s->head; o; o = o->next) n++;
  pthread_mutex_unlock(&s->mu);
  return n;
}

/* Waits until the stream has nothing it can run: empty, gated, or blocked on an event. */
static void fk_quiesce(void *stream) {
  fk_stream *s = stream;
  pthread_mutex_lock(&s->mu);
  while (!((!s->head && !s->busy) || s->waiting)) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

static int fk_GetDeviceCount(int *n) {
  *n = FK_NDEV;
  return 0;
}
static int fk_GetDevice(int *d) {
  *d = fk_cur_dev;
  return 0;
}
static int fk_SetDevice(int d) {
  if (d < 0 || d >= FK_NDEV) return FK_INVALID_DEVICE;
  fk_cur_dev = d;
  return 0;
}
static int fk_HostAlloc(void **p, size_t n, unsigned flags) {
  (void)flags;
  *p = malloc(n);
  if (!*p) return FK_OOM;
  atomic_fetch_add(&fk_pinned_live, 1);
  return 0;
}
static int fk_FreeHost(void *p) {
  free(p);
  atomic_fetch_sub(&fk_pinned_live, 1);
  return 0;
}
static int fk_Malloc(void **p, size_t n) {
  if (atomic_exchange(&fk_fail_malloc, 0)) return FK_OOM;
  *p = malloc(n);
  if (!*p) return FK_OOM;
  memset(*p, 0xCD, n);
  atomic_fetch_add(&fk_device_live, 1);
  return 0;
}
static int fk_Free(void *p) {
  free(p);
  atomic_fetch_sub(&fk_device_live, 1);
  return 0;
}
static int fk_StreamCreateWithFlags(void **out, unsigned flags) {
  (void)flags;
  fk_stream *s = calloc(1, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  pthread_create(&s->th, NULL, fk_worker, s);
  atomic_fetch_add(&fk_streams_live, 1);
  *out = s;
  return 0;
}
static int fk_StreamSynchronize(void *stream) {
  if (is_legacy(stream)) return 0;
  fk_stream *s = stream;
  pthread_mutex_lock(&s->mu);
  while (s->head || s->busy) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  return 0;
}
static int fk_StreamDestroy(void *stream) {
  fk_stream *s = stream;
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  s->gate_closed = 0;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->th, NULL);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
  atomic_fetch_sub(&fk_streams_live, 1);
  return 0;
}
static int fk_MemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream) {
  (void)kind;
  if (is_legacy(stream)) {
    memcpy(dst, src, n);
    return 0;
  }
  return fk_push(stream, (fk_op){.kind = OP_COPY, .dst = dst, .src = src, .n = n});
}
static int fk_EventCreateWithFlags(void **out, unsigned flags) {
  (void)flags;
  fk_event *e = calloc(1, sizeof *e);
  if (!e) return FK_OOM;
  atomic_init(&e->refs, 1);
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  atomic_fetch_add(&fk_events_live, 1);
  *out = e;
  return 0;
}
static int fk_EventRecord(void *event, void *stream) {
  fk_event *e = event;
  pthread_mutex_lock(&e->mu);
  long gen = ++e->recorded;
  pthread_mutex_unlock(&e->mu);
  if (is_legacy(stream)) {
    ev_complete(e, gen);
    return 0;
  }
  return fk_push(stream, (fk_op){.kind = OP_RECORD, .ev = e, .gen = gen});
}
static int fk_EventQuery(void *event) {
  fk_event *e = event;
  pthread_mutex_lock(&e->mu);
  int done = e->completed >= e->recorded;
  pthread_mutex_unlock(&e->mu);
  return done ? 0 : FK_NOT_READY;
}
static int fk_EventSynchronize(void *event) {
  fk_event *e = event;
  pthread_mutex_lock(&e->mu);
  long gen = e->recorded;
  pthread_mutex_unlock(&e->mu);
  ev_wait(e, gen);
  return 0;
}
/* Returns at once; the event is freed when no queued op names it any more.  The live count
 * is of handles (what a caller can leak), so it does not depend on the streams' progress. */
static int fk_EventDestroy(void *event) {
  atomic_fetch_sub(&fk_events_live, 1);
  ev_release(event);
  return 0;
}
static int fk_StreamWaitEvent(void *stream, void *event, unsigned flags) {
  (void)flags;
  fk_event *e = event;
  pthread_mutex_lock(&e->mu);
  long gen = e->recorded;
  pthread_mutex_unlock(&e->mu);
  if (is_legacy(stream)) {
    ev_wait(e, gen);
    return 0;
  }
  return fk_push(stream, (fk_op){.kind = OP_WAIT, .ev = e, .gen = gen});
}
static const char *fk_GetErrorString(int e) {
  return e == FK_OOM ? "out of memory (fake)" : "fake error";
}

/* A consumer stream (what a trainer's torch.cuda.Stream would be). */
static void *consumer_stream(void) {
  void *s = NULL;
  fk_StreamCreateWithFlags(&s, 1);
  return s;
}
#endif
