/*
 * mml/mrope.h — Qwen2-VL / Qwen2.5-VL multimodal rotary position ids (M-RoPE) for images,
 * computed the way transformers' Qwen2VLModel.get_rope_index does:
 *
 *   - a text token takes position p in all three rows, then p += 1;
 *   - an image with grid (t, h, w) and merge size m covers t*(h/m)*(w/m) consecutive
 *     <|image_pad|> tokens; token (ti, hi, wi) in row-major order gets
 *     (p + ti, p + hi, p + wi); afterwards p += max(h, w) / m;
 *   - rope_delta = max(position) + 1 - n.
 *
 * A run of consecutive <|image_pad|> tokens consumes the next image grids in order until
 * the run is used up; a run that does not end exactly at an image boundary, or grids that
 * are left over (or missing) at the end, are an error (transformers would fail later with
 * a shape mismatch).
 *
 * Videos (mml_mrope_positions_media): a run of <|video_pad|> tokens takes the next video
 * grid, as get_rope_index of transformers 5.24 does per modality group:
 *   Qwen2-VL:   like an image;
 *   Qwen2.5-VL: temporal position p + (int64)(float(a) * float(tokens_per_second *
 *               second_per_grid_ts[v])) (torch float32 arithmetic, truncated);
 *   Qwen3-VL:   each temporal patch is its own run (the processor separates them with
 *               timestamp text) and its own grid (1, h, w).
 *
 * After a block (legacy_advance): transformers 5 goes on at p + max(h, w) / m; transformers
 * 4.x and Qwen's own qwen-vl-finetune rope2d.py go on at the block's largest position + 1
 * (`llm_pos_ids_list[-1].max() + 1`).  The two agree for images and Qwen3-VL frames (one
 * temporal patch: the largest is p + max(h, w) / m - 1) and differ for Qwen2/2.5-VL videos
 * whose temporal positions pass max(h, w) / m - 1.
 *
 * Threads: pure functions, reentrant.
 */
#ifndef MML_MROPE_H
#define MML_MROPE_H

#include "mml/common.h"

/* Positions of one sequence of n tokens.
 *   ids           token ids [n]
 *   grids         int32 [nimages * 3], (t, h, w) per image in order of appearance
 *   spatial_merge merge size m (h and w must be multiples of m)
 *   pos           output: row r (0: temporal, 1: height, 2: width) of token i is written at
 *                 pos[r * stride + i]; stride >= n.  NULL only validates.
 *   rope_delta    output (may be NULL): max position + 1 - n (0 for an empty sequence)
 * Returns MML_OK, or MML_EINVAL when the image tokens and grids disagree (nothing useful in
 * pos then). */
mml_status mml_mrope_positions(const int32_t *ids, int64_t n, const int32_t *grids, int nimages,
                               int spatial_merge, int32_t image_pad_id, int64_t *pos,
                               int64_t stride, int64_t *rope_delta, mml_err *err);

typedef struct mml_mrope_media {
  const int32_t *grids; /* images: int32 [nimages * 3] */
  int nimages;
  const int32_t *vgrids; /* videos: int32 [nvideos * 3] */
  int nvideos;
  const float *second_per_grid; /* Qwen2.5-VL: per video (NULL: no time scaling) */
  int tokens_per_second;        /* Qwen2.5-VL: 2 */
  int split_frames;             /* Qwen3-VL: one run per temporal patch */
  int legacy_advance;           /* 1: after a block, its largest position + 1 (rope2d.py) */
  int32_t image_pad_id, video_pad_id;
} mml_mrope_media;

/* The same with videos. */
mml_status mml_mrope_positions_media(const int32_t *ids, int64_t n, const mml_mrope_media *m,
                                     int spatial_merge, int64_t *pos, int64_t stride,
                                     int64_t *rope_delta, mml_err *err);

#endif
