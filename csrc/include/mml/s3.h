/*
 * mml/s3.h — S3 addressing, ListObjectsV2 listing and the XML reading it needs.
 * Transfers and SigV4 signing are the fetcher's (mml/fetch.h, mml/sigv4.h).
 */
#ifndef MML_S3_H
#define MML_S3_H

#include "mml/fetch.h"

/* Lists objects under an s3:// prefix (ListObjectsV2 with pagination) whose keys match
 * the glob `pattern`; returns malloc'd "s3://bucket/key" strings, sorted.
 * Free with mml_fetch_list_free.  Globs follow fnmatch(3) with FNM_PATHNAME (`*` stops at
 * '/').  pattern may be:
 *   NULL            all keys under the prefix; when the prefix itself holds a wildcard
 *                   ("s3://b/dir/train-*.jsonl") it is listed up to the wildcard and the
 *                   whole key must match it;
 *   "s3://b/..."    matched against the whole URL;
 *   anything else   matched against the key after the prefix's directory (the part of
 *                   the key up to its last '/'): prefix "s3://b/dir/", pattern "*.jsonl". */
mml_status mml_fetch_list(mml_fetcher *f, const char *s3_prefix, const char *pattern, char ***urls,
                          size_t *n, mml_err *err);
void mml_fetch_list_free(char **urls, size_t n);

/* Where an s3:// URL is fetched from.  No endpoint (NULL/""): AWS, virtual-host style
 * https://BUCKET.s3.REGION.amazonaws.com/KEY (path style for dotted bucket names); an
 * endpoint ("http://127.0.0.1:9000"): path style ENDPOINT/BUCKET/KEY.  The key is
 * percent-encoded once (S3's canonical URI); query, when given, is appended as is. */
typedef struct mml_s3_addr {
  char *http_url, *host, *canonical_uri; /* malloc'd */
} mml_s3_addr;
mml_status mml_s3_address(const char *s3url, const char *query, const char *region,
                          const char *endpoint, mml_s3_addr *out, mml_err *err);
void mml_s3_addr_free(mml_s3_addr *a);
/* The parts of the above: "s3://bucket/key" split into bucket (pointer + length) and key
 * (shown names the URL in messages); the request line of bucket/key (+ encoded query). */
mml_status mml_s3_split(const char *url, const char **bucket, size_t *blen, const char **key,
                        const char *shown, mml_err *err);
mml_status mml_s3_address_parts(const char *region, const char *endpoint, const char *bucket,
                                size_t blen, const char *key, const char *query, mml_s3_addr *out,
                                mml_err *err);

/* Text of the first <tag>...</tag> in an XML document, entity-decoded, into out (cap
 * bytes, NUL-terminated); 1 when found, else 0 with out = "". */
int mml_xml_text(const char *doc, size_t n, const char *tag, char *out, size_t cap);

#endif
