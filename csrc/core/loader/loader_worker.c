/*
 * loader_worker.c — the loader's worker threads and the per-sample task.
 *
 * A worker (num_threads of them) first emits a finished batch if one is queued, else
 * expands a chunk of the batch being emitted while the output queue is empty
 * (loader_expand.c), else decodes a placed sample (the decode queue, in order; under
 * max_memory a decode whose images need scratch beyond the worker's reserve first takes
 * that room: its charge waits in the ledger meanwhile, loader_admit.c D1), else takes a ready task (remote bytes arrived), else dispatches the
 * next seq if it lies in the window and its slot is free; it runs the task as far as it
 * can without waiting and marks the slot DONE when the sample is finished (good or
 * failed).  A worker with nothing it may take for want of room waits until a room gate's
 * input changes (loader_admit.c W5).
 *
 * The task is three stages, each a function: the record's bytes (read, copied from the
 * remote shard's text kept at indexing (loader.c scan_shard), or fetched),
 * the parsed record and its images' bytes (read, fetched, or decoded from a data: URI
 * right here), the sample planned from them (image headers, grids, token counts, ids,
 * labels: mml_sample_plan) -> slot PLANNED.  Video files are opened and probed there
 * (ld_probe_videos: frame count, rate, size; nothing decoded) and kept open, idle, for the
 * decode (t->vids; closed and reopened only past MML_VIDEOS_KEPT_OPEN), so a file's
 * container is read once per sample (an mkv/webm/avi's packet pass included).  No pixel
 * work happens there: the planner (loader_place.c) puts the sample into its batch and
 * queues its decode with its destinations, its slices of the batch's pixel_values and
 * pixel_values_videos buffers; a worker then decodes its images and its videos straight
 * there (decode_task) -> slot DONE.  Text-only and failed samples are DONE at once.
 * Video files are read by path, by ranged reads through the fetcher (http(s), s3), or
 * from the bytes of their WebDataset member (read or fetched with the images).  No worker
 * waits on a round trip for a remote file in the usual case: its HEAD and first block
 * (MML_VIDEO_BLOCK: an mp4's moov when it comes first, a small file whole) are fetched with
 * the record's images (ld_head_video), and an mp4 whose index is not all in that block (at
 * the end past the mdat, or longer) has the bytes holding it fetched next, exactly, from
 * the top-level box sizes (ld_tail_video), so its open and probe in the plan stage read memory;
 * once the sample is planned, the exact byte ranges of the packets its kept frames need
 * (from an mp4/mov's sample index, or the packets an mkv/webm/avi's probe met) are
 * submitted (ld_preload_videos, STAGE_VIDEOS) and the task waits, holding no thread, until
 * they are in; only then is it PLANNED, so its decode reads them from memory.  What still
 * waits is counted: video_plan_waits (an mp4 index with no room to fetch it ahead, the
 * packet pass over a bigger mkv/webm/avi), video_decode_waits (a decode not preloaded).
 * Those bytes fetched ahead (first blocks until the probe, preloaded packets until the
 * decode) are the task's (vhead_bytes, vpre_bytes), counted in max_memory with its other
 * byte buffers; under max_memory each is fetched only when it fits beside the next batch's
 * buffer and all together stay within a quarter of it (video_reserve_locked), else it is
 * read when needed, as without.  A video kept open (idle: demuxer state and frame tables,
 * its decoder closed: mml_video_held_bytes) counts too, from its probe until its decode
 * ends; one without room is closed and opened again by its decode.
 * A stage that submitted fetches leaves the task waiting: it holds no thread, and the
 * fetch completion (the fetcher's I/O thread, on_fetch) puts it on the ready list when
 * the last one arrives.  While fetches are outstanding a failure is only recorded
 * (task_defer_error) and the task fails once the last completion re-queues it; otherwise
 * the failure ends the task at once (task_fail names shard and line).
 *
 * Locking: `pending`, `fetch_st`/`fetch_err` and the ready list are guarded by the
 * loader's mu; everything else in the task belongs to whoever holds the BUSY slot.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "loader_int.h"
#include "mml/datauri.h"
#include "mml/fetch_sync.h"
#include "mml/message.h"

void ld_ready_push_locked(mml_loader *L, task *t) {
  t->next_ready = NULL;
  if (L->ready_tail)
    L->ready_tail->next_ready = t;
  else
    L->ready_head = t;
  L->ready_tail = t;
  ld_work_wake(L, 0);
}

void ld_task_give_back_locked(mml_loader *L, task *t) {
  ld_admit_read_drop_locked(L, t);       /* R4 */
  ld_admit_scratch_drop_locked(L, t);    /* D3 */
  ld_admit_reads_settle_locked(L, t, 0); /* R5: no decode will read them: final */
  ld_task_close_videos(L, t);
  ld_task_release_videos_locked(L, t);
  ld_bytes_return_locked(L, t); /* into the spares: a cache, evicted before anyone waits */
}

/* Prefixes err with media item i of rec: an image or frame (mml_record_media_ref), else
 * the member video nmedia + v. */
static void ld_err_media(mml_err *err, const mml_record *rec, int i) {
  const char *ref = mml_record_media_ref(rec, i);
  if (ref) {
    mml_sample_err_image(err, ref);
    return;
  }
  int v = i - rec->nimages - mml_record_frames(rec);
  if (v >= 0 && v < rec->nvideos && rec->videos[v].ref) {
    char shown[MML_SHORT_CAP(200)];
    const char *r = rec->videos[v].ref;
    mml_err_prefix(err, "video %s", mml_text_short(r, strlen(r), 200, shown, sizeof shown));
  }
}

/* ------------------------------------------------------------------------------------ */
/* fetch completions (I/O thread)                                                       */

static void on_fetch(void *ctx, mml_status st, mml_bytes *body, const mml_err *err) {
  fetch_ref *r = ctx;
  task *t = r->t;
  mml_loader *L = t->L;
  pthread_mutex_lock(&L->mu);
  if (st == MML_OK) {
    mml_bytes *dst = r->which < 0 ? &t->rec_bytes : &t->imgs[r->which];
    mml_bytes_free(dst);
    *dst = *body; /* take the memory */
    memset(body, 0, sizeof *body);
    L->bytes_read += dst->len;
    t->fetched_bytes += dst->len;
  } else if (!t->fetch_st) {
    t->fetch_st = st;
    if (err)
      t->fetch_err = *err;
    else
      mml_err_set(&t->fetch_err, st, "%s", mml_status_message(st));
    if (r->which >= 0) ld_err_media(&t->fetch_err, &t->rec, r->which);
  }
  if (--t->pending == 0) ld_ready_push_locked(L, t);
  pthread_mutex_unlock(&L->mu);
}

/* ------------------------------------------------------------------------------------ */
/* the per-sample task                                                                  */

/* The one way a task fails: the sample carries the status and a message naming
 * shard:line. */
static void task_fail(task *t, mml_status st, const mml_err *e, const mml_loader *L) {
  mml_sample *s = &t->sample;
  s->status = st;
  char where[1100];
  mml_index_name_sample(&L->ix, s->shard, s->index, s->line, where, sizeof where);
  if (e && e->msg[0])
    s->err = *e;
  else
    mml_err_set(&s->err, st, "%s", mml_status_message(st));
  s->err.status = st;
  if (L->cfg.nsources > 0) /* a mixture: name the source too */
    mml_err_prefix(&s->err, "source %s: %s", L->src[s->source].name, where);
  else
    mml_err_prefix(&s->err, "%s", where);
}

/* A failure while fetches are outstanding: the first one is kept; the task fails with it
 * in its next stage, once the last completion has re-queued it. */
static void task_defer_error(mml_loader *L, task *t, mml_status st, const mml_err *e) {
  pthread_mutex_lock(&L->mu);
  if (!t->fetch_st) {
    t->fetch_st = st;
    t->fetch_err = *e;
  }
  pthread_mutex_unlock(&L->mu);
}

static mml_status task_imgs_fit(task *t, int n) {
  if (n <= t->imgs_cap) return MML_OK;
  int nc = t->imgs_cap ? t->imgs_cap : 4;
  while (nc < n) nc *= 2;
  mml_bytes *p = realloc(t->imgs, (size_t)nc * sizeof *p);
  if (!p) return MML_ENOMEM;
  memset(p + t->imgs_cap, 0, (size_t)(nc - t->imgs_cap) * sizeof *p);
  t->imgs = p;
  fetch_ref *r = realloc(t->refs, (size_t)nc * sizeof *r);
  if (!r) return MML_ENOMEM;
  t->refs = r;
  mml_vision_plan *v = realloc(t->plans, (size_t)nc * sizeof *v);
  if (!v) return MML_ENOMEM;
  t->plans = v;
  t->imgs_cap = nc;
  return MML_OK;
}

/* Stage 1 of a Parquet shard's sample: its row copied out of its decoded row group
 * (loader_parquet.c: decoded here, waited for, or cached), its record into rec_bytes. */
static mml_status record_parquet(mml_loader *L, task *t, int64_t row, run_acc *acc, mml_err *err) {
  mml_sample *s = &t->sample;
  double t0 = mml_now();
  mml_status st = ld_pq_read_row(L, s->shard, row, &L->cancel, &t->pqrow, err);
  acc->read_s += mml_now() - t0;
  if (st) return st;
  size_t len = t->pqrow.json_len;
  if ((int64_t)len > L->cfg.max_record_bytes)
    return mml_err_set(err, MML_ERECORDSIZE, "a %lld-byte record, above max_record_bytes=%lld",
                       (long long)len, (long long)L->cfg.max_record_bytes);
  mml_bytes_clear(&t->rec_bytes);
  if (mml_bytes_reserve(&t->rec_bytes, len + 1))
    return mml_err_set(err, MML_ENOMEM, "out of memory for a %zu-byte record", len);
  memcpy(t->rec_bytes.data, t->pqrow.buf.data, len + 1);
  t->rec_bytes.len = len;
  acc->bytes += len;
  s->bytes += len;
  return MML_OK;
}

/* Stage 1: the record's bytes, read here, copied from a remote shard's kept text, or
 * fetched (*wait: the task waits for them). */
static mml_status stage_record(mml_loader *L, mml_sample_scratch *sc, task *t, run_acc *acc,
                               int *wait, mml_err *err) {
  mml_sample *s = &t->sample;
  int64_t off, len;
  mml_status st = ld_lookup(L, &sc->mix, s, err); /* which source and sample */
  if (st) return st;
  mml_index_locate(&L->ix, s->index, &s->shard, &off, &len, &s->line);
  t->stage = STAGE_RECORD;
  const char *path = L->ix.shards[s->shard].path;
  if (len > L->cfg.max_record_bytes) /* before reading or fetching it */
    return mml_err_set(err, MML_ERECORDSIZE, "a %lld-byte record, above max_record_bytes=%lld",
                       (long long)len, (long long)L->cfg.max_record_bytes);
  if ((st = ld_index_precheck(L, s, err))) return st; /* too long, known from the index */
  if (mml_index_shard_parquet(&L->ix.shards[s->shard])) return record_parquet(L, t, off, acc, err);
  const mml_bytes *kept = s->shard < L->shard_text_cap ? &L->shard_text[s->shard] : NULL;
  if (L->remote[s->shard] && kept && kept->len && off + len <= (int64_t)kept->len) {
    mml_bytes_clear(&t->rec_bytes); /* the text kept from the shard's scan: no round trip */
    if (mml_bytes_reserve(&t->rec_bytes, (size_t)len + 1))
      return mml_err_set(err, MML_ENOMEM, "out of memory for a %lld-byte record", (long long)len);
    memcpy(t->rec_bytes.data, kept->data + off, (size_t)len);
    t->rec_bytes.len = (size_t)len;
    t->rec_bytes.data[len] = 0;
    acc->bytes += t->rec_bytes.len;
    s->bytes += t->rec_bytes.len;
    return MML_OK;
  }
  if (L->remote[s->shard]) {
    mml_fetcher *f;
    if ((st = ld_get_fetcher(L, &f, err))) return st;
    if (task_imgs_fit(t, 1))
      return mml_err_set(err, MML_ENOMEM, "out of memory for the record fetch");
    t->refs[0].t = t;
    t->refs[0].which = -1;
    pthread_mutex_lock(&L->mu);
    t->pending = 1;
    t->fetch_st = MML_OK;
    pthread_mutex_unlock(&L->mu);
    st = mml_fetch_submit(f, path, off, len, on_fetch, &t->refs[0], err);
    if (!st) *wait = 1;
    return st;
  }
  double t0 = mml_now();
  st = mml_index_read(&L->ix.shards[s->shard], off, len, &t->rec_bytes, err);
  acc->read_s += mml_now() - t0;
  if (!st) {
    acc->bytes += t->rec_bytes.len;
    s->bytes += t->rec_bytes.len;
  }
  return st;
}

mml_status ld_parse_record(const mml_loader *L, int shard, int64_t gi, const mml_bytes *bytes,
                           const ld_pq_row *row, mml_record *rec, mml_err *err) {
  size_t n = mml_index_record_len(&L->ix.shards[shard], bytes->data, bytes->len);
  enum { MAX_MEMBERS = 64 }; /* of each kind; more make the record's count mismatch */
  const char *imgs[MAX_MEMBERS], *vids[MAX_MEMBERS];
  int pq = row && mml_index_shard_parquet(&L->ix.shards[shard]); /* a row's blobs */
  int ni = pq ? ld_pq_row_names(row, mml_index_is_image_name, imgs, MAX_MEMBERS)
              : mml_index_images(&L->ix, shard, gi, imgs, MAX_MEMBERS);
  int nv = pq ? ld_pq_row_names(row, mml_index_is_video_name, vids, MAX_MEMBERS)
              : mml_index_videos(&L->ix, shard, gi, vids, MAX_MEMBERS);
  mml_record_opts ro = {.max_json_depth = L->cfg.max_json_depth,
                        .max_images = L->cfg.max_images_per_sample,
                        .implicit = imgs,
                        .nimplicit = ni < MAX_MEMBERS ? ni : MAX_MEMBERS,
                        .implicit_videos = vids,
                        .nimplicit_videos = nv < MAX_MEMBERS ? nv : MAX_MEMBERS,
                        .packs = L->cfg.data_packing};
  return mml_record_parse_opts((const char *)bytes->data, n, &ro, rec, err);
}

/* The record parsed into t->rec; room for its images. */
static mml_status parse_record(mml_loader *L, task *t, run_acc *acc, mml_err *err) {
  if (t->rec_parsed) mml_record_free(&t->rec);
  memset(&t->rec, 0, sizeof t->rec);
  t->rec_parsed = 1;
  double t0 = mml_now();
  mml_status st =
      ld_parse_record(L, t->sample.shard, t->sample.index, &t->rec_bytes, &t->pqrow, &t->rec, err);
  acc->read_s += mml_now() - t0;
  if (!st) /* a record the recipe refuses is refused before its media are read */
    st = mml_template_check_record(L->src[t->sample.source].tmpl, &t->rec, err);
  if (st) return st;
  if (task_imgs_fit(t, t->rec.nimages + mml_record_frames(&t->rec) + t->rec.nvideos + 1))
    return mml_err_set(err, MML_ENOMEM, "out of memory for the record's images");
  if (t->rec.nvideos > t->vcap) { /* (its videos were closed when the task began) */
    int nc = t->rec.nvideos;
    void *a = realloc(t->vinfo, (size_t)nc * sizeof *t->vinfo);
    if (a) t->vinfo = a;
    void *b = a ? realloc(t->vplans, (size_t)nc * sizeof *t->vplans) : NULL;
    if (b) t->vplans = b;
    void *c = b ? realloc(t->vids, (size_t)nc * sizeof *t->vids) : NULL;
    if (c) t->vids = c;
    void *d = c ? realloc(t->vhead, (size_t)nc * sizeof *t->vhead) : NULL;
    if (d) t->vhead = d;
    if (!d) return mml_err_set(err, MML_ENOMEM, "out of memory for the record's videos");
    memset(t->vids + t->vcap, 0, (size_t)(nc - t->vcap) * sizeof *t->vids);
    memset(t->vhead + t->vcap, 0, (size_t)(nc - t->vcap) * sizeof *t->vhead);
    t->vcap = nc;
  }
  return MML_OK;
}

/* Stage 2 submits one more fetch for t (counted in *nremote): the first one also sets the
 * guard that keeps completions from finishing the task while the stage submits (dropped
 * at the stage's end).  ld_fetch_undo takes one back when its submit failed. */
void ld_fetch_one_more(mml_loader *L, task *t, int *nremote) {
  pthread_mutex_lock(&L->mu);
  if (!*nremote) {
    t->pending = 1;
    t->fetch_st = MML_OK;
  }
  t->pending++;
  pthread_mutex_unlock(&L->mu);
  (*nremote)++;
}

void ld_fetch_undo(mml_loader *L, task *t) {
  pthread_mutex_lock(&L->mu);
  t->pending--;
  pthread_mutex_unlock(&L->mu);
}

/* Media item i of t at URL t->path (a range of it: off, len): its fetch submitted (counted
 * in *nremote), or, read again at its decode (READ AGAIN, reread_media), fetched and
 * waited for (close() ends the wait). */
static mml_status fetch_item(mml_loader *L, task *t, int i, mml_fetcher *f, int64_t off,
                             int64_t len, int *nremote, run_acc *acc, mml_err *err) {
  const char *p = (const char *)t->path.data;
  mml_status st;
  if (t->reread) {
    st = mml_fetch_get_cancellable(f, p, off, len, &L->cancel, &t->imgs[i], err);
    if (st)
      ld_err_media(err, &t->rec, i);
    else
      acc->bytes += t->imgs[i].len;
    return st;
  }
  ld_fetch_one_more(L, t, nremote);
  t->refs[i + 1].t = t;
  t->refs[i + 1].which = i;
  st = mml_fetch_submit(f, p, off, len, on_fetch, &t->refs[i + 1], err);
  if (st) ld_fetch_undo(L, t);
  return st;
}

/* Media item i named `ref` (an image, then video frames: mml_record_media_ref, then the
 * WebDataset member videos): read now, or its fetch submitted (counted in *nremote; *f is
 * obtained on the first remote item). */
static mml_status load_image(mml_loader *L, task *t, int i, const char *ref, mml_fetcher **f,
                             int *nremote, run_acc *acc, int *parked, mml_err *err) {
  if (mml_is_data_uri(ref)) { /* inline image: decoded here, no I/O */
    mml_status st = mml_data_uri_decode(ref, &t->imgs[i], err);
    if (st) mml_sample_err_image(err, ref);
    return st;
  }
  const mml_index_shard *sh = &L->ix.shards[t->sample.shard];
  const char *root = L->roots[t->sample.shard];
  int64_t off = 0, len = -1;
  mml_status st;
  if (mml_index_shard_parquet(sh)) { /* a blob of the row (else a path, as a JSON record's) */
    int found;
    double t0 = mml_now();
    st = ld_pq_blob_copy(&t->pqrow, ref, &t->imgs[i], &found, err);
    acc->read_s += mml_now() - t0;
    if (found && !st && (int64_t)t->imgs[i].len > L->cfg.max_object_bytes)
      st = mml_err_set(err, MML_EOBJECTSIZE,
                       "%s: member %s is %zu bytes, above max_object_bytes=%lld", sh->path, ref,
                       t->imgs[i].len, (long long)L->cfg.max_object_bytes);
    if (found && st) ld_err_media(err, &t->rec, i);
    if (found && !st) {
      acc->bytes += t->imgs[i].len;
      t->sample.bytes += t->imgs[i].len;
    }
    if (found) return st;
  }
  int member = mml_index_member(&L->ix, t->sample.shard, t->sample.index, ref, &off, &len);
  if (member && len > L->cfg.max_object_bytes) { /* its tar header's size, before any read */
    st = mml_err_set(err, MML_EOBJECTSIZE,
                     "%s: member %s is %lld bytes, above max_object_bytes=%lld", sh->path, ref,
                     (long long)len, (long long)L->cfg.max_object_bytes);
    ld_err_media(err, &t->rec, i);
    return st;
  }
  if (member) { /* a WebDataset member: a range of the shard itself */
    mml_bytes_clear(&t->path);
    if (mml_bytes_append(&t->path, sh->path, strlen(sh->path) + 1))
      return mml_err_set(err, MML_ENOMEM, "out of memory");
  } else if ((st = mml_sample_image_path(root, ref, &t->path, err))) {
    return st;
  }
  const char *p = (const char *)t->path.data;
  /* the path policy, before anything is opened or fetched (a member is the shard's own) */
  if (!member &&
      (st = mml_sample_image_allowed(&L->cfg, root, ref, p, !L->remote[t->sample.shard], err)))
    return st;
  mml_bytes_clear(&t->imgs[i]);
  if (member ? !mml_index_shard_remote(sh) : !mml_path_is_remote(p)) {
    double t0 = mml_now();
    struct stat sb;
    int64_t size = member ? len : stat(p, &sb) == 0 ? (int64_t)sb.st_size : 0;
    /* a spare that fits; under max_memory, room for it */
    st = size > 0 ? ld_bytes_take(L, t, &t->imgs[i], (size_t)size + 1, parked, err) : MML_OK;
    if (!st && *parked) return MML_OK; /* its charge waits: read when granted (R2) */
    if (!st)
      st = member ? mml_index_read(sh, off, len, &t->imgs[i], err)
                  : mml_read_file_max(p, 0, -1, L->cfg.max_object_bytes, &t->imgs[i], err);
    acc->read_s += mml_now() - t0;
    if (st)
      ld_err_media(err, &t->rec, i);
    else {
      acc->bytes += t->imgs[i].len;
      t->sample.bytes += t->imgs[i].len;
    }
    return st;
  }
  if (!*f && (st = ld_get_fetcher(L, f, err))) return st;
  return fetch_item(L, t, i, *f, off, len, nremote, acc, err);
}

static mml_status read_media(mml_loader *L, task *t, int from, int nremote, run_acc *acc, int *wait,
                             mml_err *err);

/* Stage 2: the record parsed, its images read or fetched (*wait: the task waits). */
static mml_status stage_images(mml_loader *L, task *t, run_acc *acc, int *wait, mml_err *err) {
  if (t->fetch_st) {
    *err = t->fetch_err;
    return t->fetch_st;
  }
  mml_status st = parse_record(L, t, acc, err);
  if (st) return st;
  if (ld_video_park(L, t)) { /* a later epoch's remote video: when that epoch is asked for */
    *wait = 1;
    return MML_OK;
  }
  t->stage = STAGE_IMAGES;
  t->vtails = 0;
  return read_media(L, t, 0, 0, acc, wait, err);
}

/* Stage 2's reads from media item `from` on, `nremote` fetches of the stage submitted
 * before it: from the start, or where a read parked for max_memory room goes on once its
 * charge is granted (loader_admit.c R2: the task was parked, holding its slot). */
static mml_status read_media(mml_loader *L, task *t, int from, int nremote, run_acc *acc, int *wait,
                             mml_err *err) {
  mml_status st = MML_OK;
  mml_fetcher *f = NULL;
  int parked = 0;
  const int nmedia = t->rec.nimages + mml_record_frames(&t->rec);
  for (int i = from; i < nmedia + t->rec.nvideos; i++) {
    if (i < nmedia) {
      st = load_image(L, t, i, mml_record_media_ref(&t->rec, i), &f, &nremote, acc, &parked, err);
    } else { /* a video file: a WebDataset member is read like an image, others are opened
              * by path or URL when planned (ld_video_open) */
      const char *ref = t->rec.videos[i - nmedia].ref;
      mml_bytes_clear(&t->imgs[i]);
      if (!ref) continue;
      int64_t off, len;
      const uint8_t *bp;
      size_t bn;
      if (mml_index_member(&L->ix, t->sample.shard, t->sample.index, ref, &off, &len) ||
          (mml_index_shard_parquet(&L->ix.shards[t->sample.shard]) &&
           ld_pq_row_member(&t->pqrow, ref, &bp, &bn)))
        st = load_image(L, t, i, ref, &f, &nremote, acc, &parked, err);
      else if (!(st = ld_video_path(L, t, ref, 1, err)))
        ld_head_video(L, t, i - nmedia, &f, &nremote);
    }
    if (!st && parked) { /* R2: parked on room_head (the fetches' guard kept), not run */
      pthread_mutex_lock(&L->mu);
      ld_admit_park_locked(L, t, i, nremote);
      pthread_mutex_unlock(&L->mu);
      *wait = 1;
      return MML_OK;
    }
    if (st) {
      if (!nremote) return st;
      task_defer_error(L, t, st, err);
      break;
    }
  }
  if (nremote) {
    pthread_mutex_lock(&L->mu);
    int last = --t->pending == 0;
    pthread_mutex_unlock(&L->mu);
    if (!last) *wait = 1; /* a completion will re-queue the task */
  }
  return MML_OK;
}

/* Stage 3: every image's bytes are here; the sample is planned from its headers and
 * checked (its pixels come later, straight into its batch: decode_task). */
static mml_status stage_plan(mml_loader *L, mml_sample_scratch *sc, task *t, run_acc *acc,
                             int *wait, mml_err *err) {
  if (t->fetch_st) {
    *err = t->fetch_err;
    return t->fetch_st;
  }
  if (!t->vtails) { /* first: an mp4 index past the first blocks, fetched (the task waits) */
    t->vtails = 1;
    int nremote = 0;
    mml_fetcher *f = NULL;
    for (int v = 0; v < t->rec.nvideos; v++)
      if (t->rec.videos[v].ref) ld_tail_video(L, t, v, &f, &nremote);
    if (nremote) {
      pthread_mutex_lock(&L->mu);
      int last = --t->pending == 0;
      pthread_mutex_unlock(&L->mu);
      if (!last) {
        *wait = 1; /* a completion will re-queue the task */
        return MML_OK;
      }
    }
  }
  t->sample.bytes += t->fetched_bytes; /* every fetch has completed */
  mml_status st = ld_probe_videos(L, t, acc, err);
  pthread_mutex_lock(&L->mu); /* the first blocks were read (and dropped) by the probes */
  ld_task_release_videos_locked(L, t);
  pthread_mutex_unlock(&L->mu);
  if (st) return st;
  st = mml_sample_plan(&L->src[t->sample.source].pl, sc, &t->rec, t->imgs, t->plans, t->vinfo,
                       t->vplans, &t->sample, err);
  if (!st) st = ld_mem_check_sample(L, t, err);                   /* max_memory: can it ever fit? */
  if (!st) st = mml_collator_check(L->collator, &t->sample, err); /* e.g. too long */
  if (st) return st;
  return ld_preload_videos(L, t, wait, err);
}

/* Runs the task as far as it can without waiting.  Returns 1 when the sample is finished
 * (good or failed), 0 when it waits for fetches. */
static int task_run(mml_loader *L, mml_sample_scratch *sc, task *t, run_acc *acc) {
  mml_err err;
  mml_err_clear(&err);
  mml_status st = MML_OK;
  int wait = 0;
  if (t->resume_at >= 0) { /* its read's charge was granted (or failed): its reads go on */
    const int from = t->resume_at, nremote = t->room_nremote;
    t->resume_at = -1;
    st = read_media(L, t, from, nremote, acc, &wait, &err);
  }
  if (t->stage == STAGE_NEW) st = stage_record(L, sc, t, acc, &wait, &err);
  if (!st && !wait && t->stage == STAGE_RECORD) st = stage_images(L, t, acc, &wait, &err);
  if (!st && !wait && t->stage == STAGE_IMAGES) st = stage_plan(L, sc, t, acc, &wait, &err);
  if (wait) return 0;
  if (!st && t->stage == STAGE_VIDEOS) t->sample.bytes += t->fetched_bytes; /* all arrived */
  if (st)
    task_fail(t, st, &err, L);
  else
    t->sample.status = MML_OK;
  return 1;
}

/* ------------------------------------------------------------------------------------ */
/* worker threads                                                                       */

/* The next decode job: pixels of batches already composed, in order, but past decodes
 * whose max_memory scratch charge waits in the ledger (*wait set; loader_admit.c D1-D4);
 * NULL when none can run. */
static task *take_decode_locked(mml_loader *L, int *wait) {
  task *prev = NULL;
  for (task *t = L->dec_head, *next; t; t = next) {
    next = t->next_dec;
    const int drop = t->gen != L->gen || !ld_place_has_dests(t);
    if (!drop) (void)ld_admit_reads_settle_locked(L, t, 1); /* R5: final now, or read again */
    /* each asks for its scratch in the ledger, which grants in stream order (L1): a later
     * sample's decode never takes the room an earlier one's waits for */
    if (!drop && !ld_mem_scratch_take_locked(L, t)) {
      *wait = 1;
      prev = t;
      continue;
    }
    if (prev)
      prev->next_dec = next;
    else
      L->dec_head = next;
    if (L->dec_tail == t) L->dec_tail = prev;
    t->dec = DEC_NONE;
    ld_admit_scratch_drop_locked(L, t); /* leaving unrun: its charge leaves too (D3) */
    if (t->gen != L->gen) { /* work of an abandoned plan: what it holds goes back (A11) */
      ld_task_give_back_locked(L, t);
      t->state = SLOT_EMPTY;
      ld_work_wake(L, 1);
      ld_consumer_stale_locked(L); /* loader_admit.c C2, C6: a decode left the queue */
      continue;
    }
    if (drop) { /* unplaced meanwhile: it is queued again when placed */
      /* a decode left the queue without running: the engine may be idle now (loader_admit.c
       * C2, C6; an open pack's decodes, unplaced by its growth, left the consumer waiting
       * from a look that saw them queued: MML_STRESS_SEED=111, 1 run in ~15-80) */
      ld_consumer_stale_locked(L);
      continue;
    }
    t->dec = DEC_RUNNING;
    L->decoding++;
    return t;
  }
  return NULL;
}

/* The next task to run: a placed sample's decode (past those waiting for scratch room), a
 * ready one, or the next seq in the window.  Emits queued batches first.  NULL once
 * stopping. */
/* The slot of the next seq, started (mu held). */
static task *start_task_locked(mml_loader *L) {
  task *t = &L->tasks[L->next_seq % L->window];
  ld_admit_reads_settle_locked(L, t, 0); /* R5: an abandoned plan's grants, final */
  ld_task_close_videos(L, t);            /* an abandoned plan's */
  ld_task_release_videos_locked(L, t);
  ld_place_clear(t);
  t->dec = DEC_NONE;
  t->state = SLOT_BUSY;
  t->gen = L->gen;
  t->seq = L->next_seq++;
  t->stage = STAGE_NEW;
  t->fetch_st = MML_OK;
  t->pending = 0;
  t->fetched_bytes = 0;
  t->scratch_need = t->scratch_granted = 0;
  t->reread = 0;
  t->reread_bytes = t->reread_granted = 0;
  t->rch_on = 0;
  t->room_at = t->resume_at = -1;
  t->restarted = 0;
  t->restart_head = t->t5_head = -1;
  ld_admit_scratch_drop_locked(L, t); /* none is left in the ledger by now (D3) */
  t->started = mml_now();
  mml_sample_reset(&t->sample);
  ld_plan_at_locked(L, t->seq, &t->sample.epoch, &t->sample.pos);
  L->in_flight++;
  ld_consumer_stale_locked(L); /* C2, C6: work without credit runs: the consumer's wait is
                                  no longer declared (ledger.c L7) */
  return t;
}

/* One look for work (mu held, L->stop clear): the task to run, or NULL after it emitted
 * a batch, dropped an abandoned task or waited (for room or work: until a poke, W4, W5). */
static task *look_locked(mml_loader *L) {
  const uint64_t seen = ld_work_look_locked(L); /* W4: read before looking */
  ld_admit_revoked_locked(L);                   /* R5: reads' grants asked back */
  int emit_wait = 0; /* max_memory: the next batch's emission charge waits (E1) */
  if (L->jobs_queued && !ld_emit_gated_locked(L)) { /* emitting unblocks the output first */
    const int64_t grant = ld_mem_emit_take_locked(L);
    if (grant >= 0) {
      int64_t charged = grant; /* the ledger's: given back once its rows are live */
      ld_emit_job_locked(L, &charged);
      L->emit_extra -= grant; /* its float rows are live in the pool now */
      ld_ledger_release(L, charged);
      return NULL;
    }
    emit_wait = 1;
  }
  if (ld_expand_help_locked(L)) return NULL; /* the expansion the consumer waits for */
  int dec_wait = 0; /* then pixels of batches already composed (take_decode_locked) */
  task *run = take_decode_locked(L, &dec_wait);
  if (run) return run;
  if (L->ready_head) {
    task *t = L->ready_head;
    L->ready_head = t->next_ready;
    if (!L->ready_head) L->ready_tail = NULL;
    if (t->gen == L->gen) return t;
    ld_task_give_back_locked(L, t); /* work of an abandoned plan: A11 */
    t->state = SLOT_EMPTY;
    L->in_flight--;
    ld_work_wake(L, 1);
    return NULL;
  }
  int parked_wait = 0; /* max_memory: a read parked for room (loader_admit.c R2) */
  if (L->room_head) {
    task *t = ld_admit_parked_locked(L, &parked_wait);
    if (t) return t;
  }
  int gated = 0; /* max_memory: no room to read one more sample now */
  if (L->next_seq < L->head_seq + L->window && (L->limit_seq < 0 || L->next_seq < L->limit_seq) &&
      L->tasks[L->next_seq % L->window].state == SLOT_EMPTY &&
      !(gated = !ld_mem_may_read_locked(L))) {
    return start_task_locked(L);
  }
  /* woken as room comes back (loader_admit.c W1) or work is queued (W4) */
  ld_work_wait_locked(L, seen, gated || dec_wait || emit_wait || parked_wait);
  return NULL;
}

static task *take_task_locked(mml_loader *L) {
  atomic_fetch_add(&L->room_waiting_work, 1); /* W4: room events poke while it looks */
  task *found = NULL;
  while (!L->stop && !found) found = look_locked(L);
  atomic_fetch_sub(&L->room_waiting_work, 1);
  return found;
}

/* What a planned sample's decode costs, roughly, for the order of a batch's decodes
 * (loader_place.c, P1): the pixels its images decode (each at its decode scale) plus its
 * video rows at 1024 source pixels each.  Read from the plans the worker holding t made. */
static int64_t decode_cost(const task *t) {
  int64_t c = 0;
  for (int i = 0; i < t->rec.nimages && i < t->imgs_cap; i++) {
    const mml_vision_plan *q = &t->plans[i];
    const int64_t d = q->decode_scale > 1 ? (int64_t)q->decode_scale * q->decode_scale : 1;
    c += (int64_t)q->src_w * q->src_h / d;
  }
  return c + t->sample.vpixel_rows * 1024;
}

/* The planned (or failed) task's slot goes to the planner and collator (or back to the
 * window if its plan was abandoned meanwhile).  A good sample with pixels waits PLANNED
 * for its decode; the others are final. */
static void finish_task_locked(mml_loader *L, task *t) {
  ld_admit_read_drop_locked(L, t); /* R4: a parked read's charge its read did not take */
  L->in_flight--;
  ld_room_gates_changed_locked(L); /* W5: the read gate counts reads in flight */
  ld_mem_count_task_locked(L, t);
  if (t->gen == L->gen) {
    int later = t->sample.status == MML_OK && L->placing &&
                (t->sample.pixel_rows > 0 || t->sample.vpixel_rows > 0);
    if (t->sample.status == MML_OK && !later) L->images += (uint64_t)t->sample.nimages;
    if (later) t->decode_cost = decode_cost(t);
    t->state = later ? SLOT_PLANNED : SLOT_DONE;
    ld_coll_wake_locked(L, 0);
  } else {
    t->state = SLOT_EMPTY;
    ld_work_wake(L, 1);
  }
  if (t->state == SLOT_PLANNED) /* R5: asked back while it was read: READ AGAIN */
    ld_admit_revoked_task_locked(L, t);
  else /* R5: no decode will read them: final (kept even when asked back) */
    ld_admit_reads_settle_locked(L, t, 0);
  if (t->state != SLOT_PLANNED) { /* its videos and bytes are no longer read */
    ld_task_close_videos(L, t);
    ld_task_release_videos_locked(L, t);
    ld_bytes_return_locked(L, t);
  }
}

uint64_t ld_task_media_sum(const task *t) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a over each item's length and bytes */
  for (int i = 0; i < t->rec.nimages + mml_record_frames(&t->rec) && i < t->imgs_cap; i++) {
    const uint64_t n = t->imgs[i].len;
    for (int k = 0; k < 64; k += 8) h = (h ^ ((n >> k) & 0xff)) * 1099511628211ull;
    for (size_t k = 0; k < t->imgs[i].len; k++) h = (h ^ t->imgs[i].data[k]) * 1099511628211ull;
  }
  return h;
}

/* Its media's bytes, dropped for earlier work under max_memory (task.reread), read again
 * as its plan stage read them (fetched bytes fetched again and waited for, and checked to
 * be the ones its plan was made from); the sample's byte count stays what the first read
 * made it. */
static mml_status reread_media(mml_loader *L, task *t, run_acc *acc, mml_err *err) {
  const uint64_t bytes = t->sample.bytes;
  mml_fetcher *f = NULL;
  int nremote = 0;
  mml_status st = MML_OK;
  const int nmedia = t->rec.nimages + mml_record_frames(&t->rec);
  int parked = 0; /* never: its grant covers it (ld_admit_read_locked) */
  for (int i = 0; i < nmedia && !st; i++)
    st = load_image(L, t, i, mml_record_media_ref(&t->rec, i), &f, &nremote, acc, &parked, err);
  t->sample.bytes = bytes;
  if (!st && nremote)
    st = mml_err_set(err, MML_EINTERNAL, "a sample read again at its decode fetched its media");
  if (!st && t->fetched_bytes && ld_task_media_sum(t) != t->reread_sum)
    st = mml_err_set(err, MML_EFETCH,
                     "its media changed on the server between its plan and its decode (fetched "
                     "again there: max_memory needed the room)");
  return st;
}

/* Decodes a placed sample into the destinations the planner gave it, one per plane
 * (captured under mu with references: the planner may move them meanwhile, then the rows
 * are copied). */
static void decode_task(mml_loader *L, mml_sample_scratch *sc, task *t) {
  mml_buf *buf[PLANES];
  size_t off[PLANES];
  uint8_t *dst[PLANES];
  for (int p = 0; p < PLANES; p++) {
    buf[p] = t->at[p].dest;
    off[p] = t->at[p].dest_off;
    dst[p] = buf[p] ? (uint8_t *)buf[p]->data + off[p] : NULL;
    mml_buf_retain(buf[p]);
  }
  pthread_mutex_unlock(&L->mu);
  mml_err err;
  mml_err_clear(&err);
  const mml_pipeline *pl = &L->src[t->sample.source].pl;
  mml_status st = MML_OK;
  run_acc acc = {0, 0};
  if (t->reread) { /* its bytes were dropped for earlier work: its grant covers them */
    st = reread_media(L, t, &acc, &err);
    pthread_mutex_lock(&L->mu);
    t->reread = 0;
    /* counted in held now: the grant becomes their charge (never both at once) */
    ld_mem_count_task_cover_locked(L, t, t->reread_granted);
    L->scratch_extra -= t->reread_granted;
    t->reread_granted = 0;
    pthread_mutex_unlock(&L->mu);
  }
  if (!st && dst[PL_IMG] && L->compact) { /* uint8 rows (loader_place.c COMPACT): the same plans */
    const mml_pipeline *pu = &L->src[t->sample.source].pl_u8;
    for (int i = 0; i < t->rec.nimages; i++) t->plans[i].cols = mml_vision_pixel_cols(pu->vision);
    st = mml_sample_decode(pu, sc, &t->rec, t->imgs, t->plans, t->rec.nimages, dst[PL_IMG], &err);
  } else if (!st && dst[PL_IMG]) {
    st = mml_sample_decode(pl, sc, &t->rec, t->imgs, t->plans, t->rec.nimages, dst[PL_IMG], &err);
  }
  if (!st && dst[PL_VID]) {
    ld_video_ctx c = {L, t, &acc, 1};
    st = mml_sample_decode_videos(pl, sc, &t->rec, t->imgs, t->vplans, ld_video_open, &c,
                                  dst[PL_VID], &err);
  }
  ld_task_close_videos(L, t); /* those a failure left undecoded */
  if (L->cfg.max_memory) mml_vision_scratch_trim(sc->vision, MML_SCRATCH_KEEP);
  pthread_mutex_lock(&L->mu);       /* the planner reads the status under mu */
  ld_mem_scratch_give_locked(L, t); /* its scratch is back to the worker's reserve */
  L->decoding--;
  ld_room_gates_changed_locked(L);     /* W5, C2: T5 and C4 count decodes running */
  ld_task_release_videos_locked(L, t); /* its preloads went with its videos */
  L->read_s += acc.read_s;
  L->bytes_read += acc.bytes;
  if (st) task_fail(t, st, &err, L);
  ld_bytes_return_locked(L, t); /* its image bytes are decoded */
  t->dec = DEC_NONE;
  const int keep = !st && t->gen == L->gen;
  for (int p = 0; p < PLANES; p++) {
    if (keep && buf[p])
      ld_place_decoded_locked(L, t, p, buf[p], off[p]); /* takes the reference */
    else
      mml_buf_release(buf[p]);
  }
  if (t->gen != L->gen) {
    t->state = SLOT_EMPTY;
    ld_work_wake(L, 1);
    return;
  }
  if (!st) L->images += (uint64_t)t->sample.nimages;
  t->state = SLOT_DONE;
  ld_coll_wake_locked(L, 0);
}

void *ld_worker_main(void *arg) {
  mml_loader *L = arg;
  mml_sample_scratch sc;
  mml_err err;
  int have_scratch = mml_sample_scratch_init(&sc, &err) == MML_OK;
  if (have_scratch && !L->cfg.max_memory) /* under max_memory: the reserve's 8 MiB */
    mml_vision_scratch_set_jpeg_keep(sc.vision, MML_WORKER_JPEG_KEEP);
  uint64_t faults = 0;
  pthread_mutex_lock(&L->mu);
  ld_count_faults_locked(L, &faults);
  task *t;
  while ((t = take_task_locked(L))) {
    ld_count_faults_locked(L, &faults); /* take_task_locked may have emitted a batch */
    int finished;
    run_acc acc = {0, 0};
    sc.vision_s = sc.text_s = 0;
    double decode0 = have_scratch ? mml_vision_scratch_decode_s(sc.vision) : 0;
    if (t->dec == DEC_RUNNING) { /* a decode job (mu is held again after it) */
      if (have_scratch) {
        decode_task(L, &sc, t);
      } else {
        task_fail(t, MML_ENOMEM, &err, L);
        ld_mem_scratch_give_locked(L, t);
        ld_task_give_back_locked(L, t); /* not decoded: A11 */
        L->decoding--;
        t->dec = DEC_NONE;
        t->state = t->gen == L->gen ? SLOT_DONE : SLOT_EMPTY;
        ld_work_wake(L, 1);
        ld_coll_wake_locked(L, 0);
      }
      L->vision_s += sc.vision_s;
      if (have_scratch) L->decode_s += mml_vision_scratch_decode_s(sc.vision) - decode0;
      ld_count_faults_locked(L, &faults);
      continue;
    }
    pthread_mutex_unlock(&L->mu);
    if (have_scratch) {
      finished = task_run(L, &sc, t, &acc);
    } else {
      task_fail(t, MML_ENOMEM, &err, L);
      finished = 1;
    }
    pthread_mutex_lock(&L->mu);
    L->read_s += acc.read_s;
    L->vision_s += sc.vision_s;
    if (have_scratch) L->decode_s += mml_vision_scratch_decode_s(sc.vision) - decode0;
    L->text_s += sc.text_s;
    L->bytes_read += acc.bytes;
    ld_count_faults_locked(L, &faults);
    if (finished) finish_task_locked(L, t);
  }
  ld_count_faults_locked(L, &faults);
  pthread_mutex_unlock(&L->mu);
  if (have_scratch) mml_sample_scratch_free(&sc);
  return NULL;
}
