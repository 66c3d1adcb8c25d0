"""Where an installed PyTorch's CUDA runtime lives, found without importing torch.

pip builds of PyTorch do not use a system libcudart: they load the one of the
nvidia-cuda-runtime wheel (``site-packages/nvidia/cuda_runtime/lib/libcudart.so.12``, or
``nvidia/cu13/lib/libcudart.so.13``) through their RPATH.  mmloader's native code tries these
paths (after a runtime already loaded in the process, before the system's), so the loader
and the trainer share one runtime even when mmloader loads it first.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from typing import List


def _locations(name: str) -> List[str]:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)
    return [os.path.dirname(spec.origin)] if spec.origin else []


def candidates() -> List[str]:
    """Paths of libcudart shared libraries of installed wheels, best first."""
    found: List[str] = []
    for loc in _locations("nvidia"):
        found += sorted(glob.glob(os.path.join(loc, "*", "lib", "libcudart.so.*")))
    for loc in _locations("torch"):
        found += sorted(glob.glob(os.path.join(loc, "lib", "libcudart*.so*")))
    out: List[str] = []
    for p in found:
        if os.path.isfile(p) and p not in out:
            out.append(p)
    return out[:8]
