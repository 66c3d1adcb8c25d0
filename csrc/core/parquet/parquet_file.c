/*
 * parquet_file.c — a Parquet file's footer and schema tree, and its rows assembled into
 * JSON records row group by row group (mml/parquet.h).
 *
 * DESIGN
 *   1. The footer is read with two reads (the last 8 bytes, then the FileMetaData), both
 *      within the file and max_chunk_bytes; a row group's read columns are read by
 *      windows of their column chunks as its rows need them: never the whole file.
 *   2. The schema's flat depth-first list becomes a tree; each node knows its maximum
 *      definition and repetition levels, its first leaf column and its kind (leaf,
 *      struct, list, image = a {bytes, path} struct).  Depth <= MML_PQ_MAX_DEPTH, so the
 *      recursive assembly is bounded.
 *   3. Record assembly (Dremel): every leaf column has a cursor; a node's presence is
 *      read from its first leaf's next entry (all leaves under a node agree on levels
 *      up to it); a null or empty node consumes exactly one entry of each leaf under it;
 *      a list continues while its first leaf's next repetition level is the list's own.
 *      Every step consumes >= 1 entry, every read checks the cursor against the column's
 *      end, and the row group must end with every column consumed: hostile levels fail
 *      (MML_ERECORD), never loop or read past an array.
 *   4. A {bytes, path} struct with bytes becomes a blob named "<key>.<k>.<ext>", with
 *      its path string when it has no bytes (resolved by the loader as a JSON record's).
 *   5. A dataset's own column names (mml_pq_open_mapped): a mapped top-level column is
 *      written under its new name, a column that name would clash with is not read, and
 *      a mapped column the file lacks fails the open (MML_ECONFIG), naming the file's
 *      columns.
 *
 * Threads: one thread per mml_pq_file.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parquet_int.h"

/* ---- the schema tree -------------------------------------------------------------- */

static mml_status schema_error(mml_pq_file *f, const char *what, const char *field) {
  return mml_err_set(f->err, MML_ERECORD, "%s: Parquet schema: %s (field %s)", f->name, what,
                     field ? field : "?");
}

static mml_status build_node(mml_pq_file *f, pq_node *n, int *at, int depth, int pdef, int prep);

static mml_status build_children(mml_pq_file *f, pq_node *n, int *at, int depth) {
  const pq_schema_el *e = n->el;
  if (e->num_children < 1 || e->num_children > f->meta.nschema - *at)
    return schema_error(f, "bad child count", e->name);
  if (!(n->child = calloc((size_t)e->num_children, sizeof *n->child)))
    return mml_err_set(f->err, MML_ENOMEM, "out of memory");
  n->nchild = e->num_children;
  n->first = f->nleaves;
  for (int i = 0; i < n->nchild; i++) {
    mml_status st = build_node(f, &n->child[i], at, depth + 1, n->def, n->rep);
    if (st) return st;
  }
  n->nleaves = f->nleaves - n->first;
  return MML_OK;
}

static int is_image(const pq_node *n) {
  if (n->nchild != 2) return 0;
  for (int i = 0; i < 2; i++) {
    const pq_node *c = &n->child[i];
    if (c->kind != K_LEAF || c->el->type != PQ_BYTE_ARRAY || c->el->repetition == PQ_REPEATED)
      return 0;
  }
  return (!strcmp(n->child[0].el->name, "bytes") && !strcmp(n->child[1].el->name, "path")) ||
         (!strcmp(n->child[1].el->name, "bytes") && !strcmp(n->child[0].el->name, "path"));
}

static mml_status build_node(mml_pq_file *f, pq_node *n, int *at, int depth, int pdef, int prep) {
  if (depth > MML_PQ_MAX_DEPTH) return schema_error(f, "nested too deep", NULL);
  if (*at >= f->meta.nschema) return schema_error(f, "fewer elements than its groups hold", NULL);
  const pq_schema_el *e = &f->meta.schema[(*at)++];
  n->el = e;
  n->def = pdef + (e->repetition != PQ_REQUIRED);
  n->rep = prep + (e->repetition == PQ_REPEATED);
  if (e->type >= 0) { /* a leaf */
    if (e->num_children > 0) return schema_error(f, "a typed element with children", e->name);
    if (e->type == PQ_INT96 || e->type == PQ_FIXED_LEN_BYTE_ARRAY ||
        e->type > PQ_FIXED_LEN_BYTE_ARRAY)
      n->string = -1; /* unsupported: refused only if read */
    else
      n->string = e->converted == PQ_CONV_UTF8 || e->converted == PQ_CONV_ENUM ||
                  e->converted == PQ_CONV_JSON || e->logical == PQ_LOGICAL_STRING ||
                  e->logical == PQ_LOGICAL_JSON;
    n->kind = K_LEAF;
    n->leaf = n->first = f->nleaves++;
    n->nleaves = 1;
    return MML_OK;
  }
  mml_status st = build_children(f, n, at, depth);
  if (st) return st;
  if (e->converted == PQ_CONV_MAP || e->converted == PQ_CONV_MAP_KV || e->logical == PQ_LOGICAL_MAP)
    n->kind = -1; /* maps: refused only if read */
  else if (e->converted == PQ_CONV_LIST || e->logical == PQ_LOGICAL_LIST) {
    if (n->nchild != 1 || n->child[0].el->repetition != PQ_REPEATED)
      return schema_error(f, "a LIST without one repeated child", e->name);
    n->kind = K_LIST;
  } else
    n->kind = is_image(n) ? K_IMAGE : K_STRUCT;
  return MML_OK;
}

static void free_node(pq_node *n) {
  for (int i = 0; i < n->nchild; i++) free_node(&n->child[i]);
  free(n->child);
}

/* Whether node n (to be read) holds anything we refuse; names it in the error. */
static mml_status check_supported(mml_pq_file *f, const pq_node *n) {
  if (n->kind == -1) return schema_error(f, "MAP columns are not supported", n->el->name);
  if (n->kind == K_LEAF && n->string < 0)
    return schema_error(f, "INT96 and FIXED_LEN_BYTE_ARRAY columns are not supported", n->el->name);
  if (n->kind == K_LEAF && n->el->type == PQ_BYTE_ARRAY && !n->string)
    return schema_error(f,
                        "a binary column outside a {bytes, path} image/video struct (its bytes "
                        "have no JSON form)",
                        n->el->name);
  for (int i = 0; n->kind != K_IMAGE && i < n->nchild; i++) {
    mml_status st = check_supported(f, &n->child[i]);
    if (st) return st;
  }
  return MML_OK;
}

/* f->leaves[k]: leaf column k's node; f->leaf_sel[k]: under a selected field. */
static void fill_leaves(mml_pq_file *f, pq_node *n, int sel) {
  if (n->kind == K_LEAF) {
    f->leaves[n->leaf] = n;
    f->leaf_sel[n->leaf] = (uint8_t)sel;
  }
  for (int i = 0; i < n->nchild; i++) fill_leaves(f, &n->child[i], sel);
}

/* A `map` column the file does not have: named, with the file's columns. */
static mml_status no_column(mml_pq_file *f, const char *col, const char *as) {
  char have[1024];
  size_t n = 0;
  have[0] = 0;
  for (int i = 0; i < f->root.nchild && n + 1 < sizeof have; i++)
    n += (size_t)snprintf(have + n, sizeof have - n, "%s%s", i ? ", " : "",
                          f->root.child[i].el->name);
  return mml_err_set(f->err, MML_ECONFIG,
                     "%s: columns maps column \"%s\" (to \"%s\"), which the file does not have "
                     "(its columns: %s)",
                     f->name, col, as, have);
}

static mml_status build_tree(mml_pq_file *f, const char *const *columns) {
  const pq_schema_el *r = &f->meta.schema[0];
  int at = 1;
  f->root.el = r;
  if (r->type >= 0) return schema_error(f, "its root is not a group", r->name);
  mml_status st = build_children(f, &f->root, &at, 0);
  if (!st && at != f->meta.nschema) st = schema_error(f, "elements outside the root", NULL);
  for (int k = 0; !st && f->map && f->map[k]; k += 2) { /* each mapped column is there */
    int found = 0;
    for (int i = 0; i < f->root.nchild && !found; i++)
      found = !strcmp(f->root.child[i].el->name, f->map[k]);
    if (!found) st = no_column(f, f->map[k], f->map[k + 1]);
  }
  for (int i = 0; !st && i < f->root.nchild; i++) {
    pq_node *c = &f->root.child[i];
    c->as = c->el->name;
    for (int k = 0; f->map && f->map[k]; k += 2)
      if (!strcmp(f->map[k + 1], c->el->name)) c->as = NULL; /* another column stands for it */
    for (int k = 0; f->map && f->map[k]; k += 2)
      if (!strcmp(f->map[k], c->el->name)) c->as = f->map[k + 1];
    c->selected = c->as && !columns;
    for (int k = 0; c->as && columns && columns[k] && !c->selected; k++)
      c->selected = !strcmp(columns[k], c->as);
    if (c->selected) st = check_supported(f, c);
  }
  if (!st && (!(f->leaves = calloc((size_t)f->nleaves + 1, sizeof *f->leaves)) ||
              !(f->leaf_sel = calloc((size_t)f->nleaves + 1, 1))))
    st = mml_err_set(f->err, MML_ENOMEM, "out of memory");
  for (int i = 0; !st && i < f->root.nchild; i++)
    fill_leaves(f, &f->root.child[i], f->root.child[i].selected);
  return st;
}

/* ---- opening ------------------------------------------------------------------------ */

static mml_status check_groups(mml_pq_file *f) {
  int64_t rows = 0;
  if (!(f->group_first = calloc((size_t)f->meta.ngroups + 1, sizeof *f->group_first)))
    return mml_err_set(f->err, MML_ENOMEM, "out of memory");
  for (int g = 0; g < f->meta.ngroups; g++) {
    const pq_row_group *rg = &f->meta.groups[g];
    if (rg->ncols != f->nleaves)
      return mml_err_set(f->err, MML_ERECORD, "%s: row group %d has %d columns, the schema %d",
                         f->name, g, rg->ncols, f->nleaves);
    if (rg->num_rows < 0)
      return mml_err_set(f->err, MML_ERECORD, "%s: row group %d holds %lld rows", f->name, g,
                         (long long)rg->num_rows);
    for (int k = 0; k < f->nleaves; k++) {
      mml_status st = f->leaf_sel[k] ? pq_check_chunk(f, g, k, f->err) : MML_OK;
      if (st) return st;
    }
    f->group_first[g] = rows;
    rows += rg->num_rows;
    f->group_first[g + 1] = rows;
    if (rows > f->meta.num_rows)
      return mml_err_set(f->err, MML_ERECORD, "%s: its row groups hold more rows than the file",
                         f->name);
  }
  if (rows != f->meta.num_rows)
    return mml_err_set(f->err, MML_ERECORD,
                       "%s: its row groups hold %lld rows, the footer says %lld", f->name,
                       (long long)rows, (long long)f->meta.num_rows);
  if (f->lim.max_rows > 0 && rows > f->lim.max_rows)
    return mml_err_set(f->err, MML_ERECORD,
                       "%s: %lld rows, above max_shard_records=%lld; refused (raise "
                       "max_shard_records for a genuine shard this large)",
                       f->name, (long long)rows, (long long)f->lim.max_rows);
  return MML_OK;
}

static mml_status read_footer(mml_pq_file *f) {
  mml_bytes b = {0};
  mml_bytes_clear(&f->footer);
  mml_status st = MML_OK;
  if (f->size < 12)
    st = mml_err_set(f->err, MML_ERECORD, "%s: too short for a Parquet file", f->name);
  if (!st) st = f->read(f->ctx, f->size - 8, 8, &b, f->err);
  if (!st && !memcmp(b.data + 4, "PARE", 4))
    st =
        mml_err_set(f->err, MML_ERECORD, "%s: an encrypted Parquet footer: not supported", f->name);
  else if (!st && memcmp(b.data + 4, "PAR1", 4))
    st = mml_err_set(f->err, MML_ERECORD, "%s: not a Parquet file (no PAR1 at its end)", f->name);
  int64_t n = st ? 0
                 : (int64_t)((uint32_t)b.data[0] | (uint32_t)b.data[1] << 8 |
                             (uint32_t)b.data[2] << 16 | (uint32_t)b.data[3] << 24);
  if (!st && (n > f->size - 12 || n > f->lim.max_chunk_bytes))
    st = mml_err_set(f->err, MML_ERECORD,
                     "%s: its footer claims %lld bytes (file %lld bytes, max_object_bytes=%lld)",
                     f->name, (long long)n, (long long)f->size, (long long)f->lim.max_chunk_bytes);
  if (!st) st = f->read(f->ctx, f->size - 8 - n, n, &f->footer, f->err);
  mml_bytes_free(&b);
  return st;
}

/* The footer's bytes parsed, the schema tree built and every row group checked. */
static mml_status parse_footer(mml_pq_file *f) {
  mml_status st = pq_parse_meta(f->footer.data, f->footer.len, &f->meta, f->err);
  if (st) mml_err_prefix(f->err, "%s", f->name);
  if (!st) st = build_tree(f, f->columns);
  if (!st) st = check_groups(f);
  if (!st && !(f->cols = calloc((size_t)f->nleaves + 1, sizeof *f->cols)))
    st = mml_err_set(f->err, MML_ENOMEM, "out of memory");
  return st;
}

mml_status mml_pq_open(const char *name, int64_t size, mml_pq_read_fn read, void *ctx,
                       const char *const *columns, const mml_pq_limits *lim, mml_pq_file **out,
                       mml_err *err) {
  return mml_pq_open_mapped(name, size, read, ctx, columns, NULL, lim, out, err);
}

mml_status mml_pq_open_mapped(const char *name, int64_t size, mml_pq_read_fn read, void *ctx,
                              const char *const *columns, const char *const *map,
                              const mml_pq_limits *lim, mml_pq_file **out, mml_err *err) {
  *out = NULL;
  mml_pq_file *f = calloc(1, sizeof *f);
  if (!f || !(f->name = strdup(name))) {
    free(f);
    return mml_err_set(err, MML_ENOMEM, "out of memory");
  }
  f->size = size, f->read = read, f->ctx = ctx, f->err = err, f->columns = columns;
  f->map = map;
  f->group = -1;
  if (lim) f->lim = *lim;
  if (f->lim.max_chunk_bytes <= 0) f->lim.max_chunk_bytes = (int64_t)256 << 20;
  mml_status st = read_footer(f);
  if (!st) st = parse_footer(f);
  if (st) {
    mml_pq_close(f);
    return st;
  }
  *out = f;
  return MML_OK;
}

mml_status mml_pq_clone(const mml_pq_file *src, mml_pq_read_fn read, void *ctx, mml_pq_file **out,
                        mml_err *err) {
  *out = NULL;
  mml_pq_file *f = calloc(1, sizeof *f);
  if (!f || !(f->name = strdup(src->name)) ||
      mml_bytes_append(&f->footer, src->footer.data, src->footer.len)) {
    mml_pq_close(f);
    return mml_err_set(err, MML_ENOMEM, "out of memory");
  }
  f->size = src->size, f->read = read, f->ctx = ctx, f->err = err, f->columns = src->columns;
  f->map = src->map;
  f->group = -1;
  f->lim = src->lim;
  mml_status st = parse_footer(f);
  if (st) {
    mml_pq_close(f);
    return st;
  }
  *out = f;
  return MML_OK;
}

void mml_pq_close(mml_pq_file *f) {
  if (!f) return;
  for (int i = 0; f->cols && i < f->nleaves; i++) pq_column_free(&f->cols[i]);
  free(f->cols);
  free(f->leaves);
  free(f->leaf_sel);
  free(f->group_first);
  mml_bytes_free(&f->footer);
  free_node(&f->root);
  pq_meta_free(&f->meta);
  mml_bytes_free(&f->json);
  mml_bytes_free(&f->names);
  free(f->blobs);
  free(f->blob_name_off);
  free(f->name);
  free(f);
}

int mml_pq_row_groups(const mml_pq_file *f) { return f->meta.ngroups; }
int64_t mml_pq_rows(const mml_pq_file *f) { return f->meta.num_rows; }
int64_t mml_pq_row_group_first(const mml_pq_file *f, int g) { return f->group_first[g]; }

int mml_pq_row_group_of(const mml_pq_file *f, int64_t row) {
  int lo = 0, hi = f->meta.ngroups - 1; /* the last group starting at or before row */
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    if (f->group_first[mid] <= row)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

void mml_pq_row_key(int g, int64_t row, char *out, size_t cap) {
  snprintf(out, cap, "row group %d, row %lld", g, (long long)row);
}
