"""Real photos for the image-format tests, and the reference they are checked against.

The photos ship inside PyPI wheels the tests install anyway (scikit-image's skimage/data,
matplotlib's mpl-data/sample_data); each test re-encodes them into the format and variant
it needs.  The reference is what transformers' PIL backend does: Pillow's Image.open, then
convert_to_rgb (alpha composited onto white) for the decode, then Qwen2VLImageProcessorPil
for the processor output.
"""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image")

from mmloader import _core  # noqa: E402

QWEN25 = dict(min_pixels=3136, max_pixels=12845056)

# color and gray photographs (not drawings, not synthetic): name -> (package, file)
_PHOTOS = {
    "astronaut": ("skimage", "astronaut.png"),
    "chelsea": ("skimage", "chelsea.png"),
    "coffee": ("skimage", "coffee.png"),
    "rocket": ("skimage", "rocket.jpg"),
    "motorcycle": ("skimage", "motorcycle_left.png"),
    "hubble": ("skimage", "hubble_deep_field.jpg"),
    "retina": ("skimage", "retina.jpg"),
    "camera": ("skimage", "camera.png"),
    "moon": ("skimage", "moon.png"),
    "grace_hopper": ("matplotlib", "grace_hopper.jpg"),
}


def _data_dir(pkg: str) -> str:
    if pkg == "skimage":
        mod = pytest.importorskip(
            "skimage", reason="scikit-image (requirements-test.txt) ships the photos"
        )
        return os.path.join(os.path.dirname(mod.__file__), "data")
    mod = pytest.importorskip("matplotlib", reason="matplotlib ships the sample photos")
    return os.path.join(os.path.dirname(mod.__file__), "mpl-data", "sample_data")


def data_file(pkg: str, name: str) -> str:
    return os.path.join(_data_dir(pkg), name)


_cache: dict = {}


def photos(max_side: int = 640) -> dict:
    """name -> PIL image (RGB or L as the photo is), reduced by an integer factor (box
    filter) so its longest side is at most max_side: test time, not realism, is the limit."""
    key = max_side
    if key not in _cache:
        out = {}
        for name, (pkg, fname) in _PHOTOS.items():
            im = Image.open(data_file(pkg, fname))
            im.load()
            im = im.convert("L" if im.mode in ("L", "I;16", "1") else "RGB")
            f = -(-max(im.size) // max_side)
            out[name] = im.reduce(f) if f > 1 else im
        _cache[key] = out
    return dict(_cache[key])


def rgb(im: "Image.Image") -> "Image.Image":
    return im if im.mode == "RGB" else im.convert("RGB")


def alpha_for(im: "Image.Image", seed: int = 0) -> np.ndarray:
    """An alpha plane with fully transparent, fully opaque and graded regions."""
    w, h = im.size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    a = ((x * 255) // max(w - 1, 1)).astype(np.uint8)
    a[: h // 6] = 0
    a[h // 6 : h // 3] = 255
    a[-(h // 6) :] = rng.integers(0, 256, a[-(h // 6) :].shape, dtype=np.uint8)
    return a


def with_alpha(im: "Image.Image", seed: int = 0) -> "Image.Image":
    return Image.fromarray(np.dstack([np.asarray(rgb(im)), alpha_for(im, seed)]), "RGBA")


def encode(im: "Image.Image", fmt: str, **kw) -> bytes:
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def pil_rgb(data: bytes) -> np.ndarray:
    """What the PIL backend starts from: Image.open + transformers' convert_to_rgb."""
    from transformers.image_transforms import convert_to_rgb

    return np.asarray(convert_to_rgb(Image.open(io.BytesIO(data)), return_numpy=True))


def mml_rgb(data: bytes) -> np.ndarray:
    buf, h, w = _core.image_decode(data, 1)
    return np.frombuffer(buf, np.uint8).reshape(h, w, 3)


def assert_decodes_like_pillow(cases: dict) -> int:
    """Every case decodes to the reference's pixels exactly, and the header-only plan gives
    the decoded size.  Returns the number of values compared."""
    import mmloader

    proc = mmloader.ImageProcessor("qwen2.5-vl")
    n = 0
    for name, data in cases.items():
        want = pil_rgb(data)
        got = mml_rgb(data)
        assert got.shape == want.shape, name
        bad = np.count_nonzero(got != want)
        assert bad == 0, f"{name}: {bad} values differ (max {np.abs(got.astype(int) - want).max()})"
        plan = proc.plan(data)
        assert (plan["src_h"], plan["src_w"]) == want.shape[:2], name
        n += want.size
    return n


def assert_processes_like_transformers(datas: list) -> None:
    """pixel_values and grids of mmloader.ImageProcessor equal Qwen2VLImageProcessorPil's."""
    import mmloader

    proc_mod = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    ref = proc_mod.Qwen2VLImageProcessorPil(**QWEN25)(
        [Image.open(io.BytesIO(d)) for d in datas], return_tensors="np"
    )
    ours = mmloader.ImageProcessor("qwen2.5-vl")(datas)
    np.testing.assert_array_equal(ours["image_grid_thw"], ref["image_grid_thw"])
    assert ours["pixel_values"].shape == ref["pixel_values"].shape
    diff = np.abs(ours["pixel_values"] - ref["pixel_values"].astype(np.float32))
    assert diff.max() == 0, f"max |diff| {diff.max()}, {np.count_nonzero(diff)} values differ"
