/*
 * mml/message.h — the text of user-facing messages (errors, warnings, reprs, stats):
 * valid UTF-8 whatever the input, long values shortened in the middle on character
 * boundaries, and every URL redacted by one function.
 *
 * mml_err_set / mml_err_prefix (common.c) pass every message through
 * mml_text_sanitize, so no message of the core can carry invalid UTF-8 or a credential
 * in a URL; call sites quoting a value of unknown length (a record's string, an image
 * reference) shorten it with mml_text_short so the message keeps both ends.
 *
 * Threads: pure functions, reentrant.
 */
#ifndef MML_MESSAGE_H
#define MML_MESSAGE_H

#include <stddef.h>

#include "mml/common.h"

/* Length (1-4) of the valid UTF-8 character at s (n bytes available); 0 when the bytes
 * there are not one (bad lead or continuation byte, overlong form, surrogate, > U+10FFFF,
 * or cut short). */
size_t mml_utf8_char(const char *s, size_t n);
/* 1 when all n bytes are valid UTF-8. */
int mml_utf8_valid(const char *s, size_t n);

/* Writes s (n bytes) into dst (cap >= 1 bytes, always NUL-terminated) as valid UTF-8:
 * each byte that is not part of a valid character becomes the four characters "\xNN";
 * with quote=1 control characters (U+0000-U+001F, U+007F) are escaped the same way.  Stops
 * before a character that does not fit.  Returns the bytes written (without the NUL). */
size_t mml_text_escape(char *dst, size_t cap, const char *s, size_t n, int quote);

/* s (n bytes) escaped as by mml_text_escape(quote=1) and, when that is longer than `max`
 * bytes, shortened in the middle to at most `max` bytes: its start, "…" (U+2026), its
 * end, cut on character boundaries.  Writes into buf (cap bytes; cap > max) and returns
 * buf, so it can be an argument of a printf-style call. */
const char *mml_text_short(const char *s, size_t n, size_t max, char *buf, size_t cap);
#define MML_SHORT_CAP(max) ((max) + 8)

/* A copy of url fit for messages: user-info dropped, values of credential-like query
 * parameters (names holding signature, credential, token, key, secret, password, auth,
 * and Azure's sig) replaced by REDACTED.  malloc'd; NULL when out of memory. */
char *mml_url_redact(const char *url);

/* Appends `text` (n bytes) to out with every URL in it ("scheme://...") redacted as by
 * mml_url_redact; the rest is copied as is. */
mml_status mml_text_redact(const char *text, size_t n, mml_bytes *out);

/* Writes src (n bytes) into dst (cap bytes) as a message: URLs
 * redacted, then made valid UTF-8 (invalid bytes and control characters other than \n
 * and \t escaped), fitted by mml_text_fit (common.h: long values shortened in the middle). */
void mml_text_clean(char *dst, size_t cap, const char *src, size_t n);
/* The same in place on the NUL-terminated message in buf (cap bytes). */
void mml_text_sanitize(char *buf, size_t cap);

#endif
