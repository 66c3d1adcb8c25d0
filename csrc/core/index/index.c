/*
 * index.c — the sample index of JSONL, JSON-array and WebDataset tar shards, plain or
 * gzip/zstd compressed (see mml/index.h).
 *
 * DESIGN
 *   One builder per shard turns a stream of stored bytes into record offsets, in three
 *   layers that each see every byte once:
 *     raw      the first bytes decide the compression (gzip 1f 8b, zstd 28 b5 2f fd);
 *              512 are held back so that the text layer sees a whole tar header first;
 *     inflate  zlib (multi-member gzip) or libzstd (multi-frame) into a 1 MiB buffer,
 *              each decompressed chunk also appended to the shard's spill file;
 *     text     a scanner over the (decompressed) text.  Until the first non-blank byte
 *              the layout is open: blanks go through the JSONL scanner (so blank-line
 *              numbers are right if it stays JSONL) and '[' switches to the array scanner.
 *              A tar (by name or ustar magic in the first chunk) goes to the tar scanner:
 *              512-byte headers (GNU 'L' long names and pax 'x' path/size honoured),
 *              member data skipped, members grouped by key as they arrive; a group is
 *              kept (one index offset: its first member) only if it has a .json member.
 *   The JSONL scanner keeps two facts across chunks: whether the current line has started
 *   a sample, and where it began.  The array scanner is a small state machine (between
 *   elements / inside one: string, escape, a bit stack of open brackets up to
 *   MAX_DEPTH); it records each element's first byte and checks only structure.
 *   A record's byte range runs to the next record's start (or data_end, the closing ']'
 *   of an array); mml_index_record_len trims the separators after it.
 *
 *   Spill files: open(O_TMPFILE) in $TMPDIR (else /tmp), or mkstemp + unlink where the
 *   file system lacks O_TMPFILE; nothing is left behind whatever way the process ends.
 *   Readers use pread on the shard's fd, which is safe from any thread.
 *
 * Threads: one thread builds; the result is read-only afterwards.
 *
 * Files: index.c (this: the builder API, the raw and decompression layers, the spill
 * file, the readers), index_scan.c (the text layer: JSONL, JSON-array and tar scanners),
 * index_int.h (the builder struct they share).
 */
#include "index_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mml/fetch.h"

/* ---- decompression and the spill file ------------------------------------------------ */

int ix_spill_open(char *dir_out, size_t cap) {
  const char *dir = getenv("TMPDIR");
  if (!dir || !*dir) dir = "/tmp";
  snprintf(dir_out, cap, "%s", dir);
#ifdef O_TMPFILE
  int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
#endif
  char path[4096];
  snprintf(path, sizeof path, "%s/mmloader-spill-XXXXXX", dir);
  fd = mkostemp(path, O_CLOEXEC);
  if (fd >= 0) unlink(path);
  return fd;
}

mml_status ix_spill_write(mml_index_builder *b, const uint8_t *p, size_t n, mml_err *err) {
  mml_index_shard *sh = shard_of(b);
  while (n) {
    ssize_t w = write(sh->fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const char *dir = getenv("TMPDIR");
      return mml_err_set(err, MML_EIO,
                         "data shard %s: cannot write its decompressed copy to %s: %s (TMPDIR "
                         "chooses the folder)",
                         sh->path, dir && *dir ? dir : "/tmp", strerror(errno));
    }
    p += w, n -= (size_t)w;
  }
  return MML_OK;
}

/* Decompressed text: to the spill file and the scanner. */
static mml_status index_cancelled(mml_index_builder *b, mml_err *err) {
  return mml_err_set(err, MML_ECANCELLED, "data shard %s: indexing cancelled", shard_of(b)->path);
}

static mml_status text_out(mml_index_builder *b, const uint8_t *p, size_t n, mml_err *err) {
  if (mml_cancelled(b->ix->cancel)) return index_cancelled(b, err);
  mml_status st = ix_scan_text(b, p, n, err); /* first: it checks the limits */
  return st ? st : ix_spill_write(b, p, n, err);
}

static mml_status start_raw(mml_index_builder *b, mml_err *err) {
  mml_index_shard *sh = shard_of(b);
  const uint8_t *h = b->head;
  if (b->nhead >= 4 && !memcmp(h, "PAR1", 4)) /* local files: ix_add_parquet */
    return mml_err_set(err, MML_ECONFIG,
                       "data shard %s: a Parquet file over HTTP(S) or S3 is read when its name "
                       "ends in .parquet (row groups by ranged reads); this one's does not",
                       sh->path);
  if (b->nhead >= 2 && h[0] == 0x1f && h[1] == 0x8b)
    sh->compression = MML_COMPRESS_GZIP;
  else if (b->nhead >= 4 && ((h[0] == 0x28 && h[1] == 0xb5 && h[2] == 0x2f && h[3] == 0xfd) ||
                             ((h[0] & 0xf0) == 0x50 && h[1] == 0x2a && h[2] == 0x4d &&
                              h[3] == 0x18))) /* a zstd frame, or a skippable frame first */
    sh->compression = MML_COMPRESS_ZSTD;
  b->sniffed = 1;
  if (sh->compression != MML_COMPRESS_NONE || mml_path_is_remote(sh->path)) {
    b->max_text = b->ix->limits.max_text_bytes;
    b->max_line = b->ix->limits.max_line_bytes;
  }
  if (sh->compression == MML_COMPRESS_NONE) return MML_OK;
  if (!(b->zbuf = malloc(CHUNK))) return ix_oom(b, err);
  char dir[4096];
  if ((sh->fd = ix_spill_open(dir, sizeof dir)) < 0)
    return mml_err_set(err, MML_EIO,
                       "data shard %s: cannot create a file for its decompressed "
                       "copy in %s: %s (TMPDIR chooses the folder)",
                       sh->path, dir, strerror(errno));
  if (sh->compression == MML_COMPRESS_GZIP) {
    if (inflateInit2(&b->z, 16 + MAX_WBITS) != Z_OK) return ix_oom(b, err);
    b->z_init = 1;
  } else {
    if (!(b->zs = ZSTD_createDStream())) return ix_oom(b, err);
    b->zs_last = 1;
  }
  return MML_OK;
}

static mml_status feed_gzip(mml_index_builder *b, const uint8_t *p, size_t n, mml_err *err) {
  b->z.next_in = (Bytef *)p;
  b->z.avail_in = (uInt)n;
  while (b->z.avail_in > 0) {
    if (b->z_ended) { /* zero padding (as gzip -t and Python allow), or another member */
      while (b->z.avail_in && !*b->z.next_in) b->z.next_in++, b->z.avail_in--;
      if (!b->z.avail_in) break;
      inflateReset(&b->z);
      b->z_ended = 0;
    }
    b->z.next_out = b->zbuf;
    b->z.avail_out = CHUNK;
    int64_t in_before = b->raw_off + (int64_t)(n - b->z.avail_in);
    uInt avail0 = b->z.avail_in;
    int r = inflate(&b->z, Z_NO_FLUSH);
    if (r == Z_BUF_ERROR && b->z.avail_in == avail0 && b->z.avail_out == CHUNK) break;
    if (r != Z_OK && r != Z_STREAM_END && r != Z_BUF_ERROR)
      return mml_err_set(err, MML_ERECORD,
                         "data shard %s: gzip data error near compressed byte "
                         "%lld: %s",
                         shard_of(b)->path, (long long)in_before, b->z.msg ? b->z.msg : "corrupt");
    mml_status st = text_out(b, b->zbuf, CHUNK - b->z.avail_out, err);
    if (st) return st;
    if (r == Z_STREAM_END) b->z_ended = 1;
  }
  /* drain output that did not fit */
  for (;;) {
    if (b->z_ended) break;
    b->z.next_out = b->zbuf;
    b->z.avail_out = CHUNK;
    int r = inflate(&b->z, Z_NO_FLUSH);
    size_t got = CHUNK - b->z.avail_out;
    if (r == Z_STREAM_END) b->z_ended = 1;
    if (got == 0) break;
    mml_status st = text_out(b, b->zbuf, got, err);
    if (st) return st;
  }
  return MML_OK;
}

static mml_status feed_zstd(mml_index_builder *b, const uint8_t *p, size_t n, mml_err *err) {
  ZSTD_inBuffer in = {p, n, 0};
  for (;;) {
    ZSTD_outBuffer out = {b->zbuf, CHUNK, 0};
    size_t r = ZSTD_decompressStream(b->zs, &out, &in);
    if (ZSTD_isError(r))
      return mml_err_set(err, MML_ERECORD,
                         "data shard %s: zstd data error near compressed byte "
                         "%lld: %s",
                         shard_of(b)->path, (long long)(b->raw_off + (int64_t)in.pos),
                         ZSTD_getErrorName(r));
    b->zs_last = r;
    mml_status st = text_out(b, b->zbuf, out.pos, err);
    if (st) return st;
    if (in.pos == in.size && out.pos < out.size) break; /* input used, output drained */
  }
  return MML_OK;
}

static mml_status feed_raw(mml_index_builder *b, const uint8_t *p, size_t n, mml_err *err) {
  if (!n) return MML_OK;
  if (mml_cancelled(b->ix->cancel)) return index_cancelled(b, err);
  mml_compression c = shard_of(b)->compression;
  mml_status st = c == MML_COMPRESS_GZIP   ? feed_gzip(b, p, n, err)
                  : c == MML_COMPRESS_ZSTD ? feed_zstd(b, p, n, err)
                                           : ix_scan_text(b, p, n, err);
  b->raw_off += (int64_t)n;
  return st;
}

/* ---- builder API ----------------------------------------------------------------------- */

mml_status mml_index_begin(mml_index *ix, const char *path, mml_layout want,
                           mml_index_builder **out, mml_err *err) {
  *out = NULL;
  if (want != MML_LAYOUT_AUTO && want != MML_LAYOUT_JSONL && want != MML_LAYOUT_JSON &&
      want != MML_LAYOUT_WDS)
    return mml_err_set(err, MML_ECONFIG, "data shard %s: unknown layout %d", path, (int)want);
  mml_index_builder *b = calloc(1, sizeof *b);
  mml_index_shard *s = realloc(ix->shards, (size_t)(ix->nshards + 1) * sizeof *s);
  if (!b || !s) {
    free(b);
    if (s) ix->shards = s;
    return mml_err_set(err, MML_ENOMEM, "data shard %s: out of memory indexing", path);
  }
  ix->shards = s;
  mml_index_shard *sh = &s[ix->nshards];
  memset(sh, 0, sizeof *sh);
  sh->fd = -1;
  sh->first = ix->n;
  sh->layout = want == MML_LAYOUT_JSON ? MML_LAYOUT_JSON : MML_LAYOUT_JSONL;
  if (!(sh->path = strdup(path))) {
    free(b);
    return mml_err_set(err, MML_ENOMEM, "data shard %s: out of memory indexing", path);
  }
  b->ix = ix;
  b->shard = ix->nshards++;
  b->want = want;
  b->line_no = 1;
  b->group = -1;
  b->next_size = -1;
  *out = b;
  return MML_OK;
}

mml_status mml_index_feed(mml_index_builder *b, const uint8_t *data, size_t len, mml_err *err) {
  if (!b->sniffed) {
    size_t k = sizeof b->head - b->nhead < len ? sizeof b->head - b->nhead : len;
    memcpy(b->head + b->nhead, data, k);
    b->nhead += k;
    data += k, len -= k;
    if (b->nhead < sizeof b->head) return MML_OK;
    mml_status st = start_raw(b, err);
    if (!st) st = feed_raw(b, b->head, b->nhead, err);
    if (st) return st;
  }
  return feed_raw(b, data, len, err);
}

static void builder_free(mml_index_builder *b) {
  mml_bytes_free(&b->ext);
  free(b->next_name);
  if (b->z_init) inflateEnd(&b->z);
  ZSTD_freeDStream(b->zs);
  free(b->zbuf);
  free(b);
}

mml_status mml_index_end(mml_index_builder *b, mml_err *err) {
  mml_status st = MML_OK;
  if (!b->sniffed) { /* fewer than 512 bytes in all */
    st = start_raw(b, err);
    if (!st) st = feed_raw(b, b->head, b->nhead, err);
  }
  mml_index_shard *sh = shard_of(b);
  if (!st && sh->compression == MML_COMPRESS_GZIP && !b->z_ended)
    st = mml_err_set(err, MML_ERECORD, "data shard %s: truncated gzip data (%lld compressed bytes)",
                     sh->path, (long long)b->raw_off);
  if (!st && sh->compression == MML_COMPRESS_ZSTD && b->zs_last != 0)
    st = mml_err_set(err, MML_ERECORD, "data shard %s: truncated zstd data (%lld compressed bytes)",
                     sh->path, (long long)b->raw_off);
  if (!st) {
    sh->size = b->raw_off;
    if (sh->layout == MML_LAYOUT_WDS) {
      if (!b->tar_end && (b->nhdr || b->skip))
        st = mml_err_set(err, MML_ERECORD,
                         "data shard %s: truncated tar (ends at byte %lld "
                         "inside a %s)",
                         sh->path, (long long)b->pos, b->nhdr ? "header" : "member");
      else if (ix_tar_close_group(b))
        st = ix_oom(b, err);
    } else if (sh->layout == MML_LAYOUT_JSONL) {
      sh->data_end = b->pos;
      /* A last line without '\n' still counts; an empty tail after the final '\n' does not. */
      if (b->content || b->line_start < b->pos) st = ix_end_line(b, b->pos, err);
    } else if (b->js != J_DONE) {
      if (b->js == J_ELEM && !(b->scalar && !b->in_str && b->depth == 0))
        st = ix_json_error(b, err,
                           "element %lld (at byte %lld) is not closed at the end of the "
                           "data (byte %lld)",
                           (long long)sh->count - 1, (long long)b->elem_start, (long long)b->pos);
      else if (b->js == J_OPEN)
        st = mml_err_set(err, MML_ERECORD, "data shard %s: no JSON array (the data is empty)",
                         sh->path);
      else
        st = mml_err_set(err, MML_ERECORD,
                         "data shard %s: malformed JSON array: no closing ']' (the data ends at "
                         "byte %lld after %lld elements)",
                         sh->path, (long long)b->pos, (long long)sh->count);
    }
  }
  if (st) {
    mml_index_abort(b);
    return st;
  }
  builder_free(b);
  return MML_OK;
}

void mml_index_abort(mml_index_builder *b) {
  if (!b) return;
  mml_index *ix = b->ix;
  mml_index_shard *sh = shard_of(b); /* always the last shard */
  ix->n = sh->first;
  free(sh->path);
  free(sh->blank_runs);
  free(sh->members);
  free(sh->names);
  mml_pq_close(sh->pq);
  if (sh->fd >= 0) close(sh->fd);
  ix->nshards--;
  builder_free(b);
}

mml_status mml_index_add_bytes(mml_index *ix, const char *path, mml_layout want,
                               const uint8_t *data, size_t len, mml_err *err) {
  mml_index_builder *b;
  mml_status st = mml_index_begin(ix, path, want, &b, err);
  if (st) return st;
  if ((st = mml_index_feed(b, data, len, err))) {
    mml_index_abort(b);
    return st;
  }
  return mml_index_end(b, err);
}

/* Member data of a plain tar that the scan would pass over unread now (0: none). */
static int64_t skippable(const mml_index_builder *b) {
  const mml_index_shard *sh = shard_of((mml_index_builder *)b);
  if (!b->sniffed || sh->compression != MML_COMPRESS_NONE || sh->layout != MML_LAYOUT_WDS ||
      b->ext_kind || b->tar_end)
    return 0;
  return b->skip;
}

/* Seeks fd past the member data the scan would skip (a WebDataset shard of large members
 * is indexed from its headers alone), never past the file's end (a member cut short
 * stays a truncated tar). */
static void seek_members(mml_index_builder *b, int fd, int64_t file_size) {
  int64_t k = skippable(b);
  if (k < CHUNK) return;
  off_t cur = lseek(fd, 0, SEEK_CUR);
  if (cur < 0 || cur >= file_size) return;
  if (k > file_size - cur) k = file_size - cur;
  if (lseek(fd, (off_t)k, SEEK_CUR) < 0) return;
  b->skip -= k;
  b->pos += k;
  b->raw_off += k;
}

static const char *file_kind(mode_t m) {
  return S_ISFIFO(m)   ? "FIFO (named pipe)"
         : S_ISCHR(m)  ? "character device"
         : S_ISBLK(m)  ? "block device"
         : S_ISSOCK(m) ? "socket"
         : S_ISDIR(m)  ? "folder"
                       : "special file";
}

/* PAR1 at the start and the end of the file. */
static int is_parquet(int fd, int64_t size) {
  uint8_t a[4], z[4];
  return size >= 12 && pread(fd, a, 4, 0) == 4 && pread(fd, z, 4, (off_t)size - 4) == 4 &&
         !memcmp(a, "PAR1", 4) && !memcmp(z, "PAR1", 4);
}

mml_status mml_index_add_file(mml_index *ix, const char *path, mml_layout want, mml_err *err) {
  /* O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below) */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    return mml_err_set(err, e == ENOENT || e == ENOTDIR ? MML_ENOENT : MML_EIO, "data shard %s: %s",
                       path, strerror(e));
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int e = errno;
    close(fd);
    return mml_err_set(err, MML_EIO, "data shard %s: %s", path, strerror(e));
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return mml_err_set(err, MML_ECONFIG, "data shard %s is a %s, not a regular file: refused", path,
                       file_kind(sb.st_mode));
  }
  const int64_t size = (int64_t)sb.st_size;
  if (want == MML_LAYOUT_AUTO && is_parquet(fd, size)) {
    mml_status pst = ix_add_parquet(ix, path, fd, size, err);
    close(fd);
    return pst;
  }
  uint8_t *buf = malloc(CHUNK);
  mml_index_builder *b = NULL;
  mml_status st = buf ? mml_index_begin(ix, path, want, &b, err)
                      : mml_err_set(err, MML_ENOMEM, "data shard %s: out of memory indexing", path);
  while (!st) {
    ssize_t r = read(fd, buf, CHUNK);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      st = mml_err_set(err, MML_EIO, "data shard %s: read failed: %s", path, strerror(errno));
      break;
    }
    if (r == 0) break;
    st = mml_index_feed(b, buf, (size_t)r, err);
    if (!st) seek_members(b, fd, size);
  }
  free(buf);
  close(fd);
  if (st) {
    mml_index_abort(b);
    return st;
  }
  return mml_index_end(b, err);
}

void mml_index_free(mml_index *ix) {
  for (int i = 0; i < ix->nshards; i++) {
    free(ix->shards[i].path);
    free(ix->shards[i].blank_runs);
    free(ix->shards[i].members);
    free(ix->shards[i].names);
    mml_pq_close(ix->shards[i].pq);
    if (ix->shards[i].fd >= 0) close(ix->shards[i].fd);
  }
  free(ix->shards);
  free(ix->offsets);
  memset(ix, 0, sizeof *ix);
}

/* ---- reading ----------------------------------------------------------------------------- */

void mml_index_locate(const mml_index *ix, int64_t i, int *shard, int64_t *off, int64_t *len,
                      int64_t *where) {
  int lo = 0, hi = ix->nshards - 1;
  while (lo < hi) { /* last shard with first <= i and count > 0 */
    int mid = (lo + hi + 1) / 2;
    if (ix->shards[mid].first <= i)
      lo = mid;
    else
      hi = mid - 1;
  }
  while (lo > 0 && ix->shards[lo].count == 0) lo--;
  const mml_index_shard *sh = &ix->shards[lo];
  int64_t k = i - sh->first;
  *shard = lo;
  if (sh->compression == MML_COMPRESS_PARQUET) { /* a row: decoded with its row group */
    *off = *where = ix->offsets[i];
    *len = 0;
    return;
  }
  if (sh->layout == MML_LAYOUT_WDS) { /* the group's .json member */
    int64_t m = ix->offsets[i], m1 = k + 1 < sh->count ? ix->offsets[i + 1] : sh->nmembers;
    for (; m < m1; m++) {
      const mml_member *mb = &sh->members[m];
      if (!strcmp(sh->names + mb->name + mb->key_len, ".json")) break;
    }
    *off = sh->members[m].off;
    *len = sh->members[m].size;
    *where = ix->offsets[i];
    return;
  }
  int64_t end = (k + 1 < sh->count) ? ix->offsets[i + 1] : sh->data_end;
  *off = ix->offsets[i];
  *len = end - ix->offsets[i];
  if (sh->layout == MML_LAYOUT_JSON) {
    *where = k;
    return;
  }
  int64_t r0 = 0, r1 = sh->nruns; /* the first run after record k: binary search */
  while (r0 < r1) {
    int64_t mid = r0 + (r1 - r0) / 2;
    if (sh->blank_runs[mid].before <= k)
      r0 = mid + 1;
    else
      r1 = mid;
  }
  /* the (k+1)-th non-blank line, after the blank lines of the runs before it */
  *where = k + 1 + (r0 ? sh->blank_runs[r0 - 1].through : 0);
}

size_t mml_index_record_len(const mml_index_shard *sh, const uint8_t *data, size_t len) {
  if (sh->layout == MML_LAYOUT_WDS) return len;
  if (sh->layout == MML_LAYOUT_JSONL) {
    const uint8_t *nl = memchr(data, '\n', len);
    return nl ? (size_t)(nl - data) : len;
  }
  /* element, blanks, ',' (before the next element), blanks */
  while (len && is_ws(data[len - 1])) len--;
  if (len && data[len - 1] == ',') len--;
  while (len && is_ws(data[len - 1])) len--;
  return len;
}

mml_status mml_index_read(const mml_index_shard *sh, int64_t off, int64_t len, mml_bytes *out,
                          mml_err *err) {
  if (sh->fd < 0) return mml_read_file(sh->path, off, len, out, err);
  mml_bytes_clear(out);
  if (mml_bytes_reserve(out, (size_t)len + 1))
    return mml_err_set(err, MML_ENOMEM, "%s: cannot allocate %lld bytes", sh->path, (long long)len);
  size_t got = 0;
  while ((int64_t)got < len) {
    ssize_t r = pread(sh->fd, out->data + got, (size_t)len - got, off + (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      return mml_err_set(err, MML_EIO, "%s: reading its decompressed copy failed: %s", sh->path,
                         strerror(errno));
    if (r == 0) break;
    got += (size_t)r;
  }
  out->len = got;
  out->data[got] = 0;
  return MML_OK;
}

int mml_index_shard_remote(const mml_index_shard *sh) {
  return sh->fd < 0 && mml_path_is_remote(sh->path);
}

/* Sample i's members [*m0, *m1) in its shard. */
static void group_of(const mml_index *ix, const mml_index_shard *sh, int64_t i, int64_t *m0,
                     int64_t *m1) {
  *m0 = ix->offsets[i];
  *m1 = i + 1 < sh->first + sh->count ? ix->offsets[i + 1] : sh->nmembers;
}

int mml_index_member(const mml_index *ix, int shard, int64_t i, const char *ref, int64_t *off,
                     int64_t *len) {
  const mml_index_shard *sh = &ix->shards[shard];
  if (sh->layout != MML_LAYOUT_WDS || sh->compression == MML_COMPRESS_PARQUET) return 0;
  int64_t m0, m1;
  group_of(ix, sh, i, &m0, &m1);
  for (int64_t m = m0; m < m1; m++) {
    const mml_member *mb = &sh->members[m];
    const char *name = sh->names + mb->name, *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (!strcmp(name, ref) || !strcmp(name + mb->key_len + 1, ref) || !strcmp(base, ref)) {
      *off = mb->off;
      *len = mb->size;
      return 1;
    }
  }
  return 0;
}

/* Sample i's members whose name `is_kind` accepts, in tar order, into names (at most max). */
static int members_of_kind(const mml_index *ix, int shard, int64_t i, int (*is_kind)(const char *),
                           const char **names, int max) {
  const mml_index_shard *sh = &ix->shards[shard];
  if (sh->layout != MML_LAYOUT_WDS || sh->compression == MML_COMPRESS_PARQUET) return 0;
  int64_t m0, m1;
  group_of(ix, sh, i, &m0, &m1);
  int n = 0;
  for (int64_t m = m0; m < m1; m++) {
    const char *name = sh->names + sh->members[m].name;
    if (!is_kind(name)) continue;
    if (n < max) names[n] = name;
    n++;
  }
  return n;
}

int mml_index_is_image_name(const char *name) { return ix_is_image_ext(name); }
int mml_index_is_video_name(const char *name) { return ix_is_video_ext(name); }

int mml_index_images(const mml_index *ix, int shard, int64_t i, const char **names, int max) {
  return members_of_kind(ix, shard, i, ix_is_image_ext, names, max);
}

int mml_index_videos(const mml_index *ix, int shard, int64_t i, const char **names, int max) {
  return members_of_kind(ix, shard, i, ix_is_video_ext, names, max);
}

void mml_index_name_sample(const mml_index *ix, int shard, int64_t i, int64_t where, char *out,
                           size_t cap) {
  const mml_index_shard *sh = &ix->shards[shard];
  if (sh->compression == MML_COMPRESS_PARQUET && sh->pq) {
    char key[64];
    int64_t row = ix->offsets[i];
    mml_pq_row_key(mml_pq_row_group_of(sh->pq, row), row, key, sizeof key);
    snprintf(out, cap, "%s[%s]", sh->path, key);
  } else if (sh->layout == MML_LAYOUT_WDS) {
    const mml_member *mb = &sh->members[ix->offsets[i]];
    snprintf(out, cap, "%s[%.*s]", sh->path, (int)mb->key_len, sh->names + mb->name);
  } else if (sh->layout == MML_LAYOUT_JSON)
    snprintf(out, cap, "%s[%lld] (byte %lld)", sh->path, (long long)where,
             (long long)ix->offsets[i]);
  else
    snprintf(out, cap, "%s:%lld", sh->path, (long long)where);
}

uint64_t mml_index_hash(const mml_index *ix) { return mml_index_hash_shards(ix, 0, ix->nshards); }

uint64_t mml_index_hash_shards(const mml_index *ix, int first, int n) {
  uint64_t h = 0;
  for (int i = first; i < first + n; i++) {
    const mml_index_shard *sh = &ix->shards[i];
    const char *base = strrchr(sh->path, '/');
    base = base ? base + 1 : sh->path; /* the data may move to another mount */
    h = mml_hash_bytes(h, base, strlen(base) + 1);
    h = mml_hash_bytes(h, &sh->size, sizeof sh->size);
    h = mml_hash_bytes(h, &sh->count, sizeof sh->count);
  }
  return h;
}
