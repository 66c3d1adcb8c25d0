/*
 * index_scan.c — the text layer of the sample index (design: index.c): the scanners that
 * turn (decompressed) shard text into record offsets, each seeing every byte once, with
 * their state in the builder so chunks may end anywhere:
 *   JSONL       a record per non-blank line; blank-line numbers kept for messages;
 *   JSON array  a small state machine (between elements / inside one: string, escape, a
 *               bit stack of open brackets up to MAX_DEPTH), structure only;
 *   tar         512-byte headers (GNU 'L' long names, pax 'x' path/size), member data
 *               skipped, members grouped by key; a group with a .json member is a record.
 * ix_scan_text decides the layout at the first non-blank byte (or by tar name or
 * ustar magic) and routes the bytes.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "index_int.h"

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

mml_status mml_index_push_blank(mml_index_shard *sh, int64_t records_before) {
  if (sh->nruns && sh->blank_runs[sh->nruns - 1].before == records_before) {
    sh->blank_runs[sh->nruns - 1].through++; /* the run goes on */
  } else {
    if (sh->nruns == sh->runs_cap) {
      int64_t nc = sh->runs_cap ? sh->runs_cap * 2 : 4;
      mml_blank_run *p = realloc(sh->blank_runs, (size_t)nc * sizeof *p);
      if (!p) return MML_ENOMEM;
      sh->blank_runs = p;
      sh->runs_cap = nc;
    }
    sh->blank_runs[sh->nruns++] = (mml_blank_run){records_before, sh->nblank + 1};
  }
  sh->nblank++;
  return MML_OK;
}

mml_status mml_index_blank_lines(const mml_index_shard *sh, int64_t **out, int64_t *n) {
  *out = NULL;
  *n = 0;
  if (!sh->nblank) return MML_OK;
  int64_t *p = malloc((size_t)sh->nblank * sizeof *p);
  if (!p) return MML_ENOMEM;
  int64_t k = 0, prev = 0;
  for (int64_t r = 0; r < sh->nruns; r++) {
    const mml_blank_run *run = &sh->blank_runs[r];
    /* the run's first line follows `before` records and `prev` blank lines */
    for (int64_t j = 0; j < run->through - prev; j++) p[k++] = run->before + prev + j + 1;
    prev = run->through;
  }
  *out = p;
  *n = k;
  return MML_OK;
}

/* Fails the build once the shard holds more than max_records records (`what`). */
static mml_status over_records(mml_index_builder *b, int64_t n, const char *what, mml_err *err) {
  int64_t max = b->ix->limits.max_records;
  if (max <= 0 || n <= max) return MML_OK;
  return mml_err_set(err, MML_ERECORD,
                     "data shard %s: more than max_shard_records=%lld %s (at text byte %lld); "
                     "refused (raise max_shard_records for a genuine shard this large)",
                     shard_of(b)->path, (long long)max, what, (long long)b->pos);
}

mml_status ix_oom(mml_index_builder *b, mml_err *err) {
  return mml_err_set(err, MML_ENOMEM, "data shard %s: out of memory indexing", shard_of(b)->path);
}

/* ---- JSONL ------------------------------------------------------------------------- */

/* Ends the current line (at a '\n' or end of file). */
mml_status ix_end_line(mml_index_builder *b, int64_t next_start, mml_err *err) {
  mml_index_shard *sh = shard_of(b);
  mml_status st = over_records(b, b->line_no, "lines (blank ones included)", err);
  if (st) return st;
  st = b->content ? push_offset(b->ix, b->line_start) : mml_index_push_blank(sh, sh->count);
  if (st) return ix_oom(b, err);
  if (b->content) sh->count++;
  b->line_start = next_start;
  b->line_no++;
  b->content = 0;
  return st;
}

/* Fails the build once the current line (unended at text byte `at`) passes max_line. */
static mml_status over_line(mml_index_builder *b, int64_t at, mml_err *err) {
  if (b->max_line <= 0 || at - b->line_start <= b->max_line) return MML_OK;
  mml_index_shard *sh = shard_of(b);
  return mml_err_set(err, MML_ERECORD,
                     "data shard %s: line %lld passes max_record_bytes=%lld bytes with no end (at "
                     "%s text byte %lld); refused, a likely compression bomb (raise "
                     "max_record_bytes for a genuine record this long)",
                     sh->path, (long long)b->line_no, (long long)b->max_line,
                     sh->compression != MML_COMPRESS_NONE ? "decompressed" : "streamed",
                     (long long)at);
}

static mml_status scan_lines(mml_index_builder *b, const uint8_t *p, size_t len, int64_t base,
                             mml_err *err) {
  for (size_t i = 0; i < len; i++) {
    uint8_t c = p[i];
    if (c == '\n') {
      mml_status st = ix_end_line(b, base + (int64_t)i + 1, err);
      if (st) return st;
    } else if (!b->content && c != ' ' && c != '\t' && c != '\r') {
      b->content = 1;
      /* fast path: skip to the end of the line */
      const uint8_t *nl = memchr(p + i, '\n', len - i);
      if (!nl) break;
      i = (size_t)(nl - p) - 1;
    }
  }
  return over_line(b, base + (int64_t)len, err); /* the line the chunk ends in */
}

/* ---- JSON array -------------------------------------------------------------------- */

static const char *show(uint8_t c, char buf[8]) {
  if (c >= 0x20 && c < 0x7f)
    snprintf(buf, 8, "'%c'", c);
  else
    snprintf(buf, 8, "0x%02x", c);
  return buf;
}

static mml_status start_elem(mml_index_builder *b, uint8_t c, int64_t at, mml_err *err) {
  mml_status st = over_records(b, shard_of(b)->count + 1, "array elements", err);
  if (st) return st;
  if (push_offset(b->ix, at)) return ix_oom(b, err);
  shard_of(b)->count++;
  b->elem_start = at;
  b->js = J_ELEM;
  b->in_str = b->esc = 0;
  b->depth = 0;
  b->scalar = !(c == '{' || c == '[');
  return MML_OK;
}

mml_status ix_json_error(mml_index_builder *b, mml_err *err, const char *fmt, ...) {
  char why[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  return mml_err_set(err, MML_ERECORD, "data shard %s: malformed JSON array: %s", shard_of(b)->path,
                     why);
}

/* One byte outside an element (states J_OPEN, J_FIRST, J_NEXT, J_AFTER, J_DONE). */
static mml_status json_between(mml_index_builder *b, uint8_t c, int64_t at, mml_err *err) {
  char sb[8];
  if (is_ws(c)) return MML_OK;
  int64_t k = shard_of(b)->count; /* elements so far */
  switch (b->js) {
    case J_OPEN:
      if (c != '[')
        return ix_json_error(b, err, "expected '[' at byte %lld, found %s", (long long)at,
                             show(c, sb));
      b->js = J_FIRST;
      return MML_OK;
    case J_FIRST:
      if (c == ']') {
        b->js = J_DONE;
        shard_of(b)->data_end = at;
        return MML_OK;
      }
      return start_elem(b, c, at, err);
    case J_NEXT:
      if (c == ']' || c == ',')
        return ix_json_error(b, err, "expected element %lld at byte %lld, found %s", (long long)k,
                             (long long)at, show(c, sb));
      return start_elem(b, c, at, err);
    case J_AFTER:
      if (c == ',') {
        b->js = J_NEXT;
        return MML_OK;
      }
      if (c == ']') {
        b->js = J_DONE;
        shard_of(b)->data_end = at;
        return MML_OK;
      }
      return ix_json_error(b, err,
                           "expected ',' or ']' at byte %lld after element %lld (which starts at "
                           "byte %lld), found %s",
                           (long long)at, (long long)k - 1, (long long)b->elem_start, show(c, sb));
    default: /* J_DONE */
      return ix_json_error(b, err, "data after the closing ']' at byte %lld (%s)", (long long)at,
                           show(c, sb));
  }
}

static mml_status scan_json(mml_index_builder *b, const uint8_t *p, size_t len, int64_t base,
                            mml_err *err) {
  char sb[8];
  for (size_t i = 0; i < len; i++) {
    uint8_t c = p[i];
    int64_t at = base + (int64_t)i;
    if (b->js != J_ELEM) {
      mml_status st = json_between(b, c, at, err);
      if (st) return st;
      if (b->js != J_ELEM || b->scalar) {
        if (b->js == J_ELEM && c == '"') b->in_str = 1; /* a string element */
        continue;
      }
      /* an element opened with '{' or '[': fall through to count it */
    } else if (b->in_str) {
      /* fast path: jump to the next quote or backslash */
      if (b->esc) {
        b->esc = 0;
        continue;
      }
      size_t j = i;
      while (j < len && p[j] != '"' && p[j] != '\\') j++;
      if (j == len) return MML_OK;
      i = j;
      if (p[j] == '\\')
        b->esc = 1;
      else
        b->in_str = 0;
      continue;
    } else if (c == '"') {
      b->in_str = 1;
      continue;
    }
    if (c == '{' || c == '[') {
      if (b->depth == MAX_DEPTH)
        return ix_json_error(
            b, err, "element %lld (at byte %lld) nests deeper than %d at byte %lld",
            (long long)shard_of(b)->count - 1, (long long)b->elem_start, MAX_DEPTH, (long long)at);
      if (c == '{')
        b->stack[b->depth / 8] |= (uint8_t)(1u << (b->depth % 8));
      else
        b->stack[b->depth / 8] &= (uint8_t) ~(1u << (b->depth % 8));
      b->depth++;
    } else if (c == '}' || c == ']') {
      if (b->depth == 0) { /* ends a scalar element: the closer belongs to the array */
        b->js = J_AFTER;
        mml_status st = json_between(b, c, at, err);
        if (st) return st;
        continue;
      }
      int open_brace = (b->stack[(b->depth - 1) / 8] >> ((b->depth - 1) % 8)) & 1;
      if (open_brace != (c == '}'))
        return ix_json_error(b, err,
                             "%s at byte %lld closes a '%c' in element %lld (which starts at "
                             "byte %lld)",
                             show(c, sb), (long long)at, open_brace ? '{' : '[',
                             (long long)shard_of(b)->count - 1, (long long)b->elem_start);
      if (--b->depth == 0 && !b->scalar) b->js = J_AFTER;
    } else if (b->scalar && b->depth == 0 && (c == ',' || is_ws(c))) {
      b->js = J_AFTER;
      mml_status st = json_between(b, c, at, err);
      if (st) return st;
    }
  }
  return MML_OK;
}

/* ---- WebDataset tar ----------------------------------------------------------------- */

static mml_status tar_error(mml_index_builder *b, mml_err *err, const char *why, int64_t at) {
  return mml_err_set(err, MML_ERECORD, "data shard %s: %s at byte %lld", shard_of(b)->path, why,
                     (long long)at);
}

/* An octal or base-256 numeric header field; -1 when malformed. */
static int64_t tar_num(const uint8_t *f, size_t n) {
  if (f[0] & 0x80) { /* GNU base-256 */
    int64_t v = f[0] & 0x3F;
    for (size_t i = 1; i < n; i++) {
      if (v > (INT64_MAX >> 8)) return -1;
      v = v << 8 | f[i];
    }
    return v;
  }
  size_t i = 0;
  while (i < n && (f[i] == ' ' || f[i] == 0)) i++;
  int64_t v = 0;
  int digits = 0;
  for (; i < n && f[i] >= '0' && f[i] <= '7'; i++, digits++) {
    if (v > (INT64_MAX >> 3)) return -1;
    v = v * 8 + (f[i] - '0');
  }
  for (; i < n; i++)
    if (f[i] != ' ' && f[i] != 0) return -1;
  return digits ? v : 0;
}

static int tar_checksum_ok(const uint8_t *h) {
  int64_t want = tar_num(h + 148, 8);
  uint64_t u = 0;
  int64_t sg = 0;
  for (int i = 0; i < 512; i++) {
    uint8_t c = i >= 148 && i < 156 ? ' ' : h[i];
    u += c;
    sg += (int8_t)c;
  }
  return want >= 0 && ((int64_t)u == want || sg == want);
}

static int has_ext(const char *name, const char *const *exts, size_t n) {
  const char *dot = strrchr(name, '.');
  if (!dot) return 0;
  for (size_t i = 0; i < n; i++)
    if (!strcasecmp(dot + 1, exts[i])) return 1;
  return 0;
}

int ix_is_image_ext(const char *name) {
  static const char *const exts[] = {"jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff"};
  return has_ext(name, exts, sizeof exts / sizeof *exts);
}

int ix_is_video_ext(const char *name) {
  static const char *const exts[] = {"mp4", "m4v", "mov", "mkv", "webm", "avi"};
  return has_ext(name, exts, sizeof exts / sizeof *exts);
}

/* Ends the open group: a sample when it has a .json member, else forgotten. */
mml_status ix_tar_close_group(mml_index_builder *b) {
  mml_index_shard *sh = shard_of(b);
  if (b->group < 0) return MML_OK;
  if (b->group_json) {
    if (push_offset(b->ix, b->group)) return MML_ENOMEM;
    sh->count++;
  } else {
    sh->names_len = sh->members[b->group].name;
    sh->nmembers = b->group;
  }
  b->group = -1;
  b->group_json = 0;
  return MML_OK;
}

mml_status ix_tar_member(mml_index_builder *b, const char *name, int64_t off, int64_t size) {
  mml_index_shard *sh = shard_of(b);
  const char *base = strrchr(name, '/');
  base = base ? base + 1 : name;
  const char *dot = strchr(base, '.');
  if (!dot || dot == base) return MML_OK; /* no key.ext: not part of a sample */
  size_t key_len = (size_t)(dot - name), nlen = strlen(name);
  if (b->group >= 0) {
    const mml_member *g = &sh->members[b->group];
    if (g->key_len != key_len || memcmp(sh->names + g->name, name, key_len)) {
      mml_status st = ix_tar_close_group(b);
      if (st) return st;
    }
  }
  if (sh->nmembers == sh->members_cap) {
    int64_t nc = sh->members_cap ? sh->members_cap * 2 : 256;
    mml_member *m = realloc(sh->members, (size_t)nc * sizeof *m);
    if (!m) return MML_ENOMEM;
    sh->members = m;
    sh->members_cap = nc;
  }
  if (sh->names_len + nlen + 1 > sh->names_cap || sh->names_len + nlen + 1 > UINT32_MAX) {
    if (sh->names_len + nlen + 1 > UINT32_MAX) return MML_ENOMEM;
    size_t nc = sh->names_cap ? sh->names_cap * 2 : 4096;
    while (nc < sh->names_len + nlen + 1) nc *= 2;
    char *p = realloc(sh->names, nc);
    if (!p) return MML_ENOMEM;
    sh->names = p;
    sh->names_cap = nc;
  }
  memcpy(sh->names + sh->names_len, name, nlen + 1);
  sh->members[sh->nmembers] = (mml_member){off, size, (uint32_t)sh->names_len, (uint32_t)key_len};
  sh->names_len += nlen + 1;
  if (b->group < 0) b->group = sh->nmembers;
  if (!strcmp(dot + 1, "json")) b->group_json = 1;
  sh->nmembers++;
  return MML_OK;
}

/* A pax extended header: "LEN key=value\n" records; path and size matter here.  A size
 * that is not a plain decimal number in range is kept as -2 (refused by tar_header). */
static void tar_pax(mml_index_builder *b) {
  const char *p = (const char *)b->ext.data, *e = p + b->ext.len;
  while (p < e) {
    char *sp;
    long n = strtol(p, &sp, 10);
    if (n <= 0 || n > e - p || *sp != ' ') return;
    const char *kv = sp + 1, *end = p + n - 1; /* drops the '\n' */
    if (end - kv > 5 && !memcmp(kv, "path=", 5)) {
      free(b->next_name);
      b->next_name = strndup(kv + 5, (size_t)(end - kv - 5));
    } else if (end - kv > 5 && !memcmp(kv, "size=", 5)) {
      int64_t v = 0;
      const char *d = kv + 5;
      for (; d < end && *d >= '0' && *d <= '9' && v <= (INT64_MAX - 9) / 10; d++)
        v = v * 10 + (*d - '0');
      b->next_size = d == end ? v : -2;
    }
    p += n;
  }
}

static mml_status tar_header(mml_index_builder *b, const uint8_t *h, int64_t at, mml_err *err) {
  if (b->tar_end) return MML_OK; /* padding after the end-of-archive blocks */
  int zero = 1;
  for (int i = 0; i < 512 && zero; i++) zero = h[i] == 0;
  if (zero) {
    b->tar_end = 1;
    return MML_OK;
  }
  if (!tar_checksum_ok(h)) return tar_error(b, err, "not a tar archive (bad header checksum)", at);
  int64_t size = tar_num(h + 124, 12);
  if (b->next_size != -1) size = b->next_size; /* -2: a pax size that is not a number */
  /* rounded up to whole blocks below without overflow (a member larger than the data
   * left ends as a truncated tar; readers check sizes against max_object_bytes) */
  if (size < 0 || size > INT64_MAX - 511)
    return tar_error(b, err, "bad or impossible member size in the tar header", at);
  char type = (char)h[156];
  b->skip = (size + 511) / 512 * 512;
  if (type == 'L' || type == 'x') {
    if (size > (1 << 20)) return tar_error(b, err, "tar name/pax header over 1 MiB", at);
    b->ext_kind = type;
    b->ext_left = size;
    mml_bytes_clear(&b->ext);
    b->next_size = -1;
    return MML_OK;
  }
  mml_status st = MML_OK;
  if (type == '0' || type == 0 || type == '7') {
    char buf[260];
    const char *name = buf;
    if (b->next_name) {
      name = b->next_name;
    } else {
      char nm[101], pre[156];
      memcpy(nm, h, 100);
      nm[100] = 0;
      memcpy(pre, h + 345, 155);
      pre[155] = 0;
      if (!memcmp(h + 257, "ustar\0", 6) && pre[0])
        snprintf(buf, sizeof buf, "%s/%s", pre, nm);
      else
        snprintf(buf, sizeof buf, "%s", nm);
    }
    st = over_records(b, shard_of(b)->nmembers + 1, "tar members", err);
    if (!st && ix_tar_member(b, name, at + 512, size)) st = ix_oom(b, err);
  }
  free(b->next_name);
  b->next_name = NULL;
  b->next_size = -1;
  return st;
}

static mml_status scan_tar(mml_index_builder *b, const uint8_t *p, size_t n, int64_t base,
                           mml_err *err) {
  while (n) {
    if (b->skip > 0) {
      size_t k = (int64_t)n < b->skip ? n : (size_t)b->skip;
      if (b->ext_kind && b->ext_left > 0) {
        size_t c = (int64_t)k < b->ext_left ? k : (size_t)b->ext_left;
        if (mml_bytes_append(&b->ext, p, c)) return ix_oom(b, err);
        b->ext_left -= (int64_t)c;
      }
      b->skip -= (int64_t)k;
      p += k, n -= k, base += (int64_t)k;
      if (b->skip == 0 && b->ext_kind) {
        if (b->ext_kind == 'L') {
          free(b->next_name);
          b->next_name = strndup((const char *)b->ext.data, b->ext.len);
        } else {
          tar_pax(b);
        }
        b->ext_kind = 0;
      }
      continue;
    }
    size_t k = 512 - b->nhdr < n ? 512 - b->nhdr : n;
    memcpy(b->hdr + b->nhdr, p, k);
    b->nhdr += k;
    p += k, n -= k, base += (int64_t)k;
    if (b->nhdr == 512) {
      b->nhdr = 0;
      mml_status st = tar_header(b, b->hdr, base - 512, err);
      if (st) return st;
    }
  }
  return MML_OK;
}

static int has_tar_name(const char *path) {
  static const char *const ends[] = {".tar", ".tar.gz", ".tgz", ".tar.zst"};
  size_t n = strlen(path);
  for (size_t i = 0; i < sizeof ends / sizeof *ends; i++) {
    size_t k = strlen(ends[i]);
    if (n >= k && !strcasecmp(path + n - k, ends[i])) return 1;
  }
  return 0;
}

/* ---- text layer ---------------------------------------------------------------------- */

mml_status ix_scan_text(mml_index_builder *b, const uint8_t *p, size_t len, mml_err *err) {
  if (!len) return MML_OK;
  if (b->max_text > 0 && (int64_t)len > b->max_text - b->pos)
    return mml_err_set(err, MML_ERECORD,
                       "data shard %s: its %s text passes max_shard_bytes=%lld bytes (after %lld "
                       "stored bytes); refused, a likely compression bomb (raise max_shard_bytes "
                       "for a genuine shard this large)",
                       shard_of(b)->path,
                       shard_of(b)->compression != MML_COMPRESS_NONE ? "decompressed" : "streamed",
                       (long long)b->max_text, (long long)b->raw_off);
  int64_t base = b->pos;
  b->pos += (int64_t)len;
  mml_index_shard *shd = shard_of(b);
  if (base == 0 && (b->want == MML_LAYOUT_WDS ||
                    (b->want == MML_LAYOUT_AUTO &&
                     (has_tar_name(shd->path) || (len >= 263 && !memcmp(p + 257, "ustar", 5)))))) {
    shd->layout = MML_LAYOUT_WDS;
    b->decided = 1;
  }
  if (shd->layout == MML_LAYOUT_WDS) return scan_tar(b, p, len, base, err);
  if (base == 0 && len >= 3 && p[0] == 0xEF && p[1] == 0xBB && p[2] == 0xBF) { /* BOM */
    p += 3, len -= 3, base = 3;
    b->line_start = 3;
  }
  if (!b->decided) {
    size_t i = 0;
    while (i < len && is_ws(p[i])) i++;
    if (b->want != MML_LAYOUT_JSON) { /* blanks so far count as JSONL blank lines */
      mml_status st = scan_lines(b, p, i, base, err);
      if (st) return st;
    }
    if (i == len) return MML_OK;
    b->decided = 1;
    mml_index_shard *sh = shard_of(b);
    if (b->want == MML_LAYOUT_JSON || (b->want == MML_LAYOUT_AUTO && p[i] == '[')) {
      sh->layout = MML_LAYOUT_JSON;
      free(sh->blank_runs);
      sh->blank_runs = NULL;
      sh->nruns = sh->runs_cap = sh->nblank = 0;
      b->js = J_OPEN;
    } else {
      sh->layout = MML_LAYOUT_JSONL;
    }
    p += i, len -= i, base += (int64_t)i;
  }
  if (shard_of(b)->layout == MML_LAYOUT_JSON) return scan_json(b, p, len, base, err);
  return scan_lines(b, p, len, base, err);
}
