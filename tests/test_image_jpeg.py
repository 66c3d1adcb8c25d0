"""JPEG strictness like the reference, on real photos.

Pillow refuses a JPEG when libjpeg raises an error anywhere, including after the last
scanline (it finishes the decompression, reading up to EOI): such files decode into a
partly gray image with "Corrupt JPEG data" warnings first.  mmloader refuses them too
(`corrupt_image`).  JPEGs that decode with warnings only are accepted by Pillow, and by
mmloader bit-exactly; `strict_jpeg=True` refuses them as well."""

from __future__ import annotations

import numpy as np
import pytest

from photos import encode, mml_rgb, photos, pil_rgb, rgb

import mmloader

pytest.importorskip("transformers")
from PIL import Image  # noqa: E402
import io  # noqa: E402


def _sos_end(d: bytes) -> int:
    """Offset of the first entropy-coded byte."""
    i = d.find(b"\xff\xda")
    return i + 2 + (d[i + 2] << 8 | d[i + 3])


def late_bad_marker(d: bytes) -> bytes:
    """A marker libjpeg cannot handle in the last tenth of the entropy data: the rest of
    the image decodes gray with a warning, then finishing the decompression fails."""
    i = len(d) - (len(d) - _sos_end(d)) // 10
    return d[:i] + b"\xff\x57" + d[i:]


def stray_restart(d: bytes) -> bytes:
    """A stray RST marker mid-scan: warnings ("Corrupt JPEG data") only."""
    i = _sos_end(d) + (len(d) - _sos_end(d)) // 2
    return d[:i] + b"\xff\xd3" + d[i:]


def _cases():
    out = {}
    for i, (name, im) in enumerate(photos(320).items()):
        d = encode(rgb(im), "JPEG", quality=60 + 3 * i, progressive=i % 3 == 0)
        out[name] = d
    return out


def test_refused_where_pillow_refuses():
    proc = mmloader.ImageProcessor()
    for name, d in _cases().items():
        bad = late_bad_marker(d)
        with pytest.raises(OSError, match="broken data stream"):
            Image.open(io.BytesIO(bad)).load()
        with pytest.raises(mmloader.SampleError, match="JPEG: Unsupported marker type 0x57"):
            proc([bad])


def test_warning_only_files_decode_like_pillow_and_strict_refuses_them():
    lenient, strict = mmloader.ImageProcessor(), mmloader.ImageProcessor(strict_jpeg=True)
    n = 0
    for name, d in _cases().items():
        odd = stray_restart(d)
        want = pil_rgb(odd)  # Pillow decodes it (libjpeg resynchronises)
        assert np.count_nonzero(mml_rgb(odd) != want) == 0, name
        assert lenient([odd])["pixel_values"].shape[0] > 0
        with pytest.raises(mmloader.SampleError, match="JPEG: Corrupt JPEG data"):
            strict([odd])
        assert strict([d])["pixel_values"].shape[0] > 0  # clean files are unaffected
        n += 1
    assert n >= 8


def test_loader_skips_as_corrupt_image(tmp_path):
    import json
    import os

    d = _cases()["astronaut"]
    (tmp_path / "good.jpg").write_bytes(d)
    (tmp_path / "broken.jpg").write_bytes(late_bad_marker(d))
    (tmp_path / "warned.jpg").write_bytes(stray_restart(d))
    recs = [
        {
            "image": n,
            "conversations": [
                {"from": "human", "value": "<image>\nWhat?"},
                {"from": "gpt", "value": "A photo."},
            ],
        }
        for n in ("good.jpg", "broken.jpg", "warned.jpg")
    ]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    tiny = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")

    def skipped(**kw):
        with mmloader.Loader(
            str(tmp_path / "d.jsonl"),
            tokenizer=tiny,
            micro_batch_size=1,
            num_threads=1,
            shuffle=False,
            on_error="skip",
            max_error_rate=0.99,
            min_pixels=3136,
            max_pixels=50176,
            **kw,
        ) as L:
            for _ in L:
                pass
            return L.stats()["skipped_by_reason"]

    with pytest.warns(UserWarning):
        assert set(skipped()) == {"corrupt_image"}
    with pytest.warns(UserWarning):
        assert set(skipped(strict_jpeg=True)) == {"corrupt_image"}
