"""Video FILES through the Loader (local, HTTP, S3, WebDataset members), equal to
qwen-vl-utils 0.0.14 process_vision_info(return_video_metadata=True) with its torchcodec
reader's rule (num_frames / average_fps, frame range, smart_nframes, linspace indices) and
PyAV decoding the frames (to_ndarray("rgb24")), followed by transformers 5.24's Qwen2.5-VL /
Qwen3-VL processor (do_sample_frames=False) and get_rope_index: pixel_values_videos,
video_grid_thw, second_per_grid_ts, Qwen3-VL timestamps (in input_ids), mm_token_type_ids,
position_ids, rope_deltas — bitwise.  (tests/video_reference.py; torchvision's resize is
reproduced with torch's antialiased bicubic interpolate, tests/tvshim.)

Videos are generated at test time with PyAV's bundled encoders (libx264, libx265,
libvpx-vp9, SVT-AV1, mpeg4) with a known moving pattern, in mp4, mov, mkv, webm and avi,
and decoded by Debian's FFmpeg libraries.  Odd sizes are odd widths and 4:4:4 odd sizes:
odd-HEIGHT 4:2:0 converts differently in PyAV's FFmpeg 8.1 (tests/test_video.py pins that).

Also: the plan only probes (composition is fixed before any frame is decoded: a file cut
off after its header is a late failure, and the batches are those of the data without
it), failures have their own skip reasons naming the file, and max_memory counts video
pixels."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
import tarfile
import threading
import time

import numpy as np
import pytest

from conftest import same
from test_video import make_video
from test_video_frames import PRESETS, REAL, SYSTEM, TINY, compare, reference_many

import mmloader

av = pytest.importorskip("av")

X265 = {"x265-params": "log-level=none"}

# name: (encoder, file, make_video arguments, element keys)
CASES = {
    "h264-mp4": ("libx264", "a.mp4", {}, {}),
    "h264-mov-yuv444-odd": (
        "libx264",
        "odd.mov",
        dict(w=63, h=47, pix="yuv444p"),
        {"min_pixels": 3136, "max_pixels": 50176},
    ),
    "h264-vfr-mkv": ("libx264", "vfr.mkv", dict(vfr=True), {"fps": 3.0}),
    "h264-long-gop-mp4": (
        "libx264",
        "long.mp4",
        dict(n=120, gop=40),
        {"fps": 1.5, "min_pixels": 3136, "total_pixels": 2e6},
    ),
    "hevc-mkv": ("libx265", "a.mkv", dict(options=X265), {"nframes": 6}),
    "vp9-webm-odd-width": ("libvpx-vp9", "a.webm", dict(w=65, h=48), {"fps": 4.0}),
    "av1-mp4": (
        "libsvtav1",
        "a.mp4",
        dict(w=64, h=64),
        {"video_start": 0.5, "video_end": 1.6, "nframes": 4},
    ),
    "mpeg4-avi": ("mpeg4", "a.avi", {}, {"resized_height": 112, "resized_width": 140}),
}
DEFAULT = ["h264-mp4", "hevc-mkv", "vp9-webm-odd-width", "av1-mp4"]  # the rest: slow


def video(tmp, name):
    codec, fname, kw, _ = CASES[name]
    return make_video(os.path.join(tmp, f"{name}-{fname}"), codec, **kw)


def chat(part, text="What happens?"):
    return [
        {"role": "user", "content": [part, {"type": "text", "text": text}]},
        {"role": "assistant", "content": "Nothing much."},
    ]


def write_shard(path, records):
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return path


def make_case(tmp, preset, tok, name, text="What happens?"):
    path = video(tmp, name)
    keys = CASES[name][3]
    tag = f"{name}-{preset}-{os.path.basename(tok)}"
    shard = write_shard(
        os.path.join(tmp, tag + ".jsonl"),
        [{"messages": chat(dict(keys, type="video", video=os.path.basename(path)), text)}],
    )
    want = (
        (SYSTEM if preset != "qwen3-vl" else "")
        + "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>"
        + text
        + "<|im_end|>\n<|im_start|>assistant\nNothing much.<|im_end|>\n"
    )
    return shard, {
        "op": "process",
        "preset": preset,
        "tokenizer": tok,
        "text": want,
        "messages": chat(dict(keys, type="video", video=path), text),
        "out": os.path.join(tmp, tag + ".npz"),
    }


def video_records(ref, n, nframes):
    """n records of one question and answer over video `ref` (a path or URL), nframes
    frames each."""
    return [
        {
            "conversations": [
                {"from": "human", "value": f"<video>{i}"},
                {"from": "gpt", "value": "x"},
            ],
            "videos": [{"video": ref, "nframes": nframes}],
        }
        for i in range(n)
    ]


def batches(data, preset="qwen2.5-vl", tok=TINY, **kw):
    args = dict(
        preset=preset,
        tokenizer=tok,
        micro_batch_size=1,
        shuffle=False,
        mrope=True,
        mm_token_type_ids=True,
        num_threads=2,
    )
    args.update(kw)
    with mmloader.Loader(data, **args) as L:
        out = [{k: np.array(v.numpy(), copy=True) for k, v in b.items()} for b in L]
        return out, L.stats()


KEYS = [(p, n) for p in PRESETS for n in sorted(CASES)]


@pytest.fixture(scope="module")
def vdir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("vfiles"))


@pytest.fixture(scope="module")
def cases(vdir, request):
    """Every case's shard and reference, in one reference process (the slow cases only
    when the slow tests run)."""
    slow = request.config.getoption("-m", default="") in ("", "slow")
    names = sorted(CASES) if slow else DEFAULT
    made = {(p, n, "tiny"): make_case(vdir, p, TINY, n) for p in PRESETS for n in names}
    if os.path.isdir(REAL):
        for p in PRESETS:
            made[(p, "hevc-mkv", "real")] = make_case(
                vdir, p, os.path.abspath(REAL), "hevc-mkv", text="Describe the clip."
            )
    refs = reference_many([r for _, r in made.values()])
    return {k: (v[0], v[1]["tokenizer"], ref) for (k, v), ref in zip(made.items(), refs)}


def check_case(cases, preset, name, tok="tiny"):
    if (preset, name, tok) not in cases:
        pytest.skip("slow case: run with -m slow")
    shard, tokenizer, ref = cases[(preset, name, tok)]
    got, st = batches(shard, preset, tokenizer)
    assert st["skipped"] == 0 and len(got) == 1
    compare(got[0], ref, preset)


@pytest.mark.parametrize("preset,name", [(p, n) for p in PRESETS for n in DEFAULT])
def test_video_file_matches_processor(cases, preset, name):
    check_case(cases, preset, name)


@pytest.mark.slow
@pytest.mark.parametrize(
    "preset,name", [(p, n) for p in PRESETS for n in sorted(set(CASES) - set(DEFAULT))]
)
def test_video_file_matches_processor_more_codecs(cases, preset, name):
    check_case(cases, preset, name)


@pytest.mark.parametrize("preset", PRESETS)
def test_video_file_matches_processor_real_tokenizer(cases, preset):
    if not os.path.isdir(REAL):
        pytest.skip(f"{REAL} not found (the Qwen tokenizer lives in ../shared/data)")
    check_case(cases, preset, "hevc-mkv", "real")


@pytest.fixture(scope="module")
def torchvision_cases(vdir):
    """The default cases again, read by qwen-vl-utils' own torchvision backend
    (_read_video_torchvision -> torchvision.io.read_video's PyAV backend, reproduced in
    tests/tvshim/torchvision/io.py: every frame decoded, then indexed), one process."""
    made = {}
    for p in PRESETS:
        for n in DEFAULT:
            shard, req = make_case(vdir, p, TINY, n)
            made[(p, n)] = (shard, dict(req, reader="torchvision", out=req["out"][:-4] + "-tv.npz"))
    refs = reference_many([r for _, r in made.values()])
    return {k: (v[0], ref) for (k, v), ref in zip(made.items(), refs)}


@pytest.mark.parametrize("preset,name", [(p, n) for p in PRESETS for n in DEFAULT])
def test_video_file_matches_the_torchvision_backend(torchvision_cases, preset, name):
    """mmloader equals qwen-vl-utils' torchvision (read_video) backend too, bitwise, except
    for one difference between qwen-vl-utils' own backends, pinned: with video_start the
    torchvision backend's frames_indices count from the start of the range (decord's and
    torchcodec's, which mmloader follows, from the start of the file), so Qwen3-VL's
    timestamps in the text are video_start earlier; the pixels and grids are the same."""
    shard, ref = torchvision_cases[(preset, name)]
    got, st = batches(shard, preset, TINY)
    assert st["skipped"] == 0 and len(got) == 1
    start = CASES[name][3].get("video_start")
    if preset != "qwen3-vl" or not start:
        compare(got[0], ref, preset)
        return
    b = got[0]
    assert np.array_equal(b["video_grid_thw"], ref["video_grid_thw"])
    assert np.array_equal(b["pixel_values_videos"], ref["pixel_values_videos"])
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=TINY)
    stamps = [
        [float(t) for t in re.findall(r"<([0-9.]+) seconds>", tok.decode(ids))]
        for ids in (b["input_ids"][0], ref["input_ids"][0])
    ]
    assert len(stamps[0]) == int(b["video_grid_thw"][0, 0]) > 0
    assert stamps[1] == [round(t - start, 1) for t in stamps[0]], stamps


# ---- record layouts, mixed media, remote sources ----------------------------------------


def layouts(name):
    """The same conversation (one video, then the question) in every record layout."""
    conv = [{"from": "human", "value": "<video>What happens?"}, {"from": "gpt", "value": "ok"}]
    msgs = [
        {"role": "user", "content": "<video>What happens?"},
        {"role": "assistant", "content": "ok"},
    ]
    parts = [
        {"role": "user", "content": [{"type": "video", "video": name}, "What happens?"]},
        {"role": "assistant", "content": "ok"},
    ]
    parts[0]["content"][1] = {"type": "text", "text": "What happens?"}
    return {
        "llava": {"conversations": conv, "videos": [name]},
        "sharegpt-object": {"conversations": conv, "videos": [{"video": name}]},
        "messages-tag": {"messages": msgs, "videos": [name]},
        "content-parts": {"messages": parts},
        "alpaca": {"instruction": "<video>What happens?", "output": "ok", "videos": [name]},
    }


def test_every_record_layout_gives_the_same_batch(vdir, tmp_path):
    path = video(vdir, "h264-mp4")
    want = None
    for lay, rec in layouts(path).items():
        got, st = batches(write_shard(str(tmp_path / f"{lay}.jsonl"), [rec]))
        assert st["skipped"] == 0, lay
        if want is None:
            want = got
        else:
            same(want, got)
    # a .json array shard too
    arr = tmp_path / "arr.json"
    arr.write_text(json.dumps([layouts(path)["llava"]]))
    same(want, batches(str(arr))[0])


def test_images_videos_and_frame_lists_mixed(vdir, tmp_path):
    """A record with an image, a video file and a frame list: each video's rows equal the
    same video alone."""
    from PIL import Image

    a, b = video(vdir, "h264-mp4"), video(vdir, "vp9-webm-odd-width")
    frames = []
    for i in range(4):
        p = str(tmp_path / f"f{i}.png")
        Image.fromarray(np.full((48, 64, 3), 40 * i, np.uint8)).save(p)
        frames.append(p)
    img = str(tmp_path / "img.png")
    Image.fromarray(np.arange(48 * 64 * 3, dtype=np.uint8).reshape(48, 64, 3)).save(img)
    recs = [
        {
            "conversations": [
                {"from": "human", "value": "<image><video>and<video>then<video>?"},
                {"from": "gpt", "value": "x"},
            ],
            "images": [img],
            "videos": [a, frames, b],
        }
    ]
    got, st = batches(write_shard(str(tmp_path / "mix.jsonl"), recs))
    assert st["skipped"] == 0
    g = got[0]
    assert g["video_grid_thw"].shape == (3, 3) and g["image_grid_thw"].shape == (1, 3)
    rows = [int(np.prod(t)) for t in g["video_grid_thw"]]
    parts = np.split(g["pixel_values_videos"], np.cumsum(rows)[:-1])
    for v, part in zip([a, frames, b], parts):
        one, _ = batches(
            write_shard(
                str(tmp_path / "one.jsonl"),
                [
                    {
                        "conversations": [
                            {"from": "human", "value": "<video>"},
                            {"from": "gpt", "value": "x"},
                        ],
                        "videos": [v],
                    }
                ],
            )
        )
        assert np.array_equal(one[0]["pixel_values_videos"], part)


def test_remote_http_and_s3_equal_local(vdir, tmp_path, fault_server, moto_s3):
    """Video files over HTTP (with injected faults) and S3 (SigV4) are range reads through
    the loader's fetcher: batches equal the local ones, and an mp4 whose index comes first is
    not downloaded whole for a few frames."""
    path = make_video(
        str(tmp_path / "big.mp4"),
        "libx264",
        n=240,
        w=320,
        h=240,
        gop=24,
        noise=True,
        container_options={"movflags": "faststart"},
    )
    data = open(path, "rb").read()
    rec = lambda ref: {  # noqa: E731
        "conversations": [{"from": "human", "value": "<video>?"}, {"from": "gpt", "value": "x"}],
        "videos": [{"video": ref, "nframes": 4}],
    }
    want, _ = batches(write_shard(str(tmp_path / "l.jsonl"), [rec(path)]))
    srv = fault_server(objects={"/v/big.mp4": data}, fault_rate=0.1, seed=3)
    got, st = batches(write_shard(str(tmp_path / "h.jsonl"), [rec(srv.url("/v/big.mp4"))]))
    same(want, got)
    # every GET is a range, and the distinct ranges (however often the prefetching loader
    # opened the file) are a part of it
    gets = {e[3] for e in srv.log if e[1] == "GET"}
    assert gets and all(r.startswith("bytes=") for r in gets), gets
    spans = [tuple(map(int, r[6:].split("-"))) for r in gets]
    assert sum(b - a + 1 for a, b in spans) < len(data) * 3 // 4, sorted(spans)
    url = moto_s3.put("v/big.mp4", data)
    s3 = dict(
        s3_endpoint=moto_s3.endpoint,
        s3_region=moto_s3.region,
        aws_access_key_id=moto_s3.access_key,
        aws_secret_access_key=moto_s3.secret_key,
    )
    same(want, batches(write_shard(str(tmp_path / "s.jsonl"), [rec(url)]), **s3)[0])


def _preload_records(ref, n):
    return [
        {
            "conversations": [
                {"from": "human", "value": f"<video>{i}"},
                {"from": "gpt", "value": "x"},
            ],
            "videos": [{"video": ref, "nframes": 4 + 2 * (i % 3)}],
        }
        for i in range(n)
    ]


@pytest.mark.parametrize("which", ["moov-first", "moov-last"])
def test_remote_mp4_decode_never_waits_on_the_network(vdir, tmp_path, fault_server, which):
    """No worker waits on a round trip for a remote mp4: its HEAD and first block are
    fetched with the record's images, and when its index (moov) is not all in that block
    (at the end, past the mdat: the top-level box sizes say where) the bytes holding it are
    fetched next, exactly, before the plan stage runs, so its open and probe read memory
    (video_plan_waits == 0; the moov at the end was read on demand, >= 1 wait per video);
    when the sample is planned, the exact packet ranges its kept frames need
    (from the index) are fetched, and the decode is queued once they are in
    (video_decode_waits == 0).  Behind a 30 ms server with injected faults, batches equal
    the local ones; the preload GETs are the exact packet ranges (not 1 MiB blocks) and
    cover a part of the file."""
    opts = {"movflags": "faststart"} if which == "moov-first" else {}
    path = make_video(
        str(tmp_path / "v.mp4"),
        "libx264",
        n=240,
        w=320,
        h=240,
        gop=24,
        noise=True,
        container_options=opts,
    )
    data = open(path, "rb").read()
    n = 6
    want, _ = batches(write_shard(str(tmp_path / "l.jsonl"), _preload_records(path, n)))
    srv = fault_server(objects={"/v.mp4": data}, latency=0.03, fault_rate=0.1, seed=5)
    recs = _preload_records(srv.url("/v.mp4"), n)
    got, st = batches(write_shard(str(tmp_path / "h.jsonl"), recs))
    same(want, got)
    assert len(got) == n and st["skipped"] == 0
    assert st["video_decode_waits"] == 0 and st["video_plan_waits"] == 0, st
    block = 1 << 20
    spans = {
        tuple(map(int, e[3][6:].split("-")))
        for e in srv.log
        if e[1] == "GET" and e[3] and e[3].startswith("bytes=")
    }
    if which == "moov-last":  # the moov past the mdat: one GET of exactly it, to the end
        moov = data.rindex(b"moov") - 4
        assert moov > block and (moov, len(data) - 1) in spans, (moov, sorted(spans))
    exact = [(a, b) for a, b in spans if a % block or (b + 1) % block and b + 1 != len(data)]
    assert exact, sorted(spans)  # packet ranges, not only whole blocks
    assert sum(b - a + 1 for a, b in exact) < len(data), sorted(exact)


@pytest.mark.parametrize(
    "codec,name", [("libx264", "v.mkv"), ("libvpx-vp9", "v.webm"), ("mpeg4", "v.avi")]
)
def test_remote_mkv_webm_avi_decode_never_waits_on_the_network(tmp_path, fault_server, codec, name):
    """A container without a per-frame index (mkv, webm, avi) is preloaded too: the packet
    pass of its open (at plan time) keeps each packet's place, so the ranges its decode
    reads (from where the seek to each kept frame's keyframe lands through the packets the
    decoder takes in) are fetched before the decode is queued (video_decode_waits == 0),
    and the rest of a file bigger than the first block (up to 1 + 8 MiB: the open's packet
    pass reads it all) is fetched in one GET before the plan stage, so the pass reads
    memory too (video_plan_waits == 0; it waited ~2 times per video on 1 MiB blocks).
    Behind a 30 ms server with injected faults, batches equal the local ones, and the
    preload GETs are exact ranges, not 1 MiB blocks.  (A decode that is not preloaded is
    counted: test_max_memory_counts_preloaded_video_bytes.)"""
    path = make_video(str(tmp_path / name), codec, n=120, w=320, h=240, gop=24, noise=True)
    data = open(path, "rb").read()
    assert len(data) > 1 << 20  # past the first block: the pass reads on demand
    want, _ = batches(write_shard(str(tmp_path / "l.jsonl"), _preload_records(path, 3)))
    srv = fault_server(objects={"/" + name: data}, latency=0.03, fault_rate=0.1, seed=7)
    recs = _preload_records(srv.url("/" + name), 3)
    got, st = batches(write_shard(str(tmp_path / "h.jsonl"), recs))
    same(want, got)
    assert len(got) == 3 and st["skipped"] == 0
    assert st["video_decode_waits"] == 0 and st["video_plan_waits"] == 0, st
    block = 1 << 20
    spans = {
        tuple(map(int, e[3][6:].split("-")))
        for e in srv.log
        if e[1] == "GET" and e[3] and e[3].startswith("bytes=")
    }
    exact = [(a, b) for a, b in spans if a % block or (b + 1) % block and b + 1 != len(data)]
    assert exact, sorted(spans)  # packet ranges, not only whole blocks


def test_s3_mp4_decode_never_waits_on_the_network(vdir, tmp_path, moto_s3):
    """The same through S3 (SigV4 HEAD and ranged GETs against moto): a file under one
    block is opened from the first block and decoded from its preloaded packets."""
    path = make_video(str(tmp_path / "s.mp4"), "libx264", n=96, w=160, h=120, gop=12, noise=True)
    want, _ = batches(write_shard(str(tmp_path / "l.jsonl"), _preload_records(path, 3)))
    url = moto_s3.put("v/s.mp4", open(path, "rb").read())
    s3 = dict(
        s3_endpoint=moto_s3.endpoint,
        s3_region=moto_s3.region,
        aws_access_key_id=moto_s3.access_key,
        aws_secret_access_key=moto_s3.secret_key,
    )
    got, st = batches(write_shard(str(tmp_path / "s.jsonl"), _preload_records(url, 3)), **s3)
    same(want, got)
    assert st["video_decode_waits"] == 0 and st["video_plan_waits"] == 0, st


def _packets_needed(path, idx):
    """Bytes of the packets a decode of frames idx reads: from the keyframe at or before
    each wanted frame through that frame (each packet once; no B-frames here)."""
    with av.open(path) as c:
        pk = [(p.pts, p.size, p.is_keyframe) for p in c.demux(c.streams.video[0]) if p.size]
    pk.sort()
    need = set()
    for i in idx:
        k = max(j for j in range(i + 1) if pk[j][2])
        need.update(range(k, i + 1))
    return sum(pk[j][1] for j in need)


@pytest.mark.parametrize("elem", [{}, {"nframes": 4}], ids=["default-fps", "nframes-4"])
def test_remote_video_bytes_served_per_sample(tmp_path, fault_server, elem):
    """Issue 29: a server that honours Range serves each sample about the bytes its decode
    reads, and no range twice.  Four samples, each its own mp4 (moov last, GOP 30), one
    epoch, then close: at the default fps (every GOP decoded) at most the file plus the
    first block its probe reads; with nframes=4 within 1.25x the packets the 4 frames need
    plus that block and the moov.  Before, the window planned and preloaded the samples of
    the next 16 epochs (a 4-sample epoch, a window of 64), each fetching its ranges again
    (served 1.85x the file per sample over 8 samples, 13 times the same range for one), and
    the epoch's StopIteration waited for a batch of the next epoch."""
    n, frames = 4, 120
    path = make_video(
        str(tmp_path / "v.mp4"), "libx264", n=frames, w=320, h=240, gop=30, noise=True
    )
    data = open(path, "rb").read()
    srv = fault_server(objects={f"/v{i}.mp4": data for i in range(n)})
    recs = [
        {
            "conversations": [
                {"from": "human", "value": f"<video>{i}"},
                {"from": "gpt", "value": "x"},
            ],
            "videos": [dict(elem, video=srv.url(f"/v{i}.mp4"))],
        }
        for i in range(n)
    ]
    got, st = batches(write_shard(str(tmp_path / "h.jsonl"), recs))
    assert len(got) == n and st["skipped"] == 0
    assert st["video_decode_waits"] == 0, st
    gets = [(e[2], e[3]) for e in srv.log if e[1] == "GET"]
    assert len(gets) == len(set(gets)), sorted(gets)  # no range of a file asked for twice
    first = 1 << 20  # the block the probe reads (the moov's place, or the moov)
    moov = len(data) - (data.rindex(b"moov") - 4)
    if elem:
        idx = np.linspace(0, frames - 1, 4).round().astype(int)
        bound = 1.25 * _packets_needed(path, idx) + first + moov
    else:
        bound = len(data) + first
    for i in range(n):
        served = sum(
            int(b) - int(a) + 1 for p, r in gets if p == f"/v{i}.mp4" for a, b in [r[6:].split("-")]
        )
        assert served <= bound, (i, served, bound, len(data))


def test_each_file_is_opened_once_per_sample(vdir, tmp_path, fault_server):
    """The plan stage's probe keeps the file open for the decode: one open (one HEAD, one
    packet pass over an mkv, which reads it whole) per sample planned, not one more for
    its decode; batches unchanged."""
    mkv = make_video(str(tmp_path / "v.mkv"), "libx264", n=96, w=160, h=120, gop=12, noise=True)
    srv = fault_server(objects={"/v/v.mkv": open(mkv, "rb").read()})
    n, window = 8, 2

    def recs(ref):
        return [
            {
                "conversations": [
                    {"from": "human", "value": f"<video>{i}"},
                    {"from": "gpt", "value": "x"},
                ],
                "videos": [{"video": ref, "nframes": 4 + 2 * (i % 3)}],
            }
            for i in range(n)
        ]

    kw = dict(num_threads=2, window=window, prefetch=1)
    want, _ = batches(write_shard(str(tmp_path / "l.jsonl"), recs(mkv)), **kw)
    got, _ = batches(write_shard(str(tmp_path / "h.jsonl"), recs(srv.url("/v/v.mkv"))), **kw)
    same(want, got)
    assert len(got) == n
    # one open per sample planned: the n samples and the few of the next epoch planned
    # ahead (the window); opening each again to decode it made it at least 2 * n
    heads = sum(1 for e in srv.log if e[1] == "HEAD" and e[2] == "/v/v.mkv")
    assert n <= heads < 2 * n, heads


def tar_shard(path, members):
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def test_webdataset_member_videos(vdir, tmp_path, fault_server):
    a, b = video(vdir, "h264-mp4"), video(vdir, "hevc-mkv")
    recs = [
        {
            "conversations": [
                {"from": "human", "value": "<video>?"},
                {"from": "gpt", "value": "x"},
            ],
            "videos": [v],
        }
        for v in (a, b)
    ]
    want, _ = batches(write_shard(str(tmp_path / "ref.jsonl"), recs))
    members = []
    for i, (v, ext) in enumerate([(a, "mp4"), (b, "mkv")]):
        rec = dict(recs[i], videos=[ext if i == 0 else f"{i:06d}.{ext}"])
        members += [
            (f"{i:06d}.json", json.dumps(rec).encode()),
            (f"{i:06d}.{ext}", open(v, "rb").read()),
        ]
    shard = tar_shard(tmp_path / "s.tar", members)
    same(want, batches(shard)[0])
    srv = fault_server(objects={"/w/s.tar": open(shard, "rb").read()})
    same(want, batches(srv.url("/w/s.tar"))[0])


def test_webdataset_implicit_member_videos(vdir, tmp_path, fault_server):
    """A WebDataset sample whose record lists no videos takes its video members (in tar
    order) for `<video>` tags and {"type": "video"} parts, as its image members stand for
    an absent image list; the batches are those of the same records naming the files."""
    Image = pytest.importorskip("PIL.Image")
    a, b = video(vdir, "h264-mp4"), video(vdir, "hevc-mkv")
    img = str(tmp_path / "i.png")
    Image.fromarray(np.full((40, 56, 3), 90, np.uint8)).save(img)

    def human(text):
        return {"conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "ok"}]}

    def part(**kw):
        content = [dict(kw, type="video"), {"type": "text", "text": "?"}]
        return {"messages": [{"role": "user", "content": content}]}

    # (record in the shard, its members, the same record naming the files)
    items = [
        (human("<video>?"), [("mp4", a)], dict(human("<video>?"), videos=[a])),
        (part(nframes=6), [("mkv", b)], part(nframes=6, video=b)),
        (
            human("<image> and <video>"),
            [("png", img), ("mp4", a)],
            dict(human("<image> and <video>"), images=[img], videos=[a]),
        ),
        (
            human("<video> then <video>"),
            [("0.mkv", b), ("1.mp4", a)],
            dict(human("<video> then <video>"), videos=[b, a]),
        ),
        (
            dict(human("<video> listed"), videos=["1.mp4"]),  # a list: the members unused
            [("0.mkv", b), ("1.mp4", a)],
            dict(human("<video> listed"), videos=[a]),
        ),
    ]
    want, _ = batches(write_shard(str(tmp_path / "ref.jsonl"), [r for _, _, r in items]))
    members = []
    for i, (rec, files, _) in enumerate(items):
        members.append((f"{i:06d}.json", json.dumps(rec).encode()))
        members += [(f"{i:06d}.{ext}", open(f, "rb").read()) for ext, f in files]
    shard = tar_shard(tmp_path / "s.tar", members)
    got, _ = batches(shard)
    assert len(got) == len(items) and sum("video_grid_thw" in g for g in got) == len(items)
    same(want, got)
    srv = fault_server(objects={"/w/s.tar": open(shard, "rb").read()})
    same(want, batches(srv.url("/w/s.tar"))[0])
    # a video member that no tag or part takes is a count mismatch naming the sample
    bad = tar_shard(
        tmp_path / "bad.tar",
        [("k.json", json.dumps(human("No tag.")).encode()), ("k.mp4", open(a, "rb").read())],
    )
    with pytest.raises(mmloader.SampleError, match=r"bad\.tar\[k\]: video count mismatch"):
        batches(bad, on_error="raise")


# ---- failures ----------------------------------------------------------------------------


def _codec_tag(path, old, new):
    """Renames the sample entry's codec (in stsd: the brands in ftyp say avc1 too)."""
    data = bytearray(open(path, "rb").read())
    i = data.find(old, data.find(b"stsd"))
    assert i > 0
    data[i : i + 4] = new
    open(path, "wb").write(bytes(data))
    return path


def test_failures_have_their_own_reasons_naming_the_file(vdir, tmp_path):
    good = video(vdir, "h264-mp4")
    (tmp_path / "junk.mp4").write_bytes(
        b"\x00\x00\x00\x18ftypmp42" + random.Random(0).randbytes(4000)
    )
    import shutil

    shutil.copy(good, tmp_path / "codec.mp4")
    _codec_tag(str(tmp_path / "codec.mp4"), b"avc1", b"zzz9")
    cases = {
        "junk.mp4": ("corrupt_video", {}),
        "codec.mp4": ("unsupported_video_codec", {}),
        "short": ("video_too_short", {"nframes": 64}),  # 48 frames
        "late": ("video_too_short", {"video_start": 5.0, "video_end": 9.0}),  # a 2 s video
    }
    for name, (reason, keys) in cases.items():
        ref = good if name in ("short", "late") else str(tmp_path / name)
        rec = {
            "conversations": [
                {"from": "human", "value": "<video>?"},
                {"from": "gpt", "value": "x"},
            ],
            "videos": [dict(keys, video=ref)],
        }
        shard = write_shard(str(tmp_path / f"{name}.jsonl"), [rec, layouts(good)["llava"]])
        got, st = batches(shard)
        assert st["skipped_by_reason"] == {reason: 1}, (name, st)
        with pytest.raises(mmloader.Error) as e:
            batches(shard, on_error="raise")
        msg = str(e.value)
        assert os.path.basename(ref) in msg and f"{name}.jsonl:1" in msg, msg


def test_cut_off_file_is_a_late_failure_and_batches_are_unchanged(vdir, tmp_path):
    """An mp4 whose index comes first, cut in its frame data: the plan (probe only) takes
    it, its decode fails (corrupt_video, naming the file), and the batches are exactly those
    of the data without it."""
    full = make_video(
        str(tmp_path / "full.mp4"),
        "libx264",
        n=96,
        w=96,
        h=64,
        gop=12,
        noise=True,
        container_options={"movflags": "faststart"},
    )
    data = open(full, "rb").read()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) * 2 // 3])
    vids = [video(vdir, "h264-mp4"), video(vdir, "vp9-webm-odd-width"), full]
    rec = lambda v, i: {  # noqa: E731
        "conversations": [{"from": "human", "value": f"<video>{i}"}, {"from": "gpt", "value": "x"}],
        "videos": [{"video": v, "fps": 2.0}],
    }
    good = [rec(vids[i % 3], i) for i in range(8)]
    with_cut = good[:3] + [rec(str(cut), 99)] + good[3:]
    kw = dict(micro_batch_size=2)
    want, _ = batches(write_shard(str(tmp_path / "g.jsonl"), good), **kw)
    got, st = batches(write_shard(str(tmp_path / "c.jsonl"), with_cut), **kw)
    assert st["skipped_by_reason"] == {"corrupt_video": 1}, st
    same(want, got)
    plan, pst = batches(str(tmp_path / "c.jsonl"), plan_only=True, **kw)
    assert pst["skipped"] == 0  # the plan never decodes a frame


def test_max_memory_counts_video_pixels(vdir, tmp_path):
    path = video(vdir, "h264-mp4")
    rec = {"conversations": [{"from": "human", "value": "<video>"}, {"from": "gpt", "value": "x"}]}
    shard = write_shard(
        str(tmp_path / "m.jsonl"), [dict(rec, videos=[{"video": path, "nframes": 16}])]
    )
    got, _ = batches(shard)
    need = got[0]["pixel_values_videos"].nbytes
    low = (40 << 20) + (1 << 20)  # the smallest max_memory for 2 workers, + 1 MiB
    assert need > 2 * (low - (32 << 20))
    with pytest.raises(mmloader.Error, match=r"needs \d+ bytes of pixel_values"):
        batches(shard, max_memory=low)
    same(got, batches(shard, max_memory=need + (64 << 20))[0])


def test_max_memory_counts_preloaded_video_bytes(vdir, tmp_path, fault_server):
    """The remote video bytes fetched ahead of their use (each file's first block, fetched
    with the images, until its probe; the packets preloaded for a decode, until it ends)
    count in max_memory: under a cap they are fetched only with room, and all together
    never pass a quarter of it (the rest is read when needed, counted as decode waits);
    without a cap the same epoch holds more than that at once.  Batches equal local."""
    path = make_video(
        str(tmp_path / "p.mp4"),
        "libx264",
        n=240,
        w=320,
        h=240,
        gop=24,
        noise=True,
        container_options={"movflags": "faststart"},
    )
    # 24 samples: uncapped, ~27 MiB preloaded at once (12 held 20.5 MiB, a hair over the
    # quarter, once the next epochs' samples no longer preloaded beside them)
    want, _ = batches(write_shard(str(tmp_path / "l.jsonl"), video_records(path, 24, nframes=4)))
    srv = fault_server(objects={"/p.mp4": open(path, "rb").read()}, latency=0.01)
    shard = write_shard(str(tmp_path / "h.jsonl"), video_records(srv.url("/p.mp4"), 24, nframes=4))
    cap = 80 << 20
    free, fst = batches(shard)
    same(want, free)
    assert fst["video_decode_waits"] == 0 and fst["video_preloads_refused"] == 0, fst
    assert fst["video_preload_peak_bytes"] > cap // 4, fst  # so the cap below binds
    capped, cst = batches(shard, max_memory=cap)
    same(want, capped)
    assert 0 < cst["video_preload_peak_bytes"] <= cap // 4, cst
    assert cst["video_preloads_refused"] > 0 and cst["video_decode_waits"] > 0, cst


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_max_memory_counts_videos_kept_open(vdir, tmp_path):
    """The videos kept open from their probe to their decode (up to 128 per loader) count
    in max_memory: an idle one holds its demuxer state and frame tables (its decoder,
    h264's ~0.8 MiB context, is closed until the decode), video_open_peak_bytes of them at
    once.  A slow consumer lets a 128-sample window fill with planned samples: without a
    cap they keep ~110 KB each open, under one the RSS growth stays below it (with ~1.1 MB
    each uncounted it did not), and batches equal the uncapped ones."""
    path = video(vdir, "h264-mp4")
    recs = video_records(path, 160, nframes=2)
    shard = write_shard(str(tmp_path / "o.jsonl"), recs)

    def run(**kw):
        args = dict(
            preset="qwen2.5-vl",
            tokenizer=TINY,
            micro_batch_size=1,
            shuffle=False,
            num_threads=2,
            window=128,
            prefetch=8,
        )
        args.update(kw)
        L = mmloader.Loader(shard, **args)
        base, peak, stop = _rss(), [0], threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], _rss())
                time.sleep(0.002)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        out = []
        try:
            for b in L:  # (not enumerate: its result tuple keeps the last batch alive)
                pv = b["pixel_values_videos"].numpy()
                out.append((pv.shape, hashlib.sha256(pv.data).hexdigest()))  # no copy kept
                del pv
                del b
                if len(out) == 1:  # the window fills with planned samples meanwhile
                    seen, still, t0 = -1, 0, time.monotonic()
                    while still < 4 and time.monotonic() - t0 < 60:
                        time.sleep(0.25)
                        now = L.stats()["video_open_peak_bytes"]
                        still = still + 1 if now == seen else 0
                        seen = now
            st = L.stats()
        finally:
            stop.set()
            th.join()
            L.close()
        return out, st, peak[0] - base

    free, fst, _ = run()
    assert fst["skipped"] == 0 and fst["video_open_peak_bytes"] > 12 << 20, fst  # > the room
    cap = 40 << 20
    capped, cst, grew = run(max_memory=cap)
    assert capped == free
    assert 0 < cst["video_open_peak_bytes"] <= cap - (32 << 20), cst
    assert grew <= cap, f"RSS grew {grew >> 20} MiB, above max_memory {cap >> 20} MiB"


def remote_mp4(tmp_path, fault_server):
    """A 5 s 640x360 H.264 mp4 (faststart) on disk and served by the fault server with
    20 ms latency: (its path, its URL)."""
    path = make_video(
        str(tmp_path / "r.mp4"),
        "libx264",
        n=150,
        w=640,
        h=360,
        fps=30,
        gop=30,
        container_options={"movflags": "faststart"},
    )
    srv = fault_server(objects={"/r.mp4": open(path, "rb").read()}, latency=0.02)
    return path, srv.url("/r.mp4")


def test_max_memory_next_batch_never_waits_on_bytes_held_ahead(tmp_path, fault_server):
    """Under max_memory the bytes fetched or held ahead of their use (remote videos' first
    blocks, preloaded packets, videos kept open) leave room for the next batch, and give it
    way when it cannot get its buffer: 2 workers on remote mp4s of 11.25 MB batches under
    max_memory=48 MiB (16 MiB beside the workers' scratch) deliver every batch to a
    consumer that releases each one (before: "cannot hold the next batch" at the first,
    preloads of later samples holding its room).  A consumer whose `for` loop keeps the
    previous batch alive during next() really needs two batches: the error says so and
    names the max_memory that fits, which then delivers them all; batches equal local."""
    path, url = remote_mp4(tmp_path, fault_server)
    want, _ = batches(write_shard(str(tmp_path / "l.jsonl"), video_records(path, 8, nframes=4)))
    assert want[0]["pixel_values_videos"].nbytes > 10 << 20  # 11.25 MB: 12 MiB of pages
    shard = write_shard(str(tmp_path / "h.jsonl"), video_records(url, 8, nframes=4))
    args = dict(
        preset="qwen2.5-vl",
        tokenizer=TINY,
        micro_batch_size=1,
        shuffle=False,
        mrope=True,
        mm_token_type_ids=True,
        num_threads=2,
    )

    def releasing(cap):
        out = []
        with mmloader.Loader(shard, max_memory=cap, **args) as L:
            it = iter(L)
            while True:
                try:
                    b = next(it)
                except StopIteration:
                    return out
                out.append({k: np.array(v.numpy(), copy=True) for k, v in b.items()})
                del b

    same(want, releasing(48 << 20))
    with pytest.raises(
        mmloader.OutOfMemoryError, match=r"consumer holds.*max_memory >= (\d+)"
    ) as e:
        batches(shard, max_memory=48 << 20)
    import re

    need = int(re.search(r"max_memory >= (\d+)", str(e.value)).group(1))
    assert need <= 60 << 20, need  # two batches in 2 MiB pages + scratch + a little
    # exactly the figure: it holds the whole batch (its other tensors too: loader_admit.c
    # X3) and the videos kept open ahead of the batch waited for close for it (C8)
    got, st = batches(shard, max_memory=need)
    same(want, got)


def test_max_memory_kept_batch_error_with_a_later_epochs_samples_parked(tmp_path, fault_server):
    """A later epoch's samples with remote videos wait, parked, until the consumer asks for
    that epoch (loader_video.c): they hold a slot and their record, and are not in flight.
    Placement stops at the epoch's end whatever their state, so they keep neither the engine
    from looking idle nor the deadlock rule (ledger.c L7) from failing a batch that cannot
    fit beside the one the consumer keeps: an error naming what is held, not a wait (before,
    placement stopped at the first of them as "being read", the engine never looked idle,
    and next() waited until next_timeout_s: 1 of ~10 runs of the test above, every run
    here).  Two records an epoch, so the next epoch's samples are read while the first
    batches are built."""
    _, url = remote_mp4(tmp_path, fault_server)
    shard = write_shard(str(tmp_path / "h.jsonl"), video_records(url, 2, nframes=4))
    for _ in range(3):
        with pytest.raises(
            mmloader.OutOfMemoryError, match=r"consumer holds.*max_memory >= (\d+)"
        ) as e:
            batches(shard, max_memory=48 << 20, next_timeout_s=60)
        assert "h.jsonl:2" in str(e.value), str(e.value)  # the sample of the batch waited for


# ---- resume and the global plan ----------------------------------------------------------


def mixed_records(vdir, n=9):
    vids = [video(vdir, "h264-mp4"), video(vdir, "hevc-mkv"), video(vdir, "vp9-webm-odd-width")]
    out = []
    for i in range(n):
        if i % 3 == 2:
            out.append(
                {
                    "conversations": [
                        {"from": "human", "value": f"text {i}"},
                        {"from": "gpt", "value": "x"},
                    ]
                }
            )
        else:
            v = {"video": vids[i % 3], "fps": 1.0 + i % 4}
            out.append(
                {
                    "conversations": [
                        {"from": "human", "value": f"<video>{i}"},
                        {"from": "gpt", "value": "x"},
                    ],
                    "videos": [v],
                }
            )
    return out


def test_resume_mid_epoch_with_videos(vdir, tmp_path):
    shard = write_shard(str(tmp_path / "r.jsonl"), mixed_records(vdir))
    kw = dict(
        preset="qwen2.5-vl",
        tokenizer=TINY,
        micro_batch_size=2,
        shuffle=True,
        seed=3,
        num_threads=2,
        mrope=True,
    )
    with mmloader.Loader(shard, **kw) as L:
        it = iter(L)
        first = [next(it) for _ in range(2)]
        state = L.state_dict()
        want = [{k: np.array(v.numpy(), copy=True) for k, v in next(it).items()}]
    assert first
    with mmloader.Loader(shard, **kw) as L:
        L.load_state_dict(state)
        got = [{k: np.array(v.numpy(), copy=True) for k, v in next(iter(L)).items()}]
    same(want, got)


def test_global_plan_counts_videos_from_the_probe(vdir, tmp_path):
    """max_tokens_per_batch plans every sample's tokens (the planning pass probes videos,
    decodes nothing); the batches keep to the budget and carry every video."""
    recs = mixed_records(vdir, 12)
    shard = write_shard(str(tmp_path / "g.jsonl"), recs)
    one, _ = batches(shard, micro_batch_size=1)
    budget = max(int(b["input_ids"].shape[1]) for b in one) * 2
    got, st = batches(shard, micro_batch_size=None, max_tokens_per_batch=budget)
    assert st["skipped"] == 0
    assert all(int(b["attention_mask"].sum()) <= budget for b in got)
    nvid = sum(len(b.get("video_grid_thw", ())) for b in got)
    assert nvid == sum(1 for r in recs if "videos" in r)


def test_next_batch_waiting_its_turn_keeps_what_is_held_ahead(tmp_path, fault_server):
    """A next batch that waits for its turn (prefetch batches ahead of a slow consumer),
    not for room, is no reason to give up the bytes held ahead of their use: later samples
    keep their preloaded packets and their videos open, so no decode waits on the network,
    with no cap and with one far above the epoch's needs.  (The release that makes way for
    a batch short of room ran on any wait: 32-46 decode waits in this epoch.)"""
    path = make_video(
        str(tmp_path / "k.mp4"),
        "libx264",
        n=120,
        w=320,
        h=240,
        gop=24,
        container_options={"movflags": "faststart"},
    )
    want, _ = batches(write_shard(str(tmp_path / "l.jsonl"), video_records(path, 24, nframes=4)))
    srv = fault_server(objects={"/k.mp4": open(path, "rb").read()}, latency=0.01)
    shard = write_shard(str(tmp_path / "h.jsonl"), video_records(srv.url("/k.mp4"), 24, nframes=4))
    for cap in (None, 1 << 30):
        out = []
        with mmloader.Loader(
            shard,
            preset="qwen2.5-vl",
            tokenizer=TINY,
            micro_batch_size=1,
            shuffle=False,
            mrope=True,
            mm_token_type_ids=True,
            num_threads=2,
            prefetch=2,
            max_memory=cap,
        ) as L:
            for b in L:
                out.append({k: np.array(v.numpy(), copy=True) for k, v in b.items()})
                del b
                time.sleep(0.03)  # slow: the next batches wait for prefetch
            st = L.stats()
        same(want, out)
        assert st["video_decode_waits"] == 0 and st["video_preloads_refused"] == 0, (cap, st)
