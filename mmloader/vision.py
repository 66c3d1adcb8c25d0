"""Qwen-VL image preprocessing in C: the same result as transformers' Qwen2VLImageProcessor
with the PIL backend (smart_resize, Pillow-exact bicubic, rescale + normalise, patchify).

    proc = mmloader.ImageProcessor("qwen2.5-vl")
    out = proc(["a.jpg", open("b.png", "rb").read(), np.zeros((64, 64, 3), np.uint8)])
    out["pixel_values"]    # float32 [sum of t*h*w, 3*T*P*P]
    out["image_grid_thw"]  # int64 [n_images, 3]

Decoding, resizing and patchifying run in C with the GIL released.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core
from ._options import DEFAULTS
from .presets import vision_config

ImageLike = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]", np.ndarray, Any]

__all__ = ["ImageProcessor", "smart_resize"]


def smart_resize(
    height: int,
    width: int,
    factor: int = 28,
    min_pixels: int = 56 * 56,
    max_pixels: int = 28 * 28 * 1280,
    legacy: bool = False,
    qwen_vl_utils: bool = False,
) -> Tuple[int, int]:
    """(height, width) an image is resized to: both multiples of `factor`, the area within
    [min_pixels, max_pixels], the aspect ratio kept as closely as possible.

    The defaults are those of transformers' `smart_resize`.  `legacy=True` reproduces older
    transformers releases (no `max(factor, ...)` clamp; sizes below `factor` rejected).
    `qwen_vl_utils=True` is qwen-vl-utils' variant (what per-image budgets in records use:
    `max(factor, round(...))` first, floors unclamped).
    Raises ValueError for an aspect ratio above 200 or a size the algorithm rejects.
    """
    if legacy and qwen_vl_utils:
        raise ValueError("choose one of legacy and qwen_vl_utils")
    return _core.smart_resize(
        int(height),
        int(width),
        int(factor),
        int(min_pixels),
        int(max_pixels),
        2 if qwen_vl_utils else int(bool(legacy)),
    )


def _pil_to_rgb_array(img: Any) -> np.ndarray:
    # transformers' convert_to_rgb: composite transparency onto white, else convert("RGB").
    from PIL import Image

    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(bg, rgba)
    return np.asarray(img.convert("RGB"))


def _item(x: Any, i: int) -> tuple:
    if isinstance(x, (bytes, bytearray, memoryview)):
        return (0, x)
    if isinstance(x, str) and x[:5].lower() == "data:":
        return (0, _core.data_uri_decode(x))
    if isinstance(x, (str, os.PathLike)):
        with open(x, "rb") as f:
            return (0, f.read())
    if not isinstance(x, np.ndarray) and hasattr(x, "getbands") and hasattr(x, "convert"):
        x = _pil_to_rgb_array(x)  # a PIL.Image.Image
    if isinstance(x, np.ndarray):
        if x.dtype != np.uint8:
            raise TypeError(f"image {i}: arrays must be uint8, got {x.dtype}")
        if x.ndim == 3 and x.shape[2] == 1:
            x = x[:, :, 0]
        if x.ndim == 2:
            x = np.repeat(x[:, :, None], 3, axis=2)
        if x.ndim != 3 or x.shape[2] != 3:
            raise ValueError(f"image {i}: arrays must be HxWx3 (or HxW) uint8, got shape {x.shape}")
        x = np.ascontiguousarray(x)
        return (1, x.reshape(-1), int(x.shape[0]), int(x.shape[1]))
    raise TypeError(
        f"image {i}: expected encoded bytes, a file path, a uint8 HxWx3 array or a "
        f"PIL image, got {type(x).__name__}"
    )


# pixel_format -> the NumPy dtype of ImageProcessor's pixel_values (bfloat16 as its bits)
_NUMPY_DTYPES = {"float32": np.float32, "bfloat16": np.uint16, "uint8": np.uint8}


class ImageProcessor:
    """Qwen-VL image processor running in C.

    Args:
        preset: "qwen2-vl", "qwen2.5-vl" or "qwen3-vl".
        model_dir: a model directory whose preprocessor_config.json overrides the preset.
        **overrides: patch_size, merge_size, temporal_patch_size, min_pixels, max_pixels,
            image_mean, image_std, legacy_resize (older smart_resize), fast_decode (the Loader's
            option: a JPEG decoded at reduced scale when the target is at most half the
            source; other formats decode at full size; not bit-exact, see docs/pixels.md),
            max_image_pixels (images with more pixels are rejected before decoding;
            0 disables), max_jpeg_scans (a JPEG of more scans is refused before
            decoding, each scan decoding the whole image again: the Loader's option and
            its default; 0 disables), pillow_h_first (True: resize horizontally first always, as
            Pillow <= 12 does; the default follows Pillow 13, which runs the vertical pass
            first when the height shrinks by more than twice as many pixels as the width —
            the two orders can differ by 1 in a few pixels), strict_jpeg (True: a JPEG
            that libjpeg decodes only with "Corrupt JPEG data" warnings is refused; by
            default it is decoded as Pillow decodes it — Pillow refuses only JPEGs with
            a libjpeg error, also one after the last row, and so does mmloader),
            image_route ("processor", "load_image" or "qwen-vl-utils": see
            :class:`mmloader.Loader`).
        pixel_format: "float32" (default), "bfloat16" or "uint8", as the Loader's
            ``pixel_format``; NumPy has no bfloat16, so "bfloat16" returns uint16 holding
            the bfloat16 bits (``torch.from_numpy(a).view(torch.bfloat16)``).

    Pixel semantics are those of the PIL backend of transformers 5.x: alpha and tRNS
    transparency are composited onto white, CMYK/16-bit/palette PNG converted as Pillow
    does, EXIF orientation ignored.  Formats (told by magic bytes): JPEG, PNG, WebP, GIF
    (first frame), BMP, TIFF (first page); others raise SampleError naming what they look
    like.

    Calling it with a list of images (encoded image bytes, file paths, uint8 HxWx3
    arrays, or PIL images) returns {"pixel_values": float32 [sum t*h*w, 3*T*P*P] (or as
    ``pixel_format`` says),
    "image_grid_thw": int64 [n, 3]}, like the transformers processor.  A bad image raises
    mmloader.SampleError (ConfigError for an invalid configuration) naming its index.
    The object may be shared between threads.
    """

    def __init__(
        self,
        preset: str = DEFAULTS["preset"],
        model_dir: Optional[str] = None,
        *,
        pixel_format: str = DEFAULTS["pixel_format"],
        **overrides: Any,
    ) -> None:
        self.config: Dict[str, Any] = vision_config(preset, model_dir, **overrides)
        self.preset = preset
        self.pixel_format = pixel_format
        self._proc = _core.VisionProcessor(self.config, pixel_format=pixel_format)
        self._dtype = _NUMPY_DTYPES[pixel_format]

    def __call__(self, images: Union[ImageLike, Sequence[ImageLike]]) -> Dict[str, np.ndarray]:
        if not isinstance(images, (list, tuple)):
            images = [images]
        items: List[tuple] = [_item(x, i) for i, x in enumerate(images)]
        buf, rows, cols, grids = self._proc.process(items)
        pixel_values = np.frombuffer(memoryview(buf), dtype=self._dtype).reshape(rows, cols)
        grid = np.array(grids, dtype=np.int64).reshape(len(grids), 3)
        return {"pixel_values": pixel_values, "image_grid_thw": grid}

    def plan(self, data: bytes) -> Dict[str, Any]:
        """What encoded image `data` becomes, read from its header only: source and target
        sizes, grid_thw, rows, cols, tokens (<|image_pad|> count), format, decode_scale,
        scratch (bytes of decoder scratch its decode maps beyond a few rows, at most: what
        max_memory charges it)."""
        return _core.vision_plan(self.config, data)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"ImageProcessor(preset={self.preset!r}, patch_size={c['patch_size']}, "
            f"merge_size={c['merge_size']}, min_pixels={c['min_pixels']}, "
            f"max_pixels={c['max_pixels']})"
        )
