"""Bytes that are no supported image are refused by magic bytes (never by file name), with
the format they look like and their first bytes in hex, counted as `unsupported_image`."""

from __future__ import annotations

import io
import json
import os

import pytest

import mmloader

LOOKALIKES = [
    (b"\0\0\0\x1cftypavif\0\0\0\0avifmif1miaf", "AVIF"),
    (b"\0\0\0\x18ftypheic\0\0\0\0mif1heic", "HEIF/HEIC"),
    (b"\0\0\0\x0cjP  \r\n\x87\n\0\0\0\x14ftypjp2 ", "JPEG 2000"),
    (b"\xff\x0a\xfa\x7f\x01\x90\x08", "JPEG XL"),
    (b"\0\0\0\x20ftypisom\0\0\x02\0isomiso2avc1mp41", "MP4 video"),
    (b"\x1aE\xdf\xa3\x9fB\x86\x81\x01", "Matroska/WebM video"),
    (b"<!DOCTYPE html>\n<html><body>403 Forbidden</body></html>", "HTML"),
    (b"\xef\xbb\xbf  <svg xmlns='http://www.w3.org/2000/svg'/>", "SVG"),
    (b"<?xml version='1.0'?>\n<svg/>", "SVG"),
    (b"8BPS\0\1\0\0\0\0\0\0\0\3", "Photoshop PSD"),
    (b"\0\0\1\0\1\0\x10\x10\0\0\1\0 \0", "ICO"),
    (b"%PDF-1.7\n", "PDF"),
    (b"P6\n4 4\n255\n" + bytes(48), "PNM"),
    (b'{"error": "not found"}', "JSON"),
    (b"\x1f\x8b\x08\0\0\0\0\0", "gzip"),
]


@pytest.mark.parametrize("data,name", LOOKALIKES, ids=[n for _, n in LOOKALIKES])
def test_unknown_format_names_lookalike_and_hex(data, name):
    proc = mmloader.ImageProcessor()
    with pytest.raises(mmloader.SampleError) as e:
        proc([data])
    msg = str(e.value)
    assert f"looks like {name}" in msg
    assert " ".join(f"{b:02x}" for b in data[:16]) in msg
    assert f"({len(data)} bytes" in msg
    assert "supported: JPEG, PNG, WebP, GIF, BMP, TIFF" in msg


def test_unknown_and_empty():
    proc = mmloader.ImageProcessor()
    with pytest.raises(mmloader.SampleError, match=r"unknown \(5 bytes, starting 01 02 03 04 05\)"):
        proc([b"\1\2\3\4\5"])
    with pytest.raises(mmloader.SampleError, match=r"no data \(0 bytes\)"):
        proc([b""])


def test_loader_counts_unsupported_images(tmp_path):
    """In skip mode an unknown format is a skip under `unsupported_image`, whatever its name."""
    from PIL import Image

    good = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 40)).save(good, "JPEG")
    (tmp_path / "a.jpg").write_bytes(good.getvalue())
    (tmp_path / "b.jpg").write_bytes(b"\0\0\0\x1cftypavif\0\0\0\0avifmif1miaf")
    recs = [
        {
            "image": n,
            "conversations": [
                {"from": "human", "value": "<image>\nWhat?"},
                {"from": "gpt", "value": "A red box."},
            ],
        }
        for n in ("a.jpg", "b.jpg")
    ] * 4
    shard = tmp_path / "d.jsonl"
    shard.write_text("".join(json.dumps(r) + "\n" for r in recs))
    tiny = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
    with mmloader.Loader(
        str(shard),
        tokenizer=tiny,
        micro_batch_size=2,
        num_threads=2,
        shuffle=False,
        on_error="skip",
        max_error_rate=0.9,
        min_pixels=28 * 28 * 4,
        max_pixels=28 * 28 * 16,
    ) as loader:
        n = sum(1 for _ in loader)
        st = loader.stats()
    assert n >= 1
    assert set(st["skipped_by_reason"]) == {"unsupported_image"}, st
    assert st["skipped_by_reason"]["unsupported_image"] >= 4, st
