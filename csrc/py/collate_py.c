/*
 * collate_py.c — test hooks into the collation core: M-RoPE positions and a collator driven
 * over a list of given samples (the same fits/add/full/emit loop the engine runs), so that
 * pytest can check batches against transformers and megatron-core.  Not public API: the
 * collator itself is driven by the Loader.
 */
#include "binding.h"

#include <string.h>

#include "mml/collate.h"
#include "mml/mrope.h"
#include "mml/options.h"

/* _mrope_positions(ids, grids, spatial_merge, image_pad_id) -> (bytes, rope_delta)
 * ids: sequence of ints; grids: sequence of (t, h, w).  The bytes hold int64 [3, len(ids)]. */
static PyObject *py_mrope_positions(PyObject *mod, PyObject *args) {
  mml_py_state *ms = mml_py_state_of(mod);
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
    mml_py_raise(ms, st, &err);
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

/* ---- _collate ---------------------------------------------------------------------- */

static int dict_int(PyObject *d, const char *key, long long *out) {
  PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
  if (!v) return 0;
  long long x = PyLong_AsLongLong(v);
  if (x == -1 && PyErr_Occurred()) return -1;
  *out = x;
  return 0;
}

/* Fills cfg from a dict: the option table's collation rows by their Loader names
 * (micro_batch_size, seq_length, packing, pack_length, pad_to_multiple, pad_id,
 * shift_labels, attention_mask, mrope, mm_token_type_ids, keys, text_only_vision,
 * pixel_format), parsed and defaulted by the table as mmloader.Loader's are (None/0 rows:
 * MML_DEFAULT_MICRO_BATCH_SIZE rows, the Qwen <|endoftext|> pad), and the model's numbers a
 * Loader takes from its tokenizer and vision settings under their mml_collate_cfg names. */
static int cfg_from_dict(mml_py_state *ms, PyObject *d, mml_collate_cfg *cfg) {
  struct {
    const char *name;
    long long v;
  } f[] = {{"spatial_merge", 2},
           {"image_pad_id", MML_QWEN_IMAGE_PAD_ID},
           {"vision_start_id", MML_QWEN_VISION_START_ID},
           {"pixel_cols", 1176},
           {"video_pad_id", MML_QWEN_VIDEO_PAD_ID},
           {"second_per_grid", 0},
           {"split_video_frames", 0}};
  enum { NF = (int)(sizeof f / sizeof f[0]) };
  const char *model[NF + 1];
  for (int i = 0; i < NF; i++) {
    model[i] = f[i].name;
    if (dict_int(d, f[i].name, &f[i].v)) return -1;
  }
  model[NF] = NULL;
  mml_loader_cfg lc;
  if (mml_py_set_options(ms, d, &lc, model)) return -1; /* from the table's defaults */
  *cfg = lc.collate;
  cfg->pixel_format = mml_pixels_emitted(lc.pixels); /* the dtype of the rows given */
  if (cfg->micro_batch_size <= 0) cfg->micro_batch_size = MML_DEFAULT_MICRO_BATCH_SIZE;
  if (cfg->pad_id < 0) cfg->pad_id = MML_QWEN_ENDOFTEXT_ID;
  cfg->spatial_merge = (int)f[0].v;
  cfg->image_pad_id = (int32_t)f[1].v;
  cfg->vision_start_id = (int32_t)f[2].v;
  cfg->pixel_cols = (int)f[3].v;
  cfg->video_pad_id = (int32_t)f[4].v;
  cfg->second_per_grid = (int)f[5].v;
  cfg->split_video_frames = (int)f[6].v;
  return 0;
}

static int ids_from_seq(PyObject *obj, mml_ids *out, const char *what) {
  PyObject *seq = PySequence_Fast(obj, what);
  if (!seq) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  for (Py_ssize_t i = 0; i < n; i++) {
    long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
    if ((v == -1 && PyErr_Occurred()) || mml_ids_push(out, (int32_t)v)) {
      if (!PyErr_Occurred()) PyErr_NoMemory();
      Py_DECREF(seq);
      return -1;
    }
  }
  Py_DECREF(seq);
  return 0;
}

/* Fills s from {"input_ids", "labels", optional "grids" [(t, h, w)...], optional
 * "pixel_values" (C-contiguous float32 buffer [rows, cols])}. */
static int sample_from_dict(PyObject *d, int64_t index, mml_sample *s) {
  mml_sample_reset(s);
  s->index = index;
  s->pos = index;
  PyObject *ids = PyDict_GetItemString(d, "input_ids");
  PyObject *labels = PyDict_GetItemString(d, "labels");
  if (!ids || !labels) {
    PyErr_SetString(PyExc_KeyError, "a sample needs input_ids and labels");
    return -1;
  }
  if (ids_from_seq(ids, &s->input_ids, "input_ids must be a sequence of ints") ||
      ids_from_seq(labels, &s->labels, "labels must be a sequence of ints"))
    return -1;
  PyObject *grids = PyDict_GetItemString(d, "grids");
  if (grids) {
    PyObject *seq = PySequence_Fast(grids, "grids must be a sequence of (t, h, w)");
    if (!seq) return -1;
    s->nimages = (int)PySequence_Fast_GET_SIZE(seq);
    for (int i = 0; i < s->nimages; i++)
      if (ids_from_seq(PySequence_Fast_GET_ITEM(seq, i), &s->grids, "grid must be (t, h, w)")) {
        Py_DECREF(seq);
        return -1;
      }
    Py_DECREF(seq);
  }
  PyObject *px = PyDict_GetItemString(d, "pixel_values");
  if (px) {
    Py_buffer view;
    if (PyObject_GetBuffer(px, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_ND) < 0) return -1;
    int ok = view.ndim == 2 && view.itemsize == 4 && view.format && !strcmp(view.format, "f");
    if (!ok) {
      PyBuffer_Release(&view);
      PyErr_SetString(PyExc_TypeError, "pixel_values must be a float32 [rows, cols] array");
      return -1;
    }
    s->pixel_rows = view.shape[0];
    s->pixel_cols = (int)view.shape[1];
    mml_status st = mml_bytes_append(&s->pixels, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    if (st) {
      PyErr_NoMemory();
      return -1;
    }
  }
  return 0;
}

/* Emits c's batch and appends (dict of Tensors, stats dict) to out. */
static int emit_into(mml_py_state *ms, mml_collator *c, PyObject *out) {
  mml_batch b;
  mml_err err = {0};
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_collator_emit(c, &b, &err);
  Py_END_ALLOW_THREADS
  if (st) {
    mml_py_raise(ms, st, &err);
    return -1;
  }
  int nsamples = b.nsamples;
  long long real = (long long)b.real_tokens, slots = (long long)b.token_slots;
  PyObject *d = mml_py_batch_dict(ms, &b); /* clears b */
  PyObject *stats = d ? Py_BuildValue("{s:i,s:L,s:L}", "nsamples", nsamples, "real_tokens", real,
                                      "token_slots", slots)
                      : NULL;
  PyObject *pair = stats ? PyTuple_Pack(2, d, stats) : NULL;
  int rc = !pair || PyList_Append(out, pair);
  Py_XDECREF(pair);
  Py_XDECREF(stats);
  Py_XDECREF(d);
  return rc ? -1 : 0;
}

/* _collate(samples, cfg) -> [(dict name -> Tensor, {"nsamples", "real_tokens",
 * "token_slots"}), ...]: the engine's collation loop over the given samples, the last
 * partial batch flushed. */
static PyObject *py_collate(PyObject *mod, PyObject *args) {
  mml_py_state *ms = mml_py_state_of(mod);
  PyObject *samples, *cfgd;
  if (!PyArg_ParseTuple(args, "OO!", &samples, &PyDict_Type, &cfgd)) return NULL;
  mml_collate_cfg cfg;
  if (cfg_from_dict(ms, cfgd, &cfg)) return NULL;
  PyObject *seq = PySequence_Fast(samples, "samples must be a sequence of dicts");
  if (!seq) return NULL;
  mml_err err = {0};
  mml_pool *pool = NULL;
  mml_collator *c = NULL;
  mml_sample s = {0};
  PyObject *out = NULL;
  mml_status st = mml_pool_new(NULL, 0, &pool, &err);
  if (!st) st = mml_collator_new(&cfg, pool, &c, &err);
  if (st) {
    mml_py_raise(ms, st, &err);
    goto done;
  }
  out = PyList_New(0);
  if (!out) goto done;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
    PyObject *d = PySequence_Fast_GET_ITEM(seq, i);
    if (!PyDict_Check(d)) {
      PyErr_SetString(PyExc_TypeError, "each sample must be a dict");
      goto fail;
    }
    if (sample_from_dict(d, i, &s)) goto fail;
    if (!mml_collator_fits(c, &s) && emit_into(ms, c, out)) goto fail;
    st = mml_collator_add(c, &s, &err);
    if (st) {
      mml_py_raise(ms, st, &err);
      goto fail;
    }
    if (mml_collator_full(c) && emit_into(ms, c, out)) goto fail;
  }
  if (mml_collator_count(c) > 0 && emit_into(ms, c, out)) goto fail;
  goto done;
fail:
  Py_CLEAR(out);
done:
  mml_sample_free(&s);
  mml_collator_free(c);
  if (pool) mml_pool_close(pool);
  Py_DECREF(seq);
  return out;
}

static PyMethodDef collate_functions[] = {
    {"_collate", py_collate, METH_VARARGS,
     "_collate(samples, cfg) -> [(dict of Tensor, stats)]: collate the given samples "
     "(dicts of input_ids, labels, optional grids and float32 pixel_values) in order with "
     "the engine's loop; cfg uses mml_collate_cfg field names (test hook)."},
    {"_mrope_positions", py_mrope_positions, METH_VARARGS,
     "_mrope_positions(ids, grids, spatial_merge, image_pad_id) -> (bytes, rope_delta): "
     "Qwen2-VL M-RoPE position ids as int64 [3, len(ids)] (test hook)."},
    {NULL, NULL, 0, NULL},
};

int mml_py_collate_exec(PyObject *m) { return PyModule_AddFunctions(m, collate_functions); }
