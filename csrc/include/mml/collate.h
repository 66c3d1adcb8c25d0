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

typedef struct mml_collate_cfg {
  int micro_batch_size;    /* rows per padded batch (packing: packs are [1, pack_length]) */
  int64_t seq_length;      /* padded: fixed row length; 0 pads to the longest in the batch */
  int pack;                /* 1: pack samples into [1, pack_length] */
  int64_t pack_length;     /* token budget of one pack (defaults to seq_length) */
  int pad_to_multiple;     /* pad each packed sample to a multiple (TP/CP); 0/1: none */
  int32_t pad_id;          /* input id used for padding */
  mml_key_style keys;      /* tensor names: HF/Qwen (input_ids, labels, ...) or Megatron */
  int shift_labels;        /* 1: labels[i] = next token's label (Megatron convention) */
  int attention_mask;      /* 1: emit attention_mask */
  int mrope;               /* 1: emit 3-row M-RoPE position ids and rope_deltas */
  int spatial_merge;       /* merge size, for M-RoPE */
  int32_t image_pad_id, vision_start_id; /* for M-RoPE */
  int pixel_cols;          /* C*T*P*P, for the text-only placeholder */
} mml_collate_cfg;

typedef struct mml_collator mml_collator;

mml_status mml_collator_new(const mml_collate_cfg *cfg, mml_pool *pool, mml_collator **out,
                            mml_err *err);
void mml_collator_free(mml_collator *c);

/* 1 when `s` fits in the current batch; 0 when the current batch must be emitted first.
 * An empty batch always accepts (an over-long sample was filtered before collation). */
int mml_collator_fits(const mml_collator *c, const mml_sample *s);
/* Takes s's contents (swap); s is left reset with spare capacity. */
mml_status mml_collator_add(mml_collator *c, mml_sample *s, mml_err *err);
int mml_collator_count(const mml_collator *c);
/* 1 when the batch is complete and must be emitted now (padded: micro_batch_size rows). */
int mml_collator_full(const mml_collator *c);
/* Builds the batch tensors (buffers from the pool) and starts a new empty batch. */
mml_status mml_collator_emit(mml_collator *c, mml_batch *out, mml_err *err);
/* Drops the current partial batch (used on seek/restart). */
void mml_collator_reset(mml_collator *c);

#endif
