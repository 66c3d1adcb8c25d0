/* test-hardening.c — hostile input at the core's edges (issue 20): message text (UTF-8
 * repair, shortening in the middle, URL redaction), the record pre-scan (nesting depth,
 * "\u0000", image count), the decoder's pixel limit, refusing FIFOs, and the
 * tokenizer.json merge ["", ""] that tripped UBSan.  The fuzz targets' crashes land here
 * as regression cases. */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mml/fetch.h"
#include "mml/fetch_sync.h"
#include "mml/image.h"
#include "mml/message.h"
#include "mml/record.h"
#include "mml/tokenizer.h"
#include "mml_fixture.h"
#include "mml_test.h"

TEST(escape_makes_valid_utf8) {
  char out[64];
  const char bad[] = "a\xff\xc3(\xe4\xb8\xad\n";
  size_t n = mml_text_escape(out, sizeof out, bad, sizeof bad - 1, 0);
  CHECK_EQ_STR(out, "a\\xff\\xc3(\xe4\xb8\xad\n");
  CHECK(mml_utf8_valid(out, n));
  mml_text_escape(out, sizeof out, "x\ny\x01", 4, 1);
  CHECK_EQ_STR(out, "x\\x0ay\\x01");
  /* stops before a character that does not fit: never half a character */
  mml_text_escape(out, 3, "\xe4\xb8\xad", 3, 0);
  CHECK_EQ_STR(out, "");
}

TEST(short_keeps_both_ends_on_character_boundaries) {
  char long_s[4000], buf[MML_SHORT_CAP(64)];
  size_t n = 0;
  for (int i = 0; i < 1000; i++) memcpy(long_s + n, "\xc3\xa9", 2), n += 2; /* é */
  memcpy(long_s + n, "/name.jpg", 9), n += 9;
  const char *s = mml_text_short(long_s, n, 64, buf, sizeof buf);
  CHECK(strlen(s) <= 64);
  CHECK(mml_utf8_valid(s, strlen(s)));
  CHECK(strstr(s, "\xe2\x80\xa6") != NULL);
  CHECK(strstr(s, "/name.jpg") != NULL);
  CHECK(!strncmp(s, "\xc3\xa9", 2));
  CHECK_EQ_STR(mml_text_short("short", 5, 64, buf, sizeof buf), "short");
  /* invalid bytes at the cut */
  char bad[300];
  memset(bad, 0xff, sizeof bad);
  s = mml_text_short(bad, sizeof bad, 64, buf, sizeof buf);
  CHECK(strlen(s) <= 64 && mml_utf8_valid(s, strlen(s)));
}

TEST(redaction_of_urls_in_text) {
  char *r = mml_url_redact(
      "https://user:pw@host.example/a/b?X-Amz-Signature=abc&x=1&X-Amz-Credential=AK%2F1");
  CHECK_EQ_STR(r,
               "https://host.example/a/b?X-Amz-Signature=REDACTED&x=1&X-Amz-Credential=REDACTED");
  free(r);
  mml_bytes b = {0};
  const char *t =
      "image s3://b/k.jpg?sig=SECRET&v=2: GET https://h/x?token=SECRET, then http://u:SECRET@h/";
  CHECK_OK(mml_text_redact(t, strlen(t), &b), (mml_err){0});
  mml_bytes_append(&b, "", 1);
  CHECK_EQ_STR((char *)b.data,
               "image s3://b/k.jpg?sig=REDACTED&v=2: GET https://h/x?token=REDACTED, "
               "then http://h/");
  mml_bytes_free(&b);
  /* every message of the core goes through it */
  mml_err e;
  mml_err_set(&e, MML_EFETCH, "image %s: %s", "https://h/a.jpg?X-Amz-Signature=SECRET",
              "bad \xff byte");
  CHECK(strstr(e.msg, "SECRET") == NULL);
  CHECK(mml_utf8_valid(e.msg, strlen(e.msg)));
  mml_err_prefix(&e, "shard:%d", 3);
  CHECK(!strncmp(e.msg, "shard:3: image https://h/a.jpg?X-Amz-Signature=REDACTED", 54));
}

/* issue 29 item 11: the gaps of the old rule (a URL ended at a quote, '<' or a backtick;
 * fragments were kept; a reference was cut before it was redacted) */
static void check_redacted(const char *text, const char *want) {
  mml_bytes b = {0};
  CHECK_OK(mml_text_redact(text, strlen(text), &b), (mml_err){0});
  mml_bytes_append(&b, "", 1);
  CHECK_EQ_STR((char *)b.data, want);
  mml_bytes_free(&b);
}

TEST(redaction_one_rule_for_every_delimiter) {
  check_redacted("image \"https://h/a.jpg?x=1\"&token=S1\": HTTP 404",
                 "image \"https://h/a.jpg?x=1\"&token=REDACTED\": HTTP 404");
  check_redacted("<https://h/a?x=<&sig=S2>", "<https://h/a?x=<&sig=REDACTED>");
  check_redacted("`https://h/a?x=`&X-Amz-Signature=S3`",
                 "`https://h/a?x=`&X-Amz-Signature=REDACTED`");
  check_redacted("see https://h/a.jpg#access_token=S4&state=1.",
                 "see https://h/a.jpg#access_token=REDACTED&state=1.");
  check_redacted("https://h/a?x=1#id_token=S5", "https://h/a?x=1#id_token=REDACTED");
  check_redacted("https://h/a?x=1;api_key=S6", "https://h/a?x=1;api_key=REDACTED");
  check_redacted("https://h/a?x=1\\u0026token=S7", "https://h/a?x=1\\u0026token=REDACTED");
  check_redacted("https://h/a?X-Amz-%53ignature=S8", "https://h/a?X-Amz-%53ignature=REDACTED");
  check_redacted("\"https://u:p\"S9@h/a.jpg\"", "\"https://h/a.jpg\"");
  check_redacted("x://y\"https://u:S10@h/a", "x://y\"https://h/a");
  check_redacted("(https://h/a?v=1), done", "(https://h/a?v=1), done");
  char *r = mml_url_redact("https://h/a.jpg#token=S11");
  CHECK_EQ_STR(r, "https://h/a.jpg#token=REDACTED");
  free(r);
  /* a long reference cut in the middle: the value kept in the tail lost its name */
  char ref[1200], buf[MML_SHORT_CAP(200)];
  snprintf(ref, sizeof ref, "https://h/%0900d?X-Amz-Signature=S12SECRETVALUE", 0);
  const char *s = mml_text_short(ref, strlen(ref), 200, buf, sizeof buf);
  CHECK(strstr(s, "S12SECRETVALUE") == NULL);
  CHECK(strstr(s, "X-Amz-Signature=REDACTED") != NULL);
}

TEST(long_messages_are_shortened_in_the_middle) {
  char ref[3000];
  memset(ref, 'd', sizeof ref);
  memcpy(ref + sizeof ref - 10, "/tail.jpg", 10);
  mml_err e;
  mml_err_set(&e, MML_ENOENT, "%s: no such file", ref);
  CHECK(strlen(e.msg) < MML_ERR_MSG);
  CHECK(strstr(e.msg, "no such file") != NULL);
  mml_err_prefix(&e, "image %s", ref);
  CHECK(strstr(e.msg, "no such file") != NULL);
  CHECK(!strncmp(e.msg, "image ddd", 9));
}

static mml_status parse(const char *line, const mml_record_opts *o, mml_record *r, mml_err *e) {
  return mml_record_parse_opts(line, strlen(line), o, r, e);
}

TEST(record_depth_nul_and_image_count) {
  mml_record r = {0};
  mml_err e = {0};
  char deep[600];
  int n = snprintf(deep, sizeof deep, "{\"x\":");
  for (int i = 0; i < 200; i++) deep[n++] = '[';
  for (int i = 0; i < 200; i++) deep[n++] = ']';
  snprintf(deep + n, sizeof deep - n, ",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}");
  CHECK_EQ_INT(parse(deep, NULL, &r, &e), MML_ERECORD);
  CHECK(strstr(e.msg, "max_json_depth=64") != NULL);
  mml_record_opts deep_ok = {.max_json_depth = 300};
  CHECK_OK(parse(deep, &deep_ok, &r, &e), e);
  /* brackets inside strings do not count; escaped quotes do not end a string */
  CHECK_OK(parse("{\"x\":\"[[[[\\\"[[[[\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}",
                 &(mml_record_opts){.max_json_depth = 3}, &r, &e),
           e);
  CHECK_EQ_INT(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000<image>\"}],"
                     "\"images\":[\"a.jpg\"]}",
                     NULL, &r, &e),
               MML_ERECORD);
  CHECK(strstr(e.msg, "U+0000") != NULL);
  /* "\\u0000" is a backslash and text, not a NUL */
  CHECK_OK(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"a\\\\u0000\"}]}", NULL, &r, &e),
           e);
  mml_record_opts two = {.max_images = 2};
  CHECK_EQ_INT(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"<image><image><image>\"}],"
                     "\"images\":[\"a\",\"b\",\"c\"]}",
                     &two, &r, &e),
               MML_ETOOMANYIMAGES);
  CHECK(strstr(e.msg, "max_images_per_sample=2") != NULL);
  CHECK_EQ_INT(parse("{\"messages\":[{\"role\":\"user\",\"content\":[{\"image\":\"a\"},"
                     "{\"image\":\"b\"},{\"image\":\"c\"}]}]}",
                     &two, &r, &e),
               MML_ETOOMANYIMAGES);
  mml_record_free(&r);
}

TEST(decoder_pixel_limit_before_decoding) {
  /* a JPEG header declaring 20799x50952 (1.06 Gpx) and nothing else */
  static const uint8_t jpg[] = {0xFF, 0xD8, 0xFF, 0xC0, 0x00, 0x11, 0x08, 0xC7,
                                0x08, 0x51, 0x3F, 0x03, 0x01, 0x22, 0x00, 0x02,
                                0x11, 0x01, 0x03, 0x11, 0x01, 0xFF, 0xD9};
  mml_decoder *d = NULL;
  CHECK_OK(mml_decoder_new(&d), (mml_err){0});
  mml_rgb8 img;
  mml_err e = {0};
  CHECK_EQ_INT(mml_image_decode(d, jpg, sizeof jpg, 1, &img, &e), MML_ETOOBIG);
  CHECK(strstr(e.msg, "max_image_pixels=178956970") != NULL);
  mml_decoder_set_max_pixels(d, 100);
  CHECK_EQ_INT(mml_image_decode(d, jpg, sizeof jpg, 1, &img, &e), MML_ETOOBIG);
  CHECK(strstr(e.msg, "max_image_pixels=100") != NULL);
  mml_decoder_free(d);
}

TEST(fifo_and_devices_are_refused_without_blocking) {
  char dir[] = "/tmp/mml-hardening-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char fifo[64];
  snprintf(fifo, sizeof fifo, "%s/pipe", dir);
  CHECK(mkfifo(fifo, 0600) == 0);
  mml_bytes b = {0};
  mml_err e = {0};
  CHECK_EQ_INT(mml_read_file(fifo, 0, -1, &b, &e), MML_EIO); /* returns: no writer needed */
  CHECK(strstr(e.msg, "FIFO") != NULL);
  CHECK_EQ_INT(mml_read_file("/dev/zero", 0, -1, &b, &e), MML_EIO);
  CHECK(strstr(e.msg, "character device") != NULL);
  CHECK_EQ_INT(mml_read_file(dir, 0, -1, &b, &e), MML_EIO);
  CHECK_EQ_INT(mml_read_file_max("/etc/hostname", 0, -1, 1, &b, &e), MML_EOBJECTSIZE);
  unlink(fifo);
  rmdir(dir);
  mml_bytes_free(&b);
}

TEST(tokenizer_empty_merge_is_an_error) {
  mml_bytes j = {0};
  mml_err e = {0};
  CHECK_OK(mml_read_file("../../mmloader/data/tiny-tokenizer.json", 0, -1, &j, &e), e);
  const char *m = strstr((const char *)j.data, "\"merges\": [");
  CHECK(m != NULL);
  size_t at = (size_t)(m - (const char *)j.data) + 11;
  mml_bytes k = {0};
  mml_bytes_append(&k, j.data, at);
  mml_bytes_append(&k, "[\"\", \"\"], ", 10);
  mml_bytes_append(&k, j.data + at, j.len - at);
  mml_tokenizer *t = NULL;
  CHECK_EQ_INT(mml_tokenizer_load_json((const char *)k.data, k.len, &t, &e), MML_ECONFIG);
  CHECK(strstr(e.msg, "merges[0]: an empty token") != NULL);
  CHECK(t == NULL);
  mml_bytes_free(&j);
  mml_bytes_free(&k);
}

/* Found by fuzz-record and fuzz-bpe-encode (clang's UBSan: NULL + 0): a record whose
 * messages hold no part at all, and decoding no ids. */
TEST(fuzz_findings) {
  mml_record r = {0};
  mml_err e = {0};
  CHECK_OK(parse("{\"messages\":[{\"role\":\"a\\u0001b\"}]}", NULL, &r, &e), e);
  CHECK_EQ_INT(r.nmessages, 1);
  CHECK_EQ_INT(r.messages[0].nparts, 0);
  mml_record_free(&r);
  mml_tokenizer *t = NULL;
  CHECK_OK(mml_tokenizer_load("../../mmloader/data/tiny-tokenizer.json", &t, &e), e);
  mml_bytes out = {0};
  CHECK_OK(mml_tokenizer_decode(t, NULL, 0, &out, &e), e);
  CHECK_EQ_INT(out.len, 0);
  mml_tokenizer_free(t);
}

/* Found by fuzz-http (corpus/http/regress-folded-after-reuse): a response whose first
 * header line is folded, after an ordinary response, made libcurl < 8.1.0 (Debian 12:
 * 7.88.1) read and free a header of the earlier transfer when the easy handle was a
 * reset, reused one (curl issue 11101).  Each transfer has a fresh handle now: the second
 * GET fails cleanly (libcurl refuses the fold), under ASan without a report. */
TEST(folded_first_header_after_another_transfer) {
  static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\n\r\nok";
  static const char folded[] = "HTTP/1.1 200 OK\r\n\tX-B: c\r\nContent-Length: 2\r\n\r\nok";
  const char *const replies[] = {ok, folded, ok};
  const size_t lens[] = {sizeof ok - 1, sizeof folded - 1, sizeof ok - 1};
  mml_test_server s;
  CHECK(mml_test_server_start(&s, replies, lens, 3) == 0);
  mml_fetch_cfg cfg = {.max_retries = -1};
  mml_fetcher *f = NULL;
  mml_err err = {0};
  CHECK_OK(mml_fetcher_new(&cfg, &f, &err), err);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/x", s.port);
  mml_bytes b = {0};
  CHECK_OK(mml_fetch_get(f, url, 0, -1, &b, &err), err);
  CHECK(b.len == 2 && !memcmp(b.data, "ok", 2));
  mml_bytes_free(&b);
  CHECK(mml_fetch_get(f, url, 0, -1, &b, &err) != MML_OK);
  CHECK(strstr(err.msg, "/x") != NULL);
  CHECK_OK(mml_fetch_get(f, url, 0, -1, &b, &err), err); /* the fetcher still works */
  CHECK(b.len == 2 && !memcmp(b.data, "ok", 2));
  mml_bytes_free(&b);
  mml_fetcher_free(f);
  mml_test_server_stop(&s);
}
