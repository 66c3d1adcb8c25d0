/*
 * mml/template.h — Qwen-VL chat templates rendered straight to token ids and labels.
 * The whole conversation is rendered as the reference template renders it, each image
 * placeholder expanded to <|vision_start|> + N x <|image_pad|> + <|vision_end|>, and the
 * rendered string is tokenized as one string (special tokens split out first), as the
 * HF processor does.  Labels are -100 outside supervised spans.
 *
 * Templates (the public Jinja templates of the Instruct checkpoints, without tools):
 *   qwen2-vl / qwen2.5-vl: "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
 *     first when the first message is not a system message; then every message as
 *     "<|im_start|>{role}\n{content}<|im_end|>\n" (roles human/gpt become user/assistant;
 *     other roles are written as the record names them).
 *   qwen3-vl: no default system turn; a system message is rendered only when it is first;
 *     "tool" messages become one "<|im_start|>user" turn of "\n<tool_response>\n...\n
 *     </tool_response>" blocks, as the reference does; other roles are dropped (a dropped
 *     message that holds an image is a bad record).  <think> handling of the Thinking
 *     checkpoints is not applied: assistant text is rendered verbatim.
 *   LLaMA-Factory's fields, rendered as its qwen2_vl / qwen3_vl_nothink templates do
 *   (tool_format "qwen"), in both styles: the record's top-level "system" stands in for
 *   a leading system message (which wins when both are there; qwen2-vl falls back to the
 *   default prompt); "tools" adds the "# Tools" section (each tool re-serialised as
 *   Python's json.dumps writes it, wrapped as {"type": "function", "function": ...} unless
 *   it already says so) to the system turn, which then renders in qwen3-vl too;
 *   function_call turns are assistant turns whose content is the call JSON rewritten as
 *   "<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>" blocks (text around a
 *   <tool_call>...</tool_call> and a leading <think> block kept, as FunctionFormatter
 *   does), supervised like assistant turns; observation turns are
 *   "<|im_start|>user\n<tool_response>\n...\n</tool_response><|im_end|>\n", never
 *   supervised.  Known difference: LLaMA-Factory tokenizes each message on its own, so
 *   assistant content that starts with whitespace ("\n\nx") can tokenize differently
 *   at that one boundary; everything else is token-exact.
 *   Image parts are rendered where they stand in any turn (as frameworks that substitute
 *   `<image>` in string content do).  The qwen3-vl Jinja template would omit image parts
 *   given as content-part lists in system/assistant turns, which leaves the image without
 *   a placeholder; mmloader keeps it.
 *   Text that itself contains <|vision_start|>, <|vision_end|>, <|image_pad|> or
 *   <|video_pad|> is a bad record (MML_ERECORD): it would desynchronise images and pads.
 *
 * Labels (mml_label_mode): a label is the token's own id where supervised, else -100
 * (labels are not shifted).  Supervised bytes are the assistant turns' content and the
 * closing "<|im_end|>\n" as the mode selects.  Image placeholder tokens
 * (<|vision_start|>, pads, <|vision_end|>) are never supervised, even inside an assistant
 * turn.  A token that straddles a span boundary (possible only at the start of assistant
 * content that begins with whitespace, e.g. "assistant\n" + "\n\nAnswer" tokenizes the
 * newlines together) is LABELLED: any token holding at least one supervised byte is
 * supervised.  Span ends always fall on <|im_end|> or the turn's final "\n", which are
 * token boundaries.
 *
 * Length: no truncation here.  max_length is enforced by the engine, which skips longer
 * samples with reason "too_long".
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
  MML_LABELS_ALL_ASSISTANT = 0, /* every assistant turn's content + its <|im_end|>\n */
  MML_LABELS_LAST_ASSISTANT,    /* only the final assistant turn */
  MML_LABELS_NO_NONFINAL_END,   /* all assistant content; <|im_end|>\n only on the last */
} mml_label_mode;

/* Whitespace around `<image>` tags (and in user text generally):
 *   IN_PLACE  the text as written, tags replaced where they stand (HF processor,
 *             LLaMA-Factory, ms-swift);
 *   STRIP     Qwen's qwen-vl-finetune (data_processor._build_messages): in user turns the
 *             text between tags is stripped (Python str.strip()) and dropped when empty,
 *             so "<image>\nWhat is it?" renders the image then "What is it?". */
typedef enum { MML_IMAGE_SPACE_IN_PLACE = 0, MML_IMAGE_SPACE_STRIP } mml_image_space;

typedef struct mml_template mml_template;

/* The tokenizer must outlive the template.  Special ids are looked up by name
 * (<|im_start|>, <|im_end|>, <|vision_start|>, <|vision_end|>, <|image_pad|>); each must be
 * an added token (encodes alone to its own id), else MML_ETOKENIZER.  tok may be NULL for
 * a render-only template (mml_template_encode then fails with MML_EINVAL). */
mml_status mml_template_new(mml_template_style style, mml_label_mode labels,
                            const mml_tokenizer *tok, mml_template **out, mml_err *err);
void mml_template_free(mml_template *t);
/* Chooses the `<image>` whitespace convention (default IN_PLACE); call before sharing. */
mml_status mml_template_set_image_space(mml_template *t, mml_image_space space, mml_err *err);

/* How a Qwen3-VL video's timestamped blocks sit in the prompt (Loader qwen3_video_prompt),
 * as transformers' Qwen3VLProcessor writes them:
 *   BARE   transformers 4.57 to 5.9 and 5.25 on (the default; 5.25 is the reference): the
 *          whole <|vision_start|><|video_pad|><|vision_end|> is replaced by the blocks;
 *   OUTER  transformers 5.10 to 5.24: only the chat template's <|video_pad|> is replaced,
 *          so the blocks sit inside its <|vision_start|> ... <|vision_end|> pair (two
 *          tokens more per video).
 * Qwen2/2.5-VL videos have no blocks: the form does not apply.  Under LLaMA-Factory's data
 * path (mml_template_set_llama_factory) its own form, BARE's, is written whatever this says. */
typedef enum { MML_QWEN3_VIDEO_BARE = 0, MML_QWEN3_VIDEO_OUTER } mml_qwen3_video_form;
mml_status mml_template_set_qwen3_video(mml_template *t, mml_qwen3_video_form form, mml_err *err);
/* The default system turn, rendered as "<|im_start|>system\n{text}<|im_end|>\n" before a
 * conversation whose first message is not a system message: NULL restores the style's
 * default (qwen2-vl's "You are a helpful assistant.", none for qwen3-vl), "" means none.
 * Call before sharing the template. */
mml_status mml_template_set_system(mml_template *t, const char *text, mml_err *err);

/* LLaMA-Factory's data path (Loader recipe="llama-factory"; its data/template.py,
 * processor/supervised.py and processor_utils.infer_seqlen, v0.9.5):
 *   1. the conversation must be LLaMA-Factory's shape: an optional leading system message,
 *      then (user | observation, assistant | function_call) pairs, ending with a target;
 *      other shapes are bad records (LLaMA-Factory drops them);
 *   2. each message is tokenized on its own, the user turn's "<|im_start|>assistant\n"
 *      with the source, the assistant content from its first byte (no boundary token);
 *   3. enable_thinking (its qwen3_vl template): "<think>\n\n</think>\n\n", tokenized on its
 *      own, starts every target whose text holds neither "<think>" nor "</think>", and is
 *      trained (with mask_history: only the last target's; a history target holding a
 *      "<think>\n" block, which LLaMA-Factory would rewrite, is a bad record);
 *   4. train_on_prompt: every source token is labelled too (image pads included);
 *   5. mask_history: only the last target is labelled (the template's label mode must be
 *      MML_LABELS_LAST_ASSISTANT then, MML_LABELS_ALL_ASSISTANT otherwise);
 *   6. cutoff_len > 0: pairs are taken in order (last first with mask_history) while the
 *      running length is under cutoff_len, each cut to infer_seqlen(source, target,
 *      cutoff_len - running) tokens from its start; later pairs are dropped.  A cut that
 *      removes part of an image's or video's tokens is MML_ETOOLONG (the model would
 *      refuse the sample: features and tokens would not match);
 *   7. Qwen3-VL videos (its Qwen3VLPlugin): the timestamped blocks replace the whole
 *      "<video>" (no outer <|vision_start|>/<|vision_end|> pair); a record with more than
 *      one video, or its video outside the first message after the optional system
 *      message, is a bad record (LLaMA-Factory 0.9.5 takes the timestamps by message
 *      index and every video's frame count from the first video). */
typedef struct mml_lf_opts {
  int64_t cutoff_len; /* 0: no truncation */
  int mask_history, train_on_prompt, enable_thinking;
  /* its image pre-resize (image_max_pixels, image_min_pixels): the loader copies them into
   * the source's mml_vision_cfg (lf_max_pixels, lf_min_pixels; mml/vision.h) */
  int64_t image_max_pixels, image_min_pixels;
  /* and its video path (video_fps, video_maxlen, video_max_pixels, video_min_pixels): into
   * the vision cfg's lf_video_* fields */
  double video_fps;
  int64_t video_maxlen, video_max_pixels, video_min_pixels;
} mml_lf_opts;

/* Switches t to LLaMA-Factory's data path (o: NULL switches it off); call before sharing.
 * MML_ECONFIG for mask_history with train_on_prompt (LLaMA-Factory refuses them too), a
 * label mode that does not match mask_history, or enable_thinking with qwen2-vl. */
mml_status mml_template_set_llama_factory(mml_template *t, const mml_lf_opts *o, mml_err *err);

/* Qwen's own fine-tuning code (Loader recipe="qwen-vl-finetune"; QwenLM/Qwen3-VL
 * qwen-vl-finetune/qwenvl/data/data_processor.py at 96588727): the template's
 * MML_IMAGE_SPACE_STRIP rendering (its _build_messages), then
 *   1. only user and assistant turns ("human" / "gpt"): a system, tool, function_call or
 *      observation turn, a top-level "system" or "tools", an image in a non-user turn,
 *      are bad records (its code would read such a turn as the assistant's, ignore the
 *      fields, keep "<image>" in an answer as text); a video given as a frame list is
 *      MML_EUNSUPPORTED (its layout names video files; those are read as the video
 *      processor reads them: mml_vision_cfg's qft fields, video/video_frames.c);
 *   2. labels as preprocess_qwen_visual sets them from the ids alone: at every token
 *      77091 ("assistant") the span from two tokens on up to the next 151645
 *      (<|im_end|>) and one token past it is labelled (its own id), whatever lies in it;
 *      a span with no <|im_end|> after it is not;
 *   3. model_max_length > 0: ids and labels are cut to their first model_max_length
 *      tokens, as its DataCollatorForSupervisedDataset cuts each padded row; a cut that
 *      removes any image or video token is MML_ETOOLONG (the model would refuse the
 *      sample: features and tokens would not match).
 *   4. Qwen3-VL videos: the timestamped blocks replace the whole
 *      <|vision_start|><|video_pad|><|vision_end|> (MML_QWEN3_VIDEO_BARE, what the
 *      processor's apply_chat_template writes under its transformers 4.57 and 5.25).
 * The labels' fixed ids must be the tokenizer's "assistant" and <|im_end|> (MML_ECONFIG
 * otherwise), and the template's label mode MML_LABELS_ALL_ASSISTANT. */
typedef struct mml_qft_opts {
  int64_t model_max_length; /* 0: no cut */
  /* its DataArguments video_min_frames / video_max_frames (the Qwen3-VL video processor's
   * frame bounds); video_fps, video_min_pixels and video_max_pixels are the rows the
   * llama-factory recipe reads too (mml_lf_opts): the loader copies all five into the
   * source's mml_vision_cfg (qft_video_*, video_min_pixels / video_max_pixels) */
  int64_t video_min_frames, video_max_frames;
} mml_qft_opts;

/* Switches t to Qwen's fine-tuning data path (o: NULL switches it off); call before
 * sharing.  Sets the template's image whitespace to MML_IMAGE_SPACE_STRIP. */
mml_status mml_template_set_qwen_finetune(mml_template *t, const mml_qft_opts *o, mml_err *err);

/* The record rules of t's recipe (qwen-vl-finetune: 1. above; none otherwise), for the
 * loader to refuse a record before it reads the record's media. */
mml_status mml_template_check_record(const mml_template *t, const mml_record *rec, mml_err *err);

/* Qwen's record rules (1. above): MML_OK, MML_ERECORD or MML_EUNSUPPORTED naming why. */
mml_status mml_qft_check_record(const mml_record *rec, mml_err *err);

/* Qwen's labels and cut (2. and 3. above) over ids/labels[from, len).  media_ids (n of
 * them) are the tokens a cut must not remove.  On failure ids/labels are unchanged. */
mml_status mml_qft_finish(int32_t assistant_id, int32_t im_end_id, int64_t model_max_length,
                          const int32_t *media_ids, int n_media, size_t from, mml_ids *ids,
                          mml_ids *labels, mml_err *err);

/* LLaMA-Factory's truncation (6. above) of ids/labels[from, len): pairs[2k] and
 * pairs[2k+1] are pair k's source and target starts (offsets into ids, from included),
 * pair k ends where pair k+1 starts (the last at ids->len).  Kept tokens stay in order.
 * media_ids (n of them) are the tokens that must survive whole (image and video pads). */
mml_status mml_lf_truncate(const int64_t *pairs, int npairs, int64_t cutoff_len, int reverse,
                           const int32_t *media_ids, int n_media, size_t from, mml_ids *ids,
                           mml_ids *labels, mml_err *err);

/* Appends ids and labels (same length) for `rec`; image_tokens[i] is the number of
 * <|image_pad|> tokens of rec->images[i] (>= 1; NULL allowed when rec has no images).
 * scratch may be NULL (one per thread otherwise).  On failure ids and labels are left at
 * their previous lengths; record problems are MML_ERECORD. */
mml_status mml_template_encode(const mml_template *t, mml_tok_scratch *scratch,
                               const mml_record *rec, const int64_t *image_tokens, mml_ids *ids,
                               mml_ids *labels, mml_err *err);

/* What a video placeholder holds (see emit_video in template.c): `groups` temporal
 * patches (grid_t) of `group_tokens` <|video_pad|> each (grid_h * grid_w / merge^2).
 * Qwen2/2.5-VL: <|vision_start|> + groups * group_tokens pads + <|vision_end|>.
 * Qwen3-VL (as transformers 5.24's Qwen3VLProcessor renders it): <|vision_start|>, then per
 * temporal patch "<{timestamps[g]:.1f} seconds>" (text) + <|vision_start|> + group_tokens
 * pads + <|vision_end|>, then <|vision_end|> (MML_QWEN3_VIDEO_BARE and recipe
 * llama-factory, LLaMA-Factory 7. above: without that outer pair). */
typedef struct mml_video_tokens {
  int64_t groups, group_tokens;
  const double *timestamps; /* qwen3-vl: groups values in seconds (NULL otherwise) */
} mml_video_tokens;

/* As mml_template_encode, for records with videos too: videos[i] for rec->videos[i] (NULL
 * allowed when rec has none). */
mml_status mml_template_encode_media(const mml_template *t, mml_tok_scratch *scratch,
                                     const mml_record *rec, const int64_t *image_tokens,
                                     const mml_video_tokens *videos, mml_ids *ids, mml_ids *labels,
                                     mml_err *err);
mml_status mml_template_render_media(const mml_template *t, const mml_record *rec,
                                     const int64_t *image_tokens, const mml_video_tokens *videos,
                                     mml_bytes *out, mml_err *err);

/* Appends the rendered text (with image pads expanded) to out — for tests and debugging.
 * On failure out keeps its previous length. */
mml_status mml_template_render(const mml_template *t, const mml_record *rec,
                               const int64_t *image_tokens, mml_bytes *out, mml_err *err);

#endif
