"""A test-only stand-in for torchvision, reproducing with torch the few functions the
references here call (qwen-vl-utils' fetch_video and transformers' video processors).

PyPI's torchvision does not work beside the CPU torch the tests use, so these tests put
this folder on PYTHONPATH of a reference subprocess (never in the pytest process).  What
is reproduced, from torchvision 0.2x's sources:
  transforms.functional.resize (v1, what qwen-vl-utils calls): tensors of other dtypes are
    cast to float32, torch.nn.functional.interpolate(mode, antialias, align_corners=False),
    bicubic results clamped to [0, 255] for uint8, rounded, cast back; an unchanged size
    returns the input.
  transforms.v2.functional.resize (what transformers calls): the same, except that uint8
    bicubic on CPU is interpolated natively in uint8 (torchvision's
    _do_native_uint8_resize_on_cpu), as is nearest.
  transforms.v2.functional.normalize: (x - mean) / std in the tensor's dtype.
  io.read_video (what qwen-vl-utils' torchvision video backend calls): torchvision
    0.21-0.25's PyAV backend, call for call (see io.py; the real one is removed in 0.26,
    the version this shim reports so that transformers never decodes video through it).
Everything else raises NotImplementedError."""

import os as _os  # noqa: E402

# >= 0.26: no video decoding, as transformers expects; MMLOADER_TVSHIM_VERSION=0.25.0 makes
# transformers 5 fall back to read_video when it has no torchcodec (io.py reproduces it)
__version__ = _os.environ.get("MMLOADER_TVSHIM_VERSION", "0.26.0") + "+mmloader.shim"

from . import io, transforms  # noqa: E402,F401
