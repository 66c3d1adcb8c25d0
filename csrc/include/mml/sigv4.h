/*
 * mml/sigv4.h — SHA-256, HMAC-SHA-256 and the AWS Signature Version 4 signer used by
 * fetch.c for S3 requests.  Pure functions: no threads, no globals, no allocation beyond
 * what the caller passes in, safe from any thread.
 *
 * Why our own signer rather than CURLOPT_AWS_SIGV4: OpenSSL headers are not guaranteed
 * on build machines, the signer must be testable against the published AWS vectors
 * without a network, and we need full control of what is signed (x-amz-content-sha256,
 * x-amz-security-token, the ListObjectsV2 query string) across libcurl versions.
 */
#ifndef MML_SIGV4_H
#define MML_SIGV4_H

#include "mml/common.h"

typedef struct mml_sha256_ctx {
  uint32_t h[8];
  uint64_t total; /* bytes hashed so far */
  uint8_t buf[64];
  size_t used; /* bytes waiting in buf */
} mml_sha256_ctx;

void mml_sha256_init(mml_sha256_ctx *c);
void mml_sha256_update(mml_sha256_ctx *c, const void *p, size_t n);
void mml_sha256_final(mml_sha256_ctx *c, uint8_t out[32]);
void mml_sha256(const void *p, size_t n, uint8_t out[32]);
void mml_hmac_sha256(const void *key, size_t klen, const void *msg, size_t n, uint8_t out[32]);
/* Lower-case hex of n bytes into out (2n+1 bytes with the terminating NUL). */
void mml_hex_lower(const uint8_t *p, size_t n, char *out);

/* SHA-256 of the empty body, the x-amz-content-sha256 value of every GET/HEAD we send. */
#define MML_SHA256_EMPTY "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* One header to sign: name in lower case, value already trimmed. */
typedef struct mml_sigv4_header {
  const char *name, *value;
} mml_sigv4_header;

typedef struct mml_sigv4_req {
  const char *method;              /* "GET", "HEAD" */
  const char *canonical_uri;       /* URI-encoded path, e.g. "/bucket/my%20key" */
  const char *canonical_query;     /* sorted, encoded "a=1&b=2", or "" */
  const mml_sigv4_header *headers; /* every signed header (host, x-amz-date, ...), any order */
  size_t nheaders;
  const char *payload_hash; /* hex SHA-256 of the body or "UNSIGNED-PAYLOAD" */
  const char *amz_date;     /* "YYYYMMDDTHHMMSSZ" */
  const char *region, *service;
  const char *access_key, *secret_key;
} mml_sigv4_req;

/* Writes the value of the Authorization header into out (cap bytes).  Fails with
 * MML_EINVAL when a field is missing or out is too small; the message never contains
 * the secret key. */
mml_status mml_sigv4_authorization(const mml_sigv4_req *r, char *out, size_t cap, mml_err *err);

/* Percent-encodes s per SigV4 (unreserved A-Z a-z 0-9 - _ . ~ kept; '/' kept when
 * keep_slash).  Appends to out (NUL-terminated). */
mml_status mml_uri_encode(const char *s, size_t n, int keep_slash, mml_bytes *out);

#endif
