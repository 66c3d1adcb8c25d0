/*
 * mml/index.h — the line index of a list of JSONL shards: where each sample (non-blank
 * line) starts, so any sample can be read with one positioned read (or one ranged GET)
 * without keeping the text in memory.  8 bytes per sample, plus the 1-based line numbers
 * of blank lines (rare) so messages can name the exact line.
 *
 * Building streams each local shard once in 1 MiB chunks; a remote shard is fetched
 * once by the caller and indexed from memory (mml_index_add_bytes).
 *
 * Threads: build from one thread; a built index is immutable and shared.
 */
#ifndef MML_INDEX_H
#define MML_INDEX_H

#include "mml/common.h"

typedef struct mml_index_shard {
  char *path;          /* as given: local path or URL */
  int64_t size;        /* bytes */
  int64_t first;       /* global index of its first sample */
  int64_t count;       /* samples in it */
  int64_t *blank_lines;/* sorted 1-based numbers of blank lines */
  int64_t nblank;
} mml_index_shard;

typedef struct mml_index {
  mml_index_shard *shards;
  int nshards;
  int64_t n;           /* samples in all shards */
  int64_t *offsets;    /* n byte offsets of the sample lines, shard after shard */
  int64_t cap;
} mml_index;

/* Indexes a local file and appends it as the next shard. */
mml_status mml_index_add_file(mml_index *ix, const char *path, mml_err *err);
/* Indexes a shard held in memory (a fetched remote object) under the name `path`. */
mml_status mml_index_add_bytes(mml_index *ix, const char *path, const uint8_t *data, size_t len,
                               mml_err *err);
void mml_index_free(mml_index *ix);

/* Locates global sample i: its shard, byte range [*off, *off + *len) (the line may be
 * followed by blank lines inside the range: cut at the first '\n') and 1-based line. */
void mml_index_locate(const mml_index *ix, int64_t i, int *shard, int64_t *off, int64_t *len,
                      int64_t *line);
/* A hash of every shard's file name (not folder), size and sample count (fingerprints). */
uint64_t mml_index_hash(const mml_index *ix);

#endif
