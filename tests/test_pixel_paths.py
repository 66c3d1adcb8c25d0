"""The CPU's pixel-path variants give the same bytes: the uint8 writer that scatters each
resized row straight into its patch rows (vision_patch.c u8_scatter, 16-byte copies that
overlap the next row's first bytes), for each order of the resize passes, and the
expansion of uint8 patch rows to float32/bfloat16 (pixels.c: the AVX-512 VBMI byte-permute
lookups, the scalar streamed loop, the plain loop), each against a NumPy reference and
against each other in child processes with the vector paths turned off."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from child import child_env

import mmloader
from mmloader import _core

HERE = os.path.dirname(os.path.abspath(__file__))

# (source h, w), max_pixels: each resize order runs — both passes horizontal-first (the
# image grows), both vertical-first (the height shrinks by more than twice as many pixels
# as the width, Pillow 13's rule), width only, height only, none (224: a multiple of
# both presets' factors, 28 and 32)
SIZES = {
    "h-first": ((310, 400), 12845056),
    "v-first": ((900, 300), 100000),
    "width-only": ((224, 500), 12845056),
    "height-only": ((500, 224), 12845056),
    "none": ((224, 448), 12845056),
}


def _image(h: int, w: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // w), (y * 255 // h), ((x + y) * 127 // (w + h))], axis=2)
    return np.clip(base + rng.integers(-40, 40, (h, w, 3)), 0, 255).astype(np.uint8)


def _patchify(img: np.ndarray, P: int, M: int) -> np.ndarray:
    h, w, _ = img.shape
    gh, gw = h // P, w // P
    x = img.transpose(2, 0, 1).reshape(3, gh // M, M, P, gw // M, M, P)
    return x.transpose(1, 4, 2, 5, 0, 3, 6).reshape(gh * gw, 3 * P * P)


@pytest.mark.parametrize("preset", ["qwen2.5-vl", "qwen3-vl"])
@pytest.mark.parametrize("case", sorted(SIZES))
def test_uint8_rows_scattered_into_patches_are_the_resized_image(preset, case):
    (h, w), pixels = SIZES[case]
    img = _image(h, w, 7)
    proc = mmloader.ImageProcessor(preset, pixel_format="uint8", min_pixels=3136, max_pixels=pixels)
    P = proc.config["patch_size"]
    M = proc.config["merge_size"]
    th, tw = mmloader.smart_resize(h, w, P * M, 3136, pixels)
    vfirst = (h - th) > 0 and (h - th) > 2 * (w - tw)
    assert vfirst == (case == "v-first")
    if case == "width-only":
        assert th == h and tw != w
    elif case == "height-only":
        assert th != h and tw == w
    elif case == "none":
        assert (th, tw) == (h, w)
    got = proc(img)["pixel_values"]
    if (th, tw) == (h, w):
        resized = img
    else:
        buf = _core.resize_bicubic(img.tobytes(), h, w, th, tw)
        resized = np.frombuffer(buf, np.uint8).reshape(th, tw, 3)
    np.testing.assert_array_equal(got, _patchify(resized, P, M))


def _expand_reference(src, P, frames, T, table, bf16):
    PP = P * P
    rows = src.shape[0]
    out = np.empty((rows, 3 * T * PP), np.float32)
    for c in range(3):
        for t in range(T):
            f = 0 if frames == 1 else t
            seg = src[:, (c * frames + f) * PP : (c * frames + f + 1) * PP]
            out[:, (c * T + t) * PP : (c * T + t + 1) * PP] = table[c][seg]
    if not bf16:
        return out
    u = out.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


# P 8: PP = 64, one block of the byte-permute path; 7: below it (the other loops)
CASES = [
    (P, frames, T, bf16)
    for P in (7, 8, 14, 16)
    for frames, T in ((1, 2), (2, 2), (1, 3))
    for bf16 in (0, 1)
]


def _expand_all(seed: int = 5):
    rng = np.random.default_rng(seed)
    outs = []
    for P, frames, T, bf16 in CASES:
        rows = 67
        src = rng.integers(0, 256, (rows, 3 * frames * P * P), dtype=np.uint8)
        table = (rng.random((3, 256), dtype=np.float32) * 4 - 2).astype(np.float32)
        dst = np.zeros((rows, 3 * T * P * P), np.uint16 if bf16 else np.float32)
        _core.expand_pixels(src, dst, table, P, frames, T, bf16)
        outs.append((src, table, dst))
    return outs


def test_expand_pixels_is_the_table_lookup_for_every_shape():
    for (P, frames, T, bf16), (src, table, dst) in zip(CASES, _expand_all()):
        want = _expand_reference(src, P, frames, T, table, bf16)
        assert np.array_equal(dst, want), (P, frames, T, bf16)


def test_expand_pixels_at_every_16_byte_offset_of_a_cache_line():
    """The streamed loops write rows at any 16-byte aligned address: 16-byte pieces up to
    the first cache line boundary, then whole lines, then the tail (pixels.c stream_row);
    each of the four offsets from a 64-byte boundary gives the table lookup."""
    rng = np.random.default_rng(11)
    for P, frames, T, bf16 in [(14, 1, 2, 0), (14, 1, 2, 1), (16, 2, 2, 0), (14, 1, 3, 1)]:
        rows = 9
        src = rng.integers(0, 256, (rows, 3 * frames * P * P), dtype=np.uint8)
        table = (rng.random((3, 256), dtype=np.float32) * 4 - 2).astype(np.float32)
        want = _expand_reference(src, P, frames, T, table, bf16)
        nbytes = want.nbytes
        raw = np.zeros(nbytes + 128, np.uint8)
        base = (-raw.ctypes.data) % 64
        for off in (0, 16, 32, 48):
            view = raw[base + off : base + off + nbytes].view(want.dtype).reshape(want.shape)
            assert view.ctypes.data % 64 == off
            _core.expand_pixels(src, view, table, P, frames, T, bf16)
            assert np.array_equal(view, want), (P, frames, T, bf16, off)


def test_pixel_paths_agree_without_the_vector_code(tmp_path):
    """The same expansions and uint8 patches in child processes with AVX-512, then AVX2,
    turned off (where the machine has them; elsewhere the same paths run three times)."""
    code = (
        "import sys, numpy as np\n"
        "sys.path.insert(0, %r)\n"
        "import test_pixel_paths as t, mmloader\n"
        "outs = [d for _, _, d in t._expand_all()]\n"
        "for name, ((h, w), px) in sorted(t.SIZES.items()):\n"
        "    p = mmloader.ImageProcessor('qwen2.5-vl', pixel_format='uint8', min_pixels=3136,"
        " max_pixels=px)\n"
        "    outs.append(p(t._image(h, w, 7))['pixel_values'])\n"
        "np.savez(sys.argv[1], *outs)\n" % HERE
    )
    env = child_env()
    env.pop("MML_DISABLE_AVX2", None)
    env.pop("MML_DISABLE_AVX512", None)
    got = {}
    for tag, extra in (
        ("default", {}),
        ("avx2", {"MML_DISABLE_AVX512": "1"}),
        ("portable", {"MML_DISABLE_AVX2": "1"}),
    ):
        out = str(tmp_path / f"{tag}.npz")
        r = subprocess.run(
            [sys.executable, "-c", code, out],
            env=dict(env, **extra),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        with np.load(out) as z:
            got[tag] = [z[k] for k in sorted(z.files, key=lambda s: int(s.split("_")[1]))]
    assert len(got["default"]) == len(CASES) + len(SIZES)
    for tag in ("avx2", "portable"):
        for i, (a, b) in enumerate(zip(got["default"], got[tag])):
            assert a.dtype == b.dtype and np.array_equal(a, b), (tag, i)
