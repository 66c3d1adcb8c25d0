/*
 * mrope.c — Qwen-VL M-RoPE position ids for one token sequence (see mml/mrope.h for the
 * rules).  One pass over the ids: text tokens advance the running position by one, each
 * image or video block advances it by max(h, w) / merge after writing its lattice (with
 * legacy_advance: to the block's largest position + 1, Qwen's rope2d.py).
 *
 * Threads: no state; reentrant.  Ownership: writes only into the caller's arrays.
 */
#include "mml/mrope.h"

#include <stdbool.h>

mml_status mml_mrope_positions(const int32_t *ids, int64_t n, const int32_t *grids, int nimages,
                               int spatial_merge, int32_t image_pad_id, int64_t *pos,
                               int64_t stride, int64_t *rope_delta, mml_err *err) {
  mml_mrope_media m = {
      .grids = grids, .nimages = nimages, .image_pad_id = image_pad_id, .video_pad_id = -1};
  return mml_mrope_positions_media(ids, n, &m, spatial_merge, pos, stride, rope_delta, err);
}

/* One block of `count` pad tokens from i with grid (gt, gh, gw): positions written, *top
 * the largest.  interval < 0: plain temporal index. */
static void block(int64_t *row_t, int64_t *row_h, int64_t *row_w, int64_t i, int64_t p, int64_t gt,
                  int64_t lh, int64_t lw, float interval, int64_t *top) {
  int64_t k = i, mx = p;
  for (int64_t a = 0; a < gt; a++) {
    int64_t ta = interval < 0 ? a : (int64_t)((float)a * interval);
    if (p + ta > mx) mx = p + ta;
    for (int64_t b = 0; row_t && b < lh; b++)
      for (int64_t c = 0; c < lw; c++, k++) {
        row_t[k] = p + ta;
        row_h[k] = p + b;
        row_w[k] = p + c;
      }
  }
  if (p + lh - 1 > mx) mx = p + lh - 1;
  if (p + lw - 1 > mx) mx = p + lw - 1;
  *top = mx;
}

mml_status mml_mrope_positions_media(const int32_t *ids, int64_t n, const mml_mrope_media *md,
                                     int spatial_merge, int64_t *pos, int64_t stride,
                                     int64_t *rope_delta, mml_err *err) {
  const int nimages = md->nimages, nvideos = md->nvideos;
  if (n < 0 || (pos && stride < n) || nimages < 0 || nvideos < 0 || spatial_merge < 1 ||
      (n > 0 && !ids) || (nimages > 0 && !md->grids) || (nvideos > 0 && !md->vgrids))
    return mml_err_set(err, MML_EINVAL, "mrope: invalid arguments (n=%lld, stride=%lld)",
                       (long long)n, (long long)stride);
  int64_t *row_t = pos, *row_h = pos ? pos + stride : NULL, *row_w = pos ? pos + 2 * stride : NULL;
  const int64_t m = spatial_merge;
  int64_t p = 0, maxpos = -1;
  int img = 0, vid = 0;
  int64_t frame = 0; /* split_frames: temporal patches of video `vid` already placed */
  int64_t i = 0;
  while (i < n) {
    const bool is_img = ids[i] == md->image_pad_id, is_vid = ids[i] == md->video_pad_id;
    if (!is_img && !is_vid) {
      if (pos) row_t[i] = row_h[i] = row_w[i] = p;
      if (p > maxpos) maxpos = p;
      p++;
      i++;
      continue;
    }
    const char *what = is_img ? "image" : "video";
    const int idx = is_img ? img : vid, have = is_img ? nimages : nvideos;
    /* A medium: the next grid says how many tokens it covers. */
    if (idx >= have)
      return mml_err_set(err, MML_EINVAL, "mrope: %s token at %lld but only %d %s grid(s) given",
                         what, (long long)i, have, what);
    const int32_t *g = is_img ? md->grids + 3 * idx : md->vgrids + 3 * idx;
    int64_t gt = g[0];
    const int64_t gh = g[1], gw = g[2];
    if (gt < 1 || gh < m || gw < m || gh % m || gw % m)
      return mml_err_set(err, MML_EINVAL,
                         "mrope: %s %d grid (%lld, %lld, %lld) is not a positive multiple "
                         "of merge size %lld",
                         what, idx, (long long)gt, (long long)gh, (long long)gw, (long long)m);
    const bool split = is_vid && md->split_frames;
    if (split) gt = 1;
    const int64_t lh = gh / m, lw = gw / m, count = gt * lh * lw;
    if (count > n - i)
      return mml_err_set(err, MML_EINVAL,
                         "mrope: %s %d needs %lld tokens but the sequence ends after %lld", what,
                         idx, (long long)count, (long long)(n - i));
    for (int64_t k = 0; k < count; k++)
      if (ids[i + k] != ids[i])
        return mml_err_set(
            err, MML_EINVAL, "mrope: %s %d needs %lld %s tokens from %lld but token %lld is %d",
            what, idx, (long long)count, what, (long long)i, (long long)(i + k), ids[i + k]);
    float interval = -1.0f;
    if (is_vid && md->second_per_grid)
      interval = (float)md->tokens_per_second * md->second_per_grid[idx];
    int64_t top;
    block(row_t, row_h, row_w, i, p, gt, lh, lw, interval, &top);
    if (top > maxpos) maxpos = top;
    p = md->legacy_advance ? top + 1 : p + (gh > gw ? gh : gw) / m;
    i += count;
    if (is_img)
      img++;
    else if (!split || ++frame == g[0])
      vid++, frame = 0;
  }
  if (img != nimages || vid != nvideos || frame)
    return mml_err_set(err, MML_EINVAL,
                       "mrope: %d image and %d video grid(s) given but the tokens hold %d "
                       "image(s) and %d video(s)",
                       nimages, nvideos, img, vid);
  if (rope_delta) *rope_delta = n ? maxpos + 1 - n : 0;
  return MML_OK;
}
