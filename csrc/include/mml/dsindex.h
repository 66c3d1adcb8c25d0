/*
 * mml/dsindex.h — the reusable dataset index: one sidecar file per data shard
 * ("<shard>.mmlidx" next to it, or "<name>.<path hash>.mmlidx" in an index folder:
 * mml_dsx_sidecar_path) holding what a loader would
 * otherwise compute at start or per sample: the shard's record offsets (the scan) and,
 * per sample, its status, text token count and each image's (and video's) header size
 * and exact vision-token count (so lengths are known before any read or decode).
 *
 * FORMAT (version 1; all integers little-endian; documented in docs/index-format.md)
 *   header, 128 bytes:
 *     0   magic "MMLINDEX"                     8   u32 version (1)
 *     12  u32 header bytes (128)               16  i64 shard size (bytes as stored)
 *     24  i64 shard mtime (ns; 0 for remote)   32  u64 settings key
 *     40  i64 samples                          48  i64 images
 *     56  i64 blank lines (JSONL)              64  i64 members (WebDataset)
 *     72  i64 member-name bytes                80  i64 data end (text offset)
 *     88  u8 layout, u8 compression, u16 0     92  u32 etag bytes
 *     96  u32 settings-text bytes              100 u32 0 ... to 120
 *     120 u64 checksum: mml_hash_bytes of the whole file with these 8 bytes zero
 *   then, each section padded to 8 bytes:
 *     etag (remote shards: the object's ETag when indexed), settings text (what the
 *     key covers, for messages), i64 offsets[samples] (as mml_index.offsets: byte
 *     offsets of records, or a WebDataset sample's first member), mml_dsx_sample
 *     [samples], mml_dsx_image[images] (samples' images back to back, in order),
 *     i64 blank_lines[], mml_member[members], member names.
 *   A sample's status is 0 when it planned (its record parsed, every image header read
 *   and planned, the template encoded) and else the mml_status it failed with.
 *
 * The partial file ("<sidecar>.partial") an interrupted build leaves holds the same
 * header (checksum 0), the etag and settings sections, and then sample entries in stream
 * order, each a mml_dsx_sample, its images and a u64 checksum (mml_dsx_entry_hash); a
 * resumed build keeps the entries before the first torn or damaged one (a checksum that
 * does not match) and goes on after them.
 *
 * Threads: pure functions over caller memory; nothing is shared.
 */
#ifndef MML_DSINDEX_H
#define MML_DSINDEX_H

#include "mml/common.h"
#include "mml/index.h"

#define MML_DSX_MAGIC "MMLINDEX"
#define MML_DSX_VERSION 1u
#define MML_DSX_SUFFIX ".mmlidx"
enum { MML_DSX_HEADER = 128 };

typedef struct mml_dsx_sample {
  uint32_t text_tokens; /* template ids minus image and video pads (0 when status != 0) */
  uint16_t nimages;     /* entries planned (0 when status != 0): its images, then its videos */
  uint8_t status;       /* 0, or the mml_status the sample failed with */
  uint8_t nvideos;      /* the last nvideos of its nimages entries are videos (0 in indexes
                           built before videos were counted: the byte was reserved, 0) */
} mml_dsx_sample;

typedef struct mml_dsx_image {
  uint32_t width, height; /* header size (after the route's EXIF orientation); a video's:
                             its frames' decoded size */
  uint32_t tokens;        /* <|image_pad|> (a video's: <|video_pad|>) tokens under the key's
                             vision settings */
} mml_dsx_image;

/* One shard's index, in memory. */
typedef struct mml_dsx {
  int64_t shard_size, shard_mtime_ns;
  uint64_t key;
  char etag[128];
  char *settings; /* NUL-terminated */
  mml_layout layout;
  mml_compression compression;
  int64_t data_end;
  int64_t n, nimages;
  int64_t *offsets;        /* n */
  mml_dsx_sample *samples; /* n */
  mml_dsx_image *images;   /* nimages */
  int64_t *first_image;    /* n + 1: samples[i]'s images are [first_image[i], [i + 1]) */
  int64_t *blank_lines, nblank;
  mml_member *members;
  int64_t nmembers;
  char *names;
  int64_t names_len;
} mml_dsx;

void mml_dsx_free(mml_dsx *x);

/* Parses and checks (magic, version, sizes, checksum, every offset and count in range)
 * a sidecar's bytes; `name` for messages. */
mml_status mml_dsx_parse(const uint8_t *data, size_t len, const char *name, mml_dsx *out,
                         mml_err *err);
/* Serialises x (first_image not needed) into out. */
mml_status mml_dsx_serialize(const mml_dsx *x, mml_bytes *out, mml_err *err);
/* Writes bytes to path atomically (a temporary file in the same folder, then rename). */
mml_status mml_dsx_write_file(const char *path, const uint8_t *data, size_t len, mml_err *err);

/* The shard described by x appended to ix as its next shard, named `path`, without
 * reading the shard.  Only for uncompressed shards (a compressed one must be
 * decompressed, which is its scan). */
mml_status mml_dsx_add_to_index(const mml_dsx *x, mml_index *ix, const char *path, mml_err *err);

/* The checksum after partial entry k (0-based): mml_hash_bytes, seeded with k, of its
 * sample and its s->nimages images, so a damaged, lost or moved entry does not match. */
uint64_t mml_dsx_entry_hash(int64_t k, const mml_dsx_sample *s, const void *images);

/* The partial file: its header bytes for x's identity fields (n, nimages ignored), and
 * the parse of a partial file's bytes: the identity (checked by the caller) into hdr,
 * the entries before the first torn or damaged one into samples/images (allocated),
 * *used = bytes they span. */
void mml_dsx_partial_header(const mml_dsx *x, uint8_t out[MML_DSX_HEADER]);
mml_status mml_dsx_partial_parse(const uint8_t *data, size_t len, const char *name, mml_dsx *hdr,
                                 size_t *used, mml_err *err);

/* Where a shard's index file is, into out (the ONE naming rule; mmloader.dsindex calls
 * it too): dir NULL or "": "<shard>.mmlidx" next to the shard; else
 * "dir/<shard's file name>.<key>.mmlidx" where key is the 16 hex digits of
 * mml_hash_bytes (FNV-1a 64) of the shard path as the loader names it (an absolute local
 * path or the URL), so shards of one file name in other folders never share a file in
 * dir.  dir may be a URL prefix. */
mml_status mml_dsx_sidecar_path(const char *shard, const char *dir, mml_bytes *out);

/* ---- building (dsindex_build.c, with a loader's scan, parser, settings, fetcher) ---- */

/* The videos whose counts the builder records (in the settings key, so that an index
 * built when a kind of video was refused is not trusted once it is loaded): frame lists
 * (from their frames' headers), video files (opened and probed, as the loader's plan
 * stage does; indexes made before files were probed said "frame-lists") and a WebDataset
 * sample's video members standing for an absent video list ("frame-lists,files" before). */
#define MML_DSX_VIDEOS "frame-lists,files,members"

/* The statuses the builder records beyond what reading headers finds (in the settings key,
 * so that an index built before it recorded them is not trusted for counts): "target", no
 * trainable turn (mml_sample_check; max_length stays a use-time check), "scans", a
 * multi-scan JPEG read whole while max_jpeg_scans applies, "size", a local file above
 * max_object_bytes from its size.  Indexes made before recorded none of them (the key had
 * no "statuses="). */
#define MML_DSX_STATUSES "target,scans,size"

/* Image bytes read for a header: the whole image only when its header is not in them, or
 * when it is a multi-scan JPEG while max_jpeg_scans applies (measure.c DESIGN 7). */
#define MML_DSX_HEAD_BYTES 16384

typedef struct mml_index_summary {
  int64_t samples, good, resumed; /* resumed: entries kept from a partial file */
  int64_t images, text_tokens, image_tokens;
  int64_t videos, video_tokens;
  int64_t image_token_hist[32]; /* planned images by tokens t: bucket floor(log2(t)) */
  int64_t by_status[MML_STATUS_COUNT];
  char example[MML_STATUS_COUNT][320]; /* the first failure of each status, with where */
  uint64_t bytes_read;                 /* record and image-header bytes read by this run */
  int up_to_date;                      /* the index existed for this shard and settings: kept */
  double seconds;
} mml_index_summary;

/* Called by the building thread about every 0.2 s; non-zero stops the build (it stays
 * resumable: the partial file keeps what is done). */
typedef int (*mml_index_progress_fn)(void *ctx, int64_t done, int64_t total);

struct mml_loader;
/* Builds the index of the loader's shard `shard` (with the settings of its source) into
 * `out` (atomically), resuming "<out>.partial" when it matches; nthreads workers; the
 * calling thread writes.  MML_ECANCELLED when cb stopped it. */
mml_status mml_loader_build_index(struct mml_loader *L, int shard, const char *out, int nthreads,
                                  mml_index_progress_fn cb, void *ctx, mml_index_summary *sum,
                                  mml_err *err);
int mml_loader_num_shards(const struct mml_loader *L);
const char *mml_loader_shard_path(const struct mml_loader *L, int shard);
/* Shards whose index counts the loader uses. */
int mml_loader_index_used(const struct mml_loader *L);

#endif
