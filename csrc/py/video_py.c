/*
 * video_py.c — thin test/benchmark hooks over the video core (mml/video.h):
 *   _core.video_probe(name, *, data=None, fetcher=None, max_bytes=0, max_pixels=0) -> dict
 *   _core.video_decode(name, indices, *, data=None, fetcher=None, max_bytes=0, threads=1,
 *                      block=0, max_pixels=0) -> dict(frames=[bytes h*w*3], shapes=[(h, w)], pts=[s],
 *                                       info=dict, bytes_read=int, frames_decoded=int,
 *                                       packets_sent=int)
 * The decode runs with the GIL released; frames are gathered in C memory and turned into
 * bytes objects afterwards.  The Loader does not go through here.
 */
#include "binding.h"

#include <string.h>

#include "mml/video.h"

typedef struct src_args {
  mml_video_src src;
  Py_buffer data;
  PyObject *fetcher_obj;
} src_args;

static int src_from(mml_py_state *ms, src_args *a, const char *name, PyObject *data,
                    PyObject *fetcher, long long max_bytes, int threads, long long block,
                    long long max_pixels) {
  memset(a, 0, sizeof *a);
  a->src.max_pixels = max_pixels;
  a->src.name = name;
  a->src.max_bytes = max_bytes;
  a->src.threads = threads;
  a->src.block = block;
  if (data && data != Py_None) {
    if (PyObject_GetBuffer(data, &a->data, PyBUF_SIMPLE)) return -1;
    a->src.data = a->data.buf;
    a->src.len = (size_t)a->data.len;
  }
  if (fetcher && fetcher != Py_None && !(a->src.fetcher = mml_py_fetcher_get(ms, fetcher))) {
    if (a->data.obj) PyBuffer_Release(&a->data);
    return -1;
  }
  return 0;
}

static void src_release(src_args *a) {
  if (a->data.obj) PyBuffer_Release(&a->data);
}

static PyObject *info_dict(const mml_video_info *in) {
  return Py_BuildValue("{s:i,s:i,s:i,s:d,s:L,s:d,s:d,s:s,s:s,s:O,s:L}", "width", in->width,
                       "height", in->height, "rotation", in->rotation, "fps", in->fps, "nframes",
                       (long long)in->nframes, "duration_s", in->duration_s, "start_s", in->start_s,
                       "codec", in->codec, "container", in->container, "exact_index",
                       in->exact_index ? Py_True : Py_False, "size", (long long)in->size);
}

static PyObject *py_video_probe(PyObject *mod, PyObject *args, PyObject *kw) {
  mml_py_state *ms = mml_py_state_of(mod);
  static char *kwlist[] = {"name", "data", "fetcher", "max_bytes", "max_pixels", NULL};
  const char *name;
  PyObject *data = NULL, *fetcher = NULL;
  long long max_bytes = 0, max_pixels = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "s|$OOLL:video_probe", kwlist, &name, &data, &fetcher,
                                   &max_bytes, &max_pixels))
    return NULL;
  src_args a;
  if (src_from(ms, &a, name, data, fetcher, max_bytes, 1, 0, max_pixels)) return NULL;
  mml_err err = {0};
  mml_video *v = NULL;
  mml_video_info info;
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_video_open(&a.src, &v, &err);
  if (!st) st = mml_video_probe(v, &info, &err);
  mml_video_close(v);
  Py_END_ALLOW_THREADS
  src_release(&a);
  if (st) return mml_py_raise(ms, st, &err);
  return info_dict(&info);
}

typedef struct gather {
  mml_bytes pix;  /* frames packed, rows of width*3 */
  mml_bytes meta; /* per frame: int h, int w, double pts */
} gather;

typedef struct frame_meta {
  int h, w;
  double pts;
} frame_meta;

static mml_status on_frame(void *ctx, const mml_video_frame *f, mml_err *err) {
  gather *g = ctx;
  frame_meta m = {f->height, f->width, f->pts_s};
  size_t row = (size_t)f->width * 3;
  if (mml_bytes_reserve(&g->pix, g->pix.len + row * (size_t)f->height) ||
      mml_bytes_append(&g->meta, &m, sizeof m))
    return mml_err_set(err, MML_ENOMEM, "video_decode: out of memory");
  for (int y = 0; y < f->height; y++)
    mml_bytes_append(&g->pix, f->rgb + (size_t)y * f->stride, row);
  return MML_OK;
}

static int indices_from(PyObject *seq, int64_t **out, Py_ssize_t *n) {
  PyObject *fast = PySequence_Fast(seq, "indices must be a sequence of ints");
  if (!fast) return -1;
  *n = PySequence_Fast_GET_SIZE(fast);
  *out = PyMem_Malloc((size_t)(*n ? *n : 1) * sizeof **out);
  if (!*out) {
    Py_DECREF(fast);
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < *n; i++) {
    (*out)[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
    if ((*out)[i] == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      PyMem_Free(*out);
      return -1;
    }
  }
  Py_DECREF(fast);
  return 0;
}

static PyObject *result(const gather *g, const mml_video_info *info, int64_t bytes_read,
                        int64_t decoded, int64_t sent) {
  size_t nf = g->meta.len / sizeof(frame_meta), off = 0;
  PyObject *frames = PyList_New((Py_ssize_t)nf), *shapes = PyList_New((Py_ssize_t)nf),
           *pts = PyList_New((Py_ssize_t)nf), *in = info_dict(info);
  PyObject *r = NULL;
  if (!frames || !shapes || !pts || !in) goto done;
  for (size_t i = 0; i < nf; i++) {
    frame_meta m;
    memcpy(&m, g->meta.data + i * sizeof m, sizeof m);
    size_t sz = (size_t)m.h * m.w * 3;
    PyObject *b = PyBytes_FromStringAndSize((const char *)g->pix.data + off, (Py_ssize_t)sz);
    PyObject *s = Py_BuildValue("(ii)", m.h, m.w), *p = PyFloat_FromDouble(m.pts);
    off += sz;
    if (!b || !s || !p) {
      Py_XDECREF(b), Py_XDECREF(s), Py_XDECREF(p);
      goto done;
    }
    PyList_SET_ITEM(frames, (Py_ssize_t)i, b);
    PyList_SET_ITEM(shapes, (Py_ssize_t)i, s);
    PyList_SET_ITEM(pts, (Py_ssize_t)i, p);
  }
  r = Py_BuildValue("{s:O,s:O,s:O,s:O,s:L,s:L,s:L}", "frames", frames, "shapes", shapes, "pts", pts,
                    "info", in, "bytes_read", (long long)bytes_read, "frames_decoded",
                    (long long)decoded, "packets_sent", (long long)sent);
done:
  Py_XDECREF(frames), Py_XDECREF(shapes), Py_XDECREF(pts), Py_XDECREF(in);
  return r;
}

static PyObject *py_video_decode(PyObject *mod, PyObject *args, PyObject *kw) {
  mml_py_state *ms = mml_py_state_of(mod);
  static char *kwlist[] = {"name",    "indices", "data",       "fetcher", "max_bytes",
                           "threads", "block",   "max_pixels", NULL};
  const char *name;
  PyObject *seq, *data = NULL, *fetcher = NULL;
  long long max_bytes = 0, block = 0, max_pixels = 0;
  int threads = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|$OOLiLL:video_decode", kwlist, &name, &seq, &data,
                                   &fetcher, &max_bytes, &threads, &block, &max_pixels))
    return NULL;
  int64_t *idx;
  Py_ssize_t n;
  if (indices_from(seq, &idx, &n)) return NULL;
  if (n > (1 << 20)) {
    PyMem_Free(idx);
    PyErr_SetString(PyExc_ValueError, "video_decode: too many indices");
    return NULL;
  }
  src_args a;
  if (src_from(ms, &a, name, data, fetcher, max_bytes, threads, block, max_pixels)) {
    PyMem_Free(idx);
    return NULL;
  }
  mml_err err = {0};
  mml_video *v = NULL;
  mml_video_info info = {0};
  gather g = {{0}, {0}};
  int64_t bytes_read = 0, decoded = 0, sent = 0;
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_video_open(&a.src, &v, &err);
  if (!st) st = mml_video_probe(v, &info, &err);
  if (!st) st = mml_video_decode(v, idx, (int)n, on_frame, &g, &err);
  bytes_read = mml_video_bytes_read(v);
  decoded = mml_video_frames_decoded(v);
  sent = mml_video_packets_sent(v);
  mml_video_close(v);
  Py_END_ALLOW_THREADS
  src_release(&a);
  PyMem_Free(idx);
  PyObject *r = st ? mml_py_raise(ms, st, &err) : result(&g, &info, bytes_read, decoded, sent);
  mml_bytes_free(&g.pix);
  mml_bytes_free(&g.meta);
  return r;
}

static PyMethodDef video_functions[] = {
    {"video_probe", (PyCFunction)(void (*)(void))py_video_probe, METH_VARARGS | METH_KEYWORDS,
     "video_probe(name, *, data=None, fetcher=None, max_bytes=0, max_pixels=0) -> dict: what the "
     "core's "
     "video probe reports (width, height, rotation, fps, nframes, duration_s, start_s, codec, "
     "container, exact_index, size)."},
    {"video_decode", (PyCFunction)(void (*)(void))py_video_decode, METH_VARARGS | METH_KEYWORDS,
     "video_decode(name, indices, *, data=None, fetcher=None, max_bytes=0, threads=1, block=0, "
     "max_pixels=0) "
     "-> dict(frames, shapes, pts, info, bytes_read, frames_decoded, packets_sent): the RGB24 "
     "frames at the "
     "ascending frame "
     "indices (presentation order), decoded with keyframe seeks."},
    {NULL, NULL, 0, NULL}};

int mml_py_video_exec(PyObject *m) { return PyModule_AddFunctions(m, video_functions); }
