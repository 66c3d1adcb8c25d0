"""Frame sampling and per-frame budgets of videos, equal to qwen-vl-utils 0.0.14 for the same
metadata: calculate_video_frame_range + smart_nframes + torch.linspace(...).round() (its
decord/torchcodec readers), fetch_video's per-frame pixel budget (VIDEO_MIN/MAX token
numbers, total_pixels, max_pixels, resized_height/width) and the frame-list path's first
fetch_image resize.  The reference runs in a subprocess with the torchvision stand-in
(tests/tvshim), calling qwen-vl-utils' own functions."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import importlib.util

import pytest

from mmloader import _core

HERE = os.path.dirname(os.path.abspath(__file__))
if importlib.util.find_spec("qwen_vl_utils") is None:  # importing it needs torchvision
    pytest.skip("pip install qwen-vl-utils", allow_module_level=True)
pytest.importorskip("torch")
pytest.importorskip("transformers")


def reference(req: dict):
    env = dict(
        os.environ,
        PYTHONPATH=os.path.join(HERE, "tvshim") + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    p = subprocess.run(
        [sys.executable, os.path.join(HERE, "video_reference.py")],
        input=json.dumps(req),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def line(ele: dict) -> str:
    part = dict(ele, type="video", video=ele.get("video", "clip.mp4"))
    return json.dumps(
        {"messages": [{"role": "user", "content": [part]}, {"role": "assistant", "content": "ok"}]}
    )


def sampling_cases(n: int, seed: int = 7):
    rng = random.Random(seed)
    cases = []
    fps_choices = [
        23.976023976023978,
        24.0,
        25.0,
        29.97002997002997,
        30.0,
        59.94,
        60.0,
        12.5,
        1.0,
        7.3,
        120.0,
    ]
    for i in range(n):
        fps = rng.choice(fps_choices)
        dur = rng.choice([0.1, 0.5, 1, 2.2, 3, 10, 33.3, 60, 61.7, 300, 601, 1800, 3600])
        total = max(1, int(round(dur * fps)) + rng.randint(-2, 2))
        ele = {}
        kind = rng.randrange(6)
        if kind == 1:
            ele["nframes"] = rng.randint(1, 80)
        elif kind == 2:
            ele["fps"] = rng.choice([0.5, 1, 1.5, 2, 3, 4, 8, 0.25])
        elif kind == 3:
            ele["min_frames"] = rng.randint(1, 12)
            ele["max_frames"] = rng.randint(8, 400)
        if rng.random() < 0.4:
            ele["video_start"] = round(rng.uniform(-1, dur * 0.7), rng.choice([0, 1, 3]))
        if rng.random() < 0.4:
            ele["video_end"] = round(rng.uniform(dur * 0.2, dur * 1.3), rng.choice([0, 1, 3]))
        cases.append([ele, total, fps])
    # edges: exactly at the boundaries, long videos, tiny ones
    cases += [
        [{}, 4, 2.0],
        [{}, 3, 30.0],
        [{}, 2, 30.0],
        [{}, 1, 30.0],
        [{"nframes": 3}, 4, 25.0],
        [{"nframes": 5}, 4, 25.0],
        [{}, 23040, 30.0],
        [{}, 107892, 29.97002997002997],
        [{"video_start": 1.0, "video_end": 1.0}, 300, 30.0],
        [{"video_start": 5.0}, 100, 25.0],
        [{"video_end": 0.0}, 100, 25.0],
        [{"fps": 2.0, "max_frames": 3}, 100, 25.0],
        [{"min_frames": 50}, 20, 10.0],
    ]
    return cases


def test_sampling_matches_qwen_vl_utils():
    cases = sampling_cases(2500)
    ref = reference({"op": "sample", "cases": cases})
    assert len(ref) == len(cases)
    ok = errors = 0
    for (ele, total, fps), want in zip(cases, ref):
        where = f"ele={ele} total={total} fps={fps}"
        if "error" in want:
            with pytest.raises(Exception, match="bad record|bad video"):
                _core.video_sample(line(ele), total, fps)
            errors += 1
            continue
        got = _core.video_sample(line(ele), total, fps)
        assert (got["first"], got["last"], got["count"], got["n"]) == (
            want["first"],
            want["last"],
            want["count"],
            want["n"],
        ), where
        assert got["indices"] == want["indices"], where
        assert got["sample_fps"] == want["sample_fps"], where
        ok += 1
    assert ok > 2000 and errors > 20  # both kinds really exercised


def test_fps_and_nframes_together_is_a_bad_record():
    with pytest.raises(Exception, match="both"):
        _core.video_sample(line({"fps": 2, "nframes": 8}), 100, 25.0)


def test_timestamps_as_qwen3_vl_processor():
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    rng = random.Random(3)
    for _ in range(300):
        n = rng.randint(1, 40)
        idx = sorted(rng.randint(0, 5000) for _ in range(n))
        fps = rng.choice([23.976023976023978, 25.0, 30.0, 2.0, 7.5])
        want = Qwen3VLProcessor._calculate_timestamps(None, list(idx), fps, 2)
        assert _core.video_timestamps(idx, fps, 2) == want
        assert [f"<{t:.1f} seconds>" for t in _core.video_timestamps(idx, fps, 2)] == [
            f"<{t:.1f} seconds>" for t in want
        ]


def budget_cases(count: int, seed: int = 11):
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        patch = rng.choice([14, 16])
        h, w = rng.choice(
            [
                (480, 640),
                (720, 1280),
                (1080, 1920),
                (64, 64),
                (333, 517),
                (2160, 3840),
                (100, 900),
                (57, 1000),
            ]
        )
        n = rng.choice([2, 3, 4, 6, 16, 64, 300, 768])
        while n * h * w > 4_000_000:  # the reference resizes every frame with Pillow
            h, w = h // 2, w // 2
        ele = {}
        r = rng.randrange(5)
        if r == 1:
            ele["max_pixels"] = rng.choice([50176, 100352, 230400, 1003520])
        elif r == 2:
            ele["min_pixels"] = rng.choice([3136, 50176, 200704])
        elif r == 3:
            ele["total_pixels"] = rng.choice([20480 * 28 * 28, 1e6, 5e7])
        elif r == 4:
            ele["resized_height"], ele["resized_width"] = rng.choice(
                [(224, 224), (300, 500), (57, 93)]
            )
        cases.append([ele, n, h, w, patch])
    return cases


@pytest.mark.parametrize("count", [12, pytest.param(80, marks=pytest.mark.slow)])
def test_frame_budget_matches_fetch_video(count):
    """fetch_video of a frame list: each frame first through fetch_image (factor 2*patch*2,
    the element's keys), then the video budget — both sizes from mmloader's functions."""
    cases = budget_cases(count)
    ref = reference({"op": "shape", "cases": cases})
    assert len(ref) == len(cases) > 0
    for (ele, n, h, w, patch), want in zip(cases, ref):
        f = patch * 2
        where = f"ele={ele} n={n} {h}x{w} patch={patch}"
        try:
            fh, fw = _core.video_list_frame_size(line(dict(ele, video=["a.jpg"])), f, h, w)
            got = [
                n + n % 2,
                *_core.video_frame_size(line(dict(ele, video=["a.jpg"])), f, n + n % 2, fh, fw),
            ]
        except Exception as e:  # noqa: BLE001
            assert isinstance(want, dict), f"{where}: {e}"
            continue
        assert got == want, where
