/*
 * mml/fetch_sync.h — blocking calls on a fetcher (index building, listing, tests): submit
 * and wait.  Refused (MML_EINVAL) from a completion callback.
 */
#ifndef MML_FETCH_SYNC_H
#define MML_FETCH_SYNC_H

#include "mml/fetch.h"

/* Blocking convenience built on submit (for index building, listing, tests). */
mml_status mml_fetch_get(mml_fetcher *f, const char *url, int64_t off, int64_t len, mml_bytes *out,
                         mml_err *err);

/* Object size (HEAD). */
mml_status mml_fetch_size(mml_fetcher *f, const char *url, int64_t *size, mml_err *err);
/* Object size and ETag (HEAD; etag "" when the server sent none), etag_cap bytes. */
mml_status mml_fetch_stat(mml_fetcher *f, const char *url, int64_t *size, char *etag,
                          size_t etag_cap, mml_err *err);

/* The general form: query is an encoded canonical query for S3 (listings; NULL for a
 * plain GET); head asks for the size (HEAD) and returns it as one int64 in *out. */
mml_status mml_fetch_get_query(mml_fetcher *f, const char *url, const char *query, int64_t off,
                               int64_t len, int head, mml_bytes *out, mml_err *err);

#endif
