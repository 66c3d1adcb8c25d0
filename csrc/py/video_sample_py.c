/*
 * video_sample_py.c — test hooks of the video planning (mml/video_sample.h), fed from a record
 * line so the record parser's reading of the qwen-vl-utils keys is exercised too:
 *   _core.video_sample(line, total_frames, fps) -> dict(first, last, count, n, sample_fps,
 *       indices) for the record's first video
 *   _core.video_frame_size(line, factor, nframes, height, width) -> (h, w)
 *   _core.video_list_frame_size(line, factor, height, width) -> (h, w)
 *   _core.video_timestamps(indices, fps, temporal_patch_size) -> [seconds per patch]
 *   _core.resize_aa_bicubic(buf, planes, w, h, out_w, out_h) -> bytes: float32 planes,
 *       torch's antialiased bicubic (mml/video_resize.h)
 *   _core.resize_aa_bicubic_u8(buf, planes, w, h, out_w, out_h) -> bytes: uint8 planes,
 *       torch's native uint8 antialiased bicubic (mml/video_resize.h)
 * and the helpers template_py.c uses (binding.h).
 */
#include "binding.h"

#include <stdlib.h>

#include "mml/record.h"
#include "mml/template.h"
#include "mml/video_resize.h"
#include "mml/video_sample.h"

PyObject *mml_py_video_dict(const mml_video_ref *v) {
  PyObject *src;
  if (v->ref) {
    src = PyUnicode_FromString(v->ref);
  } else {
    src = PyList_New(v->nframes);
    for (int j = 0; src && j < v->nframes; j++) {
      PyObject *s = PyUnicode_FromString(v->frames[j]);
      if (!s)
        Py_CLEAR(src);
      else
        PyList_SET_ITEM(src, j, s);
    }
  }
  if (!src) return NULL;
  const mml_video_keys *k = &v->keys;
  PyObject *d = Py_BuildValue(
      "{s:N,s:d,s:L,s:L,s:L,s:O,s:O,s:L,s:L,s:d,s:L,s:L,s:d,s:d}", "video", src, "fps", k->fps,
      "nframes", (long long)k->nframes, "min_frames", (long long)k->min_frames, "max_frames",
      (long long)k->max_frames, "video_start",
      k->has_start ? PyFloat_FromDouble(k->video_start) : Py_NewRef(Py_None), "video_end",
      k->has_end ? PyFloat_FromDouble(k->video_end) : Py_NewRef(Py_None), "min_pixels",
      (long long)k->min_pixels, "max_pixels", (long long)k->max_pixels, "total_pixels",
      k->total_pixels, "resized_height", (long long)k->resized_height, "resized_width",
      (long long)k->resized_width, "sample_fps", k->sample_fps, "raw_fps", k->raw_fps);
  return d;
}

void mml_py_video_tokens_free(mml_py_video_tokens *t) {
  free(t->v);
  free(t->ts);
  t->v = NULL;
  t->ts = NULL;
}

int mml_py_video_tokens_get(PyObject *obj, int nvideos, mml_py_video_tokens *out) {
  out->v = NULL;
  out->ts = NULL;
  if (nvideos == 0) return 0;
  if (obj == Py_None) {
    PyErr_Format(PyExc_ValueError, "the record has %d video(s): pass video_tokens", nvideos);
    return -1;
  }
  PyObject *seq = PySequence_Fast(obj, "video_tokens must be a sequence");
  if (!seq) return -1;
  if (PySequence_Fast_GET_SIZE(seq) != nvideos) {
    PyErr_Format(PyExc_ValueError, "video_tokens has %zd entries but the record has %d videos",
                 PySequence_Fast_GET_SIZE(seq), nvideos);
    Py_DECREF(seq);
    return -1;
  }
  out->v = calloc((size_t)nvideos, sizeof *out->v);
  size_t nts = 0;
  for (int i = 0; i < nvideos; i++) {
    PyObject *e = PySequence_Fast_GET_ITEM(seq, i);
    long long g, n;
    PyObject *ts = Py_None;
    if (!out->v || !PyArg_ParseTuple(e, "LL|O:video_tokens", &g, &n, &ts)) goto fail;
    out->v[i].groups = g;
    out->v[i].group_tokens = n;
    if (ts != Py_None) nts += (size_t)(g > 0 ? g : 0);
  }
  out->ts = malloc((nts ? nts : 1) * sizeof *out->ts);
  if (!out->ts) goto fail;
  double *p = out->ts;
  for (int i = 0; i < nvideos; i++) {
    PyObject *e = PySequence_Fast_GET_ITEM(seq, i);
    if (PyTuple_GET_SIZE(e) < 3 || PyTuple_GET_ITEM(e, 2) == Py_None) continue;
    PyObject *ts = PySequence_Fast(PyTuple_GET_ITEM(e, 2), "timestamps must be a sequence");
    if (!ts) goto fail;
    if (PySequence_Fast_GET_SIZE(ts) != out->v[i].groups) {
      PyErr_Format(PyExc_ValueError, "video %d: %zd timestamps for %lld temporal patches", i,
                   PySequence_Fast_GET_SIZE(ts), (long long)out->v[i].groups);
      Py_DECREF(ts);
      goto fail;
    }
    out->v[i].timestamps = p;
    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(ts); j++) {
      *p++ = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(ts, j));
    }
    Py_DECREF(ts);
    if (PyErr_Occurred()) goto fail;
  }
  Py_DECREF(seq);
  return 0;
fail:
  if (!PyErr_Occurred()) PyErr_NoMemory();
  Py_DECREF(seq);
  mml_py_video_tokens_free(out);
  return -1;
}

/* The first video of a record line (rec is parsed into; the caller frees it). */
static const mml_video_ref *first_video(mml_py_state *ms, const char *line, Py_ssize_t n,
                                        mml_record *rec) {
  mml_err err = {0};
  mml_status st = mml_record_parse(line, (size_t)n, rec, &err);
  if (st) {
    mml_py_raise(ms, st, &err);
    return NULL;
  }
  if (rec->nvideos < 1) {
    PyErr_SetString(PyExc_ValueError, "the record has no video");
    return NULL;
  }
  return &rec->videos[0];
}

static PyObject *py_video_sample(PyObject *mod, PyObject *args) {
  mml_py_state *ms = mml_py_state_of(mod);
  const char *line;
  Py_ssize_t n;
  long long total;
  double fps;
  if (!PyArg_ParseTuple(args, "s#Ld:video_sample", &line, &n, &total, &fps)) return NULL;
  mml_record rec = {0};
  PyObject *res = NULL;
  const mml_video_ref *v = first_video(ms, line, n, &rec);
  if (v) {
    mml_video_sampling s;
    mml_err err = {0};
    mml_status st = mml_video_sample(&v->keys, total, fps, &s, &err);
    if (st) {
      mml_py_raise(ms, st, &err);
    } else {
      int64_t *idx = malloc((size_t)s.n * sizeof *idx);
      PyObject *l = idx ? PyList_New((Py_ssize_t)s.n) : NULL;
      if (l) {
        mml_video_indices(&s, idx);
        for (int64_t i = 0; i < s.n; i++) PyList_SET_ITEM(l, i, PyLong_FromLongLong(idx[i]));
        res = Py_BuildValue("{s:L,s:L,s:L,s:L,s:d,s:N}", "first", (long long)s.first, "last",
                            (long long)s.last, "count", (long long)s.count, "n", (long long)s.n,
                            "sample_fps", s.sample_fps, "indices", l);
      } else if (!PyErr_Occurred()) {
        PyErr_NoMemory();
      }
      free(idx);
    }
  }
  mml_record_free(&rec);
  return res;
}

static PyObject *py_video_frame_size(PyObject *mod, PyObject *args) {
  mml_py_state *ms = mml_py_state_of(mod);
  const char *line;
  Py_ssize_t n;
  int factor, h, w;
  long long nframes;
  if (!PyArg_ParseTuple(args, "s#iLii:video_frame_size", &line, &n, &factor, &nframes, &h, &w))
    return NULL;
  mml_record rec = {0};
  PyObject *res = NULL;
  const mml_video_ref *v = first_video(ms, line, n, &rec);
  if (v) {
    mml_err err = {0};
    int oh, ow;
    mml_status st = mml_video_frame_size(&v->keys, factor, nframes, h, w, &oh, &ow, &err);
    res = st ? (mml_py_raise(ms, st, &err), NULL) : Py_BuildValue("(ii)", oh, ow);
  }
  mml_record_free(&rec);
  return res;
}

static PyObject *py_video_list_frame_size(PyObject *mod, PyObject *args) {
  mml_py_state *ms = mml_py_state_of(mod);
  const char *line;
  Py_ssize_t n;
  int factor, h, w;
  if (!PyArg_ParseTuple(args, "s#iii:video_list_frame_size", &line, &n, &factor, &h, &w))
    return NULL;
  mml_record rec = {0};
  PyObject *res = NULL;
  const mml_video_ref *v = first_video(ms, line, n, &rec);
  if (v) {
    mml_err err = {0};
    int oh, ow;
    mml_status st = mml_video_list_frame_size(&v->keys, factor, h, w, &oh, &ow, &err);
    res = st ? (mml_py_raise(ms, st, &err), NULL) : Py_BuildValue("(ii)", oh, ow);
  }
  mml_record_free(&rec);
  return res;
}

static PyObject *py_video_timestamps(PyObject *mod, PyObject *args) {
  PyObject *obj;
  double fps;
  int t;
  if (!PyArg_ParseTuple(args, "Odi:video_timestamps", &obj, &fps, &t)) return NULL;
  if (t < 1) {
    PyErr_SetString(PyExc_ValueError, "temporal_patch_size must be >= 1");
    return NULL;
  }
  PyObject *seq = PySequence_Fast(obj, "indices must be a sequence");
  if (!seq) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  int64_t *idx = malloc((size_t)(n ? n : 1) * sizeof *idx);
  double *ts = malloc((size_t)(n ? n : 1) * sizeof *ts);
  PyObject *res = NULL;
  if (idx && ts) {
    for (Py_ssize_t i = 0; i < n; i++) idx[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    if (!PyErr_Occurred()) {
      mml_video_timestamps(idx, n, fps, t, ts);
      Py_ssize_t g = (n + t - 1) / t;
      res = PyList_New(g);
      for (Py_ssize_t i = 0; res && i < g; i++) PyList_SET_ITEM(res, i, PyFloat_FromDouble(ts[i]));
    }
  } else {
    PyErr_NoMemory();
  }
  free(idx);
  free(ts);
  Py_DECREF(seq);
  return res;
}

static PyObject *py_resize_aa_bicubic(PyObject *mod, PyObject *args) {
  mml_py_state *ms = mml_py_state_of(mod);
  Py_buffer b;
  int planes, w, h, ow, oh, round = 0;
  if (!PyArg_ParseTuple(args, "y*iiiii|p:resize_aa_bicubic", &b, &planes, &w, &h, &ow, &oh, &round))
    return NULL;
  PyObject *res = NULL;
  if (planes < 1 || w < 1 || h < 1 || ow < 1 || oh < 1 ||
      (size_t)b.len != (size_t)planes * w * h * sizeof(float)) {
    PyErr_SetString(PyExc_ValueError, "buffer size does not match planes * w * h float32");
  } else if ((res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)planes * ow * oh * 4))) {
    mml_err err = {0};
    mml_status st;
    float *dst = (float *)PyBytes_AS_STRING(res);
    Py_BEGIN_ALLOW_THREADS
    st = round ? mml_resize_aa_bicubic_f32_u8(b.buf, planes, w, h, dst, ow, oh, &err)
               : mml_resize_aa_bicubic_f32(b.buf, planes, w, h, dst, ow, oh, &err);
    Py_END_ALLOW_THREADS
    if (st) {
      Py_CLEAR(res);
      mml_py_raise(ms, st, &err);
    }
  }
  PyBuffer_Release(&b);
  return res;
}

static PyObject *py_resize_aa_bicubic_u8(PyObject *mod, PyObject *args) {
  mml_py_state *ms = mml_py_state_of(mod);
  Py_buffer b;
  int planes, w, h, ow, oh;
  if (!PyArg_ParseTuple(args, "y*iiiii:resize_aa_bicubic_u8", &b, &planes, &w, &h, &ow, &oh))
    return NULL;
  PyObject *res = NULL;
  if (planes < 1 || w < 1 || h < 1 || ow < 1 || oh < 1 || (size_t)b.len != (size_t)planes * w * h) {
    PyErr_SetString(PyExc_ValueError, "buffer size does not match planes * w * h bytes");
  } else if ((res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)planes * ow * oh))) {
    mml_err err = {0};
    mml_status st;
    uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(res);
    Py_BEGIN_ALLOW_THREADS
    st = mml_resize_aa_bicubic_u8(b.buf, planes, w, h, dst, ow, oh, &err);
    Py_END_ALLOW_THREADS
    if (st) {
      Py_CLEAR(res);
      mml_py_raise(ms, st, &err);
    }
  }
  PyBuffer_Release(&b);
  return res;
}

static PyMethodDef video_sample_functions[] = {
    {"resize_aa_bicubic_u8", py_resize_aa_bicubic_u8, METH_VARARGS,
     "resize_aa_bicubic_u8(buf, planes, w, h, out_w, out_h) -> bytes: uint8 planes resized as "
     "torch.nn.functional.interpolate(mode='bicubic', antialias=True) resizes uint8 tensors."},
    {"resize_aa_bicubic", py_resize_aa_bicubic, METH_VARARGS,
     "resize_aa_bicubic(buf, planes, w, h, out_w, out_h, round=False) -> bytes: float32 planes "
     "resized as torch.nn.functional.interpolate(mode='bicubic', antialias=True) does (round: "
     "then clamped to [0, 255] and rounded half to even)."},
    {"video_sample", py_video_sample, METH_VARARGS,
     "video_sample(line, total_frames, fps) -> dict: qwen-vl-utils' frame range, frame count, "
     "sample fps and frame indices for the record's first video."},
    {"video_frame_size", py_video_frame_size, METH_VARARGS,
     "video_frame_size(line, factor, nframes, height, width) -> (h, w): qwen-vl-utils' "
     "fetch_video size for the record's first video."},
    {"video_list_frame_size", py_video_list_frame_size, METH_VARARGS,
     "video_list_frame_size(line, factor, height, width) -> (h, w): the size fetch_image gives "
     "one frame of a frame list (factor 2 * patch * merge)."},
    {"video_timestamps", py_video_timestamps, METH_VARARGS,
     "video_timestamps(indices, fps, temporal_patch_size) -> list: Qwen3-VL's seconds per "
     "temporal patch."},
    {NULL, NULL, 0, NULL}};

int mml_py_video_sample_exec(PyObject *m) {
  return PyModule_AddFunctions(m, video_sample_functions);
}
