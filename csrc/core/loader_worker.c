/*
 * loader_worker.c — the loader's worker threads and the per-sample task.
 *
 * A worker (num_threads of them) first emits a finished batch if one is queued, else
 * decodes a placed sample (the decode queue, in order; under max_memory a decode whose
 * images need scratch beyond the worker's reserve first takes that room, and while it
 * waits the decodes needing scratch after it wait too, no overtaking: loader_place.c
 * DECODER SCRATCH), else takes a ready task (remote bytes arrived), else dispatches the
 * next seq if it lies in the window and its slot is free; it runs the task as far as it
 * can without waiting and marks the slot DONE when the sample is finished (good or
 * failed).  A worker with nothing it may take for want of room looks again every 5 ms.
 *
 * The task is three stages, each a function: the record's bytes (read, copied from the
 * remote shard's text kept at indexing (loader.c scan_shard), or fetched),
 * the parsed record and its images' bytes (read, fetched, or decoded from a data: URI
 * right here), the sample planned from them (image headers, grids, token counts, ids,
 * labels: mml_sample_plan) -> slot PLANNED.  Video files are opened and probed there
 * (probe_videos: frame count, rate, size; nothing decoded) and kept open, idle, for the
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
 * the record's images (head_video), and an mp4 whose index is not all in that block (at
 * the end past the mdat, or longer) has the bytes holding it fetched next, exactly, from
 * the top-level box sizes (tail_video), so its open and probe in the plan stage read memory;
 * once the sample is planned, the exact byte ranges of the packets its kept frames need
 * (from an mp4/mov's sample index, or the packets an mkv/webm/avi's probe met) are
 * submitted (preload_videos, STAGE_VIDEOS) and the task waits, holding no thread, until
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
#include "mml/message.h"

static void ready_push_locked(mml_loader *L, task *t) {
  t->next_ready = NULL;
  if (L->ready_tail)
    L->ready_tail->next_ready = t;
  else
    L->ready_head = t;
  L->ready_tail = t;
  pthread_cond_signal(&L->work_cv);
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
  if (--t->pending == 0) ready_push_locked(L, t);
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
                           mml_record *rec, mml_err *err) {
  size_t n = mml_index_record_len(&L->ix.shards[shard], bytes->data, bytes->len);
  enum { MAX_MEMBERS = 64 }; /* of each kind; more make the record's count mismatch */
  const char *imgs[MAX_MEMBERS], *vids[MAX_MEMBERS];
  int ni = mml_index_images(&L->ix, shard, gi, imgs, MAX_MEMBERS);
  int nv = mml_index_videos(&L->ix, shard, gi, vids, MAX_MEMBERS);
  mml_record_opts ro = {.max_json_depth = L->cfg.max_json_depth,
                        .max_images = L->cfg.max_images_per_sample,
                        .implicit = imgs,
                        .nimplicit = ni < MAX_MEMBERS ? ni : MAX_MEMBERS,
                        .implicit_videos = vids,
                        .nimplicit_videos = nv < MAX_MEMBERS ? nv : MAX_MEMBERS};
  return mml_record_parse_opts((const char *)bytes->data, n, &ro, rec, err);
}

/* The record parsed into t->rec; room for its images. */
static mml_status parse_record(mml_loader *L, task *t, run_acc *acc, mml_err *err) {
  if (t->rec_parsed) mml_record_free(&t->rec);
  memset(&t->rec, 0, sizeof t->rec);
  t->rec_parsed = 1;
  double t0 = mml_now();
  mml_status st = ld_parse_record(L, t->sample.shard, t->sample.index, &t->rec_bytes, &t->rec, err);
  acc->read_s += mml_now() - t0;
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
 * at the stage's end).  fetch_undo takes one back when its submit failed. */
static void fetch_one_more(mml_loader *L, task *t, int *nremote) {
  pthread_mutex_lock(&L->mu);
  if (!*nremote) {
    t->pending = 1;
    t->fetch_st = MML_OK;
  }
  t->pending++;
  pthread_mutex_unlock(&L->mu);
  (*nremote)++;
}

static void fetch_undo(mml_loader *L, task *t) {
  pthread_mutex_lock(&L->mu);
  t->pending--;
  pthread_mutex_unlock(&L->mu);
}

/* Media item i named `ref` (an image, then video frames: mml_record_media_ref, then the
 * WebDataset member videos): read now, or its fetch submitted (counted in *nremote; *f is
 * obtained on the first remote item). */
static mml_status load_image(mml_loader *L, task *t, int i, const char *ref, mml_fetcher **f,
                             int *nremote, run_acc *acc, mml_err *err) {
  if (mml_is_data_uri(ref)) { /* inline image: decoded here, no I/O */
    mml_status st = mml_data_uri_decode(ref, &t->imgs[i], err);
    if (st) mml_sample_err_image(err, ref);
    return st;
  }
  const mml_index_shard *sh = &L->ix.shards[t->sample.shard];
  const char *root = L->roots[t->sample.shard];
  int64_t off = 0, len = -1;
  mml_status st;
  int member = mml_index_member(&L->ix, t->sample.shard, t->sample.index, ref, &off, &len);
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
    if (size > 0) ld_bytes_take(L, t, &t->imgs[i], (size_t)size + 1); /* a spare that fits */
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
  fetch_one_more(L, t, nremote);
  t->refs[i + 1].t = t;
  t->refs[i + 1].which = i;
  st = mml_fetch_submit(*f, p, off, len, on_fetch, &t->refs[i + 1], err);
  if (st) fetch_undo(L, t);
  return st;
}

/* Resolves a video file reference into t->path (checked by the path policy when `check`). */
static mml_status video_path(mml_loader *L, task *t, const char *ref, int check, mml_err *err) {
  const char *root = L->roots[t->sample.shard];
  mml_status st = mml_sample_image_path(root, ref, &t->path, err);
  if (!st && check)
    st = mml_sample_image_allowed(&L->cfg, root, ref, (const char *)t->path.data,
                                  !L->remote[t->sample.shard], err);
  return st;
}

typedef struct video_ctx {
  mml_loader *L;
  task *t;
  run_acc *acc;
  int decoding; /* the decode stage (else the plan's probe): where network waits count */
} video_ctx;

/* Pixel bytes of t's sample once planned (0 before): its batch needs at least those. */
static int64_t own_batch(const mml_loader *L, const task *t) {
  int64_t n = 0; /* (the rows are 0 until mml_sample_plan) */
  for (int p = 0; p < PLANES; p++)
    n += (p == PL_IMG ? t->sample.pixel_rows : t->sample.vpixel_rows) * (int64_t)L->row_bytes[p];
  return n;
}

/* (mu held) t holds delta more bytes of remote video ahead of their use in *field (its
 * first blocks or its preloaded packets): counted in t->held, so in max_memory. */
static void video_hold_locked(mml_loader *L, task *t, int64_t *field, int64_t delta) {
  *field += delta;
  L->video_held += delta;
  if (L->video_held > L->video_held_peak) L->video_held_peak = L->video_held;
  ld_mem_count_task_locked(L, t);
}

/* (mu held) Room for `bytes` of remote video fetched for t ahead of their use (into *field:
 * a first block, a decode's packets), taken (1), or none (0: they are read on demand when
 * needed).  Under max_memory they must fit beside everything counted, and all of them
 * together stay within a quarter of it, so the batches being built (whose decodes free
 * the preloads) always find the rest. */
static int video_reserve_locked(mml_loader *L, task *t, int64_t *field, int64_t bytes) {
  const int64_t cap = L->cfg.max_memory;
  if (cap &&
      (L->video_held + bytes > cap / 4 || !ld_mem_room_ahead_locked(L, bytes, own_batch(L, t)))) {
    L->video_preloads_refused++;
    return 0;
  }
  video_hold_locked(L, t, field, bytes);
  return 1;
}

void ld_task_release_videos_locked(mml_loader *L, task *t) {
  int closed = 0;
  for (int v = 0; v < t->vcap; v++) {
    mml_bytes_free(&t->vhead[v].first);
    mml_bytes_free(&t->vhead[v].tail);
    if (t->vhead[v].open_bytes && !t->vids[v]) { /* closed (or taken by its decode, done) */
      L->video_open_bytes -= t->vhead[v].open_bytes;
      t->vhead[v].open_bytes = 0;
      closed = 1;
    }
  }
  if (closed) ld_mem_count_task_locked(L, t);
  if (!t->vhead_bytes && !t->vpre_bytes) return;
  L->video_held -= t->vhead_bytes + t->vpre_bytes;
  t->vhead_bytes = t->vpre_bytes = 0;
  ld_mem_count_task_locked(L, t);
}

void ld_task_close_videos(mml_loader *L, task *t) {
  for (int v = 0; v < t->vcap; v++)
    if (t->vids[v]) {
      mml_video_close(t->vids[v]);
      t->vids[v] = NULL;
      __atomic_fetch_sub(&L->videos_kept, 1, __ATOMIC_RELAXED);
    }
}

int64_t ld_release_videos_ahead_locked(mml_loader *L) {
  int64_t freed = 0;
  for (int64_t s = L->head_seq; s < L->next_seq; s++) {
    task *t = &L->tasks[s % L->window];
    if (t->seq != s || t->gen != L->gen || t->state != SLOT_PLANNED || t->dec == DEC_RUNNING ||
        (t->tk >= 0 && t->tk == L->tk_head))
      continue;
    int64_t before = t->held;
    ld_task_close_videos(L, t); /* (nothing in flight: a planned sample's preloads are in) */
    ld_task_release_videos_locked(L, t);
    freed += before - t->held;
  }
  return freed;
}

/* Keeps video v of t open from its probe to its decode (1), when few enough are and,
 * under max_memory, what it holds idle (mml_video_held_bytes: demuxer state and tables)
 * has room ahead of the next batch; counted in t's bytes until it is closed.  Else (0)
 * the caller closes it and the decode opens it again. */
static int keep_video(mml_loader *L, task *t, int v, mml_video *vid) {
  if (__atomic_add_fetch(&L->videos_kept, 1, __ATOMIC_RELAXED) > MML_VIDEOS_KEPT_OPEN) {
    __atomic_fetch_sub(&L->videos_kept, 1, __ATOMIC_RELAXED);
    return 0;
  }
  mml_video_idle(vid);
  int64_t bytes = mml_video_held_bytes(vid);
  pthread_mutex_lock(&L->mu);
  int room = ld_mem_room_ahead_locked(L, bytes, 0);
  if (room) {
    t->vhead[v].open_bytes = bytes;
    L->video_open_bytes += bytes;
    if (L->video_open_bytes > L->video_open_peak) L->video_open_peak = L->video_open_bytes;
    ld_mem_count_task_locked(L, t);
  }
  pthread_mutex_unlock(&L->mu);
  if (!room) {
    __atomic_fetch_sub(&L->videos_kept, 1, __ATOMIC_RELAXED);
    return 0;
  }
  t->vids[v] = vid;
  return 1;
}

/* Opens video file v of t's record: the one its probe kept open, else its WebDataset
 * member's bytes, else its path or URL (range reads through the loader's fetcher).
 * Bytes read are counted. */
static mml_status video_open(void *ctx, int v, mml_video **out, mml_err *err) {
  video_ctx *c = ctx;
  mml_loader *L = c->L;
  task *t = c->t;
  if (t->vids[v]) { /* the caller closes it */
    *out = t->vids[v];
    t->vids[v] = NULL;
    __atomic_fetch_sub(&L->videos_kept, 1, __ATOMIC_RELAXED);
    mml_video_count_waits(*out, &L->video_decode_waits);
    return MML_OK;
  }
  const char *ref = t->rec.videos[v].ref;
  const mml_bytes *member = &t->imgs[t->rec.nimages + mml_record_frames(&t->rec) + v];
  const mml_pipeline *pl = &L->src[t->sample.source].pl;
  mml_video_src src = {.name = ref,
                       .max_bytes = L->cfg.max_object_bytes,
                       .threads = 1,
                       .max_pixels = pl->vision->max_image_pixels};
  mml_status st;
  if (member->len) {
    src.data = member->data;
    src.len = member->len;
  } else {
    if ((st = video_path(L, t, ref, 0, err))) return st;
    src.name = (const char *)t->path.data;
    if (mml_path_is_remote(src.name) && (st = ld_get_fetcher(L, &src.fetcher, err))) return st;
    if (!c->decoding && src.fetcher) { /* fetched with the images (head_video) */
      src.size = t->vhead[v].size;
      src.first = &t->vhead[v].first;
      src.tail = &t->vhead[v].tail;
      src.tail_off = t->vhead[v].tail_off;
    }
  }
  double t0 = mml_now();
  st = mml_video_open(&src, out, err);
  if (!member->len) {
    int64_t n = mml_video_bytes_read(*out);
    c->acc->bytes += (uint64_t)n;
    t->sample.bytes += (uint64_t)n;
  }
  if (!member->len) { /* (moved into the video) */
    mml_bytes_free(&t->vhead[v].first);
    mml_bytes_free(&t->vhead[v].tail);
  }
  c->acc->read_s += mml_now() - t0;
  uint64_t *waits = c->decoding ? &L->video_decode_waits : &L->video_plan_waits;
  if (!st) {
    __atomic_fetch_add(waits, (uint64_t)mml_video_waits(*out), __ATOMIC_RELAXED);
    mml_video_count_waits(*out, waits);
  }
  return st;
}

/* Every video file of t's record opened and probed (t->vinfo): the plan needs only the
 * metadata.  The file stays open (idle) for the decode stage, which then reads only the
 * frames it decodes (no second open, probe or packet pass), unless too many are. */
static mml_status probe_videos(mml_loader *L, task *t, run_acc *acc, mml_err *err) {
  video_ctx c = {L, t, acc, 0};
  for (int v = 0; v < t->rec.nvideos; v++) {
    memset(&t->vinfo[v], 0, sizeof t->vinfo[v]);
    if (!t->rec.videos[v].ref) continue;
    mml_video *vid = NULL;
    mml_status st = video_open(&c, v, &vid, err);
    if (!st) st = mml_video_probe(vid, &t->vinfo[v], err);
    if (st || !keep_video(L, t, v, vid)) mml_video_close(vid);
    if (st) return st;
  }
  return MML_OK;
}

/* A preloaded range of one of t's videos arrived (the fetcher's I/O thread). */
static void on_video_loaded(void *ctx, size_t bytes) {
  task *t = ctx;
  mml_loader *L = t->L;
  pthread_mutex_lock(&L->mu);
  L->bytes_read += bytes;
  t->fetched_bytes += bytes;
  if (--t->pending == 0) ready_push_locked(L, t);
  pthread_mutex_unlock(&L->mu);
}

/* The planned sample's remote videos kept open: the packets their kept frames need are
 * fetched now (mml_video_preload), the task waits for them (*wait) in STAGE_VIDEOS.  A
 * video that cannot be preloaded (out of memory here, no max_memory room, more than a
 * video may hold) is read on demand by its decode, as without a preload: a failure here
 * does not fail the sample. */
static mml_status preload_videos(mml_loader *L, task *t, int *wait, mml_err *err) {
  enum { GUARD = 1 << 30 }; /* completions cannot bring pending to 0 while submitting */
  enum { PRELOAD_MAX = 64 << 20 };
  int total = 0, any = 0;
  mml_status st = MML_OK;
  /* what one video may hold in memory from its plan to its decode (under max_memory also
   * counted there: video_reserve_locked) */
  const int64_t cap = L->cfg.max_memory ? L->cfg.max_memory / 16 : PRELOAD_MAX;
  for (int v = 0; v < t->rec.nvideos && !st; v++) {
    const mml_video_plan *p = &t->vplans[v];
    if (!t->vids[v] || !p->file || p->nframes <= 0 || p->nframes > INT_MAX) continue;
    int64_t *idx = malloc((size_t)p->nframes * sizeof *idx);
    if (!idx) break;
    mml_video_indices(&p->smp, idx);
    int64_t bytes = mml_video_preload_bytes(t->vids[v], idx, (int)p->nframes);
    pthread_mutex_lock(&L->mu);
    int room = bytes > 0 && bytes <= cap && video_reserve_locked(L, t, &t->vpre_bytes, bytes);
    if (room && !any++) {
      t->pending = GUARD;
      t->fetched_bytes = 0;
    }
    pthread_mutex_unlock(&L->mu);
    int k = 0;
    if (room)
      st = mml_video_preload(t->vids[v], idx, (int)p->nframes, bytes, on_video_loaded, t, &k, err);
    free(idx);
    if (room && !k) { /* nothing submitted: nothing held */
      pthread_mutex_lock(&L->mu);
      video_hold_locked(L, t, &t->vpre_bytes, -bytes);
      pthread_mutex_unlock(&L->mu);
    }
    total += k;
  }
  if (st) mml_err_clear(err); /* the rest is read on demand */
  if (!any) return MML_OK;
  t->stage = STAGE_VIDEOS;
  pthread_mutex_lock(&L->mu);
  t->pending += total - GUARD;
  int done = t->pending == 0;
  pthread_mutex_unlock(&L->mu);
  if (!done) *wait = 1; /* the last completion re-queues the task (even after a failure) */
  return MML_OK;
}

/* A remote video's HEAD (ref[0]), first block (ref[1]) or header tail (ref[2]) came (the
 * fetcher's I/O thread).
 * A failure is left to the open, which asks again and reports it. */
static void on_video_head(void *ctx, mml_status st, mml_bytes *body, const mml_err *err) {
  (void)err;
  fetch_ref *r = ctx;
  task *t = r->t;
  mml_loader *L = t->L;
  task_vhead *h = &t->vhead[r->which];
  pthread_mutex_lock(&L->mu);
  if (st == MML_OK && body && r == &h->ref[0] && body->len >= sizeof(int64_t)) {
    memcpy(&h->size, body->data, sizeof h->size);
  } else if (st == MML_OK && body && r == &h->ref[1]) {
    mml_bytes_free(&h->first);
    h->first = *body;              /* take the memory */
    memset(body, 0, sizeof *body); /* (counted read by the open that takes it) */
  } else if (st == MML_OK && body && r == &h->ref[2]) {
    mml_bytes_free(&h->tail);
    h->tail = *body;
    memset(body, 0, sizeof *body);
  }
  if (--t->pending == 0) ready_push_locked(L, t);
  pthread_mutex_unlock(&L->mu);
}

/* Video v of t's record, a remote file at t->path: its HEAD and its first block (what its
 * open reads first, at plan time) are submitted with the images, counted in *nremote; the
 * block only with max_memory room for it (video_reserve_locked; else the open reads it). */
static void head_video(mml_loader *L, task *t, int v, mml_fetcher **f, int *nremote) {
  task_vhead *h = &t->vhead[v];
  h->size = 0;
  mml_bytes_clear(&h->first);
  mml_err e;
  const char *url = (const char *)t->path.data;
  if (!mml_path_is_remote(url) || (!*f && ld_get_fetcher(L, f, &e))) return;
  for (int k = 0; k < 2; k++) {
    if (k) { /* the first block's memory counts from now until the probe has used it */
      pthread_mutex_lock(&L->mu);
      int room = video_reserve_locked(L, t, &t->vhead_bytes, MML_VIDEO_BLOCK);
      pthread_mutex_unlock(&L->mu);
      if (!room) return; /* the open reads it */
    }
    fetch_one_more(L, t, nremote);
    h->ref[k] = (fetch_ref){.t = t, .which = v};
    mml_status st = k ? mml_fetch_submit(*f, url, 0, MML_VIDEO_BLOCK, on_video_head, &h->ref[k], &e)
                      : mml_fetch_submit_head(*f, url, on_video_head, &h->ref[k], &e);
    if (st) { /* the open asks again */
      fetch_undo(L, t);
      if (k) {
        pthread_mutex_lock(&L->mu);
        video_hold_locked(L, t, &t->vhead_bytes, -MML_VIDEO_BLOCK);
        pthread_mutex_unlock(&L->mu);
      }
      return;
    }
  }
}

/* Video v of t's record, a remote mp4/mov whose HEAD and first block came but whose index
 * (moov) is not all in that block (past an mdat, or longer), or an mkv/webm/avi of up to
 * 1 + 8 MiB (its open's packet pass reads it all): the bytes its open reads for it
 * (mml_video_header_range) are fetched in one ranged GET, counted in *nremote, with
 * max_memory room (video_reserve_locked, as the first block; else the open reads them). */
static void tail_video(mml_loader *L, task *t, int v, mml_fetcher **f, int *nremote) {
  enum { TAIL_MAX = 64 << 20, WHOLE_MAX = 8 << 20 };
  task_vhead *h = &t->vhead[v];
  int64_t off, end;
  mml_bytes_clear(&h->tail);
  mml_err e;
  if (h->size <= 0 || !h->first.len ||
      !mml_video_header_range(h->first.data, h->first.len, h->size, WHOLE_MAX, &off, &end) ||
      end - off > (L->cfg.max_memory ? L->cfg.max_memory / 16 : TAIL_MAX) ||
      video_path(L, t, t->rec.videos[v].ref, 0, &e) || (!*f && ld_get_fetcher(L, f, &e)))
    return;
  pthread_mutex_lock(&L->mu);
  int room = video_reserve_locked(L, t, &t->vhead_bytes, end - off);
  pthread_mutex_unlock(&L->mu);
  if (!room) return;
  h->tail_off = off;
  fetch_one_more(L, t, nremote);
  h->ref[2] = (fetch_ref){.t = t, .which = v};
  if (mml_fetch_submit(*f, (const char *)t->path.data, off, end - off, on_video_head, &h->ref[2],
                       &e)) {
    fetch_undo(L, t);
    pthread_mutex_lock(&L->mu);
    video_hold_locked(L, t, &t->vhead_bytes, -(end - off));
    pthread_mutex_unlock(&L->mu);
  }
}

/* Stage 2: the record parsed, its images read or fetched (*wait: the task waits). */
static mml_status stage_images(mml_loader *L, task *t, run_acc *acc, int *wait, mml_err *err) {
  if (t->fetch_st) {
    *err = t->fetch_err;
    return t->fetch_st;
  }
  mml_status st = parse_record(L, t, acc, err);
  if (st) return st;
  t->stage = STAGE_IMAGES;
  t->vtails = 0;
  int nremote = 0;
  mml_fetcher *f = NULL;
  const int nmedia = t->rec.nimages + mml_record_frames(&t->rec);
  for (int i = 0; i < nmedia + t->rec.nvideos; i++) {
    if (i < nmedia) {
      st = load_image(L, t, i, mml_record_media_ref(&t->rec, i), &f, &nremote, acc, err);
    } else { /* a video file: a WebDataset member is read like an image, others are opened
              * by path or URL when planned (video_open) */
      const char *ref = t->rec.videos[i - nmedia].ref;
      mml_bytes_clear(&t->imgs[i]);
      if (!ref) continue;
      int64_t off, len;
      if (mml_index_member(&L->ix, t->sample.shard, t->sample.index, ref, &off, &len))
        st = load_image(L, t, i, ref, &f, &nremote, acc, err);
      else if (!(st = video_path(L, t, ref, 1, err)))
        head_video(L, t, i - nmedia, &f, &nremote);
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
      if (t->rec.videos[v].ref) tail_video(L, t, v, &f, &nremote);
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
  mml_status st = probe_videos(L, t, acc, err);
  pthread_mutex_lock(&L->mu); /* the first blocks were read (and dropped) by the probes */
  ld_task_release_videos_locked(L, t);
  pthread_mutex_unlock(&L->mu);
  if (st) return st;
  st = mml_sample_plan(&L->src[t->sample.source].pl, sc, &t->rec, t->imgs, t->plans, t->vinfo,
                       t->vplans, &t->sample, err);
  if (!st) st = ld_mem_check_sample(L, t, err);                   /* max_memory: can it ever fit? */
  if (!st) st = mml_collator_check(L->collator, &t->sample, err); /* e.g. too long */
  if (st) return st;
  return preload_videos(L, t, wait, err);
}

/* Runs the task as far as it can without waiting.  Returns 1 when the sample is finished
 * (good or failed), 0 when it waits for fetches. */
static int task_run(mml_loader *L, mml_sample_scratch *sc, task *t, run_acc *acc) {
  mml_err err;
  mml_err_clear(&err);
  mml_status st = MML_OK;
  int wait = 0;
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

/* The next task to run: a placed sample's decode (past those waiting for scratch room), a
 * ready one, or the next seq in the window.  Emits queued batches first.  NULL once
 * stopping. */
static task *take_task_locked(mml_loader *L) {
  while (!L->stop) {
    if (L->jobs_queued && !ld_emit_gated_locked(L)) { /* emitting unblocks the output first */
      ld_emit_job_locked(L);
      continue;
    }
    /* then pixels of batches already composed, in order, but past decodes that wait for
     * max_memory room for their scratch */
    int dec_wait = 0;
    task *run = NULL, *prev = NULL;
    for (task *t = L->dec_head, *next; t && !run; t = next) {
      next = t->next_dec;
      const int drop = t->gen != L->gen || !ld_place_has_dests(t);
      /* once one waits, later ones that need scratch too wait behind it (no overtaking) */
      if (!drop && ((dec_wait && t->scratch_need > 0) || !ld_mem_scratch_take_locked(L, t))) {
        dec_wait = 1;
        prev = t;
        continue;
      }
      if (prev)
        prev->next_dec = next;
      else
        L->dec_head = next;
      if (L->dec_tail == t) L->dec_tail = prev;
      t->dec = DEC_NONE;
      if (t->gen != L->gen) { /* work of an abandoned plan */
        t->state = SLOT_EMPTY;
        pthread_cond_broadcast(&L->work_cv);
        continue;
      }
      if (drop) continue; /* unplaced meanwhile: it is queued again when placed */
      t->dec = DEC_RUNNING;
      L->decoding++;
      run = t;
    }
    if (run) return run;
    if (L->ready_head) {
      task *t = L->ready_head;
      L->ready_head = t->next_ready;
      if (!L->ready_head) L->ready_tail = NULL;
      if (t->gen == L->gen) return t;
      t->state = SLOT_EMPTY; /* work of an abandoned plan */
      L->in_flight--;
      pthread_cond_broadcast(&L->work_cv);
      continue;
    }
    int gated = 0; /* max_memory: no room to read one more sample now */
    if (L->next_seq < L->head_seq + L->window && (L->limit_seq < 0 || L->next_seq < L->limit_seq) &&
        L->tasks[L->next_seq % L->window].state == SLOT_EMPTY &&
        !(gated = !ld_mem_may_read_locked(L))) {
      task *t = &L->tasks[L->next_seq % L->window];
      ld_task_close_videos(L, t); /* an abandoned plan's */
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
      t->started = mml_now();
      mml_sample_reset(&t->sample);
      ld_plan_at_locked(L, t->seq, &t->sample.epoch, &t->sample.pos);
      L->in_flight++;
      return t;
    }
    if (gated || dec_wait) { /* room comes back as the consumer releases batches: look again soon */
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      ts.tv_nsec += 5000000;
      if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
      pthread_cond_timedwait(&L->work_cv, &L->mu, &ts);
      continue;
    }
    pthread_cond_wait(&L->work_cv, &L->mu);
  }
  return NULL;
}

/* The planned (or failed) task's slot goes to the planner and collator (or back to the
 * window if its plan was abandoned meanwhile).  A good sample with pixels waits PLANNED
 * for its decode; the others are final. */
static void finish_task_locked(mml_loader *L, task *t) {
  L->in_flight--;
  if (t->scratch_need > L->scratch_max) L->scratch_max = t->scratch_need; /* holds looked for */
  if (t->sample.status == MML_OK) {
    const int64_t px = t->sample.pixel_rows * (int64_t)L->row_bytes[PL_IMG] +
                       t->sample.vpixel_rows * (int64_t)L->row_bytes[PL_VID];
    if (px > L->px_max) L->px_max = px;
  }
  ld_mem_count_task_locked(L, t);
  if (t->gen == L->gen) {
    int later = t->sample.status == MML_OK && L->placing &&
                (t->sample.pixel_rows > 0 || t->sample.vpixel_rows > 0);
    if (t->sample.status == MML_OK && !later) L->images += (uint64_t)t->sample.nimages;
    t->state = later ? SLOT_PLANNED : SLOT_DONE;
    pthread_cond_signal(&L->coll_cv);
  } else {
    t->state = SLOT_EMPTY;
    pthread_cond_broadcast(&L->work_cv);
  }
  if (t->state != SLOT_PLANNED) { /* its videos and bytes are no longer read */
    ld_task_close_videos(L, t);
    ld_task_release_videos_locked(L, t);
    ld_bytes_return_locked(L, t);
  }
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
  if (dst[PL_IMG] && L->compact) { /* uint8 rows (loader_place.c COMPACT): the same plans */
    const mml_pipeline *pu = &L->src[t->sample.source].pl_u8;
    for (int i = 0; i < t->rec.nimages; i++) t->plans[i].cols = mml_vision_pixel_cols(pu->vision);
    st = mml_sample_decode(pu, sc, &t->rec, t->imgs, t->plans, t->rec.nimages, dst[PL_IMG], &err);
  } else if (dst[PL_IMG]) {
    st = mml_sample_decode(pl, sc, &t->rec, t->imgs, t->plans, t->rec.nimages, dst[PL_IMG], &err);
  }
  if (!st && dst[PL_VID]) {
    video_ctx c = {L, t, &acc, 1};
    st = mml_sample_decode_videos(pl, sc, &t->rec, t->imgs, t->vplans, video_open, &c, dst[PL_VID],
                                  &err);
  }
  ld_task_close_videos(L, t); /* those a failure left undecoded */
  if (L->cfg.max_memory) mml_vision_scratch_trim(sc->vision, MML_SCRATCH_KEEP);
  pthread_mutex_lock(&L->mu);       /* the planner reads the status under mu */
  ld_mem_scratch_give_locked(L, t); /* its scratch is back to the worker's reserve */
  L->decoding--;
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
    pthread_cond_broadcast(&L->work_cv);
    return;
  }
  if (!st) L->images += (uint64_t)t->sample.nimages;
  t->state = SLOT_DONE;
  pthread_cond_signal(&L->coll_cv);
}

void *ld_worker_main(void *arg) {
  mml_loader *L = arg;
  mml_sample_scratch sc;
  mml_err err;
  int have_scratch = mml_sample_scratch_init(&sc, &err) == MML_OK;
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
        L->decoding--;
        t->dec = DEC_NONE;
        t->state = t->gen == L->gen ? SLOT_DONE : SLOT_EMPTY;
        pthread_cond_broadcast(&L->work_cv);
        pthread_cond_signal(&L->coll_cv);
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
