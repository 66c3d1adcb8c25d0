/*
 * parquet_int.h — private to the Parquet reader (parquet_thrift.c: the Thrift compact
 * protocol and the footer/page-header structures; parquet_chunk.c: a column chunk's
 * pages into levels and values; parquet_file.c: the schema tree, the footer, row
 * assembly into JSON).  The public contract is mml/parquet.h.
 */
#ifndef MML_PARQUET_INT_H
#define MML_PARQUET_INT_H

#include "mml/parquet.h"

/* Parquet's enums (parquet.thrift) */
enum { PQ_BOOLEAN = 0, PQ_INT32 = 1, PQ_INT64 = 2, PQ_INT96 = 3, PQ_FLOAT = 4, PQ_DOUBLE = 5 };
enum { PQ_BYTE_ARRAY = 6, PQ_FIXED_LEN_BYTE_ARRAY = 7 };
enum { PQ_REQUIRED = 0, PQ_OPTIONAL = 1, PQ_REPEATED = 2 };
enum { PQ_CONV_UTF8 = 0, PQ_CONV_MAP = 1, PQ_CONV_MAP_KV = 2, PQ_CONV_LIST = 3, PQ_CONV_ENUM = 4 };
enum { PQ_CONV_JSON = 19 };
enum { PQ_PLAIN = 0, PQ_PLAIN_DICT = 2, PQ_RLE = 3, PQ_BIT_PACKED = 4, PQ_RLE_DICT = 8 };
enum { PQ_UNCOMPRESSED = 0, PQ_SNAPPY = 1, PQ_GZIP = 2, PQ_ZSTD = 6 };
enum { PQ_DATA_PAGE = 0, PQ_INDEX_PAGE = 1, PQ_DICT_PAGE = 2, PQ_DATA_PAGE_V2 = 3 };
/* logical types (the LogicalType union's field ids) we tell apart */
enum { PQ_LOGICAL_STRING = 1, PQ_LOGICAL_MAP = 2, PQ_LOGICAL_LIST = 3, PQ_LOGICAL_JSON = 12 };

typedef struct pq_schema_el {
  char *name;
  int type; /* physical type, -1 for a group */
  int repetition;
  int num_children;
  int converted; /* -1: none */
  int logical;   /* -1: none */
} pq_schema_el;

typedef struct pq_chunk_meta {
  int type, codec;
  char **path; /* path_in_schema */
  int npath;
  int64_t num_values, total_compressed, total_uncompressed;
  int64_t data_page_offset, dict_page_offset; /* dict: -1 when none */
} pq_chunk_meta;

typedef struct pq_row_group {
  pq_chunk_meta *cols;
  int ncols;
  int64_t num_rows;
} pq_row_group;

typedef struct pq_meta {
  pq_schema_el *schema;
  int nschema;
  int64_t num_rows;
  pq_row_group *groups;
  int ngroups;
} pq_meta;

typedef struct pq_page_header {
  int type;
  int32_t uncompressed, compressed;
  int32_t num_values;       /* data pages v1/v2, dictionary pages */
  int encoding;             /* of the values */
  int def_enc, rep_enc;     /* v1: RLE or BIT_PACKED */
  int32_t def_len, rep_len; /* v2: byte lengths of the (uncompressed) levels */
  int v2_compressed;        /* v2: is_compressed (default 1) */
} pq_page_header;

/* Parse the footer's FileMetaData / a page header from [p, p + n); *used: bytes read. */
mml_status pq_parse_meta(const uint8_t *p, size_t n, pq_meta *m, mml_err *err);
mml_status pq_parse_page_header(const uint8_t *p, size_t n, pq_page_header *h, size_t *used,
                                mml_err *err);
void pq_meta_free(pq_meta *m);

/* A byte array value (a view into a page buffer or the dictionary). */
typedef struct pq_val {
  const uint8_t *p;
  uint32_t len;
  union {
    int64_t i;
    double d;
  } n; /* numbers and booleans */
} pq_val;

/* One column chunk, decoded page by page as the rows being assembled reach it: a level
 * pair per decoded entry and a value per non-null one (parquet_chunk.c). */
typedef struct pq_column {
  int max_def, max_rep, type;
  int16_t *def, *rep;
  int64_t n; /* entries decoded so far */
  pq_val *vals;
  int64_t nvals;
  mml_bytes *bufs; /* windows read and pages decompressed: the values point into them */
  int nbufs, bufs_cap;
  int64_t pos, vpos; /* assembly cursors: next entry, next value */
  /* the chunk's pages still to decode (pq_column_begin, pq_column_more) */
  const pq_chunk_meta *cm;
  int64_t next, end;   /* file offsets: the next page's header, the chunk's end */
  int win, win_pinned; /* bufs[win]: the window last read (-1: none); values point into it */
  int64_t win_off;     /* its file offset (its length: bufs[win].len) */
  int64_t win_size;    /* the next window's size (doubling up to PQ_WINDOW_MAX) */
  pq_val *dict;        /* the dictionary page's values, ndict of them */
  int64_t ndict, cap, budget, used;
} pq_column;

/* Windows: a column chunk is read from its start in windows of PQ_WINDOW_MIN bytes, each
 * twice the last up to PQ_WINDOW_MAX, and at least the page at its start (a page cut by
 * a window's end starts the next one): a row needs the pages up to its own, not the
 * chunk. */
#define PQ_WINDOW_MIN ((int64_t)1 << 20)
#define PQ_WINDOW_MAX ((int64_t)16 << 20)

/* Sets c to decode chunk `cm` (c zeroed or freed before; its levels and type set). */
void pq_column_begin(pq_column *c, const pq_chunk_meta *cm, int64_t max_bytes);
/* Decodes c's next data page that holds entries (reading the windows it needs through
 * `read`): *got = 1; at the chunk's end *got = 0 (and its entries must be the footer's
 * count, else MML_ERECORD).  Errors name the page's byte offset. */
mml_status pq_column_more(pq_column *c, mml_pq_read_fn read, void *ctx, int *got, mml_err *err);
/* The bytes c holds (its buffers, levels and values). */
int64_t pq_column_held(const pq_column *c);
void pq_column_free(pq_column *c);

/* Checks a column chunk's metadata against the schema and the file (codec, type, byte
 * range within the file before its footer and within max_chunk_bytes, value count):
 * parquet_rows.c, called for every chunk when the file is opened. */
mml_status pq_check_chunk(const mml_pq_file *f, int g, int k, mml_err *err);

/* ---- the file and its schema tree (parquet_file.c; rows: parquet_rows.c) ---- */

enum { K_LEAF, K_STRUCT, K_LIST, K_IMAGE };

typedef struct pq_node {
  const pq_schema_el *el;
  struct pq_node *child; /* nchild nodes */
  int nchild, kind, def, rep;
  int leaf;       /* K_LEAF: its column index */
  int first;      /* its first leaf column */
  int nleaves;    /* leaf columns under it */
  int string;     /* K_LEAF BYTE_ARRAY: a string (else binary) */
  int selected;   /* top-level field to read (and everything under it) */
  const char *as; /* top-level: its key in the record (its name, or the map's) */
} pq_node;

struct mml_pq_file {
  char *name;
  int64_t size;
  mml_pq_read_fn read;
  void *ctx;
  mml_pq_limits lim;
  const char *const *columns; /* as opened (the caller's, outliving the file) */
  const char *const *map;     /* column -> name pairs, or NULL (mml_pq_open_mapped) */
  mml_bytes footer;           /* the FileMetaData's bytes (mml_pq_clone parses them again) */
  int64_t *group_first;       /* ngroups + 1: the file's row number each row group starts at */
  pq_meta meta;
  pq_node root;
  int nleaves;
  pq_node **leaves;   /* nleaves: each leaf column's node */
  uint8_t *leaf_sel;  /* nleaves: 1 when under a read field */
  pq_column *cols;    /* one per leaf, for the row group being read */
  int group;          /* the row group begun (mml_pq_group_begin), -1: none */
  int64_t group_next; /* the file's row its next row assembled is */
  int col_failed;     /* a column's page failed to decode (its error names the column) */
  mml_bytes json, names;
  char key[64];
  int nblobs, blobs_cap;
  mml_pq_blob *blobs;
  size_t *blob_name_off;
  mml_err *err;
};

#endif
