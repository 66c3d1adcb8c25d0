/* fuzz-state.c — restoring a loader state: an arbitrary cursor (epoch, pos,
 * batch_in_epoch; padded and packed loaders over a small text-only shard) goes through
 * mml_loader_seek; one that is accepted must then deliver a batch, an epoch end or an
 * error within a bound (a hang or a spin is a finding: libFuzzer's -timeout). */
#include <unistd.h>

#include "fuzz.h"
#include "mml/loader.h"

enum { N_LINES = 23 };

static char g_shard[64];

static void write_shard(void) {
  snprintf(g_shard, sizeof g_shard, "/tmp/mml-fuzz-state-%d.jsonl", (int)getpid());
  FILE *f = fopen(g_shard, "w");
  if (!f) abort();
  for (int i = 0; i < N_LINES; i++)
    fprintf(f,
            i % 7 == 3 ? "{broken %d\n"
                       : "{\"messages\":[{\"role\":\"user\",\"content\":\"q%d\"},"
                         "{\"role\":\"assistant\",\"content\":\"a\"}]}\n",
            i);
  fclose(f);
}

static void remove_shard(void) { unlink(g_shard); }

static mml_loader *make(int pack) {
  static const char *data[1];
  data[0] = g_shard;
  mml_loader_cfg c;
  memset(&c, 0, sizeof c);
  c.data = data;
  c.ndata = 1;
  c.shuffle = 1;
  c.seed = 7;
  c.dp_size = 1;
  c.num_threads = 1;
  c.prefetch = 1;
  c.max_error_rate = 1.0;
  c.collate.micro_batch_size = 3;
  c.collate.pad_id = -1;
  c.collate.pack = pack;
  c.collate.pack_length = pack ? 64 : 0;
  mml_err e = {0};
  mml_vision_preset("qwen2.5-vl", &c.vision, &e);
  c.tokenizer = fuzz_tokenizer();
  mml_loader *L = NULL;
  if (mml_loader_new(&c, &L, &e)) {
    fprintf(stderr, "fuzz-state: %s\n", e.msg);
    abort();
  }
  return L;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static mml_loader *loaders[2];
  if (!loaders[0]) {
    write_shard();
    loaders[0] = make(0);
    loaders[1] = make(1);
    atexit(remove_shard);
  }
  fuzz_in in = {data, size};
  mml_loader *L = loaders[fuzz_u64(&in, 1) & 1];
  mml_cursor c;
  /* small values are likelier to be accepted; the high bit makes the value arbitrary */
  for (int i = 0; i < 3; i++) {
    uint64_t v = fuzz_u64(&in, 8);
    int64_t x = (v >> 63) ? (int64_t)v : (int64_t)(v % 97) - 2;
    if (i == 0)
      c.epoch = x;
    else if (i == 1)
      c.pos = x;
    else
      c.batch_in_epoch = x;
  }
  mml_err e = {0};
  mml_status st = mml_loader_seek(L, &c, &e);
  if (st) {
    fuzz_check_msg(&e);
    if (st != MML_ESTATE) abort();
    return 0;
  }
  for (int k = 0; k < 2; k++) {
    mml_batch b;
    memset(&b, 0, sizeof b);
    st = mml_loader_next(L, &b, 10.0, &e);
    if (st == MML_ETIMEDOUT) {
      fprintf(stderr, "fuzz-state: no batch within 10 s after seek(%lld, %lld, %lld)\n",
              (long long)c.epoch, (long long)c.pos, (long long)c.batch_in_epoch);
      abort();
    }
    if (st == MML_OK)
      mml_batch_clear(&b);
    else if (st != MML_EEND)
      fuzz_check_msg(&e);
  }
  return 0;
}
