/*
 * s3.c — S3 without the transfer loop: where an s3:// URL is fetched from (virtual-host
 * or path style, region, custom endpoint), ListObjectsV2 listing with pagination and
 * globbing (blocking, through fetch_sync.c), and the small XML reading it needs.  Signing
 * happens per transfer in fetch_loop.c (mml/sigv4.h).  Pure functions except
 * mml_fetch_list, which runs on the caller's thread.
 */
#include "mml/s3.h"

#include "mml/message.h"

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fetch_loop.h"
#include "mml/fetch_sync.h"
#include "mml/sigv4.h"

/* Bounds of one listing (issue 29): a server whose continuation tokens cycle, or whose
 * keys go back, is caught at once (ListObjectsV2 returns keys in ascending UTF-8 binary
 * order and a token names a place after the last key); one that keeps paging forward is
 * cut at LIST_MAX_PAGES pages, and at LIST_MAX_KEYS matching keys (what is kept). */
#define LIST_MAX_PAGES 100000
#define LIST_MAX_KEYS (1 << 20)

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
                                size_t blen, const char *key, const char *query, mml_s3_addr *out,
                                mml_err *err) {
  mml_bytes path = {0}, url = {0};
  char host[512];
  int path_style = endpoint != NULL || memchr(bucket, '.', blen) != NULL;
  memset(out, 0, sizeof *out);
  if (endpoint) {
    const char *h = strstr(endpoint, "://");
    h = h ? h + 3 : endpoint;
    size_t hl = strcspn(h, "/");
    if (hl == 0 || hl >= sizeof host)
      return mml_err_set(err, MML_ECONFIG, "S3 endpoint has no host");
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
    if (h)
      st |= mml_bytes_append(&url, endpoint, (size_t)(h - endpoint) + 3);
    else
      st |= mml_bytes_append(&url, "https://", 8);
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
    return mml_err_set(err, MML_ENOMEM, "S3 address: out of memory");
  }
  return MML_OK;
oom:
  mml_bytes_free(&path), mml_bytes_free(&url);
  return mml_err_set(err, MML_ENOMEM, "S3 address: out of memory");
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
  return mml_s3_address_parts(region && *region ? region : "us-east-1",
                              endpoint && *endpoint ? endpoint : NULL, b, bl, k, query, out, err);
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
    if (!strncmp(ent, "amp;", 4))
      cp = '&';
    else if (!strncmp(ent, "lt;", 3))
      cp = '<';
    else if (!strncmp(ent, "gt;", 3))
      cp = '>';
    else if (!strncmp(ent, "quot;", 5))
      cp = '"';
    else if (!strncmp(ent, "apos;", 5))
      cp = '\'';
    else if (ent[0] == '#')
      cp = ent[1] == 'x' ? strtoul(ent + 2, NULL, 16) : strtoul(ent + 1, NULL, 10);
    else
      ok = 0;
    if (!ok || cp == 0 || cp > 0x10FFFF) {
      out[o++] = s[i++];
      continue;
    }
    if (cp < 0x80)
      out[o++] = (char)cp;
    else if (cp < 0x800)
      out[o++] = (char)(0xC0 | cp >> 6), out[o++] = (char)(0x80 | (cp & 63));
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
  int ol = snprintf(open, sizeof open, "<%s>", tag),
      cl = snprintf(close, sizeof close, "</%s>", tag);
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

/* One listing in progress: what is listed, what matches, what was found. */
typedef struct lister {
  const char *shown; /* the prefix URL, redacted, for messages */
  const char *bucket;
  size_t blen;
  char *pfx, *pat; /* the key prefix listed; the glob (NULL: all) */
  size_t dirlen;   /* relative patterns match the key after this many bytes */
  char **out;
  size_t cnt, cap;
  mml_bytes token; /* the continuation token of the next page ("" first) */
  mml_bytes last;  /* the last key listed (matching or not): the next must sort after it */
  int have_last;
  uint64_t *seen; /* hashes of the continuation tokens used so far (open addressing) */
  size_t seen_cap, seen_n;
  char kbuf[4096];
} lister;

/* 1 when token t was used before in this listing, else remembers it (0); -1: no memory. */
static int token_seen(lister *ls, const char *t, size_t n) {
  if (2 * (ls->seen_n + 1) > ls->seen_cap) {
    size_t nc = ls->seen_cap ? ls->seen_cap * 2 : 1024;
    uint64_t *ns = calloc(nc, sizeof *ns);
    if (!ns) return -1;
    for (size_t i = 0; i < ls->seen_cap; i++)
      if (ls->seen[i])
        for (size_t k = ls->seen[i] & (nc - 1);; k = (k + 1) & (nc - 1))
          if (!ns[k]) {
            ns[k] = ls->seen[i];
            break;
          }
    free(ls->seen);
    ls->seen = ns, ls->seen_cap = nc;
  }
  uint64_t h = mml_mix64(mml_hash_bytes(0, t, n)) | 1; /* 0 marks a free slot */
  for (size_t k = h & (ls->seen_cap - 1);; k = (k + 1) & (ls->seen_cap - 1)) {
    if (ls->seen[k] == h) return 1;
    if (!ls->seen[k]) {
      ls->seen[k] = h, ls->seen_n++;
      return 0;
    }
  }
}

/* Key k (klen bytes, decoded) comes after the last one listed, and becomes it. */
static mml_status list_order(lister *ls, const char *k, size_t klen, mml_err *err) {
  size_t ln = ls->last.len, m = ln < klen ? ln : klen;
  int c = m ? memcmp(ls->last.data, k, m) : 0;
  if (ls->have_last && (c > 0 || (c == 0 && klen <= ln))) {
    char a[MML_SHORT_CAP(80)], b[MML_SHORT_CAP(80)];
    return mml_err_set(err, MML_EFETCH,
                       "LIST %s: the listing went back or repeated (key %s after %s): a "
                       "server whose continuation tokens cycle",
                       ls->shown, mml_text_short(k, klen, 80, a, sizeof a),
                       mml_text_short((const char *)ls->last.data, ln, 80, b, sizeof b));
  }
  mml_bytes_clear(&ls->last);
  if (mml_bytes_append(&ls->last, k, klen))
    return mml_err_set(err, MML_ENOMEM, "LIST %s: out of memory", ls->shown);
  ls->have_last = 1;
  return MML_OK;
}

/* The canonical query of the next page: names sorted (continuation-token < list-type <
 * max-keys < prefix). */
static mml_status list_query(const lister *ls, int page_size, mml_bytes *q, mml_err *err) {
  mml_bytes_clear(q);
  int bad = 0;
  if (ls->token.len) {
    bad |= mml_bytes_append(q, "continuation-token=", 19) != MML_OK;
    bad |= mml_uri_encode((const char *)ls->token.data, ls->token.len, 0, q) != MML_OK;
    bad |= mml_bytes_append(q, "&", 1) != MML_OK;
  }
  bad |= mml_bytes_append(q, "list-type=2&", 12) != MML_OK;
  if (page_size) {
    char mk[32];
    int mkn = snprintf(mk, sizeof mk, "max-keys=%d&", page_size);
    bad |= mml_bytes_append(q, mk, (size_t)mkn) != MML_OK;
  }
  bad |= mml_bytes_append(q, "prefix=", 7) != MML_OK;
  bad |= mml_uri_encode(ls->pfx, strlen(ls->pfx), 0, q) != MML_OK;
  return bad ? mml_err_set(err, MML_ENOMEM, "LIST %s: out of memory", ls->shown) : MML_OK;
}

/* Key k (decoded, klen bytes) is kept when it lies under the prefix and matches. */
static int list_match(const lister *ls, const char *k, size_t klen) {
  if (strlen(k) != klen || strncmp(k, ls->pfx, strlen(ls->pfx))) return 0; /* NUL or foreign */
  if (ls->pat && !strncmp(ls->pat, "s3://", 5)) {                          /* a whole-URL pattern */
    char full[4200];
    snprintf(full, sizeof full, "s3://%.*s/%s", (int)ls->blen, ls->bucket, k);
    return fnmatch(ls->pat, full, FNM_PATHNAME) == 0;
  }
  if (ls->pat) return fnmatch(ls->pat, klen >= ls->dirlen ? k + ls->dirlen : k, FNM_PATHNAME) == 0;
  return 1;
}

/* The matching keys of one ListBucketResult page, appended as s3:// URLs. */
static mml_status list_page(lister *ls, const char *doc, size_t dn, mml_err *err) {
  size_t pos = 0, len;
  const char *c;
  while ((c = xml_next(doc, dn, &pos, "Contents", &len))) {
    size_t kp = 0, kl;
    const char *k = xml_next(c, len, &kp, "Key", &kl);
    if (!k) continue;
    if (kl >= 4000)
      return mml_err_set(err, MML_EFETCH, "LIST %s: a key longer than 4000 bytes", ls->shown);
    size_t klen = xml_decode(k, kl, ls->kbuf, sizeof ls->kbuf);
    mml_status st = list_order(ls, ls->kbuf, klen, err);
    if (st) return st;
    if (!list_match(ls, ls->kbuf, klen)) continue;
    if (ls->cnt >= LIST_MAX_KEYS)
      return mml_err_set(err, MML_EFETCH, "LIST %s: more than %d matching keys", ls->shown,
                         LIST_MAX_KEYS);
    if (ls->cnt == ls->cap) {
      size_t nc = ls->cap ? ls->cap * 2 : 64;
      char **t = realloc(ls->out, nc * sizeof *t);
      if (!t) return mml_err_set(err, MML_ENOMEM, "LIST %s: out of memory", ls->shown);
      ls->out = t, ls->cap = nc;
    }
    size_t ul = ls->blen + 6 + klen + 1;
    if (!(ls->out[ls->cnt] = malloc(ul)))
      return mml_err_set(err, MML_ENOMEM, "LIST %s: out of memory", ls->shown);
    snprintf(ls->out[ls->cnt], ul, "s3://%.*s/%s", (int)ls->blen, ls->bucket, ls->kbuf);
    ls->cnt++;
  }
  return MML_OK;
}

/* After a page: *more = 1 with the next continuation token stored, or 0 at the end. */
static mml_status list_next_token(lister *ls, const char *doc, size_t dn, int *more, mml_err *err) {
  char trunc[16];
  mml_xml_text(doc, dn, "IsTruncated", trunc, sizeof trunc);
  *more = !strcmp(trunc, "true");
  if (!*more) return MML_OK;
  size_t tp = 0, tl;
  const char *t = xml_next(doc, dn, &tp, "NextContinuationToken", &tl);
  if (!t || !tl)
    return mml_err_set(err, MML_EFETCH, "LIST %s: truncated reply without a continuation token",
                       ls->shown);
  char tok[2048];
  size_t tn = xml_decode(t, tl, tok, sizeof tok);
  if (tl >= sizeof tok - 8)
    return mml_err_set(err, MML_EFETCH, "LIST %s: bad continuation token (too long)", ls->shown);
  int seen = token_seen(ls, tok, tn);
  if (seen < 0) return mml_err_set(err, MML_ENOMEM, "LIST %s: out of memory", ls->shown);
  if (seen)
    return mml_err_set(err, MML_EFETCH,
                       "LIST %s: a continuation token came back (a server whose pages cycle)",
                       ls->shown);
  mml_bytes_clear(&ls->token);
  if (mml_bytes_append(&ls->token, tok, tn))
    return mml_err_set(err, MML_ENOMEM, "LIST %s: out of memory", ls->shown);
  return MML_OK;
}

/* What is listed: a glob in the prefix itself lists up to its first wildcard and matches
 * the whole key; otherwise the prefix is listed and `pattern` matched. */
static mml_status list_plan(lister *ls, const char *key, const char *pattern, mml_err *err) {
  if (!pattern && has_glob(key)) {
    ls->pfx = dupn(key, strcspn(key, "*?["));
    ls->pat = dupstr(key);
    ls->dirlen = 0;
  } else {
    ls->pfx = dupstr(key);
    const char *slash = strrchr(key, '/');
    ls->dirlen = slash ? (size_t)(slash - key) + 1 : 0;
    if (pattern) ls->pat = dupstr(pattern);
  }
  if (!ls->pfx || ((pattern || has_glob(key)) && !ls->pat))
    return mml_err_set(err, MML_ENOMEM, "LIST %s: out of memory", ls->shown);
  return MML_OK;
}

/* One page fetched and read; *more as in list_next_token. */
static mml_status list_one(mml_fetcher *f, lister *ls, const char *burl, mml_bytes *q,
                           mml_bytes *page, int *more, mml_err *err) {
  mml_status st = list_query(ls, f->list_page_size, q, err);
  if (st) return st;
  st = mml_fetch_get_query(f, burl, (const char *)q->data, 0, -1, 0, page, err);
  if (st) {
    if (err) { /* the message names the bucket URL; say it was a listing of the prefix */
      char m[MML_ERR_MSG];
      snprintf(m, sizeof m, "%s", err->msg);
      mml_err_set(err, st, "LIST %s: %s", ls->shown, m);
    }
    return st;
  }
  const char *doc = (const char *)page->data;
  if (!doc || !memmem(doc, page->len, "<ListBucketResult", 17))
    return mml_err_set(err, MML_EFETCH, "LIST %s: reply is not a ListBucketResult", ls->shown);
  if ((st = list_page(ls, doc, page->len, err))) return st;
  return list_next_token(ls, doc, page->len, more, err);
}

mml_status mml_fetch_list(mml_fetcher *f, const char *s3_prefix, const char *pattern, char ***urls,
                          size_t *n, mml_err *err) {
  if (!f || !s3_prefix || !urls || !n)
    return mml_err_set(err, MML_EINVAL, "fetch_list: NULL argument");
  *urls = NULL, *n = 0;
  lister *ls = calloc(1, sizeof *ls);
  char *shown = mml_url_redact(s3_prefix);
  if (!ls || !shown) {
    free(ls), free(shown);
    return mml_err_set(err, MML_ENOMEM, "LIST: out of memory");
  }
  ls->shown = shown;
  const char *key;
  mml_bytes q = {0}, page = {0};
  char *burl = NULL;
  mml_status st = mml_s3_split(s3_prefix, &ls->bucket, &ls->blen, &key, shown, err);
  if (!st) st = list_plan(ls, key, pattern, err);
  if (!st && !(burl = malloc(ls->blen + 7)))
    st = mml_err_set(err, MML_ENOMEM, "LIST %s: out of memory", shown);
  if (!st) snprintf(burl, ls->blen + 7, "s3://%.*s", (int)ls->blen, ls->bucket);
  int more = 1;
  for (int pageno = 0; !st && more; pageno++) {
    if (pageno >= LIST_MAX_PAGES)
      st = mml_err_set(err, MML_EFETCH, "LIST %s: more than %d pages", shown, LIST_MAX_PAGES);
    else
      st = list_one(f, ls, burl, &q, &page, &more, err);
  }
  if (!st) {
    if (ls->cnt) qsort(ls->out, ls->cnt, sizeof *ls->out, cmp_str);
    *urls = ls->out, *n = ls->cnt;
    ls->out = NULL, ls->cnt = 0;
  }
  mml_fetch_list_free(ls->out, ls->cnt);
  mml_bytes_free(&ls->token), mml_bytes_free(&q), mml_bytes_free(&page);
  mml_bytes_free(&ls->last), free(ls->seen);
  free(ls->pfx), free(ls->pat), free(ls), free(burl), free(shown);
  return st;
}
