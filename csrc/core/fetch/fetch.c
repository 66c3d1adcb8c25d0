/*
 * fetch.c — the fetcher's public side: process-wide libcurl state, construction (one or
 * more I/O loops, credentials from the configuration or the environment), submission,
 * statistics and the pure helpers of mml/fetch.h.  The transfer loop itself, its threads
 * and ownership rules are in fetch_loop.c; S3 addressing and listing in s3.c; blocking
 * helpers in fetch_sync.c.
 *
 * Secrets.  Credentials are copied into the fetcher and used only to sign; messages name
 * URLs with user-info and credential-like query values redacted (mml_url_redact, the one
 * redaction of mml/message.h, which every mml_err_set applies again).
 */
#include "mml/fetch.h"

#include <math.h>
#include <stdio.h>
#include <strings.h>

#include "fetch_loop.h"

int mml_path_is_remote(const char *p) {
  return p && (!strncmp(p, "http://", 7) || !strncmp(p, "https://", 8) || !strncmp(p, "s3://", 5));
}

static const char *pick(const char *cfg, const char *env1, const char *env2) {
  if (cfg && *cfg) return cfg;
  const char *e = env1 ? getenv(env1) : NULL;
  if (e && *e) return e;
  e = env2 ? getenv(env2) : NULL;
  return e && *e ? e : NULL;
}

double mml_fetch_backoff(double base_s, double max_s, int attempt, double retry_after, double u01) {
  double d = base_s * pow(2.0, attempt < 1 ? 0 : attempt > 30 ? 29 : attempt - 1);
  if (d > max_s) d = max_s;
  d = d * 0.5 + d * 0.5 * u01;
  if (retry_after > 60) retry_after = 60;
  return retry_after > d ? retry_after : d;
}

/* ---- public API ------------------------------------------------------------------------ */

static mml_status loop_new(const mml_fetch_cfg *cfg, int max_inflight, mml_fetcher **out,
                           mml_err *err) {
  mml_fetcher *f = calloc(1, sizeof *f);
  if (!f) return mml_err_set(err, MML_ENOMEM, "fetcher: out of memory");
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
  f->max_object_bytes =
      cfg->max_object_bytes ? cfg->max_object_bytes : MML_DEFAULT_MAX_OBJECT_BYTES;
  f->min_rate = cfg->min_rate ? cfg->min_rate : 1024;
  f->retry_budget_s = cfg->retry_budget_s ? cfg->retry_budget_s : 60;
  f->whole_cap =
      cfg->whole_cache_bytes > 0 ? cfg->whole_cache_bytes : MML_DEFAULT_WHOLE_CACHE_BYTES;
  f->rng = mml_mix64((uint64_t)(uintptr_t)f ^ (uint64_t)(mml_now() * 1e9)) | 1;
  pthread_mutex_init(&f->mu, NULL);
  pthread_mutex_init(&f->smu, NULL);
  pthread_mutex_init(&f->cmu, NULL);
  pthread_mutex_init(&f->wmu, NULL);
  if (bad) {
    mml_fetcher_free(f);
    return mml_err_set(err, MML_ENOMEM, "fetcher: out of memory copying its settings");
  }
  f->multi = curl_multi_init();
  if (!f->multi) {
    mml_fetcher_free(f);
    return mml_err_set(err, MML_EINTERNAL, "curl_multi_init failed");
  }
  curl_multi_setopt(f->multi, CURLMOPT_MAXCONNECTS, (long)f->max_inflight);
  if (pthread_create(&f->io, NULL, mml_fetch_io_main, f)) {
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
  if (!mml_fetch_global_init())
    return mml_err_set(err, MML_EINTERNAL, "libcurl global initialisation failed");
  if (cfg->max_inflight < 0 || cfg->list_page_size < 0 || cfg->timeout_s < 0 ||
      cfg->connect_timeout_s < 0 || cfg->stall_s < 0 || cfg->backoff_base_s < 0 ||
      cfg->backoff_max_s < 0 || cfg->range_chunk < 0 || cfg->io_threads < 0 ||
      cfg->retry_budget_s < 0 || cfg->whole_cache_bytes < 0 || !(cfg->min_rate == cfg->min_rate))
    return mml_err_set(err, MML_ECONFIG, "fetch: negative setting");
  if (cfg->max_inflight > 100000)
    return mml_err_set(err, MML_ECONFIG, "fetch: max_inflight %d is too large", cfg->max_inflight);
  if (cfg->io_threads > 64)
    return mml_err_set(err, MML_ECONFIG, "fetch: io_threads %d is too large (at most 64)",
                       cfg->io_threads);
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
    return mml_err_set(err, MML_ENOMEM, "fetcher: out of memory for its I/O loops");
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
  if (f->multi) curl_multi_cleanup(f->multi);
  fw_free(f);
  wipe_free(f->ak), wipe_free(f->sk), wipe_free(f->tok);
  free(f->region), free(f->endpoint), free(f->ca_bundle);
  pthread_mutex_destroy(&f->mu);
  pthread_mutex_destroy(&f->smu);
  pthread_mutex_destroy(&f->cmu);
  pthread_mutex_destroy(&f->wmu);
  free(f);
}

mml_status mml_fetch_submit(mml_fetcher *f, const char *url, int64_t off, int64_t len,
                            mml_fetch_cb cb, void *ctx, mml_err *err) {
  return mml_fetch_submit_query(f, url, NULL, off, len, 0, cb, ctx, NULL, err);
}

mml_status mml_fetch_submit_head(mml_fetcher *f, const char *url, mml_fetch_cb cb, void *ctx,
                                 mml_err *err) {
  return mml_fetch_submit_query(f, url, NULL, 0, -1, 1, cb, ctx, NULL, err);
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
