/*
 * parquet_rows.c — a row group's rows assembled into JSON records and blobs, its read
 * columns decoded page by page as the rows reach them (mml/parquet.h; the assembly rules
 * are the DESIGN of parquet_file.c, points 3 and 4).
 *
 * Invariants:
 *   1. Only the column chunks of read fields are read, by windows of their pages
 *      (parquet_chunk.c), each within the file (before its footer) and max_chunk_bytes,
 *      with a supported codec: checked for every row group when the file is opened
 *      (pq_check_chunk), so a file whose metadata is wrong is refused before any row is
 *      read.
 *   2. Each emit consumes at least one entry of every leaf column under the node it
 *      emits, and checks every cursor before reading (decoding the column's next page
 *      when the cursor is past what is decoded: have()): assembly ends.
 *   3. Rows are assembled in order, as far as asked (mml_pq_group_rows): row r is
 *      delivered once the pages it needs decode, whatever lies after it; the group's
 *      last row is delivered only if every read column is then consumed exactly.  A
 *      malformed page fails the row that reaches it and every row after it.
 *   4. Memory: the group's windows, pages and decoded columns are held until
 *      mml_pq_group_end (the blobs delivered point into them), then released.
 *
 * Threads: one thread per mml_pq_file.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parquet_int.h"

/* ---- loading -------------------------------------------------------------------- */

static void chunk_range(const pq_chunk_meta *cm, int64_t *off, int64_t *len) {
  *off = cm->dict_page_offset >= 0 && cm->dict_page_offset < cm->data_page_offset
             ? cm->dict_page_offset
             : cm->data_page_offset;
  *len = cm->total_compressed;
}

void mml_pq_row_group_range(const mml_pq_file *f, int g, int64_t *off, int64_t *len) {
  int64_t lo = INT64_MAX, hi = 0;
  for (int k = 0; k < f->nleaves; k++) {
    if (!f->leaf_sel[k]) continue;
    int64_t o, n;
    chunk_range(&f->meta.groups[g].cols[k], &o, &n);
    if (o < lo) lo = o;
    if (o + n > hi) hi = o + n;
  }
  *off = lo == INT64_MAX ? 0 : lo;
  *len = hi > *off ? hi - *off : 0;
}

static void release(mml_pq_file *f) {
  for (int k = 0; k < f->nleaves; k++) pq_column_free(&f->cols[k]);
  f->group = -1;
}

/* A column's dotted path ("images.list.element.bytes") into out. */
static const char *col_name(const pq_chunk_meta *cm, const char *leaf, char *out, size_t cap) {
  size_t n = 0;
  out[0] = 0;
  for (int i = 0; i < cm->npath && cm->path[i] && n + 1 < cap; i++)
    n += (size_t)snprintf(out + n, cap - n, "%s%s", i ? "." : "", cm->path[i]);
  return n ? out : leaf;
}

mml_status pq_check_chunk(const mml_pq_file *f, int g, int k, mml_err *err) {
  const pq_chunk_meta *cm = &f->meta.groups[g].cols[k];
  const pq_node *leaf = f->leaves[k];
  char cname[256];
  const char *name = col_name(cm, leaf->el->name, cname, sizeof cname);
  int64_t off, len;
  chunk_range(cm, &off, &len);
  if (cm->type != leaf->el->type || cm->npath < 1 || !cm->path[cm->npath - 1] ||
      strcmp(cm->path[cm->npath - 1], leaf->el->name))
    return mml_err_set(err, MML_ERECORD,
                       "%s: row group %d, column %s: its metadata does not match the schema",
                       f->name, g, name);
  if (off < 4 || len < 0 || len > f->lim.max_chunk_bytes || off > f->size - 8 - len ||
      cm->num_values < 0 || cm->num_values > f->lim.max_chunk_bytes / 16)
    return mml_err_set(err, MML_ERECORD,
                       "%s: row group %d, column %s: its column chunk (%lld bytes at byte %lld, "
                       "%lld values) lies outside the file or above max_object_bytes=%lld",
                       f->name, g, name, (long long)len, (long long)off, (long long)cm->num_values,
                       (long long)f->lim.max_chunk_bytes);
  if (cm->codec != PQ_UNCOMPRESSED && cm->codec != PQ_SNAPPY && cm->codec != PQ_GZIP &&
      cm->codec != PQ_ZSTD)
    return mml_err_set(err, MML_ERECORD,
                       "%s: row group %d, column %s: compression codec %d is not supported "
                       "(uncompressed, snappy, gzip and zstd are)",
                       f->name, g, name, cm->codec);
  return MML_OK;
}

/* Column k set to decode its chunk of the group begun, page by page. */
static void begin_column(mml_pq_file *f, int k) {
  const pq_node *leaf = f->leaves[k];
  pq_column *c = &f->cols[k];
  pq_column_free(c);
  c->max_def = leaf->def, c->max_rep = leaf->rep, c->type = leaf->el->type;
  pq_column_begin(c, &f->meta.groups[f->group].cols[k], f->lim.max_chunk_bytes);
}

/* Whether column c has an entry at its cursor, its next page decoded when needed: 1;
 * 0 at the chunk's end, or on a failure (*st set, the error naming the column). */
static int have(mml_pq_file *f, pq_column *c, mml_status *st) {
  *st = MML_OK;
  while (c->pos >= c->n) {
    int got;
    if ((*st = pq_column_more(c, f->read, f->ctx, &got, f->err))) {
      f->col_failed = 1; /* (its message names the column, not the row) */
      char cname[256];
      int k = (int)(c - f->cols);
      mml_err_prefix(f->err, "%s: row group %d, column %s", f->name, f->group,
                     col_name(c->cm, f->leaves[k]->el->name, cname, sizeof cname));
      return 0;
    }
    if (!got) return 0;
  }
  return 1;
}

/* ---- JSON --------------------------------------------------------------------------- */

static mml_status put(mml_pq_file *f, const void *p, size_t n) {
  if (mml_bytes_append(&f->json, p, n))
    return mml_err_set(f->err, MML_ENOMEM, "out of memory assembling a Parquet row");
  return MML_OK;
}

static mml_status puts_(mml_pq_file *f, const char *s) { return put(f, s, strlen(s)); }

static mml_status put_string(mml_pq_file *f, const uint8_t *p, size_t n) {
  mml_status st = put(f, "\"", 1);
  size_t run = 0;
  for (size_t i = 0; !st && i < n; i++) {
    uint8_t ch = p[i];
    if (ch >= 0x20 && ch != '"' && ch != '\\') continue;
    char esc[8];
    snprintf(esc, sizeof esc, ch == '"' ? "\\\"" : ch == '\\' ? "\\\\" : "\\u%04x", ch);
    if (!(st = put(f, p + run, i - run))) st = puts_(f, esc);
    run = i + 1;
  }
  if (!st) st = put(f, p + run, n - run);
  return st ? st : put(f, "\"", 1);
}

static mml_status broken(mml_pq_file *f, const pq_node *n) {
  return mml_err_set(f->err, MML_ERECORD,
                     "the levels of column %s do not fit the schema (malformed data)",
                     f->leaves[n->first]->el->name);
}

/* ---- assembly ----------------------------------------------------------------------- */

static mml_status emit_value(mml_pq_file *f, const pq_node *n);
static mml_status emit_content(mml_pq_file *f, const pq_node *n);

/* Node n is null or empty: one entry of each of its leaves, none with a value. */
static mml_status skip_one(mml_pq_file *f, const pq_node *n) {
  mml_status st;
  for (int k = n->first; k < n->first + n->nleaves; k++) {
    pq_column *c = &f->cols[k];
    if (!have(f, c, &st)) return st ? st : broken(f, n);
    if (c->def[c->pos] >= n->def) return broken(f, n);
    c->pos++;
  }
  return MML_OK;
}

static mml_status emit_leaf(mml_pq_file *f, const pq_node *n) {
  pq_column *c = &f->cols[n->leaf];
  mml_status st;
  if (!have(f, c, &st)) return st ? st : broken(f, n);
  if (c->def[c->pos] != c->max_def || c->vpos >= c->nvals) return broken(f, n);
  const pq_val *v = &c->vals[c->vpos++];
  c->pos++;
  char num[40];
  switch (n->el->type) {
    case PQ_BYTE_ARRAY:
      return put_string(f, v->p, v->len);
    case PQ_BOOLEAN:
      return puts_(f, v->n.i ? "true" : "false");
    case PQ_INT32:
    case PQ_INT64:
      snprintf(num, sizeof num, "%lld", (long long)v->n.i);
      return puts_(f, num);
    default:
      if (!isfinite(v->n.d)) return puts_(f, "null");
      snprintf(num, sizeof num, "%.17g", v->n.d);
      return puts_(f, num);
  }
}

static const char *blob_ext(const uint8_t *p, size_t n) {
  if (n >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff) return "jpg";
  if (n >= 8 && !memcmp(p, "\x89PNG", 4)) return "png";
  if (n >= 12 && !memcmp(p, "RIFF", 4) && !memcmp(p + 8, "WEBP", 4)) return "webp";
  if (n >= 12 && !memcmp(p, "RIFF", 4) && !memcmp(p + 8, "AVI ", 4)) return "avi";
  if (n >= 4 && !memcmp(p, "GIF8", 4)) return "gif";
  if (n >= 2 && p[0] == 'B' && p[1] == 'M') return "bmp";
  if (n >= 4 && (!memcmp(p, "II*\0", 4) || !memcmp(p, "MM\0*", 4))) return "tif";
  if (n >= 8 && !memcmp(p + 4, "ftyp", 4)) return "mp4";
  if (n >= 4 && !memcmp(p, "\x1a\x45\xdf\xa3", 4)) return "mkv";
  return "bin";
}

static mml_status add_blob(mml_pq_file *f, const pq_val *v) {
  if (f->nblobs == f->blobs_cap) {
    int nc = f->blobs_cap ? 2 * f->blobs_cap : 8;
    mml_pq_blob *b = realloc(f->blobs, (size_t)nc * sizeof *b);
    if (b) f->blobs = b;
    size_t *o = b ? realloc(f->blob_name_off, (size_t)nc * sizeof *o) : NULL;
    if (!o) return mml_err_set(f->err, MML_ENOMEM, "out of memory");
    f->blob_name_off = o, f->blobs_cap = nc;
  }
  char name[128];
  int len = snprintf(name, sizeof name, "%s.%d.%s", f->key, f->nblobs, blob_ext(v->p, v->len));
  f->blob_name_off[f->nblobs] = f->names.len;
  f->blobs[f->nblobs++] = (mml_pq_blob){NULL, v->p, v->len};
  if (mml_bytes_append(&f->names, name, (size_t)len + 1))
    return mml_err_set(f->err, MML_ENOMEM, "out of memory");
  return put_string(f, (const uint8_t *)name, (size_t)len);
}

/* A {bytes, path} struct: its blob's name, else its path, else null. */
static mml_status emit_image(mml_pq_file *f, const pq_node *n) {
  int bi = strcmp(n->child[0].el->name, "bytes") != 0;
  pq_column *cb = &f->cols[n->child[bi].leaf], *cp = &f->cols[n->child[!bi].leaf];
  mml_status st;
  if (!have(f, cb, &st) || !have(f, cp, &st)) return st ? st : broken(f, n);
  int has_b = cb->def[cb->pos] == cb->max_def, has_p = cp->def[cp->pos] == cp->max_def;
  if ((has_b && cb->vpos >= cb->nvals) || (has_p && cp->vpos >= cp->nvals)) return broken(f, n);
  const pq_val *b = has_b ? &cb->vals[cb->vpos++] : NULL, *p = has_p ? &cp->vals[cp->vpos++] : NULL;
  cb->pos++, cp->pos++;
  if (b) return add_blob(f, b);
  if (p) return put_string(f, p->p, p->len);
  return puts_(f, "null");
}

/* Repeated node r as a JSON array: of r itself (elem_is_r) or of its one child. */
static mml_status emit_repeated(mml_pq_file *f, const pq_node *r, int elem_is_r) {
  pq_column *c = &f->cols[r->first];
  mml_status st;
  if (!have(f, c, &st)) return st ? st : broken(f, r);
  if (c->def[c->pos] < r->def) {
    st = puts_(f, "[]");
    return st ? st : skip_one(f, r);
  }
  st = put(f, "[", 1);
  for (int i = 0; !st; i++) {
    if (i && (st = put(f, ",", 1))) break;
    st = elem_is_r ? emit_content(f, r) : emit_value(f, &r->child[0]);
    if (st || !have(f, c, &st) || c->rep[c->pos] != r->rep) break;
  }
  return st ? st : put(f, "]", 1);
}

static mml_status emit_list(mml_pq_file *f, const pq_node *n) {
  const pq_node *r = &n->child[0];
  char tuple[300];
  snprintf(tuple, sizeof tuple, "%s_tuple", n->el->name);
  int elem_is_r = r->kind == K_LEAF || r->nchild != 1 || !strcmp(r->el->name, "array") ||
                  !strcmp(r->el->name, tuple);
  return emit_repeated(f, r, elem_is_r);
}

static mml_status emit_field(mml_pq_file *f, const pq_node *n) {
  const char *key = n->as ? n->as : n->el->name;
  mml_status st = put_string(f, (const uint8_t *)key, strlen(key));
  if (!st) st = put(f, ":", 1);
  if (st) return st;
  return n->el->repetition == PQ_REPEATED ? emit_repeated(f, n, 1) : emit_value(f, n);
}

static mml_status emit_content(mml_pq_file *f, const pq_node *n) {
  if (n->kind == K_LEAF) return emit_leaf(f, n);
  if (n->kind == K_IMAGE) return emit_image(f, n);
  if (n->kind == K_LIST) return emit_list(f, n);
  mml_status st = put(f, "{", 1);
  for (int i = 0; !st && i < n->nchild; i++) {
    if (i && (st = put(f, ",", 1))) break;
    st = emit_field(f, &n->child[i]);
  }
  return st ? st : put(f, "}", 1);
}

static mml_status emit_value(mml_pq_file *f, const pq_node *n) {
  pq_column *c = &f->cols[n->first];
  mml_status st;
  if (!have(f, c, &st)) return st ? st : broken(f, n);
  if (n->el->repetition == PQ_OPTIONAL && c->def[c->pos] < n->def) {
    st = puts_(f, "null");
    return st ? st : skip_one(f, n);
  }
  return emit_content(f, n);
}

/* ---- rows --------------------------------------------------------------------------- */

static mml_status emit_row(mml_pq_file *f) {
  mml_bytes_clear(&f->json);
  mml_bytes_clear(&f->names);
  f->nblobs = 0;
  mml_status st = put(f, "{", 1);
  int first = 1;
  for (int i = 0; !st && i < f->root.nchild; i++) {
    const pq_node *n = &f->root.child[i];
    if (!n->selected) continue;
    pq_column *c = &f->cols[n->first];
    if (!have(f, c, &st)) return st ? st : broken(f, n);
    if (c->rep[c->pos] != 0) return broken(f, n);
    if (!first && (st = put(f, ",", 1))) break;
    first = 0;
    st = emit_field(f, n);
  }
  if (!st) st = put(f, "}", 2); /* with its NUL */
  for (int k = 0; !st && k < f->nblobs; k++)
    f->blobs[k].name = (const char *)f->names.data + f->blob_name_off[k];
  return st;
}

/* Every read column consumed exactly at the group's end (invariant 3). */
static mml_status all_consumed(mml_pq_file *f, int64_t nrows) {
  mml_status st = MML_OK;
  for (int k = 0; !st && k < f->nleaves; k++) {
    pq_column *c = &f->cols[k];
    if (!f->leaf_sel[k]) continue;
    if (have(f, c, &st) || (!st && c->vpos != c->nvals))
      st = mml_err_set(f->err, MML_ERECORD,
                       "%s: row group %d, column %s: %lld entries left after its %lld rows "
                       "(malformed levels)",
                       f->name, f->group, f->leaves[k]->el->name,
                       (long long)(c->cm->num_values - c->pos), (long long)nrows);
  }
  return st;
}

mml_status mml_pq_group_begin(mml_pq_file *f, int g, mml_err *err) {
  f->err = err;
  release(f);
  if (g < 0 || g >= f->meta.ngroups)
    return mml_err_set(err, MML_EINTERNAL, "%s: no row group %d", f->name, g);
  f->group = g;
  f->group_next = f->group_first[g];
  f->col_failed = 0;
  for (int k = 0; k < f->nleaves; k++)
    if (f->leaf_sel[k]) begin_column(f, k);
  return MML_OK;
}

mml_status mml_pq_group_rows(mml_pq_file *f, int64_t upto, mml_pq_row_fn fn, void *ctx,
                             const mml_cancel *cancel, mml_err *err) {
  f->err = err;
  int g = f->group;
  if (g < 0) return mml_err_set(err, MML_EINTERNAL, "%s: no row group begun", f->name);
  int64_t end = f->group_first[g + 1];
  if (upto > end) upto = end;
  mml_status st = MML_OK;
  while (!st && f->group_next < upto) {
    int64_t row = f->group_next;
    if (!((row - f->group_first[g]) & 63) && mml_cancelled(cancel))
      return mml_err_set(err, MML_ECANCELLED, "%s: reading cancelled", f->name);
    mml_pq_row_key(g, row, f->key, sizeof f->key);
    if ((st = emit_row(f))) {
      if (!f->col_failed) mml_err_prefix(err, "%s: %s", f->name, f->key);
      break;
    }
    if (row + 1 == end && (st = all_consumed(f, end - f->group_first[g]))) break;
    if ((st = fn(ctx, row, f->key, (const char *)f->json.data, f->json.len - 1, f->blobs, f->nblobs,
                 err)))
      break;
    f->group_next = row + 1;
  }
  return st;
}

int64_t mml_pq_group_held(const mml_pq_file *f) {
  int64_t n = (int64_t)(f->json.cap + f->names.cap);
  for (int k = 0; f->group >= 0 && k < f->nleaves; k++) n += pq_column_held(&f->cols[k]);
  return n;
}

void mml_pq_group_end(mml_pq_file *f) { release(f); }

mml_status mml_pq_read_row_group(mml_pq_file *f, int g, mml_pq_row_fn fn, void *ctx,
                                 const mml_cancel *cancel, mml_err *err) {
  mml_status st = mml_pq_group_begin(f, g, err);
  if (!st) st = mml_pq_group_rows(f, f->group_first[g + 1], fn, ctx, cancel, err);
  if (!st && f->group_first[g + 1] == f->group_first[g]) st = all_consumed(f, 0);
  release(f);
  return st;
}
