/*
 * pretok.c — the text side of the tokenizer before BPE: UTF-8 validation/repair, NFC and
 * the Qwen pre-tokenizer regex reproduced by a hand-written scanner.
 *
 * Design
 *   - Process-wide tables (2.2 MB plus a small composition hash, built once under
 *     pthread_once from utf8proc's Unicode data, read-only afterwards) give for every code
 *     point its regex class (\p{L}, \p{N}, \s = White_Space, other), its canonical
 *     combining class and NFC bits (quick check, has a decomposition).  After init every
 *     function here is reentrant and lock-free; any number of threads may call them.
 *   - NFC: a quick check (ASCII and all "NFC_QC = Yes" characters with well-ordered
 *     combining classes) answers most text without copying; otherwise NFC is computed by
 *     the book from utf8proc's decompositions.  Where the Unicode data of `tokenizers`
 *     differs from utf8proc's (newer letters in its regex engine, older NFC tables), the
 *     generated unicode_delta.h (tools/gen_unicode_tables.py) says what `tokenizers` does.
 *   - The scanner is the regex's leftmost-first alternation unrolled by hand; each rule
 *     below quotes the alternative it implements and how backtracking resolves it.
 */
#include "mml/pretok.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define UC_CLASS_MASK 3u
#define UC_NFC_MAYBE 4u /* not NFC_QC=Yes: a composition second, or NFC(c) != c */
#define UC_CCC 8u       /* canonical combining class != 0 */
#define UC_DECOMP 16u   /* has a canonical decomposition (that tokenizers applies) */
#define UC_MAX 0x110000

#include "unicode_delta.h"

static uint8_t g_uc[UC_MAX];  /* class | flags */
static uint8_t g_ccc[UC_MAX]; /* canonical combining class, as tokenizers knows it */

/* Canonical compositions (Hangul aside): (first << 21 | second) -> composite. */
#define COMP_SLOTS 8192
static struct {
  uint64_t key; /* 0: empty (key is stored + 1) */
  int32_t c;
} g_comp[COMP_SLOTS];

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static mml_status g_init_status = MML_EINTERNAL;

static int is_white_space(int32_t c) {
  /* Unicode White_Space, which is what \s means for Unicode text in Oniguruma. */
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

static uint64_t comp_key(int32_t a, int32_t b) { return (((uint64_t)a << 21) | (uint64_t)b) + 1; }

static int comp_put(int32_t a, int32_t b, int32_t c) {
  uint64_t k = comp_key(a, b);
  for (size_t i = (k * 0x9E3779B97F4A7C15ull) >> 51, n = 0; n < COMP_SLOTS;
       i = (i + 1) & (COMP_SLOTS - 1), n++) {
    if (g_comp[i].key == 0 || g_comp[i].key == k) {
      g_comp[i].key = k;
      g_comp[i].c = c;
      return 0;
    }
  }
  return -1;
}

static int32_t compose_pair(int32_t a, int32_t b) {
  if (a >= 0x1100 && a <= 0x1112 && b >= 0x1161 && b <= 0x1175) /* Hangul L + V */
    return 0xAC00 + ((a - 0x1100) * 21 + (b - 0x1161)) * 28;
  if (a >= 0xAC00 && a <= 0xD7A3 && (a - 0xAC00) % 28 == 0 && b >= 0x11A8 && b <= 0x11C2)
    return a + (b - 0x11A7); /* Hangul LV + T */
  uint64_t k = comp_key(a, b);
  for (size_t i = (k * 0x9E3779B97F4A7C15ull) >> 51;; i = (i + 1) & (COMP_SLOTS - 1)) {
    if (g_comp[i].key == k) return g_comp[i].c;
    if (g_comp[i].key == 0) return -1;
  }
}

static int in_no_decomp(int32_t c) {
  for (size_t i = 0; k_no_decomp[i].lo >= 0; i++)
    if (c >= k_no_decomp[i].lo && c <= k_no_decomp[i].hi) return 1;
  return 0;
}

static int in_no_compose(int32_t a, int32_t b) {
  for (size_t i = 0; k_no_compose[i].a >= 0; i++)
    if (k_no_compose[i].a == a && k_no_compose[i].b == b) return 1;
  return 0;
}

static void build_tables(void) {
  for (int32_t c = 0; c < UC_MAX; c++) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    const utf8proc_property_t *p = utf8proc_get_property(c);
    uint8_t f = MML_UC_OTHER;
    switch (p->category) {
      case UTF8PROC_CATEGORY_LU:
      case UTF8PROC_CATEGORY_LL:
      case UTF8PROC_CATEGORY_LT:
      case UTF8PROC_CATEGORY_LM:
      case UTF8PROC_CATEGORY_LO:
        f = MML_UC_L;
        break;
      case UTF8PROC_CATEGORY_ND:
      case UTF8PROC_CATEGORY_NL:
      case UTF8PROC_CATEGORY_NO:
        f = MML_UC_N;
        break;
      default:
        break;
    }
    if (is_white_space(c)) f = MML_UC_S;
    g_uc[c] = f;
    g_ccc[c] = (uint8_t)p->combining_class;
  }
  for (size_t i = 0; k_class_overrides[i].lo >= 0; i++)
    for (int32_t c = k_class_overrides[i].lo; c <= k_class_overrides[i].hi; c++)
      g_uc[c] = (uint8_t)((g_uc[c] & ~UC_CLASS_MASK) | k_class_overrides[i].cls);
  for (size_t i = 0; k_ccc_zero[i].lo >= 0; i++)
    for (int32_t c = k_ccc_zero[i].lo; c <= k_ccc_zero[i].hi; c++) g_ccc[c] = 0;
  for (int32_t c = 0; c < UC_MAX; c++)
    if (g_ccc[c]) g_uc[c] |= UC_CCC;

  for (int32_t c = 0; c < UC_MAX; c++) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    if (c >= 0xAC00 && c <= 0xD7A3) { /* Hangul syllables: algorithmic, NFC-stable */
      g_uc[c] |= UC_DECOMP;
      continue;
    }
    const utf8proc_property_t *p = utf8proc_get_property(c);
    if (p->decomp_seqindex == UINT16_MAX || p->decomp_type != 0 || in_no_decomp(c)) continue;
    utf8proc_int32_t dec[32], comp[32];
    int last = 0;
    utf8proc_ssize_t n = utf8proc_decompose_char(c, dec, 32, UTF8PROC_DECOMPOSE, &last);
    if (n <= 0 || n > 32 || (n == 1 && dec[0] == c)) continue;
    g_uc[c] |= UC_DECOMP;
    memcpy(comp, dec, (size_t)n * sizeof *dec);
    utf8proc_ssize_t m = utf8proc_normalize_utf32(comp, n, UTF8PROC_COMPOSE | UTF8PROC_STABLE);
    if (m == 1 && comp[0] == c) {
      /* A primary composite: its last pair composes; everything after the first code point
       * of its decomposition may compose with what precedes it (a superset of
       * NFC_QC = Maybe). */
      memcpy(comp, dec, (size_t)(n - 1) * sizeof *dec);
      utf8proc_ssize_t h =
          utf8proc_normalize_utf32(comp, n - 1, UTF8PROC_COMPOSE | UTF8PROC_STABLE);
      if (h == 1 && !in_no_compose(comp[0], dec[n - 1]) && comp_put(comp[0], dec[n - 1], c)) {
        g_init_status = MML_EINTERNAL;
        return;
      }
      for (utf8proc_ssize_t i = 1; i < n; i++)
        if (dec[i] >= 0 && dec[i] < UC_MAX) g_uc[dec[i]] |= UC_NFC_MAYBE;
    } else {
      g_uc[c] |= UC_NFC_MAYBE; /* NFC_QC = No */
    }
  }
  /* Hangul V and T jamo compose algorithmically with a preceding L or LV. */
  for (int32_t c = 0x1161; c <= 0x1175; c++) g_uc[c] |= UC_NFC_MAYBE;
  for (int32_t c = 0x11A8; c <= 0x11C2; c++) g_uc[c] |= UC_NFC_MAYBE;
  g_init_status = MML_OK;
}

mml_status mml_pretok_init(void) {
  if (pthread_once(&g_once, build_tables) != 0) return MML_EINTERNAL;
  return g_init_status;
}

int mml_uc_class(int32_t cp) {
  return (cp >= 0 && cp < UC_MAX) ? (int)(g_uc[cp] & UC_CLASS_MASK) : MML_UC_OTHER;
}

/* ---- UTF-8 ------------------------------------------------------------------------- */

/* Length of the valid sequence at s[i] (> 0), or minus the length of the maximal invalid
 * subpart there (Unicode 3.9, "substitution of maximal subparts"). */
static long utf8_step(const uint8_t *s, size_t len, size_t i) {
  uint8_t c = s[i];
  if (c < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF)
    need = 1;
  else if (c == 0xE0)
    need = 2, lo = 0xA0;
  else if (c >= 0xE1 && c <= 0xEC)
    need = 2;
  else if (c == 0xED)
    need = 2, hi = 0x9F;
  else if (c >= 0xEE && c <= 0xEF)
    need = 2;
  else if (c == 0xF0)
    need = 3, lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3)
    need = 3;
  else if (c == 0xF4)
    need = 3, hi = 0x8F;
  else
    return -1;
  size_t k = 1;
  for (; k <= need; k++) {
    if (i + k >= len) return -(long)k;
    uint8_t b = s[i + k];
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return -(long)k;
  }
  return (long)k;
}

size_t mml_utf8_valid_prefix(const uint8_t *s, size_t len) {
  size_t i = 0;
  while (i < len) {
    /* ASCII fast path, eight bytes at a time. */
    while (i + 8 <= len) {
      uint64_t w;
      memcpy(&w, s + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= len) break;
    long n = utf8_step(s, len, i);
    if (n < 0) return i;
    i += (size_t)n;
  }
  return len;
}

mml_status mml_utf8_sanitize(const uint8_t *s, size_t len, mml_bytes *out) {
  static const uint8_t fffd[3] = {0xEF, 0xBF, 0xBD};
  size_t i = 0;
  while (i < len) {
    size_t ok = mml_utf8_valid_prefix(s + i, len - i);
    if (ok && mml_bytes_append(out, s + i, ok) != MML_OK) return MML_ENOMEM;
    i += ok;
    if (i >= len) break;
    long n = utf8_step(s, len, i);
    if (mml_bytes_append(out, fffd, 3) != MML_OK) return MML_ENOMEM;
    i += (size_t)(-n);
  }
  return MML_OK;
}

/* Decodes the code point at s[i] of valid UTF-8; *n receives its byte length. */
static inline int32_t cp_at(const uint8_t *s, size_t i, size_t *n) {
  uint8_t c = s[i];
  if (c < 0x80) {
    *n = 1;
    return c;
  }
  if (c < 0xE0) {
    *n = 2;
    return ((int32_t)(c & 0x1F) << 6) | (s[i + 1] & 0x3F);
  }
  if (c < 0xF0) {
    *n = 3;
    return ((int32_t)(c & 0x0F) << 12) | ((int32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
  }
  *n = 4;
  return ((int32_t)(c & 0x07) << 18) | ((int32_t)(s[i + 1] & 0x3F) << 12) |
         ((int32_t)(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
}

static inline int cls_at(const uint8_t *s, size_t i, size_t *n, int32_t *cp) {
  int32_t c = cp_at(s, i, n);
  if (cp) *cp = c;
  return g_uc[c] & UC_CLASS_MASK;
}

/* ---- NFC --------------------------------------------------------------------------- */

int mml_nfc_quick_check(const uint8_t *s, size_t len) {
  size_t i = 0;
  int last_ccc = 0;
  while (i < len) {
    if (s[i] < 0x80) {
      last_ccc = 0;
      i++;
      continue;
    }
    size_t n;
    int32_t c = cp_at(s, i, &n);
    uint8_t f = g_uc[c];
    if (f & UC_NFC_MAYBE) return 0;
    if (f & UC_CCC) {
      int ccc = g_ccc[c];
      if (ccc < last_ccc) return 0;
      last_ccc = ccc;
    } else {
      last_ccc = 0;
    }
    i += n;
  }
  return 1;
}

size_t mml_utf8_put(int32_t c, uint8_t *o) {
  if (c < 0x80) {
    o[0] = (uint8_t)c;
    return 1;
  }
  if (c < 0x800) {
    o[0] = (uint8_t)(0xC0 | (c >> 6));
    o[1] = (uint8_t)(0x80 | (c & 0x3F));
    return 2;
  }
  if (c < 0x10000) {
    o[0] = (uint8_t)(0xE0 | (c >> 12));
    o[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
    o[2] = (uint8_t)(0x80 | (c & 0x3F));
    return 3;
  }
  o[0] = (uint8_t)(0xF0 | (c >> 18));
  o[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
  o[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
  o[3] = (uint8_t)(0x80 | (c & 0x3F));
  return 4;
}

/* NFC by the book (UAX #15): canonical decomposition, canonical ordering, canonical
 * composition; with the data tokenizers uses (see unicode_delta.h). */
mml_status mml_nfc_append(const uint8_t *s, size_t len, mml_bytes *out) {
  if (len == 0) return MML_OK;
  size_t cap = len * 4 + 32; /* a byte is at least a code point; decompositions <= 4x */
  int32_t *buf = malloc(cap * sizeof *buf);
  if (!buf) return MML_ENOMEM;
  size_t n = 0;
  for (size_t i = 0; i < len;) {
    size_t k;
    int32_t c = cp_at(s, i, &k);
    i += k;
    if (g_uc[c] & UC_DECOMP) {
      int last = 0;
      utf8proc_ssize_t m = utf8proc_decompose_char(c, buf + n, (utf8proc_ssize_t)(cap - n),
                                                   UTF8PROC_DECOMPOSE, &last);
      if (m <= 0 || (size_t)m > cap - n) {
        free(buf);
        return MML_EINTERNAL;
      }
      n += (size_t)m;
    } else {
      buf[n++] = c;
    }
  }
  /* canonical ordering: stable insertion sort of each run of non-starters */
  for (size_t i = 1; i < n; i++) {
    int cc = g_ccc[buf[i]];
    if (!cc) continue;
    for (size_t j = i; j > 0 && g_ccc[buf[j - 1]] > cc; j--) {
      int32_t t = buf[j - 1];
      buf[j - 1] = buf[j];
      buf[j] = t;
    }
  }
  /* canonical composition, in place */
  size_t o = 0;
  long starter = -1;
  int prev_cc = 0;
  for (size_t i = 0; i < n; i++) {
    int32_t c = buf[i];
    int cc = g_ccc[c];
    if (starter >= 0 && ((long)o - 1 == starter || (prev_cc != 0 && prev_cc < cc))) {
      int32_t comp = compose_pair(buf[starter], c);
      if (comp >= 0) {
        buf[starter] = comp;
        continue;
      }
    }
    if (cc == 0) starter = (long)o;
    buf[o++] = c;
    prev_cc = cc;
  }
  mml_status st = mml_bytes_reserve(out, out->len + o * 4);
  if (st == MML_OK) {
    for (size_t i = 0; i < o; i++) out->len += mml_utf8_put(buf[i], out->data + out->len);
  }
  free(buf);
  return st;
}

/* ---- The split regex --------------------------------------------------------------- */

static inline int is_crlf(uint8_t b) { return b == '\r' || b == '\n'; }

/* End of the run of class `cls` starting at i. */
static size_t scan_class(const uint8_t *s, size_t len, size_t i, int cls) {
  while (i < len) {
    size_t n;
    if (cls_at(s, i, &n, NULL) != cls) break;
    i += n;
  }
  return i;
}

size_t mml_pretok_next(const uint8_t *s, size_t len, size_t pos) {
  size_t n0, n1 = 0;
  int32_t c0, c1 = -1;
  int k0 = cls_at(s, pos, &n0, &c0), k1 = -1;
  size_t p1 = pos + n0;
  if (p1 < len) k1 = cls_at(s, p1, &n1, &c1);

  /* (?i:'s|'t|'re|'ve|'m|'ll|'d) — case-insensitive under Unicode case folding, where
   * U+017F (long s) folds to 's'. */
  if (c0 == '\'' && c1 >= 0) {
    int32_t l1 = (c1 >= 'A' && c1 <= 'Z') ? c1 + 32 : c1;
    if (l1 == 's' || l1 == 't' || l1 == 'm' || l1 == 'd' || c1 == 0x17F) return p1 + n1;
    if ((l1 == 'r' || l1 == 'v' || l1 == 'l') && p1 + n1 < len) {
      uint8_t b2 = s[p1 + n1];
      int l2 = (b2 >= 'A' && b2 <= 'Z') ? b2 + 32 : b2;
      if ((l1 != 'l' && l2 == 'e') || (l1 == 'l' && l2 == 'l')) return p1 + n1 + 1;
    }
  }
  /* [^\r\n\p{L}\p{N}]?\p{L}+ */
  if (k0 == MML_UC_L) return scan_class(s, len, p1, MML_UC_L);
  if (k0 != MML_UC_N && c0 != '\r' && c0 != '\n' && k1 == MML_UC_L)
    return scan_class(s, len, p1 + n1, MML_UC_L);
  /* \p{N} */
  if (k0 == MML_UC_N) return p1;
  /* " ?[^\s\p{L}\p{N}]+[\r\n]*" */
  if (k0 == MML_UC_OTHER || (c0 == ' ' && k1 == MML_UC_OTHER)) {
    size_t e = scan_class(s, len, k0 == MML_UC_OTHER ? p1 : p1 + n1, MML_UC_OTHER);
    while (e < len && is_crlf(s[e])) e++;
    return e;
  }
  /* Now c0 is \s.  Let the maximal whitespace run be [pos, e). */
  size_t e = p1, nl_end = is_crlf((uint8_t)c0) ? p1 : 0;
  while (e < len) {
    size_t n;
    int32_t c;
    if (cls_at(s, e, &n, &c) != MML_UC_S) break;
    e += n;
    if (c == '\r' || c == '\n') nl_end = e;
  }
  /* \s*[\r\n]+ — \s* gives back characters until [\r\n]+ can match: the match ends just
   * after the run's last CR or LF. */
  if (nl_end) return nl_end;
  /* \s+(?!\S) — the whole run at the end of text, else the run minus its last character
   * (which is then followed by whitespace), when that leaves at least one. */
  if (e == len) return e;
  size_t last = e - 1;
  while ((s[last] & 0xC0) == 0x80) last--;
  if (last > pos) return last;
  /* \s+ */
  return e;
}
