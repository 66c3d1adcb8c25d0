/* loader_py.c — placeholder until the loader binding lands (owned by that subsystem). */
#include "binding.h"

int mml_py_loader_register(PyObject *m) {
  (void)m;
  return 0;
}
