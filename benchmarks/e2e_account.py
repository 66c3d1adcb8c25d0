"""What the Loader end to end adds to the image work at a recipe cap, step by step (issue 34).

    python3 benchmarks/e2e_account.py [--rounds 3] [--cap 589824] [--batches 60]

On bench_e2e.py's recipe-cap photos (MML_BENCH_PHOTO_MP=recipe: 64 records, 70 JPEGs
re-encoded at 3-12 MP, the records repeated, each pass shuffled), CPU time per sample (a
record: 1.09 images), one child process per figure, every figure once per round, the
order reversed every other round; the report gives the median of the rounds and each
round's value:

    decode_full / decode_scaled   _core.decode_only of each record's images, one thread,
                                  at full size / at fast_decode's scales (the floors)
    ip_exact_u8 / ip_fast_u8      mmloader.ImageProcessor(pixel_format="uint8"), one call
                                  per image (the one-call path)
    loader <mode> T<n>            the bench's Loader configuration (its pipelines/
                                  mmloader_pipe.py settings: batches of 8, prefetch 4,
                                  max_inflight 64, the cap as max_pixels) with n threads,
                                  uint8 (-u8) or float32 pixels, exact or fast_decode:
                                  the process's CPU over `--batches` batches after 12 of
                                  warm-up

So the steps: decode alone -> a one-thread uint8 Loader (the rest of the image work and
everything else) -> two threads -> float32 pixels (the expansion at emission).  The
1-min load average is printed with each figure.  Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def shard_paths() -> Dict[str, str]:
    from benchmarks.pipelines import dataset

    shard = dataset.cached(64, photos=True, max_mp=12.0, photo_mp=dataset.RECIPE_MP)
    return {"shard": shard, "long": dataset.repeated(shard, 256)}


def child_images(cap: int, shard: str) -> Dict[str, Any]:
    import mmloader
    from mmloader import _core

    root = os.path.dirname(shard)
    with open(shard, encoding="utf-8") as f:
        lines = [ln for ln in f if ln.strip()]
    paths = [os.path.join(root, m) for ln in lines for m in re.findall(r"images/[^\"]+", ln)]
    datas = []
    for p in paths:
        with open(p, "rb") as f:
            datas.append(f.read())
    kw = dict(max_pixels=cap, min_pixels=3136)
    procs = {
        f: mmloader.ImageProcessor("qwen2.5-vl", fast_decode=f, pixel_format="uint8", **kw)
        for f in (False, True)
    }
    scales = [int(procs[True].plan(d)["decode_scale"]) for d in datas]
    for p in procs.values():
        for d in datas:  # warm: each processor's buffers at their largest
            p([d])

    def cpu(fn: Any) -> float:
        c = time.process_time()
        fn()
        return (time.process_time() - c) / len(lines) * 1e3

    return {
        "decode_full": cpu(lambda: _core.decode_only(datas)),
        "decode_scaled": cpu(lambda: _core.decode_only(datas, scales)),
        "ip_exact_u8": cpu(lambda: [procs[False]([d]) for d in datas]),
        "ip_fast_u8": cpu(lambda: [procs[True]([d]) for d in datas]),
    }


def child_loader(cap: int, shard: str, mode: str, threads: int, batches: int) -> Dict[str, Any]:
    import mmloader
    from benchmarks.pipelines.common import default_tokenizer_file

    kw: Dict[str, Any] = dict(
        tokenizer=default_tokenizer_file()[0],
        preset="qwen2.5-vl",
        micro_batch_size=8,
        num_threads=threads,
        prefetch=4,
        shuffle=False,
        min_pixels=3136,
        max_pixels=cap,
        max_inflight=64,
    )
    if mode.startswith("fast"):
        kw["fast_decode"] = True
    if mode.endswith("-u8"):
        kw["pixel_format"] = "uint8"
    warm = 12
    n, c0 = 0, 0.0
    with mmloader.Loader([shard], **kw) as L:
        for i, b in enumerate(L):
            if i == warm:
                r = resource.getrusage(resource.RUSAGE_SELF)
                c0 = r.ru_utime + r.ru_stime
            elif i > warm:
                n += int(b["input_ids"].shape[0])
            del b
            if i == warm + batches:
                break
        r = resource.getrusage(resource.RUSAGE_SELF)
    return {"ms": (r.ru_utime + r.ru_stime - c0) / n * 1e3}


def run_child(args: List[str]) -> Dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=ROOT, TOKENIZERS_PARALLELISM="false")
    p = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if p.returncode:
        raise SystemExit(p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cap", type=int, default=589824)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--child", nargs="*")
    a = ap.parse_args()
    if a.child is not None:
        kind, rest = a.child[0], a.child[1:]
        if kind == "images":
            out = child_images(int(rest[0]), rest[1])
        else:
            out = child_loader(int(rest[0]), rest[1], rest[2], int(rest[3]), int(rest[4]))
        print(json.dumps(out))
        return
    sh = shard_paths()
    steps = [("fast-u8", 1), ("fast-u8", 2), ("fast", 2), ("exact-u8", 1), ("exact-u8", 2)]
    steps.append(("exact", 2))
    res: Dict[str, List[float]] = {}
    for k in range(a.rounds):
        load = os.getloadavg()[0]
        d = run_child(["images", str(a.cap), sh["shard"]])
        for name, v in d.items():
            res.setdefault(name, []).append(v)
        print(f"round {k} load {load:.2f} " + " ".join(f"{n} {v:.2f}" for n, v in d.items()))
        for mode, t in steps if k % 2 == 0 else steps[::-1]:
            load = os.getloadavg()[0]
            args = ["loader", str(a.cap), sh["long"], mode, str(t), str(a.batches)]
            v = run_child(args)["ms"]
            res.setdefault(f"loader {mode} T{t}", []).append(v)
            print(f"round {k} load {load:.2f} loader {mode} T{t} {v:.2f}", flush=True)
    print(f"load at the end {os.getloadavg()[0]:.2f}; CPU ms per sample, median (rounds):")
    for name, v in res.items():
        print(f"  {name:22s} {statistics.median(v):6.2f}  ({', '.join(f'{x:.2f}' for x in v)})")


if __name__ == "__main__":
    main()
