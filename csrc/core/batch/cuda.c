/*
 * cuda.c — the CUDA runtime, loaded at run time.
 *
 * Design: no CUDA header or library is needed to build: the few runtime functions we use
 * are declared here with the runtime's ABI (mml_cuda_api in mml/cuda.h) and resolved with
 * dlsym from libcudart.  The first mml_cuda_load decides, under a mutex, and its outcome
 * (the function table, or the reason it failed) is kept for the life of the process; after
 * that the table is read-only, so every other function reads it without a lock (acquire
 * load of `g_state`).  A libcudart already in the process (PyTorch's) is preferred, so the
 * trainer and the loader share one runtime and one notion of "current device".
 *
 * Devices: every call that touches a device makes it current and restores the caller's
 * device afterwards (cudaGetDevice/cudaSetDevice are per thread and cheap).
 *
 * Nothing here blocks except mml_cuda_event_sync and mml_cuda_stream_free.
 */
#include "mml/cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Constants of the runtime API (stable across CUDA 11, 12, 13). */
enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_HOST_ALLOC_PORTABLE = 1,
  CUDA_STREAM_NON_BLOCKING = 1,
  CUDA_EVENT_DISABLE_TIMING = 2,
  CUDA_MEMCPY_HOST_TO_DEVICE = 1,
};

enum { ST_UNLOADED = 0, ST_READY = 1, ST_FAILED = 2 };

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int g_state;         /* ST_*; written under g_lock, read with acquire */
static mml_cuda_api g_api;         /* valid when g_state == ST_READY */
static int g_ndev;                 /* devices seen at load */
static char g_reason[MML_ERR_MSG]; /* why the load failed (ST_FAILED) */
static char g_lib[512];            /* where the runtime came from (ST_READY) */
#define MAX_CANDIDATES 8
static char g_cand[MAX_CANDIDATES][512]; /* mml_cuda_set_candidates, under g_lock */
static int g_ncand;

struct mml_cuda_stream {
  int device;
  void *handle;
};
struct mml_cuda_event {
  int device;
  void *handle;
};

static int ready(void) { return atomic_load_explicit(&g_state, memory_order_acquire) == ST_READY; }

static const char *cuda_errstr(int e) {
  const char *s = g_api.GetErrorString ? g_api.GetErrorString(e) : NULL;
  return s ? s : "unknown CUDA error";
}

static mml_status fail(mml_err *err, int e, const char *what) {
  return mml_err_set(err, MML_ECUDA, "%s failed: %s (cudaError %d)", what, cuda_errstr(e), e);
}

static mml_status not_loaded(mml_err *err) {
  return mml_err_set(err, MML_ECUDA, "CUDA runtime is not loaded");
}

/* --- loading ---------------------------------------------------------------------- */

// clang-format off
#define API_SYMBOLS(X)                                                                     \
  X(GetDeviceCount) X(GetDevice) X(SetDevice) X(HostAlloc) X(FreeHost) X(Malloc) X(Free)   \
  X(StreamCreateWithFlags) X(StreamDestroy) X(StreamSynchronize) X(MemcpyAsync)           \
  X(EventCreateWithFlags) X(EventRecord) X(EventQuery) X(EventSynchronize) X(EventDestroy) \
  X(StreamWaitEvent) X(GetErrorString)
// clang-format on

/* Resolves every symbol of handle into *api; MML_ECUDA naming the first missing one. */
static mml_status resolve(void *handle, const char *path, mml_cuda_api *api, mml_err *err) {
  memset(api, 0, sizeof *api);
#define X(name)                                                                             \
  {                                                                                         \
    void *sym = dlsym(handle, "cuda" #name);                                                \
    if (!sym) return mml_err_set(err, MML_ECUDA, "%s: missing symbol cuda%s", path, #name); \
    memcpy(&api->name, &sym, sizeof sym);                                                   \
  }
  API_SYMBOLS(X)
#undef X
  return MML_OK;
}

mml_status mml_cuda_probe(const char *path, mml_err *err) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *why = dlerror();
    return mml_err_set(err, MML_ECUDA, "cannot load %s: %s", path, why ? why : "not found");
  }
  mml_cuda_api api;
  mml_status st = resolve(h, path, &api, err);
  dlclose(h);
  return st;
}

static const char *const k_sonames[] = {"libcudart.so.12", "libcudart.so.13", "libcudart.so.11",
                                        "libcudart.so"};

/* Opens the runtime; fills g_api/g_lib or g_reason.  Called once, under g_lock. */
static int load_locked(void) {
  const char *dis = getenv("MML_CUDA_DISABLE");
  if (dis && *dis && strcmp(dis, "0") != 0) {
    snprintf(g_reason, sizeof g_reason, "CUDA disabled by MML_CUDA_DISABLE=%s", dis);
    return ST_FAILED;
  }
  void *h = NULL;
  const char *from = NULL;
  char tried[MML_ERR_MSG / 2] = "";
  const char *env = getenv("MML_CUDART");
  if (env && *env) {
    h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char *why = dlerror();
      snprintf(g_reason, sizeof g_reason, "cannot load MML_CUDART=%s: %s", env,
               why ? why : "not found");
      return ST_FAILED;
    }
    from = env;
  }
  size_t ns = sizeof k_sonames / sizeof k_sonames[0];
  for (size_t i = 0; !h && i < ns; i++) { /* one already in the process (PyTorch's) */
    h = dlopen(k_sonames[i], RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    from = k_sonames[i];
  }
  for (int i = 0; !h && i < g_ncand; i++) {
    h = dlopen(g_cand[i], RTLD_NOW | RTLD_LOCAL);
    from = g_cand[i];
    size_t used = strlen(tried);
    snprintf(tried + used, sizeof tried - used, "%s%.200s", used ? ", " : "", g_cand[i]);
  }
  for (size_t i = 0; !h && i < ns; i++) {
    h = dlopen(k_sonames[i], RTLD_NOW | RTLD_LOCAL);
    from = k_sonames[i];
    size_t used = strlen(tried);
    snprintf(tried + used, sizeof tried - used, "%s%s", used ? ", " : "", k_sonames[i]);
  }
  if (!h) {
    snprintf(g_reason, sizeof g_reason,
             "no CUDA runtime found (tried %s; set MML_CUDART to its path)", tried);
    return ST_FAILED;
  }
  mml_err e = {0};
  if (resolve(h, from, &g_api, &e) != MML_OK) {
    dlclose(h);
    memset(&g_api, 0, sizeof g_api);
    snprintf(g_reason, sizeof g_reason, "%s", e.msg);
    return ST_FAILED;
  }
  int n = 0, rc = g_api.GetDeviceCount(&n);
  if (rc != CUDA_SUCCESS || n <= 0) {
    snprintf(g_reason, sizeof g_reason, "%.400s loaded but no usable CUDA device: %.300s", from,
             rc != CUDA_SUCCESS ? cuda_errstr(rc) : "device count is 0");
    memset(&g_api, 0, sizeof g_api);
    dlclose(h);
    return ST_FAILED;
  }
  /* The handle stays open for the life of the process: buffers and events made with it
   * may be freed at interpreter exit, after everything else is gone. */
  g_ndev = n;
  Dl_info info;
  void *sym;
  memcpy(&sym, &g_api.GetDeviceCount, sizeof sym);
  if (dladdr(sym, &info) && info.dli_fname) from = info.dli_fname;
  snprintf(g_lib, sizeof g_lib, "%.*s", (int)sizeof g_lib - 1, from);
  return ST_READY;
}

mml_status mml_cuda_load(mml_err *err) {
  int s = atomic_load_explicit(&g_state, memory_order_acquire);
  if (s == ST_UNLOADED) {
    pthread_mutex_lock(&g_lock);
    s = atomic_load_explicit(&g_state, memory_order_relaxed);
    if (s == ST_UNLOADED) {
      s = load_locked();
      atomic_store_explicit(&g_state, s, memory_order_release);
    }
    pthread_mutex_unlock(&g_lock);
  }
  if (s == ST_READY) return MML_OK;
  return mml_err_set(err, MML_ECUDA, "%s", g_reason);
}

void mml_cuda_install_api(const mml_cuda_api *api) {
  pthread_mutex_lock(&g_lock);
  if (api) {
    g_api = *api;
    int n = 0;
    g_ndev = (g_api.GetDeviceCount(&n) == CUDA_SUCCESS) ? n : 0;
    snprintf(g_lib, sizeof g_lib, "(fake)");
    atomic_store_explicit(&g_state, ST_READY, memory_order_release);
  } else {
    memset(&g_api, 0, sizeof g_api);
    g_ndev = 0;
    g_lib[0] = 0;
    g_reason[0] = 0;
    atomic_store_explicit(&g_state, ST_UNLOADED, memory_order_release);
  }
  pthread_mutex_unlock(&g_lock);
}

void mml_cuda_set_candidates(const char *const *paths, int n) {
  pthread_mutex_lock(&g_lock);
  g_ncand = 0;
  for (int i = 0; i < n && g_ncand < MAX_CANDIDATES; i++)
    if (paths[i] && strlen(paths[i]) < sizeof g_cand[0])
      snprintf(g_cand[g_ncand++], sizeof g_cand[0], "%s", paths[i]);
  pthread_mutex_unlock(&g_lock);
}

int mml_cuda_available(void) { return mml_cuda_load(NULL) == MML_OK; }

int mml_cuda_device_count(void) { return mml_cuda_available() ? g_ndev : 0; }

const char *mml_cuda_library(void) { return ready() ? g_lib : NULL; }

int mml_cuda_current_device(void) {
  int d = 0;
  if (!ready() || g_api.GetDevice(&d) != CUDA_SUCCESS) return 0;
  return d;
}

void mml_cuda_set_current_device(int device) {
  if (ready()) (void)g_api.SetDevice(device);
}

/* --- device scoping --------------------------------------------------------------- */

/* Makes `device` current; *prev receives the caller's device (to restore with leave). */
static mml_status enter(int device, int *prev, mml_err *err) {
  *prev = -1;
  if (!ready()) return not_loaded(err);
  if (device < 0 || device >= g_ndev)
    return mml_err_set(err, MML_ECUDA, "CUDA device %d does not exist (%d visible)", device,
                       g_ndev);
  int cur = -1;
  if (g_api.GetDevice(&cur) != CUDA_SUCCESS) cur = -1;
  *prev = cur;
  if (cur != device) {
    int rc = g_api.SetDevice(device);
    if (rc != CUDA_SUCCESS) return fail(err, rc, "cudaSetDevice");
  }
  return MML_OK;
}

static void leave(int device, int prev) {
  if (prev >= 0 && prev != device) g_api.SetDevice(prev);
}

/* --- memory ----------------------------------------------------------------------- */

mml_status mml_cuda_host_alloc(size_t n, void **out, mml_err *err) {
  if (!ready()) return not_loaded(err);
  void *p = NULL;
  int rc = g_api.HostAlloc(&p, n ? n : 1, CUDA_HOST_ALLOC_PORTABLE);
  if (rc != CUDA_SUCCESS || !p)
    return mml_err_set(err, rc == 2 ? MML_ENOMEM : MML_ECUDA,
                       "cudaHostAlloc of %zu bytes failed: %s", n, cuda_errstr(rc));
  *out = p;
  return MML_OK;
}

void mml_cuda_host_free(void *p) {
  if (p && ready()) g_api.FreeHost(p);
}

mml_status mml_cuda_malloc(int device, size_t n, void **out, mml_err *err) {
  int prev;
  mml_status st = enter(device, &prev, err);
  if (st) return st;
  void *p = NULL;
  int rc = g_api.Malloc(&p, n ? n : 1);
  leave(device, prev);
  if (rc != CUDA_SUCCESS || !p)
    return mml_err_set(err, rc == 2 ? MML_ENOMEM : MML_ECUDA,
                       "cudaMalloc of %zu bytes on cuda:%d failed: %s", n, device, cuda_errstr(rc));
  *out = p;
  return MML_OK;
}

void mml_cuda_free(int device, void *p) {
  int prev;
  if (!p || enter(device, &prev, NULL) != MML_OK) return;
  g_api.Free(p);
  leave(device, prev);
}

/* --- streams and events ------------------------------------------------------------ */

mml_status mml_cuda_stream_new(int device, mml_cuda_stream **out, mml_err *err) {
  mml_cuda_stream *s = calloc(1, sizeof *s);
  if (!s) return mml_err_set(err, MML_ENOMEM, "cannot allocate a CUDA stream wrapper");
  int prev;
  mml_status st = enter(device, &prev, err);
  if (st) {
    free(s);
    return st;
  }
  int rc = g_api.StreamCreateWithFlags(&s->handle, CUDA_STREAM_NON_BLOCKING);
  leave(device, prev);
  if (rc != CUDA_SUCCESS) {
    free(s);
    return fail(err, rc, "cudaStreamCreateWithFlags");
  }
  s->device = device;
  *out = s;
  return MML_OK;
}

void mml_cuda_stream_free(mml_cuda_stream *s) {
  if (!s) return;
  int prev;
  if (enter(s->device, &prev, NULL) == MML_OK) {
    g_api.StreamSynchronize(s->handle);
    g_api.StreamDestroy(s->handle);
    leave(s->device, prev);
  }
  free(s);
}

mml_status mml_cuda_stream_sync(mml_cuda_stream *s, mml_err *err) {
  if (!ready()) return not_loaded(err);
  int rc = g_api.StreamSynchronize(s->handle);
  return rc == CUDA_SUCCESS ? MML_OK : fail(err, rc, "cudaStreamSynchronize");
}

mml_status mml_cuda_memcpy_h2d_async(int device, void *dst, const void *src, size_t n,
                                     mml_cuda_stream *s, mml_err *err) {
  if (!n) return MML_OK;
  int prev;
  mml_status st = enter(device, &prev, err);
  if (st) return st;
  int rc = g_api.MemcpyAsync(dst, src, n, CUDA_MEMCPY_HOST_TO_DEVICE, s ? s->handle : NULL);
  leave(device, prev);
  return rc == CUDA_SUCCESS ? MML_OK : fail(err, rc, "cudaMemcpyAsync (host to device)");
}

mml_status mml_cuda_event_new(int device, mml_cuda_event **out, mml_err *err) {
  mml_cuda_event *e = calloc(1, sizeof *e);
  if (!e) return mml_err_set(err, MML_ENOMEM, "cannot allocate a CUDA event wrapper");
  int prev;
  mml_status st = enter(device, &prev, err);
  if (st) {
    free(e);
    return st;
  }
  int rc = g_api.EventCreateWithFlags(&e->handle, CUDA_EVENT_DISABLE_TIMING);
  leave(device, prev);
  if (rc != CUDA_SUCCESS) {
    free(e);
    return fail(err, rc, "cudaEventCreateWithFlags");
  }
  e->device = device;
  *out = e;
  return MML_OK;
}

void mml_cuda_event_free(mml_cuda_event *e) {
  if (!e) return;
  if (ready()) g_api.EventDestroy(e->handle);
  free(e);
}

int mml_cuda_event_device(const mml_cuda_event *e) { return e->device; }

mml_status mml_cuda_event_record(mml_cuda_event *e, mml_cuda_stream *s, mml_err *err) {
  return mml_cuda_event_record_raw(e, s ? (uintptr_t)s->handle : 0, err);
}

mml_status mml_cuda_event_record_raw(mml_cuda_event *e, uintptr_t stream, mml_err *err) {
  int prev;
  mml_status st = enter(e->device, &prev, err);
  if (st) return st;
  int rc = g_api.EventRecord(e->handle, (void *)stream);
  leave(e->device, prev);
  return rc == CUDA_SUCCESS ? MML_OK : fail(err, rc, "cudaEventRecord");
}

int mml_cuda_event_query(mml_cuda_event *e) {
  if (!ready()) return 1;
  return g_api.EventQuery(e->handle) != CUDA_ERROR_NOT_READY;
}

mml_status mml_cuda_event_sync(mml_cuda_event *e, mml_err *err) {
  if (!ready()) return not_loaded(err);
  int rc = g_api.EventSynchronize(e->handle);
  return rc == CUDA_SUCCESS ? MML_OK : fail(err, rc, "cudaEventSynchronize");
}

mml_status mml_cuda_stream_wait_raw(int device, uintptr_t stream, mml_cuda_event *e, mml_err *err) {
  int prev;
  mml_status st = enter(device, &prev, err);
  if (st) return st;
  int rc = g_api.StreamWaitEvent((void *)stream, e->handle, 0);
  leave(device, prev);
  return rc == CUDA_SUCCESS ? MML_OK : fail(err, rc, "cudaStreamWaitEvent");
}
