/*
 * fetch_sync.c — blocking helpers on top of the fetcher's submit: the caller waits on a
 * condition variable that the completion callback (I/O thread) signals.  A blocking call
 * from a completion callback would wait on its own thread, so it is refused.
 *
 * Cancellation: the caller waits in 50 ms slices and checks the fetcher's cancel flag
 * (mml_fetch_cfg.cancel) and the call's own (mml_fetch_get_cancellable) between them; once set it returns MML_ECANCELLED at once and
 * leaves the waiter (heap memory) to the completion, which frees it: the request itself
 * ends by its deadlines or when the fetcher is freed (its completions then run).
 */
#include "mml/fetch_sync.h"

#include "mml/message.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fetch_loop.h"

typedef struct waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  int abandoned; /* the caller left (cancelled): the completion frees the waiter */
  mml_status st;
  mml_bytes body;
  mml_err err;
} waiter;

static void waiter_free(waiter *w) {
  mml_bytes_free(&w->body);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
}

static void waiter_cb(void *ctx, mml_status st, mml_bytes *body, const mml_err *err) {
  waiter *w = ctx;
  pthread_mutex_lock(&w->mu);
  if (w->abandoned) {
    pthread_mutex_unlock(&w->mu);
    if (body) mml_bytes_free(body); /* the callback owns it */
    waiter_free(w);
    return;
  }
  w->st = st;
  if (body) { /* the waiter takes the memory (a twin's copy is freed after the call) */
    w->body = *body;
    memset(body, 0, sizeof *body);
  }
  if (err) w->err = *err;
  w->done = 1;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static int stopped(const mml_fetcher *f, const mml_cancel *own) {
  return mml_cancelled(f->cancel) || mml_cancelled(own);
}

static mml_status get_query(mml_fetcher *f, const char *url, const char *query, int64_t off,
                            int64_t len, int head, mml_bytes *out, int64_t *total,
                            const mml_cancel *own, mml_err *err) {
  for (int i = 0; f && i < (f->nloops ? f->nloops : 1); i++) {
    mml_fetcher *l = f->nloops ? f->loops[i] : f;
    if (l->io_started && pthread_equal(pthread_self(), l->io))
      return mml_err_set(err, MML_EINVAL, "fetch: blocking call from a completion callback");
  }
  if (f && stopped(f, own)) return mml_err_set(err, MML_ECANCELLED, "fetch: cancelled");
  waiter *w = calloc(1, sizeof *w);
  if (!w) return mml_err_set(err, MML_ENOMEM, "fetch: out of memory");
  pthread_mutex_init(&w->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&w->cv, &ca);
  pthread_condattr_destroy(&ca);
  mml_status st = mml_fetch_submit_query(f, url, query, off, len, head, waiter_cb, w, total, err);
  if (st) {
    waiter_free(w);
    return st;
  }
  pthread_mutex_lock(&w->mu);
  while (!w->done) {
    if (stopped(f, own)) {
      w->abandoned = 1; /* the completion frees it */
      pthread_mutex_unlock(&w->mu);
      return mml_err_set(err, MML_ECANCELLED, "fetch: cancelled");
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += 50 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&w->cv, &w->mu, &ts);
  }
  pthread_mutex_unlock(&w->mu);
  st = w->st;
  if (st == MML_OK) {
    mml_bytes_free(out);
    *out = w->body;
    w->body = (mml_bytes){0};
  } else if (err) {
    *err = w->err;
  }
  waiter_free(w);
  return st;
}

mml_status mml_fetch_get_query(mml_fetcher *f, const char *url, const char *query, int64_t off,
                               int64_t len, int head, mml_bytes *out, mml_err *err) {
  return get_query(f, url, query, off, len, head, out, NULL, NULL, err);
}

mml_status mml_fetch_get_sized(mml_fetcher *f, const char *url, int64_t off, int64_t len,
                               mml_bytes *out, int64_t *total, mml_err *err) {
  if (!out || !total) return mml_err_set(err, MML_EINVAL, "fetch: NULL output");
  *total = -1;
  return get_query(f, url, NULL, off, len, 0, out, total, NULL, err);
}

mml_status mml_fetch_get(mml_fetcher *f, const char *url, int64_t off, int64_t len, mml_bytes *out,
                         mml_err *err) {
  if (!out) return mml_err_set(err, MML_EINVAL, "fetch: NULL output");
  return mml_fetch_get_query(f, url, NULL, off, len, 0, out, err);
}

mml_status mml_fetch_get_cancellable(mml_fetcher *f, const char *url, int64_t off, int64_t len,
                                     const mml_cancel *cancel, mml_bytes *out, mml_err *err) {
  if (!out) return mml_err_set(err, MML_EINVAL, "fetch: NULL output");
  return get_query(f, url, NULL, off, len, 0, out, NULL, cancel, err);
}

mml_status mml_fetch_stat(mml_fetcher *f, const char *url, int64_t *size, char *etag,
                          size_t etag_cap, mml_err *err) {
  if (!size) return mml_err_set(err, MML_EINVAL, "fetch: NULL output");
  mml_bytes h = {0};
  mml_status st = mml_fetch_get_query(f, url, NULL, 0, -1, 1, &h, err);
  if (st == MML_OK) {
    int64_t v = -1;
    if (h.len >= sizeof v) memcpy(&v, h.data, sizeof v);
    if (v < 0) {
      char *shown = mml_url_redact(url);
      st = mml_err_set(err, MML_EFETCH, "HEAD %s: no Content-Length", shown ? shown : "(url)");
      free(shown);
    } else {
      *size = v;
      if (etag && etag_cap) { /* the bytes after the size: the ETag, as the server sent it */
        size_t n = h.len - sizeof v < etag_cap - 1 ? h.len - sizeof v : etag_cap - 1;
        memcpy(etag, h.data + sizeof v, n);
        etag[n] = 0;
      }
    }
  }
  mml_bytes_free(&h);
  return st;
}

mml_status mml_fetch_size(mml_fetcher *f, const char *url, int64_t *size, mml_err *err) {
  return mml_fetch_stat(f, url, size, NULL, 0, err);
}
