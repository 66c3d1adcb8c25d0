/*
 * vision_py.c — binding of the vision core (csrc/core/vision/vision.c, image.c):
 *
 *   _core.VisionProcessor(cfg: dict, pixel_format="float32")  per-object config + scratch
 *       .process(items) -> (VisionBuffer, rows, cols, [(t, h, w), ...])
 *           items: list of (0, bytes-like encoded image) or (1, buffer, height, width)
 *           for C-contiguous uint8 HxWx3; the output (float32, bfloat16 bits or uint8, as
 *           pixel_format says) is written straight into the returned VisionBuffer
 *           (malloc'd; recycled through the processor)
 *   _core.smart_resize(height, width, factor, min_pixels, max_pixels, legacy)
 *   _core.vision_plan(cfg, data) -> dict        header-only plan (the engine's first step)
 *   _core.image_decode(data, scale_denom=1, alpha=0, max_image_pixels=178956970)
 *       -> (bytes, height, width)   (tests; alpha: MML_ALPHA_* policy, 0 composite, 1 drop,
 *       2 paste; images over max_image_pixels are refused before decoding, 0: no limit)
 *   _core.data_uri_decode(ref) -> bytes   (the payload of a base64 data: URI)
 *   _core.resize_bicubic(buf, height, width, dst_h, dst_w, h_first=False) -> bytes (tests)
 *   _core.expand_pixels(src, dst, table, P, frames, T, bf16)   uint8 patches -> float rows
 *   _core.scratch_mapped() -> (now, peak)   decoder scratch mapped in the process (tests)
 *
 * Threads: planning and processing run with the GIL released.  A VisionProcessor's
 * scratch is guarded by a lock taken without blocking; a call that finds it busy (the
 * same object used from two threads) works with a temporary scratch instead.
 *
 * A processor's scratch keeps a progressive JPEG's coefficient region mapped between calls
 * up to MML_WORKER_JPEG_KEEP, as a Loader worker without max_memory does: a region mapped
 * afresh per call costs a page fault and the kernel's zeroing per page (the temporary
 * scratch keeps the decoder's default, MML_JPEG_KEEP).
 */
#include "binding.h"
#include "mml/options.h"

#include <stdlib.h>
#include <string.h>

#include "mml/datauri.h"
#include "mml/batch.h"
#include "mml/image.h"
#include "mml/loader.h"
#include "mml/vision.h"

/* ---------------------------------------------------------------- config from dict */

static int get_item(mml_py_state *ms, PyObject *d, const char *key, PyObject **out) {
  *out = PyDict_GetItemString(d, key); /* borrowed */
  if (!*out) {
    PyErr_Format(ms->ConfigError, "vision config: missing key %s", key);
    return -1;
  }
  return 0;
}

static int get_i64(mml_py_state *ms, PyObject *d, const char *key, int64_t *out) {
  PyObject *v;
  if (get_item(ms, d, key, &v)) return -1;
  if (v == Py_None) {
    *out = 0;
    return 0;
  }
  long long x = PyLong_AsLongLong(v);
  if (x == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    PyErr_Format(ms->ConfigError, "vision config: %s must be an integer", key);
    return -1;
  }
  *out = x;
  return 0;
}

static int get_int(mml_py_state *ms, PyObject *d, const char *key, int *out) {
  int64_t x;
  if (get_i64(ms, d, key, &x)) return -1;
  if (x < INT32_MIN || x > INT32_MAX) {
    PyErr_Format(ms->ConfigError, "vision config: %s out of range", key);
    return -1;
  }
  *out = (int)x;
  return 0;
}

static int get_bool(mml_py_state *ms, PyObject *d, const char *key, int *out) {
  PyObject *v;
  if (get_item(ms, d, key, &v)) return -1;
  int b = PyObject_IsTrue(v);
  if (b < 0) return -1;
  *out = b;
  return 0;
}

static int get_vec3(mml_py_state *ms, PyObject *d, const char *key, float out[3]) {
  PyObject *v;
  if (get_item(ms, d, key, &v)) return -1;
  PyObject *seq = PySequence_Fast(v, "vision config: image_mean/image_std must be sequences");
  if (!seq) return -1;
  if (PySequence_Fast_GET_SIZE(seq) != 3) {
    Py_DECREF(seq);
    PyErr_Format(ms->ConfigError, "vision config: %s needs 3 values", key);
    return -1;
  }
  for (int i = 0; i < 3; i++) {
    double x = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
    if (x == -1.0 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return -1;
    }
    out[i] = (float)x; /* same rounding as numpy's float64 -> float32 */
  }
  Py_DECREF(seq);
  return 0;
}

int mml_py_vision_cfg_from_dict(mml_py_state *ms, PyObject *d, struct mml_vision_cfg *cfg) {
  if (!PyDict_Check(d)) {
    PyErr_SetString(PyExc_TypeError,
                    "vision config must be a dict (mmloader.presets.vision_config())");
    return -1;
  }
  memset(cfg, 0, sizeof *cfg);
  if (get_int(ms, d, "patch_size", &cfg->patch_size) ||
      get_int(ms, d, "merge_size", &cfg->merge_size) ||
      get_int(ms, d, "temporal_patch_size", &cfg->temporal_patch_size) ||
      get_i64(ms, d, "min_pixels", &cfg->min_pixels) ||
      get_i64(ms, d, "max_pixels", &cfg->max_pixels) || get_vec3(ms, d, "image_mean", cfg->mean) ||
      get_vec3(ms, d, "image_std", cfg->std) ||
      get_bool(ms, d, "legacy_resize", &cfg->legacy_resize) ||
      get_bool(ms, d, "fast_decode", &cfg->fast) ||
      get_i64(ms, d, "max_image_pixels", &cfg->max_image_pixels))
    return -1;
  cfg->max_jpeg_scans = (int)mml_loader_option("max_jpeg_scans")->def; /* the table's */
  if (PyDict_GetItemString(d, "max_jpeg_scans") &&
      get_int(ms, d, "max_jpeg_scans", &cfg->max_jpeg_scans))
    return -1;
  if (PyDict_GetItemString(d, "pillow_h_first") &&
      get_bool(ms, d, "pillow_h_first", &cfg->pillow_h_first))
    return -1;
  cfg->video_min_pixels = cfg->min_pixels; /* no separate video limits: the image ones */
  cfg->video_max_pixels = cfg->max_pixels;
  if (PyDict_GetItemString(d, "video_min_pixels") &&
      get_i64(ms, d, "video_min_pixels", &cfg->video_min_pixels))
    return -1;
  if (PyDict_GetItemString(d, "video_max_pixels") &&
      get_i64(ms, d, "video_max_pixels", &cfg->video_max_pixels))
    return -1;
  PyObject *fam = PyDict_GetItemString(d, "video_family");
  if (fam) {
    const char *f = PyUnicode_Check(fam) ? PyUnicode_AsUTF8(fam) : NULL;
    if (f && !strcmp(f, "qwen2-vl"))
      cfg->video_family = MML_VIDEO_QWEN2;
    else if (f && !strcmp(f, "qwen2.5-vl"))
      cfg->video_family = MML_VIDEO_QWEN25;
    else if (f && !strcmp(f, "qwen3-vl"))
      cfg->video_family = MML_VIDEO_QWEN3;
    else {
      PyErr_SetString(PyExc_ValueError,
                      "vision config: video_family must be \"qwen2-vl\", "
                      "\"qwen2.5-vl\" or \"qwen3-vl\"");
      return -1;
    }
  }
  if (PyDict_GetItemString(d, "strict_jpeg") && get_bool(ms, d, "strict_jpeg", &cfg->strict_jpeg))
    return -1;
  PyObject *route = PyDict_GetItemString(d, "image_route");
  if (route) {
    const mml_option *o = mml_loader_option("image_route"); /* its names, in MML_ROUTE_* order */
    const char *r = PyUnicode_Check(route) ? PyUnicode_AsUTF8(route) : NULL;
    int k = 0;
    while (r && o->choices[k] && strcmp(r, o->choices[k])) k++;
    if (!r || !o->choices[k]) {
      char list[256];
      mml_option_choice_list(o, list, sizeof list);
      PyErr_Format(PyExc_ValueError, "vision config: image_route must be one of (%s), got %R", list,
                   route);
      return -1;
    }
    cfg->route = k;
  }
  mml_err err = {0};
  mml_status st = mml_vision_cfg_check(cfg, &err);
  if (st != MML_OK) {
    mml_py_raise(ms, st, &err);
    return -1;
  }
  return 0;
}

/* ---------------------------------------------------------------- VisionProcessor */

typedef struct {
  PyObject_HEAD
  mml_vision_cfg cfg;
  mml_vision_scratch *scratch;
  PyThread_type_lock lock;
  void *cache; /* one output buffer returned by a released VisionBuffer (GIL held) */
  size_t cache_size;
} VisionProcessorObject;

/* ---------------------------------------------------------------- VisionBuffer */

/* The pixel_values output of one call: malloc'd memory (written without the GIL) exposed through
 * the buffer protocol.  When the last view goes away the memory goes back to its processor
 * (one cached buffer: the largest released, so a small first call (a warm-up) does not
 * leave a cache that every larger call then passes by) so steady-state calls neither
 * allocate nor page-fault new memory. */
typedef struct {
  PyObject_HEAD
  PyObject *owner; /* the VisionProcessor */
  void *data;
  size_t size;
} VisionBufferObject;

static int VisionBuffer_getbuffer(VisionBufferObject *self, Py_buffer *view, int flags) {
  return PyBuffer_FillInfo(view, (PyObject *)self, self->data, (Py_ssize_t)self->size, 0, flags);
}

static int VisionBuffer_traverse(VisionBufferObject *self, visitproc visit, void *arg) {
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(self->owner);
  return 0;
}

static int VisionBuffer_clear(VisionBufferObject *self) {
  Py_CLEAR(self->owner); /* the memory is then freed, not cached */
  return 0;
}

static void VisionBuffer_dealloc(VisionBufferObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  VisionProcessorObject *o = (VisionProcessorObject *)self->owner;
  if (o && self->data && (!o->cache || o->cache_size < self->size)) {
    free(o->cache); /* smaller: this one serves every call it served, and more */
    o->cache = self->data;
    o->cache_size = self->size;
  } else {
    free(self->data);
  }
  VisionBuffer_clear(self);
  tp->tp_free((PyObject *)self);
  Py_DECREF(tp); /* heap type: each instance holds a reference */
}

static PyType_Slot VisionBuffer_slots[] = {
    {Py_tp_dealloc, VisionBuffer_dealloc},
    {Py_tp_traverse, VisionBuffer_traverse},
    {Py_tp_clear, VisionBuffer_clear},
    {Py_tp_doc, "pixel_values memory of one ImageProcessor call (buffer protocol)."},
    {Py_bf_getbuffer, VisionBuffer_getbuffer},
    {0, NULL}};

static PyType_Spec VisionBuffer_spec = {
    .name = "mmloader._core.VisionBuffer",
    .basicsize = sizeof(VisionBufferObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = VisionBuffer_slots,
};

static int VisionProcessor_init(VisionProcessorObject *self, PyObject *args, PyObject *kw) {
  mml_py_state *ms = mml_py_state_of_self(self);
  PyObject *d;
  const char *fmt = NULL; /* the option table's default */
  static char *kwlist[] = {"cfg", "pixel_format", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|z:VisionProcessor", kwlist, &d, &fmt)) return -1;
  if (mml_py_vision_cfg_from_dict(ms, d, &self->cfg)) return -1;
  int k;
  if (mml_py_table_enum(ms, "pixel_format", fmt, &k)) return -1; /* mml_pixels */
  if (k != MML_PIXELS_FLOAT32 && k != MML_PIXELS_BFLOAT16 && k != MML_PIXELS_UINT8) {
    PyErr_Format(ms->ConfigError,
                 "pixel_format='%s': a VisionProcessor writes each image's rows as it "
                 "decodes it; its pixel_format is the dtype alone ('%s', '%s' or '%s')",
                 mml_pixels_name(k), mml_pixels_name(MML_PIXELS_FLOAT32),
                 mml_pixels_name(MML_PIXELS_BFLOAT16), mml_pixels_name(MML_PIXELS_UINT8));
    return -1;
  }
  self->cfg.pixel_format = mml_pixels_emitted(k);
  if (!self->scratch) {
    if (mml_vision_scratch_new(&self->scratch) != MML_OK) {
      PyErr_NoMemory();
      return -1;
    }
    mml_vision_scratch_set_jpeg_keep(self->scratch, MML_WORKER_JPEG_KEEP);
  }
  if (!self->lock && !(self->lock = PyThread_allocate_lock())) {
    PyErr_NoMemory();
    return -1;
  }
  return 0;
}

/* A buffer of n bytes, reusing the processor's cached one when it fits (and is not more
 * than 4x too large).  GIL held. */
static PyObject *take_buffer(mml_py_state *ms, VisionProcessorObject *self, size_t n) {
  PyTypeObject *tp = ms->VisionBuffer_Type;
  VisionBufferObject *b = (VisionBufferObject *)tp->tp_alloc(tp, 0); /* zeroed, tracked */
  if (!b) return NULL;
  b->size = n;
  if (self->cache && self->cache_size >= n && self->cache_size / 4 <= n) {
    b->data = self->cache;
    self->cache = NULL;
  } else if (posix_memalign(&b->data, 64, n ? n : 1)) { /* 64: aligned streaming stores */
    b->data = NULL;
    Py_DECREF(b);
    return PyErr_NoMemory();
  }
  Py_INCREF(self);
  b->owner = (PyObject *)self;
  return (PyObject *)b;
}

static void VisionProcessor_dealloc(VisionProcessorObject *self) {
  free(self->cache);
  mml_vision_scratch_free(self->scratch);
  if (self->lock) PyThread_free_lock(self->lock);
  PyTypeObject *tp = Py_TYPE(self);
  tp->tp_free((PyObject *)self);
  Py_DECREF(tp); /* heap type: each instance holds a reference */
}

typedef struct item {
  int kind; /* 0 encoded, 1 rgb */
  Py_buffer buf;
  int have_buf;
  int h, w;
  mml_vision_plan plan;
} item;

static void items_release(item *it, Py_ssize_t n) {
  for (Py_ssize_t i = 0; i < n; i++)
    if (it[i].have_buf) PyBuffer_Release(&it[i].buf);
  PyMem_Free(it);
}

/* The items of process(): (kind, buffer[, h, w]); kind 1 is raw RGB of h x w. */
static int parse_items(PyObject *seq, item *it, Py_ssize_t n) {
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *o = PySequence_Fast_GET_ITEM(seq, i), *b;
    if (!PyArg_ParseTuple(o, "iO|ii:process item", &it[i].kind, &b, &it[i].h, &it[i].w)) return -1;
    if (PyObject_GetBuffer(b, &it[i].buf, PyBUF_SIMPLE)) return -1;
    it[i].have_buf = 1;
    if (it[i].kind == 1 &&
        (it[i].h < 1 || it[i].w < 1 || it[i].buf.len != (Py_ssize_t)it[i].h * it[i].w * 3)) {
      PyErr_Format(PyExc_ValueError, "image %zd: buffer of %zd bytes is not %dx%dx3", i,
                   it[i].buf.len, it[i].h, it[i].w);
      return -1;
    }
  }
  return 0;
}

/* Plans every item (GIL released); *rows: their pixel_values rows.  -1 with an exception. */
static int plan_items(mml_py_state *ms, VisionProcessorObject *self, item *it, Py_ssize_t n,
                      int64_t *rows) {
  mml_err err = {0};
  mml_status st = MML_OK;
  Py_ssize_t bad = -1;
  *rows = 0;
  Py_BEGIN_ALLOW_THREADS
  for (Py_ssize_t i = 0; i < n && st == MML_OK; i++) {
    if (it[i].kind == 0)
      st = mml_vision_plan_bytes(&self->cfg, it[i].buf.buf, (size_t)it[i].buf.len, &it[i].plan,
                                 &err);
    else
      st = mml_vision_plan_size(&self->cfg, it[i].w, it[i].h, &it[i].plan, &err);
    if (st != MML_OK)
      bad = i;
    else
      *rows += it[i].plan.rows;
  }
  Py_END_ALLOW_THREADS
  if (st != MML_OK) {
    mml_err_prefix(&err, "image %zd", bad);
    mml_py_raise(ms, st, &err);
    return -1;
  }
  return 0;
}

/* Decodes, resizes and patchifies every item into dst (GIL released), rows of row_bytes,
 * with the processor's scratch when it is free, else a temporary one.  -1 with an
 * exception. */
static int process_items(mml_py_state *ms, VisionProcessorObject *self, item *it, Py_ssize_t n,
                         uint8_t *dst) {
  mml_err err = {0};
  mml_status st = MML_OK;
  Py_ssize_t bad = -1;
  const size_t row_bytes = mml_vision_row_bytes(&self->cfg);
  Py_BEGIN_ALLOW_THREADS
  mml_vision_scratch *s = self->scratch, *tmp = NULL;
  int locked = PyThread_acquire_lock(self->lock, NOWAIT_LOCK);
  if (!locked) {
    if (mml_vision_scratch_new(&tmp) != MML_OK) st = mml_err_set(&err, MML_ENOMEM, "out of memory");
    s = tmp;
  }
  uint8_t *p = dst;
  for (Py_ssize_t i = 0; i < n && st == MML_OK; i++) {
    if (it[i].kind == 0) {
      st = mml_vision_process_bytes(&self->cfg, s, it[i].buf.buf, (size_t)it[i].buf.len,
                                    &it[i].plan, p, &err);
    } else {
      mml_rgb8 img = {it[i].buf.buf, it[i].w, it[i].h, (size_t)it[i].w * 3};
      st = mml_vision_process_rgb(&self->cfg, s, &img, &it[i].plan, p, &err);
    }
    if (st != MML_OK) bad = i;
    p += (size_t)it[i].plan.rows * row_bytes;
  }
  if (locked) PyThread_release_lock(self->lock);
  mml_vision_scratch_free(tmp);
  Py_END_ALLOW_THREADS
  if (st != MML_OK) {
    mml_err_prefix(&err, "image %zd", bad);
    mml_py_raise(ms, st, &err);
    return -1;
  }
  return 0;
}

/* [(grid_t, grid_h, grid_w), ...] */
static PyObject *grids_list(const item *it, Py_ssize_t n) {
  PyObject *grids = PyList_New(n);
  if (!grids) return NULL;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *g = Py_BuildValue("(iii)", it[i].plan.grid_t, it[i].plan.grid_h, it[i].plan.grid_w);
    if (!g) {
      Py_DECREF(grids);
      return NULL;
    }
    PyList_SET_ITEM(grids, i, g);
  }
  return grids;
}

static PyObject *VisionProcessor_process(VisionProcessorObject *self, PyObject *arg) {
  mml_py_state *ms = mml_py_state_of_self(self);
  PyObject *seq = PySequence_Fast(arg, "process() takes a list of items");
  if (!seq) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  item *it = PyMem_Calloc(n ? (size_t)n : 1, sizeof *it);
  if (!it) {
    Py_DECREF(seq);
    return PyErr_NoMemory();
  }
  PyObject *result = NULL, *out = NULL, *grids;
  int64_t rows;
  if (parse_items(seq, it, n) || plan_items(ms, self, it, n, &rows)) goto fail;
  int cols = mml_vision_pixel_cols(&self->cfg);
  const size_t row_bytes = mml_vision_row_bytes(&self->cfg);
  if (rows > (int64_t)(PY_SSIZE_T_MAX / row_bytes)) {
    PyErr_NoMemory();
    goto fail;
  }
  out = take_buffer(ms, self, (size_t)rows * row_bytes);
  if (!out) goto fail;
  if (process_items(ms, self, it, n, ((VisionBufferObject *)out)->data)) goto fail;
  if (!(grids = grids_list(it, n))) goto fail;
  result = Py_BuildValue("(OLiN)", out, (long long)rows, cols, grids);
fail:
  Py_XDECREF(out);
  items_release(it, n);
  Py_DECREF(seq);
  return result;
}

static PyMethodDef VisionProcessor_methods[] = {
    {"process", (PyCFunction)VisionProcessor_process, METH_O,
     "process(items) -> (buffer, rows, cols, grids).  items: (0, encoded) or "
     "(1, rgb_buffer, height, width)."},
    {NULL, NULL, 0, NULL}};

static PyType_Slot VisionProcessor_slots[] = {
    {Py_tp_doc, "Native Qwen-VL image preprocessing with a reusable scratch."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, VisionProcessor_init},
    {Py_tp_dealloc, VisionProcessor_dealloc},
    {Py_tp_methods, VisionProcessor_methods},
    {0, NULL}};

static PyType_Spec VisionProcessor_spec = {
    .name = "mmloader._core.VisionProcessor",
    .basicsize = sizeof(VisionProcessorObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = VisionProcessor_slots,
};

/* ---------------------------------------------------------------- functions */

static PyObject *py_smart_resize(PyObject *mod, PyObject *args, PyObject *kw) {
  int h, w, factor = 28, legacy = 0;
  long long mn = 56 * 56, mx = 28 * 28 * 1280;
  static char *kwlist[] = {"height", "width", "factor", "min_pixels", "max_pixels", "legacy", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kw, "ii|iLLi:smart_resize", kwlist, &h, &w, &factor, &mn,
                                   &mx, &legacy))
    return NULL;
  mml_err err = {0};
  int oh, ow;
  mml_status st = mml_smart_resize(h, w, factor, mn, mx, legacy, &oh, &ow, &err);
  if (st != MML_OK) {
    /* the reference raises ValueError; ConfigError/SampleError are not ValueErrors for all */
    PyErr_SetString(PyExc_ValueError, err.msg);
    return NULL;
  }
  return Py_BuildValue("(ii)", oh, ow);
}

static PyObject *py_vision_plan(PyObject *mod, PyObject *args) {
  mml_py_state *ms = mml_py_state_of(mod);
  PyObject *d;
  Py_buffer b;
  if (!PyArg_ParseTuple(args, "Oy*:vision_plan", &d, &b)) return NULL;
  mml_vision_cfg cfg;
  if (mml_py_vision_cfg_from_dict(ms, d, &cfg)) {
    PyBuffer_Release(&b);
    return NULL;
  }
  mml_vision_plan plan;
  mml_err err = {0};
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_vision_plan_bytes(&cfg, b.buf, (size_t)b.len, &plan, &err);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&b);
  if (st != MML_OK) return mml_py_raise(ms, st, &err);
  return Py_BuildValue("{s:i,s:i,s:i,s:i,s:(iii),s:L,s:i,s:L,s:s,s:i,s:L}", "src_w", plan.src_w,
                       "src_h", plan.src_h, "dst_w", plan.dst_w, "dst_h", plan.dst_h, "grid_thw",
                       plan.grid_t, plan.grid_h, plan.grid_w, "rows", (long long)plan.rows, "cols",
                       plan.cols, "tokens", (long long)plan.tokens, "format",
                       mml_image_format_name(plan.format), "decode_scale", plan.decode_scale,
                       "scratch", (long long)plan.scratch);
}

static PyObject *py_data_uri_decode(PyObject *mod, PyObject *args) {
  mml_py_state *ms = mml_py_state_of(mod);
  const char *ref;
  if (!PyArg_ParseTuple(args, "s:data_uri_decode", &ref)) return NULL;
  mml_bytes out = {0};
  mml_err err = {0};
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_data_uri_decode(ref, &out, &err);
  Py_END_ALLOW_THREADS
  PyObject *r = st == MML_OK
                    ? PyBytes_FromStringAndSize((const char *)out.data, (Py_ssize_t)out.len)
                    : mml_py_raise(ms, st, &err);
  mml_bytes_free(&out);
  return r;
}

static PyObject *py_image_decode(PyObject *mod, PyObject *args, PyObject *kw) {
  mml_py_state *ms = mml_py_state_of(mod);
  static char *kwlist[] = {"data", "scale_denom", "alpha", "max_image_pixels", NULL};
  Py_buffer b;
  int scale = 1, alpha = MML_ALPHA_COMPOSITE;
  long long max_px = MML_DEFAULT_MAX_IMAGE_PIXELS;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|iiL:image_decode", kwlist, &b, &scale, &alpha,
                                   &max_px))
    return NULL;
  mml_decoder *d = NULL;
  if (mml_decoder_new(&d) != MML_OK) {
    PyBuffer_Release(&b);
    return PyErr_NoMemory();
  }
  mml_decoder_set_max_pixels(d, max_px);
  mml_rgb8 img;
  mml_err err = {0};
  mml_status st;
  const mml_decode_opts opts = {.alpha = alpha};
  mml_decoder_set_opts(d, &opts);
  Py_BEGIN_ALLOW_THREADS
  st = mml_image_decode(d, b.buf, (size_t)b.len, scale, &img, &err);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&b);
  PyObject *r = NULL;
  if (st != MML_OK)
    mml_py_raise(ms, st, &err);
  else
    r = Py_BuildValue("(y#ii)", (const char *)img.pixels, (Py_ssize_t)img.stride * img.height,
                      img.height, img.width);
  mml_decoder_free(d);
  return r;
}

static PyObject *py_resize_bicubic(PyObject *mod, PyObject *args) {
  mml_py_state *ms = mml_py_state_of(mod);
  Py_buffer b;
  int h, w, dh, dw, h_first = 0;
  if (!PyArg_ParseTuple(args, "y*iiii|p:resize_bicubic", &b, &h, &w, &dh, &dw, &h_first))
    return NULL;
  if (h < 1 || w < 1 || b.len != (Py_ssize_t)h * w * 3 || dh < 1 || dw < 1) {
    PyBuffer_Release(&b);
    PyErr_SetString(PyExc_ValueError, "resize_bicubic: bad sizes");
    return NULL;
  }
  PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)dh * dw * 3);
  mml_vision_scratch *s = NULL;
  if (!out || mml_vision_scratch_new(&s) != MML_OK) {
    PyBuffer_Release(&b);
    Py_XDECREF(out);
    return out ? PyErr_NoMemory() : NULL;
  }
  mml_rgb8 img = {b.buf, w, h, (size_t)w * 3};
  uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(out);
  mml_err err = {0};
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_resize_bicubic_rgb8_order(s, &img, dw, dh, h_first, dst, &err);
  Py_END_ALLOW_THREADS
  mml_vision_scratch_free(s);
  PyBuffer_Release(&b);
  if (st != MML_OK) {
    Py_DECREF(out);
    return mml_py_raise(ms, st, &err);
  }
  return out;
}

/* expand_pixels(src, dst, table, patch_size, frames, temporal_patch_size, bfloat16): src a
 * uint8 buffer of rows of 3*frames*P*P bytes, dst a writable buffer of as many rows of
 * 3*T*P*P float32 (or bfloat16) values, table 768 float32 ([3][256]). */
static PyObject *py_expand_pixels(PyObject *mod, PyObject *args) {
  mml_py_state *ms = mml_py_state_of(mod);
  Py_buffer src, dst, tab;
  int P, F, T, bf16;
  if (!PyArg_ParseTuple(args, "y*w*y*iiip:expand_pixels", &src, &dst, &tab, &P, &F, &T, &bf16))
    return NULL;
  PyObject *r = NULL;
  const size_t in_row = (size_t)3 * P * P * F, out_row = (size_t)3 * P * P * T * (bf16 ? 2 : 4);
  const int64_t rows = P > 0 && F > 0 ? (int64_t)((size_t)src.len / in_row) : 0;
  if (P < 1 || F < 1 || T < 1 || tab.len != 768 * 4 || (size_t)src.len != (size_t)rows * in_row ||
      (size_t)dst.len != (size_t)rows * out_row) {
    PyErr_SetString(PyExc_ValueError,
                    "expand_pixels: buffer sizes do not match [rows, "
                    "3*frames*P*P] uint8 in, [rows, 3*T*P*P] out and a 768-float table");
    goto out;
  }
  mml_err err = {0};
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_pixels_expand(src.buf, rows, P, F, T, (const float(*)[256])tab.buf,
                         bf16 ? MML_PIXEL_BFLOAT16 : MML_PIXEL_FLOAT32, dst.buf, &err);
  Py_END_ALLOW_THREADS
  if (st != MML_OK)
    mml_py_raise(ms, st, &err);
  else
    r = Py_NewRef(Py_None);
out:
  PyBuffer_Release(&src);
  PyBuffer_Release(&dst);
  PyBuffer_Release(&tab);
  return r;
}

static PyObject *py_scratch_mapped(PyObject *mod, PyObject *noargs) {
  size_t now, peak;
  mml_mapped_usage(&now, &peak);
  return Py_BuildValue("(nn)", (Py_ssize_t)now, (Py_ssize_t)peak);
}

static PyMethodDef vision_functions[] = {
    {"scratch_mapped", py_scratch_mapped, METH_NOARGS,
     "scratch_mapped() -> (now, peak): decoder scratch (multi-scan JPEG regions) mapped in "
     "the process, bytes (mml_mapped_usage)"},
    {"expand_pixels", py_expand_pixels, METH_VARARGS,
     "expand_pixels(src_u8, dst, table_f32_768, patch_size, frames, temporal_patch_size, "
     "bfloat16) "
     "-> None: uint8 patch rows into float32/bfloat16 rows (mml_pixels_expand)"},
    {"smart_resize", (PyCFunction)(void (*)(void))py_smart_resize, METH_VARARGS | METH_KEYWORDS,
     "smart_resize(height, width, factor=28, min_pixels=3136, max_pixels=1003520, legacy=0): "
     "legacy 0 transformers, 1 older transformers, 2 qwen-vl-utils"},
    {"vision_plan", py_vision_plan, METH_VARARGS, "vision_plan(cfg, data) -> dict"},
    {"data_uri_decode", py_data_uri_decode, METH_VARARGS,
     "data_uri_decode(ref) -> bytes: the payload of a base64 data: URI"},
    {"image_decode", (PyCFunction)(void (*)(void))py_image_decode, METH_VARARGS | METH_KEYWORDS,
     "image_decode(data, scale_denom=1, max_image_pixels=178956970) -> (rgb bytes, height, "
     "width); images of more pixels raise SampleError before decoding (0: no limit)"},
    {"resize_bicubic", py_resize_bicubic, METH_VARARGS,
     "resize_bicubic(rgb, height, width, dst_h, dst_w) -> bytes (Pillow-exact bicubic)"},
    {NULL, NULL, 0, NULL}};

int mml_py_vision_exec(PyObject *m) {
  mml_py_state *ms = mml_py_state_of(m);
  if (mml_py_add_type(m, &VisionProcessor_spec, &ms->VisionProcessor_Type, "VisionProcessor") ||
      mml_py_add_type(m, &VisionBuffer_spec, &ms->VisionBuffer_Type, NULL))
    return -1;
  return PyModule_AddFunctions(m, vision_functions);
}
