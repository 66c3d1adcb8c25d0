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
 * a shape mismatch).  Videos are not handled.
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

#endif
