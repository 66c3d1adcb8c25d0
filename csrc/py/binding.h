/*
 * binding.h — the contract between the CPython binding files.  module.c creates the
 * module and calls each file's register function; every type lives in its own file.
 * Only files under csrc/py include Python.h.
 */
#ifndef MML_PY_BINDING_H
#define MML_PY_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Python 3.9: the two 3.10 API calls the binding uses, with their 3.10 semantics. */
#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *mml_py_newref(PyObject *o) {
  Py_INCREF(o);
  return o;
}
#define Py_NewRef(o) mml_py_newref((PyObject *)(o))
static inline int mml_py_add_object_ref(PyObject *m, const char *name, PyObject *v) {
  Py_XINCREF(v); /* PyModule_AddObject steals the reference only on success */
  if (PyModule_AddObject(m, name, v) < 0) {
    Py_XDECREF(v);
    return -1;
  }
  return 0;
}
#define PyModule_AddObjectRef mml_py_add_object_ref
#endif

#include "mml/common.h"

/* Exception classes (created by errors_py.c, owned by the module). */
extern PyObject *mml_py_Error;       /* base: mmloader.Error(RuntimeError) */
extern PyObject *mml_py_ConfigError; /* bad configuration: also a ValueError */
extern PyObject *mml_py_SampleError; /* a sample failed (record, image, fetch, too long) */
extern PyObject *mml_py_FetchError;  /* remote fetch failed (subclass of SampleError) */
extern PyObject *mml_py_StateError;  /* state_dict does not fit this loader (ValueError) */
extern PyObject *mml_py_CudaError;
extern PyObject *mml_py_OutOfMemoryError; /* the engine ran out of memory: also MemoryError */

/* Raises the exception matching err->status (or st when err is NULL/empty) with
 * err->msg; returns NULL so callers can `return mml_py_raise(st, &err);`. */
PyObject *mml_py_raise(mml_status st, const mml_err *err);
/* The same with the class chosen by the caller. */
PyObject *mml_py_raise_as(PyObject *exc, mml_status st, const mml_err *err);
/* The exception class for a status. */
PyObject *mml_py_exc_for(mml_status st);

/* Cross-file helpers (each defined by the file named). */
struct mml_vision_cfg;
struct mml_tokenizer;
/* vision_py.c: fills cfg from the dict mmloader.presets.vision_config() returns.
 * Returns 0, or -1 with a Python exception set. */
int mml_py_vision_cfg_from_dict(PyObject *d, struct mml_vision_cfg *cfg);
/* tokenizer_py.c: the core tokenizer inside a mmloader.Tokenizer object (borrowed: keep a
 * reference to obj while using it), or NULL with TypeError set. */
const struct mml_tokenizer *mml_py_tokenizer_get(PyObject *obj);
/* The fetcher of a _core.Fetcher (NULL with TypeError / Error set when not one or closed). */
struct mml_fetcher *mml_py_fetcher_get(PyObject *obj);

/* template_py.c: a chat template name ("qwen2-vl", "qwen2.5-vl", "qwen3-vl") as an
 * mml_template_style, and a label mode name ("all_assistant", "last_assistant",
 * "no_nonfinal_end") as an mml_label_mode.  Return 0, or -1 with ConfigError set. */
int mml_py_template_style_from_str(const char *s, int *style);
int mml_py_image_space_from_str(const char *s, int *space);
int mml_py_label_mode_from_str(const char *s, int *mode);

/* cuda_py.c: the DLPack stream argument (None -> legacy default stream, -1 -> no sync,
 * otherwise a cudaStream_t as int) as a raw handle; 0, or -1 with an exception set. */
int mml_py_cuda_stream_arg(PyObject *stream, uintptr_t *out);
/* cuda_py.c: before exporting buffer b through __dlpack__(stream=stream): for device
 * memory, makes that stream wait for the copy that filled b and keeps b from reuse until
 * the work the consumer queues there before releasing it is done.  Host memory: nothing.
 * Returns 0, or -1 with an exception set. */
struct mml_buf;
int mml_py_cuda_export(struct mml_buf *b, PyObject *stream);

/* tensor_py.c: a mmloader.Tensor taking over a batch slot's buffer reference (slot->buf
 * becomes NULL).  NULL with an exception set on failure (the slot keeps its reference). */
struct mml_tensor;
PyObject *mml_py_tensor_from_slot(struct mml_tensor *slot);

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
int mml_py_loader_cfg_from_dict(PyObject *d, struct mml_loader_cfg *c, mml_py_cfg_mem *m);
void mml_py_cfg_mem_free(mml_py_cfg_mem *m);
PyObject *mml_py_loader_cfg_to_dict(const struct mml_loader_cfg *c);

int mml_py_errors_register(PyObject *m);
int mml_py_tensor_register(PyObject *m);    /* tensor_py.c: mmloader.Tensor, DLPack */
int mml_py_loader_register(PyObject *m);    /* loader_py.c: the engine's Loader */
int mml_py_options_register(PyObject *m);   /* options_py.c: loader_options() etc. */
int mml_py_tokenizer_register(PyObject *m); /* tokenizer_py.c: Tokenizer */
int mml_py_vision_register(PyObject *m);    /* vision_py.c: ImageProcessor core, smart_resize */
int mml_py_template_register(PyObject *m);  /* template_py.c: record/template test hooks */
int mml_py_fetch_register(PyObject *m);     /* fetch_py.c: fetch helpers for tests/tools */
int mml_py_cuda_register(PyObject *m);      /* cuda_py.c: cuda_available() etc. */
int mml_py_collate_register(PyObject *m);   /* collate_py.c: collation/M-RoPE test hooks */
int mml_py_video_register(PyObject *m);     /* video_py.c: video probe/decode test hooks */
int mml_py_dsindex_register(PyObject *m);   /* dsindex_py.c: build_index, read_index */
/* loader_py.c: the engine inside a _Loader (borrowed), or NULL with an exception set. */
struct mml_loader;
struct mml_loader *mml_py_loader_get(PyObject *obj);

#endif
