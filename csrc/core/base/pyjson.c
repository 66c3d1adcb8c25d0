/*
 * pyjson.c — JSON text re-serialised as Python's json.dumps(json.loads(s),
 * ensure_ascii=False) writes it (contract: mml/pyjson.h).
 *
 * One recursive-descent reader, val(), walks a value; with `emit` it also writes Python's
 * form.  Objects are read twice when emitting: once to list the members (decoded key,
 * spans), then each distinct key is written at its first position with its last value,
 * which is what a Python dict does with repeated keys.  Numbers: integers are copied (only
 * "-0" changes), the rest go through strtod and the shortest round-trip "%.*e" form,
 * laid out like Python's float repr.
 *
 * Threads: no global state; reentrant.
 */
#include "mml/pyjson.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_DEPTH = 512 };

typedef struct ctx {
  const char *base, *end;
  mml_bytes *out; /* NULL: check only */
  mml_err *err;   /* NULL: quiet (accessors) */
  mml_status st;
} ctx;

static const char *ws(const char *p, const char *e) {
  while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
  return p;
}

static const char *fail(ctx *c, const char *at, const char *why) {
  if (!c->st)
    c->st = mml_err_set(c->err, MML_ERECORD, "invalid JSON at byte %zu: %s", (size_t)(at - c->base),
                        why);
  return NULL;
}

static int put(ctx *c, int emit, const void *p, size_t n) {
  if (!emit || !c->out) return 1;
  if (mml_bytes_append(c->out, p, n)) {
    if (!c->st) c->st = mml_err_set(c->err, MML_ENOMEM, "out of memory");
    return 0;
  }
  return 1;
}

static int put_utf8(mml_bytes *b, unsigned cp) {
  char u[4];
  size_t k;
  if (cp < 0x80)
    u[0] = (char)cp, k = 1;
  else if (cp < 0x800)
    u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3F)), k = 2;
  else if (cp < 0x10000)
    u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | (cp >> 6 & 0x3F)),
    u[2] = (char)(0x80 | (cp & 0x3F)), k = 3;
  else
    u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | (cp >> 12 & 0x3F)),
    u[2] = (char)(0x80 | (cp >> 6 & 0x3F)), u[3] = (char)(0x80 | (cp & 0x3F)), k = 4;
  return mml_bytes_append(b, u, k) == MML_OK;
}

/* A code point as Python's ensure_ascii=False encoder writes it inside a string. */
static int put_cp(ctx *c, int emit, unsigned cp) {
  if (!emit || !c->out) return 1;
  char e[8];
  const char *s = NULL;
  switch (cp) {
    case '"':
      s = "\\\"";
      break;
    case '\\':
      s = "\\\\";
      break;
    case '\b':
      s = "\\b";
      break;
    case '\f':
      s = "\\f";
      break;
    case '\n':
      s = "\\n";
      break;
    case '\r':
      s = "\\r";
      break;
    case '\t':
      s = "\\t";
      break;
    default:
      if (cp < 0x20) {
        snprintf(e, sizeof e, "\\u%04x", cp);
        s = e;
      }
  }
  if (s) return put(c, emit, s, strlen(s));
  if (!put_utf8(c->out, cp)) {
    if (!c->st) c->st = mml_err_set(c->err, MML_ENOMEM, "out of memory");
    return 0;
  }
  return 1;
}

static int hex4(const char *p, const char *e, unsigned *v) {
  if (e - p < 4) return 0;
  unsigned x = 0;
  for (int i = 0; i < 4; i++) {
    char h = p[i];
    x <<= 4;
    if (h >= '0' && h <= '9')
      x |= (unsigned)(h - '0');
    else if (h >= 'a' && h <= 'f')
      x |= (unsigned)(h - 'a' + 10);
    else if (h >= 'A' && h <= 'F')
      x |= (unsigned)(h - 'A' + 10);
    else
      return 0;
  }
  *v = x;
  return 1;
}

/* One UTF-8 sequence at p (first byte >= 0x80): its length, 0 if invalid. */
static int utf8_seq(const unsigned char *p, const unsigned char *e, unsigned *cp) {
  unsigned c = *p, v, min;
  int k;
  if ((c & 0xE0) == 0xC0)
    k = 1, v = c & 0x1F, min = 0x80;
  else if ((c & 0xF0) == 0xE0)
    k = 2, v = c & 0x0F, min = 0x800;
  else if ((c & 0xF8) == 0xF0)
    k = 3, v = c & 0x07, min = 0x10000;
  else
    return 0;
  if (e - p <= k) return 0;
  for (int i = 1; i <= k; i++) {
    if ((p[i] & 0xC0) != 0x80) return 0;
    v = v << 6 | (p[i] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return k + 1;
}

/* A string at p ('"'); dec (optional) receives the decoded UTF-8. */
static const char *str(ctx *c, const char *p, mml_bytes *dec, int emit) {
  const char *e = c->end;
  p++;
  if (!put(c, emit, "\"", 1)) return NULL;
  for (;;) {
    if (p >= e) return fail(c, p, "unterminated string");
    unsigned char ch = (unsigned char)*p;
    unsigned cp;
    if (ch == '"') break;
    if (ch == '\\') {
      if (p + 1 >= e) return fail(c, p, "unterminated string");
      char x = p[1];
      p += 2;
      switch (x) {
        case '"':
          cp = '"';
          break;
        case '\\':
          cp = '\\';
          break;
        case '/':
          cp = '/';
          break;
        case 'b':
          cp = '\b';
          break;
        case 'f':
          cp = '\f';
          break;
        case 'n':
          cp = '\n';
          break;
        case 'r':
          cp = '\r';
          break;
        case 't':
          cp = '\t';
          break;
        case 'u': {
          if (!hex4(p, e, &cp)) return fail(c, p - 2, "bad \\u escape");
          p += 4;
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            unsigned lo;
            if (e - p >= 6 && p[0] == '\\' && p[1] == 'u' && hex4(p + 2, e, &lo) && lo >= 0xDC00 &&
                lo <= 0xDFFF) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
              p += 6;
            }
          }
          if (cp >= 0xD800 && cp <= 0xDFFF)
            return fail(c, p - 6, "a lone UTF-16 surrogate (no UTF-8 form)");
          break;
        }
        default:
          return fail(c, p - 2, "bad escape");
      }
    } else if (ch < 0x20) {
      return fail(c, p, "control character inside a string");
    } else if (ch < 0x80) {
      cp = ch;
      p++;
    } else {
      int k = utf8_seq((const unsigned char *)p, (const unsigned char *)e, &cp);
      if (!k) return fail(c, p, "invalid UTF-8");
      p += k;
    }
    if (dec && !put_utf8(dec, cp)) return fail(c, p, "out of memory");
    if (!put_cp(c, emit, cp)) return NULL;
  }
  if (!put(c, emit, "\"", 1)) return NULL;
  return p + 1;
}

/* Python's repr() of a finite or infinite double. */
static void py_repr(double x, char *buf, size_t cap) {
  if (isnan(x)) {
    snprintf(buf, cap, "NaN");
    return;
  }
  if (isinf(x)) {
    snprintf(buf, cap, x < 0 ? "-Infinity" : "Infinity");
    return;
  }
  if (x == 0) {
    snprintf(buf, cap, signbit(x) ? "-0.0" : "0.0");
    return;
  }
  char t[40];
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(t, sizeof t, "%.*e", prec - 1, x);
    if (strtod(t, NULL) == x) break;
  }
  /* t: [-]d[.ddd]e(+|-)XX */
  char digits[24];
  int nd = 0;
  const char *q = t;
  int neg = *q == '-';
  if (neg) q++;
  for (; *q && *q != 'e'; q++)
    if (*q != '.') digits[nd++] = *q;
  digits[nd] = 0;
  int e10 = atoi(q + 1);
  char *o = buf;
  size_t left = cap;
#define OUT(...)                              \
  do {                                        \
    int _w = snprintf(o, left, __VA_ARGS__);  \
    if (_w < 0 || (size_t)_w >= left) return; \
    o += _w, left -= (size_t)_w;              \
  } while (0)
  if (neg) OUT("-");
  if (e10 < -4 || e10 >= 16) {
    OUT("%c", digits[0]);
    if (nd > 1) OUT(".%s", digits + 1);
    OUT("e%c%02d", e10 < 0 ? '-' : '+', e10 < 0 ? -e10 : e10);
  } else if (e10 >= 0) {
    int il = e10 + 1;
    if (nd <= il) {
      OUT("%s", digits);
      for (int i = nd; i < il; i++) OUT("0");
      OUT(".0");
    } else {
      OUT("%.*s.%s", il, digits, digits + il);
    }
  } else {
    OUT("0.");
    for (int i = 0; i < -e10 - 1; i++) OUT("0");
    OUT("%s", digits);
  }
#undef OUT
}

static const char *num(ctx *c, const char *p, int emit) {
  const char *e = c->end, *s = p;
  int is_float = 0;
  if (p < e && *p == '-') p++;
  if (e - p >= 8 && !memcmp(p, "Infinity", 8)) {
    p += 8;
    return put(c, emit, s, (size_t)(p - s)) ? p : NULL;
  }
  if (p >= e || *p < '0' || *p > '9') return fail(c, s, "bad number");
  if (*p == '0')
    p++;
  else
    while (p < e && *p >= '0' && *p <= '9') p++;
  if (p < e && *p == '.') {
    is_float = 1;
    p++;
    if (p >= e || *p < '0' || *p > '9') return fail(c, s, "bad number");
    while (p < e && *p >= '0' && *p <= '9') p++;
  }
  if (p < e && (*p == 'e' || *p == 'E')) {
    is_float = 1;
    p++;
    if (p < e && (*p == '+' || *p == '-')) p++;
    if (p >= e || *p < '0' || *p > '9') return fail(c, s, "bad number");
    while (p < e && *p >= '0' && *p <= '9') p++;
  }
  size_t n = (size_t)(p - s);
  if (!emit || !c->out) return p;
  if (!is_float) {
    if (n == 2 && s[0] == '-' && s[1] == '0') return put(c, emit, "0", 1) ? p : NULL;
    return put(c, emit, s, n) ? p : NULL;
  }
  char small[64], *tmp = n < sizeof small ? small : malloc(n + 1);
  if (!tmp) return fail(c, s, "out of memory");
  memcpy(tmp, s, n);
  tmp[n] = 0;
  double x = strtod(tmp, NULL);
  if (tmp != small) free(tmp);
  char r[48];
  py_repr(x, r, sizeof r);
  return put(c, emit, r, strlen(r)) ? p : NULL;
}

typedef struct member {
  size_t key_off, key_len; /* decoded key in the scratch buffer */
  const char *key, *val;   /* raw spans' starts */
} member;

static const char *val(ctx *c, const char *p, int depth, int emit);

static const char *object(ctx *c, const char *p, int depth, int emit) {
  const char *e = c->end;
  member *m = NULL;
  size_t nm = 0, cap = 0;
  mml_bytes keys = {0};
  int collect = emit && c->out;
  p = ws(p + 1, e);
  if (p < e && *p == '}') {
    p++;
    goto done;
  }
  for (;;) {
    if (p >= e || *p != '"') {
      p = fail(c, p, "expected a string key");
      goto done;
    }
    size_t k0 = keys.len;
    const char *key = p;
    if (!(p = str(c, p, collect ? &keys : NULL, 0))) goto done;
    p = ws(p, e);
    if (p >= e || *p != ':') {
      p = fail(c, p, "expected ':'");
      goto done;
    }
    p = ws(p + 1, e);
    const char *v = p;
    if (!(p = val(c, p, depth + 1, 0))) goto done;
    if (collect) {
      if (nm == cap) {
        cap = cap ? cap * 2 : 8;
        member *q = realloc(m, cap * sizeof *m);
        if (!q) {
          p = fail(c, p, "out of memory");
          goto done;
        }
        m = q;
      }
      m[nm++] = (member){k0, keys.len - k0, key, v};
    }
    p = ws(p, e);
    if (p < e && *p == ',') {
      p = ws(p + 1, e);
      continue;
    }
    if (p < e && *p == '}') {
      p++;
      break;
    }
    p = fail(c, p, "expected ',' or '}'");
    goto done;
  }
done:
  if (p && collect) {
    const char *endp = p;
    int first = 1;
    if (!put(c, 1, "{", 1)) endp = NULL;
    for (size_t i = 0; endp && i < nm; i++) {
      int seen = 0;
      size_t last = i;
      for (size_t j = 0; j < nm; j++) {
        int same = m[j].key_len == m[i].key_len &&
                   !memcmp(keys.data + m[j].key_off, keys.data + m[i].key_off, m[i].key_len);
        if (same && j < i) seen = 1;
        if (same) last = j;
      }
      if (seen) continue;
      if ((!first && !put(c, 1, ", ", 2)) || !str(c, m[i].key, NULL, 1) || !put(c, 1, ": ", 2) ||
          !val(c, m[last].val, depth + 1, 1))
        endp = NULL;
      first = 0;
    }
    if (endp && !put(c, 1, "}", 1)) endp = NULL;
    p = endp;
  }
  free(m);
  mml_bytes_free(&keys);
  return p;
}

static const char *array(ctx *c, const char *p, int depth, int emit) {
  const char *e = c->end;
  if (!put(c, emit, "[", 1)) return NULL;
  p = ws(p + 1, e);
  if (p < e && *p == ']') return put(c, emit, "]", 1) ? p + 1 : NULL;
  for (int i = 0;; i++) {
    if (i && !put(c, emit, ", ", 2)) return NULL;
    if (!(p = val(c, p, depth + 1, emit))) return NULL;
    p = ws(p, e);
    if (p < e && *p == ',') {
      p = ws(p + 1, e);
      continue;
    }
    if (p < e && *p == ']') return put(c, emit, "]", 1) ? p + 1 : NULL;
    return fail(c, p, "expected ',' or ']'");
  }
}

static const char *word(ctx *c, const char *p, const char *w, int emit) {
  size_t n = strlen(w);
  if ((size_t)(c->end - p) < n || memcmp(p, w, n)) return fail(c, p, "unexpected character");
  return put(c, emit, w, n) ? p + n : NULL;
}

static const char *val(ctx *c, const char *p, int depth, int emit) {
  if (depth > MAX_DEPTH) return fail(c, p, "nested too deeply");
  if (p >= c->end) return fail(c, p, "expected a value");
  switch (*p) {
    case '{':
      return object(c, p, depth, emit);
    case '[':
      return array(c, p, depth, emit);
    case '"':
      return str(c, p, NULL, emit);
    case 't':
      return word(c, p, "true", emit);
    case 'f':
      return word(c, p, "false", emit);
    case 'n':
      return word(c, p, "null", emit);
    case 'N':
      return word(c, p, "NaN", emit);
    case 'I':
      return word(c, p, "Infinity", emit);
    default:
      return num(c, p, emit);
  }
}

static mml_status whole(mml_span s, mml_bytes *out, mml_err *err) {
  ctx c = {s.p, s.p + s.n, out, err, MML_OK};
  size_t len0 = out ? out->len : 0;
  const char *p = ws(s.p, c.end);
  p = val(&c, p, 0, 1);
  if (p) {
    p = ws(p, c.end);
    if (p != c.end) fail(&c, p, "extra data after the value");
  }
  if (c.st && out) out->len = len0;
  return c.st;
}

mml_status mml_pyjson_check(mml_span s, mml_err *err) { return whole(s, NULL, err); }

mml_status mml_pyjson_dumps(mml_span s, mml_bytes *out, mml_err *err) { return whole(s, out, err); }

char mml_pyjson_kind(mml_span s) {
  const char *p = ws(s.p, s.p + s.n);
  return p < s.p + s.n ? *p : 0;
}

/* Walks the elements (or members) of a container; calls back with each value (and key). */
static int walk(mml_span s, int (*fn)(void *, const char *key, const char *v, const char *ve),
                void *arg) {
  ctx c = {s.p, s.p + s.n, NULL, NULL, MML_OK};
  const char *e = c.end, *p = ws(s.p, e);
  if (p >= e || (*p != '[' && *p != '{')) return 0;
  int obj = *p == '{';
  p = ws(p + 1, e);
  if (p < e && (*p == ']' || *p == '}')) return 1;
  for (;;) {
    const char *key = NULL;
    if (obj) {
      key = p;
      if (!(p = str(&c, p, NULL, 0))) return 0;
      p = ws(p, e);
      if (p >= e || *p != ':') return 0;
      p = ws(p + 1, e);
    }
    const char *v = p;
    if (!(p = val(&c, p, 1, 0))) return 0;
    if (fn(arg, key, v, p)) return 1;
    p = ws(p, e);
    if (p >= e || *p != ',') return 1;
    p = ws(p + 1, e);
  }
}

typedef struct find_ctx {
  int want, at;
  const char *key;
  mml_span found;
  int ok;
} find_ctx;

static int count_fn(void *a, const char *key, const char *v, const char *ve) {
  ((find_ctx *)a)->at++;
  return 0;
}

static int item_fn(void *a, const char *key, const char *v, const char *ve) {
  find_ctx *f = a;
  if (f->at++ != f->want) return 0;
  f->found = (mml_span){v, (size_t)(ve - v)};
  f->ok = 1;
  return 1;
}

static int member_fn(void *a, const char *key, const char *v, const char *ve) {
  find_ctx *f = a;
  if (key && mml_pyjson_string_is((mml_span){key, (size_t)(v - key)}, f->key)) {
    f->found = (mml_span){v, (size_t)(ve - v)};
    f->ok = 1; /* keep walking: the last one wins */
  }
  return 0;
}

int mml_pyjson_len(mml_span s) {
  find_ctx f = {0};
  walk(s, count_fn, &f);
  return f.at;
}

int mml_pyjson_item(mml_span arr, int i, mml_span *out) {
  find_ctx f = {.want = i};
  if (mml_pyjson_kind(arr) != '[') return 0;
  walk(arr, item_fn, &f);
  if (f.ok) *out = f.found;
  return f.ok;
}

int mml_pyjson_member(mml_span obj, const char *key, mml_span *out) {
  find_ctx f = {.key = key};
  if (mml_pyjson_kind(obj) != '{') return 0;
  walk(obj, member_fn, &f);
  if (f.ok) *out = f.found;
  return f.ok;
}

int mml_pyjson_string_is(mml_span v, const char *s) {
  const char *p = ws(v.p, v.p + v.n);
  if (p >= v.p + v.n || *p != '"') return 0;
  ctx c = {v.p, v.p + v.n, NULL, NULL, MML_OK};
  mml_bytes dec = {0};
  int eq = str(&c, p, &dec, 0) && dec.len == strlen(s) && !memcmp(dec.data, s, dec.len);
  mml_bytes_free(&dec);
  return eq;
}
