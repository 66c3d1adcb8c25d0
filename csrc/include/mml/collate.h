/*
 * mml/collate.h — turns finished samples, offered strictly in stream order, into batches:
 * padded [micro_batch_size, seq_length] rows or packed [1, pack_length] sequences with
 * cu_seqlens, plus the Qwen-VL vision tensors.  Packing is greedy in stream order: a
 * sample that does not fit closes the current pack and starts the next one, so batch
 * composition is a pure function of the sample stream and resuming needs only the cursor.
 *
 * Threads: a collator is used by one thread at a time (the engine's collation step).
 */
#ifndef MML_COLLATE_H
#define MML_COLLATE_H

#include "mml/batch.h"
#include "mml/common.h"
#include "mml/sample.h"

typedef enum { MML_KEYS_QWEN = 0, MML_KEYS_MEGATRON } mml_key_style;

/* Special token ids shared by the Qwen2, Qwen2.5 and Qwen3 vocabularies: defaults for
 * callers without a tokenizer (tests, the collate hook).  The loader asks its tokenizer
 * instead (mml_tokenizer_token_to_id). */
enum {
  MML_QWEN_ENDOFTEXT_ID = 151643,    /* <|endoftext|>, the padding id */
  MML_QWEN_VISION_START_ID = 151652, /* <|vision_start|> */
  MML_QWEN_IMAGE_PAD_ID = 151655,    /* <|image_pad|> */
  MML_QWEN_VIDEO_PAD_ID = 151656,    /* <|video_pad|> */
};
/* Qwen2.5-VL's vision_config.tokens_per_second (temporal positions per second). */
#define MML_QWEN25_TOKENS_PER_SECOND 2

/* What a batch without any image carries for pixel_values / image_grid_thw. */
typedef enum {
  MML_VISION_PLACEHOLDER = 0, /* pixel_values float32 [1, pixel_cols] of zeros and
                                 image_grid_thw int64 [[0, 0, 0]]: t == 0 marks it */
  MML_VISION_OMIT,            /* neither key is present */
  MML_VISION_EMPTY,           /* pixel_values [0, pixel_cols], image_grid_thw [0, 3] */
} mml_text_only_vision;

/*
 * Tensors of a batch (B = micro_batch_size rows of L = seq_length in padded mode; B = 1,
 * L = pack_length in packed mode; n = samples in the batch; "ignored" = -100):
 *
 *   qwen keys        megatron keys     dtype / shape
 *   input_ids        tokens            int64 [B, L]; padding holds pad_id
 *   labels           labels            int64 [B, L]; ignored at padding and prompt tokens
 *   -                loss_mask         float32 [B, L]; 1.0 where labels is not ignored
 *   position_ids     position_ids      int64 [B, L], or [3, B, L] with mrope, [4, 1, L] with
 *                                      mrope + packing + qwen keys (row 0: text positions,
 *                                      which transformers uses to find the packed samples)
 *   attention_mask   attention_mask    (only with cfg.attention_mask)
 *                                      qwen: int64 [B, L], 1 on real tokens, 0 on padding;
 *                                      megatron: bool [B, 1, L, L], true = masked (causal;
 *                                      block-diagonal per sample slot when packed)
 *   mm_token_type_ids -                int64 [B, L], 1 on <|image_pad|>, 2 on <|video_pad|>
 *                                      (cfg.mm_token_type_ids)
 *   rope_deltas      rope_deltas       int64 [B, 1] padded, [n, 1] packed (mrope only)
 *   pixel_values     pixel_values      [rows, pixel_cols] float32 / bfloat16 / uint8 (as
 *                                      cfg.pixel_format), all images in order
 *   image_grid_thw   image_grid_thw    int64 [n_images, 3]; text-only: cfg.text_only_vision
 *   pixel_values_videos (same)         [video rows, video_cols] in cfg.pixel_format, every
 *                                      video in order; only in batches with videos (as the
 *                                      HF processors)
 *   video_grid_thw   (same)            int64 [n_videos, 3]
 *   second_per_grid_ts (same)          float32 [n_videos] (cfg.second_per_grid: Qwen2.5-VL)
 *   cu_seqlens       -                 packed only: int32 [n+1], offsets of the sample slots
 *                                      in the row (a slot is a sample plus its padding to
 *                                      pad_to_multiple); the tail padding after the last
 *                                      slot is outside
 *   cu_seqlens_unpadded -              packed with pad_to_multiple > 1: int32 [n+1],
 *                                      cumulative real lengths
 *   max_seqlen       -                 packed only: int32 [1], the longest slot
 *   -                cu_seqlens        packed only: int32 [n+1], cumulative real lengths
 *                                      (Megatron's name: the real boundaries)
 *   -                cu_seqlens_padded packed only: int32 [n+1], slot offsets; the last
 *                                      entry is L (the tail padding joins the last slot)
 *   -                max_seqlen        packed only: int32 [1], the longest padded slot
 *
 * Labels: shift_labels = 0 keeps labels aligned with the ids (HF shifts inside the loss);
 * when packed, each sample's first label is forced to ignored so that the loss's shift never
 * predicts a token of the next sample.  shift_labels = 1 gives labels[i] = label of token
 * i+1 of the same sample, and ignored on each sample's last token.
 * Positions: padded rows count 0..L-1 (padding included); packed slots restart at 0 and run
 * through their padding; the tail padding counts from 0 again.  With mrope, real tokens get
 * transformers' get_rope_index values (per sample when packed) and padding gets 0.
 *
 * Flattened (cfg.flatten, qwen keys only: Qwen's FlattenedDataCollatorForSupervisedDataset
 * of qwen-vl-finetune 96588727): a batch is micro_batch_size samples, composed as padded
 * batches are, written back to back into one row, B = 1, L = the sum of their lengths (no
 * padding anywhere); labels as the samples have them (none forced to ignored); position_ids
 * int64 [3, 1, L], each sample's M-RoPE positions from 0 (whatever cfg.mrope) as Qwen's
 * rope2d.py computes them (legacy_advance, mml/mrope.h: Qwen2.5-VL videos differ from
 * transformers 5's); attention_mask
 * int32 [n+1] holds the cumulative sample lengths (its name for cu_seqlens; needs
 * cfg.attention_mask); no rope_deltas, cu_seqlens or max_seqlen.  Not with pack,
 * seq_length, shift_labels or megatron keys (check_cfg refuses them).
 */

typedef struct mml_collate_cfg {
  int micro_batch_size; /* rows per padded batch (ignored when packing: one pack
                        [1, pack_length] per batch) */
  int64_t seq_length;   /* padded: fixed row length; 0 pads to the longest in the batch */
  int pack;             /* 1: pack samples into [1, pack_length] */
  int64_t pack_length;  /* token budget of one pack (defaults to seq_length) */
  int pad_to_multiple;  /* pad each packed sample to a multiple (TP/CP); 0/1: none */
  int32_t pad_id;       /* input id used for padding */
  mml_key_style keys;   /* tensor names: HF/Qwen (input_ids, labels, ...) or Megatron */
  int shift_labels;     /* 1: labels[i] = next token's label (Megatron convention) */
  int attention_mask;   /* 1: emit attention_mask */
  int mrope;            /* 1: emit 3-row M-RoPE position ids and rope_deltas */
  int spatial_merge;    /* merge size, for M-RoPE */
  int32_t image_pad_id, vision_start_id; /* for M-RoPE */
  int32_t video_pad_id;                  /* <|video_pad|> (-1: none) */
  int second_per_grid;    /* 1: emit second_per_grid_ts and scale video time positions by
                            MML_QWEN25_TOKENS_PER_SECOND (Qwen2.5-VL) */
  int split_video_frames; /* 1: Qwen3-VL positions (one block per temporal patch) */
  int pixel_cols;         /* values per pixel_values row (mml_vision_pixel_cols) */
  int pixel_format;       /* MML_PIXEL_* (mml/vision.h): the dtype of pixel_values and
                            pixel_values_videos */
  int video_cols;         /* values per pixel_values_videos row (mml_vision_video_cols;
                            0: pixel_cols) */
  int text_only_vision;   /* mml_text_only_vision */
  int mm_token_type_ids;  /* 1: qwen keys also carry mm_token_type_ids (transformers >= 5) */
  int rows_dynamic;       /* padded: a batch has as many rows as samples and the engine
                            decides where it ends (token-budget batches, mml/plan.h);
                            micro_batch_size is then ignored */
  int flatten;            /* 1: Qwen's flattened batch (qwen-vl-finetune's data_flatten, see
                            below): micro_batch_size samples concatenated into [1, L] */
  int rope2d;             /* 1 (padded rows, with mrope): Qwen's own positions, as its
                            qwen-vl-finetune DataCollatorForSupervisedDataset gives them: its
                            rope2d.py rule after a vision block (legacy_advance, mml/mrope.h)
                            and padding positions 1 (its pad_and_cat) instead of 0 */
} mml_collate_cfg;

typedef struct mml_collator mml_collator;

mml_status mml_collator_new(const mml_collate_cfg *cfg, mml_pool *pool, mml_collator **out,
                            mml_err *err);
void mml_collator_free(mml_collator *c);

/* Whether `s` can ever be collated: MML_ETOOLONG (message gives the lengths) when it is
 * longer than seq_length / pack_length (after padding to pad_to_multiple), MML_EINVAL when
 * its fields disagree (ids vs labels, pixel rows vs grids, image tokens vs grids when mrope
 * is on).  Const and reentrant: the engine calls it in worker threads, before collation. */
mml_status mml_collator_check(const mml_collator *c, const mml_sample *s, mml_err *err);
/* Its length part alone, for a sample of n tokens (known from a dataset index before the
 * sample is built): the same MML_ETOOLONG and message. */
mml_status mml_collator_check_length(const mml_collator *c, int64_t n, mml_err *err);
/* Tokens `s` occupies in a batch row (its length, rounded up to pad_to_multiple when
 * packing). */
int64_t mml_collator_sample_tokens(const mml_collator *c, const mml_sample *s);

/* The composition step, a pure function of token counts: what a batch holds so far, and
 * whether a sample of `tokens` (mml_collator_sample_tokens) joins it (fits), and whether
 * it is then complete (full).  The collator runs it on finished samples; the loader's
 * planner runs the same step ahead of any pixel work, on the counts planned from image
 * headers, so both agree on every batch's composition.  A new batching policy changes
 * these three functions only. */
typedef struct mml_compose {
  int count;    /* samples */
  int64_t used; /* packed: sum of slot lengths; padded: longest sample */
  /* its samples' sums that its tensors' sizes depend on (mml_compose_emit_bytes): tokens,
   * pixel_values rows, images, videos, records (a flattened pack's) */
  int64_t tokens, rows, images, videos, records;
} mml_compose;
int mml_compose_fits(const mml_collator *c, const mml_compose *k, int64_t tokens);
void mml_compose_add(const mml_collator *c, mml_compose *k, const mml_sample *s);
int mml_compose_full(const mml_collator *c, const mml_compose *k);
/* The current batch's composition state. */
mml_compose mml_collator_compose_state(const mml_collator *c);
/* The most pixel_values rows any one batch can hold, or -1 when unbounded: packed, every
 * image row group stands for one token of the pack (rows = tokens * merge^2), so a pack
 * holds at most pack_length * max_merge^2 rows. */
int64_t mml_collator_rows_bound(const mml_collator *c, int max_merge);

/* Pixels written elsewhere (the loader writes each image straight into its slice of the
 * batch's pixel_values buffer, each video into its slice of pixel_values_videos): the
 * current batch's pixel_values (videos = 0) or pixel_values_videos (videos = 1) will be
 * a view of `buf` from byte 0 (one reference taken; NULL drops it).  Samples added then
 * carry pixels_elsewhere = 1 and no pixel bytes; video rows are always elsewhere (a batch
 * with video rows and no attached buffer is refused at emit). */
void mml_collator_attach_pixels(mml_collator *c, int videos, mml_buf *buf);
mml_buf *mml_collator_attached_pixels(const mml_collator *c, int videos);
/* pixel_values rows of the current batch so far. */
int64_t mml_collator_rows(const mml_collator *c);
/* The pool bytes mml_collator_emit will allocate for the current batch's tensors (each
 * tensor its own buffer, rounded as mml_pool_alloc rounds: 4 KiB pages below 1 MiB, whole
 * 2 MiB pages from there), pixel buffers attached with mml_collator_attach_pixels not
 * counted (they are views): what a memory cap must hold before the emission allocates
 * (csrc/core/loader/loader_admit.c).  Never less than what emit allocates. */
int64_t mml_collator_emit_bytes(const mml_collator *c);
/* The same for a batch of composition k (a plan's, before its samples are added), its
 * pixel_values counted unless its buffer will be attached (`pixels_attached`). */
int64_t mml_compose_emit_bytes(const mml_collator *c, const mml_compose *k, int pixels_attached);

/* 1 when `s` fits in the current batch; 0 when the current batch must be emitted first.
 * An empty batch always accepts (an over-long sample was filtered before collation). */
int mml_collator_fits(const mml_collator *c, const mml_sample *s);
/* Takes s's contents (swap); s is left reset with spare capacity. */
mml_status mml_collator_add(mml_collator *c, mml_sample *s, mml_err *err);
int mml_collator_count(const mml_collator *c);
/* 1 when the batch is complete and must be emitted now (padded: micro_batch_size rows;
 * never with rows_dynamic). */
int mml_collator_full(const mml_collator *c);
/* Builds the batch tensors (buffers from the pool) and starts a new empty batch.  Sets
 * out->nsamples, real_tokens (sum of sample lengths), token_slots (B * L) and out->after to
 * (epoch, pos + 1) of the last sample; the engine may overwrite `after`.  An empty batch is
 * MML_EINVAL.  On failure `out` is cleared and the samples stay in the collator. */
mml_status mml_collator_emit(mml_collator *c, mml_batch *out, mml_err *err);
/* Drops the current partial batch (used on seek/restart). */
void mml_collator_reset(mml_collator *c);

#endif
