/*
 * test-loader-stress.c — max_memory under random schedules of the threaded engine (issue
 * 33), in C so that thousands of schedules run in CI time: random caps from the largest
 * batch's pages up (beside the workers' scratch reserve), random thread counts, prefetch
 * depths, windows and pixel formats (compact float32, float32-decode, uint8), padded and
 * packed batches, a consumer that sleeps at random and sometimes keeps its previous batch
 * while it asks for the next, JPEG images of several sizes, short videos (the committed
 * seed videos of the fuzz corpus) and injected decode failures (JPEGs whose header is good
 * and whose data is cut: they fail only at decode, which rewinds the planner).
 *
 * What each schedule must do (S1..S4, cited below; "the largest batch" is its pixel
 * tensors in the pool's 2 MiB pages, for packs the pages of their bound in both planes):
 *   S1. End: deliver the whole epoch, or fail with MML_ENOMEM (the explainer's "cannot
 *       hold" message), never hang.  A watchdog fails the test (naming the seed) when one
 *       schedule runs past its limit: next() has a timeout, and a thread ends the process
 *       with the seed when a schedule (its close included) runs past twice that.
 *   S2. A delivered epoch is bitwise the epoch of the same settings without a cap.
 *   S3. The pool never held more than the cap (pool_peak <= max_memory).
 *   S5. The memory ledger balances: at the epoch's end it holds exactly the pool's, the
 *       window's, the scratch's and the emissions' bytes (csrc/core/loader/loader_admit.c
 *       A6; mml_loader_check_memory), and no batch entered the consumer's queue while the
 *       engine still held a reference to its buffers (A10).
 *   S4. MML_ENOMEM only where the cap is tight: less room beside the workers' reserve than
 *       2 x (prefetch + 2) of the largest batches and 8 MiB (what today's gates may hold
 *       for the batch the consumer waits for; tests/test_memory_stress.py's bound).
 *   S6. next() does not poll and is not woken for nothing: its waits by the ledger
 *       (loader_admit.c C2, C6) stay below 100 a batch in every schedule (the summary
 *       prints the most).
 *
 * MML_STRESS_SHOW_OVER=1 prints each schedule whose memory_peak passed max_memory, and
 * MML_STRESS_SHOW_OOM=1 each out-of-memory message with its seed (to compare trees).
 * MML_STRESS_SCHEDULES (default 2000; 60 under a sanitizer) and MML_STRESS_SEED (the
 * first seed, default 1) choose the schedules; a failure prints the seed and its settings,
 * and MML_STRESS_SEED=<seed> MML_STRESS_SCHEDULES=1 runs that one alone.
 *
 * Needs the bundled tokenizer (mmloader/data/tiny-tokenizer.json, relative to tests/c, or
 * MML_TEST_TOKENIZER) and fuzz/corpus/video.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mml/loader.h"
#include "mml_fixture.h"
#include "mml_test.h"

#define SEEDS "../../fuzz/corpus/video/"
#define MIB ((int64_t)1 << 20)
enum { NLINES = 24, NSHAPES = 4, MAXB = NLINES + 2, NMANY = 12 };

static char g_shard[128], g_many[128], g_mixed[128];
static const char *g_data = g_shard; /* the shard shape_cfg reads */
/* the most encoded bytes of one many-image sample (make_many) and the most float32 pixel
 * bytes of one (shape 0's batches hold one sample each): with them the room a schedule's
 * cap leaves at least (pick), so that every sample fits alone (loader_admit.c A4) */
static int64_t g_sample_bytes, g_sample_px;
static int g_any_room; /* pick draws the room as for the ordinary samples (no A4 floor) */
static int make_many(const char *dir);
static int make_mixed(const char *dir);
static int make_dataset(const char *dir);
static mml_fixture g_fx = {"lstress", make_dataset};

static int copy_file(const char *from, const char *to, size_t keep) {
  mml_bytes b = {0};
  mml_err err;
  if (mml_read_file(from, 0, -1, &b, &err)) return -1;
  FILE *f = fopen(to, "wb");
  if (!f) return mml_bytes_free(&b), -1;
  size_t n = keep && keep < b.len ? keep : b.len;
  int ok = fwrite(b.data, 1, n, f) == n;
  fclose(f);
  mml_bytes_free(&b);
  return ok ? 0 : -1;
}

/* JPEGs of five sizes (the largest 480x360), two seed videos, and per late line a copy of
 * its last image cut to 40%: a good header, a failure at decode. */
static int write_media(const char *dir) {
  static const int sizes[5][2] = {{64, 64}, {320, 240}, {120, 400}, {480, 360}, {90, 160}};
  char p[200], q[200];
  for (int i = 0; i < 5; i++) {
    snprintf(p, sizeof p, "%s/i%d.jpg", dir, i);
    if (mml_test_write_jpeg(p, sizes[i][0], sizes[i][1], i)) return -1;
  }
  static const char *vids[2] = {"h264.mp4", "vp9.webm"};
  for (int v = 0; v < 2; v++) {
    snprintf(p, sizeof p, SEEDS "%s", vids[v]);
    snprintf(q, sizeof q, "%s/%s", dir, vids[v]);
    if (copy_file(p, q, 0)) return -1;
  }
  for (int i = 0; i < 5; i++) {
    mml_bytes b = {0};
    mml_err err;
    snprintf(p, sizeof p, "%s/i%d.jpg", dir, i);
    if (mml_read_file(p, 0, -1, &b, &err)) return -1;
    snprintf(q, sizeof q, "%s/late%d.jpg", dir, i);
    int rc = copy_file(p, q, b.len * 2 / 5);
    mml_bytes_free(&b);
    if (rc) return -1;
  }
  return 0;
}

static int is_late(int i) { return i == 2 || i == 9 || i == 10 || i == 17 || i == 22; }

/* Lines: a video every fourth (2-4 of its 6 frames), a text-only turn every seventh, else
 * 1-3 images, the last one cut on the late lines. */
static void write_line(FILE *f, int i) {
  fprintf(f, "{\"messages\":[{\"role\":\"user\",\"content\":");
  int n = i % 4 == 3 || i % 7 == 6 ? 0 : 1 + i % 3;
  if (i % 4 == 3)
    fprintf(f,
            "[{\"type\":\"video\",\"video\":\"%s\",\"nframes\":%d},"
            "{\"type\":\"text\",\"text\":\"What moves in %d?\"}]",
            (i / 4) % 2 ? "vp9.webm" : "h264.mp4", 2 + i % 3, i);
  else if (!n)
    fprintf(f, "\"Text only %d?\"", i);
  else
    fprintf(f, "\"%.*ssample %d: %.*s\"", 7 * n, "<image><image><image>", i, 5 * (i % 6),
            "word word word word word word ");
  fprintf(f, "},{\"role\":\"assistant\",\"content\":\"answer %d\"}]", i);
  if (n) {
    fprintf(f, ",\"images\":[");
    for (int j = 0; j < n; j++)
      fprintf(f, "%s\"%s%d.jpg\"", j ? "," : "", j == n - 1 && is_late(i) ? "late" : "i",
              (i + j) % 5);
    fprintf(f, "]");
  }
  fprintf(f, "}\n");
}

static int make_dataset(const char *dir) {
  if (write_media(dir)) return -1;
  snprintf(g_shard, sizeof g_shard, "%s/d.jsonl", dir);
  FILE *f = fopen(g_shard, "w");
  if (!f) return -1;
  for (int i = 0; i < NLINES; i++) write_line(f, i);
  fclose(f);
  return make_many(dir) || make_mixed(dir) ? -1 : 0;
}

/* The shapes of batches: padded in order, shuffled padded, uint8 pixels, packed. */
static void shape_cfg(mml_loader_cfg *c, const char **data, int shape) {
  memset(c, 0, sizeof *c);
  data[0] = g_data;
  c->data = data;
  c->ndata = 1;
  c->dp_size = 1;
  c->num_threads = 2;
  c->prefetch = 2;
  c->max_error_rate = 1.0;
  c->collate.pad_id = -1;
  c->collate.attention_mask = 1;
  c->pixels = MML_PIXELS_FLOAT32;
  mml_err err;
  mml_vision_preset("qwen2.5-vl", &c->vision, &err);
  c->vision.min_pixels = 28 * 28 * 4;
  c->vision.max_pixels = 28 * 28 * 96;
  c->tokenizer = g_fx.tok;
  static const int mbs[NSHAPES] = {1, 2, 3, 1};
  c->collate.micro_batch_size = mbs[shape];
  c->shuffle = shape > 0;
  c->seed = (uint64_t)(1 + 2 * shape);
  if (shape == 2) c->pixels = MML_PIXELS_UINT8;
  if (shape == 3) {
    c->collate.pack = 1;
    c->collate.pack_length = 768;
    c->collate.pad_to_multiple = 8;
  }
}

/* One epoch's batch hashes (every tensor) and its largest batch's pixels in the pool's
 * pages (2 MiB each, as the Python stress counts them). */
typedef struct epoch_out {
  uint64_t h[MAXB];
  int n;
  int64_t largest;
  int64_t px_most; /* the largest batch's pixel bytes, not rounded to pages */
  mml_status st;
  char msg[1024];
  mml_loader_stats stats;
} epoch_out;

/* the last schedule's batches and next()'s waits by the ledger (loader_admit.c C2) */
static int g_last_n;
static uint64_t g_last_waits;
static uint64_t g_last_cwaits; /* the collation thread's waits for a buffer (loader_admit.c W2) */
static uint64_t g_last_again;  /* its parked reads restarted again (loader_admit.c R6) */

static uint64_t batch_hash(const mml_batch *b, int64_t *pixel_bytes) {
  uint64_t h = 0;
  *pixel_bytes = 0;
  for (int i = 0; i < b->ntensors; i++) {
    const mml_tensor *t = &b->tensors[i];
    const size_t nb = (size_t)mml_tensor_numel(t) * mml_dtype_size(t->dtype);
    h = mml_hash_bytes(h, t->name, strlen(t->name));
    h = mml_hash_bytes(h, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    h = mml_hash_bytes(h, (const char *)t->buf->data + t->offset, nb);
    if (!strncmp(t->name, "pixel_values", 12)) *pixel_bytes += (int64_t)nb;
  }
  return h;
}

/* How the consumer behaves: it sleeps up to 4 ms after 30% of its batches, and keeps the
 * previous batch alive while it asks for the next when keep_prev. */
typedef struct consumer {
  unsigned rng;
  int keep_prev, delays;
  double timeout_s;
} consumer;

static unsigned next_rand(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return (*s >> 8) & 0xffffff;
}

/* S5: at the epoch's end, with every batch released, the loader's memory ledger holds
 * exactly what its memory is (loader_admit.c A6): within a second (the pool's last
 * changes reach it after the pool's lock), else the mismatch is the schedule's failure. */
static void ledger_settles(mml_loader *L, epoch_out *o) {
  mml_err err;
  mml_status st = MML_OK;
  for (int k = 0; k < 100 && (st = mml_loader_check_memory(L, &err)); k++) usleep(10 * 1000);
  if (!st) return;
  o->st = st;
  snprintf(o->msg, sizeof o->msg, "S5: %s", err.msg);
}

static void run_epoch(const mml_loader_cfg *c, consumer *who, epoch_out *o) {
  memset(o, 0, sizeof *o);
  mml_loader *L;
  mml_err err;
  o->st = mml_loader_new(c, &L, &err);
  if (o->st) {
    snprintf(o->msg, sizeof o->msg, "%s", err.msg);
    return;
  }
  mml_batch prev;
  memset(&prev, 0, sizeof prev);
  for (;;) {
    mml_batch b;
    memset(&b, 0, sizeof b);
    mml_status st = mml_loader_next(L, &b, who->timeout_s, &err);
    if (st == MML_EEND) break;
    if (st || o->n == MAXB) {
      o->st = st ? st : MML_EINTERNAL;
      if (st == MML_ETIMEDOUT) mml_loader_describe_wait(L, &err); /* what it waits on */
      snprintf(o->msg, sizeof o->msg, "%s", st ? err.msg : "more batches than lines");
      mml_batch_clear(&b);
      break;
    }
    int64_t px;
    o->h[o->n++] = batch_hash(&b, &px);
    if (px > o->px_most) o->px_most = px;
    px = (px + 2 * MIB - 1) / (2 * MIB) * (2 * MIB);
    if (px > o->largest) o->largest = px;
    if (who->delays && next_rand(&who->rng) % 10 < 3)
      usleep((useconds_t)(next_rand(&who->rng) % 4000));
    mml_batch_clear(&prev);
    if (who->keep_prev)
      prev = b;
    else
      mml_batch_clear(&b);
  }
  mml_batch_clear(&prev);
  if (!o->st) ledger_settles(L, o);
  mml_loader_get_stats(L, &o->stats);
  mml_loader_free(L);
}

/* ---- the watchdog (S1) ----------------------------------------------------------------- */

/* the schedule running (seed -1: none), when it started and its settings */
static pthread_mutex_t g_watch_mu = PTHREAD_MUTEX_INITIALIZER;
static long long g_sched_seed = -1, g_sched_start_ms;
static char g_sched_desc[256];
static atomic_int g_watch_stop;
static double g_limit_s = 60.0; /* next()'s timeout; the watchdog's is twice it */

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void watch_set(long long seed, long long start_ms, const char *desc) {
  pthread_mutex_lock(&g_watch_mu);
  g_sched_seed = seed;
  g_sched_start_ms = start_ms;
  snprintf(g_sched_desc, sizeof g_sched_desc, "%s", desc ? desc : "");
  pthread_mutex_unlock(&g_watch_mu);
}

static void *watchdog(void *arg) {
  (void)arg;
  while (!atomic_load(&g_watch_stop)) {
    usleep(100 * 1000);
    pthread_mutex_lock(&g_watch_mu);
    if (g_sched_seed >= 0 && now_ms() - g_sched_start_ms > (long long)(2000 * g_limit_s)) {
      fprintf(stderr,
              "  FAIL %s: schedule MML_STRESS_SEED=%lld did not end in %.0f s (a hang: close "
              "or next() past its timeout): %s\n",
              mml_test_current, g_sched_seed, 2 * g_limit_s, g_sched_desc);
      _exit(3);
    }
    pthread_mutex_unlock(&g_watch_mu);
  }
  return NULL;
}

/* ---- the schedules --------------------------------------------------------------------- */

typedef struct schedule {
  long long seed;
  int shape, keep_prev;
  int64_t cap, room;
  char desc[200];
} schedule;

/* Random settings for `seed` over shape refs (largest[shape]): a cap of the workers'
 * reserve and from 8 MiB or half the largest batch up to ten largest batches, plus up to
 * 4 MiB. */
static void pick(schedule *s, long long seed, const int64_t largest[NSHAPES], mml_loader_cfg *c,
                 const char **data, consumer *who) {
  unsigned r = (unsigned)seed * 2654435761u + 7u;
  memset(s, 0, sizeof *s);
  s->seed = seed;
  s->shape = (int)(next_rand(&r) % NSHAPES);
  shape_cfg(c, data, s->shape);
  c->num_threads = 1 + (int)(next_rand(&r) % 3);
  c->prefetch = 1 + (int)(next_rand(&r) % 4);
  if (s->shape != 2)
    c->pixels = next_rand(&r) % 10 < 7 ? MML_PIXELS_FLOAT32 : MML_PIXELS_FLOAT32_DECODE;
  static const int windows[4] = {2, 4, 8, 32};
  if (next_rand(&r) % 2) c->window = windows[next_rand(&r) % 4];
  const double u = (double)next_rand(&r) / (double)0x1000000;
  int64_t room = (int64_t)((double)largest[s->shape] * (0.5 + 9.5 * u * u));
  if (room < 8 * MIB) room = 8 * MIB;
  const int64_t alone = (s->shape == 2 ? g_sample_px / 4 : g_sample_px) + g_sample_bytes + MIB;
  if (g_data == g_many && !g_any_room && room < alone) room = alone; /* A4 */
  s->room = room;
  s->cap = c->num_threads * MML_SCRATCH_RESERVE + room + (int64_t)(next_rand(&r) % (4 * MIB));
  c->max_memory = s->cap;
  s->keep_prev = next_rand(&r) % 10 < 3;
  who->rng = r;
  who->keep_prev = s->keep_prev;
  who->delays = 1;
  who->timeout_s = g_limit_s;
  snprintf(s->desc, sizeof s->desc,
           "shape %d, threads %d, prefetch %d, window %d, pixels %d, max_memory %lld, "
           "keep_prev %d, largest batch %lld",
           s->shape, c->num_threads, c->prefetch, c->window, c->pixels, (long long)s->cap,
           s->keep_prev, (long long)largest[s->shape]);
}

/* Runs one schedule and checks S2..S4: 0 when it passed (*oom: it ended out of memory;
 * *reread: its samples read again, loader_admit.c READ AGAIN). */
/* X1: the hint to release batches (`del batch`, "release earlier batches") only where the
 * consumer holds some: with none held it frees nothing. */
static int oom_hint_fits(const char *msg) {
  if (!strstr(msg, "(0 bytes of batches the consumer holds")) return 1;
  return !strstr(msg, "del batch") && !strstr(msg, "release earlier batches");
}

static int run_schedule(long long seed, const epoch_out refs[NSHAPES],
                        const int64_t largest[NSHAPES], int *oom, uint64_t *reread, int64_t *peak,
                        int64_t *cap) {
  schedule s;
  mml_loader_cfg c;
  const char *data[1];
  consumer who;
  pick(&s, seed, largest, &c, data, &who);
  watch_set(seed, now_ms(), s.desc);
  static epoch_out o;
  run_epoch(&c, &who, &o);
  g_last_n = o.n;
  g_last_waits = o.stats.consumer_waits;
  g_last_cwaits = o.stats.collator_room_waits;
  g_last_again = o.stats.reads_restarted_again;
  watch_set(-1, 0, NULL);
  const epoch_out *ref = &refs[s.shape];
  *oom = o.st == MML_ENOMEM;
  if (*oom && getenv("MML_STRESS_SHOW_OOM")) /* which errors: compare seeds between trees */
    fprintf(stderr, "  seed %lld out of memory (%s): %s\n", seed, s.desc, o.msg);
  *reread = o.stats.samples_reread;
  *peak = o.stats.memory_peak;
  *cap = s.cap;
  const char *why = NULL;
  if (*oom && !strstr(o.msg, "cannot hold"))
    why = "out of memory without the explainer's message";
  else if (*oom && !oom_hint_fits(o.msg))
    why = "the message's hint says to release batches where the consumer holds none (X1)";
  else if (*oom && s.room >= 2 * (c.prefetch + 2) * largest[s.shape] + 8 * MIB)
    why = "out of memory where the cap is not tight (S4)";
  else if (o.st && !*oom)
    why = "failed";
  else if (!o.st && (o.n != ref->n || memcmp(o.h, ref->h, sizeof o.h)))
    why = "batches differ from the uncapped epoch (S2)";
  else if ((int64_t)o.stats.pool_peak > s.cap)
    why = "the pool held more than max_memory (S3)";
  if (!why) return 0;
  fprintf(stderr,
          "  FAIL %s: MML_STRESS_SEED=%lld: %s: %s (%d batches of %d, pool peak %zu): %s %s\n",
          mml_test_current, seed, why, s.desc, o.n, ref->n, o.stats.pool_peak,
          mml_status_name(o.st), o.msg);
  return 1;
}

static int under_sanitizer(void) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  return 1;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
  return 1;
#endif
#endif
  return 0;
}

static uint64_t skips(const mml_loader_stats *st, const char *reason) {
  for (int i = 0; i < st->nreasons; i++)
    if (!strcmp(st->reason[i], reason)) return st->reason_count[i];
  return 0;
}

/* S1..S4 over MML_STRESS_SCHEDULES random schedules from MML_STRESS_SEED. */
TEST(loader_max_memory_random_schedules_end) {
  if (mml_fixture_ready(&g_fx)) FAIL_AT("no fixture (tokenizer, dataset or seed videos)");
  const char *ns = getenv("MML_STRESS_SCHEDULES"), *s0 = getenv("MML_STRESS_SEED");
  const long long n = ns && atoll(ns) > 0 ? atoll(ns) : under_sanitizer() ? 60 : 2000;
  const long long seed0 = s0 ? atoll(s0) : 1;
  if (under_sanitizer()) g_limit_s = 180.0;
  static epoch_out refs[NSHAPES];
  int64_t largest[NSHAPES];
  for (int k = 0; k < NSHAPES; k++) {
    mml_loader_cfg c;
    const char *data[1];
    shape_cfg(&c, data, k);
    consumer who = {1, 0, 0, -1};
    run_epoch(&c, &who, &refs[k]);
    CHECK_OK(refs[k].st, refs[k]);
    CHECK(refs[k].n > 1);
    /* the five late lines fail at decode; pixel_format uint8 cannot hold the resized
     * videos (the six video lines: unsupported_video) */
    CHECK_EQ_INT(refs[k].stats.skipped, k == 2 ? 11 : 5);
    CHECK_EQ_INT(skips(&refs[k].stats, "corrupt_image"), 5);
    largest[k] = refs[k].largest;
    /* a pack's buffers may be its bound (pack_length x merge^2 rows, in both planes, float
     * rows at most: loader_place.c ld_place_new), whatever its rows */
    const int64_t bound = 2 * mml_round_2mib((int64_t)768 * 4 * 1176 * 4);
    if (k == 3 && bound > largest[k]) largest[k] = bound;
  }
  pthread_t th;
  CHECK_EQ_INT(pthread_create(&th, NULL, watchdog, NULL), 0);
  long long failed = 0, ooms = 0, rereads = 0, reread_in = 0, over = 0, wseed = -1, again = 0;
  double wmost = 0; /* the most consumer waits per batch in one schedule (C2) */
  double cmost = 0; /* the most collator waits for a buffer per batch in one schedule (W2) */
  long long cseed = -1, cwaits = 0, batches = 0;
  /* pinned first: seed 4102 (beyond CI's 2000) hung 1 run in 2 when an expansion waited
   * at the ledger's head with a read parked behind it (loader_admit.c C4, E4); 4 runs */
  for (int k = 0; k < 4 && !s0 && !under_sanitizer(); k++) {
    int oom = 0;
    uint64_t reread = 0;
    int64_t peak = 0, cap = 0;
    failed += run_schedule(4102, refs, largest, &oom, &reread, &peak, &cap);
  }
  for (long long k = 0; k < n && failed < 5; k++) {
    int oom = 0;
    uint64_t reread = 0;
    int64_t peak = 0, cap = 0;
    failed += run_schedule(seed0 + k, refs, largest, &oom, &reread, &peak, &cap);
    if (g_last_n > 0 && (double)g_last_waits / (double)g_last_n > wmost) {
      wmost = (double)g_last_waits / (double)g_last_n;
      wseed = seed0 + k;
    }
    if (g_last_n > 0 && (double)g_last_cwaits / (double)g_last_n > cmost) {
      cmost = (double)g_last_cwaits / (double)g_last_n;
      cseed = seed0 + k;
    }
    cwaits += (long long)g_last_cwaits;
    batches += g_last_n;
    if (peak > cap) {
      over++;
      if (getenv("MML_STRESS_SHOW_OVER"))
        fprintf(stderr, "  seed %lld: memory peak %lld > max_memory %lld (%+.1f%%)\n", seed0 + k,
                (long long)peak, (long long)cap, 100.0 * (double)(peak - cap) / (double)cap);
    }
    ooms += oom;
    rereads += (long long)reread;
    reread_in += reread > 0;
    again += (long long)g_last_again;
  }
  atomic_store(&g_watch_stop, 1);
  pthread_join(th, NULL);
  fprintf(stderr,
          "  %lld schedules from seed %lld: %lld out of memory, %lld failed; %lld samples read "
          "again in %lld schedules (%lld parked reads restarted again, R6); %lld held more "
          "than max_memory in all (memory_peak)\n",
          n, seed0, ooms, failed, rereads, reread_in, again, over);
  fprintf(stderr, "  next() waited at most %.1f times per batch (seed %lld)\n", wmost, wseed);
  fprintf(stderr,
          "  the collation thread waited for a buffer %.2f times per batch in all, at most "
          "%.1f (seed %lld)\n",
          batches ? (double)cwaits / (double)batches : 0.0, cmost, cseed);
  CHECK_EQ_INT(failed, 0);
  if (n >= 20) CHECK(ooms < n); /* most caps hold an epoch */
  /* S6: next() waits by the ledger's consumer count without a busy loop (loader_admit.c
   * C2) and is woken only where its answer can change (C6, ledger.c L14): at most 7 and 15
   * waits a batch in seeds 1-2000 (the most in schedules that ran out of memory after a
   * batch or two), where waking it at every end of work gave 48-63 and next() poking its
   * own count looped ~10^6 times a batch.  The bound is for loops; the wakes themselves
   * are counted by ledger_consumer_woken_only_where_deadlock_rule_decides. */
  CHECK(wmost < 100);
}

/* A schedule the random ones found hanging (S1), kept as it was: a packed epoch, one
 * worker, float32-decode, room for little more than the head pack's buffer beside the
 * reserve.  The head pack's samples were all taken, the sample that ends it (the next
 * pack's first) was planned but its pack could get no buffer before more samples were
 * read, and no read fit: next() waited forever (in most of ten runs).  It must end: the
 * whole epoch, bitwise, or MML_ENOMEM naming what is held. */
TEST(loader_max_memory_stuck_read_ends) {
  if (mml_fixture_ready(&g_fx)) FAIL_AT("no fixture (tokenizer, dataset or seed videos)");
  mml_loader_cfg c;
  const char *data[1];
  consumer who = {1, 0, 0, -1};
  static epoch_out ref, o;
  shape_cfg(&c, data, 3);
  run_epoch(&c, &who, &ref);
  CHECK_OK(ref.st, ref);
  c.num_threads = 1;
  c.prefetch = 4;
  c.pixels = MML_PIXELS_FLOAT32_DECODE;
  c.max_memory = 25730142;
  int ooms = 0;
  for (int k = 0; k < 10; k++) { /* it hung in most runs, depending on timing */
    who = (consumer){7u + (unsigned)k, k % 2, 1, g_limit_s};
    run_epoch(&c, &who, &o);
    if (o.st == MML_ENOMEM) {
      CHECK(strstr(o.msg, "cannot hold") != NULL);
      CHECK(oom_hint_fits(o.msg));
      if (!ooms++) fprintf(stderr, "  %s\n", o.msg);
      continue;
    }
    CHECK_OK(o.st, o);
    CHECK_EQ_INT(o.n, ref.n);
    CHECK(!memcmp(o.h, ref.h, sizeof o.h));
  }
  fprintf(stderr, "  10 runs: %d out of memory, the rest whole\n", ooms);
}

/* The engine has read ahead and the output queue is full (at most ~5 s: not a check). */
static void wait_read_ahead(mml_loader *L, int prefetch) {
  for (int k = 0; k < 500; k++) {
    mml_loader_stats st;
    mml_loader_get_stats(L, &st);
    if (!st.in_flight && st.queue_depth >= prefetch) return;
    usleep(10 * 1000);
  }
}

/* loader_admit.c A11: a seek abandons the plan of the samples read ahead (planned, their
 * decode not begun, holding their images' bytes); their slots are emptied, and what they
 * held goes back at once (into the spares, a cache), not when each slot is used again.
 * After the seek only one sample is read (seek_ahead), so most slots stay empty: the
 * ledger's check (A6, with A11's) fails while any of them holds media bytes -- before the
 * fix "slots that no work holds ... hold 905824 bytes of media".  The batch after the
 * seek is bitwise the first batch (A2). */
TEST(loader_max_memory_seek_gives_bytes_back) {
  if (mml_fixture_ready(&g_fx)) FAIL_AT("no fixture (tokenizer, dataset or seed videos)");
  mml_loader_cfg c;
  const char *data[1];
  shape_cfg(&c, data, 0); /* padded, in order, one sample a batch */
  c.num_threads = 2;
  c.prefetch = 1;
  c.window = 8;
  c.max_memory = 512 * MIB;
  mml_loader *L;
  mml_err err;
  CHECK_OK(mml_loader_new(&c, &L, &err), err);
  mml_batch b;
  memset(&b, 0, sizeof b);
  CHECK_OK(mml_loader_next(L, &b, 60.0, &err), err);
  int64_t px;
  const uint64_t first = batch_hash(&b, &px);
  mml_batch_clear(&b);
  wait_read_ahead(L, c.prefetch);
  mml_loader_stats st;
  mml_loader_get_stats(L, &st);
  const int64_t before = st.window_bytes;
  const mml_cursor start = {0, 0, 0};
  CHECK_OK(mml_loader_seek_ahead(L, &start, 1, &err), err);
  memset(&b, 0, sizeof b);
  CHECK_OK(mml_loader_next(L, &b, 60.0, &err), err);
  CHECK(batch_hash(&b, &px) == first);
  mml_batch_clear(&b);
  mml_status cs = MML_OK;
  for (int k = 0; k < 100 && (cs = mml_loader_check_memory(L, &err)); k++) usleep(10 * 1000);
  CHECK_OK(cs, err);
  mml_loader_get_stats(L, &st);
  fprintf(stderr, "  window bytes %lld before the seek, %lld after (spares included)\n",
          (long long)before, (long long)st.window_bytes);
  CHECK(before > 0);
  mml_loader_free(L);
}

/* ---- parked reads asked back again (loader_admit.c R6) --------------------------------- */

/* Samples of four to six images, most of them large files that resize to few rows: their
 * encoded bytes, not their pixels, are what max_memory must hold, so reads park between
 * a sample's images and later heads ask the parked reads back, more than once. */
static int make_many(const char *dir) {
  static const int big[3][2] = {{1600, 1200}, {1200, 1600}, {1400, 1050}};
  char p[200];
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s/b%d.jpg", dir, i);
    if (mml_test_write_jpeg(p, big[i][0], big[i][1], 7 + i)) return -1;
  }
  snprintf(g_many, sizeof g_many, "%s/m.jsonl", dir);
  FILE *f = fopen(g_many, "w");
  if (!f) return -1;
  for (int i = 0; i < NMANY; i++) {
    const int n = 4 + i % 3;
    fprintf(f,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"%.*smany %d\"},"
            "{\"role\":\"assistant\",\"content\":\"answer %d\"}],\"images\":[",
            7 * n, "<image><image><image><image><image><image>", i, i);
    int64_t bytes = 0;
    for (int j = 0; j < n; j++) {
      const char *name = (i + j) % 4 == 3 ? "i" : "b";
      fprintf(f, "%s\"%s%d.jpg\"", j ? "," : "", name, (i + j) % 3);
      struct stat st;
      snprintf(p, sizeof p, "%s/%s%d.jpg", dir, name, (i + j) % 3);
      if (stat(p, &st)) {
        fclose(f);
        return -1;
      }
      bytes += (int64_t)st.st_size;
    }
    if (bytes > g_sample_bytes) g_sample_bytes = bytes;
    fprintf(f, "]}\n");
  }
  fclose(f);
  return 0;
}

/* R6, T5 and T6 (loader_admit.c) over random schedules of the many-image samples
 * (make_many), their caps leaving room for each sample alone (A4: pick): every schedule
 * ends (S1) and delivers the uncapped epoch bitwise (S2), or fails with the explainer's
 * message where the cap is tight (S4); the summary counts the parked reads restarted
 * again.  Before T6, a ticket's charge at the ledger's head and a parked read behind it
 * that kept its bytes (asked back a second time by that head) waited for next()'s
 * timeout: the pinned seed 32 below, and MML_STRESS_SEED=159 (1 run in 4).
 * MML_STRESS_SCHEDULES / MML_STRESS_SEED as above (default 60 schedules, ~30 s plain, beside
 * the ordinary test's 2000 in CI's time; 8 under a sanitizer). */
TEST(loader_max_memory_parked_reads_asked_again_end) {
  if (mml_fixture_ready(&g_fx)) FAIL_AT("no fixture (tokenizer, dataset or seed videos)");
  const char *ns = getenv("MML_STRESS_SCHEDULES"), *s0 = getenv("MML_STRESS_SEED");
  const long long n = ns && atoll(ns) > 0 ? atoll(ns) : under_sanitizer() ? 8 : 60;
  const long long seed0 = s0 ? atoll(s0) : 1;
  if (under_sanitizer()) g_limit_s = 180.0;
  g_data = g_many;
  static epoch_out refs[NSHAPES];
  int64_t largest[NSHAPES];
  for (int k = 0; k < NSHAPES; k++) {
    mml_loader_cfg c;
    const char *data[1];
    shape_cfg(&c, data, k);
    consumer who = {1, 0, 0, -1};
    run_epoch(&c, &who, &refs[k]);
    CHECK_OK(refs[k].st, refs[k]);
    CHECK(refs[k].n > 1);
    CHECK_EQ_INT(refs[k].stats.skipped, 0);
    largest[k] = refs[k].largest;
    const int64_t bound = 2 * mml_round_2mib((int64_t)768 * 4 * 1176 * 4);
    if (k == 3 && bound > largest[k]) largest[k] = bound;
  }
  g_sample_px = refs[0].px_most; /* shape 0: one sample a batch */
  CHECK(g_sample_px > 0 && g_sample_bytes > 0);
  pthread_t th;
  CHECK_EQ_INT(pthread_create(&th, NULL, watchdog, NULL), 0);
  long long failed = 0, ooms = 0, again = 0, again_in = 0;
  /* first seed 32 drawn without the floor: its cap (44232087) leaves room for its first
   * samples, not for the largest; it ends at the first batch, where before T6 its ticket
   * head and a parked read that kept its bytes hung (3 of 3 runs on main f9b2444) */
  int oom32 = 0;
  uint64_t reread32 = 0;
  int64_t peak32 = 0, cap32 = 0;
  g_any_room = 1;
  failed += run_schedule(32, refs, largest, &oom32, &reread32, &peak32, &cap32);
  g_any_room = 0;
  for (long long k = 0; k < n && failed < 5; k++) {
    int oom = 0;
    uint64_t reread = 0;
    int64_t peak = 0, cap = 0;
    failed += run_schedule(seed0 + k, refs, largest, &oom, &reread, &peak, &cap);
    ooms += oom;
    again += (long long)g_last_again;
    again_in += g_last_again > 0;
  }
  atomic_store(&g_watch_stop, 1);
  pthread_join(th, NULL);
  fprintf(stderr,
          "  %lld schedules from seed %lld: %lld out of memory, %lld failed; %lld parked reads "
          "restarted again in %lld schedules\n",
          n, seed0, ooms, failed, again, again_in);
  CHECK_EQ_INT(failed, 0);
}

/* ---- videos kept open ahead of a read at the head (loader_admit.c C7) ------------------- */

/* Every fourth line from line 1 a sample of six of make_many's large JPEGs, the others
 * short videos: while a many-image sample's read waits for room, the video samples after
 * it are read, planned and keep their videos open. */
static int make_mixed(const char *dir) {
  snprintf(g_mixed, sizeof g_mixed, "%s/x.jsonl", dir);
  FILE *f = fopen(g_mixed, "w");
  if (!f) return -1;
  for (int i = 0; i < NMANY; i++) {
    if (i % 4 != 1) {
      fprintf(f,
              "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"video\",\"video\":"
              "\"%s\",\"nframes\":%d},{\"type\":\"text\",\"text\":\"What moves in %d?\"}]},"
              "{\"role\":\"assistant\",\"content\":\"answer %d\"}]}\n",
              i % 2 ? "vp9.webm" : "h264.mp4", 2 + i % 3, i, i);
      continue;
    }
    fprintf(f,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"%.*smixed %d\"},"
            "{\"role\":\"assistant\",\"content\":\"answer %d\"}],\"images\":[",
            7 * 6, "<image><image><image><image><image><image>", i, i);
    for (int j = 0; j < 6; j++) fprintf(f, "%s\"b%d.jpg\"", j ? "," : "", (i + j) % 3);
    fprintf(f, "]}\n");
  }
  fclose(f);
  return 0;
}

/* C7, C8 (loader_admit.c): a charge waiting at the ledger's head gets the videos kept open
 * after it given back (make-way runs for every charge at the head).  make_mixed's lines in
 * order, one sample a batch, images resized to the fewest pixels (their encoded bytes fill
 * the cap), three workers, the consumer keeping its previous batch, max_object_bytes two
 * large JPEGs (the read gate's estimate before a sample is counted) and 32 caps in 128 KiB
 * steps from the least one: a many-image sample's reads or its decode's re-read wait while
 * the video samples after it keep their videos open.  Each run ends (S1): the epoch bitwise
 * (S2) or the explainer's error.  With make-way only for a ticket's charge, next() declared
 * those videos as coming back (C7), nothing gave them back, and 18 of the 32 runs waited
 * past next()'s 5 s timeout ("waiting on sample x.jsonl:2: being decoded"). */
TEST(loader_max_memory_videos_ahead_make_way_end) {
  if (mml_fixture_ready(&g_fx)) FAIL_AT("no fixture (tokenizer, dataset or seed videos)");
  mml_loader_cfg c;
  const char *data[1];
  g_data = g_mixed;
  shape_cfg(&c, data, 0);
  c.vision.max_pixels = c.vision.min_pixels; /* encoded bytes, not pixels, fill the cap */
  static epoch_out ref, o;
  consumer who = {1, 0, 0, -1};
  run_epoch(&c, &who, &ref);
  CHECK_OK(ref.st, ref);
  CHECK(ref.n == NMANY);
  struct stat st;
  char p[200];
  snprintf(p, sizeof p, "%s/b0.jpg", g_fx.dir);
  CHECK_EQ_INT(stat(p, &st), 0);
  c.num_threads = 3;
  c.prefetch = 1;
  c.window = 8;
  c.max_object_bytes = (int64_t)st.st_size * 2;
  int ooms = 0, whole = 0, hung = 0;
  const char *ns = getenv("MML_STRESS_SCHEDULES");
  const int n = ns && atoi(ns) > 0 ? atoi(ns) : under_sanitizer() ? 8 : 32;
  for (int k = 0; k < n; k++) {
    c.max_memory = 3 * MML_SCRATCH_RESERVE + 8 * MIB + (int64_t)k * (MIB / 8);
    who = (consumer){7u + (unsigned)k, 1, 0, under_sanitizer() ? 60.0 : 5.0};
    run_epoch(&c, &who, &o);
    if (o.st == MML_ENOMEM && strstr(o.msg, "cannot hold")) {
      if (getenv("MML_STRESS_SHOW_OOM"))
        fprintf(stderr, "  max_memory %lld: %s\n", (long long)c.max_memory, o.msg);
      ooms++;
      continue;
    }
    if (o.st == MML_ETIMEDOUT) {
      hung++;
      fprintf(stderr, "  max_memory %lld: %s\n", (long long)c.max_memory, o.msg);
      continue;
    }
    CHECK_OK(o.st, o);
    CHECK_EQ_INT(o.n, ref.n);
    CHECK(!memcmp(o.h, ref.h, sizeof o.h));
    whole++;
  }
  fprintf(stderr, "  %d caps: %d whole, %d out of memory, %d timed out\n", n, whole, ooms, hung);
  CHECK_EQ_INT(hung, 0);
}
