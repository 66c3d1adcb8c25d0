/*
 * measure.c — one sample measured from its record and its media's headers, outside the
 * streaming pipeline: what the dataset-index builder (dsindex_build.c) and the global
 * plan's planning pass (loader_plan.c) run for every sample.  Both feed the numbers to
 * the same function as the loader's workers: mml_sample_measure (pipeline.c).
 *
 * DESIGN
 *   1. One measuring path.  The worker (loader_worker.c stage_plan -> mml_sample_plan),
 *      the planning pass and the index builder all size a sample with
 *      mml_sample_measure; only how the bytes arrive differs (the worker's are read or
 *      fetched asynchronously into its task, these synchronously here).
 *   2. Why the loader level.  Reading a record needs the loader's scan (offsets, layouts,
 *      WebDataset members), parser options, path policy, image roots and fetcher, and
 *      measuring needs each source's vision settings and template: all loader state.  So
 *      the index builder is driven from the loader (mml_loader_build_index, in this
 *      folder), and the index folder (level 2) only stores and reads the counts.
 *   3. Same order as the worker: the record (max_record_bytes, kept remote text), then
 *      every media item in order (images, frames of frame lists, WebDataset member
 *      videos; the path policy for video files), then every video file opened and
 *      probed, then mml_sample_measure.  So the first failure is the worker's.
 *   4. head (ld_measurer_init): MML_DSX_HEAD_BYTES reads the first bytes of each image or
 *      frame, all of it when its header lies further (the index: headers only); -1 reads
 *      each whole, bounded by max_object_bytes, as the worker does (the planning pass:
 *      the same statuses as the stream, e.g. a JPEG's scan count).
 *   5. f32_videos: videos planned as for float32 (the index: its counts do not depend on
 *      the pixel format; a uint8 loader refuses the videos it cannot hold when it plans).
 *   6. Cancellation: m->cancel (the loader's flag, or the index build's) stops a fetch
 *      or a video probe under way with MML_ECANCELLED (ARCHITECTURE 4.8).
 *   7. Heads measure as whole files do (the index and the stream agree on every sample):
 *      a local file above max_object_bytes is refused from its size (stat) as the worker
 *      refuses it on reading; a multi-scan JPEG is read whole while max_jpeg_scans applies
 *      (its scans lie beyond the head; baseline JPEGs and other formats stay heads).
 *   Threads: one measurer per thread; the loader is only read (its fetcher is shared and
 *   thread-safe).  Memory: one record, its media (headers, or whole under head = -1, as
 *   one worker task holds), one open video file at a time; all reused across samples.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "loader_int.h"
#include "mml/datauri.h"
#include "mml/fetch_sync.h"
#include "mml/message.h"
#include "mml/video_frames.h"

mml_status ld_measurer_init(ld_measurer *m, mml_loader *L, int64_t head, int f32_videos,
                            mml_err *err) {
  memset(m, 0, sizeof *m);
  m->L = L;
  m->head = head;
  m->f32_videos = f32_videos;
  m->cancel = &L->cancel;
  return mml_sample_scratch_init(&m->sc, err);
}

void ld_measurer_free(ld_measurer *m) {
  mml_sample_scratch_free(&m->sc);
  if (m->rec_parsed) mml_record_free(&m->rec);
  mml_bytes_free(&m->rec_bytes);
  ld_pq_row_free(&m->pqrow);
  mml_bytes_free(&m->path);
  for (int i = 0; i < m->media_cap; i++) mml_bytes_free(&m->media[i]);
  free(m->media);
  free(m->plans);
  free(m->vinfo);
  free(m->vplans);
  mml_sample_free(&m->s);
  memset(m, 0, sizeof *m);
}

static mml_status fetcher(ld_measurer *m, mml_fetcher **f, mml_err *err) {
  return ld_get_fetcher(m->L, f, err);
}

/* A media reference resolved into m->path and checked by the path policy (as the
 * loader's worker does before it reads an image or opens a video file). */
static mml_status media_path(ld_measurer *m, const char *ref, mml_err *err) {
  mml_loader *L = m->L;
  const char *root = L->roots[m->shard];
  mml_status st = mml_sample_image_path(root, ref, &m->path, err);
  if (!st)
    st = mml_sample_image_allowed(&L->cfg, root, ref, (const char *)m->path.data,
                                  !L->remote[m->shard], err);
  return st;
}

/* MML_EOBJECTSIZE when local file p is above max bytes (the worker reads it whole and
 * refuses it so); any other trouble is left to the read that follows. */
static mml_status local_size(const char *p, int64_t max, mml_err *err) {
  struct stat sb;
  if (max > 0 && stat(p, &sb) == 0 && S_ISREG(sb.st_mode) && (int64_t)sb.st_size > max)
    return mml_err_set(err, MML_EOBJECTSIZE, "%s: %lld bytes, above max_object_bytes=%lld", p,
                       (long long)sb.st_size, (long long)max);
  return MML_OK;
}

/* The first `want` bytes of media `ref` (all of it when want < 0: *whole), read or
 * fetched into *dst. */
static mml_status media_read(ld_measurer *m, const char *ref, int64_t want, mml_bytes *dst,
                             int *whole, mml_err *err) {
  mml_loader *L = m->L;
  const mml_index_shard *sh = &L->ix.shards[m->shard];
  mml_status st;
  mml_fetcher *f;
  *whole = 1;
  if (mml_is_data_uri(ref)) return mml_data_uri_decode(ref, dst, err);
  int64_t off = 0, len = -1;
  const uint8_t *bp;
  size_t bn;
  if (mml_index_shard_parquet(sh) && ld_pq_row_member(&m->pqrow, ref, &bp, &bn)) {
    if ((int64_t)bn > L->cfg.max_object_bytes) /* as the worker does */
      return mml_err_set(err, MML_EOBJECTSIZE,
                         "%s: member %s is %zu bytes, above max_object_bytes=%lld", sh->path, ref,
                         bn, (long long)L->cfg.max_object_bytes);
    size_t n = want >= 0 && (size_t)want < bn ? (size_t)want : bn; /* a blob of the row */
    *whole = n == bn;
    mml_bytes_clear(dst);
    if (mml_bytes_reserve(dst, n + 1) || mml_bytes_append(dst, bp, n))
      return mml_err_set(err, MML_ENOMEM, "out of memory for a %zu-byte Parquet blob", n);
    dst->data[n] = 0;
    m->bytes += dst->len;
    return MML_OK;
  }
  if (mml_index_member(&L->ix, m->shard, m->gi, ref, &off, &len)) { /* a WebDataset member */
    if (len > L->cfg.max_object_bytes) /* as the loader does: from its tar header */
      return mml_err_set(err, MML_EOBJECTSIZE,
                         "%s: member %s is %lld bytes, above max_object_bytes=%lld", sh->path, ref,
                         (long long)len, (long long)L->cfg.max_object_bytes);
    int64_t n = want >= 0 && want < len ? want : len;
    *whole = n == len;
    if (!mml_index_shard_remote(sh))
      st = mml_index_read(sh, off, n, dst, err);
    else if (!(st = fetcher(m, &f, err)))
      st = mml_fetch_get_cancellable(f, sh->path, off, n, m->cancel, dst, err);
  } else {
    if ((st = media_path(m, ref, err))) return st;
    const char *p = (const char *)m->path.data;
    if (mml_path_is_remote(p)) {
      if (!(st = fetcher(m, &f, err)))
        st = mml_fetch_get_cancellable(f, p, 0, want, m->cancel, dst, err);
    } else { /* whole (as the worker reads it) or the head of a file within the limit */
      st = want >= 0 ? local_size(p, L->cfg.max_object_bytes, err) : MML_OK; /* DESIGN 7 */
      if (!st) st = mml_read_file_max(p, 0, want, L->cfg.max_object_bytes, dst, err);
    }
    *whole = want < 0 || (int64_t)dst->len < want;
  }
  if (!st) m->bytes += dst->len;
  return st;
}

/* Whether the head of an image must be read whole to be measured as the worker measures
 * it: its header lies further (it does not probe), or it is a multi-scan JPEG whose scans
 * the head may not all hold while max_jpeg_scans applies (DESIGN 7). */
static int need_whole(const mml_bytes *head, int max_scans) {
  mml_image_info info;
  if (mml_image_probe(head->data, head->len, &info, NULL) != MML_OK) return 1;
  return info.format == MML_FMT_JPEG && info.scratch > 0 && max_scans > 0 &&
         info.scans <= max_scans;
}

/* Image or frame i of the record into m->media[i]: its first m->head bytes, all of it
 * when need_whole says so (or m->head < 0). */
static mml_status media_head(ld_measurer *m, int i, int max_scans, mml_err *err) {
  const char *ref = mml_record_media_ref(&m->rec, i);
  mml_bytes *dst = &m->media[i];
  int whole;
  mml_status st = media_read(m, ref, m->head, dst, &whole, err);
  if (!st && !whole && need_whole(dst, max_scans)) st = media_read(m, ref, -1, dst, &whole, err);
  if (st) mml_sample_err_image(err, ref);
  return st;
}

/* Room for the record's media, plans and probes. */
static mml_status fit(ld_measurer *m, mml_err *err) {
  const mml_record *rec = &m->rec;
  const int n = rec->nimages + mml_record_frames(rec) + rec->nvideos, nv = rec->nvideos;
  if (n > m->media_cap) {
    mml_bytes *b = realloc(m->media, (size_t)n * sizeof *b);
    if (!b) return mml_err_set(err, MML_ENOMEM, "out of memory for %d media items", n);
    memset(b + m->media_cap, 0, (size_t)(n - m->media_cap) * sizeof *b);
    m->media = b;
    m->media_cap = n;
  }
  if (rec->nimages > m->plans_cap) {
    void *p = realloc(m->plans, (size_t)rec->nimages * sizeof *m->plans);
    if (!p) return mml_err_set(err, MML_ENOMEM, "out of memory planning %d images", n);
    m->plans = p;
    m->plans_cap = rec->nimages;
  }
  if (nv > m->vcap) {
    void *p = realloc(m->vplans, (size_t)nv * sizeof *m->vplans);
    if (p) m->vplans = p;
    void *q = p ? realloc(m->vinfo, (size_t)nv * sizeof *m->vinfo) : NULL;
    if (q) m->vinfo = q;
    if (!q) return mml_err_set(err, MML_ENOMEM, "out of memory planning %d videos", nv);
    m->vcap = nv;
  }
  return MML_OK;
}

/* The record of global sample gi, read (or copied from a remote shard's kept text) and
 * parsed into m->rec. */
static mml_status read_record(ld_measurer *m, mml_err *err) {
  mml_loader *L = m->L;
  const mml_index_shard *sh = &L->ix.shards[m->shard];
  int shard;
  int64_t off, len, line;
  mml_index_locate(&L->ix, m->gi, &shard, &off, &len, &line);
  if (len > L->cfg.max_record_bytes)
    return mml_err_set(err, MML_ERECORDSIZE, "a %lld-byte record, above max_record_bytes=%lld",
                       (long long)len, (long long)L->cfg.max_record_bytes);
  const mml_bytes *kept = shard < L->shard_text_cap ? &L->shard_text[shard] : NULL;
  mml_status st;
  mml_fetcher *f;
  if (L->remote[shard] && kept && kept->len && off + len <= (int64_t)kept->len) {
    mml_bytes_clear(&m->rec_bytes); /* as the worker copies it (stage_record) */
    if (mml_bytes_reserve(&m->rec_bytes, (size_t)len + 1))
      return mml_err_set(err, MML_ENOMEM, "out of memory for a %lld-byte record", (long long)len);
    memcpy(m->rec_bytes.data, kept->data + off, (size_t)len);
    m->rec_bytes.len = (size_t)len;
    m->rec_bytes.data[len] = 0;
    st = MML_OK;
  } else if (mml_index_shard_parquet(sh)) { /* its row, from its decoded row group */
    st = ld_pq_read_row(L, shard, off, m->cancel, &m->pqrow, err);
    size_t n = m->pqrow.json_len;
    if (!st && (int64_t)n > L->cfg.max_record_bytes)
      st = mml_err_set(err, MML_ERECORDSIZE, "a %zu-byte record, above max_record_bytes=%lld", n,
                       (long long)L->cfg.max_record_bytes);
    mml_bytes_clear(&m->rec_bytes);
    if (!st && (mml_bytes_reserve(&m->rec_bytes, n + 1) ||
                mml_bytes_append(&m->rec_bytes, m->pqrow.buf.data, n + 1)))
      st = mml_err_set(err, MML_ENOMEM, "out of memory for a %zu-byte record", n);
    if (!st) m->rec_bytes.len = n;
  } else if (!mml_index_shard_remote(sh)) {
    st = mml_index_read(sh, off, len, &m->rec_bytes, err);
  } else if (!(st = fetcher(m, &f, err))) {
    st = mml_fetch_get_cancellable(f, sh->path, off, len, m->cancel, &m->rec_bytes, err);
  }
  if (st) return st;
  m->bytes += m->rec_bytes.len;
  if (m->rec_parsed) mml_record_free(&m->rec);
  memset(&m->rec, 0, sizeof m->rec);
  m->rec_parsed = 1;
  return ld_parse_record(L, shard, m->gi, &m->rec_bytes, &m->pqrow, &m->rec, err);
}

/* Whether ref names a WebDataset member or a blob of the Parquet row read (its bytes are
 * then read with the media, not opened by path). */
static int member_of(const ld_measurer *m, const char *ref, int64_t *off, int64_t *len) {
  const uint8_t *p;
  size_t n;
  if (mml_index_shard_parquet(&m->L->ix.shards[m->shard]))
    return ld_pq_row_member(&m->pqrow, ref, &p, &n);
  return mml_index_member(&m->L->ix, m->shard, m->gi, ref, off, len);
}

/* Opens and probes video file v into m->vinfo[v], as the worker's plan stage does (a
 * WebDataset member from its bytes, m->media[nmedia + v]; else by path or URL: ranged
 * reads through the fetcher); nothing is decoded. */
static mml_status probe_file(ld_measurer *m, int v, const mml_vision_cfg *vision, mml_err *err) {
  mml_loader *L = m->L;
  const char *ref = m->rec.videos[v].ref;
  const mml_bytes *member = &m->media[m->rec.nimages + mml_record_frames(&m->rec) + v];
  mml_video_src src = {.name = ref,
                       .max_bytes = L->cfg.max_object_bytes,
                       .threads = 1,
                       .max_pixels = vision->max_image_pixels,
                       .cancel = m->cancel};
  mml_status st;
  int64_t off, len;
  if (member_of(m, ref, &off, &len)) {
    src.data = member->data;
    src.len = member->len;
  } else {
    if ((st = media_path(m, ref, err))) return st;
    src.name = (const char *)m->path.data;
    if (mml_path_is_remote(src.name) && (st = fetcher(m, &src.fetcher, err))) return st;
  }
  mml_video *vid = NULL;
  memset(&m->vinfo[v], 0, sizeof m->vinfo[v]);
  st = mml_video_open(&src, &vid, err);
  if (!st) st = mml_video_probe(vid, &m->vinfo[v], err);
  if (!src.data) m->bytes += (uint64_t)mml_video_bytes_read(vid);
  mml_video_close(vid);
  return st;
}

/* Every media item read (images and frames: headers; member videos: whole; video files:
 * the path policy), then every video file probed (DESIGN 3). */
static mml_status read_media(ld_measurer *m, const mml_vision_cfg *vision, mml_err *err) {
  const mml_record *rec = &m->rec;
  const int nmedia = rec->nimages + mml_record_frames(rec);
  mml_status st = fit(m, err);
  for (int i = 0; !st && i < nmedia; i++) st = media_head(m, i, vision->max_jpeg_scans, err);
  for (int v = 0; !st && v < rec->nvideos; v++) {
    const char *ref = rec->videos[v].ref;
    int64_t off, len;
    int whole;
    mml_bytes_clear(&m->media[nmedia + v]);
    if (!ref) continue;
    if (member_of(m, ref, &off, &len))
      st = media_read(m, ref, -1, &m->media[nmedia + v], &whole, err);
    else
      st = media_path(m, ref, err);
    if (st) mml_sample_err_video(err, &rec->videos[v], v);
  }
  for (int v = 0; !st && v < rec->nvideos; v++)
    if (rec->videos[v].ref && (st = probe_file(m, v, vision, err)))
      mml_sample_err_video(err, &rec->videos[v], v);
  return st;
}

mml_status ld_measure(ld_measurer *m, int64_t gi, mml_err *err) {
  mml_loader *L = m->L;
  int64_t off, len, line;
  m->gi = gi;
  mml_index_locate(&L->ix, gi, &m->shard, &off, &len, &line);
  const ld_source *src = &L->src[L->shard_src[m->shard]];
  mml_sample_reset(&m->s);
  mml_status st = read_record(m, err);
  if (!st) st = read_media(m, &src->vision, err);
  if (st) return st;
  mml_pipeline pl = src->pl;
  mml_vision_cfg f32 = *src->pl.vision;
  if (m->f32_videos && m->rec.nvideos) { /* DESIGN 5 */
    f32.pixel_format = MML_PIXEL_FLOAT32;
    pl.vision = &f32;
  }
  return mml_sample_measure(&pl, &m->sc, &m->rec, m->media, m->plans, m->vinfo, m->vplans, &m->s,
                            err);
}
