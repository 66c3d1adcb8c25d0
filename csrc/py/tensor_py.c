/* tensor_py.c — placeholder until the tensor binding lands (owned by that subsystem). */
#include "binding.h"

int mml_py_tensor_register(PyObject *m) {
  (void)m;
  return 0;
}
