/*
 * mml/index.h — the sample index of a list of data shards: where each sample starts, so
 * any sample can be read with one positioned read (or one ranged GET) without keeping
 * the text in memory.  8 bytes per sample, plus 16 bytes per run of blank lines (however
 * long) so messages can name the exact line: a sample's line number is found by binary
 * search over the runs (O(log runs)).
 *
 * Shard formats (mml_index_begin; the layout is chosen by content, `want` overrides):
 *   JSONL       one record per non-blank line ('\n'-separated; "\r\n" is fine).
 *   JSON array  one record per element of a top-level array ("[{...}, {...}]", any
 *               whitespace or line breaks inside and between elements).  Elements are
 *               found by a streaming structural scan (strings, escapes, nesting) that
 *               never holds the file; a structural error (missing ',' or ']', a closer
 *               that does not match, data after the array, an unterminated element)
 *               fails the build naming the byte offset.  What the scan does not check
 *               (e.g. a bad literal inside an element) is that element's bad record.
 *   Either may be gzip- or zstd-compressed, told by magic bytes (never by name).  A
 *   compressed shard is decompressed once, while it is indexed, into an unlinked
 *   temporary file ($TMPDIR, else /tmp) that records are then read from (shard.fd); the
 *   offsets are those of the decompressed text.  A UTF-8 byte order mark is skipped.
 *   WebDataset  a tar shard (ustar, GNU or pax names) whose members are grouped into
 *               samples by key as webdataset and Energon do: the key is the member path up
 *               to the first '.' of its file name ("a/000123.json", "a/000123.0.png" ->
 *               key "a/000123"), consecutive members with one key form a sample.  A
 *               sample is its ".json" member (the record); groups without one are not
 *               samples.  Image members (jpg, jpeg, png, webp, gif, bmp, tif, tiff after
 *               the last '.') are the sample's images in tar order when the record lists
 *               none; a record's image reference names a member by full name, by what
 *               follows the key ("jpg", "0.png") or by file name.  Member data is
 *               range-read from the shard: nothing is unpacked.
 *   Parquet    a local file with PAR1 at its start and end (a URL: mml_index_add_parquet):
 *               only its footer is read (mml/parquet.h); a sample is a row, addressed as
 *               (shard, row group, row): its offset is the file's row number and the
 *               shard keeps the opened footer (shard.pq) for the row groups.  Rows are
 *               decoded later, a row group at a time, by whoever reads them (the loader's
 *               workers: loader_parquet.c); nothing is copied to $TMPDIR.  The shard is
 *               MML_LAYOUT_WDS with compression MML_COMPRESS_PARQUET and no members:
 *               a row's embedded blobs are found through its decoded row group.
 * Auto layout: a ".tar" name (also .tar.gz, .tgz, .tar.zst) or the ustar magic at byte
 * 257 means WebDataset; else the first non-blank character '[' means a JSON array,
 * anything else JSONL (many ".json" exports hold JSON lines).
 *
 * Building streams the bytes once through mml_index_feed in chunks of any size (files
 * are read 1 MiB at a time; remote objects arrive as ranged GETs from the caller).
 *
 * Limits (mml_index.limits; hostile shards, issue 29): a build fails, naming the shard and
 * the limit, once a shard's text passes max_text_bytes (checked for compressed and remote
 * shards: the decompressed copy in $TMPDIR, the streamed bytes; a local plain file's size
 * is what it is) or once it holds more than max_records records (JSONL lines, blank ones
 * included; JSON array elements; tar members).  So a compression bomb costs at most
 * max_text_bytes of disk and max_records * 8 bytes of memory, and stops early.  One JSONL
 * line of a compressed or remote shard longer than max_line_bytes (the loader's
 * max_record_bytes: a record that long is never read) fails the build as soon as it
 * passes the limit, so a bomb that is one endless line costs max_line_bytes, not
 * max_text_bytes (a local plain file's long line is skipped when read instead).  A tar
 * member's size is checked from its header with overflow-safe arithmetic; readers check
 * a member's size against their own limit before they read it.
 *
 * Formats accepted as their tools do: gzip members may be followed (or separated) by
 * zero bytes (gzip -t, Python's gzip); a zstd stream may start with a skippable frame.
 *
 * Threads: build from one thread; a built index is immutable and shared.
 */
#ifndef MML_INDEX_H
#define MML_INDEX_H

#include "mml/common.h"
#include "mml/parquet.h"

typedef enum {
  MML_LAYOUT_AUTO = 0, /* by content (see above) */
  MML_LAYOUT_JSONL,
  MML_LAYOUT_JSON, /* a top-level JSON array of records */
  MML_LAYOUT_WDS,  /* a WebDataset tar shard */
} mml_layout;

/* A member of a WebDataset shard: its data's byte range and name (in shard.names). */
typedef struct mml_member {
  int64_t off, size;
  uint32_t name, key_len; /* name offset in the pool; the key is its first key_len bytes */
} mml_member;

/* PARQUET: a Parquet file read row group by row group (index_parquet.c) */
typedef enum {
  MML_COMPRESS_NONE = 0,
  MML_COMPRESS_GZIP,
  MML_COMPRESS_ZSTD,
  MML_COMPRESS_PARQUET
} mml_compression;

/* A run of consecutive blank JSONL lines: `before` records (non-blank lines) precede it,
 * `through` blank lines precede its end (this run's included).  Runs are sorted and
 * `before` strictly increases, so a record's line is found by binary search. */
typedef struct mml_blank_run {
  int64_t before, through;
} mml_blank_run;

typedef struct mml_index_shard {
  char *path;                /* as given: local path or URL */
  int64_t size;              /* bytes as stored (compressed size for a compressed shard) */
  int64_t first;             /* global index of its first sample */
  int64_t count;             /* samples in it */
  mml_blank_run *blank_runs; /* JSONL: its blank lines, as runs */
  int64_t nruns, runs_cap;
  int64_t nblank;    /* blank lines in all */
  mml_layout layout; /* JSONL or JSON (never AUTO once built) */
  mml_compression compression;
  int64_t data_end; /* end of the last record's byte range (text offsets) */
  int fd;           /* >= 0: records are read from this local decompressed copy */
  /* WebDataset: the members of its samples, in tar order; ix.offsets hold, per sample,
   * the index of its first member here (a sample's members run to the next one's) */
  mml_member *members;
  int64_t nmembers, members_cap;
  char *names; /* NUL-terminated member names, back to back */
  size_t names_len, names_cap;
  /* Parquet: the file's footer, opened (its row groups; clones read rows); owned */
  mml_pq_file *pq;
} mml_index_shard;

/* The loader's defaults of the limits (options max_shard_bytes, max_shard_records). */
#define MML_DEFAULT_MAX_SHARD_BYTES ((int64_t)8 << 30)   /* 8 GiB */
#define MML_DEFAULT_MAX_SHARD_RECORDS ((int64_t)1 << 24) /* 16,777,216: 128 MiB of offsets */

/* Bounds on one shard's build (0: none); see "Limits" above. */
typedef struct mml_index_limits {
  int64_t max_text_bytes;  /* compressed or remote shards: bytes of text */
  int64_t max_records;     /* JSONL lines (blank ones too), array elements, tar members */
  int64_t max_line_bytes;  /* compressed or remote shards: bytes of one JSONL line */
  int64_t max_chunk_bytes; /* Parquet: a footer, column chunk or page (0: 256 MiB) */
} mml_index_limits;

typedef struct mml_index {
  mml_index_limits limits; /* set before shards are added */
  mml_index_shard *shards;
  int nshards;
  int64_t n;        /* samples in all shards */
  int64_t *offsets; /* n byte offsets of the records, shard after shard */
  int64_t cap;
  /* Builds stop with MML_ECANCELLED soon after it is set (checked per chunk of stored
   * and of decompressed bytes; NULL: never).  Not owned. */
  const mml_cancel *cancel;
  /* Parquet shards added from now on read their columns under these names: pairs
   * {column, name, ..., NULL} (mml_pq_open_mapped; NULL: their own).  Not owned; must
   * outlive the shards. */
  const char *const *pq_map;
} mml_index;

/* Streaming build of one shard, appended as the next shard.  begin, then feed the stored
 * bytes (compressed or not) in order, then end (which also frees the builder).  On any
 * failure call mml_index_abort instead (the shard is then dropped).  Messages name
 * `path` and the byte offset. */
typedef struct mml_index_builder mml_index_builder;
mml_status mml_index_begin(mml_index *ix, const char *path, mml_layout want,
                           mml_index_builder **out, mml_err *err);
mml_status mml_index_feed(mml_index_builder *b, const uint8_t *data, size_t len, mml_err *err);
mml_status mml_index_end(mml_index_builder *b, mml_err *err);
void mml_index_abort(mml_index_builder *b);

/* Indexes a local file (streamed in 1 MiB chunks). */
mml_status mml_index_add_file(mml_index *ix, const char *path, mml_layout want, mml_err *err);
/* Indexes a Parquet file of `size` bytes named `path` (local or a URL) read through
 * `read` (its footer only: two ranged reads; see "Parquet" above). */
mml_status mml_index_add_parquet(mml_index *ix, const char *path, int64_t size, mml_pq_read_fn read,
                                 void *read_ctx, mml_err *err);
/* Indexes a shard held in memory under the name `path`. */
mml_status mml_index_add_bytes(mml_index *ix, const char *path, mml_layout want,
                               const uint8_t *data, size_t len, mml_err *err);
void mml_index_free(mml_index *ix);

/* Locates global sample i: its shard, byte range [*off, *off + *len) and *where: the
 * 1-based line (JSONL) or the 0-based element number (JSON array).  The range may hold
 * more than the record (blank lines; ',' between elements): mml_index_record_len cuts it.
 * A Parquet shard's sample: *off and *where are its row in the file, *len 0 (the row's
 * size is known once its row group is decoded). */
void mml_index_locate(const mml_index *ix, int64_t i, int *shard, int64_t *off, int64_t *len,
                      int64_t *where);
/* The 1-based numbers of a JSONL shard's blank lines, expanded from its runs into *out
 * (malloc'd; *n of them; NULL when none).  For the dataset index file, which lists them. */
mml_status mml_index_blank_lines(const mml_index_shard *sh, int64_t **out, int64_t *n);
/* Appends blank line `line` (1-based, after every earlier one) to the shard's runs, given
 * the records before it.  (The scanner, and the dataset index's loader.) */
mml_status mml_index_push_blank(mml_index_shard *sh, int64_t records_before);
/* Length of the record at the start of the bytes read for a located range. */
size_t mml_index_record_len(const mml_index_shard *sh, const uint8_t *data, size_t len);
/* Reads the located range [off, off + len) of a shard that is readable locally (a plain
 * local file or a decompressed copy): out holds the bytes (NUL after them). */
mml_status mml_index_read(const mml_index_shard *sh, int64_t off, int64_t len, mml_bytes *out,
                          mml_err *err);
/* 1 when records of the shard are range-read from its URL (remote and not decompressed). */
int mml_index_shard_remote(const mml_index_shard *sh);
/* The shard's Parquet file when it is one (its rows are read through it), else NULL. */
static inline const mml_pq_file *mml_index_shard_parquet(const mml_index_shard *sh) {
  return sh->compression == MML_COMPRESS_PARQUET ? sh->pq : NULL;
}
/* "path:LINE" (JSONL) or "path[ELEMENT] (byte OFF)" (JSON array): how messages name a
 * sample; into out (cap bytes). */
void mml_index_name_sample(const mml_index *ix, int shard, int64_t i, int64_t where, char *out,
                           size_t cap);
/* WebDataset: the member of sample i (of shard `shard`) that `ref` names (see above);
 * 0 when none does. */
int mml_index_member(const mml_index *ix, int shard, int64_t i, const char *ref, int64_t *off,
                     int64_t *len);
/* WebDataset: the names of sample i's image members, in tar order, into names (at most
 * max; pointers into the index); returns how many there are. */
int mml_index_images(const mml_index *ix, int shard, int64_t i, const char **names, int max);
/* The same for its video members (mp4, m4v, mov, mkv, webm, avi: video files). */
int mml_index_videos(const mml_index *ix, int shard, int64_t i, const char **names, int max);
/* Whether a member (or a Parquet blob) name is an image's / a video file's, by its
 * extension (what mml_index_images / mml_index_videos list). */
int mml_index_is_image_name(const char *name);
int mml_index_is_video_name(const char *name);
/* A hash of every shard's file name (not folder), size and sample count (fingerprints). */
uint64_t mml_index_hash(const mml_index *ix);
/* The same over shards [first, first + n) (a mixture source's). */
uint64_t mml_index_hash_shards(const mml_index *ix, int first, int n);

#endif
