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

/* The same, also returning MML_ECANCELLED within ~50 ms once `cancel` is set (the
 * fetcher's own flag always counts); for work stopped on its own, e.g. an index build. */
mml_status mml_fetch_get_cancellable(mml_fetcher *f, const char *url, int64_t off, int64_t len,
                                     const mml_cancel *cancel, mml_bytes *out, mml_err *err);

/* The same, with the object's whole size as the reply declared it (Content-Range's total,
 * or the length of a 200 with the whole object) in *total; -1 when it did not say
 * (a 206 whose Content-Range total is "*"). */
mml_status mml_fetch_get_sized(mml_fetcher *f, const char *url, int64_t off, int64_t len,
                               mml_bytes *out, int64_t *total, mml_err *err);

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
