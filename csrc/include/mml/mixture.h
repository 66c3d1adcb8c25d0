/*
 * mml/mixture.h — blending many sources into one epoch: which source, and which of its
 * samples, sits at each position of the epoch order.  A pure function of
 * (seed, epoch, position): nothing is stored per sample and no RNG state exists.
 *
 * Counts.  Each source s has n_s samples and draws c_s of them per epoch (its count):
 *   choose=N   c_s = N;
 *   repeat=r   c_s = round(r * n_s) (none of the three given: repeat=1);
 *   weight=w   the weighted sources share what the epoch has left after the fixed counts
 *              above, in proportion to their weights (largest-remainder rounding, so the
 *              counts sum exactly).  Without samples_per_epoch that is the weighted
 *              sources' total size: weights then move samples between them without
 *              changing the epoch's length.
 * The epoch holds M = sum c_s positions.
 *
 * Blending (jittered strata).  Draw k of source s gets the time
 *     t(s, k) = (k + u(s, k)) / c_s,   u in [0, 1) from a hash of (seed, epoch, s, k)
 * (u = 1/2 without shuffle), so each source's draws are spread evenly over the epoch,
 * one per stratum of width 1/c_s, and the epoch order is all draws sorted by time (ties
 * by source).  In every prefix of the epoch each source's count is within one of
 * c_s * prefix / M: no long runs, exact counts per epoch, and the random jitter keeps
 * the order between sources from aliasing with the DP stride.  Position j is found
 * without enumerating: counts below a time have a closed form (one hash per source), the
 * j-th draw lies within j +- nsrc of the ideal time j/M, so a lookup sorts the few draws
 * in that window: O(nsrc log nsrc) time, no memory beyond a per-thread scratch.  Times
 * are compared exactly in 128-bit integers (u has 20 bits).
 *
 * Within a source.  Draws continue across epochs as one stream g = epoch * c_s + k; pass
 * p = g / n_s walks a fresh permutation of the source (mml/sampler.h's Feistel network
 * keyed by the source's seed and p): a down-sampled source covers all of its samples
 * over successive epochs, an up-sampled one repeats with a fresh order each pass.  A
 * single source with c_0 = n_0 gives exactly the plain sampler's order.
 *
 * Threads: a mixture is immutable after init and shared; a scratch belongs to one thread.
 */
#ifndef MML_MIXTURE_H
#define MML_MIXTURE_H

#include "mml/common.h"
#include "mml/sampler.h"

/* How a source's count is set: at most one of weight >= 0, repeat >= 0, choose >= 0
 * (the others negative); none given means repeat=1 (each of its samples once). */
typedef struct mml_mix_spec {
  const char *name; /* for messages */
  int64_t n;        /* samples in the source */
  double weight, repeat;
  int64_t choose;
} mml_mix_spec;

/* Fills counts[nsrc].  samples_per_epoch <= 0: the default above.  MML_ECONFIG (naming
 * the source) for conflicting or invalid settings, an empty epoch, or fixed counts that
 * exceed samples_per_epoch. */
mml_status mml_mixture_counts(const mml_mix_spec *spec, int nsrc, int64_t samples_per_epoch,
                              int64_t *counts, mml_err *err);

typedef struct mml_mix_source {
  int64_t first; /* global index of its first sample (sources are consecutive) */
  int64_t n, count;
  mml_sampler perm; /* permutation of [0, n) keyed by the source's seed */
} mml_mix_source;

typedef struct mml_mixture {
  mml_mix_source *src;
  int nsrc;
  int *active; /* sources with count > 0, ascending */
  int nactive;
  int64_t total; /* M: positions per epoch */
  uint64_t seed;
  int shuffle;
} mml_mixture;

typedef struct mml_mix_scratch {
  void *cand;
  int cap;
} mml_mix_scratch;

/* Sources are laid out consecutively in the global index in the given order (source s
 * starts at sum of n[<s]).  Every source needs n >= 1.  M must be below 2^40. */
mml_status mml_mixture_init(mml_mixture *m, const int64_t *n, const int64_t *counts, int nsrc,
                            uint64_t seed, int shuffle, mml_err *err);
void mml_mixture_free(mml_mixture *m);
void mml_mix_scratch_free(mml_mix_scratch *sc);

/* Position j (0 <= j < total) of epoch `epoch`: its source and global sample index.
 * MML_ENOMEM when the scratch cannot grow. */
mml_status mml_mixture_at(const mml_mixture *m, mml_mix_scratch *sc, int64_t epoch, int64_t j,
                          int *source, int64_t *index);

#endif
