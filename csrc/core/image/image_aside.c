/*
 * image_aside.c — a decode that close() can walk away from (issue 29, ARCHITECTURE 4.8).
 *
 * Some decoders have no abort hook and do most of their work inside one call: libwebp's
 * incremental decoder decodes no row before the first partition is complete, and a flat
 * lossy WebP's first partition is nearly the whole file (213,934 of 214,212 bytes at
 * 9000x9000), so its last feed decodes every row in one call of seconds.  Such a decode
 * (the caller decides which: image_webp.c, from its pixel count) runs here on a thread of
 * its own, on its own copy of the input, into the caller's output buffer moved into the
 * job (its pages stay mapped from one image to the next, as before), while the caller
 * waits, looking at its cancel flag every MML_ASIDE_POLL_MS.  Finished: the buffer moves
 * back, the result is returned.  Cancelled (close(), Ctrl-C, exit): the caller returns at
 * once without the buffer, and the job is abandoned to its thread, which stops at its
 * next cancel check (its own flag, now set) or when the call returns, then frees the job
 * and the buffer itself.
 *
 * Invariants (tests cite them):
 *   1. The job's thread touches only the job: its input copy, its output, its argument
 *      copy and its flag; nothing of the caller's once mml_image_aside returns.
 *   2. At most MML_ASIDE_ABANDONED abandoned jobs are alive in the process (each holds its
 *      own input and output, what its decode was charged); past that, and when a thread
 *      or the job's memory cannot be had, the caller decodes on its own thread as before.
 *   3. The output is the same function's on the same bytes: the pixels are those of the
 *      decode on the caller's thread.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "image_fmt.h"

enum { MML_ASIDE_POLL_MS = 2, MML_ASIDE_ABANDONED = 2 };

static int g_abandoned; /* abandoned jobs alive (atomic) */

typedef struct aside_job {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done, abandoned, rc;
  mml_aside_fn fn;
  mml_cancel cancel; /* the job's own flag: set when it is abandoned */
  uint8_t *in;
  mml_bytes out;
  size_t len;
  unsigned char arg[]; /* the caller's argument, copied */
} aside_job;

static void job_free(aside_job *j) {
  pthread_mutex_destroy(&j->mu);
  pthread_cond_destroy(&j->cv);
  free(j->in);
  mml_bytes_free(&j->out);
  free(j);
}

static void *job_main(void *p) {
  aside_job *j = p;
  int rc = j->fn(j->arg, j->in, j->len, j->out.data, &j->cancel);
  pthread_mutex_lock(&j->mu);
  j->rc = rc;
  j->done = 1;
  const int abandoned = j->abandoned;
  pthread_cond_signal(&j->cv);
  pthread_mutex_unlock(&j->mu);
  if (abandoned) { /* (1) nobody else holds it any more */
    job_free(j);
    __atomic_fetch_sub(&g_abandoned, 1, __ATOMIC_RELAXED);
  }
  return NULL;
}

static aside_job *job_new(mml_aside_fn fn, const void *arg, size_t arg_size, const uint8_t *in,
                          size_t len) {
  aside_job *j = calloc(1, sizeof *j + arg_size);
  if (!j || !(j->in = malloc(len ? len : 1))) {
    free(j);
    return NULL;
  }
  j->fn = fn;
  j->len = len;
  memcpy(j->arg, arg, arg_size);
  memcpy(j->in, in, len);
  pthread_mutex_init(&j->mu, NULL);
  pthread_cond_init(&j->cv, NULL);
  return j;
}

int mml_image_aside(mml_aside_fn fn, void *arg, size_t arg_size, const uint8_t *in, size_t len,
                    mml_bytes *out, const mml_cancel *cancel, int *rc) {
  if (__atomic_load_n(&g_abandoned, __ATOMIC_RELAXED) >= MML_ASIDE_ABANDONED) return 0; /* (2) */
  aside_job *j = job_new(fn, arg, arg_size, in, len);
  if (!j) return 0;
  j->out = *out; /* the buffer moves into the job */
  memset(out, 0, sizeof *out);
  pthread_attr_t at;
  pthread_t th;
  int started = !pthread_attr_init(&at);
  if (started) {
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    started = !pthread_create(&th, &at, job_main, j);
    pthread_attr_destroy(&at);
  }
  if (started) {
    pthread_mutex_lock(&j->mu);
    while (!j->done && !mml_cancelled(cancel)) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += MML_ASIDE_POLL_MS * 1000000L;
      if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
      pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    }
    if (!j->done) { /* cancelled: the job's thread finishes and frees it */
      j->abandoned = 1;
      mml_cancel_set(&j->cancel);
      __atomic_fetch_add(&g_abandoned, 1, __ATOMIC_RELAXED);
      pthread_mutex_unlock(&j->mu);
      return -1;
    }
    pthread_mutex_unlock(&j->mu);
    *rc = j->rc;
    memcpy(arg, j->arg, arg_size);
  }
  *out = j->out; /* the buffer moves back */
  memset(&j->out, 0, sizeof j->out);
  job_free(j);
  return started;
}

int mml_image_aside_abandoned(void) { return __atomic_load_n(&g_abandoned, __ATOMIC_RELAXED); }
