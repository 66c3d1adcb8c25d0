"""Parity of mmloader's vision path with transformers' Qwen2VLImageProcessor (PIL backend).

Images are generated in a tmp dir: JPEG (baseline, progressive, grayscale, CMYK) and PNG
(RGB, RGBA, LA, L, palette with and without tRNS, 1/2/4/16-bit gray, 16-bit RGB/RGBA,
interlaced), sizes below the factor, extreme aspect ratios up to 200:1 and both pixel
limits.  The reference decodes with Pillow and runs the processor; the required result is
0 differing uint8 values after decode and after resize, and pixel_values within 1e-6 (in
practice bit-identical).
"""

from __future__ import annotations

import io
import json
import os
import struct
import threading
import zlib

import numpy as np
import pytest

import mmloader
from mmloader import _core
from child import child_env

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

try:
    from transformers.image_transforms import convert_to_rgb
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )
except Exception as e:  # pragma: no cover - depends on the environment
    Qwen2VLImageProcessorPil = None
    _TF_ERR = repr(e)

needs_tf = pytest.mark.skipif(
    Qwen2VLImageProcessorPil is None,
    reason="transformers with the Qwen2-VL PIL processor not installed",
)

QWEN25 = dict(min_pixels=3136, max_pixels=12845056)
PIL_MAJOR = int(PIL.__version__.split(".")[0])


# ----------------------------------------------------------------------------- generators


def pattern(h: int, w: int, seed: int = 0, channels: int = 3) -> np.ndarray:
    """Smooth gradients plus noise: exercises every kernel tap and rounding."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    base = [
        127 + 120 * np.sin(x / max(w, 1) * 6.3 + c) * np.cos(y / max(h, 1) * 4.1 - c)
        for c in range(channels)
    ]
    a = np.stack(base, -1) + rng.normal(0, 18, (h, w, channels))
    return np.clip(a, 0, 255).astype(np.uint8)


def encode(img: "Image.Image", fmt: str, **kw) -> bytes:
    b = io.BytesIO()
    img.save(b, fmt, **kw)
    return b.getvalue()


def jpeg(h, w, seed=0, mode="RGB", **kw) -> bytes:
    a = pattern(h, w, seed, 4 if mode == "CMYK" else 3)
    im = Image.fromarray(a[..., :4] if mode == "CMYK" else a, "CMYK" if mode == "CMYK" else "RGB")
    if mode == "L":
        im = im.convert("L")
    return encode(im, "JPEG", quality=kw.pop("quality", 90), **kw)


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def raw_png(
    samples: np.ndarray,
    color_type: int,
    depth: int,
    trns: bytes | None = None,
    plte: bytes | None = None,
    interlace: bool = False,
) -> bytes:
    """A PNG written by hand (for depths/chunks Pillow does not write).  `samples`:
    H x W x C unsigned ints of the given depth."""
    h, w = samples.shape[:2]
    s = samples.reshape(h, w, -1)

    def pack_rows(img):
        rows = []
        for r in img:
            if depth == 16:
                b = r.astype(">u2").tobytes()
            elif depth == 8:
                b = r.astype(np.uint8).tobytes()
            else:
                vals = r.reshape(-1).astype(np.uint8)
                per = 8 // depth
                pad = (-len(vals)) % per
                vals = np.concatenate([vals, np.zeros(pad, np.uint8)]).reshape(-1, per)
                shifts = np.array([8 - depth * (i + 1) for i in range(per)], np.uint8)
                b = np.bitwise_or.reduce(vals << shifts, axis=1).astype(np.uint8).tobytes()
            rows.append(b"\0" + b)
        return b"".join(rows)

    if interlace:
        passes = [
            (0, 0, 8, 8),
            (4, 0, 8, 8),
            (0, 4, 4, 8),
            (2, 0, 4, 4),
            (0, 2, 2, 4),
            (1, 0, 2, 2),
            (0, 1, 1, 2),
        ]
        data = b"".join(
            pack_rows(s[y0::dy, x0::dx]) for x0, y0, dx, dy in passes if s[y0::dy, x0::dx].size
        )
    else:
        data = pack_rows(s)
    out = b"\x89PNG\r\n\x1a\n" + _chunk(
        b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, int(interlace))
    )
    if plte is not None:
        out += _chunk(b"PLTE", plte)
    if trns is not None:
        out += _chunk(b"tRNS", trns)
    return out + _chunk(b"IDAT", zlib.compress(data)) + _chunk(b"IEND", b"")


def png_cases() -> dict:
    rng = np.random.default_rng(7)
    h, w = 45, 67
    rgb = pattern(h, w, 1)
    alpha = rng.integers(0, 256, (h, w), dtype=np.uint8)
    alpha[:5] = 0
    alpha[5:10] = 255
    gray = pattern(h, w, 2)[..., 0]
    cases = {
        "rgb": encode(Image.fromarray(rgb), "PNG"),
        "rgba": encode(Image.fromarray(np.dstack([rgb, alpha]), "RGBA"), "PNG"),
        "la": encode(Image.fromarray(np.dstack([gray, alpha]), "LA"), "PNG"),
        "l": encode(Image.fromarray(gray), "PNG"),
        "l_trns": encode(Image.fromarray(gray), "PNG", transparency=int(gray[3, 3])),
        "rgb_trns": encode(
            Image.fromarray(rgb), "PNG", transparency=tuple(int(v) for v in rgb[4, 4])
        ),
        "bit1": encode(Image.fromarray(gray > 128), "PNG"),
        "gray2": raw_png(gray >> 6, 0, 2),
        "gray4": raw_png(gray >> 4, 0, 4),
        "gray4_trns": raw_png(gray >> 4, 0, 4, trns=struct.pack(">H", 0)),
        "gray16": raw_png((gray.astype(np.uint16) * 257 // 90), 0, 16),
        "gray16_trns": raw_png(
            np.minimum(gray.astype(np.uint16) * 3, 65535), 0, 16, trns=struct.pack(">H", 255)
        ),
        "rgb16": raw_png(rgb.astype(np.uint16) * 257 + 3, 2, 16),
        "rgba16": raw_png(np.dstack([rgb, alpha]).astype(np.uint16) * 257 + 100, 6, 16),
        "la16": raw_png(np.dstack([gray, alpha]).astype(np.uint16) * 257, 4, 16),
        "rgb_interlaced": raw_png(rgb, 2, 8, interlace=True),
        "rgba_interlaced": raw_png(np.dstack([rgb, alpha]), 6, 8, interlace=True),
    }
    pal_img = Image.fromarray(rgb).quantize(colors=40)
    cases["palette"] = encode(pal_img, "PNG")
    pal_alpha = bytes(int(v) for v in rng.integers(0, 256, 40))
    cases["palette_trns"] = encode(pal_img, "PNG", transparency=pal_alpha)
    cases["palette_trns_one"] = encode(pal_img, "PNG", transparency=3)
    idx = (gray >> 6).astype(np.uint8)
    plte = bytes([0, 0, 0, 255, 0, 0, 0, 255, 0, 10, 20, 200])
    cases["palette2bit_trns"] = raw_png(idx, 3, 2, plte=plte, trns=bytes([255, 0, 128]))
    return cases


def jpeg_cases() -> dict:
    return {
        "baseline": jpeg(61, 83, 3),
        "progressive": jpeg(61, 83, 4, progressive=True),
        "gray": jpeg(61, 83, 5, mode="L"),
        "cmyk": jpeg(61, 83, 6, mode="CMYK"),
        "444": jpeg(61, 83, 7, subsampling=0),
        "422": jpeg(61, 83, 8, subsampling=1),
        "q40": jpeg(61, 83, 9, quality=40),
    }


def pil_rgb(data: bytes) -> np.ndarray:
    """What the PIL backend starts from: Image.open + transformers' convert_to_rgb."""
    return np.asarray(convert_to_rgb(Image.open(io.BytesIO(data)), return_numpy=True))


def mml_rgb(data: bytes, scale: int = 1) -> np.ndarray:
    buf, h, w = _core.image_decode(data, scale)
    return np.frombuffer(buf, np.uint8).reshape(h, w, 3)


def mml_resize(a: np.ndarray, h: int, w: int, h_first: bool = False) -> np.ndarray:
    out = _core.resize_bicubic(
        np.ascontiguousarray(a).tobytes(), a.shape[0], a.shape[1], h, w, h_first
    )
    return np.frombuffer(out, np.uint8).reshape(h, w, 3)


def reference(datas, **kw):
    proc = Qwen2VLImageProcessorPil(**{**QWEN25, **kw})
    return proc([Image.open(io.BytesIO(d)) for d in datas], return_tensors="np")


def assert_same(ours, ref):
    np.testing.assert_array_equal(ours["image_grid_thw"], ref["image_grid_thw"])
    assert ours["pixel_values"].dtype == np.float32
    assert ours["image_grid_thw"].dtype == np.int64
    assert ours["pixel_values"].shape == ref["pixel_values"].shape
    diff = np.abs(ours["pixel_values"] - ref["pixel_values"].astype(np.float32))
    assert diff.max() <= 1e-6, f"max |diff| {diff.max()}, {np.count_nonzero(diff)} values differ"


# ----------------------------------------------------------------------------- smart_resize

WORKED = [
    ((1365, 2048), 28, 3136, 12845056, (1372, 2044)),
    ((480, 640), 28, 3136, 12845056, (476, 644)),
    ((70, 70), 28, 3136, 12845056, (56, 56)),
    ((100, 100), 28, 3136, 12845056, (112, 112)),
    ((28, 5000), 28, 3136, 12845056, (28, 5012)),
    ((3000, 4000), 28, 3136, 12845056, (2996, 4004)),
    ((1365, 2048), 28, 3136, 1003520, (812, 1204)),
    ((1080, 1920), 28, 3136, 1003520, (728, 1316)),
    ((1365, 2048), 32, 65536, 16777216, (1376, 2048)),
    ((224, 224), 32, 65536, 16777216, (256, 256)),
]


@pytest.mark.parametrize("hw,factor,mn,mx,want", WORKED)
def test_smart_resize_worked_values(hw, factor, mn, mx, want):
    assert mmloader.smart_resize(*hw, factor=factor, min_pixels=mn, max_pixels=mx) == want


@needs_tf
def test_smart_resize_matches_transformers_randomly():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as ref

    rng = np.random.default_rng(0)
    for _ in range(3000):
        h, w = (int(v) for v in rng.integers(1, 6000, 2))
        if max(h, w) / min(h, w) > 200:
            continue
        factor = int(rng.choice([28, 32, 14]))
        mn = int(rng.choice([3136, 65536, 4 * factor * factor]))
        mx = int(rng.choice([1003520, 12845056, 16777216, 200704]))
        assert mmloader.smart_resize(h, w, factor, mn, mx) == ref(h, w, factor, mn, mx), (h, w)


def test_smart_resize_errors_and_legacy():
    with pytest.raises(ValueError, match="aspect ratio"):
        mmloader.smart_resize(10, 2011)
    assert mmloader.smart_resize(10, 20) == (56, 84)
    with pytest.raises(ValueError, match="factor"):
        mmloader.smart_resize(10, 20, legacy=True)
    # the clamp that older releases lacked
    assert mmloader.smart_resize(28, 5600, 28, 784, 7840) == (28, 1232)
    with pytest.raises(ValueError):
        mmloader.smart_resize(28, 5600, 28, 784, 7840, legacy=True)
    assert mmloader.smart_resize(1365, 2048, legacy=True) == mmloader.smart_resize(1365, 2048)


# ----------------------------------------------------------------------------- decode parity


@needs_tf
@pytest.mark.parametrize("name,data", list(png_cases().items()) + list(jpeg_cases().items()))
def test_decode_matches_pillow(name, data):
    want = pil_rgb(data)
    got = mml_rgb(data)
    assert got.shape == want.shape
    assert np.count_nonzero(got != want) == 0, name


@needs_tf
def test_decode_random_jpegs_match_pillow():
    """Our libjpeg-turbo (the system's) against Pillow's bundled one: random sizes, qualities,
    4:4:4 / 4:2:2 / 4:2:0 / 4:1:1, progressive, optimised Huffman, gray and CMYK."""
    rng = np.random.default_rng(11)
    subs = [0, 1, 2, "4:1:1"]
    for i in range(40):
        h, w = (int(v) for v in rng.integers(1, 300, 2))
        im = Image.fromarray(pattern(h, w, i))
        if i % 7 == 0:
            im = im.convert("L")
        if i % 11 == 0:
            im = Image.fromarray(pattern(h, w, i, 4), "CMYK")
        data = encode(
            im,
            "JPEG",
            quality=int(rng.integers(5, 101)),
            subsampling=subs[i % 4],
            progressive=i % 3 == 0,
            optimize=i % 5 == 0,
        )
        assert np.count_nonzero(mml_rgb(data) != pil_rgb(data)) == 0, (h, w, i)


def test_alpha_composite_and_cmyk_formulas_exhaustive():
    """Every (value, alpha) pair over white and every (c, k) pair of CMYK, against Pillow."""
    v = np.repeat(np.arange(256, dtype=np.uint8), 256).reshape(256, 256)
    a = np.tile(np.arange(256, dtype=np.uint8), 256).reshape(256, 256)
    rgba = np.dstack([v, 255 - v, v // 2 + a // 2, a])
    data = encode(Image.fromarray(rgba, "RGBA"), "PNG")
    bg = Image.new("RGBA", (256, 256), (255, 255, 255, 255))
    want = np.asarray(Image.alpha_composite(bg, Image.fromarray(rgba, "RGBA")).convert("RGB"))
    np.testing.assert_array_equal(mml_rgb(data), want)
    cmyk = np.dstack([v, a, 255 - v, a])
    data = encode(Image.fromarray(cmyk, "CMYK"), "JPEG", quality=100)
    np.testing.assert_array_equal(
        mml_rgb(data), np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    )


# ----------------------------------------------------------------------------- resize parity


def assert_resize_is_pillows(a, h, w, other_order=False):
    """mml_resize(a) to (h, w) equals Pillow's bicubic resize, in the pass order this Pillow
    takes; with other_order (Pillow >= 13), the horizontal-first order too, against Pillow's
    own two passes in that order."""
    H, W = a.shape[:2]
    want = np.asarray(Image.fromarray(a).resize((w, h), Image.BICUBIC))
    got = mml_resize(a, h, w, h_first=PIL_MAJOR < 13)
    assert np.count_nonzero(got != want) == 0, (H, W, h, w)
    if other_order and PIL_MAJOR >= 13:
        mid = Image.fromarray(a).resize((w, H), Image.BICUBIC).resize((w, h), Image.BICUBIC)
        got = mml_resize(a, h, w, h_first=True)
        assert np.count_nonzero(got != np.asarray(mid)) == 0, (H, W, h, w, "h-first")


def test_resize_matches_pillow_random_sizes():
    rng = np.random.default_rng(3)
    for _ in range(150):
        H, W, h, w = (int(v) for v in rng.integers(1, 160, 4))
        assert_resize_is_pillows(pattern(H, W, int(rng.integers(1 << 30))), h, w)


def test_resize_edge_sizes_match_pillow():
    """The horizontal pass's edge paths: fewer than 4 input pixels (portable transpose),
    fewer than 8 output pixels (single-pixel stores), row counts that leave a partial group
    of 8 rows, and the overlapping last vector steps; both pass orders."""
    for W in (1, 2, 3, 4, 5, 7, 8, 9, 33):
        for w in (1, 2, 3, 5, 7, 8, 9, 15, 17, 40):
            for H, h in ((1, 1), (3, 5), (9, 9), (13, 6), (7, 17)):
                assert_resize_is_pillows(pattern(H, W, W * 1000 + w * 10 + H), h, w)


def test_resize_near_unity_matches_pillow():
    """Sizes that change by a few pixels (smart_resize rounding to the patch grid: the
    common case), where consecutive vertical outputs read four rows each, one row apart,
    and are produced two at a time; both pass orders, widths on both sides of the 16- and
    32-byte vector steps, and heights that end a pair or leave one output alone."""
    rng = np.random.default_rng(15)
    cases = [
        (H, W, H - dh, W - dw)
        for H, W in ((29, 17), (64, 40), (97, 130))
        for dh, dw in ((1, 0), (3, 1), (6, 1), (0, 2), (2, 2), (-3, 5), (11, 0))
    ]
    cases += [
        (int(H), int(W), int(H + rng.integers(-12, 8)), int(W + rng.integers(-8, 8)))
        for H, W in rng.integers(20, 200, (40, 2))
    ]
    for H, W, h, w in cases:
        a = pattern(H, W, H * 1000 + W)
        want = np.asarray(Image.fromarray(a).resize((w, h), Image.BICUBIC))
        got = mml_resize(a, h, w, h_first=PIL_MAJOR < 13)
        assert np.count_nonzero(got != want) == 0, (H, W, h, w)


def test_resize_vnni_widths_match_pillow():
    """resize_vnni.c's horizontal pass (taken where the CPU has AVX-512 VBMI + VNNI; the
    parity tests run the other paths with MML_DISABLE_AVX512): outputs in groups of 16
    from a 128-byte window, so widths of 16 and up, downscales up to ~2x (1-3 tap groups:
    weights of three byte digits) and upscales, the last group overlapping, and rows whose
    end falls inside the window (masked loads; invariants 1-3); both pass orders and, for
    the first cases, Pillow <= 12's horizontal-first order too."""
    rng = np.random.default_rng(34)
    cases = [(W, w) for W in (16, 17, 31, 47, 48, 64, 100) for w in (16, 17, 23, 32, 47, W + 3)]
    cases += [
        (int(W), int(W * f)) for W, f in zip(rng.integers(16, 700, 40), rng.uniform(0.44, 1.6, 40))
    ]
    for i, (W, w) in enumerate(cases):
        if w < 16 or w > 2 * W + 64:
            continue
        for H, h in ((9, 9), (20, 13), (13, 29)):
            assert_resize_is_pillows(pattern(H, W, W * 7919 + w * 31 + H), h, w, i < 12)


def test_resize_vnni_wide_widths_match_pillow():
    """resize_vnni.c's wide horizontal pass (downscales past ~2x, up to 64 taps: windows of
    128 bytes per tap group, blended by lane masks; invariants 1-3 and 4): downscale factors
    2-8x and past it, odd and even widths, the last group overlapping, rows whose end falls
    inside a window (masked loads), widths around 16; both pass orders."""
    rng = np.random.default_rng(36)
    cases = [(W, w) for W in (33, 47, 97, 129, 255, 401) for w in (16, 17, 31, 47) if W > 2 * w]
    cases += [
        (int(w * f), int(w)) for w in (16, 19, 33, 97, 131) for f in (2.1, 2.5, 3, 4, 5.3, 7, 8)
    ]
    cases += [(1024, 64), (1000, 63), (997, 65), (40 * 16 + 7, 16)]
    cases += [
        (int(w * f), int(w)) for w, f in zip(rng.integers(16, 400, 40), rng.uniform(2.0, 9.0, 40))
    ]
    for i, (W, w) in enumerate(cases):
        for H, h in ((9, 9), (20, 13), (13, 29)):
            assert_resize_is_pillows(pattern(H, W, W * 7919 + w * 31 + H), h, w, i % 5 == 0)


def test_resize_vnni_heights_match_pillow():
    """resize_vnni.c's vertical pass: 64 bytes a step (rows of at least 64 bytes: planar
    rows of 64+ pixels, interleaved rows of 22+), 1-4 tap groups (up to 16 taps: heights
    shrinking up to ~4x; 5-8: test_resize_vnni_tall_heights_match_pillow), outputs alone and in pairs, the
    last step overlapping; both pass orders."""
    rng = np.random.default_rng(35)
    cases = [
        (H, h, w)
        for H in (40, 97)
        for h in (9, 20, 23, 38, H + 5, 2 * H)
        for w in (22, 64, 65, 131)
    ]
    cases += [
        (int(H), int(H * f), int(w))
        for H, f, w in zip(
            rng.integers(10, 400, 30), rng.uniform(0.2, 2, 30), rng.integers(22, 300, 30)
        )
    ]
    for H, h, w in cases:
        if h < 1:
            continue
        for W in (w, w + 7, w - 3):
            assert_resize_is_pillows(pattern(H, W, H * 7919 + W * 31 + h), h, w)


def test_resize_vnni_tall_heights_match_pillow():
    """resize_vnni.c's vertical pass past 16 taps (row_v_body_wide: 5-8 tap groups, the
    digit sums kept apart; invariant 2): heights shrinking ~4-8x (17-32 taps, the exact
    path at the recipe caps from 3-12 MP photos) and past 8x (resize.c's pass), rows of
    64 bytes and more (the last step overlapping), outputs alone and in pairs, widths that
    shrink too (horizontal pass first: planar rows) or not (vertical first: interleaved
    rows); both pass orders."""
    rng = np.random.default_rng(37)
    cases = [(H, h, w) for H in (97, 160, 255) for h in (12, 20, 31, 40) for w in (22, 64, 131)]
    cases += [
        (int(h * f), int(h), int(w))
        for h, f, w in zip(
            rng.integers(4, 90, 30), rng.uniform(3.6, 9.0, 30), rng.integers(22, 300, 30)
        )
    ]
    for i, (H, h, w) in enumerate(cases):
        if 4 * h > H:  # under ~4x: test_resize_vnni_heights_match_pillow
            continue
        for W in (w, 3 * w + 1):
            assert_resize_is_pillows(pattern(H, W, H * 7919 + W * 31 + h), h, w, i % 3 == 0)


def test_resize_ring_batches_match_pillow():
    """vision_resize.c gathers 32 source rows (resize.h MML_HROWS_RING) for each horizontal
    pass when the vertical pass follows it, and hands them to the passes 8 at a time:
    images shorter than one batch, exactly one or two, one row past, a partial last batch,
    and the rows the vertical pass stops reading before the end; every horizontal path
    (widths shrinking 1.2-5x: narrow and wide VNNI, resize.c's), both pass orders."""
    for H in (5, 31, 32, 33, 64, 65, 97):
        for W, w in ((120, 100), (120, 37), (301, 60)):
            for h in sorted({max(1, H // 3), H - 1, H + 9}):
                if h != H:
                    assert_resize_is_pillows(pattern(H, W, H * 7919 + W * 31 + h), h, w, True)


def test_resize_pass_order_matters():
    """Pillow 13 runs the vertical pass first when the height shrinks much more than the
    width; the two orders round differently, and `pillow_h_first` selects the old one."""
    a = pattern(300, 200, 5)
    v_first, h_first = mml_resize(a, 100, 190), mml_resize(a, 100, 190, h_first=True)
    assert np.count_nonzero(v_first != h_first) > 0
    want = np.asarray(Image.fromarray(a).resize((190, 100), Image.BICUBIC))
    np.testing.assert_array_equal(h_first if PIL_MAJOR < 13 else v_first, want)


# ----------------------------------------------------------------------------- processor parity


@needs_tf
@pytest.mark.parametrize("kind", ["png", "jpeg"])
def test_processor_matches_transformers_all_formats(kind):
    cases = png_cases() if kind == "png" else jpeg_cases()
    datas = list(cases.values())
    proc = mmloader.ImageProcessor("qwen2.5-vl")
    assert_same(proc(datas), reference(datas))


SIZES = [
    (5, 9),
    (27, 28),
    (30, 30),
    (3, 600),
    (600, 3),
    (7, 1400),
    (2, 400),
    (97, 1001),
    (480, 640),
    (333, 500),
    (1000, 35),
    (56, 56),
]


@needs_tf
@pytest.mark.parametrize("hw", SIZES)
def test_processor_matches_transformers_sizes(hw):
    datas = [jpeg(*hw, seed=hw[0]), encode(Image.fromarray(pattern(*hw, seed=hw[1])), "PNG")]
    proc = mmloader.ImageProcessor("qwen2.5-vl")
    assert_same(proc(datas), reference(datas))


@needs_tf
@pytest.mark.parametrize(
    "preset,kw",
    [
        ("qwen2.5-vl", dict(max_pixels=200704)),  # max limit: downscale
        ("qwen2.5-vl", dict(min_pixels=200704)),  # min limit: upscale
        ("qwen2-vl", dict(max_pixels=50176, min_pixels=3136)),
        ("qwen3-vl", {}),
    ],
)
def test_processor_pixel_limits_and_presets(preset, kw):
    datas = [
        jpeg(480, 640, 1),
        jpeg(1365 // 3, 2048 // 3, 2),
        jpeg(40, 3000, 3),
        jpeg(900, 300, 4, progressive=True),
    ]
    proc = mmloader.ImageProcessor(preset, **kw)
    c = proc.config
    ref = reference(
        datas,
        min_pixels=c["min_pixels"],
        max_pixels=c["max_pixels"],
        patch_size=c["patch_size"],
        merge_size=c["merge_size"],
        temporal_patch_size=c["temporal_patch_size"],
        image_mean=c["image_mean"],
        image_std=c["image_std"],
    )
    assert_same(proc(datas), ref)


@needs_tf
def test_processor_large_checkpoint_image():
    data = jpeg(1365, 2048, 11)
    out = mmloader.ImageProcessor("qwen2.5-vl")([data])
    assert out["image_grid_thw"].tolist() == [[1, 98, 146]]
    assert out["pixel_values"].shape == (98 * 146, 1176)
    assert_same(out, reference([data]))


@needs_tf
def test_inputs_paths_arrays_and_pil(tmp_path):
    data = jpeg(123, 77, 2)
    p = tmp_path / "a.jpg"
    p.write_bytes(data)
    arr = pil_rgb(data)
    rgba = Image.fromarray(np.dstack([pattern(40, 50, 3), pattern(40, 50, 4)[..., 0]]), "RGBA")
    proc = mmloader.ImageProcessor()
    out = proc([str(p), p, arr, data, rgba])
    ref = Qwen2VLImageProcessorPil(**QWEN25)(
        [Image.open(io.BytesIO(data))] * 4 + [rgba], return_tensors="np"
    )
    assert_same(out, ref)
    single = proc(arr)
    assert single["image_grid_thw"].shape == (1, 3)


def test_model_dir_overrides(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "size": {"shortest_edge": 3136, "longest_edge": 200704},
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
            }
        )
    )
    proc = mmloader.ImageProcessor("qwen2.5-vl", model_dir=str(tmp_path))
    assert proc.config["max_pixels"] == 200704
    out = proc([jpeg(1365, 2048, 1)])
    h, w = mmloader.smart_resize(1365, 2048, 28, 3136, 200704)
    assert out["image_grid_thw"].tolist() == [[1, h // 14, w // 14]]
    assert proc.plan(jpeg(1365, 2048, 1))["tokens"] == (h // 28) * (w // 28)
    # keyword overrides win over the model directory
    assert (
        mmloader.ImageProcessor("qwen2.5-vl", model_dir=str(tmp_path), max_pixels=1003520).config[
            "max_pixels"
        ]
        == 1003520
    )


# ----------------------------------------------------------------------------- errors


def test_errors():
    proc = mmloader.ImageProcessor(max_image_pixels=100 * 100)
    with pytest.raises(mmloader.SampleError, match="image 1.*max_image_pixels"):
        proc([jpeg(50, 50), jpeg(101, 100)])
    data = jpeg(100, 100)
    with pytest.raises(mmloader.SampleError, match="image 0"):
        proc([data[: len(data) // 2]])
    with pytest.raises(mmloader.SampleError):
        proc([b"GIF89a" + bytes(100)])
    with pytest.raises(mmloader.SampleError, match="aspect"):
        proc([jpeg(2, 500)])
    with pytest.raises(mmloader.SampleError):
        proc([data[:300] + bytes(len(data) - 300)])  # zeroed entropy data
    with pytest.raises(ValueError):
        mmloader.ImageProcessor(image_std=[0.5, 0.0, 0.5])
    with pytest.raises(ValueError):
        mmloader.ImageProcessor("qwen9")
    with pytest.raises(TypeError):
        proc([12])
    with pytest.raises(ValueError):
        proc([np.zeros((4, 4, 4), np.uint8)])
    png = encode(Image.fromarray(pattern(30, 30)), "PNG")
    for cut in (20, 40, len(png) // 2, len(png) - 30):
        with pytest.raises(mmloader.SampleError):
            proc([png[:cut]])
    # cut after the last row (the IDAT's CRC, IEND): Pillow stops at the last row and
    # decodes it, and so does the decoder since issue 29 (libpng read on to the end)
    Image.open(io.BytesIO(png[: len(png) - 13])).load()
    assert proc([png[: len(png) - 13]])["pixel_values"].shape[0] > 0
    assert proc([data])["pixel_values"].shape[0] > 0  # still usable


def test_fast_mode_is_close_and_documented():
    data = jpeg(1600, 1200, 4)
    exact = mmloader.ImageProcessor(max_pixels=200704)
    fast = mmloader.ImageProcessor(max_pixels=200704, fast_decode=True)
    assert fast.plan(data)["decode_scale"] == 2
    a, b = exact([data]), fast([data])
    np.testing.assert_array_equal(a["image_grid_thw"], b["image_grid_thw"])
    d = np.abs(a["pixel_values"] - b["pixel_values"])
    # reduced-DCT decode is not bit-exact; it stays within a few uint8 steps on average
    assert d.mean() < 0.05 and d.max() > 0


def test_fast_decode_is_one_option_in_the_loader_and_the_processor(tmp_path):
    """fast_decode has one spelling (issue 34): the Loader's batches and ImageProcessor's
    output agree bit for bit with it on, and the processor refuses the old name "fast"."""
    data = jpeg(1600, 1200, 5)
    path = tmp_path / "big.jpg"
    path.write_bytes(data)
    shard = tmp_path / "train.jsonl"
    msg = [{"role": "user", "content": "<image>What?"}, {"role": "assistant", "content": "A."}]
    shard.write_text(json.dumps({"messages": msg, "images": [str(path)]}) + "\n")
    tiny = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
    with pytest.raises(ValueError, match="fast"):
        mmloader.ImageProcessor(max_pixels=200704, fast=True)
    for fast in (False, True):
        proc = mmloader.ImageProcessor(max_pixels=200704, fast_decode=fast)
        with mmloader.Loader(
            str(shard), tokenizer=tiny, micro_batch_size=1, max_pixels=200704, fast_decode=fast
        ) as L:
            got = np.from_dlpack(next(L)["pixel_values"]).copy()
        np.testing.assert_array_equal(got, proc([data])["pixel_values"])
    # the benchmarks' floor of the fast path: the decoder alone at each image's scale
    assert _core.decode_only([data, data], [2, 4]) == 800 * 600 + 400 * 300
    with pytest.raises(mmloader.Error):
        _core.decode_only([data], [3])


@needs_tf
@pytest.mark.parametrize("switch", ["MML_DISABLE_AVX2", "MML_DISABLE_AVX512"])
def test_portable_paths_match_too(switch):
    """The non-AVX2 code (taken on other CPUs) and the AVX2 code beside the AVX-512 passes
    (taken on CPUs without AVX-512) give the same bytes: run a parity check in a child
    process with those paths switched off (the wide downscales of resize_vnni.c's wide
    variant included)."""
    import subprocess
    import sys

    code = (
        "import io, numpy as np, mmloader, test_vision as t\n"
        "d = [t.jpeg(300, 200, 1), t.jpeg(61, 83, 2), t.png_cases()['rgba'], t.jpeg(333, 500, 3)]\n"
        "t.test_resize_edge_sizes_match_pillow()\n"
        "t.test_resize_matches_pillow_random_sizes()\n"
        "t.test_resize_vnni_wide_widths_match_pillow()\n"
        "t.test_resize_vnni_tall_heights_match_pillow()\n"
        "t.test_resize_ring_batches_match_pillow()\n"
        "o = mmloader.ImageProcessor()(d)\n"
        "t.assert_same(o, t.reference(d))\n"
        "o = mmloader.ImageProcessor('qwen3-vl')(d)\n"
        "t.assert_same(o, t.reference(d, patch_size=16, min_pixels=65536, max_pixels=16777216,"
        " image_mean=[.5, .5, .5], image_std=[.5, .5, .5]))\n"
        "print('ok')\n"
    )
    env = child_env(**{switch: "1"})  # the mmloader this test imported, and test_vision
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env["PYTHONPATH"]])
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_threads_share_one_processor():
    datas = [jpeg(200 + 10 * i, 300, i) for i in range(6)]
    proc = mmloader.ImageProcessor()
    want = proc(datas)["pixel_values"]
    results, errors = [], []

    def run():
        try:
            for _ in range(3):
                results.append(proc(datas)["pixel_values"])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=run) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert len(results) == 9 and all(np.array_equal(r, want) for r in results)


def _thp_always() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[always]" in f.read()
    except OSError:
        return False


def test_output_buffer_reused_after_a_smaller_first_call():
    """The one-call API writes into the memory of its last larger output, not fresh pages:
    a processor keeps the largest output buffer released (vision_py.c).  Before, a small
    first call (a warm-up) left its small buffer cached and every larger call then mapped
    and page-faulted a fresh output (issue 34: float32 at 768x768 cost 1.7x the uint8 path
    in bench_recipe_caps)."""
    import resource

    if _thp_always():
        pytest.skip("transparent huge pages 'always': a fresh output faults per 2 MiB")
    big = [jpeg(600, 800, k) for k in range(4)]
    proc = mmloader.ImageProcessor(pixel_format="float32")
    proc([jpeg(40, 56, 9)])  # the small first call
    nbytes = proc(big)["pixel_values"].nbytes  # a larger one: a fresh buffer (dropped here)
    assert nbytes > 16 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    out = proc(big)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert out["pixel_values"].nbytes == nbytes
    assert faults < nbytes // 4096 // 8, (faults, nbytes // 4096)
