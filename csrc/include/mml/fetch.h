/*
 * mml/fetch.h — remote objects over HTTP(S) and S3 (SigV4) with libcurl's multi
 * interface.  One I/O thread per fetcher owns the multi handle; any thread submits
 * requests and gets a completion callback, called on the I/O thread (keep it short:
 * hand the body to a work queue).  Transient failures (5xx, 429, SlowDown, timeouts,
 * stalls, resets, short bodies) are retried with capped exponential backoff and jitter,
 * honouring Retry-After, on a fresh connection; failures the same request would meet
 * again (an object over max_object_bytes, a redirect loop, response headers over curl's
 * limit, a malformed chunked body, 4xx) fail at once with that cause.  Secrets never
 * appear in messages.
 *
 * Local paths are not handled here; mml_path_is_remote() tells which is which.
 */
#ifndef MML_FETCH_H
#define MML_FETCH_H

#include "mml/common.h"

/* 1 for http://, https://, s3:// */
int mml_path_is_remote(const char *path);

#define MML_DEFAULT_MAX_OBJECT_BYTES ((int64_t)256 << 20) /* 256 MiB */
#define MML_DEFAULT_WHOLE_CACHE_BYTES ((int64_t)1 << 30)  /* 1 GiB */

typedef struct mml_fetch_cfg {
  /* S3 credentials and addressing; NULL/empty fields fall back to the environment
   * (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION /
   * AWS_DEFAULT_REGION, AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL).  The strings are copied. */
  const char *access_key, *secret_key, *session_token, *region, *endpoint;
  int max_inflight; /* requests in flight (default 64 when 0).  Sizing (Little's law):
               * in flight = wanted rate x latency, e.g. 2000 images/s at 30 ms
               * first-byte latency needs 60; and enough to fill the pipe:
               * bandwidth x latency / object size (1 GB/s x 30 ms / 100 kB =
               * 300).  Take the larger, then stay under the server's limits
               * (S3: about 5,500 GETs/s per prefix, so SlowDown above that). */
  int max_retries;  /* default 8 when 0; negative: no retries */
  double timeout_s; /* whole-request timeout (default 60 when 0) */
  double connect_timeout_s;
  double stall_s;                       /* abort a transfer stalled this long (default 10 when 0) */
  double backoff_base_s, backoff_max_s; /* defaults 0.05 and 5 when 0 */
  int64_t range_chunk;   /* objects larger than this are fetched in parallel ranges (0: 8 MiB) */
  int list_page_size;    /* ListObjectsV2 max-keys per page (0: the server's default, 1000) */
  const char *ca_bundle; /* PEM file of CAs to trust for https (NULL: AWS_CA_BUNDLE, else
                         * the system store); copied */
  /* Bounds on what one server can cost (0: the default; see each). */
  int64_t max_object_bytes;  /* a body passing this is cut and refused at once, never retried
                             * (MML_EOBJECTSIZE): from the headers when the size is declared
                             * (Content-Length / Content-Range), else when the bytes pass it
                             * (default MML_DEFAULT_MAX_OBJECT_BYTES) */
  double min_rate;           /* bytes/s: a transfer slower than this over stall_s is abandoned
                               * and retried (default 1024; a server dripping bytes) */
  double retry_budget_s;     /* total time of one request with all its retries, counted from
                               * its first attempt: no attempt outlives it (default 60) */
  int64_t whole_cache_bytes; /* a server that ignores Range (answers a ranged GET with the
                              * whole object) has its objects fetched once and kept whole
                              * for their ranged reads, this many bytes in all, least
                              * recently used dropped first; a larger object is refused
                              * (0: MML_DEFAULT_WHOLE_CACHE_BYTES) */
  int io_threads;            /* I/O threads, each with its own multi handle and connections,
                               * sharing max_inflight (0: 1, which sustains thousands of GETs/s;
                               * more only when TLS or copying makes one thread CPU-bound) */
} mml_fetch_cfg;

typedef struct mml_fetcher mml_fetcher;

mml_status mml_fetcher_new(const mml_fetch_cfg *cfg, mml_fetcher **out, mml_err *err);
/* Cancels what is queued or in flight (their callbacks run with MML_ECANCELLED), joins
 * the I/O thread and frees everything.  NULL is fine. */
void mml_fetcher_free(mml_fetcher *f);

/* Completion: st is MML_OK with the body in *body (the callback takes ownership of the
 * buffer's memory, e.g. by moving it), or a failure with err naming URL, HTTP status and
 * S3 error code.  Called exactly once per successful submit, on the I/O thread. */
typedef void (*mml_fetch_cb)(void *ctx, mml_status st, mml_bytes *body, const mml_err *err);

/* Queues a GET of url (http(s):// or s3://bucket/key); off/len select a byte range
 * (len < 0: to the end).  Never blocks on the network. */
mml_status mml_fetch_submit(mml_fetcher *f, const char *url, int64_t off, int64_t len,
                            mml_fetch_cb cb, void *ctx, mml_err *err);

/* Queues a HEAD of url: on success the body is the object's size as one int64 (then its
 * ETag as the server sent it), as mml_fetch_stat reads it.  Never blocks on the network. */
mml_status mml_fetch_submit_head(mml_fetcher *f, const char *url, mml_fetch_cb cb, void *ctx,
                                 mml_err *err);

typedef struct mml_fetch_stats {
  uint64_t requests, bytes, failures;
  uint64_t retries_5xx, retries_429, retries_timeout, retries_reset, retries_short;
  double latency_p50_s, latency_p90_s, latency_p99_s; /* time to first byte */
  int inflight;
} mml_fetch_stats;
void mml_fetch_get_stats(mml_fetcher *f, mml_fetch_stats *out);

/* ---- pure helpers (exposed for tests and messages) ---------------------------------- */

/* Delay before retry number `attempt` (1-based): min(max_s, base_s * 2^(attempt-1)),
 * jittered into [d/2, d] by u01 in [0,1), and never below retry_after (a Retry-After in
 * seconds, < 0 when absent; capped at 60). */
double mml_fetch_backoff(double base_s, double max_s, int attempt, double retry_after, double u01);
/* URLs in messages: mml_url_redact (mml/message.h). */

#endif
