/*
 * fetch_loop.c — the fetcher's transfer loop: HTTP(S) and S3 GETs over libcurl's multi
 * interface (the public side is fetch.c; S3 addressing and listing s3.c; blocking
 * helpers fetch_sync.c).
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
 *
 * Files: fetch_loop.c (this: libcurl global state, starting transfers, retries, the
 * loop), fetch_job.c (jobs, xfers, twins, completion, curl callbacks), fetch_loop.h.
 */
#include "fetch_loop.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <strings.h>
#include <time.h>

#include "mml/message.h"
#include "mml/s3.h"
#include "mml/sigv4.h"

enum { MAX_REDIRECTS = 5 }; /* http(s) redirects followed (S3 follows none) */

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

int mml_fetch_global_init(void) {
  pthread_once(&g_once, global_init);
  return g_init_ok;
}

static double rand01(mml_fetcher *f) {
  uint64_t x = f->rng;
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  f->rng = x;
  return (double)(x >> 11) / 9007199254740992.0;
}

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
  if (!f->ak)
    return st ? mml_err_set(err, MML_ENOMEM, "S3 signing: out of memory") : MML_OK; /* anonymous */
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
  if (st) return mml_err_set(err, MML_ENOMEM, "S3 signing: out of memory");
  mml_sigv4_req r = {j->head ? "HEAD" : "GET",
                     j->canon_uri,
                     j->canon_query,
                     hs,
                     nh,
                     MML_SHA256_EMPTY,
                     date,
                     f->region,
                     "s3",
                     f->ak,
                     f->sk};
  char auth[1024];
  st = mml_sigv4_authorization(&r, auth, sizeof auth, err);
  if (st) return st;
  if (add_header(&x->hdrs, "Authorization: %s", auth))
    return mml_err_set(err, MML_ENOMEM, "S3 signing: out of memory");
  return MML_OK;
}

static mml_status xfer_start(mml_fetcher *f, xfer *x, mml_err *err) {
  job *j = x->j;
  /* A fresh easy handle per transfer, never a reset one: libcurl before 8.1.0 keeps a
   * pointer to the last response header across curl_easy_reset and follows it when the
   * next response starts with a folded header line (curl issue 11101: a use-after-free
   * that fuzz-http found through Debian 12's 7.88.1).  Connections live in the multi
   * handle's cache and DNS/TLS sessions in the share, so nothing is lost. */
  CURL *e = curl_easy_init();
  if (!e) return mml_err_set(err, MML_ENOMEM, "curl_easy_init failed");
  x->got = 0, x->skip = 0, x->http = 0, x->overflow = 0, x->nomem = 0, x->retry_after = -1;
  x->stalled = 0, x->last_rx = mml_now(), x->stall_s = f->stall_s, x->toobig = 0, x->cut = 0;
  if (x->attempt == 0) x->first_start = x->last_rx;
  /* no attempt outlives the request's retry budget */
  double left_s = x->first_start + f->retry_budget_s - x->last_rx;
  double timeout_s = f->timeout_s < left_s ? f->timeout_s : left_s;
  if (timeout_s < 0.05) timeout_s = 0.05;
  x->cr_start = x->cr_end = x->cr_total = -1, x->clen = -1, x->errbuf[0] = 0, x->etag[0] = 0;
  mml_bytes_clear(&x->errbody);
  if (x->probe) mml_bytes_clear(&j->body);
  curl_slist_free_all(x->hdrs);
  x->hdrs = NULL;
  mml_status st = MML_OK;
  if (x->len != 0 || x->off != 0) {
    if (x->len > 0)
      st = add_header(&x->hdrs, "Range: bytes=%lld-%lld", (long long)x->off,
                      (long long)(x->off + x->len - 1));
    else
      st = add_header(&x->hdrs, "Range: bytes=%lld-%lld", (long long)x->off,
                      (long long)(x->off + f->range_chunk - 1));
  }
  if (!st && !x->probe && j->etag[0]) st = add_header(&x->hdrs, "If-Match: %s", j->etag);
  if (st) {
    curl_easy_cleanup(e);
    return mml_err_set(err, MML_ENOMEM, "fetch: out of memory for request headers");
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
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, fl_on_header);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, x);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, fl_on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, x->hdrs);
  curl_easy_setopt(e, CURLOPT_USERAGENT, "mmloader/0.1");
  curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(f->connect_timeout_s * 1000));
  /* min_rate over stall_s (a drip-fed body); fl_on_progress catches a full stop sooner */
  curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, f->min_rate >= 1 ? (long)f->min_rate : 1L);
  curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)ceil(f->stall_s < 1 ? 1 : f->stall_s));
  curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, fl_on_progress);
  curl_easy_setopt(e, CURLOPT_XFERINFODATA, x);
  curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
  if (g_share) curl_easy_setopt(e, CURLOPT_SHARE, g_share);
  if (f->ca_bundle) curl_easy_setopt(e, CURLOPT_CAINFO, f->ca_bundle);
  if (!j->is_s3) {
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(e, CURLOPT_MAXREDIRS, (long)MAX_REDIRECTS);
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
  fl_xfer_release_easy(f, x);
  double now = mml_now();
  double due =
      now + mml_fetch_backoff(f->backoff_base_s, f->backoff_max_s, x->attempt + 1, ra, rand01(f));
  if (x->attempt < f->max_retries && !j->failed && due < x->first_start + f->retry_budget_s) {
    x->attempt++;
    j->retries++;
    pthread_mutex_lock(&f->smu);
    uint64_t *c[] = {&f->stats.retries_5xx, &f->stats.retries_429, &f->stats.retries_timeout,
                     &f->stats.retries_reset, &f->stats.retries_short};
    (*c[cause])++;
    f->stats.inflight = f->inflight;
    pthread_mutex_unlock(&f->smu);
    x->due = due;
    x->next = f->delayed;
    f->delayed = x;
    return;
  }
  if (x->attempt < f->max_retries && !j->failed) /* retries left, but no time */
    fl_part_fail(f, x, st, "%s (retry_budget_s=%g spent: %.1f s since the first attempt)", why,
                 f->retry_budget_s, now - x->first_start);
  else
    fl_part_fail(f, x, st, "%s", why);
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
    xfer *x = fl_xfer_new(f, j, o, n, 0, o - j->off);
    if (!x) { /* fail the job through a bookkeeping-only path */
      j->failed = 1, j->fst = MML_ENOMEM;
      mml_err_set(&j->ferr, MML_ENOMEM, "GET %s: out of memory", j->shown);
      return;
    }
    fl_ready_push_back(f, x);
  }
}

/* 1 when a receive error (CURLE_RECV_ERROR) came from the network (a reset, a TLS read
 * failure: worth another connection), 0 when curl refused what the server sent (response
 * headers over its limit, a malformed chunk size): the same reply would come again.  The
 * network's errors carry an errno or curl's "Recv failure"/TLS wording; the parser's
 * carry neither. */
static int recv_error_is_network(CURL *e, const char *errbuf) {
  long os_errno = 0;
  if (e) curl_easy_getinfo(e, CURLINFO_OS_ERRNO, &os_errno);
  return os_errno != 0 || !errbuf[0] || strstr(errbuf, "Recv failure") || strstr(errbuf, "SSL") ||
         strstr(errbuf, "TLS") || strstr(errbuf, "Connection");
}

/* A transfer curl could not complete (rc != CURLE_OK): retried when transient, failed at
 * once (with the cause) when asking again cannot help. */
static void xfer_curl_failed(mml_fetcher *f, xfer *x, CURLcode rc) {
  char why[512];
  /* curl keeps the FIRST message of a transfer in errbuf (a reset connection it
   * replaced, say), so the code's own wording leads and errbuf follows */
  const char *code = curl_easy_strerror(rc);
  if (x->errbuf[0] && strcmp(x->errbuf, code))
    snprintf(why, sizeof why, "%s: %s (curl %d)", code, x->errbuf, (int)rc);
  else
    snprintf(why, sizeof why, "%s (curl %d)", code, (int)rc);
  if (x->overflow) {
    fl_xfer_release_easy(f, x);
    fl_part_fail(f, x, MML_EFETCH, "server sent more bytes than requested");
    return;
  }
  if (x->toobig) { /* declared or not, the object is too large: asking again will not help */
    int64_t size = x->cr_total > 0 ? x->cr_total : x->clen;
    fl_xfer_release_easy(f, x);
    if (x->toobig == 2)
      fl_part_fail(f, x, MML_EOBJECTSIZE, "the object is %lld bytes, above max_object_bytes=%lld",
                   (long long)size, (long long)f->max_object_bytes);
    else
      fl_part_fail(f, x, MML_EOBJECTSIZE,
                   "the body passed max_object_bytes=%lld without a declared size",
                   (long long)f->max_object_bytes);
    return;
  }
  if (x->stalled) {
    snprintf(why, sizeof why, "transfer stalled for %.1f s", f->stall_s);
    retry_or_fail(f, x, RETRY_TIMEOUT, MML_EFETCH, why);
    return;
  }
  switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
      if (strstr(x->errbuf, "too slow"))
        snprintf(why, sizeof why, "transfer slower than min_rate=%g bytes/s for %.1f s",
                 f->min_rate, f->stall_s);
      retry_or_fail(f, x, RETRY_TIMEOUT, MML_EFETCH, why);
      return;
    case CURLE_PARTIAL_FILE:
      retry_or_fail(f, x, RETRY_SHORT, MML_EFETCH, why);
      return;
    case CURLE_TOO_MANY_REDIRECTS: /* a loop, or a chain no retry shortens */
      fl_xfer_release_easy(f, x);
      fl_part_fail(f, x, MML_EFETCH, "redirect loop: more than %d redirects (curl %d)",
                   MAX_REDIRECTS, (int)rc);
      return;
    case CURLE_RECV_ERROR:
      if (!recv_error_is_network(x->easy, x->errbuf)) { /* a reply curl cannot read */
        fl_xfer_release_easy(f, x);
        fl_part_fail(f, x, MML_EFETCH, "malformed reply: %s", why);
        return;
      }
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
      fl_xfer_release_easy(f, x);
      fl_part_fail(f, x, MML_EFETCH, "%s", why);
      return;
  }
}

/* A 2xx reply: the body is checked against what was asked (short bodies are retried),
 * the object size noted; a probe that found a larger object spawns the range parts. */
static void xfer_ok(mml_fetcher *f, xfer *x, CURL *e) {
  job *j = x->j;
  long s = x->http;
  char why[512];
  int64_t expect = -1;
  if (s == 206 && x->cr_start >= 0)
    expect = x->cr_end - x->cr_start + 1;
  else if (x->clen >= 0 && !x->skip && !j->head)
    expect = x->clen;
  if (s == 206 && x->cr_start >= 0 && x->cr_start != x->off) {
    fl_xfer_release_easy(f, x);
    fl_part_fail(f, x, MML_EFETCH, "HTTP 206 for the wrong range (starts at %lld)",
                 (long long)x->cr_start);
    return;
  }
  if (expect >= 0 && x->got < expect && !j->head) {
    snprintf(why, sizeof why, "short body: %lld of %lld bytes", (long long)x->got,
             (long long)expect);
    retry_or_fail(f, x, RETRY_SHORT, MML_EFETCH, why);
    return;
  }
  if (j->head) {
    curl_off_t cl = -1;
    curl_easy_getinfo(e, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
    j->total = cl;
    memcpy(j->etag, x->etag, sizeof j->etag); /* reported after the size (mml_fetch_stat) */
  } else if (x->cr_total >= 0) {
    j->total = x->cr_total;
  } else if (s == 200 && !x->skip) {
    j->total = j->off + x->got; /* the whole object came back */
  } else if (s == 200 && x->cut && x->clen >= 0) {
    j->total = x->clen; /* Range ignored, the rest left unread: the size it declared */
  } else if (s == 200 && !x->probe && x->got < x->len) {
    j->total = x->off + x->got; /* Range ignored and the object ended inside our slice */
  }
  if (!x->probe && x->len > 0 && x->got < x->len && j->total >= 0 && x->off + x->got < j->total) {
    snprintf(why, sizeof why, "short body: %lld of %lld bytes", (long long)x->got,
             (long long)x->len);
    retry_or_fail(f, x, RETRY_SHORT, MML_EFETCH, why);
    return;
  }
  fl_xfer_release_easy(f, x);
  if (x->probe && s == 206 && j->total > x->off + x->got) {
    memcpy(j->etag, x->etag, sizeof j->etag);
    spawn_rest(f, x);
  }
  fl_part_done(f, x);
}

/* A non-2xx reply: 416 on a range past the end is an empty body; 429, 5xx and 408 are
 * retried; the rest fail with the S3 error code and message when the body has them. */
static void xfer_http_error(mml_fetcher *f, xfer *x) {
  job *j = x->j;
  long s = x->http;
  char why[512];
  if (s == 416 && !j->head && (x->len != 0 || x->off != 0)) {
    /* Range unsatisfiable: it starts at or past the end of the object (a probe of
     * bytes=0-N gets this for an empty object).  Nothing there, not an error. */
    if (x->cr_total >= 0)
      j->total = x->cr_total;
    else if (j->total < 0 || j->total > x->off)
      j->total = x->off;
    fl_xfer_release_easy(f, x);
    if (x->probe) mml_bytes_clear(&j->body);
    fl_part_done(f, x);
    return;
  }
  char code[128] = "", msg[256] = "";
  if (x->errbody.len) {
    mml_xml_text((const char *)x->errbody.data, x->errbody.len, "Code", code, sizeof code);
    mml_xml_text((const char *)x->errbody.data, x->errbody.len, "Message", msg, sizeof msg);
  }
  snprintf(why, sizeof why, "HTTP %ld%s%s%s%s", s, code[0] ? " " : "", code, msg[0] ? ": " : "",
           msg);
  if (s == 429)
    retry_or_fail(f, x, RETRY_429, MML_EFETCH, why);
  else if (s == 500 || s == 502 || s == 503 || s == 504)
    retry_or_fail(f, x, RETRY_5XX, MML_EFETCH, why);
  else if (s == 408)
    retry_or_fail(f, x, RETRY_TIMEOUT, MML_EFETCH, why);
  else if (s == 412 && j->etag[0]) {
    fl_xfer_release_easy(f, x);
    fl_part_fail(f, x, MML_EFETCH, "the object changed while its ranges were fetched (ETag %s)",
                 j->etag);
  } else {
    mml_status st = s == 404 ? MML_ENOENT : (s == 401 || s == 403) ? MML_EAUTH : MML_EFETCH;
    fl_xfer_release_easy(f, x);
    fl_part_fail(f, x, st, "%s", why);
  }
}

static void xfer_done(mml_fetcher *f, xfer *x, CURLcode rc) {
  CURL *e = x->easy;
  long http = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &http);
  if (!x->http) x->http = http;
  if (x->nomem) {
    fl_xfer_release_easy(f, x);
    fl_part_fail(f, x, MML_ENOMEM, "out of memory receiving the body");
    return;
  }
  if (rc == CURLE_WRITE_ERROR && x->cut && !x->probe) rc = CURLE_OK; /* stopped on purpose */
  if (rc != CURLE_OK) {
    xfer_curl_failed(f, x, rc);
    return;
  }
  record_latency(f, e, x->http >= 200 && x->http < 300 ? x->got : 0);
  if (x->http >= 200 && x->http < 300)
    xfer_ok(f, x, e);
  else
    xfer_http_error(f, x);
}

/* ---- the I/O thread ------------------------------------------------------------------- */

/* Turns a job fresh from the queue into its first xfer(s). */
static void job_plan(mml_fetcher *f, job *j) {
  job *whole = NULL;
  if (fw_route(f, j, &whole)) { /* its server ignores Range: served from the whole object */
    if (whole) job_plan(f, whole);
    return;
  }
  fl_link_j(f, j);
  if (j->head || (j->canon_query && *j->canon_query)) { /* HEAD, listing: one plain request */
    xfer *x = fl_xfer_new(f, j, 0, 0, 1, 0);
    if (!x) goto oom;
    fl_ready_push_back(f, x);
    return;
  }
  if (j->len < 0) { /* to the end, size unknown: probe the first chunk */
    xfer *x = fl_xfer_new(f, j, j->off, -1, 1, 0);
    if (!x) goto oom;
    fl_ready_push_back(f, x);
    return;
  }
  if (j->len == 0) {
    fl_job_finish(f, j);
    return;
  }
  if (mml_bytes_reserve(&j->body, (size_t)j->len)) goto oom;
  j->body.len = (size_t)j->len;
  for (int64_t o = 0; o < j->len; o += f->range_chunk) {
    int64_t n = j->len - o < f->range_chunk ? j->len - o : f->range_chunk;
    xfer *x = fl_xfer_new(f, j, j->off + o, n, 0, o);
    if (!x) {
      j->failed = 1, j->fst = MML_ENOMEM;
      mml_err_set(&j->ferr, MML_ENOMEM, "GET %s: out of memory", j->shown);
      if (j->parts_left == 0) fl_job_finish(f, j);
      return;
    }
    fl_ready_push_back(f, x);
  }
  return;
oom:
  j->failed = 1, j->fst = MML_ENOMEM;
  mml_err_set(&j->ferr, MML_ENOMEM, "GET %s: out of memory", j->shown);
  if (j->parts_left == 0) fl_job_finish(f, j);
}

static void cancel_all(mml_fetcher *f) {
  while (f->all_x) {
    xfer *x = f->all_x;
    job *j = x->j;
    if (!j->failed) {
      j->failed = 1, j->fst = MML_ECANCELLED;
      mml_err_set(&j->ferr, MML_ECANCELLED, "GET %s: cancelled (fetcher closed)", j->shown);
    }
    fl_part_done(f, x);
  }
  while (f->all_j) { /* jobs without parts (none expected) */
    job *j = f->all_j;
    j->failed = 1, j->fst = MML_ECANCELLED;
    mml_err_set(&j->ferr, MML_ECANCELLED, "GET %s: cancelled (fetcher closed)", j->shown);
    fl_job_finish(f, j);
  }
  f->ready_head = f->ready_tail = f->delayed = NULL;
}

void *mml_fetch_io_main(void *arg) {
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
        fl_link_j(f, q);
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
        fl_ready_push_front(f, x);
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
      if (xfer_start(f, x, &err) != MML_OK) fl_part_fail(f, x, err.status, "%s", err.msg);
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

/* ---- submission (any thread) ---------------------------------------------------------- */

static mml_status submit_job(mml_fetcher *f, job *j, mml_err *err) {
  if (f->nloops > 1)
    f = f->loops[__atomic_fetch_add(&f->rr, 1, __ATOMIC_RELAXED) % (unsigned)f->nloops];
  pthread_mutex_lock(&f->mu);
  if (f->stop) {
    pthread_mutex_unlock(&f->mu);
    mml_err_set(err, MML_ECLOSED, "fetcher is closed");
    j->failed = 1, j->fst = MML_ECLOSED, j->ferr = *err;
    fl_notify_waiters(fl_twin_detach(j), j, MML_ECLOSED, NULL); /* joined it meanwhile */
    fl_job_free(j);
    return MML_ECLOSED;
  }
  j->next = NULL;
  if (f->q_tail)
    f->q_tail->next = j;
  else
    f->q_head = j;
  f->q_tail = j;
  pthread_mutex_unlock(&f->mu);
  curl_multi_wakeup(f->multi);
  return MML_OK;
}

mml_status mml_fetch_submit_query(mml_fetcher *f, const char *url, const char *query, int64_t off,
                                  int64_t len, int head, mml_fetch_cb cb, void *ctx,
                                  int64_t *total_out, mml_err *err) {
  if (!f) return mml_err_set(err, MML_EINVAL, "fetch: NULL fetcher");
  job *j = NULL;
  mml_status st = fl_job_new(f, url, query, off, len, head, cb, ctx, &j, err);
  if (st) return st;
  j->total_out = total_out;
  if (!head && !query && !total_out && fl_twin_attach(f, j)) return MML_OK;
  return submit_job(f, j, err);
}
