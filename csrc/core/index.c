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
 */
#include "mml/index.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "mml/fetch.h"

enum { CHUNK = 1 << 20, MAX_DEPTH = 1024 };

/* array scanner states */
enum { J_OPEN = 0, J_FIRST, J_NEXT, J_ELEM, J_AFTER, J_DONE };

struct mml_index_builder {
  mml_index *ix;
  int shard;            /* index into ix->shards (which may move while growing) */
  mml_layout want;
  /* raw layer */
  uint8_t head[512];    /* the first bytes, held until there are enough to tell the format */
  size_t nhead;
  int sniffed;
  int64_t raw_off;      /* stored bytes consumed */
  z_stream z;
  int z_init, z_ended;  /* z_ended: the last gzip member ended exactly at the input's end */
  ZSTD_DStream *zs;
  size_t zs_last;       /* last ZSTD_decompressStream hint: 0 when a frame just ended */
  uint8_t *zbuf;        /* decompression output */
  /* text layer */
  int64_t pos;          /* text bytes seen */
  int decided;          /* layout decided (first non-blank byte seen) */
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
  int64_t skip;         /* member data + padding still to pass */
  int64_t ext_left;     /* of that, bytes still to collect for a long name / pax header */
  int ext_kind;         /* 'L' or 'x' while collecting, else 0 */
  mml_bytes ext;
  char *next_name;      /* the next member's name, from a GNU 'L' or pax 'x' header */
  int64_t next_size;    /* its size from a pax header, -1 when none */
  int tar_end;
  int64_t group;        /* first member of the open group, -1 when none */
  int group_json;       /* the open group has a .json member */
};

static mml_index_shard *shard_of(mml_index_builder *b) { return &b->ix->shards[b->shard]; }

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

static mml_status oom(mml_index_builder *b, mml_err *err) {
  return mml_err_set(err, MML_ENOMEM, "data shard %s: out of memory indexing", shard_of(b)->path);
}

/* ---- JSONL ------------------------------------------------------------------------- */

/* Ends the current line (at a '\n' or end of file). */
static mml_status end_line(mml_index_builder *b, int64_t next_start) {
  mml_index_shard *sh = shard_of(b);
  mml_status st = b->content ? push_offset(b->ix, b->line_start) : push_blank(sh, b->line_no);
  if (b->content) sh->count++;
  b->line_start = next_start;
  b->line_no++;
  b->content = 0;
  return st;
}

static mml_status scan_lines(mml_index_builder *b, const uint8_t *p, size_t len, int64_t base) {
  for (size_t i = 0; i < len; i++) {
    uint8_t c = p[i];
    if (c == '\n') {
      mml_status st = end_line(b, base + (int64_t)i + 1);
      if (st) return st;
    } else if (!b->content && c != ' ' && c != '\t' && c != '\r') {
      b->content = 1;
      /* fast path: skip to the end of the line */
      const uint8_t *nl = memchr(p + i, '\n', len - i);
      if (!nl) return MML_OK;
      i = (size_t)(nl - p) - 1;
    }
  }
  return MML_OK;
}

/* ---- JSON array -------------------------------------------------------------------- */

static int is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

static const char *show(uint8_t c, char buf[8]) {
  if (c >= 0x20 && c < 0x7f) snprintf(buf, 8, "'%c'", c);
  else snprintf(buf, 8, "0x%02x", c);
  return buf;
}

static mml_status start_elem(mml_index_builder *b, uint8_t c, int64_t at, mml_err *err) {
  if (push_offset(b->ix, at)) return oom(b, err);
  shard_of(b)->count++;
  b->elem_start = at;
  b->js = J_ELEM;
  b->in_str = b->esc = 0;
  b->depth = 0;
  b->scalar = !(c == '{' || c == '[');
  return MML_OK;
}

static mml_status json_error(mml_index_builder *b, mml_err *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static mml_status json_error(mml_index_builder *b, mml_err *err, const char *fmt, ...) {
  char why[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  return mml_err_set(err, MML_ERECORD, "data shard %s: malformed JSON array: %s",
                     shard_of(b)->path, why);
}

/* One byte outside an element (states J_OPEN, J_FIRST, J_NEXT, J_AFTER, J_DONE). */
static mml_status json_between(mml_index_builder *b, uint8_t c, int64_t at, mml_err *err) {
  char sb[8];
  if (is_ws(c)) return MML_OK;
  int64_t k = shard_of(b)->count; /* elements so far */
  switch (b->js) {
    case J_OPEN:
      if (c != '[') return json_error(b, err, "expected '[' at byte %lld, found %s", (long long)at, show(c, sb));
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
        return json_error(b, err, "expected element %lld at byte %lld, found %s", (long long)k,
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
      return json_error(b, err,
                        "expected ',' or ']' at byte %lld after element %lld (which starts at "
                        "byte %lld), found %s",
                        (long long)at, (long long)k - 1, (long long)b->elem_start, show(c, sb));
    default: /* J_DONE */
      return json_error(b, err, "data after the closing ']' at byte %lld (%s)", (long long)at,
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
      if (p[j] == '\\') b->esc = 1;
      else b->in_str = 0;
      continue;
    } else if (c == '"') {
      b->in_str = 1;
      continue;
    }
    if (c == '{' || c == '[') {
      if (b->depth == MAX_DEPTH)
        return json_error(b, err, "element %lld (at byte %lld) nests deeper than %d at byte %lld",
                          (long long)shard_of(b)->count - 1, (long long)b->elem_start, MAX_DEPTH,
                          (long long)at);
      if (c == '{') b->stack[b->depth / 8] |= (uint8_t)(1u << (b->depth % 8));
      else b->stack[b->depth / 8] &= (uint8_t)~(1u << (b->depth % 8));
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
        return json_error(b, err, "%s at byte %lld closes a '%c' in element %lld (which starts at "
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

static int is_image_ext(const char *name) {
  const char *dot = strrchr(name, '.');
  if (!dot) return 0;
  static const char *const exts[] = {"jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff"};
  for (size_t i = 0; i < sizeof exts / sizeof *exts; i++)
    if (!strcasecmp(dot + 1, exts[i])) return 1;
  return 0;
}

/* Ends the open group: a sample when it has a .json member, else forgotten. */
static mml_status tar_close_group(mml_index_builder *b) {
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

static mml_status tar_member(mml_index_builder *b, const char *name, int64_t off, int64_t size) {
  mml_index_shard *sh = shard_of(b);
  const char *base = strrchr(name, '/');
  base = base ? base + 1 : name;
  const char *dot = strchr(base, '.');
  if (!dot || dot == base) return MML_OK; /* no key.ext: not part of a sample */
  size_t key_len = (size_t)(dot - name), nlen = strlen(name);
  if (b->group >= 0) {
    const mml_member *g = &sh->members[b->group];
    if (g->key_len != key_len || memcmp(sh->names + g->name, name, key_len)) {
      mml_status st = tar_close_group(b);
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

/* A pax extended header: "LEN key=value\n" records; path and size matter here. */
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
      b->next_size = strtoll(kv + 5, NULL, 10);
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
  if (size < 0) return tar_error(b, err, "bad member size in the tar header", at);
  if (b->next_size >= 0) size = b->next_size;
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
      if (!memcmp(h + 257, "ustar\0", 6) && pre[0]) snprintf(buf, sizeof buf, "%s/%s", pre, nm);
      else snprintf(buf, sizeof buf, "%s", nm);
    }
    if (tar_member(b, name, at + 512, size)) st = oom(b, err);
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
        if (mml_bytes_append(&b->ext, p, c)) return oom(b, err);
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

static mml_status scan_text(mml_index_builder *b, const uint8_t *p, size_t len, mml_err *err) {
  if (!len) return MML_OK;
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
      if (scan_lines(b, p, i, base)) return oom(b, err);
    }
    if (i == len) return MML_OK;
    b->decided = 1;
    mml_index_shard *sh = shard_of(b);
    if (b->want == MML_LAYOUT_JSON || (b->want == MML_LAYOUT_AUTO && p[i] == '[')) {
      sh->layout = MML_LAYOUT_JSON;
      free(sh->blank_lines);
      sh->blank_lines = NULL;
      sh->nblank = 0;
      b->js = J_OPEN;
    } else {
      sh->layout = MML_LAYOUT_JSONL;
    }
    p += i, len -= i, base += (int64_t)i;
  }
  if (shard_of(b)->layout == MML_LAYOUT_JSON) return scan_json(b, p, len, base, err);
  return scan_lines(b, p, len, base) ? oom(b, err) : MML_OK;
}

/* ---- decompression and the spill file ------------------------------------------------ */

static int spill_open(char *dir_out, size_t cap) {
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

static mml_status spill_write(mml_index_builder *b, const uint8_t *p, size_t n, mml_err *err) {
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
static mml_status text_out(mml_index_builder *b, const uint8_t *p, size_t n, mml_err *err) {
  mml_status st = spill_write(b, p, n, err);
  return st ? st : scan_text(b, p, n, err);
}

static mml_status start_raw(mml_index_builder *b, mml_err *err) {
  mml_index_shard *sh = shard_of(b);
  const uint8_t *h = b->head;
  if (b->nhead >= 2 && h[0] == 0x1f && h[1] == 0x8b) sh->compression = MML_COMPRESS_GZIP;
  else if (b->nhead >= 4 && h[0] == 0x28 && h[1] == 0xb5 && h[2] == 0x2f && h[3] == 0xfd)
    sh->compression = MML_COMPRESS_ZSTD;
  b->sniffed = 1;
  if (sh->compression == MML_COMPRESS_NONE) return MML_OK;
  if (!(b->zbuf = malloc(CHUNK))) return oom(b, err);
  char dir[4096];
  if ((sh->fd = spill_open(dir, sizeof dir)) < 0)
    return mml_err_set(err, MML_EIO, "data shard %s: cannot create a file for its decompressed "
                                     "copy in %s: %s (TMPDIR chooses the folder)",
                       sh->path, dir, strerror(errno));
  if (sh->compression == MML_COMPRESS_GZIP) {
    if (inflateInit2(&b->z, 16 + MAX_WBITS) != Z_OK) return oom(b, err);
    b->z_init = 1;
  } else {
    if (!(b->zs = ZSTD_createDStream())) return oom(b, err);
    b->zs_last = 1;
  }
  return MML_OK;
}

static mml_status feed_gzip(mml_index_builder *b, const uint8_t *p, size_t n, mml_err *err) {
  b->z.next_in = (Bytef *)p;
  b->z.avail_in = (uInt)n;
  while (b->z.avail_in > 0) {
    if (b->z_ended) { /* another gzip member follows */
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
      return mml_err_set(err, MML_ERECORD, "data shard %s: gzip data error near compressed byte "
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
      return mml_err_set(err, MML_ERECORD, "data shard %s: zstd data error near compressed byte "
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
  mml_compression c = shard_of(b)->compression;
  mml_status st = c == MML_COMPRESS_GZIP ? feed_gzip(b, p, n, err)
                  : c == MML_COMPRESS_ZSTD ? feed_zstd(b, p, n, err)
                                           : scan_text(b, p, n, err);
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
        st = mml_err_set(err, MML_ERECORD, "data shard %s: truncated tar (ends at byte %lld "
                                           "inside a %s)",
                         sh->path, (long long)b->pos, b->nhdr ? "header" : "member");
      else if (tar_close_group(b))
        st = oom(b, err);
    } else if (sh->layout == MML_LAYOUT_JSONL) {
      sh->data_end = b->pos;
      /* A last line without '\n' still counts; an empty tail after the final '\n' does not. */
      if ((b->content || b->line_start < b->pos) && end_line(b, b->pos)) st = oom(b, err);
    } else if (b->js != J_DONE) {
      if (b->js == J_ELEM && !(b->scalar && !b->in_str && b->depth == 0))
        st = json_error(b, err, "element %lld (at byte %lld) is not closed at the end of the "
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
  free(sh->blank_lines);
  free(sh->members);
  free(sh->names);
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

mml_status mml_index_add_file(mml_index *ix, const char *path, mml_layout want, mml_err *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return mml_err_set(err, e == ENOENT || e == ENOTDIR ? MML_ENOENT : MML_EIO,
                       "data shard %s: %s", path, strerror(e));
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
    free(ix->shards[i].blank_lines);
    free(ix->shards[i].members);
    free(ix->shards[i].names);
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
    if (ix->shards[mid].first <= i) lo = mid;
    else hi = mid - 1;
  }
  while (lo > 0 && ix->shards[lo].count == 0) lo--;
  const mml_index_shard *sh = &ix->shards[lo];
  int64_t k = i - sh->first;
  *shard = lo;
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
  int64_t ln = k + 1; /* the (k+1)-th non-blank line */
  for (int64_t b = 0; b < sh->nblank && sh->blank_lines[b] <= ln; b++) ln++;
  *where = ln;
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
  if (sh->layout != MML_LAYOUT_WDS) return 0;
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

int mml_index_images(const mml_index *ix, int shard, int64_t i, const char **names, int max) {
  const mml_index_shard *sh = &ix->shards[shard];
  if (sh->layout != MML_LAYOUT_WDS) return 0;
  int64_t m0, m1;
  group_of(ix, sh, i, &m0, &m1);
  int n = 0;
  for (int64_t m = m0; m < m1; m++) {
    const char *name = sh->names + sh->members[m].name;
    if (!is_image_ext(name)) continue;
    if (n < max) names[n] = name;
    n++;
  }
  return n;
}

void mml_index_name_sample(const mml_index *ix, int shard, int64_t i, int64_t where, char *out,
                           size_t cap) {
  const mml_index_shard *sh = &ix->shards[shard];
  if (sh->layout == MML_LAYOUT_WDS) {
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
