/*
 * sigv4.c — SHA-256 (FIPS 180-4), HMAC-SHA-256 (RFC 2104) and the AWS Signature
 * Version 4 signer (canonical request -> string to sign -> derived key -> signature).
 *
 * Design: pure functions over caller-provided memory; no threads, no globals, no
 * allocation except the growable buffers the canonical request is built in.  Secrets
 * (the secret key and the derived signing keys) live only on the stack of
 * mml_sigv4_authorization and are wiped before it returns; messages never quote them.
 * Checked against the published AWS test vectors in tests/c/test-fetch.c and against
 * botocore's signer in tests/test_fetch.py.
 */
#include "mml/sigv4.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- SHA-256 ------------------------------------------------------------------ */

static const uint32_t k_sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha256_block(uint32_t h[8], const uint8_t *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 |
           (uint32_t)p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    uint32_t ch = (e & f) ^ (~e & g);
    uint32_t t1 = hh + S1 + ch + k_sha256_k[i] + w[i];
    uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    uint32_t t2 = S0 + maj;
    hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
}

void mml_sha256_init(mml_sha256_ctx *c) {
  static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(c->h, h0, sizeof h0);
  c->total = 0;
  c->used = 0;
}

void mml_sha256_update(mml_sha256_ctx *c, const void *data, size_t n) {
  const uint8_t *p = data;
  c->total += n;
  if (c->used) {
    size_t take = 64 - c->used < n ? 64 - c->used : n;
    memcpy(c->buf + c->used, p, take);
    c->used += take, p += take, n -= take;
    if (c->used < 64) return;
    sha256_block(c->h, c->buf);
    c->used = 0;
  }
  for (; n >= 64; p += 64, n -= 64) sha256_block(c->h, p);
  if (n) memcpy(c->buf, p, n), c->used = n;
}

void mml_sha256_final(mml_sha256_ctx *c, uint8_t out[32]) {
  uint64_t bits = c->total * 8;
  uint8_t pad[72] = {0x80};
  size_t padlen = (c->used < 56 ? 56 : 120) - c->used;
  uint8_t len[8];
  for (int i = 0; i < 8; i++) len[i] = (uint8_t)(bits >> (56 - 8 * i));
  mml_sha256_update(c, pad, padlen);
  mml_sha256_update(c, len, 8);
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (uint8_t)(c->h[i] >> 24);
    out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
    out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
    out[4 * i + 3] = (uint8_t)c->h[i];
  }
  memset(c, 0, sizeof *c);
}

void mml_sha256(const void *p, size_t n, uint8_t out[32]) {
  mml_sha256_ctx c;
  mml_sha256_init(&c);
  mml_sha256_update(&c, p, n);
  mml_sha256_final(&c, out);
}

void mml_hmac_sha256(const void *key, size_t klen, const void *msg, size_t n, uint8_t out[32]) {
  uint8_t k[64] = {0}, pad[64], inner[32];
  if (klen > 64)
    mml_sha256(key, klen, k);
  else
    memcpy(k, key, klen);
  mml_sha256_ctx c;
  for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
  mml_sha256_init(&c);
  mml_sha256_update(&c, pad, 64);
  mml_sha256_update(&c, msg, n);
  mml_sha256_final(&c, inner);
  for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
  mml_sha256_init(&c);
  mml_sha256_update(&c, pad, 64);
  mml_sha256_update(&c, inner, 32);
  mml_sha256_final(&c, out);
  memset(k, 0, sizeof k);
  memset(pad, 0, sizeof pad);
}

void mml_hex_lower(const uint8_t *p, size_t n, char *out) {
  static const char d[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) out[2 * i] = d[p[i] >> 4], out[2 * i + 1] = d[p[i] & 15];
  out[2 * n] = 0;
}

/* ---- SigV4 ------------------------------------------------------------------------ */

mml_status mml_uri_encode(const char *s, size_t n, int keep_slash, mml_bytes *out) {
  static const char d[] = "0123456789ABCDEF";
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    int keep = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
               ch == '-' || ch == '_' || ch == '.' || ch == '~' || (keep_slash && ch == '/');
    char enc[3] = {(char)ch, 0, 0};
    size_t len = 1;
    if (!keep) enc[0] = '%', enc[1] = d[ch >> 4], enc[2] = d[ch & 15], len = 3;
    if (mml_bytes_append(out, enc, len)) return MML_ENOMEM;
  }
  if (mml_bytes_reserve(out, out->len + 1)) return MML_ENOMEM;
  out->data[out->len] = 0;
  return MML_OK;
}

static int header_cmp(const void *a, const void *b) {
  return strcmp(((const mml_sigv4_header *)a)->name, ((const mml_sigv4_header *)b)->name);
}

static mml_status put(mml_bytes *b, const char *s) { return mml_bytes_append(b, s, strlen(s)); }

mml_status mml_sigv4_authorization(const mml_sigv4_req *r, char *out, size_t cap, mml_err *err) {
  if (!r || !r->method || !r->canonical_uri || !r->payload_hash || !r->amz_date ||
      strlen(r->amz_date) != 16 || !r->region || !r->service || !r->access_key || !r->secret_key ||
      !*r->access_key || !r->nheaders || r->nheaders > 16)
    return mml_err_set(err, MML_EINVAL, "sigv4: incomplete request or credentials");
  mml_sigv4_header hs[16];
  memcpy(hs, r->headers, r->nheaders * sizeof *hs);
  qsort(hs, r->nheaders, sizeof *hs, header_cmp);

  mml_bytes creq = {0}, names = {0};
  mml_status st = MML_OK;
  st |= put(&creq, r->method), st |= put(&creq, "\n");
  st |= put(&creq, r->canonical_uri), st |= put(&creq, "\n");
  st |= put(&creq, r->canonical_query ? r->canonical_query : ""), st |= put(&creq, "\n");
  for (size_t i = 0; i < r->nheaders; i++) {
    st |= put(&creq, hs[i].name), st |= put(&creq, ":"), st |= put(&creq, hs[i].value);
    st |= put(&creq, "\n");
    if (i) st |= put(&names, ";");
    st |= put(&names, hs[i].name);
  }
  st |= put(&creq, "\n");
  st |= mml_bytes_append(&names, "", 1); /* NUL */
  st |= mml_bytes_append(&creq, names.data ? (const char *)names.data : "",
                         names.len ? names.len - 1 : 0);
  st |= put(&creq, "\n");
  st |= put(&creq, r->payload_hash);
  if (st != MML_OK) {
    mml_bytes_free(&creq), mml_bytes_free(&names);
    return mml_err_set(err, MML_ENOMEM, "sigv4: out of memory");
  }

  uint8_t dig[32];
  char creq_hex[65], date[9], scope[256], sts[512];
  mml_sha256(creq.data, creq.len, dig);
  mml_hex_lower(dig, 32, creq_hex);
  memcpy(date, r->amz_date, 8);
  date[8] = 0;
  snprintf(scope, sizeof scope, "%s/%s/%s/aws4_request", date, r->region, r->service);
  int nsts =
      snprintf(sts, sizeof sts, "AWS4-HMAC-SHA256\n%s\n%s\n%s", r->amz_date, scope, creq_hex);

  /* kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), service), "aws4_request") */
  size_t slen = strlen(r->secret_key);
  char *k0 = malloc(slen + 5);
  if (!k0) {
    mml_bytes_free(&creq), mml_bytes_free(&names);
    return mml_err_set(err, MML_ENOMEM, "sigv4: out of memory");
  }
  memcpy(k0, "AWS4", 4);
  memcpy(k0 + 4, r->secret_key, slen + 1);
  uint8_t k[32], sig[32];
  char sig_hex[65];
  mml_hmac_sha256(k0, slen + 4, date, 8, k);
  memset(k0, 0, slen + 4);
  free(k0);
  mml_hmac_sha256(k, 32, r->region, strlen(r->region), k);
  mml_hmac_sha256(k, 32, r->service, strlen(r->service), k);
  mml_hmac_sha256(k, 32, "aws4_request", 12, k);
  mml_hmac_sha256(k, 32, sts, (size_t)nsts, sig);
  memset(k, 0, sizeof k);
  mml_hex_lower(sig, 32, sig_hex);

  int n = snprintf(out, cap, "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s",
                   r->access_key, scope, (const char *)names.data, sig_hex);
  mml_bytes_free(&creq), mml_bytes_free(&names);
  if (n < 0 || (size_t)n >= cap)
    return mml_err_set(err, MML_EINVAL, "sigv4: Authorization header does not fit %zu bytes", cap);
  return MML_OK;
}
