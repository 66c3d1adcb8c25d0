/*
 * fetch_loop.h — private to the fetcher (fetch.c, fetch_loop.c, fetch_job.c, fetch_sync.c,
 * s3.c): the
 * job/xfer/fetcher structures and the entry points of the I/O loop.  Threads and
 * ownership are described at the top of fetch_loop.c.
 */
#ifndef MML_FETCH_LOOP_H
#define MML_FETCH_LOOP_H

#include <curl/curl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "mml/fetch.h"

#define LAT_RING 8192
#define ERRBODY_MAX 8192

/* ---- types ------------------------------------------------------------------------ */

typedef struct job job;
typedef struct xfer xfer;

enum { RETRY_5XX, RETRY_429, RETRY_TIMEOUT, RETRY_RESET, RETRY_SHORT };

struct job {
  job *next; /* submit queue */
  job *prev_all, *next_all;
  char *url;         /* as submitted */
  char *shown;       /* redacted, for messages */
  char *http_url;    /* what curl fetches (S3: endpoint + encoded path + query) */
  char *host;        /* S3: Host header value (signed) */
  char *canon_uri;   /* S3: canonical URI */
  char *canon_query; /* S3: canonical query ("" if none); listings only */
  int is_s3, head;
  int64_t off, len; /* requested range (len < 0: to the end) */
  mml_fetch_cb cb;
  void *ctx;
  mml_bytes body;
  int64_t total; /* object size once known, else -1 */
  int parts_left;
  int failed;
  mml_status fst;
  mml_err ferr;
  int retries;        /* over all parts, for messages */
  int64_t limit;      /* the most body bytes (0: the fetcher's max_object_bytes) */
  int whole;          /* an internal whole-object GET of fetch_whole.c (never routed) */
  int64_t *total_out; /* not NULL: gets `total` at completion (mml_fetch_get_sized) */
  char etag[128];     /* from the probe: later range parts send If-Match with it */
  /* coalescing: identical requests (url, off, len) submitted while this one is in flight
   * wait on it; the table of in-flight jobs lives in the fetcher handed out (loop 0) */
  struct fetch_waiter *waiters;
  job *twin_next; /* chain of the table's bucket */
  uint64_t key;
  mml_fetcher *top;
};

typedef struct fetch_waiter {
  struct fetch_waiter *next;
  mml_fetch_cb cb;
  void *ctx;
} fetch_waiter;

struct xfer {
  xfer *next; /* ready / delayed list */
  xfer *prev_all, *next_all;
  job *j;
  CURL *easy;
  struct curl_slist *hdrs;
  int64_t off, len; /* absolute range asked for; len < 0: open (probe), 0: none (whole) */
  int probe;        /* appends into j->body; may spawn more parts */
  int64_t dst;      /* fixed mode: offset into j->body */
  int64_t got;      /* body bytes accepted this attempt */
  int64_t skip;     /* server ignored Range: bytes still to drop */
  int attempt;
  double due;
  long http;
  double retry_after;                 /* seconds, < 0 when absent */
  int64_t cr_start, cr_end, cr_total; /* Content-Range, -1 when absent */
  int64_t clen;                       /* Content-Length, -1 when absent */
  char etag[128];
  int overflow, nomem, stalled;
  int cut;            /* the server ignored Range and our slice is complete: stopped on purpose */
  int toobig;         /* the body passed max_object_bytes: 1 undeclared, 2 declared */
  double first_start; /* the first attempt's start (the retry budget counts from it) */
  double last_rx;     /* when bytes last arrived (or the attempt started) */
  double stall_s;
  mml_bytes errbody;
  char errbuf[CURL_ERROR_SIZE];
};

struct mml_fetcher {
  char *ak, *sk, *tok, *region, *endpoint; /* owned copies; endpoint without trailing '/' */
  char *ca_bundle;
  int max_inflight, max_retries;
  double timeout_s, connect_timeout_s, stall_s, backoff_base_s, backoff_max_s;
  int64_t max_object_bytes; /* <= 0: none */
  double min_rate, retry_budget_s;
  int64_t range_chunk;
  int list_page_size;

  pthread_t io;
  int io_started;
  pthread_mutex_t mu; /* guards: q_head, q_tail, stop */
  job *q_head, *q_tail;
  int stop;
  CURLM *multi;

  /* I/O thread only */
  xfer *ready_head, *ready_tail, *delayed;
  xfer *all_x;
  job *all_j;
  int inflight;
  uint64_t rng;

  /* io_threads > 1: the fetcher handed out is loop 0 and owns the others; jobs are dealt
   * round-robin (each loop its own thread, multi handle and connection cache). */
  mml_fetcher **loops;
  int nloops;
  unsigned rr; /* atomic */

  /* loop 0 only: in-flight GETs by (url, off, len), guarded by cmu */
  pthread_mutex_t cmu;
  job *twins[1024];

  /* loop 0 only (fetch_whole.c): servers seen ignoring Range, and the objects of those
   * servers kept whole for their ranged reads, guarded by wmu */
  pthread_mutex_t wmu;
  char *norange[64];
  int nnorange;
  struct whole_obj *whole;
  int64_t whole_bytes, whole_cap;
  uint64_t whole_tick;

  pthread_mutex_t smu; /* guards: stats, lat, nlat */
  mml_fetch_stats stats;
  double lat[LAT_RING];
  uint64_t nlat;
};

static inline char *dupstr(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s);
  char *d = malloc(n + 1);
  if (d) memcpy(d, s, n + 1);
  return d;
}

static inline char *dupn(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d) memcpy(d, s, n), d[n] = 0;
  return d;
}

/* curl_global_init and the process-wide DNS/TLS share, once; 0 when they failed. */
int mml_fetch_global_init(void);
/* The I/O thread of one loop (arg: the mml_fetcher). */
void *mml_fetch_io_main(void *arg);
/* Queues a request on one of f's loops.  query: S3 only, an encoded canonical query
 * (listings); head: a HEAD whose body is the object size as one int64; total_out (not
 * NULL): the object's size as the reply declared it, -1 when it did not, stored before the
 * callback runs (such a request is never coalesced). */
mml_status mml_fetch_submit_query(mml_fetcher *f, const char *url, const char *query, int64_t off,
                                  int64_t len, int head, mml_fetch_cb cb, void *ctx,
                                  int64_t *total_out, mml_err *err);

/* ---- fetch_job.c: jobs, xfers, coalescing, completion, curl callbacks (I/O thread) ---- */
void fl_job_free(job *j);
mml_status fl_job_new(mml_fetcher *f, const char *url, const char *query, int64_t off, int64_t len,
                      int head, mml_fetch_cb cb, void *ctx, job **out, mml_err *err);
void fl_link_j(mml_fetcher *f, job *j);
void fl_ready_push_back(mml_fetcher *f, xfer *x);
void fl_ready_push_front(mml_fetcher *f, xfer *x);
xfer *fl_xfer_new(mml_fetcher *f, job *j, int64_t off, int64_t len, int probe, int64_t dst);
void fl_xfer_release_easy(mml_fetcher *f, xfer *x);
int fl_twin_attach(mml_fetcher *top, job *j);
fetch_waiter *fl_twin_detach(job *j);
void fl_notify_waiters(fetch_waiter *w, const job *j, mml_status st, const mml_bytes *body);
void fl_job_finish(mml_fetcher *f, job *j);
void fl_part_done(mml_fetcher *f, xfer *x);
void fl_part_fail(mml_fetcher *f, xfer *x, mml_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
size_t fl_on_header(char *p, size_t sz, size_t n, void *ud);
int fl_on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un);
size_t fl_on_body(char *p, size_t sz, size_t n, void *ud);
/* The most body bytes job j may receive. */
static inline int64_t fl_job_limit(const job *j) {
  return j->limit ? j->limit : j->top->max_object_bytes;
}

/* ---- fetch_whole.c: servers that ignore Range (any I/O thread; the state under wmu) ---- */
/* Notes that j's server answered a ranged GET with the whole object. */
void fw_mark_norange(job *j);
/* A ranged GET of a server known to ignore Range is served from the object kept whole
 * (fetched once): 1 when fw_route took j (answered, or waiting for the object); *start
 * is then the internal whole-object GET to plan, or NULL. */
int fw_route(mml_fetcher *f, job *j, job **start);
/* Frees the kept objects and the server list (loop 0, after its thread stopped). */
void fw_free(mml_fetcher *top);

#endif
