/*
 * mml/common.h — status codes, error details and small growable buffers shared
 * by every subsystem of the mmloader core.
 *
 * Conventions (the contract every core function follows):
 *   - A function that can fail returns mml_status; MML_OK is 0.  Results go through
 *     out-parameters.  On failure no out-parameter ownership is transferred unless the
 *     function says otherwise, and `err` (when not NULL) holds a human-readable detail
 *     naming what failed (file, line, URL, reason).
 *   - The core never includes Python.h, never calls exit()/abort(), and never prints.
 *   - Memory is plain malloc/free: everything here is touched without the GIL.
 */
#ifndef MML_COMMON_H
#define MML_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdarg.h>

/* One table for errors: X(name, skip_reason, message).  skip_reason is the key under
 * which a skipped sample is counted in stats() (NULL: not a per-sample failure). */
// clang-format off
#define MML_STATUS_MAP(X)                                                        \
  X(OK,          NULL,                   "success")                               \
  X(ENOMEM,      "out_of_memory",        "out of memory")                         \
  X(EINVAL,      NULL,                   "invalid argument")                      \
  X(ECONFIG,     NULL,                   "invalid configuration")                 \
  X(EIO,         "io_error",             "I/O error")                             \
  X(ENOENT,      "missing_file",         "no such file or object")                \
  X(EFETCH,      "fetch_failed",         "fetch failed")                          \
  X(EAUTH,       "fetch_failed",         "access denied")                         \
  X(ERECORD,     "bad_record",           "malformed record")                      \
  X(EMISMATCH,   "image_count_mismatch", "image tags do not match listed images") \
  X(EDECODE,     "corrupt_image",        "image could not be decoded")            \
  X(EUNSUPPORTED,"unsupported_image",    "unsupported image format")              \
  X(EVIDEO,      "unsupported_video",    "video input is not supported yet")      \
  X(EVIDEOCORRUPT, "corrupt_video",     "video could not be decoded")            \
  X(EVIDEOCODEC, "unsupported_video_codec", "no decoder for the video's codec")  \
  X(EVIDEOSHORT, "video_too_short",      "video has fewer frames than needed")    \
  X(ETOOBIG,     "image_too_large",      "image exceeds the pixel limit")         \
  X(EASPECT,     "bad_aspect_ratio",     "image aspect ratio exceeds 200")        \
  X(ETOOLONG,    "too_long",             "sample exceeds max_length")             \
  X(ETOOMANYIMAGES, "too_many_images",   "sample exceeds max_images_per_sample")  \
  X(ESAMPLEPIXELS, "sample_too_large",   "sample exceeds max_sample_pixels")      \
  X(ESCANS,      "too_many_scans",       "JPEG has more scans than max_jpeg_scans")\
  X(ERECORDSIZE, "record_too_large",     "record exceeds max_record_bytes")       \
  X(EOBJECTSIZE, "object_too_large",     "object exceeds max_object_bytes")       \
  X(EPATH,       "path_refused",         "path refused by the path policy")       \
  X(ETOKENIZER,  NULL,                   "tokenizer error")                       \
  X(ESTATE,      NULL,                   "invalid loader state")                  \
  X(EEND,        NULL,                   "end of epoch")                          \
  X(ETIMEDOUT,   NULL,                   "timed out")                             \
  X(ECLOSED,     NULL,                   "loader is closed")                      \
  X(ECANCELLED,  NULL,                   "cancelled")                             \
  X(EFORK,       NULL,                   "loader used in a forked child")         \
  X(ECUDA,       NULL,                   "CUDA error")                            \
  X(ETOOMANYERR, NULL,                   "error rate above max_error_rate")       \
  X(EINTERNAL,   NULL,                   "internal error")                        \
  X(EAUDIO,      "audio_record",         "record carries audio (not supported)")  \
  X(EPREFERENCE, "preference_record",    "record is a preference pair, not SFT")  \
  X(ENOTARGET,   "no_trainable_turn",    "sample has no trainable token")

typedef enum {
#define MML_X_ENUM(name, reason, msg) MML_##name,
  MML_STATUS_MAP(MML_X_ENUM)
#undef MML_X_ENUM
  MML_STATUS_COUNT
} mml_status;
// clang-format on

/* Static name ("EDECODE"), message, and skip-reason key (NULL if none) of a status. */
const char *mml_status_name(mml_status st);
const char *mml_status_message(mml_status st);
const char *mml_status_skip_reason(mml_status st);

/* Error detail.  Functions fill it on failure; callers may pass NULL. */
#define MML_ERR_MSG 768
typedef struct mml_err {
  mml_status status;
  char msg[MML_ERR_MSG];
} mml_err;

/* Sets err->status and a printf-formatted message; returns st so callers can write
 * `return mml_err_set(err, MML_EDECODE, "%s: %s", path, why);`.  err may be NULL. */
mml_status mml_err_set(mml_err *err, mml_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prefixes context to an existing message: "ctx: old message". err may be NULL. */
void mml_err_prefix(mml_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Both never cut a message before its reason: a message longer than MML_ERR_MSG has its
 * longest values (runs of non-blank bytes: paths, URLs, data: payloads, JSON) shortened
 * in the middle ("head...tail") until it fits, on UTF-8 character boundaries; only a
 * message with no long value is cut at the end.  mml_text_fit does it for any buffer:
 * copies s[0..n) into out (cap bytes, NUL-terminated), returns the length written. */
size_t mml_text_fit(char *out, size_t cap, const char *s, size_t n);
void mml_err_clear(mml_err *err);

/* Growable byte buffer.  Zero-initialise ({0}) before first use; capacity is kept
 * across mml_bytes_clear() so a reused buffer stops allocating in steady state. */
typedef struct mml_bytes {
  uint8_t *data;
  size_t len, cap;
} mml_bytes;

mml_status mml_bytes_reserve(mml_bytes *b, size_t cap); /* cap >= requested */
mml_status mml_bytes_append(mml_bytes *b, const void *p, size_t n);
static inline void mml_bytes_clear(mml_bytes *b) { b->len = 0; }
void mml_bytes_free(mml_bytes *b);

/* n bytes rounded up to whole 2 MiB pages (0 for n <= 0): what the buffer pool maps for a
 * large buffer and mml_mapped for scratch, for the memory budgets that count them. */
static inline int64_t mml_round_2mib(int64_t n) {
  return n > 0 ? (n + ((int64_t)2 << 20) - 1) & ~(((int64_t)2 << 20) - 1) : 0;
}
/* The bytes the buffer pool maps for one buffer of n bytes (mml_pool_alloc's rounding):
 * whole 2 MiB pages from 1 MiB on, 4 KiB pages below, one page for n <= 0. */
static inline int64_t mml_pool_bytes(int64_t n) {
  if (n >= ((int64_t)1 << 20)) return mml_round_2mib(n);
  return n > 0 ? (n + 4095) & ~(int64_t)4095 : 4096;
}

/* Growable int32 vector (token ids, labels). Same rules as mml_bytes. */
typedef struct mml_ids {
  int32_t *data;
  size_t len, cap;
} mml_ids;

mml_status mml_ids_reserve(mml_ids *v, size_t cap);
mml_status mml_ids_push(mml_ids *v, int32_t x);
mml_status mml_ids_append(mml_ids *v, const int32_t *p, size_t n);
static inline void mml_ids_clear(mml_ids *v) { v->len = 0; }
void mml_ids_free(mml_ids *v);

/* Reads a whole local file (or a byte range: off >= 0, len >= 0; len < 0 means to EOF).
 * Only regular files are read: a FIFO, device, socket or directory is MML_EIO, found
 * without blocking (the open never waits for a FIFO's writer). */
mml_status mml_read_file(const char *path, int64_t off, int64_t len, mml_bytes *out, mml_err *err);
/* The same refusing (MML_EOBJECTSIZE, before reading) more than max bytes (max > 0). */
mml_status mml_read_file_max(const char *path, int64_t off, int64_t len, int64_t max,
                             mml_bytes *out, mml_err *err);

/* Cancellation (ARCHITECTURE 4.8: close(), Ctrl-C and interpreter exit return within
 * about a second whatever the engine is doing).  One flag per piece of work that can be
 * stopped, set once by whoever stops it (a loader's close, the binding when a signal
 * arrives during construction or an index build) and read without a lock by every long
 * loop over outside data: the decoders' progress hooks, index scans, fetch waits,
 * listings.  Work that finds it set stops with MML_ECANCELLED.  A flag may have a
 * parent and then reads as set when the parent is (the binding's flag above a loader's
 * own during construction).  Zero-initialise ({0}); NULL reads as never set. */
typedef struct mml_cancel {
  int set;
  const struct mml_cancel *parent; /* outlives this flag, or NULL */
} mml_cancel;

static inline void mml_cancel_set(mml_cancel *c) {
  if (c) __atomic_store_n(&c->set, 1, __ATOMIC_RELEASE);
}
static inline int mml_cancelled(const mml_cancel *c) {
  for (; c; c = c->parent)
    if (__atomic_load_n(&c->set, __ATOMIC_ACQUIRE)) return 1;
  return 0;
}

/* Monotonic clock in seconds. */
double mml_now(void);
/* The CPUs this process may run on (its affinity mask), at least 1. */
size_t mml_cpu_threads(void);

/* 64-bit mixing hash (splitmix64 finaliser) and FNV-1a over bytes: used for seeds and
 * config fingerprints.  Stable across platforms and releases. */
uint64_t mml_mix64(uint64_t x);
uint64_t mml_hash_bytes(uint64_t h, const void *p, size_t n);

#endif
