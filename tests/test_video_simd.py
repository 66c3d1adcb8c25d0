"""The AVX2 video writer (csrc/core/video/video_frames.c scatter_bytes_avx2, what a frame list
no step resizes goes through, and scatter_avx2 of float planes: normalise, bfloat16
rounding, bytes, 8 values at a time) against the portable writer (MML_DISABLE_AVX2=1 in
a child process), bit for bit, in every pixel format and for both presets' patch sizes.
Frames are at a size no step resizes (fetch_image, the video budget and the processor all
keep it), so the writer is the only code that differs between the two runs (the resize
has its own tests against torch: tests/test_video_resize.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from child import child_env

from photos import photos, rgb

Image = pytest.importorskip("PIL.Image")
pytest.importorskip("torch")

TINY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mmloader")
TINY = os.path.join(TINY, "data", "tiny-tokenizer.json")
SIZES = {"qwen2.5-vl": (392, 280), "qwen3-vl": (512, 256)}  # kept by every step

CHILD = """
import sys, numpy as np, torch, mmloader
shard, preset, tok, out = sys.argv[1:5]
got = {}
for fmt in ("float32", "bfloat16", "uint8"):
    with mmloader.Loader(shard, preset=preset, tokenizer=tok, micro_batch_size=1,
                         shuffle=False, num_threads=1, pixel_format=fmt,
                         on_error="raise") as L:
        b = next(iter(L))
        t = torch.from_dlpack(b["pixel_values_videos"])
        t = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        got[fmt] = t.numpy().copy()
        got[fmt + "_grid"] = np.array(b["video_grid_thw"].numpy(), copy=True)
np.savez(out, **got)
"""


@pytest.mark.parametrize("preset", sorted(SIZES))
def test_avx2_video_writer_is_the_portable_writer_bit_for_bit(preset, tmp_path):
    w, h = SIZES[preset]
    ims = [rgb(im) for im in photos(900).values()]
    frames = []
    for i in range(4):
        p = str(tmp_path / f"f{i}.png")
        ims[i % len(ims)].resize((w, h)).save(p)
        frames.append(p)
    rec = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "video", "video": frames}, {"type": "text", "text": "?"}],
            },
            {"role": "assistant", "content": "ok"},
        ]
    }
    shard = tmp_path / "v.jsonl"
    shard.write_text(json.dumps(rec) + "\n")
    outs = {}
    for tag, extra in (("simd", {}), ("portable", {"MML_DISABLE_AVX2": "1"})):
        env = child_env()
        env.pop("MML_DISABLE_AVX2", None)
        env.update(extra)
        out = str(tmp_path / f"{tag}.npz")
        p = subprocess.run(
            [sys.executable, "-c", CHILD, str(shard), preset, TINY, out],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        with np.load(out) as z:
            outs[tag] = {k: z[k] for k in z.files}
    a, b = outs["simd"], outs["portable"]
    P = 14 if preset == "qwen2.5-vl" else 16
    assert a["uint8_grid"].tolist() == [[2, h // P, w // P]]  # no step resized the frames
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)), k
    # the formats hold the same frames: uint8 bytes -> the float32 values' integers
    assert a["float32"].shape[1] == a["uint8"].shape[1]
