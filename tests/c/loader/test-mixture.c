/* test-mixture.c — counts from weight/repeat/choose; the blended epoch holds exactly each
 * source's count, every prefix is within a draw or two of the ideal share; one source is
 * the plain sampler; sources up-sample with fresh passes and down-sample covering all of
 * their samples over epochs; lookups are pure; DP shards are disjoint and complete. */
#include <math.h>
#include <time.h>

#include "mml/mixture.h"
#include "mml_test.h"

static mml_mix_spec W(int64_t n, double w) { return (mml_mix_spec){"w", n, w, -1, -1}; }

TEST(test_counts) {
  mml_err err;
  int64_t c[4];
  mml_mix_spec a[3] = {W(1000, 0.3), W(500, 0.6), W(100, 0.1)};
  CHECK_OK(mml_mixture_counts(a, 3, 0, c, &err), err); /* epoch = 1600 */
  CHECK_EQ_INT(c[0], 480);
  CHECK_EQ_INT(c[1], 960);
  CHECK_EQ_INT(c[2], 160);
  CHECK_OK(mml_mixture_counts(a, 3, 1001, c, &err), err); /* 300.3 600.6 100.1 -> +1 to #1 */
  CHECK_EQ_INT(c[0] + c[1] + c[2], 1001);
  CHECK_EQ_INT(c[1], 601);
  mml_mix_spec b[3] = {{"r", 10, -1, 2.5, -1}, {"c", 50, -1, -1, 7}, W(40, 1)};
  CHECK_OK(mml_mixture_counts(b, 3, 0, c, &err), err);
  CHECK_EQ_INT(c[0], 25);
  CHECK_EQ_INT(c[1], 7);
  CHECK_EQ_INT(c[2], 40);
  CHECK_OK(mml_mixture_counts(b, 3, 100, c, &err), err);
  CHECK_EQ_INT(c[2], 68);
  mml_mix_spec d[2] = {W(30, -1), W(10, -1)}; /* nothing given: each sample once */
  CHECK_OK(mml_mixture_counts(d, 2, 0, c, &err), err);
  CHECK_EQ_INT(c[0], 30);
  CHECK_EQ_INT(c[1], 10);
  mml_mix_spec bad[2] = {{"both", 10, 1, 2, -1}, W(10, 1)};
  CHECK(mml_mixture_counts(bad, 2, 0, c, &err) == MML_ECONFIG);
  CHECK(strstr(err.msg, "both") != NULL);
  mml_mix_spec fixed[2] = {{"a", 10, -1, -1, 30}, {"b", 10, -1, 1.0, -1}};
  CHECK(mml_mixture_counts(fixed, 2, 20, c, &err) == MML_ECONFIG); /* 40 > 20 */
  CHECK(mml_mixture_counts(fixed, 2, 50, c, &err) == MML_ECONFIG); /* nothing to fill 10 */
  mml_mix_spec zero[2] = {W(10, 0), W(10, 0)};
  CHECK(mml_mixture_counts(zero, 2, 0, c, &err) == MML_ECONFIG);
}

/* Walks an epoch: exact counts, prefix discrepancy, indices inside their source. */
static void check_epoch(const int64_t *n, const int64_t *cnt, int nsrc, int shuffle,
                        int64_t epoch) {
  mml_mixture m;
  mml_mix_scratch sc = {0};
  mml_err err;
  CHECK_OK(mml_mixture_init(&m, n, cnt, nsrc, 42, shuffle, &err), err);
  int64_t seen[16] = {0};
  double worst = 0;
  for (int64_t j = 0; j < m.total; j++) {
    int s;
    int64_t idx;
    CHECK_OK(mml_mixture_at(&m, &sc, epoch, j, &s, &idx), err);
    CHECK(s >= 0 && s < nsrc);
    CHECK(idx >= m.src[s].first && idx < m.src[s].first + n[s]);
    seen[s]++;
    for (int t = 0; t < nsrc; t++) {
      double d = fabs((double)seen[t] - (double)cnt[t] * (double)(j + 1) / (double)m.total);
      if (d > worst) worst = d;
    }
  }
  for (int s = 0; s < nsrc; s++) CHECK_EQ_INT(seen[s], cnt[s]);
  if (worst > 2.0) FAIL_AT("prefix discrepancy %.2f > 2", worst);
  mml_mix_scratch_free(&sc);
  mml_mixture_free(&m);
}

TEST(test_exact_and_smooth) {
  int64_t n1[3] = {1000, 500, 100}, c1[3] = {480, 960, 160};
  check_epoch(n1, c1, 3, 1, 0);
  check_epoch(n1, c1, 3, 1, 5);
  check_epoch(n1, c1, 3, 0, 0);
  int64_t n2[5] = {3, 7, 1, 200, 50}, c2[5] = {1, 0, 17, 300, 2};
  check_epoch(n2, c2, 5, 1, 1);
  int64_t n3[2] = {10, 10}, c3[2] = {10, 10};
  check_epoch(n3, c3, 2, 1, 0);
}

TEST(test_single_source_is_plain_sampler) {
  mml_mixture m;
  mml_mix_scratch sc = {0};
  mml_err err;
  int64_t n = 1003, c = 1003;
  CHECK_OK(mml_mixture_init(&m, &n, &c, 1, 77, 1, &err), err);
  mml_sampler plain;
  CHECK_OK(mml_sampler_init(&plain, n, 77, 1, 0, 1, &err), err);
  for (int64_t e = 0; e < 3; e++)
    for (int64_t j = 0; j < n; j++) {
      int s;
      int64_t idx;
      CHECK_OK(mml_mixture_at(&m, &sc, e, j, &s, &idx), err);
      CHECK_EQ_INT(idx, mml_sampler_permute(&plain, e, j));
    }
  mml_mix_scratch_free(&sc);
  mml_mixture_free(&m);
}

TEST(test_up_and_down_sampling) {
  mml_mixture m;
  mml_mix_scratch sc = {0};
  mml_err err;
  int64_t n[2] = {10, 100}, c[2] = {25, 10}; /* source 0 x2.5, source 1 a tenth per epoch */
  CHECK_OK(mml_mixture_init(&m, n, c, 2, 5, 1, &err), err);
  int hits0[10] = {0}, hits1[100] = {0};
  for (int64_t e = 0; e < 10; e++) {
    for (int64_t j = 0; j < m.total; j++) {
      int s;
      int64_t idx;
      CHECK_OK(mml_mixture_at(&m, &sc, e, j, &s, &idx), err);
      if (s == 0)
        hits0[idx]++;
      else
        hits1[idx - 10]++;
    }
  }
  /* 250 draws of 10 samples in full passes: exactly 25 each; 100 draws cover 100 once */
  for (int i = 0; i < 10; i++) CHECK_EQ_INT(hits0[i], 25);
  for (int i = 0; i < 100; i++) CHECK_EQ_INT(hits1[i], 1);
  mml_mix_scratch_free(&sc);
  mml_mixture_free(&m);
}

TEST(test_dp_shards_and_purity) {
  mml_mixture m;
  mml_mix_scratch sc = {0}, sc2 = {0};
  mml_err err;
  int64_t n[3] = {400, 300, 303}, c[3] = {400, 300, 303};
  CHECK_OK(mml_mixture_init(&m, n, c, 3, 9, 1, &err), err);
  int dp = 4;
  char seen[1003] = {0};
  int64_t total = 0;
  int per_rank[4][3] = {{0}};
  for (int r = 0; r < dp; r++) {
    mml_sampler sm;
    CHECK_OK(mml_sampler_init(&sm, m.total, 9, 1, r, dp, &err), err);
    for (int64_t p = 0; p < sm.n_rank; p++) {
      int s, s2;
      int64_t idx, idx2;
      CHECK_OK(mml_mixture_at(&m, &sc, 3, mml_sampler_slot(&sm, p), &s, &idx), err);
      CHECK_OK(mml_mixture_at(&m, &sc2, 3, mml_sampler_slot(&sm, p), &s2, &idx2), err);
      CHECK_EQ_INT(idx, idx2);
      if (seen[idx]) FAIL_AT("sample %lld on two ranks", (long long)idx);
      seen[idx] = 1;
      per_rank[r][s]++;
      total++;
    }
  }
  CHECK_EQ_INT(total, (1003 / dp) * dp);
  /* no aliasing with the stride: every rank sees every source near its share */
  for (int r = 0; r < dp; r++)
    for (int s = 0; s < 3; s++) {
      double want = (double)c[s] / 1003.0 * 250.0;
      if (fabs(per_rank[r][s] - want) > 30)
        FAIL_AT("rank %d source %d: %d draws, want ~%.0f", r, s, per_rank[r][s], want);
    }
  mml_mix_scratch_free(&sc);
  mml_mix_scratch_free(&sc2);
  mml_mixture_free(&m);
}

TEST(test_many_sources_speed) {
  enum { NS = 100 };
  int64_t n[NS], c[NS];
  int64_t total = 0;
  for (int s = 0; s < NS; s++) {
    n[s] = 1000 + 1987 * s;
    c[s] = n[s];
    total += n[s];
  }
  mml_mixture m;
  mml_mix_scratch sc = {0};
  mml_err err;
  CHECK_OK(mml_mixture_init(&m, n, c, NS, 1, 1, &err), err);
  CHECK_EQ_INT(m.total, total);
  int64_t counts[NS] = {0};
  double t0 = mml_now();
  int64_t lookups = 20000;
  for (int64_t i = 0; i < lookups; i++) { /* a contiguous stretch in the middle */
    int s;
    int64_t idx;
    CHECK_OK(mml_mixture_at(&m, &sc, 0, total / 2 + i, &s, &idx), err);
    counts[s]++;
  }
  double dt = mml_now() - t0;
  fprintf(stderr, "  mixture lookup, 100 sources: %.2f us\n", dt / (double)lookups * 1e6);
  for (int s = 0; s < NS; s++) {
    double want = (double)c[s] * (double)lookups / (double)total;
    if (fabs((double)counts[s] - want) > 2.0)
      FAIL_AT("source %d: %lld, want %.1f", s, (long long)counts[s], want);
  }
  mml_mix_scratch_free(&sc);
  mml_mixture_free(&m);
}
