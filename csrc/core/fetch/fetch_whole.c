/*
 * fetch_whole.c — servers that ignore Range (issue 29): a ranged GET answered 200 with the
 * whole object (Python's http.server does this) marks its server; from then on each
 * ranged GET of that server's objects is served from the object fetched ONCE and kept
 * whole, instead of downloading it again per read (an index scan asks for 8 MiB chunks, a
 * record read for its line, a video demuxer for its blocks: each was a whole download).
 *
 * Invariants (tests/test_hostile_servers.py cites them):
 *  1. An object of a Range-ignoring server is downloaded at most once while it is kept;
 *     readers that ask for it while it loads wait on that download (one GET).
 *  2. Kept objects hold at most whole_cap bytes together (the fetcher's whole_cache_bytes:
 *     the loader's max_memory / 4, else 1 GiB); the least recently used one is dropped to
 *     make room.  An object larger than whole_cap is refused with a message that says why
 *     and what to do, never read in pieces by whole downloads.
 *  3. A failed whole download is forgotten (the next read tries again) and its readers
 *     get its error.
 *  4. Slices are copied out under the lock, so a kept object is never freed while read.
 *
 * Threads: any loop's I/O thread calls fw_mark_norange and fw_route (job_plan) and gets
 * the whole download's completion (whole_done); the state lives in loop 0 (top) under
 * wmu, never held while a callback runs.  Readers waiting on a download are jobs that
 * are in no loop's lists; they finish here (finish_waiter), on the thread that completed
 * the download (some loop's I/O thread, as mml/fetch.h promises).
 */
#include <stdio.h>
#include <string.h>

#include "fetch_loop.h"
#include "mml/message.h"

typedef struct whole_obj {
  struct whole_obj *next;
  mml_fetcher *top;
  char *url;
  int ready;
  mml_bytes body; /* ready: the whole object */
  job *waiting;   /* loading: readers (linked by next) */
  uint64_t tick;  /* last use (LRU) */
} whole_obj;

/* Length of "scheme://authority" of u (the server). */
static size_t server_len(const char *u) {
  const char *s = strstr(u, "://");
  if (!s) return 0;
  s += 3;
  return (size_t)(s - u) + strcspn(s, "/?#");
}

static int norange_has_locked(mml_fetcher *top, const char *u) {
  size_t n = server_len(u);
  for (int i = 0; i < top->nnorange; i++)
    if (strlen(top->norange[i]) == n && !strncmp(top->norange[i], u, n)) return 1;
  return 0;
}

void fw_mark_norange(job *j) {
  mml_fetcher *top = j->top;
  const char *u = j->http_url ? j->http_url : j->url;
  pthread_mutex_lock(&top->wmu);
  if (!norange_has_locked(top, u) &&
      top->nnorange < (int)(sizeof top->norange / sizeof *top->norange)) {
    char *d = dupn(u, server_len(u));
    if (d) top->norange[top->nnorange++] = d;
  }
  pthread_mutex_unlock(&top->wmu);
}

/* j's answer: its slice of the whole object (copied under wmu). */
static void slice_locked(job *j, const mml_bytes *obj) {
  int64_t size = (int64_t)obj->len, a = j->off < size ? j->off : size;
  int64_t b = j->len < 0 || j->len > size - a ? size : a + j->len;
  mml_bytes_clear(&j->body);
  j->total = size;
  if (b > a && mml_bytes_append(&j->body, obj->data + a, (size_t)(b - a))) {
    j->failed = 1, j->fst = MML_ENOMEM;
    mml_err_set(&j->ferr, MML_ENOMEM, "GET %s: out of memory", j->shown);
  }
}

/* Completes a reader that is in no loop's lists (its twins too), then frees it. */
static void finish_waiter(job *j) {
  fetch_waiter *tw = fl_twin_detach(j);
  if (j->total_out) *j->total_out = j->total;
  if (j->failed) {
    fl_notify_waiters(tw, j, j->fst, NULL);
    j->cb(j->ctx, j->fst, NULL, &j->ferr);
  } else {
    fl_notify_waiters(tw, j, MML_OK, &j->body);
    mml_bytes body = j->body;
    memset(&j->body, 0, sizeof j->body);
    j->cb(j->ctx, MML_OK, &body, NULL);
  }
  fl_job_free(j);
}

static void unlink_locked(mml_fetcher *top, whole_obj *e) {
  for (whole_obj **p = &top->whole; *p; p = &(*p)->next)
    if (*p == e) {
      *p = e->next;
      break;
    }
}

static void obj_free(whole_obj *e) {
  mml_bytes_free(&e->body);
  free(e->url);
  free(e);
}

/* Drops least recently used kept objects (not keep) until `need` more bytes fit. */
static void evict_locked(mml_fetcher *top, int64_t need, const whole_obj *keep) {
  while (top->whole_bytes + need > top->whole_cap) {
    whole_obj *lru = NULL;
    for (whole_obj *e = top->whole; e; e = e->next)
      if (e->ready && e != keep && (!lru || e->tick < lru->tick)) lru = e;
    if (!lru) return;
    unlink_locked(top, lru);
    top->whole_bytes -= (int64_t)lru->body.len;
    obj_free(lru);
  }
}

/* The most bytes a whole download may bring: a kept object fits whole_cap. */
static int64_t whole_limit(const mml_fetcher *top) {
  return top->max_object_bytes > 0 && top->max_object_bytes < top->whole_cap ? top->max_object_bytes
                                                                             : top->whole_cap;
}

/* The whole download is over (the I/O thread of the loop that ran it). */
static void whole_done(void *ctx, mml_status st, mml_bytes *body, const mml_err *err) {
  whole_obj *e = ctx;
  mml_fetcher *top = e->top;
  mml_err why = {0};
  char *shown = mml_url_redact(e->url);
  if (st == MML_EOBJECTSIZE)
    mml_err_set(&why, st,
                "GET %s: the server ignores Range requests (it answered a ranged GET with the "
                "whole object), so the object is fetched once and kept whole, and it is larger "
                "than the %lld bytes allowed for that (the least of max_object_bytes and the "
                "bytes kept whole: max_memory / 4, or 1 GiB without max_memory): serve it from "
                "a server that honours Range, or raise those limits",
                shown ? shown : "(url)", (long long)whole_limit(top));
  else if (st)
    mml_err_set(&why, st, "%s (fetched whole: the server ignores Range requests)",
                err ? err->msg : "failed");
  free(shown);
  if (!st && body->cap > body->len + body->len / 8) { /* keep what it holds, not its growth */
    uint8_t *d = realloc(body->data, body->len ? body->len : 1);
    if (d) body->data = d, body->cap = body->len ? body->len : 1;
  }
  pthread_mutex_lock(&top->wmu);
  job *readers = e->waiting;
  e->waiting = NULL;
  if (!st) {
    evict_locked(top, (int64_t)body->len, e);
    e->body = *body;
    memset(body, 0, sizeof *body);
    e->ready = 1, e->tick = ++top->whole_tick;
    top->whole_bytes += (int64_t)e->body.len;
  }
  for (job *j = readers; j; j = j->next) {
    if (st)
      j->failed = 1, j->fst = st, j->ferr = why;
    else
      slice_locked(j, &e->body);
  }
  if (st) unlink_locked(top, e); /* invariant 3 */
  pthread_mutex_unlock(&top->wmu);
  if (st) obj_free(e);
  for (job *j = readers, *n; j; j = n) {
    n = j->next;
    finish_waiter(j);
  }
}

static int ranged(const job *j) {
  return !j->head && !j->whole && !(j->canon_query && *j->canon_query) &&
         (j->off > 0 || j->len > 0);
}

int fw_route(mml_fetcher *f, job *j, job **start) {
  mml_fetcher *top = j->top;
  *start = NULL;
  if (!ranged(j)) return 0;
  pthread_mutex_lock(&top->wmu);
  if (!norange_has_locked(top, j->http_url ? j->http_url : j->url)) {
    pthread_mutex_unlock(&top->wmu);
    return 0;
  }
  whole_obj *e = top->whole;
  while (e && strcmp(e->url, j->url)) e = e->next;
  if (e && e->ready) { /* kept: answer at once */
    e->tick = ++top->whole_tick;
    slice_locked(j, &e->body);
    pthread_mutex_unlock(&top->wmu);
    finish_waiter(j);
    return 1;
  }
  if (e) { /* loading: wait on it (invariant 1) */
    j->next = e->waiting, e->waiting = j;
    pthread_mutex_unlock(&top->wmu);
    return 1;
  }
  mml_err err = {0};
  job *w = NULL;
  e = calloc(1, sizeof *e);
  if (e) e->top = top;
  mml_status st = e && (e->url = dupstr(j->url)) ? MML_OK : MML_ENOMEM;
  if (!st) st = fl_job_new(top, j->url, NULL, 0, -1, 0, whole_done, e, &w, &err);
  if (st) {
    pthread_mutex_unlock(&top->wmu);
    if (e) free(e->url), free(e);
    j->failed = 1, j->fst = st;
    mml_err_set(&j->ferr, st, "GET %s: out of memory", j->shown);
    finish_waiter(j);
    return 1;
  }
  w->whole = 1, w->limit = whole_limit(top);
  j->next = NULL, e->waiting = j;
  e->next = top->whole, top->whole = e;
  pthread_mutex_unlock(&top->wmu);
  *start = w;
  return 1;
}

void fw_free(mml_fetcher *top) {
  for (whole_obj *e = top->whole, *n; e; e = n) {
    n = e->next;
    obj_free(e); /* loading ones cannot remain: every loop cancelled its jobs */
  }
  top->whole = NULL;
  for (int i = 0; i < top->nnorange; i++) free(top->norange[i]);
  top->nnorange = 0;
}
