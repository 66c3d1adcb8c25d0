"""Videos given as frame lists (lists of image paths, as qwen-vl-utils accepts them) through
the Loader, equal to qwen-vl-utils 0.0.14 process_vision_info(return_video_metadata=True)
followed by transformers 5.24's Qwen2.5-VL / Qwen3-VL processor (do_sample_frames=False,
video_metadata from qwen-vl-utils) and get_rope_index: pixel_values_videos,
video_grid_thw, second_per_grid_ts, the Qwen3-VL timestamps in input_ids, position_ids and
rope_deltas, bitwise.

The reference runs in a subprocess with the torchvision stand-in (tests/tvshim): PyPI's
torchvision does not work beside the CPU torch here, so torchvision's resize is reproduced
with torch.nn.functional.interpolate(mode="bicubic", antialias=True) exactly as
torchvision calls it.  Frames are real photos (tests/photos.py), re-encoded as JPEG/PNG."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from photos import photos, rgb

import mmloader

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
REAL = os.path.join(HERE, "..", "..", "shared", "data", "qwen3-tokenizer")
if importlib.util.find_spec("qwen_vl_utils") is None:
    pytest.skip("pip install qwen-vl-utils", allow_module_level=True)
pytest.importorskip("transformers")
pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")

SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"


def reference_many(items: list) -> list:
    env = dict(
        os.environ,
        PYTHONPATH=os.path.join(HERE, "tvshim") + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    p = subprocess.run(
        [sys.executable, os.path.join(HERE, "video_reference.py")],
        input=json.dumps({"op": "process_many", "items": items}),
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = []
    for r in items:
        with np.load(r["out"]) as z:
            out.append({k: z[k] for k in z.files})
    return out


def frame_files(tmp, tag: str, n: int, size, fmt="JPEG", start=0) -> list:
    """n frames: crops of real photos, all of one size, moving across the photo."""
    ims = [rgb(im) for im in photos(900).values()]
    out = []
    for i in range(n):
        im = ims[(start + i) % len(ims)]
        w, h = size
        x = (i * 7) % max(1, im.width - w) if im.width > w else 0
        y = (i * 5) % max(1, im.height - h) if im.height > h else 0
        fr = im.crop((x, y, x + w, y + h)) if im.width >= w and im.height >= h else im.resize(size)
        p = os.path.join(tmp, f"{tag}-f{start}_{i}.{fmt.lower()}")
        fr.save(p, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
        out.append(p)
    return out


CASES = {
    # name: (frame count, frame size, element keys)
    "odd_count": (5, (320, 240), {}),
    "budget_shrinks": (4, (1200, 900), {}),  # fetch_video's per-frame cap resizes again
    "keys": (6, (500, 380), {"max_pixels": 200704, "sample_fps": 1.0, "raw_fps": 30.0}),
    "resized": (4, (400, 300), {"resized_height": 300, "resized_width": 400}),
}


def make_case(tmp, preset, tok, name, extra_text="What happens?"):
    """The record (a one-line shard) and the reference request for one case."""
    n, size, keys = CASES[name]
    tag = f"{name}-{preset}-{os.path.basename(tok)}"
    frames = frame_files(tmp, tag, n, size, fmt="PNG" if name == "keys" else "JPEG")
    part = dict(keys, type="video", video=frames)
    msgs = [
        {"role": "user", "content": [part, {"type": "text", "text": extra_text}]},
        {"role": "assistant", "content": "Nothing much."},
    ]
    shard = os.path.join(tmp, tag + ".jsonl")
    with open(shard, "w") as f:
        f.write(json.dumps({"messages": msgs}) + "\n")
    text = (
        (SYSTEM if preset != "qwen3-vl" else "")
        + "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>"
        + extra_text
        + "<|im_end|>\n<|im_start|>assistant\nNothing much.<|im_end|>\n"
    )
    return shard, {
        "op": "process",
        "preset": preset,
        "tokenizer": tok,
        "text": text,
        "messages": msgs,
        "out": os.path.join(tmp, tag + ".npz"),
    }


def first_batch(shard, preset, tok, **kw):
    with mmloader.Loader(
        shard,
        preset=preset,
        tokenizer=tok,
        micro_batch_size=1,
        shuffle=False,
        mrope=True,
        mm_token_type_ids=True,
        num_threads=1,
        **kw,
    ) as L:
        return {k: np.array(v.numpy(), copy=True) for k, v in next(iter(L)).items()}


PRESETS = ["qwen2.5-vl", "qwen3-vl"]
KEYS = [(p, n) for p in PRESETS for n in sorted(CASES)]


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """Every case's shard and reference, computed in one reference process."""
    tmp = str(tmp_path_factory.mktemp("frames"))
    made = {(p, n, "tiny"): make_case(tmp, p, TINY, n) for p, n in KEYS}
    if os.path.isdir(REAL):
        for p in PRESETS:
            made[(p, "keys", "real")] = make_case(
                tmp, p, os.path.abspath(REAL), "keys", extra_text="Describe the clip."
            )
    refs = reference_many([r for _, r in made.values()])
    return {k: (v[0], v[1]["tokenizer"], ref) for (k, v), ref in zip(made.items(), refs)}


def compare(b, ref, preset):
    n = ref["input_ids"].shape[1]
    assert b["input_ids"][0, :n].tolist() == ref["input_ids"][0].tolist()
    assert np.array_equal(b["video_grid_thw"], ref["video_grid_thw"])
    assert b["pixel_values_videos"].shape == ref["pixel_values_videos"].shape
    d = np.abs(b["pixel_values_videos"] - ref["pixel_values_videos"])
    assert d.max() == 0, f"max diff {d.max()} on {np.count_nonzero(d)} values"
    if preset == "qwen2.5-vl":
        assert np.array_equal(b["second_per_grid_ts"], ref["second_per_grid_ts"].astype(np.float32))
    else:
        assert "second_per_grid_ts" not in b
    assert np.array_equal(b["mm_token_type_ids"][0, :n], ref["mm_token_type_ids"][0])
    assert np.array_equal(b["position_ids"][:, 0, :n], ref["position_ids"][:, 0])
    assert b["rope_deltas"][0, 0] == ref["rope_deltas"][0, 0]


@pytest.mark.parametrize("preset,name", KEYS)
def test_frame_list_matches_processor_tiny_tokenizer(cases, preset, name):
    shard, tok, ref = cases[(preset, name, "tiny")]
    compare(first_batch(shard, preset, tok), ref, preset)


@pytest.mark.parametrize("preset", PRESETS)
def test_frame_list_matches_processor_real_tokenizer(cases, preset):
    if (preset, "keys", "real") not in cases:
        pytest.skip(
            f"{REAL} not found (the Qwen tokenizer lives in ../shared/data beside the repo)"
        )
    shard, tok, ref = cases[(preset, "keys", "real")]
    compare(first_batch(shard, preset, tok), ref, preset)


def test_frame_lists_after_qwen_vl_utils_are_what_mmloader_resizes(cases):
    """The uint8 frames qwen-vl-utils hands the processor (after its Pillow and torchvision
    resizes) are integers, and the processor's own resize was the identity in every case
    above, so pixel_values_videos equal means those frames equal too."""
    for key, (_, _, ref) in cases.items():
        fr = ref["frames_after_qwen_vl_utils"]
        assert np.array_equal(fr, np.round(fr)), key
        t, h, w = ref["video_grid_thw"][0]
        assert fr.shape[-2:] == (
            h * (16 if key[0] == "qwen3-vl" else 14),
            w * (16 if key[0] == "qwen3-vl" else 14),
        ), key
