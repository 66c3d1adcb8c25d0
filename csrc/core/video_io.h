/*
 * video_io.h — private to video*.c: the byte source behind a video's AVIOContext.
 * A local file (pread), a buffer in memory, or a remote object read in fixed blocks
 * through the fetcher (a handful cached, least recently used evicted).  Single-threaded:
 * one per mml_video, used by the thread that decodes it.
 */
#ifndef MML_VIDEO_IO_H
#define MML_VIDEO_IO_H

#include "mml/common.h"
#include "mml/fetch.h"

#define MML_VIO_BLOCKS 4

typedef struct mml_vio {
  const char *name;     /* path or URL (borrowed from the mml_video) */
  const uint8_t *data;  /* memory source */
  int fd;               /* file source (-1: none) */
  mml_fetcher *fetcher; /* remote source (NULL: none) */
  int64_t size;         /* bytes of the source (-1: unknown) */
  int64_t pos;          /* next byte the demuxer reads */
  int64_t block;        /* remote block size */
  struct {
    int64_t off;   /* -1: empty */
    uint64_t used; /* LRU tick */
    mml_bytes b;
  } blk[MML_VIO_BLOCKS];
  uint64_t tick;
  int64_t bytes_read, max_bytes;
  int64_t charged_from; /* bytes_read when the current use began (mml_vio_idle) */
  mml_status st;        /* first failure seen by a callback (MML_OK: none) */
  mml_err err;
} mml_vio;

/* Opens src (stat/HEAD for the size); the vio borrows src->name and src->data. */
mml_status mml_vio_open(mml_vio *io, const char *name, const uint8_t *data, size_t len,
                        mml_fetcher *f, int64_t max_bytes, int64_t block, mml_err *err);
void mml_vio_close(mml_vio *io);
/* Between two uses of an open source (a probe, then a decode): the cached blocks are
 * dropped and max_bytes counts afresh from here. */
void mml_vio_idle(mml_vio *io);

/* AVIOContext callbacks (opaque = mml_vio*): FFmpeg's AVERROR codes; a failure is kept
 * in io->st / io->err for the caller to report. */
int mml_vio_read(void *opaque, uint8_t *buf, int size);
int64_t mml_vio_seek(void *opaque, int64_t off, int whence);

#endif
