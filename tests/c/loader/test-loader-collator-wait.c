/*
 * test-loader-collator-wait.c — the collation thread's wait for a batch's buffer under
 * max_memory (csrc/core/loader/loader_admit.c W2), with its premise made certain.
 *
 * The epoch: one 480x360 JPEG a sample, two samples a padded batch, float rows written at
 * decode (no expansion at emission, no decoder scratch beyond the worker's reserve), so
 * that every batch's pixel buffer is the same B bytes and a read asks only for its own
 * bytes.  max_memory is the worker's reserve and 3/2 B: the batch the consumer holds and
 * the reads fit, the next batch's buffer does not.  So while the consumer holds a batch
 * and is not in next(), the next batch's ticket charge waits in the ledger (T1) and the
 * collation thread waits for it (stats collator_room_waits), where nothing but the
 * consumer can end the wait:
 *   CW1. Its wait is no poll: while nothing changes it is not woken (its count stays).
 *   CW2. The release of the held batch ends it: the next batch is queued without the
 *        consumer asking.  Three wakes each end it: the ticket's grant (ticket_wake), room
 *        back (ld_room_wake) and the worker's events (a read parked behind the ticket runs
 *        once the grant moves the ledger's change count), so only losing all three hangs.
 *   CW3. close() ends it (stop_threads' ld_coll_wake_locked): close returns.
 * A lost wake is a hang here: CW2 and CW3 wait at most LIMIT_S seconds (a bound on a hang,
 * not a timing) and name the wake that did not come.  Without stop_threads' poke close()
 * hangs (CW3); without ld_coll_room_wake_locked's the first batch never comes; a wait
 * bounded at 5 ms looks ~70 times in CW1's 0.5 s.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "mml/loader.h"
#include "mml_fixture.h"
#include "mml_test.h"

#define MIB ((int64_t)1 << 20)
enum { NLINES = 12, LIMIT_S = 20 };

static char g_shard[128];

static int make_dataset(const char *dir) {
  char p[128];
  snprintf(p, sizeof p, "%s/img.jpg", dir);
  if (mml_test_write_jpeg(p, 480, 360, 3)) return -1;
  snprintf(g_shard, sizeof g_shard, "%s/d.jsonl", dir);
  FILE *f = fopen(g_shard, "w");
  if (!f) return -1;
  for (int i = 0; i < NLINES; i++)
    fprintf(f,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"<image>sample %d\"},"
            "{\"role\":\"assistant\",\"content\":\"answer %d\"}],\"images\":[\"img.jpg\"]}\n",
            i, i);
  fclose(f);
  return 0;
}

static mml_fixture g_fx = {"lcollwait", make_dataset};

static void cfg_of(mml_loader_cfg *c, const char **data) {
  memset(c, 0, sizeof *c);
  data[0] = g_shard;
  c->data = data;
  c->ndata = 1;
  c->dp_size = 1;
  c->num_threads = 1;
  c->prefetch = 2;
  c->collate.pad_id = -1;
  c->collate.attention_mask = 1;
  c->collate.micro_batch_size = 2;
  c->pixels = MML_PIXELS_FLOAT32_DECODE;
  mml_err err;
  mml_vision_preset("qwen2.5-vl", &c->vision, &err);
  c->vision.min_pixels = 28 * 28 * 4;
  c->vision.max_pixels = 28 * 28 * 256; /* 480x360 near as it is: an 8 MiB buffer */
  c->tokenizer = g_fx.tok;
}

/* Bytes of a batch's pixel tensors. */
static int64_t pixel_bytes(const mml_batch *b) {
  int64_t n = 0;
  for (int i = 0; i < b->ntensors; i++)
    if (!strncmp(b->tensors[i].name, "pixel_values", 12))
      n += mml_tensor_numel(&b->tensors[i]) * (int64_t)mml_dtype_size(b->tensors[i].dtype);
  return n;
}

static mml_loader_stats stats_of(mml_loader *L) {
  mml_loader_stats s;
  mml_loader_get_stats(L, &s);
  return s;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Polls (the test's, every 1 ms) until the collator's waits pass `than` or the output
 * queue holds `depth` batches (depth 0: not asked), at most LIMIT_S s; 1 when it did. */
static int until_stats(mml_loader *L, uint64_t than, int depth) {
  for (double t0 = now_s(); now_s() - t0 < LIMIT_S; usleep(1000)) {
    const mml_loader_stats s = stats_of(L);
    if (depth ? s.queue_depth >= depth : s.collator_room_waits > than) return 1;
  }
  return 0;
}

typedef struct closer {
  mml_loader *L;
  atomic_int done;
} closer;

static void *close_main(void *arg) {
  closer *c = arg;
  mml_loader_close(c->L);
  atomic_store(&c->done, 1);
  return NULL;
}

/* CW3: close() from another thread returns within LIMIT_S s; a hang ends the process (the
 * thread cannot be joined), naming the wake that did not come. */
static void close_ends_the_wait(mml_loader *L) {
  closer c = {L, 0};
  pthread_t th;
  const double t0 = now_s();
  if (pthread_create(&th, NULL, close_main, &c)) return;
  while (!atomic_load(&c.done) && now_s() - t0 < LIMIT_S) usleep(1000);
  if (!atomic_load(&c.done)) {
    fprintf(stderr, "  FAIL %s: close() did not end the collator's wait for room in %d s\n",
            mml_test_current, LIMIT_S);
    _exit(3);
  }
  pthread_join(th, NULL);
  fprintf(stderr, "  close() with the collator waiting: %.3f s\n", now_s() - t0);
}

TEST(loader_max_memory_collator_wait_ends) {
  if (mml_fixture_ready(&g_fx)) FAIL_AT("no fixture (tokenizer or dataset)");
  mml_loader_cfg c;
  const char *data[1];
  cfg_of(&c, data);
  mml_loader *L;
  mml_err err;
  mml_batch b;
  memset(&b, 0, sizeof b);
  CHECK_OK(mml_loader_new(&c, &L, &err), err); /* B: one batch's pixels, in 2 MiB pages */
  CHECK_OK(mml_loader_next(L, &b, LIMIT_S, &err), err);
  const int64_t B = (pixel_bytes(&b) + 2 * MIB - 1) / (2 * MIB) * (2 * MIB);
  mml_batch_clear(&b);
  mml_loader_free(L);
  CHECK(B / 2 * 3 >= 8 * MIB); /* the least max_memory beside the reserve (ECONFIG) */
  c.max_memory = c.num_threads * MML_SCRATCH_RESERVE + B + B / 2;
  CHECK_OK(mml_loader_new(&c, &L, &err), err);
  CHECK_OK(mml_loader_next(L, &b, LIMIT_S, &err), err); /* held from here on */
  if (!until_stats(L, 0, 0)) FAIL_AT("the premise: no collator wait with a batch held");
  usleep(200 * 1000); /* the worker does what it can meanwhile */
  const uint64_t w1 = stats_of(L).collator_room_waits;
  usleep(500 * 1000);
  const uint64_t w2 = stats_of(L).collator_room_waits;
  fprintf(stderr, "  B %lld, max_memory %lld: collator waits %llu, then %llu\n", (long long)B,
          (long long)c.max_memory, (unsigned long long)w1, (unsigned long long)(w2 - w1));
  CHECK(w2 - w1 <= 1); /* CW1: a 5 ms bound looked ~100 times */
  CHECK_EQ_INT(stats_of(L).queue_depth, 0);
  const double t0 = now_s();
  mml_batch_clear(&b); /* CW2: the next batch is built without next() */
  if (!until_stats(L, 0, 1)) FAIL_AT("the release of the held batch did not end the wait");
  fprintf(stderr, "  the next batch queued %.3f s after the release\n", now_s() - t0);
  /* it holds B for the consumer now: the batch after it waits, and close ends that wait */
  if (!until_stats(L, w2, 0)) FAIL_AT("no collator wait with a batch queued");
  usleep(200 * 1000); /* the worker does what it can meanwhile */
  const uint64_t w3 = stats_of(L).collator_room_waits;
  usleep(500 * 1000);
  const uint64_t w4 = stats_of(L).collator_room_waits;
  fprintf(stderr, "  collator waits %llu from the release on (the worker's events), then %llu\n",
          (unsigned long long)(w3 - w2), (unsigned long long)(w4 - w3));
  CHECK(w4 - w3 <= 1); /* CW1 again, with the batch queued */
  close_ends_the_wait(L);
  CHECK(stats_of(L).collator_room_waits - w4 <= 1); /* CW3: woken once, then it stopped */
  mml_loader_free(L);
}
