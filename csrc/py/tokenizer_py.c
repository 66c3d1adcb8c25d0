/* tokenizer_py.c — placeholder until the tokenizer binding lands (owned by that subsystem). */
#include "binding.h"

int mml_py_tokenizer_register(PyObject *m) {
  (void)m;
  return 0;
}
