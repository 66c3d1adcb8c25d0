/*
 * binding.h — the contract between the CPython binding files.  module.c defines the
 * module (multi-phase init, PEP 489) and its state; its exec step calls each file's
 * mml_py_<area>_exec, which adds that file's functions and builds its types.  Each type
 * lives in its own file (VisionBuffer, VisionProcessor's output, beside it) and is a heap
 * type made from a PyType_Spec; none is a static PyTypeObject.  The types and the
 * exception classes live in the module state (mml_py_state), never in C globals, so each
 * module object (a subinterpreter's, a reload's) has its own.  Only files under csrc/py
 * include Python.h.
 *
 * Names: a type's object struct is <Name>Object, its spec <Name>_spec, the state member
 * holding it <Name>_Type, its methods and slots <Name>_<method> (Tensor_dlpack,
 * Loader_next, Tokenizer_dealloc); a module-level function is py_<its Python name, leading
 * underscores dropped> in a table <area>_functions; what one binding file offers another
 * is mml_py_<noun>_<verb> and declared here.
 *
 * Reaching the state: a module function gets it from its module argument
 * (mml_py_state_of(mod)); a method, slot or getter from its instance's type
 * (mml_py_state_of_self(self): PyType_GetModuleByDef, so Python subclasses work too).
 */
#ifndef MML_PY_BINDING_H
#define MML_PY_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Python 3.9 (pyproject's oldest): the 3.10/3.11 API the binding uses, with the newer
 * semantics.  The CPython versions these replace are named beside each. */
#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *mml_py_newref(PyObject *o) { /* Py_NewRef, 3.10 */
  Py_INCREF(o);
  return o;
}
#define Py_NewRef(o) mml_py_newref((PyObject *)(o))
static inline int mml_py_add_object_ref(PyObject *m, const char *name, PyObject *v) {
  Py_XINCREF(v); /* PyModule_AddObjectRef, 3.10; PyModule_AddObject steals only on success */
  if (PyModule_AddObject(m, name, v) < 0) {
    Py_XDECREF(v);
    return -1;
  }
  return 0;
}
#define PyModule_AddObjectRef mml_py_add_object_ref
#define Py_TPFLAGS_IMMUTABLETYPE 0 /* 3.10: 3.9's heap types stay settable */
/* 3.10; on 3.9 mml_py_add_type takes tp_new away from a spec without Py_tp_new. */
#define Py_TPFLAGS_DISALLOW_INSTANTIATION 0
#endif
#if PY_VERSION_HEX < 0x030B0000
/* PyType_GetModuleByDef, 3.11: the module of the first type in tp's MRO made with
 * PyType_FromModuleAndSpec from a module of that definition; borrowed; NULL with
 * TypeError when none. */
static inline PyObject *mml_py_type_module_by_def(PyTypeObject *tp, PyModuleDef *def) {
  PyObject *mro = tp->tp_mro;
  for (Py_ssize_t i = 0; mro && i < PyTuple_GET_SIZE(mro); i++) {
    PyTypeObject *t = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
    if (!(t->tp_flags & Py_TPFLAGS_HEAPTYPE)) continue;
    PyObject *m = ((PyHeapTypeObject *)t)->ht_module;
    if (m && PyModule_GetDef(m) == def) return m;
  }
  PyErr_Format(PyExc_TypeError, "PyType_GetModuleByDef: no superclass of '%s' has the given module",
               tp->tp_name);
  return NULL;
}
#define PyType_GetModuleByDef mml_py_type_module_by_def
#endif

#include "mml/common.h"

/* ---- module state (module.c) --------------------------------------------------------- */

typedef struct mml_py_state {
  /* exception classes (errors_py.c) */
  PyObject *Error;            /* base: mmloader.Error(RuntimeError) */
  PyObject *ConfigError;      /* bad configuration: also a ValueError */
  PyObject *SampleError;      /* a sample failed (record, image, fetch, too long) */
  PyObject *FetchError;       /* remote fetch failed (subclass of SampleError) */
  PyObject *StateError;       /* state_dict does not fit this loader (ValueError) */
  PyObject *CudaError;        /* CUDA is unavailable or failed */
  PyObject *OutOfMemoryError; /* the engine ran out of memory: also MemoryError */
  /* types, each from its file's PyType_Spec */
  PyTypeObject *Tensor_Type;          /* tensor_py.c: mmloader.Tensor */
  PyTypeObject *Loader_Type;          /* loader_py.c: mmloader._core._Loader */
  PyTypeObject *Tokenizer_Type;       /* tokenizer_py.c: mmloader._core.Tokenizer */
  PyTypeObject *Fetcher_Type;         /* fetch_py.c: mmloader._core.Fetcher */
  PyTypeObject *VisionProcessor_Type; /* vision_py.c: mmloader._core.VisionProcessor */
  PyTypeObject *VisionBuffer_Type;    /* vision_py.c: its output (not a module attribute) */
  PyTypeObject *DeviceStage_Type;     /* device_stage_py.c: mmloader._core.DeviceStage */
  PyObject *DecoderPool;              /* decode_only_py.c: decode_only's decoders (capsule) */
} mml_py_state;

extern PyModuleDef mml_py_module; /* mmloader._core */

static inline mml_py_state *mml_py_state_of(PyObject *module) {
  return (mml_py_state *)PyModule_GetState(module);
}
/* The state of the module that made tp (or the first of its bases that it made): what a
 * method of one of our types, or of a Python subclass of one, reaches the state by. */
static inline mml_py_state *mml_py_state_of_type(PyTypeObject *tp) {
  PyObject *m = PyType_GetModuleByDef(tp, &mml_py_module);
  return m ? mml_py_state_of(m) : NULL;
}
/* The same for self, an instance of one of our types (or of a Python subclass of one):
 * never NULL. */
static inline mml_py_state *mml_py_state_of_self(void *self) {
  return mml_py_state_of_type(Py_TYPE((PyObject *)self));
}
/* A heap type from spec, owned by module m, stored in *slot and (when name is not NULL)
 * added to m under that name.  0, or -1 with an exception set. */
int mml_py_add_type(PyObject *m, PyType_Spec *spec, PyTypeObject **slot, const char *name);

/* ---- errors (errors_py.c) ------------------------------------------------------------ */

/* Raises the exception of ms matching err->status (or st when err is NULL/empty) with
 * err->msg; returns NULL so callers can `return mml_py_raise(ms, st, &err);`. */
PyObject *mml_py_raise(mml_py_state *ms, mml_status st, const mml_err *err);
/* The same with the class chosen by the caller. */
PyObject *mml_py_raise_as(PyObject *exc, mml_status st, const mml_err *err);
/* The exception class of ms for a status (borrowed). */
PyObject *mml_py_exc_for(mml_py_state *ms, mml_status st);

/* ---- what one binding file offers another -------------------------------------------- */

struct mml_vision_cfg;
struct mml_tokenizer;
struct mml_fetcher;
struct mml_loader;
struct mml_buf;
struct mml_tensor;
struct mml_batch;

/* vision_py.c: fills cfg from the dict mmloader.presets.vision_config() returns.
 * Returns 0, or -1 with a Python exception set. */
int mml_py_vision_cfg_from_dict(mml_py_state *ms, PyObject *d, struct mml_vision_cfg *cfg);

struct mml_loader_cfg;
/* The option table (options_py.c): *c at the table's defaults, then every key of d but
 * those in `skip` (NULL-terminated) set by its row; an unknown key or a bad value is
 * ConfigError naming the option.  0 or -1. */
int mml_py_set_options(mml_py_state *ms, PyObject *d, struct mml_loader_cfg *c,
                       const char *const *skip);
/* The value of the table's enum row `option` named `name` (NULL: the row's default);
 * ConfigError naming the choices.  0 or -1. */
int mml_py_table_enum(mml_py_state *ms, const char *option, const char *name, int *out);
/* tokenizer_py.c: the core tokenizer inside a mmloader.Tokenizer object (borrowed: keep a
 * reference to obj while using it), or NULL with TypeError set. */
const struct mml_tokenizer *mml_py_tokenizer_get(mml_py_state *ms, PyObject *obj);
/* fetch_py.c: the fetcher of a _core.Fetcher (NULL with TypeError / Error set when not one
 * or closed). */
struct mml_fetcher *mml_py_fetcher_get(mml_py_state *ms, PyObject *obj);
/* interrupt_py.c: runs fn(arg) on a helper thread (first making CUDA `device` current
 * there, unless it is -1) while this one (holding the GIL) waits in 100 ms slices running
 * signal handlers between them; when one raises (Ctrl-C), sets *cancel (which fn's engine
 * work checks) and joins the helper.  0, or -1 with the handler's exception set (fn has
 * returned either way; its results are the caller's to free). */
int mml_py_run_interruptible(void (*fn)(void *), void *arg, int device, struct mml_cancel *cancel);
/* loader_py.c: the engine inside a _Loader (borrowed), or NULL with an exception set. */
struct mml_loader *mml_py_loader_get(mml_py_state *ms, PyObject *obj);

/* cuda_py.c: the DLPack stream argument (None -> legacy default stream, -1 -> no sync,
 * otherwise a cudaStream_t as int) as a raw handle; 0, or -1 with an exception set. */
int mml_py_cuda_stream_arg(PyObject *stream, uintptr_t *out);
/* cuda_py.c: before exporting buffer b through __dlpack__(stream=stream): for device
 * memory, makes that stream wait for the copy that filled b and keeps b from reuse until
 * the work the consumer queues there before releasing it is done.  Host memory: nothing.
 * Returns 0, or -1 with an exception set. */
int mml_py_cuda_export(mml_py_state *ms, struct mml_buf *b, PyObject *stream);
/* cuda_py.c: loads the CUDA runtime (once per process; the GIL released while it loads).
 * MML_OK, or the reason it is unavailable in *err (err may be NULL). */
mml_status mml_py_cuda_load(mml_err *err);

/* tensor_py.c: a mmloader.Tensor taking over a batch slot's buffer reference (slot->buf
 * becomes NULL).  NULL with an exception set on failure (the slot keeps its reference). */
PyObject *mml_py_tensor_from_slot(mml_py_state *ms, struct mml_tensor *slot);
/* tensor_py.c: a dict name -> Tensor taking over every slot of b; b is cleared, also on
 * failure (NULL with an exception set). */
PyObject *mml_py_batch_dict(mml_py_state *ms, struct mml_batch *b);

/* options_py.c: the configuration dict of mmloader.Loader as an mml_loader_cfg, checked
 * against the option table (strings borrowed from d; what is allocated is in *m, for
 * mml_py_cfg_mem_free); 0, or -1 with ConfigError set.  And back: a loader's options as a dict
 * (credentials left out). */
struct mml_loader_cfg;
struct mml_source_cfg;
typedef struct mml_py_cfg_mem { /* what parsing allocates, freed once the engine copied it */
  const char **data;
  struct mml_source_cfg *sources;
  int nsources;
} mml_py_cfg_mem;
int mml_py_loader_cfg_from_dict(mml_py_state *ms, PyObject *d, struct mml_loader_cfg *c,
                                mml_py_cfg_mem *m);
void mml_py_cfg_mem_free(mml_py_cfg_mem *m);
PyObject *mml_py_loader_cfg_to_dict(const struct mml_loader_cfg *c);

/* video_sample_py.c helpers for template_py.c: a record's video as a dict, and the video_tokens
 * argument (None, or one (grid_t, tokens_per_temporal_patch[, timestamps]) per video). */
struct mml_video_ref;
struct mml_video_tokens;
PyObject *mml_py_video_dict(const struct mml_video_ref *v);
typedef struct mml_py_video_tokens {
  struct mml_video_tokens *v; /* NULL when the record has no videos */
  double *ts;
} mml_py_video_tokens;
int mml_py_video_tokens_get(PyObject *obj, int nvideos, mml_py_video_tokens *out);
void mml_py_video_tokens_free(mml_py_video_tokens *t);

/* ---- each file's part of the module's exec step (module.c calls them in this order) --- */
/* 0, or -1 with an exception set. */
int mml_py_errors_exec(PyObject *m);       /* errors_py.c: exception classes, redact() */
int mml_py_tensor_exec(PyObject *m);       /* tensor_py.c: mmloader.Tensor, DLPack */
int mml_py_loader_exec(PyObject *m);       /* loader_py.c: the engine's _Loader */
int mml_py_options_exec(PyObject *m);      /* options_py.c: loader_options() etc. */
int mml_py_tokenizer_exec(PyObject *m);    /* tokenizer_py.c: Tokenizer */
int mml_py_vision_exec(PyObject *m);       /* vision_py.c: VisionProcessor, smart_resize */
int mml_py_template_exec(PyObject *m);     /* template_py.c: record/template test hooks */
int mml_py_fetch_exec(PyObject *m);        /* fetch_py.c: Fetcher, fetch helpers */
int mml_py_cuda_exec(PyObject *m);         /* cuda_py.c: cuda_available() etc. */
int mml_py_device_stage_exec(PyObject *m); /* device_stage_py.c: DeviceStage */
int mml_py_collate_exec(PyObject *m);      /* collate_py.c: collation/M-RoPE test hooks */
int mml_py_video_exec(PyObject *m);        /* video_py.c: video probe/decode test hooks */
int mml_py_dsindex_exec(PyObject *m);      /* dsindex_py.c: build_index, read_index */
int mml_py_video_sample_exec(PyObject *m); /* video_sample_py.c: sampling test hooks */
int mml_py_decode_only_exec(PyObject *m);  /* decode_only_py.c: the decode-only floor */

#endif
