/*
 * plan.c — the global plan: plan order, steps and the ranks' batches from token counts
 * (see mml/plan.h for the rules).
 *
 * Building is one pass over the epoch's positions (plan order, with the windows sorted
 * by qsort on a total order: (tokens desc, position asc)), then one greedy pass that
 * cuts steps; a balanced step is redistributed on its own (O(m log m + m * dp_size) for
 * its m samples).  Nothing is random here: every tie is broken by position or rank, so
 * the plan is a pure function of its inputs.
 *
 * Threads: pure functions, no shared state.  Ownership: a plan owns its arrays.
 */
#include "mml/plan.h"

#include <stdlib.h>
#include <string.h>

int64_t mml_plan_slot(const mml_plan_cfg *cfg, int64_t tokens) {
  int64_t m = cfg->pack_length > 0 && cfg->multiple > 1 ? cfg->multiple : 1;
  return (tokens + m - 1) / m * m;
}

int mml_plan_fits_alone(const mml_plan_cfg *cfg, int64_t tokens) {
  if (cfg->max_tokens > 0) return tokens <= cfg->max_tokens;
  if (cfg->pack_length > 0) return mml_plan_slot(cfg, tokens) <= cfg->pack_length;
  return 1;
}

/* ---- plan order ----------------------------------------------------------------------- */

typedef struct tok_pos {
  int64_t tokens, pos;
} tok_pos;

static int by_tokens_desc(const void *a, const void *b) {
  const tok_pos *x = a, *y = b;
  if (x->tokens != y->tokens) return x->tokens > y->tokens ? -1 : 1;
  return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* Each window of `group` plan positions sorted longest first. */
static mml_status group_windows(mml_plan *p, const int64_t *tokens, int64_t group) {
  int64_t w = group < p->nq ? group : p->nq;
  tok_pos *tmp = malloc((size_t)(w > 0 ? w : 1) * sizeof *tmp);
  if (!tmp) return MML_ENOMEM;
  for (int64_t a = 0; a < p->nq; a += group) {
    int64_t len = p->nq - a < group ? p->nq - a : group;
    for (int64_t i = 0; i < len; i++) tmp[i] = (tok_pos){tokens[p->order[a + i]], p->order[a + i]};
    qsort(tmp, (size_t)len, sizeof *tmp, by_tokens_desc);
    for (int64_t i = 0; i < len; i++) p->order[a + i] = tmp[i].pos;
  }
  free(tmp);
  return MML_OK;
}

/* ---- one batch while it is filled ----------------------------------------------------- */

typedef struct bin {
  int64_t count, longest, used; /* samples, longest sample, sum of slots */
  int64_t load, tok;            /* balance metric and tokens so far */
} bin;

static int bin_fits(const mml_plan_cfg *cfg, const bin *b, int64_t tokens) {
  if (cfg->rows > 0) return b->count < cfg->rows;
  if (cfg->max_tokens > 0) {
    int64_t m = tokens > b->longest ? tokens : b->longest;
    return (b->count + 1) * m <= cfg->max_tokens;
  }
  return b->used + mml_plan_slot(cfg, tokens) <= cfg->pack_length;
}

static void bin_add(const mml_plan_cfg *cfg, bin *b, int64_t tokens, int64_t metric) {
  b->count++;
  if (tokens > b->longest) b->longest = tokens;
  b->used += mml_plan_slot(cfg, tokens);
  b->load += metric;
  b->tok += tokens;
}

/* ---- balance -------------------------------------------------------------------------- */

typedef struct item {
  int64_t metric, tokens, q;
} item;

static int by_cost_desc(const void *a, const void *b) {
  const item *x = a, *y = b;
  if (x->metric != y->metric) return x->metric > y->metric ? -1 : 1;
  if (x->tokens != y->tokens) return x->tokens > y->tokens ? -1 : 1;
  return x->q < y->q ? -1 : x->q > y->q;
}

/* The bin for an item of cost `metric`: the least loaded among those it fits (-1: none). */
static int best_bin(const mml_plan_cfg *cfg, const bin *bins, int64_t metric, int64_t tokens) {
  int best = -1;
  for (int r = 0; r < cfg->dp_size; r++) {
    const bin *b = &bins[r];
    if (!bin_fits(cfg, b, tokens)) continue;
    if (best < 0) {
      best = r;
      continue;
    }
    const bin *o = &bins[best];
    int64_t kb[3] = {b->load, b->tok, b->count}, ko[3] = {o->load, o->tok, o->count};
    int from = metric > 0 ? 0 : 1; /* no cost of its own: even out the tokens */
    for (int i = from; i < 3; i++) {
      if (kb[i] == ko[i]) continue;
      if (kb[i] < ko[i]) best = r;
      break;
    }
  }
  return best;
}

/* Writes the assignment binof[0..m) (positions q + i) as count[] and assign[], rank by
 * rank in plan order; 0 when some rank would get nothing. */
static int write_bins(int D, const int *binof, int64_t q, int64_t m, int64_t *count,
                      int64_t *assign) {
  int64_t k = 0;
  for (int r = 0; r < D; r++) {
    count[r] = 0;
    for (int64_t i = 0; i < m; i++)
      if (binof[i] == r) assign[k++] = q + i, count[r]++;
    if (!count[r]) return 0;
  }
  return 1;
}

static int64_t metric_of(const mml_plan_cfg *cfg, const int64_t *tokens, const int64_t *vision,
                         int64_t j) {
  return cfg->balance == MML_BALANCE_VISION ? vision[j] : tokens[j];
}

/* A step's samples by decreasing cost, and the scratch of one redistribution. */
typedef struct lpt {
  item *it;   /* [m], sorted by by_cost_desc */
  int *binof; /* [m]: rank of position q + i */
  bin *bins;  /* [dp_size] */
  int64_t *cnt, *asg;
} lpt;

/* Longest processing time first over the samples of [q, e) (the sorted items with a
 * position below e): into l->cnt / l->asg; 0 when some sample fits nowhere or a rank
 * would get nothing. */
static int lpt_fit(const mml_plan_cfg *cfg, lpt *l, int64_t m, int64_t q, int64_t e) {
  memset(l->bins, 0, (size_t)cfg->dp_size * sizeof *l->bins);
  for (int64_t i = 0; i < m; i++) {
    const item *x = &l->it[i];
    if (x->q >= e) continue;
    int r = best_bin(cfg, l->bins, x->metric, x->tokens);
    if (r < 0) return 0;
    bin_add(cfg, &l->bins[r], x->tokens, x->metric);
    l->binof[x->q - q] = r;
  }
  return write_bins(cfg->dp_size, l->binof, q, e - q, l->cnt, l->asg);
}

/* Balances the step [q, *qe) into count/assign: LPT on it, else (budgets and packs: the
 * online cut filled the ranks to the brim) on the longest shorter prefix that LPT fits
 * (a binary search), giving back at most an eighth of the step's samples to the next
 * step; else the assignment stays as it is.  0 or MML_ENOMEM. */
static mml_status balance_step(const mml_plan_cfg *cfg, const mml_plan *p, const int64_t *tokens,
                               const int64_t *vision, int64_t q, int64_t *qe, int64_t *count,
                               int64_t *assign) {
  const int D = cfg->dp_size;
  int64_t m = *qe - q;
  lpt l = {malloc((size_t)m * sizeof *l.it), malloc((size_t)m * sizeof *l.binof),
           malloc((size_t)D * sizeof *l.bins), malloc((size_t)D * sizeof *l.cnt),
           malloc((size_t)m * sizeof *l.asg)};
  mml_status st = l.it && l.binof && l.bins && l.cnt && l.asg ? MML_OK : MML_ENOMEM;
  int64_t e = *qe;
  int fitted = 0;
  if (!st) {
    for (int64_t i = 0; i < m; i++) {
      int64_t j = p->order[q + i];
      l.it[i] = (item){metric_of(cfg, tokens, vision, j), tokens[j], q + i};
    }
    qsort(l.it, (size_t)m, sizeof *l.it, by_cost_desc);
    fitted = lpt_fit(cfg, &l, m, q, e);
    int64_t lo = *qe - m / 8, hi = *qe - 1;
    if (lo < q + D) lo = q + D;
    if (!fitted && cfg->rows == 0 && lo <= hi && lpt_fit(cfg, &l, m, q, lo)) {
      while (lo < hi) { /* lo fits */
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (lpt_fit(cfg, &l, m, q, mid))
          lo = mid;
        else
          hi = mid - 1;
      }
      e = lo;
      fitted = lpt_fit(cfg, &l, m, q, e);
    }
  }
  if (fitted) {
    memcpy(count, l.cnt, (size_t)D * sizeof *count);
    memcpy(assign, l.asg, (size_t)(e - q) * sizeof *assign);
    *qe = e;
  }
  free(l.it);
  free(l.binof);
  free(l.bins);
  free(l.cnt);
  free(l.asg);
  return st;
}

/* A balanced step of a token budget: samples in plan order, each to the least loaded rank
 * where it fits (an empty rank first: each sample fits one alone), until one fits nowhere.
 * Its end (q when fewer than dp_size samples are left, or out of memory: *st). */
static int64_t cut_balanced(const mml_plan_cfg *cfg, const mml_plan *p, const int64_t *tokens,
                            const int64_t *vision, int64_t q, int64_t *count, int64_t *assign,
                            int *binof, mml_status *st) {
  const int D = cfg->dp_size;
  if (p->nq - q < D) return q;
  bin *bins = calloc((size_t)D, sizeof *bins);
  int64_t e = q;
  if (bins) {
    for (; e < p->nq; e++) {
      int64_t j = p->order[e], w = metric_of(cfg, tokens, vision, j);
      int r = best_bin(cfg, bins, w, tokens[j]);
      if (r < 0) break;
      bin_add(cfg, &bins[r], tokens[j], w);
      binof[e - q] = r;
    }
    if (!write_bins(D, binof, q, e - q, count, assign)) e = q; /* not with >= D samples */
  } else {
    *st = MML_ENOMEM;
  }
  free(bins);
  return e;
}

/* ---- steps ---------------------------------------------------------------------------- */

/* The consecutive assignment of the step at q: its end, or q when no step fits. */
static int64_t cut_step(const mml_plan_cfg *cfg, const mml_plan *p, const int64_t *tokens,
                        int64_t q, int64_t *count) {
  const int D = cfg->dp_size;
  if (cfg->rows > 0) {
    if (p->nq - q < (int64_t)D * cfg->rows) return q;
    for (int r = 0; r < D; r++) count[r] = cfg->rows;
    return q + (int64_t)D * cfg->rows;
  }
  if (p->nq - q < D) return q;
  int64_t e = q;
  for (int r = 0; r < D; r++) {
    bin b = {0};
    do { /* a batch takes at least one sample; each later rank is left one */
      bin_add(cfg, &b, tokens[p->order[e]], 0);
      e++;
    } while (e < p->nq && p->nq - e > D - 1 - r && bin_fits(cfg, &b, tokens[p->order[e]]));
    count[r] = b.count;
  }
  return e;
}

static mml_status check_cfg(const mml_plan_cfg *c, mml_err *err) {
  int modes = (c->rows > 0) + (c->max_tokens > 0) + (c->pack_length > 0);
  if (c->dp_size < 1) return mml_err_set(err, MML_ECONFIG, "plan: dp_size must be >= 1");
  if (modes != 1 || c->rows < 0 || c->max_tokens < 0 || c->pack_length < 0)
    return mml_err_set(err, MML_ECONFIG,
                       "plan: give exactly one of rows, max_tokens and pack_length (> 0)");
  if (c->group < 0) return mml_err_set(err, MML_ECONFIG, "plan: group must be >= 0");
  if (c->balance < MML_BALANCE_NONE || c->balance > MML_BALANCE_VISION)
    return mml_err_set(err, MML_ECONFIG, "plan: unknown balance %d", c->balance);
  return MML_OK;
}

mml_status mml_plan_build(const mml_plan_cfg *cfg, const int64_t *tokens, const int64_t *vision,
                          int64_t n, int64_t q0, mml_plan *out, mml_err *err) {
  memset(out, 0, sizeof *out);
  mml_status st = check_cfg(cfg, err);
  if (st) return st;
  mml_plan *p = out;
  p->dp_size = cfg->dp_size;
  p->order = malloc((size_t)(n > 0 ? n : 1) * sizeof *p->order);
  if (!p->order) goto oom;
  for (int64_t j = 0; j < n; j++) {
    if (tokens[j] < 0) continue;
    if (!mml_plan_fits_alone(cfg, tokens[j])) {
      p->too_long++;
      continue;
    }
    p->order[p->nq++] = j;
  }
  if (cfg->group > 0 && group_windows(p, tokens, cfg->group)) goto oom;
  if (q0 < 0 || q0 > p->nq) {
    st = mml_err_set(err, MML_ECONFIG, "plan: start %lld is outside [0, %lld] (usable samples)",
                     (long long)q0, (long long)p->nq);
    mml_plan_free(p);
    return st;
  }
  p->q0 = q0;
  const int D = cfg->dp_size;
  int64_t maxsteps = (p->nq - q0) / D + 1;
  p->step_q = malloc((size_t)(maxsteps + 1) * sizeof *p->step_q);
  p->count = malloc((size_t)maxsteps * (size_t)D * sizeof *p->count);
  p->assign = malloc((size_t)(p->nq - q0 + 1) * sizeof *p->assign);
  int *binof = malloc((size_t)(p->nq - q0 + 1) * sizeof *binof); /* cut_balanced's */
  if (!p->step_q || !p->count || !p->assign || !binof) {
    free(binof);
    goto oom;
  }
  int64_t q = q0, k = 0;
  for (;;) {
    int64_t *count = p->count + k * D;
    int64_t *assign = p->assign + (q - q0), e;
    int online = cfg->balance != MML_BALANCE_NONE && cfg->rows == 0;
    if (online) {
      e = cut_balanced(cfg, p, tokens, vision, q, count, assign, binof, &st);
    } else {
      e = cut_step(cfg, p, tokens, q, count);
      for (int64_t i = q; i < e; i++) assign[i - q] = i;
    }
    if (st || e == q) break;
    if (cfg->balance != MML_BALANCE_NONE &&
        (st = balance_step(cfg, p, tokens, vision, q, &e, count, assign)))
      break;
    p->step_q[k++] = q;
    q = e;
  }
  free(binof);
  if (st) goto oom;
  p->step_q[k] = q;
  p->nsteps = k;
  return MML_OK;
oom:
  mml_plan_free(p);
  return mml_err_set(err, MML_ENOMEM, "plan: out of memory for %lld positions", (long long)n);
}

void mml_plan_free(mml_plan *p) {
  if (!p) return;
  free(p->order);
  free(p->step_q);
  free(p->count);
  free(p->assign);
  memset(p, 0, sizeof *p);
}

void mml_plan_load(const mml_plan *p, const int64_t *metric, double *sum_max, double *sum_mean,
                   double *worst) {
  double smax = 0, smean = 0, w = 1;
  const int64_t *a = p->assign;
  for (int64_t k = 0; k < p->nsteps; k++) {
    double mx = 0, tot = 0;
    for (int r = 0; r < p->dp_size; r++) {
      double load = 0;
      for (int64_t i = 0; i < p->count[k * p->dp_size + r]; i++)
        load += (double)metric[p->order[*a++]];
      if (load > mx) mx = load;
      tot += load;
    }
    double mean = tot / p->dp_size;
    smax += mx;
    smean += mean;
    if (mean > 0 && mx / mean > w) w = mx / mean;
  }
  *sum_max = smax;
  *sum_mean = smean;
  *worst = w;
}
