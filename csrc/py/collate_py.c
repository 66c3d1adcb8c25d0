/*
 * collate_py.c — test hooks into the collation core (M-RoPE positions), so that pytest can
 * compare them with the reference implementations in transformers.  Not public API: the
 * collator itself is driven by the Loader.
 */
#include "binding.h"

#include "mml/mrope.h"

/* _mrope_positions(ids, grids, spatial_merge, image_pad_id) -> (bytes, rope_delta)
 * ids: sequence of ints; grids: sequence of (t, h, w).  The bytes hold int64 [3, len(ids)]. */
static PyObject *py_mrope_positions(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *ids_obj, *grids_obj;
  int merge, image_pad;
  if (!PyArg_ParseTuple(args, "OOii", &ids_obj, &grids_obj, &merge, &image_pad)) return NULL;
  PyObject *ids_seq = PySequence_Fast(ids_obj, "ids must be a sequence of ints");
  if (!ids_seq) return NULL;
  PyObject *grids_seq = PySequence_Fast(grids_obj, "grids must be a sequence of (t, h, w)");
  if (!grids_seq) {
    Py_DECREF(ids_seq);
    return NULL;
  }
  Py_ssize_t n = PySequence_Fast_GET_SIZE(ids_seq), ng = PySequence_Fast_GET_SIZE(grids_seq);
  int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
  int32_t *grids = malloc((size_t)(ng ? ng : 1) * 3 * sizeof *grids);
  PyObject *buf = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(3 * n * sizeof(int64_t)));
  PyObject *ret = NULL;
  if (!ids || !grids || !buf) {
    if (!PyErr_Occurred()) PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(ids_seq, i));
    if (v == -1 && PyErr_Occurred()) goto done;
    ids[i] = (int32_t)v;
  }
  for (Py_ssize_t i = 0; i < ng; i++) {
    PyObject *g = PySequence_Fast(PySequence_Fast_GET_ITEM(grids_seq, i), "grid must be (t, h, w)");
    if (!g) goto done;
    if (PySequence_Fast_GET_SIZE(g) != 3) {
      Py_DECREF(g);
      PyErr_SetString(PyExc_ValueError, "grid must be (t, h, w)");
      goto done;
    }
    for (int k = 0; k < 3; k++) {
      long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(g, k));
      if (v == -1 && PyErr_Occurred()) {
        Py_DECREF(g);
        goto done;
      }
      grids[3 * i + k] = (int32_t)v;
    }
    Py_DECREF(g);
  }
  mml_err err = {0};
  int64_t delta = 0;
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_mrope_positions(ids, n, grids, (int)ng, merge, image_pad,
                           (int64_t *)PyBytes_AS_STRING(buf), n, &delta, &err);
  Py_END_ALLOW_THREADS
  if (st) {
    mml_py_raise(st, &err);
    goto done;
  }
  ret = Py_BuildValue("(OL)", buf, (long long)delta);
done:
  free(ids);
  free(grids);
  Py_XDECREF(buf);
  Py_DECREF(ids_seq);
  Py_DECREF(grids_seq);
  return ret;
}

static PyMethodDef k_methods[] = {
    {"_mrope_positions", py_mrope_positions, METH_VARARGS,
     "_mrope_positions(ids, grids, spatial_merge, image_pad_id) -> (bytes, rope_delta): "
     "Qwen2-VL M-RoPE position ids as int64 [3, len(ids)] (test hook)."},
    {NULL, NULL, 0, NULL},
};

int mml_py_collate_register(PyObject *m) { return PyModule_AddFunctions(m, k_methods); }
