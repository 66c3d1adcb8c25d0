/*
 * index_int.h — private to the sample index (index.c: the builder API, the raw and
 * decompression layers, the spill file and the readers; index_scan.c: the text layer,
 * i.e. the JSONL, JSON-array and WebDataset tar scanners).  The design is described at
 * the top of index.c.
 */
#ifndef MML_INDEX_INT_H
#define MML_INDEX_INT_H

#include <zlib.h>
#include <zstd.h>

#include "mml/index.h"

enum { CHUNK = 1 << 20, MAX_DEPTH = 1024 };

/* array scanner states */
enum { J_OPEN = 0, J_FIRST, J_NEXT, J_ELEM, J_AFTER, J_DONE };

struct mml_index_builder {
  mml_index *ix;
  int shard; /* index into ix->shards (which may move while growing) */
  mml_layout want;
  /* raw layer */
  uint8_t head[512]; /* the first bytes, held until there are enough to tell the format */
  size_t nhead;
  int sniffed;
  int64_t raw_off;  /* stored bytes consumed */
  int64_t max_text; /* limits.max_text_bytes for a compressed or remote shard, else 0 */
  int64_t max_line; /* limits.max_line_bytes for a compressed or remote shard, else 0 */
  z_stream z;
  int z_init, z_ended; /* z_ended: the last gzip member ended exactly at the input's end */
  ZSTD_DStream *zs;
  size_t zs_last; /* last ZSTD_decompressStream hint: 0 when a frame just ended */
  uint8_t *zbuf;  /* decompression output */
  /* text layer */
  int64_t pos; /* text bytes seen */
  int decided; /* layout decided (first non-blank byte seen) */
  /* JSONL */
  int64_t line_start, line_no;
  int content;
  /* JSON array */
  int js;
  int in_str, esc, scalar;
  int depth;
  uint8_t stack[MAX_DEPTH / 8]; /* bit set: 1 = '{' open at that depth */
  int64_t elem_start;
  /* WebDataset tar */
  uint8_t hdr[512];
  size_t nhdr;
  int64_t skip;     /* member data + padding still to pass */
  int64_t ext_left; /* of that, bytes still to collect for a long name / pax header */
  int ext_kind;     /* 'L' or 'x' while collecting, else 0 */
  mml_bytes ext;
  char *next_name;   /* the next member's name, from a GNU 'L' or pax 'x' header */
  int64_t next_size; /* its size from a pax header, -1 when none */
  int tar_end;
  int64_t group;  /* first member of the open group, -1 when none */
  int group_json; /* the open group has a .json member */
};

static inline mml_index_shard *shard_of(mml_index_builder *b) { return &b->ix->shards[b->shard]; }

static inline int is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

/* index_scan.c: the text layer.  scan_text takes the next (decompressed) text bytes;
 * end_line closes the current JSONL line at next_start (failing past max_records);
 * tar_close_group ends the open WebDataset group (nonzero: out of memory); json_error
 * formats an error naming the shard; oom an out-of-memory error naming it. */
mml_status ix_scan_text(mml_index_builder *b, const uint8_t *p, size_t len, mml_err *err);
mml_status ix_end_line(mml_index_builder *b, int64_t next_start, mml_err *err);
mml_status ix_tar_close_group(mml_index_builder *b);
mml_status ix_oom(mml_index_builder *b, mml_err *err);
/* A member of the WebDataset group being built (grouped by key; nonzero: out of memory). */
mml_status ix_tar_member(mml_index_builder *b, const char *name, int64_t off, int64_t size);
/* The spill file: an unlinked file in $TMPDIR (else /tmp; its folder into dir_out), and
 * appending to the shard's (errors name the shard and the folder). */
int ix_spill_open(char *dir_out, size_t cap);
mml_status ix_spill_write(mml_index_builder *b, const uint8_t *p, size_t n, mml_err *err);
/* index_parquet.c: a local Parquet file (open as fd, size bytes) as the next shard. */
mml_status ix_add_parquet(mml_index *ix, const char *path, int fd, int64_t size, mml_err *err);
int ix_is_image_ext(const char *name); /* a WebDataset image member's extension */
int ix_is_video_ext(const char *name); /* a WebDataset video (file) member's extension */
mml_status ix_json_error(mml_index_builder *b, mml_err *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
