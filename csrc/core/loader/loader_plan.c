/*
 * loader_plan.c — the loader's global plan (cfg.global_plan, max_tokens_per_batch,
 * balance, group_by_length): the token counts of every sample, known before any decode, and
 * per epoch the plan of mml/plan.h cut down to this rank: its samples in stream order
 * and where its batches end.
 *
 * Counts.  From the dataset index when every shard has one that applies (loader_dsindex.c:
 * no sample is read at construction); else a planning pass measures every sample of
 * every source once (measure(): num_threads threads, each with a measure.c ld_measurer:
 * the record and its media read as the stream reads them, video files probed, nothing
 * decoded, sized by mml_sample_measure, the workers' own function, then checked by
 * mml_sample_check) and records each sample's tokens and vision tokens.  No second
 * loader runs, so no option has to be reset for it.  A sample that fails there, or that alone exceeds a batch (seq_length, pack_length or
 * max_tokens_per_batch), is never planned: it is counted as skipped, with a warning, once
 * when the loader is built.
 *
 * Epochs.  The loader runs in packed-style epochs (per_epoch = -1, n_rank = the mixture's
 * M as an upper bound on a rank's positions): stream position pos of epoch e is this
 * rank's pos-th planned sample; positions past the rank's plan are "void" (ld_plan_slot
 * says so, the worker drops them) and the collator ends the epoch at the first one.
 * Batches end where the plan says (ld_plan_batch_end_locked), so every rank yields one
 * batch per global step.  Epoch plans are built on first use, under mu, and kept in a
 * small cache (the current epoch and the next, keyed by epoch and start q0).
 *
 * State.  The cursor stays per rank; the global count of a cursor is the plan position
 * where the step after its batch_in_epoch starts.  Resuming elsewhere (another dp_size,
 * micro_batch_size, budget or balance) starts that epoch's plan at the count (q0):
 * plan positions are the same for every such configuration (they depend on seed, epoch,
 * counts and group_by_length only), so no sample is repeated or lost.
 *
 * Threads: everything here runs under the loader's mu, except ld_plan_new (construction,
 * before the loader's threads: the planning pass's own threads share only the pass's
 * counter, under its mutex, and write disjoint samples' counts) and ld_plan_slot, which
 * takes mu itself.
 * Cancellation: the pass's threads check the loader's cancel flag (Ctrl-C during
 * construction sets its parent) between samples, and each sample's fetches and probes
 * check it too (measure.c DESIGN 6): a cancelled pass returns MML_ECANCELLED within one
 * sample's work, however many samples remain (tests/test_hostile_cancel.py).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "loader_int.h"
#include "mml/plan.h"

enum { PLAN_CACHE = 3, PASS_BLOCK = 64 };

typedef struct gp_epoch {
  int valid;
  int64_t epoch, q0;
  int64_t usable, end, steps, rank_samples;
  int64_t *slot;     /* [rank_samples]: rank position -> epoch position */
  int64_t *rank_end; /* [steps]: rank positions after step k */
  int64_t *step_q;   /* [steps + 1] */
  uint64_t used;     /* LRU stamp */
} gp_epoch;

struct ld_gplan {
  mml_plan_cfg pc;
  int64_t n;                /* samples (the index) */
  int64_t *tokens, *vision; /* per sample; tokens < 0: not planned */
  uint8_t *why;             /* per sample: the status that kept it out of the plan */
  int64_t unusable;
  int64_t indexed, measured; /* counts read from an index / measured by a planning pass */
  int64_t resume_epoch, resume_q0;
  mml_mix_scratch sc;
  gp_epoch cache[PLAN_CACHE];
  uint64_t stamp;
};

int ld_plan_wanted(const mml_loader_cfg *c) {
  return c->global_plan || c->max_tokens_per_batch > 0 || c->balance != MML_BALANCE_NONE ||
         c->group_by_length > 0;
}

static gp_epoch *epoch_plan(mml_loader *L, int64_t epoch, int64_t q0, mml_err *err);

/* ---- counts: the planning pass ------------------------------------------------------- */

/* The planning pass's threads take samples in blocks of PASS_BLOCK (a counter under mu). */
typedef struct pass {
  mml_loader *L;
  ld_gplan *g;
  pthread_mutex_t mu;
  int64_t next;
  int failed; /* a thread could not start its measurer: it measures nothing */
  mml_err err;
} pass;

/* Sample i's counts into g, or why it stays out of the plan: ld_measure (the record and
 * its media read whole, as the stream reads them: measure.c DESIGN 4), then the settings
 * checks the worker applies in mml_sample_plan's order (mml_sample_check, then
 * max_sample_pixel_bytes from the planned rows: mml_sample_check_pixel_bytes). */
static void measure_one(ld_measurer *m, ld_gplan *g, int64_t i) {
  mml_err e;
  mml_err_clear(&e);
  const mml_pipeline *pl = &m->L->src[m->L->shard_src[m->shard]].pl;
  mml_status st = ld_measure(m, i, &e);
  if (!st) st = mml_sample_check(pl, &m->s, &e);
  if (!st) {
    int64_t rows = 0, vrows = 0;
    for (int k = 0; k < m->rec.nimages; k++) rows += m->plans[k].rows;
    for (int v = 0; v < m->rec.nvideos; v++) vrows += m->vplans[v].rows;
    st = mml_sample_check_pixel_bytes(pl, m->rec.nimages, m->rec.nvideos, rows, vrows, &e);
  }
  if (st) {
    g->tokens[i] = -1;
    g->why[i] = (uint8_t)(st < MML_STATUS_COUNT ? st : MML_EINTERNAL);
    return;
  }
  g->tokens[i] = (int64_t)m->s.input_ids.len;
  g->vision[i] = m->s.vision_tokens;
  g->why[i] = MML_OK;
}

static void *pass_main(void *arg) {
  pass *p = arg;
  ld_measurer m;
  mml_err err;
  if (ld_measurer_init(&m, p->L, -1, 0, &err)) {
    pthread_mutex_lock(&p->mu);
    if (!p->failed) p->err = err;
    p->failed = 1;
    pthread_mutex_unlock(&p->mu);
    ld_measurer_free(&m);
    return NULL;
  }
  for (;;) {
    pthread_mutex_lock(&p->mu);
    int64_t i0 = p->next;
    p->next = i0 + PASS_BLOCK;
    pthread_mutex_unlock(&p->mu);
    if (i0 >= p->g->n) break;
    for (int64_t i = i0; i < i0 + PASS_BLOCK && i < p->g->n && !mml_cancelled(m.cancel); i++)
      measure_one(&m, p->g, i);
    if (mml_cancelled(m.cancel)) break; /* close(), Ctrl-C: leave between samples */
  }
  ld_measurer_free(&m);
  return NULL;
}

/* The planning pass: every sample of every source measured once (num_threads threads,
 * each with its own ld_measurer; each sample's counts written by the thread that measured
 * it).  No loader runs: the measuring function is the workers' own (measure.c). */
static mml_status measure(mml_loader *L, ld_gplan *g, mml_err *err) {
  pass p = {.L = L, .g = g};
  int nt = L->cfg.num_threads < 1 ? 1 : L->cfg.num_threads, started = 0;
  pthread_t *th = calloc((size_t)nt, sizeof *th);
  if (!th) return mml_err_set(err, MML_ENOMEM, "planning pass: out of memory");
  pthread_mutex_init(&p.mu, NULL);
  while (started < nt && !pthread_create(&th[started], NULL, pass_main, &p)) started++;
  if (!started) pass_main(&p); /* no thread could start: this one measures */
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  pthread_mutex_destroy(&p.mu);
  free(th);
  if (mml_cancelled(&L->cancel)) /* some samples are not measured: no plan */
    return mml_err_set(err, MML_ECANCELLED, "planning pass stopped (cancelled)");
  if (p.failed && p.next < g->n) { /* no measurer at all: nothing was measured */
    *err = p.err;
    mml_err_prefix(err, "planning pass (token counts for the global plan)");
    return err->status;
  }
  return MML_OK;
}

/* Samples that alone exceed a batch leave the plan as too_long. */
static void drop_too_long(ld_gplan *g, const mml_loader_cfg *cfg) {
  for (int64_t i = 0; i < g->n; i++) {
    int64_t t = g->tokens[i];
    if (t < 0) continue;
    if (!mml_plan_fits_alone(&g->pc, t) ||
        (!cfg->collate.pack && cfg->collate.seq_length > 0 && t > cfg->collate.seq_length)) {
      g->tokens[i] = -1;
      g->why[i] = MML_ETOOLONG;
    }
  }
}

/* The unplanned samples, counted as skipped (per reason and source) and warned about. */
static void count_unplanned(mml_loader *L, ld_gplan *g) {
  const char *what = L->cfg.max_tokens_per_batch > 0 ? "max_tokens_per_batch"
                     : L->cfg.collate.pack           ? "pack_length"
                                                     : "seq_length";
  int64_t limit = L->cfg.max_tokens_per_batch > 0 ? L->cfg.max_tokens_per_batch
                  : L->cfg.collate.pack           ? g->pc.pack_length
                                                  : L->cfg.collate.seq_length;
  for (int64_t i = 0; i < g->n; i++) {
    if (g->tokens[i] >= 0) continue;
    mml_status why = g->why[i] ? (mml_status)g->why[i] : MML_EINTERNAL;
    g->unusable++;
    int source = 0;
    while (source + 1 < L->nsrc && i >= L->src[source + 1].first) source++;
    ld_source_count_skip_locked(L, source, why);
    L->skipped++;
    L->skip_by_status[why]++;
    if (L->warn_count == WARN_BACKLOG) continue;
    int shard;
    int64_t off, len, line;
    mml_index_locate(&L->ix, i, &shard, &off, &len, &line);
    char where[1100];
    mml_index_name_sample(&L->ix, shard, i, line, where, sizeof where);
    mml_err e;
    if (why == MML_ETOOLONG)
      mml_err_set(&e, why, "sample %s: left out of the plan, too long (%s=%lld)", where, what,
                  (long long)limit);
    else
      mml_err_set(&e, why, "sample %s: left out of the plan, it failed while planning (%s)", where,
                  mml_status_skip_reason(why) ? mml_status_skip_reason(why) : "error");
    ld_push_warning_locked(L, &e);
  }
}

mml_status ld_plan_new(mml_loader *L, const mml_loader_cfg *cfg, mml_err *err) {
  ld_gplan *g = calloc(1, sizeof *g);
  if (!g) return mml_err_set(err, MML_ENOMEM, "global plan: out of memory");
  L->gp = g;
  g->n = L->ix.n;
  g->pc.dp_size = cfg->dp_size;
  g->pc.group = cfg->group_by_length;
  g->pc.balance = cfg->balance;
  if (cfg->collate.pack) {
    g->pc.pack_length = L->ccfg.pack_length;
    g->pc.multiple = cfg->collate.pad_to_multiple;
  } else if (cfg->max_tokens_per_batch > 0) {
    g->pc.max_tokens = cfg->max_tokens_per_batch;
  } else {
    g->pc.rows = cfg->collate.micro_batch_size;
  }
  g->resume_epoch = -1;
  g->tokens = malloc((size_t)(g->n + 1) * sizeof *g->tokens);
  g->vision = calloc((size_t)(g->n + 1), sizeof *g->vision);
  g->why = calloc((size_t)(g->n + 1), 1);
  if (!g->tokens || !g->vision || !g->why)
    return mml_err_set(err, MML_ENOMEM, "global plan: out of memory for %lld samples",
                       (long long)g->n);
  for (int64_t i = 0; i < g->n; i++) g->tokens[i] = -1; /* never seen: not planned */
  /* the counts from the dataset index when it knows every sample, else the planning pass */
  mml_status st = MML_OK;
  if (ld_index_all_counts(L, g->tokens, g->vision, g->why))
    g->indexed = g->n;
  else if (!(st = measure(L, g, err)))
    g->measured = g->n;
  if (st) return st;
  drop_too_long(g, cfg);
  count_unplanned(L, g);
  L->per_epoch = -1;        /* batches per epoch: the plan's steps */
  L->n_rank = L->mix.total; /* an upper bound on a rank's positions */
  gp_epoch *e = epoch_plan(L, 0, 0, err);
  if (!e) return err->status;
  if (e->steps == 0)
    return mml_err_set(err, MML_ECONFIG,
                       "the global plan has no batch: %lld usable samples (%lld left out) "
                       "cannot give each of dp_size=%d ranks a batch",
                       (long long)e->usable, (long long)g->unusable, cfg->dp_size);
  return MML_OK;
}

static void epoch_free(gp_epoch *e) {
  free(e->slot);
  free(e->rank_end);
  free(e->step_q);
  memset(e, 0, sizeof *e);
}

void ld_plan_free(mml_loader *L) {
  ld_gplan *g = L->gp;
  if (!g) return;
  for (int i = 0; i < PLAN_CACHE; i++) epoch_free(&g->cache[i]);
  mml_mix_scratch_free(&g->sc);
  free(g->tokens);
  free(g->vision);
  free(g->why);
  free(g);
  L->gp = NULL;
}

/* ---- epoch plans ---------------------------------------------------------------------- */

static int64_t q0_of(const ld_gplan *g, int64_t epoch) {
  return epoch == g->resume_epoch ? g->resume_q0 : 0;
}

/* This rank's part of plan p into e. */
static mml_status keep_rank(const mml_loader *L, const mml_plan *p, gp_epoch *e) {
  const int D = p->dp_size, r = L->cfg.dp_rank;
  e->usable = p->nq;
  e->steps = p->nsteps;
  e->end = p->step_q[p->nsteps];
  int64_t n = 0;
  for (int64_t k = 0; k < p->nsteps; k++) n += p->count[k * D + r];
  e->rank_samples = n;
  e->slot = malloc((size_t)(n + 1) * sizeof *e->slot);
  e->rank_end = malloc((size_t)(p->nsteps + 1) * sizeof *e->rank_end);
  e->step_q = malloc((size_t)(p->nsteps + 1) * sizeof *e->step_q);
  if (!e->slot || !e->rank_end || !e->step_q) return MML_ENOMEM;
  memcpy(e->step_q, p->step_q, (size_t)(p->nsteps + 1) * sizeof *e->step_q);
  const int64_t *a = p->assign;
  int64_t got = 0;
  for (int64_t k = 0; k < p->nsteps; k++)
    for (int rr = 0; rr < D; rr++) {
      int64_t c = p->count[k * D + rr];
      if (rr == r)
        for (int64_t i = 0; i < c; i++) e->slot[got++] = p->order[a[i]];
      a += c;
      if (rr == r) e->rank_end[k] = got;
    }
  return MML_OK;
}

/* Builds the plan of (epoch, q0) into e. */
static mml_status build_epoch(mml_loader *L, int64_t epoch, int64_t q0, gp_epoch *e, mml_err *err) {
  ld_gplan *g = L->gp;
  int64_t M = L->mix.total;
  int64_t *tok = malloc((size_t)(M + 1) * sizeof *tok),
          *vis = malloc((size_t)(M + 1) * sizeof *vis);
  mml_status st = tok && vis ? MML_OK : MML_ENOMEM;
  for (int64_t j = 0; !st && j < M; j++) {
    int source;
    int64_t index;
    if (mml_mixture_at(&L->mix, &g->sc, epoch, j, &source, &index))
      st = MML_ENOMEM;
    else
      tok[j] = g->tokens[index], vis[j] = g->vision[index];
  }
  mml_plan p;
  memset(&p, 0, sizeof p);
  if (st) {
    st = mml_err_set(err, st, "global plan: out of memory for epoch %lld", (long long)epoch);
  } else if (!(st = mml_plan_build(&g->pc, tok, vis, M, q0, &p, err))) {
    e->epoch = epoch;
    e->q0 = q0;
    if (keep_rank(L, &p, e))
      st = mml_err_set(err, MML_ENOMEM, "global plan: out of memory for epoch %lld",
                       (long long)epoch);
    else
      e->valid = 1;
  }
  mml_plan_free(&p);
  free(tok);
  free(vis);
  if (st) epoch_free(e);
  return st;
}

/* The plan of `epoch` (built on first use).  NULL on failure (err set). */
static gp_epoch *epoch_plan(mml_loader *L, int64_t epoch, int64_t q0, mml_err *err) {
  ld_gplan *g = L->gp;
  gp_epoch *victim = &g->cache[0];
  for (int i = 0; i < PLAN_CACHE; i++) {
    gp_epoch *e = &g->cache[i];
    if (e->valid && e->epoch == epoch && e->q0 == q0) {
      e->used = ++g->stamp;
      return e;
    }
    if (!e->valid || e->used < victim->used) victim = e;
  }
  epoch_free(victim);
  if (build_epoch(L, epoch, q0, victim, err)) return NULL;
  victim->used = ++g->stamp;
  return victim;
}

static gp_epoch *epoch_plan_locked(mml_loader *L, int64_t epoch) {
  mml_err err;
  gp_epoch *e = epoch_plan(L, epoch, q0_of(L->gp, epoch), &err);
  if (!e) ld_set_fatal_locked(L, err.status ? err.status : MML_ENOMEM, &err);
  return e;
}

mml_status ld_plan_slot(const mml_loader *Lc, int64_t epoch, int64_t pos, int64_t *j,
                        mml_err *err) {
  mml_loader *L = (mml_loader *)Lc; /* the cache changes under mu */
  pthread_mutex_lock(&L->mu);
  gp_epoch *e = epoch_plan_locked(L, epoch);
  mml_status st = MML_OK;
  if (!e)
    st = mml_err_set(err, MML_ENOMEM, "global plan of epoch %lld unavailable", (long long)epoch);
  else if (pos >= e->rank_samples)
    st = mml_err_set(err, MML_EEND, "position %lld is past this rank's plan of epoch %lld",
                     (long long)pos, (long long)epoch);
  else
    *j = e->slot[pos];
  pthread_mutex_unlock(&L->mu);
  return st;
}

int64_t ld_plan_rank_len_locked(mml_loader *L, int64_t epoch) {
  gp_epoch *e = epoch_plan_locked(L, epoch);
  return e ? e->rank_samples : 0;
}

int ld_plan_batch_end_locked(mml_loader *L, int64_t epoch, int64_t pos) {
  gp_epoch *e = epoch_plan_locked(L, epoch);
  if (!e) return 1;
  int64_t lo = 0, hi = e->steps; /* the first step whose rank_end > pos */
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (e->rank_end[mid] > pos)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo < e->steps && e->rank_end[lo] == pos + 1;
}

/* ---- public ------------------------------------------------------------------------- */

int mml_loader_has_plan(const mml_loader *L) { return L->gp != NULL; }

mml_status mml_loader_plan_info(mml_loader *L, int64_t epoch, mml_plan_info *o, mml_err *err) {
  if (!L->gp) return mml_err_set(err, MML_EINVAL, "the loader has no global plan");
  pthread_mutex_lock(&L->mu);
  gp_epoch *e = epoch_plan(L, epoch, q0_of(L->gp, epoch), err);
  if (e) {
    *o = (mml_plan_info){e->q0,           e->usable,       e->end,         e->steps,
                         e->rank_samples, L->gp->unusable, L->gp->indexed, L->gp->measured};
  }
  pthread_mutex_unlock(&L->mu);
  return e ? MML_OK : err->status;
}

mml_status mml_loader_plan_position(mml_loader *L, const mml_cursor *c, int64_t *q0, int64_t *q,
                                    mml_err *err) {
  if (!L->gp) return mml_err_set(err, MML_EINVAL, "the loader has no global plan");
  pthread_mutex_lock(&L->mu);
  gp_epoch *e = epoch_plan(L, c->epoch, q0_of(L->gp, c->epoch), err);
  if (e) {
    int64_t k = c->batch_in_epoch < e->steps ? c->batch_in_epoch : e->steps;
    *q0 = e->q0;
    *q = e->step_q[k];
  }
  pthread_mutex_unlock(&L->mu);
  return e ? MML_OK : err->status;
}

mml_status mml_loader_seek_plan(mml_loader *L, const mml_cursor *c, int64_t q0, mml_err *err) {
  if (!L->gp) return mml_err_set(err, MML_EINVAL, "the loader has no global plan");
  if (q0 < 0)
    return mml_err_set(err, MML_ESTATE, "state field plan_start=%lld is negative", (long long)q0);
  pthread_mutex_lock(&L->mu);
  int64_t old_epoch = L->gp->resume_epoch, old_q0 = L->gp->resume_q0;
  L->gp->resume_epoch = c->epoch;
  L->gp->resume_q0 = q0;
  gp_epoch *e = epoch_plan(L, c->epoch, q0, err);
  mml_status st = e ? MML_OK : err->status;
  if (st == MML_ECONFIG) { /* q0 past the epoch */
    mml_err_prefix(err, "state field plan_start / plan_pos=%lld", (long long)q0);
    st = err->status = MML_ESTATE;
  }
  if (!st && c->batch_in_epoch > e->steps)
    st = mml_err_set(err, MML_ESTATE,
                     "state field batch_in_epoch=%lld is past the %lld steps "
                     "of epoch %lld",
                     (long long)c->batch_in_epoch, (long long)e->steps, (long long)c->epoch);
  if (!st && c->batch_in_epoch > 0 && c->pos != e->rank_end[c->batch_in_epoch - 1])
    st = mml_err_set(err, MML_ESTATE,
                     "state fields pos=%lld and batch_in_epoch=%lld disagree "
                     "with the plan (its batch %lld ends at position %lld)",
                     (long long)c->pos, (long long)c->batch_in_epoch, (long long)c->batch_in_epoch,
                     (long long)e->rank_end[c->batch_in_epoch - 1]);
  if (st) {
    L->gp->resume_epoch = old_epoch;
    L->gp->resume_q0 = old_q0;
  }
  pthread_mutex_unlock(&L->mu);
  return st ? st : mml_loader_seek(L, c, err);
}
