/*
 * loader_py.c — mmloader._core._Loader: the thin binding of the engine (mml/loader.h).
 * The public, documented class is mmloader.Loader (mmloader/loader.py), which resolves
 * its keyword arguments and passes one plain dict here, parsed by the option table
 * (options_py.c, mml/options.h).
 *
 * The GIL is released around every engine call that can wait: construction (index
 * build: on a helper thread, interrupt_py.c, so Ctrl-C stops it), next (in 100 ms slices,
 * checking for signals between them so Ctrl-C works), close/dealloc (joining threads; the
 * engine's close stops a decode under way, so they return within milliseconds).  The creating pid is recorded: a forked child gets a
 * clear mmloader.Error, and never touches (or joins) threads it does not have.
 *
 * GC: a _Loader holds its tokenizer, whose Python subclass can hold anything, so it can
 * sit in a reference cycle; clearing it stops and frees the engine BEFORE dropping the
 * tokenizer the engine borrows.
 */
#include <string.h>
#include <unistd.h>

#include "binding.h"
#include "mml/cuda.h"
#include "mml/dsindex.h"
#include "mml/loader.h"

typedef struct {
  PyObject_HEAD
  mml_loader *L;
  PyObject *tokenizer; /* keeps the borrowed core tokenizer alive */
  pid_t pid;
  int warned;            /* skip warnings emitted so far */
  unsigned warned_kinds; /* records that are not SFT: reasons warned about (once each) */
  double next_timeout_s; /* next() raises after this long without an item (> 0) */
  int active;            /* next() calls in progress (they run with the GIL released) */
  mml_loader *closing;   /* closed while next() was active: freed by the last one out */
  int close_busy;        /* a close of `closing` still runs (GIL released): it frees it */
  mml_cancel cancel;     /* set on Ctrl-C during construction; the engine's flag's parent */
} LoaderObject;

enum { MAX_WARNINGS = 50 };

static int check_usable(LoaderObject *self) {
  if (self->pid != getpid()) {
    PyErr_Format(mml_py_state_of_self(self)->Error,
                 "this mmloader.Loader was created in process %d and cannot be used in a "
                 "forked child (pid %d): its threads do not exist here; create the Loader in "
                 "the child instead",
                 (int)self->pid, (int)getpid());
    return -1;
  }
  if (!self->L) {
    PyErr_SetString(mml_py_state_of_self(self)->Error, "the loader is closed");
    return -1;
  }
  return 0;
}

mml_loader *mml_py_loader_get(mml_py_state *ms, PyObject *obj) {
  if (!PyObject_TypeCheck(obj, ms->Loader_Type)) {
    PyErr_SetString(PyExc_TypeError, "expected a mmloader._core._Loader");
    return NULL;
  }
  LoaderObject *self = (LoaderObject *)obj;
  return check_usable(self) ? NULL : self->L;
}

/* ---- type --------------------------------------------------------------------------- */

typedef struct {
  const mml_loader_cfg *cfg;
  mml_loader *L;
  mml_status st;
  mml_err err;
} build_args;

static void build_main(void *p) {
  build_args *a = p;
  a->st = mml_loader_new(a->cfg, &a->L, &a->err);
}

static void free_engine(mml_loader *L);

static int Loader_init(LoaderObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"config", "tokenizer", NULL};
  PyObject *d, *tok;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O:_Loader", kwlist, &PyDict_Type, &d, &tok))
    return -1;
  mml_py_state *ms = mml_py_state_of_self(self);
  if (self->L) {
    PyErr_SetString(ms->Error, "_Loader is already initialised");
    return -1;
  }
  const struct mml_tokenizer *ct = mml_py_tokenizer_get(ms, tok);
  if (!ct) return -1;
  mml_loader_cfg cfg;
  mml_py_cfg_mem mem = {0};
  if (mml_py_loader_cfg_from_dict(ms, d, &cfg, &mem)) {
    mml_py_cfg_mem_free(&mem);
    return -1;
  }
  cfg.tokenizer = ct;
  self->cancel = (mml_cancel){0}; /* no engine yet: nothing reads it */
  cfg.cancel = &self->cancel;     /* outlives the engine: freed before this object */
  build_args a = {&cfg, NULL, MML_OK};
  mml_err_clear(&a.err);
  /* pinned memory's release guard reads the constructing thread's CUDA device */
  const int dev =
      (cfg.pin_memory || cfg.to_device) && mml_cuda_available() ? mml_cuda_current_device() : -1;
  const int interrupted = mml_py_run_interruptible(build_main, &a, dev, &self->cancel);
  mml_py_cfg_mem_free(&mem);
  mml_loader *L = a.L;
  mml_status st = a.st;
  mml_err err = a.err;
  if (interrupted) { /* the handler's exception (KeyboardInterrupt) stands */
    if (L) free_engine(L);
    return -1;
  }
  if (st) {
    if (st == MML_ENOENT || st == MML_EIO || st == MML_ECONFIG || st == MML_EINVAL) {
      mml_py_raise_as(ms->ConfigError, st, &err);
      return -1;
    }
    mml_py_raise(ms, st, &err);
    return -1;
  }
  self->next_timeout_s = cfg.next_timeout_s > 0 ? cfg.next_timeout_s : MML_DEFAULT_NEXT_TIMEOUT_S;
  self->L = L;
  self->tokenizer = Py_NewRef(tok);
  self->pid = getpid();
  return 0;
}

/* Closing while another thread is inside next() (GIL released, inside the engine) must
 * not free the engine under it: stop it (next() then returns promptly with "closed") and
 * let the last one out -- the last next() call, or this close if they all left while it
 * ran -- free it.  `closing` is set before the GIL is released: a next() call that wakes
 * meanwhile finds the engine there, never NULL. */
static void free_engine(mml_loader *L) {
  Py_BEGIN_ALLOW_THREADS
  mml_loader_free(L);
  Py_END_ALLOW_THREADS
}

static void loader_release(LoaderObject *self) {
  mml_loader *L = self->L;
  self->L = NULL;
  if (!L) return;
  if (self->pid != getpid()) return; /* forked child: the threads are not ours to join */
  if (!self->active) {
    free_engine(L);
    return;
  }
  self->closing = L;
  self->close_busy = 1;
  Py_BEGIN_ALLOW_THREADS
  mml_loader_close(L);
  Py_END_ALLOW_THREADS
  self->close_busy = 0;
  if (!self->active) { /* every next() left while it closed */
    self->closing = NULL;
    free_engine(L);
  }
}

static void loader_leave_next(LoaderObject *self) {
  if (--self->active == 0 && self->closing && !self->close_busy) {
    mml_loader *L = self->closing;
    self->closing = NULL;
    free_engine(L);
  }
}

static int Loader_traverse(LoaderObject *self, visitproc visit, void *arg) {
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(self->tokenizer);
  return 0;
}

static int Loader_clear(LoaderObject *self) {
  loader_release(self); /* first: the engine borrows the tokenizer's core */
  Py_CLEAR(self->tokenizer);
  return 0;
}

static void Loader_dealloc(LoaderObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  Loader_clear(self); /* no next() can be active: it holds a reference */
  tp->tp_free((PyObject *)self);
  Py_DECREF(tp); /* heap type: each instance holds a reference */
}

static PyObject *Loader_close(LoaderObject *self, PyObject *unused) {
  if (self->L && self->pid != getpid()) {
    self->L = NULL; /* forget it in the child */
    Py_RETURN_NONE;
  }
  loader_release(self);
  Py_RETURN_NONE;
}

/* Records that are not supervised fine-tuning data: their reasons are named in one
 * warning each (a DPO file would otherwise fill the per-sample warnings). */
static unsigned non_sft_kind(mml_status st) {
  return st == MML_EAUDIO ? 1u : st == MML_EPREFERENCE ? 2u : st == MML_ENOTARGET ? 4u : 0u;
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
      const char *reason = mml_status_skip_reason(w[i].status);
      unsigned kind = non_sft_kind(w[i].status);
      if (kind) { /* one warning per reason, whatever the count */
        if (self->warned_kinds & kind) continue;
        self->warned_kinds |= kind;
        if (PyErr_WarnFormat(PyExc_UserWarning, 1,
                             "mmloader skips every sample of reason %s (counted in "
                             "stats()['skipped_by_reason']); the first: %s",
                             reason, w[i].msg))
          return -1;
        continue;
      }
      if (self->warned >= MAX_WARNINGS) continue;
      self->warned++;
      int rc = PyErr_WarnFormat(PyExc_UserWarning, 1, "mmloader skipped a sample (%s): %s",
                                reason ? reason : mml_status_name(w[i].status), w[i].msg);
      if (!rc && self->warned == MAX_WARNINGS)
        rc = PyErr_WarnEx(PyExc_UserWarning,
                          "mmloader: further skipped-sample warnings are suppressed; see "
                          "Loader.stats()['skipped_by_reason']",
                          1);
      if (rc) return -1;
    }
  }
  return 0;
}

static PyObject *loader_next_active(mml_py_state *ms, LoaderObject *self) {
  mml_batch b;
  memset(&b, 0, sizeof b);
  mml_err err;
  double t0 = mml_now();
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
      case MML_OK:
        return mml_py_batch_dict(ms, &b);
      case MML_ETIMEDOUT:
        if (PyErr_CheckSignals()) return NULL;
        if (self->L && mml_now() - t0 >= self->next_timeout_s) {
          mml_err w;
          mml_loader_describe_wait(self->L, &w);
          mml_err_prefix(&w, "no batch for %.1f s (next_timeout_s=%g)", mml_now() - t0,
                         self->next_timeout_s);
          return mml_py_raise_as(ms->Error, MML_ETIMEDOUT, &w);
        }
        continue;
      case MML_EEND:
        PyErr_SetNone(PyExc_StopIteration);
        return NULL;
      case MML_ECLOSED:
        PyErr_SetString(ms->Error, "the loader is closed");
        return NULL;
      default:
        return mml_py_raise(ms, st, &err);
    }
  }
}

static PyObject *Loader_next(LoaderObject *self, PyObject *unused) {
  if (check_usable(self)) return NULL;
  self->active++;
  PyObject *r = loader_next_active(mml_py_state_of_self(self), self);
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
  if (st) return mml_py_raise(mml_py_state_of_self(self), st, &err);
  Py_RETURN_NONE;
}

/* The global plan (None without one): plan_info(epoch), plan_position(), seek_plan(). */
static PyObject *Loader_plan_info(LoaderObject *self, PyObject *args) {
  long long epoch;
  if (!PyArg_ParseTuple(args, "L:plan_info", &epoch)) return NULL;
  if (check_usable(self)) return NULL;
  if (!mml_loader_has_plan(self->L)) Py_RETURN_NONE;
  mml_err err;
  mml_err_clear(&err);
  mml_plan_info o;
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_loader_plan_info(self->L, epoch, &o, &err);
  Py_END_ALLOW_THREADS
  if (st) return mml_py_raise(mml_py_state_of_self(self), st, &err);
  return Py_BuildValue("{sLsLsLsLsLsLsLsL}", "q0", (long long)o.q0, "usable", (long long)o.usable,
                       "end", (long long)o.end, "steps", (long long)o.steps, "rank_samples",
                       (long long)o.rank_samples, "unusable", (long long)o.unusable, "indexed",
                       (long long)o.indexed, "measured", (long long)o.measured);
}
static PyObject *Loader_plan_position(LoaderObject *self, PyObject *unused) {
  if (check_usable(self)) return NULL;
  if (!mml_loader_has_plan(self->L)) Py_RETURN_NONE;
  mml_cursor c = mml_loader_cursor(self->L);
  mml_err err;
  mml_err_clear(&err);
  int64_t q0 = 0, q = 0;
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_loader_plan_position(self->L, &c, &q0, &q, &err);
  Py_END_ALLOW_THREADS
  if (st) return mml_py_raise(mml_py_state_of_self(self), st, &err);
  return Py_BuildValue("(LL)", (long long)q0, (long long)q);
}
static PyObject *Loader_seek_plan(LoaderObject *self, PyObject *args) {
  mml_cursor c;
  long long q0;
  if (!PyArg_ParseTuple(args, "LLLL:seek_plan", &c.epoch, &c.pos, &c.batch_in_epoch, &q0))
    return NULL;
  if (check_usable(self)) return NULL;
  mml_err err;
  mml_err_clear(&err);
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_loader_seek_plan(self->L, &c, q0, &err);
  Py_END_ALLOW_THREADS
  if (st) return mml_py_raise(mml_py_state_of_self(self), st, &err);
  Py_RETURN_NONE;
}
static PyObject *Loader_cursor(LoaderObject *self, PyObject *unused) {
  if (check_usable(self)) return NULL;
  mml_cursor c = mml_loader_cursor(self->L);
  return Py_BuildValue("(LLL)", (long long)c.epoch, (long long)c.pos, (long long)c.batch_in_epoch);
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
  return Py_BuildValue(
      "{s:L,s:L,s:L,s:L,s:s,s:N,s:i,s:i}", "num_samples", (long long)mml_loader_num_samples(L),
      "samples_per_rank", (long long)mml_loader_samples_per_rank(L), "batches_per_epoch",
      (long long)mml_loader_batches_per_epoch(L), "samples_per_epoch",
      (long long)mml_loader_samples_per_epoch(L), "data_hash", hash, "sources", src, "num_shards",
      mml_loader_num_shards(L), "index_shards", mml_loader_index_used(L));
}

/* stats()["sources"]: {name: {...}} in the mixture's order, from one snapshot. */
static PyObject *source_stats(const mml_source_stats *all, int n) {
  PyObject *out = PyDict_New();
  if (!out) return NULL;
  for (int i = 0; i < n; i++) {
    mml_source_stats ss = all[i];
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
    PyObject *e =
        Py_BuildValue("{s:L,s:L,s:K,s:K,s:N,s:L,s:L,s:K}", "num_samples", (long long)ss.num_samples,
                      "per_epoch", (long long)ss.per_epoch, "samples",
                      (unsigned long long)ss.samples, "skipped", (unsigned long long)ss.skipped,
                      "skipped_by_reason", reasons, "tokens", (long long)ss.tokens, "image_tokens",
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

static PyObject *Loader_options(LoaderObject *self, PyObject *unused) {
  if (check_usable(self)) return NULL;
  return mml_py_loader_cfg_to_dict(mml_loader_config(self->L));
}

static int set_num(PyObject *d, const char *k, PyObject *v) {
  if (!v) return -1;
  int rc = PyDict_SetItemString(d, k, v);
  Py_DECREF(v);
  return rc;
}

/* Page faults, the pixel rows moved and expanded, the video waits and bytes (stats). */
static int set_rows_video(PyObject *d, const mml_loader_stats *s) {
  return set_num(d, "page_faults", PyLong_FromUnsignedLongLong(s->page_faults)) ||
         set_num(d, "page_faults_per_batch",
                 s->page_faults_per_batch >= 0 ? PyFloat_FromDouble(s->page_faults_per_batch)
                                               : Py_NewRef(Py_None)) ||
         set_num(d, "pixel_rows_moved", PyLong_FromUnsignedLongLong(s->moved_rows)) ||
         set_num(d, "pixel_rows_expanded", PyLong_FromUnsignedLongLong(s->expanded_rows)) ||
         set_num(d, "pixel_rows_expanded_in_place",
                 PyLong_FromUnsignedLongLong(s->expanded_inplace_rows)) ||
         set_num(d, "pixel_rows_expanded_shared",
                 PyLong_FromUnsignedLongLong(s->expanded_shared_rows)) ||
         set_num(d, "video_plan_waits", PyLong_FromUnsignedLongLong(s->video_plan_waits)) ||
         set_num(d, "video_decode_waits", PyLong_FromUnsignedLongLong(s->video_decode_waits)) ||
         set_num(d, "video_preload_peak_bytes", PyLong_FromLongLong(s->video_preload_peak)) ||
         set_num(d, "video_preloads_refused",
                 PyLong_FromUnsignedLongLong(s->video_preloads_refused)) ||
         set_num(d, "video_open_peak_bytes", PyLong_FromLongLong(s->video_open_peak)) ||
         set_num(d, "samples_reread", PyLong_FromUnsignedLongLong(s->samples_reread)) ||
         set_num(d, "room_waits", PyLong_FromUnsignedLongLong(s->room_waits)) ||
         set_num(d, "consumer_waits", PyLong_FromUnsignedLongLong(s->consumer_waits)) ||
         set_num(d, "collator_room_waits", PyLong_FromUnsignedLongLong(s->collator_room_waits));
}

/* The engine's memory in parts (stats): the pool, the window's bytes, decoder scratch. */
static int set_memory(PyObject *d, const mml_loader_stats *s) {
  return set_num(d, "pool_cached_bytes", PyLong_FromSize_t(s->pool_cached)) ||
         set_num(d, "pool_live_bytes", PyLong_FromSize_t(s->pool_live)) ||
         set_num(d, "pool_live_peak_bytes", PyLong_FromSize_t(s->pool_live_peak)) ||
         set_num(d, "pool_peak_bytes", PyLong_FromSize_t(s->pool_peak)) ||
         set_num(d, "window_bytes", PyLong_FromLongLong(s->window_bytes)) ||
         set_num(d, "scratch_mapped_bytes", PyLong_FromSize_t(s->scratch_mapped)) ||
         set_num(d, "scratch_mapped_peak_bytes", PyLong_FromSize_t(s->scratch_mapped_peak));
}

static PyObject *Loader_stats(LoaderObject *self, PyObject *unused) {
  if (check_usable(self)) return NULL;
  mml_loader_stats s;
  int nsrc = mml_loader_num_sources(self->L);
  /* the totals and every source in one snapshot: sum of samples == good_samples */
  mml_source_stats *ss = PyMem_Calloc((size_t)(nsrc > 0 ? nsrc : 1), sizeof *ss);
  if (!ss) return PyErr_NoMemory();
  mml_loader_get_stats_all(self->L, &s, ss, nsrc);
  PyObject *d = PyDict_New(), *reasons = PyDict_New();
  if (!d || !reasons) goto fail;
  for (int i = 0; i < s.nreasons; i++)
    if (set_num(reasons, s.reason[i], PyLong_FromUnsignedLongLong(s.reason_count[i]))) goto fail;
  double ratio = s.wall_s > 0 ? s.wait_s / s.wall_s : 0.0;
  if (ratio > 1) ratio = 1;
  double eff = s.token_slots > 0 ? (double)s.real_tokens / (double)s.token_slots : 0.0;
  if (set_num(d, "wait_time_ratio", PyFloat_FromDouble(ratio)) ||
      set_num(d, "wait_s", PyFloat_FromDouble(s.wait_s)) ||
      set_num(d, "wait_emit_s", PyFloat_FromDouble(s.wait_emit_s)) ||
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
      set_num(d, "device",
              s.device >= 0 ? PyUnicode_FromFormat("cuda:%d", s.device)
                            : PyUnicode_FromString("cpu")) ||
      set_memory(d, &s) || set_rows_video(d, &s))
    goto fail;
  if (PyDict_SetItemString(d, "skipped_by_reason", reasons)) goto fail;
  Py_CLEAR(reasons);
  if (set_num(d, "sources", source_stats(ss, nsrc))) goto fail;
  PyMem_Free(ss);
  ss = NULL;
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
        "latency_p90_s", s.fetch.latency_p90_s, "latency_p99_s", s.fetch.latency_p99_s, "inflight",
        s.fetch.inflight);
    if (set_num(d, "fetch", f)) goto fail;
  }
  if (s.parquet) {
    PyObject *q = Py_BuildValue(
        "{s:K,s:K,s:L,s:L,s:L}", "row_groups_decoded", (unsigned long long)s.pq_row_groups,
        "bytes_read", (unsigned long long)s.pq_bytes_read, "cache_bytes",
        (long long)s.pq_cache_bytes, "cache_peak_bytes", (long long)s.pq_cache_peak, "cache_room",
        (long long)s.pq_cache_room);
    if (set_num(d, "parquet", q)) goto fail;
  }
  return d;
fail:
  PyMem_Free(ss);
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

static PyObject *Loader_get_closed(LoaderObject *self, void *c) {
  return PyBool_FromLong(!self->L);
}

static PyMethodDef Loader_methods[] = {
    {"next", (PyCFunction)Loader_next, METH_NOARGS,
     "The next batch (dict of Tensor); StopIteration at the end of an epoch."},
    {"seek", (PyCFunction)Loader_seek, METH_VARARGS,
     "seek(epoch, pos, batch_in_epoch, ahead=0): ahead > 0 starts no work beyond that many "
     "samples (plus one per skipped sample)"},
    {"cursor", (PyCFunction)Loader_cursor, METH_NOARGS,
     "(epoch, pos, batch_in_epoch) after the last delivered batch."},
    {"info", (PyCFunction)Loader_info, METH_NOARGS, "Sizes and the data hash."},
    {"plan_info", (PyCFunction)Loader_plan_info, METH_VARARGS,
     "plan_info(epoch): the global plan of that epoch (q0, usable, end, steps, rank_samples, "
     "unusable), None without a plan."},
    {"plan_position", (PyCFunction)Loader_plan_position, METH_NOARGS,
     "(q0, global count) of the cursor under the global plan, None without one."},
    {"seek_plan", (PyCFunction)Loader_seek_plan, METH_VARARGS,
     "seek_plan(epoch, pos, batch_in_epoch, q0): seek within the epoch's plan starting at q0."},
    {"options", (PyCFunction)Loader_options, METH_NOARGS,
     "The options the engine runs with, by the option table (credentials left out)."},
    {"stats", (PyCFunction)Loader_stats, METH_NOARGS, "Engine statistics."},
    {"close", (PyCFunction)Loader_close, METH_NOARGS, "Stops and joins every thread."},
    {"set_consumer_stream", (PyCFunction)Loader_set_consumer_stream, METH_VARARGS,
     "set_consumer_stream(device, stream): pinned batches delivered from now on are not "
     "reused before work queued on that cudaStream_t before their release is done."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Loader_getset[] = {
    {"closed", (getter)Loader_get_closed, NULL, "True once closed.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot Loader_slots[] = {{Py_tp_dealloc, Loader_dealloc},
                                     {Py_tp_traverse, Loader_traverse},
                                     {Py_tp_clear, Loader_clear},
                                     {Py_tp_doc, "Engine of mmloader.Loader (use that class)."},
                                     {Py_tp_methods, Loader_methods},
                                     {Py_tp_getset, Loader_getset},
                                     {Py_tp_init, Loader_init},
                                     {Py_tp_new, PyType_GenericNew},
                                     {0, NULL}};

static PyType_Spec Loader_spec = {
    .name = "mmloader._core._Loader",
    .basicsize = sizeof(LoaderObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Loader_slots,
};

int mml_py_loader_exec(PyObject *m) {
  return mml_py_add_type(m, &Loader_spec, &mml_py_state_of(m)->Loader_Type, "_Loader");
}
