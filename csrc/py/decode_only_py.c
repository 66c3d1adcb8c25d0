/*
 * decode_only_py.c — _core.decode_only(datas, scales=None) -> pixels: the decode-only floor
 * of the benchmarks (each image decoded to RGB8 rows by the engine's decoders, the rows
 * dropped: no resize, no output), with decoders reused call after call as a Loader worker
 * reuses its own.
 *
 * Why reused: a decoder's buffers (its rows, and for progressive JPEGs the mapped region of
 * whole-image coefficients, image_jpeg_mem.c) grow to the images seen and stay; a fresh
 * decoder per call pays that growth (allocation, page faults, zeroing) on every call, which
 * the Loader's workers do not, so the floor came out higher than the Loader's own decode
 * cost and "CPU / decode-only" ratios lower than they are.
 *
 * Invariants:
 *   1. A call takes a decoder from the module's pool (or makes one when the pool is empty)
 *      and gives it back after the call, whatever the outcome; a pooled decoder is used by
 *      one call at a time.
 *   2. The pool keeps at most MML_PY_DECODERS_KEPT decoders (one per thread that decoded
 *      at once); any more are freed when given back.  They are freed with the module.
 *   3. Pooled decoders keep the decoder defaults (decode_only never changes their limits or
 *      options), so a call's result never depends on an earlier call; only what they keep
 *      mapped between calls is a Loader worker's (MML_WORKER_JPEG_KEEP for a progressive
 *      JPEG's coefficient region, as without max_memory and in ImageProcessor), so the
 *      floor does not pay the fresh pages they no longer pay.
 *   4. The GIL is released while decoding; the pool's lock is only held for a push or pop.
 */
#include "binding.h"

#include "mml/image.h"
#include "mml/loader.h"

#define MML_PY_DECODERS_KEPT 16

typedef struct decoder_pool {
  PyThread_type_lock lock;
  int n;
  mml_decoder *kept[MML_PY_DECODERS_KEPT];
} decoder_pool;

#define POOL_CAPSULE "mmloader._core.decoder_pool"

static void pool_free(PyObject *capsule) {
  decoder_pool *p = PyCapsule_GetPointer(capsule, POOL_CAPSULE);
  if (!p) return;
  for (int i = 0; i < p->n; i++) mml_decoder_free(p->kept[i]);
  if (p->lock) PyThread_free_lock(p->lock);
  PyMem_RawFree(p);
}

static decoder_pool *pool_of(mml_py_state *ms) {
  return PyCapsule_GetPointer(ms->DecoderPool, POOL_CAPSULE);
}

/* A decoder from the pool, or a new one; NULL when out of memory (invariant 1). */
static mml_decoder *pool_take(decoder_pool *p) {
  mml_decoder *d = NULL;
  PyThread_acquire_lock(p->lock, WAIT_LOCK);
  if (p->n > 0) d = p->kept[--p->n];
  PyThread_release_lock(p->lock);
  if (d) return d;
  if (mml_decoder_new(&d) != MML_OK) return NULL;
  mml_decoder_set_jpeg_keep(d, MML_WORKER_JPEG_KEEP); /* invariant 3 */
  return d;
}

static void pool_give(decoder_pool *p, mml_decoder *d) {
  PyThread_acquire_lock(p->lock, WAIT_LOCK);
  if (p->n < MML_PY_DECODERS_KEPT) {
    p->kept[p->n++] = d;
    d = NULL;
  }
  PyThread_release_lock(p->lock);
  mml_decoder_free(d); /* invariant 2: beyond the pool's size */
}

static mml_status null_begin(void *ctx, int w, int h, mml_err *err) {
  (void)err;
  *(int64_t *)ctx += (int64_t)w * h;
  return MML_OK;
}

static mml_status null_row(void *ctx, int y, const uint8_t *rgb, mml_err *err) {
  (void)ctx, (void)y, (void)rgb, (void)err;
  return MML_OK;
}

/* scales: NULL (all 1) or a sequence of n ints into out.  0, or -1 with an exception set. */
static int parse_scales(PyObject *scales_obj, Py_ssize_t n, int *out) {
  for (Py_ssize_t i = 0; i < n; i++) out[i] = 1;
  if (scales_obj == Py_None) return 0;
  PyObject *ss = PySequence_Fast(scales_obj, "decode_only(): scales must be a list of ints");
  if (!ss) return -1;
  if (PySequence_Fast_GET_SIZE(ss) != n) {
    Py_DECREF(ss);
    PyErr_SetString(PyExc_ValueError, "decode_only(): one scale per image");
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) out[i] = (int)PyLong_AsLong(PySequence_Fast_GET_ITEM(ss, i));
  Py_DECREF(ss);
  return PyErr_Occurred() ? -1 : 0;
}

/* Decodes the n buffers (GIL released) on a pooled decoder; the pixels, or NULL with the
 * decoder's error raised. */
static PyObject *decode_all(mml_py_state *ms, Py_buffer *bufs, const int *scales, Py_ssize_t n) {
  decoder_pool *p = pool_of(ms);
  if (!p) return NULL;
  mml_decoder *d = pool_take(p);
  if (!d) return PyErr_NoMemory();
  int64_t pixels = 0;
  mml_err err = {0};
  mml_status st = MML_OK;
  mml_row_sink sink = {null_begin, null_row, &pixels, NULL};
  Py_BEGIN_ALLOW_THREADS
  for (Py_ssize_t i = 0; i < n && st == MML_OK; i++)
    st = mml_image_decode_rows(d, bufs[i].buf, (size_t)bufs[i].len, scales[i], &sink, &err);
  Py_END_ALLOW_THREADS
  pool_give(p, d);
  if (st != MML_OK) return mml_py_raise(ms, st, &err);
  return PyLong_FromLongLong((long long)pixels);
}

/* decode_only(datas, scales=None): scales (optional) gives each image's libjpeg
 * scale_denom (1, 2, 4, 8; the fast path's floor). */
static PyObject *py_decode_only(PyObject *mod, PyObject *args) {
  mml_py_state *ms = mml_py_state_of(mod);
  PyObject *arg, *scales_obj = Py_None;
  if (!PyArg_ParseTuple(args, "O|O:decode_only", &arg, &scales_obj)) return NULL;
  PyObject *seq = PySequence_Fast(arg, "decode_only() takes a list of bytes");
  if (!seq) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), got = 0;
  Py_buffer *bufs = PyMem_Calloc(n ? (size_t)n : 1, sizeof *bufs);
  int *scales = PyMem_Calloc(n ? (size_t)n : 1, sizeof *scales);
  PyObject *r = NULL;
  if (!bufs || !scales) {
    PyErr_NoMemory();
    goto out;
  }
  if (parse_scales(scales_obj, n, scales)) goto out;
  for (; got < n; got++)
    if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &bufs[got], PyBUF_SIMPLE)) goto out;
  r = decode_all(ms, bufs, scales, n);
out:
  for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&bufs[i]);
  PyMem_Free(bufs);
  PyMem_Free(scales);
  Py_DECREF(seq);
  return r;
}

static PyMethodDef decode_only_functions[] = {
    {"decode_only", py_decode_only, METH_VARARGS,
     "decode_only(list of encoded images, scales=None) -> total pixels (decode to RGB8 rows, "
     "discarded; scales: each image's JPEG scale_denom; decoders reused across calls)"},
    {NULL, NULL, 0, NULL}};

int mml_py_decode_only_exec(PyObject *m) {
  mml_py_state *ms = mml_py_state_of(m);
  decoder_pool *p = PyMem_RawCalloc(1, sizeof *p);
  if (!p || !(p->lock = PyThread_allocate_lock())) {
    PyMem_RawFree(p);
    PyErr_NoMemory();
    return -1;
  }
  ms->DecoderPool = PyCapsule_New(p, POOL_CAPSULE, pool_free);
  if (!ms->DecoderPool) {
    PyThread_free_lock(p->lock);
    PyMem_RawFree(p);
    return -1;
  }
  return PyModule_AddFunctions(m, decode_only_functions);
}
