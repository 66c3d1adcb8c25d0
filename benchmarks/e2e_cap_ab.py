"""A/B of bench_e2e.py's recipe-cap runs: two builds, the suite's own pipelines and runner,
alternating in fresh processes (issue 34: the Loader end to end at a recipe cap).

    git worktree add --detach /tmp/mml-base main && (cd /tmp/mml-base && bash scripts/build.sh)
    python3 benchmarks/e2e_cap_ab.py --base /tmp/mml-base [--new .] [--rounds 3] \\
        [--pipelines mmloader,mmloader-fast] [--cap 589824] [--min-seconds 20]

The dataset is bench_e2e.py's photos-only recipe set (MML_BENCH_PHOTO_MP=recipe: 64
records of mmloader.datagen, 70 JPEGs re-encoded at 3-12 MP, the records repeated, each
pass shuffled), the settings its recipe-cap run's (2 threads = the cores, prefetch 4,
batches of 8, the cap as max_pixels, float32 unless the pipeline says otherwise, trainer
step 0), each run at least 48 samples and --min-seconds.  Each round runs every pipeline
once per build, each in a fresh interpreter started in that checkout (its
benchmarks.pipelines.runner, so it imports that tree's mmloader), the order of the builds
alternating between rounds.  Per run the runner's steady-state figures: CPU ms per sample
(the process tree's user + system time over the samples after the warm-up), samples/s,
page faults per batch; with the 1-min load average before each run.  The report gives per
build and pipeline the median of the rounds, every round's value, and new / base of the
medians.  Nothing is asserted: speed is shown by the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks import bench_e2e  # noqa: E402
from benchmarks.pipelines import dataset, runner  # noqa: E402
from benchmarks.pipelines.common import default_tokenizer_file, make_config  # noqa: E402


def config(pipeline: str, cap: int, shard: str, min_seconds: float) -> Dict[str, Any]:
    """bench_e2e.Suite.config's settings for a recipe-cap run of `pipeline`."""
    module, extra, _, _ = bench_e2e.PIPELINES[pipeline]
    tok, _ = default_tokenizer_file()
    settings: Dict[str, Any] = dict(
        module=module,
        batch_size=8,
        threads=bench_e2e._cores(),
        inflight=64,
        prefetch=4,
        tokenizer=tok,
        step_ms=0.0,
        min_samples=48,
        min_seconds=min_seconds,
        max_seconds=90.0,
        max_pixels=cap,
    )
    settings.update(extra)
    return make_config([shard], **settings)


def run(tree: str, cfg: Dict[str, Any]) -> Dict[str, Any]:
    out = runner.run_subprocess(cfg, timeout=900, root=os.path.abspath(tree))
    if "error" in out:
        raise SystemExit(f"{tree}: {out['error']}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", default=os.path.dirname(HERE))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pipelines", default="mmloader,mmloader-fast")
    ap.add_argument("--cap", type=int, default=589824)
    ap.add_argument("--min-seconds", type=float, default=20.0)
    a = ap.parse_args()
    shard = dataset.repeated(
        dataset.cached(64, photos=True, max_mp=12.0, photo_mp=dataset.RECIPE_MP), 256
    )
    trees = {"base": a.base, "new": a.new}
    pipes = a.pipelines.split(",")
    res: Dict[tuple, List[Dict[str, Any]]] = {}
    print(f"cap {a.cap}, {shard}, load {os.getloadavg()[0]:.2f}", flush=True)
    for k in range(a.rounds):
        for p in pipes:
            order = list(trees.items()) if k % 2 == 0 else list(trees.items())[::-1]
            for name, tree in order:
                load = os.getloadavg()[0]
                r = run(tree, config(p, a.cap, shard, a.min_seconds))
                r["load"] = load
                res.setdefault((name, p), []).append(r)
                print(
                    f"round {k} {name:4s} {p:14s} load {load:5.2f}  cpu "
                    f"{1e3 * r['steady_cpu_s_per_sample']:6.2f} ms/sample  "
                    f"{r['steady_samples_per_s']:6.1f} samples/s  faults/batch "
                    f"{r['faults_per_batch']:.0f}",
                    flush=True,
                )
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    for p in pipes:
        med = {}
        for name in trees:
            rs = res[(name, p)]
            cpu = [1e3 * r["steady_cpu_s_per_sample"] for r in rs]
            sps = [r["steady_samples_per_s"] for r in rs]
            flt = [r["faults_per_batch"] for r in rs]
            med[name] = statistics.median(cpu)
            print(
                f"{p:14s} {name:4s} CPU ms/sample {med[name]:6.2f} "
                f"({', '.join(f'{x:.2f}' for x in cpu)})  samples/s "
                f"{statistics.median(sps):6.1f} ({', '.join(f'{x:.1f}' for x in sps)})  "
                f"faults/batch {statistics.median(flt):.0f}  load "
                f"{min(r['load'] for r in rs):.1f}-{max(r['load'] for r in rs):.1f}"
            )
        print(f"{p:14s} new / base CPU per sample {med['new'] / med['base']:.3f}")


if __name__ == "__main__":
    main()
