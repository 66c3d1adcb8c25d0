/*
 * fetch_py.c — thin binding of the fetch core (mml/fetch.h) for tests, tools and the
 * Loader's Python side (s3:// glob expansion):
 *   _core.Fetcher(**cfg)  .get(url, offset=0, length=-1) .get_many(urls, on_error="raise")
 *                         .size(url) .list(prefix, pattern=None) .stats() .close()
 *   _core.fetch_get / fetch_many / fetch_size / fetch_list (url(s), ..., **cfg): one-shot
 *   _core._sha256, _core._sigv4_authorization: hooks that pin the signer to references.
 * Every blocking call releases the GIL.  Secrets are never shown by repr() or stats().
 */
#include "binding.h"

#include <pthread.h>
#include <string.h>

#include "mml/fetch.h"
#include "mml/fetch_sync.h"
#include "mml/message.h"
#include "mml/s3.h"
#include "mml/sigv4.h"

/* Fetch failures raise FetchError, a missing object included (still a SampleError). */
static PyObject *fetch_raise(mml_py_state *ms, mml_status st, const mml_err *err) {
  mml_status s = err && err->status != MML_OK ? err->status : st;
  if (s == MML_ENOENT) {
    mml_py_raise_as(ms->FetchError, s, err);
    return NULL;
  }
  return mml_py_raise(ms, st, err);
}

typedef struct {
  PyObject_HEAD
  mml_fetcher *f;
  char region[64];
  char endpoint[256];
  int max_inflight;
} FetcherObject;

static int cfg_from_kwargs(PyObject *args, PyObject *kw, mml_fetch_cfg *c) {
  static char *kwlist[] = {"access_key",     "secret_key",        "session_token",
                           "region",         "endpoint",          "max_inflight",
                           "max_retries",    "timeout_s",         "connect_timeout_s",
                           "stall_s",        "backoff_base_s",    "backoff_max_s",
                           "range_chunk",    "list_page_size",    "io_threads",
                           "ca_bundle",      "max_object_bytes",  "min_rate",
                           "retry_budget_s", "whole_cache_bytes", NULL};
  memset(c, 0, sizeof *c);
  long long chunk = 0, max_obj = 0, whole = 0;
  if (!PyArg_ParseTupleAndKeywords(
          args, kw, "|$zzzzziidddddLiizLddL:Fetcher", kwlist, &c->access_key, &c->secret_key,
          &c->session_token, &c->region, &c->endpoint, &c->max_inflight, &c->max_retries,
          &c->timeout_s, &c->connect_timeout_s, &c->stall_s, &c->backoff_base_s, &c->backoff_max_s,
          &chunk, &c->list_page_size, &c->io_threads, &c->ca_bundle, &max_obj, &c->min_rate,
          &c->retry_budget_s, &whole))
    return -1;
  c->range_chunk = chunk;
  c->max_object_bytes = max_obj;
  c->whole_cache_bytes = whole;
  return 0;
}

static int Fetcher_init(FetcherObject *self, PyObject *args, PyObject *kw) {
  mml_fetch_cfg c;
  if (cfg_from_kwargs(args, kw, &c)) return -1;
  if (self->f) {
    mml_fetcher *old = self->f;
    self->f = NULL;
    Py_BEGIN_ALLOW_THREADS
    mml_fetcher_free(old);
    Py_END_ALLOW_THREADS
  }
  mml_err err = {0};
  mml_fetcher *f = NULL;
  mml_status st = mml_fetcher_new(&c, &f, &err);
  if (st) {
    mml_py_raise(mml_py_state_of_self(self), st, &err);
    return -1;
  }
  self->f = f;
  const char *region = c.region && *c.region ? c.region : getenv("AWS_REGION");
  if (!region || !*region) region = getenv("AWS_DEFAULT_REGION");
  snprintf(self->region, sizeof self->region, "%s", region && *region ? region : "us-east-1");
  const char *ep = c.endpoint && *c.endpoint ? c.endpoint : getenv("AWS_ENDPOINT_URL_S3");
  if (!ep || !*ep) ep = getenv("AWS_ENDPOINT_URL");
  snprintf(self->endpoint, sizeof self->endpoint, "%s", ep && *ep ? ep : "");
  self->max_inflight = c.max_inflight ? c.max_inflight : 64;
  return 0;
}

static void Fetcher_dealloc(FetcherObject *self) {
  if (self->f) {
    mml_fetcher *f = self->f;
    self->f = NULL;
    Py_BEGIN_ALLOW_THREADS
    mml_fetcher_free(f);
    Py_END_ALLOW_THREADS
  }
  PyTypeObject *tp = Py_TYPE(self);
  tp->tp_free((PyObject *)self);
  Py_DECREF(tp); /* heap type: each instance holds a reference */
}

static mml_fetcher *live(FetcherObject *self) {
  if (!self->f) PyErr_SetString(mml_py_state_of_self(self)->Error, "Fetcher is closed");
  return self->f;
}

mml_fetcher *mml_py_fetcher_get(mml_py_state *ms, PyObject *obj) {
  if (!PyObject_TypeCheck(obj, ms->Fetcher_Type)) {
    PyErr_SetString(PyExc_TypeError, "expected a mmloader._core.Fetcher");
    return NULL;
  }
  return live((FetcherObject *)obj);
}

static PyObject *Fetcher_repr(FetcherObject *self) {
  char *shown = self->endpoint[0] ? mml_url_redact(self->endpoint) : NULL; /* user-info */
  PyObject *r = PyUnicode_FromFormat(
      "<mmloader._core.Fetcher region=%s endpoint=%s "
      "max_inflight=%d%s>",
      self->region,
      shown               ? shown
      : self->endpoint[0] ? "?"
                          : "(aws)",
      self->max_inflight, self->f ? "" : " closed");
  free(shown);
  return r;
}

static PyObject *Fetcher_get(FetcherObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"url", "offset", "length", NULL};
  const char *url;
  long long off = 0, len = -1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "s|LL:get", kwlist, &url, &off, &len)) return NULL;
  mml_fetcher *f = live(self);
  if (!f) return NULL;
  mml_bytes b = {0};
  mml_err err = {0};
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_fetch_get(f, url, off, len, &b, &err);
  Py_END_ALLOW_THREADS
  if (st) return fetch_raise(mml_py_state_of_self(self), st, &err);
  PyObject *r = PyBytes_FromStringAndSize((const char *)b.data, (Py_ssize_t)b.len);
  mml_bytes_free(&b);
  return r;
}

static PyObject *Fetcher_size(FetcherObject *self, PyObject *args) {
  const char *url;
  if (!PyArg_ParseTuple(args, "s:size", &url)) return NULL;
  mml_fetcher *f = live(self);
  if (!f) return NULL;
  int64_t size = 0;
  mml_err err = {0};
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_fetch_size(f, url, &size, &err);
  Py_END_ALLOW_THREADS
  if (st) return fetch_raise(mml_py_state_of_self(self), st, &err);
  return PyLong_FromLongLong(size);
}

/* get_many: one completion slot per URL; the waiting thread sleeps on a condition. */
typedef struct batch {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  size_t left;
} batch;
typedef struct slot {
  batch *b;
  mml_status st;
  mml_bytes body;
  mml_err err;
} slot;

static void slot_cb(void *ctx, mml_status st, mml_bytes *body, const mml_err *err) {
  slot *s = ctx;
  s->st = st;
  if (body) s->body = *body;
  if (err) s->err = *err;
  pthread_mutex_lock(&s->b->mu);
  if (--s->b->left == 0) pthread_cond_signal(&s->b->cv);
  pthread_mutex_unlock(&s->b->mu);
}

static PyObject *Fetcher_get_many(FetcherObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"urls", "on_error", NULL};
  PyObject *seq;
  const char *on_error = "raise"; /* unlike a Loader's: a fetch that fails raises */
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$s:get_many", kwlist, &seq, &on_error)) return NULL;
  int raise;
  if (mml_py_table_enum(mml_py_state_of_self(self), "on_error", on_error, &raise)) return NULL;
  int skip = !raise; /* the table's names: skip, raise */
  mml_fetcher *f = live(self);
  if (!f) return NULL;
  PyObject *fast = PySequence_Fast(seq, "urls must be a sequence of str");
  if (!fast) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  const char **urls = PyMem_Calloc((size_t)n + 1, sizeof *urls);
  slot *slots = PyMem_RawCalloc((size_t)n + 1, sizeof *slots);
  PyObject *out = NULL;
  if (!urls || !slots) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    urls[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(fast, i));
    if (!urls[i]) goto done;
  }
  batch b;
  pthread_mutex_init(&b.mu, NULL);
  pthread_cond_init(&b.cv, NULL);
  b.left = (size_t)n;
  mml_status sst = MML_OK;
  mml_err serr = {0};
  Py_BEGIN_ALLOW_THREADS
  for (Py_ssize_t i = 0; i < n; i++) {
    slots[i].b = &b;
    mml_status st = mml_fetch_submit(f, urls[i], 0, -1, slot_cb, &slots[i], &slots[i].err);
    if (st) { /* never queued: account for it here */
      slots[i].st = st;
      pthread_mutex_lock(&b.mu);
      b.left--;
      pthread_mutex_unlock(&b.mu);
      if (!sst) sst = st, serr = slots[i].err;
    }
  }
  pthread_mutex_lock(&b.mu);
  while (b.left) pthread_cond_wait(&b.cv, &b.mu);
  pthread_mutex_unlock(&b.mu);
  Py_END_ALLOW_THREADS
  pthread_mutex_destroy(&b.mu);
  pthread_cond_destroy(&b.cv);
  (void)serr;
  out = PyList_New(n);
  if (!out) goto done;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *item;
    if (slots[i].st == MML_OK) {
      item = PyBytes_FromStringAndSize((const char *)slots[i].body.data,
                                       (Py_ssize_t)slots[i].body.len);
      if (!item) {
        Py_CLEAR(out);
        goto done;
      }
    } else if (skip) {
      item = Py_NewRef(Py_None);
    } else {
      fetch_raise(mml_py_state_of_self(self), slots[i].st, &slots[i].err);
      Py_CLEAR(out);
      goto done;
    }
    PyList_SET_ITEM(out, i, item);
  }
done:
  if (slots)
    for (Py_ssize_t i = 0; i < n; i++) mml_bytes_free(&slots[i].body);
  PyMem_RawFree(slots);
  PyMem_Free(urls);
  Py_DECREF(fast);
  return out;
}

static PyObject *Fetcher_list(FetcherObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"prefix", "pattern", NULL};
  const char *prefix, *pattern = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "s|z:list", kwlist, &prefix, &pattern)) return NULL;
  mml_fetcher *f = live(self);
  if (!f) return NULL;
  char **urls = NULL;
  size_t n = 0;
  mml_err err = {0};
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_fetch_list(f, prefix, pattern, &urls, &n, &err);
  Py_END_ALLOW_THREADS
  if (st) return fetch_raise(mml_py_state_of_self(self), st, &err);
  PyObject *out = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; out && i < n; i++) {
    PyObject *s = PyUnicode_FromString(urls[i]);
    if (!s) {
      Py_CLEAR(out);
      break;
    }
    PyList_SET_ITEM(out, (Py_ssize_t)i, s);
  }
  mml_fetch_list_free(urls, n);
  return out;
}

static PyObject *Fetcher_stats(FetcherObject *self, PyObject *unused) {
  mml_fetcher *f = live(self);
  if (!f) return NULL;
  mml_fetch_stats s;
  mml_fetch_get_stats(f, &s);
  return Py_BuildValue(
      "{sKsKsKs{sKsKsKsKsK}sdsdsdsi}", "requests", (unsigned long long)s.requests, "bytes",
      (unsigned long long)s.bytes, "failures", (unsigned long long)s.failures, "retries", "5xx",
      (unsigned long long)s.retries_5xx, "429", (unsigned long long)s.retries_429, "timeout",
      (unsigned long long)s.retries_timeout, "reset", (unsigned long long)s.retries_reset, "short",
      (unsigned long long)s.retries_short, "latency_p50_s", s.latency_p50_s, "latency_p90_s",
      s.latency_p90_s, "latency_p99_s", s.latency_p99_s, "inflight", s.inflight);
}

static PyObject *Fetcher_close(FetcherObject *self, PyObject *unused) {
  if (self->f) {
    mml_fetcher *f = self->f;
    self->f = NULL;
    Py_BEGIN_ALLOW_THREADS
    mml_fetcher_free(f);
    Py_END_ALLOW_THREADS
  }
  Py_RETURN_NONE;
}

static PyObject *Fetcher_enter(PyObject *self, PyObject *unused) { return Py_NewRef(self); }
static PyObject *Fetcher_exit(FetcherObject *self, PyObject *args) {
  return Fetcher_close(self, NULL);
}

static PyMethodDef Fetcher_methods[] = {
    {"get", (PyCFunction)(void (*)(void))Fetcher_get, METH_VARARGS | METH_KEYWORDS,
     "get(url, offset=0, length=-1) -> bytes: GET an http(s):// or s3:// object (or a byte "
     "range)."},
    {"get_many", (PyCFunction)(void (*)(void))Fetcher_get_many, METH_VARARGS | METH_KEYWORDS,
     "get_many(urls, *, on_error='raise') -> list: fetch all concurrently; 'skip' gives None for "
     "failures."},
    {"size", (PyCFunction)Fetcher_size, METH_VARARGS, "size(url) -> int: object size (HEAD)."},
    {"list", (PyCFunction)(void (*)(void))Fetcher_list, METH_VARARGS | METH_KEYWORDS,
     "list(prefix, pattern=None) -> list[str]: s3:// URLs under prefix matching the glob, sorted."},
    {"stats", (PyCFunction)Fetcher_stats, METH_NOARGS,
     "stats() -> dict: requests, bytes, retries, latency."},
    {"close", (PyCFunction)Fetcher_close, METH_NOARGS,
     "close(): cancel what is in flight and stop."},
    {"__enter__", (PyCFunction)Fetcher_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Fetcher_exit, METH_VARARGS, NULL},
    {NULL}};

static PyType_Slot Fetcher_slots[] = {
    {Py_tp_doc,
     "Fetcher(*, access_key=None, secret_key=None, session_token=None, region=None, "
     "endpoint=None, max_inflight=0, max_retries=0, timeout_s=0, connect_timeout_s=0, "
     "stall_s=0, backoff_base_s=0, backoff_max_s=0, range_chunk=0, list_page_size=0, "
     "io_threads=0, "
     "ca_bundle=None, max_object_bytes=0, min_rate=0, retry_budget_s=0, "
     "whole_cache_bytes=0)\n\n"
     "One I/O thread with a libcurl multi handle; 0 means the default."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, Fetcher_init},
    {Py_tp_dealloc, Fetcher_dealloc},
    {Py_tp_repr, Fetcher_repr},
    {Py_tp_methods, Fetcher_methods},
    {0, NULL}};

static PyType_Spec Fetcher_spec = {
    .name = "mmloader._core.Fetcher",
    .basicsize = sizeof(FetcherObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Fetcher_slots,
};

/* One-shot module functions: positional args go to the method, keywords split between
 * the method's own and the Fetcher configuration. */
static PyObject *one_shot(mml_py_state *ms, PyObject *args, PyObject *kw, const char *method,
                          const char *const *own) {
  PyObject *cfg = PyDict_New(), *mkw = PyDict_New(), *f = NULL, *m = NULL, *r = NULL;
  if (!cfg || !mkw) goto done;
  if (kw) {
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kw, &pos, &k, &v)) {
      int is_own = 0;
      for (const char *const *o = own; *o; o++)
        if (PyUnicode_Check(k) && PyUnicode_CompareWithASCIIString(k, *o) == 0) is_own = 1;
      if (PyDict_SetItem(is_own ? mkw : cfg, k, v)) goto done;
    }
  }
  PyObject *empty = PyTuple_New(0);
  if (!empty) goto done;
  f = PyObject_Call((PyObject *)ms->Fetcher_Type, empty, cfg);
  Py_DECREF(empty);
  if (!f) goto done;
  m = PyObject_GetAttrString(f, method);
  if (!m) goto done;
  r = PyObject_Call(m, args, mkw);
  PyObject *c = Fetcher_close((FetcherObject *)f, NULL);
  Py_XDECREF(c);
done:
  Py_XDECREF(m), Py_XDECREF(f), Py_XDECREF(cfg), Py_XDECREF(mkw);
  return r;
}

static PyObject *py_fetch_get(PyObject *mod, PyObject *args, PyObject *kw) {
  static const char *const own[] = {"url", "offset", "length", NULL};
  return one_shot(mml_py_state_of(mod), args, kw, "get", own);
}
static PyObject *py_fetch_many(PyObject *mod, PyObject *args, PyObject *kw) {
  static const char *const own[] = {"urls", "on_error", NULL};
  return one_shot(mml_py_state_of(mod), args, kw, "get_many", own);
}
static PyObject *py_fetch_size(PyObject *mod, PyObject *args, PyObject *kw) {
  static const char *const own[] = {NULL};
  return one_shot(mml_py_state_of(mod), args, kw, "size", own);
}
static PyObject *py_fetch_list(PyObject *mod, PyObject *args, PyObject *kw) {
  static const char *const own[] = {"prefix", "pattern", NULL};
  return one_shot(mml_py_state_of(mod), args, kw, "list", own);
}

static PyObject *py_sha256(PyObject *mod, PyObject *arg) {
  Py_buffer v;
  if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE)) return NULL;
  uint8_t d[32];
  mml_sha256(v.buf, (size_t)v.len, d);
  PyBuffer_Release(&v);
  return PyBytes_FromStringAndSize((const char *)d, 32);
}

/* _sigv4_authorization(method, uri, query, headers[(name, value)], payload_hash, amz_date,
 *                      region, service, access_key, secret_key) -> str */
static PyObject *py_sigv4_authorization(PyObject *mod, PyObject *args) {
  mml_py_state *ms = mml_py_state_of(mod);
  const char *method, *uri, *query, *ph, *date, *region, *service, *ak, *sk;
  PyObject *hl;
  if (!PyArg_ParseTuple(args, "sssOssssss:_sigv4_authorization", &method, &uri, &query, &hl, &ph,
                        &date, &region, &service, &ak, &sk))
    return NULL;
  PyObject *fast = PySequence_Fast(hl, "headers must be a sequence of (name, value)");
  if (!fast) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  if (n > 16) {
    Py_DECREF(fast);
    PyErr_SetString(PyExc_ValueError, "at most 16 headers");
    return NULL;
  }
  mml_sigv4_header hs[16];
  for (Py_ssize_t i = 0; i < n; i++) {
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "ss", &hs[i].name, &hs[i].value)) {
      Py_DECREF(fast);
      return NULL;
    }
  }
  mml_sigv4_req r = {method, uri, query, hs, (size_t)n, ph, date, region, service, ak, sk};
  char out[2048];
  mml_err err = {0};
  mml_status st = mml_sigv4_authorization(&r, out, sizeof out, &err);
  Py_DECREF(fast);
  if (st) return mml_py_raise(ms, st, &err);
  return PyUnicode_FromString(out);
}

static PyMethodDef fetch_functions[] = {
    {"fetch_get", (PyCFunction)(void (*)(void))py_fetch_get, METH_VARARGS | METH_KEYWORDS,
     "fetch_get(url, offset=0, length=-1, **cfg) -> bytes"},
    {"fetch_many", (PyCFunction)(void (*)(void))py_fetch_many, METH_VARARGS | METH_KEYWORDS,
     "fetch_many(urls, *, on_error='raise', **cfg) -> list"},
    {"fetch_size", (PyCFunction)(void (*)(void))py_fetch_size, METH_VARARGS | METH_KEYWORDS,
     "fetch_size(url, **cfg) -> int"},
    {"fetch_list", (PyCFunction)(void (*)(void))py_fetch_list, METH_VARARGS | METH_KEYWORDS,
     "fetch_list(prefix, pattern=None, **cfg) -> list[str]"},
    {"_sha256", (PyCFunction)py_sha256, METH_O, "_sha256(data) -> bytes (test hook)"},
    {"_sigv4_authorization", (PyCFunction)py_sigv4_authorization, METH_VARARGS,
     "SigV4 Authorization value (test hook)"},
    {NULL}};

int mml_py_fetch_exec(PyObject *m) {
  if (mml_py_add_type(m, &Fetcher_spec, &mml_py_state_of(m)->Fetcher_Type, "Fetcher")) return -1;
  return PyModule_AddFunctions(m, fetch_functions);
}
