/*
 * video_io.h — private to video*.c: the byte source behind a video's AVIOContext.
 * A local file (pread), a buffer in memory, or a remote object read in fixed blocks
 * through the fetcher (a handful cached, least recently used evicted).  The blocks the
 * caller says it will read (mml_vio_will_read) are fetched ahead, MML_VIO_AHEAD at once,
 * concurrently: the demuxer then waits on one round trip where it waited on one per
 * block.  Used by one thread at a time (the one that decodes); the fetcher's I/O thread
 * only completes fetches ahead, under io->mu.
 */
#ifndef MML_VIDEO_IO_H
#define MML_VIDEO_IO_H

#include <pthread.h>

#include "mml/common.h"
#include "mml/fetch.h"

#define MML_VIO_BLOCKS 4
#define MML_VIO_AHEAD 4    /* remote blocks fetched ahead at once */
#define MML_VIO_HINTS 4096 /* blocks one mml_vio_will_read may name (the rest: read on demand) */

struct mml_vio;
typedef struct mml_vio_ahead { /* a block fetched ahead */
  struct mml_vio *io;
  int64_t off, len;
  int state; /* 0: free, 1: in flight, 2: arrived (st, b) */
  mml_status st;
  mml_bytes b;
} mml_vio_ahead;

/* A byte range preloaded for a decode (mml_vio_preload): [off, off + len), fetched whole
 * (state and b written by the I/O thread under mu). */
typedef struct mml_vio_range {
  struct mml_vio *io;
  int64_t off, len;
  int state; /* 0: not submitted, 1: in flight, 2: arrived (st, b) */
  int charged;
  mml_status st;
  mml_bytes b;
} mml_vio_range;

/* Called on the fetcher's I/O thread when a preloaded range arrives (or failed: bytes 0). */
typedef void (*mml_vio_loaded_fn)(void *ctx, size_t bytes);

typedef struct mml_vio {
  const char *name;     /* path or URL (borrowed from the mml_video) */
  const uint8_t *data;  /* memory source */
  int fd;               /* file source (-1: none) */
  mml_fetcher *fetcher; /* remote source (NULL: none) */
  int64_t size;         /* bytes of the source (-1: unknown) */
  int64_t pos;          /* next byte the demuxer reads */
  int64_t block;        /* remote block size */
  struct {              /* an aligned block, or a hinted piece (its length: b.len) */
    int64_t off;        /* -1: empty */
    uint64_t used;      /* LRU tick */
    mml_bytes b;
  } blk[MML_VIO_BLOCKS];
  uint64_t tick;
  int64_t bytes_read, max_bytes;
  int64_t charged_from; /* bytes_read when the current use began (mml_vio_idle) */
  mml_status st;        /* first failure seen by a callback (MML_OK: none) */
  mml_err err;
  /* fetching ahead (remote, size known): pieces hint_at..nhint (hint[2j] its offset,
   * hint[2j+1] its length, at most a block) are the bytes the reader said come next, in
   * order; ahead[] the fetches of some of them (state and b written by the I/O thread
   * under mu, the rest by the reader) */
  int64_t *hint;
  int nhint, hint_at, no_ahead;
  mml_vio_ahead ahead[MML_VIO_AHEAD];
  /* preloaded ranges (mml_vio_preload): pre[0..npre), pre_at the last one read */
  mml_vio_range *pre;
  int npre, pre_at;
  mml_vio_loaded_fn loaded;
  void *loaded_ctx;
  /* times the reader waited on the network (a HEAD, a block read on demand, a block or a
   * range still in flight); also added (atomically) to *wait_count when set */
  int64_t waits;
  uint64_t *wait_count;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int mu_init;
  const mml_cancel *cancel; /* mml_video_src.cancel: checked by every read and wait */
} mml_vio;

/* Opens src (stat/HEAD for the size); the vio borrows src->name and src->data.  A remote
 * source whose size the caller knows (size > 0: no HEAD) may come with its first bytes
 * (first, exactly its first block: moved in as the first cached block, counted read) and
 * more of its header (tail, at tail_off: moved in as an arrived preloaded range, counted
 * when read). */
mml_status mml_vio_open(mml_vio *io, const char *name, const uint8_t *data, size_t len,
                        mml_fetcher *f, int64_t max_bytes, int64_t block, int64_t size,
                        mml_bytes *first, mml_bytes *tail, int64_t tail_off, mml_err *err);
void mml_vio_close(mml_vio *io);
/* Between two uses of an open source (a probe, then a decode): the cached blocks (and a
 * preload) are dropped and max_bytes counts afresh from here. */
void mml_vio_idle(mml_vio *io);
/* The byte ranges [r[2k], r[2k+1]) the reader will read next, in order (a remote source:
 * they are fetched ahead in pieces of at most a block, each from where its range starts,
 * and a read inside one fetches that piece, not the aligned block; others: nothing).
 * Replaces the previous hint.  Only a hint: what is read outside them is fetched on
 * demand by aligned blocks; bytes_read and max_bytes count what is fetched. */
void mml_vio_will_read(mml_vio *io, const int64_t *r, int n);

/* A remote source: the byte ranges [r[2k], r[2k+1]) (sorted by nothing) are fetched now,
 * each whole, with one ranged GET each; reads inside one are then served from memory,
 * without a round trip.  loaded(ctx, bytes) runs on the fetcher's I/O thread once per range
 * submitted (*submitted of them: when a submit fails the rest are not preloaded).  Drops
 * an earlier preload.  Only a hint, like mml_vio_will_read: a failed range, or a read
 * outside them, is fetched on demand (which reports the failure); a range counts in
 * bytes_read / max_bytes when first read.  Not for local or in-memory sources (*submitted
 * 0). */
mml_status mml_vio_preload(mml_vio *io, const int64_t *r, int n, mml_vio_loaded_fn loaded,
                           void *ctx, int *submitted, mml_err *err);

/* 1 once io->cancel is set, recording MML_ECANCELLED as the source's failure (so the
 * caller reports it, not the AVERROR FFmpeg passes on); 0 otherwise. */
int mml_vio_cancelled(mml_vio *io);

/* AVIOContext callbacks (opaque = mml_vio*): FFmpeg's AVERROR codes; a failure is kept
 * in io->st / io->err for the caller to report. */
int mml_vio_read(void *opaque, uint8_t *buf, int size);
int64_t mml_vio_seek(void *opaque, int64_t off, int whence);

#endif
