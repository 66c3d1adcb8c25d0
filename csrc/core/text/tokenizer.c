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
 *
 * Files: tokenizer.c (this: lookups, scratch, BPE, encode, decode), tokenizer_load.c
 * (tokenizer.json -> tables), tokenizer_int.h (the tables' types and lookups).
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "mml/message.h"
#include "mml/pretok.h"
#include "tokenizer_int.h"

#define BPE_SMALL 96 /* words up to this many symbols use the O(n^2) merge loop */
#define CACHE_SLOTS (1u << 14)
#define CACHE_MAX_WORD 128 /* longer words are not cached */
#define NO_RANK UINT32_MAX

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
static mml_status bpe_word(const mml_tokenizer *t, mml_tok_scratch *s, const uint8_t *w, size_t n,
                           mml_ids *out) {
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
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return 1;
    default:
      return 0;
  }
}

/* The leftmost, then longest, added token of `set` in p[from..n). */
static const added_tok *added_find(const mml_tokenizer *t, const added_set *set, const uint8_t *p,
                                   size_t n, size_t from, size_t *at) {
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

static mml_status encode_normalized(const mml_tokenizer *t, mml_tok_scratch *s, const uint8_t *p,
                                    size_t n, mml_ids *out) {
  return split_added(t, s, &t->norm, p, n, encode_words, out);
}

static mml_status encode_raw_piece(const mml_tokenizer *t, mml_tok_scratch *s, const uint8_t *p,
                                   size_t n, mml_ids *out) {
  if (t->nfc && !mml_nfc_quick_check(p, n)) {
    mml_bytes_clear(&s->norm);
    mml_status st = mml_nfc_append(p, n, &s->norm);
    if (st) return st;
    /* s->norm is not touched again until this piece is done */
    return encode_normalized(t, s, s->norm.data, s->norm.len, out);
  }
  return encode_normalized(t, s, p, n, out);
}

mml_status mml_tokenizer_encode(const mml_tokenizer *t, mml_tok_scratch *scratch, const char *text,
                                size_t len, mml_ids *out, mml_err *err) {
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

mml_status mml_tokenizer_decode_ex(const mml_tokenizer *t, const int32_t *ids, size_t n, int flags,
                                   mml_bytes *out, mml_err *err) {
  size_t base = out->len;
  for (size_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    if (id < 0 || (size_t)id >= t->n_ids || t->tok_len[id] == UINT32_MAX) {
      out->len = base;
      return mml_err_set(err, MML_EINVAL,
                         "tokenizer: decode: id %d at position %zu is not in "
                         "the vocabulary",
                         id, i);
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
