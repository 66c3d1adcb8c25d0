/*
 * mml/sampler.h — which sample a DP rank reads at each stream position.
 *
 * Each epoch has an "epoch order": a permutation of all N sample indices that is a pure
 * function of (seed, epoch) (the identity when shuffle is off).  Rank r of dp_size takes
 * the epoch-order positions r, r + dp_size, r + 2*dp_size, ... truncated to
 * n_rank = floor(N / dp_size), so ranks are disjoint and equally long.  A stream position
 * pos >= n_rank (padded mode filling an epoch after skips) wraps to pos % n_rank.
 *
 * The permutation is a keyed Feistel network over the smallest power of four >= N with
 * cycle walking: O(1) memory and time per lookup, no state to save.
 *
 * Threads: a sampler is immutable after init and shared by all threads.
 */
#ifndef MML_SAMPLER_H
#define MML_SAMPLER_H

#include "mml/common.h"

typedef struct mml_sampler {
  int64_t n;      /* samples in the dataset */
  int64_t n_rank; /* samples per rank and epoch */
  uint64_t seed;
  int shuffle;
  int dp_rank, dp_size;
  int half_bits; /* Feistel half width: domain is 2^(2*half_bits) >= n */
} mml_sampler;

/* MML_ECONFIG when dp_rank/dp_size are invalid or N < dp_size. */
mml_status mml_sampler_init(mml_sampler *s, int64_t n, uint64_t seed, int shuffle, int dp_rank,
                            int dp_size, mml_err *err);
/* The epoch-order permutation: position i (0 <= i < n) of epoch `epoch` -> sample index. */
int64_t mml_sampler_permute(const mml_sampler *s, int64_t epoch, int64_t i);
/* The epoch-order position this rank reads at stream position pos (any pos >= 0):
 * (pos mod n_rank) * dp_size + dp_rank.  A mixture (mml/mixture.h) maps it to a sample. */
int64_t mml_sampler_slot(const mml_sampler *s, int64_t pos);
/* The global sample index this rank reads at stream position pos (any pos >= 0). */
int64_t mml_sampler_at(const mml_sampler *s, int64_t epoch, int64_t pos);

#endif
