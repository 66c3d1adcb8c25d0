/*
 * cuda_py.c — the CUDA runtime as the module sees it: cuda_available(), device counts,
 * why CUDA is unavailable, the DLPack stream handshake used by tensor_py.c, and
 * _core.DeviceStage, the loader's device stage on its own (copy arrays to the GPU through
 * pinned buffers, exactly as the loader does; used by tests and the benchmark).
 *
 * Loading the runtime may take a while the first time (driver initialisation): the GIL is
 * released around it and around every call that may wait for the GPU.
 */
#include "binding.h"
#include "mml/cuda.h"
#include "mml/device.h"

/* Before the first load: the libcudart paths of installed wheels (mmloader._cudart), so
 * a pip-installed PyTorch's runtime is found even before torch is imported.  Failures
 * only mean fewer candidates. */
static void pass_candidates(void) {
  static int done;
  if (done) return;
  done = 1;
  PyObject *mod = PyImport_ImportModule("mmloader._cudart");
  PyObject *lst = mod ? PyObject_CallMethod(mod, "candidates", NULL) : NULL;
  if (lst && PyList_Check(lst)) {
    const char *paths[8];
    int n = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lst) && n < 8; i++) {
      const char *p = PyUnicode_Check(PyList_GET_ITEM(lst, i))
                          ? PyUnicode_AsUTF8(PyList_GET_ITEM(lst, i))
                          : NULL;
      if (p) paths[n++] = p;
    }
    mml_cuda_set_candidates(paths, n);
  }
  PyErr_Clear();
  Py_XDECREF(lst);
  Py_XDECREF(mod);
}

/* Loads the runtime (once per process) without holding the GIL. */
static mml_status ensure_loaded(mml_err *err) {
  pass_candidates();
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_cuda_load(err);
  Py_END_ALLOW_THREADS
  return st;
}

static PyObject *py_cuda_available(PyObject *self, PyObject *noargs) {
  (void)self, (void)noargs;
  return PyBool_FromLong(ensure_loaded(NULL) == MML_OK);
}

static PyObject *py_cuda_device_count(PyObject *self, PyObject *noargs) {
  (void)self, (void)noargs;
  ensure_loaded(NULL);
  return PyLong_FromLong(mml_cuda_device_count());
}

static PyObject *py_cuda_load(PyObject *self, PyObject *noargs) {
  (void)self, (void)noargs;
  mml_err err = {0};
  mml_status st = ensure_loaded(&err);
  if (st != MML_OK) return mml_py_raise(st, &err);
  return PyUnicode_FromString(mml_cuda_library());
}

static PyObject *py_cuda_unavailable_reason(PyObject *self, PyObject *noargs) {
  (void)self, (void)noargs;
  mml_err err = {0};
  if (ensure_loaded(&err) == MML_OK) Py_RETURN_NONE;
  return PyUnicode_FromString(err.msg);
}

static PyObject *py_cuda_current_device(PyObject *self, PyObject *noargs) {
  (void)self, (void)noargs;
  return PyLong_FromLong(mml_cuda_current_device());
}

int mml_py_cuda_stream_arg(PyObject *stream, uintptr_t *out) {
  if (stream == NULL || stream == Py_None) {
    *out = MML_CUDA_STREAM_LEGACY;
    return 0;
  }
  if (!PyLong_Check(stream)) {
    PyErr_SetString(PyExc_TypeError, "stream must be None or an int (a cudaStream_t)");
    return -1;
  }
  long long v = PyLong_AsLongLong(stream);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    unsigned long long u = PyLong_AsUnsignedLongLong(stream);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = (uintptr_t)u;
    return 0;
  }
  if (v < -1) {
    PyErr_Format(PyExc_ValueError, "invalid CUDA stream %lld", v);
    return -1;
  }
  /* -1: no synchronisation; 0 (ambiguous in the protocol): the legacy default stream. */
  *out = v == -1 ? MML_NO_SYNC : v == 0 ? MML_CUDA_STREAM_LEGACY : (uintptr_t)v;
  return 0;
}

int mml_py_cuda_export(mml_buf *b, PyObject *stream) {
  if (!b || b->kind != MML_MEM_DEVICE) return 0; /* host memory: nothing to order */
  uintptr_t s;
  if (mml_py_cuda_stream_arg(stream, &s) < 0) return -1;
  if (s == MML_NO_SYNC) return 0;
  mml_err err = {0};
  mml_status st = mml_fence_export(b, b->device, s, &err);
  if (st != MML_OK) {
    mml_py_raise(st, &err);
    return -1;
  }
  return 0;
}

/* ---- DeviceStage ------------------------------------------------------------------- */

typedef struct {
  PyObject_HEAD
  mml_device_stage *stage; /* NULL once closed */
  mml_pool *pinned;
  int device;
} StageObject;

static int stage_init(StageObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"device", "max_cached_bytes", NULL};
  int device = 0;
  unsigned long long max_cached = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|iK:DeviceStage", kwlist, &device, &max_cached))
    return -1;
  if (self->stage) return 0;
  mml_err err = {0};
  mml_allocator pa;
  mml_status st = ensure_loaded(&err);
  if (st == MML_OK) st = mml_pinned_allocator(&pa, &err);
  if (st == MML_OK) st = mml_pool_new(&pa, (size_t)max_cached, &self->pinned, &err);
  if (st == MML_OK) {
    Py_BEGIN_ALLOW_THREADS
    st = mml_device_stage_new(device, (size_t)max_cached, &self->stage, &err);
    Py_END_ALLOW_THREADS
  }
  if (st != MML_OK) {
    mml_pool_close(self->pinned);
    self->pinned = NULL;
    mml_py_raise(st, &err);
    return -1;
  }
  self->device = device;
  return 0;
}

static void stage_close_impl(StageObject *self) {
  mml_device_stage *s = self->stage;
  mml_pool *p = self->pinned;
  self->stage = NULL;
  self->pinned = NULL;
  Py_BEGIN_ALLOW_THREADS
  mml_device_stage_free(s);
  mml_pool_close(p);
  Py_END_ALLOW_THREADS
}

static void stage_dealloc(StageObject *self) {
  if (self->stage) stage_close_impl(self);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int dtype_of_format(const Py_buffer *v, mml_dtype *out) {
  const char *f = v->format ? v->format : "B";
  if (*f == '<' || *f == '=' || *f == '@') f++;
  char c = *f;
  if (c == 'f' && v->itemsize == 4)
    *out = MML_DT_FLOAT32;
  else if (c == '?' && v->itemsize == 1)
    *out = MML_DT_BOOL;
  else if ((c == 'B' || c == 'b') && v->itemsize == 1)
    *out = MML_DT_UINT8;
  else if (strchr("ilqn", c) && v->itemsize == 4)
    *out = MML_DT_INT32;
  else if (strchr("ilqn", c) && v->itemsize == 8)
    *out = MML_DT_INT64;
  else
    return -1;
  return 0;
}

/* Fills a pinned host batch with copies of the arrays of `arrays` (name -> C-contiguous
 * buffer).  0, or -1 with an exception set (the batch is cleared). */
static int fill_pinned(StageObject *self, PyObject *arrays, mml_batch *h) {
  memset(h, 0, sizeof *h);
  if (!PyDict_Check(arrays)) {
    PyErr_SetString(PyExc_TypeError, "expected a dict of name -> array");
    return -1;
  }
  PyObject *key, *val;
  Py_ssize_t pos = 0;
  while (PyDict_Next(arrays, &pos, &key, &val)) {
    const char *name = PyUnicode_AsUTF8(key);
    if (!name) goto fail;
    Py_buffer v;
    if (PyObject_GetBuffer(val, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto fail;
    mml_dtype dt;
    if (v.ndim > MML_MAX_DIMS || dtype_of_format(&v, &dt) < 0) {
      PyErr_Format(PyExc_TypeError, "%s: unsupported array (format %s, %d dims)", name,
                   v.format ? v.format : "B", v.ndim);
      PyBuffer_Release(&v);
      goto fail;
    }
    int64_t shape[MML_MAX_DIMS];
    for (int i = 0; i < v.ndim; i++) shape[i] = v.shape ? v.shape[i] : v.len / v.itemsize;
    mml_err err = {0};
    void *data;
    mml_status st = mml_batch_add(h, self->pinned, name, dt, v.ndim, shape, &data, &err);
    if (st == MML_OK) memcpy(data, v.buf, (size_t)v.len);
    PyBuffer_Release(&v);
    if (st != MML_OK) {
      mml_py_raise(st, &err);
      goto fail;
    }
  }
  return 0;
fail:
  mml_batch_clear(h);
  return -1;
}

/* A dict name -> Tensor taking over every slot of b (b is cleared). */
static PyObject *batch_to_dict(mml_batch *b) {
  PyObject *d = PyDict_New();
  for (int i = 0; d && i < b->ntensors; i++) {
    PyObject *t = mml_py_tensor_from_slot(&b->tensors[i]);
    if (!t || PyDict_SetItemString(d, b->tensors[i].name, t) < 0) Py_CLEAR(d);
    Py_XDECREF(t);
  }
  mml_batch_clear(b);
  return d;
}

static int check_open(StageObject *self) {
  if (self->stage) return 0;
  PyErr_SetString(mml_py_Error, "DeviceStage is closed");
  return -1;
}

static PyObject *stage_copy(StageObject *self, PyObject *arrays) {
  if (check_open(self) < 0) return NULL;
  mml_batch h, d;
  if (fill_pinned(self, arrays, &h) < 0) return NULL;
  mml_err err = {0};
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_device_stage_copy(self->stage, &h, &d, &err);
  mml_batch_clear(&h);
  Py_END_ALLOW_THREADS
  if (st != MML_OK) return mml_py_raise(st, &err);
  return batch_to_dict(&d);
}

static PyObject *stage_pinned(StageObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"arrays", "stream", NULL};
  PyObject *arrays, *stream = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:pinned", kwlist, &arrays, &stream)) return NULL;
  if (check_open(self) < 0) return NULL;
  uintptr_t s = 0;
  if (stream != Py_None && mml_py_cuda_stream_arg(stream, &s) < 0) return NULL;
  mml_batch h;
  if (fill_pinned(self, arrays, &h) < 0) return NULL;
  mml_err err = {0};
  mml_status st = mml_device_guard_pinned(&h, self->device, s, &err);
  if (st != MML_OK) {
    mml_batch_clear(&h);
    return mml_py_raise(st, &err);
  }
  return batch_to_dict(&h);
}

static PyObject *stage_bench(StageObject *self, PyObject *args) {
  unsigned long long nbytes;
  int ntensors, iters;
  if (!PyArg_ParseTuple(args, "Kii:bench", &nbytes, &ntensors, &iters)) return NULL;
  if (check_open(self) < 0) return NULL;
  if (ntensors < 1 || ntensors > MML_MAX_TENSORS || iters < 1) {
    PyErr_SetString(PyExc_ValueError, "need 1 <= ntensors <= 16 and iters >= 1");
    return NULL;
  }
  mml_err err = {0};
  mml_status st = MML_OK;
  double t0 = 0, t1 = 0;
  Py_BEGIN_ALLOW_THREADS
  int64_t each = (int64_t)(nbytes / (unsigned)ntensors);
  mml_batch last = {0};
  t0 = mml_now();
  for (int it = 0; it < iters && st == MML_OK; it++) {
    mml_batch h = {0}, d;
    for (int k = 0; k < ntensors && st == MML_OK; k++) {
      char name[16];
      snprintf(name, sizeof name, "t%d", k);
      st = mml_batch_add(&h, self->pinned, name, MML_DT_UINT8, 1, &each, NULL, &err);
    }
    if (st == MML_OK) st = mml_device_stage_copy(self->stage, &h, &d, &err);
    mml_batch_clear(&h);
    if (st == MML_OK) {
      mml_batch_clear(&last);
      last = d;
    }
  }
  for (int i = 0; i < last.ntensors && st == MML_OK; i++)
    st = mml_fence_wait(last.tensors[i].buf, &err);
  t1 = mml_now();
  mml_batch_clear(&last);
  Py_END_ALLOW_THREADS
  if (st != MML_OK) return mml_py_raise(st, &err);
  return PyFloat_FromDouble(t1 - t0);
}

static PyObject *stage_usage(StageObject *self, PyObject *noargs) {
  if (check_open(self) < 0) return NULL;
  size_t dc, dl, pc, pl;
  mml_pool_usage(mml_device_stage_pool(self->stage), &dc, &dl);
  mml_pool_usage(self->pinned, &pc, &pl);
  return Py_BuildValue("{s:K,s:K,s:K,s:K}", "device_cached", (unsigned long long)dc, "device_live",
                       (unsigned long long)dl, "pinned_cached", (unsigned long long)pc,
                       "pinned_live", (unsigned long long)pl);
}

static PyObject *stage_close(StageObject *self, PyObject *noargs) {
  if (self->stage) stage_close_impl(self);
  Py_RETURN_NONE;
}

static PyMethodDef stage_methods[] = {
    {"copy", (PyCFunction)stage_copy, METH_O,
     "copy(arrays: dict[str, array]) -> dict[str, Tensor]\n\nCopies each array into a "
     "pinned buffer, then (asynchronously, on the stage's stream) into device memory; the "
     "returned Tensors live on cuda:N and make the consumer's stream wait for the copy."},
    {"pinned", (PyCFunction)(void (*)(void))stage_pinned, METH_VARARGS | METH_KEYWORDS,
     "pinned(arrays, stream=None) -> dict[str, Tensor]\n\nPinned host copies of the arrays, "
     "guarded as the loader guards pin_memory batches (not reused before work queued on the "
     "default stream, and on `stream`, before their release has completed)."},
    {"bench", (PyCFunction)stage_bench, METH_VARARGS,
     "bench(nbytes, ntensors, iters) -> seconds\n\nCopies `iters` batches of `ntensors` "
     "tensors totalling nbytes through the stage and waits for the last."},
    {"usage", (PyCFunction)stage_usage, METH_NOARGS, "Bytes cached/live in both pools."},
    {"close", (PyCFunction)stage_close, METH_NOARGS,
     "Waits for queued copies and frees cached buffers (tensors stay valid)."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject Stage_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mmloader._core.DeviceStage",
    .tp_basicsize = sizeof(StageObject),
    .tp_dealloc = (destructor)stage_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "DeviceStage(device=0, max_cached_bytes=0): the loader's host-to-device copy "
        "stage on its own (tests, benchmarks).  Raises CudaError without CUDA.",
    .tp_methods = stage_methods,
    .tp_init = (initproc)stage_init,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef k_methods[] = {
    {"cuda_available", py_cuda_available, METH_NOARGS,
     "cuda_available() -> bool\n\nTrue when a CUDA runtime and at least one device are usable "
     "(the runtime is loaded at run time; nothing is linked)."},
    {"cuda_device_count", py_cuda_device_count, METH_NOARGS,
     "cuda_device_count() -> int\n\nVisible CUDA devices (0 without a usable runtime)."},
    {"cuda_load", py_cuda_load, METH_NOARGS,
     "cuda_load() -> str\n\nLoads the CUDA runtime; returns the library's path or raises "
     "CudaError saying why it is unavailable."},
    {"cuda_unavailable_reason", py_cuda_unavailable_reason, METH_NOARGS,
     "cuda_unavailable_reason() -> str | None\n\nWhy CUDA is unavailable, or None."},
    {"cuda_current_device", py_cuda_current_device, METH_NOARGS,
     "cuda_current_device() -> int\n\nThe calling thread's current CUDA device (0 without "
     "CUDA)."},
    {NULL, NULL, 0, NULL}};

int mml_py_cuda_register(PyObject *m) {
  if (PyModule_AddFunctions(m, k_methods) < 0) return -1;
  if (PyType_Ready(&Stage_Type) < 0) return -1;
  Py_INCREF(&Stage_Type);
  if (PyModule_AddObject(m, "DeviceStage", (PyObject *)&Stage_Type) < 0) {
    Py_DECREF(&Stage_Type);
    return -1;
  }
  if (PyModule_AddIntConstant(m, "kDLCPU", 1) < 0 || PyModule_AddIntConstant(m, "kDLCUDA", 2) < 0 ||
      PyModule_AddIntConstant(m, "kDLCUDAHost", 3) < 0)
    return -1;
  return 0;
}
