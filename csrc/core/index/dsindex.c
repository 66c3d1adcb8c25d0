/*
 * dsindex.c — the dataset index file (see mml/dsindex.h): parse with full checks,
 * serialise, atomic write, the partial file of an interrupted build, and adding an
 * indexed shard to a loader's mml_index without reading the shard.
 *
 * DESIGN
 *   A sidecar is read whole (it is ~20 bytes per sample) and every number in it is
 *   checked before use: sections must fit the file, offsets must be ascending and inside
 *   the shard, image counts must add up, member names must be NUL-terminated inside the
 *   pool.  A checksum over the file catches torn or edited files; a bad file is an error
 *   naming it, never a crash or a wrong sample.  The file is little-endian; structs are
 *   written as they lie in memory (fixed-width fields, no padding: checked below).
 *
 * Threads: pure functions over caller memory.
 */
#include "mml/dsindex.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

_Static_assert(sizeof(mml_dsx_sample) == 8, "mml_dsx_sample is 8 bytes on disk");
_Static_assert(sizeof(mml_dsx_image) == 12, "mml_dsx_image is 12 bytes on disk");
_Static_assert(sizeof(mml_member) == 24, "mml_member is 24 bytes on disk");

enum {
  H_MAGIC = 0,
  H_VERSION = 8,
  H_HSIZE = 12,
  H_SIZE = 16,
  H_MTIME = 24,
  H_KEY = 32,
  H_N = 40,
  H_NIMAGES = 48,
  H_NBLANK = 56,
  H_NMEMBERS = 64,
  H_NAMES = 72,
  H_DATA_END = 80,
  H_LAYOUT = 88,
  H_COMPRESSION = 89,
  H_ETAG = 92,
  H_SETTINGS = 96,
  H_CHECKSUM = 120
};

static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static uint64_t get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}
static uint32_t get32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

void mml_dsx_free(mml_dsx *x) {
  free(x->settings);
  free(x->offsets);
  free(x->samples);
  free(x->images);
  free(x->first_image);
  free(x->blank_lines);
  free(x->members);
  free(x->names);
  memset(x, 0, sizeof *x);
}

static void header(const mml_dsx *x, uint8_t h[MML_DSX_HEADER]) {
  memset(h, 0, MML_DSX_HEADER);
  memcpy(h + H_MAGIC, MML_DSX_MAGIC, 8);
  put32(h + H_VERSION, MML_DSX_VERSION);
  put32(h + H_HSIZE, MML_DSX_HEADER);
  put64(h + H_SIZE, (uint64_t)x->shard_size);
  put64(h + H_MTIME, (uint64_t)x->shard_mtime_ns);
  put64(h + H_KEY, x->key);
  put64(h + H_N, (uint64_t)x->n);
  put64(h + H_NIMAGES, (uint64_t)x->nimages);
  put64(h + H_NBLANK, (uint64_t)x->nblank);
  put64(h + H_NMEMBERS, (uint64_t)x->nmembers);
  put64(h + H_NAMES, (uint64_t)x->names_len);
  put64(h + H_DATA_END, (uint64_t)x->data_end);
  h[H_LAYOUT] = (uint8_t)x->layout;
  h[H_COMPRESSION] = (uint8_t)x->compression;
  put32(h + H_ETAG, (uint32_t)strlen(x->etag));
  put32(h + H_SETTINGS, (uint32_t)(x->settings ? strlen(x->settings) : 0));
}

uint64_t mml_dsx_entry_hash(int64_t k, const mml_dsx_sample *s, const void *images) {
  uint64_t h = mml_hash_bytes(0, &k, sizeof k);
  h = mml_hash_bytes(h, s, sizeof *s);
  return mml_hash_bytes(h, images, (size_t)s->nimages * sizeof(mml_dsx_image));
}

void mml_dsx_partial_header(const mml_dsx *x, uint8_t out[MML_DSX_HEADER]) {
  mml_dsx y = *x;
  y.n = y.nimages = 0;
  header(&y, out);
}

static mml_status put_section(mml_bytes *out, const void *p, size_t n) {
  static const uint8_t zero[8];
  mml_status st = n ? mml_bytes_append(out, p, n) : MML_OK;
  if (!st && pad8(n) > n) st = mml_bytes_append(out, zero, pad8(n) - n);
  return st;
}

mml_status mml_dsx_serialize(const mml_dsx *x, mml_bytes *out, mml_err *err) {
  uint8_t h[MML_DSX_HEADER];
  header(x, h);
  mml_bytes_clear(out);
  size_t need = MML_DSX_HEADER + pad8(strlen(x->etag)) +
                pad8(x->settings ? strlen(x->settings) : 0) + (size_t)x->n * 16 +
                pad8((size_t)x->nimages * sizeof(mml_dsx_image)) + (size_t)x->nblank * 8 +
                (size_t)x->nmembers * sizeof(mml_member) + pad8((size_t)x->names_len);
  mml_status st = mml_bytes_reserve(out, need);
  if (!st) st = mml_bytes_append(out, h, sizeof h);
  if (!st) st = put_section(out, x->etag, strlen(x->etag));
  if (!st) st = put_section(out, x->settings, x->settings ? strlen(x->settings) : 0);
  if (!st) st = put_section(out, x->offsets, (size_t)x->n * 8);
  if (!st) st = put_section(out, x->samples, (size_t)x->n * sizeof(mml_dsx_sample));
  if (!st) st = put_section(out, x->images, (size_t)x->nimages * sizeof(mml_dsx_image));
  if (!st) st = put_section(out, x->blank_lines, (size_t)x->nblank * 8);
  if (!st) st = put_section(out, x->members, (size_t)x->nmembers * sizeof(mml_member));
  if (!st) st = put_section(out, x->names, (size_t)x->names_len);
  if (st)
    return mml_err_set(err, MML_ENOMEM, "out of memory serialising an index (%zu bytes)", need);
  put64(out->data + H_CHECKSUM, mml_hash_bytes(0, out->data, out->len));
  return MML_OK;
}

mml_status mml_dsx_write_file(const char *path, const uint8_t *data, size_t len, mml_err *err) {
  size_t n = strlen(path);
  char *tmp = malloc(n + 32);
  if (!tmp) return mml_err_set(err, MML_ENOMEM, "out of memory");
  snprintf(tmp, n + 32, "%s.tmp%ld", path, (long)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  mml_status st = MML_OK;
  if (fd < 0) {
    st = mml_err_set(err, MML_EIO, "cannot write index %s: %s", tmp, strerror(errno));
  } else {
    size_t done = 0;
    while (done < len) {
      ssize_t w = write(fd, data + done, len - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        st = mml_err_set(err, MML_EIO, "cannot write index %s: %s", tmp, strerror(errno));
        break;
      }
      done += (size_t)w;
    }
    if (close(fd) != 0 && !st)
      st = mml_err_set(err, MML_EIO, "cannot write index %s: %s", tmp, strerror(errno));
    if (!st && rename(tmp, path) != 0)
      st = mml_err_set(err, MML_EIO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (st) unlink(tmp);
  }
  free(tmp);
  return st;
}

/* ---- parsing ------------------------------------------------------------------------- */

typedef struct reader {
  const uint8_t *p;
  size_t len, at;
} reader;

/* The next section of n bytes (padded to 8), or NULL when it does not fit. */
static const uint8_t *take(reader *r, uint64_t n) {
  if (n > r->len || pad8((size_t)n) > r->len - r->at) return NULL;
  const uint8_t *p = r->p + r->at;
  r->at += pad8((size_t)n);
  return p;
}

static void *dup_section(const uint8_t *p, size_t n) {
  void *d = malloc(n ? n : 1);
  if (d && n) memcpy(d, p, n);
  return d;
}

/* Identity fields of a header; counts range-checked against the file length. */
static mml_status parse_header(const uint8_t *h, size_t len, const char *name, mml_dsx *x,
                               mml_err *err) {
  if (len < MML_DSX_HEADER || memcmp(h, MML_DSX_MAGIC, 8))
    return mml_err_set(err, MML_ERECORD, "index %s: not an mmloader index (bad magic)", name);
  uint32_t v = get32(h + H_VERSION);
  if (v != MML_DSX_VERSION || get32(h + H_HSIZE) != MML_DSX_HEADER)
    return mml_err_set(err, MML_ERECORD,
                       "index %s: format version %u, this mmloader reads version %u (rebuild "
                       "it with python -m mmloader index)",
                       name, v, MML_DSX_VERSION);
  x->shard_size = (int64_t)get64(h + H_SIZE);
  x->shard_mtime_ns = (int64_t)get64(h + H_MTIME);
  x->key = get64(h + H_KEY);
  x->n = (int64_t)get64(h + H_N);
  x->nimages = (int64_t)get64(h + H_NIMAGES);
  x->nblank = (int64_t)get64(h + H_NBLANK);
  x->nmembers = (int64_t)get64(h + H_NMEMBERS);
  x->names_len = (int64_t)get64(h + H_NAMES);
  x->data_end = (int64_t)get64(h + H_DATA_END);
  x->layout = (mml_layout)h[H_LAYOUT];
  x->compression = (mml_compression)h[H_COMPRESSION];
  int64_t lim = (int64_t)len;
  if (x->shard_size < 0 || x->n < 0 || x->n > lim || x->nimages < 0 || x->nimages > lim ||
      x->nblank < 0 || x->nblank > lim || x->nmembers < 0 || x->nmembers > lim ||
      x->names_len < 0 || x->names_len > lim || x->data_end < 0 ||
      (x->layout != MML_LAYOUT_JSONL && x->layout != MML_LAYOUT_JSON &&
       x->layout != MML_LAYOUT_WDS) ||
      x->compression > MML_COMPRESS_PARQUET || get32(h + H_ETAG) >= sizeof x->etag)
    return mml_err_set(err, MML_ERECORD, "index %s: corrupt header", name);
  return MML_OK;
}

static mml_status corrupt(mml_err *err, const char *name, const char *what) {
  return mml_err_set(err, MML_ERECORD,
                     "index %s: corrupt (%s); rebuild it with python -m "
                     "mmloader index",
                     name, what);
}

/* The etag and settings sections (after the header). */
static mml_status parse_texts(reader *r, const uint8_t *h, const char *name, mml_dsx *x,
                              mml_err *err) {
  uint32_t ne = get32(h + H_ETAG), ns = get32(h + H_SETTINGS);
  const uint8_t *e = take(r, ne), *s = e ? take(r, ns) : NULL;
  if (!e || !s) return corrupt(err, name, "truncated");
  memcpy(x->etag, e, ne);
  x->etag[ne] = 0;
  if (!(x->settings = malloc((size_t)ns + 1))) return mml_err_set(err, MML_ENOMEM, "out of memory");
  memcpy(x->settings, s, ns);
  x->settings[ns] = 0;
  return MML_OK;
}

/* Every cross-reference of a parsed index, so readers can index without checks. */
static mml_status check_refs(mml_dsx *x, const char *name, mml_err *err) {
  int64_t imgs = 0;
  for (int64_t i = 0; i < x->n; i++) {
    x->first_image[i] = imgs;
    imgs += x->samples[i].nimages;
    if (x->samples[i].status == 0 && x->samples[i].nimages == 0 && x->samples[i].text_tokens == 0)
      return corrupt(err, name, "a good sample without tokens");
    if (x->samples[i].nvideos > x->samples[i].nimages)
      return corrupt(err, name, "a sample with more videos than entries");
  }
  x->first_image[x->n] = imgs;
  if (imgs != x->nimages) return corrupt(err, name, "image counts do not add up");
  /* a Parquet shard's offsets are its rows (data_end of them); older indexes of one
   * (members of a decoded copy) are read as WebDataset ones: only their counts are used */
  int wds =
      x->layout == MML_LAYOUT_WDS && !(x->compression == MML_COMPRESS_PARQUET && !x->nmembers);
  int64_t hi = wds ? x->nmembers : x->data_end;
  if (!wds && x->compression == MML_COMPRESS_NONE && x->data_end > x->shard_size)
    return corrupt(err, name, "data end beyond the shard");
  for (int64_t i = 0; i < x->n; i++)
    if (x->offsets[i] < 0 || x->offsets[i] >= hi || (i && x->offsets[i] <= x->offsets[i - 1]))
      return corrupt(err, name, "record offsets out of order or range");
  for (int64_t i = 0; i < x->nmembers; i++) {
    const mml_member *m = &x->members[i];
    /* a compressed or Parquet shard's members lie in its decoded copy, not the file */
    int64_t bound = x->compression == MML_COMPRESS_NONE ? x->shard_size : INT64_MAX;
    if (m->off < 0 || m->size < 0 || m->off > bound - m->size || (int64_t)m->name >= x->names_len ||
        m->key_len > x->names_len - (int64_t)m->name ||
        !memchr(x->names + m->name, 0, (size_t)(x->names_len - (int64_t)m->name)) ||
        strlen(x->names + m->name) <= m->key_len || x->names[m->name + m->key_len] != '.')
      return corrupt(err, name, "member table"); /* a name is "key.ext": ext after key_len */
  }
  if (wds) { /* every sample's group must hold its ".json" member (mml_index_locate) */
    for (int64_t i = 0; i < x->n; i++) {
      int64_t m = x->offsets[i], m1 = i + 1 < x->n ? x->offsets[i + 1] : x->nmembers, j;
      for (j = m; j < m1; j++)
        if (!strcmp(x->names + x->members[j].name + x->members[j].key_len, ".json")) break;
      if (j == m1) return corrupt(err, name, "a sample without its .json member");
    }
  }
  for (int64_t i = 1; i < x->nblank; i++)
    if (x->blank_lines[i] <= x->blank_lines[i - 1]) return corrupt(err, name, "blank lines");
  return MML_OK;
}

mml_status mml_dsx_parse(const uint8_t *data, size_t len, const char *name, mml_dsx *x,
                         mml_err *err) {
  memset(x, 0, sizeof *x);
  mml_status st = parse_header(data, len, name, x, err);
  if (st) return st;
  uint8_t h[MML_DSX_HEADER];
  memcpy(h, data, sizeof h);
  uint64_t sum = get64(h + H_CHECKSUM);
  /* the checksum covers the file with its own field zeroed */
  uint64_t c = mml_hash_bytes(0, h, H_CHECKSUM);
  static const uint8_t zero[8];
  c = mml_hash_bytes(c, zero, 8);
  c = mml_hash_bytes(c, data + H_CHECKSUM + 8, len - H_CHECKSUM - 8);
  if (c != sum) return corrupt(err, name, "checksum mismatch: torn or edited file");
  reader r = {data, len, MML_DSX_HEADER};
  if ((st = parse_texts(&r, h, name, x, err))) goto fail;
  const uint8_t *off = take(&r, (uint64_t)x->n * 8);
  const uint8_t *smp = off ? take(&r, (uint64_t)x->n * sizeof(mml_dsx_sample)) : NULL;
  const uint8_t *img = smp ? take(&r, (uint64_t)x->nimages * sizeof(mml_dsx_image)) : NULL;
  const uint8_t *bl = img ? take(&r, (uint64_t)x->nblank * 8) : NULL;
  const uint8_t *mem = bl ? take(&r, (uint64_t)x->nmembers * sizeof(mml_member)) : NULL;
  const uint8_t *nam = mem ? take(&r, (uint64_t)x->names_len) : NULL;
  if (!nam || r.at != len) {
    st = corrupt(err, name, "section sizes do not match the file");
    goto fail;
  }
  x->offsets = dup_section(off, (size_t)x->n * 8);
  x->samples = dup_section(smp, (size_t)x->n * sizeof(mml_dsx_sample));
  x->images = dup_section(img, (size_t)x->nimages * sizeof(mml_dsx_image));
  x->blank_lines = dup_section(bl, (size_t)x->nblank * 8);
  x->members = dup_section(mem, (size_t)x->nmembers * sizeof(mml_member));
  x->names = dup_section(nam, (size_t)x->names_len);
  x->first_image = malloc(((size_t)x->n + 1) * sizeof *x->first_image);
  if (!x->offsets || !x->samples || !x->images || !x->blank_lines || !x->members || !x->names ||
      !x->first_image) {
    st = mml_err_set(err, MML_ENOMEM, "index %s: out of memory (%zu bytes)", name, len);
    goto fail;
  }
  if ((st = check_refs(x, name, err))) goto fail;
  return MML_OK;
fail:
  mml_dsx_free(x);
  return st;
}

mml_status mml_dsx_partial_parse(const uint8_t *data, size_t len, const char *name, mml_dsx *x,
                                 size_t *used, mml_err *err) {
  memset(x, 0, sizeof *x);
  *used = 0;
  mml_status st = parse_header(data, len, name, x, err);
  if (st) return st;
  reader r = {data, len, MML_DSX_HEADER};
  if ((st = parse_texts(&r, data, name, x, err))) {
    mml_dsx_free(x);
    return st;
  }
  /* entries up to the first torn (the build was killed mid-write) or damaged one (its
   * checksum does not match: a disk or copy error, an edit); the rest is rebuilt */
  size_t at = r.at, cap_s = 0, cap_i = 0;
  x->n = x->nimages = 0;
  while (len - at >= sizeof(mml_dsx_sample)) {
    mml_dsx_sample s;
    memcpy(&s, data + at, sizeof s);
    size_t nimg = (size_t)s.nimages * sizeof(mml_dsx_image), need = sizeof s + nimg + 8;
    if (len - at < need) break;
    if (get64(data + at + sizeof s + nimg) != mml_dsx_entry_hash(x->n, &s, data + at + sizeof s))
      break;
    if ((size_t)x->n == cap_s) {
      cap_s = cap_s ? 2 * cap_s : 4096;
      void *p = realloc(x->samples, cap_s * sizeof *x->samples);
      if (!p) goto oom;
      x->samples = p;
    }
    x->samples[x->n++] = s;
    if ((size_t)(x->nimages + s.nimages) > cap_i) {
      while ((size_t)(x->nimages + s.nimages) > cap_i) cap_i = cap_i ? 2 * cap_i : 4096;
      void *p = realloc(x->images, cap_i * sizeof *x->images);
      if (!p) goto oom;
      x->images = p;
    }
    if (s.nimages)
      memcpy(x->images + x->nimages, data + at + sizeof s, (size_t)s.nimages * sizeof *x->images);
    x->nimages += s.nimages;
    at += need;
  }
  *used = at;
  return MML_OK;
oom:
  mml_dsx_free(x);
  return mml_err_set(err, MML_ENOMEM, "index %s: out of memory", name);
}

/* ---- into a loader's index ------------------------------------------------------------ */

mml_status mml_dsx_add_to_index(const mml_dsx *x, mml_index *ix, const char *path, mml_err *err) {
  if (x->compression != MML_COMPRESS_NONE)
    return mml_err_set(err, MML_EINTERNAL, "index of %s: a compressed shard must be scanned", path);
  if (ix->n + x->n > ix->cap) {
    int64_t nc = ix->cap ? ix->cap : 1024;
    while (nc < ix->n + x->n) nc *= 2;
    int64_t *p = realloc(ix->offsets, (size_t)nc * sizeof *p);
    if (!p) return mml_err_set(err, MML_ENOMEM, "out of memory for %lld offsets", (long long)nc);
    ix->offsets = p;
    ix->cap = nc;
  }
  mml_index_shard *s = realloc(ix->shards, (size_t)(ix->nshards + 1) * sizeof *s);
  if (!s) return mml_err_set(err, MML_ENOMEM, "out of memory");
  ix->shards = s;
  mml_index_shard *sh = &s[ix->nshards];
  memset(sh, 0, sizeof *sh);
  sh->fd = -1;
  sh->path = strdup(path);
  mml_status bst = MML_OK;
  for (int64_t j = 0; !bst && j < x->nblank; j++) { /* blank line j follows line - 1 - j records */
    int64_t before = x->blank_lines[j] - 1 - j;
    bst = before < 0 || before > x->n ? MML_ERECORD : mml_index_push_blank(sh, before);
  }
  sh->members = dup_section((const uint8_t *)x->members, (size_t)x->nmembers * sizeof(mml_member));
  sh->names = dup_section((const uint8_t *)x->names, (size_t)x->names_len);
  if (!sh->path || bst || !sh->members || !sh->names) {
    free(sh->path);
    free(sh->blank_runs);
    free(sh->members);
    free(sh->names);
    return bst == MML_ERECORD
               ? mml_err_set(err, MML_ERECORD, "index of %s: corrupt blank lines", path)
               : mml_err_set(err, MML_ENOMEM, "out of memory");
  }
  sh->size = x->shard_size;
  sh->first = ix->n;
  sh->count = x->n;
  sh->layout = x->layout;
  sh->compression = MML_COMPRESS_NONE;
  sh->data_end = x->data_end;
  sh->nmembers = sh->members_cap = x->nmembers;
  sh->names_len = sh->names_cap = (size_t)x->names_len;
  if (x->n) memcpy(ix->offsets + ix->n, x->offsets, (size_t)x->n * sizeof *x->offsets);
  ix->n += x->n;
  ix->nshards++;
  return MML_OK;
}

mml_status mml_dsx_sidecar_path(const char *shard, const char *dir, mml_bytes *out) {
  mml_bytes_clear(out);
  mml_status st = MML_OK;
  if (dir && dir[0]) {
    const char *base = strrchr(shard, '/');
    base = base ? base + 1 : shard;
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/') dl--;
    char key[24]; /* ".%016llx": shards of one base name in other folders never collide */
    snprintf(key, sizeof key, ".%016llx",
             (unsigned long long)mml_hash_bytes(0, shard, strlen(shard)));
    st = mml_bytes_append(out, dir, dl);
    if (!st) st = mml_bytes_append(out, "/", 1);
    if (!st) st = mml_bytes_append(out, base, strlen(base));
    if (!st) st = mml_bytes_append(out, key, strlen(key));
  } else {
    st = mml_bytes_append(out, shard, strlen(shard));
  }
  if (!st) st = mml_bytes_append(out, MML_DSX_SUFFIX, sizeof MML_DSX_SUFFIX); /* with NUL */
  if (!st) out->len--;
  return st;
}
