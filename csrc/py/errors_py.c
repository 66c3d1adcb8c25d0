/*
 * errors_py.c — the Python exception hierarchy (classes made per module, kept in its
 * state) and the one place a core mml_status becomes a Python exception.
 */
#include "binding.h"

#include "mml/message.h"

PyObject *mml_py_exc_for(mml_py_state *ms, mml_status st) {
  switch (st) {
    case MML_ENOMEM:
      return ms->OutOfMemoryError;
    case MML_EINVAL:
    case MML_ECONFIG:
      return ms->ConfigError;
    case MML_ESTATE:
      return ms->StateError;
    case MML_EFETCH:
    case MML_EAUTH:
      return ms->FetchError;
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
    case MML_ESCANS:
    case MML_ERECORDSIZE:
    case MML_EOBJECTSIZE:
    case MML_EPATH:
    case MML_EAUDIO:
    case MML_EPREFERENCE:
    case MML_ENOTARGET:
      return ms->SampleError;
    case MML_ECUDA:
      return ms->CudaError;
    default:
      return ms->Error;
  }
}

PyObject *mml_py_raise(mml_py_state *ms, mml_status st, const mml_err *err) {
  if (err && err->status != MML_OK) st = err->status;
  return mml_py_raise_as(mml_py_exc_for(ms, st), st, err);
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

static PyMethodDef errors_functions[] = {
    {"redact", py_redact, METH_O,
     "redact(text) -> str: text with user-info and credential-like query values of every URL "
     "replaced (what every mmloader message, warning and repr shows)."},
    {NULL, NULL, 0, NULL}};

/* A class mmloader.<name>(bases) in *slot (the state's reference) and in the module. */
static int add_exception(PyObject *m, const char *name, PyObject **slot, PyObject *bases,
                         const char *doc) {
  char full[128];
  snprintf(full, sizeof full, "mmloader.%s", name);
  *slot = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
  return *slot ? PyModule_AddObjectRef(m, name, *slot) : -1;
}

/* The same with two bases: mmloader.<name>(base, base2). */
static int add_exception2(PyObject *m, const char *name, PyObject **slot, PyObject *base,
                          PyObject *base2, const char *doc) {
  PyObject *b = PyTuple_Pack(2, base, base2);
  if (!b) return -1;
  int rc = add_exception(m, name, slot, b, doc);
  Py_DECREF(b);
  return rc;
}

int mml_py_errors_exec(PyObject *m) {
  mml_py_state *ms = mml_py_state_of(m);
  if (add_exception(m, "Error", &ms->Error, PyExc_RuntimeError, "Base class of mmloader errors.") ||
      add_exception2(m, "ConfigError", &ms->ConfigError, ms->Error, PyExc_ValueError,
                     "Invalid loader or processor configuration.") ||
      add_exception2(m, "StateError", &ms->StateError, ms->Error, PyExc_ValueError,
                     "A state_dict that does not fit this loader.") ||
      add_exception(m, "SampleError", &ms->SampleError, ms->Error,
                    "A sample could not be produced (bad record, image, fetch, or too long).") ||
      add_exception(m, "FetchError", &ms->FetchError, ms->SampleError,
                    "A remote object could not be fetched.") ||
      add_exception(m, "CudaError", &ms->CudaError, ms->Error, "CUDA is unavailable or failed.") ||
      add_exception2(m, "OutOfMemoryError", &ms->OutOfMemoryError, ms->Error, PyExc_MemoryError,
                     "The engine could not allocate memory (also a MemoryError)."))
    return -1;
  return PyModule_AddFunctions(m, errors_functions);
}
