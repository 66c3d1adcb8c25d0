"""BMP (written by hand in image_bmp.c): what Pillow's BmpImagePlugin reads — info headers
12/40/56/108/124, 1/4/8-bit palettes, 16-bit 5-5-5 and 5-6-5 (every value), 24, 32 with
Pillow's bit-field layouts (alpha composited), RLE8/RLE4, top-down rows — on real photos,
bit-exact against Pillow -> convert_to_rgb -> Qwen2VLImageProcessorPil; and what Pillow
refuses, refused."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from photos import (
    alpha_for,
    assert_decodes_like_pillow,
    assert_processes_like_transformers,
    encode,
    photos,
    rgb,
)

import mmloader

pytest.importorskip("transformers")
from PIL import Image  # noqa: E402


def _pack(idx: np.ndarray, bits: int) -> list:
    rows = []
    for r in idx:
        if bits == 8:
            b = r.astype(np.uint8).tobytes()
        else:
            per = 8 // bits
            v = np.concatenate([r, np.zeros((-len(r)) % per, r.dtype)]).reshape(-1, per)
            sh = np.array([8 - bits * (i + 1) for i in range(per)], np.uint8)
            b = np.bitwise_or.reduce(v.astype(np.uint8) << sh, axis=1).astype(np.uint8).tobytes()
        rows.append(b)
    return rows


def bmp(
    rows: list,
    w: int,
    h: int,
    bits: int,
    *,
    palette: bytes = b"",
    header: int = 40,
    compression: int = 0,
    masks=None,
    top_down: bool = False,
    colors: int = 0,
    raw: bytes | None = None,
) -> bytes:
    """A BMP file; `rows` top row first (written bottom-up unless top_down), unpadded."""
    if raw is None:
        stride = ((w * bits + 31) // 32) * 4
        order = rows if top_down else rows[::-1]
        raw = b"".join(r + bytes(stride - len(r)) for r in order)
    if header == 12:
        info = struct.pack("<IHHHH", 12, w, h, 1, bits)
    else:
        info = struct.pack(
            "<IiiHHIIiiII",
            header,
            w,
            -h if top_down else h,
            1,
            bits,
            compression,
            len(raw),
            2835,
            2835,
            colors,
            0,
        )
        extra = b""
        if masks is not None and header == 40:
            extra = struct.pack("<III", *masks[:3])
        elif header > 40:
            m = list(masks or (0, 0, 0, 0)) + [0] * 4
            info += struct.pack("<IIII", *m[:4])
        info += bytes(header - len(info)) + extra
    off = 14 + len(info) + len(palette)
    return b"BM" + struct.pack("<IHHI", off + len(raw), 0, 0, off) + info + palette + raw


def pal(colors) -> bytes:
    return b"".join(bytes((b, g, r, 0)) for r, g, b in colors)


def rle8(idx: np.ndarray, delta_at: int | None = None) -> bytes:
    """RLE8 with encoded runs and absolute runs, EOL per row, optional delta, EOB."""
    out = bytearray()
    for y, r in enumerate(idx[::-1]):  # bottom-up
        if delta_at is not None and y == delta_at:
            out += bytes((0, 2, 3, 1))  # skip 3 right, 1 up
            continue
        x = 0
        while x < len(r):
            n = 1
            while x + n < len(r) and n < 255 and r[x + n] == r[x]:
                n += 1
            if n >= 3 or len(r) - x < 3:
                out += bytes((n, int(r[x])))
                x += n
            else:
                k = min(len(r) - x, 40)
                out += bytes((0, k)) + r[x : x + k].astype(np.uint8).tobytes() + bytes(k % 2)
                x += k
        out += b"\0\0"
    return bytes(out + b"\0\1")


def rle4(idx: np.ndarray) -> bytes:
    out = bytearray()
    for r in idx[::-1]:
        x = 0
        while x < len(r):
            k = min(len(r) - x, 30)
            seg = r[x : x + k]
            if k >= 4 and np.all(seg[::2] == seg[0]) and np.all(seg[1::2] == seg[1]):
                out += bytes((k, int(seg[0]) << 4 | int(seg[1])))
            else:
                nb = (k + 1) // 2
                v = np.concatenate([seg, [0]])[: 2 * nb].reshape(-1, 2)
                data = bytes(int(a) << 4 | int(b) for a, b in v)
                out += (
                    (bytes((0, k)) + data + bytes(nb % 2))
                    if k >= 3
                    else bytes((k, int(seg[0]) << 4 | int(seg[-1])))
                )
            x += k
        out += b"\0\0"
    return bytes(out + b"\0\1")


def bmp_cases(ims: dict) -> dict:
    out = {}
    for i, (name, im) in enumerate(ims.items()):
        c = rgb(im)
        a = np.asarray(c)
        h, w = a.shape[:2]
        q = c.quantize(256)
        idx = np.asarray(q)
        colors = np.asarray(q.getpalette()[:768], np.uint8).reshape(-1, 3)
        q16 = c.quantize(16, dither=Image.Dither.NONE)
        idx16, p16 = np.asarray(q16), np.asarray(q16.getpalette()[:48], np.uint8).reshape(-1, 3)
        out[f"{name}/24 Pillow"] = encode(c, "BMP")
        out[f"{name}/8 Pillow"] = encode(q, "BMP")
        out[f"{name}/gray Pillow"] = encode(im.convert("L"), "BMP")
        out[f"{name}/1 Pillow"] = encode(im.convert("1"), "BMP")
        out[f"{name}/24 top-down"] = bmp([r[:, ::-1].tobytes() for r in a], w, h, 24, top_down=True)
        out[f"{name}/24 OS2"] = bmp([r[:, ::-1].tobytes() for r in a], w, h, 24, header=12)
        out[f"{name}/4 palette"] = bmp(_pack(idx16, 4), w, h, 4, palette=pal(p16))
        out[f"{name}/8 palette v5"] = bmp(_pack(idx, 8), w, h, 8, palette=pal(colors), header=124)
        v555 = (
            (a[..., 0] >> 3).astype(np.uint16) << 10
            | (a[..., 1] >> 3).astype(np.uint16) << 5
            | (a[..., 2] >> 3)
        )
        out[f"{name}/16 555"] = bmp([r.astype("<u2").tobytes() for r in v555], w, h, 16)
        v565 = (
            (a[..., 0] >> 3).astype(np.uint16) << 11
            | (a[..., 1] >> 2).astype(np.uint16) << 5
            | (a[..., 2] >> 3)
        )
        out[f"{name}/16 565"] = bmp(
            [r.astype("<u2").tobytes() for r in v565],
            w,
            h,
            16,
            compression=3,
            masks=(0xF800, 0x7E0, 0x1F),
        )
        al = alpha_for(im, i)
        bgra = np.dstack([a[..., 2], a[..., 1], a[..., 0], al])
        out[f"{name}/32 BGRA v4"] = bmp(
            [r.tobytes() for r in bgra],
            w,
            h,
            32,
            header=108,
            compression=3,
            masks=(0xFF0000, 0xFF00, 0xFF, 0xFF000000),
        )
        out[f"{name}/32 BI_RGB alpha ignored"] = bmp([r.tobytes() for r in bgra], w, h, 32)
        out[f"{name}/32 XBGR bitfields"] = bmp(
            [np.dstack([al, a[..., 2], a[..., 1], a[..., 0]])[y].tobytes() for y in range(h)],
            w,
            h,
            32,
            compression=3,
            masks=(0xFF000000, 0xFF0000, 0xFF00, 0),
        )
        out[f"{name}/rle8"] = bmp([], w, h, 8, palette=pal(colors), compression=1, raw=rle8(idx))
        out[f"{name}/rle4"] = bmp([], w, h, 4, palette=pal(p16), compression=2, raw=rle4(idx16))
    return out


def test_bmp_decodes_like_pillow_on_real_photos():
    assert assert_decodes_like_pillow(bmp_cases(photos(320))) > 10_000_000


def test_bmp_16_bit_every_value():
    v = np.arange(65536, dtype=np.uint16).reshape(256, 256)
    assert_decodes_like_pillow(
        {
            "555": bmp([r.astype("<u2").tobytes() for r in v], 256, 256, 16),
            "565": bmp(
                [r.astype("<u2").tobytes() for r in v],
                256,
                256,
                16,
                compression=3,
                masks=(0xF800, 0x7E0, 0x1F),
            ),
            "555 bitfields": bmp(
                [r.astype("<u2").tobytes() for r in v],
                256,
                256,
                16,
                compression=3,
                masks=(0x7C00, 0x3E0, 0x1F),
                header=56,
            ),
        }
    )


def test_bmp_palette_and_rle_edges():
    rng = np.random.default_rng(5)
    idx = rng.integers(0, 4, (37, 53)).astype(np.uint8)
    four = [(250, 10, 10), (10, 250, 10), (10, 10, 250), (128, 128, 0)]
    gray = np.asarray(photos(128)["camera"])
    assert_decodes_like_pillow(
        {
            "short palette, indices past it": bmp(
                _pack(idx * 3, 8), 53, 37, 8, palette=pal(four), colors=4
            ),
            "gray ramp palette": bmp(
                _pack(gray, 8),
                gray.shape[1],
                gray.shape[0],
                8,
                palette=pal([(i, i, i) for i in range(256)]),
            ),
            "rle8 with delta": bmp(
                [], 53, 37, 8, palette=pal(four), compression=1, raw=rle8(idx, delta_at=5)
            ),
            "32 all-zero masks (BGRA)": bmp(
                [rng.integers(0, 256, 53 * 4, dtype=np.uint8).tobytes() for _ in range(37)],
                53,
                37,
                32,
                compression=3,
                masks=(0, 0, 0, 0),
                header=124,
            ),
        }
    )


def test_bmp_processor_matches_transformers():
    cases = bmp_cases(dict(list(photos(300).items())[:2]))
    assert_processes_like_transformers(list(cases.values()))


def test_bmp_refusals_name_the_reason():
    proc = mmloader.ImageProcessor()
    a = np.asarray(rgb(photos(64)["coffee"]))
    h, w = a.shape[:2]
    good = bmp([r[:, ::-1].tobytes() for r in a], w, h, 24)
    for data, why in [
        (good[: 14 + 20], "truncated header"),
        (good[: len(good) - 5], "truncated pixel data"),
        (bmp([r[:, ::-1].tobytes() for r in a], w, h, 24, compression=4), "compression"),
        (
            bmp([r.tobytes() for r in a], w, h, 24, compression=3, masks=(0xFF, 0xFF00, 0xFF0000)),
            "bit fields",
        ),
        (good[:14] + struct.pack("<I", 20) + good[18:], "header type"),
        (
            bmp(_pack(np.zeros((4, 4), np.uint8), 2), 4, 4, 2, palette=pal([(0, 0, 0)] * 4)),
            "pixel depth",
        ),
        (
            bmp([], w, h, 8, palette=pal([(1, 2, 3)] * 256), compression=1, raw=b"\0\1"),
            "RLE data ends",
        ),
    ]:
        with pytest.raises(mmloader.SampleError, match=why):
            proc([data])
        with pytest.raises(Exception):  # Pillow refuses them too
            Image.open(__import__("io").BytesIO(data)).load()
