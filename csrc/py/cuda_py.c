/*
 * cuda_py.c — the CUDA runtime as the module sees it: cuda_available(), device counts,
 * why CUDA is unavailable, and the DLPack stream handshake used by tensor_py.c.
 *
 * Loading the runtime may take a while the first time (driver initialisation): the GIL is
 * released around it.
 */
#include "binding.h"
#include "mml/cuda.h"
#include "mml/device.h"

/* Loads the runtime (once per process) without holding the GIL. */
static mml_status ensure_loaded(mml_err *err) {
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
  if (PyModule_AddIntConstant(m, "kDLCPU", 1) < 0 || PyModule_AddIntConstant(m, "kDLCUDA", 2) < 0 ||
      PyModule_AddIntConstant(m, "kDLCUDAHost", 3) < 0)
    return -1;
  return 0;
}
