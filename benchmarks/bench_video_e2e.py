"""End-to-end video samples: mmloader's Loader against the qwen-vl-utils path on the same
records and files, in one run: videos per second and CPU seconds per video (all threads of
the process: "per core").

The work per sample is the same on both sides: a chat record naming one video ->
``input_ids`` + ``pixel_values_videos`` + ``video_grid_thw`` (+ ``second_per_grid_ts``,
Qwen2.5-VL) as the model takes them.
  qwen-vl-utils  ``process_vision_info(messages, return_video_kwargs=True,
                 return_video_metadata=True)`` (frame lists: each frame through
                 fetch_image, PIL; video files: its decord backend, the default when
                 decord is installed) + transformers' processor
                 (``Qwen2_5_VLProcessor`` / ``Qwen3VLProcessor`` with its video processor,
                 ``do_sample_frames=False``) on the chat template's text, one sample at a
                 time, torch on one thread.  transformers' video processor calls
                 torchvision's resize / normalize on tensors; PyPI's torchvision breaks beside
                 the CPU torch here, so the peer runs in a subprocess with
                 tests/tvshim (those functions reproduced with torch.nn.functional.interpolate
                 and the same tensor ops torchvision runs; see its docstring) on PYTHONPATH.
  mmloader       ``mmloader.Loader`` over a JSONL shard of the SAME messages records,
                 ``micro_batch_size=1``, ``num_threads=1``, float32 ``pixel_values_videos``
                 (the processor's dtype).  CPU: fixed costs are left out on both sides (the
                 peer times its loop after building the processor; mmloader's is a loader
                 over 2n samples minus one over n, each from construction to close); wall:
                 mmloader's whole 2n-sample run (construction included) per sample.
Same work, checked before timing: the first sample's ``pixel_values_videos`` and
``video_grid_thw`` of both are compared (bit for bit, else the largest difference is
reported) and the run refuses to report ratios when the grids differ.

Inputs, made once into ~/.cache/mmloader/bench-video-e2e:
  frames  frame lists (qwen-vl-utils accepts a list of images as a video): 16 JPEG frames
          (quality 90) of a moving pattern with grain per video, several videos
  mp4     bench_video.py's H.264 files (640x360, 30 fps, 1 and 10 minutes) with
          ``nframes`` kept frames; run only when this mmloader loads video files (else
          reported as skipped, with the loader's reason); for these also the cost of
          decoding alone (mmloader's decoder and decord on the same kept frames) and the
          10-minute / 1-minute cost at the same nframes

    python3 benchmarks/bench_video_e2e.py                  # median of 3 rounds
    python3 benchmarks/bench_video_e2e.py --runs 5 --samples 24 --preset qwen3-vl --md out.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

CACHE = os.path.join(os.path.expanduser("~"), ".cache", "mmloader", "bench-video-e2e")
SHIM = os.path.join(ROOT, "tests", "tvshim")
TINY = os.path.join(ROOT, "mmloader", "data", "tiny-tokenizer.json")
REAL = os.path.join(os.path.dirname(ROOT), "shared", "data", "qwen3-tokenizer")
SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
ANSWER = "Something moves."


def tokenizer_path():
    """The real Qwen tokenizer when the checkout has ../shared, else the bundled tiny one
    (both sides use the same)."""
    return REAL if os.path.exists(os.path.join(REAL, "tokenizer.json")) else TINY


# ---- inputs ---------------------------------------------------------------------------


def make_frames(folder, n, w, h, seed):
    """n JPEG frames of a moving pattern with grain (what a decoded video frame looks like
    to the resize: smooth gradients plus noise)."""
    from PIL import Image

    os.makedirs(folder, exist_ok=True)
    paths = [os.path.join(folder, f"{i:03d}.jpg") for i in range(n)]
    if all(os.path.exists(p) for p in paths):
        return paths
    y, x = np.mgrid[0:h, 0:w]
    grain = np.random.default_rng(seed).integers(0, 24, (h, w, 3), np.uint8)
    for i, p in enumerate(paths):
        img = np.stack([(x + 3 * i + seed) % 256, (y + 2 * i) % 256, ((x + y) // 2 + i) % 256], -1)
        img = img.astype(np.uint8) + np.roll(grain, i % 97, axis=1)
        Image.fromarray(img).save(p + ".part.jpg", quality=90)
        os.replace(p + ".part.jpg", p)
    return paths


def record(video, question):
    """One chat record in the messages layout both sides read."""
    return {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "video", "video": video}, {"type": "text", "text": question}],
            },
            {"role": "assistant", "content": ANSWER},
        ]
    }


def chat_text(rec, preset):
    """The chat template's text of a one-video record (what mmloader's template renders;
    Qwen2.5-VL adds the default system turn, Qwen3-VL does not)."""
    user, answer = rec["messages"][0]["content"], rec["messages"][1]["content"]
    question = next(p["text"] for p in user if p["type"] == "text")
    system = "" if preset == "qwen3-vl" else SYSTEM
    return (
        system
        + "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>"
        + question
        + f"<|im_end|>\n<|im_start|>assistant\n{answer}<|im_end|>\n"
    )


def frame_list_records(nvideos, nframes, w, h):
    recs = []
    for v in range(nvideos):
        paths = make_frames(os.path.join(CACHE, f"frames{w}x{h}-{v}"), nframes, w, h, seed=v)
        recs.append(record(paths, f"What happens in clip {v}?"))
    return recs


def file_records(seconds, nframes):
    sys.path.insert(0, HERE)
    import bench_video as bv

    os.makedirs(bv.CACHE, exist_ok=True)
    base = bv.make_video(os.path.join(bv.CACHE, "base-60s.mp4"), 60, 640, 360, 30)
    path = base if seconds <= 60 else bv.remux(base, os.path.join(bv.CACHE, "long-600s.mp4"), 10)
    rec = file_records_line(path, nframes)
    rec["messages"][0]["content"].append({"type": "text", "text": "What happens?"})
    return [rec]


def write_shard(recs, n, name):
    path = os.path.join(CACHE, name + ".jsonl")
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps(recs[i % len(recs)]) + "\n")
    return path


# ---- the qwen-vl-utils + transformers side (a subprocess with the torchvision shim) ----


def peer_main(req):
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("FORCE_QWENVL_VIDEO_READER", "decord")
    from qwen_vl_utils import process_vision_info
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from video_reference import _processor  # the checkpoint processors the tests compare with

    tp = req["tokenizer"]
    tok = (
        AutoTokenizer.from_pretrained(tp)
        if os.path.isdir(tp)
        else PreTrainedTokenizerFast(
            tokenizer_file=tp, eos_token="<|im_end|>", pad_token="<|endoftext|>"
        )
    )
    proc, patch = _processor(req["preset"], tok)
    recs = [json.loads(line) for line in open(req["shard"])]

    def one(rec):
        msgs = rec["messages"]
        text = chat_text(rec, req["preset"])
        images, videos, kw = process_vision_info(
            msgs, return_video_kwargs=True, return_video_metadata=True, image_patch_size=patch
        )
        vids, metas = (list(x) for x in zip(*videos))
        return proc(
            text=[text],
            images=images,
            videos=vids,
            video_metadata=metas,
            return_tensors="pt",
            **{"do_sample_frames": False, **kw},
        )

    first = one(recs[0])
    np.savez(
        req["out"],
        pixel_values_videos=first["pixel_values_videos"].numpy(),
        video_grid_thw=first["video_grid_thw"].numpy(),
    )
    times = []
    for _ in range(req["runs"]):
        w0, c0 = time.perf_counter(), time.process_time()
        for r in recs:
            one(r)
        times.append((time.perf_counter() - w0, time.process_time() - c0))
    return {"times": times, "n": len(recs)}


def run_peer(shard, preset, runs, out):
    env = dict(os.environ, PYTHONPATH=SHIM + os.pathsep + ROOT, OMP_NUM_THREADS="1")
    req = dict(shard=shard, preset=preset, runs=runs, out=out, tokenizer=tokenizer_path())
    p = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--peer"],
        input=json.dumps(req),
        capture_output=True,
        text=True,
        env=env,
    )
    if p.returncode:
        raise RuntimeError(f"the qwen-vl-utils side failed:\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---- the mmloader side -------------------------------------------------------------------


def loader(shard, preset, **kw):
    import mmloader

    return mmloader.Loader(
        shard,
        preset=preset,
        tokenizer=tokenizer_path(),
        micro_batch_size=1,
        num_threads=1,
        shuffle=False,
        prefetch=2,
        on_error="raise",
        **kw,
    )


def mmloader_first(shard, preset):
    with loader(shard, preset) as L:
        b = next(iter(L))
        return {
            k: np.array(b[k].numpy(), copy=True) for k in ("pixel_values_videos", "video_grid_thw")
        }


def run_mmloader(shard, shard2, preset, n):
    """(wall, CPU) of n samples without the fixed costs (tokenizer load, threads, scan),
    which the peer's timing leaves out too: a loader over the 2n-sample shard2 minus one
    over the n-sample shard, each from construction to close."""

    def once(path, want):
        w0, c0 = time.perf_counter(), time.process_time()
        got = 0
        with loader(path, preset) as L:
            for b in L:
                got += int(b["video_grid_thw"].numpy().shape[0])
        assert got == want, (got, want)
        return time.perf_counter() - w0, time.process_time() - c0

    a, b = once(shard, n), once(shard2, 2 * n)
    # CPU: the difference; wall: the whole 2n-sample run per sample (a difference of wall
    # times on a shared machine is noise), so mmloader's wall figure includes construction
    return b[0] / 2, b[1] - a[1]


def decode_only(path, nframes, runs):
    """CPU seconds per video of decoding just the kept frames (qwen-vl-utils' indices for
    ``nframes``) to RGB, median of ``runs``: mmloader's decoder (keyframe seeks, frames
    nobody references skipped) and decord's get_batch as qwen-vl-utils calls it, plus
    how many packets mmloader's decoder took in and frames it put out for them."""
    from mmloader import _core

    info = _core.video_probe(path)
    line = json.dumps(file_records_line(path, nframes))
    idx = _core.video_sample(line, info["nframes"], info["fps"])["indices"]

    def cpu(fn):
        ts = []
        for _ in range(runs):
            c0 = time.process_time()
            fn()
            ts.append(time.process_time() - c0)
        return statistics.median(ts)

    out = {"kept": len(idx), "frames": info["nframes"]}

    def ours():
        r = _core.video_decode(path, idx)
        out.update(decoded=r["frames_decoded"], sent=r["packets_sent"])

    out["mmloader"] = cpu(ours)
    try:
        import decord

        out["decord"] = cpu(lambda: decord.VideoReader(path).get_batch(idx).asnumpy())
    except ImportError:
        out["decord"] = None
    return out


def file_records_line(path, nframes):
    return {
        "messages": [
            {"role": "user", "content": [{"type": "video", "video": path, "nframes": nframes}]},
            {"role": "assistant", "content": ANSWER},
        ]
    }


def same_work(a, b):
    """'equal' when the first sample's tensors agree bit for bit, else the largest
    difference; None when the grids differ (not the same work)."""
    if not np.array_equal(a["video_grid_thw"], b["video_grid_thw"]):
        return None
    x, y = a["pixel_values_videos"], b["pixel_values_videos"]
    if x.shape == y.shape and np.array_equal(x.view(np.int32), y.view(np.int32)):
        return "bit-identical"
    return f"max |diff| {float(np.abs(x.astype(np.float64) - y).max()):.3g}"


# ---- the run -----------------------------------------------------------------------------


def bench(name, recs, args):
    shard = write_shard(recs, args.samples, name)
    note = None
    try:
        mine = mmloader_first(shard, args.preset)
    except Exception as e:  # noqa: BLE001 - reported: this mmloader cannot load these inputs
        return {"name": name, "skipped": f"mmloader: {str(e).splitlines()[0][:200]}"}
    ref = os.path.join(CACHE, name + "-peer.npz")
    peer = run_peer(shard, args.preset, args.runs, ref)
    check = same_work(mine, dict(np.load(ref)))
    if check is None:
        return {"name": name, "skipped": "video_grid_thw differs from the processor's"}
    shard2 = write_shard(recs, 2 * args.samples, name + "-x2")
    ours = [run_mmloader(shard, shard2, args.preset, args.samples) for _ in range(args.runs)]
    n = args.samples

    def med(ts, i):
        return statistics.median(t[i] for t in ts) / n

    row = {
        "name": name,
        "samples": n,
        "grid": mine["video_grid_thw"][0].tolist(),
        "same_work": check,
        "mmloader": {"wall_s": med(ours, 0), "cpu_s": med(ours, 1)},
        "qwen-vl-utils": {"wall_s": med(peer["times"], 0), "cpu_s": med(peer["times"], 1)},
        "note": note,
    }
    row["cpu_ratio"] = row["qwen-vl-utils"]["cpu_s"] / row["mmloader"]["cpu_s"]
    row["wall_ratio"] = row["qwen-vl-utils"]["wall_s"] / row["mmloader"]["wall_s"]
    video = recs[0]["messages"][0]["content"][0]
    if isinstance(video["video"], str):  # a file: what decoding alone costs
        row["decode_only"] = decode_only(video["video"], video["nframes"], args.runs)
    return row


def report(rows, args, started, load):
    out = [
        f"{args.preset}, {args.samples} samples per round, median of {args.runs} rounds; "
        f"tokenizer {os.path.basename(tokenizer_path())}; load average {load}",
        "",
        "| input | grid (t,h,w) | same work | pipeline | wall s/video | CPU s/video | "
        "videos/s | CPU ratio (per core) | wall ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    skipped = []
    for r in rows:
        if "skipped" in r:
            skipped.append(f"{r['name']}: {r['skipped']}")
            continue
        for side in ("mmloader", "qwen-vl-utils"):
            s = r[side]
            ratio = "1.0x" if side == "mmloader" else f"{r['cpu_ratio']:.1f}x"
            wr = "1.0x" if side == "mmloader" else f"{r['wall_ratio']:.1f}x"
            out.append(
                f"| {r['name']} | {tuple(r['grid'])} | {r['same_work']} | {side} | "
                f"{s['wall_s']:.4f} | {s['cpu_s']:.4f} | {1 / s['wall_s']:.1f} | {ratio} | {wr} |"
            )
    dec = [r for r in rows if "decode_only" in r]
    if dec:
        out += [
            "",
            "Decoding alone (the same kept frames to RGB, no resize; median CPU s/video):",
            "",
            "| input | frames kept / in the file | packets into / frames out of mmloader's "
            "decoder | mmloader decode | decord decode | decord / mmloader | "
            "mmloader decode / e2e |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in dec:
            d = r["decode_only"]
            dr = f"{d['decord']:.4f}" if d["decord"] else "-"
            ratio = f"{d['decord'] / d['mmloader']:.1f}x" if d["decord"] else "-"
            out.append(
                f"| {r['name']} | {d['kept']} / {d['frames']} | {d['sent']} / {d['decoded']} | "
                f"{d['mmloader']:.4f} | {dr} | {ratio} | "
                f"{d['mmloader'] / r['mmloader']['cpu_s']:.0%} |"
            )
    by = {r["name"]: r for r in rows if "skipped" not in r}
    if "mp4-1min" in by and "mp4-10min" in by:
        a, b = by["mp4-1min"], by["mp4-10min"]
        out += [
            "",
            f"10-minute vs 1-minute video at the same nframes ({args.nframes}), CPU per video: "
            f"mmloader {b['mmloader']['cpu_s'] / a['mmloader']['cpu_s']:.2f}x, "
            f"qwen-vl-utils {b['qwen-vl-utils']['cpu_s'] / a['qwen-vl-utils']['cpu_s']:.2f}x.",
        ]
    if skipped:
        out += ["", "skipped: " + "; ".join(skipped)]
    out.append(f"\n(run {started} - {time.strftime('%H:%M UTC', time.gmtime())})")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--preset", default="qwen2.5-vl", choices=["qwen2.5-vl", "qwen3-vl"])
    ap.add_argument("--nframes", type=int, default=16, help="frames kept of a video file")
    ap.add_argument("--inputs", default="frames,mp4-1min,mp4-10min")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--md", help="write the markdown table here")
    args = ap.parse_args()
    if args.peer:
        print(json.dumps(peer_main(json.loads(sys.stdin.read()))))
        return
    os.makedirs(CACHE, exist_ok=True)
    started = time.strftime("%H:%M UTC", time.gmtime())
    makers = {
        "frames-16x640x360": lambda: frame_list_records(4, 16, 640, 360),
        "frames-16x320x240": lambda: frame_list_records(4, 16, 320, 240),
        "mp4-1min": lambda: file_records(60, args.nframes),
        "mp4-10min": lambda: file_records(600, args.nframes),
    }
    wanted = args.inputs.split(",")
    if "frames" in wanted:
        i = wanted.index("frames")
        wanted[i : i + 1] = ["frames-16x640x360", "frames-16x320x240"]
    rows = []
    for name in wanted:
        rows.append(bench(name, makers[name](), args))
        print(json.dumps(rows[-1]), flush=True)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    text = report(rows, args, started, load)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
