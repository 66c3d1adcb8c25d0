/* test-common.c — status table, error details and growable buffers. */
#include "mml/common.h"
#include "mml_test.h"

TEST(status_table) {
  CHECK_EQ_STR(mml_status_name(MML_EDECODE), "EDECODE");
  CHECK_EQ_STR(mml_status_skip_reason(MML_EDECODE), "corrupt_image");
  CHECK(mml_status_skip_reason(MML_ECONFIG) == NULL);
  CHECK_EQ_STR(mml_status_name((mml_status)9999), "EUNKNOWN");
}

TEST(err_set_prefix) {
  mml_err e;
  CHECK_EQ_INT(mml_err_set(&e, MML_ENOENT, "%s: gone", "a.jpg"), MML_ENOENT);
  mml_err_prefix(&e, "shard %s line %d", "s.jsonl", 3);
  CHECK_EQ_STR(e.msg, "shard s.jsonl line 3: a.jpg: gone");
  CHECK_EQ_INT(mml_err_set(NULL, MML_EIO, "x"), MML_EIO);
}

TEST(buffers_grow_and_keep_capacity) {
  mml_bytes b = {0};
  for (int i = 0; i < 1000; i++) CHECK_EQ_INT(mml_bytes_append(&b, "abc", 3), MML_OK);
  CHECK_EQ_INT(b.len, 3000);
  size_t cap = b.cap;
  mml_bytes_clear(&b);
  CHECK_EQ_INT(b.cap, cap);
  mml_bytes_free(&b);
  mml_ids v = {0};
  for (int i = 0; i < 100; i++) CHECK_EQ_INT(mml_ids_push(&v, i), MML_OK);
  CHECK_EQ_INT(v.data[99], 99);
  mml_ids_free(&v);
}

TEST(read_file_missing) {
  mml_bytes b = {0};
  mml_err e = {0};
  CHECK_EQ_INT(mml_read_file("/nonexistent/x.jpg", 0, -1, &b, &e), MML_ENOENT);
  CHECK(strstr(e.msg, "/nonexistent/x.jpg") != NULL);
  mml_bytes_free(&b);
}

MML_TEST_MAIN(RUN(status_table); RUN(err_set_prefix); RUN(buffers_grow_and_keep_capacity);
              RUN(read_file_missing))
