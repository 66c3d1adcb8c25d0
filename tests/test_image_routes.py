"""The image reference route (Loader/ImageProcessor `image_route`), each value bit-exact to
its reference pipeline on real photos re-encoded with alpha, transparency and EXIF
orientations:

  "processor"      Image.open -> Qwen2VLImageProcessorPil (transparency composited onto
                   white by convert_to_rgb, EXIF ignored)
  "load_image"     transformers.image_utils.load_image (exif_transpose, convert("RGB"))
                   -> Qwen2VLImageProcessorPil
  "qwen-vl-utils"  qwen_vl_utils.fetch_image (to_rgb: RGBA pasted onto white; its
                   smart_resize and bicubic resize) -> Qwen2VLImageProcessorPil

qwen-vl-utils imports torchvision at module level for its video readers only; PyPI's
torchvision does not work beside the CPU torch these tests use, so when it is missing
a bare stand-in module is registered before the import (fetch_image never touches it)."""

from __future__ import annotations

import json
import os
import sys
import types

import numpy as np
import pytest

from photos import alpha_for, encode, photos, rgb, with_alpha

import mmloader

Image = pytest.importorskip("PIL.Image")
pytest.importorskip("transformers")
from PIL import TiffImagePlugin  # noqa: E402
from transformers.image_utils import load_image  # noqa: E402
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (  # noqa: E402
    Qwen2VLImageProcessorPil,
)

LIMITS = dict(min_pixels=3136, max_pixels=401408)


def _qwen_vl_utils():
    try:
        import torchvision  # noqa: F401
    except Exception:
        tv = types.ModuleType("torchvision")
        tv.io = types.ModuleType("torchvision.io")
        tv.transforms = types.ModuleType("torchvision.transforms")
        tv.transforms.InterpolationMode = type("InterpolationMode", (), {"BICUBIC": 3})
        tv.__version__ = "0.0"
        for name, mod in (
            ("torchvision", tv),
            ("torchvision.io", tv.io),
            ("torchvision.transforms", tv.transforms),
        ):
            sys.modules.setdefault(name, mod)
    return pytest.importorskip("qwen_vl_utils", reason="pip install qwen-vl-utils")


def reference(route: str, paths: list) -> dict:
    proc = Qwen2VLImageProcessorPil(**LIMITS)
    if route == "processor":
        ims = [Image.open(p) for p in paths]
    elif route == "load_image":
        ims = [load_image(p) for p in paths]
    else:
        qvu = _qwen_vl_utils()
        ims = [qvu.fetch_image({"image": p, **LIMITS}, image_patch_size=14) for p in paths]
    return proc(ims, return_tensors="np")


def exif_bytes(orientation: int) -> bytes:
    ex = Image.Exif()
    ex[0x0112] = orientation
    return ex.tobytes()


def route_cases(tmp_path) -> dict:
    """name -> file: the transparency kinds each route treats differently, and all eight
    orientations in the four containers that carry one."""
    out = {}
    ims = photos(256)
    names = list(ims)
    for i, (name, im) in enumerate(list(ims.items())[:3]):
        c = rgb(im)
        q = c.quantize(64)
        la = Image.fromarray(np.dstack([np.asarray(im.convert("L")), alpha_for(im, i)]), "LA")
        out[f"{name}.rgba.png"] = encode(with_alpha(im, i), "PNG")
        out[f"{name}.la.png"] = encode(la, "PNG")
        out[f"{name}.ptrns.png"] = encode(q, "PNG", transparency=3)
        out[f"{name}.rgbtrns.png"] = encode(
            c, "PNG", transparency=tuple(np.asarray(c)[0, 0].tolist())
        )
        out[f"{name}.alpha.webp"] = encode(with_alpha(im, i), "WEBP", lossless=True)
        out[f"{name}.trans.gif"] = encode(q, "GIF", transparency=5)
        out[f"{name}.rgba.tif"] = encode(with_alpha(im, i), "TIFF", compression="tiff_lzw")
    for o in range(1, 9):
        c = rgb(ims[names[o % len(names)]]).resize((200 + 8 * o, 120 + 4 * o))
        out[f"o{o}.jpg"] = encode(c, "JPEG", quality=90, exif=exif_bytes(o))
        out[f"o{o}.png"] = encode(c, "PNG", exif=exif_bytes(o))
        out[f"o{o}.webp"] = encode(c, "WEBP", quality=90, exif=exif_bytes(o))
        ifd = TiffImagePlugin.ImageFileDirectory_v2()
        ifd[0x0112] = o  # a TIFF's orientation is a tag of its own first IFD
        out[f"o{o}.tif"] = encode(c, "TIFF", tiffinfo=ifd)
    paths = {}
    for k, d in out.items():
        p = tmp_path / k
        p.write_bytes(d)
        paths[k] = str(p)
    return paths


def assert_same(ours, ref, what):
    np.testing.assert_array_equal(ours["image_grid_thw"], ref["image_grid_thw"], err_msg=what)
    diff = np.abs(ours["pixel_values"] - ref["pixel_values"].astype(np.float32))
    assert diff.max() == 0, f"{what}: max |diff| {diff.max()}, {np.count_nonzero(diff)} differ"


@pytest.mark.parametrize("route", ["processor", "load_image", "qwen-vl-utils"])
def test_route_matches_its_reference(route, tmp_path):
    paths = route_cases(tmp_path)
    proc = mmloader.ImageProcessor("qwen2.5-vl", image_route=route, **LIMITS)
    for name, p in paths.items():  # one at a time: a mismatch names its case
        assert_same(proc([p]), reference(route, [p]), f"{route} {name}")


def test_routes_differ_where_the_references_do(tmp_path):
    paths = route_cases(tmp_path)
    out = {
        r: mmloader.ImageProcessor(image_route=r, **LIMITS)
        for r in ("processor", "load_image", "qwen-vl-utils")
    }
    pv = {r: p([paths["astronaut.rgba.png"]])["pixel_values"] for r, p in out.items()}
    assert not np.array_equal(pv["processor"], pv["load_image"])  # RGBA: composite vs drop
    assert np.array_equal(pv["processor"], pv["qwen-vl-utils"])  # paste rounds as composite
    pv = {r: p([paths["astronaut.la.png"]])["pixel_values"] for r, p in out.items()}
    assert not np.array_equal(pv["processor"], pv["qwen-vl-utils"])  # LA: composite vs drop
    assert np.array_equal(pv["load_image"], pv["qwen-vl-utils"])
    rot = paths["o6.jpg"]
    g = {r: p([rot])["image_grid_thw"].tolist() for r, p in out.items()}
    assert g["load_image"] != g["processor"] == g["qwen-vl-utils"]  # only load_image turns it


def test_paste_and_composite_formulas_exhaustive(tmp_path):
    """Every (value, alpha) pair, on an image whose size the processor keeps (no resize)."""
    v = np.arange(280 * 252) % 256
    a = (np.arange(280 * 252) // 256) % 256
    a = np.where(np.arange(280 * 252) >= 65536, 255 - v, a)
    rgba = np.stack([v, 255 - v, (v * 7) % 256, a], -1).astype(np.uint8).reshape(252, 280, 4)
    p = tmp_path / "pairs.png"
    p.write_bytes(encode(Image.fromarray(rgba, "RGBA"), "PNG"))
    for route in ("processor", "load_image", "qwen-vl-utils"):
        ours = mmloader.ImageProcessor(image_route=route, **LIMITS)([str(p)])
        assert ours["image_grid_thw"].tolist() == [[1, 18, 20]]
        assert_same(ours, reference(route, [str(p)]), route)


def test_loader_uses_the_route(tmp_path):
    paths = route_cases(tmp_path)
    names = ["o6.jpg", "astronaut.rgba.png", "o8.webp", "chelsea.trans.gif"]
    recs = [
        {
            "image": os.path.basename(paths[n]),
            "conversations": [
                {"from": "human", "value": "<image>\nDescribe."},
                {"from": "gpt", "value": "Ok."},
            ],
        }
        for n in names
    ]
    shard = tmp_path / "d.jsonl"
    shard.write_text("".join(json.dumps(r) + "\n" for r in recs))
    tiny = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
    for route in ("load_image", "qwen-vl-utils"):
        with mmloader.Loader(
            str(shard),
            tokenizer=tiny,
            micro_batch_size=4,
            num_threads=2,
            shuffle=False,
            image_route=route,
            **LIMITS,
        ) as L:
            b = next(iter(L))
        want = mmloader.ImageProcessor(image_route=route, **LIMITS)([paths[n] for n in names])
        np.testing.assert_array_equal(b["pixel_values"].numpy(), want["pixel_values"])
        np.testing.assert_array_equal(b["image_grid_thw"].numpy(), want["image_grid_thw"])
    with pytest.raises(mmloader.ConfigError, match="image_route"):
        mmloader.Loader(str(shard), tokenizer=tiny, image_route="pil")
