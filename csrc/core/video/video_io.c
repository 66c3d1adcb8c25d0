/*
 * video_io.c — the bytes under a video's AVIOContext (see video_io.h).
 *
 * A remote object is read in aligned blocks of io->block bytes with ranged GETs through
 * the fetcher (mml_fetch_get, the same path WebDataset members take), so the demuxer's
 * reads and seeks (an mp4's moov, then the few samples a decode needs) fetch only the
 * blocks they touch; bytes the reader named ahead (mml_vio_will_read) are fetched as
 * pieces of their own ranges instead (invariant 2).  Errors from the source are remembered in io->st/io->err (FFmpeg
 * only sees AVERROR(EIO)) so the caller reports the real cause: missing object, HTTP
 * status, max_bytes.  Threads: none of its own; the caller's thread runs the callbacks.
 *
 * Fetching ahead: the reader names the byte ranges it reads next (mml_vio_will_read: the
 * packet pass over an mkv, the samples an mp4 decode needs); their blocks become a hint
 * list, and up to MML_VIO_AHEAD of the next ones not cached are submitted at once
 * (mml_fetch_submit, completed on the fetcher's I/O thread under io->mu).  A block the
 * reader misses is taken from them (waiting for it when still in flight), else fetched
 * on demand as before; each miss moves the hint on and submits more.  The bytes read and
 * charged are those of reading without the hint: a block fetched ahead counts when it is
 * taken, one that failed is fetched again on demand (which reports the failure).  Idle
 * and close wait for what is in flight (the callbacks write into io).
 *
 * Preloading (mml_vio_preload): the loader names the exact byte ranges of the packets a
 * planned decode reads (an mp4's samples, from its index) when the sample is planned; each
 * is one ranged GET submitted at once, and the task's decode is queued only when all have
 * arrived (the loaded callback), so the decode reads them from memory and never waits.  A
 * read inside an arrived range is served from it; anything else (a range that failed, a
 * read the index did not foresee) falls back to the blocks above, and every such wait on
 * the network is counted (io->waits, *io->wait_count), so tests and stats can show there
 * were none.  Close waits for the ranges in flight.
 *
 * Invariants (tests cite them):
 *   1. At most MML_VIO_BLOCKS blocks or pieces are cached and MML_VIO_AHEAD in flight,
 *      each at most io->block bytes: what a reader holds does not grow with the file.
 *   2. A named range is fetched as pieces that start at its first byte (at most a block
 *      each), never rounded out to aligned blocks: a decode that was not preloaded (no
 *      max_memory room for it, more than a video may hold) fetches its packets' bytes, not
 *      the 1 MiB blocks around them (an mp4 decode of 4 frames of a 21 MB file under
 *      max_memory: 4.5 MB of packets fetched as 7.5 MB of blocks before).  A byte already
 *      cached (the first block, still held) is served from the cache, not fetched again.
 *
 * Also here: mml_video_header_range, which bytes of a remote file its open reads past the
 * first block (an mp4's top-level boxes, an mkv/avi's packets), for a caller to fetch them
 * ahead and pass them in (mml_vio_open's tail).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "video_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <libavformat/avio.h>
#include <libavutil/error.h>

#include "mml/fetch_sync.h"
#include "mml/video.h"

static mml_status open_file(mml_vio *io, mml_err *err) {
  io->fd = open(io->name, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (io->fd < 0)
    return mml_err_set(err, errno == ENOENT ? MML_ENOENT : MML_EIO, "%s: %s", io->name,
                       strerror(errno));
  struct stat sb;
  if (fstat(io->fd, &sb) || !S_ISREG(sb.st_mode))
    return mml_err_set(err, MML_EIO, "%s: not a regular file", io->name);
  io->size = (int64_t)sb.st_size;
  return MML_OK;
}

enum { AH_FREE, AH_FLIGHT, AH_DONE };
#define AH_WINDOW (MML_VIO_AHEAD + MML_VIO_BLOCKS) /* hints looked at from hint_at on */

static void ahead_done(void *ctx, mml_status st, mml_bytes *body, const mml_err *err) {
  mml_vio_ahead *a = ctx;
  mml_vio *io = a->io;
  (void)err; /* a failed block is fetched again on demand, which reports it */
  pthread_mutex_lock(&io->mu);
  a->st = st;
  if (st == MML_OK && body) { /* the memory moves here */
    a->b = *body;
    memset(body, 0, sizeof *body);
  }
  a->state = AH_DONE;
  pthread_cond_broadcast(&io->cv);
  pthread_mutex_unlock(&io->mu);
}

/* Waits for the fetches in flight, then drops every block fetched ahead and the hint. */
static void ahead_drop(mml_vio *io) {
  if (!io->mu_init) return;
  pthread_mutex_lock(&io->mu);
  for (int i = 0; i < MML_VIO_AHEAD; i++) {
    while (io->ahead[i].state == AH_FLIGHT) pthread_cond_wait(&io->cv, &io->mu);
    mml_bytes_free(&io->ahead[i].b);
    io->ahead[i].state = AH_FREE;
  }
  pthread_mutex_unlock(&io->mu);
  io->nhint = io->hint_at = 0;
}

/* Counts one wait of the reader on the network. */
static void waited(mml_vio *io) {
  io->waits++;
  if (io->wait_count) __atomic_fetch_add(io->wait_count, 1, __ATOMIC_RELAXED);
}

static void pre_done(void *ctx, mml_status st, mml_bytes *body, const mml_err *err) {
  mml_vio_range *g = ctx;
  mml_vio *io = g->io;
  (void)err; /* a failed range is read on demand, which reports it */
  pthread_mutex_lock(&io->mu);
  g->st = st;
  if (st == MML_OK && body) {
    g->b = *body;
    memset(body, 0, sizeof *body);
  }
  size_t got = g->b.len;
  mml_vio_loaded_fn loaded = io->loaded; /* io may be closed once the state says arrived */
  void *lctx = io->loaded_ctx;
  g->state = AH_DONE;
  pthread_cond_broadcast(&io->cv);
  pthread_mutex_unlock(&io->mu);
  if (loaded) loaded(lctx, got);
}

/* Waits for the preloaded ranges in flight, then drops them all. */
static void pre_drop(mml_vio *io) {
  if (!io->mu_init || !io->pre) return;
  pthread_mutex_lock(&io->mu);
  for (int i = 0; i < io->npre; i++) {
    while (io->pre[i].state == AH_FLIGHT) pthread_cond_wait(&io->cv, &io->mu);
    mml_bytes_free(&io->pre[i].b);
  }
  pthread_mutex_unlock(&io->mu);
  free(io->pre);
  io->pre = NULL;
  io->npre = io->pre_at = 0;
}

mml_status mml_vio_preload(mml_vio *io, const int64_t *r, int n, mml_vio_loaded_fn loaded,
                           void *ctx, int *submitted, mml_err *err) {
  *submitted = 0;
  pre_drop(io);
  if (!io->mu_init || io->size < 0 || n <= 0) return MML_OK;
  if (!(io->pre = calloc((size_t)n, sizeof *io->pre)))
    return mml_err_set(err, MML_ENOMEM, "%s: out of memory for %d byte ranges", io->name, n);
  io->loaded = loaded;
  io->loaded_ctx = ctx;
  for (int k = 0; k < n; k++) {
    int64_t end = r[2 * k + 1] < io->size ? r[2 * k + 1] : io->size;
    if (r[2 * k] < 0 || end <= r[2 * k]) continue;
    io->pre[io->npre++] = (mml_vio_range){.io = io, .off = r[2 * k], .len = end - r[2 * k]};
  }
  for (int k = 0; k < io->npre; k++) {
    mml_vio_range *g = &io->pre[k];
    g->state = AH_FLIGHT; /* before the submit: the completion may come first */
    mml_err e;
    if (mml_fetch_submit(io->fetcher, io->name, g->off, g->len, pre_done, g, &e)) {
      g->state = AH_FREE; /* (a closing fetcher) the rest is read on demand */
      break;
    }
    (*submitted)++;
  }
  return MML_OK;
}

/* The preloaded range holding byte off (NULL: none arrived whole); waits for one still in
 * flight (counted). */
static mml_vio_range *pre_at(mml_vio *io, int64_t off) {
  if (!io->npre) return NULL;
  mml_vio_range *hit = NULL;
  pthread_mutex_lock(&io->mu);
  for (int j = 0; j < io->npre && !hit; j++) { /* from the last one read: reads go forward */
    mml_vio_range *g = &io->pre[(io->pre_at + j) % io->npre];
    if (off < g->off || off >= g->off + g->len || g->state == AH_FREE) continue;
    if (g->state == AH_FLIGHT) waited(io);
    while (g->state == AH_FLIGHT) pthread_cond_wait(&io->cv, &io->mu);
    if (g->st == MML_OK && (int64_t)g->b.len == g->len) hit = g;
  }
  pthread_mutex_unlock(&io->mu);
  if (hit) io->pre_at = (int)(hit - io->pre);
  return hit;
}

static int64_t block_len(const mml_vio *io, int64_t start) {
  return io->size - start < io->block ? io->size - start : io->block;
}

/* The cached block or piece holding byte off (-1: none). */
static int cached_at(const mml_vio *io, int64_t off) {
  for (int i = 0; i < MML_VIO_BLOCKS; i++)
    if (io->blk[i].off >= 0 && off >= io->blk[i].off &&
        off < io->blk[i].off + (int64_t)io->blk[i].b.len)
      return i;
  return -1;
}

static int hinted(const mml_vio *io, int64_t start) {
  for (int j = io->hint_at; j < io->nhint && j < io->hint_at + AH_WINDOW; j++)
    if (io->hint[2 * j] == start) return 1;
  return 0;
}

/* The hinted piece holding byte off, from hint_at on (its index, -1: none). */
static int hint_at_off(const mml_vio *io, int64_t off) {
  for (int j = io->hint_at; j < io->nhint; j++)
    if (off >= io->hint[2 * j] && off < io->hint[2 * j] + io->hint[2 * j + 1]) return j;
  return -1;
}

/* (mu held) A slot for block start: -1 when it is fetched ahead already or no slot is
 * free (a free one, else one holding a block the hint no longer names). */
static int ahead_slot(mml_vio *io, int64_t start) {
  for (int i = 0; i < MML_VIO_AHEAD; i++)
    if (io->ahead[i].state != AH_FREE && io->ahead[i].off == start) return -1;
  for (int i = 0; i < MML_VIO_AHEAD; i++)
    if (io->ahead[i].state == AH_FREE) return i;
  for (int i = 0; i < MML_VIO_AHEAD; i++)
    if (io->ahead[i].state == AH_DONE && !hinted(io, io->ahead[i].off)) return i;
  return -1;
}

/* Submits the next hinted blocks that are neither cached nor fetched ahead. */
static void ahead_pump(mml_vio *io) {
  for (int j = io->hint_at; !io->no_ahead && j < io->nhint && j < io->hint_at + AH_WINDOW; j++) {
    int64_t start = io->hint[2 * j], len = io->hint[2 * j + 1];
    if (cached_at(io, start) >= 0) continue;
    pthread_mutex_lock(&io->mu);
    int slot = ahead_slot(io, start);
    mml_vio_ahead *a = slot >= 0 ? &io->ahead[slot] : NULL;
    if (a) {
      mml_bytes_free(&a->b);
      *a = (mml_vio_ahead){.io = io, .off = start, .len = len, .state = AH_FLIGHT};
    }
    pthread_mutex_unlock(&io->mu);
    if (!a) continue;
    mml_err e;
    if (mml_fetch_submit(io->fetcher, io->name, a->off, a->len, ahead_done, a, &e)) {
      pthread_mutex_lock(&io->mu);
      a->state = AH_FREE;
      pthread_mutex_unlock(&io->mu);
      io->no_ahead = 1; /* (a closing fetcher) on demand from now on */
    }
  }
}

/* Block start (len bytes) fetched ahead, into *out: 1; 0 when it was not (or failed). */
static int ahead_take(mml_vio *io, int64_t start, int64_t len, mml_bytes *out) {
  if (!io->mu_init) return 0;
  int got = 0;
  pthread_mutex_lock(&io->mu);
  for (int i = 0; i < MML_VIO_AHEAD; i++) {
    mml_vio_ahead *a = &io->ahead[i];
    if (a->state == AH_FREE || a->off != start) continue;
    if (a->state == AH_FLIGHT) waited(io);
    while (a->state == AH_FLIGHT) pthread_cond_wait(&io->cv, &io->mu);
    if (a->st == MML_OK && a->len == len && (int64_t)a->b.len == len) {
      mml_bytes t = *out;
      *out = a->b;
      a->b = t;
      got = 1;
    }
    mml_bytes_free(&a->b);
    a->state = AH_FREE;
    break;
  }
  pthread_mutex_unlock(&io->mu);
  return got;
}

/* The block or piece at start was read: the hint moves past it, and more is fetched ahead. */
static void ahead_next(mml_vio *io, int64_t start) {
  if (!io->mu_init) return;
  for (int j = io->hint_at; j < io->nhint && j < io->hint_at + AH_WINDOW; j++)
    if (io->hint[2 * j] == start) {
      io->hint_at = j + 1;
      break;
    }
  ahead_pump(io);
}

void mml_vio_will_read(mml_vio *io, const int64_t *r, int n) {
  if (!io->mu_init || io->size < 0) return;
  io->nhint = io->hint_at = 0;
  if (!io->hint && !(io->hint = malloc(2 * MML_VIO_HINTS * sizeof *io->hint))) return;
  for (int k = 0; k < n && io->nhint < MML_VIO_HINTS; k++) {
    int64_t end = r[2 * k + 1] < io->size ? r[2 * k + 1] : io->size;
    /* invariant 2: pieces of the range itself, from its first byte, at most a block each */
    for (int64_t o = r[2 * k] < 0 ? 0 : r[2 * k]; o < end && io->nhint < MML_VIO_HINTS;
         o += io->block) {
      int dup = 0; /* ranges come in reading order: a repeat is among the last few */
      for (int j = io->nhint - 1; j >= 0 && j >= io->nhint - 8 && !dup; j--)
        dup = io->hint[2 * j] == o;
      if (dup) continue;
      io->hint[2 * io->nhint] = o;
      io->hint[2 * io->nhint + 1] = end - o < io->block ? end - o : io->block;
      io->nhint++;
    }
  }
  ahead_pump(io);
}

static int charge(mml_vio *io, int64_t n);

/* The remote source's first block, fetched by the caller: the first cached block. */
static void first_block(mml_vio *io, mml_bytes *first) {
  if (!first || io->size <= 0 || (int64_t)first->len != block_len(io, 0)) return;
  io->blk[0].off = 0;
  io->blk[0].used = ++io->tick;
  io->blk[0].b = *first; /* the memory moves here */
  memset(first, 0, sizeof *first);
  charge(io, (int64_t)io->blk[0].b.len);
}

/* More of the remote source's header, fetched by the caller: an arrived preloaded range. */
static void header_tail(mml_vio *io, mml_bytes *tail, int64_t off) {
  if (!tail || !tail->len || off < 0 || off + (int64_t)tail->len > io->size) return;
  if (!(io->pre = calloc(1, sizeof *io->pre))) return; /* (then read on demand) */
  io->pre[0] = (mml_vio_range){
      .io = io, .off = off, .len = (int64_t)tail->len, .state = AH_DONE, .st = MML_OK, .b = *tail};
  memset(tail, 0, sizeof *tail); /* the memory moves here */
  io->npre = 1;
}

mml_status mml_vio_open(mml_vio *io, const char *name, const uint8_t *data, size_t len,
                        mml_fetcher *f, int64_t max_bytes, int64_t block, int64_t size,
                        mml_bytes *first, mml_bytes *tail, int64_t tail_off, mml_err *err) {
  memset(io, 0, sizeof *io);
  io->name = name;
  io->fd = -1;
  io->max_bytes = max_bytes;
  io->block = block > 0 ? block : MML_VIDEO_BLOCK;
  for (int i = 0; i < MML_VIO_BLOCKS; i++) io->blk[i].off = -1;
  if (data) {
    io->data = data;
    io->size = (int64_t)len;
    return MML_OK;
  }
  if (!mml_path_is_remote(name)) return open_file(io, err);
  if (!f) return mml_err_set(err, MML_EINVAL, "%s: a remote video needs a fetcher", name);
  io->fetcher = f;
  for (int i = 0; i < MML_VIO_AHEAD; i++) io->ahead[i].io = io;
  pthread_mutex_init(&io->mu, NULL);
  pthread_cond_init(&io->cv, NULL);
  io->mu_init = 1;
  if (size > 0) { /* the caller's HEAD */
    io->size = size;
    first_block(io, first);
    header_tail(io, tail, tail_off);
    return MML_OK;
  }
  mml_err e = {0};
  waited(io); /* (no counter is set yet: counted in io->waits only) */
  mml_status st = mml_fetch_size(f, name, &io->size, &e);
  if (st == MML_ENOENT || st == MML_ENOMEM || st == MML_EINVAL) {
    if (err) *err = e;
    mml_err_prefix(err, "video");
    return st;
  }
  if (st) io->size = -1; /* no HEAD (a URL presigned for GET): the reads find the end */
  return MML_OK;
}

void mml_vio_close(mml_vio *io) {
  if (io->fd >= 0) close(io->fd);
  io->fd = -1;
  ahead_drop(io);
  pre_drop(io);
  free(io->hint);
  io->hint = NULL;
  if (io->mu_init) {
    pthread_mutex_destroy(&io->mu);
    pthread_cond_destroy(&io->cv);
    io->mu_init = 0;
  }
  for (int i = 0; i < MML_VIO_BLOCKS; i++) mml_bytes_free(&io->blk[i].b);
}

void mml_vio_idle(mml_vio *io) {
  ahead_drop(io);
  pre_drop(io);
  free(io->hint); /* (mml_vio_will_read allocates it again) */
  io->hint = NULL;
  for (int i = 0; i < MML_VIO_BLOCKS; i++) {
    mml_bytes_free(&io->blk[i].b);
    io->blk[i].off = -1;
  }
  io->charged_from = io->bytes_read;
}

static int fail(mml_vio *io, mml_status st, const mml_err *e) {
  if (!io->st) {
    io->st = st;
    if (e) io->err = *e;
    io->err.status = st;
  }
  return AVERROR(EIO);
}

int mml_vio_cancelled(mml_vio *io) {
  if (!mml_cancelled(io->cancel)) return 0;
  mml_err e;
  mml_err_set(&e, MML_ECANCELLED, "%s: video work cancelled", io->name);
  fail(io, MML_ECANCELLED, &e);
  return 1;
}

/* Counts n more bytes against max_bytes. */
static int charge(mml_vio *io, int64_t n) {
  io->bytes_read += n;
  if (io->max_bytes > 0 && io->bytes_read - io->charged_from > io->max_bytes) {
    mml_err e;
    mml_err_set(&e, MML_EOBJECTSIZE, "%s: video reads pass max_object_bytes (%lld)", io->name,
                (long long)io->max_bytes);
    return fail(io, MML_EOBJECTSIZE, &e);
  }
  return 0;
}

/* The cached block or piece holding byte off, fetched when absent (NULL on failure): the
 * hinted piece that holds it, else the aligned block. */
static const mml_bytes *block_at(mml_vio *io, int64_t off, int64_t *boff) {
  int hit = cached_at(io, off);
  if (hit >= 0) {
    io->blk[hit].used = ++io->tick;
    *boff = io->blk[hit].off;
    return &io->blk[hit].b;
  }
  int slot = 0;
  for (int i = 1; i < MML_VIO_BLOCKS; i++)
    if (io->blk[i].used < io->blk[slot].used) slot = i;
  int j = hint_at_off(io, off);
  int64_t start = j >= 0 ? io->hint[2 * j] : off / io->block * io->block;
  int64_t len = j >= 0 ? io->hint[2 * j + 1] : io->size >= 0 ? block_len(io, start) : io->block;
  mml_err e = {0};
  io->blk[slot].off = -1;
  mml_bytes_clear(&io->blk[slot].b);
  mml_status st = MML_OK;
  if (!ahead_take(io, start, len, &io->blk[slot].b)) {
    waited(io);
    st = mml_fetch_get_cancellable(io->fetcher, io->name, start, len, io->cancel, &io->blk[slot].b,
                                   &e);
  }
  if (!st && io->size < 0 && (int64_t)io->blk[slot].b.len < len) /* the end, found */
    io->size = start + (int64_t)(len = (int64_t)io->blk[slot].b.len);
  if (!st && (int64_t)io->blk[slot].b.len != len)
    st = mml_err_set(&e, MML_EFETCH, "%s: range %lld+%lld returned %zu bytes", io->name,
                     (long long)start, (long long)len, io->blk[slot].b.len);
  if (st) {
    fail(io, st, &e);
    return NULL;
  }
  if (charge(io, len)) return NULL;
  io->blk[slot].off = start;
  io->blk[slot].used = ++io->tick;
  *boff = start;
  ahead_next(io, start);
  return &io->blk[slot].b;
}

static int read_file(mml_vio *io, uint8_t *buf, int n) {
  ssize_t r;
  do r = pread(io->fd, buf, (size_t)n, io->pos);
  while (r < 0 && errno == EINTR);
  if (r < 0) {
    mml_err e;
    mml_err_set(&e, MML_EIO, "%s: read: %s", io->name, strerror(errno));
    return fail(io, MML_EIO, &e);
  }
  if (r == 0) return AVERROR_EOF;
  if (charge(io, r)) return AVERROR(EIO);
  return (int)r;
}

int mml_vio_read(void *opaque, uint8_t *buf, int size) {
  mml_vio *io = opaque;
  if (io->st) return AVERROR(EIO);
  if (mml_vio_cancelled(io)) return AVERROR_EXIT;
  if (size <= 0) return 0;
  if (io->size >= 0 && io->pos >= io->size) return AVERROR_EOF;
  int64_t left = io->size >= 0 ? io->size - io->pos : size;
  int n = left < size ? (int)left : size;
  int r;
  mml_vio_range *g;
  if (io->data) {
    memcpy(buf, io->data + io->pos, (size_t)n);
    r = n;
  } else if (io->fd >= 0) {
    r = read_file(io, buf, n);
  } else if ((g = pre_at(io, io->pos))) {
    if (!g->charged && charge(io, g->len)) return AVERROR(EIO);
    g->charged = 1;
    if (g->off + g->len - io->pos < n) n = (int)(g->off + g->len - io->pos);
    memcpy(buf, g->b.data + (io->pos - g->off), (size_t)n);
    r = n;
  } else {
    int64_t boff = 0;
    const mml_bytes *b = block_at(io, io->pos, &boff);
    if (!b) return AVERROR(EIO);
    int64_t in = (int64_t)b->len - (io->pos - boff);
    if (in <= 0) return AVERROR_EOF;
    if (in < n) n = (int)in;
    memcpy(buf, b->data + (io->pos - boff), (size_t)n);
    r = n;
  }
  if (r > 0) io->pos += r;
  return r;
}

int64_t mml_vio_seek(void *opaque, int64_t off, int whence) {
  mml_vio *io = opaque;
  whence &= ~AVSEEK_FORCE;
  if (whence == AVSEEK_SIZE) return io->size >= 0 ? io->size : AVERROR(ENOSYS);
  int64_t base = whence == SEEK_SET                    ? 0
                 : whence == SEEK_CUR                  ? io->pos
                 : whence == SEEK_END && io->size >= 0 ? io->size
                                                       : -1;
  if (base < 0 || base + off < 0) return AVERROR(EINVAL);
  io->pos = base + off;
  return io->pos;
}

/* ---- where a remote video's header lies (mml/video.h) ------------------------------- */

static uint64_t be(const uint8_t *p, int n) {
  uint64_t x = 0;
  for (int i = 0; i < n; i++) x = x << 8 | p[i];
  return x;
}

int mml_video_header_range(const uint8_t *b, size_t len, int64_t size, int64_t whole, int64_t *off,
                           int64_t *end) {
  *off = *end = 0;
  const int64_t n = (int64_t)len;
  if (!b || n < 16 || size <= n) return 0;
  if (!memcmp(b, "\x1a\x45\xdf\xa3", 4) || (!memcmp(b, "RIFF", 4) && !memcmp(b + 8, "AVI ", 4))) {
    if (size - n > whole) return 0; /* the packet pass reads it in blocks, on demand */
    *off = n;
    *end = size;
    return 1;
  }
  if (memcmp(b + 4, "ftyp", 4)) return 0;
  int64_t pos = 0;
  while (pos + 8 <= n) {
    int64_t sz = (int64_t)be(b + pos, 4), hdr = 8;
    if (sz == 1) { /* a 64-bit size follows */
      if (pos + 16 > n) break;
      uint64_t big = be(b + pos + 8, 8);
      if (big > (uint64_t)INT64_MAX) return 0;
      sz = (int64_t)big, hdr = 16;
    } else if (sz == 0) { /* to the end of the file */
      sz = size - pos;
    }
    if (sz < hdr || sz > size - pos) return 0; /* not a box chain we can follow */
    if (!memcmp(b + pos + 4, "moov", 4)) {
      if (pos + sz <= n) return 0; /* whole in the first bytes */
      *off = n;
      *end = pos + sz + MML_VIDEO_BLOCK < size ? pos + sz + MML_VIDEO_BLOCK : size;
      return 1;
    }
    pos += sz;
  }
  if (pos >= size) return 0;
  *off = pos > n ? pos : n;
  *end = size;
  return 1;
}
