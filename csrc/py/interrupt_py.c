/*
 * interrupt_py.c — engine work that Ctrl-C can stop (ARCHITECTURE 4.8).  A thread that
 * waits inside the engine with the GIL released cannot run Python's signal handlers:
 * Ctrl-C during a Loader's construction (index scans, listings, remote reads, the plan)
 * was ignored until it finished.  mml_py_run_interruptible runs such work on a helper
 * thread while the calling thread waits in 100 ms slices, taking the GIL back between
 * them to run the signal handlers (PyErr_CheckSignals).  When a handler raises
 * (KeyboardInterrupt), the work's cancel flag is set; the engine's loops check it
 * (mml_cancel) and return MML_ECANCELLED within milliseconds, the helper is joined and
 * the exception propagates.
 *
 * Threads: the helper runs only `fn` (no Python); it is always joined before the call
 * returns, so `arg` may live on the caller's stack.  The CUDA current device is per
 * thread: a helper given one makes it current first (the loader's pinned-memory release
 * guard reads the constructing thread's).
 */
#include <pthread.h>
#include <time.h>

#include "binding.h"
#include "mml/cuda.h"

typedef struct {
  void (*fn)(void *);
  void *arg;
  int device; /* the caller's CUDA device, or -1 */
  int done;
  pthread_mutex_t mu;
  pthread_cond_t cv;
} job;

static void *job_main(void *p) {
  job *j = p;
  if (j->device >= 0) mml_cuda_set_current_device(j->device);
  j->fn(j->arg);
  pthread_mutex_lock(&j->mu);
  j->done = 1;
  pthread_cond_signal(&j->cv);
  pthread_mutex_unlock(&j->mu);
  return NULL;
}

/* Waits up to `s` seconds for the job (GIL released by the caller). */
static int wait_done(job *j, double s) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_nsec += (long)(s * 1e9);
  while (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&j->mu);
  while (!j->done)
    if (pthread_cond_timedwait(&j->cv, &j->mu, &ts)) break;
  int done = j->done;
  pthread_mutex_unlock(&j->mu);
  return done;
}

int mml_py_run_interruptible(void (*fn)(void *), void *arg, int device, mml_cancel *cancel) {
  job j = {fn, arg, device, 0};
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&j.cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&j.mu, NULL);
  pthread_t t;
  int rc = 0, started = pthread_create(&t, NULL, job_main, &j) == 0;
  if (!started) { /* no thread to spare: run it here, uninterruptible as before */
    Py_BEGIN_ALLOW_THREADS
    fn(arg);
    Py_END_ALLOW_THREADS
  }
  while (started) {
    int done;
    Py_BEGIN_ALLOW_THREADS
    done = wait_done(&j, 0.1);
    Py_END_ALLOW_THREADS
    if (done) break;
    if (PyErr_CheckSignals() < 0) { /* a handler raised: stop the work, keep its error */
      mml_cancel_set(cancel);
      rc = -1;
      break;
    }
  }
  if (started) {
    Py_BEGIN_ALLOW_THREADS
    pthread_join(t, NULL);
    Py_END_ALLOW_THREADS
  }
  pthread_cond_destroy(&j.cv);
  pthread_mutex_destroy(&j.mu);
  return rc;
}
