/*
 * fetch.c — HTTP(S) and S3 GETs over libcurl's multi interface.
 *
 * Threads.  Each fetcher owns one I/O thread, and that thread alone touches the CURLM
 * handle, the easy handles and every job/xfer after it left the submit queue.  Other
 * threads only (a) append jobs to the submit queue under `mu` and wake the thread with
 * curl_multi_wakeup, (b) read stats under `smu`, (c) set `stop`.  Completion callbacks
 * run on the I/O thread.  Lock order: mu and smu are never held together.  With
 * io_threads > 1 the fetcher is several such loops (each its own thread, multi handle and
 * connection cache, max_inflight split exactly between them); jobs are dealt round-robin.
 * A blocking call (mml_fetch_get/size/list) from a completion callback is refused.
 *
 * Objects.  A job is one submitted request; it is carried out by one or more xfers (HTTP
 * transfers).  A GET of a whole object starts with one "probe" xfer asking for the first
 * range_chunk bytes; when the 206 reply's Content-Range shows a larger object, the rest is
 * fetched as parallel range xfers that write straight into their slice of the job's
 * body.  An explicit range longer than range_chunk is split up front.  A job completes
 * when its last xfer finishes; its callback gets the body or the first permanent error.
 *
 * Flow control.  At most max_inflight xfers are inside the multi handle; the rest wait
 * in `ready` (FIFO).  A transient failure (5xx, 429, timeout/stall, reset, short body)
 * puts the xfer on `delayed` with capped exponential backoff and jitter (at least what
 * Retry-After asks) and restarts it from its first byte on a fresh connection, so a
 * retried body is exactly a clean one.  Range parts after the probe carry If-Match with
 * the probe's ETag, so an object replaced mid-fetch fails instead of mixing versions.
 * Stalls are detected from the time since the last byte (progress callback).  Connections stay alive in the multi handle's own
 * cache (never shared across threads); DNS and TLS sessions are shared process-wide
 * through one CURLSH with locks.
 *
 * Secrets.  Credentials are copied into the fetcher and used only to sign; messages name
 * URLs with user-info and credential-like query values redacted.
 */
#include "mml/fetch.h"

#include <curl/curl.h>
#include <fnmatch.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "mml/sigv4.h"

#define LAT_RING 8192
#define ERRBODY_MAX 8192
#define LIST_MAX_PAGES 100000

/* ---- process-wide libcurl state: global init and the DNS/TLS share --------------- */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static CURLSH *g_share;
static int g_init_ok;
static pthread_mutex_t g_share_mu[CURL_LOCK_DATA_LAST];

static void share_lock(CURL *h, curl_lock_data d, curl_lock_access a, void *u) {
  (void)h, (void)a, (void)u;
  pthread_mutex_lock(&g_share_mu[d]);
}
static void share_unlock(CURL *h, curl_lock_data d, void *u) {
  (void)h, (void)u;
  pthread_mutex_unlock(&g_share_mu[d]);
}

static void global_init(void) {
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return;
  for (int i = 0; i < CURL_LOCK_DATA_LAST; i++) pthread_mutex_init(&g_share_mu[i], NULL);
  g_share = curl_share_init();
  if (g_share) {
    curl_share_setopt(g_share, CURLSHOPT_LOCKFUNC, share_lock);
    curl_share_setopt(g_share, CURLSHOPT_UNLOCKFUNC, share_unlock);
    curl_share_setopt(g_share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    curl_share_setopt(g_share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
  }
  g_init_ok = 1;
}

int mml_path_is_remote(const char *p) {
  return p && (!strncmp(p, "http://", 7) || !strncmp(p, "https://", 8) || !strncmp(p, "s3://", 5));
}

/* ---- types ------------------------------------------------------------------------ */

typedef struct job job;
typedef struct xfer xfer;

enum { RETRY_5XX, RETRY_429, RETRY_TIMEOUT, RETRY_RESET, RETRY_SHORT };

struct job {
  job *next;            /* submit queue */
  job *prev_all, *next_all;
  char *url;            /* as submitted */
  char *shown;          /* redacted, for messages */
  char *http_url;       /* what curl fetches (S3: endpoint + encoded path + query) */
  char *host;           /* S3: Host header value (signed) */
  char *canon_uri;      /* S3: canonical URI */
  char *canon_query;    /* S3: canonical query ("" if none); listings only */
  int is_s3, head;
  int64_t off, len;     /* requested range (len < 0: to the end) */
  mml_fetch_cb cb;
  void *ctx;
  mml_bytes body;
  int64_t total;        /* object size once known, else -1 */
  int parts_left;
  int failed;
  mml_status fst;
  mml_err ferr;
  int retries;          /* over all parts, for messages */
  char etag[128];       /* from the probe: later range parts send If-Match with it */
};

struct xfer {
  xfer *next;           /* ready / delayed list */
  xfer *prev_all, *next_all;
  job *j;
  CURL *easy;
  struct curl_slist *hdrs;
  int64_t off, len;     /* absolute range asked for; len < 0: open (probe), 0: none (whole) */
  int probe;            /* appends into j->body; may spawn more parts */
  int64_t dst;          /* fixed mode: offset into j->body */
  int64_t got;          /* body bytes accepted this attempt */
  int64_t skip;         /* server ignored Range: bytes still to drop */
  int attempt;
  double due;
  long http;
  double retry_after;   /* seconds, < 0 when absent */
  int64_t cr_start, cr_end, cr_total; /* Content-Range, -1 when absent */
  int64_t clen;         /* Content-Length, -1 when absent */
  char etag[128];
  int overflow, nomem, stalled;
  double last_rx;       /* when bytes last arrived (or the attempt started) */
  double stall_s;
  mml_bytes errbody;
  char errbuf[CURL_ERROR_SIZE];
};

struct mml_fetcher {
  char *ak, *sk, *tok, *region, *endpoint; /* owned copies; endpoint without trailing '/' */
  char *ca_bundle;
  int max_inflight, max_retries;
  double timeout_s, connect_timeout_s, stall_s, backoff_base_s, backoff_max_s;
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
  CURL *pool[64];
  int npool;
  uint64_t rng;

  /* io_threads > 1: the fetcher handed out is loop 0 and owns the others; jobs are dealt
   * round-robin (each loop its own thread, multi handle and connection cache). */
  mml_fetcher **loops;
  int nloops;
  unsigned rr; /* atomic */

  pthread_mutex_t smu; /* guards: stats, lat, nlat */
  mml_fetch_stats stats;
  double lat[LAT_RING];
  uint64_t nlat;
};

/* ---- small helpers ------------------------------------------------------------------ */

static char *dupstr(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s);
  char *d = malloc(n + 1);
  if (d) memcpy(d, s, n + 1);
  return d;
}

static char *dupn(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d) memcpy(d, s, n), d[n] = 0;
  return d;
}

static const char *pick(const char *cfg, const char *env1, const char *env2) {
  if (cfg && *cfg) return cfg;
  const char *e = env1 ? getenv(env1) : NULL;
  if (e && *e) return e;
  e = env2 ? getenv(env2) : NULL;
  return e && *e ? e : NULL;
}

static int name_is_secret(const char *p, size_t n) {
  static const char *const words[] = {"signature", "credential", "token", "key", "secret",
                                      "password", "auth"};
  for (size_t w = 0; w < sizeof words / sizeof *words; w++) {
    size_t wl = strlen(words[w]);
    for (size_t i = 0; i + wl <= n; i++)
      if (!strncasecmp(p + i, words[w], wl)) return 1;
  }
  return 0;
}

/* URL safe to show: user-info dropped, credential-like query values replaced. */
char *mml_url_redact(const char *url) {
  mml_bytes b = {0};
  const char *s = strstr(url, "://");
  const char *rest = url;
  if (s) {
    s += 3;
    const char *slash = s + strcspn(s, "/?#");
    const char *at = memchr(s, '@', (size_t)(slash - s));
    mml_bytes_append(&b, url, (size_t)(s - url));
    rest = at ? at + 1 : s;
  }
  const char *q = strchr(rest, '?');
  if (!q) {
    mml_bytes_append(&b, rest, strlen(rest));
  } else {
    mml_bytes_append(&b, rest, (size_t)(q - rest) + 1);
    const char *p = q + 1;
    while (*p) {
      size_t n = strcspn(p, "&#");
      const char *eq = memchr(p, '=', n);
      if (eq && name_is_secret(p, (size_t)(eq - p))) {
        mml_bytes_append(&b, p, (size_t)(eq - p) + 1);
        mml_bytes_append(&b, "REDACTED", 8);
      } else {
        mml_bytes_append(&b, p, n);
      }
      p += n;
      if (*p == '&') mml_bytes_append(&b, "&", 1), p++;
      else if (*p == '#') break;
    }
  }
  mml_bytes_append(&b, "", 1);
  return (char *)b.data; /* NULL on allocation failure */
}

static double rand01(mml_fetcher *f) {
  uint64_t x = f->rng;
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  f->rng = x;
  return (double)(x >> 11) / 9007199254740992.0;
}

double mml_fetch_backoff(double base_s, double max_s, int attempt, double retry_after, double u01) {
  double d = base_s * pow(2.0, attempt < 1 ? 0 : attempt > 30 ? 29 : attempt - 1);
  if (d > max_s) d = max_s;
  d = d * 0.5 + d * 0.5 * u01;
  if (retry_after > 60) retry_after = 60;
  return retry_after > d ? retry_after : d;
}

/* ---- S3 addressing ------------------------------------------------------------------ */

static int bucket_ok(const char *b, size_t n) {
  if (n == 0 || n > 255) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = b[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '-' || c == '_'))
      return 0;
  }
  return 1;
}

/* Splits "s3://bucket/key" into bucket (pointer+length) and key. */
static mml_status s3_split(const char *url, const char **bucket, size_t *blen, const char **key,
                           const char *shown, mml_err *err) {
  if (strncmp(url, "s3://", 5)) return mml_err_set(err, MML_EINVAL, "%s: not an s3:// URL", shown);
  const char *b = url + 5, *sl = strchr(b, '/');
  size_t n = sl ? (size_t)(sl - b) : strlen(b);
  if (!bucket_ok(b, n)) return mml_err_set(err, MML_EINVAL, "%s: bad bucket name", shown);
  *bucket = b, *blen = n, *key = sl ? sl + 1 : "";
  return MML_OK;
}

/* Request line parts for bucket/key (+ encoded query) under this endpoint/region. */
static mml_status s3_address_parts(const char *region, const char *endpoint, const char *bucket,
                                   size_t blen, const char *key, const char *query,
                                   mml_s3_addr *out, mml_err *err) {
  mml_bytes path = {0}, url = {0};
  char host[512];
  int path_style = endpoint != NULL || memchr(bucket, '.', blen) != NULL;
  memset(out, 0, sizeof *out);
  if (endpoint) {
    const char *h = strstr(endpoint, "://");
    h = h ? h + 3 : endpoint;
    size_t hl = strcspn(h, "/");
    if (hl == 0 || hl >= sizeof host) return mml_err_set(err, MML_ECONFIG, "S3 endpoint has no host");
    memcpy(host, h, hl), host[hl] = 0;
  } else if (path_style) { /* dotted bucket names break the TLS wildcard certificate */
    snprintf(host, sizeof host, "s3.%s.amazonaws.com", region);
  } else {
    snprintf(host, sizeof host, "%.*s.s3.%s.amazonaws.com", (int)blen, bucket, region);
  }
  mml_status st = MML_OK;
  st |= mml_bytes_append(&path, "/", 1);
  if (path_style) {
    st |= mml_uri_encode(bucket, blen, 0, &path);
    if (*key || !query) st |= mml_bytes_append(&path, "/", 1);
  }
  st |= mml_uri_encode(key, strlen(key), 1, &path);
  if (st) goto oom;
  if (endpoint) {
    const char *h = strstr(endpoint, "://");
    if (h) st |= mml_bytes_append(&url, endpoint, (size_t)(h - endpoint) + 3);
    else st |= mml_bytes_append(&url, "https://", 8);
  } else {
    st |= mml_bytes_append(&url, "https://", 8);
  }
  st |= mml_bytes_append(&url, host, strlen(host));
  st |= mml_bytes_append(&url, path.data, path.len);
  if (query && *query) {
    st |= mml_bytes_append(&url, "?", 1);
    st |= mml_bytes_append(&url, query, strlen(query));
  }
  st |= mml_bytes_append(&url, "", 1);
  if (st) goto oom;
  out->http_url = (char *)url.data;
  out->canonical_uri = (char *)path.data;
  out->host = dupstr(host);
  if (!out->host) {
    mml_s3_addr_free(out);
    return mml_err_set(err, MML_ENOMEM, "out of memory");
  }
  return MML_OK;
oom:
  mml_bytes_free(&path), mml_bytes_free(&url);
  return mml_err_set(err, MML_ENOMEM, "out of memory");
}

void mml_s3_addr_free(mml_s3_addr *a) {
  if (!a) return;
  free(a->http_url), free(a->host), free(a->canonical_uri);
  memset(a, 0, sizeof *a);
}

mml_status mml_s3_address(const char *s3url, const char *query, const char *region,
                          const char *endpoint, mml_s3_addr *out, mml_err *err) {
  const char *b, *k;
  size_t bl;
  if (!s3url || !out) return mml_err_set(err, MML_EINVAL, "s3 address: NULL argument");
  mml_status st = s3_split(s3url, &b, &bl, &k, s3url, err);
  if (st) return st;
  return s3_address_parts(region && *region ? region : "us-east-1", endpoint && *endpoint ? endpoint : NULL,
                          b, bl, k, query, out, err);
}

/* ---- jobs and xfers ----------------------------------------------------------------- */

static void job_free(job *j) {
  if (!j) return;
  free(j->url), free(j->shown), free(j->http_url), free(j->host), free(j->canon_uri);
  free(j->canon_query);
  mml_bytes_free(&j->body);
  free(j);
}

static mml_status job_new(mml_fetcher *f, const char *url, const char *query, int64_t off,
                          int64_t len, int head, mml_fetch_cb cb, void *ctx, job **out,
                          mml_err *err) {
  if (!url || !cb) return mml_err_set(err, MML_EINVAL, "fetch: NULL url or callback");
  if (off < 0) return mml_err_set(err, MML_EINVAL, "fetch: negative offset");
  job *j = calloc(1, sizeof *j);
  if (!j) return mml_err_set(err, MML_ENOMEM, "out of memory");
  j->url = dupstr(url);
  j->shown = mml_url_redact(url);
  if (!j->url || !j->shown) {
    job_free(j);
    return mml_err_set(err, MML_ENOMEM, "out of memory");
  }
  j->off = off, j->len = len, j->head = head, j->cb = cb, j->ctx = ctx, j->total = -1;
  mml_status st = MML_OK;
  if (!strncmp(url, "s3://", 5)) {
    const char *b, *k;
    size_t bl;
    j->is_s3 = 1;
    mml_s3_addr a;
    st = s3_split(url, &b, &bl, &k, j->shown, err);
    if (!st) st = s3_address_parts(f->region, f->endpoint, b, bl, k, query, &a, err);
    if (!st) {
      j->http_url = a.http_url, j->host = a.host, j->canon_uri = a.canonical_uri;
      if (!(j->canon_query = dupstr(query ? query : ""))) st = mml_err_set(err, MML_ENOMEM, "out of memory");
    }
  } else if (!strncmp(url, "http://", 7) || !strncmp(url, "https://", 8)) {
    j->http_url = dupstr(url);
    if (!j->http_url) st = mml_err_set(err, MML_ENOMEM, "out of memory");
  } else {
    st = mml_err_set(err, MML_EINVAL, "%s: not a remote URL (http://, https://, s3://)", j->shown);
  }
  if (st) {
    job_free(j);
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
  if (x->prev_all) x->prev_all->next_all = x->next_all;
  else f->all_x = x->next_all;
  if (x->next_all) x->next_all->prev_all = x->prev_all;
}
static void link_j(mml_fetcher *f, job *j) {
  j->next_all = f->all_j, j->prev_all = NULL;
  if (f->all_j) f->all_j->prev_all = j;
  f->all_j = j;
}
static void unlink_j(mml_fetcher *f, job *j) {
  if (j->prev_all) j->prev_all->next_all = j->next_all;
  else f->all_j = j->next_all;
  if (j->next_all) j->next_all->prev_all = j->prev_all;
}

static void ready_push_back(mml_fetcher *f, xfer *x) {
  x->next = NULL;
  if (f->ready_tail) f->ready_tail->next = x;
  else f->ready_head = x;
  f->ready_tail = x;
}
static void ready_push_front(mml_fetcher *f, xfer *x) {
  x->next = f->ready_head;
  f->ready_head = x;
  if (!f->ready_tail) f->ready_tail = x;
}

static xfer *xfer_new(mml_fetcher *f, job *j, int64_t off, int64_t len, int probe, int64_t dst) {
  xfer *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  x->j = j, x->off = off, x->len = len, x->probe = probe, x->dst = dst;
  j->parts_left++;
  link_x(f, x);
  return x;
}

static void xfer_release_easy(mml_fetcher *f, xfer *x) {
  if (x->easy) {
    curl_multi_remove_handle(f->multi, x->easy);
    f->inflight--;
    pthread_mutex_lock(&f->smu);
    f->stats.inflight = f->inflight; /* before any completion callback can run */
    pthread_mutex_unlock(&f->smu);
    if (f->npool < (int)(sizeof f->pool / sizeof *f->pool)) {
      curl_easy_reset(x->easy);
      f->pool[f->npool++] = x->easy;
    } else {
      curl_easy_cleanup(x->easy);
    }
    x->easy = NULL;
  }
  curl_slist_free_all(x->hdrs);
  x->hdrs = NULL;
}

static void xfer_free(mml_fetcher *f, xfer *x) {
  xfer_release_easy(f, x);
  unlink_x(f, x);
  mml_bytes_free(&x->errbody);
  free(x);
}

static void job_finish(mml_fetcher *f, job *j) {
  unlink_j(f, j);
  if (j->failed) {
    pthread_mutex_lock(&f->smu);
    f->stats.failures++;
    pthread_mutex_unlock(&f->smu);
    j->cb(j->ctx, j->fst, NULL, &j->ferr);
  } else {
    if (j->len >= 0 && !j->head) {
      int64_t want = j->len;
      if (j->total >= 0 && j->total - j->off < want) want = j->total - j->off > 0 ? j->total - j->off : 0;
      if ((int64_t)j->body.len > want) j->body.len = (size_t)want;
    }
    if (j->head) { /* HEAD reports the size as one int64 */
      mml_bytes_clear(&j->body);
      if (mml_bytes_append(&j->body, &j->total, sizeof j->total)) {
        j->failed = 1, j->fst = MML_ENOMEM;
        mml_err_set(&j->ferr, MML_ENOMEM, "HEAD %s: out of memory", j->shown);
        j->cb(j->ctx, j->fst, NULL, &j->ferr);
        job_free(j);
        return;
      }
    }
    mml_bytes body = j->body;
    memset(&j->body, 0, sizeof j->body);
    j->cb(j->ctx, MML_OK, &body, NULL);
  }
  job_free(j);
}

/* The part is over (success or permanent failure). */
static void part_done(mml_fetcher *f, xfer *x) {
  job *j = x->j;
  xfer_free(f, x);
  if (--j->parts_left == 0) job_finish(f, j);
}

static void part_fail(mml_fetcher *f, xfer *x, mml_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void part_fail(mml_fetcher *f, xfer *x, mml_status st, const char *fmt, ...) {
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
      snprintf(range, sizeof range, " (bytes %lld-%s)", (long long)x->off,
               x->len > 0 ? "" : "end");
    if (x->len > 0)
      snprintf(range, sizeof range, " (bytes %lld-%lld)", (long long)x->off,
               (long long)(x->off + x->len - 1));
    char tail[48] = "";
    if (j->retries) snprintf(tail, sizeof tail, " [after %d retries]", j->retries);
    mml_err_set(&j->ferr, st, "%s %s%s: %s%s", j->head ? "HEAD" : "GET", j->shown, range, why, tail);
  }
  part_done(f, x);
}

/* ---- curl callbacks (I/O thread) ------------------------------------------------------ */

static size_t on_header(char *p, size_t sz, size_t n, void *ud) {
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
    if (sscanf(v, "bytes %lld-%lld/%lld", &a, &b, &t) == 3) x->cr_start = a, x->cr_end = b, x->cr_total = t;
    else if (sscanf(v, "bytes */%lld", &t) == 1) x->cr_total = t;
  } else if (!strncasecmp(line, "etag:", 5)) {
    const char *v = line + 5;
    while (*v == ' ') v++;
    size_t vl = strcspn(v, "\r\n");
    if (vl < sizeof x->etag) memcpy(x->etag, v, vl), x->etag[vl] = 0;
  } else if (!strncasecmp(line, "content-length:", 15)) {
    x->clen = strtoll(line + 15, NULL, 10);
  }
  return len;
}

/* Stall detection: libcurl's LOW_SPEED_* averages over a window of seconds, so a
 * transfer that stops after a burst of bytes is noticed late; this checks the time since
 * the last byte instead (libcurl calls it at least once a second). */
static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
  (void)dt, (void)dn, (void)ut, (void)un;
  xfer *x = ud;
  if (mml_now() - x->last_rx > x->stall_s) {
    x->stalled = 1;
    return 1;
  }
  return 0;
}

static size_t on_body(char *p, size_t sz, size_t n, void *ud) {
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
    /* The server ignored Range: drop the bytes before our slice. */
    x->skip = x->off + 1; /* +1 marks "initialised"; removed below */
  }
  const char *q = p;
  size_t left = len;
  if (x->skip > 1) {
    size_t drop = (uint64_t)(x->skip - 1) < left ? (size_t)(x->skip - 1) : left;
    q += drop, left -= drop, x->skip -= (int64_t)drop;
  }
  if (!left) return len;
  if (x->probe) {
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
  return len;
}

/* ---- starting a transfer ---------------------------------------------------------------- */

static mml_status add_header(struct curl_slist **l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static mml_status add_header(struct curl_slist **l, const char *fmt, ...) {
  char line[4096];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof line) return MML_EINVAL;
  struct curl_slist *t = curl_slist_append(*l, line);
  if (!t) return MML_ENOMEM;
  *l = t;
  return MML_OK;
}

static mml_status sign_s3(mml_fetcher *f, xfer *x, mml_err *err) {
  job *j = x->j;
  mml_status st = MML_OK;
  st |= add_header(&x->hdrs, "Host: %s", j->host);
  st |= add_header(&x->hdrs, "x-amz-content-sha256: %s", MML_SHA256_EMPTY);
  if (!f->ak) return st ? mml_err_set(err, MML_ENOMEM, "out of memory") : MML_OK; /* anonymous */
  char date[20];
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(date, sizeof date, "%Y%m%dT%H%M%SZ", &tm);
  st |= add_header(&x->hdrs, "x-amz-date: %s", date);
  mml_sigv4_header hs[4] = {{"host", j->host},
                            {"x-amz-content-sha256", MML_SHA256_EMPTY},
                            {"x-amz-date", date},
                            {"x-amz-security-token", f->tok}};
  size_t nh = 3;
  if (f->tok) {
    nh = 4;
    st |= add_header(&x->hdrs, "x-amz-security-token: %s", f->tok);
  }
  if (st) return mml_err_set(err, MML_ENOMEM, "out of memory");
  mml_sigv4_req r = {j->head ? "HEAD" : "GET", j->canon_uri, j->canon_query, hs, nh,
                     MML_SHA256_EMPTY, date, f->region, "s3", f->ak, f->sk};
  char auth[1024];
  st = mml_sigv4_authorization(&r, auth, sizeof auth, err);
  if (st) return st;
  if (add_header(&x->hdrs, "Authorization: %s", auth)) return mml_err_set(err, MML_ENOMEM, "out of memory");
  return MML_OK;
}

static mml_status xfer_start(mml_fetcher *f, xfer *x, mml_err *err) {
  job *j = x->j;
  CURL *e = f->npool ? f->pool[--f->npool] : curl_easy_init();
  if (!e) return mml_err_set(err, MML_ENOMEM, "curl_easy_init failed");
  x->got = 0, x->skip = 0, x->http = 0, x->overflow = 0, x->nomem = 0, x->retry_after = -1;
  x->stalled = 0, x->last_rx = mml_now(), x->stall_s = f->stall_s;
  x->cr_start = x->cr_end = x->cr_total = -1, x->clen = -1, x->errbuf[0] = 0, x->etag[0] = 0;
  mml_bytes_clear(&x->errbody);
  if (x->probe) mml_bytes_clear(&j->body);
  curl_slist_free_all(x->hdrs);
  x->hdrs = NULL;
  mml_status st = MML_OK;
  if (x->len != 0 || x->off != 0) {
    if (x->len > 0)
      st = add_header(&x->hdrs, "Range: bytes=%lld-%lld", (long long)x->off, (long long)(x->off + x->len - 1));
    else
      st = add_header(&x->hdrs, "Range: bytes=%lld-%lld", (long long)x->off,
                      (long long)(x->off + f->range_chunk - 1));
  }
  if (!st && !x->probe && j->etag[0]) st = add_header(&x->hdrs, "If-Match: %s", j->etag);
  if (st) {
    curl_easy_cleanup(e);
    return mml_err_set(err, MML_ENOMEM, "out of memory");
  }
  if (j->is_s3 && (st = sign_s3(f, x, err))) {
    curl_easy_cleanup(e);
    return st;
  }
  curl_easy_setopt(e, CURLOPT_URL, j->http_url);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_PRIVATE, x);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, x->errbuf);
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, x);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, x->hdrs);
  curl_easy_setopt(e, CURLOPT_USERAGENT, "mmloader/0.1");
  curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(f->timeout_s * 1000));
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(f->connect_timeout_s * 1000));
  curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L); /* backstop; on_progress is sharper */
  curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)ceil(f->stall_s < 1 ? 1 : f->stall_s));
  curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(e, CURLOPT_XFERINFODATA, x);
  curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
  if (g_share) curl_easy_setopt(e, CURLOPT_SHARE, g_share);
  if (f->ca_bundle) curl_easy_setopt(e, CURLOPT_CAINFO, f->ca_bundle);
  if (!j->is_s3) {
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(e, CURLOPT_MAXREDIRS, 5L);
  }
  if (j->head) curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
  if (x->attempt > 0) curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, 1L);
  if (curl_multi_add_handle(f->multi, e) != CURLM_OK) {
    curl_easy_cleanup(e);
    return mml_err_set(err, MML_EINTERNAL, "curl_multi_add_handle failed");
  }
  x->easy = e;
  f->inflight++;
  pthread_mutex_lock(&f->smu);
  f->stats.requests++;
  f->stats.inflight = f->inflight;
  pthread_mutex_unlock(&f->smu);
  return MML_OK;
}

/* ---- finishing a transfer ------------------------------------------------------------ */

/* Extracts <tag>text</tag> from an XML document (first match), entity-decoded. */

static void retry_or_fail(mml_fetcher *f, xfer *x, int cause, mml_status st, const char *why) {
  job *j = x->j;
  double ra = x->retry_after;
  xfer_release_easy(f, x);
  if (x->attempt < f->max_retries && !j->failed) {
    x->attempt++;
    j->retries++;
    pthread_mutex_lock(&f->smu);
    uint64_t *c[] = {&f->stats.retries_5xx, &f->stats.retries_429, &f->stats.retries_timeout,
                     &f->stats.retries_reset, &f->stats.retries_short};
    (*c[cause])++;
    f->stats.inflight = f->inflight;
    pthread_mutex_unlock(&f->smu);
    x->due = mml_now() + mml_fetch_backoff(f->backoff_base_s, f->backoff_max_s, x->attempt, ra, rand01(f));
    x->next = f->delayed;
    f->delayed = x;
    return;
  }
  part_fail(f, x, st, "%s", why);
}

static void record_latency(mml_fetcher *f, CURL *e, int64_t got) {
  curl_off_t us = 0;
  curl_easy_getinfo(e, CURLINFO_STARTTRANSFER_TIME_T, &us);
  pthread_mutex_lock(&f->smu);
  if (us > 0) f->lat[f->nlat++ % LAT_RING] = (double)us / 1e6;
  f->stats.bytes += (uint64_t)got;
  pthread_mutex_unlock(&f->smu);
}

static void spawn_rest(mml_fetcher *f, xfer *probe) {
  job *j = probe->j;
  int64_t end = j->total; /* exclusive, absolute */
  int64_t start = probe->off + probe->got;
  if (end <= start) return;
  if (mml_bytes_reserve(&j->body, (size_t)(end - j->off))) {
    j->failed = 1, j->fst = MML_ENOMEM;
    mml_err_set(&j->ferr, MML_ENOMEM, "GET %s: out of memory", j->shown);
    return;
  }
  j->body.len = (size_t)(end - j->off);
  for (int64_t o = start; o < end; o += f->range_chunk) {
    int64_t n = end - o < f->range_chunk ? end - o : f->range_chunk;
    xfer *x = xfer_new(f, j, o, n, 0, o - j->off);
    if (!x) { /* fail the job through a bookkeeping-only path */
      j->failed = 1, j->fst = MML_ENOMEM;
      mml_err_set(&j->ferr, MML_ENOMEM, "GET %s: out of memory", j->shown);
      return;
    }
    ready_push_back(f, x);
  }
}

static void xfer_done(mml_fetcher *f, xfer *x, CURLcode rc) {
  job *j = x->j;
  CURL *e = x->easy;
  long http = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &http);
  if (!x->http) x->http = http;
  char why[512];
  if (x->nomem) {
    xfer_release_easy(f, x);
    part_fail(f, x, MML_ENOMEM, "out of memory");
    return;
  }
  if (rc != CURLE_OK) {
    const char *msg = x->errbuf[0] ? x->errbuf : curl_easy_strerror(rc);
    snprintf(why, sizeof why, "%s (curl %d)", msg, (int)rc);
    if (x->overflow) {
      xfer_release_easy(f, x);
      part_fail(f, x, MML_EFETCH, "server sent more bytes than requested");
      return;
    }
    if (x->stalled) {
      snprintf(why, sizeof why, "transfer stalled for %.1f s", f->stall_s);
      retry_or_fail(f, x, RETRY_TIMEOUT, MML_EFETCH, why);
      return;
    }
    switch (rc) {
      case CURLE_OPERATION_TIMEDOUT:
        retry_or_fail(f, x, RETRY_TIMEOUT, MML_EFETCH, why);
        return;
      case CURLE_PARTIAL_FILE:
        retry_or_fail(f, x, RETRY_SHORT, MML_EFETCH, why);
        return;
      case CURLE_RECV_ERROR:
        if (x->got > 0 && x->clen > x->got) { /* cut off inside the body: a short body */
          retry_or_fail(f, x, RETRY_SHORT, MML_EFETCH, why);
          return;
        }
        /* fall through */
      case CURLE_SEND_ERROR:
      case CURLE_GOT_NOTHING:
      case CURLE_COULDNT_CONNECT:
      case CURLE_HTTP2:
      case CURLE_HTTP2_STREAM:
      case CURLE_SSL_CONNECT_ERROR:
      case CURLE_WEIRD_SERVER_REPLY:
        retry_or_fail(f, x, RETRY_RESET, MML_EFETCH, why);
        return;
      default:
        xfer_release_easy(f, x);
        part_fail(f, x, MML_EFETCH, "%s", why);
        return;
    }
  }
  record_latency(f, e, x->http >= 200 && x->http < 300 ? x->got : 0);
  long s = x->http;
  if (s >= 200 && s < 300) {
    int64_t expect = -1;
    if (s == 206 && x->cr_start >= 0) expect = x->cr_end - x->cr_start + 1;
    else if (x->clen >= 0 && !x->skip && !j->head) expect = x->clen;
    if (s == 206 && x->cr_start >= 0 && x->cr_start != x->off) {
      xfer_release_easy(f, x);
      part_fail(f, x, MML_EFETCH, "HTTP 206 for the wrong range (starts at %lld)", (long long)x->cr_start);
      return;
    }
    if (expect >= 0 && x->got < expect && !j->head) {
      snprintf(why, sizeof why, "short body: %lld of %lld bytes", (long long)x->got, (long long)expect);
      retry_or_fail(f, x, RETRY_SHORT, MML_EFETCH, why);
      return;
    }
    if (j->head) {
      curl_off_t cl = -1;
      curl_easy_getinfo(e, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
      j->total = cl;
    } else if (x->cr_total >= 0) {
      j->total = x->cr_total;
    } else if (s == 200 && !x->skip) {
      j->total = j->off + x->got; /* the whole object came back */
    } else if (s == 200 && !x->probe && x->got < x->len) {
      j->total = x->off + x->got; /* Range ignored and the object ended inside our slice */
    }
    if (!x->probe && x->len > 0 && x->got < x->len && j->total >= 0 && x->off + x->got < j->total) {
      snprintf(why, sizeof why, "short body: %lld of %lld bytes", (long long)x->got, (long long)x->len);
      retry_or_fail(f, x, RETRY_SHORT, MML_EFETCH, why);
      return;
    }
    xfer_release_easy(f, x);
    if (x->probe && s == 206 && j->total > x->off + x->got) {
      memcpy(j->etag, x->etag, sizeof j->etag);
      spawn_rest(f, x);
    }
    part_done(f, x);
    return;
  }
  if (s == 416 && !j->head && (x->len != 0 || x->off != 0)) {
    /* Range unsatisfiable: it starts at or past the end of the object (a probe of
     * bytes=0-N gets this for an empty object).  Nothing there, not an error. */
    if (x->cr_total >= 0) j->total = x->cr_total;
    else if (j->total < 0 || j->total > x->off) j->total = x->off;
    xfer_release_easy(f, x);
    if (x->probe) mml_bytes_clear(&j->body);
    part_done(f, x);
    return;
  }
  char code[128] = "", msg[256] = "";
  if (x->errbody.len) {
    mml_xml_text((const char *)x->errbody.data, x->errbody.len, "Code", code, sizeof code);
    mml_xml_text((const char *)x->errbody.data, x->errbody.len, "Message", msg, sizeof msg);
  }
  snprintf(why, sizeof why, "HTTP %ld%s%s%s%s", s, code[0] ? " " : "", code, msg[0] ? ": " : "", msg);
  if (s == 429) retry_or_fail(f, x, RETRY_429, MML_EFETCH, why);
  else if (s == 500 || s == 502 || s == 503 || s == 504) retry_or_fail(f, x, RETRY_5XX, MML_EFETCH, why);
  else if (s == 408) retry_or_fail(f, x, RETRY_TIMEOUT, MML_EFETCH, why);
  else if (s == 412 && j->etag[0]) {
    xfer_release_easy(f, x);
    part_fail(f, x, MML_EFETCH, "the object changed while its ranges were fetched (ETag %s)", j->etag);
  }
  else {
    mml_status st = s == 404 ? MML_ENOENT : (s == 401 || s == 403) ? MML_EAUTH : MML_EFETCH;
    xfer_release_easy(f, x);
    part_fail(f, x, st, "%s", why);
  }
}

/* ---- the I/O thread ------------------------------------------------------------------- */

/* Turns a job fresh from the queue into its first xfer(s). */
static void job_plan(mml_fetcher *f, job *j) {
  link_j(f, j);
  if (j->head || (j->canon_query && *j->canon_query)) { /* HEAD, listing: one plain request */
    xfer *x = xfer_new(f, j, 0, 0, 1, 0);
    if (!x) goto oom;
    ready_push_back(f, x);
    return;
  }
  if (j->len < 0) { /* to the end, size unknown: probe the first chunk */
    xfer *x = xfer_new(f, j, j->off, -1, 1, 0);
    if (!x) goto oom;
    ready_push_back(f, x);
    return;
  }
  if (j->len == 0) {
    job_finish(f, j);
    return;
  }
  if (mml_bytes_reserve(&j->body, (size_t)j->len)) goto oom;
  j->body.len = (size_t)j->len;
  for (int64_t o = 0; o < j->len; o += f->range_chunk) {
    int64_t n = j->len - o < f->range_chunk ? j->len - o : f->range_chunk;
    xfer *x = xfer_new(f, j, j->off + o, n, 0, o);
    if (!x) {
      j->failed = 1, j->fst = MML_ENOMEM;
      mml_err_set(&j->ferr, MML_ENOMEM, "GET %s: out of memory", j->shown);
      if (j->parts_left == 0) job_finish(f, j);
      return;
    }
    ready_push_back(f, x);
  }
  return;
oom:
  j->failed = 1, j->fst = MML_ENOMEM;
  mml_err_set(&j->ferr, MML_ENOMEM, "GET %s: out of memory", j->shown);
  if (j->parts_left == 0) job_finish(f, j);
}

static void cancel_all(mml_fetcher *f) {
  while (f->all_x) {
    xfer *x = f->all_x;
    job *j = x->j;
    if (!j->failed) {
      j->failed = 1, j->fst = MML_ECANCELLED;
      mml_err_set(&j->ferr, MML_ECANCELLED, "GET %s: cancelled (fetcher closed)", j->shown);
    }
    part_done(f, x);
  }
  while (f->all_j) { /* jobs without parts (none expected) */
    job *j = f->all_j;
    j->failed = 1, j->fst = MML_ECANCELLED;
    mml_err_set(&j->ferr, MML_ECANCELLED, "GET %s: cancelled (fetcher closed)", j->shown);
    job_finish(f, j);
  }
  f->ready_head = f->ready_tail = f->delayed = NULL;
}

static void *io_main(void *arg) {
  mml_fetcher *f = arg;
  for (;;) {
    pthread_mutex_lock(&f->mu);
    job *q = f->q_head;
    f->q_head = f->q_tail = NULL;
    int stop = f->stop;
    pthread_mutex_unlock(&f->mu);
    if (stop) {
      /* queued jobs were never planned: cancel them too */
      while (q) {
        job *n = q->next;
        link_j(f, q);
        q = n;
      }
      break;
    }
    while (q) {
      job *n = q->next;
      job_plan(f, q);
      q = n;
    }
    double now = mml_now(), next_due = 0;
    for (xfer **pp = &f->delayed; *pp;) {
      xfer *x = *pp;
      if (x->due <= now) {
        *pp = x->next;
        ready_push_front(f, x);
      } else {
        if (!next_due || x->due < next_due) next_due = x->due;
        pp = &x->next;
      }
    }
    while (f->inflight < f->max_inflight && f->ready_head) {
      xfer *x = f->ready_head;
      f->ready_head = x->next;
      if (!f->ready_head) f->ready_tail = NULL;
      mml_err err = {0};
      if (xfer_start(f, x, &err) != MML_OK) part_fail(f, x, err.status, "%s", err.msg);
    }
    int running = 0;
    curl_multi_perform(f->multi, &running);
    CURLMsg *m;
    int left;
    int progressed = 0;
    while ((m = curl_multi_info_read(f->multi, &left))) {
      if (m->msg != CURLMSG_DONE) continue;
      xfer *x = NULL;
      curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
      CURLcode rc = m->data.result;
      if (x) xfer_done(f, x, rc);
      progressed = 1;
    }
    pthread_mutex_lock(&f->smu);
    f->stats.inflight = f->inflight;
    pthread_mutex_unlock(&f->smu);
    if (progressed) continue; /* freed slots or new parts: start them before sleeping */
    long wait_ms = 1000;
    curl_multi_timeout(f->multi, &wait_ms);
    if (wait_ms < 0 || wait_ms > 1000) wait_ms = 1000;
    if (next_due) {
      long d = (long)((next_due - mml_now()) * 1000) + 1;
      if (d < wait_ms) wait_ms = d < 0 ? 0 : d;
    }
    if (f->ready_head && f->inflight < f->max_inflight) wait_ms = 0;
    curl_multi_poll(f->multi, NULL, 0, (int)wait_ms, NULL);
  }
  cancel_all(f);
  return NULL;
}

/* ---- public API ------------------------------------------------------------------------ */

static mml_status loop_new(const mml_fetch_cfg *cfg, int max_inflight, mml_fetcher **out, mml_err *err) {
  mml_fetcher *f = calloc(1, sizeof *f);
  if (!f) return mml_err_set(err, MML_ENOMEM, "out of memory");
  const char *ak = pick(cfg->access_key, "AWS_ACCESS_KEY_ID", NULL);
  const char *sk = pick(cfg->secret_key, "AWS_SECRET_ACCESS_KEY", NULL);
  const char *tok = pick(cfg->session_token, "AWS_SESSION_TOKEN", NULL);
  const char *region = pick(cfg->region, "AWS_REGION", "AWS_DEFAULT_REGION");
  const char *ep = pick(cfg->endpoint, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL");
  const char *ca = pick(cfg->ca_bundle, "AWS_CA_BUNDLE", NULL);
  int bad = 0;
  if (ca) bad |= !(f->ca_bundle = dupstr(ca));
  if (ak && sk) {
    bad |= !(f->ak = dupstr(ak)) || !(f->sk = dupstr(sk));
    if (tok) bad |= !(f->tok = dupstr(tok));
  }
  bad |= !(f->region = dupstr(region ? region : "us-east-1"));
  if (ep) {
    bad |= !(f->endpoint = dupstr(ep));
    if (f->endpoint) {
      size_t n = strlen(f->endpoint);
      while (n && f->endpoint[n - 1] == '/') f->endpoint[--n] = 0;
    }
  }
  f->max_inflight = max_inflight;
  f->max_retries = cfg->max_retries == 0 ? 8 : cfg->max_retries < 0 ? 0 : cfg->max_retries;
  f->timeout_s = cfg->timeout_s ? cfg->timeout_s : 60;
  f->connect_timeout_s = cfg->connect_timeout_s ? cfg->connect_timeout_s : 10;
  f->stall_s = cfg->stall_s ? cfg->stall_s : 10;
  f->backoff_base_s = cfg->backoff_base_s ? cfg->backoff_base_s : 0.05;
  f->backoff_max_s = cfg->backoff_max_s ? cfg->backoff_max_s : 5;
  f->range_chunk = cfg->range_chunk ? cfg->range_chunk : 8 << 20;
  f->list_page_size = cfg->list_page_size > 0 ? cfg->list_page_size : 0;
  f->rng = mml_mix64((uint64_t)(uintptr_t)f ^ (uint64_t)(mml_now() * 1e9)) | 1;
  pthread_mutex_init(&f->mu, NULL);
  pthread_mutex_init(&f->smu, NULL);
  if (bad) {
    mml_fetcher_free(f);
    return mml_err_set(err, MML_ENOMEM, "out of memory");
  }
  f->multi = curl_multi_init();
  if (!f->multi) {
    mml_fetcher_free(f);
    return mml_err_set(err, MML_EINTERNAL, "curl_multi_init failed");
  }
  curl_multi_setopt(f->multi, CURLMOPT_MAXCONNECTS, (long)f->max_inflight);
  if (pthread_create(&f->io, NULL, io_main, f)) {
    mml_fetcher_free(f);
    return mml_err_set(err, MML_EINTERNAL, "cannot start the fetch I/O thread");
  }
  f->io_started = 1;
  *out = f;
  return MML_OK;
}

mml_status mml_fetcher_new(const mml_fetch_cfg *cfg, mml_fetcher **out, mml_err *err) {
  mml_fetch_cfg zero = {0};
  if (!cfg) cfg = &zero;
  *out = NULL;
  pthread_once(&g_once, global_init);
  if (!g_init_ok) return mml_err_set(err, MML_EINTERNAL, "libcurl global initialisation failed");
  if (cfg->max_inflight < 0 || cfg->list_page_size < 0 || cfg->timeout_s < 0 ||
      cfg->connect_timeout_s < 0 || cfg->stall_s < 0 || cfg->backoff_base_s < 0 ||
      cfg->backoff_max_s < 0 || cfg->range_chunk < 0 || cfg->io_threads < 0)
    return mml_err_set(err, MML_ECONFIG, "fetch: negative setting");
  if (cfg->max_inflight > 100000)
    return mml_err_set(err, MML_ECONFIG, "fetch: max_inflight %d is too large", cfg->max_inflight);
  if (cfg->io_threads > 64)
    return mml_err_set(err, MML_ECONFIG, "fetch: io_threads %d is too large (at most 64)", cfg->io_threads);
  int n = cfg->io_threads ? cfg->io_threads : 1;
  int total = cfg->max_inflight ? cfg->max_inflight : 64;
  if (total < n) n = total; /* at least one request in flight per loop */
  /* max_inflight split exactly: the first total % n loops take one more */
  int per = total / n, extra = total % n;
  mml_fetcher *f;
  mml_status st = loop_new(cfg, per + (extra > 0), &f, err);
  if (st || n == 1) {
    *out = st ? NULL : f;
    return st;
  }
  f->loops = calloc((size_t)n, sizeof *f->loops);
  if (!f->loops) {
    mml_fetcher_free(f);
    return mml_err_set(err, MML_ENOMEM, "out of memory");
  }
  f->loops[0] = f;
  f->nloops = 1;
  for (int i = 1; i < n; i++) {
    if ((st = loop_new(cfg, per + (i < extra), &f->loops[i], err))) {
      mml_fetcher_free(f);
      return st;
    }
    f->nloops++;
  }
  *out = f;
  return MML_OK;
}

static void wipe_free(char *s) {
  if (!s) return;
  volatile char *p = s;
  while (*p) *p++ = 0;
  free(s);
}

void mml_fetcher_free(mml_fetcher *f) {
  if (!f) return;
  for (int i = 1; i < f->nloops; i++) mml_fetcher_free(f->loops[i]);
  free(f->loops);
  if (f->io_started) {
    pthread_mutex_lock(&f->mu);
    f->stop = 1;
    pthread_mutex_unlock(&f->mu);
    curl_multi_wakeup(f->multi);
    pthread_join(f->io, NULL);
  }
  for (int i = 0; i < f->npool; i++) curl_easy_cleanup(f->pool[i]);
  if (f->multi) curl_multi_cleanup(f->multi);
  wipe_free(f->ak), wipe_free(f->sk), wipe_free(f->tok);
  free(f->region), free(f->endpoint), free(f->ca_bundle);
  pthread_mutex_destroy(&f->mu);
  pthread_mutex_destroy(&f->smu);
  free(f);
}

static mml_status submit_job(mml_fetcher *f, job *j, mml_err *err) {
  if (f->nloops > 1) f = f->loops[__atomic_fetch_add(&f->rr, 1, __ATOMIC_RELAXED) % (unsigned)f->nloops];
  pthread_mutex_lock(&f->mu);
  if (f->stop) {
    pthread_mutex_unlock(&f->mu);
    job_free(j);
    return mml_err_set(err, MML_ECLOSED, "fetcher is closed");
  }
  j->next = NULL;
  if (f->q_tail) f->q_tail->next = j;
  else f->q_head = j;
  f->q_tail = j;
  pthread_mutex_unlock(&f->mu);
  curl_multi_wakeup(f->multi);
  return MML_OK;
}

static mml_status submit_ex(mml_fetcher *f, const char *url, const char *query, int64_t off,
                            int64_t len, int head, mml_fetch_cb cb, void *ctx, mml_err *err) {
  if (!f) return mml_err_set(err, MML_EINVAL, "fetch: NULL fetcher");
  job *j = NULL;
  mml_status st = job_new(f, url, query, off, len, head, cb, ctx, &j, err);
  if (st) return st;
  return submit_job(f, j, err);
}

mml_status mml_fetch_submit(mml_fetcher *f, const char *url, int64_t off, int64_t len,
                            mml_fetch_cb cb, void *ctx, mml_err *err) {
  return submit_ex(f, url, NULL, off, len, 0, cb, ctx, err);
}

/* ---- blocking helpers ------------------------------------------------------------------ */

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
  if (body) w->body = *body;
  if (err) w->err = *err;
  w->done = 1;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static mml_status get_ex(mml_fetcher *f, const char *url, const char *query, int64_t off,
                         int64_t len, int head, mml_bytes *out, mml_err *err) {
  for (int i = 0; f && i < (f->nloops ? f->nloops : 1); i++) {
    mml_fetcher *l = f->nloops ? f->loops[i] : f;
    if (l->io_started && pthread_equal(pthread_self(), l->io))
      return mml_err_set(err, MML_EINVAL, "fetch: blocking call from a completion callback");
  }
  waiter w = {.st = MML_OK};
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  mml_status st = submit_ex(f, url, query, off, len, head, waiter_cb, &w, err);
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

mml_status mml_fetch_get(mml_fetcher *f, const char *url, int64_t off, int64_t len,
                         mml_bytes *out, mml_err *err) {
  if (!out) return mml_err_set(err, MML_EINVAL, "fetch: NULL output");
  return get_ex(f, url, NULL, off, len, 0, out, err);
}

mml_status mml_fetch_size(mml_fetcher *f, const char *url, int64_t *size, mml_err *err) {
  if (!size) return mml_err_set(err, MML_EINVAL, "fetch: NULL output");
  mml_bytes h = {0};
  mml_status st = get_ex(f, url, NULL, 0, -1, 1, &h, err);
  if (st == MML_OK) {
    int64_t v = -1;
    if (h.len == sizeof v) memcpy(&v, h.data, sizeof v);
    if (v < 0) {
      char *shown = mml_url_redact(url);
      st = mml_err_set(err, MML_EFETCH, "HEAD %s: no Content-Length", shown ? shown : "(url)");
      free(shown);
    }
    else *size = v;
  }
  mml_bytes_free(&h);
  return st;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

void mml_fetch_get_stats(mml_fetcher *f, mml_fetch_stats *out) {
  memset(out, 0, sizeof *out);
  if (!f) return;
  int nl = f->nloops ? f->nloops : 1;
  double *tmp = malloc((size_t)nl * LAT_RING * sizeof *tmp);
  size_t n = 0;
  for (int i = 0; i < nl; i++) {
    mml_fetcher *l = f->nloops ? f->loops[i] : f;
    pthread_mutex_lock(&l->smu);
    mml_fetch_stats s = l->stats;
    size_t m = l->nlat < LAT_RING ? (size_t)l->nlat : LAT_RING;
    if (tmp) memcpy(tmp + n, l->lat, m * sizeof *tmp), n += m;
    pthread_mutex_unlock(&l->smu);
    out->requests += s.requests, out->bytes += s.bytes, out->failures += s.failures;
    out->retries_5xx += s.retries_5xx, out->retries_429 += s.retries_429;
    out->retries_timeout += s.retries_timeout, out->retries_reset += s.retries_reset;
    out->retries_short += s.retries_short, out->inflight += s.inflight;
  }
  if (tmp && n) {
    qsort(tmp, n, sizeof *tmp, cmp_double);
    out->latency_p50_s = tmp[(size_t)((double)(n - 1) * 0.50)];
    out->latency_p90_s = tmp[(size_t)((double)(n - 1) * 0.90)];
    out->latency_p99_s = tmp[(size_t)((double)(n - 1) * 0.99)];
  }
  free(tmp);
}

/* ---- ListObjectsV2 ------------------------------------------------------------------------ */

/* Decodes the five XML entities and numeric references of s[0..n) into out. */
static size_t xml_decode(const char *s, size_t n, char *out, size_t cap) {
  size_t o = 0;
  for (size_t i = 0; i < n && o + 4 < cap;) {
    if (s[i] != '&') {
      out[o++] = s[i++];
      continue;
    }
    const char *semi = memchr(s + i, ';', n - i < 12 ? n - i : 12);
    if (!semi) {
      out[o++] = s[i++];
      continue;
    }
    size_t el = (size_t)(semi - (s + i)) + 1;
    const char *ent = s + i + 1;
    unsigned long cp = 0;
    int ok = 1;
    if (!strncmp(ent, "amp;", 4)) cp = '&';
    else if (!strncmp(ent, "lt;", 3)) cp = '<';
    else if (!strncmp(ent, "gt;", 3)) cp = '>';
    else if (!strncmp(ent, "quot;", 5)) cp = '"';
    else if (!strncmp(ent, "apos;", 5)) cp = '\'';
    else if (ent[0] == '#') cp = ent[1] == 'x' ? strtoul(ent + 2, NULL, 16) : strtoul(ent + 1, NULL, 10);
    else ok = 0;
    if (!ok || cp == 0 || cp > 0x10FFFF) {
      out[o++] = s[i++];
      continue;
    }
    if (cp < 0x80) out[o++] = (char)cp;
    else if (cp < 0x800) out[o++] = (char)(0xC0 | cp >> 6), out[o++] = (char)(0x80 | (cp & 63));
    else if (cp < 0x10000)
      out[o++] = (char)(0xE0 | cp >> 12), out[o++] = (char)(0x80 | ((cp >> 6) & 63)),
      out[o++] = (char)(0x80 | (cp & 63));
    else
      out[o++] = (char)(0xF0 | cp >> 18), out[o++] = (char)(0x80 | ((cp >> 12) & 63)),
      out[o++] = (char)(0x80 | ((cp >> 6) & 63)), out[o++] = (char)(0x80 | (cp & 63));
    i += el;
  }
  out[o] = 0;
  return o;
}

/* Finds the next <tag>...</tag> in doc[0..n) from *pos; returns a pointer to the raw text
 * and its length, advancing *pos past the close tag.  NULL when absent. */
static const char *xml_next(const char *doc, size_t n, size_t *pos, const char *tag, size_t *len) {
  char open[64], close[64];
  int ol = snprintf(open, sizeof open, "<%s>", tag), cl = snprintf(close, sizeof close, "</%s>", tag);
  const char *end = doc + n;
  const char *p = doc + *pos;
  while (p < end) {
    const char *a = memmem(p, (size_t)(end - p), open, (size_t)ol);
    if (!a) return NULL;
    a += ol;
    const char *b = memmem(a, (size_t)(end - a), close, (size_t)cl);
    if (!b) return NULL;
    *pos = (size_t)(b - doc) + (size_t)cl;
    *len = (size_t)(b - a);
    return a;
  }
  return NULL;
}

int mml_xml_text(const char *doc, size_t n, const char *tag, char *out, size_t cap) {
  size_t pos = 0, len;
  const char *t = xml_next(doc, n, &pos, tag, &len);
  if (!t) {
    out[0] = 0;
    return 0;
  }
  xml_decode(t, len, out, cap);
  return 1;
}

void mml_fetch_list_free(char **urls, size_t n) {
  if (!urls) return;
  for (size_t i = 0; i < n; i++) free(urls[i]);
  free(urls);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int has_glob(const char *s) { return strpbrk(s, "*?[") != NULL; }

mml_status mml_fetch_list(mml_fetcher *f, const char *s3_prefix, const char *pattern,
                          char ***urls, size_t *n, mml_err *err) {
  if (!f || !s3_prefix || !urls || !n) return mml_err_set(err, MML_EINVAL, "fetch_list: NULL argument");
  *urls = NULL, *n = 0;
  char *shown = mml_url_redact(s3_prefix);
  if (!shown) return mml_err_set(err, MML_ENOMEM, "out of memory");
  const char *bucket, *key;
  size_t blen;
  mml_status st = s3_split(s3_prefix, &bucket, &blen, &key, shown, err);
  if (st) {
    free(shown);
    return st;
  }
  /* A glob in the prefix itself: list up to its first wildcard, match the whole key. */
  char *pfx = NULL, *pat = NULL;
  size_t dirlen;
  if (!pattern && has_glob(key)) {
    pfx = dupn(key, strcspn(key, "*?["));
    pat = dupstr(key);
    dirlen = 0;
  } else {
    pfx = dupstr(key);
    const char *slash = strrchr(key, '/');
    dirlen = slash ? (size_t)(slash - key) + 1 : 0;
    if (pattern) pat = dupstr(pattern);
  }
  char *burl = malloc(blen + 7);
  char **out = NULL;
  size_t cnt = 0, cap = 0;
  mml_bytes token = {0}, q = {0}, page = {0};
  char *kbuf = malloc(4096);
  if (!pfx || (pattern && !pat) || (!pattern && has_glob(key) && !pat) || !burl || !kbuf) {
    st = mml_err_set(err, MML_ENOMEM, "out of memory");
    goto done;
  }
  snprintf(burl, blen + 7, "s3://%.*s", (int)blen, bucket);
  for (int pageno = 0;; pageno++) {
    if (pageno >= LIST_MAX_PAGES) {
      st = mml_err_set(err, MML_EFETCH, "LIST %s: more than %d pages", shown, LIST_MAX_PAGES);
      goto done;
    }
    /* canonical query: names sorted (continuation-token < list-type < prefix) */
    mml_bytes_clear(&q);
    int bad = 0;
    if (token.len) {
      bad |= mml_bytes_append(&q, "continuation-token=", 19) != MML_OK;
      bad |= mml_uri_encode((const char *)token.data, token.len, 0, &q) != MML_OK;
      bad |= mml_bytes_append(&q, "&", 1) != MML_OK;
    }
    bad |= mml_bytes_append(&q, "list-type=2&", 12) != MML_OK;
    if (f->list_page_size) {
      char mk[32];
      int mkn = snprintf(mk, sizeof mk, "max-keys=%d&", f->list_page_size);
      bad |= mml_bytes_append(&q, mk, (size_t)mkn) != MML_OK;
    }
    bad |= mml_bytes_append(&q, "prefix=", 7) != MML_OK;
    bad |= mml_uri_encode(pfx, strlen(pfx), 0, &q) != MML_OK;
    if (bad) {
      st = mml_err_set(err, MML_ENOMEM, "out of memory");
      goto done;
    }
    st = get_ex(f, burl, (const char *)q.data, 0, -1, 0, &page, err);
    if (st) {
      if (err) {
        /* the message names the bucket URL; say it was a listing of the prefix */
        char m[MML_ERR_MSG];
        snprintf(m, sizeof m, "%s", err->msg);
        mml_err_set(err, st, "LIST %s: %s", shown, m);
      }
      goto done;
    }
    const char *doc = (const char *)page.data;
    size_t dn = page.len, pos = 0, len;
    if (!doc || !memmem(doc, dn, "<ListBucketResult", 17)) {
      st = mml_err_set(err, MML_EFETCH, "LIST %s: reply is not a ListBucketResult", shown);
      goto done;
    }
    const char *c;
    while ((c = xml_next(doc, dn, &pos, "Contents", &len))) {
      size_t kp = 0, kl;
      const char *k = xml_next(c, len, &kp, "Key", &kl);
      if (!k) continue;
      if (kl >= 4000) {
        st = mml_err_set(err, MML_EFETCH, "LIST %s: a key longer than 4000 bytes", shown);
        goto done;
      }
      size_t klen = xml_decode(k, kl, kbuf, 4096);
      if (strlen(kbuf) != klen || strncmp(kbuf, pfx, strlen(pfx))) continue; /* NUL or foreign */
      if (pat && !strncmp(pat, "s3://", 5)) { /* a whole-URL pattern */
        char full[4200];
        snprintf(full, sizeof full, "s3://%.*s/%s", (int)blen, bucket, kbuf);
        if (fnmatch(pat, full, FNM_PATHNAME) != 0) continue;
      } else if (pat) {
        const char *rel = klen >= dirlen ? kbuf + dirlen : kbuf;
        if (fnmatch(pat, rel, FNM_PATHNAME) != 0) continue;
      }
      if (cnt == cap) {
        size_t nc = cap ? cap * 2 : 64;
        char **t = realloc(out, nc * sizeof *t);
        if (!t) {
          st = mml_err_set(err, MML_ENOMEM, "out of memory");
          goto done;
        }
        out = t, cap = nc;
      }
      size_t ul = blen + 6 + klen + 1;
      if (!(out[cnt] = malloc(ul))) {
        st = mml_err_set(err, MML_ENOMEM, "out of memory");
        goto done;
      }
      snprintf(out[cnt], ul, "s3://%.*s/%s", (int)blen, bucket, kbuf);
      cnt++;
    }
    char trunc[16];
    mml_xml_text(doc, dn, "IsTruncated", trunc, sizeof trunc);
    if (strcmp(trunc, "true")) break;
    size_t tp = 0, tl;
    const char *t = xml_next(doc, dn, &tp, "NextContinuationToken", &tl);
    if (!t || !tl) {
      st = mml_err_set(err, MML_EFETCH, "LIST %s: truncated reply without a continuation token", shown);
      goto done;
    }
    char tok[2048];
    size_t tn = xml_decode(t, tl, tok, sizeof tok);
    if (tl >= sizeof tok - 8 || (token.len == tn && !memcmp(token.data, tok, tn))) {
      st = mml_err_set(err, MML_EFETCH, "LIST %s: bad continuation token (too long or repeated)", shown);
      goto done;
    }
    mml_bytes_clear(&token);
    if (mml_bytes_append(&token, tok, tn)) {
      st = mml_err_set(err, MML_ENOMEM, "out of memory");
      goto done;
    }
  }
  if (cnt) qsort(out, cnt, sizeof *out, cmp_str);
  *urls = out, *n = cnt;
  out = NULL, cnt = 0;
done:
  mml_fetch_list_free(out, cnt);
  mml_bytes_free(&token), mml_bytes_free(&q), mml_bytes_free(&page);
  free(pfx), free(pat), free(burl), free(kbuf), free(shown);
  return st;
}
