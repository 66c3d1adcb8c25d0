/*
 * parquet_thrift.c — the Thrift compact protocol, as far as a Parquet footer
 * (FileMetaData: schema, row groups, column chunks) and page headers need it.
 *
 * DESIGN
 *   1. A reader is a bounded cursor [p, end): every length, count and varint is checked
 *      against the bytes left before use, so a hostile footer fails (MML_ERECORD naming
 *      the byte offset) instead of reading out of bounds or allocating what it claims.
 *   2. A list's element count is at most the bytes left (each element takes >= 1 byte),
 *      so allocations stay within the footer's size.
 *   3. Structures nest at most MML_PQ_MAX_DEPTH deep (skipping unknown fields recurses).
 *   4. Unknown fields are skipped by type: newer writers' additions are ignored.
 *   5. A field with the wrong wire type for what we read fails (never a reinterpretation).
 *
 * Threads: pure functions of their input.
 */
#include <stdlib.h>
#include <string.h>

#include "parquet_int.h"

enum { T_STOP = 0, T_TRUE = 1, T_FALSE = 2, T_BYTE = 3, T_I16 = 4, T_I32 = 5, T_I64 = 6 };
enum { T_DOUBLE = 7, T_BINARY = 8, T_LIST = 9, T_SET = 10, T_MAP = 11, T_STRUCT = 12 };

typedef struct tr {
  const uint8_t *start, *p, *end;
  int depth, bad;
} tr;

static uint64_t varint(tr *r) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64 && r->p < r->end; shift += 7) {
    uint8_t b = *r->p++;
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  r->bad = 1;
  return 0;
}

static int64_t rd_int(tr *r) {
  uint64_t v = varint(r);
  return (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
}

static int32_t rd_i32(tr *r) {
  int64_t v = rd_int(r);
  if (v < INT32_MIN || v > INT32_MAX) r->bad = 1;
  return (int32_t)v;
}

static int rd_bin(tr *r, const uint8_t **s, size_t *n) {
  uint64_t len = varint(r);
  if (r->bad || len > (uint64_t)(r->end - r->p)) return r->bad = 1, -1;
  *s = r->p;
  *n = (size_t)len;
  r->p += len;
  return 0;
}

static char *rd_str(tr *r) {
  const uint8_t *s;
  size_t n;
  if (rd_bin(r, &s, &n)) return NULL;
  char *out = malloc(n + 1);
  if (!out) return r->bad = 2, NULL;
  memcpy(out, s, n);
  out[n] = 0;
  return out;
}

/* A list/set header: element type and count (count <= bytes left). */
static int64_t rd_list(tr *r, int *etype) {
  if (r->p >= r->end) return r->bad = 1, 0;
  uint8_t b = *r->p++;
  *etype = b & 0x0f;
  uint64_t n = b >> 4;
  if (n == 15) n = varint(r);
  if (r->bad || n > (uint64_t)(r->end - r->p)) return r->bad = 1, 0;
  return (int64_t)n;
}

/* The next field of a struct: its id and type (T_STOP at the end). */
static int rd_field(tr *r, int *id, int *last) {
  if (r->p >= r->end) return r->bad = 1, T_STOP;
  uint8_t b = *r->p++;
  if (b == 0) return T_STOP;
  int delta = b >> 4;
  *id = delta ? *last + delta : (int)rd_int(r);
  *last = *id;
  return b & 0x0f;
}

static void skip(tr *r, int type, int in_list);

static void skip_struct(tr *r) {
  if (++r->depth > MML_PQ_MAX_DEPTH) {
    r->bad = 1;
    return;
  }
  int id = 0, last = 0, t;
  while (!r->bad && (t = rd_field(r, &id, &last)) != T_STOP) skip(r, t, 0);
  r->depth--;
}

static void skip(tr *r, int type, int in_list) {
  const uint8_t *s;
  size_t n;
  int et;
  switch (type) {
    case T_TRUE:
    case T_FALSE:
      if (in_list) r->p < r->end ? (void)r->p++ : (void)(r->bad = 1);
      return;
    case T_BYTE:
      r->p < r->end ? (void)r->p++ : (void)(r->bad = 1);
      return;
    case T_I16:
    case T_I32:
    case T_I64:
      varint(r);
      return;
    case T_DOUBLE:
      if (r->end - r->p < 8)
        r->bad = 1;
      else
        r->p += 8;
      return;
    case T_BINARY:
      rd_bin(r, &s, &n);
      return;
    case T_LIST:
    case T_SET: {
      int64_t k = rd_list(r, &et);
      if (++r->depth > MML_PQ_MAX_DEPTH) r->bad = 1;
      for (int64_t i = 0; i < k && !r->bad; i++) skip(r, et, 1);
      r->depth--;
      return;
    }
    case T_MAP: {
      int64_t k = (int64_t)varint(r);
      if (k > r->end - r->p) r->bad = 1;
      if (k == 0 || r->bad) return;
      uint8_t kv = *r->p++;
      if (++r->depth > MML_PQ_MAX_DEPTH) r->bad = 1;
      for (int64_t i = 0; i < k && !r->bad; i++) skip(r, kv >> 4, 1), skip(r, kv & 15, 1);
      r->depth--;
      return;
    }
    case T_STRUCT:
      skip_struct(r);
      return;
    default:
      r->bad = 1;
  }
}

/* The wire type of an integer field must be one. */
static int is_int(int t) { return t == T_I16 || t == T_I32 || t == T_I64 || t == T_BYTE; }

/* LogicalType: a union; we keep which member is set. */
static int rd_logical(tr *r) {
  int id = 0, last = 0, t, which = -1;
  if (++r->depth > MML_PQ_MAX_DEPTH) return r->bad = 1, -1;
  while (!r->bad && (t = rd_field(r, &id, &last)) != T_STOP) {
    which = id;
    skip(r, t, 0);
  }
  r->depth--;
  return which;
}

static void rd_schema_el(tr *r, pq_schema_el *e) {
  int id = 0, last = 0, t;
  *e = (pq_schema_el){.type = -1, .repetition = PQ_REQUIRED, .converted = -1, .logical = -1};
  while (!r->bad && (t = rd_field(r, &id, &last)) != T_STOP) {
    if (id == 1 && is_int(t))
      e->type = rd_i32(r);
    else if (id == 3 && is_int(t))
      e->repetition = rd_i32(r);
    else if (id == 4 && t == T_BINARY && !e->name)
      e->name = rd_str(r);
    else if (id == 5 && is_int(t))
      e->num_children = rd_i32(r);
    else if (id == 6 && is_int(t))
      e->converted = rd_i32(r);
    else if (id == 10 && t == T_STRUCT)
      e->logical = rd_logical(r);
    else
      skip(r, t, 0);
  }
  if (!e->name && !r->bad) r->bad = 1; /* every element is named */
}

static void rd_path(tr *r, pq_chunk_meta *c) {
  int et;
  int64_t n = rd_list(r, &et);
  if (r->bad || et != T_BINARY || c->path) return (void)(r->bad = 1);
  if (!(c->path = calloc((size_t)n + 1, sizeof *c->path))) return (void)(r->bad = 2);
  for (int64_t i = 0; i < n && !r->bad; i++, c->npath++) c->path[i] = rd_str(r);
}

static void rd_col_meta(tr *r, pq_chunk_meta *c) {
  int id = 0, last = 0, t;
  while (!r->bad && (t = rd_field(r, &id, &last)) != T_STOP) {
    if (id == 1 && is_int(t))
      c->type = rd_i32(r);
    else if (id == 3 && t == T_LIST)
      rd_path(r, c);
    else if (id == 4 && is_int(t))
      c->codec = rd_i32(r);
    else if (id == 5 && is_int(t))
      c->num_values = rd_int(r);
    else if (id == 6 && is_int(t))
      c->total_uncompressed = rd_int(r);
    else if (id == 7 && is_int(t))
      c->total_compressed = rd_int(r);
    else if (id == 9 && is_int(t))
      c->data_page_offset = rd_int(r);
    else if (id == 11 && is_int(t))
      c->dict_page_offset = rd_int(r);
    else
      skip(r, t, 0);
  }
}

static void rd_chunk(tr *r, pq_chunk_meta *c) {
  int id = 0, last = 0, t, seen = 0;
  c->dict_page_offset = -1;
  c->type = -1;
  while (!r->bad && (t = rd_field(r, &id, &last)) != T_STOP) {
    if (id == 1 && t == T_BINARY)
      r->bad = 3; /* data in another file: refused */
    else if (id == 3 && t == T_STRUCT && !seen)
      seen = 1, rd_col_meta(r, c);
    else
      skip(r, t, 0);
  }
  if (!seen && !r->bad) r->bad = 1;
}

static void rd_group(tr *r, pq_row_group *g) {
  int id = 0, last = 0, t, et;
  while (!r->bad && (t = rd_field(r, &id, &last)) != T_STOP) {
    if (id == 1 && t == T_LIST && !g->cols) {
      int64_t n = rd_list(r, &et);
      if (r->bad || et != T_STRUCT) return (void)(r->bad = 1);
      if (!(g->cols = calloc((size_t)n + 1, sizeof *g->cols))) return (void)(r->bad = 2);
      for (int64_t i = 0; i < n && !r->bad; i++, g->ncols++) rd_chunk(r, &g->cols[i]);
    } else if (id == 3 && is_int(t))
      g->num_rows = rd_int(r);
    else
      skip(r, t, 0);
  }
}

static void rd_meta(tr *r, pq_meta *m) {
  int id = 0, last = 0, t, et;
  while (!r->bad && (t = rd_field(r, &id, &last)) != T_STOP) {
    if (id == 2 && t == T_LIST && !m->schema) {
      int64_t n = rd_list(r, &et);
      if (r->bad || et != T_STRUCT) return (void)(r->bad = 1);
      if (!(m->schema = calloc((size_t)n + 1, sizeof *m->schema))) return (void)(r->bad = 2);
      for (int64_t i = 0; i < n && !r->bad; i++, m->nschema++) rd_schema_el(r, &m->schema[i]);
    } else if (id == 3 && is_int(t))
      m->num_rows = rd_int(r);
    else if (id == 4 && t == T_LIST && !m->groups) {
      int64_t n = rd_list(r, &et);
      if (r->bad || et != T_STRUCT) return (void)(r->bad = 1);
      if (!(m->groups = calloc((size_t)n + 1, sizeof *m->groups))) return (void)(r->bad = 2);
      for (int64_t i = 0; i < n && !r->bad; i++, m->ngroups++) rd_group(r, &m->groups[i]);
    } else
      skip(r, t, 0);
  }
}

static mml_status bad(const tr *r, const char *what, mml_err *err) {
  if (r->bad == 2) return mml_err_set(err, MML_ENOMEM, "out of memory reading a Parquet %s", what);
  if (r->bad == 3)
    return mml_err_set(err, MML_ERECORD,
                       "its %s puts column data in another file (ColumnChunk.file_path): not "
                       "supported",
                       what);
  return mml_err_set(err, MML_ERECORD, "malformed Parquet %s (Thrift compact) at its byte %lld",
                     what, (long long)(r->p - r->start));
}

mml_status pq_parse_meta(const uint8_t *p, size_t n, pq_meta *m, mml_err *err) {
  memset(m, 0, sizeof *m);
  tr r = {p, p, p + n, 0, 0};
  rd_meta(&r, m);
  if (!r.bad && (!m->schema || m->nschema < 1 || m->num_rows < 0)) r.bad = 1;
  for (int i = 0; !r.bad && i < m->ngroups; i++)
    if (m->groups[i].num_rows < 0) r.bad = 1;
  if (r.bad) {
    mml_status st = bad(&r, "footer", err);
    pq_meta_free(m);
    return st;
  }
  return MML_OK;
}

static void rd_data_header(tr *r, pq_page_header *h, int v2) {
  int id = 0, last = 0, t;
  while (!r->bad && (t = rd_field(r, &id, &last)) != T_STOP) {
    if (id == 1 && is_int(t))
      h->num_values = rd_i32(r);
    else if (!v2 && id == 2 && is_int(t))
      h->encoding = rd_i32(r);
    else if (!v2 && id == 3 && is_int(t))
      h->def_enc = rd_i32(r);
    else if (!v2 && id == 4 && is_int(t))
      h->rep_enc = rd_i32(r);
    else if (v2 && id == 4 && is_int(t))
      h->encoding = rd_i32(r);
    else if (v2 && id == 5 && is_int(t))
      h->def_len = rd_i32(r);
    else if (v2 && id == 6 && is_int(t))
      h->rep_len = rd_i32(r);
    else if (v2 && id == 7 && (t == T_TRUE || t == T_FALSE))
      h->v2_compressed = t == T_TRUE;
    else
      skip(r, t, 0);
  }
}

mml_status pq_parse_page_header(const uint8_t *p, size_t n, pq_page_header *h, size_t *used,
                                mml_err *err) {
  *h = (pq_page_header){
      .type = -1, .encoding = PQ_PLAIN, .def_enc = PQ_RLE, .rep_enc = PQ_RLE, .v2_compressed = 1};
  tr r = {p, p, p + n, 0, 0};
  int id = 0, last = 0, t;
  while (!r.bad && (t = rd_field(&r, &id, &last)) != T_STOP) {
    if (id == 1 && is_int(t))
      h->type = rd_i32(&r);
    else if (id == 2 && is_int(t))
      h->uncompressed = rd_i32(&r);
    else if (id == 3 && is_int(t))
      h->compressed = rd_i32(&r);
    else if ((id == 5 || id == 7) && t == T_STRUCT)
      rd_data_header(&r, h, 0);
    else if (id == 8 && t == T_STRUCT)
      rd_data_header(&r, h, 1);
    else
      skip(&r, t, 0);
  }
  if (!r.bad && (h->uncompressed < 0 || h->compressed < 0 || h->num_values < 0 || h->def_len < 0 ||
                 h->rep_len < 0))
    r.bad = 1;
  if (r.bad) return bad(&r, "page header", err);
  *used = (size_t)(r.p - p);
  return MML_OK;
}

void pq_meta_free(pq_meta *m) {
  for (int i = 0; m->schema && i < m->nschema; i++) free(m->schema[i].name);
  free(m->schema);
  for (int g = 0; m->groups && g < m->ngroups; g++) {
    pq_row_group *rg = &m->groups[g];
    for (int c = 0; rg->cols && c < rg->ncols; c++) {
      for (int k = 0; k < rg->cols[c].npath; k++) free(rg->cols[c].path[k]);
      free(rg->cols[c].path);
    }
    free(rg->cols);
  }
  free(m->groups);
  memset(m, 0, sizeof *m);
}
