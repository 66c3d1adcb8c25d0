"""Video pixels are decoded straight into their slice of the batch's pixel_values_videos
buffer, as images are into pixel_values (csrc/core/loader/loader_place.c: a second plane per
batch).  A video that fails only at decode (an mp4 whose index comes first, cut in its
frame data: the plan probes it fine) is found after its batch was planned; the batches
must still be exactly those of the same data where that video fails before any pixel
work (a missing file): same composition, order, image AND video pixels, whatever the
thread count, padded or packed.  Nothing is copied unless a late failure moved rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import same
from test_plan_decode import _epoch  # the same loader settings (TINY, SMALL)

av = pytest.importorskip("av")
Image = pytest.importorskip("PIL.Image")

N = 24
BAD = {0, 4, 5, 11, 16, 23}  # first of the stream, a run, ends of batches and packs


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Records mixing images, video files and frame lists (both planes in one batch);
    BAD samples' video is cut off after its header (late) in one copy and missing
    (early) in the other; the same without images ("-vonly")."""
    from test_video import make_video

    root = tmp_path_factory.mktemp("plan_decode_video")
    a = make_video(root / "a.mp4", "libx264", n=48, w=64, h=48)
    b = make_video(root / "b.webm", "libvpx-vp9", n=30, w=65, h=48, fps=10)
    full = make_video(
        root / "full.mp4",
        "libx264",
        n=96,
        w=96,
        h=64,
        gop=12,
        noise=True,
        container_options={"movflags": "faststart"},
    )
    data = open(full, "rb").read()
    (root / "late.mp4").write_bytes(data[: len(data) * 2 // 3])
    img = str(root / "i.png")
    Image.fromarray(np.arange(40 * 56 * 3, dtype=np.uint8).reshape(40, 56, 3)).save(img)
    frames = []
    for i in range(4):
        frames.append(str(root / f"f{i}.png"))
        Image.fromarray(np.full((48, 64, 3), 40 * i, np.uint8)).save(frames[-1])
    out = {}
    for kind, with_images in (("late", 1), ("early", 1), ("late-vonly", 0), ("early-vonly", 0)):
        recs = []
        for i in range(N):
            videos = [
                [{"video": a, "fps": 2.0}],
                [frames, {"video": b, "nframes": 6}],
                [],
                [{"video": full, "nframes": 4}],
            ][i % 4]
            if i in BAD:
                bad = root / f"{kind.split('-')[0]}.mp4"
                videos = videos + [{"video": str(bad), "fps": 2.0}]
            images = [img] if with_images and i % 3 == 0 else []
            text = "<image>" * len(images) + "<video>" * len(videos) + f" sample {i}"
            rec = {
                "conversations": [
                    {"from": "human", "value": text},
                    {"from": "gpt", "value": "answer " * (1 + i % 5)},
                ]
            }
            if images:
                rec["images"] = images
            if videos:
                rec["videos"] = videos
            recs.append(json.dumps(rec))
        path = root / f"{kind}.jsonl"
        path.write_text("\n".join(recs) + "\n")
        out[kind] = str(path)
    return out


CONFIGS = {
    "padded": dict(micro_batch_size=3, shuffle=True, seed=1),
    "packed": dict(micro_batch_size=1, packing=True, pack_length=1024, shuffle=True, seed=2),
    "packed-mrope": dict(
        micro_batch_size=1, packing=True, pack_length=2048, mrope=True, keys="megatron"
    ),
}


def test_bad_videos_fail_only_at_decode(shards):
    _, st = _epoch(shards["late"], 2, micro_batch_size=2, plan_only=True)
    assert st["skipped"] == 0
    _, st = _epoch(shards["late"], 2, micro_batch_size=2)
    assert st["skipped_by_reason"] == {"corrupt_video": len(BAD)}
    _, st = _epoch(shards["early"], 2, micro_batch_size=2)
    assert st["skipped_by_reason"] == {"missing_file": len(BAD)}


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_late_video_failure_gives_the_batches_of_an_early_one(shards, name, threads):
    late, st_late = _epoch(shards["late"], threads, **CONFIGS[name])
    early, st_early = _epoch(shards["early"], threads, **CONFIGS[name])
    assert len(late) == len(early) > 0
    same(late, early)
    assert sum(len(b.get("video_grid_thw", ())) for b in early) > N // 2
    assert any("pixel_values" in b and "pixel_values_videos" in b for b in early)
    assert st_late["skipped"] == st_early["skipped"] == len(BAD)
    # images and videos are written in place: nothing is copied when nothing fails late
    assert st_early["pixel_rows_moved"] == 0
    if name.startswith("packed"):
        # a pack that held a late failure was planned again: its rows taken so far moved
        assert st_late["pixel_rows_moved"] > 0, st_late["pixel_rows_moved"]


@pytest.mark.parametrize("name", ["packed", "padded"])
def test_video_rows_live_in_the_batch_buffer(shards, name):
    """Without images, every pixel row is a video row: a pack planned again after a late
    video failure moves the video rows the collator took (they are in the pack's
    pixel_values_videos buffer, not in per-sample copies)."""
    late, st_late = _epoch(shards["late-vonly"], 2, **CONFIGS[name])
    early, st_early = _epoch(shards["early-vonly"], 2, **CONFIGS[name])
    same(late, early)
    assert st_early["pixel_rows_moved"] == 0
    if name == "packed":
        assert st_late["pixel_rows_moved"] > 0, st_late["pixel_rows_moved"]
