/*
 * mml/template.h — Qwen-VL chat templates rendered straight to token ids and labels.
 * The whole conversation is rendered as the reference template renders it, each image
 * placeholder expanded to <|vision_start|> + N x <|image_pad|> + <|vision_end|>, and the
 * rendered string is tokenized as one string (special tokens split out first), as the
 * HF processor does.  Labels are -100 outside supervised spans.
 *
 * Threads: a template is immutable after creation and shared; encode is reentrant.
 */
#ifndef MML_TEMPLATE_H
#define MML_TEMPLATE_H

#include "mml/common.h"
#include "mml/record.h"
#include "mml/tokenizer.h"

#define MML_IGNORE_INDEX (-100)

typedef enum {
  MML_TEMPLATE_QWEN2_VL = 0, /* qwen2-vl / qwen2.5-vl: default system prompt */
  MML_TEMPLATE_QWEN3_VL,     /* no default system prompt */
} mml_template_style;

typedef enum {
  MML_LABELS_ALL_ASSISTANT = 0,   /* every assistant turn's content + its <|im_end|>\n */
  MML_LABELS_LAST_ASSISTANT,      /* only the final assistant turn */
  MML_LABELS_NO_NONFINAL_END,     /* all assistant content; <|im_end|>\n only on the last */
} mml_label_mode;

typedef struct mml_template mml_template;

/* The tokenizer must outlive the template.  Special ids are looked up by name
 * (<|im_start|>, <|im_end|>, <|vision_start|>, <|vision_end|>, <|image_pad|>). */
mml_status mml_template_new(mml_template_style style, mml_label_mode labels,
                            const mml_tokenizer *tok, mml_template **out, mml_err *err);
void mml_template_free(mml_template *t);

/* Appends ids and labels (same length) for `rec`; image_tokens[i] is the number of
 * <|image_pad|> tokens of rec->images[i].  scratch may be NULL. */
mml_status mml_template_encode(const mml_template *t, mml_tok_scratch *scratch,
                               const mml_record *rec, const int64_t *image_tokens,
                               mml_ids *ids, mml_ids *labels, mml_err *err);

/* The rendered text (with image pads expanded) — for tests and debugging. */
mml_status mml_template_render(const mml_template *t, const mml_record *rec,
                               const int64_t *image_tokens, mml_bytes *out, mml_err *err);

#endif
