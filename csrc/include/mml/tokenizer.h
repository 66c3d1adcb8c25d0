/*
 * mml/tokenizer.h — byte-level BPE loaded from a Hugging Face tokenizer.json (Qwen2,
 * Qwen2.5, Qwen3 family), encoding exactly like the `tokenizers` library: added tokens
 * split out first (leftmost-longest), NFC, the Qwen pre-tokenizer regex, GPT-2
 * byte-to-unicode mapping, merges by rank.
 *
 * Threads: a loaded tokenizer is immutable and shared read-only by all threads.
 * Per-call scratch may be passed to avoid allocation (one scratch per thread).
 */
#ifndef MML_TOKENIZER_H
#define MML_TOKENIZER_H

#include "mml/common.h"

typedef struct mml_tokenizer mml_tokenizer;
typedef struct mml_tok_scratch mml_tok_scratch;

mml_status mml_tokenizer_load(const char *path, mml_tokenizer **out, mml_err *err);
mml_status mml_tokenizer_load_json(const char *json, size_t len, mml_tokenizer **out, mml_err *err);
void mml_tokenizer_free(mml_tokenizer *t);

mml_status mml_tok_scratch_new(mml_tok_scratch **out);
void mml_tok_scratch_free(mml_tok_scratch *s);

/* Appends the ids of `text` (UTF-8, len bytes) to `out`.  Added/special tokens that
 * occur in the text are recognised.  scratch may be NULL (a temporary one is used); a
 * scratch must not be used by two threads at once.  Invalid UTF-8 is first repaired the
 * way Python's bytes.decode("utf-8", "replace") does (each maximal invalid subsequence
 * becomes U+FFFD), so the ids are those `tokenizers` gives for the repaired str. */
mml_status mml_tokenizer_encode(const mml_tokenizer *t, mml_tok_scratch *scratch, const char *text,
                                size_t len, mml_ids *out, mml_err *err);

/* ---- many texts on many threads (tokenizer_batch.c) ------------------------------------
 * A pool keeps up to `max` idle slots (a scratch + an id buffer, each used by one thread
 * at a time); get makes a new slot when the pool is empty (NULL: out of memory), put
 * clears the ids and keeps the slot (or frees it when the pool is full).  Thread-safe. */
typedef struct mml_tok_pool mml_tok_pool;
typedef struct mml_tok_slot {
  mml_tok_scratch *scratch;
  mml_ids ids;
} mml_tok_slot;
mml_status mml_tok_pool_new(int max, mml_tok_pool **out);
void mml_tok_pool_free(mml_tok_pool *p); /* no slot may be out */
mml_tok_slot *mml_tok_pool_get(mml_tok_pool *p);
void mml_tok_pool_put(mml_tok_pool *p, mml_tok_slot *s);

/* Encodes texts[0..n) (lens[i] bytes each) on nthreads threads (0: one per CPU; never more
 * than n or 256; the calling thread is one of them), each with a slot from `pool`.  The
 * ids of text i, in input order, are mml_tok_batch_ids(*out, i); *out holds its slots
 * until mml_tok_batch_free returns them to the pool.  On failure nothing is returned and
 * err names the lowest failing index ("texts[i]: ...").  Threads, ordering and ownership:
 * tokenizer_batch.c. */
typedef struct mml_tok_batch mml_tok_batch;
mml_status mml_tokenizer_encode_batch(const mml_tokenizer *t, mml_tok_pool *pool,
                                      const char *const *texts, const size_t *lens, size_t n,
                                      size_t nthreads, mml_tok_batch **out, mml_err *err);
size_t mml_tok_batch_size(const mml_tok_batch *b);
const int32_t *mml_tok_batch_ids(const mml_tok_batch *b, size_t i, size_t *len);
void mml_tok_batch_free(mml_tok_batch *b);

/* Appends the UTF-8 text of `ids` to out (invalid sequences become U+FFFD as HF does). */
mml_status mml_tokenizer_decode(const mml_tokenizer *t, const int32_t *ids, size_t n,
                                mml_bytes *out, mml_err *err);

/* mml_tokenizer_decode with flags: MML_TOK_SKIP_SPECIAL drops special added tokens (like
 * tokenizers' decode(ids, skip_special_tokens=True)).  An id outside the vocabulary fails
 * with MML_EINVAL and leaves out unchanged. */
#define MML_TOK_SKIP_SPECIAL 1
mml_status mml_tokenizer_decode_ex(const mml_tokenizer *t, const int32_t *ids, size_t n, int flags,
                                   mml_bytes *out, mml_err *err);

/* 1 when id is a special added token (special=true in tokenizer.json). */
int mml_tokenizer_is_special(const mml_tokenizer *t, int32_t id);

/* -1 when the token is absent. */
int32_t mml_tokenizer_token_to_id(const mml_tokenizer *t, const char *tok, size_t len);
/* NULL when out of range; *len receives the byte length. */
const char *mml_tokenizer_id_to_token(const mml_tokenizer *t, int32_t id, size_t *len);
/* Including added tokens (like tokenizers' get_vocab_size(with_added_tokens=True)). */
size_t mml_tokenizer_vocab_size(const mml_tokenizer *t);

#endif
