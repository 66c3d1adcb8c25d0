/* The dataset index file (mml/dsindex.h): round trip into a loader's index, and every
 * truncation / byte flip of a file refused without reading outside it (run under ASan). */
#include "mml/dsindex.h"

#include "mml_test.h"

static const char k_jsonl[] = "{\"a\": 1}\n\n{\"b\": 22}\n{\"c\": 333}\n";

/* An index of k_jsonl with made-up counts: sample i has i images. */
static void make(mml_index *ix, mml_dsx *x, mml_dsx_sample *s, mml_dsx_image *im) {
  mml_err err = {0};
  memset(ix, 0, sizeof *ix);
  mml_index_add_bytes(ix, "s.jsonl", MML_LAYOUT_AUTO, (const uint8_t *)k_jsonl,
                      sizeof k_jsonl - 1, &err);
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
  x->blank_lines = sh->blank_lines;
  x->nblank = sh->nblank;
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
    mml_bytes_append(&b, &s[i], sizeof s[i]);
    mml_bytes_append(&b, &im[k], (size_t)i * sizeof im[0]);
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
  mml_bytes_free(&b);
  mml_index_free(&ix);
}

MML_TEST_MAIN(RUN(test_round_trip_into_an_index); RUN(test_every_damage_is_refused);
              RUN(test_partial_entries))
