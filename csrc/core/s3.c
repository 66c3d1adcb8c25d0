/*
 * s3.c — S3 without the transfer loop: where an s3:// URL is fetched from (virtual-host
 * or path style, region, custom endpoint), ListObjectsV2 listing with pagination and
 * globbing (blocking, through fetch_sync.c), and the small XML reading it needs.  Signing
 * happens per transfer in fetch_loop.c (mml/sigv4.h).  Pure functions except
 * mml_fetch_list, which runs on the caller's thread.
 */
#include "mml/s3.h"

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fetch_loop.h"
#include "mml/fetch_sync.h"
#include "mml/sigv4.h"

#define LIST_MAX_PAGES 100000

/* ---- S3 addressing ------------------------------------------------------------------ */

static int bucket_ok(const char *b, size_t n) {
  if (n == 0 || n > 255) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = b[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '-' || c == '_'))
      return 0;
  }
  return 1;
}

mml_status mml_s3_split(const char *url, const char **bucket, size_t *blen, const char **key,
                       const char *shown, mml_err *err) {
  if (strncmp(url, "s3://", 5)) return mml_err_set(err, MML_EINVAL, "%s: not an s3:// URL", shown);
  const char *b = url + 5, *sl = strchr(b, '/');
  size_t n = sl ? (size_t)(sl - b) : strlen(b);
  if (!bucket_ok(b, n)) return mml_err_set(err, MML_EINVAL, "%s: bad bucket name", shown);
  *bucket = b, *blen = n, *key = sl ? sl + 1 : "";
  return MML_OK;
}

mml_status mml_s3_address_parts(const char *region, const char *endpoint, const char *bucket,
                               size_t blen, const char *key, const char *query,
                               mml_s3_addr *out, mml_err *err) {
  mml_bytes path = {0}, url = {0};
  char host[512];
  int path_style = endpoint != NULL || memchr(bucket, '.', blen) != NULL;
  memset(out, 0, sizeof *out);
  if (endpoint) {
    const char *h = strstr(endpoint, "://");
    h = h ? h + 3 : endpoint;
    size_t hl = strcspn(h, "/");
    if (hl == 0 || hl >= sizeof host) return mml_err_set(err, MML_ECONFIG, "S3 endpoint has no host");
    memcpy(host, h, hl), host[hl] = 0;
  } else if (path_style) { /* dotted bucket names break the TLS wildcard certificate */
    snprintf(host, sizeof host, "s3.%s.amazonaws.com", region);
  } else {
    snprintf(host, sizeof host, "%.*s.s3.%s.amazonaws.com", (int)blen, bucket, region);
  }
  mml_status st = MML_OK;
  st |= mml_bytes_append(&path, "/", 1);
  if (path_style) {
    st |= mml_uri_encode(bucket, blen, 0, &path);
    if (*key || !query) st |= mml_bytes_append(&path, "/", 1);
  }
  st |= mml_uri_encode(key, strlen(key), 1, &path);
  if (st) goto oom;
  if (endpoint) {
    const char *h = strstr(endpoint, "://");
    if (h) st |= mml_bytes_append(&url, endpoint, (size_t)(h - endpoint) + 3);
    else st |= mml_bytes_append(&url, "https://", 8);
  } else {
    st |= mml_bytes_append(&url, "https://", 8);
  }
  st |= mml_bytes_append(&url, host, strlen(host));
  st |= mml_bytes_append(&url, path.data, path.len);
  if (query && *query) {
    st |= mml_bytes_append(&url, "?", 1);
    st |= mml_bytes_append(&url, query, strlen(query));
  }
  st |= mml_bytes_append(&url, "", 1);
  if (st) goto oom;
  out->http_url = (char *)url.data;
  out->canonical_uri = (char *)path.data;
  out->host = dupstr(host);
  if (!out->host) {
    mml_s3_addr_free(out);
    return mml_err_set(err, MML_ENOMEM, "out of memory");
  }
  return MML_OK;
oom:
  mml_bytes_free(&path), mml_bytes_free(&url);
  return mml_err_set(err, MML_ENOMEM, "out of memory");
}

void mml_s3_addr_free(mml_s3_addr *a) {
  if (!a) return;
  free(a->http_url), free(a->host), free(a->canonical_uri);
  memset(a, 0, sizeof *a);
}

mml_status mml_s3_address(const char *s3url, const char *query, const char *region,
                          const char *endpoint, mml_s3_addr *out, mml_err *err) {
  const char *b, *k;
  size_t bl;
  if (!s3url || !out) return mml_err_set(err, MML_EINVAL, "s3 address: NULL argument");
  mml_status st = mml_s3_split(s3url, &b, &bl, &k, s3url, err);
  if (st) return st;
  return mml_s3_address_parts(region && *region ? region : "us-east-1", endpoint && *endpoint ? endpoint : NULL,
                          b, bl, k, query, out, err);
}

/* ---- ListObjectsV2 ------------------------------------------------------------------------ */

/* Decodes the five XML entities and numeric references of s[0..n) into out. */
static size_t xml_decode(const char *s, size_t n, char *out, size_t cap) {
  size_t o = 0;
  for (size_t i = 0; i < n && o + 4 < cap;) {
    if (s[i] != '&') {
      out[o++] = s[i++];
      continue;
    }
    const char *semi = memchr(s + i, ';', n - i < 12 ? n - i : 12);
    if (!semi) {
      out[o++] = s[i++];
      continue;
    }
    size_t el = (size_t)(semi - (s + i)) + 1;
    const char *ent = s + i + 1;
    unsigned long cp = 0;
    int ok = 1;
    if (!strncmp(ent, "amp;", 4)) cp = '&';
    else if (!strncmp(ent, "lt;", 3)) cp = '<';
    else if (!strncmp(ent, "gt;", 3)) cp = '>';
    else if (!strncmp(ent, "quot;", 5)) cp = '"';
    else if (!strncmp(ent, "apos;", 5)) cp = '\'';
    else if (ent[0] == '#') cp = ent[1] == 'x' ? strtoul(ent + 2, NULL, 16) : strtoul(ent + 1, NULL, 10);
    else ok = 0;
    if (!ok || cp == 0 || cp > 0x10FFFF) {
      out[o++] = s[i++];
      continue;
    }
    if (cp < 0x80) out[o++] = (char)cp;
    else if (cp < 0x800) out[o++] = (char)(0xC0 | cp >> 6), out[o++] = (char)(0x80 | (cp & 63));
    else if (cp < 0x10000)
      out[o++] = (char)(0xE0 | cp >> 12), out[o++] = (char)(0x80 | ((cp >> 6) & 63)),
      out[o++] = (char)(0x80 | (cp & 63));
    else
      out[o++] = (char)(0xF0 | cp >> 18), out[o++] = (char)(0x80 | ((cp >> 12) & 63)),
      out[o++] = (char)(0x80 | ((cp >> 6) & 63)), out[o++] = (char)(0x80 | (cp & 63));
    i += el;
  }
  out[o] = 0;
  return o;
}

/* Finds the next <tag>...</tag> in doc[0..n) from *pos; returns a pointer to the raw text
 * and its length, advancing *pos past the close tag.  NULL when absent. */
static const char *xml_next(const char *doc, size_t n, size_t *pos, const char *tag, size_t *len) {
  char open[64], close[64];
  int ol = snprintf(open, sizeof open, "<%s>", tag), cl = snprintf(close, sizeof close, "</%s>", tag);
  const char *end = doc + n;
  const char *p = doc + *pos;
  while (p < end) {
    const char *a = memmem(p, (size_t)(end - p), open, (size_t)ol);
    if (!a) return NULL;
    a += ol;
    const char *b = memmem(a, (size_t)(end - a), close, (size_t)cl);
    if (!b) return NULL;
    *pos = (size_t)(b - doc) + (size_t)cl;
    *len = (size_t)(b - a);
    return a;
  }
  return NULL;
}

int mml_xml_text(const char *doc, size_t n, const char *tag, char *out, size_t cap) {
  size_t pos = 0, len;
  const char *t = xml_next(doc, n, &pos, tag, &len);
  if (!t) {
    out[0] = 0;
    return 0;
  }
  xml_decode(t, len, out, cap);
  return 1;
}

void mml_fetch_list_free(char **urls, size_t n) {
  if (!urls) return;
  for (size_t i = 0; i < n; i++) free(urls[i]);
  free(urls);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int has_glob(const char *s) { return strpbrk(s, "*?[") != NULL; }

mml_status mml_fetch_list(mml_fetcher *f, const char *s3_prefix, const char *pattern,
                          char ***urls, size_t *n, mml_err *err) {
  if (!f || !s3_prefix || !urls || !n) return mml_err_set(err, MML_EINVAL, "fetch_list: NULL argument");
  *urls = NULL, *n = 0;
  char *shown = mml_url_redact(s3_prefix);
  if (!shown) return mml_err_set(err, MML_ENOMEM, "out of memory");
  const char *bucket, *key;
  size_t blen;
  mml_status st = mml_s3_split(s3_prefix, &bucket, &blen, &key, shown, err);
  if (st) {
    free(shown);
    return st;
  }
  /* A glob in the prefix itself: list up to its first wildcard, match the whole key. */
  char *pfx = NULL, *pat = NULL;
  size_t dirlen;
  if (!pattern && has_glob(key)) {
    pfx = dupn(key, strcspn(key, "*?["));
    pat = dupstr(key);
    dirlen = 0;
  } else {
    pfx = dupstr(key);
    const char *slash = strrchr(key, '/');
    dirlen = slash ? (size_t)(slash - key) + 1 : 0;
    if (pattern) pat = dupstr(pattern);
  }
  char *burl = malloc(blen + 7);
  char **out = NULL;
  size_t cnt = 0, cap = 0;
  mml_bytes token = {0}, q = {0}, page = {0};
  char *kbuf = malloc(4096);
  if (!pfx || (pattern && !pat) || (!pattern && has_glob(key) && !pat) || !burl || !kbuf) {
    st = mml_err_set(err, MML_ENOMEM, "out of memory");
    goto done;
  }
  snprintf(burl, blen + 7, "s3://%.*s", (int)blen, bucket);
  for (int pageno = 0;; pageno++) {
    if (pageno >= LIST_MAX_PAGES) {
      st = mml_err_set(err, MML_EFETCH, "LIST %s: more than %d pages", shown, LIST_MAX_PAGES);
      goto done;
    }
    /* canonical query: names sorted (continuation-token < list-type < prefix) */
    mml_bytes_clear(&q);
    int bad = 0;
    if (token.len) {
      bad |= mml_bytes_append(&q, "continuation-token=", 19) != MML_OK;
      bad |= mml_uri_encode((const char *)token.data, token.len, 0, &q) != MML_OK;
      bad |= mml_bytes_append(&q, "&", 1) != MML_OK;
    }
    bad |= mml_bytes_append(&q, "list-type=2&", 12) != MML_OK;
    if (f->list_page_size) {
      char mk[32];
      int mkn = snprintf(mk, sizeof mk, "max-keys=%d&", f->list_page_size);
      bad |= mml_bytes_append(&q, mk, (size_t)mkn) != MML_OK;
    }
    bad |= mml_bytes_append(&q, "prefix=", 7) != MML_OK;
    bad |= mml_uri_encode(pfx, strlen(pfx), 0, &q) != MML_OK;
    if (bad) {
      st = mml_err_set(err, MML_ENOMEM, "out of memory");
      goto done;
    }
    st = mml_fetch_get_query(f, burl, (const char *)q.data, 0, -1, 0, &page, err);
    if (st) {
      if (err) {
        /* the message names the bucket URL; say it was a listing of the prefix */
        char m[MML_ERR_MSG];
        snprintf(m, sizeof m, "%s", err->msg);
        mml_err_set(err, st, "LIST %s: %s", shown, m);
      }
      goto done;
    }
    const char *doc = (const char *)page.data;
    size_t dn = page.len, pos = 0, len;
    if (!doc || !memmem(doc, dn, "<ListBucketResult", 17)) {
      st = mml_err_set(err, MML_EFETCH, "LIST %s: reply is not a ListBucketResult", shown);
      goto done;
    }
    const char *c;
    while ((c = xml_next(doc, dn, &pos, "Contents", &len))) {
      size_t kp = 0, kl;
      const char *k = xml_next(c, len, &kp, "Key", &kl);
      if (!k) continue;
      if (kl >= 4000) {
        st = mml_err_set(err, MML_EFETCH, "LIST %s: a key longer than 4000 bytes", shown);
        goto done;
      }
      size_t klen = xml_decode(k, kl, kbuf, 4096);
      if (strlen(kbuf) != klen || strncmp(kbuf, pfx, strlen(pfx))) continue; /* NUL or foreign */
      if (pat && !strncmp(pat, "s3://", 5)) { /* a whole-URL pattern */
        char full[4200];
        snprintf(full, sizeof full, "s3://%.*s/%s", (int)blen, bucket, kbuf);
        if (fnmatch(pat, full, FNM_PATHNAME) != 0) continue;
      } else if (pat) {
        const char *rel = klen >= dirlen ? kbuf + dirlen : kbuf;
        if (fnmatch(pat, rel, FNM_PATHNAME) != 0) continue;
      }
      if (cnt == cap) {
        size_t nc = cap ? cap * 2 : 64;
        char **t = realloc(out, nc * sizeof *t);
        if (!t) {
          st = mml_err_set(err, MML_ENOMEM, "out of memory");
          goto done;
        }
        out = t, cap = nc;
      }
      size_t ul = blen + 6 + klen + 1;
      if (!(out[cnt] = malloc(ul))) {
        st = mml_err_set(err, MML_ENOMEM, "out of memory");
        goto done;
      }
      snprintf(out[cnt], ul, "s3://%.*s/%s", (int)blen, bucket, kbuf);
      cnt++;
    }
    char trunc[16];
    mml_xml_text(doc, dn, "IsTruncated", trunc, sizeof trunc);
    if (strcmp(trunc, "true")) break;
    size_t tp = 0, tl;
    const char *t = xml_next(doc, dn, &tp, "NextContinuationToken", &tl);
    if (!t || !tl) {
      st = mml_err_set(err, MML_EFETCH, "LIST %s: truncated reply without a continuation token", shown);
      goto done;
    }
    char tok[2048];
    size_t tn = xml_decode(t, tl, tok, sizeof tok);
    if (tl >= sizeof tok - 8 || (token.len == tn && !memcmp(token.data, tok, tn))) {
      st = mml_err_set(err, MML_EFETCH, "LIST %s: bad continuation token (too long or repeated)", shown);
      goto done;
    }
    mml_bytes_clear(&token);
    if (mml_bytes_append(&token, tok, tn)) {
      st = mml_err_set(err, MML_ENOMEM, "out of memory");
      goto done;
    }
  }
  if (cnt) qsort(out, cnt, sizeof *out, cmp_str);
  *urls = out, *n = cnt;
  out = NULL, cnt = 0;
done:
  mml_fetch_list_free(out, cnt);
  mml_bytes_free(&token), mml_bytes_free(&q), mml_bytes_free(&page);
  free(pfx), free(pat), free(burl), free(kbuf), free(shown);
  return st;
}
