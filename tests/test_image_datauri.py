"""data: URI image references (OpenAI-style content parts, dataset exports): decoded in the
worker, byte for byte as Python's base64.b64decode (what transformers' load_image and
qwen-vl-utils run), then the same pixels as the same image read from a file; errors name
the reference and the reason."""

from __future__ import annotations

import base64
import json
import os

import numpy as np
import pytest

from conftest import as_np, same
from photos import encode, photos, rgb, with_alpha

import mmloader
from mmloader import _core

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")


def uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def test_payload_decodes_like_python_base64():
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 4, 5, 100, 1001):
        raw = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        b = base64.b64encode(raw).decode()
        for payload in (
            b,
            b[:3] + "\n" + b[3:],
            " " + b + "\r\n",
            b + "====",
            b + "!!",
            "@".join(b[i : i + 7] for i in range(0, len(b), 7)),
            b + "QUJD" if b.endswith("=") else b,
        ):
            want = base64.b64decode(payload)
            assert _core.data_uri_decode("data:image/png;base64," + payload) == want, payload
    assert _core.data_uri_decode("DATA:image/PNG;BASE64,QU==QUJD") == b"A"
    assert _core.data_uri_decode("data:;base64,QUJD") == b"ABC"  # no media type: bytes decide
    for bad, why in [
        ("data:image/png;base64,QUJ", "padding"),
        ("data:image/png;base64,Q===", "1 more"),
        ("data:image/png,QUJD", "not base64-encoded"),
        ("data:video/mp4;base64,QUJD", "type video/mp4 is not an image"),
        ("data:image/png;base64", "without a comma"),
        ("data:image/png;base64,", "empty payload"),
    ]:
        with pytest.raises(mmloader.SampleError, match=why):
            _core.data_uri_decode(bad)
        if why in ("padding", "1 more"):
            with pytest.raises(ValueError):
                base64.b64decode(bad.split(",", 1)[1])


def _records(refs):
    out = []
    for k, ref in enumerate(refs):
        q = {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": ref}},
                {"type": "text", "text": f"What is in picture {k}?"},
            ],
        }
        if k % 2:  # the other spelling: LLaVA-style field
            out.append(
                {
                    "image": ref,
                    "conversations": [
                        {"from": "human", "value": f"<image>\nWhat is in picture {k}?"},
                        {"from": "gpt", "value": "A photo."},
                    ],
                }
            )
        else:
            out.append({"messages": [q, {"role": "assistant", "content": "A photo."}]})
    return out


def _batches(path, **kw):
    with mmloader.Loader(
        str(path),
        tokenizer=TINY,
        micro_batch_size=2,
        num_threads=2,
        shuffle=False,
        min_pixels=3136,
        max_pixels=100352,
        **kw,
    ) as L:
        return [as_np(b) for b in L]


def test_loader_reads_data_uris_like_files(tmp_path):
    ims = list(photos(256).values())[:4]
    datas = [
        encode(rgb(ims[0]), "PNG"),
        encode(rgb(ims[1]), "JPEG", quality=85),
        encode(with_alpha(ims[2]), "WEBP", lossless=True),
        encode(rgb(ims[3]), "GIF"),
    ]
    names = []
    for i, d in enumerate(datas):
        (tmp_path / f"{i}.img").write_bytes(d)
        names.append(f"{i}.img")
    mimes = ["image/png", "image/jpeg", "image/webp", "image/gif"]
    files, inline = tmp_path / "files.jsonl", tmp_path / "inline.jsonl"
    files.write_text("".join(json.dumps(r) + "\n" for r in _records(names)))
    inline.write_text(
        "".join(json.dumps(r) + "\n" for r in _records([uri(d, m) for d, m in zip(datas, mimes)]))
    )
    a, b = _batches(files), _batches(inline)
    assert len(a) == 2
    same(a, b)
    proc = mmloader.ImageProcessor()
    np.testing.assert_array_equal(
        proc([uri(datas[0])])["pixel_values"], proc([datas[0]])["pixel_values"]
    )


def test_bad_data_uri_is_a_skip_naming_it(tmp_path):
    good = uri(encode(rgb(photos(128)["coffee"]), "PNG"))
    bad = [
        good[:-7],  # truncated payload
        "data:image/png;base64," + base64.b64encode(b"<html>403</html>").decode(),
        "data:text/html;base64,PGh0bWw+",
    ]
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in _records([good] + bad)))
    with mmloader.Loader(
        str(p),
        tokenizer=TINY,
        micro_batch_size=1,
        num_threads=1,
        shuffle=False,
        on_error="raise",
        min_pixels=3136,
        max_pixels=50176,
    ) as L:
        it = iter(L)
        assert next(it)["pixel_values"].shape[0] > 0
        msgs = []
        for _ in bad:
            with pytest.raises(mmloader.SampleError) as e:
                next(it)
            msgs.append(str(e.value))
    assert "image data:image/png;base64,iVBOR" in msgs[0] and "bad base64" in msgs[0], msgs[0]
    assert "looks like HTML" in msgs[1], msgs[1]
    assert "type text/html is not an image" in msgs[2], msgs[2]
    for m in msgs:
        assert len(m) < 1000
