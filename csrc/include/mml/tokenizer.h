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
mml_status mml_tokenizer_load_json(const char *json, size_t len, mml_tokenizer **out,
                                   mml_err *err);
void mml_tokenizer_free(mml_tokenizer *t);

mml_status mml_tok_scratch_new(mml_tok_scratch **out);
void mml_tok_scratch_free(mml_tok_scratch *s);

/* Appends the ids of `text` (UTF-8, len bytes) to `out`.  Added/special tokens that
 * occur in the text are recognised.  scratch may be NULL (a temporary one is used); a
 * scratch must not be used by two threads at once.  Invalid UTF-8 is first repaired the
 * way Python's bytes.decode("utf-8", "replace") does (each maximal invalid subsequence
 * becomes U+FFFD), so the ids are those `tokenizers` gives for the repaired str. */
mml_status mml_tokenizer_encode(const mml_tokenizer *t, mml_tok_scratch *scratch,
                                const char *text, size_t len, mml_ids *out, mml_err *err);

/* Appends the UTF-8 text of `ids` to out (invalid sequences become U+FFFD as HF does). */
mml_status mml_tokenizer_decode(const mml_tokenizer *t, const int32_t *ids, size_t n,
                                mml_bytes *out, mml_err *err);

/* mml_tokenizer_decode with flags: MML_TOK_SKIP_SPECIAL drops special added tokens (like
 * tokenizers' decode(ids, skip_special_tokens=True)).  An id outside the vocabulary fails
 * with MML_EINVAL and leaves out unchanged. */
#define MML_TOK_SKIP_SPECIAL 1
mml_status mml_tokenizer_decode_ex(const mml_tokenizer *t, const int32_t *ids, size_t n,
                                   int flags, mml_bytes *out, mml_err *err);

/* 1 when id is a special added token (special=true in tokenizer.json). */
int mml_tokenizer_is_special(const mml_tokenizer *t, int32_t id);

/* -1 when the token is absent. */
int32_t mml_tokenizer_token_to_id(const mml_tokenizer *t, const char *tok, size_t len);
/* NULL when out of range; *len receives the byte length. */
const char *mml_tokenizer_id_to_token(const mml_tokenizer *t, int32_t id, size_t *len);
/* Including added tokens (like tokenizers' get_vocab_size(with_added_tokens=True)). */
size_t mml_tokenizer_vocab_size(const mml_tokenizer *t);

#endif
