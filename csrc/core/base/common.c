/*
 * common.c — the status table, error details, growable buffers, file reads, clock and
 * hashing shared by all subsystems.  No threads or global state: every function is
 * reentrant and may be called from any thread.
 */
#include "mml/common.h"

#include "mml/message.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sched.h>
#endif

static const char *const k_names[] = {
#define X(name, reason, msg) #name,
    MML_STATUS_MAP(X)
#undef X
};
static const char *const k_msgs[] = {
#define X(name, reason, msg) msg,
    MML_STATUS_MAP(X)
#undef X
};
static const char *const k_reasons[] = {
#define X(name, reason, msg) reason,
    MML_STATUS_MAP(X)
#undef X
};

const char *mml_status_name(mml_status st) {
  return (unsigned)st < MML_STATUS_COUNT ? k_names[st] : "EUNKNOWN";
}
const char *mml_status_message(mml_status st) {
  return (unsigned)st < MML_STATUS_COUNT ? k_msgs[st] : "unknown status";
}
const char *mml_status_skip_reason(mml_status st) {
  return (unsigned)st < MML_STATUS_COUNT ? k_reasons[st] : NULL;
}

/* Every message goes through mml_text_clean (mml/message.h): URLs redacted, valid UTF-8,
 * then fitted by mml_text_fit (long values shortened in the middle). */
/* Start of the UTF-8 character holding byte i (never splits a sequence). */
static size_t char_start(const char *s, size_t i) {
  while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
  return i;
}

size_t mml_text_fit(char *out, size_t cap, const char *s, size_t n) {
  if (!cap) return 0;
  static const char dots[] = "...";
  char *buf = NULL;
  while (n > cap - 1) {
    /* the longest run of non-blank bytes: a path, URL, base64 payload, JSON value */
    size_t best = 0, best_len = 0;
    for (size_t i = 0; i < n;) {
      size_t j = i;
      while (j < n && s[j] != ' ' && s[j] != '\n') j++;
      if (j - i > best_len) best = i, best_len = j - i;
      i = j + 1;
    }
    enum { MIN_KEEP = 48 }; /* what a shortened value keeps at least (head + tail) */
    size_t excess = n - (cap - 1);
    if (best_len <= MIN_KEEP + 3 + 4) break; /* nothing long left: cut the end */
    size_t keep = best_len > excess + 3 + MIN_KEEP ? best_len - excess - 3 : MIN_KEEP;
    size_t head = char_start(s, best + keep / 2) - best;
    size_t tail_from = best + best_len - (keep - keep / 2);
    while (tail_from < n && ((unsigned char)s[tail_from] & 0xC0) == 0x80) tail_from++;
    size_t nn = best + head + 3 + (n - tail_from);
    char *t = nn < n ? malloc(nn + 1) : NULL;
    if (!t) break;
    memcpy(t, s, best + head);
    memcpy(t + best + head, dots, 3);
    memcpy(t + best + head + 3, s + tail_from, n - tail_from);
    free(buf);
    buf = t;
    s = t;
    n = nn;
  }
  size_t k = n <= cap - 1 ? n : char_start(s, cap - 1);
  memcpy(out, s, k);
  out[k] = 0;
  free(buf);
  return k;
}

/* vsnprintf into a fresh heap string (NULL when out of memory). */
static char *vformat(size_t *n, const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int len = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (len < 0) return NULL;
  char *s = malloc((size_t)len + 1);
  if (s) vsnprintf(s, (size_t)len + 1, fmt, ap);
  *n = (size_t)len;
  return s;
}

mml_status mml_err_set(mml_err *err, mml_status st, const char *fmt, ...) {
  if (err) {
    err->status = st;
    va_list ap;
    va_start(ap, fmt);
    size_t n;
    char *s = vformat(&n, fmt, ap);
    va_end(ap);
    if (s)
      mml_text_clean(err->msg, sizeof err->msg, s, n);
    else
      snprintf(err->msg, sizeof err->msg, "%s", fmt);
    free(s);
  }
  return st;
}

void mml_err_prefix(mml_err *err, const char *fmt, ...) {
  if (!err) return;
  va_list ap;
  va_start(ap, fmt);
  size_t hn;
  char *head = vformat(&hn, fmt, ap);
  va_end(ap);
  size_t on = strlen(err->msg);
  char *s = head ? malloc(hn + 2 + on + 1) : NULL;
  if (s) {
    memcpy(s, head, hn);
    memcpy(s + hn, ": ", 2);
    memcpy(s + hn + 2, err->msg, on + 1);
    mml_text_clean(err->msg, sizeof err->msg, s, hn + 2 + on);
  }
  free(s);
  free(head);
}

void mml_err_clear(mml_err *err) {
  if (err) {
    err->status = MML_OK;
    err->msg[0] = 0;
  }
}

static mml_status grow(void **data, size_t *cap, size_t want, size_t elem) {
  if (want <= *cap) return MML_OK;
  size_t n = *cap ? *cap : 16;
  while (n < want) {
    if (n > SIZE_MAX / 2 / elem) return MML_ENOMEM;
    n *= 2;
  }
  void *p = realloc(*data, n * elem);
  if (!p) return MML_ENOMEM;
  *data = p;
  *cap = n;
  return MML_OK;
}

mml_status mml_bytes_reserve(mml_bytes *b, size_t cap) {
  return grow((void **)&b->data, &b->cap, cap, 1);
}
mml_status mml_bytes_append(mml_bytes *b, const void *p, size_t n) {
  if (n > SIZE_MAX - b->len) return MML_ENOMEM;
  mml_status st = mml_bytes_reserve(b, b->len + n);
  if (st) return st;
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
  return MML_OK;
}
void mml_bytes_free(mml_bytes *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

mml_status mml_ids_reserve(mml_ids *v, size_t cap) {
  return grow((void **)&v->data, &v->cap, cap, sizeof(int32_t));
}
mml_status mml_ids_push(mml_ids *v, int32_t x) { return mml_ids_append(v, &x, 1); }
mml_status mml_ids_append(mml_ids *v, const int32_t *p, size_t n) {
  if (n > SIZE_MAX / sizeof(int32_t) - v->len) return MML_ENOMEM;
  mml_status st = mml_ids_reserve(v, v->len + n);
  if (st) return st;
  if (n) memcpy(v->data + v->len, p, n * sizeof(int32_t));
  v->len += n;
  return MML_OK;
}
void mml_ids_free(mml_ids *v) {
  free(v->data);
  v->data = NULL;
  v->len = v->cap = 0;
}

mml_status mml_read_file(const char *path, int64_t off, int64_t len, mml_bytes *out, mml_err *err) {
  return mml_read_file_max(path, off, len, 0, out, err);
}

static const char *file_kind(mode_t m) {
  return S_ISFIFO(m)   ? "a FIFO"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
         : S_ISSOCK(m) ? "a socket"
         : S_ISDIR(m)  ? "a directory"
                       : "not a plain file";
}

mml_status mml_read_file_max(const char *path, int64_t off, int64_t len, int64_t max,
                             mml_bytes *out, mml_err *err) {
  /* O_NONBLOCK: opening a FIFO without a writer returns at once instead of blocking the
   * thread forever; anything but a regular file is then refused before any read. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    int e = errno;
    return mml_err_set(err, e == ENOENT || e == ENOTDIR ? MML_ENOENT : MML_EIO, "%s: %s", path,
                       strerror(e));
  }
  mml_status st = MML_OK;
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    st = mml_err_set(err, MML_EIO, "%s: %s", path, strerror(errno));
    goto done;
  }
  if (!S_ISREG(sb.st_mode)) {
    st = mml_err_set(err, MML_EIO, "%s: not a regular file (%s): refused", path,
                     file_kind(sb.st_mode));
    goto done;
  }
  if (off < 0) off = 0;
  if (off > sb.st_size) off = sb.st_size;
  int64_t want = (len < 0 || off + len > sb.st_size) ? sb.st_size - off : len;
  if (max > 0 && want > max) {
    st = mml_err_set(err, MML_EOBJECTSIZE, "%s: %lld bytes, above max_object_bytes=%lld", path,
                     (long long)want, (long long)max);
    goto done;
  }
  mml_bytes_clear(out);
  if (out->cap < (size_t)want + 1) mml_bytes_free(out); /* a new buffer, not a copy */
  if ((st = mml_bytes_reserve(out, (size_t)want + 1))) {
    mml_err_set(err, st, "%s: cannot allocate %lld bytes", path, (long long)want);
    goto done;
  }
  size_t got = 0;
  while ((int64_t)got < want) {
    ssize_t r = pread(fd, out->data + got, (size_t)want - got, off + (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      st = mml_err_set(err, MML_EIO, "%s: read failed: %s", path, strerror(errno));
      goto done;
    }
    if (r == 0) break; /* file shrank: return what is there */
    got += (size_t)r;
  }
  out->len = got;
  out->data[got] = 0; /* convenience NUL, not counted in len */
done:
  close(fd);
  return st;
}

double mml_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t mml_mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t mml_hash_bytes(uint64_t h, const void *p, size_t n) {
  const uint8_t *s = p;
  if (!h) h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; i++) {
    h ^= s[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

size_t mml_cpu_threads(void) {
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int c = CPU_COUNT(&set);
    if (c > 0) return (size_t)c;
  }
#endif
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  return c > 0 ? (size_t)c : 1;
}
