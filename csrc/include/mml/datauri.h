/*
 * mml/datauri.h — data: URIs (RFC 2397) as image references, as OpenAI-style content parts
 * ({"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}) and dataset
 * exports carry them: "data:[<media type>][;<param>]*;base64,<payload>".  The payload is
 * decoded in the worker that builds the sample (no I/O); the image format is then told by
 * magic bytes as for any file.
 *
 * Threads: pure functions.
 */
#ifndef MML_DATAURI_H
#define MML_DATAURI_H

#include "mml/common.h"

/* 1 when `ref` starts with "data:" (any case). */
int mml_is_data_uri(const char *ref);

/* Decodes the base64 payload of `ref` into `out` (cleared first), byte for byte as
 * Python's base64.b64decode does (what transformers' load_image and qwen-vl-utils run):
 * bytes outside the alphabet are skipped, padding ends the data, a payload that is not
 * padded to a multiple of 4 is an error.  Errors (MML_EDECODE unless noted): no comma;
 * not base64-encoded (MML_EUNSUPPORTED); a media type other than image/... or none
 * (MML_EUNSUPPORTED); bad padding or length; an empty payload. */
mml_status mml_data_uri_decode(const char *ref, mml_bytes *out, mml_err *err);

#endif
