"""Process A/B of the exact path's CPU per image against its decode-only floor, two builds
alternating (issue 34's targets: CPU per sample <= 1.2x decode-only with uint8, <= 1.4x with
float32, in the Loader and the one-call ImageProcessor, at the recipe caps).

    git worktree add --detach /tmp/mml-base main && (cd /tmp/mml-base && bash scripts/build.sh)
    python3 benchmarks/exact_ab.py --base /tmp/mml-base [--new .] [--rounds 3] [--repeats 3]

The photos are bench_recipe_caps.py's 14 (3-12 MP re-encodes of tests/photos.py), written
once to a temporary folder.  Each round runs one child process per build (cwd = that
checkout, so it imports that tree's mmloader), the order alternating between rounds
(base, new / new, base / ...).  A child measures, for each cap (768x768, 200,704 and the
model's limits), REPEATS repeats of these peers in turn, CPU time (time.process_time) per
image on one thread, exactly as bench_recipe_caps.py's `measure` does:

    decode_full           _core.decode_only of the 14 files (the floor)
    exact_uint8/float32   mmloader.ImageProcessor(max_pixels=cap) on the 14 files
    loader_uint8/float32  a one-thread Loader, 3 x 14 samples (records cycled), process CPU
                          per sample (the caps only)

and reports each peer / the same repeat's decode_full.  A run's figure is the median over
its repeats; the report gives, per build, the median over its runs and every run's value.
Times are ratios measured in one run; nothing is asserted.  The load average is printed
with every child.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import json, os, statistics, sys, time
sys.path.insert(0, os.getcwd())
import mmloader
from mmloader import _core
folder, repeats = sys.argv[1], int(sys.argv[2])
names = sorted(f for f in os.listdir(folder) if f.endswith(".jpg"))
files = [open(os.path.join(folder, f), "rb").read() for f in names]
shard = os.path.join(folder, "train.jsonl")
tok = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
n = len(files)

def cpu_ms(fn, k):
    c = time.process_time(); fn(); return (time.process_time() - c) / k * 1e3

def loader_ms(cap, fmt, k):
    c = time.process_time(); got = 0
    with mmloader.Loader(shard, tokenizer=tok, micro_batch_size=2, max_pixels=cap,
                         pixel_format=fmt, num_threads=1, cycle=True) as L:
        for b in L:
            got += int(b["image_grid_thw"].shape[0])
            if got >= k:
                break
    return (time.process_time() - c) / got * 1e3

out = {"load": [os.getloadavg()[0]]}
for cap_name, cap in (("768x768", 768 * 768), ("200704", 200704), ("model", None)):
    kw = {} if cap is None else {"max_pixels": cap}
    proc = {f: mmloader.ImageProcessor("qwen2.5-vl", pixel_format=f, **kw)
            for f in ("uint8", "float32")}
    for p in proc.values():
        p(files[:2])  # warm the scratch
    peers = {"decode_full": lambda: cpu_ms(lambda: _core.decode_only(files), n),
             "exact_uint8": lambda: cpu_ms(lambda: proc["uint8"](files), n),
             "exact_float32": lambda: cpu_ms(lambda: proc["float32"](files), n)}
    if cap is not None:
        peers["loader_uint8"] = lambda: loader_ms(cap, "uint8", 3 * n)
        peers["loader_float32"] = lambda: loader_ms(cap, "float32", 3 * n)
    runs = {k: [] for k in peers}
    for _ in range(repeats):
        for k, fn in peers.items():
            runs[k].append(fn())
    res = {}
    for k, v in runs.items():
        res[k + "_ms"] = statistics.median(v)
        if k != "decode_full":
            res[k + "_ratio"] = statistics.median(
                a / b for a, b in zip(v, runs["decode_full"]))
    out[cap_name] = res
    out["load"].append(os.getloadavg()[0])
print(json.dumps(out))
"""


def write_photos(folder: str) -> None:
    sys.path.insert(0, HERE)
    from bench_recipe_caps import make_photos

    with open(os.path.join(folder, "train.jsonl"), "w") as shard:
        for i, d in enumerate(make_photos()):
            p = os.path.join(folder, f"photo-{i:02d}.jpg")
            with open(p, "wb") as f:
                f.write(d)
            msg = [
                {"role": "user", "content": "<image>What is in the photo?"},
                {"role": "assistant", "content": "A photo."},
            ]
            shard.write(json.dumps({"messages": msg, "images": [p]}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="checkout of the build before (built in place)")
    ap.add_argument("--new", default=os.path.dirname(HERE), help="checkout of the build after")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--env", default="", help="NAME=VALUE[,NAME=VALUE] for both children")
    args = ap.parse_args()
    env = dict(os.environ)
    for kv in filter(None, args.env.split(",")):
        k, v = kv.split("=", 1)
        env[k] = v
    env.pop("PYTHONPATH", None)
    builds = {"base": os.path.abspath(args.base), "new": os.path.abspath(args.new)}
    got: dict = {"base": [], "new": []}
    with tempfile.TemporaryDirectory() as folder:
        write_photos(folder)
        for r in range(args.rounds):
            order = ["base", "new"] if r % 2 == 0 else ["new", "base"]
            for b in order:
                p = subprocess.run(
                    [sys.executable, "-c", CHILD, folder, str(args.repeats)],
                    cwd=builds[b],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                if p.returncode:
                    sys.exit(f"[exact_ab] {b} child failed:\n{p.stderr}")
                res = json.loads(p.stdout.strip().splitlines()[-1])
                got[b].append(res)
                load = ", ".join(f"{x:.1f}" for x in res["load"])
                print(f"[exact_ab] round {r + 1} {b}: load {load}", flush=True)
    print(
        f"[exact_ab] base {builds['base']}, new {builds['new']}, {args.rounds} rounds x "
        f"{args.repeats} repeats; per build: median of the runs (each run's value)"
    )
    for cap in ("768x768", "200704", "model"):
        keys = [k for k in got["base"][0][cap]]
        for k in keys:
            line = []
            for b in ("base", "new"):
                v = [res[cap][k] for res in got[b]]
                line.append(f"{statistics.median(v):7.3f} ({', '.join(f'{x:.3f}' for x in v)})")
            print(f"[exact_ab] {cap:8s} {k:22s} base {line[0]}  new {line[1]}")


if __name__ == "__main__":
    main()
