/* test-mrope.c — Qwen2-VL M-RoPE positions: a hand-worked example and the error cases.
 * (Parity with transformers' get_rope_index is checked in tests/test_collate.py.) */
#include "mml/mrope.h"
#include "mml_test.h"

enum { IMG = 151655, VSTART = 151652, VEND = 151653 };

/* ---- M-RoPE ----------------------------------------------------------------------------- */

TEST(mrope_worked_example) {
  /* a b <vs> [grid (1, 4, 6), merge 2 -> 2 x 3 tokens] <ve> c  */
  int32_t ids[] = {1, 2, VSTART, IMG, IMG, IMG, IMG, IMG, IMG, VEND, 3};
  int32_t grid[] = {1, 4, 6};
  int64_t n = 11, pos[3 * 11], delta = 0;
  mml_err err = {0};
  CHECK_OK(mml_mrope_positions(ids, n, grid, 1, 2, IMG, pos, n, &delta, &err), err);
  /* text 0,1,2; image at p=3: t=3, h=3+{0,0,0,1,1,1}, w=3+{0,1,2,0,1,2}; then p=3+3=6 */
  const int64_t et[] = {0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7};
  const int64_t eh[] = {0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7};
  const int64_t ew[] = {0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7};
  for (int i = 0; i < n; i++) {
    CHECK_EQ_INT(pos[i], et[i]);
    CHECK_EQ_INT(pos[n + i], eh[i]);
    CHECK_EQ_INT(pos[2 * n + i], ew[i]);
  }
  CHECK_EQ_INT(delta, 8 - 11);
  /* validate-only mode */
  CHECK_OK(mml_mrope_positions(ids, n, grid, 1, 2, IMG, NULL, 0, NULL, &err), err);
}

TEST(mrope_legacy_advance) {
  /* a [video grid (4, 2, 2), merge 2: 4 tokens, one per temporal patch] b, Qwen2-VL time:
   * the block's positions are t = 1..4, h = w = 1; transformers 5 goes on at 1 + 1 = 2,
   * transformers 4.x / Qwen's rope2d.py at the largest + 1 = 5 */
  enum { VID = 151656 };
  int32_t ids[] = {1, VID, VID, VID, VID, 2};
  int32_t vgrid[] = {4, 2, 2};
  int64_t n = 6, pos[3 * 6], delta = 0;
  mml_err err = {0};
  mml_mrope_media md = {.vgrids = vgrid, .nvideos = 1, .image_pad_id = IMG, .video_pad_id = VID};
  CHECK_OK(mml_mrope_positions_media(ids, n, &md, 2, pos, n, &delta, &err), err);
  CHECK_EQ_INT(pos[4], 4);
  CHECK_EQ_INT(pos[5], 2);
  CHECK_EQ_INT(delta, 5 - 6);
  md.legacy_advance = 1;
  CHECK_OK(mml_mrope_positions_media(ids, n, &md, 2, pos, n, &delta, &err), err);
  CHECK_EQ_INT(pos[5], 5);
  CHECK_EQ_INT(pos[n + 5], 5);
  CHECK_EQ_INT(delta, 6 - 6);
}

TEST(mrope_errors) {
  int32_t ids[] = {1, VSTART, IMG, IMG, IMG, VEND};
  int32_t grid[] = {1, 4, 4, 1, 2, 2};
  int64_t pos[18];
  mml_err err = {0};
  /* 3 image tokens for a 4-token grid */
  CHECK_EQ_INT(mml_mrope_positions(ids, 6, grid, 1, 2, IMG, pos, 6, NULL, &err), MML_EINVAL);
  /* run of 3 = image of 1 token (grid 1,2,2) + 2 left over: next grid needs 4 */
  int32_t g2[] = {1, 2, 2, 1, 4, 4};
  CHECK_EQ_INT(mml_mrope_positions(ids, 6, g2, 2, 2, IMG, pos, 6, NULL, &err), MML_EINVAL);
  /* unused grid */
  int32_t ids2[] = {1, 2};
  CHECK_EQ_INT(mml_mrope_positions(ids2, 2, grid, 1, 2, IMG, pos, 2, NULL, &err), MML_EINVAL);
  /* grid not a multiple of merge */
  int32_t ids3[] = {IMG, IMG};
  int32_t g3[] = {1, 2, 3};
  CHECK_EQ_INT(mml_mrope_positions(ids3, 2, g3, 1, 2, IMG, pos, 2, NULL, &err), MML_EINVAL);
  /* two adjacent images inside one run are split by their grids */
  int32_t ids4[] = {IMG, IMG, 5};
  int32_t g4[] = {1, 2, 2, 1, 2, 2};
  int64_t d = 0;
  CHECK_OK(mml_mrope_positions(ids4, 3, g4, 2, 2, IMG, pos, 3, &d, &err), err);
  CHECK_EQ_INT(pos[0], 0);
  CHECK_EQ_INT(pos[1], 1);
  CHECK_EQ_INT(pos[2], 2);
  CHECK_EQ_INT(d, 0);
}
