/*
 * device_stage_py.c — mmloader._core.DeviceStage: the loader's device stage on its own
 * (copy arrays to the GPU through pinned buffers, exactly as the loader does; used by tests
 * and the benchmark).  The GIL is released around every call that may wait for the GPU.
 */
#include <string.h>

#include "binding.h"
#include "mml/batch.h"
#include "mml/cuda.h"
#include "mml/device.h"

typedef struct {
  PyObject_HEAD
  mml_device_stage *stage; /* NULL once closed */
  mml_pool *pinned;
  int device;
} DeviceStageObject;

static int DeviceStage_init(DeviceStageObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"device", "max_cached_bytes", NULL};
  int device = 0;
  unsigned long long max_cached = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|iK:DeviceStage", kwlist, &device, &max_cached))
    return -1;
  if (self->stage) return 0;
  mml_err err = {0};
  mml_allocator pa;
  mml_status st = mml_py_cuda_load(&err);
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
    mml_py_raise(mml_py_state_of_self(self), st, &err);
    return -1;
  }
  self->device = device;
  return 0;
}

static void close_stage(DeviceStageObject *self) {
  mml_device_stage *s = self->stage;
  mml_pool *p = self->pinned;
  self->stage = NULL;
  self->pinned = NULL;
  Py_BEGIN_ALLOW_THREADS
  mml_device_stage_free(s);
  mml_pool_close(p);
  Py_END_ALLOW_THREADS
}

static void DeviceStage_dealloc(DeviceStageObject *self) {
  if (self->stage) close_stage(self);
  PyTypeObject *tp = Py_TYPE(self);
  tp->tp_free((PyObject *)self);
  Py_DECREF(tp); /* heap type: each instance holds a reference */
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
static int fill_pinned(DeviceStageObject *self, PyObject *arrays, mml_batch *h) {
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
      mml_py_raise(mml_py_state_of_self(self), st, &err);
      goto fail;
    }
  }
  return 0;
fail:
  mml_batch_clear(h);
  return -1;
}

static int check_open(DeviceStageObject *self) {
  if (self->stage) return 0;
  PyErr_SetString(mml_py_state_of_self(self)->Error, "DeviceStage is closed");
  return -1;
}

static PyObject *DeviceStage_copy(DeviceStageObject *self, PyObject *arrays) {
  if (check_open(self) < 0) return NULL;
  mml_batch h, d;
  if (fill_pinned(self, arrays, &h) < 0) return NULL;
  mml_err err = {0};
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_device_stage_copy(self->stage, &h, &d, &err);
  mml_batch_clear(&h);
  Py_END_ALLOW_THREADS
  if (st != MML_OK) return mml_py_raise(mml_py_state_of_self(self), st, &err);
  return mml_py_batch_dict(mml_py_state_of_self(self), &d);
}

static PyObject *DeviceStage_pinned(DeviceStageObject *self, PyObject *args, PyObject *kw) {
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
    return mml_py_raise(mml_py_state_of_self(self), st, &err);
  }
  return mml_py_batch_dict(mml_py_state_of_self(self), &h);
}

/* bench: `iters` batches of `ntensors` uint8 tensors (nbytes in all) from the pinned pool
 * through the stage, as the loader emits them: each host batch is released once its copy
 * is queued, each device batch when the next one is out.  hold=True keeps every batch
 * until the last copy is done instead, so both pools end up caching iters x ntensors
 * buffers: every buffer a run can have in flight, however far the host gets ahead of the
 * copies (benchmarks/bench_cuda.py warms its stages so). */
static PyObject *DeviceStage_bench(DeviceStageObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"nbytes", "ntensors", "iters", "hold", "timings", NULL};
  unsigned long long nbytes;
  int ntensors, iters, hold = 0, timings = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "Kii|$pp:bench", kwlist, &nbytes, &ntensors, &iters,
                                   &hold, &timings))
    return NULL;
  if (check_open(self) < 0) return NULL;
  if (ntensors < 1 || ntensors > MML_MAX_TENSORS || iters < 1) {
    PyErr_SetString(PyExc_ValueError, "need 1 <= ntensors <= 16 and iters >= 1");
    return NULL;
  }
  mml_batch *held = NULL;
  if (hold && !(held = calloc(2 * (size_t)iters, sizeof *held))) return PyErr_NoMemory();
  int nheld = 0;
  mml_err err = {0};
  mml_status st = MML_OK;
  double t0 = 0, t1 = 0, t2 = 0;
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
    if (st == MML_OK && held) {
      held[nheld++] = h;
      held[nheld++] = last;
    } else {
      mml_batch_clear(&h);
      mml_batch_clear(&last);
    }
    if (st == MML_OK) last = d;
  }
  t1 = mml_now(); /* every copy queued */
  for (int i = 0; i < last.ntensors && st == MML_OK; i++)
    st = mml_fence_wait(last.tensors[i].buf, &err);
  t2 = mml_now();
  mml_batch_clear(&last);
  for (int i = 0; i < nheld; i++) mml_batch_clear(&held[i]);
  Py_END_ALLOW_THREADS
  free(held);
  if (st != MML_OK) return mml_py_raise(mml_py_state_of_self(self), st, &err);
  if (timings) return Py_BuildValue("(dd)", t2 - t0, t1 - t0);
  return PyFloat_FromDouble(t2 - t0);
}

static PyObject *DeviceStage_usage(DeviceStageObject *self, PyObject *noargs) {
  if (check_open(self) < 0) return NULL;
  size_t dc, dl, pc, pl;
  mml_pool_usage(mml_device_stage_pool(self->stage), &dc, &dl);
  mml_pool_usage(self->pinned, &pc, &pl);
  return Py_BuildValue("{s:K,s:K,s:K,s:K}", "device_cached", (unsigned long long)dc, "device_live",
                       (unsigned long long)dl, "pinned_cached", (unsigned long long)pc,
                       "pinned_live", (unsigned long long)pl);
}

static PyObject *pool_stats_dict(mml_pool *p) {
  mml_pool_stats s;
  mml_pool_stats_get(p, &s);
  return Py_BuildValue(
      "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "allocs", (unsigned long long)s.allocs, "reuses",
      (unsigned long long)s.reuses, "frees", (unsigned long long)s.frees, "release_frees",
      (unsigned long long)s.release_frees, "pending_skips", (unsigned long long)s.pending_skips,
      "pending_max", (unsigned long long)s.pending_max, "cached_bufs",
      (unsigned long long)s.cached_bufs, "cached", (unsigned long long)s.cached, "live",
      (unsigned long long)s.live);
}

static PyObject *DeviceStage_stats(DeviceStageObject *self, PyObject *noargs) {
  if (check_open(self) < 0) return NULL;
  PyObject *d = pool_stats_dict(mml_device_stage_pool(self->stage));
  PyObject *p = d ? pool_stats_dict(self->pinned) : NULL;
  PyObject *r = p ? Py_BuildValue("{s:O,s:O}", "device", d, "pinned", p) : NULL;
  Py_XDECREF(d);
  Py_XDECREF(p);
  return r;
}

static PyObject *DeviceStage_close(DeviceStageObject *self, PyObject *noargs) {
  if (self->stage) close_stage(self);
  Py_RETURN_NONE;
}

static PyMethodDef DeviceStage_methods[] = {
    {"copy", (PyCFunction)DeviceStage_copy, METH_O,
     "copy(arrays: dict[str, array]) -> dict[str, Tensor]\n\nCopies each array into a "
     "pinned buffer, then (asynchronously, on the stage's stream) into device memory; the "
     "returned Tensors live on cuda:N and make the consumer's stream wait for the copy."},
    {"pinned", (PyCFunction)(void (*)(void))DeviceStage_pinned, METH_VARARGS | METH_KEYWORDS,
     "pinned(arrays, stream=None) -> dict[str, Tensor]\n\nPinned host copies of the arrays, "
     "guarded as the loader guards pin_memory batches (not reused before work queued on the "
     "default stream, and on `stream`, before their release has completed)."},
    {"bench", (PyCFunction)(void (*)(void))DeviceStage_bench, METH_VARARGS | METH_KEYWORDS,
     "bench(nbytes, ntensors, iters, *, hold=False, timings=False) -> seconds\n\nCopies "
     "`iters` batches of `ntensors` tensors totalling nbytes through the stage and waits for "
     "the last.  hold: keep every batch until then (the pools end up caching every buffer a "
     "run can have in flight).  timings: (seconds, seconds until every copy was queued)."},
    {"usage", (PyCFunction)DeviceStage_usage, METH_NOARGS, "Bytes cached/live in both pools."},
    {"stats", (PyCFunction)DeviceStage_stats, METH_NOARGS,
     "stats() -> {'device': {...}, 'pinned': {...}}: each pool's counts since it was made "
     "(allocs, reuses, frees, release_frees, pending_skips, pending_max, cached_bufs) and its "
     "cached / live bytes."},
    {"close", (PyCFunction)DeviceStage_close, METH_NOARGS,
     "Waits for queued copies and frees cached buffers (tensors stay valid)."},
    {NULL, NULL, 0, NULL}};

static PyType_Slot DeviceStage_slots[] = {
    {Py_tp_dealloc, DeviceStage_dealloc},
    {Py_tp_doc,
     "DeviceStage(device=0, max_cached_bytes=0): the loader's host-to-device copy "
     "stage on its own (tests, benchmarks).  Raises CudaError without CUDA."},
    {Py_tp_methods, DeviceStage_methods},
    {Py_tp_init, DeviceStage_init},
    {Py_tp_new, PyType_GenericNew},
    {0, NULL}};

static PyType_Spec DeviceStage_spec = {
    .name = "mmloader._core.DeviceStage",
    .basicsize = sizeof(DeviceStageObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = DeviceStage_slots,
};

int mml_py_device_stage_exec(PyObject *m) {
  return mml_py_add_type(m, &DeviceStage_spec, &mml_py_state_of(m)->DeviceStage_Type,
                         "DeviceStage");
}
