/*
 * module.c — mmloader._core: creates the module and lets each binding file register its
 * types and functions.  No logic lives here.
 */
#include "binding.h"

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    "mmloader._core",
    "Native engine of mmloader (C).  Use the `mmloader` package, not this module.",
    -1,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL};

PyMODINIT_FUNC PyInit__core(void) {
  PyObject *m = PyModule_Create(&core_module);
  if (!m) return NULL;
  if (mml_py_errors_register(m) || mml_py_tensor_register(m) || mml_py_loader_register(m) ||
      mml_py_options_register(m) || mml_py_tokenizer_register(m) || mml_py_vision_register(m) ||
      mml_py_template_register(m) || mml_py_fetch_register(m) || mml_py_cuda_register(m) ||
      mml_py_collate_register(m) || mml_py_video_register(m) || mml_py_dsindex_register(m) ||
      mml_py_video_sample_register(m)) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
