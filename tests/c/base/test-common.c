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

/* 1 when s is valid UTF-8 */
static int utf8_ok(const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    int k = *p < 0x80             ? 0
            : (*p & 0xE0) == 0xC0 ? 1
            : (*p & 0xF0) == 0xE0 ? 2
            : (*p & 0xF8) == 0xF0 ? 3
                                  : -1;
    if (k < 0) return 0;
    for (int i = 1; i <= k; i++)
      if ((p[i] & 0xC0) != 0x80) return 0;
    p += k + 1;
  }
  return 1;
}

TEST(long_values_are_shortened_in_the_middle) {
  /* a 100 kB data: URI in the middle of a message: the reason at the end survives */
  size_t n = 100000;
  char *uri = malloc(n + 1);
  memcpy(uri, "data:image/png;base64,", 22);
  for (size_t i = 22; i < n; i++)
    uri[i] =
        "\xc3\xa9"
        "ab"[i % 4]; /* UTF-8 "é" + ASCII */
  memcpy(uri + n - 4, "TAIL", 4);
  uri[n] = 0;
  mml_err e = {0};
  mml_err_set(&e, MML_ENOENT, "image %s: No such file or directory", uri);
  mml_err_prefix(&e, "/data/shard-%05d.jsonl:%d", 3, 17);
  CHECK(strlen(e.msg) < MML_ERR_MSG);
  CHECK(!strncmp(e.msg, "/data/shard-00003.jsonl:17: image data:image/png;base64,", 56));
  CHECK(strstr(e.msg, "...") != NULL);
  const char *end = ": No such file or directory";
  CHECK(!strcmp(e.msg + strlen(e.msg) - strlen(end), end));
  CHECK(strstr(e.msg, "TAIL: No such file") != NULL);
  CHECK(utf8_ok(e.msg));
  /* two long values: both shortened as needed; short messages untouched */
  mml_err_set(&e, MML_EFETCH, "%s -> %s: HTTP 404", uri, uri);
  CHECK(strstr(e.msg, "HTTP 404") != NULL && utf8_ok(e.msg));
  mml_err_set(&e, MML_EIO, "short %s", "value");
  CHECK_EQ_STR(e.msg, "short value");
  /* nothing long to shorten: cut at the end, on a character boundary */
  char words[2000];
  for (int i = 0; i < 1999; i++) words[i] = i % 3 == 2 ? ' ' : 'w';
  words[1999] = 0;
  mml_err_set(&e, MML_EIO, "%s", words);
  CHECK_EQ_INT(strlen(e.msg), MML_ERR_MSG - 1);
  char out[8];
  CHECK_EQ_INT(mml_text_fit(out, sizeof out, "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", 8), 6);
  CHECK(utf8_ok(out));
  free(uri);
}
