/*
 * template.c — Qwen2/2.5-VL and Qwen3-VL chat templates rendered straight to token ids
 * and labels (contract: mml/template.h).
 *
 * One walker (walk()) produces the conversation as a stream of three kinds of pieces:
 * plain text, the two turn markers <|im_start|>/<|im_end|>, and image placeholders.  The
 * same walk feeds both outputs, so the text that mml_template_render shows is exactly what
 * mml_template_encode tokenizes:
 *   - render appends the pieces as text (image pads expanded);
 *   - encode buffers consecutive text into one segment and tokenizes each segment when a
 *     marker or an image ends it, and pushes marker and image ids directly.
 * This equals tokenizing the whole rendered string at once because the tokenizer splits
 * added tokens out first and tokenizes the text between them independently; it also
 * avoids tokenizing thousands of "<|image_pad|>" strings per image.  (Assumption, checked
 * for the markers at mml_template_new: each marker string encodes alone to its own id; no
 * added token of the vocabulary can start in text and run into a marker — true of every
 * Qwen tokenizer.)
 *
 * Labels: the walker marks every text piece and marker as supervised or not.  Within a
 * segment the supervised bytes are always a suffix (the role header "assistant\n" comes
 * before the content; markers end segments), so a segment has one boundary, sup_from.
 * The tokens before it are from the ASCII header, whose byte lengths are read from the
 * vocabulary (a byte-level token's string has one character per byte); a token that
 * overlaps sup_from is labelled (see template.h).
 *
 * Threads: a template is immutable after mml_template_new; encode and render keep all
 * state on the stack (plus one heap buffer for text segments over 1 KiB) and are reentrant.
 */
#include "mml/template.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mml/pyjson.h"

#define NO_SUP ((size_t)-1)
static const char k_default_system[] = "You are a helpful assistant.";

enum {
  TOK_IM_START,
  TOK_IM_END,
  TOK_VISION_START,
  TOK_VISION_END,
  TOK_IMAGE_PAD,
  TOK_VIDEO_PAD,
  TOK_COUNT
};
static const char *const k_tok_names[TOK_COUNT] = {"<|im_start|>",     "<|im_end|>",
                                                   "<|vision_start|>", "<|vision_end|>",
                                                   "<|image_pad|>",    "<|video_pad|>"};

/* The ids data_processor.preprocess_qwen_visual labels by (qwen-vl-finetune). */
#define QFT_ASSISTANT_ID 77091
#define QFT_IM_END_ID 151645

struct mml_template {
  mml_template_style style;
  mml_label_mode labels;
  mml_image_space space;
  mml_qwen3_video_form video_form; /* mml_template_set_qwen3_video */
  const mml_tokenizer *tok;        /* NULL: render-only */
  int32_t id[TOK_COUNT];           /* -1 where absent (render-only, or no <|video_pad|>) */
  char *system;                    /* mml_template_set_system: the default system turn's text */
  int system_set;
  int lf_on;        /* mml_template_set_llama_factory: LLaMA-Factory's data path */
  mml_lf_opts lf;   /* its settings */
  int32_t think_id; /* "<think>" (-1: absent) */
  int qft_on;       /* mml_template_set_qwen_finetune: Qwen's fine-tuning data path */
  mml_qft_opts qft; /* its settings */
};

mml_status mml_template_set_system(mml_template *t, const char *text, mml_err *err) {
  char *copy = NULL;
  if (text && !(copy = strdup(text)))
    return mml_err_set(err, MML_ENOMEM, "template: out of memory");
  free(t->system);
  t->system = copy;
  t->system_set = text != NULL;
  return MML_OK;
}

mml_status mml_template_new(mml_template_style style, mml_label_mode labels,
                            const mml_tokenizer *tok, mml_template **out, mml_err *err) {
  if (!out) return mml_err_set(err, MML_EINVAL, "template: NULL out");
  *out = NULL;
  if (style != MML_TEMPLATE_QWEN2_VL && style != MML_TEMPLATE_QWEN3_VL)
    return mml_err_set(err, MML_ECONFIG, "template: unknown style %d", (int)style);
  if (labels != MML_LABELS_ALL_ASSISTANT && labels != MML_LABELS_LAST_ASSISTANT &&
      labels != MML_LABELS_NO_NONFINAL_END)
    return mml_err_set(err, MML_ECONFIG, "template: unknown label mode %d", (int)labels);
  mml_template *t = calloc(1, sizeof *t);
  if (!t) return mml_err_set(err, MML_ENOMEM, "template: out of memory");
  t->style = style;
  t->labels = labels;
  t->tok = tok;
  for (int i = 0; i < TOK_COUNT; i++) t->id[i] = -1;
  if (tok) {
    mml_ids v = {0};
    for (int i = 0; i < TOK_COUNT; i++) {
      const char *name = k_tok_names[i];
      int32_t id = mml_tokenizer_token_to_id(tok, name, strlen(name));
      if (id < 0) {
        if (i == TOK_VIDEO_PAD) continue;
        mml_ids_free(&v);
        free(t);
        return mml_err_set(err, MML_ETOKENIZER, "template: the tokenizer has no %s token", name);
      }
      /* The marker must come out of whole-string tokenization as itself. */
      mml_ids_clear(&v);
      mml_status st = mml_tokenizer_encode(tok, NULL, name, strlen(name), &v, err);
      if (st || v.len != 1 || v.data[0] != id) {
        mml_ids_free(&v);
        free(t);
        return st ? st
                  : mml_err_set(err, MML_ETOKENIZER,
                                "template: %s is not an added token of the tokenizer", name);
      }
      t->id[i] = id;
    }
    mml_ids_free(&v);
  }
  *out = t;
  return MML_OK;
}

mml_status mml_template_set_llama_factory(mml_template *t, const mml_lf_opts *o, mml_err *err) {
  if (!o) {
    t->lf_on = 0;
    return MML_OK;
  }
  if (o->mask_history && o->train_on_prompt)
    return mml_err_set(err, MML_ECONFIG,
                       "mask_history is incompatible with train_on_prompt (as in LLaMA-Factory)");
  if (t->labels != (o->mask_history ? MML_LABELS_LAST_ASSISTANT : MML_LABELS_ALL_ASSISTANT))
    return mml_err_set(err, MML_ECONFIG,
                       "recipe=\"llama-factory\" labels as its mask_history says: leave "
                       "label_mode at its default");
  if (o->enable_thinking && t->style != MML_TEMPLATE_QWEN3_VL)
    return mml_err_set(err, MML_ECONFIG,
                       "enable_thinking selects LLaMA-Factory's qwen3_vl template: it needs a "
                       "Qwen3-VL preset");
  if (o->cutoff_len < 0) return mml_err_set(err, MML_ECONFIG, "cutoff_len must be >= 1");
  t->think_id = t->tok ? mml_tokenizer_token_to_id(t->tok, "<think>", 7) : -1;
  if (o->enable_thinking && t->tok && t->think_id < 0)
    return mml_err_set(err, MML_ETOKENIZER, "enable_thinking: the tokenizer has no <think> token");
  t->lf = *o;
  t->lf_on = 1;
  return MML_OK;
}

mml_status mml_template_set_qwen_finetune(mml_template *t, const mml_qft_opts *o, mml_err *err) {
  if (!o) {
    t->qft_on = 0;
    return MML_OK;
  }
  if (o->model_max_length < 0)
    return mml_err_set(err, MML_ECONFIG, "model_max_length must be >= 1");
  if (t->lf_on)
    return mml_err_set(err, MML_ECONFIG,
                       "recipe=\"qwen-vl-finetune\" and \"llama-factory\" exclude each other");
  if (t->labels != MML_LABELS_ALL_ASSISTANT)
    return mml_err_set(err, MML_ECONFIG,
                       "recipe=\"qwen-vl-finetune\" labels as Qwen's code does: leave label_mode "
                       "at its default");
  if (t->tok && (mml_tokenizer_token_to_id(t->tok, "assistant", 9) != QFT_ASSISTANT_ID ||
                 t->id[TOK_IM_END] != QFT_IM_END_ID))
    return mml_err_set(err, MML_ECONFIG,
                       "recipe=\"qwen-vl-finetune\" labels by Qwen's fixed token ids 77091 "
                       "(\"assistant\") and 151645 (<|im_end|>): this tokenizer's differ (a "
                       "Qwen2/2.5/3-VL tokenizer is needed)");
  if (o->video_min_frames < 0 || o->video_max_frames < 0)
    return mml_err_set(err, MML_ECONFIG, "video_min_frames and video_max_frames must be >= 1");
  t->space = MML_IMAGE_SPACE_STRIP;
  t->video_form = MML_QWEN3_VIDEO_BARE; /* 4.: its apply_chat_template's form */
  t->qft = *o;
  t->qft_on = 1;
  return MML_OK;
}

mml_status mml_template_check_record(const mml_template *t, const mml_record *rec, mml_err *err) {
  return t && t->qft_on ? mml_qft_check_record(rec, err) : MML_OK;
}

void mml_template_free(mml_template *t) {
  if (t) free(t->system);
  free(t);
}

mml_status mml_template_set_image_space(mml_template *t, mml_image_space space, mml_err *err) {
  if (space != MML_IMAGE_SPACE_IN_PLACE && space != MML_IMAGE_SPACE_STRIP)
    return mml_err_set(err, MML_ECONFIG, "template: unknown image whitespace convention %d",
                       (int)space);
  t->space = space;
  return MML_OK;
}

mml_status mml_template_set_qwen3_video(mml_template *t, mml_qwen3_video_form form, mml_err *err) {
  if (form != MML_QWEN3_VIDEO_OUTER && form != MML_QWEN3_VIDEO_BARE)
    return mml_err_set(err, MML_ECONFIG, "template: unknown Qwen3-VL video prompt form %d",
                       (int)form);
  t->video_form = form;
  return MML_OK;
}

/* ---- output side: render (text) or encode (ids + labels) ---- */

#define TRY(x)            \
  do {                    \
    mml_status _st = (x); \
    if (_st) return _st;  \
  } while (0)

typedef struct out_ctx {
  const mml_template *t;
  const mml_record *rec;
  const int64_t *image_tokens;
  const mml_video_tokens *videos;
  mml_err *err;
  mml_bytes *text; /* render: the output text; NULL when encoding */
  /* encode */
  mml_tok_scratch *scratch;
  mml_ids *ids, *labels;
  char *seg; /* pending text segment */
  size_t seg_len, seg_cap;
  size_t sup_from;      /* byte of seg where supervision starts, NO_SUP if none */
  char seg_stack[1024]; /* seg's storage until it outgrows it */
  mml_bytes fmt;        /* formatted tool prompt / function call text */
  mml_bytes scratch_text;
  /* LLaMA-Factory: each pair's source and target starts (token offsets into ids) */
  int64_t *pairs;
  int npairs, pairs_cap;
} out_ctx;

static size_t utf8_chars(const char *s, size_t n) {
  size_t c = 0;
  for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
  return c;
}

static mml_status flush(out_ctx *o) {
  if (o->text || o->seg_len == 0) return MML_OK;
  const mml_template *t = o->t;
  size_t start = o->ids->len;
  mml_status st = mml_tokenizer_encode(t->tok, o->scratch, o->seg, o->seg_len, o->ids, o->err);
  if (st) return st;
  size_t n = o->ids->len;
  if ((st = mml_ids_reserve(o->labels, n)))
    return mml_err_set(o->err, st, "template: out of memory");
  size_t off = 0; /* byte offset of the token's start in seg, exact up to sup_from */
  for (size_t i = start; i < n; i++) {
    int32_t id = o->ids->data[i];
    for (int k = TOK_VISION_START; k < TOK_COUNT; k++) {
      if (id == t->id[k])
        return mml_err_set(o->err, MML_ERECORD,
                           "bad record: message text contains %s (use <image> or an image "
                           "part for images)",
                           k_tok_names[k]);
    }
    bool sup;
    if (o->sup_from == NO_SUP)
      sup = false;
    else if (off >= o->sup_from)
      sup = true;
    else {
      size_t len = 0;
      const char *s = mml_tokenizer_id_to_token(t->tok, id, &len);
      off += s ? utf8_chars(s, len) : 0;
      sup = off > o->sup_from; /* overlaps the supervised bytes */
    }
    o->labels->data[i] = sup ? id : MML_IGNORE_INDEX;
  }
  o->labels->len = n;
  o->seg_len = 0;
  o->sup_from = NO_SUP;
  return MML_OK;
}

static mml_status emit_text(out_ctx *o, const char *p, size_t n, bool sup) {
  if (n == 0) return MML_OK;
  if (o->text) {
    mml_status st = mml_bytes_append(o->text, p, n);
    return st ? mml_err_set(o->err, st, "template: out of memory") : MML_OK;
  }
  if (sup && o->sup_from == NO_SUP)
    o->sup_from = o->seg_len;
  else if (!sup && o->sup_from != NO_SUP)
    return mml_err_set(o->err, MML_EINTERNAL, "template: unsupervised text after supervised");
  if (o->seg_len + n > o->seg_cap) {
    size_t cap = o->seg_cap * 2;
    while (cap < o->seg_len + n) cap *= 2;
    char *q = o->seg == o->seg_stack ? malloc(cap) : realloc(o->seg, cap);
    if (!q) return mml_err_set(o->err, MML_ENOMEM, "template: out of memory");
    if (o->seg == o->seg_stack) memcpy(q, o->seg, o->seg_len);
    o->seg = q;
    o->seg_cap = cap;
  }
  memcpy(o->seg + o->seg_len, p, n);
  o->seg_len += n;
  return MML_OK;
}

static mml_status emit_cstr(out_ctx *o, const char *s, bool sup) {
  return emit_text(o, s, strlen(s), sup);
}

static mml_status push_id(out_ctx *o, int32_t id, bool sup) {
  if (mml_ids_push(o->ids, id) || mml_ids_push(o->labels, sup ? id : MML_IGNORE_INDEX))
    return mml_err_set(o->err, MML_ENOMEM, "template: out of memory");
  return MML_OK;
}

static mml_status emit_marker(out_ctx *o, int which, bool sup) {
  if (o->text) {
    mml_status st = mml_bytes_append(o->text, k_tok_names[which], strlen(k_tok_names[which]));
    return st ? mml_err_set(o->err, st, "template: out of memory") : MML_OK;
  }
  mml_status st = flush(o);
  return st ? st : push_id(o, o->t->id[which], sup);
}

/* Image placeholders are never supervised. */
static mml_status emit_image(out_ctx *o, int image) {
  const mml_record *rec = o->rec;
  if (image < 0 || image >= rec->nimages)
    return mml_err_set(o->err, MML_EINVAL, "template: image part %d out of range (%d images)",
                       image, rec->nimages);
  if (!o->image_tokens)
    return mml_err_set(o->err, MML_EINVAL, "template: the record has images but no token counts");
  int64_t n = o->image_tokens[image];
  if (n < 1 || n > (int64_t)1 << 30)
    return mml_err_set(o->err, MML_EINVAL, "template: image %d (%s) has %lld tokens", image,
                       rec->images[image], (long long)n);
  mml_status st;
  if (o->text) {
    static const char pad[] = "<|image_pad|>";
    size_t pl = sizeof pad - 1;
    if ((st = mml_bytes_reserve(o->text, o->text->len + 32 + (size_t)n * pl)))
      return mml_err_set(o->err, st, "template: out of memory");
    mml_bytes_append(o->text, "<|vision_start|>", 16);
    for (int64_t i = 0; i < n; i++) mml_bytes_append(o->text, pad, pl);
    mml_bytes_append(o->text, "<|vision_end|>", 14);
    return MML_OK;
  }
  if ((st = flush(o))) return st;
  size_t len = o->ids->len;
  if (mml_ids_reserve(o->ids, len + (size_t)n + 2) ||
      mml_ids_reserve(o->labels, len + (size_t)n + 2))
    return mml_err_set(o->err, MML_ENOMEM, "template: out of memory");
  const mml_template *t = o->t;
  o->ids->data[len] = t->id[TOK_VISION_START];
  for (int64_t i = 0; i < n; i++) o->ids->data[len + 1 + i] = t->id[TOK_IMAGE_PAD];
  o->ids->data[len + 1 + n] = t->id[TOK_VISION_END];
  for (size_t i = len; i < len + (size_t)n + 2; i++) o->labels->data[i] = MML_IGNORE_INDEX;
  o->ids->len = o->labels->len = len + (size_t)n + 2;
  return MML_OK;
}

/* Appends n copies of `pad` (rendered) or of its id (encoded, unsupervised). */
static mml_status emit_pads(out_ctx *o, int which, int64_t n) {
  mml_status st;
  if (o->text) {
    const char *pad = k_tok_names[which];
    size_t pl = strlen(pad);
    if ((st = mml_bytes_reserve(o->text, o->text->len + (size_t)n * pl)))
      return mml_err_set(o->err, st, "template: out of memory");
    for (int64_t i = 0; i < n; i++) mml_bytes_append(o->text, pad, pl);
    return MML_OK;
  }
  if ((st = flush(o))) return st;
  size_t len = o->ids->len;
  if (mml_ids_reserve(o->ids, len + (size_t)n) || mml_ids_reserve(o->labels, len + (size_t)n))
    return mml_err_set(o->err, MML_ENOMEM, "template: out of memory");
  int32_t id = o->t->id[which];
  for (int64_t i = 0; i < n; i++) {
    o->ids->data[len + i] = id;
    o->labels->data[len + i] = MML_IGNORE_INDEX;
  }
  o->ids->len = o->labels->len = len + (size_t)n;
  return MML_OK;
}

/* A video placeholder, never supervised.  Qwen2/2.5-VL: <|vision_start|>, groups *
 * group_tokens <|video_pad|>, <|vision_end|>.  Qwen3-VL: transformers 5.24's processor
 * replaces the template's <|video_pad|> (inside <|vision_start|>...<|vision_end|>) with one
 * "<{t:.1f} seconds><|vision_start|>pads<|vision_end|>" block per temporal patch;
 * transformers 4.57 to 5.9 (MML_QWEN3_VIDEO_BARE) replace the whole pair with the blocks,
 * as LLaMA-Factory's Qwen3VLPlugin writes them in place of its "<video>". */
static mml_status emit_video(out_ctx *o, int video) {
  const mml_record *rec = o->rec;
  if (video < 0 || video >= rec->nvideos)
    return mml_err_set(o->err, MML_EINVAL, "template: video part %d out of range (%d videos)",
                       video, rec->nvideos);
  if (!o->videos)
    return mml_err_set(o->err, MML_EINVAL, "template: the record has videos but no token counts");
  if (!o->text && o->t->id[TOK_VIDEO_PAD] < 0)
    return mml_err_set(o->err, MML_ETOKENIZER,
                       "template: the tokenizer has no <|video_pad|> token");
  const mml_video_tokens *v = &o->videos[video];
  if (v->groups < 1 || v->group_tokens < 1 || v->groups * v->group_tokens > (int64_t)1 << 30)
    return mml_err_set(o->err, MML_EINVAL, "template: video %d has %lld x %lld tokens", video,
                       (long long)v->groups, (long long)v->group_tokens);
  bool stamps = o->t->style == MML_TEMPLATE_QWEN3_VL;
  if (stamps && !v->timestamps)
    return mml_err_set(o->err, MML_EINVAL, "template: qwen3-vl video %d has no timestamps", video);
  bool outer = !stamps || !(o->t->lf_on || o->t->video_form == MML_QWEN3_VIDEO_BARE);
  if (outer) TRY(emit_marker(o, TOK_VISION_START, false));
  if (!stamps) {
    TRY(emit_pads(o, TOK_VIDEO_PAD, v->groups * v->group_tokens));
  } else {
    for (int64_t g = 0; g < v->groups; g++) {
      char ts[64];
      int n = snprintf(ts, sizeof ts, "<%.1f seconds>", v->timestamps[g]);
      if (n < 0 || n >= (int)sizeof ts)
        return mml_err_set(o->err, MML_EINVAL, "template: video %d timestamp %g", video,
                           v->timestamps[g]);
      TRY(emit_text(o, ts, (size_t)n, false));
      TRY(emit_marker(o, TOK_VISION_START, false));
      TRY(emit_pads(o, TOK_VIDEO_PAD, v->group_tokens));
      TRY(emit_marker(o, TOK_VISION_END, false));
    }
  }
  return outer ? emit_marker(o, TOK_VISION_END, false) : MML_OK;
}

/* Length of the Python-whitespace character (str.isspace) at p, 0 if none. */
static size_t py_space_at(const unsigned char *p, size_t n) {
  if (!n) return 0;
  unsigned c = p[0];
  if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20)) return 1;
  if (c < 0x80) return 0;
  unsigned cp = 0;
  size_t k = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
  if (k > n) return 0;
  cp = k == 2 ? c & 0x1F : k == 3 ? c & 0x0F : c & 0x07;
  for (size_t i = 1; i < k; i++) cp = cp << 6 | (p[i] & 0x3F);
  bool sp = cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
            cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
  return sp ? k : 0;
}

/* Python's str.strip() of [*p, *p + *n). */
static void py_strip(const char **p, size_t *n) {
  const unsigned char *s = (const unsigned char *)*p;
  size_t b = 0, e = *n, k;
  while (b < e && (k = py_space_at(s + b, e - b))) b += k;
  while (e > b) { /* back up to the start of the last character */
    size_t j = e - 1;
    while (j > b && (s[j] & 0xC0) == 0x80) j--;
    if (py_space_at(s + j, e - j) != e - j) break;
    e = j;
  }
  *p += b;
  *n = e - b;
}

static mml_status emit_parts(out_ctx *o, const mml_message *m, bool sup) {
  /* qwen-vl-finetune: user text between image tags is stripped, empty pieces dropped */
  bool strip = o->t->space == MML_IMAGE_SPACE_STRIP && m->role == MML_ROLE_USER;
  for (int i = 0; i < m->nparts; i++) {
    const mml_part *p = &m->parts[i];
    const char *text = p->text;
    size_t len = p->len;
    if (p->kind == MML_PART_TEXT && strip) py_strip(&text, &len);
    mml_status st = p->kind == MML_PART_IMAGE   ? emit_image(o, p->image)
                    : p->kind == MML_PART_VIDEO ? emit_video(o, p->image)
                                                : emit_text(o, text, len, sup);
    if (st) return st;
  }
  return MML_OK;
}

/* ---- LLaMA-Factory's qwen tool formats (tool_utils.QwenToolUtils, formatter.py) ---- */

static const char k_tool_prompt_head[] =
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char k_tool_prompt_tail[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

static mml_status put(out_ctx *o, mml_bytes *b, const char *s, size_t n) {
  return mml_bytes_append(b, s, n) ? mml_err_set(o->err, MML_ENOMEM, "template: out of memory")
                                   : MML_OK;
}

/* The system prompt's tool section for rec->tools, into o->fmt. */
static mml_status format_tools(out_ctx *o, const char *json) {
  mml_bytes *b = &o->fmt;
  mml_bytes_clear(b);
  mml_span all = {json, strlen(json)};
  mml_status st = mml_pyjson_check(all, o->err);
  if (st) {
    mml_err_prefix(o->err, "bad record: \"tools\"");
    return MML_ERECORD;
  }
  if (mml_pyjson_kind(all) != '[')
    return mml_err_set(o->err, MML_ERECORD, "bad record: \"tools\" is not a JSON list");
  int n = mml_pyjson_len(all);
  if (n == 0) return MML_OK; /* an empty list: no tool text (the system turn still renders) */
  TRY(put(o, b, k_tool_prompt_head, sizeof k_tool_prompt_head - 1));
  for (int i = 0; i < n; i++) {
    mml_span tool, type;
    mml_pyjson_item(all, i, &tool);
    if (mml_pyjson_kind(tool) != '{')
      return mml_err_set(o->err, MML_ERECORD, "bad record: tool %d is not a JSON object", i);
    bool wrapped = mml_pyjson_member(tool, "type", &type) && mml_pyjson_string_is(type, "function");
    TRY(put(o, b, "\n", 1));
    if (!wrapped) TRY(put(o, b, "{\"type\": \"function\", \"function\": ", 33));
    TRY(mml_pyjson_dumps(tool, b, o->err));
    if (!wrapped) TRY(put(o, b, "}", 1));
  }
  return put(o, b, k_tool_prompt_tail, sizeof k_tool_prompt_tail - 1);
}

/* The calls in JSON text s (one object or a list), as "<tool_call>\n{...}\n</tool_call>"
 * blocks joined by "\n". */
static mml_status format_calls(out_ctx *o, int k, mml_span s, mml_bytes *b) {
  if (mml_pyjson_check(s, o->err)) {
    mml_err_prefix(o->err, "bad record: message %d (function_call)", k);
    return MML_ERECORD;
  }
  bool list = mml_pyjson_kind(s) == '[';
  int n = list ? mml_pyjson_len(s) : 1;
  for (int i = 0; i < n; i++) {
    mml_span call = s, name, args;
    if (list) mml_pyjson_item(s, i, &call);
    if (mml_pyjson_kind(call) != '{' || !mml_pyjson_member(call, "name", &name) ||
        !mml_pyjson_member(call, "arguments", &args))
      return mml_err_set(o->err, MML_ERECORD,
                         "bad record: message %d (function_call): call %d is not an object with "
                         "\"name\" and \"arguments\"",
                         k, i);
    if (i) TRY(put(o, b, "\n", 1));
    TRY(put(o, b, "<tool_call>\n{\"name\": ", 21));
    TRY(mml_pyjson_dumps(name, b, o->err));
    TRY(put(o, b, ", \"arguments\": ", 15));
    TRY(mml_pyjson_dumps(args, b, o->err));
    TRY(put(o, b, "}\n</tool_call>", 14));
  }
  return MML_OK;
}

/* s with every occurrence of [m, m + mn) removed (Python's str.replace(m, "")). */
static mml_status remove_all(out_ctx *o, const char *s, size_t n, const char *m, size_t mn,
                             mml_bytes *b) {
  const char *p = s, *e = s + n, *q;
  while ((q = memmem(p, (size_t)(e - p), m, mn))) {
    TRY(put(o, b, p, (size_t)(q - p)));
    p = q + mn;
  }
  return put(o, b, p, (size_t)(e - p));
}

/* First match of open(.*?)close in s (DOTALL): the match and the inner text. */
static bool find_pair(const char *s, size_t n, const char *open, const char *close, mml_span *match,
                      mml_span *inner) {
  size_t on = strlen(open), cn = strlen(close);
  const char *a = memmem(s, n, open, on);
  if (!a) return false;
  const char *c = memmem(a + on, (size_t)(s + n - (a + on)), close, cn);
  if (!c) return false;
  *match = (mml_span){a, (size_t)(c + cn - a)};
  *inner = (mml_span){a + on, (size_t)(c - (a + on))};
  return true;
}

/* FunctionFormatter.apply: a function_call message's content as the assistant writes it. */
static mml_status format_function_call(out_ctx *o, int k, const mml_message *m) {
  mml_bytes *text = &o->scratch_text, *b = &o->fmt;
  mml_bytes_clear(text);
  mml_bytes_clear(b);
  for (int i = 0; i < m->nparts; i++) TRY(put(o, text, m->parts[i].text, m->parts[i].len));
  const char *s = (const char *)text->data;
  size_t n = text->len;
  if (!s) s = "";
  mml_span match, inner;
  if (find_pair(s, n, "<tool_call>", "</tool_call>", &match, &inner)) {
    TRY(remove_all(o, s, n, match.p, match.n, b)); /* the text around the call */
    return format_calls(o, k, inner, b);
  }
  if (find_pair(s, n, "<think>\n", "\n</think>\n\n", &match, &inner)) {
    mml_bytes json = {0};
    mml_status st = remove_all(o, s, n, match.p, match.n, &json);
    if (!st) st = put(o, b, match.p, match.n);
    if (!st) st = format_calls(o, k, (mml_span){(const char *)json.data, json.len}, b);
    mml_bytes_free(&json);
    return st;
  }
  return format_calls(o, k, (mml_span){s, n}, b);
}

static bool has_image(const mml_message *m) {
  for (int i = 0; i < m->nparts; i++)
    if (m->parts[i].kind != MML_PART_TEXT) return true;
  return false;
}

static bool is_tool(const mml_message *m) {
  return m->role == MML_ROLE_OTHER && !strcmp(m->role_name, "tool");
}

static mml_status emit_system_turn(out_ctx *o, const mml_message *m, const char *text, bool tools) {
  TRY(emit_marker(o, TOK_IM_START, false));
  TRY(emit_cstr(o, "system\n", false));
  if (m) TRY(emit_parts(o, m, false));
  if (text) TRY(emit_cstr(o, text, false));
  if (tools) TRY(emit_text(o, (const char *)o->fmt.data, o->fmt.len, false));
  TRY(emit_marker(o, TOK_IM_END, false));
  return emit_cstr(o, "\n", false);
}

static bool is_target(const mml_message *m) {
  return m->role == MML_ROLE_ASSISTANT || m->role == MML_ROLE_FUNCTION_CALL;
}

/* LLaMA-Factory's Qwen3-VL videos (mml/template.h, LLaMA-Factory 7.): one video, in the
 * first message after the optional system message. */
static mml_status lf_check_video(out_ctx *o) {
  const mml_record *rec = o->rec;
  if (o->t->style != MML_TEMPLATE_QWEN3_VL || !rec->nvideos) return MML_OK;
  int where = -1, k0 = rec->messages[0].role == MML_ROLE_SYSTEM;
  for (int k = 0; k < rec->nmessages && where < 0; k++)
    for (int i = 0; i < rec->messages[k].nparts; i++)
      if (rec->messages[k].parts[i].kind == MML_PART_VIDEO) where = k;
  if (rec->nvideos > 1 || where != k0)
    return mml_err_set(o->err, MML_ERECORD,
                       "bad record: recipe=\"llama-factory\" with Qwen3-VL takes one video, in "
                       "the first user message (LLaMA-Factory 0.9.5's Qwen3VLPlugin takes a "
                       "video's timestamps by message index and every video's frame count from "
                       "the first: not reproduced)");
  return MML_OK;
}

/* LLaMA-Factory's conversation shape (mml/template.h, LLaMA-Factory 1.): an optional
 * leading system message, then (user | observation, assistant | function_call) pairs. */
static mml_status lf_check_shape(out_ctx *o) {
  const mml_record *rec = o->rec;
  int k0 = rec->messages[0].role == MML_ROLE_SYSTEM, n = rec->nmessages - k0;
  for (int i = 0; i < n; i++) {
    const mml_message *m = &rec->messages[k0 + i];
    bool src = m->role == MML_ROLE_USER || m->role == MML_ROLE_OBSERVATION;
    if (i % 2 ? !is_target(m) : !src)
      return mml_err_set(o->err, MML_ERECORD,
                         "bad record: message %d (role \"%s\"): recipe=\"llama-factory\" takes "
                         "(user|observation, assistant|function_call) pairs after an optional "
                         "system message, as LLaMA-Factory does (it drops other conversations)",
                         k0 + i, m->role_name);
  }
  if (n < 2 || n % 2)
    return mml_err_set(o->err, MML_ERECORD,
                       "bad record: recipe=\"llama-factory\" needs the conversation to end with "
                       "an assistant turn (LLaMA-Factory drops it otherwise)");
  return MML_OK;
}

/* LLaMA-Factory: a pair boundary at the current token offset (encoding only). */
static mml_status lf_mark(out_ctx *o) {
  if (o->text || !o->t->lf_on) return MML_OK;
  TRY(flush(o));
  if (o->npairs == o->pairs_cap) {
    int cap = o->pairs_cap ? 2 * o->pairs_cap : 16;
    int64_t *q = realloc(o->pairs, (size_t)cap * sizeof *q);
    if (!q) return mml_err_set(o->err, MML_ENOMEM, "template: out of memory");
    o->pairs = q;
    o->pairs_cap = cap;
  }
  o->pairs[o->npairs++] = (int64_t)o->ids->len;
  return MML_OK;
}

static bool parts_hold(const mml_message *m, const char *needle) {
  size_t nl = strlen(needle);
  for (int i = 0; i < m->nparts; i++)
    if (m->parts[i].kind == MML_PART_TEXT && memmem(m->parts[i].text, m->parts[i].len, needle, nl))
      return true;
  return false;
}

/* LLaMA-Factory's qwen3_vl (ReasoningTemplate, enable_thinking): the empty thought that
 * starts a target without one, trained as the target is (mml/template.h, LLaMA-Factory 3.). */
static mml_status lf_empty_thought(out_ctx *o, int k, int last, bool sup) {
  const mml_template *t = o->t;
  const mml_message *m = &o->rec->messages[k];
  if (!t->lf_on || !t->lf.enable_thinking) return MML_OK;
  if (t->lf.mask_history && k != last) {
    if (parts_hold(m, "<think>\n"))
      return mml_err_set(o->err, MML_ERECORD,
                         "bad record: message %d: a thought in a history turn under "
                         "mask_history + enable_thinking (LLaMA-Factory rewrites it; not "
                         "supported)",
                         k);
    return MML_OK;
  }
  if (parts_hold(m, "<think>") || parts_hold(m, "</think>")) return MML_OK;
  TRY(emit_cstr(o, "<think>\n\n</think>\n\n", sup));
  return o->text ? MML_OK : flush(o); /* tokenized on its own */
}

/* One message as <|im_start|>{role}\n{content}<|im_end|>\n, supervised as the label mode
 * says (function_call turns: the formatted call as an assistant turn). */
static mml_status emit_turn(out_ctx *o, int k, int last) {
  const mml_template *t = o->t;
  const mml_message *m = &o->rec->messages[k];
  bool call = m->role == MML_ROLE_FUNCTION_CALL;
  bool asst = is_target(m);
  bool sup = asst && (t->labels != MML_LABELS_LAST_ASSISTANT || k == last);
  bool end_sup = sup && (t->labels != MML_LABELS_NO_NONFINAL_END || k == last);
  if (!asst && k > 0 && is_target(m - 1)) TRY(lf_mark(o)); /* the next pair's source */
  TRY(emit_marker(o, TOK_IM_START, false));
  TRY(emit_cstr(o, call ? "assistant" : m->role_name, false));
  TRY(emit_cstr(o, "\n", false));
  if (asst) TRY(lf_mark(o)); /* the target: content tokenized from its first byte */
  if (asst) TRY(lf_empty_thought(o, k, last, sup));
  if (call) {
    TRY(format_function_call(o, k, m));
    TRY(emit_text(o, (const char *)o->fmt.data, o->fmt.len, sup));
  } else {
    TRY(emit_parts(o, m, sup));
  }
  TRY(emit_marker(o, TOK_IM_END, end_sup));
  return emit_cstr(o, "\n", end_sup);
}

/* The chat template.  Qwen2-VL (and 2.5): a default system turn when the first message is
 * not a system message; every message as <|im_start|>{role}\n{content}<|im_end|>\n.
 * Qwen3-VL (Instruct): no default system turn; the system message only when first; tool
 * messages grouped into one user turn of <tool_response> blocks; other roles dropped.
 * LLaMA-Factory's fields (qwen2_vl / qwen3_vl_nothink templates, tool_format "qwen"): the
 * record's "system" when no system message leads; "tools" appended to the system turn
 * (which then renders in qwen3-vl too); function_call turns written as assistant turns
 * (trained); observation turns as <|im_start|>user\n<tool_response>\n...\n
 * </tool_response><|im_end|>\n (not trained), in both styles. */
static mml_status walk(out_ctx *o) {
  const mml_template *t = o->t;
  const mml_record *rec = o->rec;
  int n = rec->nmessages;
  if (n <= 0) return mml_err_set(o->err, MML_ERECORD, "bad record: empty conversation");
  int last = -1;
  for (int k = 0; k < n; k++)
    if (rec->messages[k].role == MML_ROLE_ASSISTANT ||
        rec->messages[k].role == MML_ROLE_FUNCTION_CALL)
      last = k;

  if (t->lf_on) {
    TRY(lf_check_shape(o));
    TRY(lf_check_video(o));
    TRY(lf_mark(o)); /* the first pair's source: the system turn too */
  }
  bool tools = rec->tools != NULL;
  if (tools) TRY(format_tools(o, rec->tools));
  bool first_sys = rec->messages[0].role == MML_ROLE_SYSTEM;
  if (!first_sys) { /* the record's own system, else the source's, else the style's */
    const char *sys = rec->system                         ? rec->system
                      : t->system_set                     ? t->system
                      : t->style == MML_TEMPLATE_QWEN2_VL ? k_default_system
                                                          : NULL;
    if (sys && !sys[0]) sys = NULL;
    if (sys || tools) TRY(emit_system_turn(o, NULL, sys, tools));
  }
  for (int k = 0; k < n; k++) {
    const mml_message *m = &rec->messages[k];
    if (k == 0 && first_sys) {
      TRY(emit_system_turn(o, m, NULL, tools));
      continue;
    }
    if (m->role == MML_ROLE_OBSERVATION) {
      if (k > 0 && is_target(m - 1)) TRY(lf_mark(o));
      TRY(emit_marker(o, TOK_IM_START, false));
      TRY(emit_cstr(o, "user\n<tool_response>\n", false));
      TRY(emit_parts(o, m, false));
      TRY(emit_cstr(o, "\n</tool_response>", false));
      TRY(emit_marker(o, TOK_IM_END, false));
      TRY(emit_cstr(o, "\n", false));
      continue;
    }
    if (t->style == MML_TEMPLATE_QWEN3_VL) {
      if (is_tool(m)) {
        if (k == 0 || !is_tool(m - 1)) {
          TRY(emit_marker(o, TOK_IM_START, false));
          TRY(emit_cstr(o, "user", false));
        }
        TRY(emit_cstr(o, "\n<tool_response>\n", false));
        TRY(emit_parts(o, m, false));
        TRY(emit_cstr(o, "\n</tool_response>", false));
        if (k == n - 1 || !is_tool(m + 1)) {
          TRY(emit_marker(o, TOK_IM_END, false));
          TRY(emit_cstr(o, "\n", false));
        }
        continue;
      }
      bool dropped = (m->role == MML_ROLE_SYSTEM && k > 0) || m->role == MML_ROLE_OTHER;
      if (dropped) {
        if (has_image(m))
          return mml_err_set(o->err, MML_ERECORD,
                             "bad record: message %d (role \"%s\") holds an image or video but the "
                             "qwen3-vl template drops such messages",
                             k, m->role_name);
        continue;
      }
    }
    TRY(emit_turn(o, k, last));
  }
  return flush(o);
}

/* LLaMA-Factory's train_on_prompt and cutoff_len (mml/template.h, LLaMA-Factory 4. and
 * 6.) over the pairs the walk marked: pairs[2k] source, pairs[2k+1] target. */
static mml_status lf_finish(out_ctx *o, size_t ids0) {
  const mml_template *t = o->t;
  if (o->npairs % 2)
    return mml_err_set(o->err, MML_EINTERNAL, "template: %d pair marks", o->npairs);
  if (t->lf.train_on_prompt)
    for (int k = 0; k < o->npairs; k += 2)
      for (int64_t i = o->pairs[k]; i < o->pairs[k + 1]; i++) o->labels->data[i] = o->ids->data[i];
  if (t->lf.cutoff_len <= 0) return MML_OK;
  const int32_t media[4] = {t->id[TOK_IMAGE_PAD], t->id[TOK_VIDEO_PAD], t->id[TOK_VISION_START],
                            t->id[TOK_VISION_END]};
  return mml_lf_truncate(o->pairs, o->npairs / 2, t->lf.cutoff_len, t->lf.mask_history, media, 4,
                         ids0, o->ids, o->labels, o->err);
}

/* Qwen's labels and model_max_length cut (mml/template.h, qwen-vl-finetune 2. and 3.). */
static mml_status qft_finish(out_ctx *o, size_t ids0) {
  const mml_template *t = o->t;
  const int32_t media[4] = {t->id[TOK_IMAGE_PAD], t->id[TOK_VIDEO_PAD], t->id[TOK_VISION_START],
                            t->id[TOK_VISION_END]};
  return mml_qft_finish(QFT_ASSISTANT_ID, QFT_IM_END_ID, t->qft.model_max_length, media, 4, ids0,
                        o->ids, o->labels, o->err);
}

mml_status mml_template_encode_media(const mml_template *t, mml_tok_scratch *scratch,
                                     const mml_record *rec, const int64_t *image_tokens,
                                     const mml_video_tokens *videos, mml_ids *ids, mml_ids *labels,
                                     mml_err *err) {
  if (!t || !rec || !ids || !labels) return mml_err_set(err, MML_EINVAL, "template: NULL argument");
  if (!t->tok)
    return mml_err_set(err, MML_EINVAL, "template: created without a tokenizer (render only)");
  if (ids->len != labels->len)
    return mml_err_set(err, MML_EINVAL, "template: ids and labels differ in length");
  size_t ids0 = ids->len;
  out_ctx o = {.t = t,
               .rec = rec,
               .image_tokens = image_tokens,
               .videos = videos,
               .err = err,
               .scratch = scratch,
               .ids = ids,
               .labels = labels,
               .sup_from = NO_SUP,
               .seg_cap = sizeof o.seg_stack};
  o.seg = o.seg_stack;
  mml_status st = t->qft_on ? mml_qft_check_record(rec, err) : MML_OK;
  if (!st) st = walk(&o);
  if (!st && t->lf_on) st = lf_finish(&o, ids0);
  if (!st && t->qft_on) st = qft_finish(&o, ids0);
  free(o.pairs);
  if (o.seg != o.seg_stack) free(o.seg);
  mml_bytes_free(&o.fmt);
  mml_bytes_free(&o.scratch_text);
  if (st) ids->len = labels->len = ids0;
  return st;
}

mml_status mml_template_encode(const mml_template *t, mml_tok_scratch *scratch,
                               const mml_record *rec, const int64_t *image_tokens, mml_ids *ids,
                               mml_ids *labels, mml_err *err) {
  return mml_template_encode_media(t, scratch, rec, image_tokens, NULL, ids, labels, err);
}

mml_status mml_template_render_media(const mml_template *t, const mml_record *rec,
                                     const int64_t *image_tokens, const mml_video_tokens *videos,
                                     mml_bytes *out, mml_err *err) {
  if (!t || !rec || !out) return mml_err_set(err, MML_EINVAL, "template: NULL argument");
  size_t len0 = out->len;
  out_ctx o = {
      .t = t, .rec = rec, .image_tokens = image_tokens, .videos = videos, .err = err, .text = out};
  mml_status st = walk(&o);
  mml_bytes_free(&o.fmt);
  mml_bytes_free(&o.scratch_text);
  if (st) out->len = len0;
  return st;
}

mml_status mml_template_render(const mml_template *t, const mml_record *rec,
                               const int64_t *image_tokens, mml_bytes *out, mml_err *err) {
  return mml_template_render_media(t, rec, image_tokens, NULL, out, err);
}
