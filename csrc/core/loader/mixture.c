/*
 * mixture.c — per-source counts, the blended epoch order and the within-source order
 * (see mml/mixture.h for the design).
 *
 * A lookup of position j: the ideal time of j is j/M; every source's count below a time
 * T differs from c_s * T by less than one, so the j-th draw has a time in
 * [(j - nsrc - 1)/M, (j + nsrc + 2)/M).  count_below() gives the exact number of draws
 * before the window's start, the draws inside it (at most ~4 per source) are gathered
 * and sorted, and the (j - before)-th is the answer.  All comparisons are exact integer
 * arithmetic: a time is num/(c * D) with num = k*D + u, u < D = 2^20, and two times
 * compare by cross-multiplying in 128 bits (num < 2^60, c < 2^40).
 *
 * Threads: pure functions over an immutable mixture; the scratch is the caller's.
 */
#include "mml/mixture.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

__extension__ typedef unsigned __int128 u128;

#define JITTER_BITS 20
#define JITTER_D ((uint64_t)1 << JITTER_BITS)
#define MAX_TOTAL ((int64_t)1 << 40)

typedef struct cand {
  uint64_t num; /* k*D + u */
  int64_t c;    /* the source's count */
  int64_t k;
  int s;
} cand;

/* ---------------------------------------------------------------- counts */

typedef struct frac_idx {
  double frac;
  int idx;
} frac_idx;

static int by_frac_desc(const void *a, const void *b) {
  const frac_idx *x = a, *y = b;
  if (x->frac != y->frac) return x->frac > y->frac ? -1 : 1;
  return x->idx - y->idx;
}

/* The sources with a fixed count (choose, repeat, or neither: repeat=1) get it in counts;
 * the weighted ones are summed: *fixed, *natural (their samples), *wsum, *nweighted. */
static mml_status fixed_counts(const mml_mix_spec *spec, int nsrc, int64_t *counts, int64_t *fixed,
                               int64_t *natural, double *wsum, int *nweighted, mml_err *err) {
  for (int s = 0; s < nsrc; s++) {
    const mml_mix_spec *p = &spec[s];
    const char *name = p->name ? p->name : "?";
    int given = (p->weight >= 0) + (p->repeat >= 0) + (p->choose >= 0);
    if (given > 1)
      return mml_err_set(err, MML_ECONFIG, "source %s: give only one of weight, repeat and choose",
                         name);
    counts[s] = 0;
    if (p->choose >= 0) {
      if (p->choose >= MAX_TOTAL)
        return mml_err_set(err, MML_ECONFIG, "source %s: choose=%lld is too large", name,
                           (long long)p->choose);
      counts[s] = p->choose;
    } else if (p->repeat >= 0 || p->weight < 0) { /* neither given: repeat=1 */
      double r = p->repeat >= 0 ? p->repeat : 1.0;
      double c = nearbyint(r * (double)p->n);
      if (!isfinite(c) || c >= (double)MAX_TOTAL)
        return mml_err_set(err, MML_ECONFIG, "source %s: repeat=%g is too large", name, p->repeat);
      counts[s] = (int64_t)c;
    } else {
      double w = p->weight;
      if (!isfinite(w))
        return mml_err_set(err, MML_ECONFIG, "source %s: weight must be finite", name);
      *wsum += w;
      *natural += p->n;
      (*nweighted)++;
      continue;
    }
    *fixed += counts[s];
    if (*fixed >= MAX_TOTAL)
      return mml_err_set(err, MML_ECONFIG, "the mixture's epoch is too large");
  }
  return MML_OK;
}

/* Shares `rest` samples between the weighted sources by largest remainder: floors first,
 * then one more to the largest fractions. */
static mml_status share_weighted(const mml_mix_spec *spec, int nsrc, int nweighted, double wsum,
                                 int64_t rest, int64_t *counts, mml_err *err) {
  frac_idx *fr = malloc((size_t)nweighted * sizeof *fr);
  if (!fr) return mml_err_set(err, MML_ENOMEM, "out of memory");
  int64_t given_out = 0;
  int nw = 0;
  for (int s = 0; s < nsrc; s++) {
    const mml_mix_spec *p = &spec[s];
    if (p->weight < 0) continue;
    double w = p->weight;
    double q = (double)rest * (w / wsum);
    double f = floor(q);
    counts[s] = (int64_t)f;
    given_out += counts[s];
    fr[nw].frac = q - f;
    fr[nw].idx = s;
    nw++;
  }
  qsort(fr, (size_t)nw, sizeof *fr, by_frac_desc);
  int64_t left = rest - given_out;
  for (int i = 0; left > 0; i = (i + 1) % nw, left--) counts[fr[i].idx]++;
  for (int i = nw - 1; left < 0 && i >= 0; i--) /* rounding overshoot (cannot really happen) */
    if (counts[fr[i].idx] > 0) counts[fr[i].idx]--, left++;
  free(fr);
  return MML_OK;
}

mml_status mml_mixture_counts(const mml_mix_spec *spec, int nsrc, int64_t samples_per_epoch,
                              int64_t *counts, mml_err *err) {
  if (nsrc < 1) return mml_err_set(err, MML_ECONFIG, "the mixture has no source");
  int64_t fixed = 0, natural = 0;
  double wsum = 0;
  int nweighted = 0;
  mml_status st = fixed_counts(spec, nsrc, counts, &fixed, &natural, &wsum, &nweighted, err);
  if (st != MML_OK) return st;
  int64_t rest;
  if (samples_per_epoch > 0) {
    rest = samples_per_epoch - fixed;
    if (rest < 0)
      return mml_err_set(err, MML_ECONFIG,
                         "the sources' repeat/choose counts (%lld samples) exceed "
                         "samples_per_epoch=%lld",
                         (long long)fixed, (long long)samples_per_epoch);
    if (nweighted == 0 && rest != 0)
      return mml_err_set(err, MML_ECONFIG,
                         "samples_per_epoch=%lld, but every source has a fixed count "
                         "(repeat/choose) and they total %lld",
                         (long long)samples_per_epoch, (long long)fixed);
  } else {
    rest = natural;
  }
  if (rest > 0 && !(wsum > 0))
    return mml_err_set(err, MML_ECONFIG, "the weighted sources' weights sum to 0");
  if (fixed + rest <= 0) return mml_err_set(err, MML_ECONFIG, "the mixture's epoch is empty");
  if (fixed + rest >= MAX_TOTAL)
    return mml_err_set(err, MML_ECONFIG, "the mixture's epoch is too large");
  if (nweighted == 0 || rest == 0) return MML_OK;
  return share_weighted(spec, nsrc, nweighted, wsum, rest, counts, err);
}

/* ---------------------------------------------------------------- init */

mml_status mml_mixture_init(mml_mixture *m, const int64_t *n, const int64_t *counts, int nsrc,
                            uint64_t seed, int shuffle, mml_err *err) {
  memset(m, 0, sizeof *m);
  if (nsrc < 1) return mml_err_set(err, MML_ECONFIG, "the mixture has no source");
  m->src = calloc((size_t)nsrc, sizeof *m->src);
  m->active = calloc((size_t)nsrc, sizeof *m->active);
  if (!m->src || !m->active) {
    mml_mixture_free(m);
    return mml_err_set(err, MML_ENOMEM, "out of memory");
  }
  m->nsrc = nsrc;
  m->seed = seed;
  m->shuffle = shuffle;
  int64_t first = 0;
  for (int s = 0; s < nsrc; s++) {
    mml_mix_source *p = &m->src[s];
    p->first = first;
    p->n = n[s];
    p->count = counts[s];
    first += n[s];
    if (p->count < 0 || p->n < 1) {
      mml_mixture_free(m);
      return mml_err_set(err, MML_ECONFIG, "source %d: %lld samples, count %lld", s,
                         (long long)n[s], (long long)counts[s]);
    }
    /* source 0 uses the loader's seed itself: one source is the plain sampler */
    uint64_t sseed = seed + (uint64_t)s * 0x9E3779B97F4A7C15ULL;
    mml_status st = mml_sampler_init(&p->perm, p->n, sseed, shuffle, 0, 1, err);
    if (st) {
      mml_mixture_free(m);
      return st;
    }
    if (p->count > 0) m->active[m->nactive++] = s;
    m->total += p->count;
  }
  if (m->total <= 0 || m->total >= MAX_TOTAL) {
    mml_mixture_free(m);
    return mml_err_set(err, MML_ECONFIG, "the mixture's epoch holds %lld samples",
                       (long long)m->total);
  }
  return MML_OK;
}

void mml_mixture_free(mml_mixture *m) {
  free(m->src);
  free(m->active);
  memset(m, 0, sizeof *m);
}

void mml_mix_scratch_free(mml_mix_scratch *sc) {
  free(sc->cand);
  sc->cand = NULL;
  sc->cap = 0;
}

/* ---------------------------------------------------------------- lookup */

static uint64_t epoch_key(const mml_mixture *m, int64_t epoch) {
  return mml_mix64(mml_mix64(m->seed ^ 0x6a09e667f3bcc909ULL) ^
                   mml_mix64((uint64_t)epoch + 0x3c6ef372fe94f82bULL));
}

static uint64_t source_key(uint64_t ekey, int s) {
  return mml_mix64(ekey ^ mml_mix64((uint64_t)s + 1));
}

/* k*D + u for draw k of a source (u: its jitter inside the stratum). */
static uint64_t draw_num(const mml_mixture *m, uint64_t skey, int64_t k) {
  uint64_t u = m->shuffle ? mml_mix64(skey ^ (uint64_t)k) >> (64 - JITTER_BITS) : JITTER_D / 2;
  return (uint64_t)k * JITTER_D + u;
}

/* floor(a * c / M) without a 128-bit division: a double estimate, corrected exactly. */
static int64_t floor_mul_div(int64_t a, int64_t c, int64_t M) {
  u128 ac = (u128)a * (u128)c;
  int64_t k = (int64_t)((double)a * (double)c / (double)M);
  while (k > 0 && (u128)k * (u128)M > ac) k--;
  while ((u128)(k + 1) * (u128)M <= ac) k++;
  return k;
}

/* Draws of source s with time < a / M. */
static int64_t count_below(const mml_mixture *m, int s, uint64_t skey, int64_t a) {
  int64_t c = m->src[s].count, M = m->total;
  int64_t k0 = floor_mul_div(a, c, M); /* the stratum holding a/M */
  if (k0 >= c) return c;
  u128 lhs = (u128)draw_num(m, skey, k0) * (u128)M;
  u128 rhs = (u128)a * (u128)c * JITTER_D;
  return lhs < rhs ? k0 + 1 : k0;
}

static int cand_cmp(const void *pa, const void *pb) {
  const cand *a = pa, *b = pb;
  u128 x = (u128)a->num * (u128)b->c, y = (u128)b->num * (u128)a->c;
  if (x != y) return x < y ? -1 : 1;
  return a->s - b->s;
}

mml_status mml_mixture_at(const mml_mixture *m, mml_mix_scratch *sc, int64_t epoch, int64_t j,
                          int *source, int64_t *index) {
  int s;
  int64_t k;
  if (m->nactive == 1) {
    s = m->active[0];
    k = j;
  } else {
    /* The window j +- (nactive + 2) always holds the answer; the deviations of the
     * sources mostly cancel, so a narrow window usually does and is tried first. */
    int need = 6 * m->nactive + 16;
    if (sc->cap < need) {
      void *p = realloc(sc->cand, (size_t)need * sizeof(cand));
      if (!p) return MML_ENOMEM;
      sc->cand = p;
      sc->cap = need;
    }
    cand *cd = sc->cand;
    uint64_t ekey = epoch_key(m, epoch);
    int64_t wmax = m->nactive + 2, w = 4;
    while (w * w < m->nactive) w *= 2;
    for (;; w *= 2) {
      if (w > wmax) w = wmax;
      int64_t lo = j - w, hi = j + w + 1;
      if (lo < 0) lo = 0;
      if (hi > m->total) hi = m->total;
      int64_t before = 0;
      int nc = 0;
      for (int i = 0; i < m->nactive; i++) {
        int t = m->active[i];
        uint64_t skey = source_key(ekey, t);
        int64_t k_lo = count_below(m, t, skey, lo), k_hi = count_below(m, t, skey, hi);
        before += k_lo;
        for (int64_t q = k_lo; q < k_hi && nc < sc->cap; q++)
          cd[nc++] = (cand){draw_num(m, skey, q), m->src[t].count, q, t};
      }
      int64_t r = j - before;
      if (r >= 0 && r < nc) {
        qsort(cd, (size_t)nc, sizeof *cd, cand_cmp);
        s = cd[r].s;
        k = cd[r].k;
        break;
      }
      if (w == wmax) return MML_EINTERNAL; /* impossible: see the bound above */
    }
  }
  const mml_mix_source *p = &m->src[s];
  int64_t g = epoch * p->count + k; /* this source's draws continue across epochs */
  *source = s;
  *index = p->first + mml_sampler_permute(&p->perm, g / p->n, g % p->n);
  return MML_OK;
}
