"""GIF (giflib): the first frame, palettes (global, local, none, indices past the table),
palette transparency, interlacing, frames offset inside or reaching past the logical
screen, real animations; on real photos, bit-exact against Pillow -> convert_to_rgb ->
Qwen2VLImageProcessorPil."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from photos import (
    assert_decodes_like_pillow,
    assert_processes_like_transformers,
    data_file,
    encode,
    photos,
    rgb,
)

import mmloader

pytest.importorskip("transformers")
from PIL import Image  # noqa: E402


def _first_descriptor(g: bytes) -> int:
    """Offset of the first image descriptor (0x2C) of a GIF."""
    i = 13 + ((3 << ((g[10] & 7) + 1)) if g[10] & 0x80 else 0)
    while g[i] == 0x21:
        i += 2
        while g[i]:
            i += g[i] + 1
        i += 1
    assert g[i] == 0x2C
    return i


def regrid(g: bytes, screen, left: int, top: int) -> bytes:
    """The same GIF with another logical screen size and the first frame moved."""
    i = _first_descriptor(g)
    out = bytearray(g)
    out[6:10] = struct.pack("<HH", *screen)
    out[i + 1 : i + 5] = struct.pack("<HH", left, top)
    return bytes(out)


def local_palette(g: bytes) -> bytes:
    """The same GIF with its global colour table moved onto the first frame."""
    assert g[10] & 0x80
    n = 3 << ((g[10] & 7) + 1)
    table = g[13 : 13 + n]
    head = bytearray(g[:13])
    bits = head[10] & 7
    head[10] &= 0x7F
    rest = g[13 + n :]
    i = _first_descriptor(bytes(head) + rest) - 13
    desc = bytearray(rest[i : i + 10])
    desc[9] = (desc[9] & 0x40) | 0x80 | bits
    return bytes(head) + rest[:i] + bytes(desc) + table + rest[i + 10 :]


def gif_cases(ims: dict) -> dict:
    out = {}
    for i, (name, im) in enumerate(ims.items()):
        q = rgb(im).quantize(256)
        out[f"{name}/256"] = encode(q, "GIF")
        out[f"{name}/16 no dither"] = encode(rgb(im).quantize(16, dither=Image.Dither.NONE), "GIF")
        out[f"{name}/transparent"] = encode(q, "GIF", transparency=(7 * i) % 256)
        out[f"{name}/interlaced"] = encode(q, "GIF", interlace=True)
        out[f"{name}/gray"] = encode(im.convert("L"), "GIF")
        out[f"{name}/local palette"] = local_palette(encode(q, "GIF"))
    return out


def test_gif_decodes_like_pillow_on_real_photos():
    assert assert_decodes_like_pillow(gif_cases(photos(400))) > 5_000_000


def test_gif_frame_placement_and_palette_edges():
    im = rgb(photos(160)["astronaut"]).quantize(64)
    g = encode(im, "GIF")
    w, h = im.size
    a = (np.arange(64 * 48).reshape(48, 64) % 8).astype(np.uint8)
    short = Image.fromarray(a, "P")
    short.putpalette([10, 20, 30, 200, 100, 50, 5, 250, 5, 90, 90, 90])  # 4 entries, 8 indices
    assert_decodes_like_pillow(
        {
            "offset inside screen": regrid(g, (w + 30, h + 20), 17, 9),
            "offset, transparent": regrid(
                encode(im, "GIF", transparency=5), (w + 30, h + 20), 17, 9
            ),
            "reaching past screen": regrid(g, (w - 40, h - 10), 25, 3),
            "zero screen": regrid(g, (0, 0), 0, 0),
            "indices past the table": encode(short, "GIF"),
            "local + interlaced": local_palette(encode(im, "GIF", interlace=True)),
        }
    )


def test_gif_real_animation_first_frame():
    path = data_file("skimage", "no_time_for_that_tiny.gif")
    data = open(path, "rb").read()
    assert Image.open(path).n_frames > 1
    assert_decodes_like_pillow({"skimage animation": data})
    ims = [rgb(x).resize((120, 90)) for x in list(photos(160).values())[:3]]
    anim = encode(ims[0], "GIF", save_all=True, append_images=ims[1:], duration=50, loop=0)
    assert_decodes_like_pillow({"photo animation": anim})


def test_gif_processor_matches_transformers():
    cases = gif_cases(dict(list(photos(400).items())[:3]))
    assert_processes_like_transformers(list(cases.values()))


def test_gif_broken_files_are_refused():
    data = encode(rgb(photos(128)["coffee"]).quantize(256), "GIF")
    proc = mmloader.ImageProcessor()
    for cut in (8, 13, 400, len(data) // 2, len(data) - 20):
        with pytest.raises(mmloader.SampleError, match="GIF"):
            proc([data[:cut]])
    with pytest.raises(mmloader.SampleError, match="GIF.*no image"):
        proc([data[: 13 + 768] + b";"])
