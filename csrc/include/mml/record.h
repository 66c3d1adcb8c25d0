/*
 * mml/record.h — one JSONL line (LLaVA conversations, messages + images, or HF content
 * parts; see ../shared/SPEC-QWEN.md) parsed into a neutral conversation: messages made of
 * text and image parts, and the list of image references in the order they appear.
 * `<image>` tags in text become image parts matched to the listed images in order; a
 * count mismatch is MML_EMISMATCH, anything else malformed is MML_ERECORD.
 *
 * Threads: a record is owned by one thread; parsing is reentrant.
 */
#ifndef MML_RECORD_H
#define MML_RECORD_H

#include "mml/common.h"

typedef enum { MML_ROLE_SYSTEM = 0, MML_ROLE_USER, MML_ROLE_ASSISTANT, MML_ROLE_OTHER } mml_role;
typedef enum { MML_PART_TEXT = 0, MML_PART_IMAGE } mml_part_kind;

typedef struct mml_part {
  mml_part_kind kind;
  const char *text; /* MML_PART_TEXT: UTF-8, not NUL-terminated */
  size_t len;
  int image;        /* MML_PART_IMAGE: index into mml_record.images */
} mml_part;

typedef struct mml_message {
  mml_role role;
  const char *role_name; /* "system", "user", "assistant", or the record's own role */
  mml_part *parts;
  int nparts;
} mml_message;

typedef struct mml_record {
  mml_message *messages;
  int nmessages;
  const char **images; /* references as written in the record (path, URL, s3://) */
  int nimages;
  void *arena;         /* owns every string and array above */
} mml_record;

/* Parses one line.  rec must be zero-initialised or previously freed/reused; on success
 * the caller frees it with mml_record_free (reuse keeps capacity). */
mml_status mml_record_parse(const char *line, size_t len, mml_record *rec, mml_err *err);
void mml_record_free(mml_record *rec);

#endif
