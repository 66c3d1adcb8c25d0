/* The dataset index (mml/dsindex.h): the file's round trip into a loader's index, every
 * truncation / byte flip refused without reading outside it (ASan), and the threaded
 * build (TSan) giving a loader the batches it gives without the index.
 * Needs the bundled tokenizer (as test-loader.c). */
#include "mml/dsindex.h"

#include <stdio.h>
#include <turbojpeg.h>

#include "mml/loader.h"
#include "mml/plan.h"
#include "mml_fixture.h"
#include "mml_test.h"

static const char k_jsonl[] = "{\"a\": 1}\n\n{\"b\": 22}\n{\"c\": 333}\n";

/* An index of k_jsonl with made-up counts: sample i has i images. */
static void make(mml_index *ix, mml_dsx *x, mml_dsx_sample *s, mml_dsx_image *im) {
  mml_err err = {0};
  memset(ix, 0, sizeof *ix);
  mml_index_add_bytes(ix, "s.jsonl", MML_LAYOUT_AUTO, (const uint8_t *)k_jsonl, sizeof k_jsonl - 1,
                      &err);
  const mml_index_shard *sh = &ix->shards[0];
  memset(x, 0, sizeof *x);
  x->shard_size = sh->size;
  x->shard_mtime_ns = 1234567890123LL;
  x->key = 0xfeedULL;
  strcpy(x->etag, "\"abc\"");
  x->settings = "tokenizer=1 max_pixels=2";
  x->layout = sh->layout;
  x->data_end = sh->data_end;
  x->n = sh->count;
  x->offsets = ix->offsets;
  static int64_t blank[8]; /* the file lists blank lines; the index keeps runs */
  int64_t *bl;
  mml_index_blank_lines(sh, &bl, &x->nblank);
  if (x->nblank) memcpy(blank, bl, (size_t)x->nblank * sizeof *bl);
  free(bl);
  x->blank_lines = blank;
  int64_t k = 0;
  for (int64_t i = 0; i < x->n; i++) {
    s[i] = (mml_dsx_sample){(uint32_t)(10 + i), (uint16_t)i, 0, 0};
    for (int j = 0; j < i; j++) im[k++] = (mml_dsx_image){(uint32_t)(100 + j), 50, 64};
  }
  x->samples = s;
  x->images = im;
  x->nimages = k;
}

TEST(test_round_trip_into_an_index) {
  mml_index ix;
  mml_dsx x;
  mml_dsx_sample s[8];
  mml_dsx_image im[16];
  make(&ix, &x, s, im);
  CHECK_EQ_INT(x.n, 3);
  CHECK_EQ_INT(x.nblank, 1);
  mml_bytes b = {0};
  mml_err err = {0};
  CHECK_OK(mml_dsx_serialize(&x, &b, &err), err);
  CHECK_EQ_INT(b.len % 8, 0);
  mml_dsx y;
  CHECK_OK(mml_dsx_parse(b.data, b.len, "t", &y, &err), err);
  CHECK_EQ_INT(y.n, 3);
  CHECK_EQ_INT(y.nimages, 3);
  CHECK_EQ_INT(y.first_image[2], 1);
  CHECK_EQ_INT(y.images[2].width, 101);
  CHECK_EQ_INT(y.samples[2].text_tokens, 12);
  CHECK_EQ_STR(y.etag, "\"abc\"");
  CHECK_EQ_STR(y.settings, "tokenizer=1 max_pixels=2");
  CHECK_EQ_INT(y.shard_mtime_ns, 1234567890123LL);
  /* the shard from the file locates samples exactly as the scan did */
  mml_index ix2 = {0};
  CHECK_OK(mml_dsx_add_to_index(&y, &ix2, "s.jsonl", &err), err);
  CHECK_OK(mml_dsx_add_to_index(&y, &ix2, "t.jsonl", &err), err);
  CHECK_EQ_INT(ix2.n, 6);
  CHECK_EQ_INT(ix2.shards[1].first, 3);
  for (int64_t i = 0; i < 3; i++) {
    int sa, sb;
    int64_t oa, la, wa, ob, lb, wb;
    mml_index_locate(&ix, i, &sa, &oa, &la, &wa);
    mml_index_locate(&ix2, i + 3, &sb, &ob, &lb, &wb);
    CHECK_EQ_INT(sb, 1);
    CHECK_EQ_INT(oa, ob);
    CHECK_EQ_INT(la, lb);
    CHECK_EQ_INT(wa, wb); /* line numbers, blank line included */
  }
  CHECK_EQ_INT(mml_index_hash_shards(&ix, 0, 1), mml_index_hash_shards(&ix2, 0, 1));
  mml_index_free(&ix2);
  mml_dsx_free(&y);
  mml_bytes_free(&b);
  mml_index_free(&ix);
}

TEST(test_every_damage_is_refused) {
  mml_index ix;
  mml_dsx x;
  mml_dsx_sample s[8];
  mml_dsx_image im[16];
  make(&ix, &x, s, im);
  mml_bytes b = {0};
  mml_err err = {0};
  CHECK_OK(mml_dsx_serialize(&x, &b, &err), err);
  uint8_t *copy = malloc(b.len);
  for (size_t n = 0; n < b.len; n++) { /* truncated: exact-size copies, so ASan sees reads */
    uint8_t *t = malloc(n ? n : 1);
    memcpy(t, b.data, n);
    mml_dsx y;
    if (mml_dsx_parse(t, n, "t", &y, &err) == MML_OK) FAIL_AT("truncated to %zu parsed", n);
    free(t);
  }
  for (size_t i = 0; i < b.len; i++) {
    for (int bit = 0; bit < 8; bit += 3) {
      memcpy(copy, b.data, b.len);
      copy[i] ^= (uint8_t)(1u << bit);
      mml_dsx y;
      if (mml_dsx_parse(copy, b.len, "t", &y, &err) == MML_OK) FAIL_AT("flip at %zu parsed", i);
    }
  }
  free(copy);
  mml_bytes_free(&b);
  mml_index_free(&ix);
}

TEST(test_partial_entries) {
  mml_index ix;
  mml_dsx x;
  mml_dsx_sample s[8];
  mml_dsx_image im[16];
  make(&ix, &x, s, im);
  mml_bytes b = {0};
  uint8_t h[MML_DSX_HEADER];
  mml_dsx_partial_header(&x, h);
  mml_bytes_append(&b, h, sizeof h);
  mml_bytes_append(&b, "\"abc\"\0\0\0", 8);
  mml_bytes_append(&b, "tokenizer=1 max_pixels=2", 24);
  size_t head = b.len, ends[3];
  int64_t k = 0;
  for (int i = 0; i < 3; i++) {
    uint64_t h = mml_dsx_entry_hash(i, &s[i], &im[k]);
    mml_bytes_append(&b, &s[i], sizeof s[i]);
    mml_bytes_append(&b, &im[k], (size_t)i * sizeof im[0]);
    mml_bytes_append(&b, &h, sizeof h);
    k += i;
    ends[i] = b.len;
  }
  mml_err err = {0};
  for (size_t n = head; n <= b.len; n++) {
    mml_dsx p;
    size_t used;
    CHECK_OK(mml_dsx_partial_parse(b.data, n, "p", &p, &used, &err), err);
    int64_t want = n >= ends[2] ? 3 : n >= ends[1] ? 2 : n >= ends[0] ? 1 : 0;
    CHECK_EQ_INT(p.n, want);
    CHECK_EQ_INT(used, want ? ends[want - 1] : head);
    CHECK_EQ_INT(p.key, 0xfeed);
    CHECK_EQ_STR(p.etag, "\"abc\"");
    mml_dsx_free(&p);
  }
  /* a byte damaged anywhere in an entry (not a torn tail): kept are the entries before */
  for (size_t at = ends[0]; at < ends[2]; at++) {
    b.data[at] ^= 0x10;
    mml_dsx p;
    size_t used;
    CHECK_OK(mml_dsx_partial_parse(b.data, b.len, "p", &p, &used, &err), err);
    CHECK_EQ_INT(p.n, at < ends[1] ? 1 : 2);
    CHECK_EQ_INT(used, at < ends[1] ? ends[0] : ends[1]);
    mml_dsx_free(&p);
    b.data[at] ^= 0x10;
  }
  mml_bytes_free(&b);
  mml_index_free(&ix);
}

/* The one naming rule: next to the shard, or in a folder keyed by a hash of the shard path
 * (pinned: existing index folders must keep being found). */
TEST(test_sidecar_names_never_collide) {
  static const struct {
    const char *shard, *dir, *want;
  } k[] = {
      {"/data/text/data-00000.jsonl", NULL, "/data/text/data-00000.jsonl.mmlidx"},
      {"/data/text/data-00000.jsonl", "", "/data/text/data-00000.jsonl.mmlidx"},
      {"/data/text/data-00000.jsonl", "/idx", "/idx/data-00000.jsonl.6310befde0564b54.mmlidx"},
      {"/data/img/data-00000.jsonl", "/idx//", "/idx/data-00000.jsonl.55a7403ce7497bc6.mmlidx"},
      {"s3://bucket/ds/data-00000.jsonl", "s3://b/idx/",
       "s3://b/idx/data-00000.jsonl.fcad24029909a99f.mmlidx"},
  };
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    mml_bytes b = {0};
    CHECK(mml_dsx_sidecar_path(k[i].shard, k[i].dir, &b) == MML_OK);
    CHECK_EQ_INT(b.len, strlen(k[i].want));
    CHECK_EQ_STR((const char *)b.data, k[i].want);
    mml_bytes_free(&b);
  }
}

/* ---- the build, with a loader ---------------------------------------------------------- */

static char g_shard[128], g_idx[160];
static int make_dataset(const char *dir);
/* the tokenizer and the dataset of the build test (mml_fixture.h) */
static mml_fixture g_fx = {"dsindex", make_dataset};

/* 600 samples (more than two build chunks): 0-2 images, some long, one malformed. */
static int make_dataset(const char *dir) {
  char p[160];
  for (int i = 0; i < 4; i++) {
    snprintf(p, sizeof p, "%s/img%d.jpg", dir, i);
    if (mml_test_write_jpeg(p, 40 + 50 * i, 60 + 30 * i, i)) return -1;
  }
  snprintf(g_shard, sizeof g_shard, "%s/data.jsonl", dir);
  snprintf(g_idx, sizeof g_idx, "%s.mmlidx", g_shard);
  FILE *f = fopen(g_shard, "w");
  if (!f) return -1;
  for (int i = 0; i < 600; i++) {
    if (i == 400) { /* after the first chunk: in the resumed build (examples are its own) */
      fprintf(f, "{\"messages\": [oops\n");
      continue;
    }
    int k = i % 3;
    fprintf(f,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"%s%sQuestion %d%s?\"},"
            "{\"role\":\"assistant\",\"content\":\"Answer %d.\"}]",
            k > 0 ? "<image>" : "", k > 1 ? "<image>" : "", i,
            i % 7 ? "" : " and a much longer question with many more words in it", i);
    if (k) fprintf(f, ",\"images\":[\"img%d.jpg\"%s]", i % 4, k > 1 ? ",\"img3.jpg\"" : "");
    fprintf(f, "}\n");
  }
  fclose(f);
  return 0;
}

static void cfg_of(mml_loader_cfg *c, const char **data, const char *index) {
  memset(c, 0, sizeof *c);
  data[0] = g_shard;
  c->data = data;
  c->ndata = 1;
  c->index = index;
  c->shuffle = 1;
  c->seed = 7;
  c->dp_size = 1;
  c->num_threads = 2;
  c->prefetch = 2;
  c->max_error_rate = 1.0;
  c->max_length = 60;
  c->collate.micro_batch_size = 4;
  c->collate.pad_id = -1;
  mml_err err;
  mml_vision_preset("qwen2.5-vl", &c->vision, &err);
  c->vision.min_pixels = 28 * 28 * 4;
  c->vision.max_pixels = 28 * 28 * 16;
  c->tokenizer = g_fx.tok;
}

static uint64_t epoch_hash(mml_loader *L, int *batches) {
  uint64_t h = 0;
  mml_err err;
  mml_batch b;
  *batches = 0;
  for (;;) {
    memset(&b, 0, sizeof b);
    if (mml_loader_next(L, &b, -1, &err) != MML_OK) break;
    for (int i = 0; i < b.ntensors; i++) {
      const mml_tensor *t = &b.tensors[i];
      h = mml_hash_bytes(h, t->name, strlen(t->name));
      h = mml_hash_bytes(h, (const char *)t->buf->data + t->offset,
                         (size_t)mml_tensor_numel(t) * mml_dtype_size(t->dtype));
    }
    (*batches)++;
    mml_batch_clear(&b);
  }
  return h;
}

static int stop_early(void *ctx, int64_t done, int64_t total) {
  (void)total;
  return done >= *(int64_t *)ctx;
}

TEST(test_build_and_use) {
  if (mml_fixture_ready(&g_fx)) FAIL_AT("no fixture (tokenizer or dataset)");
  const char *data[1];
  mml_loader_cfg c;
  mml_loader *L;
  mml_err err;
  mml_index_summary *sum = calloc(1, sizeof *sum);
  cfg_of(&c, data, "");
  CHECK_OK(mml_loader_new(&c, &L, &err), err);
  int64_t after = 1; /* stopped after its first chunk, then resumed */
  CHECK(mml_loader_build_index(L, 0, g_idx, 4, stop_early, &after, sum, &err) == MML_ECANCELLED);
  CHECK_OK(mml_loader_build_index(L, 0, g_idx, 4, NULL, NULL, sum, &err), err);
  CHECK_EQ_INT(sum->samples, 600);
  CHECK(sum->resumed > 0 && sum->resumed < 600);
  CHECK_EQ_INT(sum->good, 599);
  CHECK_EQ_INT(sum->by_status[MML_ERECORD], 1);
  CHECK(strstr(sum->example[MML_ERECORD], "data.jsonl:401") != NULL);
  int nb0, nb1;
  uint64_t h0 = epoch_hash(L, &nb0);
  mml_loader_free(L);
  cfg_of(&c, data, NULL);
  CHECK_OK(mml_loader_new(&c, &L, &err), err);
  CHECK_EQ_INT(mml_loader_index_used(L), 1);
  uint64_t h1 = epoch_hash(L, &nb1);
  mml_loader_stats st;
  mml_loader_get_stats(L, &st);
  mml_loader_free(L);
  CHECK(nb0 > 10);
  CHECK_EQ_INT(nb0, nb1);
  CHECK(h0 == h1);
  CHECK(st.skipped > 0);
  free(sum);
}

/* The global plan's counts from the index (the builder's ld_measure, headers only) and
 * from the planning pass (ld_measure on num_threads threads, media whole; no second
 * loader): the same function measures both (measure.c DESIGN 1), so the plans and the
 * epochs are the same.  Under TSan: the planning pass's threads. */
TEST(test_plan_from_index_or_planning_pass) {
  if (mml_fixture_ready(&g_fx)) FAIL_AT("no fixture (tokenizer or dataset)");
  const char *data[1];
  mml_loader_cfg c;
  mml_loader *L;
  mml_err err;
  mml_plan_info p0, p1;
  mml_index_summary *sum = calloc(1, sizeof *sum);
  int nb0, nb1;
  cfg_of(&c, data, ""); /* no index: the planning pass */
  c.collate.micro_batch_size = 0;
  c.max_tokens_per_batch = 160;
  c.balance = MML_BALANCE_TOKENS;
  CHECK_OK(mml_loader_new(&c, &L, &err), err);
  CHECK_OK(mml_loader_plan_info(L, 0, &p0, &err), err);
  CHECK_EQ_INT(p0.measured, 600);
  CHECK_EQ_INT(p0.indexed, 0);
  CHECK(p0.unusable > 1); /* the malformed line, and those above max_length=60 */
  CHECK_OK(mml_loader_build_index(L, 0, g_idx, 3, NULL, NULL, sum, &err), err);
  uint64_t h0 = epoch_hash(L, &nb0);
  mml_loader_free(L);
  cfg_of(&c, data, NULL); /* the index beside the shard */
  c.collate.micro_batch_size = 0;
  c.max_tokens_per_batch = 160;
  c.balance = MML_BALANCE_TOKENS;
  CHECK_OK(mml_loader_new(&c, &L, &err), err);
  CHECK_OK(mml_loader_plan_info(L, 0, &p1, &err), err);
  CHECK_EQ_INT(p1.indexed, 600);
  CHECK_EQ_INT(p1.measured, 0);
  uint64_t h1 = epoch_hash(L, &nb1);
  mml_loader_free(L);
  CHECK_EQ_INT(p1.unusable, p0.unusable);
  CHECK_EQ_INT(p1.steps, p0.steps);
  CHECK_EQ_INT(p1.usable, p0.usable);
  CHECK(nb0 > 10);
  CHECK_EQ_INT(nb0, nb1);
  CHECK(h0 == h1);
  free(sum);
}

/* ---- samples only a whole read or mml_sample_check rejects ------------------------------ */

static char g_hard[128];
static int make_hard(const char *dir);
static mml_fixture g_fx_hard = {"dsindex-hard", make_hard};

/* w x h of noise (a JPEG that compresses badly: its later scans lie beyond the first
 * MML_DSX_HEAD_BYTES), progressive or baseline, into path.  0: done. */
static int write_noise_jpeg(const char *path, int w, int h, int progressive) {
  unsigned char *rgb = malloc((size_t)w * h * 3), *out = NULL;
  if (!rgb) return -1;
  uint32_t x = 12345;
  for (int i = 0; i < w * h * 3; i++)
    rgb[i] = (unsigned char)((x = x * 1103515245u + 12345u) >> 24);
  tjhandle tj = tjInitCompress();
  unsigned long len = 0;
  int rc = tj && !tjCompress2(tj, rgb, w, 0, h, TJPF_RGB, &out, &len, TJSAMP_420, 95,
                              progressive ? TJFLAG_PROGRESSIVE : 0)
               ? 0
               : -1;
  FILE *f = rc ? NULL : fopen(path, "wb");
  if (!f || fwrite(out, 1, len, f) != len) rc = -1;
  if (f && fclose(f)) rc = -1;
  tjFree(out);
  if (tj) tjDestroy(tj);
  free(rgb);
  return rc;
}

/* 40 samples: i % 10 == 3 has no assistant turn, 5 a progressive JPEG of ~10 scans
 * (~230 KB: above max_jpeg_scans=4, its first 16 KiB holding 2 of them), 7 a baseline JPEG
 * above max_object_bytes (1 MB); the others a small JPEG. */
static int make_hard(const char *dir) {
  char p[160];
  snprintf(p, sizeof p, "%s/small.jpg", dir);
  if (mml_test_write_jpeg(p, 56, 40, 1)) return -1;
  snprintf(p, sizeof p, "%s/prog.jpg", dir);
  if (write_noise_jpeg(p, 480, 480, 1)) return -1;
  snprintf(p, sizeof p, "%s/big.jpg", dir);
  if (write_noise_jpeg(p, 1000, 1000, 0)) return -1;
  snprintf(g_hard, sizeof g_hard, "%s/hard.jsonl", dir);
  FILE *f = fopen(g_hard, "w");
  if (!f) return -1;
  for (int i = 0; i < 40; i++) {
    int k = i % 10;
    if (k == 3)
      fprintf(f, "{\"messages\":[{\"role\":\"user\",\"content\":\"Question %d?\"}]}\n", i);
    else
      fprintf(f,
              "{\"messages\":[{\"role\":\"user\",\"content\":\"<image>Question %d?\"},"
              "{\"role\":\"assistant\",\"content\":\"Answer %d.\"}],\"images\":[\"%s\"]}\n",
              i, i,
              k == 5   ? "prog.jpg"
              : k == 7 ? "big.jpg"
                       : "small.jpg");
  }
  return fclose(f) ? -1 : 0;
}

static void cfg_hard(mml_loader_cfg *c, const char **data, const char *index) {
  cfg_of(c, data, index);
  data[0] = g_hard;
  c->tokenizer = g_fx_hard.tok;
  c->max_length = 0;
  c->max_jpeg_scans = 4;
  c->max_object_bytes = 1000000;
  c->collate.micro_batch_size = 0;
  c->max_tokens_per_batch = 160;
  c->balance = MML_BALANCE_TOKENS;
}

/* What the planning pass rejects, the index records (issues 28/32): with an index built
 * beside the shard the plan and the epoch are the planning pass's, and the index holds the
 * statuses (no trainable turn, too many scans, object too large), 4 of each. */
TEST(test_plan_from_index_agrees_on_rejected_samples) {
  if (mml_fixture_ready(&g_fx_hard)) FAIL_AT("no fixture (tokenizer or dataset)");
  const char *data[1];
  mml_loader_cfg c;
  mml_loader *L;
  mml_err err;
  mml_plan_info p0, p1;
  mml_index_summary *sum = calloc(1, sizeof *sum);
  char idx[160];
  int nb0, nb1;
  snprintf(idx, sizeof idx, "%s.mmlidx", g_hard);
  cfg_hard(&c, data, ""); /* no index: the planning pass */
  CHECK_OK(mml_loader_new(&c, &L, &err), err);
  CHECK_OK(mml_loader_plan_info(L, 0, &p0, &err), err);
  CHECK_EQ_INT(p0.measured, 40);
  CHECK_EQ_INT(p0.unusable, 12);
  CHECK_OK(mml_loader_build_index(L, 0, idx, 3, NULL, NULL, sum, &err), err);
  CHECK_EQ_INT(sum->good, 28);
  CHECK_EQ_INT(sum->by_status[MML_ENOTARGET], 4);
  CHECK_EQ_INT(sum->by_status[MML_ESCANS], 4);
  CHECK_EQ_INT(sum->by_status[MML_EOBJECTSIZE], 4);
  uint64_t h0 = epoch_hash(L, &nb0);
  mml_loader_free(L);
  cfg_hard(&c, data, NULL); /* the index beside the shard */
  CHECK_OK(mml_loader_new(&c, &L, &err), err);
  CHECK_OK(mml_loader_plan_info(L, 0, &p1, &err), err);
  CHECK_EQ_INT(p1.indexed, 40);
  uint64_t h1 = epoch_hash(L, &nb1);
  mml_loader_free(L);
  CHECK_EQ_INT(p1.unusable, p0.unusable);
  CHECK_EQ_INT(p1.steps, p0.steps);
  CHECK_EQ_INT(p1.usable, p0.usable);
  CHECK(nb0 > 2);
  CHECK_EQ_INT(nb0, nb1);
  CHECK(h0 == h1);
  free(sum);
}

int mml_cpu_avx2(void), mml_cpu_fma(void); /* csrc/core/vision/resize.h */
