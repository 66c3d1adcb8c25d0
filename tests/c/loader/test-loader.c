/*
 * test-loader.c — the threaded engine end to end on a small JSONL + JPEG dataset written
 * here: batches are identical whatever the thread count, prefetch and window; resuming
 * from any delivered cursor reproduces the rest; seeking and freeing a busy loader neither
 * hangs nor leaks; skipped samples keep every rank's batch count.  Run under TSan too.
 *
 * Needs the bundled tokenizer (mmloader/data/tiny-tokenizer.json, relative to tests/c, or
 * MML_TEST_TOKENIZER).
 */
#include <stdio.h>

#include "mml/loader.h"
#include "mml_fixture.h"
#include "mml_test.h"

static char g_shard[128];
static int make_dataset(const char *dir);
/* the tokenizer and the dataset every loader test reads (mml_fixture.h) */
static mml_fixture g_fx = {"loader", make_dataset};

/* 37 lines: mostly good (0-2 images), a malformed line, a missing image. */
static int make_dataset(const char *dir) {
  char p[160];
  for (int i = 0; i < 5; i++) {
    snprintf(p, sizeof p, "%s/img%d.jpg", dir, i);
    if (mml_test_write_jpeg(p, 40 + 23 * i, 60 + 11 * i, i)) return -1;
  }
  snprintf(g_shard, sizeof g_shard, "%s/data.jsonl", dir);
  FILE *f = fopen(g_shard, "w");
  if (!f) return -1;
  for (int i = 0; i < 37; i++) {
    if (i == 7) {
      fprintf(f, "{\"messages\": [oops\n");
      continue;
    }
    if (i == 20) {
      fprintf(f,
              "{\"messages\":[{\"role\":\"user\",\"content\":\"<image>look %d\"},"
              "{\"role\":\"assistant\",\"content\":\"nothing\"}],\"images\":[\"gone.jpg\"]}\n",
              i);
      continue;
    }
    int k = i % 3;
    fprintf(f,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"%s%sQuestion number %d?\"},"
            "{\"role\":\"assistant\",\"content\":\"Answer %d is %s.\"}]",
            k > 0 ? "<image>" : "", k > 1 ? "<image>" : "", i, i * 7, i % 2 ? "odd" : "even");
    if (k) {
      fprintf(f, ",\"images\":[\"img%d.jpg\"", i % 5);
      if (k > 1) fprintf(f, ",\"img%d.jpg\"", (i + 2) % 5);
      fprintf(f, "]");
    }
    fprintf(f, "}\n");
  }
  fclose(f);
  return 0;
}

static void base_cfg(mml_loader_cfg *c, const char **data) {
  memset(c, 0, sizeof *c);
  data[0] = g_shard;
  c->data = data;
  c->ndata = 1;
  c->shuffle = 1;
  c->seed = 42;
  c->dp_rank = 0;
  c->dp_size = 1;
  c->num_threads = 2;
  c->prefetch = 2;
  c->max_error_rate = 1.0;
  c->collate.micro_batch_size = 3;
  c->collate.pad_id = -1;
  c->collate.attention_mask = 1;
  c->pixels = MML_PIXELS_FLOAT32; /* the public default (options.c) */
  mml_err err;
  mml_vision_preset("qwen2.5-vl", &c->vision, &err);
  c->vision.min_pixels = 28 * 28 * 4;
  c->vision.max_pixels = 28 * 28 * 16;
  c->tokenizer = g_fx.tok;
}

static uint64_t batch_hash(const mml_batch *b) {
  uint64_t h = 0;
  for (int i = 0; i < b->ntensors; i++) {
    const mml_tensor *t = &b->tensors[i];
    h = mml_hash_bytes(h, t->name, strlen(t->name));
    h = mml_hash_bytes(h, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    h = mml_hash_bytes(h, (const char *)t->buf->data + t->offset,
                       (size_t)mml_tensor_numel(t) * mml_dtype_size(t->dtype));
  }
  return h;
}

/* Reads n items (a batch hash, or 1 for an epoch end) into out. */
static int take(mml_loader *L, uint64_t *out, int n, mml_cursor *cursors) {
  mml_err err;
  for (int i = 0; i < n; i++) {
    mml_batch b;
    memset(&b, 0, sizeof b);
    mml_status st = mml_loader_next(L, &b, -1, &err);
    if (st == MML_EEND) {
      out[i] = 1;
    } else if (st == MML_OK) {
      out[i] = batch_hash(&b);
      mml_batch_clear(&b);
    } else {
      fprintf(stderr, "next: %s: %s\n", mml_status_name(st), err.msg);
      return -1;
    }
    if (cursors) cursors[i] = mml_loader_cursor(L);
  }
  return 0;
}

enum { NITEMS = 40 }; /* 12 batches per epoch + end markers: over three epochs */

TEST(test_same_output_any_threads) {
  if (mml_fixture_ready(&g_fx)) FAIL_AT("no fixture (tokenizer or dataset)");
  const char *data[1];
  mml_loader_cfg c;
  uint64_t ref[NITEMS], got[NITEMS];
  int configs[][3] = {{1, 1, 0}, {4, 3, 0}, {3, 1, 4}, {2, 5, 64}, {8, 1, 0}, {9, 4, 30}};
  for (size_t k = 0; k < sizeof configs / sizeof *configs; k++) {
    base_cfg(&c, data);
    c.num_threads = configs[k][0];
    c.prefetch = configs[k][1];
    c.window = configs[k][2];
    mml_loader *L;
    mml_err err;
    CHECK_OK(mml_loader_new(&c, &L, &err), err);
    CHECK_EQ_INT(mml_loader_batches_per_epoch(L), 12);
    int rc = take(L, k ? got : ref, NITEMS, NULL);
    mml_loader_stats st;
    mml_loader_get_stats(L, &st);
    mml_loader_free(L);
    CHECK_EQ_INT(rc, 0);
    CHECK(st.skipped >= 2);
    if (k)
      for (int i = 0; i < NITEMS; i++)
        if (got[i] != ref[i]) FAIL_AT("config %zu differs at item %d", k, i);
  }
  CHECK_EQ_INT(ref[12], 1); /* epoch end after 12 batches */
  CHECK_EQ_INT(ref[25], 1);
  int differ = 0;
  for (int i = 0; i < 12; i++) differ += ref[i] != ref[13 + i];
  CHECK(differ > 0); /* epochs reshuffle */
}

TEST(test_resume_anywhere) {
  if (mml_fixture_ready(&g_fx)) FAIL_AT("no fixture (tokenizer or dataset)");
  const char *data[1];
  mml_loader_cfg c;
  base_cfg(&c, data);
  uint64_t ref[NITEMS];
  mml_cursor cur[NITEMS];
  mml_loader *L;
  mml_err err;
  CHECK_OK(mml_loader_new(&c, &L, &err), err);
  CHECK_EQ_INT(take(L, ref, NITEMS, cur), 0);
  mml_loader_free(L);
  int cuts[] = {0, 1, 5, 11, 12, 13, 20, 26};
  for (size_t k = 0; k < sizeof cuts / sizeof *cuts; k++) {
    int cut = cuts[k];
    c.num_threads = 1 + (int)(k % 3);
    CHECK_OK(mml_loader_new(&c, &L, &err), err);
    if (cut > 0) CHECK_OK(mml_loader_seek(L, &cur[cut - 1], &err), err);
    uint64_t got[NITEMS];
    CHECK_EQ_INT(take(L, got, NITEMS - cut - 1, NULL), 0);
    for (int i = 0; i < NITEMS - cut - 1; i++)
      if (got[i] != ref[cut + i]) FAIL_AT("cut %d: item %d differs", cut, cut + i);
    mml_loader_free(L);
  }
}

TEST(test_seek_and_free_while_busy) {
  if (mml_fixture_ready(&g_fx)) FAIL_AT("no fixture (tokenizer or dataset)");
  const char *data[1];
  mml_loader_cfg c;
  base_cfg(&c, data);
  c.prefetch = 1;
  mml_err err;
  for (int round = 0; round < 8; round++) {
    c.num_threads = round % 2 ? 8 : 4; /* 3 and 2 collator instances */
    mml_loader *L;
    CHECK_OK(mml_loader_new(&c, &L, &err), err);
    uint64_t h[3];
    CHECK_EQ_INT(take(L, h, 3, NULL), 0);
    for (int s = 0; s < round; s++) {
      mml_cursor cur = {s % 2, (s * 5) % 30, (s * 5) % 30 / 3};
      CHECK_OK(mml_loader_seek(L, &cur, &err), err);
      CHECK_EQ_INT(take(L, h, 1, NULL), 0);
    }
    mml_loader_free(L); /* threads busy, queue full */
  }
  mml_loader *L;
  CHECK_OK(mml_loader_new(&c, &L, &err), err);
  mml_loader_close(L);
  mml_batch b;
  CHECK(mml_loader_next(L, &b, 0.01, &err) == MML_ECLOSED);
  mml_loader_free(L);
}

TEST(test_ranks_equal_batches_despite_skips) {
  if (mml_fixture_ready(&g_fx)) FAIL_AT("no fixture (tokenizer or dataset)");
  const char *data[1];
  mml_loader_cfg c;
  base_cfg(&c, data);
  c.dp_size = 2;
  c.collate.micro_batch_size = 4;
  for (int r = 0; r < 2; r++) {
    c.dp_rank = r;
    mml_loader *L;
    mml_err err;
    CHECK_OK(mml_loader_new(&c, &L, &err), err);
    CHECK_EQ_INT(mml_loader_samples_per_rank(L), 18);
    int n = 0;
    for (;;) {
      mml_batch b;
      memset(&b, 0, sizeof b);
      mml_status st = mml_loader_next(L, &b, -1, &err);
      if (st == MML_EEND) break;
      CHECK_OK(st, err);
      CHECK_EQ_INT(b.nsamples, 4);
      mml_batch_clear(&b);
      n++;
    }
    CHECK_EQ_INT(n, 4);
    mml_loader_free(L);
  }
}

TEST(loader_bad_config) {
  if (mml_fixture_ready(&g_fx)) FAIL_AT("no fixture (tokenizer or dataset)");
  const char *data[1];
  mml_loader_cfg c;
  mml_loader *L = NULL;
  mml_err err;
  base_cfg(&c, data);
  c.collate.micro_batch_size = 100;
  CHECK(mml_loader_new(&c, &L, &err) == MML_ECONFIG);
  base_cfg(&c, data);
  c.num_threads = 0;
  CHECK(mml_loader_new(&c, &L, &err) == MML_ECONFIG);
  base_cfg(&c, data);
  data[0] = "/nonexistent/x.jsonl";
  CHECK(mml_loader_new(&c, &L, &err) == MML_ENOENT);
  CHECK(strstr(err.msg, "/nonexistent/x.jsonl") != NULL);
  CHECK(L == NULL);
}

/* One batch per seek_ahead (what a mmloader.ray producer does): the same batches, and
 * no more samples read than they take; plan_only gives the same cursors without tensors. */
TEST(test_seek_ahead_and_plan_only) {
  if (mml_fixture_ready(&g_fx)) FAIL_AT("no fixture (tokenizer or dataset)");
  const char *data[1];
  mml_loader_cfg c;
  base_cfg(&c, data);
  c.num_threads = 4;
  uint64_t ref[NITEMS];
  mml_cursor cur[NITEMS];
  mml_loader *L;
  mml_err err;
  CHECK_OK(mml_loader_new(&c, &L, &err), err);
  CHECK_EQ_INT(take(L, ref, NITEMS, cur), 0);
  mml_loader_free(L);

  /* as mmloader.ray's producers: a loader started at construction decodes epoch 0's first
   * batches before the first seek_ahead drops them (good_samples counted them: 117 != 111
   * once in ~600 runs under load, when the workers got that far first) */
  c.start = MML_START_NEXT;
  CHECK_OK(mml_loader_new(&c, &L, &err), err);
  mml_cursor at = {0, 0, 0};
  for (int i = 0; i < NITEMS; i++) {
    if (ref[i] == 1) continue; /* the epoch end comes before the next batch */
    CHECK_OK(mml_loader_seek_ahead(L, &at, c.collate.micro_batch_size, &err), err);
    uint64_t h;
    CHECK_EQ_INT(take(L, &h, 1, NULL), 0);
    if (i > 0 && ref[i - 1] == 1) {
      CHECK_EQ_INT(h, 1);
      CHECK_EQ_INT(take(L, &h, 1, NULL), 0);
    }
    if (h != ref[i]) FAIL_AT("seek_ahead: item %d differs", i);
    at = mml_loader_cursor(L);
    CHECK_EQ_INT(at.pos, cur[i].pos);
  }
  mml_loader_stats st;
  mml_loader_get_stats(L, &st);
  mml_loader_free(L);
  CHECK_EQ_INT((int64_t)st.good_samples, (int64_t)st.batches * c.collate.micro_batch_size);

  c.plan_only = 1;
  CHECK_OK(mml_loader_new(&c, &L, &err), err);
  for (int i = 0; i < NITEMS; i++) {
    mml_batch b;
    memset(&b, 0, sizeof b);
    mml_status s2 = mml_loader_next(L, &b, -1, &err);
    if (s2 == MML_EEND) {
      CHECK_EQ_INT(ref[i], 1);
      continue;
    }
    CHECK_OK(s2, err);
    CHECK_EQ_INT(b.ntensors, 0);
    mml_cursor p = mml_loader_cursor(L);
    if (p.epoch != cur[i].epoch || p.pos != cur[i].pos || p.batch_in_epoch != cur[i].batch_in_epoch)
      FAIL_AT("plan_only: cursor after item %d differs", i);
    mml_batch_clear(&b);
  }
  mml_loader_free(L);
}

/* Two copies of the dataset where lines in LATE name an image that fails only at decode
 * (a JPEG cut in its scan data: the header plans it), or one that fails before any pixel
 * work (missing).  Plan before decode must give the same batches for both. */
static char g_late[128], g_early[128];
static int write_late_shards(void) {
  static const int LATE[] = {0, 4, 5, 13, 14, 15, 29, 36};
  char p[160];
  snprintf(p, sizeof p, "%s/cut.jpg", g_fx.dir);
  mml_test_write_jpeg(p, 200, 150, 9);
  FILE *f = fopen(p, "rb");
  unsigned char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  f = fopen(p, "wb");
  fwrite(buf, 1, n * 3 / 5, f);
  fclose(f);
  snprintf(g_late, sizeof g_late, "%s/late.jsonl", g_fx.dir);
  snprintf(g_early, sizeof g_early, "%s/early.jsonl", g_fx.dir);
  for (int v = 0; v < 2; v++) {
    f = fopen(v ? g_early : g_late, "w");
    if (!f) return -1;
    for (int i = 0; i < 37; i++) {
      int bad = 0;
      for (size_t j = 0; j < sizeof LATE / sizeof *LATE; j++) bad |= LATE[j] == i;
      int k = bad ? 1 + i % 2 : i % 3, nimg = k + bad;
      fprintf(f,
              "{\"messages\":[{\"role\":\"user\",\"content\":\"%s%s%sQ%d %s\"},"
              "{\"role\":\"assistant\",\"content\":\"A%d\"}]",
              nimg > 0 ? "<image>" : "", nimg > 1 ? "<image>" : "", nimg > 2 ? "<image>" : "", i,
              i % 4 ? "more words" : "", i);
      if (k) {
        fprintf(f, ",\"images\":[\"img%d.jpg\"", i % 5);
        if (k > 1) fprintf(f, ",\"img%d.jpg\"", (i + 2) % 5);
        if (bad) fprintf(f, ",\"%s\"", v ? "absent.jpg" : "cut.jpg");
        fprintf(f, "]");
      }
      fprintf(f, "}\n");
    }
    fclose(f);
  }
  return 0;
}

TEST(test_late_decode_failures_same_as_early) {
  if (mml_fixture_ready(&g_fx)) FAIL_AT("no fixture (tokenizer or dataset)");
  if (write_late_shards()) FAIL_AT("cannot write the late/early shards");
  uint64_t ref[NITEMS], got[NITEMS];
  int configs[][4] = {
      /* threads, prefetch, window, packed */
      {1, 1, 0, 0}, {3, 2, 0, 0}, {4, 1, 5, 0}, {1, 2, 0, 1}, {3, 3, 0, 1}, {2, 1, 6, 1}};
  uint64_t moved_late = 0;
  for (size_t k = 0; k < sizeof configs / sizeof *configs; k++) {
    for (int v = 0; v < 2; v++) {
      const char *data[1];
      mml_loader_cfg c;
      base_cfg(&c, data);
      data[0] = v ? g_early : g_late;
      c.num_threads = configs[k][0];
      c.prefetch = configs[k][1];
      c.window = configs[k][2];
      if (configs[k][3]) {
        c.collate.pack = 1;
        c.collate.pack_length = 400;
        c.collate.pad_to_multiple = 8;
      }
      mml_loader *L;
      mml_err err;
      CHECK_OK(mml_loader_new(&c, &L, &err), err);
      int rc = take(L, v ? got : ref, NITEMS, NULL);
      mml_loader_stats st;
      mml_loader_get_stats(L, &st);
      mml_loader_free(L);
      CHECK_EQ_INT(rc, 0);
      CHECK(st.skipped >= 8);
      /* nothing failed late: nothing moves (a small window may make a batch that cannot
       * complete inside it take an early buffer and move as it grows) */
      if (v && !c.window) CHECK_EQ_INT(st.moved_rows, 0);
      if (!v && configs[k][3]) moved_late += st.moved_rows;
    }
    for (int i = 0; i < NITEMS; i++)
      if (got[i] != ref[i]) FAIL_AT("config %zu: item %d differs (late vs early failure)", k, i);
  }
  CHECK(moved_late > 0); /* packs holding a late failure were planned again */
}

/* stats while the collator runs: the totals and every source come from one moment (one
 * hold of the lock), so the sources' good samples always add up to good_samples.  Read
 * separately they did not (the collator counted samples between the two reads). */
TEST(test_stats_snapshot_with_sources) {
  if (mml_fixture_ready(&g_fx)) FAIL_AT("no fixture (tokenizer or dataset)");
  const char *data[1];
  mml_loader_cfg c;
  base_cfg(&c, data);
  mml_source_cfg sc[3];
  const char *names[3] = {"a", "b", "c"};
  const double weights[3] = {0.5, 0.3, 0.2};
  for (int i = 0; i < 3; i++) {
    memset(&sc[i], 0, sizeof sc[i]);
    sc[i].name = names[i];
    sc[i].data = data;
    sc[i].ndata = 1;
    sc[i].weight = weights[i];
    sc[i].repeat = -1;
    sc[i].choose = -1;
    sc[i].vision = c.vision;
  }
  c.sources = sc;
  c.nsources = 3;
  c.num_threads = 3;
  c.prefetch = 4;
  mml_loader *L;
  mml_err err;
  CHECK_OK(mml_loader_new(&c, &L, &err), err);
  CHECK_EQ_INT(mml_loader_num_sources(L), 3);
  mml_source_stats ss[4];
  mml_loader_stats st;
  int batches = 0;
  for (int i = 0; i < 3 * 14; i++) {
    mml_batch b;
    memset(&b, 0, sizeof b);
    mml_status s = mml_loader_next(L, &b, -1, &err);
    if (s != MML_EEND) {
      CHECK_OK(s, err);
      mml_batch_clear(&b);
      batches++;
    }
    for (int k = 0; k < 8; k++) { /* a few reads while the collator refills the queue */
      mml_loader_get_stats_all(L, &st, ss, 4); /* clamped to the 3 sources */
      uint64_t sum = ss[0].samples + ss[1].samples + ss[2].samples;
      if (sum != st.good_samples)
        FAIL_AT("batch %d: sources' samples %llu != good_samples %llu", i, (unsigned long long)sum,
                (unsigned long long)st.good_samples);
      CHECK(st.good_samples >= st.batches * (uint64_t)c.collate.micro_batch_size);
    }
  }
  int named = 1; /* names live as long as the loader */
  for (int i = 0; i < 3; i++) named &= ss[i].name && !strcmp(ss[i].name, names[i]);
  mml_loader_get_stats_all(L, &st, NULL, 3); /* no array: the totals only */
  mml_loader_free(L);
  CHECK(named);
  CHECK(batches > 12);
  CHECK_EQ_INT(st.batches, batches);
  for (int i = 0; i < 3; i++) CHECK(ss[i].samples > 0 && ss[i].tokens > 0);
}
