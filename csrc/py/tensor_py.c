/*
 * tensor_py.c — mmloader.Tensor: a read-only view of one pooled output buffer, exported
 * zero-copy through DLPack (torch.from_dlpack, numpy.from_dlpack) and .numpy().
 *
 * Lifetime: a Tensor holds one reference on its mml_buf; every DLPack capsule it hands out
 * holds another, dropped by the DLManagedTensor deleter, which is pure C (mml_buf_release:
 * atomics + the pool's mutex), callable from any thread, after the loader is closed and
 * after the interpreter has shut down.  The capsule destructor frees only a capsule that
 * no consumer took (its name is still "dltensor" / "dltensor_versioned").
 *
 * Devices: dl_device_of() is the one place that maps a buffer's memory kind to a DLPack
 * device; pinned host memory is reported as CPU memory (kDLCPU), which every consumer
 * can read directly.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "binding.h"
#include "mml/batch.h"

/* ---- DLPack ABI (v1.x), written from the specification ------------------------------ */
enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 };
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 };
typedef struct {
  int32_t device_type;
  int32_t device_id;
} DLDevice;
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;
typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;
#define MML_DLPACK_MAJOR 1
#define MML_DLPACK_MINOR 0

typedef struct {
  PyObject_HEAD
  mml_buf *buf;
  mml_dtype dtype;
  int ndim;
  int64_t shape[MML_MAX_DIMS];
  size_t offset;
} TensorObject;

static DLDevice dl_device_of(const mml_buf *b) {
  DLDevice d = {kDLCPU, 0};
  if (b->kind == MML_MEM_DEVICE) {
    d.device_type = kDLCUDA;
    d.device_id = b->device;
  }
  return d;
}

static DLDataType dl_dtype_of(mml_dtype dt) {
  DLDataType t = {kDLUInt, 8, 1};
  switch (dt) {
    case MML_DT_UINT8:
      t = (DLDataType){kDLUInt, 8, 1};
      break;
    case MML_DT_INT32:
      t = (DLDataType){kDLInt, 32, 1};
      break;
    case MML_DT_INT64:
      t = (DLDataType){kDLInt, 64, 1};
      break;
    case MML_DT_FLOAT32:
      t = (DLDataType){kDLFloat, 32, 1};
      break;
    case MML_DT_BOOL:
      t = (DLDataType){kDLBool, 8, 1};
      break;
    case MML_DT_BFLOAT16:
      t = (DLDataType){kDLBfloat, 16, 1};
      break;
  }
  return t;
}

/* One allocation holds the managed tensor, its shape and the buffer reference. */
typedef struct {
  DLManagedTensor m;
  int64_t shape[MML_MAX_DIMS];
  mml_buf *buf;
} legacy_ctx;
typedef struct {
  DLManagedTensorVersioned m;
  int64_t shape[MML_MAX_DIMS];
  mml_buf *buf;
} versioned_ctx;

static void legacy_deleter(DLManagedTensor *self) {
  legacy_ctx *c = (legacy_ctx *)self->manager_ctx;
  mml_buf_release(c->buf);
  free(c);
}
static void versioned_deleter(DLManagedTensorVersioned *self) {
  versioned_ctx *c = (versioned_ctx *)self->manager_ctx;
  mml_buf_release(c->buf);
  free(c);
}

static void legacy_capsule_destructor(PyObject *cap) {
  if (PyCapsule_IsValid(cap, "dltensor")) {
    DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
    if (m && m->deleter) m->deleter(m);
  }
  PyErr_Clear();
}
static void versioned_capsule_destructor(PyObject *cap) {
  if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
    DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
    if (m && m->deleter) m->deleter(m);
  }
  PyErr_Clear();
}

static void fill_dltensor(TensorObject *t, DLTensor *d, int64_t *shape) {
  for (int i = 0; i < t->ndim; i++) shape[i] = t->shape[i];
  d->data = t->buf->data;
  d->device = dl_device_of(t->buf);
  d->ndim = t->ndim;
  d->dtype = dl_dtype_of(t->dtype);
  d->shape = shape;
  d->strides = NULL; /* row-major contiguous */
  d->byte_offset = t->offset;
}

static PyObject *Tensor_dlpack(TensorObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
  PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO:__dlpack__", kwlist, &stream, &max_version,
                                   &dl_device, &copy))
    return NULL;
  DLDevice dev = dl_device_of(self->buf);
  if (dl_device != Py_None) {
    int dt, di;
    if (!PyArg_ParseTuple(dl_device, "ii:dl_device", &dt, &di)) return NULL;
    if (dt != dev.device_type || di != dev.device_id) {
      PyErr_Format(PyExc_BufferError,
                   "mmloader.Tensor lives on DLPack device (%d, %d) and cannot be exported to "
                   "(%d, %d)",
                   dev.device_type, dev.device_id, dt, di);
      return NULL;
    }
  }
  if (copy == Py_True) {
    PyErr_SetString(PyExc_BufferError,
                    "mmloader.Tensor exports without copying (copy=True "
                    "is not supported; copy the result instead)");
    return NULL;
  }
  /* DLPack stream protocol: device memory makes `stream` wait for its copy (cuda_py.c);
   * host memory (pinned included) has nothing to order. */
  if (mml_py_cuda_export(mml_py_state_of_self(self), self->buf, stream) < 0) return NULL;
  int versioned = 0;
  if (max_version != Py_None) {
    if (!PyTuple_Check(max_version) || PyTuple_GET_SIZE(max_version) < 1) {
      PyErr_SetString(PyExc_TypeError, "max_version must be a (major, minor) tuple");
      return NULL;
    }
    long major = PyLong_AsLong(PyTuple_GET_ITEM(max_version, 0));
    if (major == -1 && PyErr_Occurred()) return NULL;
    versioned = major >= 1;
  }
  PyObject *cap;
  if (versioned) {
    versioned_ctx *c = calloc(1, sizeof *c);
    if (!c) return PyErr_NoMemory();
    c->m.version = (DLPackVersion){MML_DLPACK_MAJOR, MML_DLPACK_MINOR};
    c->m.manager_ctx = c;
    c->m.deleter = versioned_deleter;
    c->m.flags = 0;
    fill_dltensor(self, &c->m.dl_tensor, c->shape);
    c->buf = self->buf;
    mml_buf_retain(self->buf);
    cap = PyCapsule_New(&c->m, "dltensor_versioned", versioned_capsule_destructor);
    if (!cap) versioned_deleter(&c->m);
  } else {
    legacy_ctx *c = calloc(1, sizeof *c);
    if (!c) return PyErr_NoMemory();
    c->m.manager_ctx = c;
    c->m.deleter = legacy_deleter;
    fill_dltensor(self, &c->m.dl_tensor, c->shape);
    c->buf = self->buf;
    mml_buf_retain(self->buf);
    cap = PyCapsule_New(&c->m, "dltensor", legacy_capsule_destructor);
    if (!cap) legacy_deleter(&c->m);
  }
  return cap;
}

static PyObject *Tensor_dlpack_device(TensorObject *self, PyObject *unused) {
  DLDevice d = dl_device_of(self->buf);
  return Py_BuildValue("(ii)", d.device_type, d.device_id);
}

static PyObject *Tensor_numpy(TensorObject *self, PyObject *unused) {
  if (self->dtype == MML_DT_BFLOAT16) {
    PyErr_SetString(PyExc_TypeError,
                    "NumPy has no bfloat16: view the tensor with "
                    "torch.from_dlpack(t) (zero copy), or use pixel_format=\"float32\"");
    return NULL;
  }
  PyObject *np = PyImport_ImportModule("numpy");
  if (!np) return NULL;
  PyObject *arr = PyObject_CallMethod(np, "from_dlpack", "O", (PyObject *)self);
  Py_DECREF(np);
  return arr;
}

static PyObject *Tensor_get_shape(TensorObject *self, void *c) {
  PyObject *t = PyTuple_New(self->ndim);
  if (!t) return NULL;
  for (int i = 0; i < self->ndim; i++) {
    PyObject *v = PyLong_FromLongLong(self->shape[i]);
    if (!v) {
      Py_DECREF(t);
      return NULL;
    }
    PyTuple_SET_ITEM(t, i, v);
  }
  return t;
}
static PyObject *Tensor_get_dtype(TensorObject *self, void *c) {
  return PyUnicode_FromString(mml_dtype_name(self->dtype));
}
static PyObject *Tensor_get_ndim(TensorObject *self, void *c) {
  return PyLong_FromLong(self->ndim);
}
static int64_t numel(TensorObject *self) {
  int64_t n = 1;
  for (int i = 0; i < self->ndim; i++) n *= self->shape[i];
  return n;
}
static PyObject *Tensor_get_nbytes(TensorObject *self, void *c) {
  return PyLong_FromLongLong(numel(self) * (int64_t)mml_dtype_size(self->dtype));
}
static PyObject *Tensor_get_data_ptr(TensorObject *self, void *c) {
  return PyLong_FromVoidPtr((char *)self->buf->data + self->offset);
}
static PyObject *Tensor_get_device(TensorObject *self, void *c) {
  if (self->buf->kind == MML_MEM_DEVICE) return PyUnicode_FromFormat("cuda:%d", self->buf->device);
  return PyUnicode_FromString("cpu");
}

static PyObject *Tensor_get_is_pinned(TensorObject *self, void *c) {
  return PyBool_FromLong(self->buf->kind == MML_MEM_PINNED);
}

static Py_ssize_t Tensor_len(TensorObject *self) {
  if (self->ndim == 0) {
    PyErr_SetString(PyExc_TypeError, "len() of a 0-d tensor");
    return -1;
  }
  return (Py_ssize_t)self->shape[0];
}

static PyObject *Tensor_repr(TensorObject *self) {
  char dims[128];
  size_t k = 0;
  dims[0] = 0;
  for (int i = 0; i < self->ndim && k < sizeof dims; i++)
    k += (size_t)snprintf(dims + k, sizeof dims - k, i ? ", %lld" : "%lld",
                          (long long)self->shape[i]);
  return PyUnicode_FromFormat("mmloader.Tensor(shape=(%s%s), dtype=%s)", dims,
                              self->ndim == 1 ? "," : "", mml_dtype_name(self->dtype));
}

static void Tensor_dealloc(TensorObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  mml_buf_release(self->buf);
  tp->tp_free((PyObject *)self);
  Py_DECREF(tp); /* heap type: each instance holds a reference */
}

static PyObject *Tensor_new(PyTypeObject *type, PyObject *a, PyObject *k) {
  PyErr_SetString(PyExc_TypeError, "mmloader.Tensor objects are created by the loader");
  return NULL;
}

PyObject *mml_py_tensor_from_slot(mml_py_state *ms, mml_tensor *slot) {
  TensorObject *t = PyObject_New(TensorObject, ms->Tensor_Type);
  if (!t) return NULL;
  t->buf = slot->buf; /* steals the slot's reference */
  slot->buf = NULL;
  t->dtype = slot->dtype;
  t->ndim = slot->ndim;
  for (int i = 0; i < MML_MAX_DIMS; i++) t->shape[i] = i < slot->ndim ? slot->shape[i] : 0;
  t->offset = slot->offset;
  return (PyObject *)t;
}

PyObject *mml_py_batch_dict(mml_py_state *ms, mml_batch *b) {
  PyObject *d = PyDict_New();
  for (int i = 0; d && i < b->ntensors; i++) {
    PyObject *t = mml_py_tensor_from_slot(ms, &b->tensors[i]);
    if (!t || PyDict_SetItemString(d, b->tensors[i].name, t) < 0) Py_CLEAR(d);
    Py_XDECREF(t);
  }
  mml_batch_clear(b);
  return d;
}

static PyMethodDef Tensor_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))Tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)\n"
     "A DLPack capsule viewing this tensor's memory (no copy)."},
    {"__dlpack_device__", (PyCFunction)Tensor_dlpack_device, METH_NOARGS,
     "(device_type, device_id) as DLPack defines them."},
    {"numpy", (PyCFunction)Tensor_numpy, METH_NOARGS,
     "A read-write NumPy view of the same memory (zero copy; keeps the buffer alive)."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Tensor_getset[] = {
    {"shape", (getter)Tensor_get_shape, NULL, "Shape as a tuple of ints.", NULL},
    {"dtype", (getter)Tensor_get_dtype, NULL, "NumPy dtype name (\"int64\", \"float32\", ...).",
     NULL},
    {"ndim", (getter)Tensor_get_ndim, NULL, "Number of dimensions.", NULL},
    {"nbytes", (getter)Tensor_get_nbytes, NULL, "Size in bytes.", NULL},
    {"data_ptr", (getter)Tensor_get_data_ptr, NULL, "Address of element 0.", NULL},
    {"device", (getter)Tensor_get_device, NULL, "\"cpu\" or \"cuda:N\".", NULL},
    {"is_pinned", (getter)Tensor_get_is_pinned, NULL,
     "True for page-locked host memory (pin_memory=True with CUDA present).", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot Tensor_slots[] = {
    {Py_tp_dealloc, Tensor_dealloc},
    {Py_tp_repr, Tensor_repr},
    {Py_sq_length, Tensor_len},
    {Py_tp_doc,
     "A batch tensor produced by mmloader: a zero-copy view of a pooled buffer.\n"
     "Convert with torch.from_dlpack(t) or numpy.from_dlpack(t) / t.numpy()."},
    {Py_tp_methods, Tensor_methods},
    {Py_tp_getset, Tensor_getset},
    {Py_tp_new, Tensor_new},
    {0, NULL}};

static PyType_Spec Tensor_spec = {
    .name = "mmloader.Tensor",
    .basicsize = sizeof(TensorObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Tensor_slots,
};

int mml_py_tensor_exec(PyObject *m) {
  return mml_py_add_type(m, &Tensor_spec, &mml_py_state_of(m)->Tensor_Type, "Tensor");
}
