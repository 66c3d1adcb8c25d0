/*
 * template_truncate.c — LLaMA-Factory's cutoff_len truncation of an encoded conversation
 * (contract: mml_lf_truncate in mml/template.h).
 *
 * Mirrors processor/supervised.py _encode_data_example with processor_utils.infer_seqlen:
 *   1. the pairs are visited in order, or last first (mask_history), while the running
 *      length is below cutoff_len; the rest are dropped whole;
 *   2. a visited pair keeps the first infer_seqlen(source, target, cutoff - running)
 *      tokens of its source and of its target;
 *   3. kept tokens stay in their original order (mask_history prepends, which restores it);
 *   4. infer_seqlen's float share int(cutoff * (target / (source + target))) is computed in
 *      double, as Python computes it;
 *   5. a cut inside an image's or video's pad tokens fails with MML_ETOOLONG and leaves
 *      ids/labels as they were.
 * Pure function of its arguments; reentrant.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "mml/template.h"

/* processor_utils.infer_seqlen (2.): the kept (source, target) lengths. */
static void infer_seqlen(int64_t src, int64_t tgt, int64_t cutoff, int64_t *ns, int64_t *nt) {
  int64_t max_tgt;
  if (tgt * 2 < cutoff)
    max_tgt = cutoff;
  else if (src * 2 < cutoff)
    max_tgt = cutoff - src;
  else
    max_tgt = (int64_t)((double)cutoff * ((double)tgt / (double)(src + tgt)));
  *nt = tgt < max_tgt ? tgt : max_tgt;
  int64_t max_src = cutoff - *nt > 0 ? cutoff - *nt : 0;
  *ns = src < max_src ? src : max_src;
}

static bool is_media(int32_t id, const int32_t *media, int n) {
  for (int i = 0; i < n; i++)
    if (media[i] >= 0 && id == media[i]) return true;
  return false;
}

static size_t count_media(const mml_ids *ids, size_t from, const int32_t *media, int n) {
  size_t c = 0;
  for (size_t i = from; i < ids->len; i++) c += is_media(ids->data[i], media, n);
  return c;
}

mml_status mml_lf_truncate(const int64_t *pairs, int npairs, int64_t cutoff_len, int reverse,
                           const int32_t *media_ids, int n_media, size_t from, mml_ids *ids,
                           mml_ids *labels, mml_err *err) {
  if (!ids || !labels || ids->len != labels->len || (npairs > 0 && !pairs) || cutoff_len <= 0)
    return mml_err_set(err, MML_EINVAL, "truncate: bad arguments");
  const size_t n = ids->len;
  if (npairs == 0 || n - from <= (size_t)cutoff_len) return MML_OK; /* nothing to cut */
  unsigned char *keep = calloc(n - from, 1);
  if (!keep) return mml_err_set(err, MML_ENOMEM, "truncate: out of memory");
  int64_t total = 0;
  for (int v = 0; v < npairs && total < cutoff_len; v++) { /* 1. */
    const int k = reverse ? npairs - 1 - v : v;
    const int64_t s0 = pairs[2 * k], t0 = pairs[2 * k + 1];
    const int64_t end = k + 1 < npairs ? pairs[2 * k + 2] : (int64_t)n;
    int64_t ns, nt;
    infer_seqlen(t0 - s0, end - t0, cutoff_len - total, &ns, &nt); /* 2. */
    memset(keep + (s0 - (int64_t)from), 1, (size_t)ns);
    memset(keep + (t0 - (int64_t)from), 1, (size_t)nt);
    total += ns + nt;
  }
  size_t media_before = count_media(ids, from, media_ids, n_media), media_after = 0;
  for (size_t i = from; i < n; i++)
    media_after += keep[i - from] && is_media(ids->data[i], media_ids, n_media);
  if (media_after != media_before) { /* 5. */
    free(keep);
    return mml_err_set(err, MML_ETOOLONG,
                       "%zu tokens: cutoff_len=%lld would cut %zu of the %zu image/video tokens "
                       "(the model would refuse the sample)",
                       n - from, (long long)cutoff_len, media_before - media_after, media_before);
  }
  size_t w = from; /* 3. */
  for (size_t i = from; i < n; i++) {
    if (!keep[i - from]) continue;
    ids->data[w] = ids->data[i];
    labels->data[w] = labels->data[i];
    w++;
  }
  ids->len = labels->len = w;
  free(keep);
  return MML_OK;
}
