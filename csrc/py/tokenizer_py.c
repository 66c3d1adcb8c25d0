/*
 * tokenizer_py.c — mmloader._core.Tokenizer: the CPython face of csrc/core/tokenizer.c.
 *
 * Threads: the core tokenizer is immutable, so the GIL is released around every encode
 * and decode.  Each call borrows a scratch (caches, buffers) from a small pool guarded by a
 * mutex held only to pop/push, so concurrent Python threads never share one.
 * encode_batch runs its own C threads (no Python calls in them), each with its own
 * scratch, and builds the result lists after taking the GIL back.
 * The mmloader.Tokenizer Python class subclasses this type; the engine takes the core
 * tokenizer from such an object with mml_py_tokenizer_get().
 */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>
#ifdef __linux__
#include <sched.h>
#endif

#include "binding.h"
#include "mml/tokenizer.h"
#include "mml/pretok.h"

#define POOL_MAX 64
#define BATCH_MAX_THREADS 256

typedef struct {
  mml_tok_scratch *scratch;
  mml_ids ids;
} tok_slot;

typedef struct {
  PyObject_HEAD
  mml_tokenizer *tok;
  pthread_mutex_t lock; /* guards pool/npool */
  tok_slot *pool[POOL_MAX];
  int npool;
} TokObject;

static PyTypeObject TokType;

static void slot_free(tok_slot *s) {
  if (!s) return;
  mml_tok_scratch_free(s->scratch);
  mml_ids_free(&s->ids);
  free(s);
}

/* Pops a slot from the pool or makes one; NULL when out of memory.  No GIL needed. */
static tok_slot *slot_get(TokObject *self) {
  tok_slot *s = NULL;
  pthread_mutex_lock(&self->lock);
  if (self->npool) s = self->pool[--self->npool];
  pthread_mutex_unlock(&self->lock);
  if (s) return s;
  s = calloc(1, sizeof *s);
  if (s && mml_tok_scratch_new(&s->scratch) != MML_OK) {
    free(s);
    s = NULL;
  }
  return s;
}

static void slot_put(TokObject *self, tok_slot *s) {
  if (!s) return;
  mml_ids_clear(&s->ids);
  pthread_mutex_lock(&self->lock);
  if (self->npool < POOL_MAX) {
    self->pool[self->npool++] = s;
    s = NULL;
  }
  pthread_mutex_unlock(&self->lock);
  slot_free(s);
}

static PyObject *Tok_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  TokObject *self = (TokObject *)type->tp_alloc(type, 0);
  if (!self) return NULL;
  pthread_mutex_init(&self->lock, NULL);
  return (PyObject *)self;
}

static void Tok_dealloc(TokObject *self) {
  for (int i = 0; i < self->npool; i++) slot_free(self->pool[i]);
  self->npool = 0;
  mml_tokenizer_free(self->tok);
  self->tok = NULL;
  pthread_mutex_destroy(&self->lock);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Tok_init(TokObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"path", "json", NULL};
  PyObject *path = Py_None, *json = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO:Tokenizer", kwlist, &path, &json)) return -1;
  if ((path == Py_None) == (json == Py_None)) {
    PyErr_SetString(PyExc_TypeError, "Tokenizer() takes a path or json=, exactly one");
    return -1;
  }
  if (self->tok) {
    PyErr_SetString(PyExc_TypeError, "Tokenizer is already initialised");
    return -1;
  }
  mml_err err = {0};
  mml_status st;
  mml_tokenizer *t = NULL;
  if (path != Py_None) {
    PyObject *bytes = NULL;
    if (!PyUnicode_FSConverter(path, &bytes)) return -1;
    const char *p = PyBytes_AS_STRING(bytes);
    Py_BEGIN_ALLOW_THREADS
    st = mml_tokenizer_load(p, &t, &err);
    Py_END_ALLOW_THREADS
    Py_DECREF(bytes);
  } else {
    Py_ssize_t n;
    const char *s = PyUnicode_Check(json) ? PyUnicode_AsUTF8AndSize(json, &n) : NULL;
    if (!s) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "json must be a str");
      return -1;
    }
    Py_BEGIN_ALLOW_THREADS
    st = mml_tokenizer_load_json(s, (size_t)n, &t, &err);
    Py_END_ALLOW_THREADS
  }
  if (st) {
    if (st == MML_ENOENT) {
      PyErr_SetString(PyExc_FileNotFoundError, err.msg);
      return -1;
    }
    mml_py_raise(st, &err);
    return -1;
  }
  self->tok = t;
  return 0;
}

static int ready(TokObject *self) {
  if (self->tok) return 1;
  PyErr_SetString(PyExc_ValueError, "Tokenizer is not initialised");
  return 0;
}

const struct mml_tokenizer *mml_py_tokenizer_get(PyObject *obj) {
  if (!obj || !PyObject_TypeCheck(obj, &TokType)) {
    PyErr_Format(PyExc_TypeError, "expected a mmloader.Tokenizer, got %.100s",
                 obj ? Py_TYPE(obj)->tp_name : "NULL");
    return NULL;
  }
  TokObject *self = (TokObject *)obj;
  return ready(self) ? self->tok : NULL;
}

static PyObject *ids_to_list(const int32_t *ids, size_t n) {
  PyObject *l = PyList_New((Py_ssize_t)n);
  if (!l) return NULL;
  for (size_t i = 0; i < n; i++) {
    PyObject *v = PyLong_FromLong(ids[i]);
    if (!v) {
      Py_DECREF(l);
      return NULL;
    }
    PyList_SET_ITEM(l, (Py_ssize_t)i, v);
  }
  return l;
}

/* UTF-8 of a str (lone surrogates raise UnicodeEncodeError; tokenizers raises TypeError),
 * or the bytes of a bytes object (taken as UTF-8; the core replaces invalid sequences). */
static const char *text_utf8(PyObject *text, Py_ssize_t *n) {
  if (PyBytes_Check(text)) {
    char *s;
    return PyBytes_AsStringAndSize(text, &s, n) < 0 ? NULL : s;
  }
  if (!PyUnicode_Check(text)) {
    PyErr_Format(PyExc_TypeError, "text must be a str or bytes, not %.100s",
                 Py_TYPE(text)->tp_name);
    return NULL;
  }
  return PyUnicode_AsUTF8AndSize(text, n);
}

static PyObject *Tok_encode(TokObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"text", NULL};
  PyObject *text;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O:encode", kwlist, &text)) return NULL;
  if (!ready(self)) return NULL;
  Py_ssize_t n;
  const char *s = text_utf8(text, &n);
  if (!s) return NULL;
  mml_err err = {0};
  mml_status st;
  tok_slot *slot;
  if (n < 256) { /* short text: cheaper to keep the GIL than to hand it back and forth */
    slot = slot_get(self);
    st = slot ? mml_tokenizer_encode(self->tok, slot->scratch, s, (size_t)n, &slot->ids, &err)
              : MML_ENOMEM;
  } else {
    Py_BEGIN_ALLOW_THREADS
    slot = slot_get(self);
    st = slot ? mml_tokenizer_encode(self->tok, slot->scratch, s, (size_t)n, &slot->ids, &err)
              : MML_ENOMEM;
    Py_END_ALLOW_THREADS
  }
  PyObject *res = st ? mml_py_raise(st, &err) : ids_to_list(slot->ids.data, slot->ids.len);
  slot_put(self, slot);
  return res;
}

/* ---- encode_batch ------------------------------------------------------------------ */

typedef struct {
  TokObject *self;
  const char **texts;
  size_t *lens;
  size_t n;
  atomic_size_t next;
  atomic_int failed;
  /* per text: which worker holds its ids, where */
  uint32_t *owner;
  size_t *off, *len;
  tok_slot **slots; /* per worker */
  mml_status st;
  mml_err err;
  size_t err_index;
  pthread_mutex_t err_lock;
} batch_job;

static void batch_fail(batch_job *job, size_t i, mml_status st, const mml_err *err) {
  pthread_mutex_lock(&job->err_lock);
  if (!job->st || i < job->err_index) {
    job->st = st;
    job->err_index = i;
    if (err) job->err = *err;
    else mml_err_set(&job->err, st, "%s", mml_status_message(st));
  }
  pthread_mutex_unlock(&job->err_lock);
  atomic_store(&job->failed, 1);
}

typedef struct {
  batch_job *job;
  uint32_t w;
} batch_arg;

static void *batch_worker(void *p) {
  batch_arg *a = p;
  batch_job *job = a->job;
  tok_slot *slot = job->slots[a->w];
  for (;;) {
    size_t i = atomic_fetch_add(&job->next, 1);
    if (i >= job->n || atomic_load(&job->failed)) break;
    mml_err err = {0};
    size_t before = slot->ids.len;
    mml_status st = mml_tokenizer_encode(job->self->tok, slot->scratch, job->texts[i],
                                         job->lens[i], &slot->ids, &err);
    if (st) {
      batch_fail(job, i, st, &err);
      break;
    }
    job->owner[i] = a->w;
    job->off[i] = before;
    job->len[i] = slot->ids.len - before;
  }
  return NULL;
}

static size_t default_threads(void) {
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int c = CPU_COUNT(&set);
    if (c > 0) return (size_t)c;
  }
#endif
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  return c > 0 ? (size_t)c : 1;
}

static PyObject *Tok_encode_batch(TokObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"texts", "num_threads", NULL};
  PyObject *texts;
  Py_ssize_t nthreads_arg = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|n:encode_batch", kwlist, &texts, &nthreads_arg))
    return NULL;
  if (!ready(self)) return NULL;
  if (nthreads_arg < 0) {
    PyErr_SetString(PyExc_ValueError, "num_threads must be >= 0 (0: one per CPU)");
    return NULL;
  }
  PyObject *seq = PySequence_Fast(texts, "texts must be a sequence of str");
  if (!seq) return NULL;
  size_t n = (size_t)PySequence_Fast_GET_SIZE(seq);
  PyObject *result = NULL;
  batch_job job = {0};
  job.self = self;
  job.n = n;
  pthread_mutex_init(&job.err_lock, NULL);
  size_t nw = nthreads_arg ? (size_t)nthreads_arg : default_threads();
  if (nw > n) nw = n;
  if (nw > BATCH_MAX_THREADS) nw = BATCH_MAX_THREADS;
  if (nw == 0) nw = 1;
  job.texts = malloc((n + 1) * sizeof *job.texts);
  job.lens = malloc((n + 1) * sizeof *job.lens);
  job.owner = malloc((n + 1) * sizeof *job.owner);
  job.off = malloc((n + 1) * sizeof *job.off);
  job.len = malloc((n + 1) * sizeof *job.len);
  job.slots = calloc(nw, sizeof *job.slots);
  pthread_t *tids = calloc(nw, sizeof *tids);
  batch_arg *bargs = calloc(nw, sizeof *bargs);
  if (!job.texts || !job.lens || !job.owner || !job.off || !job.len || !job.slots || !tids ||
      !bargs) {
    PyErr_NoMemory();
    goto done;
  }
  for (size_t i = 0; i < n; i++) {
    Py_ssize_t len;
    const char *s = text_utf8(PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)i), &len);
    if (!s) goto done;
    job.texts[i] = s;
    job.lens[i] = (size_t)len;
  }
  int nomem = 0;
  Py_BEGIN_ALLOW_THREADS
  for (size_t w = 0; w < nw; w++) {
    job.slots[w] = slot_get(self);
    if (!job.slots[w]) nomem = 1;
    bargs[w] = (batch_arg){&job, (uint32_t)w};
  }
  if (!nomem) {
    size_t started = 1;
    for (size_t w = 1; w < nw; w++) {
      if (pthread_create(&tids[w], NULL, batch_worker, &bargs[w]) != 0) break;
      started++;
    }
    batch_worker(&bargs[0]); /* the calling thread works too */
    for (size_t w = 1; w < started; w++) pthread_join(tids[w], NULL);
  }
  Py_END_ALLOW_THREADS
  if (nomem) {
    PyErr_NoMemory();
    goto done;
  }
  if (job.st) {
    mml_err_prefix(&job.err, "texts[%zu]", job.err_index);
    mml_py_raise(job.st, &job.err);
    goto done;
  }
  result = PyList_New((Py_ssize_t)n);
  if (!result) goto done;
  for (size_t i = 0; i < n; i++) {
    tok_slot *slot = job.slots[job.owner[i]];
    PyObject *l = ids_to_list(slot->ids.data + job.off[i], job.len[i]);
    if (!l) {
      Py_CLEAR(result);
      goto done;
    }
    PyList_SET_ITEM(result, (Py_ssize_t)i, l);
  }
done:
  if (job.slots)
    for (size_t w = 0; w < nw; w++) slot_put(self, job.slots[w]);
  free(job.texts);
  free(job.lens);
  free(job.owner);
  free(job.off);
  free(job.len);
  free(job.slots);
  free(tids);
  free(bargs);
  pthread_mutex_destroy(&job.err_lock);
  Py_DECREF(seq);
  return result;
}

/* ---- decode and lookups -------------------------------------------------------------- */

static PyObject *Tok_decode(TokObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"ids", "skip_special_tokens", NULL};
  PyObject *ids;
  int skip = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|p:decode", kwlist, &ids, &skip)) return NULL;
  if (!ready(self)) return NULL;
  PyObject *seq = PySequence_Fast(ids, "ids must be a sequence of int");
  if (!seq) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  int32_t *v = malloc(((size_t)n + 1) * sizeof *v);
  if (!v) {
    Py_DECREF(seq);
    return PyErr_NoMemory();
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    long x = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
    if (x == -1 && PyErr_Occurred()) {
      free(v);
      Py_DECREF(seq);
      return NULL;
    }
    if (x < INT32_MIN || x > INT32_MAX) x = -1;
    v[i] = (int32_t)x;
  }
  Py_DECREF(seq);
  mml_bytes out = {0};
  mml_err err = {0};
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_tokenizer_decode_ex(self->tok, v, (size_t)n, skip ? MML_TOK_SKIP_SPECIAL : 0, &out,
                               &err);
  Py_END_ALLOW_THREADS
  free(v);
  PyObject *res;
  if (st == MML_EINVAL) {
    PyErr_SetString(PyExc_ValueError, err.msg);
    res = NULL;
  } else if (st) {
    res = mml_py_raise(st, &err);
  } else {
    res = PyUnicode_DecodeUTF8(out.len ? (const char *)out.data : "", (Py_ssize_t)out.len,
                               "strict");
  }
  mml_bytes_free(&out);
  return res;
}

static PyObject *Tok_token_to_id(TokObject *self, PyObject *arg) {
  if (!ready(self)) return NULL;
  Py_ssize_t n;
  const char *s = text_utf8(arg, &n);
  if (!s) return NULL;
  int32_t id = mml_tokenizer_token_to_id(self->tok, s, (size_t)n);
  if (id < 0) Py_RETURN_NONE;
  return PyLong_FromLong(id);
}

static PyObject *Tok_id_to_token(TokObject *self, PyObject *arg) {
  if (!ready(self)) return NULL;
  long id = PyLong_AsLong(arg);
  if (id == -1 && PyErr_Occurred()) return NULL;
  size_t len;
  const char *s = (id < 0 || id > INT32_MAX) ? NULL
                                             : mml_tokenizer_id_to_token(self->tok, (int32_t)id, &len);
  if (!s) Py_RETURN_NONE;
  return PyUnicode_DecodeUTF8(s, (Py_ssize_t)len, "replace");
}

static PyObject *Tok_is_special(TokObject *self, PyObject *arg) {
  if (!ready(self)) return NULL;
  long id = PyLong_AsLong(arg);
  if (id == -1 && PyErr_Occurred()) return NULL;
  return PyBool_FromLong(id >= 0 && id <= INT32_MAX &&
                         mml_tokenizer_is_special(self->tok, (int32_t)id));
}

static PyObject *Tok_vocab_size(TokObject *self, void *closure) {
  if (!ready(self)) return NULL;
  return PyLong_FromSize_t(mml_tokenizer_vocab_size(self->tok));
}

static PyMethodDef Tok_methods[] = {
    {"encode", (PyCFunction)(void (*)(void))Tok_encode, METH_VARARGS | METH_KEYWORDS,
     "encode(text) -> list[int]\n\nToken ids of `text`, exactly as `tokenizers` would give them "
     "(added and special tokens in the text are recognised).  A str with lone surrogates "
     "raises UnicodeEncodeError; bytes are read as UTF-8, invalid sequences becoming U+FFFD."},
    {"encode_batch", (PyCFunction)(void (*)(void))Tok_encode_batch, METH_VARARGS | METH_KEYWORDS,
     "encode_batch(texts, num_threads=0) -> list[list[int]]\n\nencode() of every text, in "
     "parallel C threads with the GIL released (num_threads=0: one per CPU)."},
    {"decode", (PyCFunction)(void (*)(void))Tok_decode, METH_VARARGS | METH_KEYWORDS,
     "decode(ids, skip_special_tokens=False) -> str\n\nText of `ids`; invalid UTF-8 becomes "
     "U+FFFD.  An id outside the vocabulary raises ValueError."},
    {"token_to_id", (PyCFunction)Tok_token_to_id, METH_O,
     "token_to_id(token) -> int | None"},
    {"id_to_token", (PyCFunction)Tok_id_to_token, METH_O,
     "id_to_token(id) -> str | None\n\nThe token string as stored in tokenizer.json (byte-level "
     "symbols, e.g. 'Ġhello')."},
    {"is_special", (PyCFunction)Tok_is_special, METH_O,
     "is_special(id) -> bool\n\nWhether id is a special added token."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Tok_getset[] = {
    {"vocab_size", (getter)Tok_vocab_size, NULL,
     "Number of distinct tokens, added tokens included.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject TokType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mmloader._core.Tokenizer",
    .tp_basicsize = sizeof(TokObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json.\n\n"
              "Tokenizer(path) or Tokenizer(json=text).  Use mmloader.Tokenizer.",
    .tp_new = Tok_new,
    .tp_init = (initproc)Tok_init,
    .tp_dealloc = (destructor)Tok_dealloc,
    .tp_methods = Tok_methods,
    .tp_getset = Tok_getset,
};

/* ---- test hooks: the pieces of the pre-tokenizer and NFC on their own ------------------ */

static PyObject *py_tok_pre_split(PyObject *mod, PyObject *text) {
  Py_ssize_t n;
  const char *s = text_utf8(text, &n);
  if (!s || mml_pretok_init() != MML_OK) return s ? PyErr_NoMemory() : NULL;
  PyObject *l = PyList_New(0);
  for (size_t pos = 0; l && pos < (size_t)n;) {
    size_t e = mml_pretok_next((const uint8_t *)s, (size_t)n, pos);
    PyObject *piece = PyUnicode_DecodeUTF8(s + pos, (Py_ssize_t)(e - pos), "strict");
    if (!piece || PyList_Append(l, piece) < 0) Py_CLEAR(l);
    Py_XDECREF(piece);
    pos = e;
  }
  return l;
}

static PyObject *py_tok_nfc(PyObject *mod, PyObject *text) {
  Py_ssize_t n;
  const char *s = text_utf8(text, &n);
  if (!s || mml_pretok_init() != MML_OK) return s ? PyErr_NoMemory() : NULL;
  if (mml_nfc_quick_check((const uint8_t *)s, (size_t)n)) return PyUnicode_FromStringAndSize(s, n);
  mml_bytes out = {0};
  if (mml_nfc_append((const uint8_t *)s, (size_t)n, &out) != MML_OK) return PyErr_NoMemory();
  PyObject *r = PyUnicode_DecodeUTF8(out.len ? (const char *)out.data : "", (Py_ssize_t)out.len,
                                     "strict");
  mml_bytes_free(&out);
  return r;
}

static PyObject *py_tok_nfc_quick(PyObject *mod, PyObject *text) {
  Py_ssize_t n;
  const char *s = text_utf8(text, &n);
  if (!s || mml_pretok_init() != MML_OK) return s ? PyErr_NoMemory() : NULL;
  return PyBool_FromLong(mml_nfc_quick_check((const uint8_t *)s, (size_t)n));
}

static PyMethodDef tok_functions[] = {
    {"_tok_pre_split", py_tok_pre_split, METH_O, "Test hook: the Qwen regex pieces of text."},
    {"_tok_nfc", py_tok_nfc, METH_O, "Test hook: NFC as the tokenizer computes it."},
    {"_tok_nfc_quick", py_tok_nfc_quick, METH_O, "Test hook: the NFC quick check."},
    {NULL, NULL, 0, NULL}};

int mml_py_tokenizer_register(PyObject *m) {
  if (PyModule_AddFunctions(m, tok_functions) < 0) return -1;
  if (PyType_Ready(&TokType) < 0) return -1;
  Py_INCREF(&TokType);
  if (PyModule_AddObject(m, "Tokenizer", (PyObject *)&TokType) < 0) {
    Py_DECREF(&TokType);
    return -1;
  }
  return 0;
}
