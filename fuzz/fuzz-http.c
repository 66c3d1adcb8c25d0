/* fuzz-http.c — HTTP and S3 response handling: a server thread on 127.0.0.1 answers every
 * request with the input's bytes (status line, headers, body: whatever they are), and
 * the fetcher GETs a whole object, GETs a range, HEADs, or lists an s3:// prefix from it
 * (the first byte picks which).  Status codes, Content-Length / Content-Range / ETag /
 * Retry-After, truncated and oversized bodies, S3 XML errors and listing pages all go
 * through the real libcurl callbacks.  Failures are fine; a crash, a sanitizer report,
 * a message that is not valid UTF-8, a body over the object limit, or a hang
 * (libFuzzer's -timeout) is a finding.  The XML helper is also fed the input directly. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "mml/fetch.h"
#include "mml/fetch_sync.h"
#include "mml/s3.h"

static int g_lfd, g_port;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *g_resp;
static size_t g_len;

static void *serve(void *arg) {
  (void)arg;
  for (;;) {
    int c = accept(g_lfd, NULL, NULL);
    if (c < 0) continue;
    char req[8192];
    size_t got = 0;
    struct pollfd p = {c, POLLIN, 0};
    while (got < sizeof req - 1 && poll(&p, 1, 500) > 0) { /* the request's head */
      ssize_t r = read(c, req + got, sizeof req - 1 - got);
      if (r <= 0) break;
      got += (size_t)r;
      req[got] = 0;
      if (strstr(req, "\r\n\r\n")) break;
    }
    pthread_mutex_lock(&g_mu);
    size_t off = 0;
    while (off < g_len) {
      ssize_t w = send(c, g_resp + off, g_len - off, MSG_NOSIGNAL);
      if (w <= 0) break;
      off += (size_t)w;
    }
    pthread_mutex_unlock(&g_mu);
    shutdown(c, SHUT_WR);
    close(c);
  }
  return NULL;
}

static void start_server(void) {
  g_lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t n = sizeof a;
  if (g_lfd < 0 || bind(g_lfd, (struct sockaddr *)&a, sizeof a) || listen(g_lfd, 64) ||
      getsockname(g_lfd, (struct sockaddr *)&a, &n))
    abort();
  g_port = ntohs(a.sin_port);
  pthread_t t;
  if (pthread_create(&t, NULL, serve, NULL)) abort();
  pthread_detach(t);
}

enum { MAX_OBJECT = 1 << 20 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static mml_fetcher *f;
  static char base[64], endpoint[64];
  if (!f) {
    start_server();
    snprintf(base, sizeof base, "http://127.0.0.1:%d/obj.jpg", g_port);
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%d", g_port);
    mml_fetch_cfg c = {.access_key = "AKIDEXAMPLE",
                       .secret_key = "secret",
                       .region = "us-east-1",
                       .endpoint = endpoint,
                       .max_retries = -1,
                       .timeout_s = 2,
                       .connect_timeout_s = 2,
                       .stall_s = 1,
                       .range_chunk = 4096,
                       .max_object_bytes = MAX_OBJECT,
                       .retry_budget_s = 3};
    mml_err e = {0};
    if (mml_fetcher_new(&c, &f, &e)) abort();
  }
  if (!size) return 0;
  char xml[256];
  mml_xml_text((const char *)data, size, "Code", xml, sizeof xml);
  int mode = data[0] % 4;
  pthread_mutex_lock(&g_mu);
  free(g_resp);
  g_resp = malloc(size);
  memcpy(g_resp, data + 1, size - 1);
  g_len = size - 1;
  pthread_mutex_unlock(&g_mu);
  mml_bytes body = {0};
  mml_err e = {0};
  mml_status st = MML_OK;
  if (mode == 0) {
    st = mml_fetch_get(f, base, 0, -1, &body, &e);
    if (!st && body.len > MAX_OBJECT) abort();
  } else if (mode == 1) {
    st = mml_fetch_get(f, "s3://bucket/some/key.png", 100, 5000, &body, &e);
    if (!st && body.len > 5000) abort();
  } else if (mode == 2) {
    int64_t n = 0;
    st = mml_fetch_size(f, base, &n, &e);
  } else {
    char **urls = NULL;
    size_t n = 0;
    st = mml_fetch_list(f, "s3://bucket/dir/", "*.jsonl", &urls, &n, &e);
    if (!st) mml_fetch_list_free(urls, n);
  }
  if (st) fuzz_check_msg(&e);
  mml_bytes_free(&body);
  return 0;
}
