"""Never late (issue 34): how long mmloader takes per batch, batch by batch, and how long
the trainer waits in next() when its step is 1.2x the mean production time, measured so
that a loaded machine and a quiet one can be compared.

    python3 -m pytest benchmarks/bench_never_late.py --benchmark-only -q -s   # this build
    python3 benchmarks/bench_never_late.py --base /path/to/other/checkout [--rounds 3]

The second form compares two builds in one run: each repeat is a fresh child process per
build (PYTHONPATH = that checkout, built in place by scripts/build.sh), the builds
alternating (base, new, new, base, ...) so the machine's load falls on both alike; first
each build digests the bench's batches (every tensor, sha256) and the digests must agree.
Lines starting with "[never_late]" are the figures.

The data: the end-to-end suite's mix with real photos (benchmarks/pipelines/dataset.py,
photos=True: generated photos and screenshots, and three in ten references the
scikit-image / matplotlib photos re-encoded at 0.3-12 MP), RECORDS records, read in record
order and cycled; the Qwen2.5-VL preset at the model's default pixel limits, float32
pixels, micro_batch_size 8, 2 worker threads, prefetch 4, as the suite runs mmloader.

The machine's share.  On a shared machine the loader's threads get a varying part of the
CPU they ask for, and a trainer step fixed in wall time then measures the machine: last
round the process got 0.56-1.13 cores, a swing wider than the 1.2x step's slack.  So every
time here is also read on an "equal-share" clock: for each thread of the process but the
trainer's (the loader's workers, collator, I/O), /proc/self/task/T/schedstat gives the time
it ran and the time it waited runnable for a CPU (run_delay); over an interval the share
granted is ran / (ran + waited) of all those threads (1 when none wanted to run), and the
interval counts wall x share on the equal-share clock: the time the same work would have
taken had the machine given every runnable thread a CPU.  On a quiet machine the two clocks
agree.  The trainer's set-up and steps last their time on that clock (it sleeps in slices
of SLICE_S until they have), next() waits are read on both, and the wait-time ratio is
reported both ways: Loader.stats()'s (wall) and the equal-share one (waits / (waits +
steps), both on that clock).  It corrects for CPU time the machine withheld, not for
cache or memory-bandwidth contention, nor for work done while no thread was runnable.

Each repeat, in a fresh Loader each:

- step 0 (the loader's own rate): the time between consecutive next() returns after the
  warm-up (the first WARMUP batches), BATCHES of them: the production time per batch, p50 /
  p90 / p99 / max, on both clocks, and the share of batches over 1.2x the median;
- the trainer: builds a fresh loader, spends SETUP_S of set-up (loading its model) on the
  equal-share clock, then takes WARMUP + BATCHES batches with a step of 1.2x that repeat's
  mean equal-share production time after each: every next() wait (p50 / p90 / p99 / max),
  the wait-time ratio of the whole run (warm-up included) and after the warm-up, the first
  call's wait as its share of the whole-run ratio, the output queue's depth as each
  next() is called (its peak since the last call) and how often it was full, and how much
  of the wait came after the batch waited for was composed (stats()["wait_emit_s"]: its
  emission, with float32 pixels the expansion of its uint8 rows; the rest is decoding,
  so a build without that figure prints none).  A build
  whose Loader starts producing when it is built (start="construction", the default since
  issue 34) has the set-up to make its first batches; one that starts at the first next()
  (start="next", and builds before it) does not.

MML_NEVER_LATE_PIXELS=uint8 (or any pixel_format) runs the same with that pixel_format
(uint8: no expansion of uint8 rows into float rows, the float32 run's work less that).

MML_NEVER_LATE_PREFETCH=4,8,16 runs the trainer at each prefetch in turn (the order
rotated per repeat, the same step: 1.2x the production at the first prefetch).

test_one_image_bound (issue 34's "split one huge image's resize over idle workers": is it
worth it?): each image of the same batches timed alone through mmloader.ImageProcessor (the
same preset and pixels, one thread, median of 3), and per batch whether its largest image
takes longer than the rest together: with 2 workers, such a batch cannot be produced in
less than that image's time however its decodes are ordered, and splitting that image is
the only lever on it.

The figures are medians over REPEATS repeats with the load average beside them; nothing is
asserted on them (they follow the machine's load).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = "--child" in sys.argv  # the build under test comes from PYTHONPATH, not this tree
if not CHILD:
    sys.path.insert(0, os.path.dirname(HERE))
    sys.path.insert(0, HERE)

import mmloader  # noqa: E402

RECORDS = int(os.environ.get("MML_NEVER_LATE_RECORDS", "128"))
BATCHES = int(os.environ.get("MML_NEVER_LATE_BATCHES", "96"))
REPEATS = int(os.environ.get("MML_NEVER_LATE_REPEATS", "3"))
PREFETCH = [int(x) for x in os.environ.get("MML_NEVER_LATE_PREFETCH", "4").split(",")]
SETUP_S = float(os.environ.get("MML_NEVER_LATE_SETUP_S", "1.0"))
WARMUP = 5
FACTOR = 1.2
SLICE_S = 0.005  # the trainer's sleep between two looks at the equal-share clock
TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")


def _pct(v: List[float], q: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


class ShareClock:
    """The equal-share clock (see the module's doc): per thread of this process other than
    the one that made the clock, its run time and run-queue wait from schedstat."""

    def __init__(self) -> None:
        self.me = str(threading.get_native_id())

    def sample(self) -> Tuple[float, Dict[str, Tuple[int, int]]]:
        out: Dict[str, Tuple[int, int]] = {}
        t = time.perf_counter()
        for tid in os.listdir("/proc/self/task"):
            if tid == self.me:
                continue
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    ran, waited = f.read().split()[:2]
            except (OSError, ValueError):  # a thread that ended meanwhile
                continue
            out[tid] = (int(ran), int(waited))
        return t, out

    @staticmethod
    def interval(a: Any, b: Any) -> Tuple[float, float, float, float]:
        """(wall s, equal-share s, ran s, waited s) from sample a to sample b."""
        ran = waited = 0
        for tid, (r1, w1) in b[1].items():
            r0, w0 = a[1].get(tid, (0, 0))  # a thread born in between: all of it
            ran += r1 - r0
            waited += w1 - w0
        wall = b[0] - a[0]
        share = ran / (ran + waited) if ran + waited > 0 else 1.0
        return wall, wall * share, ran / 1e9, waited / 1e9

    def spend(self, seconds: float) -> Tuple[float, float]:
        """Sleeps until `seconds` passed on the equal-share clock: (wall s, equal-share s)."""
        a = prev = self.sample()
        v = 0.0
        while v < seconds:
            time.sleep(min(SLICE_S, seconds - v))  # wall >= equal-share: never overshoots
            cur = self.sample()
            v += self.interval(prev, cur)[1]
            prev = cur
        return prev[0] - a[0], v


def _loader(shard: str, prefetch: int = PREFETCH[0]) -> mmloader.Loader:
    return mmloader.Loader(
        shard,
        tokenizer=TINY,
        preset="qwen2.5-vl",
        micro_batch_size=8,
        num_threads=2,
        prefetch=prefetch,
        max_inflight=64,
        shuffle=False,
        cycle=True,
        pixel_format=os.environ.get("MML_NEVER_LATE_PIXELS", "float32"),
    )


def production(shard: str) -> Dict[str, Any]:
    """Time between consecutive next() returns at step 0, after the warm-up (ms, both
    clocks), the share granted and the cores used over those batches."""
    clock = ShareClock()
    wall: List[float] = []
    eq: List[float] = []
    with _loader(shard) as L:
        it = iter(L)
        for _ in range(WARMUP):
            next(it)
        first = prev = clock.sample()
        for _ in range(BATCHES):
            next(it)
            cur = clock.sample()
            w, v, _, _ = clock.interval(prev, cur)
            wall.append(w * 1e3)
            eq.append(v * 1e3)
            prev = cur
        w, v, ran, waited = clock.interval(first, prev)
    return {
        "wall": wall,
        "eq": eq,
        "share": ran / (ran + waited) if ran + waited else 1.0,
        "cores": ran / w,
    }


def trainer(shard: str, step_ms: float, prefetch: int = PREFETCH[0]) -> Dict[str, Any]:
    """A trainer: builds the loader, SETUP_S of set-up, then WARMUP + BATCHES batches with a
    step of step_ms (equal-share ms) after each."""
    clock = ShareClock()
    w: List[float] = []  # each next() wait, wall ms
    e: List[float] = []  # the same on the equal-share clock
    steps_eq = 0.0
    depth: List[int] = []  # finished batches in the output queue as each next() is called
    with _loader(shard, prefetch) as L:
        it = iter(L)
        clock.spend(SETUP_S)
        start = clock.sample()
        for k in range(WARMUP + BATCHES):
            if k > 0:
                depth.append(L.stats()["queue_depth"])
            a = clock.sample()
            next(it)
            b = clock.sample()
            wall_s, eq_s, _, _ = clock.interval(a, b)
            w.append(wall_s * 1e3)
            e.append(eq_s * 1e3)
            steps_eq += clock.spend(step_ms / 1e3)[1]
        end = clock.sample()
        st = L.stats()
    whole = clock.interval(start, end)
    after_e = e[WARMUP:]
    steps_after = steps_eq * len(after_e) / len(e)
    wall_after = sum(w[WARMUP:]) / 1e3 + (whole[0] - sum(w) / 1e3) * len(after_e) / len(e)
    return {
        "waits": w,
        "waits_eq": e,
        "ratio": st["wait_time_ratio"],  # the loader's own (wall, from the first call)
        "ratio_eq": sum(e) / 1e3 / (sum(e) / 1e3 + steps_eq),
        "ratio_after": sum(w[WARMUP:]) / 1e3 / wall_after,
        "ratio_eq_after": sum(after_e) / 1e3 / (sum(after_e) / 1e3 + steps_after),
        "first": w[0] / 1e3 / st["wall_s"] if st["wall_s"] > 0 else 0.0,
        "first_ms": w[0],
        "first_eq_ms": e[0],
        "share": whole[2] / (whole[2] + whole[3]) if whole[2] + whole[3] else 1.0,
        "cores": whole[2] / whole[0],
        "full": sum(d >= prefetch for d in depth) / len(depth),
        # of the loader's wait_s, the part after the batch was composed (its emission: the
        # expansion of float32 pixels); -1 from a build without the figure
        "emit": st["wait_emit_s"] / st["wait_s"] if "wait_emit_s" in st and st["wait_s"] else -1.0,
        "depth": statistics.median(depth),
    }


def digest(shard: str) -> str:
    """sha256 of every tensor of the WARMUP + BATCHES batches the bench reads."""
    h = hashlib.sha256()
    with _loader(shard) as L:
        it = iter(L)
        for _ in range(WARMUP + BATCHES):
            b = next(it)
            for name in sorted(b):
                a = b[name].numpy()
                h.update(name.encode())
                h.update(str((a.dtype.str, a.shape)).encode())
                h.update(a.data)
                del a
            del b
    return h.hexdigest()


def measure(shard: str, r: int = 0) -> List[Dict[str, Any]]:
    """One repeat: production at step 0, then the trainer at each prefetch (rotated by r)."""
    load0 = os.getloadavg()[0]
    prod = production(shard)
    mean_eq = statistics.mean(prod["eq"])
    rows = []
    for pf in PREFETCH[r % len(PREFETCH) :] + PREFETCH[: r % len(PREFETCH)]:
        t = trainer(shard, FACTOR * mean_eq, pf)
        rows.append({"prod": prod, "step_ms": FACTOR * mean_eq, "pf": pf, **t})
    for x in rows:
        x["load"] = (load0, os.getloadavg()[0])
    return rows


def _summary(v: List[float], f: str = ".1f") -> str:
    return (
        f"p50 {_pct(v, 50):{f}} / p90 {_pct(v, 90):{f}} / p99 {_pct(v, 99):{f}} / "
        f"max {max(v):{f}} ms"
    )


def _row_text(x: Dict[str, Any]) -> str:
    p = x["prod"]
    med = statistics.median(p["wall"])
    over = sum(v > FACTOR * med for v in p["wall"]) / len(p["wall"])
    return (
        f"load {x['load'][0]:.1f}-{x['load'][1]:.1f}; production per batch: wall "
        f"{_summary(p['wall'])} (mean {statistics.mean(p['wall']):.1f}; {100 * over:.0f}% over "
        f"1.2x the median), equal-share {_summary(p['eq'])} (mean "
        f"{statistics.mean(p['eq']):.1f}), share granted {p['share']:.2f}, {p['cores']:.2f} "
        f"cores\n  prefetch {x['pf']}, set-up {SETUP_S:g} s, step {x['step_ms']:.1f} ms "
        f"(equal-share): next() waits wall {_summary(x['waits'], '.2f')}, equal-share "
        f"{_summary(x['waits_eq'], '.2f')}; wait-time ratio wall {100 * x['ratio']:.2f}% "
        f"({100 * x['ratio_after']:.2f}% after the warm-up; the first call "
        f"{100 * x['first']:.2f}%, {x['first_ms']:.1f} ms), equal-share "
        f"{100 * x['ratio_eq']:.2f}% ({100 * x['ratio_eq_after']:.2f}% after the warm-up); "
        f"share granted {x['share']:.2f}, {x['cores']:.2f} cores; output queue at a call: "
        f"median {x['depth']:g} batches, full at {100 * x['full']:.0f}%"
        + (
            f"; of the wait, after its batch was composed {100 * x['emit']:.0f}%"
            if x.get("emit", -1) >= 0
            else ""
        )
    )


def _medians(rows: List[Dict[str, Any]], label: str) -> List[str]:
    def med(xs: List[Dict[str, Any]], f: Any) -> float:
        return statistics.median(f(x) for x in xs)

    base = [x for x in rows if x["pf"] == PREFETCH[0]]
    loads = [v for x in rows for v in x["load"]]
    out = [
        f"{label}medians of {len(base)} repeats ({RECORDS} records, {BATCHES} batches of 8 "
        f"after {WARMUP} of warm-up; load {min(loads):.1f}-{max(loads):.1f}): production per "
        f"batch wall p50 {med(base, lambda x: _pct(x['prod']['wall'], 50)):.1f} / p90 "
        f"{med(base, lambda x: _pct(x['prod']['wall'], 90)):.1f} / p99 "
        f"{med(base, lambda x: _pct(x['prod']['wall'], 99)):.1f} ms, equal-share p50 "
        f"{med(base, lambda x: _pct(x['prod']['eq'], 50)):.1f} / p90 "
        f"{med(base, lambda x: _pct(x['prod']['eq'], 90)):.1f} / p99 "
        f"{med(base, lambda x: _pct(x['prod']['eq'], 99)):.1f} ms (share granted "
        f"{med(base, lambda x: x['prod']['share']):.2f})"
    ]
    for pf in PREFETCH:
        xs = [x for x in rows if x["pf"] == pf]
        out.append(
            f"{label}prefetch {pf}, set-up {SETUP_S:g} s, step = 1.2x the mean: next() waits "
            f"wall p50 {med(xs, lambda x: _pct(x['waits'], 50)):.2f} / p90 "
            f"{med(xs, lambda x: _pct(x['waits'], 90)):.2f} / p99 "
            f"{med(xs, lambda x: _pct(x['waits'], 99)):.2f} ms, equal-share p50 "
            f"{med(xs, lambda x: _pct(x['waits_eq'], 50)):.2f} / p90 "
            f"{med(xs, lambda x: _pct(x['waits_eq'], 90)):.2f} / p99 "
            f"{med(xs, lambda x: _pct(x['waits_eq'], 99)):.2f} ms; wait-time ratio wall "
            f"{100 * med(xs, lambda x: x['ratio']):.2f}% (after the warm-up "
            f"{100 * med(xs, lambda x: x['ratio_after']):.2f}%; the first call "
            f"{100 * med(xs, lambda x: x['first']):.2f}%), equal-share "
            f"{100 * med(xs, lambda x: x['ratio_eq']):.2f}% (after the warm-up "
            f"{100 * med(xs, lambda x: x['ratio_eq_after']):.2f}%); share granted "
            f"{med(xs, lambda x: x['share']):.2f}; queue at a call median "
            f"{med(xs, lambda x: x['depth']):g}, full at {100 * med(xs, lambda x: x['full']):.0f}%"
        )
    return out


# ---- pytest: this build ---------------------------------------------------------------


def _shard() -> str:
    from pipelines import dataset

    return dataset.repeated(dataset.cached(RECORDS, photos=True), 8)


@pytest.fixture(scope="module")
def shard() -> str:
    pytest.importorskip("PIL")
    return _shard()


def test_never_late(benchmark, shard):
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    rows = []
    for r in range(REPEATS):
        got = measure(shard, r)
        for x in got:
            print(f"\nrepeat {r}: {_row_text(x)}")
        rows += got
    print()
    print("\n".join(_medians(rows, "")))


def test_one_image_bound(benchmark, shard):
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    _one_image_bound(shard)


def _images(rec: Dict[str, object]) -> List[str]:
    x = rec.get("image") or rec.get("images") or []
    return [x] if isinstance(x, str) else list(x)  # type: ignore[arg-type]


def _one_image_bound(shard: str) -> None:
    proc = mmloader.ImageProcessor("qwen2.5-vl")
    root = os.path.dirname(shard)
    with open(shard, encoding="utf-8") as f:
        recs = [json.loads(ln) for _, ln in zip(range(8 * (WARMUP + BATCHES)), f)]
    ms: Dict[str, float] = {}
    bound = 0
    excess = total = 0.0
    for i in range(0, len(recs), 8):
        t = []
        for name in (p for r in recs[i : i + 8] for p in _images(r)):
            if name not in ms:
                with open(os.path.join(root, name), "rb") as f:
                    data = f.read()
                runs = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    proc([data])
                    runs.append((time.perf_counter() - t0) * 1e3)
                ms[name] = statistics.median(runs)
            t.append(ms[name])
        if t:
            big, rest = max(t), sum(t) - max(t)
            bound += big > rest
            excess += max(0.0, big - sum(t) / 2)  # beyond an even split over 2 workers
            total += sum(t) / 2
    n = len(recs) // 8
    print(
        f"\n{n} batches of 8, {len(ms)} distinct images (load {os.getloadavg()[0]:.1f}): "
        f"{bound} batches ({100 * bound / n:.0f}%) have one image longer than the rest "
        f"together; their largest images' time beyond an even split over 2 workers is "
        f"{100 * excess / total:.1f}% of the batches' decode time / 2"
    )


# ---- two builds, one run ------------------------------------------------------------------


def _child(args: argparse.Namespace) -> None:
    if args.digest:
        print(json.dumps({"digest": digest(args.shard)}))
    else:
        print(json.dumps({"rows": measure(args.shard, args.repeat)}))


def _run_child(root: str, shard: str, *extra: str) -> Dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(root))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--shard", shard, *extra]
    p = subprocess.run(cmd, env=env, cwd="/", capture_output=True, text=True, check=False)
    if p.returncode:
        raise SystemExit(f"{root}: the child failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _pair(args: argparse.Namespace) -> None:
    shard = _shard()
    builds = {"base": args.base, "new": args.new}
    for name, root in builds.items():
        got = _run_child(root, "-", "--version")
        rev = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        print(
            f"[never_late] {name}: {root} at {rev}{' (modified)' if dirty else ''}, mmloader "
            f"imported from {got['version']}",
            flush=True,
        )
    digests = {n: _run_child(r, shard, "--digest")["digest"] for n, r in builds.items()}
    print(f"[never_late] batch digests: {digests}", flush=True)
    if len(set(digests.values())) != 1:
        raise SystemExit("the builds make different batches: nothing to compare")
    rows: Dict[str, List[Dict[str, Any]]] = {n: [] for n in builds}
    for r in range(args.rounds):
        order = ["base", "new"] if r % 2 == 0 else ["new", "base"]
        for name in order:
            got = _run_child(builds[name], shard, "--repeat", str(r))["rows"]
            rows[name] += got
            for x in got:
                print(f"[never_late] round {r} {name}: {_row_text(x)}", flush=True)
    for name in builds:
        for line in _medians(rows[name], f"{name}: "):
            print(f"[never_late] {line}", flush=True)


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", help="a checkout built in place (the build to compare with)")
    ap.add_argument("--new", default=os.path.dirname(HERE), help="default: this checkout")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shard", help=argparse.SUPPRESS)
    ap.add_argument("--repeat", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--digest", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--version", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child and args.version:
        print(json.dumps({"version": os.path.dirname(os.path.dirname(mmloader.__file__))}))
    elif args.child:
        _child(args)
    elif not args.base:
        ap.error("--base is required (or run it under pytest for this build alone)")
    else:
        _pair(args)


if __name__ == "__main__":
    main()
