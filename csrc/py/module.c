/*
 * module.c — mmloader._core: the module definition, multi-phase init (PEP 489) and the
 * module state (binding.h: the exception classes and every type).  The exec step lets each
 * binding file add its functions and build its types into the state; the state is visited
 * and cleared with the module (GC), so each module object owns what it made.  No other
 * logic lives here.
 */
#include "binding.h"

int mml_py_add_type(PyObject *m, PyType_Spec *spec, PyTypeObject **slot, const char *name) {
  *slot = (PyTypeObject *)PyType_FromModuleAndSpec(m, spec, NULL);
  if (!*slot) return -1;
#if PY_VERSION_HEX < 0x030A0000
  /* 3.9 has no Py_TPFLAGS_DISALLOW_INSTANTIATION: a spec without Py_tp_new inherits
   * object's; take it away as 3.10 does (the types meant to be created have one). */
  int has_new = 0;
  for (PyType_Slot *s = spec->slots; s->slot; s++) has_new |= s->slot == Py_tp_new;
  if (!has_new) (*slot)->tp_new = NULL;
#endif
  return name ? PyModule_AddObjectRef(m, name, (PyObject *)*slot) : 0;
}

static int core_exec(PyObject *m) {
  if (mml_py_errors_exec(m) || mml_py_tensor_exec(m) || mml_py_loader_exec(m) ||
      mml_py_options_exec(m) || mml_py_tokenizer_exec(m) || mml_py_vision_exec(m) ||
      mml_py_template_exec(m) || mml_py_fetch_exec(m) || mml_py_cuda_exec(m) ||
      mml_py_device_stage_exec(m) || mml_py_collate_exec(m) || mml_py_video_exec(m) ||
      mml_py_dsindex_exec(m) || mml_py_video_sample_exec(m) || mml_py_decode_only_exec(m))
    return -1;
  return 0;
}

/* Every member of the state is an owned reference, visited and cleared here. */
_Static_assert(sizeof(mml_py_state) == 15 * sizeof(PyObject *), "a state member not visited");

static int core_traverse(PyObject *m, visitproc visit, void *arg) {
  mml_py_state *ms = mml_py_state_of(m);
  Py_VISIT(ms->Error);
  Py_VISIT(ms->ConfigError);
  Py_VISIT(ms->SampleError);
  Py_VISIT(ms->FetchError);
  Py_VISIT(ms->StateError);
  Py_VISIT(ms->CudaError);
  Py_VISIT(ms->OutOfMemoryError);
  Py_VISIT(ms->Tensor_Type);
  Py_VISIT(ms->Loader_Type);
  Py_VISIT(ms->Tokenizer_Type);
  Py_VISIT(ms->Fetcher_Type);
  Py_VISIT(ms->VisionProcessor_Type);
  Py_VISIT(ms->VisionBuffer_Type);
  Py_VISIT(ms->DeviceStage_Type);
  Py_VISIT(ms->DecoderPool);
  return 0;
}

static int core_clear(PyObject *m) {
  mml_py_state *ms = mml_py_state_of(m);
  Py_CLEAR(ms->Error);
  Py_CLEAR(ms->ConfigError);
  Py_CLEAR(ms->SampleError);
  Py_CLEAR(ms->FetchError);
  Py_CLEAR(ms->StateError);
  Py_CLEAR(ms->CudaError);
  Py_CLEAR(ms->OutOfMemoryError);
  Py_CLEAR(ms->Tensor_Type);
  Py_CLEAR(ms->Loader_Type);
  Py_CLEAR(ms->Tokenizer_Type);
  Py_CLEAR(ms->Fetcher_Type);
  Py_CLEAR(ms->VisionProcessor_Type);
  Py_CLEAR(ms->VisionBuffer_Type);
  Py_CLEAR(ms->DeviceStage_Type);
  Py_CLEAR(ms->DecoderPool);
  return 0;
}

static void core_free(void *m) { core_clear((PyObject *)m); }

static PyModuleDef_Slot core_slots[] = {{Py_mod_exec, core_exec}, {0, NULL}};

PyModuleDef mml_py_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "mmloader._core",
    .m_doc = "Native engine of mmloader (C).  Use the `mmloader` package, not this module.",
    .m_size = sizeof(mml_py_state),
    .m_slots = core_slots,
    .m_traverse = core_traverse,
    .m_clear = core_clear,
    .m_free = core_free,
};

PyMODINIT_FUNC PyInit__core(void) { return PyModuleDef_Init(&mml_py_module); }
