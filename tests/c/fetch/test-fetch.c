/*
 * test-fetch.c — the fetch core: SHA-256/HMAC and SigV4 against published vectors, pure
 * helpers (backoff, redaction, XML), and the fetcher's I/O thread against a scripted
 * one-thread HTTP server on 127.0.0.1 (short bodies, 503 + Retry-After, resets,
 * cancellation on free).  Every wait is bounded.
 */
#include <pthread.h>
#include <unistd.h>

#include "mml/fetch.h"
#include "mml/fetch_sync.h"
#include "mml/message.h"
#include "mml/s3.h"
#include "mml/sigv4.h"
#include "mml_fixture.h"
#include "mml_test.h"

static void hex_of(const void *p, size_t n, char *out) {
  uint8_t d[32];
  mml_sha256(p, n, d);
  mml_hex_lower(d, 32, out);
}

TEST(sha256_vectors) {
  char h[65];
  hex_of("", 0, h);
  CHECK_EQ_STR(h, MML_SHA256_EMPTY);
  hex_of("abc", 3, h);
  CHECK_EQ_STR(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  hex_of(m, strlen(m), h);
  CHECK_EQ_STR(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  /* one million 'a', fed in uneven pieces */
  mml_sha256_ctx c;
  mml_sha256_init(&c);
  char a[1000];
  memset(a, 'a', sizeof a);
  size_t done = 0, step = 1;
  while (done < 1000000) {
    size_t n = step < 1000000 - done ? step : 1000000 - done;
    if (n > sizeof a) n = sizeof a;
    mml_sha256_update(&c, a, n);
    done += n;
    step = step * 7 % 997 + 1;
  }
  uint8_t d[32];
  mml_sha256_final(&c, d);
  mml_hex_lower(d, 32, h);
  CHECK_EQ_STR(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(hmac_vectors) {
  uint8_t d[32];
  char h[65];
  const char *msg = "what do ya want for nothing?";
  mml_hmac_sha256("Jefe", 4, msg, strlen(msg), d); /* RFC 4231 case 2 */
  mml_hex_lower(d, 32, h);
  CHECK_EQ_STR(h, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  char k[100], m2[200];
  memset(k, 'k', sizeof k), memset(m2, 'm', sizeof m2); /* key longer than a block */
  mml_hmac_sha256(k, sizeof k, m2, sizeof m2, d);
  mml_hex_lower(d, 32, h);
  CHECK_EQ_STR(h, "a6bca6f4482167eeffadc0449a346c21ffe8f96177eceecaeb182b610f6128c8");
}

/* AWS SigV4 test suite: get-vanilla */
TEST(sigv4_get_vanilla) {
  mml_sigv4_header hs[] = {{"host", "example.amazonaws.com"}, {"x-amz-date", "20150830T123600Z"}};
  mml_sigv4_req r = {"GET",
                     "/",
                     "",
                     hs,
                     2,
                     MML_SHA256_EMPTY,
                     "20150830T123600Z",
                     "us-east-1",
                     "service",
                     "AKIDEXAMPLE",
                     "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"};
  char out[512];
  mml_err err = {0};
  CHECK_OK(mml_sigv4_authorization(&r, out, sizeof out, &err), err);
  CHECK_EQ_STR(out,
               "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
               "SignedHeaders=host;x-amz-date, "
               "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
}

/* S3 documentation examples (GET object with a Range; ListObjects with a query). */
TEST(sigv4_s3_examples) {
  const char *sk = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
  mml_sigv4_header get[] = {{"x-amz-date", "20130524T000000Z"},
                            {"range", "bytes=0-9"},
                            {"host", "examplebucket.s3.amazonaws.com"},
                            {"x-amz-content-sha256", MML_SHA256_EMPTY}};
  mml_sigv4_req r = {"GET",
                     "/test.txt",
                     "",
                     get,
                     4,
                     MML_SHA256_EMPTY,
                     "20130524T000000Z",
                     "us-east-1",
                     "s3",
                     "AKIAIOSFODNN7EXAMPLE",
                     sk};
  char out[512];
  mml_err err = {0};
  CHECK_OK(mml_sigv4_authorization(&r, out, sizeof out, &err), err);
  CHECK(strstr(out, "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"));
  CHECK(strstr(out, "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"));
  mml_sigv4_header list[] = {{"host", "examplebucket.s3.amazonaws.com"},
                             {"x-amz-content-sha256", MML_SHA256_EMPTY},
                             {"x-amz-date", "20130524T000000Z"}};
  mml_sigv4_req l = {
      "GET",       "/",  "max-keys=2&prefix=J",  list, 3, MML_SHA256_EMPTY, "20130524T000000Z",
      "us-east-1", "s3", "AKIAIOSFODNN7EXAMPLE", sk};
  CHECK_OK(mml_sigv4_authorization(&l, out, sizeof out, &err), err);
  CHECK(strstr(out, "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"));
  /* failures never echo the secret */
  CHECK(mml_sigv4_authorization(&l, out, 20, &err) == MML_EINVAL);
  CHECK(!strstr(err.msg, sk));
  l.access_key = "";
  CHECK(mml_sigv4_authorization(&l, out, sizeof out, &err) == MML_EINVAL);
}

TEST(uri_encode) {
  mml_bytes b = {0};
  const char *s = "a b/c+d~e%f_g.h-\xc3\xa9";
  CHECK_OK(mml_uri_encode(s, strlen(s), 1, &b), (mml_err){0});
  CHECK_EQ_STR((char *)b.data, "a%20b/c%2Bd~e%25f_g.h-%C3%A9");
  mml_bytes_clear(&b);
  CHECK_OK(mml_uri_encode("x/y", 3, 0, &b), (mml_err){0});
  CHECK_EQ_STR((char *)b.data, "x%2Fy");
  mml_bytes_free(&b);
}

TEST(backoff) {
  double prev_hi = 0;
  for (int a = 1; a <= 12; a++) {
    double lo = mml_fetch_backoff(0.05, 5, a, -1, 0.0),
           hi = mml_fetch_backoff(0.05, 5, a, -1, 0.999999);
    double d = 0.05 * (double)(1 << (a - 1));
    if (d > 5) d = 5;
    CHECK(lo >= d / 2 - 1e-12 && lo <= d / 2 + 1e-12);
    CHECK(hi <= d + 1e-12 && hi > d * 0.99);
    CHECK(hi >= prev_hi - 1e-12); /* grows until capped */
    prev_hi = hi;
  }
  CHECK(mml_fetch_backoff(0.05, 5, 1000, -1, 0.5) <= 5);
  CHECK(mml_fetch_backoff(0.05, 5, 1, 2.0, 0.5) == 2.0);  /* Retry-After wins */
  CHECK(mml_fetch_backoff(0.05, 5, 1, 1e9, 0.5) == 60.0); /* ... within reason */
}

TEST(redact) {
  char *r = mml_url_redact(
      "https://user:pw@host.example/a/b?X-Amz-Signature=abc&x=1&X-Amz-Credential=AK%2F1");
  CHECK_EQ_STR(r,
               "https://host.example/a/b?X-Amz-Signature=REDACTED&x=1&X-Amz-Credential=REDACTED");
  free(r);
  r = mml_url_redact("s3://bucket/key@v?versionId=3");
  CHECK_EQ_STR(r, "s3://bucket/key@v?versionId=3");
  free(r);
}

TEST(xml) {
  const char *doc =
      "<Error><Code>NoSuchKey</Code><Message>a &amp; b &lt;c&gt; &#233;&#x41;</Message></Error>";
  char out[64];
  CHECK(mml_xml_text(doc, strlen(doc), "Code", out, sizeof out));
  CHECK_EQ_STR(out, "NoSuchKey");
  CHECK(mml_xml_text(doc, strlen(doc), "Message", out, sizeof out));
  CHECK_EQ_STR(out,
               "a & b <c> \xc3\xa9"
               "A");
  CHECK(!mml_xml_text(doc, strlen(doc), "Key", out, sizeof out));
  CHECK_EQ_STR(out, "");
  CHECK(!mml_xml_text("<Code>unterminated", 18, "Code", out, sizeof out));
  CHECK(mml_xml_text(doc, strlen(doc), "Message", out, 8)); /* truncates, stays terminated */
  CHECK(strlen(out) < 8);
}

TEST(s3_addressing) {
  mml_s3_addr a;
  mml_err err = {0};
  CHECK_OK(mml_s3_address("s3://my-bucket/dir/a b+c.jpg", NULL, "eu-west-1", NULL, &a, &err), err);
  CHECK_EQ_STR(a.http_url, "https://my-bucket.s3.eu-west-1.amazonaws.com/dir/a%20b%2Bc.jpg");
  CHECK_EQ_STR(a.host, "my-bucket.s3.eu-west-1.amazonaws.com");
  CHECK_EQ_STR(a.canonical_uri, "/dir/a%20b%2Bc.jpg");
  mml_s3_addr_free(&a);
  CHECK_OK(mml_s3_address("s3://my.dotted.bucket/k", NULL, NULL, NULL, &a, &err), err);
  CHECK_EQ_STR(a.http_url, "https://s3.us-east-1.amazonaws.com/my.dotted.bucket/k");
  CHECK_EQ_STR(a.host, "s3.us-east-1.amazonaws.com");
  mml_s3_addr_free(&a);
  CHECK_OK(mml_s3_address("s3://b/x/y.jsonl", NULL, "us-east-1", "http://127.0.0.1:9000", &a, &err),
           err);
  CHECK_EQ_STR(a.http_url, "http://127.0.0.1:9000/b/x/y.jsonl");
  CHECK_EQ_STR(a.host, "127.0.0.1:9000");
  CHECK_EQ_STR(a.canonical_uri, "/b/x/y.jsonl");
  mml_s3_addr_free(&a);
  CHECK_OK(
      mml_s3_address("s3://b", "list-type=2&prefix=p", "us-east-1", "minio.local:9000/", &a, &err),
      err);
  CHECK_EQ_STR(a.http_url, "https://minio.local:9000/b?list-type=2&prefix=p");
  CHECK_EQ_STR(a.canonical_uri, "/b");
  mml_s3_addr_free(&a);
  CHECK_OK(mml_s3_address("s3://b", "list-type=2", "us-east-1", NULL, &a, &err), err);
  CHECK_EQ_STR(a.http_url, "https://b.s3.us-east-1.amazonaws.com/?list-type=2");
  CHECK_EQ_STR(a.canonical_uri, "/");
  mml_s3_addr_free(&a);
  CHECK(mml_s3_address("s3://bad bucket/k", NULL, NULL, NULL, &a, &err) == MML_EINVAL);
  CHECK(mml_s3_address("http://x/k", NULL, NULL, NULL, &a, &err) == MML_EINVAL);
  CHECK(mml_s3_address("s3://b/k", NULL, NULL, "http:///nohost", &a, &err) == MML_ECONFIG);
}

TEST(retries_short_and_503) {
  static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789";
  static const char shortb[] = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234";
  static const char slow[] =
      "HTTP/1.1 503 Slow Down\r\nRetry-After: 0\r\nContent-Length: 71\r\n\r\n"
      "<Error><Code>SlowDown</Code><Message>Reduce your rate</Message></Error>";
  const char *const replies[] = {shortb, slow, ok};
  const size_t lens[] = {sizeof shortb - 1, sizeof slow - 1, sizeof ok - 1};
  mml_test_server s;
  CHECK(mml_test_server_start(&s, replies, lens, 3) == 0);
  mml_fetch_cfg cfg = {.backoff_base_s = 0.001, .backoff_max_s = 0.01};
  mml_fetcher *f = NULL;
  mml_err err = {0};
  CHECK_OK(mml_fetcher_new(&cfg, &f, &err), err);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/x", s.port);
  mml_bytes b = {0};
  CHECK_OK(mml_fetch_get(f, url, 0, -1, &b, &err), err);
  CHECK_EQ_INT(b.len, 10);
  CHECK(b.len == 10 && !memcmp(b.data, "0123456789", 10));
  mml_fetch_stats st;
  mml_fetch_get_stats(f, &st);
  CHECK_EQ_INT(st.requests, 3);
  CHECK_EQ_INT(st.retries_short, 1);
  CHECK_EQ_INT(st.retries_5xx, 1);
  CHECK_EQ_INT(st.failures, 0);
  mml_bytes_free(&b);
  mml_fetcher_free(f);
  mml_test_server_stop(&s);
}

TEST(permanent_error_names_url_status_code) {
  static const char nf[] =
      "HTTP/1.1 404 Not Found\r\nContent-Length: 75\r\n\r\n"
      "<Error><Code>NoSuchKey</Code><Message>The key does not exist</Message></Error>";
  const char *const replies[] = {nf};
  const size_t lens[] = {sizeof nf - 1};
  mml_test_server s;
  CHECK(mml_test_server_start(&s, replies, lens, 1) == 0);
  mml_fetcher *f = NULL;
  mml_err err = {0};
  mml_fetch_cfg cfg = {.secret_key = "TOPSECRET", .access_key = "AK"};
  CHECK_OK(mml_fetcher_new(&cfg, &f, &err), err);
  char url[96];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/missing.jpg?token=TOPSECRET", s.port);
  mml_bytes b = {0};
  CHECK(mml_fetch_get(f, url, 0, -1, &b, &err) == MML_ENOENT);
  CHECK(strstr(err.msg, "/missing.jpg"));
  CHECK(strstr(err.msg, "404"));
  CHECK(strstr(err.msg, "NoSuchKey"));
  CHECK(!strstr(err.msg, "TOPSECRET"));
  mml_fetch_stats st;
  mml_fetch_get_stats(f, &st);
  CHECK_EQ_INT(st.failures, 1);
  mml_fetcher_free(f);
  mml_test_server_stop(&s);
}

TEST(connection_refused_is_retried_then_fails) {
  /* a port nobody listens on: bind, note it, close */
  mml_test_server s;
  const char *const none[] = {NULL};
  const size_t zl[] = {0};
  CHECK(mml_test_server_start(&s, none, zl, 0) == 0);
  mml_test_server_stop(&s);
  mml_fetch_cfg cfg = {.max_retries = 2, .backoff_base_s = 0.001, .backoff_max_s = 0.002};
  mml_fetcher *f = NULL;
  mml_err err = {0};
  CHECK_OK(mml_fetcher_new(&cfg, &f, &err), err);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/x", s.port);
  mml_bytes b = {0};
  CHECK(mml_fetch_get(f, url, 0, -1, &b, &err) == MML_EFETCH);
  CHECK(strstr(err.msg, "after 2 retries"));
  mml_fetch_stats st;
  mml_fetch_get_stats(f, &st);
  CHECK_EQ_INT(st.retries_reset, 2);
  mml_fetcher_free(f);
}

typedef struct {
  pthread_mutex_t mu;
  int calls;
  mml_status st;
} cb_rec;
static void rec_cb(void *ctx, mml_status st, mml_bytes *body, const mml_err *err) {
  cb_rec *r = ctx;
  pthread_mutex_lock(&r->mu);
  r->calls++;
  r->st = st;
  pthread_mutex_unlock(&r->mu);
  if (body) mml_bytes_free(body);
}

TEST(free_cancels_in_flight) {
  const char *const replies[] = {NULL}; /* accepts, reads, never answers */
  const size_t lens[] = {0};
  mml_test_server s;
  CHECK(mml_test_server_start(&s, replies, lens, 1) == 0);
  mml_fetcher *f = NULL;
  mml_err err = {0};
  CHECK_OK(mml_fetcher_new(NULL, &f, &err), err);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/hang", s.port);
  cb_rec r = {PTHREAD_MUTEX_INITIALIZER, 0, MML_OK};
  CHECK_OK(mml_fetch_submit(f, url, 0, -1, rec_cb, &r, &err), err);
  CHECK_OK(mml_fetch_submit(f, url, 5, 10, rec_cb, &r, &err), err);
  for (int i = 0; i < 500 && __atomic_load_n(&s.served, __ATOMIC_SEQ_CST) == 0; i++)
    usleep(2000); /* let it get in flight */
  mml_fetcher_free(f);
  CHECK_EQ_INT(r.calls, 2);
  CHECK_EQ_INT(r.st, MML_ECANCELLED);
  mml_test_server_stop(&s);
}

typedef struct {
  pthread_mutex_t mu;
  int calls, ok;
} many_rec;
static void many_cb(void *ctx, mml_status st, mml_bytes *body, const mml_err *err) {
  many_rec *r = ctx;
  pthread_mutex_lock(&r->mu);
  r->calls++;
  r->ok += st == MML_OK && body && body->len == 10 && !memcmp(body->data, "0123456789", 10);
  pthread_mutex_unlock(&r->mu);
  if (body) mml_bytes_free(body);
}

TEST(several_io_threads) {
  static const char ok[] =
      "HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\n0123456789";
  const char *const replies[] = {ok, ok, ok, ok, ok, ok};
  const size_t lens[] = {sizeof ok - 1, sizeof ok - 1, sizeof ok - 1,
                         sizeof ok - 1, sizeof ok - 1, sizeof ok - 1};
  mml_test_server s;
  CHECK(mml_test_server_start(&s, replies, lens, 6) == 0);
  mml_fetch_cfg cfg = {.io_threads = 3, .max_inflight = 6};
  mml_fetcher *f = NULL;
  mml_err err = {0};
  CHECK_OK(mml_fetcher_new(&cfg, &f, &err), err);
  char url[64];
  many_rec r = {PTHREAD_MUTEX_INITIALIZER, 0, 0};
  for (int i = 0; i < 6; i++) { /* distinct URLs: identical ones in flight are fetched once */
    snprintf(url, sizeof url, "http://127.0.0.1:%d/x%d", s.port, i);
    CHECK_OK(mml_fetch_submit(f, url, 0, -1, many_cb, &r, &err), err);
  }
  for (int i = 0; i < 1000; i++) {
    pthread_mutex_lock(&r.mu);
    int c = r.calls;
    pthread_mutex_unlock(&r.mu);
    if (c == 6) break;
    usleep(10000);
  }
  mml_fetch_stats st;
  mml_fetch_get_stats(f, &st);
  mml_fetcher_free(f);
  CHECK_EQ_INT(r.calls, 6);
  CHECK_EQ_INT(r.ok, 6);
  CHECK_EQ_INT(st.requests, 6);
  mml_test_server_stop(&s);
}

TEST(fetch_bad_input) {
  mml_fetcher *f = NULL;
  mml_err err = {0};
  mml_fetch_cfg bad = {.max_inflight = -1};
  CHECK(mml_fetcher_new(&bad, &f, &err) == MML_ECONFIG);
  mml_fetch_cfg bad2 = {.io_threads = 1000};
  CHECK(mml_fetcher_new(&bad2, &f, &err) == MML_ECONFIG);
  CHECK_OK(mml_fetcher_new(NULL, &f, &err), err);
  cb_rec r = {PTHREAD_MUTEX_INITIALIZER, 0, MML_OK};
  CHECK(mml_fetch_submit(f, NULL, 0, -1, rec_cb, &r, &err) == MML_EINVAL);
  CHECK(mml_fetch_submit(f, "/local/path", 0, -1, rec_cb, &r, &err) == MML_EINVAL);
  CHECK(mml_fetch_submit(f, "s3://Bad Bucket/x", 0, -1, rec_cb, &r, &err) == MML_EINVAL);
  CHECK(mml_fetch_submit(f, "s3:///x", 0, -1, rec_cb, &r, &err) == MML_EINVAL);
  CHECK(mml_fetch_submit(f, "http://127.0.0.1:1/x", -5, -1, rec_cb, &r, &err) == MML_EINVAL);
  char **urls = NULL;
  size_t n = 0;
  CHECK(mml_fetch_list(f, "http://x/y", NULL, &urls, &n, &err) == MML_EINVAL);
  CHECK_EQ_INT(r.calls, 0);
  mml_bytes b = {0};
  CHECK_OK(mml_fetch_get(f, "http://127.0.0.1:1/x", 0, 0, &b, &err),
           err); /* empty range: no request */
  CHECK_EQ_INT(b.len, 0);
  CHECK(mml_path_is_remote("s3://b/k") && mml_path_is_remote("https://h/") &&
        !mml_path_is_remote("/tmp/x"));
  mml_fetcher_free(f);
  mml_fetcher_free(NULL);
}
