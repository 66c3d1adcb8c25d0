/* test-plan.c — the global plan: budgets never exceeded, every planned position once,
 * steps give every rank a non-empty batch, balance lowers the max/mean load on a skewed
 * epoch, plans from a step boundary are suffixes, grouping sorts windows. */
#include "mml/plan.h"
#include "mml_test.h"

static uint64_t rng_state = 88172645463325252ULL;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* A skewed epoch: 1 in 8 samples carries a large image, the rest are short text. */
static void skewed(int64_t n, int64_t *tok, int64_t *vis) {
  for (int64_t j = 0; j < n; j++) {
    int img = rnd() % 8 == 0;
    vis[j] = img ? 256 + (int64_t)(rnd() % 1024) : 0;
    tok[j] = 20 + (int64_t)(rnd() % 300) + vis[j];
    if (rnd() % 50 == 0) tok[j] = -1; /* failed while planning */
  }
}

/* Checks the invariants of p; returns 0 (after FAIL_AT's message) when one breaks. */
static int check_plan(const mml_plan_cfg *c, const mml_plan *p, const int64_t *tok, int64_t n) {
  char *seen = calloc((size_t)n, 1);
  const int64_t *a = p->assign;
  int ok = 1;
  for (int64_t k = 0; ok && k < p->nsteps; k++) {
    int64_t in_step = 0;
    for (int r = 0; ok && r < c->dp_size; r++) {
      int64_t cnt = p->count[k * c->dp_size + r], longest = 0, used = 0, prev = -1;
      if (cnt < 1 || (c->rows && cnt != c->rows)) ok = 0;
      for (int64_t i = 0; ok && i < cnt; i++, a++) {
        if (*a < p->step_q[k] || *a >= p->step_q[k + 1] || *a <= prev) ok = 0;
        prev = *a;
        int64_t j = p->order[*a];
        if (j < 0 || j >= n || seen[j] || tok[j] < 0)
          ok = 0;
        else
          seen[j] = 1;
        if (tok[j] > longest) longest = tok[j];
        used += mml_plan_slot(c, tok[j]);
      }
      in_step += cnt;
      if (c->max_tokens && cnt * longest > c->max_tokens) ok = 0;
      if (c->pack_length && used > c->pack_length) ok = 0;
    }
    if (in_step != p->step_q[k + 1] - p->step_q[k]) ok = 0;
  }
  /* what is not planned: the start before q0 and a tail too short for one more step */
  int64_t tail = p->nq - p->step_q[p->nsteps];
  if (c->rows && tail >= (int64_t)c->dp_size * c->rows) ok = 0;
  free(seen);
  return ok;
}

static const mml_plan_cfg k_cfgs[] = {
    {.dp_size = 4, .rows = 3},
    {.dp_size = 4, .max_tokens = 4096},
    {.dp_size = 3, .max_tokens = 2000, .group = 64},
    {.dp_size = 8, .pack_length = 4096, .multiple = 64},
    {.dp_size = 1, .max_tokens = 1500},
};

TEST(test_invariants) {
  enum { N = 5000 };
  static int64_t tok[N], vis[N];
  skewed(N, tok, vis);
  mml_err err;
  for (size_t i = 0; i < sizeof k_cfgs / sizeof *k_cfgs; i++)
    for (int b = MML_BALANCE_NONE; b <= MML_BALANCE_VISION; b++) {
      mml_plan_cfg c = k_cfgs[i];
      c.balance = b;
      mml_plan p;
      CHECK_OK(mml_plan_build(&c, tok, vis, N, 0, &p, &err), err);
      if (!check_plan(&c, &p, tok, N)) FAIL_AT("cfg %zu balance %d broke an invariant", i, b);
      CHECK(p.nsteps > 10);
      mml_plan_free(&p);
    }
}

TEST(test_too_long_left_out) {
  int64_t tok[] = {10, 5000, 20, 30, 4097, 40}, vis[6] = {0};
  mml_plan_cfg c = {.dp_size = 2, .max_tokens = 4096};
  mml_plan p;
  mml_err err;
  CHECK_OK(mml_plan_build(&c, tok, vis, 6, 0, &p, &err), err);
  CHECK_EQ_INT(p.too_long, 2);
  CHECK_EQ_INT(p.nq, 4);
  CHECK_EQ_INT(p.nsteps, 1); /* rank 0 takes 10, 20, 30 (leaving one), rank 1 takes 40 */
  CHECK_EQ_INT(p.count[0], 3);
  CHECK_EQ_INT(p.count[1], 1);
  mml_plan_free(&p);
}

TEST(test_balance_lowers_max_over_mean) {
  enum { N = 20000 };
  static int64_t tok[N], vis[N];
  skewed(N, tok, vis);
  mml_err err;
  /* fixed rows (2 images per rank and step: LPT's granularity), packing, a padded budget
   * with length grouping (without it the padding a mix of lengths costs limits balance) */
  const mml_plan_cfg base[] = {{.dp_size = 8, .rows = 16},
                               {.dp_size = 8, .pack_length = 32768},
                               {.dp_size = 8, .max_tokens = 32768, .group = 4096}};
  const double bound[] = {1.15, 1.05, 1.05};
  for (size_t i = 0; i < 3; i++) {
    double mx[2], mean[2], worst[2];
    for (int b = 0; b < 2; b++) {
      mml_plan_cfg c = base[i];
      c.balance = b ? MML_BALANCE_VISION : MML_BALANCE_NONE;
      mml_plan p;
      CHECK_OK(mml_plan_build(&c, tok, vis, N, 0, &p, &err), err);
      mml_plan_load(&p, vis, &mx[b], &mean[b], &worst[b]);
      mml_plan_free(&p);
    }
    double before = mx[0] / mean[0], after = mx[1] / mean[1];
    fprintf(stderr, "  cfg %zu: vision max/mean %.3f -> %.3f\n", i, before, after);
    if (!(before > 1.2 && after < bound[i]))
      FAIL_AT("cfg %zu: vision max/mean %.3f -> %.3f", i, before, after);
  }
}

TEST(test_suffix_and_determinism) {
  enum { N = 3000 };
  static int64_t tok[N], vis[N];
  skewed(N, tok, vis);
  mml_err err;
  mml_plan_cfg c = {.dp_size = 4, .max_tokens = 4096, .group = 100, .balance = MML_BALANCE_TOKENS};
  mml_plan a, b, again;
  CHECK_OK(mml_plan_build(&c, tok, vis, N, 0, &a, &err), err);
  CHECK_OK(mml_plan_build(&c, tok, vis, N, 0, &again, &err), err);
  CHECK_EQ_INT(a.nsteps, again.nsteps);
  CHECK(!memcmp(a.assign, again.assign, (size_t)(a.step_q[a.nsteps]) * sizeof *a.assign));
  int64_t k0 = a.nsteps / 3, q0 = a.step_q[k0];
  CHECK_OK(mml_plan_build(&c, tok, vis, N, q0, &b, &err), err);
  CHECK_EQ_INT(b.nsteps, a.nsteps - k0);
  CHECK(!memcmp(b.assign, a.assign + (q0 - a.q0),
                (size_t)(b.step_q[b.nsteps] - q0) * sizeof *b.assign));
  CHECK(!memcmp(b.count, a.count + k0 * 4, (size_t)b.nsteps * 4 * sizeof *b.count));
  /* another rank count from the same global position covers exactly the rest */
  mml_plan_cfg c3 = c;
  c3.dp_size = 3;
  mml_plan d;
  CHECK_OK(mml_plan_build(&c3, tok, vis, N, q0, &d, &err), err);
  if (!check_plan(&c3, &d, tok, N)) FAIL_AT("resumed plan broke an invariant");
  CHECK(d.step_q[0] == q0 && d.nq - d.step_q[d.nsteps] < 3);
  mml_plan_free(&a);
  mml_plan_free(&again);
  mml_plan_free(&b);
  mml_plan_free(&d);
}

TEST(test_group_sorts_windows) {
  int64_t tok[] = {5, 9, 7, 1, 3, 8, 2}, vis[7] = {0};
  mml_plan_cfg c = {.dp_size = 1, .rows = 1, .group = 3};
  mml_plan p;
  mml_err err;
  CHECK_OK(mml_plan_build(&c, tok, vis, 7, 0, &p, &err), err);
  int64_t want[] = {1, 2, 0, 5, 4, 3, 6};
  for (int i = 0; i < 7; i++) CHECK_EQ_INT(p.order[i], want[i]);
  mml_plan_free(&p);
}

TEST(test_bad_cfg) {
  int64_t tok[] = {1}, vis[] = {0};
  mml_plan p;
  mml_err err;
  mml_plan_cfg both = {.dp_size = 1, .rows = 2, .max_tokens = 10};
  CHECK(mml_plan_build(&both, tok, vis, 1, 0, &p, &err) == MML_ECONFIG);
  mml_plan_cfg ok = {.dp_size = 1, .rows = 1};
  CHECK(mml_plan_build(&ok, tok, vis, 1, 2, &p, &err) == MML_ECONFIG);
}
