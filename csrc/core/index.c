/*
 * index.c — the shard line index (see mml/index.h).
 *
 * A sample is a line holding anything besides spaces, tabs and '\r'.  The scanner walks
 * the bytes once, keeping two bits of state across chunk boundaries: whether the current
 * line has started a sample, and where it began.  One thread builds; the result is
 * read-only afterwards.
 */
#include "mml/index.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct scan {
  int64_t line_start; /* offset of the current line */
  int64_t line_no;    /* 1-based number of the current line */
  int content;        /* current line has a non-blank byte */
} scan;

static mml_status push_offset(mml_index *ix, int64_t off) {
  if (ix->n == ix->cap) {
    int64_t nc = ix->cap ? ix->cap * 2 : 1024;
    int64_t *p = realloc(ix->offsets, (size_t)nc * sizeof *p);
    if (!p) return MML_ENOMEM;
    ix->offsets = p;
    ix->cap = nc;
  }
  ix->offsets[ix->n++] = off;
  return MML_OK;
}

static mml_status push_blank(mml_index_shard *sh, int64_t line) {
  if ((sh->nblank & (sh->nblank - 1)) == 0) { /* grow at powers of two */
    int64_t nc = sh->nblank ? sh->nblank * 2 : 4;
    int64_t *p = realloc(sh->blank_lines, (size_t)nc * sizeof *p);
    if (!p) return MML_ENOMEM;
    sh->blank_lines = p;
  }
  sh->blank_lines[sh->nblank++] = line;
  return MML_OK;
}

/* Ends the current line (at a '\n' or end of file). */
static mml_status end_line(mml_index *ix, mml_index_shard *sh, scan *sc, int64_t next_start) {
  mml_status st = sc->content ? push_offset(ix, sc->line_start) : push_blank(sh, sc->line_no);
  if (sc->content) sh->count++;
  sc->line_start = next_start;
  sc->line_no++;
  sc->content = 0;
  return st;
}

static mml_status scan_chunk(mml_index *ix, mml_index_shard *sh, scan *sc, const uint8_t *p,
                             size_t len, int64_t base) {
  for (size_t i = 0; i < len; i++) {
    uint8_t c = p[i];
    if (c == '\n') {
      mml_status st = end_line(ix, sh, sc, base + (int64_t)i + 1);
      if (st) return st;
    } else if (!sc->content && c != ' ' && c != '\t' && c != '\r') {
      sc->content = 1;
      /* fast path: skip to the end of the line */
      const uint8_t *nl = memchr(p + i, '\n', len - i);
      if (!nl) return MML_OK;
      i = (size_t)(nl - p) - 1;
    }
  }
  return MML_OK;
}

static mml_status start_shard(mml_index *ix, const char *path, mml_index_shard **out,
                              mml_err *err) {
  mml_index_shard *s = realloc(ix->shards, (size_t)(ix->nshards + 1) * sizeof *s);
  if (!s) return mml_err_set(err, MML_ENOMEM, "%s: out of memory indexing", path);
  ix->shards = s;
  mml_index_shard *sh = &s[ix->nshards];
  memset(sh, 0, sizeof *sh);
  sh->path = strdup(path);
  if (!sh->path) return mml_err_set(err, MML_ENOMEM, "%s: out of memory indexing", path);
  sh->first = ix->n;
  ix->nshards++;
  *out = sh;
  return MML_OK;
}

static mml_status finish_shard(mml_index *ix, mml_index_shard *sh, scan *sc, int64_t size,
                               mml_err *err) {
  sh->size = size;
  /* A last line without '\n' still counts; an empty tail after the final '\n' does not. */
  if (sc->content || sc->line_start < size) {
    if (end_line(ix, sh, sc, size)) return mml_err_set(err, MML_ENOMEM, "%s: out of memory", sh->path);
  }
  return MML_OK;
}

mml_status mml_index_add_bytes(mml_index *ix, const char *path, const uint8_t *data, size_t len,
                               mml_err *err) {
  mml_index_shard *sh = NULL;
  mml_status st = start_shard(ix, path, &sh, err);
  if (st) return st;
  scan sc = {0, 1, 0};
  if (scan_chunk(ix, sh, &sc, data, len, 0))
    return mml_err_set(err, MML_ENOMEM, "%s: out of memory indexing", path);
  return finish_shard(ix, sh, &sc, (int64_t)len, err);
}

mml_status mml_index_add_file(mml_index *ix, const char *path, mml_err *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return mml_err_set(err, e == ENOENT || e == ENOTDIR ? MML_ENOENT : MML_EIO,
                       "data shard %s: %s", path, strerror(e));
  }
  mml_index_shard *sh = NULL;
  mml_status st = start_shard(ix, path, &sh, err);
  if (st) {
    close(fd);
    return st;
  }
  enum { CHUNK = 1 << 20 };
  uint8_t *buf = malloc(CHUNK);
  if (!buf) {
    close(fd);
    return mml_err_set(err, MML_ENOMEM, "%s: out of memory indexing", path);
  }
  scan sc = {0, 1, 0};
  int64_t off = 0;
  for (;;) {
    ssize_t r = read(fd, buf, CHUNK);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      st = mml_err_set(err, MML_EIO, "data shard %s: read failed: %s", path, strerror(errno));
      break;
    }
    if (r == 0) break;
    if (scan_chunk(ix, sh, &sc, buf, (size_t)r, off)) {
      st = mml_err_set(err, MML_ENOMEM, "%s: out of memory indexing", path);
      break;
    }
    off += r;
  }
  free(buf);
  close(fd);
  if (st) return st;
  return finish_shard(ix, sh, &sc, off, err);
}

void mml_index_free(mml_index *ix) {
  for (int i = 0; i < ix->nshards; i++) {
    free(ix->shards[i].path);
    free(ix->shards[i].blank_lines);
  }
  free(ix->shards);
  free(ix->offsets);
  memset(ix, 0, sizeof *ix);
}

void mml_index_locate(const mml_index *ix, int64_t i, int *shard, int64_t *off, int64_t *len,
                      int64_t *line) {
  int lo = 0, hi = ix->nshards - 1;
  while (lo < hi) { /* last shard with first <= i and count > 0 */
    int mid = (lo + hi + 1) / 2;
    if (ix->shards[mid].first <= i) lo = mid;
    else hi = mid - 1;
  }
  while (lo > 0 && ix->shards[lo].count == 0) lo--;
  const mml_index_shard *sh = &ix->shards[lo];
  int64_t k = i - sh->first;
  int64_t end = (k + 1 < sh->count) ? ix->offsets[i + 1] : sh->size;
  *shard = lo;
  *off = ix->offsets[i];
  *len = end - ix->offsets[i];
  int64_t ln = k + 1; /* the (k+1)-th non-blank line */
  for (int64_t b = 0; b < sh->nblank && sh->blank_lines[b] <= ln; b++) ln++;
  *line = ln;
}

uint64_t mml_index_hash(const mml_index *ix) {
  uint64_t h = 0;
  for (int i = 0; i < ix->nshards; i++) {
    const mml_index_shard *sh = &ix->shards[i];
    const char *base = strrchr(sh->path, '/');
    base = base ? base + 1 : sh->path; /* the data may move to another mount */
    h = mml_hash_bytes(h, base, strlen(base) + 1);
    h = mml_hash_bytes(h, &sh->size, sizeof sh->size);
    h = mml_hash_bytes(h, &sh->count, sizeof sh->count);
  }
  return h;
}
