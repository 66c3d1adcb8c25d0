"""torchvision.transforms.functional (v1), the parts qwen-vl-utils uses."""

from enum import Enum

import torch
from torch.nn.functional import interpolate


class InterpolationMode(Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def _mode(interpolation):
    if isinstance(interpolation, InterpolationMode):
        return interpolation.value
    if isinstance(interpolation, int):  # PIL codes
        return {0: "nearest", 2: "bilinear", 3: "bicubic"}[interpolation]
    return str(interpolation)


def resize(img, size, interpolation=InterpolationMode.BILINEAR, max_size=None, antialias=True):
    if not isinstance(img, torch.Tensor):
        raise NotImplementedError("torchvision shim: resize of PIL images")
    if max_size is not None or len(size) != 2:
        raise NotImplementedError("torchvision shim: resize needs [h, w]")
    h, w = img.shape[-2:]
    if [h, w] == list(size):
        return img
    mode = _mode(interpolation)
    if mode not in ("bilinear", "bicubic"):
        antialias = False
    shape = img.shape
    x = img.reshape(-1, *shape[-3:]) if img.ndim != 4 else img
    out_dtype = x.dtype
    need_cast = out_dtype not in (torch.float32, torch.float64)
    if need_cast:
        x = x.to(torch.float32)
    x = interpolate(
        x,
        size=list(size),
        mode=mode,
        align_corners=False if mode in ("bilinear", "bicubic") else None,
        antialias=antialias,
    )
    if mode == "bicubic" and out_dtype == torch.uint8:
        x = x.clamp(min=0, max=255)
    if need_cast:
        if not out_dtype.is_floating_point:
            x = torch.round(x)
        x = x.to(out_dtype)
    return x.reshape(*shape[:-2], *x.shape[-2:])


def pil_to_tensor(pic):
    import numpy as np

    a = np.asarray(pic)
    if a.ndim == 2:
        a = a[:, :, None]
    return torch.from_numpy(a.copy()).permute(2, 0, 1)
