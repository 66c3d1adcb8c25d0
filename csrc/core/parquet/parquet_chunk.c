/*
 * parquet_chunk.c — one column chunk's pages into repetition/definition levels and
 * values, a page at a time as the rows being assembled need them (mml/parquet.h says
 * what is supported).
 *
 * DESIGN
 *   1. Pages are walked from the chunk's first page (the dictionary page when there is
 *      one) to its end, each decoded only when the assembly's cursor reaches past the
 *      entries decoded so far (pq_column_more); each header's stored size must lie
 *      inside the chunk and its decoded size within max_bytes before anything is
 *      decompressed.  The bytes come in windows read by range (PQ_WINDOW_MIN, doubling
 *      up to PQ_WINDOW_MAX, at least the page at the window's start, never past the
 *      chunk's end): a row near a row group's start waits for the pages before it, not
 *      for the whole chunk; a window whose last page is cut is not read again, the next
 *      window starts at that page.
 *   2. Decompression goes through the well-kept libraries: libsnappy's C API, zlib
 *      (gzip or zlib framing), libzstd; each must produce exactly the size the header
 *      declares.
 *   3. Levels are RLE / bit-packed hybrid runs (v1: 4-byte length first; v2: lengths in
 *      the header, never compressed).  A run never writes past the page's entry count,
 *      a zero-length run is malformed (no endless loop on hostile bytes).
 *   4. Values are views (pointer, length) into page buffers or the dictionary: nothing
 *      is copied; the buffers live as long as the pq_column.
 *   5. Memory: decoded page bytes plus 20 bytes per entry stay within max_bytes; the
 *      windows read are at most twice the chunk's stored size (each holds at most one
 *      page read again: the one cut by the previous window's end).  A window is kept
 *      only when values point into it (an uncompressed page's); a compressed chunk's
 *      next window reuses its buffer, so it holds its decoded pages and one window.
 *   6. The entry count ends at the footer's num_values exactly, when the chunk's pages
 *      are all decoded (pq_column_more at the chunk's end).
 *
 * Threads: one thread per pq_column.
 */
#include <snappy-c.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "parquet_int.h"

typedef struct dec {
  const pq_chunk_meta *cm;
  pq_column *c;
  mml_err *err;
  int64_t off; /* file offset of the page being decoded */
} dec;

static mml_status malformed(dec *d, const char *what) {
  return mml_err_set(d->err, MML_ERECORD, "malformed Parquet page at byte %lld: %s",
                     (long long)d->off, what);
}

static mml_status oom(dec *d) {
  return mml_err_set(d->err, MML_ENOMEM, "out of memory decoding a Parquet page");
}

static int bit_width(int max) {
  int w = 0;
  while (max >> w) w++;
  return w;
}

/* RLE / bit-packed hybrid: count values of bw bits from [p, p + n) into out. */
static int rle_decode(const uint8_t *p, size_t n, int bw, uint32_t *out, int64_t count) {
  const uint8_t *end = p + n;
  int64_t got = 0;
  size_t vbytes = (size_t)(bw + 7) / 8;
  while (got < count) {
    uint64_t h = 0;
    int shift = 0;
    do {
      if (p >= end || shift > 35) return -1;
      h |= (uint64_t)(*p & 0x7f) << shift, shift += 7;
    } while (*p++ & 0x80);
    if (h & 1) { /* bit-packed: (h >> 1) groups of 8 values */
      uint64_t nv = (h >> 1) * 8, nbytes = (h >> 1) * (uint64_t)bw;
      if (nv == 0 || nbytes > (uint64_t)(end - p)) return -1;
      for (uint64_t i = 0; i < nv && got < count; i++) {
        uint64_t bit = i * (uint64_t)bw, v = 0;
        for (int b = 0; b < bw; b++, bit++) v |= (uint64_t)((p[bit >> 3] >> (bit & 7)) & 1) << b;
        out[got++] = (uint32_t)v;
      }
      p += nbytes;
    } else { /* a run of one value */
      uint64_t run = h >> 1;
      if (run == 0 || vbytes > (size_t)(end - p)) return -1;
      uint32_t v = 0;
      for (size_t b = 0; b < vbytes; b++) v |= (uint32_t)p[b] << (8 * b);
      p += vbytes;
      for (uint64_t i = 0; i < run && got < count; i++) out[got++] = v;
    }
  }
  return 0;
}

/* The page's decoded bytes: a view of the chunk (uncompressed), else a new buffer. */
static mml_status decompress(dec *d, const uint8_t *in, size_t len, size_t want, int codec,
                             const uint8_t **out) {
  if (codec == PQ_UNCOMPRESSED) {
    if (len != want) return malformed(d, "stored and decoded sizes differ (uncompressed)");
    *out = in;
    d->c->win_pinned = 1; /* values will point into the window: it is kept */
    return MML_OK;
  }
  pq_column *c = d->c;
  if (c->nbufs == c->bufs_cap) {
    int nc = c->bufs_cap ? 2 * c->bufs_cap : 8;
    mml_bytes *b = realloc(c->bufs, (size_t)nc * sizeof *b);
    if (!b) return oom(d);
    c->bufs = b, c->bufs_cap = nc;
  }
  mml_bytes *b = &c->bufs[c->nbufs];
  *b = (mml_bytes){0};
  if (mml_bytes_reserve(b, want + 1)) return oom(d);
  c->nbufs++;
  size_t got = want;
  int ok;
  if (codec == PQ_SNAPPY) {
    size_t ulen;
    ok = snappy_uncompressed_length((const char *)in, len, &ulen) == SNAPPY_OK && ulen == want &&
         snappy_uncompress((const char *)in, len, (char *)b->data, &got) == SNAPPY_OK;
  } else if (codec == PQ_ZSTD) {
    got = ZSTD_decompress(b->data, want, in, len);
    ok = !ZSTD_isError(got);
  } else { /* GZIP: gzip or zlib framing */
    z_stream z = {0};
    ok = inflateInit2(&z, 15 + 32) == Z_OK;
    if (ok) {
      z.next_in = (Bytef *)in, z.avail_in = (uInt)len;
      z.next_out = b->data, z.avail_out = (uInt)want;
      int r = inflate(&z, Z_FINISH);
      got = want - z.avail_out;
      ok = r == Z_STREAM_END;
      inflateEnd(&z);
    }
  }
  if (!ok || got != want)
    return malformed(d, "its compressed data does not decompress to its size");
  b->len = want;
  *out = b->data;
  return MML_OK;
}

/* PLAIN values of the column's type: count of them from [p, p + n) into out. */
static mml_status plain(dec *d, const uint8_t *p, size_t n, int64_t count, pq_val *out) {
  int type = d->cm->type;
  size_t at = 0, w = type == PQ_INT32 || type == PQ_FLOAT ? 4 : 8;
  for (int64_t i = 0; i < count; i++) {
    pq_val *v = &out[i];
    memset(v, 0, sizeof *v);
    if (type == PQ_BOOLEAN) {
      if ((size_t)(i >> 3) >= n) return malformed(d, "fewer values than entries");
      v->n.i = (p[i >> 3] >> (i & 7)) & 1;
      continue;
    }
    if (type == PQ_BYTE_ARRAY) {
      if (n - at < 4) return malformed(d, "fewer values than entries");
      uint32_t len = (uint32_t)p[at] | (uint32_t)p[at + 1] << 8 | (uint32_t)p[at + 2] << 16 |
                     (uint32_t)p[at + 3] << 24;
      at += 4;
      if (len > n - at) return malformed(d, "a byte array runs past the page");
      v->p = p + at, v->len = len, at += len;
      continue;
    }
    if (n - at < w) return malformed(d, "fewer values than entries");
    uint64_t x = 0;
    for (size_t b = 0; b < w; b++) x |= (uint64_t)p[at + b] << (8 * b);
    at += w;
    if (type == PQ_INT32)
      v->n.i = (int32_t)(uint32_t)x;
    else if (type == PQ_INT64)
      v->n.i = (int64_t)x;
    else if (type == PQ_FLOAT) {
      float f;
      uint32_t x32 = (uint32_t)x;
      memcpy(&f, &x32, 4);
      v->n.d = f;
    } else
      memcpy(&v->n.d, &x, 8);
  }
  return MML_OK;
}

/* Dictionary indices of count values into out. */
static mml_status dict_values(dec *d, const uint8_t *p, size_t n, int64_t count, pq_val *out) {
  if (!d->c->dict) return malformed(d, "dictionary-encoded values without a dictionary page");
  if (count == 0) return MML_OK;
  if (n < 1 || p[0] > 32) return malformed(d, "bad dictionary index bit width");
  uint32_t *ix = malloc((size_t)count * sizeof *ix);
  if (!ix) return oom(d);
  mml_status st = MML_OK;
  if (rle_decode(p + 1, n - 1, p[0], ix, count)) st = malformed(d, "bad dictionary indices");
  for (int64_t i = 0; !st && i < count; i++) {
    if ((int64_t)ix[i] >= d->c->ndict)
      st = malformed(d, "a dictionary index out of range");
    else
      out[i] = d->c->dict[ix[i]];
  }
  free(ix);
  return st;
}

/* Room for k more entries (and as many values), within the budget. */
static mml_status grow(dec *d, int64_t k) {
  pq_column *c = d->c;
  c->used += k * 20;
  if (c->used > c->budget)
    return mml_err_set(d->err, MML_ERECORD,
                       "a Parquet column chunk decodes to more than max_object_bytes=%lld bytes "
                       "(page at byte %lld); write smaller row groups or raise the limit",
                       (long long)c->budget, (long long)d->off);
  if (c->n + k <= c->cap) return MML_OK;
  int64_t nc = c->cap ? c->cap : 1024;
  while (nc < c->n + k) nc *= 2;
  int16_t *def = realloc(c->def, (size_t)nc * sizeof *def);
  if (def) c->def = def;
  int16_t *rep = def ? realloc(c->rep, (size_t)nc * sizeof *rep) : NULL;
  if (rep) c->rep = rep;
  pq_val *v = rep ? realloc(c->vals, (size_t)nc * sizeof *v) : NULL;
  if (!v) return oom(d);
  c->vals = v, c->cap = nc;
  return MML_OK;
}

/* Levels of k entries (max level `max`) into lv, from [p, p + n). */
static mml_status levels(dec *d, const uint8_t *p, size_t n, int max, int64_t k, int16_t *lv) {
  if (max == 0) {
    memset(lv, 0, (size_t)k * sizeof *lv);
    return MML_OK;
  }
  uint32_t *tmp = malloc((size_t)k * sizeof *tmp);
  if (!tmp) return oom(d);
  mml_status st = MML_OK;
  if (rle_decode(p, n, bit_width(max), tmp, k))
    st = malformed(d, "bad repetition/definition levels");
  for (int64_t i = 0; !st && i < k; i++) {
    if (tmp[i] > (uint32_t)max) st = malformed(d, "a level above the column's maximum");
    lv[i] = (int16_t)tmp[i];
  }
  free(tmp);
  return st;
}

/* v1 levels: a 4-byte length, then the runs; advances *p / *n past them. */
static mml_status levels_v1(dec *d, const uint8_t **p, size_t *n, int max, int64_t k, int16_t *lv) {
  if (max == 0) return levels(d, NULL, 0, 0, k, lv);
  if (*n < 4) return malformed(d, "levels cut short");
  uint32_t len = (uint32_t)(*p)[0] | (uint32_t)(*p)[1] << 8 | (uint32_t)(*p)[2] << 16 |
                 (uint32_t)(*p)[3] << 24;
  if (len > *n - 4) return malformed(d, "levels run past the page");
  mml_status st = levels(d, *p + 4, len, max, k, lv);
  *p += 4 + len, *n -= 4 + (size_t)len;
  return st;
}

/* The values of a data page: PLAIN or dictionary indices. */
static mml_status page_values(dec *d, int enc, const uint8_t *p, size_t n, int64_t k) {
  pq_column *c = d->c;
  int64_t nv = 0;
  for (int64_t i = c->n; i < c->n + k; i++) nv += c->def[i] == c->max_def;
  mml_status st;
  if (enc == PQ_PLAIN)
    st = plain(d, p, n, nv, c->vals + c->nvals);
  else if (enc == PQ_PLAIN_DICT || enc == PQ_RLE_DICT)
    st = dict_values(d, p, n, nv, c->vals + c->nvals);
  else
    return mml_err_set(d->err, MML_ERECORD,
                       "Parquet value encoding %d (page at byte %lld) is not supported (PLAIN "
                       "and dictionary encodings are)",
                       enc, (long long)d->off);
  if (st) return st;
  c->nvals += nv;
  c->n += k;
  return MML_OK;
}

static mml_status data_page(dec *d, const pq_page_header *h, const uint8_t *in) {
  pq_column *c = d->c;
  int64_t k = h->num_values;
  if (k == 0) return MML_OK; /* nothing to decode (and no arrays yet to offset into) */
  mml_status st = grow(d, k);
  if (st) return st;
  const uint8_t *p;
  size_t n = (size_t)h->uncompressed;
  if (h->type == PQ_DATA_PAGE) {
    if ((h->rep_enc != PQ_RLE && c->max_rep) || (h->def_enc != PQ_RLE && c->max_def))
      return malformed(d, "BIT_PACKED levels are not supported (RLE are)");
    if ((st = decompress(d, in, (size_t)h->compressed, n, d->cm->codec, &p)) ||
        (st = levels_v1(d, &p, &n, c->max_rep, k, c->rep + c->n)) ||
        (st = levels_v1(d, &p, &n, c->max_def, k, c->def + c->n)))
      return st;
    return page_values(d, h->encoding, p, n, k);
  }
  size_t ll = (size_t)h->rep_len + (size_t)h->def_len;
  if (ll > (size_t)h->compressed || ll > n) return malformed(d, "levels run past the page");
  if ((st = levels(d, in, (size_t)h->rep_len, c->max_rep, k, c->rep + c->n)) ||
      (st = levels(d, in + h->rep_len, (size_t)h->def_len, c->max_def, k, c->def + c->n)))
    return st;
  int codec = h->v2_compressed ? d->cm->codec : PQ_UNCOMPRESSED;
  if ((st = decompress(d, in + ll, (size_t)h->compressed - ll, n - ll, codec, &p))) return st;
  return page_values(d, h->encoding, p, n - ll, k);
}

static mml_status dict_page(dec *d, const pq_page_header *h, const uint8_t *in) {
  pq_column *c = d->c;
  if (c->dict) return malformed(d, "a second dictionary page");
  if (h->encoding != PQ_PLAIN && h->encoding != PQ_PLAIN_DICT)
    return malformed(d, "a dictionary page not PLAIN-encoded");
  c->used += (int64_t)h->num_values * 16;
  if (c->used > c->budget) return grow(d, 0);
  const uint8_t *p;
  mml_status st =
      decompress(d, in, (size_t)h->compressed, (size_t)h->uncompressed, d->cm->codec, &p);
  if (st) return st;
  if (!(c->dict = malloc(((size_t)h->num_values + 1) * sizeof *c->dict))) return oom(d);
  c->ndict = h->num_values;
  return plain(d, p, (size_t)h->uncompressed, h->num_values, c->dict);
}

/* The page at d->off decoded from [in, in + avail) (its header there, its data within). */
static mml_status one_page(dec *d, const pq_page_header *h, const uint8_t *in) {
  pq_column *c = d->c;
  c->used += h->uncompressed;
  if (c->used > c->budget) return grow(d, 0);
  if (h->type == PQ_DICT_PAGE) return dict_page(d, h, in);
  if (h->type == PQ_DATA_PAGE || h->type == PQ_DATA_PAGE_V2) return data_page(d, h, in);
  return MML_OK; /* index pages: not needed */
}

void pq_column_begin(pq_column *c, const pq_chunk_meta *cm, int64_t max_bytes) {
  c->cm = cm;
  c->next = cm->dict_page_offset >= 0 && cm->dict_page_offset < cm->data_page_offset
                ? cm->dict_page_offset
                : cm->data_page_offset;
  c->end = c->next + cm->total_compressed; /* (within the file: pq_check_chunk) */
  c->win = -1;
  c->win_size = PQ_WINDOW_MIN;
  c->budget = max_bytes;
}

/* A window of `len` bytes at c->next read into a buffer of c's, bufs[c->win]: the last
 * window's buffer again when no values point into it (its pages were all compressed:
 * their values are in their own decoded buffers), else a new one. */
static mml_status read_window(dec *d, int64_t len, mml_pq_read_fn read, void *ctx) {
  pq_column *c = d->c;
  if (c->win < 0 || c->win_pinned) {
    if (c->nbufs == c->bufs_cap) {
      int nc = c->bufs_cap ? 2 * c->bufs_cap : 8;
      mml_bytes *b = realloc(c->bufs, (size_t)nc * sizeof *b);
      if (!b) return oom(d);
      c->bufs = b, c->bufs_cap = nc;
    }
    c->bufs[c->nbufs] = (mml_bytes){0};
    c->win = c->nbufs++;
  }
  c->win_pinned = 0;
  c->win_off = c->next;
  mml_status st = read(ctx, c->next, len, &c->bufs[c->win], d->err);
  if (!st && (int64_t)c->bufs[c->win].len != len)
    st = mml_err_set(d->err, MML_EIO, "a read of %lld bytes at byte %lld returned %lld",
                     (long long)len, (long long)c->next, (long long)c->bufs[c->win].len);
  if (st) c->bufs[c->win].len = 0;
  return st;
}

/* The next page's header parsed, its stored bytes in the window: *in, *used. */
static mml_status next_page(dec *d, pq_page_header *h, const uint8_t **in, size_t *used,
                            mml_pq_read_fn read, void *ctx) {
  pq_column *c = d->c;
  int64_t rest = c->end - c->next, want = 0;
  for (int tries = 0;; tries++) {
    int64_t at = c->next - c->win_off;
    size_t avail = c->win >= 0 && at >= 0 && at < (int64_t)c->bufs[c->win].len
                       ? c->bufs[c->win].len - (size_t)at
                       : 0;
    const uint8_t *p = avail ? c->bufs[c->win].data + at : NULL;
    mml_err perr = {0};
    mml_status st = avail ? pq_parse_page_header(p, avail, h, used, &perr)
                          : mml_err_set(&perr, MML_ERECORD, "no page header");
    if (!st && h->compressed >= 0 && (size_t)h->compressed <= avail - *used) {
      *in = p + *used;
      return MML_OK;
    }
    if ((int64_t)avail >= rest || tries > 40) { /* all the chunk's rest was there: malformed */
      if (st) {
        *d->err = perr;
        return mml_err_prefix(d->err, "page at byte %lld", (long long)d->off), st;
      }
      return malformed(d, "its data runs past the column chunk");
    }
    /* a window from this page: the next size, at least this page (header known), at
     * least twice what did not hold the header */
    want = c->win_size > want ? c->win_size : want;
    if (!st) want = (int64_t)*used + h->compressed > want ? (int64_t)*used + h->compressed : want;
    if (st && avail && (int64_t)avail * 2 > want) want = (int64_t)avail * 2;
    if (want > rest) want = rest;
    if (c->win_size < PQ_WINDOW_MAX) c->win_size *= 2;
    if ((st = read_window(d, want, read, ctx))) return st;
  }
}

mml_status pq_column_more(pq_column *c, mml_pq_read_fn read, void *ctx, int *got, mml_err *err) {
  const pq_chunk_meta *cm = c->cm;
  dec d = {.cm = cm, .c = c, .err = err};
  *got = 0;
  if (cm->codec != PQ_UNCOMPRESSED && cm->codec != PQ_SNAPPY && cm->codec != PQ_GZIP &&
      cm->codec != PQ_ZSTD)
    return mml_err_set(err, MML_ERECORD,
                       "compression codec %d is not supported (uncompressed, snappy, gzip and "
                       "zstd are)",
                       cm->codec);
  while (c->next < c->end && c->n < cm->num_values) {
    pq_page_header h;
    const uint8_t *in = NULL;
    size_t used;
    d.off = c->next;
    int64_t n0 = c->n;
    mml_status st = next_page(&d, &h, &in, &used, read, ctx);
    if (st) return st;
    c->next += (int64_t)used + h.compressed;
    if ((st = one_page(&d, &h, in))) return st;
    if (c->n > n0) {
      *got = 1;
      return MML_OK;
    }
  }
  if (c->win >= 0 && !c->win_pinned) /* the chunk is decoded: its last window not needed */
    mml_bytes_free(&c->bufs[c->win]);
  if (c->n != cm->num_values)
    return mml_err_set(err, MML_ERECORD,
                       "a column chunk holds %lld entries, its metadata says %lld", (long long)c->n,
                       (long long)cm->num_values);
  return MML_OK;
}

int64_t pq_column_held(const pq_column *c) {
  int64_t n = c->cap * (int64_t)(2 * sizeof(int16_t) + sizeof(pq_val)) +
              (c->dict ? (c->ndict + 1) * (int64_t)sizeof(pq_val) : 0);
  for (int i = 0; i < c->nbufs; i++) n += (int64_t)c->bufs[i].len; /* (what was read or decoded) */
  return n;
}

void pq_column_free(pq_column *c) {
  free(c->def);
  free(c->rep);
  free(c->vals);
  free(c->dict);
  for (int i = 0; i < c->nbufs; i++) mml_bytes_free(&c->bufs[i]);
  free(c->bufs);
  memset(c, 0, sizeof *c);
}
