/*
 * errors_py.c — the Python exception hierarchy and the one place a core mml_status
 * becomes a Python exception.
 */
#include "binding.h"

#include "mml/message.h"

PyObject *mml_py_Error, *mml_py_ConfigError, *mml_py_SampleError, *mml_py_FetchError,
    *mml_py_StateError, *mml_py_CudaError, *mml_py_OutOfMemoryError;

PyObject *mml_py_exc_for(mml_status st) {
  switch (st) {
    case MML_ENOMEM:
      return mml_py_OutOfMemoryError;
    case MML_EINVAL:
    case MML_ECONFIG:
      return mml_py_ConfigError;
    case MML_ESTATE:
      return mml_py_StateError;
    case MML_EFETCH:
    case MML_EAUTH:
      return mml_py_FetchError;
    case MML_ENOENT:
    case MML_EIO:
    case MML_ERECORD:
    case MML_EMISMATCH:
    case MML_EDECODE:
    case MML_EUNSUPPORTED:
    case MML_EVIDEO:
    case MML_EVIDEOCORRUPT:
    case MML_EVIDEOCODEC:
    case MML_EVIDEOSHORT:
    case MML_ETOOBIG:
    case MML_EASPECT:
    case MML_ETOOLONG:
    case MML_ETOOMANYIMAGES:
    case MML_ESAMPLEPIXELS:
    case MML_ERECORDSIZE:
    case MML_EOBJECTSIZE:
    case MML_EPATH:
      return mml_py_SampleError;
    case MML_ECUDA:
      return mml_py_CudaError;
    default:
      return mml_py_Error;
  }
}

PyObject *mml_py_raise(mml_status st, const mml_err *err) {
  if (err && err->status != MML_OK) st = err->status;
  return mml_py_raise_as(mml_py_exc_for(st), st, err);
}

PyObject *mml_py_raise_as(PyObject *exc, mml_status st, const mml_err *err) {
  const char *msg = (err && err->msg[0]) ? err->msg : mml_status_message(st);
  /* core messages are valid UTF-8 (mml_text_clean); decode leniently all the same, so a
   * message can never turn into a UnicodeDecodeError */
  PyObject *text =
      PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strnlen(msg, MML_ERR_MSG), "backslashreplace");
  if (text) {
    PyErr_SetObject(exc, text);
    Py_DECREF(text);
  }
  return NULL;
}

/* _core.redact(text) -> text with every URL redacted (the core's one redaction). */
static PyObject *py_redact(PyObject *mod, PyObject *arg) {
  Py_ssize_t n;
  const char *s = PyUnicode_AsUTF8AndSize(arg, &n);
  if (!s) return NULL;
  mml_bytes b = {0};
  if (mml_text_redact(s, (size_t)n, &b)) {
    mml_bytes_free(&b);
    return PyErr_NoMemory();
  }
  PyObject *r = PyUnicode_DecodeUTF8(b.len ? (const char *)b.data : "", (Py_ssize_t)b.len,
                                     "backslashreplace");
  mml_bytes_free(&b);
  return r;
}

static PyMethodDef k_methods[] = {
    {"redact", py_redact, METH_O,
     "redact(text) -> str: text with user-info and credential-like query values of every URL "
     "replaced (what every mmloader message, warning and repr shows)."},
    {NULL, NULL, 0, NULL}};

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
  rc =
      add(m, "ConfigError", &mml_py_ConfigError, b, "Invalid loader or processor configuration.") ||
      add(m, "StateError", &mml_py_StateError, b, "A state_dict that does not fit this loader.");
  Py_DECREF(b);
  if (rc) return rc;
  if (add(m, "SampleError", &mml_py_SampleError, mml_py_Error,
          "A sample could not be produced (bad record, image, fetch, or too long).") ||
      add(m, "FetchError", &mml_py_FetchError, mml_py_SampleError,
          "A remote object could not be fetched.") ||
      add(m, "CudaError", &mml_py_CudaError, mml_py_Error, "CUDA is unavailable or failed."))
    return -1;
  b = PyTuple_Pack(2, mml_py_Error, PyExc_MemoryError);
  if (!b) return -1;
  rc = add(m, "OutOfMemoryError", &mml_py_OutOfMemoryError, b,
           "The engine could not allocate memory (also a MemoryError).");
  Py_DECREF(b);
  if (rc) return rc;
  return PyModule_AddFunctions(m, k_methods);
}
