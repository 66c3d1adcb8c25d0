/*
 * tokenizer_py.c — mmloader._core.Tokenizer: the CPython face of csrc/core/text/tokenizer.c.
 *
 * Threads: the core tokenizer is immutable, so the GIL is released around every encode
 * and decode.  Each call borrows a slot (scratch + id buffer) from the object's
 * mml_tok_pool, so concurrent Python threads never share one.  encode_batch is the core's
 * mml_tokenizer_encode_batch (its threads make no Python calls); the result lists are
 * built after taking the GIL back.
 * The mmloader.Tokenizer Python class subclasses this type; the engine takes the core
 * tokenizer from such an object with mml_py_tokenizer_get().
 */
#include "binding.h"
#include "mml/tokenizer.h"
#include "mml/pretok.h"

#define POOL_MAX 64

typedef struct {
  PyObject_HEAD
  mml_tokenizer *tok;
  mml_tok_pool *pool; /* idle slots, at most POOL_MAX */
} TokenizerObject;

static PyObject *Tokenizer_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  TokenizerObject *self = (TokenizerObject *)type->tp_alloc(type, 0);
  if (!self) return NULL;
  if (mml_tok_pool_new(POOL_MAX, &self->pool) != MML_OK) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  return (PyObject *)self;
}

static void Tokenizer_dealloc(TokenizerObject *self) {
  mml_tok_pool_free(self->pool);
  self->pool = NULL;
  mml_tokenizer_free(self->tok);
  self->tok = NULL;
  PyTypeObject *tp = Py_TYPE(self);
  tp->tp_free((PyObject *)self);
  Py_DECREF(tp); /* heap type: each instance holds a reference */
}

static int Tokenizer_init(TokenizerObject *self, PyObject *args, PyObject *kw) {
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
    mml_py_raise(mml_py_state_of_self(self), st, &err);
    return -1;
  }
  self->tok = t;
  return 0;
}

static int ready(TokenizerObject *self) {
  if (self->tok) return 1;
  PyErr_SetString(PyExc_ValueError, "Tokenizer is not initialised");
  return 0;
}

const struct mml_tokenizer *mml_py_tokenizer_get(mml_py_state *ms, PyObject *obj) {
  if (!obj || !PyObject_TypeCheck(obj, ms->Tokenizer_Type)) {
    PyErr_Format(PyExc_TypeError, "expected a mmloader.Tokenizer, got %.100s",
                 obj ? Py_TYPE(obj)->tp_name : "NULL");
    return NULL;
  }
  TokenizerObject *self = (TokenizerObject *)obj;
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

static PyObject *Tokenizer_encode(TokenizerObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"text", NULL};
  PyObject *text;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O:encode", kwlist, &text)) return NULL;
  if (!ready(self)) return NULL;
  Py_ssize_t n;
  const char *s = text_utf8(text, &n);
  if (!s) return NULL;
  mml_err err = {0};
  mml_status st;
  mml_tok_slot *slot;
  if (n < 256) { /* short text: cheaper to keep the GIL than to hand it back and forth */
    slot = mml_tok_pool_get(self->pool);
    st = slot ? mml_tokenizer_encode(self->tok, slot->scratch, s, (size_t)n, &slot->ids, &err)
              : MML_ENOMEM;
  } else {
    Py_BEGIN_ALLOW_THREADS
    slot = mml_tok_pool_get(self->pool);
    st = slot ? mml_tokenizer_encode(self->tok, slot->scratch, s, (size_t)n, &slot->ids, &err)
              : MML_ENOMEM;
    Py_END_ALLOW_THREADS
  }
  PyObject *res = st ? mml_py_raise(mml_py_state_of_self(self), st, &err)
                     : ids_to_list(slot->ids.data, slot->ids.len);
  mml_tok_pool_put(self->pool, slot);
  return res;
}

/* ---- encode_batch ------------------------------------------------------------------ */

static PyObject *batch_lists(const mml_tok_batch *b) {
  size_t n = mml_tok_batch_size(b);
  PyObject *result = PyList_New((Py_ssize_t)n);
  if (!result) return NULL;
  for (size_t i = 0; i < n; i++) {
    size_t len;
    const int32_t *ids = mml_tok_batch_ids(b, i, &len);
    PyObject *l = ids_to_list(ids, len);
    if (!l) {
      Py_DECREF(result);
      return NULL;
    }
    PyList_SET_ITEM(result, (Py_ssize_t)i, l);
  }
  return result;
}

static PyObject *Tokenizer_encode_batch(TokenizerObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"texts", "num_threads", NULL};
  PyObject *texts;
  Py_ssize_t nthreads = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|n:encode_batch", kwlist, &texts, &nthreads))
    return NULL;
  if (!ready(self)) return NULL;
  if (nthreads < 0) {
    PyErr_SetString(PyExc_ValueError, "num_threads must be >= 0 (0: one per CPU)");
    return NULL;
  }
  PyObject *seq = PySequence_Fast(texts, "texts must be a sequence of str");
  if (!seq) return NULL;
  size_t n = (size_t)PySequence_Fast_GET_SIZE(seq);
  PyObject *result = NULL;
  const char **ptrs = malloc((n + 1) * sizeof *ptrs);
  size_t *lens = malloc((n + 1) * sizeof *lens);
  if (!ptrs || !lens) {
    PyErr_NoMemory();
    goto done;
  }
  for (size_t i = 0; i < n; i++) { /* borrowed from the items, which seq keeps alive */
    Py_ssize_t len;
    if (!(ptrs[i] = text_utf8(PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)i), &len))) goto done;
    lens[i] = (size_t)len;
  }
  mml_tok_batch *b = NULL;
  mml_err err = {0};
  mml_status st;
  Py_BEGIN_ALLOW_THREADS
  st = mml_tokenizer_encode_batch(self->tok, self->pool, ptrs, lens, n, (size_t)nthreads, &b, &err);
  Py_END_ALLOW_THREADS
  if (st) {
    mml_py_raise(mml_py_state_of_self(self), st, &err);
    goto done;
  }
  result = batch_lists(b);
  mml_tok_batch_free(b); /* its slots back to the pool */
done:
  free(ptrs);
  free(lens);
  Py_DECREF(seq);
  return result;
}

/* ---- decode and lookups -------------------------------------------------------------- */

static PyObject *Tokenizer_decode(TokenizerObject *self, PyObject *args, PyObject *kw) {
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
  st =
      mml_tokenizer_decode_ex(self->tok, v, (size_t)n, skip ? MML_TOK_SKIP_SPECIAL : 0, &out, &err);
  Py_END_ALLOW_THREADS
  free(v);
  PyObject *res;
  if (st == MML_EINVAL) {
    PyErr_SetString(PyExc_ValueError, err.msg);
    res = NULL;
  } else if (st) {
    res = mml_py_raise(mml_py_state_of_self(self), st, &err);
  } else {
    res =
        PyUnicode_DecodeUTF8(out.len ? (const char *)out.data : "", (Py_ssize_t)out.len, "strict");
  }
  mml_bytes_free(&out);
  return res;
}

static PyObject *Tokenizer_token_to_id(TokenizerObject *self, PyObject *arg) {
  if (!ready(self)) return NULL;
  Py_ssize_t n;
  const char *s = text_utf8(arg, &n);
  if (!s) return NULL;
  int32_t id = mml_tokenizer_token_to_id(self->tok, s, (size_t)n);
  if (id < 0) Py_RETURN_NONE;
  return PyLong_FromLong(id);
}

static PyObject *Tokenizer_id_to_token(TokenizerObject *self, PyObject *arg) {
  if (!ready(self)) return NULL;
  long id = PyLong_AsLong(arg);
  if (id == -1 && PyErr_Occurred()) return NULL;
  size_t len;
  const char *s =
      (id < 0 || id > INT32_MAX) ? NULL : mml_tokenizer_id_to_token(self->tok, (int32_t)id, &len);
  if (!s) Py_RETURN_NONE;
  return PyUnicode_DecodeUTF8(s, (Py_ssize_t)len, "replace");
}

static PyObject *Tokenizer_is_special(TokenizerObject *self, PyObject *arg) {
  if (!ready(self)) return NULL;
  long id = PyLong_AsLong(arg);
  if (id == -1 && PyErr_Occurred()) return NULL;
  return PyBool_FromLong(id >= 0 && id <= INT32_MAX &&
                         mml_tokenizer_is_special(self->tok, (int32_t)id));
}

static PyObject *Tokenizer_get_vocab_size(TokenizerObject *self, void *closure) {
  if (!ready(self)) return NULL;
  return PyLong_FromSize_t(mml_tokenizer_vocab_size(self->tok));
}

static PyMethodDef Tokenizer_methods[] = {
    {"encode", (PyCFunction)(void (*)(void))Tokenizer_encode, METH_VARARGS | METH_KEYWORDS,
     "encode(text) -> list[int]\n\nToken ids of `text`, exactly as `tokenizers` would give them "
     "(added and special tokens in the text are recognised).  A str with lone surrogates "
     "raises UnicodeEncodeError; bytes are read as UTF-8, invalid sequences becoming U+FFFD."},
    {"encode_batch", (PyCFunction)(void (*)(void))Tokenizer_encode_batch,
     METH_VARARGS | METH_KEYWORDS,
     "encode_batch(texts, num_threads=0) -> list[list[int]]\n\nencode() of every text, in "
     "parallel C threads with the GIL released (num_threads=0: one per CPU)."},
    {"decode", (PyCFunction)(void (*)(void))Tokenizer_decode, METH_VARARGS | METH_KEYWORDS,
     "decode(ids, skip_special_tokens=False) -> str\n\nText of `ids`; invalid UTF-8 becomes "
     "U+FFFD.  An id outside the vocabulary raises ValueError."},
    {"token_to_id", (PyCFunction)Tokenizer_token_to_id, METH_O, "token_to_id(token) -> int | None"},
    {"id_to_token", (PyCFunction)Tokenizer_id_to_token, METH_O,
     "id_to_token(id) -> str | None\n\nThe token string as stored in tokenizer.json (byte-level "
     "symbols, e.g. 'Ġhello')."},
    {"is_special", (PyCFunction)Tokenizer_is_special, METH_O,
     "is_special(id) -> bool\n\nWhether id is a special added token."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Tokenizer_getset[] = {
    {"vocab_size", (getter)Tokenizer_get_vocab_size, NULL,
     "Number of distinct tokens, added tokens included.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot Tokenizer_slots[] = {
    {Py_tp_doc,
     "Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json.\n\n"
     "Tokenizer(path) or Tokenizer(json=text).  Use mmloader.Tokenizer."},
    {Py_tp_new, Tokenizer_new},
    {Py_tp_init, Tokenizer_init},
    {Py_tp_dealloc, Tokenizer_dealloc},
    {Py_tp_methods, Tokenizer_methods},
    {Py_tp_getset, Tokenizer_getset},
    {0, NULL}};

/* No Py_TPFLAGS_HAVE_GC: a Tokenizer holds no Python objects (its Python subclass gets GC
 * for its __dict__ from CPython). */
static PyType_Spec Tokenizer_spec = {
    .name = "mmloader._core.Tokenizer",
    .basicsize = sizeof(TokenizerObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Tokenizer_slots,
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
  PyObject *r =
      PyUnicode_DecodeUTF8(out.len ? (const char *)out.data : "", (Py_ssize_t)out.len, "strict");
  mml_bytes_free(&out);
  return r;
}

static PyObject *py_tok_nfc_quick(PyObject *mod, PyObject *text) {
  Py_ssize_t n;
  const char *s = text_utf8(text, &n);
  if (!s || mml_pretok_init() != MML_OK) return s ? PyErr_NoMemory() : NULL;
  return PyBool_FromLong(mml_nfc_quick_check((const uint8_t *)s, (size_t)n));
}

static PyMethodDef tokenizer_functions[] = {
    {"_tok_pre_split", py_tok_pre_split, METH_O, "Test hook: the Qwen regex pieces of text."},
    {"_tok_nfc", py_tok_nfc, METH_O, "Test hook: NFC as the tokenizer computes it."},
    {"_tok_nfc_quick", py_tok_nfc_quick, METH_O, "Test hook: the NFC quick check."},
    {NULL, NULL, 0, NULL}};

int mml_py_tokenizer_exec(PyObject *m) {
  if (PyModule_AddFunctions(m, tokenizer_functions) < 0) return -1;
  return mml_py_add_type(m, &Tokenizer_spec, &mml_py_state_of(m)->Tokenizer_Type, "Tokenizer");
}
