/* test-index.c — line offsets, blank lines, missing trailing newline, chunk boundaries,
 * line numbers; file and in-memory builds agree. */
#include <stdio.h>
#include <unistd.h>

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
  CHECK_OK(mml_index_add_bytes(&ix, "mem.jsonl", (const uint8_t *)text, strlen(text), &err), err);
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
  CHECK_OK(mml_index_add_file(&a, path, &err), err);
  CHECK_OK(mml_index_add_bytes(&b, path, (const uint8_t *)text, total, &err), err);
  check_same(&a, &b);
  CHECK_EQ_INT(a.n, 300);
  CHECK_EQ_INT(mml_index_hash(&a), mml_index_hash(&b));
  /* a second shard continues the global numbering */
  CHECK_OK(mml_index_add_bytes(&a, "two.jsonl", (const uint8_t *)"x\ny\n", 4, &err), err);
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
  CHECK_OK(mml_index_add_bytes(&ix, "e", (const uint8_t *)"", 0, &err), err);
  CHECK_OK(mml_index_add_bytes(&ix, "ws", (const uint8_t *)" \n\n", 3, &err), err);
  CHECK_OK(mml_index_add_bytes(&ix, "one", (const uint8_t *)"z", 1, &err), err);
  CHECK_EQ_INT(ix.n, 1);
  int shard;
  int64_t off, len, line;
  mml_index_locate(&ix, 0, &shard, &off, &len, &line);
  CHECK_EQ_INT(shard, 2);
  CHECK_EQ_INT(len, 1);
  CHECK(mml_index_add_file(&ix, "/nonexistent/shard.jsonl", &err) == MML_ENOENT);
  CHECK(strstr(err.msg, "/nonexistent/shard.jsonl") != NULL);
  mml_index_free(&ix);
}

MML_TEST_MAIN(RUN(test_lines_and_blanks); RUN(test_file_matches_memory_and_shards);
              RUN(test_empty_and_missing))
