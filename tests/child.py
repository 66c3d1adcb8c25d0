"""The mmloader the tests import, and the environment for a Python child process of a test:
it imports the same mmloader as the test (the package's folder first on PYTHONPATH),
wherever pytest was started -- a child finds a package only through its own sys.path, which
holds its working directory, not pytest's rootdir."""

from __future__ import annotations

import os
from typing import Dict

import mmloader

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mmloader.__file__)))


def child_env(**extra: str) -> Dict[str, str]:
    path = os.pathsep.join(p for p in (PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)


def check_package() -> None:
    """Where MML_TEST_PACKAGE is set (scripts/gpu-check.sh testing an installed wheel), it is
    the folder of the mmloader the tests must import: raises ValueError when they import
    another one (the source tree's, say, where sys.path puts it first)."""
    want = os.environ.get("MML_TEST_PACKAGE")
    got = os.path.dirname(os.path.abspath(mmloader.__file__))
    if want and os.path.realpath(want) != os.path.realpath(got):
        raise ValueError(f"MML_TEST_PACKAGE={want}, but the tests import mmloader from {got}")
