/*
 * tokenizer.c — byte-level BPE from a Hugging Face tokenizer.json, encoding exactly like
 * the `tokenizers` library for the Qwen2 / Qwen2.5 / Qwen3 configuration.
 *
 * Design
 *   - Load parses the JSON with cJSON, copies every token string into one arena and
 *     builds open-addressing hash tables (token -> id, (left id, right id) -> merge rank
 *     and result).  After load the tokenizer is immutable: any number of threads may
 *     encode/decode with it concurrently without locks.
 *   - Mutable state lives in mml_tok_scratch (one per thread): normalisation buffers, BPE
 *     work arrays and a cache of recently seen words -> ids (dropped when the scratch is
 *     used with another tokenizer).  A NULL scratch makes the call use a temporary one,
 *     without the cache.
 *   - encode = the `tokenizers` pipeline:
 *       1. invalid UTF-8 is replaced (maximal subparts -> U+FFFD), as a Python caller's
 *          bytes.decode("utf-8", "replace") would;
 *       2. added tokens with normalized=false are split out of the raw text (leftmost,
 *          then longest; honouring single_word / lstrip / rstrip);
 *       3. each remaining piece is NFC-normalised, then added tokens with normalized=true
 *          are split out of it;
 *       4. the Qwen regex (pretok.c) cuts the rest into words; each word's bytes map to
 *          the byte-level symbols and are merged lowest rank first (leftmost on ties).
 *   - decode = the ByteLevel decoder: each token's characters map back to bytes (or the
 *     token's own UTF-8 when some character has no byte), then invalid UTF-8 becomes
 *     U+FFFD like Rust's String::from_utf8_lossy.
 */
#include "mml/tokenizer.h"

#include "mml/message.h"

#include <cjson/cJSON.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "mml/pretok.h"

#define MAX_TOKEN_ID (1 << 22) /* bounds the per-id tables a bad file can make us allocate */
#define BPE_SMALL 96          /* words up to this many symbols use the O(n^2) merge loop */
#define CACHE_SLOTS (1u << 14)
#define CACHE_MAX_WORD 128    /* longer words are not cached */
#define NO_RANK UINT32_MAX

static const char k_qwen_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* ---- hashing ----------------------------------------------------------------------- */

static inline uint64_t hash_bytes(const void *p, size_t n) {
  const uint8_t *s = p;
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, s, 8);
    h = (h ^ w) * 0xC2B2AE3D27D4EB4Full;
    h ^= h >> 31;
    s += 8;
    n -= 8;
  }
  if (n) {
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0xC2B2AE3D27D4EB4Full;
  }
  h ^= h >> 29;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 32;
  return h;
}

static size_t pow2_at_least(size_t n) {
  size_t c = 16;
  while (c < n) c <<= 1;
  return c;
}

/* ---- the tokenizer ----------------------------------------------------------------- */

typedef struct {
  uint64_t h;
  uint32_t off, len; /* into the arena */
  int32_t id;        /* -1: empty slot */
} str_slot;

typedef struct {
  str_slot *slots;
  size_t mask, count;
} str_map;

typedef struct {
  uint64_t key; /* (left << 32) | right; UINT64_MAX: empty */
  uint32_t rank;
  int32_t id;
} merge_slot;

typedef struct {
  uint32_t off, len; /* content (for the normalized set: its NFC form) */
  int32_t id;
  uint8_t special, single_word, lstrip, rstrip, normalized;
} added_tok;

/* The added tokens of one kind (normalized or not), grouped by first byte. */
typedef struct {
  added_tok *toks; /* sorted by first byte */
  size_t n;
  uint32_t first[257]; /* toks[first[b] .. first[b+1]) start with byte b */
} added_set;

struct mml_tokenizer {
  char *arena;
  size_t arena_len, arena_cap;
  str_map vocab;           /* model vocabulary */
  str_map added_map;       /* added token content -> id */
  merge_slot *merges;
  size_t merges_mask, n_merges;
  int32_t byte_id[256];    /* id of the byte-level symbol of each byte, -1 if absent */
  uint8_t byte_sym[256][2], byte_sym_len[256]; /* UTF-8 of each byte's symbol */
  int32_t unk_id;
  int nfc, ignore_merges;
  size_t n_ids;            /* 1 + the largest id */
  uint32_t *tok_off, *tok_len; /* per id: the token string (added content wins) */
  uint32_t *dec_off, *dec_len; /* per id: its bytes for decode */
  uint8_t *dec_arena;
  uint8_t *special;        /* per id */
  added_set raw, norm;     /* normalized=false / normalized=true added tokens */
  size_t vocab_size;       /* distinct strings, added tokens included */
  uint64_t serial;         /* unique per loaded tokenizer: scratch caches check it */
};

static _Atomic uint64_t g_serial;

static mml_status arena_add(mml_tokenizer *t, const void *p, size_t n, uint32_t *off) {
  if (t->arena_len + n + 1 > t->arena_cap) {
    size_t c = t->arena_cap ? t->arena_cap : 1 << 16;
    while (c < t->arena_len + n + 1) c *= 2;
    if (c > UINT32_MAX) return MML_ENOMEM;
    char *a = realloc(t->arena, c);
    if (!a) return MML_ENOMEM;
    t->arena = a;
    t->arena_cap = c;
  }
  *off = (uint32_t)t->arena_len;
  memcpy(t->arena + t->arena_len, p, n);
  t->arena_len += n;
  t->arena[t->arena_len++] = 0;
  return MML_OK;
}

static mml_status str_map_init(str_map *m, size_t n) {
  size_t cap = pow2_at_least(n + n / 2 + 16); /* load factor <= 2/3 */
  m->slots = malloc(cap * sizeof *m->slots);
  if (!m->slots) return MML_ENOMEM;
  for (size_t i = 0; i < cap; i++) m->slots[i].id = -1;
  m->mask = cap - 1;
  m->count = 0;
  return MML_OK;
}

static int32_t str_map_get(const str_map *m, const char *arena, const char *s, size_t n) {
  if (!m->slots) return -1;
  uint64_t h = hash_bytes(s, n);
  for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
    const str_slot *e = &m->slots[i];
    if (e->id < 0) return -1;
    if (e->h == h && e->len == n && memcmp(arena + e->off, s, n) == 0) return e->id;
  }
}

/* Inserts or overwrites; the string must already be in the arena at off. */
static void str_map_put(str_map *m, const char *arena, uint32_t off, uint32_t n, int32_t id) {
  uint64_t h = hash_bytes(arena + off, n);
  for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
    str_slot *e = &m->slots[i];
    if (e->id < 0) {
      *e = (str_slot){h, off, n, id};
      m->count++;
      return;
    }
    if (e->h == h && e->len == n && memcmp(arena + e->off, arena + off, n) == 0) {
      e->id = id;
      return;
    }
  }
}

static inline const merge_slot *merge_get(const mml_tokenizer *t, int32_t a, int32_t b) {
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  uint64_t h = key * 0x9E3779B97F4A7C15ull;
  for (size_t i = (h >> 20) & t->merges_mask;; i = (i + 1) & t->merges_mask) {
    const merge_slot *e = &t->merges[i];
    if (e->key == key) return e;
    if (e->key == UINT64_MAX) return NULL;
  }
}

static void merge_put(mml_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id) {
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  uint64_t h = key * 0x9E3779B97F4A7C15ull;
  for (size_t i = (h >> 20) & t->merges_mask;; i = (i + 1) & t->merges_mask) {
    merge_slot *e = &t->merges[i];
    if (e->key == UINT64_MAX || e->key == key) { /* a repeated pair keeps its last rank */
      if (e->key == UINT64_MAX) t->n_merges++;
      *e = (merge_slot){key, rank, id};
      return;
    }
  }
}

void mml_tokenizer_free(mml_tokenizer *t) {
  if (!t) return;
  free(t->arena);
  free(t->vocab.slots);
  free(t->added_map.slots);
  free(t->merges);
  free(t->tok_off);
  free(t->tok_len);
  free(t->dec_off);
  free(t->dec_len);
  free(t->dec_arena);
  free(t->special);
  free(t->raw.toks);
  free(t->norm.toks);
  free(t);
}

/* ---- byte-level alphabet (GPT-2) ----------------------------------------------------- */

/* byte -> code point of its symbol, and code point (< 324) -> byte. */
static void byte_alphabet(int32_t b2c[256], int16_t c2b[324]) {
  for (int i = 0; i < 324; i++) c2b[i] = -1;
  int extra = 0;
  for (int b = 0; b < 256; b++) {
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    b2c[b] = printable ? b : 256 + extra++;
    c2b[b2c[b]] = (int16_t)b;
  }
}

/* ---- loading ------------------------------------------------------------------------- */

static int json_bool(const cJSON *o, const char *k, int dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
  return dflt;
}

static const char *json_str(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int type_is(const cJSON *o, const char *type) {
  const char *s = json_str(o, "type");
  return s && strcmp(s, type) == 0;
}

static int json_id(const cJSON *v, int32_t *id) {
  if (!cJSON_IsNumber(v)) return 0;
  double d = v->valuedouble;
  if (!(d >= 0 && d < MAX_TOKEN_ID) || d != (double)(int32_t)d) return 0;
  *id = (int32_t)d;
  return 1;
}

/* Accepts: null, NFC, or a Sequence of NFC normalizers. */
static mml_status check_normalizer(mml_tokenizer *t, const cJSON *n, mml_err *err) {
  if (!n || cJSON_IsNull(n)) return MML_OK;
  if (type_is(n, "NFC")) {
    t->nfc = 1;
    return MML_OK;
  }
  if (type_is(n, "Sequence")) {
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(n, "normalizers")) {
      mml_status st = check_normalizer(t, it, err);
      if (st) return st;
    }
    return MML_OK;
  }
  return mml_err_set(err, MML_ECONFIG, "unsupported normalizer type %s (only NFC)",
                     json_str(n, "type") ? json_str(n, "type") : "?");
}

static mml_status check_byte_level(const cJSON *b, const char *what, mml_err *err) {
  if (json_bool(b, "add_prefix_space", 0) || json_bool(b, "use_regex", 0))
    return mml_err_set(err, MML_ECONFIG,
                       "%s ByteLevel with add_prefix_space or use_regex is not supported", what);
  return MML_OK;
}

/* Accepts exactly the Qwen pre-tokenizer: Split(Qwen regex, Isolated) then ByteLevel. */
static mml_status check_pre_tokenizer(const cJSON *p, mml_err *err) {
  const cJSON *seq = type_is(p, "Sequence") ? cJSON_GetObjectItemCaseSensitive(p, "pretokenizers")
                                            : NULL;
  if (!cJSON_IsArray(seq) || cJSON_GetArraySize(seq) != 2)
    return mml_err_set(err, MML_ECONFIG,
                       "unsupported pre_tokenizer: expected Sequence[Split, ByteLevel]");
  const cJSON *split = cJSON_GetArrayItem(seq, 0), *bl = cJSON_GetArrayItem(seq, 1);
  const cJSON *pat = cJSON_GetObjectItemCaseSensitive(split, "pattern");
  const char *re = json_str(pat, "Regex");
  const char *beh = json_str(split, "behavior");
  if (!type_is(split, "Split") || !re || strcmp(re, k_qwen_regex) != 0 || !beh ||
      strcmp(beh, "Isolated") != 0 || json_bool(split, "invert", 0))
    return mml_err_set(err, MML_ECONFIG,
                       "unsupported pre_tokenizer: the Split must be the Qwen regex, Isolated");
  if (!type_is(bl, "ByteLevel"))
    return mml_err_set(err, MML_ECONFIG, "unsupported pre_tokenizer: expected ByteLevel after Split");
  return check_byte_level(bl, "pre_tokenizer", err);
}

static mml_status build_added_set(mml_tokenizer *t, added_set *set) {
  /* counting sort by first byte keeps the file order within a group */
  added_tok *sorted = set->n ? malloc(set->n * sizeof *sorted) : NULL;
  if (set->n && !sorted) return MML_ENOMEM;
  uint32_t count[257] = {0};
  for (size_t i = 0; i < set->n; i++) count[(uint8_t)t->arena[set->toks[i].off] + 1]++;
  for (int b = 0; b < 256; b++) count[b + 1] += count[b];
  memcpy(set->first, count, sizeof count);
  for (size_t i = 0; i < set->n; i++) sorted[count[(uint8_t)t->arena[set->toks[i].off]]++] = set->toks[i];
  free(set->toks);
  set->toks = sorted;
  return MML_OK;
}

static mml_status load_added(mml_tokenizer *t, const cJSON *arr, mml_bytes *tmp, mml_err *err) {
  size_t n = (size_t)cJSON_GetArraySize(arr);
  t->raw.toks = calloc(n + 1, sizeof(added_tok));
  t->norm.toks = calloc(n + 1, sizeof(added_tok));
  if (!t->raw.toks || !t->norm.toks || str_map_init(&t->added_map, n)) return MML_ENOMEM;
  const cJSON *it;
  size_t i = 0;
  cJSON_ArrayForEach(it, arr) {
    const char *content = json_str(it, "content");
    int32_t id;
    if (!content || !json_id(cJSON_GetObjectItemCaseSensitive(it, "id"), &id))
      return mml_err_set(err, MML_ECONFIG, "added_tokens[%zu]: needs a content and an id", i);
    i++;
    size_t len = strlen(content);
    if (len == 0) continue; /* tokenizers ignores empty added tokens */
    added_tok a = {0};
    a.id = id;
    a.special = (uint8_t)json_bool(it, "special", 0);
    a.single_word = (uint8_t)json_bool(it, "single_word", 0);
    a.lstrip = (uint8_t)json_bool(it, "lstrip", 0);
    a.rstrip = (uint8_t)json_bool(it, "rstrip", 0);
    a.normalized = (uint8_t)json_bool(it, "normalized", !a.special);
    if (arena_add(t, content, len, &a.off)) return MML_ENOMEM;
    a.len = (uint32_t)len;
    str_map_put(&t->added_map, t->arena, a.off, a.len, id);
    if (!a.normalized) {
      t->raw.toks[t->raw.n++] = a;
    } else {
      /* matched against normalized text: store its normalized form */
      mml_bytes_clear(tmp);
      const uint8_t *c = (const uint8_t *)content;
      if (mml_utf8_valid_prefix(c, len) != len)
        return mml_err_set(err, MML_ECONFIG, "added token %d is not valid UTF-8", id);
      if (t->nfc && !mml_nfc_quick_check(c, len)) {
        if (mml_nfc_append(c, len, tmp)) return MML_ENOMEM;
        if (tmp->len == 0) continue;
        if (arena_add(t, tmp->data, tmp->len, &a.off)) return MML_ENOMEM;
        a.len = (uint32_t)tmp->len;
      }
      t->norm.toks[t->norm.n++] = a;
    }
  }
  if (build_added_set(t, &t->raw) || build_added_set(t, &t->norm)) return MML_ENOMEM;
  return MML_OK;
}

static mml_status load_model(mml_tokenizer *t, const cJSON *model, mml_err *err) {
  if (!model || (json_str(model, "type") && !type_is(model, "BPE")))
    return mml_err_set(err, MML_ECONFIG, "unsupported model: only BPE");
  const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
  if (dropout && !cJSON_IsNull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0))
    return mml_err_set(err, MML_ECONFIG, "BPE dropout is not supported");
  const char *pre = json_str(model, "continuing_subword_prefix");
  const char *suf = json_str(model, "end_of_word_suffix");
  if ((pre && *pre) || (suf && *suf))
    return mml_err_set(err, MML_ECONFIG,
                       "BPE continuing_subword_prefix / end_of_word_suffix are not supported");
  t->ignore_merges = json_bool(model, "ignore_merges", 0);

  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
  if (!cJSON_IsObject(vocab)) return mml_err_set(err, MML_ECONFIG, "model.vocab missing");
  size_t nv = (size_t)cJSON_GetArraySize(vocab);
  if (str_map_init(&t->vocab, nv)) return MML_ENOMEM;
  const cJSON *it;
  cJSON_ArrayForEach(it, vocab) {
    int32_t id;
    if (!json_id(it, &id)) {
      char shown[MML_SHORT_CAP(80)];
      return mml_err_set(err, MML_ECONFIG, "model.vocab[\"%s\"]: bad id",
                         mml_text_short(it->string, strlen(it->string), 80, shown, sizeof shown));
    }
    uint32_t off;
    size_t len = strlen(it->string);
    if (arena_add(t, it->string, len, &off)) return MML_ENOMEM;
    str_map_put(&t->vocab, t->arena, off, (uint32_t)len, id);
  }
  const char *unk = json_str(model, "unk_token");
  t->unk_id = unk ? str_map_get(&t->vocab, t->arena, unk, strlen(unk)) : -1;

  const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
  if (merges && !cJSON_IsNull(merges) && !cJSON_IsArray(merges))
    return mml_err_set(err, MML_ECONFIG, "model.merges must be a list");
  size_t nm = cJSON_IsArray(merges) ? (size_t)cJSON_GetArraySize(merges) : 0;
  size_t cap = pow2_at_least(nm + nm / 2 + 16);
  t->merges = malloc(cap * sizeof *t->merges);
  if (!t->merges) return MML_ENOMEM;
  for (size_t i = 0; i < cap; i++) t->merges[i].key = UINT64_MAX;
  t->merges_mask = cap - 1;
  char *buf = NULL;
  size_t bufcap = 0;
  uint32_t rank = 0;
  mml_status st = MML_OK;
  cJSON_ArrayForEach(it, merges) {
    const char *a, *b;
    size_t la, lb;
    if (cJSON_IsString(it)) { /* "a b" */
      a = it->valuestring;
      const char *sp = strchr(a, ' ');
      if (!sp || strchr(sp + 1, ' ')) {
        char shown[MML_SHORT_CAP(80)];
        st = mml_err_set(err, MML_ECONFIG, "merges[%u]: \"%s\" is not \"a b\"", rank,
                         mml_text_short(a, strlen(a), 80, shown, sizeof shown));
        break;
      }
      la = (size_t)(sp - a);
      b = sp + 1;
      lb = strlen(b);
    } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
               cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
               cJSON_IsString(cJSON_GetArrayItem(it, 1))) { /* ["a", "b"] */
      a = cJSON_GetArrayItem(it, 0)->valuestring;
      b = cJSON_GetArrayItem(it, 1)->valuestring;
      la = strlen(a);
      lb = strlen(b);
    } else {
      st = mml_err_set(err, MML_ECONFIG, "merges[%u]: expected \"a b\" or [\"a\", \"b\"]", rank);
      break;
    }
    if (!la || !lb) { /* no vocabulary token is empty; "" would merge nothing */
      st = mml_err_set(err, MML_ECONFIG, "merges[%u]: an empty token", rank);
      break;
    }
    if (la + lb > bufcap) {
      bufcap = (la + lb) * 2 + 64;
      char *nb = realloc(buf, bufcap);
      if (!nb) {
        st = MML_ENOMEM;
        break;
      }
      buf = nb;
    }
    memcpy(buf, a, la);
    memcpy(buf + la, b, lb);
    int32_t ia = str_map_get(&t->vocab, t->arena, a, la);
    int32_t ib = str_map_get(&t->vocab, t->arena, b, lb);
    int32_t iab = str_map_get(&t->vocab, t->arena, buf, la + lb);
    if (ia < 0 || ib < 0 || iab < 0) {
      char sa[MML_SHORT_CAP(60)], sb[MML_SHORT_CAP(60)];
      st = mml_err_set(err, MML_ECONFIG, "merges[%u]: \"%s\" + \"%s\" not in the vocabulary",
                       rank, mml_text_short(a, la, 60, sa, sizeof sa),
                       mml_text_short(b, lb, 60, sb, sizeof sb));
      break;
    }
    merge_put(t, ia, ib, rank, iab);
    rank++;
  }
  free(buf);
  return st;
}

/* Per-id tables: token string, decode bytes, special flag. */
static mml_status build_id_tables(mml_tokenizer *t) {
  size_t n = 0;
  for (size_t i = 0; i <= t->vocab.mask; i++)
    if (t->vocab.slots[i].id >= 0 && (size_t)t->vocab.slots[i].id + 1 > n)
      n = (size_t)t->vocab.slots[i].id + 1;
  const added_set *sets[2] = {&t->raw, &t->norm};
  for (int s = 0; s < 2; s++)
    for (size_t i = 0; i < sets[s]->n; i++)
      if ((size_t)sets[s]->toks[i].id + 1 > n) n = (size_t)sets[s]->toks[i].id + 1;
  t->n_ids = n;
  t->tok_off = calloc(n + 1, sizeof *t->tok_off);
  t->tok_len = malloc((n + 1) * sizeof *t->tok_len);
  t->dec_off = calloc(n + 1, sizeof *t->dec_off);
  t->dec_len = calloc(n + 1, sizeof *t->dec_len);
  t->special = calloc(n + 1, 1);
  if (!t->tok_off || !t->tok_len || !t->dec_off || !t->dec_len || !t->special) return MML_ENOMEM;
  for (size_t i = 0; i <= n; i++) t->tok_len[i] = UINT32_MAX;
  size_t distinct = 0;
  for (size_t i = 0; i <= t->vocab.mask; i++) {
    const str_slot *e = &t->vocab.slots[i];
    if (e->id < 0) continue;
    distinct++;
    t->tok_off[e->id] = e->off;
    t->tok_len[e->id] = e->len;
  }
  /* added tokens win for id -> token (their original content, not the normalized form) */
  for (size_t i = 0; i <= t->added_map.mask; i++) {
    const str_slot *e = &t->added_map.slots[i];
    if (e->id < 0) continue;
    if (str_map_get(&t->vocab, t->arena, t->arena + e->off, e->len) < 0) distinct++;
    t->tok_off[e->id] = e->off;
    t->tok_len[e->id] = e->len;
  }
  for (int s = 0; s < 2; s++)
    for (size_t i = 0; i < sets[s]->n; i++)
      if (sets[s]->toks[i].special) t->special[sets[s]->toks[i].id] = 1;
  t->vocab_size = distinct;

  int32_t b2c[256];
  int16_t c2b[324];
  byte_alphabet(b2c, c2b);
  size_t total = 0;
  for (size_t id = 0; id < n; id++)
    if (t->tok_len[id] != UINT32_MAX) total += t->tok_len[id];
  t->dec_arena = malloc(total + 1);
  if (!t->dec_arena) return MML_ENOMEM;
  size_t pos = 0;
  for (size_t id = 0; id < n; id++) {
    if (t->tok_len[id] == UINT32_MAX) continue;
    const uint8_t *s = (const uint8_t *)t->arena + t->tok_off[id];
    size_t len = t->tok_len[id], i = 0, o = pos;
    int all = 1;
    while (i < len) {
      int32_t c;
      size_t k;
      uint8_t b0 = s[i];
      if (b0 < 0x80) c = b0, k = 1;
      else if (b0 < 0xE0 && i + 1 < len) c = ((b0 & 0x1F) << 6) | (s[i + 1] & 0x3F), k = 2;
      else c = -1, k = 1;
      if (c < 0 || c >= 324 || c2b[c] < 0) {
        all = 0;
        break;
      }
      t->dec_arena[o++] = (uint8_t)c2b[c];
      i += k;
    }
    if (!all) { /* a character without a byte: the token's own UTF-8 */
      memcpy(t->dec_arena + pos, s, len);
      o = pos + len;
    }
    t->dec_off[id] = (uint32_t)pos;
    t->dec_len[id] = (uint32_t)(o - pos);
    pos = o;
  }
  for (int b = 0; b < 256; b++) {
    uint8_t u[4];
    size_t k = mml_utf8_put(b2c[b], u);
    t->byte_id[b] = str_map_get(&t->vocab, t->arena, (const char *)u, k);
    memcpy(t->byte_sym[b], u, k);
    t->byte_sym_len[b] = (uint8_t)k;
  }
  return MML_OK;
}

mml_status mml_tokenizer_load_json(const char *json, size_t len, mml_tokenizer **out,
                                   mml_err *err) {
  *out = NULL;
  mml_status st = mml_pretok_init();
  if (st) return mml_err_set(err, st, "tokenizer: Unicode tables could not be built");
  cJSON *root = cJSON_ParseWithLength(json, len);
  if (!root) {
    const char *where = cJSON_GetErrorPtr();
    long off = where && where >= json && where <= json + len ? (long)(where - json) : -1;
    return mml_err_set(err, MML_ECONFIG, "tokenizer.json: invalid JSON near byte %ld", off);
  }
  mml_tokenizer *t = calloc(1, sizeof *t);
  mml_bytes tmp = {0};
  if (!t) {
    cJSON_Delete(root);
    return mml_err_set(err, MML_ENOMEM, "tokenizer: out of memory");
  }
  t->unk_id = -1;
  t->serial = atomic_fetch_add(&g_serial, 1) + 1;
  st = check_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), err);
  if (!st) st = check_pre_tokenizer(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), err);
  const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
  if (!st && !type_is(dec, "ByteLevel"))
    st = mml_err_set(err, MML_ECONFIG, "unsupported decoder: only ByteLevel");
  if (!st) st = check_byte_level(dec, "decoder", err);
  const cJSON *post = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
  if (!st && post && !cJSON_IsNull(post) && !type_is(post, "ByteLevel"))
    st = mml_err_set(err, MML_ECONFIG, "unsupported post_processor %s (only ByteLevel or null)",
                     json_str(post, "type") ? json_str(post, "type") : "?");
  if (!st) st = load_model(t, cJSON_GetObjectItemCaseSensitive(root, "model"), err);
  if (!st) st = load_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), &tmp, err);
  if (!st) st = build_id_tables(t);
  cJSON_Delete(root);
  mml_bytes_free(&tmp);
#ifdef __GLIBC__
  /* the JSON tree of a large tokenizer.json is ~60 MB of small blocks, freed just now:
   * hand it back to the system rather than keep it in the heap */
  if (len > (1u << 20)) malloc_trim(0);
#endif
  if (st) {
    if (st == MML_ENOMEM) mml_err_set(err, st, "tokenizer: out of memory");
    mml_tokenizer_free(t);
    return st;
  }
  *out = t;
  return MML_OK;
}

mml_status mml_tokenizer_load(const char *path, mml_tokenizer **out, mml_err *err) {
  mml_bytes b = {0};
  *out = NULL;
  mml_status st = mml_read_file(path, 0, -1, &b, err);
  if (st) return st;
  st = mml_tokenizer_load_json((const char *)b.data, b.len, out, err);
  mml_bytes_free(&b);
  if (st) mml_err_prefix(err, "%s", path);
  return st;
}

/* ---- lookups ------------------------------------------------------------------------ */

int32_t mml_tokenizer_token_to_id(const mml_tokenizer *t, const char *tok, size_t len) {
  int32_t id = str_map_get(&t->added_map, t->arena, tok, len);
  return id >= 0 ? id : str_map_get(&t->vocab, t->arena, tok, len);
}

const char *mml_tokenizer_id_to_token(const mml_tokenizer *t, int32_t id, size_t *len) {
  if (id < 0 || (size_t)id >= t->n_ids || t->tok_len[id] == UINT32_MAX) return NULL;
  if (len) *len = t->tok_len[id];
  return t->arena + t->tok_off[id];
}

size_t mml_tokenizer_vocab_size(const mml_tokenizer *t) { return t->vocab_size; }

int mml_tokenizer_is_special(const mml_tokenizer *t, int32_t id) {
  return id >= 0 && (size_t)id < t->n_ids && t->special[id];
}

/* ---- scratch ------------------------------------------------------------------------- */

typedef struct {
  uint64_t h;
  uint32_t key_off, ids_off;
  uint16_t key_len, n_ids; /* key_len 0: empty */
} cache_slot;

typedef struct {
  uint32_t rank, pos;
  int32_t id;
} heap_item;

struct mml_tok_scratch {
  mml_bytes clean, norm, mapped;
  /* BPE work arrays, capacity `cap` symbols */
  int32_t *sym, *nid, *prev, *next;
  uint32_t *rank;
  heap_item *heap;
  size_t cap;
  /* word cache: words -> ids of the tokenizer whose serial is cache_owner */
  int no_cache;
  uint64_t cache_owner;
  cache_slot *cache;
  size_t cache_count;
  mml_bytes cache_keys;
  mml_ids cache_ids;
};

mml_status mml_tok_scratch_new(mml_tok_scratch **out) {
  *out = calloc(1, sizeof **out);
  return *out ? MML_OK : MML_ENOMEM;
}

static void scratch_release(mml_tok_scratch *s) {
  mml_bytes_free(&s->clean);
  mml_bytes_free(&s->norm);
  mml_bytes_free(&s->mapped);
  free(s->sym);
  free(s->nid);
  free(s->prev);
  free(s->next);
  free(s->rank);
  free(s->heap);
  free(s->cache);
  mml_bytes_free(&s->cache_keys);
  mml_ids_free(&s->cache_ids);
}

void mml_tok_scratch_free(mml_tok_scratch *s) {
  if (!s) return;
  scratch_release(s);
  free(s);
}

static mml_status scratch_reserve(mml_tok_scratch *s, size_t n) {
  if (n <= s->cap) return MML_OK;
  size_t c = pow2_at_least(n);
  void *p[6] = {realloc(s->sym, c * 4), NULL, NULL, NULL, NULL, NULL};
  if (!p[0]) return MML_ENOMEM;
  s->sym = p[0];
  if (!(p[1] = realloc(s->nid, c * 4))) return MML_ENOMEM;
  s->nid = p[1];
  if (!(p[2] = realloc(s->prev, c * 4))) return MML_ENOMEM;
  s->prev = p[2];
  if (!(p[3] = realloc(s->next, c * 4))) return MML_ENOMEM;
  s->next = p[3];
  if (!(p[4] = realloc(s->rank, c * 4))) return MML_ENOMEM;
  s->rank = p[4];
  if (!(p[5] = realloc(s->heap, c * 2 * sizeof(heap_item)))) return MML_ENOMEM;
  s->heap = p[5];
  s->cap = c;
  return MML_OK;
}

/* ---- BPE ------------------------------------------------------------------------------ */

static inline uint32_t pair_rank(const mml_tokenizer *t, int32_t a, int32_t b, int32_t *id) {
  const merge_slot *m = merge_get(t, a, b);
  if (!m) return NO_RANK;
  *id = m->id;
  return m->rank;
}

/* Lowest rank first, leftmost among equal ranks: O(n^2), fast for short words. */
static size_t bpe_small(const mml_tokenizer *t, mml_tok_scratch *s, size_t n) {
  int32_t *sym = s->sym, *nid = s->nid;
  uint32_t *rank = s->rank;
  for (size_t i = 0; i + 1 < n; i++) rank[i] = pair_rank(t, sym[i], sym[i + 1], &nid[i]);
  while (n > 1) {
    uint32_t best = NO_RANK;
    size_t bi = 0;
    for (size_t i = 0; i + 1 < n; i++)
      if (rank[i] < best) best = rank[i], bi = i;
    if (best == NO_RANK) break;
    sym[bi] = nid[bi];
    size_t tail = n - bi - 2; /* symbols after bi + 1 */
    memmove(sym + bi + 1, sym + bi + 2, tail * sizeof *sym);
    memmove(rank + bi + 1, rank + bi + 2, (tail ? tail - 1 : 0) * sizeof *rank);
    memmove(nid + bi + 1, nid + bi + 2, (tail ? tail - 1 : 0) * sizeof *nid);
    n--;
    if (bi > 0) rank[bi - 1] = pair_rank(t, sym[bi - 1], sym[bi], &nid[bi - 1]);
    if (bi + 1 < n) rank[bi] = pair_rank(t, sym[bi], sym[bi + 1], &nid[bi]);
  }
  return n;
}

static inline int heap_less(const heap_item *a, const heap_item *b) {
  return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(heap_item *h, size_t *n, heap_item x) {
  size_t i = (*n)++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!heap_less(&x, &h[p])) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = x;
}

static heap_item heap_pop(heap_item *h, size_t *n) {
  heap_item top = h[0], x = h[--(*n)];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
    if (!heap_less(&h[c], &x)) break;
    h[i] = h[c];
    i = c;
  }
  if (*n) h[i] = x;
  return top;
}

/* The same order with a heap over a linked list: O(n log n) for long words. */
static size_t bpe_large(const mml_tokenizer *t, mml_tok_scratch *s, size_t n) {
  int32_t *sym = s->sym, *prev = s->prev, *next = s->next;
  heap_item *heap = s->heap;
  size_t hn = 0;
  for (size_t i = 0; i < n; i++) {
    prev[i] = (int32_t)i - 1;
    next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
  }
  for (size_t i = 0; i + 1 < n; i++) {
    int32_t id;
    uint32_t r = pair_rank(t, sym[i], sym[i + 1], &id);
    if (r != NO_RANK) heap_push(heap, &hn, (heap_item){r, (uint32_t)i, id});
  }
  while (hn) {
    heap_item m = heap_pop(heap, &hn);
    int32_t p = (int32_t)m.pos;
    if (sym[p] < 0 || next[p] < 0) continue; /* merged away, or nothing to its right */
    int32_t q = next[p], id = -1;
    if (pair_rank(t, sym[p], sym[q], &id) != m.rank || id != m.id) continue; /* stale */
    sym[p] = m.id;
    sym[q] = -1;
    next[p] = next[q];
    if (next[q] >= 0) prev[next[q]] = p;
    if (prev[p] >= 0) {
      uint32_t r = pair_rank(t, sym[prev[p]], sym[p], &id);
      if (r != NO_RANK) heap_push(heap, &hn, (heap_item){r, (uint32_t)prev[p], id});
    }
    if (next[p] >= 0) {
      uint32_t r = pair_rank(t, sym[p], sym[next[p]], &id);
      if (r != NO_RANK) heap_push(heap, &hn, (heap_item){r, (uint32_t)p, id});
    }
  }
  size_t k = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) sym[k++] = sym[i];
  return k;
}

static mml_status cache_init(mml_tok_scratch *s) {
  s->cache = calloc(CACHE_SLOTS, sizeof *s->cache);
  return s->cache ? MML_OK : MML_ENOMEM;
}

static void cache_reset(mml_tok_scratch *s) {
  memset(s->cache, 0, CACHE_SLOTS * sizeof *s->cache);
  s->cache_count = 0;
  mml_bytes_clear(&s->cache_keys);
  mml_ids_clear(&s->cache_ids);
}

/* BPE of one pre-tokenized word; appends its ids to out. */
static mml_status bpe_word(const mml_tokenizer *t, mml_tok_scratch *s, const uint8_t *w,
                           size_t n, mml_ids *out) {
  if (n == 1) {
    int32_t id = t->byte_id[w[0]] >= 0 ? t->byte_id[w[0]] : t->unk_id;
    return id >= 0 ? mml_ids_push(out, id) : MML_OK;
  }
  uint64_t h = 0;
  cache_slot *slot = NULL;
  if (n <= CACHE_MAX_WORD && !s->no_cache) {
    if (!s->cache && cache_init(s)) return MML_ENOMEM;
    if (s->cache_owner != t->serial) { /* a scratch moved to another tokenizer */
      if (s->cache_owner) cache_reset(s);
      s->cache_owner = t->serial;
    }
    h = hash_bytes(w, n);
    size_t mask = CACHE_SLOTS - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      cache_slot *e = &s->cache[i];
      if (!e->key_len) {
        slot = e;
        break;
      }
      if (e->h == h && e->key_len == n && memcmp(s->cache_keys.data + e->key_off, w, n) == 0)
        return mml_ids_append(out, s->cache_ids.data + e->ids_off, e->n_ids);
    }
  }
  if (scratch_reserve(s, n)) return MML_ENOMEM;
  size_t k = 0;
  if (t->ignore_merges) { /* a word that is itself a token skips the merges */
    mml_bytes_clear(&s->mapped);
    for (size_t i = 0; i < n; i++)
      if (mml_bytes_append(&s->mapped, t->byte_sym[w[i]], t->byte_sym_len[w[i]])) return MML_ENOMEM;
    int32_t id = str_map_get(&t->vocab, t->arena, (const char *)s->mapped.data, s->mapped.len);
    if (id >= 0) {
      s->sym[0] = id;
      k = 1;
      goto done;
    }
  }
  for (size_t i = 0; i < n; i++) {
    int32_t id = t->byte_id[w[i]];
    if (id < 0) id = t->unk_id;
    if (id >= 0) s->sym[k++] = id;
  }
  k = k <= BPE_SMALL ? bpe_small(t, s, k) : bpe_large(t, s, k);
done:;
  mml_status st = mml_ids_append(out, s->sym, k);
  if (st || !slot) return st;
  if (s->cache_count * 2 >= CACHE_SLOTS || s->cache_keys.len > (1u << 22)) {
    cache_reset(s);
    size_t mask = CACHE_SLOTS - 1;
    slot = &s->cache[h & mask];
  }
  uint32_t key_off = (uint32_t)s->cache_keys.len, ids_off = (uint32_t)s->cache_ids.len;
  if (mml_bytes_append(&s->cache_keys, w, n) || mml_ids_append(&s->cache_ids, s->sym, k))
    return MML_ENOMEM;
  *slot = (cache_slot){h, key_off, ids_off, (uint16_t)n, (uint16_t)k};
  s->cache_count++;
  return MML_OK;
}

/* ---- encode ------------------------------------------------------------------------- */

/* Pre-tokenize and BPE a normalized piece without added tokens. */
static mml_status encode_words(const mml_tokenizer *t, mml_tok_scratch *s, const uint8_t *p,
                               size_t n, mml_ids *out) {
  size_t pos = 0;
  while (pos < n) {
    size_t e = mml_pretok_next(p, n, pos);
    mml_status st = bpe_word(t, s, p + pos, e - pos, out);
    if (st) return st;
    pos = e;
  }
  return MML_OK;
}

/* \w of the Rust regex crate (Alphabetic, marks, decimal digits, connector punctuation,
 * join controls): what single_word added tokens must not touch. */
static int is_word_char(int32_t c) {
  if (c == 0x200C || c == 0x200D) return 1;
  if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
      (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189))
    return 1; /* Other_Alphabetic symbols: circled and squared letters */
  switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return 1;
    default:
      return 0;
  }
}

/* The leftmost, then longest, added token of `set` in p[from..n). */
static const added_tok *added_find(const mml_tokenizer *t, const added_set *set,
                                   const uint8_t *p, size_t n, size_t from, size_t *at) {
  for (size_t i = from; i < n; i++) {
    uint8_t b = p[i];
    uint32_t lo = set->first[b], hi = set->first[b + 1];
    if (lo == hi) continue;
    const added_tok *best = NULL;
    for (uint32_t k = lo; k < hi; k++) {
      const added_tok *a = &set->toks[k];
      if (a->len <= n - i && (!best || a->len > best->len) &&
          memcmp(p + i, t->arena + a->off, a->len) == 0)
        best = a;
    }
    if (best) {
      *at = i;
      return best;
    }
  }
  return NULL;
}

static int32_t cp_before(const uint8_t *p, size_t i) {
  size_t j = i - 1;
  while (j > 0 && (p[j] & 0xC0) == 0x80) j--;
  int32_t c = p[j];
  if (c >= 0x80) {
    int k = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
    c &= (0x3F >> k);
    for (int m = 1; m <= k; m++) c = (c << 6) | (p[j + (size_t)m] & 0x3F);
  }
  return c;
}

static int32_t cp_after(const uint8_t *p, size_t i) {
  int32_t c = p[i];
  if (c >= 0x80) {
    int k = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
    c &= (0x3F >> k);
    for (int m = 1; m <= k; m++) c = (c << 6) | (p[i + (size_t)m] & 0x3F);
  }
  return c;
}

static size_t ws_len_before(const uint8_t *p, size_t i) {
  size_t j = i;
  while (j > 0) {
    size_t k = j - 1;
    while (k > 0 && (p[k] & 0xC0) == 0x80) k--;
    if (mml_uc_class(cp_after(p, k)) != MML_UC_S) break;
    j = k;
  }
  return i - j;
}

static size_t ws_len_after(const uint8_t *p, size_t n, size_t i) {
  size_t j = i;
  while (j < n) {
    int32_t c = cp_after(p, j);
    if (mml_uc_class(c) != MML_UC_S) break;
    j += c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
  }
  return j - i;
}

typedef mml_status (*segment_fn)(const mml_tokenizer *t, mml_tok_scratch *s, const uint8_t *p,
                                 size_t n, mml_ids *out);

/* Splits p on the added tokens of `set` the way tokenizers' AddedVocabulary does; calls
 * `gap` on the text between them. */
static mml_status split_added(const mml_tokenizer *t, mml_tok_scratch *s, const added_set *set,
                              const uint8_t *p, size_t n, segment_fn gap, mml_ids *out) {
  size_t start_offset = 0, from = 0, at;
  mml_status st;
  const added_tok *a;
  while (set->n && from < n && (a = added_find(t, set, p, n, from, &at))) {
    size_t start = at, stop = at + a->len;
    from = stop;
    if (a->single_word) {
      int start_space = start == 0 || !is_word_char(cp_before(p, start));
      int stop_space = stop == n || !is_word_char(cp_after(p, stop));
      if (!start_space || !stop_space) continue;
    }
    if (a->lstrip) {
      size_t ns = start - ws_len_before(p, start);
      start = ns > start_offset ? ns : start_offset;
    }
    if (a->rstrip) stop += ws_len_after(p, n, stop);
    if (start_offset < start && (st = gap(t, s, p + start_offset, start - start_offset, out)))
      return st;
    if ((st = mml_ids_push(out, a->id))) return st;
    start_offset = stop;
  }
  if (start_offset < n) return gap(t, s, p + start_offset, n - start_offset, out);
  return MML_OK;
}

static mml_status encode_normalized(const mml_tokenizer *t, mml_tok_scratch *s,
                                    const uint8_t *p, size_t n, mml_ids *out) {
  return split_added(t, s, &t->norm, p, n, encode_words, out);
}

static mml_status encode_raw_piece(const mml_tokenizer *t, mml_tok_scratch *s,
                                   const uint8_t *p, size_t n, mml_ids *out) {
  if (t->nfc && !mml_nfc_quick_check(p, n)) {
    mml_bytes_clear(&s->norm);
    mml_status st = mml_nfc_append(p, n, &s->norm);
    if (st) return st;
    /* s->norm is not touched again until this piece is done */
    return encode_normalized(t, s, s->norm.data, s->norm.len, out);
  }
  return encode_normalized(t, s, p, n, out);
}

mml_status mml_tokenizer_encode(const mml_tokenizer *t, mml_tok_scratch *scratch,
                                const char *text, size_t len, mml_ids *out, mml_err *err) {
  mml_tok_scratch local = {0}, *s = scratch ? scratch : &local;
  local.no_cache = 1; /* a cache would not outlive this call */
  const uint8_t *p = (const uint8_t *)text;
  if (len && !text) return mml_err_set(err, MML_EINVAL, "tokenizer: NULL text");
  mml_status st = MML_OK;
  if (mml_utf8_valid_prefix(p, len) != len) {
    mml_bytes_clear(&s->clean);
    st = mml_utf8_sanitize(p, len, &s->clean);
    p = s->clean.data;
    len = s->clean.len;
  }
  if (!st) st = split_added(t, s, &t->raw, p, len, encode_raw_piece, out);
  if (!scratch) scratch_release(&local);
  if (st) return mml_err_set(err, st, "tokenizer: encode failed: %s", mml_status_message(st));
  return MML_OK;
}

/* ---- decode ------------------------------------------------------------------------- */

mml_status mml_tokenizer_decode_ex(const mml_tokenizer *t, const int32_t *ids, size_t n,
                                   int flags, mml_bytes *out, mml_err *err) {
  size_t base = out->len;
  for (size_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    if (id < 0 || (size_t)id >= t->n_ids || t->tok_len[id] == UINT32_MAX) {
      out->len = base;
      return mml_err_set(err, MML_EINVAL, "tokenizer: decode: id %d at position %zu is not in "
                         "the vocabulary", id, i);
    }
    if ((flags & MML_TOK_SKIP_SPECIAL) && t->special[id]) continue;
    if (mml_bytes_append(out, t->dec_arena + t->dec_off[id], t->dec_len[id])) {
      out->len = base;
      return mml_err_set(err, MML_ENOMEM, "tokenizer: out of memory");
    }
  }
  size_t len = out->len - base;
  if (!len || mml_utf8_valid_prefix(out->data + base, len) == len) return MML_OK;
  mml_bytes raw = {0};
  mml_status st = mml_bytes_append(&raw, out->data + base, len);
  out->len = base;
  if (!st) st = mml_utf8_sanitize(raw.data, raw.len, out);
  mml_bytes_free(&raw);
  if (st) return mml_err_set(err, st, "tokenizer: out of memory");
  return MML_OK;
}

mml_status mml_tokenizer_decode(const mml_tokenizer *t, const int32_t *ids, size_t n,
                                mml_bytes *out, mml_err *err) {
  return mml_tokenizer_decode_ex(t, ids, n, 0, out, err);
}
