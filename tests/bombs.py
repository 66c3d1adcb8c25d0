"""Decoder bombs made at test time from real photos (tests/photos.py), for the hostile-input
tests of issue 29: a progressive JPEG with thousands of (valid) scans, and a PNG whose
deflate stream runs on far past its last row.  Both are files a real decoder accepts:
only the work they cost is hostile."""

from __future__ import annotations

import io
import struct
import zlib

from photos import Image, photos


def _photo(side: int) -> "Image.Image":
    im = photos(640)["astronaut"].convert("RGB")
    return im.resize((side, side), Image.BICUBIC)


def _eob_scan(component: int, blocks: int) -> bytes:
    """An AC spectral-selection scan (Ss=1, Se=63, Ah=Al=0) of one component whose entropy
    data is EOB runs only (Huffman symbol 0xE0: a run of 2^14 + 14 extra bits): every
    block of the component is visited, in about 2 bytes per 32767 blocks."""
    sos = b"\xff\xda" + struct.pack(">HBBBBBB", 8, 1, component, 0x00, 1, 63, 0)
    bits = "0" + "1" * 14  # code '0' (symbol 0xE0), then 14 bits: run 32767
    s = bits * -(-blocks // 32767)
    s += "1" * (-len(s) % 8)  # pad with 1s, as an encoder does
    out = bytearray()
    for i in range(0, len(s), 8):
        b = int(s[i : i + 8], 2)
        out.append(b)
        if b == 0xFF:
            out.append(0)  # byte stuffing
    return sos + bytes(out)


def jpeg_scan_bomb(side: int = 8000, scans: int = 1000, quality: int = 30) -> bytes:
    """A progressive JPEG of a real photo at side x side whose progression ends with
    `scans` extra AC scans of the luma component (each a valid scan libjpeg decodes over
    every block); Pillow opens it.  The issue's 8000x8000 / 1000 scans is about 220 KB
    plus the photo."""
    b = io.BytesIO()
    _photo(side).save(b, "JPEG", quality=quality, progressive=True)
    data = b.getvalue()
    assert data.endswith(b"\xff\xd9")
    # one AC Huffman table (class 1, id 0) with the single code '0' for symbol 0xE0
    dht = b"\xff\xc4" + struct.pack(">HB", 2 + 1 + 16 + 1, 0x10) + bytes([1] + [0] * 15) + b"\xe0"
    blocks = (-(-side // 8)) ** 2  # Pillow's luma is not subsampled: ceil(side/8)^2 blocks
    return data[:-2] + dht + _eob_scan(1, blocks) * scans + b"\xff\xd9"


def jpeg_scans(data: bytes) -> int:
    """SOS markers of a JPEG (its scans), walking segments and entropy data."""
    i, n = 2, 0
    while i + 4 <= len(data):
        assert data[i] == 0xFF, i
        m = data[i + 1]
        if m == 0xD9:
            break
        seg = struct.unpack(">H", data[i + 2 : i + 4])[0]
        i += 2 + seg
        if m == 0xDA:
            n += 1
            while not (data[i] == 0xFF and data[i + 1] not in (0, *range(0xD0, 0xD8))):
                i += 1
    return n


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_tail_bomb(side: int = 512, tail_mib: int = 1024) -> bytes:
    """A PNG of a real photo whose single deflate stream holds its rows and then
    `tail_mib` MiB of zero bytes more (about 1 KB compressed per MiB): libpng inflated the
    whole stream looking for its end, Pillow stops at the last row.  The stream is valid
    (its Adler-32 too): one compressed MiB of zeros, which refers only to zeros, repeated."""
    b = io.BytesIO()
    _photo(side).save(b, "PNG")
    png = b.getvalue()
    pos, idat, head, tail = 8, b"", b"", b""
    while pos < len(png):
        n, kind = struct.unpack(">I4s", png[pos : pos + 8])
        whole = png[pos : pos + 12 + n]
        if kind == b"IDAT":
            idat += png[pos + 8 : pos + 8 + n]
        elif not idat:
            head += whole
        else:
            tail += whole
        pos += 12 + n
    rows = zlib.decompress(idat)
    mib = bytes(1 << 20)
    c = zlib.compressobj(9)
    first = c.compress(rows) + c.compress(mib) + c.flush(zlib.Z_SYNC_FLUSH)
    again = c.compress(mib) + c.flush(zlib.Z_SYNC_FLUSH)  # window: zeros only
    end = c.flush()[:-4]  # the final block; the Adler-32 is recomputed below
    adler = zlib.adler32(rows)
    for _ in range(tail_mib):
        adler = zlib.adler32(mib, adler)
    stream = first + again * (tail_mib - 1) + end + struct.pack(">I", adler)
    assert tail_mib > 8 or len(zlib.decompress(stream)) == len(rows) + (tail_mib << 20)
    chunks = [_chunk(b"IDAT", stream[i : i + (1 << 20)]) for i in range(0, len(stream), 1 << 20)]
    return png[:8] + head + b"".join(chunks) + tail


def _riff_chunk(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("<I", len(body)) + body + b"\0" * (len(body) & 1)


def webp_huge(side: int = 6000) -> bytes:
    """A still lossy WebP of a real photo at side x side: about 1.5 s of decode on a quiet
    core for 6000^2 (the encoder takes about 3x that)."""
    b = io.BytesIO()
    _photo(side).save(b, "WEBP", quality=50, method=0)
    return b.getvalue()


def webp_animated(still: bytes, frames: int = 3) -> bytes:
    """An animation of `frames` frames, each the bitstream of the still WebP `still` over
    the whole canvas (built by hand: the encoder takes ~5x longer than the still's)."""
    assert still[:4] == b"RIFF" and still[8:12] == b"WEBP"
    kind, n = still[12:16], struct.unpack("<I", still[16:20])[0]
    assert kind in (b"VP8 ", b"VP8L"), kind
    w, h = Image.open(io.BytesIO(still)).size
    img = _riff_chunk(kind, still[20 : 20 + n])
    size = struct.pack("<I", w - 1)[:3] + struct.pack("<I", h - 1)[:3]
    vp8x = _riff_chunk(b"VP8X", bytes([0x02, 0, 0, 0]) + size)  # the animation flag
    anim = _riff_chunk(b"ANIM", struct.pack("<IH", 0, 0))
    frame = bytes(6) + size + struct.pack("<I", 100)[:3] + bytes([0x02])  # no blend
    body = b"WEBP" + vp8x + anim + _riff_chunk(b"ANMF", frame + img) * frames
    return b"RIFF" + struct.pack("<I", len(body)) + body
