/*
 * mrope.c — Qwen-VL M-RoPE position ids for one token sequence (see mml/mrope.h for the
 * rules).  One pass over the ids: text tokens advance the running position by one, each
 * image advances it by max(h, w) / merge after writing its (t, h, w) lattice.
 *
 * Threads: no state; reentrant.  Ownership: writes only into the caller's arrays.
 */
#include "mml/mrope.h"

mml_status mml_mrope_positions(const int32_t *ids, int64_t n, const int32_t *grids, int nimages,
                               int spatial_merge, int32_t image_pad_id, int64_t *pos,
                               int64_t stride, int64_t *rope_delta, mml_err *err) {
  if (n < 0 || (pos && stride < n) || nimages < 0 || spatial_merge < 1 || (n > 0 && !ids) ||
      (nimages > 0 && !grids))
    return mml_err_set(err, MML_EINVAL, "mrope: invalid arguments (n=%lld, stride=%lld)",
                       (long long)n, (long long)stride);
  int64_t *row_t = pos, *row_h = pos ? pos + stride : NULL, *row_w = pos ? pos + 2 * stride : NULL;
  const int64_t m = spatial_merge;
  int64_t p = 0, maxpos = -1;
  int img = 0;
  int64_t i = 0;
  while (i < n) {
    if (ids[i] != image_pad_id) {
      if (pos) row_t[i] = row_h[i] = row_w[i] = p;
      if (p > maxpos) maxpos = p;
      p++;
      i++;
      continue;
    }
    /* An image: the next grid says how many tokens it covers. */
    if (img >= nimages)
      return mml_err_set(err, MML_EINVAL,
                         "mrope: image token at %lld but only %d image grid(s) given",
                         (long long)i, nimages);
    const int64_t gt = grids[3 * img], gh = grids[3 * img + 1], gw = grids[3 * img + 2];
    if (gt < 1 || gh < m || gw < m || gh % m || gw % m)
      return mml_err_set(err, MML_EINVAL,
                         "mrope: image %d grid (%lld, %lld, %lld) is not a positive multiple "
                         "of merge size %lld",
                         img, (long long)gt, (long long)gh, (long long)gw, (long long)m);
    const int64_t lh = gh / m, lw = gw / m, count = gt * lh * lw;
    if (count > n - i)
      return mml_err_set(err, MML_EINVAL,
                         "mrope: image %d needs %lld tokens but the sequence ends after %lld",
                         img, (long long)count, (long long)(n - i));
    for (int64_t k = 0; k < count; k++)
      if (ids[i + k] != image_pad_id)
        return mml_err_set(err, MML_EINVAL,
                           "mrope: image %d needs %lld image tokens from %lld but token %lld "
                           "is %d",
                           img, (long long)count, (long long)i, (long long)(i + k), ids[i + k]);
    int64_t k = i;
    for (int64_t a = 0; pos && a < gt; a++)
      for (int64_t b = 0; b < lh; b++)
        for (int64_t c = 0; c < lw; c++, k++) {
          row_t[k] = p + a;
          row_h[k] = p + b;
          row_w[k] = p + c;
        }
    int64_t top = p + (gt - 1 > lh - 1 ? (gt - 1 > lw - 1 ? gt - 1 : lw - 1)
                                       : (lh - 1 > lw - 1 ? lh - 1 : lw - 1));
    if (top > maxpos) maxpos = top;
    p += (gh > gw ? gh : gw) / m;
    i += count;
    img++;
  }
  if (img != nimages)
    return mml_err_set(err, MML_EINVAL,
                       "mrope: %d image grid(s) given but the tokens hold %d image(s)", nimages,
                       img);
  if (rope_delta) *rope_delta = n ? maxpos + 1 - n : 0;
  return MML_OK;
}
