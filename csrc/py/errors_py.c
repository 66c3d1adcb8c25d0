/*
 * errors_py.c — the Python exception hierarchy and the one place a core mml_status
 * becomes a Python exception.
 */
#include "binding.h"

PyObject *mml_py_Error, *mml_py_ConfigError, *mml_py_SampleError, *mml_py_FetchError,
    *mml_py_StateError, *mml_py_CudaError;

PyObject *mml_py_exc_for(mml_status st) {
  switch (st) {
    case MML_ENOMEM: return PyExc_MemoryError;
    case MML_EINVAL:
    case MML_ECONFIG: return mml_py_ConfigError;
    case MML_ESTATE: return mml_py_StateError;
    case MML_EFETCH:
    case MML_EAUTH: return mml_py_FetchError;
    case MML_ENOENT:
    case MML_EIO:
    case MML_ERECORD:
    case MML_EMISMATCH:
    case MML_EDECODE:
    case MML_EUNSUPPORTED:
    case MML_EVIDEO:
    case MML_ETOOBIG:
    case MML_EASPECT:
    case MML_ETOOLONG: return mml_py_SampleError;
    case MML_ECUDA: return mml_py_CudaError;
    default: return mml_py_Error;
  }
}

PyObject *mml_py_raise(mml_status st, const mml_err *err) {
  if (err && err->status != MML_OK) st = err->status;
  const char *msg = (err && err->msg[0]) ? err->msg : mml_status_message(st);
  PyErr_SetString(mml_py_exc_for(st), msg);
  return NULL;
}

static int add(PyObject *m, const char *name, PyObject **slot, PyObject *bases, const char *doc) {
  char full[128];
  snprintf(full, sizeof full, "mmloader.%s", name);
  *slot = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
  if (!*slot) return -1;
  Py_INCREF(*slot);
  return PyModule_AddObject(m, name, *slot);
}

int mml_py_errors_register(PyObject *m) {
  int rc = add(m, "Error", &mml_py_Error, PyExc_RuntimeError, "Base class of mmloader errors.");
  if (rc) return rc;
  PyObject *b = PyTuple_Pack(2, mml_py_Error, PyExc_ValueError);
  if (!b) return -1;
  rc = add(m, "ConfigError", &mml_py_ConfigError, b, "Invalid loader or processor configuration.") ||
       add(m, "StateError", &mml_py_StateError, b, "A state_dict that does not fit this loader.");
  Py_DECREF(b);
  if (rc) return rc;
  if (add(m, "SampleError", &mml_py_SampleError, mml_py_Error,
          "A sample could not be produced (bad record, image, fetch, or too long).") ||
      add(m, "FetchError", &mml_py_FetchError, mml_py_SampleError,
          "A remote object could not be fetched.") ||
      add(m, "CudaError", &mml_py_CudaError, mml_py_Error, "CUDA is unavailable or failed."))
    return -1;
  return 0;
}
