/*
 * options_py.c — the loader's option table (mml/options.h) on the Python side: the
 * configuration dict mmloader.Loader builds becomes an mml_loader_cfg by the table (every
 * key must be an option, every value fit its row), the table itself is exported as
 * _core.loader_options(), and a built loader's options read back as a dict (its resume
 * fingerprint comes from those values).  Messages name the option and, except for
 * credentials, the value.  Three keys are structured and parsed here beside the table:
 * data (the shard list), sources (a mixture's resolved sources) and vision (the preset's
 * vision settings, vision_py.c).
 */
#include <string.h>

#include "binding.h"
#include "mml/options.h"

static int config_error(mml_py_state *ms, const mml_err *err) {
  PyErr_SetString(ms->ConfigError, err->msg);
  return -1;
}

static int type_error(mml_py_state *ms, const mml_option *o, PyObject *v, const char *want) {
  if (o->flags & MML_OPT_SECRET)
    PyErr_Format(ms->ConfigError, "%s must be %s", o->name, want);
  else
    PyErr_Format(ms->ConfigError, "%s must be %s, got %R", o->name, want, v);
  return -1;
}

/* One option from a Python value.  0, or -1 with ConfigError set. */
static int set_option(mml_py_state *ms, mml_loader_cfg *c, const mml_option *o, PyObject *v) {
  mml_err err;
  mml_err_clear(&err);
  mml_status st = MML_OK;
  if (v == Py_None) {
    if (o->flags & MML_OPT_NONE) return 0; /* the default: off / automatic */
    return type_error(ms, o, v, o->type == MML_OPT_STR ? "a string" : "given (not None)");
  }
  switch (o->type) {
    case MML_OPT_BOOL:
    case MML_OPT_INT: {
      if (o->type == MML_OPT_BOOL && !PyBool_Check(v) && !PyLong_Check(v))
        return type_error(ms, o, v, "True or False"); /* an int must be 0 or 1 */
      if (o->type == MML_OPT_INT && (PyBool_Check(v) || !PyIndex_Check(v)))
        return type_error(ms, o, v, "an integer");
      int overflow = 0;
      PyObject *i = PyNumber_Index(v);
      if (!i) return -1;
      long long x = PyLong_AsLongLongAndOverflow(i, &overflow);
      Py_DECREF(i);
      if (x == -1 && PyErr_Occurred()) return -1;
      if (overflow) return type_error(ms, o, v, "an integer that fits 64 bits");
      st = mml_option_set_int(c, o, x, &err);
      break;
    }
    case MML_OPT_FLOAT: {
      if (PyBool_Check(v) || !(PyFloat_Check(v) || PyLong_Check(v)))
        return type_error(ms, o, v, "a number");
      double x = PyFloat_AsDouble(v);
      if (x == -1 && PyErr_Occurred()) return -1;
      st = mml_option_set_float(c, o, x, &err);
      break;
    }
    case MML_OPT_STR:
    case MML_OPT_ENUM: {
      if (!PyUnicode_Check(v)) return type_error(ms, o, v, "a string");
      const char *s = PyUnicode_AsUTF8(v);
      if (!s) return -1;
      st = o->type == MML_OPT_STR ? mml_option_set_str(c, o, s, &err)
                                  : mml_option_set_enum(c, o, s, &err);
      break;
    }
  }
  return st ? config_error(ms, &err) : 0;
}

/* Every key of d except those in `skip` must be an option; each is set. */
static int set_options(mml_py_state *ms, PyObject *d, mml_loader_cfg *c, const char *const *skip) {
  PyObject *k, *v;
  Py_ssize_t pos = 0;
  while (PyDict_Next(d, &pos, &k, &v)) {
    if (!PyUnicode_Check(k)) {
      PyErr_Format(ms->ConfigError, "option names must be strings, got %R", k);
      return -1;
    }
    const char *name = PyUnicode_AsUTF8(k);
    if (!name) return -1;
    int skipped = 0;
    for (int i = 0; skip && skip[i] && !skipped; i++) skipped = !strcmp(skip[i], name);
    if (skipped) continue;
    const mml_option *o = mml_loader_option(name);
    if (o && o->flags & MML_OPT_PYTHON) {
      PyErr_Format(ms->ConfigError,
                   "%s is a keyword of mmloader.Loader (resolved in Python), not an engine "
                   "option",
                   name);
      return -1;
    }
    if (!o) {
      PyErr_Format(ms->ConfigError,
                   "unknown Loader option %R (see "
                   "mmloader._core.loader_options())",
                   k);
      return -1;
    }
    if (set_option(ms, c, o, v)) return -1;
  }
  return 0;
}

int mml_py_set_options(mml_py_state *ms, PyObject *d, mml_loader_cfg *c, const char *const *skip) {
  mml_loader_cfg_defaults(c);
  return set_options(ms, d, c, skip);
}

int mml_py_table_enum(mml_py_state *ms, const char *option, const char *name, int *out) {
  const mml_option *o = mml_loader_option(option);
  mml_loader_cfg tmp;
  mml_loader_cfg_defaults(&tmp);
  mml_err err;
  mml_err_clear(&err);
  if (name && mml_option_set_enum(&tmp, o, name, &err)) return config_error(ms, &err);
  *out = (int)mml_option_get_int(&tmp, o);
  return 0;
}

/* ---- the structured keys: data, sources (a mixture), vision ---------------------------- */

static int source_enum(mml_py_state *ms, const char *option, const char *name, int *out);

static int get_obj(PyObject *d, const char *k, PyObject **out) {
  *out = PyDict_GetItemString(d, k); /* borrowed; NULL when absent */
  return 0;
}
static int get_ll(mml_py_state *ms, PyObject *d, const char *k, long long def, long long *out) {
  PyObject *v;
  get_obj(d, k, &v);
  if (!v || v == Py_None) {
    *out = def;
    return 0;
  }
  *out = PyLong_AsLongLong(v);
  if (*out == -1 && PyErr_Occurred()) {
    PyErr_Format(ms->ConfigError, "%s must be an integer", k);
    return -1;
  }
  return 0;
}
static int get_double(mml_py_state *ms, PyObject *d, const char *k, double def, double *out) {
  PyObject *v;
  get_obj(d, k, &v);
  if (!v || v == Py_None) {
    *out = def;
    return 0;
  }
  *out = PyFloat_AsDouble(v);
  if (*out == -1 && PyErr_Occurred()) {
    PyErr_Format(ms->ConfigError, "%s must be a number", k);
    return -1;
  }
  return 0;
}
static int get_str(mml_py_state *ms, PyObject *d, const char *k, const char **out) {
  PyObject *v;
  get_obj(d, k, &v);
  *out = NULL;
  if (!v || v == Py_None) return 0;
  if (!PyUnicode_Check(v)) {
    PyErr_Format(ms->ConfigError, "%s must be a string", k);
    return -1;
  }
  *out = PyUnicode_AsUTF8(v);
  return *out ? 0 : -1;
}

/* Borrowed strings of a list (the list outlives the engine's construction). */
static int str_list(mml_py_state *ms, PyObject *list, const char *what, const char ***out, int *n) {
  if (!list || !PyList_Check(list) || PyList_GET_SIZE(list) == 0) {
    PyErr_Format(ms->ConfigError, "%s must be a non-empty list of paths or URLs", what);
    return -1;
  }
  Py_ssize_t k = PyList_GET_SIZE(list);
  *out = PyMem_Calloc((size_t)k, sizeof **out);
  if (!*out) {
    PyErr_NoMemory();
    return -1;
  }
  *n = (int)k;
  for (Py_ssize_t i = 0; i < k; i++) {
    PyObject *s = PyList_GET_ITEM(list, i);
    if (!PyUnicode_Check(s)) {
      PyErr_Format(ms->ConfigError, "%s entries must be strings", what);
      return -1;
    }
    if (!((*out)[i] = PyUnicode_AsUTF8(s))) return -1;
  }
  return 0;
}

void mml_py_cfg_mem_free(mml_py_cfg_mem *m) {
  PyMem_Free(m->data);
  for (int i = 0; m->sources && i < m->nsources; i++) PyMem_Free((void *)m->sources[i].data);
  PyMem_Free(m->sources);
  memset(m, 0, sizeof *m);
}

/* "sources": a list of dicts (resolved by mmloader/loader.py: every setting filled). */
static int parse_sources(mml_py_state *ms, PyObject *list, mml_loader_cfg *c, mml_py_cfg_mem *m) {
  if (!PyList_Check(list) || PyList_GET_SIZE(list) == 0) {
    PyErr_SetString(ms->ConfigError, "sources must be a non-empty list");
    return -1;
  }
  Py_ssize_t n = PyList_GET_SIZE(list);
  m->sources = PyMem_Calloc((size_t)n, sizeof *m->sources);
  if (!m->sources) {
    PyErr_NoMemory();
    return -1;
  }
  m->nsources = (int)n;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *d = PyList_GET_ITEM(list, i), *data, *vision;
    mml_source_cfg *s = &m->sources[i];
    const char *labels, *space, *recipe;
    long long choose, maxlen, cutoff, mask, prompt, think, imax, imin, vlen, vmax, vmin, mml_len,
        vminf, vmaxf;
    double vfps;
    int e;
    if (!PyDict_Check(d)) {
      PyErr_SetString(ms->ConfigError, "sources entries must be dicts");
      return -1;
    }
    data = PyDict_GetItemString(d, "data");
    vision = PyDict_GetItemString(d, "vision");
    if (get_str(ms, d, "name", &s->name) ||
        str_list(ms, data, "a source's data", (const char ***)&s->data, &s->ndata) ||
        get_double(ms, d, "weight", -1, &s->weight) ||
        get_double(ms, d, "repeat", -1, &s->repeat) || get_ll(ms, d, "choose", -1, &choose) ||
        get_str(ms, d, "image_root", &s->image_root) || get_str(ms, d, "columns", &s->columns) ||
        get_str(ms, d, "system_prompt", &s->system_prompt) ||
        get_str(ms, d, "label_mode", &labels) || get_str(ms, d, "image_whitespace", &space) ||
        get_ll(ms, d, "max_length", 0, &maxlen) || get_str(ms, d, "recipe", &recipe) ||
        get_ll(ms, d, "cutoff_len", 0, &cutoff) || get_ll(ms, d, "mask_history", 0, &mask) ||
        get_ll(ms, d, "train_on_prompt", 0, &prompt) ||
        get_ll(ms, d, "enable_thinking", 0, &think) ||
        get_ll(ms, d, "image_max_pixels", 0, &imax) ||
        get_ll(ms, d, "image_min_pixels", 0, &imin) || get_double(ms, d, "video_fps", 0, &vfps) ||
        get_ll(ms, d, "video_maxlen", 0, &vlen) || get_ll(ms, d, "video_max_pixels", 0, &vmax) ||
        get_ll(ms, d, "video_min_pixels", 0, &vmin) ||
        get_ll(ms, d, "model_max_length", 0, &mml_len) ||
        get_ll(ms, d, "video_min_frames", 0, &vminf) ||
        get_ll(ms, d, "video_max_frames", 0, &vmaxf))
      return -1;
    if (!vision || !PyDict_Check(vision)) {
      PyErr_SetString(ms->ConfigError, "a source's vision must be a dict");
      return -1;
    }
    if (mml_py_vision_cfg_from_dict(ms, vision, &s->vision)) return -1;
    s->choose = choose;
    s->max_length = maxlen;
    if (source_enum(ms, "label_mode", labels, &e)) return -1;
    s->label_mode = (mml_label_mode)e;
    if (source_enum(ms, "image_whitespace", space, &e)) return -1;
    s->image_space = (mml_image_space)e;
    if (source_enum(ms, "recipe", recipe, &e)) return -1;
    s->recipe = e;
    s->lf = (mml_lf_opts){.cutoff_len = cutoff,
                          .mask_history = mask != 0,
                          .train_on_prompt = prompt != 0,
                          .enable_thinking = think != 0,
                          .image_max_pixels = imax,
                          .image_min_pixels = imin,
                          .video_fps = vfps,
                          .video_maxlen = vlen,
                          .video_max_pixels = vmax,
                          .video_min_pixels = vmin};
    s->qft = (mml_qft_opts){
        .model_max_length = mml_len, .video_min_frames = vminf, .video_max_frames = vmaxf};
  }
  c->sources = m->sources;
  c->nsources = m->nsources;
  return 0;
}

/* A source's value of an enum option, by the table's names (NULL: the default). */
static int source_enum(mml_py_state *ms, const char *option, const char *name, int *out) {
  const mml_option *o = mml_loader_option(option);
  mml_loader_cfg tmp;
  mml_loader_cfg_defaults(&tmp);
  mml_err err;
  mml_err_clear(&err);
  if (name && mml_option_set_enum(&tmp, o, name, &err)) {
    PyErr_Format(ms->ConfigError, "a source's %s", err.msg);
    return -1;
  }
  *out = (int)mml_option_get_int(&tmp, o);
  return 0;
}

int mml_py_loader_cfg_from_dict(mml_py_state *ms, PyObject *d, mml_loader_cfg *c,
                                mml_py_cfg_mem *m) {
  mml_loader_cfg_defaults(c);
  PyObject *sources = PyDict_GetItemString(d, "sources"); /* borrowed */
  if (sources && sources != Py_None) {
    if (parse_sources(ms, sources, c, m)) return -1;
  } else {
    if (str_list(ms, PyDict_GetItemString(d, "data"), "data", &m->data, &c->ndata)) return -1;
    c->data = m->data;
  }
  PyObject *vision = PyDict_GetItemString(d, "vision");
  if (!vision || !PyDict_Check(vision)) {
    PyErr_SetString(ms->ConfigError, "vision must be a dict (mmloader.presets.vision_config)");
    return -1;
  }
  if (mml_py_vision_cfg_from_dict(ms, vision, &c->vision)) return -1;
  static const char *const skip[] = {"data", "sources", "vision", NULL};
  if (set_options(ms, d, c, skip)) return -1;
  c->to_device = c->device >= 0;
  if (c->device < 0) c->device = 0;
  return 0;
}

static PyObject *option_value(const mml_loader_cfg *c, const mml_option *o) {
  switch (o->type) {
    case MML_OPT_BOOL:
      return PyBool_FromLong((long)mml_option_get_int(c, o));
    case MML_OPT_INT:
      return PyLong_FromLongLong(mml_option_get_int(c, o));
    case MML_OPT_FLOAT:
      return PyFloat_FromDouble(mml_option_get_float(c, o));
    case MML_OPT_ENUM: {
      const char *s = mml_option_enum_name(o, mml_option_get_int(c, o));
      if (s) return PyUnicode_FromString(s);
      break;
    }
    case MML_OPT_STR: {
      const char *s = mml_option_get_str(c, o);
      if (s) return PyUnicode_FromString(s);
      break;
    }
  }
  Py_RETURN_NONE;
}

PyObject *mml_py_loader_cfg_to_dict(const mml_loader_cfg *c) {
  PyObject *d = PyDict_New();
  if (!d) return NULL;
  int n;
  const mml_option *t = mml_loader_options(&n);
  for (int i = 0; i < n; i++) {
    if (t[i].flags & (MML_OPT_SECRET | MML_OPT_PYTHON)) continue;
    PyObject *v = option_value(c, &t[i]);
    if (!v || PyDict_SetItemString(d, t[i].name, v)) {
      Py_XDECREF(v);
      Py_DECREF(d);
      return NULL;
    }
    Py_DECREF(v);
  }
  return d;
}

static PyObject *none(void) { Py_RETURN_NONE; }

static const char *type_name(mml_opt_type t) {
  static const char *const names[] = {"bool", "int", "float", "str", "enum"};
  return names[t];
}

/* One row as a dict: name, type, default (None for MML_OPT_NONE rows: the Loader
 * keyword's default), min, max, choices, fingerprint, internal, secret, python, doc. */
static PyObject *row_dict(const mml_option *o, const mml_loader_cfg *defaults) {
  PyObject *def = o->flags & MML_OPT_NONE ? none() : option_value(defaults, o);
  PyObject *choices = NULL;
  if (o->choices) {
    int n = 0;
    while (o->choices[n]) n++;
    choices = PyTuple_New(n);
    for (int i = 0; choices && i < n; i++)
      PyTuple_SET_ITEM(choices, i, PyUnicode_FromString(o->choices[i]));
  }
  int numeric = o->type == MML_OPT_INT || o->type == MML_OPT_FLOAT;
  PyObject *lo = !numeric                 ? none()
                 : o->type == MML_OPT_INT ? PyLong_FromDouble(o->lo)
                                          : PyFloat_FromDouble(o->lo);
  PyObject *hi = !numeric                 ? none()
                 : o->type == MML_OPT_INT ? PyLong_FromDouble(o->hi)
                                          : PyFloat_FromDouble(o->hi);
  PyObject *r = NULL;
  if (def && (choices || !o->choices) && lo && hi)
    r = Py_BuildValue("{s:s,s:s,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:s}", "name", o->name, "type",
                      type_name(o->type), "default", def, "min", lo, "max", hi, "choices",
                      choices ? choices : Py_None, "fingerprint",
                      o->flags & MML_OPT_FINGERPRINT ? Py_True : Py_False, "internal",
                      o->flags & MML_OPT_INTERNAL ? Py_True : Py_False, "secret",
                      o->flags & MML_OPT_SECRET ? Py_True : Py_False, "python",
                      o->flags & MML_OPT_PYTHON ? Py_True : Py_False, "doc", o->doc);
  Py_XDECREF(def), Py_XDECREF(choices), Py_XDECREF(lo), Py_XDECREF(hi);
  return r;
}

static PyObject *py_loader_options(PyObject *mod, PyObject *noargs) {
  mml_loader_cfg defaults;
  mml_loader_cfg_defaults(&defaults);
  int n;
  const mml_option *t = mml_loader_options(&n);
  PyObject *out = PyList_New(n);
  for (int i = 0; out && i < n; i++) {
    PyObject *r = row_dict(&t[i], &defaults);
    if (!r) {
      Py_CLEAR(out);
      break;
    }
    PyList_SET_ITEM(out, i, r);
  }
  return out;
}

static PyObject *py_check_loader_options(PyObject *mod, PyObject *d) {
  mml_py_state *ms = mml_py_state_of(mod);
  if (!PyDict_Check(d)) return PyErr_Format(PyExc_TypeError, "expected a dict of options");
  mml_loader_cfg c;
  mml_loader_cfg_defaults(&c);
  if (set_options(ms, d, &c, NULL)) return NULL;
  mml_err err;
  mml_err_clear(&err);
  if (mml_loader_cfg_check(&c, &err)) {
    config_error(ms, &err);
    return NULL;
  }
  return mml_py_loader_cfg_to_dict(&c);
}

static PyMethodDef options_functions[] = {
    {"loader_options", py_loader_options, METH_NOARGS,
     "loader_options() -> list of dicts: the loader's option table (name, type, default, "
     "min, max, choices, fingerprint, internal, secret, python, doc)."},
    {"check_loader_options", py_check_loader_options, METH_O,
     "check_loader_options(options) -> dict: checks options (a dict of table options) "
     "against the table and each other, raising ConfigError; returns every non-secret "
     "option's value."},
    {NULL, NULL, 0, NULL}};

int mml_py_options_exec(PyObject *m) { return PyModule_AddFunctions(m, options_functions); }
