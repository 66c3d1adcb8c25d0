"""Video decode: mmloader's core decoder (csrc/core/video/video.c) against the qwen-vl-utils
reading paths, on the same files, in one run, the same frame indices.

What each pipeline does for one video (qwen-vl-utils 0.0.14 semantics: `nframes` frames
at torch.linspace(0, total - 1, nframes).round(), RGB24 uint8 out):
  mmloader      _core.video_decode: probe + keyframe seeks, only the kept frames converted
                (one thread).  DECODE ONLY: the per-frame resize of the video path is issue
                17's other half and is not in these figures.
  decord        qwen-vl-utils' default backend when decord is installed:
                VideoReader(path).get_batch(idx).asnumpy() (decord's own thread pool).
  pyav-all      what qwen-vl-utils' torchvision backend costs (torchvision.io.read_video
                with PyAV decodes and converts every frame, then indexes): PyAV's decode of
                the whole stream, to_ndarray(rgb24) of every frame (only the kept ones are
                held: read_video holds them all, 12 GB for the 10-min video here).
  pyav-seek     a careful PyAV reader: seek to the keyframe before each kept frame, decode
                forward, convert only the kept frames.
torchcodec cannot run here (PyPI's 0.17 wheel needs CUDA's libnvrtc beside CPU torch), and
the HF video processor cannot be imported without torchvision (which breaks beside CPU
torch), so neither is a peer; both are reported as skipped.

The videos: x264 veryfast (B-frames, keyint 250 as x264's default) of a moving pattern
with grain, 640x360 at 30 fps; the longer videos repeat the first one's packets back to
back (stream copy: the same GOP structure, minutes of encoding saved).

Each pipeline's frames are checked equal to mmloader's before timing (PyAV: bit-exact;
decord bundles its own FFmpeg and is compared the same way).  Timing: wall seconds and
process CPU seconds (all threads) per video, median of --runs rounds, the pipelines
interleaved in each round.  Ratios are per CPU second ("per core") and per wall second.

    python3 benchmarks/bench_video.py                # 1-min and 10-min 640x360 H.264, 16 frames
    python3 benchmarks/bench_video.py --runs 5 --nframes 32 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from mmloader import _core  # noqa: E402

import av  # noqa: E402

CACHE = os.path.join(os.path.expanduser("~"), ".cache", "mmloader", "bench-video")


def make_video(path, seconds, w, h, fps, container_options=None):
    """H.264 (x264 veryfast, keyint 250 as x264's default, B-frames) of a moving pattern."""
    if os.path.exists(path):
        return path
    tmp = path + ".part"
    c = av.open(
        tmp,
        "w",
        format="mp4" if path.endswith(".mp4") else "matroska",
        options=container_options or {},
    )
    s = c.add_stream("libx264", rate=fps)
    s.width, s.height, s.pix_fmt = w, h, "yuv420p"
    s.options = {"preset": "veryfast", "crf": "23"}
    y, x = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(0)
    grain = rng.integers(0, 24, (h, w, 3), np.uint8)
    for i in range(int(seconds * fps)):
        img = np.stack([(x + 3 * i) % 256, (y + 2 * i) % 256, ((x + y) // 2 + i) % 256], -1)
        img = img.astype(np.uint8) + np.roll(grain, i % 97, axis=1)
        for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
            c.mux(p)
    for p in s.encode():
        c.mux(p)
    c.close()
    os.replace(tmp, path)
    return path


def remux(src, dst, repeat=1):
    """src's packets `repeat` times over, back to back (stream copy: a long video with the
    same GOP structure for the cost of demuxing, not encoding): mp4 (moov first) or mkv."""
    if os.path.exists(dst):
        return dst
    mp4 = dst.endswith(".mp4")
    with (
        av.open(src) as i,
        av.open(
            dst + ".part",
            "w",
            format="mp4" if mp4 else "matroska",
            options={"movflags": "faststart"} if mp4 else {},
        ) as o,
    ):
        ist = i.streams.video[0]
        s = o.add_stream_from_template(ist)
        span = None
        for r in range(repeat):
            i.seek(0, stream=ist)
            last = 0
            for pkt in i.demux(ist):
                if pkt.dts is None:
                    continue
                if span is not None:
                    pkt.pts += r * span
                    pkt.dts += r * span
                last = max(last, pkt.pts + pkt.duration) if span is None else last
                pkt.stream = s
                o.mux(pkt)
            if span is None:
                span = last - (ist.start_time or 0)
    os.replace(dst + ".part", dst)
    return dst


def qwen_indices(total, nframes):
    """qwen-vl-utils smart_nframes with ele={"nframes": n} + its linspace/round rule."""
    n = max(2, int(round(nframes / 2)) * 2)
    n = min(n, total)
    return [int(v) for v in np.round(np.linspace(0, total - 1, n))]


# ---- pipelines: each returns the kept frames as a list of HxWx3 uint8 arrays --------------


def run_mmloader(path, nframes):
    info = _core.video_probe(path)
    idx = qwen_indices(info["nframes"], nframes)
    r = _core.video_decode(path, idx)
    return [
        np.frombuffer(b, np.uint8).reshape(h, w, 3) for b, (h, w) in zip(r["frames"], r["shapes"])
    ], r


def run_decord(path, nframes):
    import decord

    vr = decord.VideoReader(path)
    idx = qwen_indices(len(vr), nframes)
    return list(vr.get_batch(idx).asnumpy()), None


def run_pyav_all(path, nframes):
    """torchvision.io.read_video's work (decode and convert every frame), without its
    memory: it keeps every frame (10 min of 640x360 = 12 GB), this keeps the wanted ones."""
    with av.open(path) as c:
        s = c.streams.video[0]
        total = s.frames or sum(1 for _ in c.demux(s) if _.size)
        if not s.frames:
            c.seek(0, stream=s)
        keep, out = set(qwen_indices(total, nframes)), []
        for i, f in enumerate(c.decode(s)):
            a = f.to_ndarray(format="rgb24")
            if i in keep:
                out.append(a)
    return out, None


def run_pyav_seek(path, nframes):
    with av.open(path) as c:
        s = c.streams.video[0]
        total = s.frames or round(c.duration / 1e6 * float(s.average_rate))
        idx = qwen_indices(total, nframes)
        step = 1 / float(s.average_rate) / float(s.time_base)  # CFR: frame i at i * step
        start = s.start_time or 0
        out, it, last = [], None, None
        for i in idx:
            want = start + round(i * step)
            if it is None or last is None or want - last > 250 * step:  # past a keyframe interval
                c.seek(want, backward=True, any_frame=False, stream=s)
                it = c.decode(s)
            for f in it:
                last = f.pts
                if f.pts >= want:
                    out.append(f.to_ndarray(format="rgb24"))
                    break
        return out, None


PIPELINES = {
    "mmloader": run_mmloader,
    "decord": run_decord,
    "pyav-all": run_pyav_all,
    "pyav-seek": run_pyav_seek,
}


def available(name):
    if name == "decord":
        try:
            import decord  # noqa: F401
        except ImportError as e:
            return f"not installed ({e})"
    return None


def timed(fn, *a):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn(*a)
    return out, time.perf_counter() - w0, time.process_time() - c0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nframes", type=int, default=16)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--minutes", type=float, nargs="+", default=[1, 10])
    ap.add_argument("--size", default="640x360")
    ap.add_argument("--fps", type=int, default=30)
    ap.add_argument(
        "--slow-runs",
        type=int,
        default=1,
        help="rounds of pyav-all on the .mp4 of videos over 2 minutes (it decodes every frame)",
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None, help="also write the report (markdown) here")
    a = ap.parse_args()
    w, h = map(int, a.size.split("x"))
    os.makedirs(CACHE, exist_ok=True)
    videos = []
    for m in a.minutes:
        base = os.path.join(CACHE, f"h264-{w}x{h}-{a.fps}fps-{m:g}min")
        unit = os.path.join(CACHE, f"h264-{w}x{h}-{a.fps}fps-{a.minutes[0]:g}min")
        t0 = time.perf_counter()
        make_video(unit + ".mp4", a.minutes[0] * 60, w, h, a.fps, {"movflags": "faststart"})
        if m != a.minutes[0]:  # longer ones: the first one's packets repeated
            if m % a.minutes[0]:
                sys.exit("--minutes: each length must be a multiple of the first")
            remux(unit + ".mp4", base + ".mp4", int(m // a.minutes[0]))
        remux(base + ".mp4", base + ".mkv")
        if time.perf_counter() - t0 > 1:
            print(f"# made {base}.mp4/.mkv in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
        videos += [(f"{m:g} min .mp4", base + ".mp4"), (f"{m:g} min .mkv", base + ".mkv")]
    skipped = {n: why for n in PIPELINES if (why := available(n))}
    skipped["torchcodec"] = "PyPI's 0.17 wheel needs CUDA's libnvrtc.so.13 beside CPU torch"
    skipped["hf-video-processor"] = "transformers' Qwen2-VL video processor needs torchvision"
    names = [n for n in PIPELINES if n not in skipped]

    # correctness first: every pipeline returns mmloader's frames
    decoded = {}
    for label, p in videos:
        ref, r = run_mmloader(p, a.nframes)
        decoded[label] = r["frames_decoded"]
        for n in names[1:]:
            if n == "pyav-all" and float(label.split()[0]) > 2:
                continue  # slow; its frames are PyAV's own, checked on the short videos
            got, _ = PIPELINES[n](p, a.nframes)
            same = len(got) == len(ref) and all(np.array_equal(x, y) for x, y in zip(got, ref))
            if not same:
                diff = max(
                    (int(np.abs(x.astype(int) - y).max()) for x, y in zip(got, ref)), default=-1
                )
                print(
                    f"# {n} on {label}: {len(got)} frames, differing from mmloader's {len(ref)} "
                    f"(max |diff| {diff})",
                    file=sys.stderr,
                )

    res = {}
    for rnd in range(a.runs):
        for label, p in videos:
            for n in names:
                if (
                    n == "pyav-all"
                    and float(label.split()[0]) > 2
                    and (rnd >= a.slow_runs or not label.endswith(".mp4"))
                ):
                    continue  # every frame of a long video: --slow-runs rounds, mp4 only
                _, wall, cpu = timed(PIPELINES[n], p, a.nframes)
                res.setdefault((label, n), []).append((wall, cpu))

    rows, lines = [], []

    def out(line=""):
        print(line)
        lines.append(line)

    out(
        f"{a.nframes} frames per video (qwen-vl-utils nframes + linspace), {w}x{h} H.264 "
        f"{a.fps} fps, x264 veryfast keyint 250; median of {a.runs} rounds "
        f"(pyav-all on long videos: {a.slow_runs}); mmloader DECODE ONLY (no resize)"
    )
    out()
    out(
        "| video | pipeline | wall s/video | CPU s/video | videos/s | CPU vs mmloader | wall vs mmloader |"
    )
    out("|---|---|---|---|---|---|---|")
    for label, _ in videos:
        base = res[(label, "mmloader")]
        bw, bc = statistics.median(x[0] for x in base), statistics.median(x[1] for x in base)
        for n in names:
            if (label, n) not in res:
                continue
            v = res[(label, n)]
            mw, mc = statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)
            rows.append(
                dict(
                    video=label,
                    pipeline=n,
                    wall_s=mw,
                    cpu_s=mc,
                    runs=len(v),
                    wall_min=min(x[0] for x in v),
                    wall_max=max(x[0] for x in v),
                    cpu_ratio=mc / bc,
                    wall_ratio=mw / bw,
                )
            )
            out(
                f"| {label} | {n} | {mw:.4f} | {mc:.4f} | {1 / mw:.1f} | {mc / bc:.1f}x | {mw / bw:.1f}x |"
            )
    out()
    out(
        "frames decoded by mmloader (kept + the GOP lead-in before each): "
        + ", ".join(f"{k}: {v}" for k, v in decoded.items())
    )
    mm = {r["video"]: r["cpu_s"] for r in rows if r["pipeline"] == "mmloader"}
    if len(a.minutes) >= 2:
        for ext in ("mp4", "mkv"):
            s, l = mm.get(f"{a.minutes[0]:g} min .{ext}"), mm.get(f"{a.minutes[-1]:g} min .{ext}")
            if s and l:
                out(
                    f"mmloader .{ext}: {a.minutes[-1]:g}-min video costs {l / s:.2f}x the "
                    f"{a.minutes[0]:g}-min one at the same nframes (CPU)"
                )
    out("skipped: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    if a.md:
        with open(a.md, "w") as f:
            f.write("# Video decode (benchmarks/bench_video.py)\n\n" + "\n".join(lines) + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                dict(rows=rows, frames_decoded=decoded, skipped=skipped, args=vars(a)), f, indent=1
            )


if __name__ == "__main__":
    main()
