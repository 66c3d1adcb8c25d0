/*
 * datauri.c — decoding of data: URI image references (see mml/datauri.h): header checks,
 * then a base64 decoder with the semantics of CPython's binascii.a2b_base64 (what
 * base64.b64decode in the reference pipelines runs), writing straight into the sample's
 * image buffer.
 *
 * Threads: pure; the output buffer belongs to the caller (a task's image slot).
 */
#include "mml/datauri.h"

#include <string.h>
#include <strings.h>

int mml_is_data_uri(const char *ref) { return ref && !strncasecmp(ref, "data:", 5); }

/* Value of a base64 symbol, 64 for '=', 255 for anything else. */
static inline unsigned b64v(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  return c == '+' ? 62 : c == '/' ? 63 : c == '=' ? 64 : 255;
}

mml_status mml_data_uri_decode(const char *ref, mml_bytes *out, mml_err *err) {
  mml_bytes_clear(out);
  if (!mml_is_data_uri(ref)) return mml_err_set(err, MML_EINVAL, "not a data: URI");
  const char *meta = ref + 5, *comma = strchr(meta, ',');
  if (!comma) return mml_err_set(err, MML_EDECODE, "data: URI without a comma before the data");
  size_t mlen = (size_t)(comma - meta);
  /* media type: up to the first ';' (empty means text/plain in RFC 2397; accept it, the
   * bytes decide) */
  const char *semi = memchr(meta, ';', mlen);
  size_t tlen = semi ? (size_t)(semi - meta) : mlen;
  if (tlen && (tlen < 6 || strncasecmp(meta, "image/", 6)))
    return mml_err_set(err, MML_EUNSUPPORTED, "data: URI of type %.*s is not an image",
                       (int)(tlen > 64 ? 64 : tlen), meta);
  if (mlen < 7 || strncasecmp(comma - 7, ";base64", 7))
    return mml_err_set(err, MML_EUNSUPPORTED,
                       "data: URI is not base64-encoded (only \";base64,\" payloads are read)");
  const unsigned char *p = (const unsigned char *)comma + 1;
  size_t n = strlen((const char *)p);
  if (mml_bytes_reserve(out, n / 4 * 3 + 3))
    return mml_err_set(err, MML_ENOMEM, "data: URI: out of memory for %zu bytes", n / 4 * 3);
  /* CPython's binascii.a2b_base64 (non-strict), step by step: bytes outside the alphabet
   * are skipped, '=' before the third symbol of a quad is skipped, a quad completed by
   * padding ends the data (what follows is ignored). */
  uint8_t *o = out->data;
  unsigned left = 0, quad = 0, pads = 0;
  size_t nsym = 0;
  int ended = 0;
  for (size_t i = 0; i < n && !ended; i++) {
    unsigned v = b64v(p[i]);
    if (v == 64) {
      if (quad >= 2 && quad + ++pads >= 4) ended = 1;
      continue;
    }
    if (v == 255) continue;
    pads = 0;
    nsym++;
    switch (quad) {
      case 0:
        left = v;
        quad = 1;
        break;
      case 1:
        *o++ = (uint8_t)(left << 2 | v >> 4);
        left = v & 15;
        quad = 2;
        break;
      case 2:
        *o++ = (uint8_t)(left << 4 | v >> 2);
        left = v & 3;
        quad = 3;
        break;
      default:
        *o++ = (uint8_t)(left << 6 | v);
        quad = 0;
        break;
    }
  }
  if (!ended && quad == 1)
    return mml_err_set(err, MML_EDECODE,
                       "data: URI: bad base64 (%zu symbols, 1 more than a multiple of 4)", nsym);
  if (!ended && quad)
    return mml_err_set(err, MML_EDECODE, "data: URI: bad base64 padding (truncated payload?)");
  out->len = (size_t)(o - out->data);
  if (!out->len) return mml_err_set(err, MML_EDECODE, "data: URI with an empty payload");
  return MML_OK;
}
