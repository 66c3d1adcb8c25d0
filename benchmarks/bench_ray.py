"""mmloader.ray on a Ray cluster simulated on this machine (ray.cluster_utils.Cluster).

    python3 -m pytest benchmarks/bench_ray.py --benchmark-only -q -s
    python3 benchmarks/bench_ray.py            # the same, without pytest

Three measurements, each against a peer in the same run, medians of MML_BENCH_RAY_RUNS
(default 3):
  1. transport: the trainer's time in next() per batch when the batch is already made, and
     the bytes copied on the trainer's node per batch: mmloader.Loader in process against
     mmloader.ray zero-copy views and copying get, with the object on the trainer's node
     and on another node.
  2. CPU-starved trainer: the head node (trainer) and a data node are pinned to different
     cores; the trainer burns its core for a step per batch; producers on the trainer's
     node ("node-local") against producers on the data node ("spread"), and in process.
  3. the ablation {pack, spread} x {copying get, zero-copy views}: two producers, two data
     nodes.
What one machine cannot show: nodes share its cores, memory bus and page cache, and an
object "transfer" between simulated nodes is a local memory copy, not a NIC; figures are
labelled simulated.  Writes benchmarks/results/ray.json, benchmarks/results-ray.md and
docs/ray.md's ray-results block.  Knobs: MML_BENCH_RAY_RUNS, MML_BENCH_RAY_BATCHES (16),
MML_BENCH_RAY_STEP_MS (40), MML_BENCH_RAY_MAX_PIXELS (448 * 448), MML_BENCH_OUT.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

import mmloader  # noqa: E402
from mmloader.datagen import load_manifest, make_dataset  # noqa: E402

RUNS = int(os.environ.get("MML_BENCH_RAY_RUNS", "3"))
N = int(os.environ.get("MML_BENCH_RAY_BATCHES", "16"))
STEP_MS = float(os.environ.get("MML_BENCH_RAY_STEP_MS", "40"))
MAX_PIXELS = int(os.environ.get("MML_BENCH_RAY_MAX_PIXELS", str(448 * 448)))
KW = dict(micro_batch_size=4, seed=0, num_threads=1, cycle=True, max_pixels=MAX_PIXELS)
OUT = os.environ.get("MML_BENCH_OUT", os.path.join(HERE, "results"))


def _dataset():
    root = os.path.join(os.environ.get("TMPDIR", "/tmp"), "mmloader-bench-ray")
    try:
        return load_manifest(root)["shards"]
    except (OSError, KeyError, ValueError):
        return make_dataset(
            root,
            n_samples=96,
            seed=0,
            n_images=48,
            min_size=160,
            max_size=640,
            text_only_fraction=0.0,
            two_image_fraction=0.0,
        )["shards"]


def _cluster(pin: bool):
    """A head node (the trainer) and two data nodes with resource "data"; with pin, the
    head runs on core 0 and the data nodes on the other cores (processes inherit it)."""
    import ray
    from ray.cluster_utils import Cluster

    cores = sorted(os.sched_getaffinity(0))
    os.environ["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    head_cores = {cores[0]}
    data_cores = set(cores[1:]) or head_cores
    if pin:
        os.sched_setaffinity(0, head_cores)
    c = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 256 << 20}
    )
    if pin:
        os.sched_setaffinity(0, data_cores)
    for _ in range(2):
        c.add_node(num_cpus=2, object_store_memory=256 << 20, resources={"data": 2})
    os.sched_setaffinity(0, head_cores if pin else set(cores))
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    return c, set(cores)


def _stop(c, cores):
    import ray

    ray.shutdown()
    c.shutdown()
    os.sched_setaffinity(0, cores)


def _settle() -> None:
    """Waits until closed loaders' actors gave their resources back (placement depends on
    what is free)."""
    import ray

    total = ray.cluster_resources()
    deadline = time.time() + 60
    while time.time() < deadline:
        free = ray.available_resources()
        if all(free.get(k, 0) >= total[k] for k in ("CPU", "data")):
            return
        time.sleep(0.2)


def _loader(data, **kw):
    import mmloader.ray as mray

    _settle()
    return mray.Loader(data, **kw)


def _wait_ready(L, local: bool) -> None:
    import ray

    refs = [r.ref for r in L._inflight]
    ray.wait(refs, num_returns=len(refs), fetch_local=local, timeout=120)


def _transport():
    """Median time in next() per ready batch, and bytes copied per batch."""
    data = _dataset()
    rows = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        L = mmloader.Loader(data, prefetch=N, **KW)
        times, nbytes = [], []
        for _ in range(RUNS):
            next(L)
            while L.stats()["queue_depth"] < N:
                time.sleep(0.02)
            for _ in range(N - 1):
                t0 = time.perf_counter()
                b = next(L)
                arrs = {k: np.from_dlpack(v) for k, v in b.items()}
                times.append(time.perf_counter() - t0)
                nbytes.append(sum(a.nbytes for a in arrs.values()))
        L.close()
    rows["in process"] = {
        "us_per_batch": 1e6 * statistics.median(times),
        "bytes_per_batch": statistics.mean(nbytes),
        "copied_per_batch": 0,
    }
    for name, placement, res, zc in (
        ("ray zero-copy, object on this node", "node-local", {"CPU": 1}, True),
        ("ray zero-copy, object on another node", "spread", {"CPU": 1, "data": 1}, True),
        ("ray copying get, object on this node", "node-local", {"CPU": 1}, False),
        ("ray copying get, object on another node", "spread", {"CPU": 1, "data": 1}, False),
    ):
        times = []
        with _loader(
            data,
            producers=2,
            placement=placement,
            producer_resources=res,
            refs_in_flight=N,
            zero_copy=zc,
            **KW,
        ) as R:
            for _ in range(RUNS):
                next(R)
                _wait_ready(R, local=placement == "node-local")
                for _ in range(N - 1):
                    t0 = time.perf_counter()
                    b = next(R)
                    times.append(time.perf_counter() - t0)
                    del b
            s = R.stats()
        rows[name] = {
            "us_per_batch": 1e6 * statistics.median(times),
            "bytes_per_batch": s["bytes"] / max(1, s["batches"]),
            "copied_per_batch": s["bytes_copied_per_batch"],
        }
    return rows


def _burn(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    x = 0
    while time.perf_counter() < end:
        x += 1


def _trainer(it, n: int) -> float:
    """Batches per second of a trainer that burns its core for STEP_MS per batch."""
    next(it)
    t0 = time.perf_counter()
    for _ in range(n):
        b = next(it)
        _burn(STEP_MS)
        del b
    return n / (time.perf_counter() - t0)


def _starved():
    data = _dataset()
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vals = []
        for _ in range(RUNS):
            with mmloader.Loader(data, prefetch=4, **KW) as L:
                vals.append(_trainer(L, N))
        out["in process (trainer's core)"] = statistics.median(vals)
    for name, placement, res in (
        ("ray node-local (trainer's node)", "node-local", {"CPU": 1}),
        ("ray spread (data node)", "spread", {"CPU": 1, "data": 1}),
    ):
        vals = []
        for _ in range(RUNS):
            with _loader(
                data,
                producers=2,
                placement=placement,
                producer_resources=res,
                refs_in_flight=4,
                **KW,
            ) as R:
                vals.append(_trainer(R, N))
        out[name] = statistics.median(vals)
    return out


def _ablation():
    data = _dataset()
    out = {}
    for placement in ("pack", "spread"):
        for zc in (False, True):
            vals, s = [], None
            for _ in range(RUNS):
                with _loader(
                    data,
                    producers=2,
                    placement=placement,
                    producer_resources={"CPU": 1, "data": 1},
                    refs_in_flight=4,
                    zero_copy=zc,
                    **KW,
                ) as R:
                    next(R)
                    t0 = time.perf_counter()
                    for _ in range(N):
                        b = next(R)
                        del b
                    vals.append(N / (time.perf_counter() - t0))
                    s = R.stats()
            out[f"{placement}, {'zero-copy views' if zc else 'copying get'}"] = {
                "batches_per_s": statistics.median(vals),
                "nodes": len(s["nodes"]),
                "copied_per_batch": s["bytes_copied_per_batch"],
                "wait_time_ratio": s["wait_time_ratio"],
            }
    return out


def run_all() -> dict:
    res = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "load_start": os.getloadavg()[0],
        "runs": RUNS,
        "batches": N,
        "step_ms": STEP_MS,
        "config": KW,
    }
    c, cores = _cluster(pin=False)
    try:
        res["transport"] = _transport()
        res["ablation"] = _ablation()
    finally:
        _stop(c, cores)
    c, cores = _cluster(pin=True)
    try:
        res["starved"] = _starved()
    finally:
        _stop(c, cores)
    res["load_end"] = os.getloadavg()[0]
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "ray.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = report(res)
    with open(os.path.join(HERE, "results-ray.md"), "w") as f:
        f.write(md)
    if OUT == os.path.join(HERE, "results"):
        _readme(md)
    print(md)
    return res


def _readme(md: str) -> None:
    """Puts the tables between docs/ray.md's ray-results markers."""
    path = os.path.join(ROOT, "docs", "ray.md")
    text = open(path, encoding="utf-8").read()
    a, b = "<!-- ray-results:start -->\n", "<!-- ray-results:end -->"
    if a in text and b in text:
        head, rest = text.split(a, 1)
        tail = rest.split(b, 1)[1]
        note = "<!-- Generated by benchmarks/bench_ray.py; do not edit by hand. -->\n"
        with open(path, "w", encoding="utf-8") as f:
            f.write(head + a + note + md + b + tail)


def report(r: dict) -> str:
    kib = 1024.0
    lines = [
        f"**Simulated** cluster (ray.cluster_utils.Cluster: 3 nodes on one machine, "
        f"{r['cores']} cores), {r['when']}, Python {r['python']}, load "
        f"{r['load_start']:.1f} -> {r['load_end']:.1f}; medians of {r['runs']} runs; "
        "micro_batch_size 4, images 160-640 px, 1 thread per producer.",
        "",
        "Transport (batch already made; time in next(), bytes copied on the trainer's node):",
        "",
        "| path | us per batch | KiB per batch | KiB copied per batch |",
        "|---|---|---|---|",
    ]
    for k, v in r["transport"].items():
        lines.append(
            f"| {k} | {v['us_per_batch']:.0f} | {v['bytes_per_batch'] / kib:.0f} | "
            f"{v['copied_per_batch'] / kib:.0f} |"
        )
    lines += [
        "",
        f"CPU-starved trainer (trainer node pinned to 1 core, burning {r['step_ms']:g}"
        " ms per batch; data node on the other core(s)); batches/s:",
        "",
        "| producers | batches/s |",
        "|---|---|",
    ]
    for k, v in r["starved"].items():
        lines.append(f"| {k} | {v:.1f} |")
    lines += [
        "",
        "Ablation (2 producers, 2 data nodes, no trainer step):",
        "",
        "| placement, transport | batches/s | nodes used | KiB copied per batch | "
        "wait-time ratio |",
        "|---|---|---|---|---|",
    ]
    for k, v in r["ablation"].items():
        lines.append(
            f"| {k} | {v['batches_per_s']:.1f} | {v['nodes']} | "
            f"{v['copied_per_batch'] / kib:.0f} | {v['wait_time_ratio']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def test_ray_cluster(benchmark):
    import pytest

    pytest.importorskip("ray")
    benchmark.pedantic(run_all, rounds=1, iterations=1)


if __name__ == "__main__":
    run_all()
