"""torchvision.transforms.v2.functional, the parts transformers' video processors use."""

import torch
from torch.nn.functional import interpolate

from ..functional import InterpolationMode, _mode, pil_to_tensor  # noqa: F401


def resize(image, size, interpolation=InterpolationMode.BILINEAR, max_size=None, antialias=True):
    if max_size is not None or len(size) != 2:
        raise NotImplementedError("torchvision shim: resize needs [h, w]")
    mode = _mode(interpolation)
    if mode not in ("bilinear", "bicubic"):
        antialias = False
    shape = image.shape
    c, h, w = shape[-3:]
    if [h, w] == list(size):
        return image
    x = image.reshape(-1, c, h, w)
    dtype = x.dtype
    ok = [torch.float32, torch.float64]
    if mode in ("nearest", "nearest-exact", "bicubic"):  # native uint8 on CPU
        ok.append(torch.uint8)
    need_cast = dtype not in ok
    if need_cast:
        x = x.to(torch.float32)
    x = interpolate(
        x,
        size=list(size),
        mode=mode,
        align_corners=False if mode in ("bilinear", "bicubic") else None,
        antialias=antialias,
    )
    if need_cast:
        if mode == "bicubic" and dtype == torch.uint8:
            x = x.clamp_(min=0, max=255)
        if not dtype.is_floating_point:
            x = x.round_()
        x = x.to(dtype)
    return x.reshape(*shape[:-2], *size)


def normalize(image, mean, std, inplace=False):
    mean = torch.as_tensor(mean, dtype=image.dtype, device=image.device)
    std = torch.as_tensor(std, dtype=image.dtype, device=image.device)
    if mean.ndim == 1:
        mean = mean.view(-1, 1, 1)
    if std.ndim == 1:
        std = std.view(-1, 1, 1)
    image = image.sub_(mean) if inplace else image.sub(mean)
    return image.div_(std)


def grayscale_to_rgb(image):
    if image.shape[-3] == 3:
        return image
    return image.expand(*image.shape[:-3], 3, *image.shape[-2:]).clone()


def to_dtype(image, dtype=torch.float32, scale=False):
    if scale:
        raise NotImplementedError("torchvision shim: to_dtype(scale=True)")
    return image.to(dtype)


def _nope(*a, **k):
    raise NotImplementedError("torchvision shim")


pad = crop = to_tensor = center_crop = _nope
