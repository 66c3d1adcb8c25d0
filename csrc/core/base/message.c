/*
 * message.c — the text of user-facing messages (see mml/message.h): UTF-8 repair and
 * escaping, shortening in the middle, and the one URL redaction every message, warning,
 * repr and stat goes through.
 *
 * Design: messages are built by printf into fixed buffers from values of any origin (a
 * record's bytes, a server's reply, a path), so instead of trusting every call site, the
 * error setter rewrites each finished message: URLs are redacted first (on the raw text,
 * so a credential cut by an escape cannot slip through), then invalid bytes are escaped
 * and the result is shortened in the middle to fit.  Call sites that quote long values
 * shorten them with mml_text_short, keeping both ends (the file name is at the end).
 *
 * Threads: pure functions; no global state.  Memory: only mml_url_redact and
 * mml_text_redact allocate (their result); sanitize works on the stack.
 */
#include "mml/message.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---------------------------------------------------------------- UTF-8 */

size_t mml_utf8_char(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  if (!n) return 0;
  unsigned c = p[0];
  if (c < 0x80) return 1;
  size_t k;
  unsigned cp, min;
  if ((c & 0xE0) == 0xC0)
    k = 1, cp = c & 0x1F, min = 0x80;
  else if ((c & 0xF0) == 0xE0)
    k = 2, cp = c & 0x0F, min = 0x800;
  else if ((c & 0xF8) == 0xF0)
    k = 3, cp = c & 0x07, min = 0x10000;
  else
    return 0;
  if (n <= k) return 0;
  for (size_t i = 1; i <= k; i++) {
    if ((p[i] & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (p[i] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return k + 1;
}

int mml_utf8_valid(const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    size_t k = mml_utf8_char(s + i, n - i);
    if (!k) return 0;
    i += k;
  }
  return 1;
}

static int needs_escape(unsigned char c, int quote) {
  if (c == 0x7F) return quote;
  if (c >= 0x20) return 0;
  return quote || (c != '\n' && c != '\t');
}

size_t mml_text_escape(char *dst, size_t cap, const char *s, size_t n, int quote) {
  static const char hex[] = "0123456789abcdef";
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    unsigned char c = (unsigned char)s[i];
    size_t k = mml_utf8_char(s + i, n - i);
    if (k && !(k == 1 && needs_escape(c, quote))) {
      if (o + k >= cap) break;
      memcpy(dst + o, s + i, k);
      o += k;
      i += k;
    } else {
      if (o + 4 >= cap) break;
      dst[o++] = '\\', dst[o++] = 'x', dst[o++] = hex[c >> 4], dst[o++] = hex[c & 15];
      i++;
    }
  }
  if (cap) dst[o] = 0;
  return o;
}

/* Start of the character that holds byte i of valid UTF-8 text t. */
static size_t char_start(const char *t, size_t i) {
  while (i > 0 && ((unsigned char)t[i] & 0xC0) == 0x80) i--;
  return i;
}

static void short_into(const char *s, size_t n, size_t max, char *buf, size_t cap);

#define ELLIPSIS "\xe2\x80\xa6" /* U+2026 */
enum { END_MAX = 2048 };        /* most bytes kept of either end */

/* dst = head[0..hl) + "…" + tail[..tl) fitted into max bytes, both valid UTF-8. */
static void join_ends(char *dst, size_t max, const char *head, size_t hl, const char *tail,
                      size_t tl) {
  size_t budget = max - 3, hb = budget - budget / 2, tb = budget / 2;
  if (hl > hb) hl = char_start(head, hb);
  size_t ts = tl > tb ? tl - tb : 0;
  while (ts < tl && ((unsigned char)tail[ts] & 0xC0) == 0x80) ts++;
  memmove(dst, head, hl);
  memcpy(dst + hl, ELLIPSIS, 3);
  memmove(dst + hl + 3, tail + ts, tl - ts);
  dst[hl + 3 + tl - ts] = 0;
}

const char *mml_text_short(const char *s, size_t n, size_t max, char *buf, size_t cap) {
  if (!cap) return buf;
  mml_bytes red = {0}; /* redacted before it is cut (rule 4 of the redaction below) */
  if (memmem(s, n, "://", 3)) {
    if (mml_text_redact(s, n, &red) == MML_OK)
      s = (const char *)red.data, n = red.len;
    else /* out of memory: no more than the scheme */
      n = (size_t)((const char *)memmem(s, n, "://", 3) + 3 - s);
  }
  short_into(s, n, max, buf, cap);
  mml_bytes_free(&red);
  return buf;
}

static void short_into(const char *s, size_t n, size_t max, char *buf, size_t cap) {
  if (max >= cap) max = cap - 1;
  if (max > END_MAX) max = END_MAX;
  /* Both ends escaped from at most max raw bytes each: escaping only grows text, so
   * they hold every byte the shortened form can show. */
  char head[END_MAX + 8], tail[END_MAX + 8];
  size_t hl = mml_text_escape(head, sizeof head, s, n < max ? n : max, 1);
  if ((n <= max && hl <= max) || max < 8) {
    if (hl > max) hl = char_start(head, max);
    memcpy(buf, head, hl);
    buf[hl] = 0;
    return;
  }
  size_t from = n > max ? n - max : 0;
  for (int k = 0; k < 3 && from < n && ((unsigned char)s[from] & 0xC0) == 0x80; k++) from++;
  size_t tl = mml_text_escape(tail, sizeof tail, s + from, n - from, 1);
  join_ends(buf, max, head, hl, tail, tl);
}

/* ---------------------------------------------------------------- URL redaction */
/*
 * The one rule (every message, warning, repr, stat and _core.redact):
 *  1. A URL starts at "scheme://" and runs to the next whitespace or control byte (or the
 *     end); quotes, brackets and backticks do not end it, since a reference quoted in a
 *     message may hold them.  Trailing ":,;.)]}'\"`>" are shown after it.
 *  2. Its user-info (what precedes the last '@' before the first '/', '?' or '#') is
 *     dropped; so is that of a URL nested anywhere in it.
 *  3. In its query and its fragment, each name=value whose name (the letters, digits and
 *     "_.%~+-" before the '=', percent-decoded) holds signature, credential, token, key,
 *     secret, password, passwd or auth, or is sig or pw, has its value replaced by
 *     REDACTED, wherever it stands; a value runs to the next '&', ';', '#', '?' or '\'
 *     (a JSON escape such as \u0026) or the URL's end.
 *  4. A value quoted in a message is redacted before it is escaped or shortened
 *     (mml_text_short), so a cut never separates a value from its name.
 */

static int hex_digit(char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

static int name_is_secret(const char *raw, size_t rn) {
  static const char *const words[] = {"signature", "credential", "token",  "key",
                                      "secret",    "password",   "passwd", "auth"};
  char p[256]; /* the name percent-decoded; a longer one counts as secret */
  size_t n = 0;
  for (size_t i = 0; i < rn; i++) {
    if (n == sizeof p) return 1;
    int hi = raw[i] == '%' && i + 2 < rn ? hex_digit(raw[i + 1]) : -1;
    int lo = hi >= 0 ? hex_digit(raw[i + 2]) : -1;
    if (lo >= 0)
      p[n++] = (char)(hi << 4 | lo), i += 2;
    else
      p[n++] = raw[i];
  }
  for (size_t w = 0; w < sizeof words / sizeof *words; w++) {
    size_t wl = strlen(words[w]);
    for (size_t i = 0; i + wl <= n; i++)
      if (!strncasecmp(p + i, words[w], wl)) return 1;
  }
  return (n == 3 && !strncasecmp(p, "sig", 3)) || (n == 2 && !strncasecmp(p, "pw", 2));
}

static int param_sep(char c) { return c == '&' || c == ';' || c == '#' || c == '\\' || c == '?'; }
static int name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         strchr("_.%~+-", c) != NULL;
}

static int scheme_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '+' ||
         c == '-' || c == '.';
}

/* The start of a "scheme://" in [from, to) that has a scheme (NULL: none). */
static const char *nested_url(const char *from, const char *to) {
  for (const char *p = from; p < to;) {
    const char *sep = memmem(p, (size_t)(to - p), "://", 3);
    if (!sep) return NULL;
    const char *st = sep;
    while (st > from && scheme_char(st[-1])) st--;
    if (st < sep) return st;
    p = sep + 3;
  }
  return NULL;
}

/* Appends [p, end) with the user-info of every URL in it dropped (rule 2). */
static mml_status drop_userinfo(const char *p, const char *end, mml_bytes *b) {
  mml_status st = MML_OK;
  for (const char *u; !st && (u = nested_url(p, end));) {
    const char *s = (const char *)memmem(u, (size_t)(end - u), "://", 3) + 3;
    const char *slash = s;
    while (slash < end && !strchr("/?#", *slash)) slash++;
    const char *at = memrchr(s, '@', (size_t)(slash - s));
    st = mml_bytes_append(b, p, (size_t)(s - p));
    p = at ? at + 1 : s;
  }
  return st ? st : mml_bytes_append(b, p, (size_t)(end - p));
}

/* Appends the query or fragment p[0..end) (after its '?' or '#') with secret values
 * redacted (rule 3): every "name=" whose name (the run of name characters before the
 * '=') is secret-like, wherever it stands, has its value up to the next separator
 * replaced; between them, URLs nested in it lose their user-info (rule 2). */
static mml_status redact_params(const char *p, const char *end, mml_bytes *b) {
  mml_status st = MML_OK;
  const char *from = p; /* copied up to here */
  while (p < end && !st) {
    const char *eq = memchr(p, '=', (size_t)(end - p));
    if (!eq) break;
    const char *name = eq;
    while (name > from && name_char(name[-1])) name--;
    p = eq + 1;
    if (name == eq || !name_is_secret(name, (size_t)(eq - name))) continue;
    st = drop_userinfo(from, p, b);
    if (!st) st = mml_bytes_append(b, "REDACTED", 8);
    while (p < end && !param_sep(*p)) p++;
    from = p;
  }
  return st ? st : drop_userinfo(from, end, b);
}

/* Appends url[0..n) redacted (rules 2 and 3; a URL nested in it, a proxy's, a redirect
 * parameter's or text glued to it, loses its user-info too). */
static mml_status redact_one(const char *url, size_t n, mml_bytes *b) {
  mml_status st = MML_OK;
  const char *end = url + n, *rest = url;
  const char *s = memmem(url, n, "://", 3);
  if (s) {
    s += 3;
    const char *slash = s;
    while (slash < end && !strchr("/?#", *slash)) slash++;
    const char *at = memrchr(s, '@', (size_t)(slash - s));
    if ((st = mml_bytes_append(b, url, (size_t)(s - url)))) return st;
    rest = at ? at + 1 : s;
  }
  const char *q = rest;
  while (q < end && *q != '?' && *q != '#') q++;
  if ((st = drop_userinfo(rest, q, b))) return st;
  if (q == end) return MML_OK;
  if ((st = mml_bytes_append(b, q, 1))) return st;
  return redact_params(q + 1, end, b);
}

char *mml_url_redact(const char *url) {
  mml_bytes b = {0};
  if (redact_one(url, strlen(url), &b) || mml_bytes_append(&b, "", 1)) {
    mml_bytes_free(&b);
    return NULL;
  }
  return (char *)b.data;
}

static int url_end_char(char c) { return (unsigned char)c <= ' ' || c == 0x7F; }

mml_status mml_text_redact(const char *text, size_t n, mml_bytes *out) {
  const char *p = text, *end = text + n;
  mml_status st = MML_OK;
  while (p < end && !st) {
    const char *sep = memmem(p, (size_t)(end - p), "://", 3);
    if (!sep) break;
    const char *start = sep;
    while (start > p && scheme_char(start[-1])) start--;
    if (start == sep) { /* "://" without a scheme: not a URL */
      st = mml_bytes_append(out, p, (size_t)(sep + 3 - p));
      p = sep + 3;
      continue;
    }
    const char *e = sep + 3;
    while (e < end && !url_end_char(*e)) e++;
    /* punctuation that ends a sentence, a quote or a "url: reason" prefix is shown after
     * it (rule 1); a value it cut short is still redacted whole */
    while (e > sep + 3 && strchr(":,;.)]}'\"`>", e[-1])) e--;
    st = mml_bytes_append(out, p, (size_t)(start - p));
    if (!st) st = redact_one(start, (size_t)(e - start), out);
    p = e;
  }
  if (!st && p < end) st = mml_bytes_append(out, p, (size_t)(end - p));
  return st;
}

void mml_text_clean(char *dst, size_t cap, const char *src, size_t n) {
  if (!cap) return;
  mml_bytes red = {0};
  if (memmem(src, n, "://", 3)) {
    if (mml_text_redact(src, n, &red) == MML_OK) {
      src = (const char *)red.data;
      n = red.len;
    } else { /* out of memory: show no query string rather than risk one */
      const char *q = memchr(src, '?', n);
      if (q) n = (size_t)(q - src);
    }
  }
  size_t tcap = 4 * n + 1; /* each byte escapes to at most 4 */
  char stack[4096], *tmp = tcap <= sizeof stack ? stack : malloc(tcap);
  if (!tmp) { /* out of memory: what fits of the escaped start */
    tmp = stack;
    tcap = sizeof stack;
  }
  size_t len = mml_text_escape(tmp, tcap, src, n, 0);
  mml_text_fit(dst, cap, tmp, len); /* long values shortened in the middle */
  if (tmp != stack) free(tmp);
  mml_bytes_free(&red);
}

void mml_text_sanitize(char *buf, size_t cap) {
  if (!cap) return;
  size_t n = strnlen(buf, cap - 1);
  char copy[4096];
  if (n >= sizeof copy) n = sizeof copy - 1;
  memcpy(copy, buf, n);
  mml_text_clean(buf, cap, copy, n);
}
