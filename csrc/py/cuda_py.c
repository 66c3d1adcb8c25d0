/*
 * cuda_py.c — the CUDA runtime as the module sees it: cuda_available(), device counts,
 * why CUDA is unavailable, and the DLPack stream handshake used by tensor_py.c
 * (device_stage_py.c has the DeviceStage type).
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

mml_status mml_py_cuda_load(mml_err *err) {
  pass_candidates();
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_cuda_load(err);
  Py_END_ALLOW_THREADS
  return st;
}

static PyObject *py_cuda_available(PyObject *mod, PyObject *noargs) {
  return PyBool_FromLong(mml_py_cuda_load(NULL) == MML_OK);
}

static PyObject *py_cuda_device_count(PyObject *mod, PyObject *noargs) {
  mml_py_cuda_load(NULL);
  return PyLong_FromLong(mml_cuda_device_count());
}

static PyObject *py_cuda_load(PyObject *mod, PyObject *noargs) {
  mml_err err = {0};
  mml_status st = mml_py_cuda_load(&err);
  if (st != MML_OK) return mml_py_raise(mml_py_state_of(mod), st, &err);
  return PyUnicode_FromString(mml_cuda_library());
}

static PyObject *py_cuda_unavailable_reason(PyObject *mod, PyObject *noargs) {
  mml_err err = {0};
  if (mml_py_cuda_load(&err) == MML_OK) Py_RETURN_NONE;
  return PyUnicode_FromString(err.msg);
}

static PyObject *py_cuda_current_device(PyObject *mod, PyObject *noargs) {
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

int mml_py_cuda_export(mml_py_state *ms, mml_buf *b, PyObject *stream) {
  if (!b || b->kind != MML_MEM_DEVICE) return 0; /* host memory: nothing to order */
  uintptr_t s;
  if (mml_py_cuda_stream_arg(stream, &s) < 0) return -1;
  if (s == MML_NO_SYNC) return 0;
  mml_err err = {0};
  mml_status st = mml_fence_export(b, b->device, s, &err);
  if (st != MML_OK) {
    mml_py_raise(ms, st, &err);
    return -1;
  }
  return 0;
}

static PyMethodDef cuda_functions[] = {
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

int mml_py_cuda_exec(PyObject *m) {
  if (PyModule_AddFunctions(m, cuda_functions) < 0) return -1;
  if (PyModule_AddIntConstant(m, "kDLCPU", 1) < 0 || PyModule_AddIntConstant(m, "kDLCUDA", 2) < 0 ||
      PyModule_AddIntConstant(m, "kDLCUDAHost", 3) < 0)
    return -1;
  return 0;
}
