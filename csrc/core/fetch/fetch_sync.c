/*
 * fetch_sync.c — blocking helpers on top of the fetcher's submit: the caller waits on a
 * condition variable that the completion callback (I/O thread) signals.  A blocking call
 * from a completion callback would wait on its own thread, so it is refused.
 */
#include "mml/fetch_sync.h"

#include "mml/message.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fetch_loop.h"

typedef struct waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  mml_status st;
  mml_bytes body;
  mml_err err;
} waiter;

static void waiter_cb(void *ctx, mml_status st, mml_bytes *body, const mml_err *err) {
  waiter *w = ctx;
  pthread_mutex_lock(&w->mu);
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

static mml_status get_query(mml_fetcher *f, const char *url, const char *query, int64_t off,
                            int64_t len, int head, mml_bytes *out, int64_t *total, mml_err *err) {
  for (int i = 0; f && i < (f->nloops ? f->nloops : 1); i++) {
    mml_fetcher *l = f->nloops ? f->loops[i] : f;
    if (l->io_started && pthread_equal(pthread_self(), l->io))
      return mml_err_set(err, MML_EINVAL, "fetch: blocking call from a completion callback");
  }
  waiter w = {.st = MML_OK};
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  mml_status st = mml_fetch_submit_query(f, url, query, off, len, head, waiter_cb, &w, total, err);
  if (st == MML_OK) {
    pthread_mutex_lock(&w.mu);
    while (!w.done) pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    st = w.st;
    if (st == MML_OK) {
      mml_bytes_free(out);
      *out = w.body;
    } else {
      mml_bytes_free(&w.body);
      if (err) *err = w.err;
    }
  }
  pthread_mutex_destroy(&w.mu);
  pthread_cond_destroy(&w.cv);
  return st;
}

mml_status mml_fetch_get_query(mml_fetcher *f, const char *url, const char *query, int64_t off,
                               int64_t len, int head, mml_bytes *out, mml_err *err) {
  return get_query(f, url, query, off, len, head, out, NULL, err);
}

mml_status mml_fetch_get_sized(mml_fetcher *f, const char *url, int64_t off, int64_t len,
                               mml_bytes *out, int64_t *total, mml_err *err) {
  if (!out || !total) return mml_err_set(err, MML_EINVAL, "fetch: NULL output");
  *total = -1;
  return get_query(f, url, NULL, off, len, 0, out, total, err);
}

mml_status mml_fetch_get(mml_fetcher *f, const char *url, int64_t off, int64_t len, mml_bytes *out,
                         mml_err *err) {
  if (!out) return mml_err_set(err, MML_EINVAL, "fetch: NULL output");
  return mml_fetch_get_query(f, url, NULL, off, len, 0, out, err);
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
