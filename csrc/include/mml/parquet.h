/*
 * mml/parquet.h — a scoped Parquet reader: the files the Hugging Face `datasets` library
 * and pyarrow write by default (the Hub's multimodal shards), read row group by row
 * group, each row turned into one JSON record plus the binary blobs (images, videos) it
 * embeds.
 *
 * What it reads (anything else is refused with MML_ERECORD naming the file, the row
 * group, the column and the feature):
 *   - the Thrift compact footer (FileMetaData) and page headers;
 *   - physical types BOOLEAN, INT32, INT64, FLOAT, DOUBLE, BYTE_ARRAY;
 *   - nesting: optional/required fields, structs, LIST-annotated lists (the 3-level form
 *     pyarrow writes, and bare repeated fields), any depth up to MML_PQ_MAX_DEPTH;
 *   - encodings PLAIN, PLAIN_DICTIONARY / RLE_DICTIONARY (values), RLE / bit-packed
 *     hybrid (levels), data pages v1 and v2, dictionary pages;
 *   - codecs UNCOMPRESSED, SNAPPY (libsnappy's C API), GZIP (zlib), ZSTD (libzstd).
 *
 * Rows as records: a row is a JSON object of its top-level fields (those `columns`
 * names, when given).  Strings are JSON strings, numbers and booleans JSON's, a struct
 * an object, a list an array, a null null.  A struct of exactly the fields {bytes,
 * path} (the `datasets` Image and Video features) is a reference: the name of the blob
 * holding its bytes when they are present (`<key>.<k>.<ext>`, ext told from the bytes:
 * jpg, png, webp, gif, bmp, tif, mp4, webm, mkv, avi, else bin), else its path string,
 * else null.  A BYTE_ARRAY elsewhere without a string annotation is refused (no
 * silent re-encoding of binary data).
 *
 * Limits (hostile files): every size comes from the file and is checked before it is
 * allocated or read: the footer (within the file, at most max_chunk_bytes), each column
 * chunk's stored size and each page's stored and decoded sizes (at most
 * max_chunk_bytes), a row group's values (at most max_chunk_bytes / 16 per column) and
 * rows; Thrift structures nest at most MML_PQ_MAX_DEPTH deep; a malformed page or
 * footer is MML_ERECORD naming the byte offset.
 *
 * Threads: a mml_pq_file is read by one thread at a time (mml_pq_clone gives each thread
 * its own); its metadata functions (row groups, rows) may be called from any thread once
 * it is open.  Reads go through the caller's read function (a local pread, a ranged GET),
 * by windows of a column chunk's pages as the rows being assembled need them (1 MiB,
 * doubling up to 16 MiB, at least the page a window starts with).
 */
#ifndef MML_PARQUET_H
#define MML_PARQUET_H

#include "mml/common.h"

#define MML_PQ_MAX_DEPTH 32

/* Reads [off, off + len) of the file into out (exactly len bytes, or an error). */
typedef mml_status (*mml_pq_read_fn)(void *ctx, int64_t off, int64_t len, mml_bytes *out,
                                     mml_err *err);

typedef struct mml_pq_limits {
  int64_t max_chunk_bytes; /* a footer, column chunk or page; 0: 256 MiB */
  int64_t max_rows;        /* rows in the file; 0: none */
} mml_pq_limits;

typedef struct mml_pq_file mml_pq_file;

/* Parses the footer of a file of `size` bytes named `name` (for messages).  `columns`:
 * the top-level fields to read (NULL-terminated; NULL: all; the caller's array, which
 * must outlive the file and its clones).  Fields not named are never read.  Every read
 * column chunk of every row group is checked from the footer here (its byte range within
 * the file and max_chunk_bytes, its codec, its type against the schema): a file whose
 * metadata is wrong is refused now, before any row is read. */
mml_status mml_pq_open(const char *name, int64_t size, mml_pq_read_fn read, void *ctx,
                       const char *const *columns, const mml_pq_limits *lim, mml_pq_file **out,
                       mml_err *err);
/* The same, with a dataset's own column names: `map` holds pairs {column, name, ...,
 * NULL} (the caller's, outliving the file): top-level column `column` is read as if it
 * were called `name` (its key in the row's record; `columns` selects by that name), and a
 * column whose own name is some pair's `name` is then not read.  A pair whose column is
 * not in the file is refused (MML_ECONFIG naming it and the file's columns). */
mml_status mml_pq_open_mapped(const char *name, int64_t size, mml_pq_read_fn read, void *ctx,
                              const char *const *columns, const char *const *map,
                              const mml_pq_limits *lim, mml_pq_file **out, mml_err *err);
/* A second handle on the same file, reading through `read`/`ctx`: the footer kept by `src`
 * parsed again (no read), so several threads can each read row groups through their own
 * handle.  src is only read. */
mml_status mml_pq_clone(const mml_pq_file *src, mml_pq_read_fn read, void *ctx, mml_pq_file **out,
                        mml_err *err);
void mml_pq_close(mml_pq_file *f);
int mml_pq_row_groups(const mml_pq_file *f);
int64_t mml_pq_rows(const mml_pq_file *f);
/* The file's row number row group g starts at (g == row groups: the number of rows). */
int64_t mml_pq_row_group_first(const mml_pq_file *f, int g);
/* The row group holding the file's row `row` (0 <= row < mml_pq_rows). */
int mml_pq_row_group_of(const mml_pq_file *f, int64_t row);
/* The byte range [*off, *off + *len) row group g's read columns occupy in the file. */
void mml_pq_row_group_range(const mml_pq_file *f, int g, int64_t *off, int64_t *len);

/* A row's embedded blob: its name (as the record refers to it) and bytes. */
typedef struct mml_pq_blob {
  const char *name;
  const uint8_t *data;
  size_t len;
} mml_pq_blob;

/* Called per row of a row group in order: `row` is the file's row number, `key` the
 * row's name ("row group G, row R"), json its record (NUL-terminated) and blobs its
 * embedded bytes (all valid during the call only). */
typedef mml_status (*mml_pq_row_fn)(void *ctx, int64_t row, const char *key, const char *json,
                                    size_t len, const mml_pq_blob *blobs, int nblobs, mml_err *err);

/* Reads row group g (its column chunks through the read function) and calls fn per row.
 * Stops with MML_ECANCELLED soon after *cancel is set (NULL: never). */
mml_status mml_pq_read_row_group(mml_pq_file *f, int g, mml_pq_row_fn fn, void *ctx,
                                 const mml_cancel *cancel, mml_err *err);

/* The same a few rows at a time: mml_pq_group_begin(g) (nothing read yet), then
 * mml_pq_group_rows(upto) calls fn for the group's next rows up to the file's row `upto`
 * (exclusive), reading and decoding only the pages those rows reach; the group's last
 * row is delivered only once every column is consumed exactly.  A failure fails the row
 * it surfaced at; call no further rows then.  The blobs' bytes handed to fn stay valid
 * until mml_pq_group_end (or the next begin, or the close), which releases the group's
 * buffers; the JSON and the names only during the call. */
mml_status mml_pq_group_begin(mml_pq_file *f, int g, mml_err *err);
mml_status mml_pq_group_rows(mml_pq_file *f, int64_t upto, mml_pq_row_fn fn, void *ctx,
                             const mml_cancel *cancel, mml_err *err);
/* The bytes the group begun holds (windows read, pages decoded, levels, values). */
int64_t mml_pq_group_held(const mml_pq_file *f);
void mml_pq_group_end(mml_pq_file *f);

/* The key of a row: "row group G, row R" into out (cap bytes). */
void mml_pq_row_key(int g, int64_t row, char *out, size_t cap);

#endif
