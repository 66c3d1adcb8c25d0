/*
 * dsindex_py.c — the dataset index (mml/dsindex.h) for mmloader.dsindex and
 * `python -m mmloader index`: build_index(loader, shard, out, threads, progress) runs
 * the C build with the GIL released (progress is called with it held, about every
 * 0.2 s; an exception from it, e.g. KeyboardInterrupt, stops the build, resumably);
 * read_index(path) parses a sidecar with every check the loader makes; index_path(shard,
 * out) is where a shard's index file is (mml_dsx_sidecar_path: the one naming rule).
 */
#include "binding.h"
#include "mml/options.h"
#include "mml/dsindex.h"
#include "mml/loader.h"

/* The build calls its callback on the thread that started it (dsindex_build.c DESIGN),
 * which released the GIL: the callback takes that thread's own state back (not
 * PyGILState, which knows only the main interpreter). */
typedef struct progress_ctx {
  PyObject *fn;
  PyThreadState *ts; /* the caller's, saved while the build runs */
  int failed;        /* fn raised: the exception is pending */
} progress_ctx;

static int on_progress(void *ctx, int64_t done, int64_t total) {
  progress_ctx *p = ctx;
  PyEval_RestoreThread(p->ts);
  int stop = 0;
  if (PyErr_CheckSignals() < 0) {
    stop = p->failed = 1;
  } else if (p->fn != Py_None) {
    PyObject *r = PyObject_CallFunction(p->fn, "LL", (long long)done, (long long)total);
    if (!r) stop = p->failed = 1;
    Py_XDECREF(r);
  }
  p->ts = PyEval_SaveThread();
  return stop;
}

static PyObject *summary_dict(const mml_index_summary *s) {
  PyObject *hist = PyDict_New(), *bad = PyDict_New(), *ex = PyDict_New();
  PyObject *d = NULL;
  if (!hist || !bad || !ex) goto done;
  for (int b = 0; b < 32; b++) {
    if (!s->image_token_hist[b]) continue;
    PyObject *k = PyLong_FromLongLong(1LL << b), *v = PyLong_FromLongLong(s->image_token_hist[b]);
    int bad_set = !k || !v || PyDict_SetItem(hist, k, v) < 0;
    Py_XDECREF(k);
    Py_XDECREF(v);
    if (bad_set) goto done;
  }
  for (int st = 1; st < MML_STATUS_COUNT; st++) {
    if (!s->by_status[st]) continue;
    const char *r = mml_status_skip_reason((mml_status)st);
    if (!r) r = mml_status_name((mml_status)st);
    PyObject *old = PyDict_GetItemString(bad, r);
    long long n = s->by_status[st] + (old ? PyLong_AsLongLong(old) : 0);
    PyObject *v = PyLong_FromLongLong(n);
    if (!v || PyDict_SetItemString(bad, r, v) < 0) {
      Py_XDECREF(v);
      goto done;
    }
    Py_DECREF(v);
    if (s->example[st][0] && !PyDict_GetItemString(ex, r)) {
      PyObject *m =
          PyUnicode_DecodeUTF8(s->example[st], (Py_ssize_t)strlen(s->example[st]), "replace");
      if (!m || PyDict_SetItemString(ex, r, m) < 0) {
        Py_XDECREF(m);
        goto done;
      }
      Py_DECREF(m);
    }
  }
  d = Py_BuildValue(
      "{s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:K,s:d,s:O,s:O,s:O,s:O}", "samples", (long long)s->samples,
      "good", (long long)s->good, "resumed", (long long)s->resumed, "images", (long long)s->images,
      "text_tokens", (long long)s->text_tokens, "image_tokens", (long long)s->image_tokens,
      "videos", (long long)s->videos, "video_tokens", (long long)s->video_tokens, "bytes_read",
      (unsigned long long)s->bytes_read, "seconds", s->seconds, "image_token_hist", hist, "bad",
      bad, "examples", ex, "up_to_date", s->up_to_date ? Py_True : Py_False);
done:
  Py_XDECREF(hist);
  Py_XDECREF(bad);
  Py_XDECREF(ex);
  return d;
}

static PyObject *py_build_index(PyObject *mod, PyObject *args, PyObject *kw) {
  mml_py_state *ms = mml_py_state_of(mod);
  static char *kwlist[] = {"loader", "shard", "out", "threads", "progress", NULL};
  PyObject *lo, *progress = Py_None;
  int shard, threads = 1;
  const char *out;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "Ois|iO", kwlist, &lo, &shard, &out, &threads,
                                   &progress))
    return NULL;
  mml_loader *L = mml_py_loader_get(ms, lo);
  if (!L) return NULL;
  mml_index_summary *sum = PyMem_Calloc(1, sizeof *sum);
  if (!sum) return PyErr_NoMemory();
  progress_ctx ctx = {progress, NULL, 0};
  mml_err err;
  mml_err_clear(&err);
  mml_status st;
  Py_INCREF(lo); /* the loader must outlive the build */
  ctx.ts = PyEval_SaveThread();
  st = mml_loader_build_index(L, shard, out, threads, on_progress, &ctx, sum, &err);
  PyEval_RestoreThread(ctx.ts);
  Py_DECREF(lo);
  PyObject *r = NULL;
  if (ctx.failed) {
    /* the callback's exception (e.g. KeyboardInterrupt) is pending */
  } else if (st) {
    mml_py_raise(ms, st, &err);
  } else {
    r = summary_dict(sum);
  }
  PyMem_Free(sum);
  return r;
}

static PyObject *py_loader_shards(PyObject *mod, PyObject *lo) {
  mml_py_state *ms = mml_py_state_of(mod);
  mml_loader *L = mml_py_loader_get(ms, lo);
  if (!L) return NULL;
  int n = mml_loader_num_shards(L);
  PyObject *l = PyList_New(n);
  for (int i = 0; l && i < n; i++) {
    PyObject *s = PyUnicode_FromString(mml_loader_shard_path(L, i));
    if (!s) {
      Py_CLEAR(l);
      break;
    }
    PyList_SET_ITEM(l, i, s);
  }
  return l;
}

static PyObject *py_read_index(PyObject *mod, PyObject *args) {
  mml_py_state *ms = mml_py_state_of(mod);
  const char *path;
  if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
  mml_bytes b = {0};
  mml_err err;
  mml_status st;
  mml_dsx x;
  Py_BEGIN_ALLOW_THREADS
  st = mml_read_file(path, 0, -1, &b, &err);
  if (!st) st = mml_dsx_parse(b.data, b.len, path, &x, &err);
  Py_END_ALLOW_THREADS
  mml_bytes_free(&b);
  if (st) return mml_py_raise(ms, st, &err);
  PyObject *tt = PyList_New(x.n), *st_l = PyList_New(x.n), *imgs = PyList_New(x.n);
  for (int64_t i = 0; tt && st_l && imgs && i < x.n; i++) {
    PyList_SET_ITEM(tt, i, PyLong_FromUnsignedLong(x.samples[i].text_tokens));
    PyList_SET_ITEM(st_l, i, PyLong_FromLong(x.samples[i].status));
    PyObject *l = PyList_New(x.samples[i].nimages);
    for (int j = 0; l && j < x.samples[i].nimages; j++) {
      const mml_dsx_image *m = &x.images[x.first_image[i] + j];
      PyList_SET_ITEM(l, j,
                      Py_BuildValue("(kkk)", (unsigned long)m->width, (unsigned long)m->height,
                                    (unsigned long)m->tokens));
    }
    PyList_SET_ITEM(imgs, i, l ? l : (Py_INCREF(Py_None), Py_None));
  }
  const char *layout = mml_option_enum_name(mml_loader_option("data_format"), x.layout);
  static const char *const comp[] = {"none", "gzip", "zstd", "parquet"};
  char key[17];
  snprintf(key, sizeof key, "%016llx", (unsigned long long)x.key);
  PyObject *r = NULL;
  if (tt && st_l && imgs)
    r = Py_BuildValue("{s:i,s:L,s:L,s:L,s:L,s:s,s:s,s:s,s:s,s:s,s:O,s:O,s:O}", "version",
                      (int)MML_DSX_VERSION, "samples", (long long)x.n, "num_images",
                      (long long)x.nimages, "shard_size", (long long)x.shard_size, "shard_mtime_ns",
                      (long long)x.shard_mtime_ns, "etag", x.etag, "key", key, "settings",
                      x.settings, "layout", layout ? layout : "?", "compression",
                      comp[x.compression], "text_tokens", tt, "status", st_l, "images", imgs);
  Py_XDECREF(tt);
  Py_XDECREF(st_l);
  Py_XDECREF(imgs);
  mml_dsx_free(&x);
  return r;
}

static PyObject *py_index_path(PyObject *mod, PyObject *args) {
  const char *shard, *out = NULL;
  if (!PyArg_ParseTuple(args, "s|z", &shard, &out)) return NULL;
  mml_bytes b = {0};
  if (mml_dsx_sidecar_path(shard, out, &b)) return PyErr_NoMemory();
  PyObject *r = PyUnicode_FromStringAndSize((const char *)b.data, (Py_ssize_t)b.len);
  mml_bytes_free(&b);
  return r;
}

static PyMethodDef dsindex_functions[] = {
    {"build_index", (PyCFunction)(void (*)(void))py_build_index, METH_VARARGS | METH_KEYWORDS,
     "build_index(loader, shard, out, threads=1, progress=None) -> summary dict: the dataset "
     "index of the loader's shard number `shard`, written to `out` (resumable)."},
    {"loader_shards", py_loader_shards, METH_O, "loader_shards(loader): the loader's shard paths."},
    {"index_path", py_index_path, METH_VARARGS,
     "index_path(shard, out=None) -> str: where the index file of `shard` is: next to it, "
     "or in folder/URL prefix `out` under a name keyed by a hash of the shard path."},
    {"read_index", py_read_index, METH_VARARGS,
     "read_index(path) -> dict: a dataset index file, checked as the loader checks it."},
    {NULL, NULL, 0, NULL}};

int mml_py_dsindex_exec(PyObject *m) { return PyModule_AddFunctions(m, dsindex_functions); }
