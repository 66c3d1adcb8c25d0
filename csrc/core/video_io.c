/*
 * video_io.c — the bytes under a video's AVIOContext (see video_io.h).
 *
 * A remote object is read in aligned blocks of io->block bytes with ranged GETs through
 * the fetcher (mml_fetch_get, the same path WebDataset members take), so the demuxer's
 * reads and seeks (an mp4's moov, then the few samples a decode needs) fetch only the
 * blocks they touch.  Errors from the source are remembered in io->st/io->err (FFmpeg
 * only sees AVERROR(EIO)) so the caller reports the real cause: missing object, HTTP
 * status, max_bytes.  Threads: none of its own; the caller's thread runs the callbacks.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "video_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <libavformat/avio.h>
#include <libavutil/error.h>

#include "mml/fetch_sync.h"

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

mml_status mml_vio_open(mml_vio *io, const char *name, const uint8_t *data, size_t len,
                        mml_fetcher *f, int64_t max_bytes, int64_t block, mml_err *err) {
  memset(io, 0, sizeof *io);
  io->name = name;
  io->fd = -1;
  io->max_bytes = max_bytes;
  io->block = block > 0 ? block : (int64_t)1 << 20;
  for (int i = 0; i < MML_VIO_BLOCKS; i++) io->blk[i].off = -1;
  if (data) {
    io->data = data;
    io->size = (int64_t)len;
    return MML_OK;
  }
  if (!mml_path_is_remote(name)) return open_file(io, err);
  if (!f) return mml_err_set(err, MML_EINVAL, "%s: a remote video needs a fetcher", name);
  io->fetcher = f;
  mml_err e = {0};
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
  for (int i = 0; i < MML_VIO_BLOCKS; i++) mml_bytes_free(&io->blk[i].b);
}

void mml_vio_idle(mml_vio *io) {
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

/* The cached block holding byte off, fetched when absent (NULL on failure). */
static const mml_bytes *block_at(mml_vio *io, int64_t off, int64_t *boff) {
  int64_t start = off / io->block * io->block;
  int slot = 0;
  for (int i = 0; i < MML_VIO_BLOCKS; i++) {
    if (io->blk[i].off == start) {
      io->blk[i].used = ++io->tick;
      *boff = start;
      return &io->blk[i].b;
    }
    if (io->blk[i].used < io->blk[slot].used) slot = i;
  }
  int64_t len = io->size >= 0 && io->size - start < io->block ? io->size - start : io->block;
  mml_err e = {0};
  io->blk[slot].off = -1;
  mml_bytes_clear(&io->blk[slot].b);
  mml_status st = mml_fetch_get(io->fetcher, io->name, start, len, &io->blk[slot].b, &e);
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
  if (size <= 0) return 0;
  if (io->size >= 0 && io->pos >= io->size) return AVERROR_EOF;
  int64_t left = io->size >= 0 ? io->size - io->pos : size;
  int n = left < size ? (int)left : size;
  int r;
  if (io->data) {
    memcpy(buf, io->data + io->pos, (size_t)n);
    r = n;
  } else if (io->fd >= 0) {
    r = read_file(io, buf, n);
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
