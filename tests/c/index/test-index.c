/* test-index.c — line offsets, blank lines, missing trailing newline, chunk boundaries,
 * line numbers; file and in-memory builds agree; JSON arrays (elements, separators,
 * strings with brackets and escapes) and gzip input fed a byte at a time. */
#include <stdio.h>
#include <unistd.h>
#include <zlib.h>

#include "mml/index.h"
#include "mml_test.h"

static void check_same(mml_index *a, mml_index *b) {
  CHECK_EQ_INT(a->n, b->n);
  for (int64_t i = 0; i < a->n; i++) CHECK_EQ_INT(a->offsets[i], b->offsets[i]);
}

static void record_at(const char *text, mml_index *ix, int64_t i, char *out, size_t cap,
                      int64_t *line) {
  int shard;
  int64_t off, len;
  mml_index_locate(ix, i, &shard, &off, &len, line);
  size_t n = 0;
  while (n < (size_t)len && text[off + (int64_t)n] != '\n' && n + 1 < cap) {
    out[n] = text[off + (int64_t)n];
    n++;
  }
  out[n] = 0;
}

TEST(test_lines_and_blanks) {
  const char *text = "{\"a\":1}\n\n  \n{\"b\":2}\r\n{\"c\":3}";
  mml_index ix = {0};
  mml_err err = {0};
  CHECK_OK(mml_index_add_bytes(&ix, "mem.jsonl", MML_LAYOUT_AUTO, (const uint8_t *)text,
                               strlen(text), &err),
           err);
  CHECK_EQ_INT(ix.n, 3);
  char buf[64];
  int64_t line;
  record_at(text, &ix, 0, buf, sizeof buf, &line);
  CHECK_EQ_STR(buf, "{\"a\":1}");
  CHECK_EQ_INT(line, 1);
  record_at(text, &ix, 1, buf, sizeof buf, &line);
  CHECK_EQ_STR(buf, "{\"b\":2}\r");
  CHECK_EQ_INT(line, 4);
  record_at(text, &ix, 2, buf, sizeof buf, &line);
  CHECK_EQ_STR(buf, "{\"c\":3}");
  CHECK_EQ_INT(line, 5);
  mml_index_free(&ix);
}

TEST(test_file_matches_memory_and_shards) {
  char path[] = "/tmp/mml-test-index-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  FILE *f = fdopen(fd, "w");
  /* long lines so records straddle the 1 MiB read chunks */
  size_t total = 0;
  char *text = malloc(4 << 20);
  for (int i = 0; i < 300; i++) {
    int len = 100 + (i * 7919) % 20000;
    for (int k = 0; k < len; k++) text[total++] = (char)('a' + (k % 26));
    text[total++] = '\n';
    if (i % 50 == 0) text[total++] = '\n';
  }
  fwrite(text, 1, total, f);
  fclose(f);
  mml_index a = {0}, b = {0};
  mml_err err = {0};
  CHECK_OK(mml_index_add_file(&a, path, MML_LAYOUT_AUTO, &err), err);
  CHECK_OK(mml_index_add_bytes(&b, path, MML_LAYOUT_AUTO, (const uint8_t *)text, total, &err), err);
  check_same(&a, &b);
  CHECK_EQ_INT(a.n, 300);
  CHECK_EQ_INT(mml_index_hash(&a), mml_index_hash(&b));
  /* a second shard continues the global numbering */
  CHECK_OK(
      mml_index_add_bytes(&a, "two.jsonl", MML_LAYOUT_AUTO, (const uint8_t *)"x\ny\n", 4, &err),
      err);
  CHECK_EQ_INT(a.n, 302);
  int shard;
  int64_t off, len, line;
  mml_index_locate(&a, 301, &shard, &off, &len, &line);
  CHECK_EQ_INT(shard, 1);
  CHECK_EQ_INT(off, 2);
  CHECK_EQ_INT(line, 2);
  mml_index_locate(&a, 299, &shard, &off, &len, &line);
  CHECK_EQ_INT(shard, 0);
  CHECK_EQ_INT(line, 300 + 6);
  CHECK(mml_index_hash(&a) != mml_index_hash(&b));
  mml_index_free(&a);
  mml_index_free(&b);
  free(text);
  unlink(path);
}

TEST(test_empty_and_missing) {
  mml_index ix = {0};
  mml_err err = {0};
  CHECK_OK(mml_index_add_bytes(&ix, "e", MML_LAYOUT_AUTO, (const uint8_t *)"", 0, &err), err);
  CHECK_OK(mml_index_add_bytes(&ix, "ws", MML_LAYOUT_AUTO, (const uint8_t *)" \n\n", 3, &err), err);
  CHECK_OK(mml_index_add_bytes(&ix, "one", MML_LAYOUT_AUTO, (const uint8_t *)"z", 1, &err), err);
  CHECK_EQ_INT(ix.n, 1);
  int shard;
  int64_t off, len, line;
  mml_index_locate(&ix, 0, &shard, &off, &len, &line);
  CHECK_EQ_INT(shard, 2);
  CHECK_EQ_INT(len, 1);
  CHECK(mml_index_add_file(&ix, "/nonexistent/shard.jsonl", MML_LAYOUT_AUTO, &err) == MML_ENOENT);
  CHECK(strstr(err.msg, "/nonexistent/shard.jsonl") != NULL);
  mml_index_free(&ix);
}

/* Builds one shard from `data` fed in pieces of `step` bytes. */
static mml_status build_stepped(mml_index *ix, const char *name, const uint8_t *data, size_t len,
                                size_t step, mml_err *err) {
  mml_index_builder *b;
  mml_status st = mml_index_begin(ix, name, MML_LAYOUT_AUTO, &b, err);
  for (size_t i = 0; !st && i < len; i += step)
    st = mml_index_feed(b, data + i, len - i < step ? len - i : step, err);
  if (st) {
    mml_index_abort(b);
    return st;
  }
  return mml_index_end(b, err);
}

static const char k_array[] =
    "\xef\xbb\xbf [\n  {\"a\": \"x],[}{\\\"\\\\\"},\n  {\"b\": [1, [2, {\"c\": null}]]} ,"
    "\"str,]\", 12 ,[3], {}\n]\n";

TEST(test_json_array_elements) {
  static const char *const want[] = {"{\"a\": \"x],[}{\\\"\\\\\"}",
                                     "{\"b\": [1, [2, {\"c\": null}]]}",
                                     "\"str,]\"",
                                     "12",
                                     "[3]",
                                     "{}"};
  size_t n = strlen(k_array);
  for (size_t step = 1; step <= n; step += step < 8 ? 1 : 13) {
    mml_index ix = {0};
    mml_err err = {0};
    CHECK_OK(build_stepped(&ix, "a.json", (const uint8_t *)k_array, n, step, &err), err);
    CHECK_EQ_INT(ix.n, 6);
    CHECK_EQ_INT(ix.shards[0].layout, MML_LAYOUT_JSON);
    for (int64_t i = 0; i < ix.n; i++) {
      int shard;
      int64_t off, len, where;
      mml_index_locate(&ix, i, &shard, &off, &len, &where);
      CHECK_EQ_INT(where, i);
      size_t rl = mml_index_record_len(&ix.shards[0], (const uint8_t *)k_array + off, (size_t)len);
      char buf[64];
      snprintf(buf, sizeof buf, "%.*s", (int)rl, k_array + off);
      CHECK_EQ_STR(buf, want[i]);
    }
    mml_index_free(&ix);
  }
}

TEST(test_gzip_fed_bytewise) {
  /* two gzip members of JSON lines */
  const char *text = "{\"x\": 1}\n\n{\"y\": 2}\n{\"z\": 3}";
  uint8_t gz[512];
  size_t total = 0;
  for (int part = 0; part < 2; part++) {
    const char *p = part ? text + 10 : text;
    size_t len = part ? strlen(text) - 10 : 10;
    z_stream z = {0};
    CHECK(deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    z.next_in = (Bytef *)p;
    z.avail_in = (uInt)len;
    z.next_out = gz + total;
    z.avail_out = (uInt)(sizeof gz - total);
    CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END);
    total = sizeof gz - z.avail_out;
    deflateEnd(&z);
  }
  for (size_t step = 1; step <= total; step *= 3) {
    mml_index ix = {0};
    mml_err err = {0};
    CHECK_OK(build_stepped(&ix, "g.jsonl.gz", gz, total, step, &err), err);
    CHECK_EQ_INT(ix.n, 3);
    CHECK_EQ_INT(ix.shards[0].compression, MML_COMPRESS_GZIP);
    CHECK(ix.shards[0].fd >= 0);
    CHECK(!mml_index_shard_remote(&ix.shards[0]));
    int shard;
    int64_t off, len, line;
    mml_index_locate(&ix, 1, &shard, &off, &len, &line);
    CHECK_EQ_INT(line, 3);
    mml_bytes rec = {0};
    CHECK_OK(mml_index_read(&ix.shards[0], off, len, &rec, &err), err);
    CHECK_EQ_INT(mml_index_record_len(&ix.shards[0], rec.data, rec.len), 8);
    CHECK(!memcmp(rec.data, "{\"y\": 2}", 8));
    mml_bytes_free(&rec);
    mml_index_free(&ix);
  }
  /* truncated: refused, and the shard is dropped */
  mml_index ix = {0};
  mml_err err = {0};
  CHECK(build_stepped(&ix, "cut.gz", gz, total - 3, 5, &err) == MML_ERECORD);
  CHECK(strstr(err.msg, "truncated gzip data") != NULL);
  CHECK_EQ_INT(ix.nshards, 0);
  CHECK_EQ_INT(ix.n, 0);
  mml_index_free(&ix);
}
