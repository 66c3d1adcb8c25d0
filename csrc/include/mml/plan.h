/*
 * mml/plan.h — the global plan: which samples form each global step and which DP rank
 * gets which of them, decided from per-sample token counts alone (no pixels).  Used by
 * the loader when max_tokens_per_batch, balance or group_by_length is set.
 *
 * Input: one epoch order of n positions (mml/sampler.h, mml/mixture.h) and, for each
 * position j, its sample's tokens[j] (text + vision tokens: its length in input_ids;
 * < 0: unusable, e.g. it failed while planning) and vision[j] (its <|image_pad|> tokens).
 *
 * Plan order.  The usable positions in epoch order; with group > 0, each run of `group`
 * consecutive usable positions (windows counted from the epoch's start) is sorted by
 * tokens, longest first (ties: epoch order).  A pure function of the epoch order and the
 * counts, so of (seed, epoch).  A sample that alone exceeds a batch (tokens > max_tokens,
 * or its slot > pack_length) is left out of the plan order and counted in `too_long`.
 *
 * Steps.  Global step k takes the plan positions [step_q[k], step_q[k+1]) and gives
 * each of the dp_size ranks one batch (never an empty one):
 *   rows > 0        (micro_batch_size) exactly rows samples per rank; a step needs
 *                   dp_size * rows positions;
 *   max_tokens > 0  padded rows: a batch of r samples, the longest m tokens, costs r * m
 *                   (its input_ids tensor, padding included) <= max_tokens;
 *   pack_length > 0 one pack per rank: the sum of its slots (tokens rounded up to
 *                   `multiple`) <= pack_length.
 * Without balance the ranks' batches are consecutive runs: rank 0 takes samples while
 * they fit, then rank 1, ... (rows: rows each) — per-rank greedy packing as the default
 * loader packs.  Steps are cut greedily from `q0`, so the plan from q0 is the suffix of
 * any plan that has a step starting at q0 (same-configuration resume), and a plan may
 * start anywhere (elastic resume: another dp_size, rows or budget continues at the global
 * sample count q0).  The epoch's tail that cannot give every rank a batch (fewer than
 * dp_size * rows positions, or fewer than dp_size samples) is not planned (drop-last).
 *
 * Balance.  balance = tokens or vision_tokens keeps each step's samples (the same set as
 * without balance) and redistributes them: longest-processing-time first — samples by
 * decreasing cost, each to the rank with the least cost so far among those where it
 * still fits (rows / budget / pack length); samples without vision tokens go by tokens so
 * far.  If some sample fits nowhere, the step keeps the consecutive assignment (which
 * fits).  Within a batch, samples keep plan order.
 *
 * Threads: pure functions; a plan is immutable after build.
 */
#ifndef MML_PLAN_H
#define MML_PLAN_H

#include "mml/common.h"

typedef enum { MML_BALANCE_NONE = 0, MML_BALANCE_TOKENS, MML_BALANCE_VISION } mml_balance;

typedef struct mml_plan_cfg {
  int dp_size;         /* >= 1 */
  int rows;            /* samples per batch, or 0 ... */
  int64_t max_tokens;  /* ... or the padded token budget of a batch, or 0 ... */
  int64_t pack_length; /* ... or the pack length (exactly one of the three > 0) */
  int multiple;        /* packing: slot rounding (0/1: none) */
  int64_t group;       /* group_by_length window (0: none) */
  int balance;         /* mml_balance */
} mml_plan_cfg;

typedef struct mml_plan {
  int dp_size;
  int64_t nq;       /* usable positions (plan order) */
  int64_t *order;   /* [nq]: plan position -> epoch position */
  int64_t too_long; /* usable samples left out because they alone exceed a batch */
  int64_t q0;       /* the plan position the steps start at */
  int64_t nsteps;
  int64_t *step_q; /* [nsteps + 1]: first plan position of each step; [nsteps]: end */
  int64_t *count;  /* [nsteps * dp_size]: samples of rank r's batch in step k */
  int64_t *assign; /* [step_q[nsteps] - q0]: step by step, rank 0's batch, then rank
                 1's, ...: plan positions, ascending within a batch */
} mml_plan;

/* The cost of one slot: tokens rounded up to `multiple` when packing. */
int64_t mml_plan_slot(const mml_plan_cfg *cfg, int64_t tokens);
/* 1 when a sample of `tokens` tokens fits a batch on its own. */
int mml_plan_fits_alone(const mml_plan_cfg *cfg, int64_t tokens);

/* MML_ECONFIG for an invalid cfg or q0 outside [0, usable positions]; MML_ENOMEM. */
mml_status mml_plan_build(const mml_plan_cfg *cfg, const int64_t *tokens, const int64_t *vision,
                          int64_t n, int64_t q0, mml_plan *out, mml_err *err);
void mml_plan_free(mml_plan *p);

/* Load of the ranks by `metric` (per position j: tokens or vision): sum over steps of the
 * most loaded rank's cost, and of the mean rank's cost (their ratio is the time a
 * synchronous step waits on its slowest rank), and the worst single step's max/mean. */
void mml_plan_load(const mml_plan *p, const int64_t *metric, double *sum_max, double *sum_mean,
                   double *worst);

#endif
