/*
 * tokenizer_load.c — loading a Hugging Face tokenizer.json (design: tokenizer.c): the
 * configuration is checked against what the encoder implements (NFC normaliser or none,
 * the Qwen ByteLevel/Split pre-tokenizer, ByteLevel decoder, BPE model), then every token
 * string is copied into one arena and the hash tables (token -> id, (left, right) ->
 * merge rank and result), the added-token sets and the per-id tables are built.  After
 * mml_tokenizer_load* returns, the tokenizer is immutable.
 */
#include <cjson/cJSON.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "mml/message.h"
#include "mml/pretok.h"
#include "tokenizer_int.h"

#define MAX_TOKEN_ID (1 << 22) /* bounds the per-id tables a bad file can make us allocate */

static const char k_qwen_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
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
  const cJSON *seq =
      type_is(p, "Sequence") ? cJSON_GetObjectItemCaseSensitive(p, "pretokenizers") : NULL;
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
    return mml_err_set(err, MML_ECONFIG,
                       "unsupported pre_tokenizer: expected ByteLevel after Split");
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
  for (size_t i = 0; i < set->n; i++)
    sorted[count[(uint8_t)t->arena[set->toks[i].off]]++] = set->toks[i];
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

static mml_status check_model(mml_tokenizer *t, const cJSON *model, mml_err *err) {
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
  return MML_OK;
}

static mml_status load_vocab(mml_tokenizer *t, const cJSON *model, mml_err *err) {
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
  return MML_OK;
}

/* The two halves of merge number `rank`: "a b" or ["a", "b"], both non-empty. */
static mml_status merge_pair(const cJSON *it, uint32_t rank, const char **a, size_t *la,
                             const char **b, size_t *lb, mml_err *err) {
  if (cJSON_IsString(it)) { /* "a b" */
    *a = it->valuestring;
    const char *sp = strchr(*a, ' ');
    if (!sp || strchr(sp + 1, ' ')) {
      char shown[MML_SHORT_CAP(80)];
      return mml_err_set(err, MML_ECONFIG, "merges[%u]: \"%s\" is not \"a b\"", rank,
                         mml_text_short(*a, strlen(*a), 80, shown, sizeof shown));
    }
    *la = (size_t)(sp - *a);
    *b = sp + 1;
    *lb = strlen(*b);
  } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
             cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
             cJSON_IsString(cJSON_GetArrayItem(it, 1))) { /* ["a", "b"] */
    *a = cJSON_GetArrayItem(it, 0)->valuestring;
    *b = cJSON_GetArrayItem(it, 1)->valuestring;
    *la = strlen(*a);
    *lb = strlen(*b);
  } else {
    return mml_err_set(err, MML_ECONFIG, "merges[%u]: expected \"a b\" or [\"a\", \"b\"]", rank);
  }
  if (!*la || !*lb) /* no vocabulary token is empty; "" would merge nothing */
    return mml_err_set(err, MML_ECONFIG, "merges[%u]: an empty token", rank);
  return MML_OK;
}

/* Adds merge `rank` (a + b); buf/bufcap: a growing buffer for the concatenation. */
static mml_status add_merge(mml_tokenizer *t, const cJSON *it, uint32_t rank, char **buf,
                            size_t *bufcap, mml_err *err) {
  const char *a = NULL, *b = NULL;
  size_t la = 0, lb = 0;
  mml_status st = merge_pair(it, rank, &a, &la, &b, &lb, err);
  if (st) return st;
  if (la + lb > *bufcap) {
    size_t cap = (la + lb) * 2 + 64;
    char *nb = realloc(*buf, cap);
    if (!nb) return MML_ENOMEM;
    *buf = nb;
    *bufcap = cap;
  }
  memcpy(*buf, a, la);
  memcpy(*buf + la, b, lb);
  int32_t ia = str_map_get(&t->vocab, t->arena, a, la);
  int32_t ib = str_map_get(&t->vocab, t->arena, b, lb);
  int32_t iab = str_map_get(&t->vocab, t->arena, *buf, la + lb);
  if (ia < 0 || ib < 0 || iab < 0) {
    char sa[MML_SHORT_CAP(60)], sb[MML_SHORT_CAP(60)];
    return mml_err_set(err, MML_ECONFIG, "merges[%u]: \"%s\" + \"%s\" not in the vocabulary", rank,
                       mml_text_short(a, la, 60, sa, sizeof sa),
                       mml_text_short(b, lb, 60, sb, sizeof sb));
  }
  merge_put(t, ia, ib, rank, iab);
  return MML_OK;
}

static mml_status load_merges(mml_tokenizer *t, const cJSON *model, mml_err *err) {
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
  const cJSON *it;
  cJSON_ArrayForEach(it, merges) {
    if ((st = add_merge(t, it, rank, &buf, &bufcap, err))) break;
    rank++;
  }
  free(buf);
  return st;
}

/* model: BPE with its vocabulary and merges. */
static mml_status load_model(mml_tokenizer *t, const cJSON *model, mml_err *err) {
  mml_status st = check_model(t, model, err);
  if (!st) st = load_vocab(t, model, err);
  if (!st) st = load_merges(t, model, err);
  return st;
}

/* 1 + the largest id of the vocabulary and the added tokens. */
static size_t count_ids(const mml_tokenizer *t) {
  size_t n = 0;
  for (size_t i = 0; i <= t->vocab.mask; i++)
    if (t->vocab.slots[i].id >= 0 && (size_t)t->vocab.slots[i].id + 1 > n)
      n = (size_t)t->vocab.slots[i].id + 1;
  const added_set *sets[2] = {&t->raw, &t->norm};
  for (int s = 0; s < 2; s++)
    for (size_t i = 0; i < sets[s]->n; i++)
      if ((size_t)sets[s]->toks[i].id + 1 > n) n = (size_t)sets[s]->toks[i].id + 1;
  return n;
}

/* id -> token string and special flag, and vocab_size. */
static void fill_token_tables(mml_tokenizer *t) {
  const added_set *sets[2] = {&t->raw, &t->norm};
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
}

/* Writes token s's decoded bytes at out: each character's byte, or (when some character
 * has none) the token's own UTF-8.  Returns how many. */
static size_t decode_token(const uint8_t *s, size_t len, const int16_t c2b[324], uint8_t *out) {
  size_t i = 0, o = 0;
  while (i < len) {
    int32_t c;
    size_t k;
    uint8_t b0 = s[i];
    if (b0 < 0x80)
      c = b0, k = 1;
    else if (b0 < 0xE0 && i + 1 < len)
      c = ((b0 & 0x1F) << 6) | (s[i + 1] & 0x3F), k = 2;
    else
      c = -1, k = 1;
    if (c < 0 || c >= 324 || c2b[c] < 0) { /* a character without a byte */
      memcpy(out, s, len);
      return len;
    }
    out[o++] = (uint8_t)c2b[c];
    i += k;
  }
  return o;
}

/* id -> bytes for decode, and each byte's symbol and id. */
static mml_status build_decode_tables(mml_tokenizer *t) {
  const size_t n = t->n_ids;
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
    size_t k = decode_token(s, t->tok_len[id], c2b, t->dec_arena + pos);
    t->dec_off[id] = (uint32_t)pos;
    t->dec_len[id] = (uint32_t)k;
    pos += k;
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

/* Per-id tables: token string, decode bytes, special flag. */
static mml_status build_id_tables(mml_tokenizer *t) {
  size_t n = count_ids(t);
  t->n_ids = n;
  t->tok_off = calloc(n + 1, sizeof *t->tok_off);
  t->tok_len = malloc((n + 1) * sizeof *t->tok_len);
  t->dec_off = calloc(n + 1, sizeof *t->dec_off);
  t->dec_len = calloc(n + 1, sizeof *t->dec_len);
  t->special = calloc(n + 1, 1);
  if (!t->tok_off || !t->tok_len || !t->dec_off || !t->dec_len || !t->special) return MML_ENOMEM;
  for (size_t i = 0; i <= n; i++) t->tok_len[i] = UINT32_MAX;
  fill_token_tables(t);
  return build_decode_tables(t);
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
