"""The dataset index counts videos: each video's <|video_pad|> tokens (and Qwen3-VL's
timestamp text) are what the loader plans — frame lists from the frames' headers alone,
video files (local, HTTP, WebDataset members) from their probe, nothing decoded; batches
and the global plan with the index are bitwise those without."""

import json
import os
import warnings

import numpy as np
import pytest

import mmloader
from mmloader import dsindex
from conftest import same

Image = pytest.importorskip("PIL.Image")

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
VISION = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)


@pytest.fixture(scope="module")
def vds(tmp_path_factory):
    """Records mixing images, frame-list videos (JPEG and PNG frames, two sizes, per-video
    keys) and text; plus one with a missing frame (a failed sample)."""
    root = tmp_path_factory.mktemp("vindex")
    rng = np.random.default_rng(7)
    frames = {}
    for size, ext in (((96, 64), "jpg"), ((150, 100), "png")):
        paths = []
        for i in range(6):
            a = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
            p = str(root / f"f{size[0]}_{i}.{ext}")
            Image.fromarray(a).save(p)
            paths.append(p)
        frames[ext] = paths
    a = {"from": "gpt", "value": "An answer."}

    def q(t):
        return {"from": "human", "value": t}

    recs = [
        {
            "conversations": [q("<image> and <video>?"), a],
            "images": [frames["jpg"][0]],
            "videos": [frames["jpg"][1:5]],
        },
        {
            "conversations": [q("<video> then <video>"), a],
            "videos": [
                frames["png"],
                {"video": frames["jpg"][:3], "sample_fps": 1.0, "raw_fps": 30.0},
            ],
        },
        {
            "conversations": [q("<video>small"), a],
            "videos": [
                {"video": frames["png"][:4], "min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 8}
            ],
        },
        {"conversations": [q("<image>What is it?"), a], "images": [frames["png"][5]]},
        {"conversations": [q("Just text."), a]},
        {"conversations": [q("<video>gone"), a], "videos": [[frames["jpg"][0], "missing.jpg"]]},
    ] * 3
    shard = str(root / "mixed.jsonl")
    with open(shard, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    return shard


def epoch(data, **kw):
    args = dict(
        tokenizer=TINY,
        micro_batch_size=2,
        num_threads=2,
        prefetch=2,
        seed=3,
        max_error_rate=1.0,
        **VISION,
    )
    args.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mmloader.Loader(data, **args) as L:
            out = [{k: np.array(v.numpy(), copy=True) for k, v in b.items()} for b in L]
            return out, L.index_shards, L.stats()


@pytest.mark.parametrize("preset", ["qwen2.5-vl", "qwen3-vl"])
def test_video_counts_are_the_loaders(vds, tmp_path, preset):
    out = str(tmp_path / preset)
    s = dsindex.build([vds], tokenizer=TINY, threads=2, preset=preset, out=out, **VISION)
    assert s["samples"] == 18 and s["good"] == 15, s
    assert s["bad"] == {"missing_file": 3}, s
    x = dsindex.read(os.path.join(out, os.listdir(out)[0]))
    assert "videos=frame-lists,files" in x["settings"] and "video_family=" in x["settings"]
    # the loader's own count of every sample, one per batch in stream order
    b, n, _ = epoch(vds, preset=preset, micro_batch_size=1, shuffle=False, index=False)
    assert n == 0
    want = [y["input_ids"].shape[1] for y in b]
    got = [
        t + sum(e[2] for e in im)
        for t, st, im in zip(x["text_tokens"], x["status"], x["images"])
        if st == 0
    ]
    # (an epoch keeps its 18 batches: the skipped samples' places go to the next ones)
    assert len(want) == 18 and got == want[:15]
    assert sum("video_grid_thw" in y for y in b[:15]) == 9  # records 0, 1, 2 of each repeat
    # batches with the index are those without; the global plan takes the index's counts
    for kw in ({}, dict(max_tokens_per_batch=1500, balance="tokens", micro_batch_size=None)):
        a, n, st = epoch(vds, preset=preset, index=out, **kw)
        c, n0, st0 = epoch(vds, preset=preset, index=False, **kw)
        assert n == 1 and n0 == 0
        same(a, c)
        assert st["skipped_by_reason"] == st0["skipped_by_reason"] == {"missing_file": 3}


def test_video_limits_are_in_the_settings_key(vds, tmp_path):
    """The video processor's limits change video counts, so they are in the settings key:
    a checkpoint with other video limits keeps the index's offsets, not its counts (with a
    warning), and its batches are still those without an index."""
    out = str(tmp_path / "idx")
    dsindex.build([vds], tokenizer=TINY, threads=1, out=out, **VISION)
    model = tmp_path / "model"
    model.mkdir()
    size = {"shortest_edge": 3136, "longest_edge": 28 * 28 * 40}
    (model / "video_preprocessor_config.json").write_text(json.dumps({"size": size}))
    with pytest.warns(UserWarning, match="built with other settings"):
        with mmloader.Loader(
            vds, tokenizer=TINY, index=out, model_dir=str(model), max_error_rate=1.0, **VISION
        ) as L:
            next(iter(L))
    a, n, _ = epoch(vds, index=out, model_dir=str(model))
    c, _, _ = epoch(vds, index=False, model_dir=str(model))
    assert n == 0  # counts not used
    same(a, c)
    assert epoch(vds, index=out)[1] == 1
    b, _, _ = epoch(vds, index=False)
    assert not all(np.array_equal(x["input_ids"], y["input_ids"]) for x, y in zip(b, c))


# ---- video files ---------------------------------------------------------------------


def tar_shard(path, members):
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


@pytest.fixture(scope="module")
def fds(tmp_path_factory):
    """Records naming video FILES (h264 mp4, vp9 webm; absolute and shard-relative paths;
    per-video keys; beside an image and a frame list), a video too short for its element,
    a corrupt file, text; and a WebDataset shard of member videos."""
    pytest.importorskip("av")
    from test_video import make_video

    root = tmp_path_factory.mktemp("vfindex")
    a = make_video(root / "a.mp4", "libx264", n=48, w=64, h=48, fps=24)
    b = make_video(root / "b.webm", "libvpx-vp9", n=30, w=65, h=48, fps=10)
    (root / "junk.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 16)
    img = str(root / "i.png")
    Image.fromarray(np.full((40, 56, 3), 90, np.uint8)).save(img)
    frames = []
    for i in range(4):
        frames.append(str(root / f"fr{i}.png"))
        Image.fromarray(np.full((48, 64, 3), 30 * i, np.uint8)).save(frames[-1])
    ans = {"from": "gpt", "value": "An answer."}

    def rec(text, videos, **kw):
        return dict(
            {"conversations": [{"from": "human", "value": text}, ans], "videos": videos}, **kw
        )

    recs = [
        rec("<image><video>?", [{"video": a, "fps": 2.0}], images=[img]),
        rec("<video>, <video> and <video>", ["b.webm", frames, {"video": a, "nframes": 6}]),
        rec("<video>long", [{"video": b, "nframes": 64}]),  # 30 frames: video_too_short
        rec("<video>junk", ["junk.mp4"]),  # corrupt_video
        {"conversations": [{"from": "human", "value": "Just text."}, ans]},
        rec("<video>window", [{"video": "a.mp4", "video_start": 0.5, "video_end": 1.5}]),
    ] * 2
    shard = str(root / "files.jsonl")
    with open(shard, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    members = []
    for i, (v, ext) in enumerate([(a, "mp4"), (b, "webm"), (a, "mp4")]):
        r = rec(f"<video>member {i}", [ext])
        members += [
            (f"{i:06d}.json", json.dumps(r).encode()),
            (f"{i:06d}.{ext}", open(v, "rb").read()),
        ]
    wds = tar_shard(root / "v.tar", members)
    return shard, wds, a


def index_counts(x):
    """Each planned sample's total tokens, in stream order."""
    return [
        t + sum(e[2] for e in im)
        for t, st, im in zip(x["text_tokens"], x["status"], x["images"])
        if st == 0
    ]


def check_against_loader(data, out, preset, bad, **kw):
    """The index of `data` counts what the loader plans, sample by sample; batches, skips
    and the global plan with it are those without it."""
    x = dsindex.read(os.path.join(out, os.listdir(out)[0]))
    assert "videos=frame-lists,files" in x["settings"]
    b, n, st = epoch(data, preset=preset, micro_batch_size=1, shuffle=False, index=False, **kw)
    assert n == 0 and st["skipped_by_reason"] == bad, st
    good = len(x["status"]) - sum(bad.values())
    assert index_counts(x) == [y["input_ids"].shape[1] for y in b][:good]
    plan = dict(max_tokens_per_batch=2 * max(y["input_ids"].shape[1] for y in b))
    for extra in ({}, dict(plan, balance="tokens", micro_batch_size=None)):
        a, n, sa = epoch(data, preset=preset, index=out, **kw, **extra)
        c, n0, sc = epoch(data, preset=preset, index=False, **kw, **extra)
        assert n == 1 and n0 == 0
        same(a, c)
        assert sa["skipped_by_reason"] == sc["skipped_by_reason"] == bad
        assert sum(len(y.get("video_grid_thw", ())) for y in a) >= good - 2


@pytest.mark.parametrize("preset", ["qwen2.5-vl", "qwen3-vl"])
def test_video_file_counts_are_the_loaders(fds, tmp_path, preset):
    shard, _, _ = fds
    out = str(tmp_path / "idx")
    s = dsindex.build([shard], tokenizer=TINY, threads=2, preset=preset, out=out, **VISION)
    bad = {"video_too_short": 2, "corrupt_video": 2}
    assert s["samples"] == 12 and s["good"] == 8 and s["bad"] == bad, s
    assert s["videos"] == 2 * (1 + 3 + 1), s  # per planned sample's videos
    assert "junk.mp4" in s["examples"]["corrupt_video"], s["examples"]
    assert "64" in s["examples"]["video_too_short"], s["examples"]
    check_against_loader(shard, out, preset, bad)


def test_webdataset_and_remote_video_files_are_probed(fds, tmp_path, fault_server):
    """Member videos of a WebDataset shard (local and over HTTP: the member's bytes) and a
    video file named by URL (ranged reads through the fetcher) are probed like local files."""
    _, wds, a = fds
    out = str(tmp_path / "wds")
    s = dsindex.build([wds], tokenizer=TINY, threads=2, out=out, **VISION)
    assert s["good"] == 3 and s["videos"] == 3, s
    check_against_loader(wds, out, "qwen2.5-vl", {})
    srv = fault_server(objects={"/v/a.mp4": open(a, "rb").read()})
    recs = [
        {
            "conversations": [
                {"from": "human", "value": f"<video>remote {i}"},
                {"from": "gpt", "value": "ok"},
            ],
            "videos": [v],
        }
        for i, v in enumerate([srv.url("/v/a.mp4"), {"video": srv.url("/v/a.mp4"), "nframes": 8}])
    ]
    shard = str(tmp_path / "remote.jsonl")
    with open(shard, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    out = str(tmp_path / "remote")
    s = dsindex.build([shard], tokenizer=TINY, threads=1, out=out, **VISION)
    assert s["good"] == 2 and s["videos"] == 2, s
    assert 0 < s["bytes_read"], s
    check_against_loader(shard, out, "qwen2.5-vl", {})


def test_webdataset_implicit_member_videos_are_counted(fds, tmp_path):
    """A WebDataset record without a video list takes its sample's video members, in the
    index as in the loader (and the settings key says so: an older index is not trusted)."""
    _, _, a = fds
    b = os.path.join(os.path.dirname(a), "b.webm")
    video = open(a, "rb").read()
    members = []
    for i, (text, files) in enumerate(
        [("<video>one", ["mp4"]), ("<video> and <video>", ["0.mp4", "1.webm"]), ("none", [])]
    ):
        r = {"conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "ok"}]}
        members.append((f"{i:06d}.json", json.dumps(r).encode()))
        members += [(f"{i:06d}.{e}", open(b, "rb").read() if "webm" in e else video) for e in files]
    wds = tar_shard(tmp_path / "implicit.tar", members)
    out = str(tmp_path / "idx")
    s = dsindex.build([wds], tokenizer=TINY, threads=2, out=out, **VISION)
    assert s["good"] == 3 and s["videos"] == 3, s
    x = dsindex.read(os.path.join(out, os.listdir(out)[0]))
    assert "videos=frame-lists,files,members" in x["settings"]
    check_against_loader(wds, out, "qwen2.5-vl", {})
