/*
 * template_py.c — test and debugging hooks of the record parser and chat templates:
 *   _core.parse_record(line) -> {"messages": [{"role", "parts": [...]}], "images": [...]}
 *   _core.render_record(line, style, image_tokens) -> str
 *   _core.encode_record(line, tokenizer, style, label_mode, image_tokens) -> (ids, labels)
 *   _core.json_dumps(text) -> str (Python's json.dumps(json.loads(text)), from C)
 * with the option table's enum rows (template, label_mode, image_whitespace) for the names
 * and defaults.  The GIL is released
 * around parsing and encoding; the line's buffer belongs to an immutable str/bytes object
 * we hold a reference to.
 */
#include "binding.h"

#include <stdlib.h>
#include <string.h>

#include "mml/pyjson.h"
#include "mml/record.h"
#include "mml/template.h"

/* The UTF-8 bytes of a str or bytes-like line (borrowed from `obj`). */
static int line_bytes(PyObject *obj, const char **p, Py_ssize_t *n) {
  if (PyUnicode_Check(obj)) {
    *p = PyUnicode_AsUTF8AndSize(obj, n);
    return *p ? 0 : -1;
  }
  if (PyBytes_Check(obj)) {
    char *q;
    if (PyBytes_AsStringAndSize(obj, &q, n)) return -1;
    *p = q;
    return 0;
  }
  PyErr_SetString(PyExc_TypeError, "line must be str or bytes");
  return -1;
}

static int parse_line_opts(mml_py_state *ms, PyObject *line, const mml_record_opts *opts,
                           mml_record *rec) {
  const char *p;
  Py_ssize_t n;
  if (line_bytes(line, &p, &n)) return -1;
  mml_err err = {0};
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_record_parse_opts(p, (size_t)n, opts, rec, &err);
  Py_END_ALLOW_THREADS
  if (st) {
    mml_py_raise(ms, st, &err);
    return -1;
  }
  return 0;
}

static int parse_line(mml_py_state *ms, PyObject *line, mml_record *rec) {
  return parse_line_opts(ms, line, NULL, rec);
}

/* image_tokens: None (record must have no images), an int for every image, or a sequence
 * of one int per image.  Returns a malloc'd array (NULL with no images) or -1. */
static int image_counts(PyObject *obj, const mml_record *rec, int64_t **out) {
  *out = NULL;
  if (rec->nimages == 0) return 0;
  if (obj == Py_None) {
    PyErr_Format(PyExc_ValueError, "the record has %d image(s): pass image_tokens", rec->nimages);
    return -1;
  }
  int64_t *v = malloc(sizeof *v * (size_t)rec->nimages);
  if (!v) {
    PyErr_NoMemory();
    return -1;
  }
  if (PyLong_Check(obj)) {
    long long x = PyLong_AsLongLong(obj);
    if (x == -1 && PyErr_Occurred()) goto fail;
    for (int i = 0; i < rec->nimages; i++) v[i] = x;
  } else {
    PyObject *seq = PySequence_Fast(obj, "image_tokens must be an int or a sequence of ints");
    if (!seq) goto fail;
    if (PySequence_Fast_GET_SIZE(seq) != rec->nimages) {
      PyErr_Format(PyExc_ValueError, "image_tokens has %zd entries but the record has %d images",
                   PySequence_Fast_GET_SIZE(seq), rec->nimages);
      Py_DECREF(seq);
      goto fail;
    }
    for (int i = 0; i < rec->nimages; i++) {
      v[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
      if (v[i] == -1 && PyErr_Occurred()) {
        Py_DECREF(seq);
        goto fail;
      }
    }
    Py_DECREF(seq);
  }
  *out = v;
  return 0;
fail:
  free(v);
  return -1;
}

static PyObject *py_parse_record(PyObject *mod, PyObject *args, PyObject *kw) {
  mml_py_state *ms = mml_py_state_of(mod);
  static char *kwlist[] = {"line", "max_images_per_sample", "max_json_depth", NULL};
  PyObject *line;
  mml_record_opts opts = {0};
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|ii:parse_record", kwlist, &line, &opts.max_images,
                                   &opts.max_json_depth))
    return NULL;
  mml_record rec = {0};
  if (parse_line_opts(ms, line, &opts, &rec)) {
    mml_record_free(&rec);
    return NULL;
  }
  PyObject *msgs = PyList_New(rec.nmessages), *imgs = PyList_New(rec.nimages), *res = NULL;
  PyObject *vids = PyList_New(rec.nvideos);
  if (!msgs || !imgs || !vids) goto done;
  for (int i = 0; i < rec.nvideos; i++) {
    PyObject *d = mml_py_video_dict(&rec.videos[i]);
    if (!d) goto done;
    PyList_SET_ITEM(vids, i, d);
  }
  for (int i = 0; i < rec.nimages; i++) {
    PyObject *s = PyUnicode_FromString(rec.images[i]);
    if (!s) goto done;
    PyList_SET_ITEM(imgs, i, s);
  }
  for (int i = 0; i < rec.nmessages; i++) {
    const mml_message *m = &rec.messages[i];
    PyObject *parts = PyList_New(m->nparts);
    if (!parts) goto done;
    for (int k = 0; k < m->nparts; k++) {
      const mml_part *p = &m->parts[k];
      PyObject *d =
          p->kind == MML_PART_TEXT
              ? Py_BuildValue("{s:s,s:s#}", "type", "text", "text", p->text, (Py_ssize_t)p->len)
              : Py_BuildValue("{s:s,s:i}", "type", p->kind == MML_PART_VIDEO ? "video" : "image",
                              p->kind == MML_PART_VIDEO ? "video" : "image", p->image);
      if (!d) {
        Py_DECREF(parts);
        goto done;
      }
      PyList_SET_ITEM(parts, k, d);
    }
    PyObject *md = Py_BuildValue("{s:s,s:N}", "role", m->role_name, "parts", parts);
    if (!md) goto done;
    PyList_SET_ITEM(msgs, i, md);
  }
  res = Py_BuildValue("{s:O,s:O,s:O}", "messages", msgs, "images", imgs, "videos", vids);
done:
  Py_XDECREF(msgs);
  Py_XDECREF(imgs);
  Py_XDECREF(vids);
  mml_record_free(&rec);
  return res;
}

static PyObject *py_render_record(PyObject *mod, PyObject *args, PyObject *kw) {
  mml_py_state *ms = mml_py_state_of(mod);
  static char *kwlist[] = {"line",         "style", "image_tokens", "image_whitespace",
                           "video_tokens", NULL};
  PyObject *line, *counts = Py_None, *vcounts = Py_None;
  const char *style_s = NULL, *space_s = NULL; /* NULL: the option table's default */
  int style, space;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|zOzO:render_record", kwlist, &line, &style_s,
                                   &counts, &space_s, &vcounts))
    return NULL;
  if (mml_py_table_enum(ms, "template", style_s, &style) ||
      mml_py_table_enum(ms, "image_whitespace", space_s, &space))
    return NULL;
  mml_record rec = {0};
  mml_template *t = NULL;
  int64_t *n = NULL;
  mml_bytes out = {0};
  mml_err err = {0};
  PyObject *res = NULL;
  mml_py_video_tokens vt = {0};
  if (parse_line(ms, line, &rec) || image_counts(counts, &rec, &n) ||
      mml_py_video_tokens_get(vcounts, rec.nvideos, &vt))
    goto done;
  mml_status st =
      mml_template_new((mml_template_style)style, MML_LABELS_ALL_ASSISTANT, NULL, &t, &err);
  if (!st) st = mml_template_set_image_space(t, (mml_image_space)space, &err);
  if (!st) {
    Py_BEGIN_ALLOW_THREADS
    st = mml_template_render_media(t, &rec, n, vt.v, &out, &err);
    Py_END_ALLOW_THREADS
  }
  if (st) {
    mml_py_raise(ms, st, &err);
    goto done;
  }
  res = PyUnicode_DecodeUTF8((const char *)out.data, (Py_ssize_t)out.len, "strict");
done:
  mml_py_video_tokens_free(&vt);
  mml_bytes_free(&out);
  mml_template_free(t);
  free(n);
  mml_record_free(&rec);
  return res;
}

static PyObject *ids_list(const mml_ids *v) {
  PyObject *l = PyList_New((Py_ssize_t)v->len);
  if (!l) return NULL;
  for (size_t i = 0; i < v->len; i++) {
    PyObject *x = PyLong_FromLong(v->data[i]);
    if (!x) {
      Py_DECREF(l);
      return NULL;
    }
    PyList_SET_ITEM(l, (Py_ssize_t)i, x);
  }
  return l;
}

static PyObject *py_encode_record(PyObject *mod, PyObject *args, PyObject *kw) {
  mml_py_state *ms = mml_py_state_of(mod);
  static char *kwlist[] = {"line",         "tokenizer",        "style",        "label_mode",
                           "image_tokens", "image_whitespace", "video_tokens", NULL};
  PyObject *line, *tok_obj, *counts = Py_None, *vcounts = Py_None;
  const char *style_s = NULL, *mode_s = NULL, *space_s = NULL; /* NULL: the table's default */
  int style, mode, space;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|zzOzO:encode_record", kwlist, &line, &tok_obj,
                                   &style_s, &mode_s, &counts, &space_s, &vcounts))
    return NULL;
  if (mml_py_table_enum(ms, "template", style_s, &style) ||
      mml_py_table_enum(ms, "label_mode", mode_s, &mode) ||
      mml_py_table_enum(ms, "image_whitespace", space_s, &space))
    return NULL;
  const struct mml_tokenizer *tok = mml_py_tokenizer_get(ms, tok_obj);
  if (!tok) return NULL;
  mml_record rec = {0};
  mml_template *t = NULL;
  int64_t *n = NULL;
  mml_ids ids = {0}, labels = {0};
  mml_err err = {0};
  PyObject *res = NULL;
  mml_py_video_tokens vt = {0};
  if (parse_line(ms, line, &rec) || image_counts(counts, &rec, &n) ||
      mml_py_video_tokens_get(vcounts, rec.nvideos, &vt))
    goto done;
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_template_new((mml_template_style)style, (mml_label_mode)mode, tok, &t, &err);
  if (!st) st = mml_template_set_image_space(t, (mml_image_space)space, &err);
  if (!st) st = mml_template_encode_media(t, NULL, &rec, n, vt.v, &ids, &labels, &err);
  Py_END_ALLOW_THREADS
  if (st) {
    mml_py_raise(ms, st, &err);
    goto done;
  }
  PyObject *a = ids_list(&ids), *b = a ? ids_list(&labels) : NULL;
  if (a && b) res = PyTuple_Pack(2, a, b);
  Py_XDECREF(a);
  Py_XDECREF(b);
done:
  mml_py_video_tokens_free(&vt);
  mml_ids_free(&ids);
  mml_ids_free(&labels);
  mml_template_free(t);
  free(n);
  mml_record_free(&rec);
  return res;
}

static PyObject *py_json_dumps(PyObject *mod, PyObject *args) {
  mml_py_state *ms = mml_py_state_of(mod);
  const char *p;
  Py_ssize_t n;
  PyObject *text;
  if (!PyArg_ParseTuple(args, "O:json_dumps", &text) || line_bytes(text, &p, &n)) return NULL;
  mml_bytes out = {0};
  mml_err err = {0};
  mml_status st = mml_pyjson_dumps((mml_span){p, (size_t)n}, &out, &err);
  PyObject *res = st ? (mml_py_raise(ms, st, &err), NULL)
                     : PyUnicode_DecodeUTF8((const char *)out.data, (Py_ssize_t)out.len, "strict");
  mml_bytes_free(&out);
  return res;
}

static PyMethodDef template_functions[] = {
    {"json_dumps", (PyCFunction)py_json_dumps, METH_VARARGS,
     "json_dumps(text) -> str: json.dumps(json.loads(text), ensure_ascii=False) as the C core "
     "writes it for prompts (tools, function calls); for tests."},
    {"parse_record", (PyCFunction)(void (*)(void))py_parse_record, METH_VARARGS | METH_KEYWORDS,
     "parse_record(line, max_images_per_sample=256, max_json_depth=64) -> dict: the neutral "
     "conversation of one JSONL record."},
    {"render_record", (PyCFunction)(void (*)(void))py_render_record, METH_VARARGS | METH_KEYWORDS,
     "render_record(line, style='qwen2-vl', image_tokens=None, image_whitespace='in_place', "
     "video_tokens=None) -> str: the chat template's text with image and video pads expanded "
     "(video_tokens: one (grid_t, tokens_per_temporal_patch[, timestamps]) per video)."},
    {"encode_record", (PyCFunction)(void (*)(void))py_encode_record, METH_VARARGS | METH_KEYWORDS,
     "encode_record(line, tokenizer, style='qwen2-vl', label_mode='all_assistant', "
     "image_tokens=None, image_whitespace='in_place', video_tokens=None) -> (ids, labels)."},
    {NULL, NULL, 0, NULL}};

int mml_py_template_exec(PyObject *m) { return PyModule_AddFunctions(m, template_functions); }
