/*
 * loader_video.c — the loader's video files, from the plan stage to the decode
 * (loader_worker.c runs the stages; this file is their video part).
 *
 * A remote file's HEAD and first block are fetched with the record's images
 * (ld_head_video), then, when its open would read more before it can plan (an mp4's
 * moov past that block, an mkv/webm/avi's packet pass), those bytes in one ranged GET
 * (ld_tail_video); the plan stage opens and probes every file (ld_probe_videos, reading
 * memory) and keeps it open, idle, for the decode (keep_video: its decoder closed, what it
 * holds counted in max_memory); once planned, the exact byte ranges its decode reads are
 * preloaded (ld_preload_videos) and the decode opens it from there (ld_video_open).
 * Bytes held ahead of their use count in max_memory and are taken only with room left
 * for the next batch (video_reserve_locked); a blocked head makes the samples whose video
 * bytes wait ahead of their decode (ld_video_ahead: not running, nor queued in the head
 * batch) close their kept videos (ld_release_videos_ahead_locked), the head batch's own
 * too: their decodes open them again.
 *
 * A later epoch's remote videos wait for it (issue 29): a sample whose epoch is past the
 * latest one the consumer asked a batch of (L->asked_epoch: next() called in it, or a
 * seek) is parked once its record is parsed (ld_video_park), before any of its media is
 * fetched, and goes on when the consumer asks for its epoch (ld_ask_epoch_locked, from
 * next(); loader.c ends an epoch at its last batch, so StopIteration needs nothing of the
 * next one).  A consumer that stops at an epoch's end has then fetched each of its
 * samples' video ranges once; before, the window (64 samples behind a remote source)
 * planned and preloaded the samples of the next epochs too (16 epochs of a 4-sample
 * dataset), fetching the same ranges again for each.  Invariants:
 *   1. No byte of a remote video (HEAD, first block, header, packets) is fetched for a
 *      sample of an epoch the consumer has not asked for.
 *   2. A parked sample holds its slot and its record only, and is not in flight (the
 *      max_memory admission and its deadlock checks do not wait for it); a seek releases
 *      it.
 *
 * Threads and locking: the task's fields belong to the thread holding its BUSY slot (or
 * running its decode); the counts shared with the planner (video_held, video_open_bytes,
 * the task's held bytes) change under the loader's mu; completions (on_video_head,
 * on_video_loaded) run on the fetcher's I/O thread and take mu.  videos_kept is atomic.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "loader_int.h"

/* Resolves a video file reference into t->path (checked by the path policy when `check`). */
mml_status ld_video_path(mml_loader *L, task *t, const char *ref, int check, mml_err *err) {
  const char *root = L->roots[t->sample.shard];
  mml_status st = mml_sample_image_path(root, ref, &t->path, err);
  if (!st && check)
    st = mml_sample_image_allowed(&L->cfg, root, ref, (const char *)t->path.data,
                                  !L->remote[t->sample.shard], err);
  return st;
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
  if (cap && (L->video_held + bytes > cap / 4 || !ld_mem_room_locked(L, bytes))) {
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

int ld_video_ahead(const mml_loader *L, const task *t) {
  /* the head batch's own too: counted behind the head (C7) and never closed, a video kept
   * open while there was room made a rerun at the message's max_memory fail */
  return t->dec == DEC_NONE || (t->dec == DEC_QUEUED && !(t->tk >= 0 && t->tk == L->tk_head));
}

int64_t ld_release_videos_ahead_locked(mml_loader *L) {
  int64_t freed = 0;
  for (int64_t s = L->head_seq; s < L->next_seq; s++) {
    task *t = &L->tasks[s % L->window];
    if (t->seq != s || t->gen != L->gen || t->state != SLOT_PLANNED || !ld_video_ahead(L, t))
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
 * has room (ld_mem_room_locked); counted in t's bytes until it is closed.  Else (0)
 * the caller closes it and the decode opens it again. */
static int keep_video(mml_loader *L, task *t, int v, mml_video *vid) {
  if (__atomic_add_fetch(&L->videos_kept, 1, __ATOMIC_RELAXED) > MML_VIDEOS_KEPT_OPEN) {
    __atomic_fetch_sub(&L->videos_kept, 1, __ATOMIC_RELAXED);
    return 0;
  }
  mml_video_idle(vid);
  int64_t bytes = mml_video_held_bytes(vid);
  pthread_mutex_lock(&L->mu);
  int room = ld_mem_room_locked(L, bytes);
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
mml_status ld_video_open(void *ctx, int v, mml_video **out, mml_err *err) {
  ld_video_ctx *c = ctx;
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
                       .max_pixels = pl->vision->max_image_pixels,
                       .plain_rgb = pl->vision->lf,
                       .cancel = &L->cancel};
  mml_status st;
  if (member->len) {
    src.data = member->data;
    src.len = member->len;
  } else {
    if ((st = ld_video_path(L, t, ref, 0, err))) return st;
    src.name = (const char *)t->path.data;
    if (mml_path_is_remote(src.name) && (st = ld_get_fetcher(L, &src.fetcher, err))) return st;
    if (!c->decoding && src.fetcher) { /* fetched with the images (ld_head_video) */
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
mml_status ld_probe_videos(mml_loader *L, task *t, run_acc *acc, mml_err *err) {
  ld_video_ctx c = {L, t, acc, 0};
  for (int v = 0; v < t->rec.nvideos; v++) {
    memset(&t->vinfo[v], 0, sizeof t->vinfo[v]);
    if (!t->rec.videos[v].ref) continue;
    mml_video *vid = NULL;
    mml_status st = ld_video_open(&c, v, &vid, err);
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
  if (--t->pending == 0) ld_ready_push_locked(L, t);
  pthread_mutex_unlock(&L->mu);
}

/* The planned sample's remote videos kept open: the packets their kept frames need are
 * fetched now (mml_video_preload), the task waits for them (*wait) in STAGE_VIDEOS.  A
 * video that cannot be preloaded (out of memory here, no max_memory room, more than a
 * video may hold) is read on demand by its decode, as without a preload: a failure here
 * does not fail the sample. */
mml_status ld_preload_videos(mml_loader *L, task *t, int *wait, mml_err *err) {
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
  if (--t->pending == 0) ld_ready_push_locked(L, t);
  pthread_mutex_unlock(&L->mu);
}

/* Video v of t's record, a remote file at t->path: its HEAD and its first block (what its
 * open reads first, at plan time) are submitted with the images, counted in *nremote; the
 * block only with max_memory room for it (video_reserve_locked; else the open reads it). */
void ld_head_video(mml_loader *L, task *t, int v, mml_fetcher **f, int *nremote) {
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
    ld_fetch_one_more(L, t, nremote);
    h->ref[k] = (fetch_ref){.t = t, .which = v};
    mml_status st = k ? mml_fetch_submit(*f, url, 0, MML_VIDEO_BLOCK, on_video_head, &h->ref[k], &e)
                      : mml_fetch_submit_head(*f, url, on_video_head, &h->ref[k], &e);
    if (st) { /* the open asks again */
      ld_fetch_undo(L, t);
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
void ld_tail_video(mml_loader *L, task *t, int v, mml_fetcher **f, int *nremote) {
  enum { TAIL_MAX = 64 << 20, WHOLE_MAX = 8 << 20 };
  task_vhead *h = &t->vhead[v];
  int64_t off, end;
  mml_bytes_clear(&h->tail);
  mml_err e;
  if (h->size <= 0 || !h->first.len ||
      !mml_video_header_range(h->first.data, h->first.len, h->size, WHOLE_MAX, &off, &end) ||
      end - off > (L->cfg.max_memory ? L->cfg.max_memory / 16 : TAIL_MAX) ||
      ld_video_path(L, t, t->rec.videos[v].ref, 0, &e) || (!*f && ld_get_fetcher(L, f, &e)))
    return;
  pthread_mutex_lock(&L->mu);
  int room = video_reserve_locked(L, t, &t->vhead_bytes, end - off);
  pthread_mutex_unlock(&L->mu);
  if (!room) return;
  h->tail_off = off;
  ld_fetch_one_more(L, t, nremote);
  h->ref[2] = (fetch_ref){.t = t, .which = v};
  if (mml_fetch_submit(*f, (const char *)t->path.data, off, end - off, on_video_head, &h->ref[2],
                       &e)) {
    ld_fetch_undo(L, t);
    pthread_mutex_lock(&L->mu);
    video_hold_locked(L, t, &t->vhead_bytes, -(end - off));
    pthread_mutex_unlock(&L->mu);
  }
}

int ld_video_park(mml_loader *L, task *t) {
  int remote = 0;
  for (int v = 0; v < t->rec.nvideos && !remote; v++) {
    const char *ref = t->rec.videos[v].ref;
    int64_t off, len;
    const uint8_t *bp;
    size_t bn;
    mml_err e;
    if (!ref || mml_index_member(&L->ix, t->sample.shard, t->sample.index, ref, &off, &len) ||
        (mml_index_shard_parquet(&L->ix.shards[t->sample.shard]) &&
         ld_pq_row_member(&t->pqrow, ref, &bp, &bn))) /* (as stage_images tells them) */
      continue;
    if (!ld_video_path(L, t, ref, 0, &e)) remote = mml_path_is_remote((const char *)t->path.data);
  }
  if (!remote) return 0;
  pthread_mutex_lock(&L->mu);
  int park = t->gen == L->gen && t->sample.epoch > L->asked_epoch;
  if (park) { /* not in flight: nothing it holds can change until it is asked for */
    t->next_ready = L->parked_head;
    L->parked_head = t;
    L->in_flight--;
    ld_room_gates_changed_locked(L); /* loader_admit.c W5: the read gate counts in_flight */
  }
  pthread_mutex_unlock(&L->mu);
  return park;
}

void ld_ask_epoch_locked(mml_loader *L, int64_t epoch, int force) {
  if (!force && epoch <= L->asked_epoch) return;
  L->asked_epoch = epoch;
  for (task **p = &L->parked_head; *p;) {
    task *t = *p;
    if (t->gen == L->gen && t->sample.epoch > epoch) { /* still later: stays parked */
      p = &t->next_ready;
      continue;
    }
    *p = t->next_ready;
    L->in_flight++;
    ld_ready_push_locked(L, t); /* (an abandoned plan's: dropped there) */
  }
  ld_work_wake(L, 1);
}
