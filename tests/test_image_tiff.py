"""TIFF (libtiff): the first page, for the layouts Pillow reads into 8-bit modes — gray
1/4/8/16-bit (min-is-black and min-is-white), gray+alpha, palette, RGB 8/16-bit with
unspecified / associated / unassociated alpha, CMYK, YCbCr JPEG — with every common
compression, predictors, strips or tiles, contiguous or separate planes, both byte orders;
on real photos, bit-exact against Pillow -> convert_to_rgb -> Qwen2VLImageProcessorPil;
what Pillow cannot read (float, signed samples) refused with the layout named."""

from __future__ import annotations

import io

import numpy as np
import pytest

from photos import (
    alpha_for,
    assert_decodes_like_pillow,
    assert_processes_like_transformers,
    data_file,
    encode,
    photos,
    rgb,
    with_alpha,
)

import mmloader

pytest.importorskip("transformers")
tifffile = pytest.importorskip(
    "tifffile", reason="tifffile (with scikit-image) writes the layouts Pillow does not"
)
from PIL import Image  # noqa: E402


def tiff(data: np.ndarray, **kw) -> bytes:
    b = io.BytesIO()
    tifffile.imwrite(b, data, **kw)
    return b.getvalue()


def planes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(a, -1, 0))


def pillow_cases(ims: dict) -> dict:
    out = {}
    for i, (name, im) in enumerate(ims.items()):
        c = rgb(im)
        out[f"{name}/raw"] = encode(c, "TIFF")
        out[f"{name}/lzw"] = encode(c, "TIFF", compression="tiff_lzw")
        out[f"{name}/deflate"] = encode(c, "TIFF", compression="tiff_adobe_deflate")
        out[f"{name}/packbits"] = encode(c, "TIFF", compression="packbits")
        out[f"{name}/jpeg q{50 + 5 * i}"] = encode(
            c, "TIFF", compression="jpeg", quality=50 + 5 * i
        )
        out[f"{name}/rgba lzw"] = encode(with_alpha(im, i), "TIFF", compression="tiff_lzw")
        out[f"{name}/gray"] = encode(im.convert("L"), "TIFF", compression="tiff_lzw")
        out[f"{name}/bilevel g4"] = encode(im.convert("1"), "TIFF", compression="group4")
        out[f"{name}/bilevel raw"] = encode(im.convert("1"), "TIFF")
        out[f"{name}/palette"] = encode(c.quantize(256), "TIFF")
        out[f"{name}/palette 4-bit"] = encode(c.quantize(16), "TIFF", compression="tiff_lzw")
        out[f"{name}/cmyk"] = encode(c.convert("CMYK"), "TIFF")
        out[f"{name}/I;16"] = encode(
            Image.fromarray(np.asarray(im.convert("L")).astype(np.uint16) * 2), "TIFF"
        )
        out[f"{name}/LA"] = encode(
            Image.fromarray(np.dstack([np.asarray(im.convert("L")), alpha_for(im, i)]), "LA"),
            "TIFF",
        )
    return out


def tifffile_cases(ims: dict) -> dict:
    out = {}
    for i, (name, im) in enumerate(ims.items()):
        a = np.asarray(rgb(im))
        g = np.asarray(im.convert("L"))
        al = alpha_for(im, i)
        out[f"{name}/tiled deflate"] = tiff(a, photometric="rgb", tile=(64, 48), compression="zlib")
        out[f"{name}/separate planes"] = tiff(planes(a), photometric="rgb", planarconfig="separate")
        out[f"{name}/separate, predictor, 7-row strips"] = tiff(
            planes(a),
            photometric="rgb",
            planarconfig="separate",
            compression="zlib",
            predictor=True,
            rowsperstrip=7,
        )
        out[f"{name}/separate tiled alpha"] = tiff(
            planes(np.dstack([a, al])),
            photometric="rgb",
            planarconfig="separate",
            extrasamples=["unassalpha"],
            tile=(32, 48),
        )
        out[f"{name}/16-bit big-endian"] = tiff(
            a.astype(np.uint16) * 257 + i, photometric="rgb", byteorder=">"
        )
        out[f"{name}/associated alpha"] = tiff(
            np.dstack([a, al]), photometric="rgb", extrasamples=["assocalpha"]
        )
        out[f"{name}/16-bit associated alpha"] = tiff(
            np.dstack([a, al]).astype(np.uint16) * 200,
            photometric="rgb",
            extrasamples=["assocalpha"],
        )
        out[f"{name}/unspecified 4th sample"] = tiff(
            np.dstack([a, al]), photometric="rgb", extrasamples=["unspecified"]
        )
        out[f"{name}/min-is-white"] = tiff(g, photometric="miniswhite")
        out[f"{name}/gray 16 big-endian"] = tiff(
            g.astype(np.uint16) // 3 + 40, photometric="minisblack", byteorder=">"
        )
        out[f"{name}/gray alpha lzma"] = tiff(
            np.dstack([g, al]),
            photometric="minisblack",
            extrasamples=["unassalpha"],
            compression="lzma",
        )
        out[f"{name}/cmyk tiled"] = tiff(np.dstack([a, al]), photometric="separated", tile=(48, 32))
    return out


def test_tiff_pillow_written_decode_like_pillow_on_real_photos():
    assert assert_decodes_like_pillow(pillow_cases(photos(320))) > 10_000_000


def test_tiff_other_layouts_decode_like_pillow_on_real_photos():
    assert assert_decodes_like_pillow(tifffile_cases(photos(320))) > 10_000_000


def test_tiff_first_page():
    ims = [rgb(x).resize((150, 100)) for x in list(photos(160).values())[:3]]
    multi = encode(ims[0], "TIFF", save_all=True, append_images=ims[1:])
    assert Image.open(io.BytesIO(multi)).n_frames == 3
    real = open(data_file("skimage", "multipage.tif"), "rb").read()
    assert_decodes_like_pillow({"photo pages": multi, "skimage multipage": real})


def test_tiff_processor_matches_transformers():
    ims = dict(list(photos(300).items())[:2])
    cases = {**pillow_cases(ims), **tifffile_cases(ims)}
    assert_processes_like_transformers(list(cases.values()))


def test_tiff_refusals_name_the_layout():
    proc = mmloader.ImageProcessor()
    a = np.asarray(rgb(photos(64)["coffee"]))
    good = encode(rgb(photos(64)["coffee"]), "TIFF")
    real_float = open(data_file("skimage", "multipage_rgb.tif"), "rb").read()
    for data, why in [
        (tiff(a.astype(np.float32) / 255, photometric="rgb"), r"RGB .* 32 bit\(s\) \(float\)"),
        (real_float, r"RGB .* 64 bit\(s\) \(float\)"),
        (tiff(a.astype(np.int16), photometric="rgb"), r"\(signed\)"),
        (
            tiff(
                np.dstack([a[..., 0], a[..., 1]]),
                photometric="minisblack",
                extrasamples=["assocalpha"],
            ),
            "min-is-black with 2 sample",
        ),
        (good[:8], "IFD"),
        (good[: len(good) // 2], "TIFF"),
    ]:
        with pytest.raises(mmloader.SampleError, match=why):
            proc([data])
        with pytest.raises(Exception):  # Pillow cannot read them either
            Image.open(io.BytesIO(data)).convert("RGB")
