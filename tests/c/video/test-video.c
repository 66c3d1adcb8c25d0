/* test-video.c — the video core (mml/video.h) on the tiny committed seed videos of the
 * fuzz corpus (fuzz/corpus/video: 16x16, 6 frames, keyframe every 3): the same frames
 * from a file, from memory and over HTTP in small blocks fetched ahead, in one thread and
 * in four at once (run under TSan by the Makefile), the failure statuses, and what an
 * idle open video holds. */
#include <malloc.h>
#include <pthread.h>

#include "mml/fetch.h"
#include "mml/video.h"
#include "mml_fixture.h"
#include "mml_test.h"

#define DIR "../../fuzz/corpus/video/"
static const char *k_files[] = {DIR "h264.mp4", DIR "h264.mkv", DIR "vp9.webm", DIR "mpeg4.avi",
                                DIR "hevc.mov"};
enum { NFILES = 5, NT = 4, ROUNDS = 3 };

static mml_status sum_frame(void *ctx, const mml_video_frame *f, mml_err *err) {
  uint64_t *h = ctx;
  for (int y = 0; y < f->height; y++)
    *h = mml_hash_bytes(*h, f->rgb + (size_t)y * f->stride, (size_t)f->width * 3);
  *h = mml_hash_bytes(*h, &f->k, sizeof f->k);
  return MML_OK;
}

/* Hash of frames {0, 2, 3, 5} (and 6 -> video_too_short), or 0 on failure. */
static uint64_t frames_hash(const mml_video_src *src) {
  mml_video *v = NULL;
  mml_err err = {0};
  uint64_t h = 1469598103934665603ull;
  static const int64_t idx[] = {0, 2, 3, 3, 5};
  if (mml_video_open(src, &v, &err)) return 0;
  mml_video_info info;
  if (mml_video_probe(v, &info, &err) || info.nframes != 6 || info.width != 16) h = 0;
  if (h && mml_video_decode(v, idx, 5, sum_frame, &h, &err)) h = 0;
  int64_t six = 6;
  if (h && mml_video_decode(v, &six, 1, sum_frame, &h, &err) != MML_EVIDEOSHORT) h = 0;
  mml_video_close(v);
  return h;
}

static uint64_t base[NFILES];

TEST(test_file_and_memory_agree) {
  for (int i = 0; i < NFILES; i++) {
    mml_video_src src = {.name = k_files[i]};
    base[i] = frames_hash(&src);
    CHECK(base[i] != 0);
    mml_bytes b = {0};
    mml_err err = {0};
    CHECK_OK(mml_read_file(k_files[i], 0, -1, &b, &err), err);
    mml_video_src mem = {.name = "member", .data = b.data, .len = b.len};
    CHECK_EQ_INT(frames_hash(&mem), base[i]);
    mml_bytes_free(&b);
  }
}

static void *worker(void *arg) {
  int *bad = arg;
  for (int r = 0; r < ROUNDS; r++)
    for (int i = 0; i < NFILES; i++) {
      /* threads = 1: libavcodec's own frame threads synchronise in uninstrumented code,
       * which TSan cannot see (tests/test_video.py decodes with threads=2) */
      mml_video_src src = {.name = k_files[i], .threads = 1};
      if (frames_hash(&src) != base[i]) (*bad)++;
    }
  return NULL;
}

TEST(test_threads) {
  for (int i = 0; i < NFILES; i++) { /* the reference hashes (each test runs alone) */
    mml_video_src src = {.name = k_files[i]};
    base[i] = frames_hash(&src);
    CHECK(base[i] != 0);
  }
  pthread_t th[NT];
  int bad[NT] = {0};
  for (int t = 0; t < NT; t++) pthread_create(&th[t], NULL, worker, &bad[t]);
  for (int t = 0; t < NT; t++) pthread_join(th[t], NULL);
  for (int t = 0; t < NT; t++) CHECK_EQ_INT(bad[t], 0);
}

typedef struct remote_arg {
  mml_fetcher *f;
  const char *url;
  uint64_t want;
  int bad;
} remote_arg;

static void *remote_worker(void *arg) {
  remote_arg *a = arg;
  for (int r = 0; r < ROUNDS; r++) {
    /* 96-byte blocks: each video is tens of them, most fetched ahead */
    mml_video_src src = {.name = a->url, .fetcher = a->f, .threads = 1, .block = 96};
    if (frames_hash(&src) != a->want) a->bad++;
  }
  return NULL;
}

TEST(test_remote_blocks_fetched_ahead) {
  mml_fetch_cfg cfg = {.backoff_base_s = 0.001, .backoff_max_s = 0.01};
  mml_fetcher *f = NULL;
  mml_err err = {0};
  CHECK_OK(mml_fetcher_new(&cfg, &f, &err), err);
  for (int i = 0; i < NFILES; i++) {
    mml_video_src src = {.name = k_files[i]};
    uint64_t want = frames_hash(&src);
    CHECK(want != 0);
    mml_bytes b = {0};
    CHECK_OK(mml_read_file(k_files[i], 0, -1, &b, &err), err);
    mml_test_range_server s;
    CHECK(mml_test_range_server_start(&s, b.data, b.len) == 0);
    char url[96];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v%d", s.port, i);
    pthread_t th[NT];
    remote_arg a[NT];
    for (int t = 0; t < NT; t++) {
      a[t] = (remote_arg){.f = f, .url = url, .want = want};
      pthread_create(&th[t], NULL, remote_worker, &a[t]);
    }
    for (int t = 0; t < NT; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < NT; t++) CHECK_EQ_INT(a[t].bad, 0);
    CHECK(__atomic_load_n(&s.requests, __ATOMIC_SEQ_CST) > NT * ROUNDS);
    /* probed, idle (what was fetched ahead dropped), then decoded: as the loader does */
    mml_video_src src2 = {.name = url, .fetcher = f, .block = 96};
    mml_video *v = NULL;
    CHECK_OK(mml_video_open(&src2, &v, &err), err);
    mml_video_idle(v);
    static const int64_t idx[] = {0, 2, 3, 3, 5};
    uint64_t h = 1469598103934665603ull;
    CHECK_OK(mml_video_decode(v, idx, 5, sum_frame, &h, &err), err);
    mml_video_close(v);
    mml_test_range_server_stop(&s);
    mml_bytes_free(&b);
  }
  mml_fetcher_free(f);
}

typedef struct loaded_count {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int n;
  size_t bytes;
} loaded_count;

static void on_loaded(void *ctx, size_t bytes) { /* the fetcher's I/O thread */
  loaded_count *c = ctx;
  pthread_mutex_lock(&c->mu);
  c->n++;
  c->bytes += bytes;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

/* Probed, idle, the decode's packet ranges preloaded (mp4/mov: from the index; the others
 * from the places their open's packet pass met the packets at), then decoded once they are
 * in, without a wait on the network: the same frames as the local file,
 * the completions (I/O thread) against the reads (this thread) under TSan, and a bound
 * below the ranges' bytes preloads nothing.  (These 6-frame files mostly sit in
 * libavformat's buffer after the probe, so whether a decode waits is shown with real files:
 * tests/test_video_files.py, video_decode_waits.) */
TEST(test_remote_preload_decodes_from_memory) {
  mml_fetch_cfg cfg = {.backoff_base_s = 0.001, .backoff_max_s = 0.01};
  mml_fetcher *f = NULL;
  mml_err err = {0};
  CHECK_OK(mml_fetcher_new(&cfg, &f, &err), err);
  static const int64_t idx[] = {0, 2, 3, 3, 5};
  for (int i = 0; i < NFILES; i++) {
    uint64_t want = 1469598103934665603ull, got = want;
    mml_video_src src = {.name = k_files[i]};
    mml_video *v = NULL;
    CHECK_OK(mml_video_open(&src, &v, &err), err);
    CHECK_OK(mml_video_decode(v, idx, 5, sum_frame, &want, &err), err);
    mml_video_close(v);
    mml_bytes b = {0};
    CHECK_OK(mml_read_file(k_files[i], 0, -1, &b, &err), err);
    mml_test_range_server s;
    CHECK(mml_test_range_server_start(&s, b.data, b.len) == 0);
    char url[96];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/p%d", s.port, i);
    mml_video_src rs = {.name = url, .fetcher = f, .threads = 1, .block = 96};
    CHECK_OK(mml_video_open(&rs, &v, &err), err);
    CHECK(mml_video_waits(v) > 0); /* its HEAD and header blocks */
    mml_video_idle(v);
    loaded_count c = {.n = 0};
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    int k = -1;
    CHECK_OK(mml_video_preload(v, idx, 5, (int64_t)1 << 20, on_loaded, &c, &k, &err), err);
    CHECK(k > 0);
    CHECK(mml_video_preload_bytes(v, idx, 5) > 0);
    pthread_mutex_lock(&c.mu);
    while (c.n < k) pthread_cond_wait(&c.cv, &c.mu);
    pthread_mutex_unlock(&c.mu);
    CHECK(c.bytes > 0);
    int64_t w0 = mml_video_waits(v);
    CHECK_OK(mml_video_decode(v, idx, 5, sum_frame, &got, &err), err);
    CHECK(got == want);
    CHECK_EQ_INT(mml_video_waits(v), w0);
    /* a bound below the ranges' bytes: nothing preloaded, the decode reads on demand */
    mml_video_idle(v);
    CHECK_OK(mml_video_preload(v, idx, 5, 1, on_loaded, &c, &k, &err), err);
    CHECK_EQ_INT(k, 0);
    got = 1469598103934665603ull;
    CHECK_OK(mml_video_decode(v, idx, 5, sum_frame, &got, &err), err);
    CHECK(got == want);
    mml_video_close(v);
    pthread_mutex_destroy(&c.mu);
    pthread_cond_destroy(&c.cv);
    mml_test_range_server_stop(&s);
    mml_bytes_free(&b);
  }
  mml_fetcher_free(f);
}

TEST(test_failures) {
  mml_video *v = NULL;
  mml_err err = {0};
  mml_video_src missing = {.name = DIR "nope.mp4"};
  CHECK_EQ_INT(mml_video_open(&missing, &v, &err), MML_ENOENT);
  CHECK(strstr(err.msg, "nope.mp4") != NULL);
  static const uint8_t junk[64] = {1, 2, 3};
  mml_video_src bad = {.name = "junk.bin", .data = junk, .len = sizeof junk};
  CHECK_EQ_INT(mml_video_open(&bad, &v, &err), MML_EVIDEOCORRUPT);
  CHECK(strstr(err.msg, "junk.bin") != NULL);
  mml_video_src small = {.name = k_files[0], .max_pixels = 255};
  CHECK_EQ_INT(mml_video_open(&small, &v, &err), MML_ETOOBIG);
  CHECK(v == NULL);
}

static size_t heap_used(void) {
  struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

/* An open video after mml_video_idle (the loader keeps one from its probe to its decode)
 * holds its demuxer state and tables but no decoder (h264's context alone is ~0.8 MiB):
 * at most mml_video_held_bytes (what max_memory counts for it), and its decode after the
 * idle gives the same frames.  (The heap figure is glibc's: under the sanitizers' own
 * allocators it reads ~0 and only the frames are checked.) */
TEST(test_idle_video_holds_little) {
  for (int i = 0; i < NFILES; i++) {
    mml_video_src src = {.name = k_files[i], .threads = 1};
    uint64_t want = frames_hash(&src), h = 1469598103934665603ull;
    mml_video *v = NULL;
    mml_err err = {0};
    CHECK_OK(mml_video_open(&src, &v, &err), err);
    mml_video_idle(v);
    static const int64_t idx[] = {0, 2, 3, 3, 5};
    CHECK_OK(mml_video_decode(v, idx, 5, sum_frame, &h, &err), err);
    int64_t six = 6;
    CHECK_EQ_INT(mml_video_decode(v, &six, 1, sum_frame, &h, &err), MML_EVIDEOSHORT);
    CHECK_EQ_INT(h, want);
    mml_video_close(v);
  }
  enum { N = 16 };
  mml_video *vs[N] = {0};
  mml_err err = {0};
  size_t before = heap_used();
  for (int k = 0; k < N; k++) {
    mml_video_src src = {.name = k_files[0], .threads = 1};
    CHECK_OK(mml_video_open(&src, &vs[k], &err), err);
    mml_video_idle(vs[k]);
  }
  size_t after = heap_used();
  int64_t each = after > before ? (int64_t)(after - before) / N : 0;
  CHECK(each <= mml_video_held_bytes(vs[0]));
  CHECK(mml_video_held_bytes(vs[0]) < (int64_t)512 << 10);
  for (int k = 0; k < N; k++) mml_video_close(vs[k]);
}

static void box(uint8_t *p, uint32_t size, const char *type) {
  p[0] = size >> 24, p[1] = size >> 16, p[2] = size >> 8, p[3] = size;
  memcpy(p + 4, type, 4);
}

/* Where an mp4's index lies past its first bytes, from the top-level box sizes. */
TEST(test_header_range) {
  uint8_t b[256] = {0};
  int64_t off, end;
  box(b, 24, "ftyp");
  box(b + 24, 100, "moov"); /* whole in the first 256 bytes */
  CHECK_EQ_INT(mml_video_header_range(b, sizeof b, 10000, 0, &off, &end), 0);
  box(b + 24, 500, "moov"); /* its rest, and a block past it (the first packets) */
  CHECK_EQ_INT(mml_video_header_range(b, sizeof b, 10000, 0, &off, &end), 1);
  CHECK_EQ_INT(off, 256);
  CHECK_EQ_INT(end, 10000); /* (the file ends within that block) */
  CHECK_EQ_INT(mml_video_header_range(b, sizeof b, (int64_t)4 << 20, 0, &off, &end), 1);
  CHECK_EQ_INT(end, 524 + MML_VIDEO_BLOCK);
  box(b + 24, 8000, "mdat"); /* moov after the mdat: from there to the end */
  CHECK_EQ_INT(mml_video_header_range(b, sizeof b, 9000, 0, &off, &end), 1);
  CHECK_EQ_INT(off, 8024);
  CHECK_EQ_INT(end, 9000);
  box(b + 24, 1, "mdat"); /* a 64-bit size */
  memset(b + 32, 0, 8);
  b[38] = 0x20; /* 0x2000 = 8192 */
  CHECK_EQ_INT(mml_video_header_range(b, sizeof b, 9000, 0, &off, &end), 1);
  CHECK_EQ_INT(off, 24 + 8192);
  box(b + 24, 0, "mdat"); /* to the end of the file: no moov after it */
  CHECK_EQ_INT(mml_video_header_range(b, sizeof b, 9000, 0, &off, &end), 0);
  box(b + 24, 20000, "mdat"); /* past the end: not followed */
  CHECK_EQ_INT(mml_video_header_range(b, sizeof b, 9000, 0, &off, &end), 0);
  box(b + 24, 4, "mdat"); /* shorter than its header */
  CHECK_EQ_INT(mml_video_header_range(b, sizeof b, 9000, 0, &off, &end), 0);
  box(b, 24, "isom"); /* not ISO BMFF */
  CHECK_EQ_INT(mml_video_header_range(b, sizeof b, 9000, 0, &off, &end), 0);
  memcpy(b, "\x1a\x45\xdf\xa3", 4); /* Matroska: the rest when at most `whole` */
  CHECK_EQ_INT(mml_video_header_range(b, sizeof b, 9000, 0, &off, &end), 0);
  CHECK_EQ_INT(mml_video_header_range(b, sizeof b, 9000, 9000, &off, &end), 1);
  CHECK_EQ_INT(off, 256);
  CHECK_EQ_INT(end, 9000);
  memcpy(b, "RIFF\0\0\0\0AVI ", 12); /* AVI */
  CHECK_EQ_INT(mml_video_header_range(b, sizeof b, 9000, 9000, &off, &end), 1);
  box(b, 24, "ftyp"); /* the whole file in the first bytes */
  CHECK_EQ_INT(mml_video_header_range(b, sizeof b, 256, 0, &off, &end), 0);
}
