/* cuda_py.c — placeholder until the cuda binding lands (owned by that subsystem). */
#include "binding.h"

int mml_py_cuda_register(PyObject *m) {
  (void)m;
  return 0;
}
