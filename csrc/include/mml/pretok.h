/*
 * mml/pretok.h — the text stages of the tokenizer before BPE (csrc/core/text/pretok.c):
 * Unicode classes, UTF-8 repair, NFC and the Qwen pre-tokenizer scanner.  Used by
 * tokenizer.c and by the binding's test hooks; most callers want mml/tokenizer.h.
 *
 * All functions take valid UTF-8 (the tokenizer sanitises its input first) and are
 * reentrant.  mml_pretok_init() builds the process-wide read-only tables once
 * (pthread_once) and must have returned MML_OK before any other function here is called.
 */
#ifndef MML_PRETOK_H
#define MML_PRETOK_H

#include <stddef.h>
#include <stdint.h>

#include "mml/common.h"

/* Classes of the pre-tokenizer regex: \p{L}, \p{N}, \s (White_Space), anything else. */
enum { MML_UC_OTHER = 0, MML_UC_L = 1, MML_UC_N = 2, MML_UC_S = 3 };

mml_status mml_pretok_init(void);

/* The class of a code point (MML_UC_*). */
int mml_uc_class(int32_t cp);

/* Writes code point c (0..0x10FFFF) as UTF-8 into o (room for 4 bytes); returns the length. */
size_t mml_utf8_put(int32_t c, uint8_t *o);
/* Byte length of the longest valid UTF-8 prefix of s[0..len). */
size_t mml_utf8_valid_prefix(const uint8_t *s, size_t len);
/* Appends s to out with every maximal invalid subsequence replaced by U+FFFD (the
 * replacement rule of Python's bytes.decode("utf-8", "replace") and Rust's
 * String::from_utf8_lossy). */
mml_status mml_utf8_sanitize(const uint8_t *s, size_t len, mml_bytes *out);

/* 1 when s (valid UTF-8) is certainly in NFC (the Unicode quick check answers Yes);
 * 0 when it may not be. */
int mml_nfc_quick_check(const uint8_t *s, size_t len);
/* Appends NFC(s) to out (s valid UTF-8). */
mml_status mml_nfc_append(const uint8_t *s, size_t len, mml_bytes *out);

/* The end (exclusive byte offset) of the piece of the Qwen split regex
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}
 *   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * that starts at byte offset pos < len of s (valid UTF-8).  Always > pos. */
size_t mml_pretok_next(const uint8_t *s, size_t len, size_t pos);

#endif
