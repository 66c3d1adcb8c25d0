/*
 * tokenizer_int.h — private to the tokenizer (tokenizer_load.c: tokenizer.json -> the
 * immutable tables; tokenizer.c: lookups, scratch, BPE, encode, decode).  The design is
 * described at the top of tokenizer.c.  The tables are written only while loading and
 * read-only afterwards, so everything here may be read from any number of threads.
 */
#ifndef MML_TOKENIZER_INT_H
#define MML_TOKENIZER_INT_H

#include <stdint.h>
#include <string.h>

#include "mml/tokenizer.h"

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

static inline size_t pow2_at_least(size_t n) {
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
  str_map vocab;     /* model vocabulary */
  str_map added_map; /* added token content -> id */
  merge_slot *merges;
  size_t merges_mask, n_merges;
  int32_t byte_id[256]; /* id of the byte-level symbol of each byte, -1 if absent */
  uint8_t byte_sym[256][2], byte_sym_len[256]; /* UTF-8 of each byte's symbol */
  int32_t unk_id;
  int nfc, ignore_merges;
  size_t n_ids;                /* 1 + the largest id */
  uint32_t *tok_off, *tok_len; /* per id: the token string (added content wins) */
  uint32_t *dec_off, *dec_len; /* per id: its bytes for decode */
  uint8_t *dec_arena;
  uint8_t *special;    /* per id */
  added_set raw, norm; /* normalized=false / normalized=true added tokens */
  size_t vocab_size;   /* distinct strings, added tokens included */
  uint64_t serial;     /* unique per loaded tokenizer: scratch caches check it */
};

static inline int32_t str_map_get(const str_map *m, const char *arena, const char *s, size_t n) {
  if (!m->slots) return -1;
  uint64_t h = hash_bytes(s, n);
  for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
    const str_slot *e = &m->slots[i];
    if (e->id < 0) return -1;
    if (e->h == h && e->len == n && memcmp(arena + e->off, s, n) == 0) return e->id;
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

#endif
