"""End-to-end video samples: mmloader's Loader against the qwen-vl-utils path on the same
records and files, in one run: videos per second and CPU seconds per video (all threads of
the process: "per core").

The work per sample is the same on both sides: a chat record naming one video ->
``input_ids`` + ``pixel_values_videos`` + ``video_grid_thw`` (+ ``second_per_grid_ts``,
Qwen2.5-VL) as the model takes them.
  qwen-vl-utils  ``process_vision_info(messages, return_video_kwargs=True,
                 return_video_metadata=True)`` + transformers' processor
                 (``Qwen2_5_VLProcessor`` / ``Qwen3VLProcessor`` with its video processor,
                 ``do_sample_frames=False``) on the chat template's text, one sample at a
                 time, torch on one thread, in a long-lived subprocess per video backend
                 (FORCE_QWENVL_VIDEO_READER; each reply checked to come from that backend):
                   decord       its default when decord is installed: VideoReader +
                                get_batch of the kept frames.
                   torchvision  its fallback: torchvision.io.read_video (PyAV backend),
                                which decodes and holds EVERY frame of the video, then
                                indexes.  PyPI's torchvision breaks beside the CPU torch
                                here, so read_video is the shim's reproduction of
                                torchvision 0.21-0.25's (tests/tvshim/torchvision/io.py,
                                call for call; the tests check it against mmloader).
                   torchvision LOWER BOUND  read_video's decode and to_rgb() of every
                                frame without holding them (read_video_lower_bound): run
                                beside the real one where that fits, and alone where
                                read_video's frames would not fit in half the free memory
                                (the 10-minute video: ~30 GiB) -- a lower bound of its
                                cost, so the ratio against it is a lower bound too.
                   torchcodec   not installable beside the CPU torch here (PyPI's wheel
                                needs CUDA's libnvrtc): not a peer.
                 Frame lists are read by fetch_image (PIL) whatever the backend: one peer.
                 transformers' video processor calls torchvision's resize / normalize on
                 tensors: tests/tvshim reproduces those with torch.nn.functional.interpolate
                 and the same tensor ops torchvision runs (see its docstring), on the
                 subprocess's PYTHONPATH.
  mmloader       ``mmloader.Loader`` over a JSONL shard of the SAME messages records,
                 ``micro_batch_size=1``, ``num_threads=1``, float32 ``pixel_values_videos``
                 (the processor's dtype).  CPU: fixed costs are left out on both sides (the
                 peer times its loop after building the processor; mmloader's is a loader
                 over 2n samples minus one over n, each from construction to close; n is
                 --mm-frame-samples on frame lists, where a sample costs a few ms); wall:
                 mmloader's whole 2n-sample run (construction included) per sample.
Same work: the first sample's ``pixel_values_videos`` and ``video_grid_thw`` of every peer
(saved from its first round, outside the timing) are compared with mmloader's (bit for
bit, else the largest difference is reported) and the run refuses to report ratios when
the grids differ.  Rounds are interleaved (every pipeline once per round, the order
rotated), medians of --runs rounds with their min-max; the torchvision backend times
--tv-samples videos a round (it costs seconds to a minute each).

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
(with a python that has decord, e.g. the peers' venv)
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

# What read_video holds per frame of the range: the decoded yuv420p frame (1.5 B/pixel, in
# its pts dict), its RGB array (3) and np.stack's copy (3).
HELD_BYTES_PER_PIXEL = 7.5


def mem_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def read_video_lower_bound(ele):
    """qwen-vl-utils' _read_video_torchvision with read_video's work but not its memory:
    every frame decoded by PyAV and converted with to_rgb().to_ndarray() as read_video
    does, but only the frames qwen-vl-utils then indexes are held (the count and fps read
    from the container first, checked against the frames decoded).  A LOWER BOUND of the
    real backend's cost: no pts dict of every frame, no np.stack of them, none of their
    page faults."""
    import av
    import torch
    from qwen_vl_utils import vision_process as q

    with av.open(ele["video"], metadata_errors="ignore") as c:
        s = c.streams.video[0]
        total, fps = s.frames, float(s.average_rate)
        n = q.smart_nframes(ele, total_frames=total, video_fps=fps)
        idx = torch.linspace(0, total - 1, n).round().long()
        want, kept, count = set(idx.tolist()), {}, 0
        for frame in c.decode(video=0):
            if frame.pts is not None and frame.pts < 0:
                continue  # read_video keeps start_pts (0) <= pts
            rgb = frame.to_rgb().to_ndarray()
            if count in want:
                kept[count] = rgb
            count += 1
    if count != total:
        raise RuntimeError(f"{ele['video']}: {count} frames decoded, the container says {total}")
    video = torch.as_tensor(np.stack([kept[i] for i in idx.tolist()])).permute(0, 3, 1, 2)
    meta = dict(fps=fps, frames_indices=idx, total_num_frames=total, video_backend="torchvision")
    return video, meta, n / max(total, 1e-6) * fps


def peer_main():
    """A long-lived peer: one JSON request per stdin line, one JSON reply per stdout line.
    {"op": "time", "shard", "limit", "lower_bound", "out"}: one timed pass over the first
    `limit` records (the first sample's tensors saved to `out` when given, outside the
    timing)."""
    import torch

    torch.set_num_threads(1)
    cfg = json.loads(sys.stdin.readline())
    os.environ["FORCE_QWENVL_VIDEO_READER"] = cfg["backend"]  # read at import
    from qwen_vl_utils import process_vision_info
    from qwen_vl_utils import vision_process as q
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from video_reference import _processor  # the checkpoint processors the tests compare with

    real_torchvision = q.VIDEO_READER_BACKENDS["torchvision"]
    tp = cfg["tokenizer"]
    tok = (
        AutoTokenizer.from_pretrained(tp)
        if os.path.isdir(tp)
        else PreTrainedTokenizerFast(
            tokenizer_file=tp, eos_token="<|im_end|>", pad_token="<|endoftext|>"
        )
    )
    proc, patch = _processor(cfg["preset"], tok)

    def one(rec):
        msgs = rec["messages"]
        text = chat_text(rec, cfg["preset"])
        images, videos, kw = process_vision_info(
            msgs, return_video_kwargs=True, return_video_metadata=True, image_patch_size=patch
        )
        vids, metas = (list(x) for x in zip(*videos))
        for m in metas:  # the backend that actually read it (qwen-vl-utils falls back silently)
            if isinstance(rec["messages"][0]["content"][0]["video"], str):
                assert m["video_backend"] == cfg["backend"], m["video_backend"]
        return proc(
            text=[text],
            images=images,
            videos=vids,
            video_metadata=metas,
            return_tensors="pt",
            **{"do_sample_frames": False, **kw},
        )

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        q.VIDEO_READER_BACKENDS["torchvision"] = (
            read_video_lower_bound if req.get("lower_bound") else real_torchvision
        )
        recs = [json.loads(x) for x in open(req["shard"])][: req["limit"]]
        outs = []
        w0, c0 = time.perf_counter(), time.process_time()
        for r in recs:
            o = one(r)
            if req.get("out") and not outs:
                outs.append(o)
            del o
        t = (time.perf_counter() - w0, time.process_time() - c0)
        if outs:
            np.savez(
                req["out"],
                pixel_values_videos=outs[0]["pixel_values_videos"].numpy(),
                video_grid_thw=outs[0]["video_grid_thw"].numpy(),
            )
        print(json.dumps({"time": t, "n": len(recs)}), flush=True)


class Peer:
    """qwen-vl-utils + the processor in a subprocess (tests/tvshim on its PYTHONPATH), with
    the given video reader backend; built once, timed per request."""

    def __init__(self, backend, preset):
        env = dict(os.environ, PYTHONPATH=SHIM + os.pathsep + ROOT, OMP_NUM_THREADS="1")
        self.backend = backend
        self.p = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--peer"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._send(dict(backend=backend, preset=preset, tokenizer=tokenizer_path()))

    def _send(self, req):
        self.p.stdin.write(json.dumps(req) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"the qwen-vl-utils side ({self.backend}) failed (see stderr)")
        return json.loads(line)

    def time(self, shard, limit, lower_bound=False, out=None):
        r = self._send(dict(op="time", shard=shard, limit=limit, lower_bound=lower_bound, out=out))
        return r["time"], r["n"]

    def close(self):
        self.p.stdin.close()
        self.p.wait()


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


def bench(name, recs, args, peers):
    shard = write_shard(recs, args.samples, name)
    try:
        mine = mmloader_first(shard, args.preset)
    except Exception as e:  # noqa: BLE001 - reported: this mmloader cannot load these inputs
        return {"name": name, "skipped": f"mmloader: {str(e).splitlines()[0][:200]}"}
    video = recs[0]["messages"][0]["content"][0]
    is_file = isinstance(video["video"], str)
    # frame lists are read by fetch_image (PIL) whatever the video backend: one peer
    sides = ["decord"]
    limit = {"decord": args.samples, "torchvision": min(args.samples, args.tv_samples)}
    lower = False
    if is_file:
        from mmloader import _core

        info = _core.video_probe(video["video"])
        held = info["nframes"] * info["width"] * info["height"] * HELD_BYTES_PER_PIXEL
        avail = mem_available()
        lower = avail is not None and held > avail / 2
        # where read_video's frames fit, it runs for real AND as the lower bound (what the
        # lower bound leaves out, measured); else only as the lower bound, one video a round
        sides += ["torchvision-lb"] if lower else ["torchvision", "torchvision-lb"]
        limit["torchvision-lb"] = 1 if lower else limit["torchvision"]
    n = args.samples
    # mmloader's CPU is a difference of a 2m- and an m-sample run: for frame lists (a few
    # ms a sample beside ~0.1 s of fixed costs) m must be large for it to beat the noise
    m = n if is_file else max(n, args.mm_frame_samples)
    shard_m = shard if m == n else write_shard(recs, m, name + f"-{m}")
    shard2 = write_shard(recs, 2 * m, name + f"-x2-{m}")
    ours, theirs = [], {s: [] for s in sides}
    refs = {s: os.path.join(CACHE, f"{name}-{s}-peer.npz") for s in sides}
    for r in range(args.runs):  # interleaved: every pipeline once per round, order rotated
        order = ["mmloader"] + sides
        order = order[r % len(order) :] + order[: r % len(order)]
        for side in order:
            if side == "mmloader":
                w, c = run_mmloader(shard_m, shard2, args.preset, m)
                ours.append((w / m, c / m))
                continue
            t, k = peers[side.removesuffix("-lb")].time(
                shard,
                limit[side],
                lower_bound=side.endswith("-lb"),
                out=refs[side] if r == 0 else None,
            )
            theirs[side].append((t[0] / k, t[1] / k))
    checks = {s: same_work(mine, dict(np.load(refs[s]))) for s in sides}
    if any(c is None for c in checks.values()):
        bad = [s for s, c in checks.items() if c is None]
        return {"name": name, "skipped": f"video_grid_thw differs from the processor's ({bad})"}

    def med(ts, i):
        return statistics.median(t[i] for t in ts)

    row = {
        "name": name,
        "samples": n,
        "grid": mine["video_grid_thw"][0].tolist(),
        "sides": {
            "mmloader": {
                "wall_s": med(ours, 0),
                "cpu_s": med(ours, 1),
                "cpu_min": min(t[1] for t in ours),
                "cpu_max": max(t[1] for t in ours),
                "samples": m,
                "same_work": "-",
            }
        },
    }
    for s in sides:
        label = "qwen-vl-utils " + (s.removesuffix("-lb") if is_file else "(frame list)")
        if s.endswith("-lb"):
            label += " LOWER BOUND"
        row["sides"][label] = {
            "wall_s": med(theirs[s], 0),
            "cpu_s": med(theirs[s], 1),
            "cpu_min": min(t[1] for t in theirs[s]),
            "cpu_max": max(t[1] for t in theirs[s]),
            "samples": limit[s],
            "same_work": checks[s],
            "backend": s,
        }
    if lower:
        row["lower_bound_note"] = (
            f"read_video would hold ~{held / 2**30:.1f} GiB for this video ({info['nframes']} "
            f"frames; MemAvailable {avail / 2**30:.1f} GiB): only its lower bound runs"
        )
    mm = row["sides"]["mmloader"]
    for v in row["sides"].values():
        v["cpu_ratio"] = v["cpu_s"] / mm["cpu_s"]
        v["wall_ratio"] = v["wall_s"] / mm["wall_s"]
    if is_file:  # a file: what decoding alone costs
        row["decode_only"] = decode_only(video["video"], video["nframes"], args.runs)
    return row


def report(rows, args, started, load):
    out = [
        f"{args.preset}, {args.samples} samples per round for mmloader and decord "
        f"(mmloader on frame lists: {max(args.samples, args.mm_frame_samples)}) "
        f"({args.tv_samples} for the torchvision backend; its LOWER BOUND: read_video's decode "
        "and RGB conversion of every frame without holding them, 1 where the real one does not "
        "fit in memory), "
        f"median of {args.runs} interleaved rounds; tokenizer "
        f"{os.path.basename(tokenizer_path())}; load average at the end {load}",
        "",
        "| input | grid (t,h,w) | pipeline | same work (1st sample vs mmloader) | videos/round | "
        "wall s/video | CPU s/video (min-max) | CPU ratio (per core) | wall ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    skipped, notes = [], []
    for r in rows:
        if "skipped" in r:
            skipped.append(f"{r['name']}: {r['skipped']}")
            continue
        for side, s in r["sides"].items():
            out.append(
                f"| {r['name']} | {tuple(r['grid'])} | {side} | {s['same_work']} | "
                f"{s['samples']} | {s['wall_s']:.4f} | {s['cpu_s']:.4f} "
                f"({s['cpu_min']:.4f}-{s['cpu_max']:.4f}) | {s['cpu_ratio']:.1f}x | "
                f"{s['wall_ratio']:.1f}x |"
            )
        if "lower_bound_note" in r:
            notes.append(f"{r['name']}: {r['lower_bound_note']}")
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
                f"{d['mmloader'] / r['sides']['mmloader']['cpu_s']:.0%} |"
            )
    by = {r["name"]: r for r in rows if "skipped" not in r}
    if "mp4-1min" in by and "mp4-10min" in by:
        a, b = by["mp4-1min"]["sides"], by["mp4-10min"]["sides"]
        parts = []
        for side in b:
            base = side.replace(" LOWER BOUND", "")
            src = a.get(side) or a.get(base)
            if src:
                parts.append(f"{side} {b[side]['cpu_s'] / src['cpu_s']:.2f}x")
        out += [
            "",
            f"10-minute vs 1-minute video at the same nframes ({args.nframes}), CPU per video: "
            + ", ".join(parts)
            + ".",
        ]
    if notes:
        out += [""] + [f"lower bound: {n}" for n in notes]
    if skipped:
        out += ["", "skipped: " + "; ".join(skipped)]
    out.append(f"\n(run {started} - {time.strftime('%H:%M UTC', time.gmtime())})")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument(
        "--mm-frame-samples",
        type=int,
        default=96,
        help="mmloader's samples a round on frame lists (its CPU is a 2m - m difference)",
    )
    ap.add_argument(
        "--tv-samples",
        type=int,
        default=2,
        help="videos per round for the torchvision backend (it decodes every frame)",
    )
    ap.add_argument("--preset", default="qwen2.5-vl", choices=["qwen2.5-vl", "qwen3-vl"])
    ap.add_argument("--nframes", type=int, default=16, help="frames kept of a video file")
    ap.add_argument("--inputs", default="frames,mp4-1min,mp4-10min")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--md", help="write the markdown table here")
    args = ap.parse_args()
    if args.peer:
        peer_main()
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
    peers = {b: Peer(b, args.preset) for b in ("decord", "torchvision")}
    rows = []
    try:
        for name in wanted:
            rows.append(bench(name, makers[name](), args, peers))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        for p in peers.values():
            p.close()
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
