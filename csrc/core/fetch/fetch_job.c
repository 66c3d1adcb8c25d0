/*
 * fetch_job.c — the fetcher's jobs and xfers (design: fetch_loop.c): their creation and
 * lists, coalescing of identical in-flight requests (twins), completion (a job finishes
 * when its last xfer does; its callback and every waiter get the body or the first
 * permanent error), and the curl header/body/progress callbacks that fill an xfer's
 * slice of the job's body.  Everything here runs on the loop's I/O thread, except
 * fl_job_new and fl_twin_attach, which the submitting thread calls (under the top
 * fetcher's lock for the twin table).
 */
#include <stdarg.h>
#include <stdio.h>
#include <strings.h>

#include "fetch_loop.h"
#include "mml/message.h"
#include "mml/s3.h"
/* ---- jobs and xfers ----------------------------------------------------------------- */

void fl_job_free(job *j) {
  if (!j) return;
  for (fetch_waiter *w = j->waiters, *n; w; w = n) n = w->next, free(w);
  free(j->url), free(j->shown), free(j->http_url), free(j->host), free(j->canon_uri);
  free(j->canon_query);
  mml_bytes_free(&j->body);
  free(j);
}

mml_status fl_job_new(mml_fetcher *f, const char *url, const char *query, int64_t off, int64_t len,
                      int head, mml_fetch_cb cb, void *ctx, job **out, mml_err *err) {
  if (!url || !cb) return mml_err_set(err, MML_EINVAL, "fetch: NULL url or callback");
  if (off < 0) return mml_err_set(err, MML_EINVAL, "fetch: negative offset");
  job *j = calloc(1, sizeof *j);
  if (!j) return mml_err_set(err, MML_ENOMEM, "fetch: out of memory for a request");
  j->url = dupstr(url);
  j->shown = mml_url_redact(url);
  if (!j->url || !j->shown) {
    fl_job_free(j);
    return mml_err_set(err, MML_ENOMEM, "fetch: out of memory for a request");
  }
  j->off = off, j->len = len, j->head = head, j->cb = cb, j->ctx = ctx, j->total = -1;
  j->top = f;
  mml_status st = MML_OK;
  if (!strncmp(url, "s3://", 5)) {
    const char *b, *k;
    size_t bl;
    j->is_s3 = 1;
    mml_s3_addr a;
    st = mml_s3_split(url, &b, &bl, &k, j->shown, err);
    if (!st) st = mml_s3_address_parts(f->region, f->endpoint, b, bl, k, query, &a, err);
    if (!st) {
      j->http_url = a.http_url, j->host = a.host, j->canon_uri = a.canonical_uri;
      if (!(j->canon_query = dupstr(query ? query : "")))
        st = mml_err_set(err, MML_ENOMEM, "fetch: out of memory for a request");
    }
  } else if (!strncmp(url, "http://", 7) || !strncmp(url, "https://", 8)) {
    j->http_url = dupstr(url);
    if (!j->http_url) st = mml_err_set(err, MML_ENOMEM, "fetch: out of memory for a request");
  } else {
    st = mml_err_set(err, MML_EINVAL, "%s: not a remote URL (http://, https://, s3://)", j->shown);
  }
  if (st) {
    fl_job_free(j);
    return st;
  }
  *out = j;
  return MML_OK;
}

static void link_x(mml_fetcher *f, xfer *x) {
  x->next_all = f->all_x, x->prev_all = NULL;
  if (f->all_x) f->all_x->prev_all = x;
  f->all_x = x;
}
static void unlink_x(mml_fetcher *f, xfer *x) {
  if (x->prev_all)
    x->prev_all->next_all = x->next_all;
  else
    f->all_x = x->next_all;
  if (x->next_all) x->next_all->prev_all = x->prev_all;
}
void fl_link_j(mml_fetcher *f, job *j) {
  j->next_all = f->all_j, j->prev_all = NULL;
  if (f->all_j) f->all_j->prev_all = j;
  f->all_j = j;
}
static void unlink_j(mml_fetcher *f, job *j) {
  if (j->prev_all)
    j->prev_all->next_all = j->next_all;
  else
    f->all_j = j->next_all;
  if (j->next_all) j->next_all->prev_all = j->prev_all;
}

void fl_ready_push_back(mml_fetcher *f, xfer *x) {
  x->next = NULL;
  if (f->ready_tail)
    f->ready_tail->next = x;
  else
    f->ready_head = x;
  f->ready_tail = x;
}
void fl_ready_push_front(mml_fetcher *f, xfer *x) {
  x->next = f->ready_head;
  f->ready_head = x;
  if (!f->ready_tail) f->ready_tail = x;
}

xfer *fl_xfer_new(mml_fetcher *f, job *j, int64_t off, int64_t len, int probe, int64_t dst) {
  xfer *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  x->j = j, x->off = off, x->len = len, x->probe = probe, x->dst = dst;
  j->parts_left++;
  link_x(f, x);
  return x;
}

void fl_xfer_release_easy(mml_fetcher *f, xfer *x) {
  if (x->easy) {
    curl_multi_remove_handle(f->multi, x->easy);
    f->inflight--;
    pthread_mutex_lock(&f->smu);
    f->stats.inflight = f->inflight; /* before any completion callback can run */
    pthread_mutex_unlock(&f->smu);
    curl_easy_cleanup(x->easy); /* never reused: see xfer_start */
    x->easy = NULL;
  }
  curl_slist_free_all(x->hdrs);
  x->hdrs = NULL;
}

static void xfer_free(mml_fetcher *f, xfer *x) {
  fl_xfer_release_easy(f, x);
  unlink_x(f, x);
  mml_bytes_free(&x->errbody);
  free(x);
}

/* ---- coalescing identical requests (any thread; the table is under top->cmu) ---------- */

static uint64_t twin_key(const job *j) {
  uint64_t h = mml_hash_bytes(0, j->url, strlen(j->url));
  h = mml_hash_bytes(h, &j->off, sizeof j->off);
  return mml_mix64(mml_hash_bytes(h, &j->len, sizeof j->len));
}

static int twin_of(const job *a, const job *b) {
  return a->key == b->key && a->off == b->off && a->len == b->len && !strcmp(a->url, b->url);
}

/* 1 when an identical GET is in flight: j's callback then waits on it (j is freed). */
int fl_twin_attach(mml_fetcher *top, job *j) {
  j->key = twin_key(j) | 1; /* 0: not in the table */
  job **b = &top->twins[j->key % (sizeof top->twins / sizeof *top->twins)];
  pthread_mutex_lock(&top->cmu);
  for (job *t = *b; t; t = t->twin_next) {
    if (!twin_of(t, j)) continue;
    fetch_waiter *w = malloc(sizeof *w);
    if (!w) break; /* fetch it on its own */
    *w = (fetch_waiter){t->waiters, j->cb, j->ctx};
    t->waiters = w;
    pthread_mutex_unlock(&top->cmu);
    fl_job_free(j);
    return 1;
  }
  j->twin_next = *b;
  *b = j;
  pthread_mutex_unlock(&top->cmu);
  return 0;
}

/* Takes j out of the table (no waiter joins after this) and returns its waiters. */
fetch_waiter *fl_twin_detach(job *j) {
  if (!j->key) return NULL;
  mml_fetcher *top = j->top;
  pthread_mutex_lock(&top->cmu);
  for (job **b = &top->twins[j->key % (sizeof top->twins / sizeof *top->twins)]; *b;
       b = &(*b)->twin_next)
    if (*b == j) {
      *b = j->twin_next;
      break;
    }
  fetch_waiter *w = j->waiters;
  j->waiters = NULL;
  j->key = 0;
  pthread_mutex_unlock(&top->cmu);
  return w;
}

/* Waiters of a coalesced request get the same outcome (a copy of the body). */
void fl_notify_waiters(fetch_waiter *w, const job *j, mml_status st, const mml_bytes *body) {
  for (fetch_waiter *n; w; w = n) {
    n = w->next;
    mml_bytes copy = {0};
    if (st == MML_OK && mml_bytes_append(&copy, body->data, body->len)) {
      mml_err e;
      mml_err_set(&e, MML_ENOMEM, "GET %s: out of memory", j->shown);
      w->cb(w->ctx, MML_ENOMEM, NULL, &e);
    } else if (st == MML_OK) {
      w->cb(w->ctx, MML_OK, &copy, NULL);
    } else {
      w->cb(w->ctx, st, NULL, &j->ferr);
    }
    mml_bytes_free(&copy);
    free(w);
  }
}

void fl_job_finish(mml_fetcher *f, job *j) {
  unlink_j(f, j);
  if (j->total_out) *j->total_out = j->total;
  fetch_waiter *waiters = fl_twin_detach(j);
  if (j->failed) {
    pthread_mutex_lock(&f->smu);
    f->stats.failures++;
    pthread_mutex_unlock(&f->smu);
    fl_notify_waiters(waiters, j, j->fst, NULL);
    j->cb(j->ctx, j->fst, NULL, &j->ferr);
  } else {
    if (j->len >= 0 && !j->head) {
      int64_t want = j->len;
      if (j->total >= 0 && j->total - j->off < want)
        want = j->total - j->off > 0 ? j->total - j->off : 0;
      if ((int64_t)j->body.len > want) j->body.len = (size_t)want;
    }
    if (j->head) { /* HEAD reports the size as one int64 */
      mml_bytes_clear(&j->body);
      if (mml_bytes_append(&j->body, &j->total, sizeof j->total) ||
          mml_bytes_append(&j->body, j->etag, strlen(j->etag))) {
        j->failed = 1, j->fst = MML_ENOMEM;
        mml_err_set(&j->ferr, MML_ENOMEM, "HEAD %s: out of memory", j->shown);
        fl_notify_waiters(waiters, j, j->fst, NULL);
        j->cb(j->ctx, j->fst, NULL, &j->ferr);
        fl_job_free(j);
        return;
      }
    }
    fl_notify_waiters(waiters, j, MML_OK, &j->body);
    mml_bytes body = j->body;
    memset(&j->body, 0, sizeof j->body);
    j->cb(j->ctx, MML_OK, &body, NULL);
  }
  fl_job_free(j);
}

/* The part is over (success or permanent failure). */
void fl_part_done(mml_fetcher *f, xfer *x) {
  job *j = x->j;
  xfer_free(f, x);
  if (--j->parts_left == 0) fl_job_finish(f, j);
}

void fl_part_fail(mml_fetcher *f, xfer *x, mml_status st, const char *fmt, ...) {
  job *j = x->j;
  if (!j->failed) {
    char why[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    j->failed = 1, j->fst = st;
    char range[64] = "";
    if (x->len > 0 || x->off > 0)
      snprintf(range, sizeof range, " (bytes %lld-%s)", (long long)x->off, x->len > 0 ? "" : "end");
    if (x->len > 0)
      snprintf(range, sizeof range, " (bytes %lld-%lld)", (long long)x->off,
               (long long)(x->off + x->len - 1));
    char tail[48] = "";
    if (j->retries) snprintf(tail, sizeof tail, " [after %d retries]", j->retries);
    mml_err_set(&j->ferr, st, "%s %s%s: %s%s", j->head ? "HEAD" : "GET", j->shown, range, why,
                tail);
  }
  fl_part_done(f, x);
}

/* ---- curl callbacks (I/O thread) ------------------------------------------------------ */

size_t fl_on_header(char *p, size_t sz, size_t n, void *ud) {
  xfer *x = ud;
  size_t len = sz * n;
  if (len >= 5 && !strncmp(p, "HTTP/", 5)) { /* a new response (redirect, 100): start over */
    const char *sp = memchr(p, ' ', len);
    x->http = sp ? strtol(sp + 1, NULL, 10) : 0;
    x->retry_after = -1, x->cr_start = x->cr_end = x->cr_total = -1, x->clen = -1;
    x->etag[0] = 0;
    return len;
  }
  char line[256];
  size_t m = len < sizeof line - 1 ? len : sizeof line - 1;
  memcpy(line, p, m), line[m] = 0;
  if (!strncasecmp(line, "retry-after:", 12)) {
    char *e;
    double v = strtod(line + 12, &e);
    if (e != line + 12 && v >= 0) x->retry_after = v;
  } else if (!strncasecmp(line, "content-range:", 14)) {
    long long a, b, t;
    const char *v = line + 14;
    while (*v == ' ') v++;
    if (sscanf(v, "bytes %lld-%lld/%lld", &a, &b, &t) == 3)
      x->cr_start = a, x->cr_end = b, x->cr_total = t;
    else if (sscanf(v, "bytes */%lld", &t) == 1)
      x->cr_total = t;
  } else if (!strncasecmp(line, "etag:", 5)) {
    const char *v = line + 5;
    while (*v == ' ') v++;
    size_t vl = strcspn(v, "\r\n");
    if (vl < sizeof x->etag) memcpy(x->etag, v, vl), x->etag[vl] = 0;
  } else if (!strncasecmp(line, "content-length:", 15)) {
    x->clen = strtoll(line + 15, NULL, 10);
  }
  /* a 2xx body declared larger than max_object_bytes is refused before it comes (a GET of
   * the whole object: a ranged one receives its range, however large the object) */
  int64_t max = fl_job_limit(x->j);
  if (max > 0 && !x->j->head && x->j->len < 0 && x->http >= 200 && x->http < 300 &&
      (x->cr_total > max || (x->http == 200 && x->clen > max))) {
    x->toobig = 2;
    return 0; /* aborts the transfer */
  }
  return len;
}

/* Stall detection: libcurl's LOW_SPEED_* averages over a window of seconds, so a
 * transfer that stops after a burst of bytes is noticed late; this checks the time since
 * the last byte instead (libcurl calls it at least once a second). */
int fl_on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
  (void)dt, (void)dn, (void)ut, (void)un;
  xfer *x = ud;
  if (mml_now() - x->last_rx > x->stall_s) {
    x->stalled = 1;
    return 1;
  }
  return 0;
}

size_t fl_on_body(char *p, size_t sz, size_t n, void *ud) {
  xfer *x = ud;
  job *j = x->j;
  size_t len = sz * n;
  x->last_rx = mml_now();
  if (x->http < 200 || x->http >= 300) { /* error document: keep the start for the code */
    size_t room = x->errbody.len < ERRBODY_MAX ? ERRBODY_MAX - x->errbody.len : 0;
    if (room && mml_bytes_append(&x->errbody, p, len < room ? len : room)) x->nomem = 1;
    return x->nomem ? 0 : len;
  }
  if (x->http == 200 && (x->off > 0 || x->len > 0) && x->got == 0 && x->skip == 0 &&
      x->cr_start < 0) {
    /* The server ignored Range: drop the bytes before our slice (and stop after it);
     * its later ranged reads are served from the object fetched once (fetch_whole.c). */
    x->skip = x->off + 1; /* +1 marks "initialised"; removed below */
    fw_mark_norange(j);
  }
  const char *q = p;
  size_t left = len;
  if (x->skip > 1) {
    size_t drop = (uint64_t)(x->skip - 1) < left ? (size_t)(x->skip - 1) : left;
    q += drop, left -= drop, x->skip -= (int64_t)drop;
  }
  if (!left) return len;
  if (x->probe) {
    int64_t max = fl_job_limit(j);
    if (x->http == 200 && x->cr_start < 0 && x->len < 0 && !j->whole && !x->cut &&
        (int64_t)(j->body.len + left) > j->top->range_chunk) {
      x->cut = 1; /* more than the first range came: the server ignored Range (noted once) */
      fw_mark_norange(j);
    }
    if (max > 0 && (int64_t)(j->body.len + left) > max) { /* undeclared size: cut here */
      x->toobig = 1;
      return 0;
    }
    if (mml_bytes_append(&j->body, q, left)) {
      x->nomem = 1;
      return 0;
    }
    x->got += (int64_t)left;
    return len;
  }
  /* fixed slice [dst, dst + len) of the job body */
  int64_t room = x->len - x->got;
  if (room <= 0) {
    if (x->skip) return len; /* whole object came back: ignore the rest */
    x->overflow = 1;
    return 0;
  }
  size_t take = (int64_t)left < room ? left : (size_t)room;
  if (take < left && !x->skip) {
    x->overflow = 1;
    return 0;
  }
  memcpy(j->body.data + x->dst + x->got, q, take);
  x->got += (int64_t)take;
  if (x->skip && x->got == x->len) { /* Range ignored: our slice is in, the rest is not wanted */
    x->cut = 1;
    return 0;
  }
  return len;
}

/* ---- starting a transfer ---------------------------------------------------------------- */
