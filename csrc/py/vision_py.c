/* vision_py.c — placeholder until the vision binding lands (owned by that subsystem). */
#include "binding.h"

int mml_py_vision_register(PyObject *m) {
  (void)m;
  return 0;
}
