/*
 * mml/pyjson.h — JSON text re-serialised exactly as Python writes it:
 * json.dumps(json.loads(text), ensure_ascii=False) with the default separators ", " and
 * ": ".  Trainers (LLaMA-Factory's tool and function-call formatters) put such strings in
 * the prompt, so a loader that renders them must produce the same bytes.
 *
 * What Python does and this reproduces: key order kept, a repeated key keeps its first
 * position and its last value; integers written as given (arbitrary size; "-0" -> "0");
 * other numbers as repr(float(text)) (shortest round-trip digits, exponent form below
 * 1e-4 and from 1e16, "Infinity" on overflow); NaN / Infinity / -Infinity literals
 * accepted; strings with '"', '\\', \b \f \n \r \t escaped, other control characters as
 * \u00XX, everything else (non-ASCII) written as UTF-8; \u surrogate pairs joined.
 * Refused (MML_ERECORD, naming the byte): invalid JSON, raw control characters inside
 * strings, invalid UTF-8, a lone surrogate (no UTF-8 form), nesting deeper than 512.
 *
 * Values are spans of the text; the accessors assume a span that mml_pyjson_dumps (or
 * mml_pyjson_check) accepted.  Threads: reentrant, no state.
 */
#ifndef MML_PYJSON_H
#define MML_PYJSON_H

#include "mml/common.h"

typedef struct mml_span {
  const char *p;
  size_t n;
} mml_span;

/* Checks that s is one JSON value (surrounding whitespace allowed). */
mml_status mml_pyjson_check(mml_span s, mml_err *err);
/* Appends Python's serialisation of the value in s to out. */
mml_status mml_pyjson_dumps(mml_span s, mml_bytes *out, mml_err *err);
/* First character of the value: '{', '[', '"', 't', 'f', 'n', 'N', 'I', or a number's
 * first character ('-' or a digit); 0 for an empty span. */
char mml_pyjson_kind(mml_span s);
/* Number of elements of an array (members of an object). */
int mml_pyjson_len(mml_span s);
/* Element i of an array; 0 when out of range. */
int mml_pyjson_item(mml_span arr, int i, mml_span *out);
/* Value of the last member named key of an object; 0 when absent. */
int mml_pyjson_member(mml_span obj, const char *key, mml_span *out);
/* 1 when the value is a string equal to s. */
int mml_pyjson_string_is(mml_span v, const char *s);

#endif
