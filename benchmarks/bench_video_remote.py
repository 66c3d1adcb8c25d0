"""Remote video files behind a slow server: videos per second of mmloader's Loader when
every video is an http:// mp4 served with a fixed first-byte latency (30 and 50 ms by
default), this checkout against a baseline checkout (another build of mmloader, e.g. main
before a change) in ONE run, A/B interleaved, medians.

What it measures: a Loader over a JSONL shard of chat records each naming one remote
video (``nframes`` kept frames), ``micro_batch_size=1``, ``num_threads`` workers, float32
``pixel_values_videos``; wall seconds from construction to the last batch, per video.  The
server is tests/servers/faultserver.py (ranged GETs, the latency added to every request),
in this process; each measurement runs in its own subprocess with PYTHONPATH set to the
checkout measured.  Same work: the digest of every batch's pixel_values_videos and
input_ids must be equal on both sides (else no ratio is reported).  Also reported: the
GETs per video, and the loader's video_plan_waits / video_decode_waits (times a worker
waited on the network opening / decoding a video; absent in builds without them).

Input: an H.264 mp4 (640x360, 30 fps, moov first; the tests' moving pattern) of --seconds
(20) with a keyframe every --gop (30) frames, made once into ~/.cache/mmloader/bench-video/
(--container mkv: the same stream in Matroska, no per-frame index; or --video FILE, e.g.
bench_video.py's base-60s.mp4).  The served objects are named with the file's extension.

    python3 benchmarks/bench_video_remote.py --baseline /path/to/other/checkout
    python3 benchmarks/bench_video_remote.py --latency 0.03 0.05 --runs 3 --samples 16 --md out.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "servers"))

from faultserver import FaultServer  # noqa: E402

TINY = os.path.join(ROOT, "mmloader", "data", "tiny-tokenizer.json")
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "mmloader", "bench-video")

CHILD = r"""
import hashlib, json, sys, time
import numpy as np
import mmloader
a = json.loads(sys.argv[1])
t0 = time.perf_counter()
c0 = time.process_time()
h = hashlib.sha256()
n = 0
with mmloader.Loader(a["shard"], **a["kw"]) as L:
    for b in L:
        for k in ("input_ids", "pixel_values_videos"):
            h.update(np.ascontiguousarray(b[k].numpy()).tobytes())
        n += 1
    st = L.stats()
wall = time.perf_counter() - t0
keys = ("video_plan_waits", "video_decode_waits", "skipped")
print(json.dumps({"wall": wall, "cpu": time.process_time() - c0, "n": n,
                  "digest": h.hexdigest(), **{k: st.get(k) for k in keys}}))
"""


def video_file(args):
    if args.video:
        return args.video
    ext = args.container
    path = os.path.join(CACHE, f"remote-{args.seconds}s-gop{args.gop}.{ext}")
    if not os.path.exists(path):
        sys.path.insert(0, ROOT)
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from test_video import make_video  # the tests' moving pattern, PyAV's libx264

        os.makedirs(CACHE, exist_ok=True)
        make_video(
            path + f".tmp.{ext}",
            "libx264",
            n=30 * args.seconds,
            w=640,
            h=360,
            fps=30,
            gop=args.gop,
            container_options={"movflags": "faststart"} if ext == "mp4" else None,
        )
        os.replace(path + f".tmp.{ext}", path)
    return path


def shard(folder, urls, nframes):
    path = os.path.join(folder, "remote.jsonl")
    with open(path, "w") as f:
        for i, u in enumerate(urls):
            rec = {
                "conversations": [
                    {"from": "human", "value": f"<video>What happens in clip {i}?"},
                    {"from": "gpt", "value": "Nothing much."},
                ],
                "videos": [{"video": u, "nframes": nframes}],
            }
            f.write(json.dumps(rec) + "\n")
    return path


def measure(root, path, threads):
    kw = dict(
        preset="qwen2.5-vl",
        tokenizer=TINY,
        micro_batch_size=1,
        shuffle=False,
        num_threads=threads,
    )
    env = dict(os.environ, PYTHONPATH=root)
    arg = json.dumps({"shard": path, "kw": kw})
    out = subprocess.run(
        [sys.executable, "-c", CHILD, arg], env=env, capture_output=True, text=True, cwd=root
    )
    if out.returncode:
        raise SystemExit(f"{root}: measurement failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(args):
    vpath = video_file(args)
    ext = os.path.splitext(vpath)[1]
    data = open(vpath, "rb").read()
    sides = [("this", ROOT)] + (
        [("baseline", os.path.abspath(args.baseline))] if args.baseline else []
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for lat in args.latency:
            objs = {f"/v{k}{ext}": data for k in range(args.samples)}
            srv = FaultServer(objects=objs, latency=lat).start()
            try:
                path = shard(
                    tmp, [srv.url(f"/v{k}{ext}") for k in range(args.samples)], args.nframes
                )
                res = {name: [] for name, _ in sides}
                for r in range(args.runs):
                    order = sides if r % 2 == 0 else sides[::-1]  # A/B interleaved
                    for name, root in order:
                        g0 = sum(1 for e in srv.log if e[1] == "GET")
                        m = measure(root, path, args.threads)
                        m["gets"] = sum(1 for e in srv.log if e[1] == "GET") - g0
                        res[name].append(m)
            finally:
                srv.stop()
            rows.append((lat, res))
    return rows


def report(rows, args, load):
    lines = [
        f"Remote {args.container if not args.video else 'video'} behind a slow server "
        f"(bench_video_remote.py): {args.samples} videos "
        f"({args.video or f'{args.seconds} s, GOP {args.gop}, 640x360, 30 fps, H.264'}"
        f"{', moov first' if args.container == 'mp4' and not args.video else ''}) each as an "
        f"http:// URL, nframes="
        f"{args.nframes}, num_threads={args.threads}, medians of {args.runs} A/B-interleaved "
        f"runs; load average {load}.",
        "",
        "| latency | side | videos/s (min-max) | CPU s/video | GETs/video | plan waits/video "
        "| decode waits/video | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for lat, res in rows:
        digests = {m["digest"] for ms in res.values() for m in ms}
        vps = {k: statistics.median(m["n"] / m["wall"] for m in ms) for k, ms in res.items()}
        for name, ms in res.items():
            n = ms[0]["n"] or 1

            def per(key, ms=ms, n=n):
                v = [m.get(key) for m in ms]
                return "-" if None in v else f"{statistics.median(v) / n:.1f}"

            ratio = (
                f"{vps['this'] / vps['baseline']:.2f}x"
                if name == "this" and "baseline" in vps and len(digests) == 1
                else ""
            )
            cpu = statistics.median(m["cpu"] for m in ms) / n
            each = [m["n"] / m["wall"] for m in ms]
            lines.append(
                f"| {lat * 1000:.0f} ms | {name} | {vps[name]:.2f} ({min(each):.2f}-{max(each):.2f}) "
                f"| {cpu:.3f} | {per('gets')} "
                f"| {per('video_plan_waits')} | {per('video_decode_waits')} | {ratio} |"
            )
        if len(digests) != 1:
            lines.append(f"| {lat * 1000:.0f} ms | DIFFERENT BATCHES | | | | | | |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", help="another mmloader checkout, built in place")
    ap.add_argument("--latency", type=float, nargs="+", default=[0.03, 0.05])
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--nframes", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--gop", type=int, default=30)
    ap.add_argument("--container", choices=["mp4", "mkv"], default="mp4", help="generated file's")
    ap.add_argument("--video", help="a video file to serve instead of the generated one")
    ap.add_argument("--md", help="also write the table here")
    args = ap.parse_args()
    t0 = time.time()
    rows = run(args)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    text = report(rows, args, load)
    text += f"\n\n({time.strftime('%H:%M', time.gmtime(t0))}-{time.strftime('%H:%M UTC', time.gmtime())})"
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
