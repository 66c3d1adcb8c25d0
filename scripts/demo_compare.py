#!/usr/bin/env python3
"""The demo's side-by-side: a PyTorch DataLoader + PIL + the Hugging Face processor
against mmloader, on the same data, under the same simulated trainer step.

    python3 scripts/demo_compare.py [--data demo-data] [--seconds 8]

Both run in fresh processes through benchmarks/pipelines/runner.py (the suite's
end-to-end harness: the same per-sample work, checked equal there).  First mmloader runs
with no step, which gives its production time per batch; the trainer step is then set to
1.2x that time and both loaders run under it: a loader that keeps up leaves the trainer
waiting ~0% of the time, one that does not makes it wait for the difference.  Printed:
samples/s and the wait-time ratio (time the trainer waited in next() / wall time) of each.
The DataLoader needs torch and transformers (scripts/demo.sh installs them when missing).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.pipelines.common import make_config  # noqa: E402
from benchmarks.pipelines.runner import run_subprocess  # noqa: E402


def measure(shards, pipeline: str, step_ms: float, seconds: float):
    cfg = make_config(shards, batch_size=8, threads=os.cpu_count() or 1, max_pixels=401408)
    cfg.update(module=pipeline, step_ms=step_ms, min_seconds=seconds, max_seconds=4 * seconds)
    cfg.update(min_samples=64, pss=False)
    r = run_subprocess(cfg, timeout=120 + 8 * seconds)
    if "error" in r:
        raise SystemExit(f"demo_compare: {pipeline}: {r['error']}")
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="demo-data", help="the demo's dataset folder")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per run")
    a = ap.parse_args()
    shards = sorted(glob.glob(os.path.join(os.path.abspath(a.data), "*.jsonl")))
    if not shards:
        raise SystemExit(f"demo_compare: no *.jsonl in {a.data} (run python -m mmloader demo)")
    free = measure(shards, "mmloader_pipe", 0.0, a.seconds / 2)
    batch_ms = free["interval_ms"]["p50"] if free.get("interval_ms") else 1000.0 / 8
    step = round(1.2 * batch_ms, 1)
    print(
        f"\nside by side, the same {len(shards)} shard(s), batches of 8, a simulated trainer "
        f"step of {step:g} ms per batch (1.2x mmloader's production time), "
        f"{os.cpu_count()} CPU(s):"
    )
    rows = [
        ("PyTorch DataLoader + PIL + HF processor", "dataloader"),
        ("mmloader", "mmloader_pipe"),
    ]
    got = {}
    for name, mod in rows:
        r = measure(shards, mod, step, a.seconds)
        got[mod] = r
        print(
            f"  {name:40s} {r['samples_per_s']:7.1f} samples/s   wait-time ratio "
            f"{100 * r['wait_ratio']:5.1f}%"
        )
    dl, mm = got["dataloader"], got["mmloader_pipe"]
    print(
        f"  -> the trainer waits {100 * dl['wait_ratio']:.0f}% of its time on the DataLoader "
        f"and {100 * mm['wait_ratio']:.0f}% on mmloader; mmloader delivers "
        f"{mm['samples_per_s'] / dl['samples_per_s']:.1f}x the samples/s "
        f"(it is capped by the step: without one see the line above)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
