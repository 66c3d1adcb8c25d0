/* test-pool.c — buffers, pool reuse and lifetime, batches; concurrent release (TSan). */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>

#include "mml/batch.h"
#include "mml_test.h"

TEST(test_alloc_reuse) {
  mml_pool *p;
  mml_err err = {0};
  CHECK_OK(mml_pool_new(NULL, 0, &p, &err), err);
  mml_buf *a;
  CHECK_OK(mml_pool_alloc(p, 1000, &a, &err), err);
  CHECK(a->size >= 1000);
  CHECK_EQ_INT((uintptr_t)a->data % 64, 0);
  memset(a->data, 7, 1000);
  void *addr = a->data;
  size_t cached, live;
  mml_pool_usage(p, &cached, &live);
  CHECK_EQ_INT(cached, 0);
  CHECK(live >= 1000);
  mml_buf_retain(a);
  mml_buf_release(a); /* still one reference: not recycled */
  mml_pool_usage(p, &cached, &live);
  CHECK_EQ_INT(cached, 0);
  mml_buf_release(a);
  mml_pool_usage(p, &cached, &live);
  CHECK(cached >= 1000);
  CHECK_EQ_INT(live, 0);
  mml_buf *b;
  CHECK_OK(mml_pool_alloc(p, 900, &b, &err), err);
  CHECK(b->data == addr); /* reused */
  mml_buf *c;
  CHECK_OK(mml_pool_alloc(p, 100000, &c, &err), err);
  CHECK(c->data != addr);
  mml_buf_release(b);
  mml_buf *d; /* a much smaller request does not take a big cached buffer */
  mml_buf_release(c);
  CHECK_OK(mml_pool_alloc(p, 10, &d, &err), err);
  CHECK(d->size < 100000);
  mml_buf_release(d);
  mml_pool_close(p);
}

TEST(test_buffer_outlives_pool) {
  mml_pool *p;
  mml_err err = {0};
  CHECK_OK(mml_pool_new(NULL, 0, &p, &err), err);
  mml_buf *a;
  CHECK_OK(mml_pool_alloc(p, 64, &a, &err), err);
  memset(a->data, 1, 64);
  mml_pool_close(p); /* live buffer stays valid */
  CHECK_EQ_INT(((uint8_t *)a->data)[63], 1);
  mml_buf_release(a); /* frees buffer and pool: ASan reports leaks otherwise */
}

static int fence_state;
static int fence_done(void *f) { return *(int *)f; }
TEST(test_fence_blocks_reuse) {
  mml_pool *p;
  mml_err err = {0};
  CHECK_OK(mml_pool_new(NULL, 0, &p, &err), err);
  mml_buf *a, *b;
  CHECK_OK(mml_pool_alloc(p, 4096, &a, &err), err);
  void *addr = a->data;
  fence_state = 0;
  a->fence = &fence_state;
  a->fence_done = fence_done;
  mml_buf_release(a);
  CHECK_OK(mml_pool_alloc(p, 4096, &b, &err), err);
  CHECK(b->data != addr); /* copy still pending */
  mml_buf_release(b);
  fence_state = 1;
  mml_buf *c;
  CHECK_OK(mml_pool_alloc(p, 4096, &c, &err), err);
  CHECK(c->data == addr || c->data == b->data);
  mml_buf_release(c);
  mml_pool_close(p);
}

/* pool.c COUNTS: allocations, reuses, frees (at a release into a full cache), and the cached
 * buffers a request passed over because their fence was pending. */
TEST(test_pool_stats_counts) {
  mml_pool *p;
  mml_err err = {0};
  CHECK_OK(mml_pool_new(NULL, 8192, &p, &err), err);
  mml_buf *a, *b, *c, *d, *e;
  mml_pool_stats s;
  CHECK_OK(mml_pool_alloc(p, 4096, &a, &err), err);
  fence_state = 0;
  a->fence = &fence_state;
  a->fence_done = fence_done;
  mml_buf_release(a);
  CHECK_OK(mml_pool_alloc(p, 4096, &b, &err), err); /* a's copy pending: a new one */
  mml_pool_stats_get(p, &s);
  CHECK_EQ_INT(s.allocs, 2);
  CHECK_EQ_INT(s.reuses, 0);
  CHECK_EQ_INT(s.pending_skips, 1);
  CHECK_EQ_INT(s.pending_max, 1);
  CHECK_EQ_INT(s.cached_bufs, 1);
  CHECK_EQ_INT(s.live, 4096);
  fence_state = 1;
  mml_buf_release(b);
  CHECK_OK(mml_pool_alloc(p, 4096, &c, &err), err);
  CHECK_OK(mml_pool_alloc(p, 4096, &d, &err), err);
  CHECK_OK(mml_pool_alloc(p, 4096, &e, &err), err);
  mml_buf_release(c);
  mml_buf_release(d);
  mml_buf_release(e); /* the cache holds 8192 bytes: freed */
  mml_pool_stats_get(p, &s);
  CHECK_EQ_INT(s.allocs, 3);
  CHECK_EQ_INT(s.reuses, 2);
  CHECK_EQ_INT(s.frees, 1);
  CHECK_EQ_INT(s.release_frees, 1);
  CHECK_EQ_INT(s.pending_skips, 1);
  CHECK_EQ_INT(s.cached_bufs, 2);
  CHECK_EQ_INT(s.cached, 8192);
  CHECK_EQ_INT(s.live, 0);
  CHECK_EQ_INT(mml_pool_trim(p, 4096), 4096);
  mml_pool_stats_get(p, &s);
  CHECK_EQ_INT(s.frees, 2);
  CHECK_EQ_INT(s.release_frees, 1);
  mml_pool_close(p);
}

TEST(test_cache_limit) {
  mml_pool *p;
  mml_err err = {0};
  CHECK_OK(mml_pool_new(NULL, 8192, &p, &err), err);
  mml_buf *a, *b, *c;
  CHECK_OK(mml_pool_alloc(p, 4096, &a, &err), err);
  CHECK_OK(mml_pool_alloc(p, 4096, &b, &err), err);
  CHECK_OK(mml_pool_alloc(p, 4096, &c, &err), err);
  mml_buf_release(a);
  mml_buf_release(b);
  mml_buf_release(c); /* over the limit: freed */
  size_t cached, live;
  mml_pool_usage(p, &cached, &live);
  CHECK_EQ_INT(cached, 8192);
  CHECK_EQ_INT(live, 0);
  mml_pool_close(p);
}

TEST(test_batch) {
  mml_pool *p;
  mml_err err = {0};
  CHECK_OK(mml_pool_new(NULL, 0, &p, &err), err);
  mml_batch b;
  memset(&b, 0, sizeof b);
  int64_t shape[2] = {3, 5};
  void *data;
  CHECK_OK(mml_batch_add(&b, p, "input_ids", MML_DT_INT64, 2, shape, &data, &err), err);
  ((int64_t *)data)[14] = 42;
  int64_t s1[1] = {0};
  CHECK_OK(mml_batch_add(&b, p, "empty", MML_DT_FLOAT32, 1, s1, NULL, &err), err);
  mml_tensor *t = mml_batch_find(&b, "input_ids");
  CHECK(t != NULL);
  CHECK_EQ_INT(mml_tensor_numel(t), 15);
  CHECK_EQ_STR(mml_dtype_name(t->dtype), "int64");
  CHECK_EQ_INT(mml_dtype_size(MML_DT_FLOAT32), 4);
  CHECK(mml_batch_find(&b, "nope") == NULL);
  mml_buf *keep = t->buf;
  mml_buf_retain(keep);
  mml_batch_clear(&b);
  CHECK_EQ_INT(b.ntensors, 0);
  CHECK_EQ_INT(((int64_t *)keep->data)[14], 42);
  mml_buf_release(keep);
  for (int i = 0; i < MML_MAX_TENSORS; i++)
    CHECK_OK(mml_batch_add(&b, p, "x", MML_DT_UINT8, 1, s1, NULL, &err), err);
  CHECK(mml_batch_add(&b, p, "x", MML_DT_UINT8, 1, s1, NULL, &err) != MML_OK);
  mml_batch_clear(&b);
  mml_pool_close(p);
}

/* Buffers released from several threads while another allocates (TSan checks). */
enum { NT = 4, PER = 200 };
static mml_buf *bufs[NT][PER];
static void *releaser(void *arg) {
  mml_buf **v = arg;
  for (int i = 0; i < PER; i++) {
    ((uint8_t *)v[i]->data)[0]++;
    mml_buf_release(v[i]);
  }
  return NULL;
}
TEST(test_concurrent_release) {
  mml_pool *p;
  mml_err err = {0};
  CHECK_OK(mml_pool_new(NULL, 1 << 20, &p, &err), err);
  for (int t = 0; t < NT; t++)
    for (int i = 0; i < PER; i++) CHECK_OK(mml_pool_alloc(p, 100 + i, &bufs[t][i], &err), err);
  pthread_t th[NT];
  for (int t = 0; t < NT; t++) pthread_create(&th[t], NULL, releaser, bufs[t]);
  for (int i = 0; i < 100; i++) {
    mml_buf *b;
    CHECK_OK(mml_pool_alloc(p, 150, &b, &err), err);
    ((uint8_t *)b->data)[0] = 1;
    mml_buf_release(b);
  }
  mml_pool_close(p); /* while releases are still running */
  for (int t = 0; t < NT; t++) pthread_join(th[t], NULL);
}

/* Large buffers are mappings that stay mapped: reused whatever their size, grown in place
 * (contents kept) when nothing cached is large enough, freed only by trim or close. */
TEST(test_large_buffers_stay_mapped) {
  mml_pool *p;
  mml_err err = {0};
  CHECK_OK(mml_pool_new(NULL, 0, &p, &err), err);
  const size_t MB = 1 << 20;
  mml_buf *a, *b, *c;
  CHECK_OK(mml_pool_alloc(p, 3 * MB, &a, &err), err);
  CHECK(a->size >= 3 * MB);
  CHECK_EQ_INT((uintptr_t)a->data % (2 * MB), 0); /* 2 MiB aligned: huge pages */
  memset(a->data, 0x5a, a->size);
  void *addr = a->data;
  mml_buf_release(a);
  CHECK_OK(mml_pool_alloc(p, MB + 1, &b, &err), err); /* smaller: takes the cached one */
  CHECK(b->data == addr);
  mml_buf_release(b);
  CHECK_OK(mml_pool_alloc(p, 9 * MB, &c, &err), err); /* larger: the cached one grows */
  CHECK(c->size >= 9 * MB);
  CHECK_EQ_INT(((uint8_t *)c->data)[3 * MB - 1], 0x5a); /* its pages kept their contents */
  memset(c->data, 1, c->size);
  size_t cached, live;
  mml_pool_usage(p, &cached, &live);
  CHECK_EQ_INT(cached, 0);
  CHECK_EQ_INT(live, c->size);
  mml_buf_release(c);
  mml_pool_usage(p, &cached, &live);
  CHECK_EQ_INT(live, 0);
  CHECK(cached >= 9 * MB);
  CHECK_EQ_INT(mml_pool_trim(p, 0), 0);
  mml_pool_close(p);
}

#ifndef __has_feature
#define __has_feature(x) 0
#endif
/* Sanitizers fault in their shadow memory as the test writes: page faults count only
 * in the plain build. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || \
    __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FAULTS_COUNTED 0
#else
#define FAULTS_COUNTED 1
#endif

static long thread_minflt(void) {
  struct rusage ru;
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_minflt;
}

/* A buffer's pages beyond a smaller request go to the reservoir and fill the next
 * request: moved (their old contents show), not mapped and zeroed afresh, so writing the
 * new buffer faults nothing. */
TEST(test_pages_move_between_buffers) {
  mml_pool *p;
  mml_err err = {0};
  CHECK_OK(mml_pool_new(NULL, 0, &p, &err), err);
  const size_t MB = 1 << 20;
  mml_buf *a, *b, *c;
  CHECK_OK(mml_pool_alloc(p, 8 * MB, &a, &err), err);
  memset(a->data, 0x11, 8 * MB);
  void *addr = a->data;
  mml_buf_release(a);
  CHECK_OK(mml_pool_alloc(p, 4 * MB, &b, &err), err); /* the mapping with the most pages */
  CHECK(b->data == addr);
  size_t cached, live;
  mml_pool_usage(p, &cached, &live);
  CHECK_EQ_INT(cached, 4 * MB);                       /* the other 4 MiB: spare pages */
  CHECK_OK(mml_pool_alloc(p, 4 * MB, &c, &err), err); /* a new mapping, given those pages */
  mml_pool_usage(p, &cached, &live);
  CHECK_EQ_INT(cached, 0);
  CHECK_EQ_INT(live, 8 * MB);
  uint8_t *d = c->data;
  CHECK_EQ_INT(d[0], 0x11); /* a's pages, moved */
  CHECK_EQ_INT(d[4 * MB - 1], 0x11);
  long f0 = thread_minflt();
  memset(c->data, 0x22, 4 * MB);
  if (FAULTS_COUNTED) CHECK_EQ_INT(thread_minflt() - f0, 0);
  CHECK_EQ_INT(((uint8_t *)b->data)[4 * MB - 1], 0x11); /* b kept its own */
  mml_buf_release(b);
  mml_buf_release(c);
  mml_pool_usage(p, &cached, &live);
  CHECK_EQ_INT(cached, 8 * MB);
  mml_buf *e;
  CHECK_OK(mml_pool_alloc(p, 2 * MB, &e, &err), err); /* 2 MiB of 4 go spare */
  mml_pool_usage(p, &cached, &live);
  CHECK_EQ_INT(cached, 6 * MB);
  CHECK_EQ_INT(mml_pool_trim(p, 4 * MB), 4 * MB); /* the spare pages go first */
  CHECK_EQ_INT(mml_pool_trim(p, 0), 0);
  mml_buf_release(e);
  mml_pool_close(p);
}

/* A buffer with room to grow in place (a batch's uint8 rows that become its float rows):
 * it holds pages for its size only; growing keeps its address and contents, takes the
 * cache's pages (so writing the new part faults nothing), counts live at once; past its
 * capacity is an error; below 1 MiB the whole capacity comes at once. */
TEST(test_grow_in_place) {
  mml_pool *p;
  mml_err err = {0};
  CHECK_OK(mml_pool_new(NULL, 0, &p, &err), err);
  const size_t MB = 1 << 20;
  mml_buf *a, *g, *s;
  CHECK_OK(mml_pool_alloc(p, 8 * MB, &a, &err), err);
  memset(a->data, 0x33, 8 * MB);
  mml_buf_release(a); /* 8 MiB of pages cached */
  CHECK_OK(mml_pool_alloc_cap(p, 2 * MB, 16 * MB, &g, &err), err);
  CHECK(mml_buf_capacity(g) >= 16 * MB);
  size_t cached, live;
  mml_pool_usage(p, &cached, &live);
  CHECK_EQ_INT(live, g->size);
  CHECK(g->size >= 2 * MB && g->size < 16 * MB);
  memset(g->data, 0x44, 2 * MB);
  void *addr = g->data;
  CHECK_OK(mml_pool_grow(g, 8 * MB, &err), err); /* its 2 MiB came from a's 8 already */
  CHECK(g->data == addr && g->size >= 8 * MB);
  CHECK_EQ_INT(((uint8_t *)g->data)[0], 0x44);
  CHECK_EQ_INT(((uint8_t *)g->data)[2 * MB - 1], 0x44);
  mml_pool_usage(p, &cached, &live);
  CHECK_EQ_INT(live, g->size);
  CHECK_EQ_INT(cached, 0); /* the cached pages moved in */
  long f0 = thread_minflt();
  memset((uint8_t *)g->data + 2 * MB, 0x55, 6 * MB);
  if (FAULTS_COUNTED) CHECK_EQ_INT(thread_minflt() - f0, 0);
  CHECK_OK(mml_pool_grow(g, 4 * MB, &err), err); /* smaller: nothing to do */
  CHECK(g->size >= 8 * MB);
  CHECK_EQ_INT(mml_pool_grow(g, mml_buf_capacity(g) + 1, &err), MML_EINVAL);
  CHECK_OK(mml_pool_grow(g, mml_buf_capacity(g), &err), err);
  mml_pool_usage(p, &cached, &live);
  CHECK_EQ_INT(live, g->size);
  mml_buf_release(g);
  mml_pool_usage(p, &cached, &live);
  CHECK_EQ_INT(live, 0);
  CHECK(cached >= 16 * MB);
  CHECK_OK(mml_pool_alloc_cap(p, 1000, 4000, &s, &err), err);
  CHECK(s->size >= 4000 && mml_buf_capacity(s) >= 4000);
  mml_buf_release(s);
  mml_pool_close(p);
}

/* Batches of varying sizes, a few alive at a time: after a warm-up the pool faults (maps,
 * zeroes) nothing, and it holds no more than the most the live buffers needed at once
 * (keeping each buffer's largest size instead grows to N x the largest request). */
TEST(test_steady_state_maps_nothing) {
  enum { D = 4, N = 160, WARM = 40 };
  const size_t MB = 1 << 20;
  mml_pool *p;
  mml_err err = {0};
  CHECK_OK(mml_pool_new(NULL, (size_t)1 << 30, &p, &err), err);
  mml_buf *ring[D] = {0};
  uint32_t x = 12345;
  size_t peak = 0, biggest = 0;
  long f0 = 0;
  for (int i = 0; i < N; i++) {
    if (i == WARM) f0 = thread_minflt();
    mml_buf_release(ring[i % D]);
    ring[i % D] = NULL;
    x = x * 1103515245u + 12345u;
    size_t n = (2 + (x >> 16) % 23) * MB; /* 2..24 MiB */
    mml_buf *b;
    CHECK_OK(mml_pool_alloc(p, n, &b, &err), err);
    memset(b->data, i, n);
    ring[i % D] = b;
    size_t cached, live;
    mml_pool_usage(p, &cached, &live);
    if (live > peak) peak = live;
    if (n > biggest) biggest = n;
  }
  long faults = thread_minflt() - f0;
  size_t cached, live;
  mml_pool_usage(p, &cached, &live);
  for (int k = 0; k < D; k++) mml_buf_release(ring[k]);
  if (FAULTS_COUNTED) CHECK(faults <= 4); /* at most a rare new mapping's header page */
  CHECK(cached + live <= peak);
  CHECK(peak < (size_t)D * biggest);
  mml_pool_close(p);
}

/* One batch far larger than the rest: its pages stay while it is within the recent
 * working set (256 large requests), then the cache is trimmed to what the recent
 * requests needed at once, and the steady state after the trim still maps nothing. */
TEST(test_trim_to_recent_working_set) {
  const size_t MB = 1 << 20;
  mml_pool *p;
  mml_err err = {0};
  CHECK_OK(mml_pool_new(NULL, (size_t)1 << 30, &p, &err), err);
  mml_buf *big;
  CHECK_OK(mml_pool_alloc(p, 160 * MB, &big, &err), err);
  memset(big->data, 3, big->size);
  mml_buf_release(big);
  size_t cached, live;
  long f0 = 0;
  for (int i = 0; i < 320; i++) {
    if (i == 200) {
      mml_pool_usage(p, &cached, &live);
      CHECK(cached >= 150 * MB); /* still within the recent working set: kept */
    }
    if (i == 300) f0 = thread_minflt();
    mml_buf *b;
    CHECK_OK(mml_pool_alloc(p, 4 * MB, &b, &err), err);
    memset(b->data, i, 4 * MB);
    mml_buf_release(b);
  }
  long faults = thread_minflt() - f0;
  mml_pool_usage(p, &cached, &live);
  CHECK_EQ_INT(live, 0);
  CHECK(cached <= 8 * MB); /* the giant's pages went */
  CHECK(cached >= 4 * MB); /* the working set's stayed */
  if (FAULTS_COUNTED) CHECK(faults <= 2);
  size_t live_peak, held_peak;
  mml_pool_peaks(p, &live_peak, &held_peak);
  CHECK_EQ_INT(live_peak, 160 * MB);
  mml_pool_close(p);
}

/* The high-water marks: the most bytes live at once, and live + cached. */
TEST(test_pool_peaks) {
  const size_t MB = 1 << 20;
  mml_pool *p;
  mml_err err = {0};
  CHECK_OK(mml_pool_new(NULL, 0, &p, &err), err);
  mml_buf *a, *b, *c;
  CHECK_OK(mml_pool_alloc(p, 4 * MB, &a, &err), err);
  CHECK_OK(mml_pool_alloc(p, 6 * MB, &b, &err), err);
  mml_buf_release(a);
  CHECK_OK(mml_pool_alloc(p, 2 * MB, &c, &err), err);
  size_t live_peak, held_peak;
  mml_pool_peaks(p, &live_peak, &held_peak);
  CHECK_EQ_INT(live_peak, 10 * MB);
  CHECK_EQ_INT(held_peak, 10 * MB); /* c took pages a had: nothing more was held */
  mml_buf_release(b);
  mml_buf_release(c);
  mml_pool_peaks(p, &live_peak, &held_peak);
  CHECK_EQ_INT(live_peak, 10 * MB);
  mml_pool_close(p);
}

/* Mapped scratch is counted process-wide: grown, freed, and its high-water mark. */
TEST(test_mapped_usage) {
  const size_t MB = 1 << 20;
  size_t now0, peak0, now, peak;
  mml_mapped_usage(&now0, &peak0);
  mml_mapped m = {0};
  CHECK_EQ_INT(mml_mapped_reserve(&m, 3 * MB), MML_OK);
  mml_mapped_usage(&now, &peak);
  CHECK_EQ_INT(now - now0, 4 * MB); /* 2 MiB pages */
  CHECK_EQ_INT(mml_mapped_reserve(&m, 9 * MB), MML_OK);
  mml_mapped_usage(&now, &peak);
  CHECK_EQ_INT(now - now0, 10 * MB);
  CHECK(peak >= now);
  mml_mapped_free(&m);
  mml_mapped_usage(&now, &peak);
  CHECK_EQ_INT(now, now0);
  CHECK(peak >= now0 + 10 * MB);
}

/* the hook's running sums (HOOK in pool.c) */
typedef struct hook_sum {
  atomic_llong live, cached, calls;
} hook_sum;
static void sum_hook(void *arg, int64_t d_live, int64_t d_cached) {
  hook_sum *s = arg;
  atomic_fetch_add(&s->live, d_live);
  atomic_fetch_add(&s->cached, d_cached);
  atomic_fetch_add(&s->calls, 1);
}

/* The hook's sums equal the pool's usage after every kind of change (small and large
 * allocations, reuse, growth in place, release, trim); mml_pool_evict frees without it. */
TEST(test_pool_hook_reports_every_change) {
  const size_t MB = 1 << 20;
  mml_pool *p;
  mml_err err = {0};
  CHECK_OK(mml_pool_new(NULL, 0, &p, &err), err);
  hook_sum s = {0};
  mml_pool_set_hook(p, sum_hook, &s);
  size_t cached, live;
#define SAME_AS_POOL()                                       \
  do {                                                       \
    mml_pool_usage(p, &cached, &live);                       \
    CHECK_EQ_INT(atomic_load(&s.live), (long long)live);     \
    CHECK_EQ_INT(atomic_load(&s.cached), (long long)cached); \
  } while (0)
  mml_buf *a, *b, *c, *d;
  CHECK_OK(mml_pool_alloc(p, 5000, &a, &err), err);
  CHECK_OK(mml_pool_alloc(p, 5 * MB, &b, &err), err);
  SAME_AS_POOL();
  mml_buf_release(a);
  mml_buf_release(b);
  SAME_AS_POOL();
  CHECK(cached > 5 * MB);
  CHECK_OK(mml_pool_alloc(p, 3 * MB, &c, &err), err); /* pages reused */
  CHECK_OK(mml_pool_alloc_cap(p, 1 * MB, 8 * MB, &d, &err), err);
  SAME_AS_POOL();
  CHECK_OK(mml_pool_grow(d, 7 * MB, &err), err);
  SAME_AS_POOL();
  mml_buf_release(c);
  mml_buf_release(d);
  SAME_AS_POOL();
  mml_pool_trim(p, 2 * MB);
  SAME_AS_POOL();
  CHECK_OK(mml_pool_alloc(p, 9000, &a, &err), err);
  mml_buf_release(a);
  SAME_AS_POOL();
  const long long calls = atomic_load(&s.calls);
  size_t before;
  mml_pool_usage(p, &before, NULL);
  CHECK(before > 0);
  size_t freed = mml_pool_evict(p, 1);
  mml_pool_usage(p, &cached, NULL);
  CHECK(freed > 0);
  CHECK_EQ_INT(before - cached, freed);
  CHECK_EQ_INT(atomic_load(&s.calls), calls); /* evict: not reported */
#undef SAME_AS_POOL
  mml_pool_close(p);
}

typedef struct hook_churn {
  mml_pool *p;
  unsigned seed;
} hook_churn;
static void *hook_churn_main(void *arg) {
  hook_churn *h = arg;
  mml_err err;
  for (int i = 0; i < 300; i++) {
    h->seed = h->seed * 1103515245u + 12345u;
    size_t n =
        (h->seed >> 8) % 3 ? 1000 + (h->seed >> 4) % 60000 : (1 << 20) + (h->seed >> 4) % (3 << 20);
    mml_buf *b;
    if (mml_pool_alloc(h->p, n, &b, &err)) return NULL;
    if (i % 50 == 0) mml_pool_trim(h->p, 4 << 20);
    mml_buf_release(b);
  }
  return NULL;
}

/* Under concurrent allocations, releases and trims the sums still match (TSan), and
 * setting the hook to NULL returns only after its calls ended. */
TEST(test_pool_hook_concurrent) {
  mml_pool *p;
  mml_err err = {0};
  CHECK_OK(mml_pool_new(NULL, 0, &p, &err), err);
  hook_sum s = {0};
  mml_pool_set_hook(p, sum_hook, &s);
  enum { N = 4 };
  hook_churn h[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    h[i].p = p;
    h[i].seed = 17 + (unsigned)i;
    CHECK_EQ_INT(pthread_create(&th[i], NULL, hook_churn_main, &h[i]), 0);
  }
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  size_t cached, live;
  mml_pool_usage(p, &cached, &live);
  CHECK_EQ_INT(live, 0);
  CHECK_EQ_INT(atomic_load(&s.live), 0);
  CHECK_EQ_INT(atomic_load(&s.cached), (long long)cached);
  mml_pool_set_hook(p, NULL, NULL);
  const long long calls = atomic_load(&s.calls);
  mml_buf *b;
  CHECK_OK(mml_pool_alloc(p, 100, &b, &err), err);
  mml_buf_release(b);
  CHECK_EQ_INT(atomic_load(&s.calls), calls); /* no call after removal */
  mml_pool_close(p);
}
