"""``python -m mmloader profile DATA``: where the time goes, and what to change.

Runs a Loader for N batches behind a progress bar (optionally with a simulated trainer
step per batch), takes ``Loader.stats()`` after every batch, then prints

* a per-stage breakdown — fetch/read, decode, resize/patchify, tokenize (worker threads),
  collate (the collation thread), consumer wait (the trainer blocked in ``next``);
* the wait-time ratio and throughput;
* the bottleneck it concludes — I/O latency, network bandwidth, CPU, or the consumer —
  with the evidence, and concrete suggestions (threads, requests in flight, window,
  prefetch);
* with ``--plot FILE.png``, a timeline of stage utilisation (needs matplotlib).

The logic lives in plain functions (``run``, ``breakdown``, ``diagnose``, ``report``,
``plot_timeline``) so it can be used on any Loader from Python as well.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, TextIO, Tuple, Union

from ._options import add_flags, flag, flag_kwargs

if TYPE_CHECKING:
    from types import EllipsisType

# Worker stages: stats() reports read_s, vision_s (decode + resize/normalise/patchify),
# decode_s (the decoder's part of vision_s, when the engine reports it) and tokenize_s.
WORKER_STAGES = (
    ("read_s", "fetch / read"),
    ("decode_s", "decode"),
    ("resize_s", "resize / patchify"),
    ("tokenize_s", "tokenize"),
)
BOTTLENECKS = ("I/O latency", "network bandwidth", "CPU", "consumer", "pipeline depth")

# The flags the suggestions name (the option table's spelling).
_F_THREADS, _F_INFLIGHT, _F_WINDOW, _F_PREFETCH = (
    flag(n) for n in ("num_threads", "max_inflight", "window", "prefetch")
)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@dataclass
class Point:
    """One observation, taken right after a batch was received."""

    t: float  # seconds since the run started
    cpu_s: float  # process CPU seconds (all threads) since the run started
    stats: Dict[str, Any]


@dataclass
class Profile:
    """What `run` observed."""

    batches: int
    samples: int
    wall_s: float  # first next() to the last batch
    cpu_s: float  # process CPU over the same span
    step_s: float  # simulated trainer step per batch
    cores: int
    consumer_wait_s: float  # measured here, around next()
    first_batch_s: float
    stats: Dict[str, Any]  # the loader's final stats()
    timeline: List[Point] = field(default_factory=list)
    remote: bool = False

    @property
    def wait_ratio(self) -> float:
        r = self.stats.get("wait_time_ratio")
        if r is None:
            r = self.consumer_wait_s / self.wall_s if self.wall_s > 0 else 0.0
        return float(r)


def _rows(batch: Dict[str, Any]) -> int:
    if "cu_seqlens" in batch:
        return int(batch["cu_seqlens"].shape[0]) - 1
    return int(batch["input_ids"].shape[0])


def _progress(out: Optional[TextIO], done: int, total: int, t: float, samples: int) -> None:
    if out is None:
        return
    width = 30
    fill = int(width * done / max(total, 1))
    rate = samples / t if t > 0 else 0.0
    out.write(
        f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{total} batches {rate:7.1f} samples/s"
    )
    if done == total:
        out.write("\n")
    out.flush()


def run(
    loader: Any,
    batches: int,
    step_s: float = 0.0,
    progress: Union[TextIO, None, EllipsisType] = ...,
) -> Profile:
    """Takes `batches` batches from `loader` (across epochs), sleeping `step_s` after each
    (a trainer step), and records stats() after every batch.  Progress goes to
    `progress` (default: sys.stderr at the time of the call; None: none)."""
    if progress is ...:
        progress = sys.stderr
    if batches < 1:
        raise ValueError("batches must be >= 1")
    it = iter(loader)
    t0 = time.perf_counter()
    c0 = time.process_time()
    points: List[Point] = []
    samples = done = 0
    waited = 0.0
    first = 0.0
    ends = 0
    while done < batches:
        t = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:  # epoch end: the next iteration runs the next epoch
            ends += 1
            if ends > 1 and done == 0:
                break  # empty data
            it = iter(loader)
            continue
        now = time.perf_counter()
        waited += now - t
        if done == 0:
            first = now - t0
        samples += _rows(batch)
        done += 1
        del batch
        points.append(Point(now - t0, time.process_time() - c0, dict(loader.stats())))
        _progress(progress, done, batches, now - t0, samples)
        if step_s > 0 and done < batches:
            time.sleep(step_s)
    wall = time.perf_counter() - t0
    st = dict(loader.stats())
    return Profile(
        batches=done,
        samples=samples,
        wall_s=wall,
        cpu_s=time.process_time() - c0,
        step_s=step_s,
        cores=_cores(),
        consumer_wait_s=waited,
        first_batch_s=first,
        stats=st,
        timeline=points,
        remote=bool(st.get("fetch")),
    )


def stage_seconds(st: Dict[str, Any]) -> Dict[str, float]:
    """Busy seconds per worker stage (keys of WORKER_STAGES; decode_s only when the
    engine splits it out of vision_s, else resize_s holds decode as well)."""
    out = {
        "read_s": float(st.get("read_s") or 0.0),
        "tokenize_s": float(st.get("tokenize_s") or 0.0),
    }
    vision = float(st.get("vision_s") or 0.0)
    if st.get("decode_s") is not None:
        out["decode_s"] = float(st["decode_s"])
        out["resize_s"] = max(0.0, vision - out["decode_s"])
    else:
        out["resize_s"] = vision
    return out


def breakdown(p: Profile) -> List[Tuple[str, float, float]]:
    """(stage, busy seconds, share) rows: worker stages as a share of worker-thread time
    (threads x wall), collate of the collation thread's time, consumer wait of wall."""
    st = p.stats
    wall = float(st.get("wall_s") or p.wall_s) or 1e-9
    threads = max(1, int(st.get("num_threads") or 1))
    rows = []
    stages = stage_seconds(st)
    for key, name in WORKER_STAGES:
        if key not in stages:
            continue
        label = name
        if key == "resize_s" and "decode_s" not in stages:
            label = "decode + resize / patchify"
        v = stages[key]
        rows.append((label, v, v / (threads * wall)))
    if st.get("fetch_wait_s") is not None:
        v = float(st["fetch_wait_s"])  # sample-seconds spent waiting on the network
        rows.append(("network wait (samples)", v, v / (threads * wall)))
    if "collate_s" in st:
        v = float(st["collate_s"])
        rows.append(("collate", v, v / wall))
    w = float(st.get("wait_s", p.consumer_wait_s))
    rows.append(("consumer wait", w, w / wall))
    return rows


def _compute_s(st: Dict[str, Any]) -> float:
    """Worker CPU work: every worker stage but the read/fetch wait."""
    return sum(v for k, v in stage_seconds(st).items() if k != "read_s")


def _avg_fetch_inflight(p: Profile) -> float:
    vals = [float((pt.stats.get("fetch") or {}).get("inflight", 0)) for pt in p.timeline]
    return sum(vals) / len(vals) if vals else 0.0


@dataclass
class Diagnosis:
    bottleneck: str
    evidence: List[str]
    suggestions: List[str]


def diagnose(p: Profile, max_inflight: Optional[int] = None) -> Diagnosis:
    """Names what limits throughput and what to change, from the figures of `p`."""
    st = p.stats
    wall = float(st.get("wall_s") or p.wall_s) or 1e-9
    threads = max(1, int(st.get("num_threads") or 1))
    cores = p.cores
    prefetch = int(st.get("prefetch") or 0)
    window = int(st.get("window") or 0)
    ratio = p.wait_ratio
    compute = _compute_s(st)
    read = float(st.get("read_s") or 0.0)
    collate = float(st.get("collate_s") or 0.0)
    cpu_util = p.cpu_s / (p.wall_s * cores) if p.wall_s > 0 else 0.0
    worker_util = compute / (threads * wall)
    samples = max(1, int(st.get("good_samples") or p.samples))
    # samples/s the workers could sustain with every usable core busy
    usable = min(threads, cores)
    capacity = samples / (compute / usable) if compute > 0 else float("inf")
    achieved = p.samples / p.wall_s if p.wall_s > 0 else 0.0
    ev = [
        f"wait-time ratio {100 * ratio:.1f}% (consumer blocked in next())",
        f"process CPU {100 * cpu_util:.0f}% of {cores} core(s); worker threads busy "
        f"computing {100 * worker_util:.0f}% of the time ({threads} thread(s))",
        f"throughput {achieved:.1f} samples/s; the workers' CPU work alone would allow "
        f"about {capacity:.1f} samples/s on {usable} core(s)",
    ]
    sug: List[str] = []
    fetch = st.get("fetch") or {}

    if ratio < 0.05:
        need = max(1, math.ceil(threads * worker_util * 1.3))
        ev.append("the loader keeps batches ready: the trainer is the slower side")
        if need < threads:
            sug.append(
                f"the loader has headroom: {_F_THREADS} {need} would still keep up and "
                f"leave {threads - need} core(s) to the trainer"
            )
        sug.append("nothing to tune on the data side; profile the training step")
        return Diagnosis("consumer", ev, sug)

    if cpu_util > 0.85 or worker_util > 0.8:
        stages = stage_seconds(st)
        names = dict(WORKER_STAGES)
        if "decode_s" not in stages:
            names["resize_s"] = "decode + resize / patchify"
        heavy = max(
            ((names[k], v) for k, v in stages.items() if k != "read_s"),
            key=lambda x: x[1],
            default=("", 0.0),
        )
        if worker_util > 0.8 and cpu_util < 0.6 * min(threads, cores) / cores:
            ev.append(
                f"the threads were busy but the process got only {100 * cpu_util:.0f}% "
                "of the cores: other processes compete for the CPU"
            )
        if heavy[0]:
            ev.append(
                f"heaviest stage: {heavy[0]} ({100 * heavy[1] / max(compute, 1e-9):.0f}% "
                "of worker compute)"
            )
        if threads < cores:
            sug.append(
                f"raise {_F_THREADS} from {threads} to {cores} (the cores this process may use)"
            )
        else:
            sug.append(
                f"all {cores} core(s) are busy: more throughput needs more cores "
                "(or fewer ranks per node), not more threads"
            )
        if "decode" in heavy[0] or "resize" in heavy[0]:
            sug.append(
                "lower max_pixels if the model allows it (resize and patchify cost "
                "grows with output pixels); fast_decode=True trades exact Pillow "
                "parity for faster JPEG decode"
            )
        if collate / wall > 0.5:
            sug.append(
                "collation takes over half of its thread: use larger micro-batches "
                "less often, or packing"
            )
        return Diagnosis("CPU", ev, sug)

    if p.remote and fetch:
        reqs = int(fetch.get("requests") or 0)
        nbytes = int(fetch.get("bytes") or 0)
        p50 = float(fetch.get("latency_p50_s") or 0.0)
        p90 = float(fetch.get("latency_p90_s") or p50)
        inflight = _avg_fetch_inflight(p)
        bw = nbytes / p.wall_s if p.wall_s > 0 else 0.0
        rate = reqs / p.wall_s if p.wall_s > 0 else 0.0
        # Little's law: mean request duration = mean requests in flight / request rate
        duration = inflight / rate if rate > 0 else 0.0
        ev.append(
            f"{reqs} requests, {nbytes / 2**20:.1f} MiB at {bw / 2**20:.1f} MiB/s; "
            f"first-byte latency p50 {1000 * p50:.0f} ms, p90 {1000 * p90:.0f} ms; "
            f"about {inflight:.1f} requests in flight on average"
        )
        if duration > 0:
            ev.append(f"a request takes about {1000 * duration:.0f} ms in total")
        per_sample = reqs / max(1, p.samples)
        target = min(capacity, 4 * achieved) if math.isfinite(capacity) else 4 * achieved
        needed = max(8, math.ceil(target * per_sample * max(p90, duration, 1e-3) * 1.5))
        if duration <= 0 or duration < 2.5 * max(p50, 1e-4):
            ev.append("requests spend most of their time waiting for the first byte")
            limit = max_inflight or fetch.get("max_inflight")
            sug.append(
                f"more requests in flight: {_F_INFLIGHT} {needed}"
                + (f" (now {limit})" if limit else "")
            )
            need_window = max(window, math.ceil(needed / max(per_sample, 1e-9)))
            if window and need_window > window:
                sug.append(
                    f"a larger window of samples in flight: {_F_WINDOW} {need_window} "
                    f"(now {window}); each sample needs ~{per_sample:.1f} requests"
                )
            if prefetch and ratio > 0.02:
                sug.append(
                    f"keep {_F_PREFETCH} at {max(prefetch, 4)} or more to ride out latency spikes"
                )
            return Diagnosis("I/O latency", ev, sug)
        ev.append("transfers take much longer than the first byte: the link is the limit")
        sug.append(
            f"the data path delivers {bw / 2**20:.1f} MiB/s: store images closer to "
            "the trainer, smaller (pre-resized to max_pixels) or better compressed"
        )
        sug.append(
            f"if the store limits each connection, more connections help: {_F_INFLIGHT} {needed}"
        )
        return Diagnosis("network bandwidth", ev, sug)

    if read > compute:
        ev.append(
            f"workers spend {100 * read / max(read + compute, 1e-9):.0f}% of their time "
            "reading files"
        )
        sug.append(
            f"reads are slow (cold cache or network filesystem): raise {_F_THREADS} to "
            f"{max(threads * 2, cores)} so reads overlap"
        )
        return Diagnosis("I/O latency", ev, sug)

    ev.append("workers are idle while the trainer waits: too little work is queued ahead")
    if window:
        sug.append(f"raise {_F_WINDOW} from {window} to {2 * window}")
    if prefetch:
        sug.append(f"raise {_F_PREFETCH} from {prefetch} to {2 * prefetch}")
    if threads < cores:
        sug.append(f"raise {_F_THREADS} from {threads} to {cores}")
    return Diagnosis("pipeline depth", ev, sug)


def report(p: Profile, d: Optional[Diagnosis] = None) -> str:
    """The text the command prints."""
    d = d or diagnose(p)
    st = p.stats
    out = [
        f"{p.batches} batches, {p.samples} samples in {p.wall_s:.2f} s: "
        f"{p.samples / max(p.wall_s, 1e-9):.1f} samples/s "
        f"({int(st.get('num_threads') or 0)} threads, prefetch {st.get('prefetch')}, "
        f"window {st.get('window')}; trainer step {1000 * p.step_s:.0f} ms; first batch "
        f"after {p.first_batch_s:.2f} s)",
        "",
        f"{'stage':30s} {'busy s':>9s} {'share':>7s}  of",
    ]
    for name, v, share in breakdown(p):
        of = (
            "wall time"
            if name == "consumer wait"
            else "collation thread"
            if name == "collate"
            else "worker threads"
        )
        out.append(f"{name:30s} {v:9.3f} {100 * share:6.1f}%  {of}")
    if st.get("skipped"):
        out.append(f"skipped samples: {st['skipped']} {st.get('skipped_by_reason') or ''}")
    sources = st.get("sources") or {}
    if len(sources) > 1:
        width = max(6, max(len(n) for n in sources))
        out += [
            "",
            f"  {'source':{width}s} {'samples':>9s} {'share':>7s} {'expected':>8s} "
            f"{'skipped':>8s} {'tokens':>10s} {'img tok':>10s} {'MiB':>8s}",
        ]
        for name, s in sources.items():
            out.append(
                f"  {name:{width}s} {s['samples']:9d} {100 * s.get('share', 0):6.1f}% "
                f"{100 * s.get('expected_share', 0):7.1f}% {s['skipped']:8d} "
                f"{s['tokens']:10d} {s['image_tokens']:10d} {s['bytes'] / 2**20:8.1f}"
            )
    fetch = st.get("fetch") or {}
    if fetch:
        out.append(
            f"fetch: {fetch.get('requests', 0)} requests, "
            f"{int(fetch.get('bytes', 0)) / 2**20:.1f} MiB, retries "
            f"{sum(int(v) for k, v in fetch.items() if k.startswith('retries'))}, "
            f"failures {fetch.get('failures', 0)}, first byte p50 "
            f"{1000 * float(fetch.get('latency_p50_s', 0)):.0f} ms / p99 "
            f"{1000 * float(fetch.get('latency_p99_s', 0)):.0f} ms"
        )
    out += ["", f"wait-time ratio: {100 * p.wait_ratio:.1f}%", f"bottleneck: {d.bottleneck}"]
    out += [f"  - {e}" for e in d.evidence]
    out.append("suggestions:")
    out += [f"  - {s}" for s in d.suggestions]
    return "\n".join(out) + "\n"


def plot_timeline(p: Profile, path: str) -> None:
    """Writes a PNG: per-stage utilisation of the worker threads over time, the
    collation thread and the consumer's wait, and the queue / in-flight depths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = p.timeline
    threads = max(1, int(p.stats.get("num_threads") or 1))
    split = "decode_s" in stage_seconds(p.stats)
    keys = [
        (k, n if split or k != "resize_s" else "decode + resize / patchify")
        for k, n in WORKER_STAGES
        if k in stage_seconds(p.stats)
    ]
    ts, util, coll, wait, cpu, depth, inflight, fetching = [], [], [], [], [], [], [], []
    prev_t, prev = 0.0, {"cpu": 0.0}
    for pt in pts:
        dt = pt.t - prev_t
        if dt <= 0:
            continue
        s = dict(pt.stats, **stage_seconds(pt.stats))

        def delta(k: str) -> float:
            return float(s.get(k) or 0.0) - float(prev.get(k) or 0.0)

        ts.append(pt.t)
        util.append([max(0.0, delta(k)) / (dt * threads) for k, _ in keys])
        coll.append(max(0.0, delta("collate_s")) / dt)
        wait.append(max(0.0, delta("wait_s")) / dt)
        cpu.append(max(0.0, pt.cpu_s - prev["cpu"]) / (dt * p.cores))
        depth.append(int(s.get("queue_depth") or 0))
        inflight.append(int(s.get("in_flight") or 0))
        fetching.append(int((s.get("fetch") or {}).get("inflight", 0)))
        prev_t, prev = pt.t, dict(s, cpu=pt.cpu_s)
    fig, (ax, ax2) = plt.subplots(
        2, 1, figsize=(9, 6), sharex=True, gridspec_kw={"height_ratios": [2, 1]}
    )
    if ts:
        cols = list(zip(*util)) if util and util[0] else []
        ax.stackplot(ts, *cols, labels=[n for _, n in keys], step="pre", alpha=0.8)
        ax.plot(ts, coll, drawstyle="steps-pre", color="k", lw=1, label="collate (1 thread)")
        ax.plot(ts, wait, drawstyle="steps-pre", color="red", lw=1.5, label="consumer wait")
        ax.plot(
            ts,
            cpu,
            drawstyle="steps-pre",
            color="gray",
            ls="--",
            lw=1,
            label=f"process CPU / {p.cores} cores",
        )
        ax2.plot(ts, depth, drawstyle="steps-pre", label="batches queued")
        ax2.plot(ts, inflight, drawstyle="steps-pre", label="samples in flight")
        if any(fetching):
            ax2.plot(ts, fetching, drawstyle="steps-pre", label="requests in flight")
    ax.set_ylabel("utilisation")
    ax.set_ylim(0, max([1.05] + [max(w, c) for w, c in zip(wait, cpu)]))
    ax.set_title(
        f"mmloader stage utilisation ({threads} worker threads; wait-time ratio "
        f"{100 * p.wait_ratio:.1f}%)"
    )
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(True, alpha=0.3)
    ax2.set_xlabel("seconds since the first next()")
    ax2.set_ylabel("count")
    ax2.legend(fontsize=7, loc="upper right")
    ax2.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------- command line


# The Loader options the profile command takes (flags and help from the option table).
LOADER_FLAGS = (
    "micro_batch_size",
    "num_threads",
    "prefetch",
    "window",
    "max_inflight",
    "tokenizer",
    "model_dir",
    "preset",
    "max_pixels",
    "min_pixels",
    "seq_length",
    "packing",
    "pack_length",
    "shuffle",
    "seed",
    "s3_endpoint",
)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("data", nargs="+", help="JSONL shard(s), glob, folder, http(s):// or s3://")
    ap.add_argument("--batches", type=int, default=50, help="batches to take (default 50)")
    ap.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        help="simulated trainer step per batch, ms (default 0: as fast as it goes)",
    )
    ap.add_argument(
        "--plot",
        default=None,
        metavar="FILE.png",
        help="write a timeline of stage utilisation (needs matplotlib)",
    )
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    add_flags(ap.add_argument_group("loader options (mmloader.Loader)"), LOADER_FLAGS)


def loader_from_args(args: argparse.Namespace):
    from . import Loader

    kw = flag_kwargs(args, LOADER_FLAGS)
    data: Sequence[str] = args.data
    return Loader(list(data) if len(data) > 1 else data[0], **kw)


def main_args(args: argparse.Namespace) -> int:
    if args.batches < 1:
        print("profile: --batches must be >= 1", file=sys.stderr)
        return 2
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("profile: --plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 2
    loader = loader_from_args(args)
    try:
        prof = run(
            loader,
            args.batches,
            step_s=args.step_ms / 1000.0,
            progress=None if args.quiet else sys.stderr,
        )
    finally:
        loader.close()
    sys.stdout.write(report(prof, diagnose(prof, args.max_inflight)))
    if args.plot:
        plot_timeline(prof, args.plot)
        print(f"timeline written to {args.plot}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mmloader profile", description="Profile mmloader on a dataset."
    )
    add_arguments(ap)
    return main_args(ap.parse_args(argv))


__all__ = [
    "run",
    "breakdown",
    "diagnose",
    "report",
    "plot_timeline",
    "Profile",
    "Diagnosis",
    "main",
]
