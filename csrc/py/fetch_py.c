/* fetch_py.c — placeholder until the fetch binding lands (owned by that subsystem). */
#include "binding.h"

int mml_py_fetch_register(PyObject *m) {
  (void)m;
  return 0;
}
