"""WebP (libwebp): lossy, lossless, with alpha, animated (first frame), on real photos,
bit-exact against Pillow -> convert_to_rgb -> Qwen2VLImageProcessorPil; chosen by magic
bytes whatever the file name; broken files refused with a reason."""

from __future__ import annotations

import pytest

from photos import (
    assert_decodes_like_pillow,
    assert_processes_like_transformers,
    encode,
    photos,
    rgb,
    with_alpha,
)

import mmloader

pytest.importorskip("transformers")


def webp_cases(ims: dict) -> dict:
    out = {}
    for i, (name, im) in enumerate(ims.items()):
        out[f"{name}/lossy q{30 + 7 * i}"] = encode(rgb(im), "WEBP", quality=30 + 7 * i)
        out[f"{name}/lossy gray"] = encode(im.convert("L"), "WEBP", quality=80)
        out[f"{name}/lossless"] = encode(rgb(im), "WEBP", lossless=True)
        out[f"{name}/alpha lossy"] = encode(with_alpha(im, i), "WEBP", quality=75)
        out[f"{name}/alpha lossless"] = encode(with_alpha(im, i), "WEBP", lossless=True)
    return out


def test_webp_decodes_like_pillow_on_real_photos():
    assert assert_decodes_like_pillow(webp_cases(photos(512))) > 10_000_000


def test_webp_animated_gives_the_first_frame():
    ims = list(photos(256).values())
    a, b = rgb(ims[0]), rgb(ims[1]).resize(ims[0].size)
    assert_decodes_like_pillow(
        {
            "anim lossy": encode(a, "WEBP", save_all=True, append_images=[b], quality=80),
            "anim alpha": encode(
                with_alpha(a), "WEBP", save_all=True, append_images=[b], lossless=True
            ),
        }
    )


def test_webp_processor_matches_transformers():
    cases = webp_cases(dict(list(photos(400).items())[:4]))
    assert_processes_like_transformers(list(cases.values()))


def test_webp_by_magic_not_by_name(tmp_path):
    data = encode(rgb(photos(128)["chelsea"]), "WEBP", quality=90)
    p = tmp_path / "photo.jpg"  # scraped data: WebP bytes behind a .jpg name
    p.write_bytes(data)
    proc = mmloader.ImageProcessor()
    assert proc.plan(data)["format"] == "webp"
    assert_processes_like_transformers([p.read_bytes()])
    assert proc([str(p)])["pixel_values"].shape[0] > 0


def test_webp_broken_files_are_refused():
    data = encode(rgb(photos(128)["coffee"]), "WEBP", quality=90)
    proc = mmloader.ImageProcessor()
    for cut in (20, 40, len(data) // 2, len(data) - 3):
        with pytest.raises(mmloader.SampleError, match="WebP"):
            proc([data[:cut]])
    with pytest.raises(mmloader.SampleError, match="WebP"):
        proc([data[:12] + b"VP9 " + data[16:]])  # unknown chunk where the bitstream starts
