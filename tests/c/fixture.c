/*
 * fixture.c — fixtures shared by the C tests (mml_fixture.h).  The on-disk fixture is
 * made by one thread (a test's main thread); the atexit handler removes every folder
 * made.  The scripted server runs one thread of its own, joined by mml_test_server_stop.
 */
#include "mml_fixture.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <turbojpeg.h>
#include <unistd.h>

static mml_fixture *g_made[8];
static int g_nmade;

static void remove_all(void) {
  for (int i = 0; i < g_nmade; i++) {
    mml_fixture *fx = g_made[i];
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", fx->dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", fx->dir);
    mml_tokenizer_free(fx->tok);
    fx->tok = NULL;
  }
  g_nmade = 0;
}

int mml_fixture_ready(mml_fixture *fx) {
  if (fx->state) return fx->state > 0 ? 0 : -1;
  fx->state = -1;
  if (g_nmade == (int)(sizeof g_made / sizeof g_made[0])) return -1;
  const char *tp = getenv("MML_TEST_TOKENIZER");
  if (!tp) tp = "../../mmloader/data/tiny-tokenizer.json";
  mml_tokenizer *tok = NULL;
  mml_err err;
  if (mml_tokenizer_load(tp, &tok, &err) != MML_OK) {
    fprintf(stderr, "cannot load tokenizer %s: %s\n", tp, err.msg);
    return -1;
  }
  snprintf(fx->dir, sizeof fx->dir, "/tmp/mml-test-%s-XXXXXX", fx->name);
  if (!mkdtemp(fx->dir)) {
    fprintf(stderr, "cannot make %s\n", fx->dir);
    mml_tokenizer_free(tok);
    return -1;
  }
  if (!g_nmade) atexit(remove_all);
  fx->tok = tok;
  g_made[g_nmade++] = fx; /* removed at exit even when make fails half-way */
  if (fx->make(fx->dir)) {
    fprintf(stderr, "cannot write the dataset in %s\n", fx->dir);
    return -1;
  }
  fx->state = 1;
  return 0;
}

int mml_test_write_jpeg(const char *path, int w, int h, int seed) {
  unsigned char *rgb = malloc((size_t)w * h * 3);
  if (!rgb) return -1;
  for (int i = 0; i < w * h * 3; i++) rgb[i] = (unsigned char)((i * 31 + seed * 17) ^ (i >> 7));
  tjhandle tj = tjInitCompress();
  unsigned char *out = NULL;
  unsigned long len = 0;
  int rc = tj && !tjCompress2(tj, rgb, w, 0, h, TJPF_RGB, &out, &len, TJSAMP_420, 85, 0) ? 0 : -1;
  FILE *f = rc ? NULL : fopen(path, "wb");
  if (!f || fwrite(out, 1, len, f) != len) rc = -1;
  if (f && fclose(f)) rc = -1;
  tjFree(out);
  if (tj) tjDestroy(tj);
  free(rgb);
  return rc;
}

/* A w x h RGB8 image of a smooth pattern with some texture (`seed` shifts the blue ramp). */
uint8_t *mml_test_rgb(int w, int h, unsigned seed) {
  uint8_t *p = malloc((size_t)w * h * 3);
  if (!p) return NULL;
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      uint8_t *q = p + ((size_t)y * w + x) * 3;
      q[0] = (uint8_t)(x * 255 / (w > 1 ? w - 1 : 1));
      q[1] = (uint8_t)(y * 255 / (h > 1 ? h - 1 : 1));
      q[2] = (uint8_t)((x * 7 + y * 13 + seed) & 0xff);
    }
  return p;
}

/* mml_test_rgb(w, h, 5) as a JPEG (4:2:0, quality 90, progressive or not) in memory, freed
   with tjFree; NULL on failure. */
unsigned char *mml_test_jpeg(int w, int h, int progressive, unsigned long *len) {
  uint8_t *rgb = mml_test_rgb(w, h, 5);
  tjhandle tj = rgb ? tjInitCompress() : NULL;
  unsigned char *jpg = NULL;
  *len = 0;
  int flags = progressive ? TJFLAG_PROGRESSIVE : 0;
  if (!tj || tjCompress2(tj, rgb, w, 0, h, TJPF_RGB, &jpg, len, TJSAMP_420, 90, flags)) jpg = NULL;
  if (tj) tjDestroy(tj);
  free(rgb);
  return jpg;
}

/* ---- the scripted HTTP server ------------------------------------------------------- */

static void *serve(void *arg) {
  mml_test_server *s = arg;
  for (int i = 0; i < s->n; i++) {
    struct pollfd p = {s->fd, POLLIN, 0};
    if (poll(&p, 1, 10000) <= 0) break;
    int c = accept(s->fd, NULL, NULL);
    if (c < 0) break;
    char buf[8192];
    size_t got = 0;
    while (got < sizeof buf - 1) {
      struct pollfd q = {c, POLLIN, 0};
      if (poll(&q, 1, 5000) <= 0) break;
      ssize_t r = read(c, buf + got, sizeof buf - 1 - got);
      if (r <= 0) break;
      got += (size_t)r;
      buf[got] = 0;
      if (strstr(buf, "\r\n\r\n")) break;
    }
    __atomic_store_n(&s->served, i + 1, __ATOMIC_SEQ_CST);
    if (s->replies[i]) {
      ssize_t w = write(c, s->replies[i], s->lens[i]);
      (void)w;
    } else { /* hold the connection, silent, until told to stop (bounded: 20 s) */
      for (int t = 0; t < 2000 && !__atomic_load_n(&s->stop, __ATOMIC_SEQ_CST); t++) usleep(10000);
    }
    close(c);
  }
  return NULL;
}

int mml_test_server_start(mml_test_server *s, const char *const *replies, const size_t *lens,
                          int n) {
  memset(s, 0, sizeof *s);
  s->replies = replies, s->lens = lens, s->n = n;
  s->fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  if (s->fd < 0 || bind(s->fd, (struct sockaddr *)&a, sizeof a) || listen(s->fd, 16) ||
      getsockname(s->fd, (struct sockaddr *)&a, &al))
    return -1;
  s->port = ntohs(a.sin_port);
  return pthread_create(&s->th, NULL, serve, s);
}

void mml_test_server_stop(mml_test_server *s) {
  __atomic_store_n(&s->stop, 1, __ATOMIC_SEQ_CST);
  pthread_join(s->th, NULL);
  close(s->fd);
}

/* ---- the range server --------------------------------------------------------------- */

/* Reads a request head from c into buf (cap bytes); 0 when none came. */
static size_t read_head(int c, char *buf, size_t cap) {
  size_t got = 0;
  buf[0] = 0;
  while (got < cap - 1 && !strstr(buf, "\r\n\r\n")) {
    struct pollfd q = {c, POLLIN, 0};
    if (poll(&q, 1, 5000) <= 0) return 0;
    ssize_t r = read(c, buf + got, cap - 1 - got);
    if (r <= 0) return 0;
    got += (size_t)r;
    buf[got] = 0;
  }
  return got;
}

static void range_reply(mml_test_range_server *s, int c, const char *req) {
  size_t a = 0, b = s->len ? s->len - 1 : 0;
  const char *r = strstr(req, "Range: bytes=");
  unsigned long long x, y;
  int ranged = r && sscanf(r, "Range: bytes=%llu-%llu", &x, &y) == 2 && x <= y && x < s->len;
  if (ranged) a = (size_t)x, b = (size_t)y < s->len ? (size_t)y : s->len - 1;
  char head[256];
  int n = ranged ? snprintf(head, sizeof head,
                            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %zu-%zu/%zu\r\n"
                            "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                            a, b, s->len, b - a + 1)
                 : snprintf(head, sizeof head,
                            "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                            s->len);
  ssize_t w = write(c, head, (size_t)n);
  if (strncmp(req, "HEAD", 4) && w == n) w = write(c, s->data + a, ranged ? b - a + 1 : s->len);
  (void)w;
}

static void *range_serve(void *arg) {
  mml_test_range_server *s = arg;
  while (!__atomic_load_n(&s->stop, __ATOMIC_SEQ_CST)) {
    struct pollfd p = {s->fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    int c = accept(s->fd, NULL, NULL);
    if (c < 0) continue;
    char req[8192];
    if (read_head(c, req, sizeof req)) {
      range_reply(s, c, req);
      __atomic_add_fetch(&s->requests, 1, __ATOMIC_SEQ_CST);
    }
    close(c);
  }
  return NULL;
}

int mml_test_range_server_start(mml_test_range_server *s, const void *data, size_t len) {
  memset(s, 0, sizeof *s);
  s->data = data, s->len = len;
  s->fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  if (s->fd < 0 || bind(s->fd, (struct sockaddr *)&a, sizeof a) || listen(s->fd, 64) ||
      getsockname(s->fd, (struct sockaddr *)&a, &al))
    return -1;
  s->port = ntohs(a.sin_port);
  return pthread_create(&s->th, NULL, range_serve, s);
}

void mml_test_range_server_stop(mml_test_range_server *s) {
  __atomic_store_n(&s->stop, 1, __ATOMIC_SEQ_CST);
  pthread_join(s->th, NULL);
  close(s->fd);
}
