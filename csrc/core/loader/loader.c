/*
 * loader.c — the engine's public side: construction, threads' start and stop, the
 * consumer API (next, seek, cursor, stats) and the plan (see mml/loader.h).  The workers
 * and the per-sample task are in loader_worker.c, the collation thread and the output
 * queue in loader_collator.c; the shared structures in loader_int.h.
 *
 * DESIGN
 *   Sequence numbers.  Work is numbered by `seq` = 0, 1, 2, ...; a "plan" maps seq to a
 *   stream coordinate (epoch, pos): nominal plans walk pos 0..n_rank-1 and roll over to
 *   the next epoch; a wrap plan (padded mode filling an epoch short of samples after
 *   skips) walks pos = n_rank, n_rank+1, ... within one epoch.  Every change of plan
 *   (seek, epoch end, wrap) bumps `gen` and restarts numbering at head_seq; work of an
 *   older generation is discarded when it completes.
 *
 *   Threads.
 *     workers (num_threads): first emit a finished batch if one is queued (build its
 *       small tensors: its pixels are already in place), else decode a queued sample
 *       straight into its slice of its batch's pixel_values, else take ready tasks
 *       (remote bytes arrived), else dispatch the next seq if it lies in the window
 *       [head_seq, head_seq + window) (and below limit_seq after a seek_ahead: the seek's
 *       `ahead` samples, one more per skip) and its slot is free; read, fetch and plan
 *       the sample from its image headers (no pixel work); mark the slot PLANNED (or
 *       DONE: failed, text-only).  A task waiting on the network holds no thread: the
 *       fetch completion (I/O thread) puts it on the ready list.
 *     planner (in the collator thread, loader_place.c): places PLANNED samples into the
 *       batches the collator will compose (the same composition step on the same
 *       counts), gets each batch's pixel_values buffer from the pool and queues each
 *       sample's decode with its destination; the decode marks the slot DONE.
 *     collator (1): consumes the slot of head_seq strictly in order, decides epoch
 *       boundaries and batch composition (mml_collator_fits/add/full on one of `ncoll`
 *       collator instances), and hands each complete batch to the workers for emission,
 *       continuing on the next instance meanwhile.  Finished items (batches, and with
 *       on_error="raise" sample errors) wait in `pend` in stream order and move into the
 *       output queue of `prefetch` items as it has room; a full `pend` stops the
 *       collator (backpressure).  Batch composition is sequential, so the output does
 *       not depend on which instance or worker emitted a batch.
 *     consumer (the caller of mml_loader_next): pops items; never does sample work.
 *   Task slots: tasks[seq % window].  A slot is owned by exactly one party at a time:
 *   EMPTY (free), BUSY (a worker or an outstanding fetch), PLANNED (counts known, waiting
 *   for its decode: its placement fields belong to the planner, under mu), DONE
 *   (waiting for collation).
 *
 *   Locking: one mutex `mu` guards all shared state; condition variables work_cv
 *   (workers), coll_cv (collator) and out_cv (consumer).  Sample work, reads, fetch
 *   submission and collation run outside it.  Lock order: mu -> pool (batches are
 *   released under mu on seek/close) and mu -> fetcher internals are never nested the
 *   other way round: fetch completions (the fetcher's I/O thread) take mu, so mu is never
 *   held while calling into a running fetcher (creating it runs no completions).
 *
 *   Ownership: the loader owns the tasks, the collator, the pool's creator reference and
 *   the fetcher; a delivered batch's buffers belong to the consumer (and outlive the
 *   loader).  Shutdown: stop flag + broadcast, join workers and collator, then free the
 *   fetcher (its cancelled completions only touch tasks, which are still allocated).
 *
 *   Epoch ends.  The batch whose `after` cursor ends its epoch (all of a padded epoch's
 *   batches, or every position of a packed one) sets epoch_done: the consumer's next
 *   call returns MML_EEND at once, not once a batch of the next epoch is queued.  The
 *   epochs the consumer asked for (asked_epoch) let a later epoch's remote videos wait
 *   (loader_video.c); a consumer waiting with nothing of its epoch left asks for the next.
 *
 *   Determinism: a task's result depends only on (epoch, pos) and the config; the
 *   collator sees results in seq order; so batches never depend on timing.
 *
 *   Start (cfg.start, mml_start).  The threads start once: at the end of mml_loader_new
 *   (MML_START_CONSTRUCTION, the default: the first batches are those of cursor {0, 0, 0},
 *   known once the loader is built) or at the first mml_loader_next (MML_START_NEXT).
 *     S1. Work made before the first next() is the work a running loader would hold
 *         (the window, `prefetch` batches, within max_memory: the same gates); a seek
 *         before the first next() (load_state_dict, set_epoch) drops it as it drops a
 *         running loader's prefetch (gen, ld_drop_output_locked), so the batches after it
 *         are bitwise those of a loader started at the seek's cursor.
 *     S2. stats' wall_s and wait_s still count from the first next(): the wait-time
 *         ratio is the consumer's, whenever production began.
 */
#include "loader_int.h"

#include <errno.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mml/fetch_sync.h"
#include "mml/options.h"
#include "mml/message.h"
#include "mml/s3.h"

static void start_or_fail_locked(mml_loader *L);

/* ------------------------------------------------------------------------------------ */
/* small helpers and the plan                                                           */

static void deadline_after(struct timespec *ts, double s) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  time_t whole = (time_t)s;
  long ns = (long)((s - (double)whole) * 1e9);
  ts->tv_sec += whole;
  ts->tv_nsec += ns;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

void ld_plan_at_locked(const mml_loader *L, int64_t seq, int64_t *epoch, int64_t *pos) {
  int64_t k = L->base_pos + (seq - L->base_seq);
  if (L->base_wrap) {
    *epoch = L->base_epoch;
    *pos = k;
  } else {
    *epoch = L->base_epoch + k / L->n_rank;
    *pos = k % L->n_rank;
  }
}

void ld_rebase_locked(mml_loader *L, int64_t epoch, int64_t pos, int wrap) {
  L->gen++;
  L->base_epoch = epoch;
  L->base_pos = pos;
  L->base_wrap = wrap;
  L->base_seq = L->head_seq;
  L->next_seq = L->head_seq;
  L->place_held = 0;
  for (int i = 0; i < L->window; i++) {
    task *t = &L->tasks[i]; /* a queued or running decode empties its slot itself */
    if (t->state == SLOT_DONE || (t->state == SLOT_PLANNED && t->dec == DEC_NONE)) {
      ld_task_give_back_locked(L, t); /* its media bytes, now, not at its next read: A11 */
      t->state = SLOT_EMPTY;
    } else if (t->dec == DEC_QUEUED) {
      ld_admit_scratch_drop_locked(L, t); /* its decode's charge, now (loader_admit.c D3) */
    }
  }
  ld_work_wake(L, 1);
}

/* The engine-side start of a cursor: an epoch that is complete starts the next one. */
static void normalize_cursor(const mml_loader *L, const mml_cursor *c, mml_cursor *out, int *wrap) {
  *out = *c;
  *wrap = 0;
  int done = L->per_epoch >= 0 ? c->batch_in_epoch >= L->per_epoch : c->pos >= L->n_rank;
  if (done) {
    out->epoch = c->epoch + 1;
    out->pos = 0;
    out->batch_in_epoch = 0;
  } else if (c->pos >= L->n_rank) {
    *wrap = 1;
  }
}

void ld_count_faults_locked(mml_loader *L, uint64_t *last) {
  struct rusage ru;
  if (getrusage(RUSAGE_THREAD, &ru)) return;
  uint64_t now = (uint64_t)ru.ru_minflt;
  if (*last && now >= *last) L->faults += now - *last;
  *last = now;
}

mml_status ld_get_fetcher(mml_loader *L, mml_fetcher **out, mml_err *err) {
  pthread_mutex_lock(&L->mu);
  if (!L->fetcher && L->fetcher_st == MML_OK)
    L->fetcher_st = mml_fetcher_new(&L->cfg.fetch, &L->fetcher, &L->fetcher_err);
  mml_status st = L->fetcher_st;
  if (st) *err = L->fetcher_err;
  *out = L->fetcher;
  pthread_mutex_unlock(&L->mu);
  return st;
}

static int has_glob(const char *s) { return strpbrk(s, "*?[") != NULL; }

/* A remote shard is streamed into the index in ranged GETs of INDEX_CHUNK bytes (a
 * shorter reply is the end), so indexing holds one chunk, never the object; except that
 * without max_memory the text of remote shards is kept, up to SHARD_KEEP bytes in all
 * (L->shard_text, read-only once built), so a sample's record is copied from it instead of
 * costing a GET round trip before its images' GETs (issue 15).  The kept bytes are the
 * ones the index was built from: records never mix two versions of an object. */
enum { INDEX_CHUNK = 8 << 20 };
#define SHARD_KEEP ((int64_t)64 << 20)

/* Keeps `body` (the bytes at `off` of the shard being scanned) in *keep while the kept
 * text of all shards stays within SHARD_KEEP; else drops *keep for good (*keep_on = 0). */
static void keep_chunk(mml_loader *L, mml_bytes *keep, int *keep_on, const mml_bytes *body) {
  if (!*keep_on) return;
  if (L->shard_text_bytes + (int64_t)keep->len + (int64_t)body->len > SHARD_KEEP ||
      mml_bytes_append(keep, body->data, body->len)) {
    mml_bytes_free(keep);
    *keep_on = 0;
  }
}

/* Stores the kept text of shard k (owned by L from here, freed with it). */
static mml_status store_text(mml_loader *L, int k, mml_bytes *keep, mml_err *err) {
  if (k >= L->shard_text_cap) {
    int nc = k + 8;
    mml_bytes *p = realloc(L->shard_text, (size_t)nc * sizeof *p);
    if (!p) return mml_err_set(err, MML_ENOMEM, "out of memory building the loader");
    memset(p + L->shard_text_cap, 0, (size_t)(nc - L->shard_text_cap) * sizeof *p);
    L->shard_text = p, L->shard_text_cap = nc;
  }
  L->shard_text[k] = *keep;
  L->shard_text_bytes += (int64_t)keep->len;
  *keep = (mml_bytes){0};
  return MML_OK;
}

/* A remote shard is as large as its server declares, within max_shard_bytes, and stays
 * so while it is scanned: an endless object (206 to every range, issue 29) is refused at
 * its first chunk instead of being streamed until a limit.  *size: the size the first
 * chunk declared (-1 before it). */
static mml_status remote_size_check(const mml_loader *L, const char *path, int64_t off,
                                    const mml_bytes *body, int64_t total, int64_t *size,
                                    mml_err *err) {
  int64_t max = L->cfg.max_shard_bytes;
  if (total < 0 && body->len == INDEX_CHUNK)
    return mml_err_set(err, MML_EFETCH,
                       "data shard %s: the server does not declare the object's size (a 206 "
                       "with Content-Range: bytes a-b/*, or a 200 without Content-Length), so "
                       "its end is unknown (an endless object?); refused",
                       path);
  if (total > max && max > 0)
    return mml_err_set(err, MML_EFETCH,
                       "data shard %s: the server declares %lld bytes, above max_shard_bytes=%lld",
                       path, (long long)total, (long long)max);
  if (*size >= 0 && total >= 0 && total != *size)
    return mml_err_set(err, MML_EFETCH,
                       "data shard %s: its size changed while it was indexed (%lld bytes, then "
                       "%lld at byte %lld)",
                       path, (long long)*size, (long long)total, (long long)off);
  if (*size < 0) *size = total >= 0 ? total : INT64_MAX;
  return MML_OK;
}

/* A remote Parquet file's ranged reads (mml_pq_read_fn): exactly the bytes asked for, of
 * an object whose size stays what it was. */
typedef struct remote_pq {
  const mml_loader *L;
  mml_fetcher *f;
  const char *path;
  int64_t size;
} remote_pq;

static mml_status remote_pq_read(void *ctx, int64_t off, int64_t len, mml_bytes *out,
                                 mml_err *err) {
  remote_pq *r = ctx;
  int64_t total;
  mml_status st = mml_fetch_get_sized(r->f, r->path, off, len, out, &total, err);
  if (st) return mml_err_prefix(err, "data shard %s", r->path), st;
  if ((st = remote_size_check(r->L, r->path, off, out, total, &r->size, err))) return st;
  if ((int64_t)out->len != len)
    return mml_err_set(err, MML_EFETCH,
                       "data shard %s: a ranged read of %lld bytes at byte %lld returned %lld",
                       r->path, (long long)len, (long long)off, (long long)out->len);
  return MML_OK;
}

static int is_parquet_name(const char *path) {
  size_t n = strlen(path);
  return n > 8 && !strcmp(path + n - 8, ".parquet");
}

/* A Parquet shard over HTTP(S)/S3: its size from a first 4-byte read, then row group by
 * row group (mml_index_add_parquet): never the whole object for a few rows. */
static mml_status scan_remote_parquet(mml_loader *L, mml_fetcher *f, const char *path,
                                      mml_err *err) {
  remote_pq r = {L, f, path, -1};
  mml_bytes head = {0};
  int64_t total = -1;
  mml_status st = mml_fetch_get_sized(f, path, 0, 4, &head, &total, err);
  if (st) mml_err_prefix(err, "data shard %s", path);
  if (!st) st = remote_size_check(L, path, 0, &head, total, &r.size, err);
  if (!st && total < 0)
    st = mml_err_set(err, MML_EFETCH, "data shard %s: the server does not declare its size", path);
  mml_bytes_free(&head);
  if (!st) st = mml_index_add_parquet(&L->ix, path, r.size, remote_pq_read, &r, err);
  return st;
}

static mml_status scan_shard(mml_loader *L, const char *path, mml_err *err) {
  mml_layout layout = (mml_layout)L->cfg.data_format;
  if (!mml_path_is_remote(path)) return mml_index_add_file(&L->ix, path, layout, err);
  mml_fetcher *f;
  mml_status st = ld_get_fetcher(L, &f, err);
  if (st) return st;
  if (layout == MML_LAYOUT_AUTO && is_parquet_name(path))
    return scan_remote_parquet(L, f, path, err);
  mml_index_builder *b;
  int k = L->ix.nshards; /* the shard mml_index_begin adds */
  if ((st = mml_index_begin(&L->ix, path, layout, &b, err))) return st;
  mml_bytes body = {0}, keep = {0};
  int keep_on = !L->cfg.max_memory;
  int64_t size = -1; /* as the server declares it */
  for (int64_t off = 0;; off += INDEX_CHUNK) {
    int64_t total;
    if ((st = mml_fetch_get_sized(f, path, off, INDEX_CHUNK, &body, &total, err))) {
      mml_err_prefix(err, "data shard %s", path);
      break;
    }
    if ((st = remote_size_check(L, path, off, &body, total, &size, err))) break;
    if ((st = mml_index_feed(b, body.data, body.len, err))) break;
    keep_chunk(L, &keep, &keep_on, &body);
    /* the end (or a server that sent it all) */
    if (body.len != INDEX_CHUNK || off + (int64_t)body.len >= size) break;
  }
  mml_bytes_free(&body);
  if (st) {
    mml_bytes_free(&keep);
    mml_index_abort(b);
    return st;
  }
  if ((st = mml_index_end(b, err)) || !keep_on || !mml_index_shard_remote(&L->ix.shards[k]))
    mml_bytes_free(&keep); /* a compressed shard is read from its decompressed copy */
  else
    st = store_text(L, k, &keep, err);
  return st;
}

/* A shard from its dataset index when it has one (no scan), else scanned. */
static mml_status add_shard(mml_loader *L, const char *path, mml_err *err) {
  mml_dsx *pending;
  int added;
  mml_status st = ld_index_open(L, path, &pending, &added, err);
  if (st || added) return st;
  st = scan_shard(L, path, err);
  if (pending) {
    if (!st) return ld_index_attach(L, pending, err);
    mml_dsx_free(pending);
    free(pending);
  }
  return st;
}

mml_status ld_add_data(mml_loader *L, const char *path, mml_err *err) {
  if (!(mml_path_is_remote(path) && !strncmp(path, "s3://", 5) && has_glob(path)))
    return add_shard(L, path, err);
  /* s3://bucket/prefix*glob: the fetcher lists up to the first wildcard, matches the key */
  mml_fetcher *f;
  mml_status st = ld_get_fetcher(L, &f, err);
  if (st) return st;
  char **urls = NULL;
  size_t n = 0;
  st = mml_fetch_list(f, path, NULL, &urls, &n, err);
  if (st) return st;
  if (n == 0) st = mml_err_set(err, MML_ECONFIG, "no data shard matches %s", path);
  for (size_t i = 0; !st && i < n; i++) st = add_shard(L, urls[i], err);
  mml_fetch_list_free(urls, n);
  return st;
}

static mml_status validate(const mml_loader_cfg *c, mml_err *err) {
  if ((!c->data || c->ndata < 1) && (!c->sources || c->nsources < 1))
    return mml_err_set(err, MML_ECONFIG, "no data given");
  if (!c->tokenizer) return mml_err_set(err, MML_ECONFIG, "no tokenizer");
  /* None ("automatic") is resolved by the caller (mmloader.Loader: the CPUs it may use) */
  if (c->num_threads < 1) return mml_err_set(err, MML_ECONFIG, "num_threads must be >= 1");
  return mml_loader_cfg_check(c, err); /* the option table's bounds and cross-checks */
}

/* A zeroed C configuration's limits and deadlines: the option table's defaults. */
static void limits_defaults(mml_loader_cfg *c) {
  mml_loader_cfg_fill_zeros(c);
  c->fetch.max_object_bytes = c->max_object_bytes; /* remote images obey it too */
  /* objects of servers that ignore Range are kept whole for their ranged reads: within
   * max_memory (a quarter of it), else the fetcher's default */
  if (c->max_memory > 0) c->fetch.whole_cache_bytes = c->max_memory / 4;
}

/* The loader's own copies of the configuration's strings (credentials first: until they
 * are copied, L->cfg still points at the caller's, which mml_loader_free must not free). */
static mml_status copy_cfg_strings(mml_loader *L, const mml_loader_cfg *cfg) {
  const char *const src[] = {cfg->fetch.access_key, cfg->fetch.secret_key, cfg->fetch.session_token,
                             cfg->fetch.region, cfg->fetch.endpoint};
  const char **dst[] = {&L->cfg.fetch.access_key, &L->cfg.fetch.secret_key,
                        &L->cfg.fetch.session_token, &L->cfg.fetch.region, &L->cfg.fetch.endpoint};
  int bad = 0;
  for (size_t i = 0; i < sizeof src / sizeof *src; i++) {
    *dst[i] = src[i] ? strdup(src[i]) : NULL;
    bad |= src[i] && !*dst[i];
  }
  if (bad) return MML_ENOMEM;
  L->data = calloc((size_t)cfg->ndata, sizeof *L->data);
  if (!L->data) return MML_ENOMEM;
  for (int i = 0; i < cfg->ndata; i++)
    if (!(L->data[i] = strdup(cfg->data[i]))) return MML_ENOMEM;
  L->cfg.data = (const char *const *)L->data;
  if (cfg->image_root && cfg->image_root[0]) {
    if (!(L->image_root = strdup(cfg->image_root))) return MML_ENOMEM;
    size_t n = strlen(L->image_root);
    while (n > 1 && L->image_root[n - 1] == '/') L->image_root[--n] = 0;
  }
  L->cfg.image_root = L->image_root;
  if (cfg->index && !(L->index_dir = strdup(cfg->index))) return MML_ENOMEM;
  L->cfg.index = L->index_dir;
  if (cfg->system_prompt && !(L->system_prompt = strdup(cfg->system_prompt))) return MML_ENOMEM;
  L->cfg.system_prompt = L->system_prompt; /* kept: mml_loader_config reports it */
  return MML_OK;
}

/* The sources (their shards' index, the mixture, the rank's sampler, image roots and
 * per-source pipelines) and batches per epoch. */
static mml_status build_stream(mml_loader *L, const mml_loader_cfg *cfg, mml_err *err) {
  mml_status st = ld_build_sources(L, cfg, err);
  L->cfg.sources = NULL; /* the caller's memory: everything needed is copied */
  if (st) return st;
  L->n_rank = L->sm.n_rank;
  int mbs = cfg->collate.micro_batch_size;
  if (cfg->collate.pack || ld_plan_wanted(cfg)) { /* the plan's epochs: ld_plan_new */
    L->per_epoch = -1;
  } else {
    L->per_epoch = L->n_rank / mbs;
    if (L->per_epoch == 0)
      return mml_err_set(err, MML_ECONFIG,
                         "each rank holds %lld samples, fewer than micro_batch_size=%d",
                         (long long)L->n_rank, mbs);
  }
  return MML_OK;
}

/* The collator's settings. */
static mml_status build_pipeline(mml_loader *L, const mml_loader_cfg *cfg, mml_err *err) {
  L->ccfg = cfg->collate;
  if (cfg->plan_only) L->ccfg.mrope = 0; /* no grids to check the ids against */
  /* padded rows of Qwen's fine-tuning code: its positions (mml/collate.h rope2d); one rule
   * per loader, so a mixture mixing it with other recipes has no M-RoPE positions */
  int qft = 0, n = cfg->sources && cfg->nsources > 0 ? cfg->nsources : 1;
  for (int i = 0; i < n; i++)
    qft += (cfg->sources && cfg->nsources > 0 ? cfg->sources[i].recipe : cfg->recipe) ==
           MML_RECIPE_QWEN_VL_FINETUNE;
  if (L->ccfg.mrope && !L->ccfg.pack && !L->ccfg.flatten && qft && qft < n)
    return mml_err_set(err, MML_ECONFIG,
                       "mrope=True: padded batches' positions follow Qwen's rope2d.py for "
                       "recipe=\"qwen-vl-finetune\" and transformers' otherwise; a mixture "
                       "of %d qwen-vl-finetune and %d other sources would mix the two rules",
                       qft, n - qft);
  L->ccfg.rope2d = qft == n && !L->ccfg.pack;
  const mml_tokenizer *tok = cfg->tokenizer;
  if (L->ccfg.pad_id < 0) {
    L->ccfg.pad_id = mml_tokenizer_token_to_id(tok, "<|endoftext|>", 13);
    if (L->ccfg.pad_id < 0) L->ccfg.pad_id = 0;
  }
  L->ccfg.image_pad_id = mml_tokenizer_token_to_id(tok, "<|image_pad|>", 13);
  L->ccfg.vision_start_id = mml_tokenizer_token_to_id(tok, "<|vision_start|>", 16);
  L->ccfg.video_pad_id = mml_tokenizer_token_to_id(tok, "<|video_pad|>", 13);
  L->ccfg.second_per_grid = cfg->vision.video_family == MML_VIDEO_QWEN25;
  L->ccfg.split_video_frames = cfg->vision.video_family == MML_VIDEO_QWEN3;
  L->ccfg.spatial_merge = cfg->vision.merge_size;
  mml_vision_cfg v = cfg->vision;
  v.pixel_format = cfg->collate.pixel_format;
  L->ccfg.pixel_cols = mml_vision_pixel_cols(&v);
  L->ccfg.video_cols = mml_vision_video_cols(&v);
  if (cfg->collate.pack && L->ccfg.pack_length <= 0) L->ccfg.pack_length = cfg->collate.seq_length;
  if (cfg->max_tokens_per_batch > 0) L->ccfg.rows_dynamic = 1; /* the plan ends batches */
  return MML_OK;
}

/* The window when none is set: 2 batches, at least 4 samples a worker and 16.  Behind a
 * remote shard or image root a sample holds its slot for two round trips (record, then
 * images) before any pixel work, and the slot frees only when the sample is collated, so
 * 16 slots left the workers idle behind a 30 ms server (issue 15: ~1.1 of 2 cores busy);
 * there the window also covers the prefetch batches being decoded plus two more batches
 * being fetched, and at least 64 samples.  Only encoded bytes wait in the extra slots
 * (max_memory bounds them); the batches do not depend on the window. */
static int default_window(const mml_loader *L, const mml_loader_cfg *cfg) {
  int batch = cfg->collate.pack ? 8 : cfg->collate.micro_batch_size;
  if (batch < 1) batch = 8; /* max_tokens_per_batch alone: batches of unknown size */
  int w = 2 * batch;
  if (w < 4 * cfg->num_threads) w = 4 * cfg->num_threads;
  if (w < 16) w = 16;
  int remote = 0;
  for (int k = 0; k < L->ix.nshards && !remote; k++)
    remote = L->remote[k] || (L->roots[k] && mml_path_is_remote(L->roots[k]));
  if (!remote) return w;
  int64_t r = (int64_t)(cfg->prefetch + 2) * batch;
  if (r < 64) r = 64;
  if (r > 4096) r = 4096;
  return r > w ? (int)r : w;
}

/* Batch memory (allocator, pool, device stage), the collator instances, the pending and
 * output queues and the task window. */
static mml_status build_output(mml_loader *L, const mml_loader_cfg *cfg, mml_err *err) {
  mml_status st;
  if (cfg->allocator) {
    L->alloc = *cfg->allocator;
  } else if (cfg->pin_memory || cfg->to_device) { /* device copies read pinned buffers */
    mml_err e2;
    L->pinned = mml_pinned_allocator(&L->alloc, &e2) == MML_OK; /* else plain host memory */
    /* the trainer's device (the constructing thread's current one) for the release guard */
    L->guard_device = L->pinned ? mml_cuda_current_device() : 0;
  } else {
    mml_host_allocator(&L->alloc);
  }
  if (cfg->to_device && (st = mml_device_stage_new(cfg->device, 0, &L->stage, err))) return st;
  /* Released batch buffers stay mapped for reuse (a buffer mapped afresh costs its page
   * faults and zeroing) up to max_memory, or 2 GiB without one. */
  size_t keep = cfg->max_memory > 0 ? (size_t)cfg->max_memory : (size_t)2 << 30;
  if (cfg->max_memory > 0 &&
      cfg->max_memory < (int64_t)cfg->num_threads * MML_SCRATCH_RESERVE + ((int64_t)8 << 20))
    return mml_err_set(err, MML_ECONFIG,
                       "max_memory=%lld is below the %lld bytes %d workers' scratch and one "
                       "small batch take",
                       (long long)cfg->max_memory,
                       (long long)cfg->num_threads * MML_SCRATCH_RESERVE + (8 << 20),
                       cfg->num_threads);
  if ((st = mml_pool_new(&L->alloc, keep, &L->pool, err))) return st;
  if ((st = ld_ledger_open(L, err))) return st; /* max_memory's ledger (loader_admit.c) */
  /* Emission (building a batch's tensors, mostly copying pixels) runs on workers, one
   * batch per collator instance, so one collation thread does not cap throughput. */
  L->ncoll = 1 + cfg->num_threads / 4;
  if (L->ncoll > 8) L->ncoll = 8;
  L->colls = calloc((size_t)L->ncoll, sizeof *L->colls);
  L->coll_busy = calloc((size_t)L->ncoll, sizeof *L->coll_busy);
  L->npend = L->ncoll + 1;
  L->pend = calloc((size_t)L->npend, sizeof *L->pend);
  if (!L->colls || !L->coll_busy || !L->pend)
    return mml_err_set(err, MML_ENOMEM, "out of memory building the loader");
  for (int i = 0; i < L->ncoll; i++) {
    if ((st = mml_collator_new(&L->ccfg, L->pool, &L->colls[i], err)))
      return st == MML_EINVAL ? MML_ECONFIG : st;
  }
  L->collator = L->colls[0];

  int w = cfg->window > 0 ? cfg->window : default_window(L, cfg);
  L->window = w;
  L->tasks = calloc((size_t)w, sizeof *L->tasks);
  L->out_cap = cfg->prefetch < 8 ? cfg->prefetch : 8; /* grows up to prefetch as needed */
  L->outq = calloc((size_t)L->out_cap, sizeof *L->outq);
  /* queued batches stop at max_memory's bytes, or the 2 GiB the pool keeps without it */
  L->out_budget = cfg->max_memory > 0 ? (size_t)cfg->max_memory : (size_t)2 << 30;
  L->skips = calloc(SKIP_LOG, sizeof *L->skips);
  if (!L->tasks || !L->outq || !L->skips)
    return mml_err_set(err, MML_ENOMEM, "out of memory building the loader");
  for (int i = 0; i < w; i++) {
    L->tasks[i].L = L;
    L->tasks[i].tk = -1;
  }
  return ld_place_new(L, err);
}

mml_status mml_loader_new(const mml_loader_cfg *cfg, mml_loader **out, mml_err *err) {
  mml_loader_cfg with_limits = *cfg; /* a zeroed C cfg gets the limits' defaults */
  limits_defaults(&with_limits);
  /* pixel_format=: the dtype emitted (what collation and the vision plan see) */
  with_limits.collate.pixel_format = mml_pixels_emitted(with_limits.pixels);
  mml_status st = validate(&with_limits, err);
  if (st) return st;
  if (!with_limits.collate.micro_batch_size && !with_limits.max_tokens_per_batch)
    with_limits.collate.micro_batch_size = MML_DEFAULT_MICRO_BATCH_SIZE;
  cfg = &with_limits; /* the caller's strings, the defaults above */
  mml_loader *L = calloc(1, sizeof *L);
  if (!L) return mml_err_set(err, MML_ENOMEM, "loader: out of memory");
  L->cfg = with_limits;
  L->ix.limits = (mml_index_limits){cfg->max_shard_bytes, cfg->max_shard_records,
                                    cfg->max_record_bytes, cfg->max_object_bytes};
  pthread_mutex_init(&L->mu, NULL);
  pthread_mutex_init(&L->spare_mu, NULL);
  pthread_mutex_init(&L->coll_mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&L->work_cv, &ca);
  pthread_cond_init(&L->coll_cv, &ca);
  pthread_cond_init(&L->out_cv, &ca);
  pthread_cond_init(&L->coll_room_cv, &ca);
  pthread_condattr_destroy(&ca);
  L->closed = 1; /* until fully built: free() must not join anything */
  L->cancel.parent = cfg->cancel;
  L->ix.cancel = &L->cancel;
  L->cfg.fetch.cancel = &L->cancel; /* the fetcher's blocking calls (index, listings) */

  if (copy_cfg_strings(L, cfg)) {
    st = mml_err_set(err, MML_ENOMEM, "out of memory building the loader");
    goto fail;
  }
  if ((st = build_stream(L, cfg, err)) || (st = build_pipeline(L, cfg, err)) ||
      (st = build_output(L, cfg, err)) || (ld_plan_wanted(cfg) && (st = ld_plan_new(L, cfg, err))))
    goto fail;
  mml_cursor zero = {0, 0, 0};
  L->closed = 0;
  L->gen = 1;
  if ((st = mml_loader_seek(L, &zero, err))) goto fail;
  if (L->cfg.start == MML_START_CONSTRUCTION) { /* DESIGN "Start" */
    pthread_mutex_lock(&L->mu);
    start_or_fail_locked(L);
    pthread_mutex_unlock(&L->mu);
  }
  *out = L;
  return MML_OK;
fail:
  mml_loader_free(L);
  return st;
}

/* ------------------------------------------------------------------------------------ */
/* threads: start and stop                                                              */

static mml_status start_locked(mml_loader *L, mml_err *err) {
  if (L->started) return MML_OK;
  L->started = 1;
  ld_ledger_start_locked(L);
  L->threads = calloc((size_t)L->cfg.num_threads, sizeof *L->threads);
  if (!L->threads)
    return mml_err_set(err, MML_ENOMEM, "loader: out of memory for the worker threads");
  for (int i = 0; i < L->cfg.num_threads; i++) {
    if (pthread_create(&L->threads[i], NULL, ld_worker_main, L) != 0)
      return mml_err_set(err, MML_ENOMEM, "cannot start worker thread %d", i);
    L->nthreads_started++;
  }
  if (pthread_create(&L->coll_thread, NULL, ld_collator_main, L) != 0)
    return mml_err_set(err, MML_ENOMEM, "cannot start the collation thread");
  L->coll_started = 1;
  return MML_OK;
}

/* Starts the threads once; a failure to start them is the stream's fatal error, which the
 * consumer's next call reports (mu held). */
static void start_or_fail_locked(mml_loader *L) {
  if (L->closed || L->started) return;
  mml_err e;
  mml_err_clear(&e);
  mml_status st = start_locked(L, &e);
  if (st) ld_set_fatal_locked(L, st, &e);
}

static void stop_threads(mml_loader *L) {
  mml_cancel_set(&L->cancel); /* first: what a worker is decoding stops too */
  pthread_mutex_lock(&L->mu);
  L->stop = 1;
  ld_work_wake(L, 1);
  ld_coll_wake_locked(L, 1);
  pthread_cond_broadcast(&L->out_cv);
  ld_consumer_wake_locked(L, 1); /* C2 */
  pthread_mutex_unlock(&L->mu);
  for (int i = 0; i < L->nthreads_started; i++) pthread_join(L->threads[i], NULL);
  L->nthreads_started = 0;
  if (L->coll_started) pthread_join(L->coll_thread, NULL);
  L->coll_started = 0;
  /* Cancels outstanding fetches; their completions only touch tasks, still alive. */
  mml_fetcher_free(L->fetcher);
  L->fetcher = NULL;
}

void mml_loader_close(mml_loader *L) {
  if (!L) return;
  pthread_mutex_lock(&L->mu);
  int was = L->closed;
  L->closed = 1;
  pthread_mutex_unlock(&L->mu);
  if (was) return;
  stop_threads(L);
  pthread_mutex_lock(&L->mu);
  ld_drop_output_locked(L);
  pthread_mutex_unlock(&L->mu);
}

/* What one window slot owns (its reads' charges are out of the ledger: mml_loader_free). */
static void task_free(mml_loader *L, task *t) {
  mml_sample_free(&t->sample);
  mml_bytes_free(&t->rec_bytes);
  ld_pq_row_free(&t->pqrow);
  if (t->rec_parsed) mml_record_free(&t->rec);
  for (int j = 0; j < t->imgs_cap; j++) mml_bytes_free(&t->imgs[j]);
  free(t->imgs);
  free(t->rc); /* its reads' charges, out of the ledger (mml_loader_free) */
  free(t->refs);
  free(t->plans);
  ld_task_close_videos(L, t);
  free(t->vinfo);
  free(t->vplans);
  free(t->vids);
  for (int v = 0; t->vhead && v < t->vcap; v++) {
    mml_bytes_free(&t->vhead[v].first);
    mml_bytes_free(&t->vhead[v].tail);
  }
  free(t->vhead);
  ld_place_clear(t);
  mml_bytes_free(&t->path);
}

void mml_loader_free(mml_loader *L) {
  if (!L) return;
  mml_loader_close(L);
  ld_ledger_assert_quiet(L);    /* the threads are joined: a debug build checks A6 */
  mml_fetcher_free(L->fetcher); /* a fetcher created while building the index */
  L->fetcher = NULL;
  if (L->outq) {
    for (int i = 0; i < L->out_cap; i++) mml_batch_clear(&L->outq[i].batch);
    free(L->outq);
  }
  if (L->tasks && L->ledger) { /* R5: the reads' charges leave the ledger before they are
                                * freed (ticket_drop below still runs its grant step) */
    pthread_mutex_lock(&L->mu);
    for (int i = 0; i < L->window; i++) {
      ld_admit_read_drop_locked(L, &L->tasks[i]);
      ld_admit_scratch_drop_locked(L, &L->tasks[i]); /* loader_admit.c D3 */
      ld_admit_reads_settle_locked(L, &L->tasks[i], 0);
    }
    pthread_mutex_unlock(&L->mu);
  }
  if (L->tasks) {
    for (int i = 0; i < L->window; i++) task_free(L, &L->tasks[i]);
    ld_bytes_free_spares(L);
    free(L->tasks);
  }
  free(L->skips);
  free(L->threads);
  if (L->pend) {
    for (int i = 0; i < L->npend; i++) mml_batch_clear(&L->pend[i].it.batch);
    free(L->pend);
  }
  if (L->colls)
    for (int i = 0; i < L->ncoll; i++)
      if (L->colls[i]) mml_collator_free(L->colls[i]);
  free(L->colls);
  free(L->coll_busy);
  ld_place_free(L);
  mml_device_stage_free(L->stage); /* waits for queued copies */
  ld_ledger_unhook(L);
  mml_pool_close(L->pool);
  ld_ledger_free(L);
  ld_plan_free(L);
  ld_free_sources(L); /* before the index: roots are per shard */
  ld_index_free(L);
  ld_pq_cache_free(L); /* before the index: its handles are clones of the shards' */
  for (int k = 0; k < L->shard_text_cap; k++) mml_bytes_free(&L->shard_text[k]);
  free(L->shard_text);
  mml_index_free(&L->ix);
  free(L->index_dir);
  if (L->data)
    for (int i = 0; i < L->cfg.ndata; i++) free(L->data[i]);
  free(L->data);
  free(L->image_root);
  free(L->system_prompt);
  free((char *)L->cfg.fetch.access_key);
  free((char *)L->cfg.fetch.secret_key);
  free((char *)L->cfg.fetch.session_token);
  free((char *)L->cfg.fetch.region);
  free((char *)L->cfg.fetch.endpoint);
  pthread_cond_destroy(&L->work_cv);
  pthread_cond_destroy(&L->coll_cv);
  pthread_cond_destroy(&L->out_cv);
  pthread_cond_destroy(&L->coll_room_cv);
  pthread_mutex_destroy(&L->coll_mu);
  pthread_mutex_destroy(&L->spare_mu);
  pthread_mutex_destroy(&L->mu);
  free(L);
}

/* ------------------------------------------------------------------------------------ */
/* consumer API                                                                         */

void mml_loader_set_consumer_stream(mml_loader *L, int device, uintptr_t stream) {
  L->consumer_device = device;
  L->consumer_stream = stream;
}

int64_t mml_loader_num_samples(const mml_loader *L) { return L->ix.n; }
int64_t mml_loader_samples_per_rank(const mml_loader *L) { return L->n_rank; }
int64_t mml_loader_batches_per_epoch(const mml_loader *L) { return L->per_epoch; }
uint64_t mml_loader_data_hash(const mml_loader *L) { return mml_index_hash(&L->ix); }
const mml_loader_cfg *mml_loader_config(const mml_loader *L) { return &L->cfg; }

/* Every field of a cursor against this loader's stream, each failure naming its field.
 * A cursor is {epoch, 0, 0} (an epoch's start) or what follows a delivered batch, so:
 * epoch in [0, MML_MAX_EPOCH]; batch_in_epoch 0 means pos 0.  Padded mode: batch_in_epoch
 * <= batches per epoch; its b batches hold b * mbs samples, so pos >= b * mbs; a pass over
 * the rank's n samples yields at least one good sample (else the epoch fails), so
 * pos < (b * mbs + 1) * n.  Packed mode: pos <= n and b <= pos (a pack holds a sample). */
static mml_status check_cursor(const mml_loader *L, const mml_cursor *c, mml_err *err) {
  const long long e = c->epoch, p = c->pos, b = c->batch_in_epoch, n = L->n_rank;
  if (e < 0 || e > MML_MAX_EPOCH)
    return mml_err_set(err, MML_ESTATE, "state field epoch=%lld is outside [0, %lld]", e,
                       (long long)MML_MAX_EPOCH);
  long long bmax = L->per_epoch >= 0 ? L->per_epoch : n;
  if (b < 0 || b > bmax)
    return mml_err_set(err, MML_ESTATE,
                       "state field batch_in_epoch=%lld is outside [0, %lld] (%s of this rank)", b,
                       bmax, L->per_epoch >= 0 ? "batches per epoch" : "samples");
  long long pmax = n; /* packed */
  if (L->per_epoch >= 0) {
    const long long mbs = L->cfg.collate.micro_batch_size;
    pmax = (b * mbs + 1) * n - 1;
    if (p >= 0 && p < b * mbs)
      return mml_err_set(err, MML_ESTATE,
                         "state fields batch_in_epoch=%lld and pos=%lld disagree: %lld batches "
                         "of %lld samples take at least %lld positions",
                         b, p, b, mbs, b * mbs);
  } else if (p >= 0 && b > p) {
    return mml_err_set(err, MML_ESTATE,
                       "state fields batch_in_epoch=%lld and pos=%lld disagree: a pack holds at "
                       "least one sample",
                       b, p);
  }
  if (b == 0) pmax = 0;
  if (p < 0 || p > pmax)
    return mml_err_set(err, MML_ESTATE,
                       "state field pos=%lld is outside [0, %lld] for batch_in_epoch=%lld (this "
                       "rank holds %lld samples)",
                       p, pmax, b, n);
  return MML_OK;
}

/* 1 when cursor c (a batch's `after`) is at the end of its epoch: the padded epoch's
 * batches are all out, or its positions (this rank's plan's) are all consumed. */
static int epoch_end_locked(mml_loader *L, const mml_cursor *c) {
  if (L->per_epoch >= 0) return L->per_epoch > 0 && c->batch_in_epoch >= L->per_epoch;
  if (L->gp) return c->pos >= ld_plan_rank_len_locked(L, c->epoch);
  return c->pos >= L->n_rank;
}

mml_status mml_loader_seek(mml_loader *L, const mml_cursor *c, mml_err *err) {
  return mml_loader_seek_ahead(L, c, 0, err);
}

mml_status mml_loader_seek_ahead(mml_loader *L, const mml_cursor *c, int64_t ahead, mml_err *err) {
  mml_status st = check_cursor(L, c, err);
  if (st) return st;
  pthread_mutex_lock(&L->mu);
  if (L->closed) {
    pthread_mutex_unlock(&L->mu);
    return mml_err_set(err, MML_ECLOSED, "the loader is closed");
  }
  mml_cursor start;
  int wrap;
  normalize_cursor(L, c, &start, &wrap);
  L->start = start;
  ld_rebase_locked(L, start.epoch, start.pos, wrap);
  L->limit_seq = ahead > 0 ? L->head_seq + ahead : -1;
  /* pending work of the old plan is abandoned; the ready list keeps its tasks until a
   * worker drops them (their gen is old) */
  ld_drop_output_locked(L);
  L->skip_count = 0; /* composed, never delivered */
  L->fatal = MML_OK;
  L->consumer_epoch = c->epoch;
  L->delivered = *c;
  L->epoch_done = !L->cfg.cycle && epoch_end_locked(L, c);
  ld_ask_epoch_locked(L, c->epoch, 1);
  ld_coll_wake_locked(L, 1);
  pthread_mutex_unlock(&L->mu);
  return MML_OK;
}

void mml_loader_describe_wait(mml_loader *L, mml_err *err) {
  pthread_mutex_lock(&L->mu);
  const task *t = L->tasks ? &L->tasks[L->head_seq % L->window] : NULL;
  if (!L->started || !t) {
    mml_err_set(err, MML_ETIMEDOUT, "waiting for the loader's threads to start");
  } else if (L->fatal || L->out_count) {
    mml_err_set(err, MML_ETIMEDOUT, "waiting on the output queue");
  } else if (t->state != SLOT_BUSY || t->stage == STAGE_NEW || t->gen != L->gen) {
    mml_err_set(
        err, MML_ETIMEDOUT, "waiting on sample %lld of the stream (%s)", (long long)t->seq,
        t->state == SLOT_DONE ? "done, being composed"
        : t->state == SLOT_PLANNED
            ? (t->dec == DEC_RUNNING ? "planned, being decoded" : "planned, waiting to be decoded")
            : "starting");
  } else {
    /* shard, line and images were written before the fetches were submitted (under mu) */
    char where[1100], what[400] = "being decoded";
    const mml_sample *s = &t->sample;
    mml_index_name_sample(&L->ix, s->shard, s->index, s->line, where, sizeof where);
    if (t->pending > 0 && t->stage == STAGE_RECORD) {
      snprintf(what, sizeof what, "fetching its record");
    } else if (t->pending > 0 && t->stage == STAGE_VIDEOS) {
      snprintf(what, sizeof what, "fetching the frames of its video(s)");
    } else if (t->pending > 0 && t->rec_parsed) {
      int first = -1, n = 0;
      for (int i = 0; i < t->rec.nimages; i++)
        if (t->imgs[i].len == 0) n++, first = first < 0 ? i : first;
      char ref[MML_SHORT_CAP(200)];
      if (first >= 0)
        snprintf(what, sizeof what, "fetching %d image(s), first image %s", n,
                 mml_text_short(t->rec.images[first], strlen(t->rec.images[first]), 200, ref,
                                sizeof ref));
    }
    mml_err_set(err, MML_ETIMEDOUT, "waiting on sample %s: %s, for %.1f s", where, what,
                mml_now() - t->started);
  }
  pthread_mutex_unlock(&L->mu);
}

mml_cursor mml_loader_cursor(const mml_loader *L) {
  pthread_mutex_lock((pthread_mutex_t *)&L->mu);
  mml_cursor c = L->delivered;
  pthread_mutex_unlock((pthread_mutex_t *)&L->mu);
  return c;
}

/* The consumer is about to wait with nothing of its epoch left anywhere (nothing queued,
 * pending or being emitted, and the collator past the epoch): it waits for the next
 * epoch's first item, so that epoch is asked for. */
int ld_consumer_would_ask_locked(mml_loader *L) {
  if (L->out_count || L->pend_head < L->pend_tail || L->emitting || L->jobs_queued) return 0;
  int64_t e, p;
  ld_plan_at_locked(L, L->head_seq, &e, &p);
  return e > L->consumer_epoch && L->consumer_epoch + 1 > L->asked_epoch;
}

static void ask_when_waiting_locked(mml_loader *L) {
  if (ld_consumer_would_ask_locked(L)) ld_ask_epoch_locked(L, L->consumer_epoch + 1, 0);
}

/* The consumer takes the next queued item (out_count > 0): a batch into *out (MML_OK), or
 * a sample error (its status, into *err). */
static mml_status take_item_locked(mml_loader *L, mml_batch *out, mml_err *err) {
  out_item item;
  ld_out_pop_locked(L, &item);
  ld_move_ready_locked(L);                       /* room for the next finished item */
  if (L->mem_blocked) ld_coll_wake_locked(L, 1); /* and for a ticket's pixels */
  out_item *it = &item;
  if (it->kind == ITEM_ERROR) {
    ld_release_oldest_skip_locked(L); /* the oldest logged skip is this sample */
    if (err) *err = it->err;
    return it->err.status ? it->err.status : MML_EINTERNAL;
  }
  *out = it->batch;
  if (L->pinned && !L->stage) { /* no reuse before the consumer's default-stream copies */
    mml_err e2;
    mml_device_guard_pinned(out, L->guard_device, 0, &e2);
    if (L->consumer_stream)
      mml_device_guard_pinned(out, L->consumer_device, L->consumer_stream, &e2);
  }
  L->consumer_epoch = out->after.epoch;
  L->delivered = out->after;
  if (epoch_end_locked(L, &out->after)) { /* cycle: no end, the next epoch goes on */
    if (L->cfg.cycle)
      ld_ask_epoch_locked(L, out->after.epoch + 1, 0);
    else
      L->epoch_done = 1;
  }
  ld_release_skips_locked(L, out->after.epoch, out->after.pos);
  L->batches++;
  if (L->batches == (uint64_t)MML_FAULT_WARMUP(L->cfg.prefetch)) L->faults_warm = L->faults;
  L->real_tokens += out->real_tokens;
  L->token_slots += out->token_slots;
  return MML_OK;
}

/* next()'s wait, mu held (released while it waits): 0 when woken, ETIMEDOUT.  With
 * max_memory (M5: ledger.c L7, loader_admit.c C1-C3) it waits by the ledger's consumer
 * count, read under mu before the look (`seen`); its wait is declared only while none of
 * the engine's work runs without credit (C2), and only when nothing ended since the look;
 * every end of ENGINE work ends the declaration and wakes it, and so does every event it
 * waits for (a batch queued, an error, a close), so it looks and declares again, with no
 * lost wakeup and no polling.  Without, on out_cv. */
static int consumer_wait_locked(mml_loader *L, uint64_t seen, const struct timespec *dl) {
  if (!L->ledger)
    return dl ? pthread_cond_timedwait(&L->out_cv, &L->mu, dl)
              : pthread_cond_wait(&L->out_cv, &L->mu);
  const int declare = ld_admit_engine_idle_locked(L);
  /* loader_admit.c W2: what keeps it from declaring may be the collator's to ask anew (a
   * ticket charge's stale hold, an open pack's bound: C3), at its next look */
  if (!declare && L->mem_blocked) ld_coll_wake_locked(L, 1);
  mml_ledger_consumer_behind(L->ledger, declare ? ld_admit_behind_locked(L) : 0); /* C7 */
  L->consumer_waits++;
  pthread_mutex_unlock(&L->mu);
  const int woken = mml_ledger_consumer_wait(L->ledger, seen, declare, dl);
  pthread_mutex_lock(&L->mu);
  return woken ? 0 : ETIMEDOUT;
}

mml_status mml_loader_next(mml_loader *L, mml_batch *out, double timeout_s, mml_err *err) {
  double t0 = mml_now();
  double handed = 0; /* the batch taken: when it was handed off for emission */
  int waited = 0;
  struct timespec dl;
  if (timeout_s >= 0) deadline_after(&dl, timeout_s);
  mml_status st;
  pthread_mutex_lock(&L->mu);
  if (L->first_next == 0) L->first_next = t0;
  start_or_fail_locked(L);
  if (!L->epoch_done) ld_ask_epoch_locked(L, L->consumer_epoch, 0);
  for (;;) {
    /* C1: the consumer's count before the look (ledger.c L7 with L11) */
    const uint64_t seen = L->ledger ? mml_ledger_consumer_changes(L->ledger) : 0;
    if (L->closed) {
      st = mml_err_set(err, MML_ECLOSED, "the loader is closed");
      break;
    }
    if (L->epoch_done) { /* its last batch was delivered: no need to wait for the next one */
      L->epoch_done = 0;
      L->consumer_epoch++;
      L->delivered = (mml_cursor){L->consumer_epoch, 0, 0};
      ld_release_skips_locked(L, L->consumer_epoch, 0);
      st = MML_EEND;
      break;
    }
    if (L->out_count) {
      out_item *it = &L->outq[L->out_head];
      if (!L->cfg.cycle && it->epoch > L->consumer_epoch) {
        L->consumer_epoch = it->epoch;
        L->delivered = (mml_cursor){it->epoch, 0, 0};
        ld_release_skips_locked(L, it->epoch, 0);
        st = MML_EEND;
        break;
      }
      handed = it->kind == ITEM_BATCH ? it->handed : 0;
      st = take_item_locked(L, out, err);
      break;
    }
    if (L->fatal) {
      ld_release_skips_locked(L, INT64_MAX, 0); /* the stream stops here: report them all */
      if (err) *err = L->fatal_err;
      st = L->fatal;
      break;
    }
    ask_when_waiting_locked(L);
    L->consumer_waiting = 1; /* max_memory: what the consumer holds cannot be released */
    /* W5: the workers' waits for room are bounded now (not the consumer's own poke: C2) */
    ld_room_gates_wake_workers_locked(L);
    waited = 1;
    const int rc = consumer_wait_locked(L, seen, timeout_s < 0 ? NULL : &dl);
    L->consumer_waiting = 0;
    if (rc == ETIMEDOUT) {
      st = MML_ETIMEDOUT;
      break;
    }
  }
  const double t1 = mml_now();
  L->wait_s += t1 - t0;
  if (waited && handed > 0) /* the part after its batch was composed: its emission's */
    L->wait_emit_s += t1 - (handed > t0 ? handed : t0);
  pthread_mutex_unlock(&L->mu);
  return st;
}

int mml_loader_take_warnings(mml_loader *L, mml_err *out, int max) {
  pthread_mutex_lock(&L->mu);
  int n = 0;
  while (n < max && L->warn_count) {
    out[n++] = L->warn[L->warn_head];
    L->warn_head = (L->warn_head + 1) % WARN_BACKLOG;
    L->warn_count--;
  }
  pthread_mutex_unlock(&L->mu);
  return n;
}

mml_status mml_loader_check_memory(mml_loader *L, mml_err *err) {
  pthread_mutex_lock(&L->mu);
  const mml_status st = ld_ledger_check_locked(L, err);
  pthread_mutex_unlock(&L->mu);
  return st;
}

/* max_memory's waits and re-reads (loader_admit.c W2, W4, C2, READ AGAIN), mu held. */
static void waits_stats_locked(const mml_loader *L, mml_loader_stats *o) {
  o->samples_reread = L->samples_reread;
  o->reads_restarted_again = L->reads_restarted_again;
  o->room_waits = L->room_waits;
  o->consumer_waits = L->consumer_waits;
  o->collator_room_waits = L->collator_room_waits;
}

void mml_loader_get_stats(mml_loader *L, mml_loader_stats *o) {
  mml_loader_get_stats_all(L, o, NULL, 0);
}

void mml_loader_get_stats_all(mml_loader *L, mml_loader_stats *o, mml_source_stats *src, int nsrc) {
  memset(o, 0, sizeof *o);
  if (nsrc > L->nsrc) nsrc = L->nsrc;
  if (nsrc < 0 || !src) nsrc = 0;
  ld_sources_fixed(L, src, nsrc); /* the data hash reads the index: outside mu */
  pthread_mutex_lock(&L->mu);
  for (int i = 0; i < nsrc; i++) ld_source_counts_locked(L, i, &src[i]);
  o->wait_s = L->wait_s;
  o->wait_emit_s = L->wait_emit_s;
  o->wall_s = L->first_next > 0 ? mml_now() - L->first_next : 0;
  o->read_s = L->read_s;
  o->vision_s = L->vision_s;
  o->decode_s = L->decode_s;
  o->text_s = L->text_s;
  o->collate_s = L->collate_s;
  o->queue_depth = L->out_count;
  o->prefetch = L->cfg.prefetch;
  o->window = L->window;
  o->in_flight = L->in_flight;
  o->num_threads = L->cfg.num_threads;
  o->samples = L->samples;
  o->good_samples = L->good;
  o->skipped = L->skipped;
  o->batches = L->batches;
  o->bytes_read = L->bytes_read;
  o->images = L->images;
  o->real_tokens = L->real_tokens;
  o->token_slots = L->token_slots;
  for (int s = 0; s < MML_STATUS_COUNT; s++) {
    if (!L->skip_by_status[s]) continue;
    const char *r = mml_status_skip_reason((mml_status)s);
    if (!r) r = "other";
    int k = 0;
    while (k < o->nreasons && strcmp(o->reason[k], r)) k++;
    if (k == o->nreasons) {
      if (k == MML_MAX_REASONS) continue;
      o->reason[k] = r;
      o->nreasons++;
    }
    o->reason_count[k] += L->skip_by_status[s];
  }
  o->page_faults = L->faults;
  o->window_bytes = L->win_bytes + ld_bytes_spares(L);
  uint64_t warm = MML_FAULT_WARMUP(L->cfg.prefetch);
  o->page_faults_per_batch =
      L->batches > warm ? (double)(L->faults - L->faults_warm) / (double)(L->batches - warm) : -1;
  o->moved_rows = L->moved_rows;
  o->expanded_rows = L->expanded_rows;
  o->expanded_inplace_rows = L->inplace_rows;
  o->expanded_shared_rows = L->shared_rows;
  o->video_plan_waits = __atomic_load_n(&L->video_plan_waits, __ATOMIC_RELAXED);
  o->video_decode_waits = __atomic_load_n(&L->video_decode_waits, __ATOMIC_RELAXED);
  o->video_preload_peak = L->video_held_peak;
  o->video_preloads_refused = L->video_preloads_refused;
  o->video_open_peak = L->video_open_peak;
  waits_stats_locked(L, o);
  o->pinned = L->pinned;
  o->device = L->stage ? mml_device_stage_device(L->stage) : -1;
  mml_fetcher *f = L->fetcher; /* freed only by close, on this (the consumer's) thread */
  pthread_mutex_unlock(&L->mu);
  o->remote = f != NULL;
  if ((o->parquet = L->pqc != NULL)) {
    ld_pq_stats ps;
    ld_pq_cache_stats(L, &ps);
    o->pq_row_groups = ps.row_groups_decoded;
    o->pq_bytes_read = ps.bytes_read;
    o->pq_cache_bytes = ps.cache_bytes;
    o->pq_cache_peak = ps.cache_peak_bytes;
    o->pq_cache_room = ps.cache_room;
  }
  mml_pool_usage(L->pool, &o->pool_cached, &o->pool_live);
  mml_pool_peaks(L->pool, &o->pool_live_peak, &o->pool_peak);
  o->memory_peak = ld_ledger_peak(L);
  mml_mapped_usage(&o->scratch_mapped, &o->scratch_mapped_peak);
  /* outside mu: the fetcher's I/O thread takes mu in completions (lock order) */
  if (f) mml_fetch_get_stats(f, &o->fetch);
}
