/* template_py.c — placeholder until the template binding lands (owned by that subsystem). */
#include "binding.h"

int mml_py_template_register(PyObject *m) {
  (void)m;
  return 0;
}
