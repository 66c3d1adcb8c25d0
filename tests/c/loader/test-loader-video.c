/*
 * test-loader-video.c — video files through the threaded engine (run under TSan too): the
 * committed seed videos of the fuzz corpus (fuzz/corpus/video: 16x16, 6 frames; h264 in
 * mp4 and mkv, vp9 in webm, mpeg4 in avi, hevc in mov) copied into a dataset with text-only
 * samples, a corrupt file and a video too short for its element.  Plan (probe) and decode
 * (reopen, the kept frames) run on different workers; the batches are the same whatever
 * the thread count, prefetch and window, and the bad videos are skipped with their own
 * statuses.
 *
 * Needs the bundled tokenizer (mmloader/data/tiny-tokenizer.json, relative to tests/c, or
 * MML_TEST_TOKENIZER).
 */
#include <stdio.h>

#include "mml/loader.h"
#include "mml_fixture.h"
#include "mml_test.h"

#define SEEDS "../../fuzz/corpus/video/"
static const char *k_videos[] = {"h264.mp4", "h264.mkv", "vp9.webm", "mpeg4.avi", "hevc.mov"};
enum { NVIDEOS = 5, NLINES = 14, NITEMS = NLINES / 3 + 1 }; /* one epoch and its end */

static char g_shard[128];
static int make_dataset(const char *dir);
static mml_fixture g_fx = {"lvideo", make_dataset};

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

/* Lines: a video (every seed in turn), a text-only turn, or (lines 7 and 12) a corrupt
 * file and a video asked for more frames than it has. */
static int make_dataset(const char *dir) {
  char from[256], to[160];
  for (int i = 0; i < NVIDEOS; i++) {
    snprintf(from, sizeof from, SEEDS "%s", k_videos[i]);
    snprintf(to, sizeof to, "%s/%s", dir, k_videos[i]);
    if (copy_file(from, to, 0)) return -1;
  }
  snprintf(from, sizeof from, SEEDS "h264.mp4");
  snprintf(to, sizeof to, "%s/junk.mp4", dir);
  if (copy_file(from, to, 40)) return -1; /* the ftyp box and no more */
  snprintf(g_shard, sizeof g_shard, "%s/data.jsonl", dir);
  FILE *f = fopen(g_shard, "w");
  if (!f) return -1;
  for (int i = 0; i < NLINES; i++) {
    const char *v = i == 7 ? "junk.mp4" : k_videos[i % NVIDEOS];
    if (i % 3 == 2)
      fprintf(f,
              "{\"messages\":[{\"role\":\"user\",\"content\":\"Text only %d?\"},"
              "{\"role\":\"assistant\",\"content\":\"Yes %d.\"}]}\n",
              i, i);
    else
      fprintf(f,
              "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"video\",\"video\":"
              "\"%s\"%s},{\"type\":\"text\",\"text\":\"What moves in %d?\"}]},"
              "{\"role\":\"assistant\",\"content\":\"Pixels %d.\"}]}\n",
              v, i == 12 ? ",\"nframes\":8" : "", i, i);
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
  c->seed = 7;
  c->dp_size = 1;
  c->num_threads = 2;
  c->prefetch = 2;
  c->max_error_rate = 1.0;
  c->collate.micro_batch_size = 3;
  c->collate.pad_id = -1;
  c->collate.attention_mask = 1;
  mml_err err;
  mml_vision_preset("qwen2.5-vl", &c->vision, &err);
  c->tokenizer = g_fx.tok;
}

/* Hash of every tensor of the batch; *videos counts its pixel_values_videos rows. */
static uint64_t batch_hash(const mml_batch *b, int64_t *videos) {
  uint64_t h = 0;
  for (int i = 0; i < b->ntensors; i++) {
    const mml_tensor *t = &b->tensors[i];
    h = mml_hash_bytes(h, t->name, strlen(t->name));
    h = mml_hash_bytes(h, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    h = mml_hash_bytes(h, (const char *)t->buf->data + t->offset,
                       (size_t)mml_tensor_numel(t) * mml_dtype_size(t->dtype));
    if (!strcmp(t->name, "pixel_values_videos")) *videos += t->shape[0];
  }
  return h;
}

TEST(loader_video_files_same_output_any_threads) {
  if (mml_fixture_ready(&g_fx)) FAIL_AT("no fixture (tokenizer or dataset)");
  const char *data[1];
  mml_loader_cfg c;
  uint64_t ref[NITEMS], got[NITEMS];
  int configs[][3] = {{1, 1, 0}, {4, 3, 0}, {3, 1, 4}};
  for (size_t k = 0; k < sizeof configs / sizeof *configs; k++) {
    base_cfg(&c, data);
    c.num_threads = configs[k][0];
    c.prefetch = configs[k][1];
    c.window = configs[k][2];
    mml_loader *L;
    mml_err err;
    CHECK_OK(mml_loader_new(&c, &L, &err), err);
    int64_t rows = 0;
    uint64_t *out = k ? got : ref;
    for (int i = 0; i < NITEMS; i++) {
      mml_batch b;
      memset(&b, 0, sizeof b);
      mml_status st = mml_loader_next(L, &b, -1, &err);
      if (st == MML_EEND) {
        out[i] = 1;
        continue;
      }
      CHECK_OK(st, err);
      out[i] = batch_hash(&b, &rows);
      mml_batch_clear(&b);
    }
    mml_source_stats st;
    mml_loader_source_stats(L, 0, &st);
    mml_loader_free(L);
    CHECK(rows > 0);
    for (int r = 0; r < MML_STATUS_COUNT; r++)
      if (st.skip_by_status[r] && r != MML_EVIDEOCORRUPT && r != MML_EVIDEOSHORT)
        FAIL_AT("skipped %llu with %s", (unsigned long long)st.skip_by_status[r],
                mml_status_name((mml_status)r));
    CHECK(st.skip_by_status[MML_EVIDEOCORRUPT] >= 1);
    CHECK(st.skip_by_status[MML_EVIDEOSHORT] >= 1);
    CHECK_EQ_INT(st.skipped,
                 st.skip_by_status[MML_EVIDEOCORRUPT] + st.skip_by_status[MML_EVIDEOSHORT]);
    if (k)
      for (int i = 0; i < NITEMS; i++)
        if (got[i] != ref[i]) FAIL_AT("config %zu differs at item %d", k, i);
  }
}
