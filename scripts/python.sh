# Sourced (from the checkout's root) by the set-up scripts: exports PYTHON, the interpreter
# they all use: $PYTHON when set; else python3, unless that is a distribution's externally
# managed Python (PEP 668, Debian 12/13's /usr/bin/python3: pip refuses to install into
# it), in which case the venv .venv in the checkout, which install-deps.sh creates.
if [ -z "${PYTHON:-}" ]; then
  if command -v python3 > /dev/null && ! python3 -c '
import os, sys, sysconfig
managed = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
sys.exit(1 if managed and sys.prefix == sys.base_prefix else 0)'; then
    PYTHON=$PWD/.venv/bin/python
  else
    PYTHON=python3
  fi
  export PYTHON
fi
