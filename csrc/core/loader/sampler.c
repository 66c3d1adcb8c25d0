/*
 * sampler.c — the epoch order and the per-rank stream (see mml/sampler.h).
 *
 * The permutation is a 4-round balanced Feistel network on 2*half_bits-bit integers whose
 * round function is mml_mix64 keyed by mml_mix64(seed ^ epoch-derived key, round).  A
 * Feistel network is a bijection on its domain; values >= n are walked again ("cycle
 * walking") until they land in [0, n), which keeps it a bijection on [0, n).  The domain
 * is < 4n, so the expected number of walks is under 4.  Pure functions, no state, any
 * thread.
 */
#include "mml/sampler.h"

mml_status mml_sampler_init(mml_sampler *s, int64_t n, uint64_t seed, int shuffle, int dp_rank,
                            int dp_size, mml_err *err) {
  if (dp_size < 1) return mml_err_set(err, MML_ECONFIG, "dp_size must be >= 1, got %d", dp_size);
  if (dp_rank < 0 || dp_rank >= dp_size)
    return mml_err_set(err, MML_ECONFIG, "dp_rank must be in [0, %d), got %d", dp_size, dp_rank);
  if (n < dp_size)
    return mml_err_set(err, MML_ECONFIG, "%lld samples cannot be split over dp_size=%d ranks",
                       (long long)n, dp_size);
  s->n = n;
  s->n_rank = n / dp_size;
  s->seed = seed;
  s->shuffle = shuffle;
  s->dp_rank = dp_rank;
  s->dp_size = dp_size;
  int bits = 1;
  while (bits < 31 && ((int64_t)1 << (2 * bits)) < n) bits++;
  s->half_bits = bits;
  return MML_OK;
}

static uint64_t feistel(uint64_t x, int half_bits, uint64_t key) {
  uint64_t mask = ((uint64_t)1 << half_bits) - 1;
  uint64_t l = x >> half_bits, r = x & mask;
  for (int round = 0; round < 4; round++) {
    uint64_t f = mml_mix64(key ^ mml_mix64(r + (uint64_t)round * 0x632be59bd9b4e019ULL)) & mask;
    uint64_t nl = r;
    r = l ^ f;
    l = nl;
  }
  return (l << half_bits) | r;
}

int64_t mml_sampler_permute(const mml_sampler *s, int64_t epoch, int64_t i) {
  if (!s->shuffle) return i;
  uint64_t key = mml_mix64(mml_mix64(s->seed) ^ mml_mix64((uint64_t)epoch + 0x5bd1e995ULL));
  uint64_t x = (uint64_t)i;
  do {
    x = feistel(x, s->half_bits, key);
  } while (x >= (uint64_t)s->n);
  return (int64_t)x;
}

int64_t mml_sampler_slot(const mml_sampler *s, int64_t pos) {
  if (pos >= s->n_rank) pos %= s->n_rank;
  return pos * s->dp_size + s->dp_rank;
}

int64_t mml_sampler_at(const mml_sampler *s, int64_t epoch, int64_t pos) {
  return mml_sampler_permute(s, epoch, mml_sampler_slot(s, pos));
}
