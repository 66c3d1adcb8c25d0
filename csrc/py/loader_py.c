/*
 * loader_py.c — mmloader._core._Loader: the thin binding of the engine (mml/loader.h).
 * The public, documented class is mmloader.Loader (mmloader/loader.py), which validates
 * keyword arguments and passes one plain dict here.
 *
 * The GIL is released around every engine call that can wait: construction (index
 * build), next (in 100 ms slices, checking for signals between them so Ctrl-C works),
 * close/dealloc (joining threads).  The creating pid is recorded: a forked child gets a
 * clear mmloader.Error, and never touches (or joins) threads it does not have.
 */
#include <string.h>
#include <unistd.h>

#include "binding.h"
#include "mml/loader.h"

typedef struct {
  PyObject_HEAD
  mml_loader *L;
  PyObject *tokenizer; /* keeps the borrowed core tokenizer alive */
  pid_t pid;
  int warned;          /* skip warnings emitted so far */
  int active;          /* next() calls in progress (they run with the GIL released) */
  mml_loader *closing; /* closed while next() was active: freed by the last one out */
} LoaderObject;

enum { MAX_WARNINGS = 50 };

static int check_usable(LoaderObject *self) {
  if (self->pid != getpid()) {
    PyErr_Format(mml_py_Error,
                 "this mmloader.Loader was created in process %d and cannot be used in a "
                 "forked child (pid %d): its threads do not exist here; create the Loader in "
                 "the child instead",
                 (int)self->pid, (int)getpid());
    return -1;
  }
  if (!self->L) {
    PyErr_SetString(mml_py_Error, "the loader is closed");
    return -1;
  }
  return 0;
}

/* ---- config dict -> mml_loader_cfg ---------------------------------------------------- */

static int get_obj(PyObject *d, const char *k, PyObject **out) {
  *out = PyDict_GetItemString(d, k); /* borrowed; NULL when absent */
  return 0;
}
static int get_ll(PyObject *d, const char *k, long long def, long long *out) {
  PyObject *v;
  get_obj(d, k, &v);
  if (!v || v == Py_None) {
    *out = def;
    return 0;
  }
  *out = PyLong_AsLongLong(v);
  if (*out == -1 && PyErr_Occurred()) {
    PyErr_Format(mml_py_ConfigError, "%s must be an integer", k);
    return -1;
  }
  return 0;
}
static int get_int(PyObject *d, const char *k, int def, int *out) {
  long long v;
  if (get_ll(d, k, def, &v)) return -1;
  if (v < -2147483647LL || v > 2147483647LL) {
    PyErr_Format(mml_py_ConfigError, "%s is out of range", k);
    return -1;
  }
  *out = (int)v;
  return 0;
}
static int get_double(PyObject *d, const char *k, double def, double *out) {
  PyObject *v;
  get_obj(d, k, &v);
  if (!v || v == Py_None) {
    *out = def;
    return 0;
  }
  *out = PyFloat_AsDouble(v);
  if (*out == -1 && PyErr_Occurred()) {
    PyErr_Format(mml_py_ConfigError, "%s must be a number", k);
    return -1;
  }
  return 0;
}
static int get_str(PyObject *d, const char *k, const char **out) {
  PyObject *v;
  get_obj(d, k, &v);
  *out = NULL;
  if (!v || v == Py_None) return 0;
  if (!PyUnicode_Check(v)) {
    PyErr_Format(mml_py_ConfigError, "%s must be a string", k);
    return -1;
  }
  *out = PyUnicode_AsUTF8(v);
  return *out ? 0 : -1;
}

static mml_label_mode label_mode_of(const char *labels) {
  if (labels && !strcmp(labels, "last_assistant")) return MML_LABELS_LAST_ASSISTANT;
  if (labels && !strcmp(labels, "no_nonfinal_end")) return MML_LABELS_NO_NONFINAL_END;
  return MML_LABELS_ALL_ASSISTANT;
}

/* Borrowed strings of a list (the list outlives the engine's construction). */
static int str_list(PyObject *list, const char *what, const char ***out, int *n) {
  if (!list || !PyList_Check(list) || PyList_GET_SIZE(list) == 0) {
    PyErr_Format(mml_py_ConfigError, "%s must be a non-empty list of paths or URLs", what);
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
      PyErr_Format(mml_py_ConfigError, "%s entries must be strings", what);
      return -1;
    }
    if (!((*out)[i] = PyUnicode_AsUTF8(s))) return -1;
  }
  return 0;
}

/* What parse_cfg allocates (freed once the engine has copied it). */
typedef struct cfg_mem {
  const char **data;
  mml_source_cfg *sources;
  int nsources;
} cfg_mem;

static void cfg_mem_free(cfg_mem *m) {
  PyMem_Free(m->data);
  for (int i = 0; m->sources && i < m->nsources; i++) PyMem_Free((void *)m->sources[i].data);
  PyMem_Free(m->sources);
  memset(m, 0, sizeof *m);
}

/* "sources": a list of dicts (resolved by mmloader/loader.py: every setting filled). */
static int parse_sources(PyObject *list, mml_loader_cfg *c, cfg_mem *m) {
  if (!PyList_Check(list) || PyList_GET_SIZE(list) == 0) {
    PyErr_SetString(mml_py_ConfigError, "sources must be a non-empty list");
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
    const char *labels;
    long long choose, maxlen;
    if (!PyDict_Check(d)) {
      PyErr_SetString(mml_py_ConfigError, "sources entries must be dicts");
      return -1;
    }
    data = PyDict_GetItemString(d, "data");
    vision = PyDict_GetItemString(d, "vision");
    if (get_str(d, "name", &s->name) || str_list(data, "a source's data", (const char ***)&s->data, &s->ndata) ||
        get_double(d, "weight", -1, &s->weight) || get_double(d, "repeat", -1, &s->repeat) ||
        get_ll(d, "choose", -1, &choose) || get_str(d, "image_root", &s->image_root) ||
        get_str(d, "system_prompt", &s->system_prompt) || get_str(d, "label_mode", &labels) ||
        get_ll(d, "max_length", 0, &maxlen))
      return -1;
    if (!vision || !PyDict_Check(vision)) {
      PyErr_SetString(mml_py_ConfigError, "a source's vision must be a dict");
      return -1;
    }
    if (mml_py_vision_cfg_from_dict(vision, &s->vision)) return -1;
    s->choose = choose;
    s->max_length = maxlen;
    s->label_mode = label_mode_of(labels);
  }
  c->sources = m->sources;
  c->nsources = m->nsources;
  return 0;
}

static int parse_cfg(PyObject *d, mml_loader_cfg *c, cfg_mem *m) {
  memset(c, 0, sizeof *c);
  PyObject *list, *sources;
  get_obj(d, "sources", &sources);
  if (sources && sources != Py_None) {
    if (parse_sources(sources, c, m)) return -1;
  } else {
    get_obj(d, "data", &list);
    if (str_list(list, "data", &m->data, &c->ndata)) return -1;
    c->data = m->data;
  }
  long long seed, maxlen, seqlen, packlen, minerr, spe;
  const char *on_error, *keys, *tmpl, *labels, *space;
  if (get_str(d, "image_root", &c->image_root) || get_int(d, "data_format", 0, &c->data_format) || get_int(d, "shuffle", 1, &c->shuffle) ||
      get_ll(d, "seed", 0, &seed) || get_int(d, "dp_rank", 0, &c->dp_rank) ||
      get_int(d, "dp_size", 1, &c->dp_size) || get_int(d, "num_threads", 1, &c->num_threads) ||
      get_int(d, "prefetch", 4, &c->prefetch) || get_int(d, "window", 0, &c->window) ||
      get_str(d, "on_error", &on_error) || get_double(d, "max_error_rate", 0.1, &c->max_error_rate) ||
      get_ll(d, "min_error_samples", 100, &minerr) ||
      get_ll(d, "max_length", 0, &maxlen) || get_int(d, "cycle", 0, &c->cycle) ||
      get_int(d, "micro_batch_size", 8, &c->collate.micro_batch_size) ||
      get_ll(d, "seq_length", 0, &seqlen) || get_int(d, "pack", 0, &c->collate.pack) ||
      get_ll(d, "pack_length", 0, &packlen) ||
      get_int(d, "pad_to_multiple", 0, &c->collate.pad_to_multiple) ||
      get_int(d, "pad_id", -1, &c->collate.pad_id) || get_str(d, "keys", &keys) ||
      get_int(d, "shift_labels", 0, &c->collate.shift_labels) ||
      get_int(d, "attention_mask", 1, &c->collate.attention_mask) ||
      get_int(d, "mrope", 0, &c->collate.mrope) ||
      get_int(d, "text_only_vision", 0, &c->collate.text_only_vision) ||
      get_int(d, "mm_token_type_ids", 0, &c->collate.mm_token_type_ids) || get_str(d, "template", &tmpl) ||
      get_str(d, "label_mode", &labels) || get_str(d, "image_whitespace", &space) || get_str(d, "s3_endpoint", &c->fetch.endpoint) ||
      get_str(d, "s3_region", &c->fetch.region) ||
      get_str(d, "aws_access_key_id", &c->fetch.access_key) ||
      get_str(d, "aws_secret_access_key", &c->fetch.secret_key) ||
      get_str(d, "aws_session_token", &c->fetch.session_token) ||
      get_int(d, "max_inflight", 0, &c->fetch.max_inflight) ||
      get_int(d, "pin_memory", 0, &c->pin_memory) || get_int(d, "device", -1, &c->device) ||
      get_str(d, "system_prompt", &c->system_prompt) ||
      get_ll(d, "samples_per_epoch", 0, &spe) ||
      get_double(d, "mixture_tolerance", 0, &c->mixture_tolerance) ||
      get_int(d, "plan_only", 0, &c->plan_only))
    return -1;
  c->samples_per_epoch = spe;
  c->seed = (uint64_t)seed;
  c->to_device = c->device >= 0;
  if (c->device < 0) c->device = 0;
  c->min_error_samples = minerr;
  c->max_length = maxlen;
  c->collate.seq_length = seqlen;
  c->collate.pack_length = packlen;
  c->on_error_raise = on_error && !strcmp(on_error, "raise");
  c->collate.keys = keys && !strcmp(keys, "megatron") ? MML_KEYS_MEGATRON : MML_KEYS_QWEN;
  c->template_style = tmpl && !strcmp(tmpl, "qwen3-vl") ? MML_TEMPLATE_QWEN3_VL
                                                         : MML_TEMPLATE_QWEN2_VL;
  c->label_mode = label_mode_of(labels);
  int sp = MML_IMAGE_SPACE_IN_PLACE;
  if (space && mml_py_image_space_from_str(space, &sp)) return -1;
  c->image_space = (mml_image_space)sp;
  PyObject *vision;
  get_obj(d, "vision", &vision);
  if (!vision || !PyDict_Check(vision)) {
    PyErr_SetString(mml_py_ConfigError, "vision must be a dict (mmloader.presets.vision_config)");
    return -1;
  }
  if (mml_py_vision_cfg_from_dict(vision, &c->vision)) return -1;
  return 0;
}

/* ---- type --------------------------------------------------------------------------- */

static int Loader_init(LoaderObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"config", "tokenizer", NULL};
  PyObject *d, *tok;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O:_Loader", kwlist, &PyDict_Type, &d, &tok))
    return -1;
  if (self->L) {
    PyErr_SetString(mml_py_Error, "_Loader is already initialised");
    return -1;
  }
  const struct mml_tokenizer *ct = mml_py_tokenizer_get(tok);
  if (!ct) return -1;
  mml_loader_cfg cfg;
  cfg_mem mem = {0};
  if (parse_cfg(d, &cfg, &mem)) {
    cfg_mem_free(&mem);
    return -1;
  }
  cfg.tokenizer = ct;
  mml_err err;
  mml_err_clear(&err);
  mml_loader *L = NULL;
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_loader_new(&cfg, &L, &err);
  Py_END_ALLOW_THREADS
  cfg_mem_free(&mem);
  if (st) {
    if (st == MML_ENOENT || st == MML_EIO || st == MML_ECONFIG || st == MML_EINVAL) {
      PyErr_SetString(mml_py_ConfigError, err.msg[0] ? err.msg : mml_status_message(st));
      return -1;
    }
    mml_py_raise(st, &err);
    return -1;
  }
  self->L = L;
  Py_INCREF(tok);
  self->tokenizer = tok;
  self->pid = getpid();
  return 0;
}

/* Closing while another thread is inside next() (GIL released, inside the engine) must
 * not free the engine under it: stop it (next() then returns promptly with "closed") and
 * let the last next() call out free it. */
static void loader_release(LoaderObject *self) {
  mml_loader *L = self->L;
  self->L = NULL;
  if (!L) return;
  if (self->pid != getpid()) return; /* forked child: the threads are not ours to join */
  Py_BEGIN_ALLOW_THREADS
  if (self->active) mml_loader_close(L);
  else mml_loader_free(L);
  Py_END_ALLOW_THREADS
  if (self->active) self->closing = L;
}

static void loader_leave_next(LoaderObject *self) {
  if (--self->active == 0 && self->closing) {
    mml_loader *L = self->closing;
    self->closing = NULL;
    Py_BEGIN_ALLOW_THREADS
    mml_loader_free(L);
    Py_END_ALLOW_THREADS
  }
}

static void Loader_dealloc(LoaderObject *self) {
  loader_release(self); /* no next() can be active: it holds a reference */
  Py_CLEAR(self->tokenizer);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Loader_close(LoaderObject *self, PyObject *unused) {
  if (self->L && self->pid != getpid()) {
    self->L = NULL; /* forget it in the child */
    Py_RETURN_NONE;
  }
  loader_release(self);
  Py_RETURN_NONE;
}

static int emit_warnings(LoaderObject *self) {
  mml_err w[8];
  int n;
  while ((n = mml_loader_take_warnings(self->L, w, 8)) > 0) {
    for (int i = 0; i < n; i++) {
      if (w[i].status == MML_OK) { /* a notice (mixture drift), not a skipped sample */
        if (PyErr_WarnFormat(PyExc_UserWarning, 1, "mmloader: %s", w[i].msg)) return -1;
        continue;
      }
      if (self->warned >= MAX_WARNINGS) continue;
      self->warned++;
      const char *reason = mml_status_skip_reason(w[i].status);
      int rc = PyErr_WarnFormat(PyExc_UserWarning, 1, "mmloader skipped a sample (%s): %s",
                                reason ? reason : mml_status_name(w[i].status), w[i].msg);
      if (!rc && self->warned == MAX_WARNINGS)
        rc = PyErr_WarnEx(PyExc_UserWarning,
                          "mmloader: further skipped-sample warnings are suppressed; see "
                          "Loader.stats()['skipped_by_reason']", 1);
      if (rc) return -1;
    }
  }
  return 0;
}

static PyObject *batch_to_dict(mml_batch *b) {
  PyObject *d = PyDict_New();
  if (!d) goto fail;
  for (int i = 0; i < b->ntensors; i++) {
    PyObject *t = mml_py_tensor_from_slot(&b->tensors[i]);
    if (!t) goto fail;
    int rc = PyDict_SetItemString(d, b->tensors[i].name, t);
    Py_DECREF(t);
    if (rc) goto fail;
  }
  mml_batch_clear(b);
  return d;
fail:
  Py_XDECREF(d);
  mml_batch_clear(b);
  return NULL;
}

static PyObject *loader_next_active(LoaderObject *self) {
  mml_batch b;
  memset(&b, 0, sizeof b);
  mml_err err;
  for (;;) {
    mml_status st;
    mml_err_clear(&err);
    mml_loader *L = self->L ? self->L : self->closing;
    Py_BEGIN_ALLOW_THREADS
    st = mml_loader_next(L, &b, 0.1, &err);
    Py_END_ALLOW_THREADS
    if (self->L && emit_warnings(self)) {
      mml_batch_clear(&b);
      return NULL;
    }
    switch (st) {
      case MML_OK: return batch_to_dict(&b);
      case MML_ETIMEDOUT:
        if (PyErr_CheckSignals()) return NULL;
        continue;
      case MML_EEND: PyErr_SetNone(PyExc_StopIteration); return NULL;
      case MML_ECLOSED: PyErr_SetString(mml_py_Error, "the loader is closed"); return NULL;
      default: return mml_py_raise(st, &err);
    }
  }
}

static PyObject *Loader_next(LoaderObject *self, PyObject *unused) {
  if (check_usable(self)) return NULL;
  self->active++;
  PyObject *r = loader_next_active(self);
  loader_leave_next(self);
  return r;
}

static PyObject *Loader_seek(LoaderObject *self, PyObject *args) {
  mml_cursor c;
  long long ahead = 0;
  if (!PyArg_ParseTuple(args, "LLL|L:seek", &c.epoch, &c.pos, &c.batch_in_epoch, &ahead))
    return NULL;
  if (check_usable(self)) return NULL;
  mml_err err;
  mml_err_clear(&err);
  mml_status st = mml_loader_seek_ahead(self->L, &c, ahead, &err);
  if (st) return mml_py_raise(st, &err);
  Py_RETURN_NONE;
}

static PyObject *Loader_cursor(LoaderObject *self, PyObject *unused) {
  if (check_usable(self)) return NULL;
  mml_cursor c = mml_loader_cursor(self->L);
  return Py_BuildValue("(LLL)", (long long)c.epoch, (long long)c.pos,
                       (long long)c.batch_in_epoch);
}

static PyObject *Loader_info(LoaderObject *self, PyObject *unused) {
  if (check_usable(self)) return NULL;
  mml_loader *L = self->L;
  char hash[17];
  snprintf(hash, sizeof hash, "%016llx", (unsigned long long)mml_loader_data_hash(L));
  int n = mml_loader_num_sources(L);
  PyObject *src = PyList_New(n);
  if (!src) return NULL;
  for (int i = 0; i < n; i++) {
    mml_source_stats ss;
    mml_loader_source_stats(L, i, &ss);
    char h[17];
    snprintf(h, sizeof h, "%016llx", (unsigned long long)ss.data_hash);
    PyObject *e = Py_BuildValue("{s:s,s:L,s:L,s:s}", "name", ss.name, "num_samples",
                                (long long)ss.num_samples, "per_epoch", (long long)ss.per_epoch,
                                "data_hash", h);
    if (!e) {
      Py_DECREF(src);
      return NULL;
    }
    PyList_SET_ITEM(src, i, e);
  }
  return Py_BuildValue("{s:L,s:L,s:L,s:L,s:s,s:N}", "num_samples",
                       (long long)mml_loader_num_samples(L), "samples_per_rank",
                       (long long)mml_loader_samples_per_rank(L), "batches_per_epoch",
                       (long long)mml_loader_batches_per_epoch(L), "samples_per_epoch",
                       (long long)mml_loader_samples_per_epoch(L), "data_hash", hash,
                       "sources", src);
}

/* stats()["sources"]: {name: {...}} in the mixture's order. */
static PyObject *source_stats(mml_loader *L) {
  PyObject *out = PyDict_New();
  if (!out) return NULL;
  for (int i = 0; i < mml_loader_num_sources(L); i++) {
    mml_source_stats ss;
    mml_loader_source_stats(L, i, &ss);
    PyObject *reasons = PyDict_New();
    if (!reasons) goto fail;
    for (int st = 0; st < MML_STATUS_COUNT; st++) {
      if (!ss.skip_by_status[st]) continue;
      const char *r = mml_status_skip_reason((mml_status)st);
      if (!r) r = "other";
      PyObject *old = PyDict_GetItemString(reasons, r);
      unsigned long long v = ss.skip_by_status[st] + (old ? PyLong_AsUnsignedLongLong(old) : 0);
      PyObject *x = PyLong_FromUnsignedLongLong(v);
      if (!x || PyDict_SetItemString(reasons, r, x)) {
        Py_XDECREF(x);
        Py_DECREF(reasons);
        goto fail;
      }
      Py_DECREF(x);
    }
    PyObject *e = Py_BuildValue("{s:L,s:L,s:K,s:K,s:N,s:L,s:L,s:K}", "num_samples",
                                (long long)ss.num_samples, "per_epoch", (long long)ss.per_epoch,
                                "samples", (unsigned long long)ss.samples, "skipped",
                                (unsigned long long)ss.skipped, "skipped_by_reason", reasons,
                                "tokens", (long long)ss.tokens, "image_tokens",
                                (long long)ss.image_tokens, "bytes", (unsigned long long)ss.bytes);
    if (!e || PyDict_SetItemString(out, ss.name, e)) {
      Py_XDECREF(e);
      goto fail;
    }
    Py_DECREF(e);
  }
  return out;
fail:
  Py_DECREF(out);
  return NULL;
}

static int set_num(PyObject *d, const char *k, PyObject *v) {
  if (!v) return -1;
  int rc = PyDict_SetItemString(d, k, v);
  Py_DECREF(v);
  return rc;
}

static PyObject *Loader_stats(LoaderObject *self, PyObject *unused) {
  if (check_usable(self)) return NULL;
  mml_loader_stats s;
  mml_loader_get_stats(self->L, &s);
  PyObject *d = PyDict_New(), *reasons = PyDict_New();
  if (!d || !reasons) goto fail;
  for (int i = 0; i < s.nreasons; i++)
    if (set_num(reasons, s.reason[i], PyLong_FromUnsignedLongLong(s.reason_count[i]))) goto fail;
  double ratio = s.wall_s > 0 ? s.wait_s / s.wall_s : 0.0;
  if (ratio > 1) ratio = 1;
  double eff = s.token_slots > 0 ? (double)s.real_tokens / (double)s.token_slots : 0.0;
  if (set_num(d, "wait_time_ratio", PyFloat_FromDouble(ratio)) ||
      set_num(d, "wait_s", PyFloat_FromDouble(s.wait_s)) ||
      set_num(d, "wall_s", PyFloat_FromDouble(s.wall_s)) ||
      set_num(d, "read_s", PyFloat_FromDouble(s.read_s)) ||
      set_num(d, "vision_s", PyFloat_FromDouble(s.vision_s)) ||
      set_num(d, "decode_s", PyFloat_FromDouble(s.decode_s)) ||
      set_num(d, "tokenize_s", PyFloat_FromDouble(s.text_s)) ||
      set_num(d, "collate_s", PyFloat_FromDouble(s.collate_s)) ||
      set_num(d, "queue_depth", PyLong_FromLong(s.queue_depth)) ||
      set_num(d, "prefetch", PyLong_FromLong(s.prefetch)) ||
      set_num(d, "window", PyLong_FromLong(s.window)) ||
      set_num(d, "in_flight", PyLong_FromLong(s.in_flight)) ||
      set_num(d, "num_threads", PyLong_FromLong(s.num_threads)) ||
      set_num(d, "samples", PyLong_FromUnsignedLongLong(s.samples)) ||
      set_num(d, "good_samples", PyLong_FromUnsignedLongLong(s.good_samples)) ||
      set_num(d, "skipped", PyLong_FromUnsignedLongLong(s.skipped)) ||
      set_num(d, "batches", PyLong_FromUnsignedLongLong(s.batches)) ||
      set_num(d, "bytes_read", PyLong_FromUnsignedLongLong(s.bytes_read)) ||
      set_num(d, "images", PyLong_FromUnsignedLongLong(s.images)) ||
      set_num(d, "real_tokens", PyLong_FromLongLong(s.real_tokens)) ||
      set_num(d, "token_slots", PyLong_FromLongLong(s.token_slots)) ||
      set_num(d, "packing_efficiency", PyFloat_FromDouble(eff)) ||
      set_num(d, "pinned", PyBool_FromLong(s.pinned)) ||
      set_num(d, "device", s.device >= 0 ? PyUnicode_FromFormat("cuda:%d", s.device)
                                         : PyUnicode_FromString("cpu")) ||
      set_num(d, "pool_cached_bytes", PyLong_FromSize_t(s.pool_cached)) ||
      set_num(d, "pool_live_bytes", PyLong_FromSize_t(s.pool_live)))
    goto fail;
  if (PyDict_SetItemString(d, "skipped_by_reason", reasons)) goto fail;
  Py_CLEAR(reasons);
  if (set_num(d, "sources", source_stats(self->L))) goto fail;
  if (s.remote) {
    PyObject *f = Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:d,s:d,s:d,s:i}", "requests",
        (unsigned long long)s.fetch.requests, "bytes", (unsigned long long)s.fetch.bytes,
        "failures", (unsigned long long)s.fetch.failures, "retries_5xx",
        (unsigned long long)s.fetch.retries_5xx, "retries_429",
        (unsigned long long)s.fetch.retries_429, "retries_timeout",
        (unsigned long long)s.fetch.retries_timeout, "retries_reset",
        (unsigned long long)s.fetch.retries_reset, "retries_short",
        (unsigned long long)s.fetch.retries_short, "latency_p50_s", s.fetch.latency_p50_s,
        "latency_p90_s", s.fetch.latency_p90_s, "latency_p99_s", s.fetch.latency_p99_s,
        "inflight", s.fetch.inflight);
    if (set_num(d, "fetch", f)) goto fail;
  }
  return d;
fail:
  Py_XDECREF(d);
  Py_XDECREF(reasons);
  return NULL;
}

static PyObject *Loader_set_consumer_stream(LoaderObject *self, PyObject *args) {
  int device;
  unsigned long long stream;
  if (!PyArg_ParseTuple(args, "iK:set_consumer_stream", &device, &stream)) return NULL;
  if (self->L) mml_loader_set_consumer_stream(self->L, device, (uintptr_t)stream);
  Py_RETURN_NONE;
}

static PyObject *Loader_get_closed(LoaderObject *self, void *c) { return PyBool_FromLong(!self->L); }

static PyMethodDef Loader_methods[] = {
    {"next", (PyCFunction)Loader_next, METH_NOARGS,
     "The next batch (dict of Tensor); StopIteration at the end of an epoch."},
    {"seek", (PyCFunction)Loader_seek, METH_VARARGS, "seek(epoch, pos, batch_in_epoch, ahead=0): ahead > 0 starts no work beyond that many "
     "samples (plus one per skipped sample)"},
    {"cursor", (PyCFunction)Loader_cursor, METH_NOARGS,
     "(epoch, pos, batch_in_epoch) after the last delivered batch."},
    {"info", (PyCFunction)Loader_info, METH_NOARGS, "Sizes and the data hash."},
    {"stats", (PyCFunction)Loader_stats, METH_NOARGS, "Engine statistics."},
    {"close", (PyCFunction)Loader_close, METH_NOARGS, "Stops and joins every thread."},
    {"set_consumer_stream", (PyCFunction)Loader_set_consumer_stream, METH_VARARGS,
     "set_consumer_stream(device, stream): pinned batches delivered from now on are not "
     "reused before work queued on that cudaStream_t before their release is done."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Loader_getset[] = {
    {"closed", (getter)Loader_get_closed, NULL, "True once closed.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject Loader_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mmloader._core._Loader",
    .tp_basicsize = sizeof(LoaderObject),
    .tp_dealloc = (destructor)Loader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Engine of mmloader.Loader (use that class).",
    .tp_methods = Loader_methods,
    .tp_getset = Loader_getset,
    .tp_init = (initproc)Loader_init,
    .tp_new = PyType_GenericNew,
};

int mml_py_loader_register(PyObject *m) {
  if (PyType_Ready(&Loader_Type) < 0) return -1;
  Py_INCREF(&Loader_Type);
  if (PyModule_AddObject(m, "_Loader", (PyObject *)&Loader_Type) < 0) {
    Py_DECREF(&Loader_Type);
    return -1;
  }
  return 0;
}
