"""Where mmloader's CPU goes in the end-to-end run: samples the whole process (all threads,
kernel included) with `perf record` while mmloader runs the suite's local measurement, in
its steady state only (perf attaches when the runner's warm-up ends, so imports, start-up
and the first batches are not in the profile, as they are not in the CPU per sample),
groups the samples by what they do, and writes benchmarks/results/profile.json, which
benchmarks/report.py turns into the README's profile table.

    python3 benchmarks/profile_e2e.py [--seconds 30] [--records 512] [--mmloader-kwargs JSON]

Needs `perf` (Debian: linux-perf) allowed to sample the kernel (root, or
kernel.perf_event_paranoid <= 1); without kernel access it samples user space only and says
so.  Groups (first match wins, on the symbol, then the shared object): page faults and
page zeroing in the kernel; other kernel work; memmove/memcpy/memset; image decoders
(libjpeg-turbo, libpng, zlib, libwebp, giflib, libtiff, and mmloader's glue around them);
mmloader's resize; mmloader's
normalise/patchify/collate; mmloader's tokenizer; the rest of mmloader; the Python
interpreter; torch; everything else.  Every sample is counted (no percent limit): code
without symbols (libjpeg-turbo's SIMD kernels are not exported, so perf sees bare
addresses) is grouped by its shared object, one row per object.

It profiles each of --formats (default: float32 and uint8, the two CPU-per-sample targets)
in its own measurement: the JSON's top level is the first format's profile, and each other
format's profile is under its name (e.g. "uint8"), with the same keys.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

# (group, symbol regex, shared-object regex); first match wins
GROUPS: List[Tuple[str, str, str]] = [
    (
        "kernel: page faults, page zeroing",
        r"clear_page|page_fault|handle_mm_fault|"
        r"do_anonymous_page|folio|alloc_pages|get_page_from_freelist|zap_|unmap|lru|"
        r"rmqueue|__mod_memcg|memcg|mmap|munmap|madvise|tlb|alloc_frozen|free_unref|"
        r"free_pages|pcp|buddy|list_del|pte|pmd|vma",
        r"kernel",
    ),
    ("kernel: other (syscalls, scheduling, I/O)", r".", r"kernel"),
    ("memmove / memcpy / memset", r"mem(move|cpy|set)|__memmove|__memcpy|__memset", r"."),
    (
        "image decoders (libjpeg-turbo, libpng, zlib, ...)",
        r".",
        r"libjpeg|libturbojpeg|libpng|libz\.|libdeflate|libwebp|libgif|libtiff",
    ),
    (  # mmloader's own decoder glue (row conversion, callbacks): decode-only runs it too
        "image decoders (libjpeg-turbo, libpng, zlib, ...)",
        r"^decode_(jpeg|png|animated)|^mml_(image|bmp|gif|tiff|webp)_decode|png_|jpeg|"
        r"^gif_|tiff_line|rgba_row|cmyk|rle_decode|full_row|limit_row",
        r"_core",
    ),
    (
        "mmloader: resize",
        r"resize|resample|bicubic|rows?_[hv]|pixel_h|transpose_in|clip8|pack4",
        r"_core",
    ),
    (
        "mmloader: normalise, patchify, collate",
        r"vision|patch|norm|flush_block|lut|collate|"
        r"emit|pixel|write_(f32|bf16|u8)|expand",
        r"_core",
    ),
    (
        "mmloader: tokenizer, template",
        r"token|bpe|pretok|template|utf8|unicode",
        r"_core|libutf8proc",
    ),
    ("mmloader: other (records, loader, pool)", r".", r"_core"),
    ("Python interpreter", r".", r"libpython|python3"),
    ("torch", r".", r"libtorch|libc10"),
    ("libc: malloc / free", r"malloc|free|_int_|calloc|realloc|arena", r"libc"),
]
# perf report -n: "  12.34%  5678  dso  [k]  symbol"; shares come from the sample counts
LINE = re.compile(r"^\s+[\d.]+%\s+(\d+)\s+(\S+)\s+\[(.)\]\s+(.+?)\s*$")
ADDRESS = re.compile(r"^0x[0-9a-fA-F]+$")


def _group(dso: str, sym: str) -> str:
    for name, sym_re, dso_re in GROUPS:
        if re.search(dso_re, dso) and re.search(sym_re, sym):
            return name
    return "other"


def parse(report: str) -> Tuple[List[Dict[str, object]], float]:
    """perf report -n --sort dso,sym text -> groups (share, top symbols), kernel share."""
    shares: Dict[str, float] = {}
    top: Dict[str, Dict[str, float]] = {}
    kernel = 0.0
    rows = [m.groups() for m in map(LINE.match, report.splitlines()) if m]
    total = sum(int(r[0]) for r in rows) or 1
    for count, dso, _, sym in rows:
        pct = int(count) / total
        if ADDRESS.match(sym):  # no symbol: one row for all of the object's addresses
            sym = f"{dso} (no symbols)"
        if "kernel" in dso:
            kernel += pct
        g = _group(dso, sym)
        shares[g] = shares.get(g, 0.0) + pct
        syms = top.setdefault(g, {})
        syms[sym] = syms.get(sym, 0.0) + pct
    groups = [
        {
            "group": g,
            "share": s,
            "top": [
                f"{sym} {100 * p:.1f}%"
                for sym, p in sorted(top[g].items(), key=lambda kv: -kv[1])[:4]
            ],
        }
        for g, s in sorted(shares.items(), key=lambda kv: -kv[1])
    ]
    return groups, kernel


def _record(
    run: "subprocess.Popen[str]", steady: str, data: str, seconds: float
) -> Tuple["subprocess.CompletedProcess[str]", str]:
    """Waits for the runner's steady state, then records all its threads for `seconds`
    (kernel too where perf may; else user space only).  Returns (perf's result, scope)."""
    deadline = time.monotonic() + 600
    while not os.path.exists(steady):
        if run.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the measurement ended before its steady state")
        time.sleep(0.05)
    rec = None
    for event, scope in (
        ("cpu-clock", "user space and kernel"),
        ("cpu-clock:u", "user space only (no kernel access for perf)"),
    ):
        cmd = ["perf", "record", "-F", "499", "-e", event, "-o", data, "-p", str(run.pid)]
        rec = subprocess.run(cmd + ["--", "sleep", f"{seconds:g}"], capture_output=True, text=True)
        if rec.returncode == 0 or run.poll() is not None:  # done, or nothing left to record
            break
    if run.poll() is not None and rec.returncode:
        raise RuntimeError(f"the measurement ended while perf recorded it: {rec.stderr[-500:]}")
    assert rec is not None
    return rec, scope


def _profile(args: argparse.Namespace, shard: str, threads: int, fmt: str) -> Dict[str, object]:
    """One measurement of mmloader with pixel_format=`fmt`, perf over its steady state ->
    the profile's JSON object.  Raises RuntimeError when the measurement or perf fails."""
    from benchmarks.pipelines.common import make_config

    kwargs = dict(json.loads(args.mmloader_kwargs), pixel_format=fmt)
    tmp = tempfile.mkdtemp(prefix="mml-profile-")
    data = os.path.join(tmp, "perf.data")
    steady = os.path.join(tmp, "steady")
    # the runner's warm-up is a quarter of min_seconds: perf records `seconds` after it
    cfg = make_config(
        [shard],
        module="mmloader_pipe",
        threads=threads,
        prefetch=4,
        inflight=64,
        min_samples=512,
        min_seconds=args.seconds * 4 / 3 + 2,
        pss=False,
        steady_file=steady,
        mmloader_kwargs=kwargs,
    )
    env = dict(os.environ, PYTHONPATH=ROOT)
    load0 = os.getloadavg()[0]
    run = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.pipelines.runner", json.dumps(cfg)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        rec, scope = _record(run, steady, data, args.seconds)
    finally:
        stdout, stderr = run.communicate(timeout=600)
    if rec.returncode or run.returncode:
        raise RuntimeError((rec.stderr + stderr)[-3000:])
    res = next(
        json.loads(ln[len("MMLBENCH ") :])
        for ln in stdout.splitlines()[::-1]
        if ln.startswith("MMLBENCH ")
    )
    rep = subprocess.run(
        ["perf", "report", "-i", data, "--stdio", "--no-children", "-n", "--sort", "dso,sym"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    shutil.rmtree(tmp, ignore_errors=True)
    n = re.search(r"# Samples: (\S+)", rep)
    groups, kernel = parse(rep)
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return {
        "tool": f"perf record -F 499 -e cpu-clock, {scope}",
        "pixel_format": fmt,
        "what": f"mmloader, {threads} threads, local disk, steady state: the {args.seconds:g} s "
        f"after the warm-up of a {res['samples']}-sample, {res['wall_s']:.0f} s measurement, "
        f"options {json.dumps(kwargs)}; measured {when} on "
        f"{rev or 'an unknown commit'}, 1-min load average {load0:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after",
        "samples": n.group(1) if n else "?",
        "kernel_share": kernel,
        "cpu_ms_per_sample": 1000 * (res.get("steady_cpu_s_per_sample") or res["cpu_s_per_sample"]),
        "faults_per_batch": res.get("faults_per_batch"),
        "groups": groups,
    }


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--records", type=int, default=512)
    ap.add_argument("--max-mp", type=float, default=12.0, help="the dataset's largest photo")
    ap.add_argument("--threads", type=int, default=0, help="default: the cores")
    ap.add_argument("--formats", default="float32,uint8", help="pixel formats, comma-separated")
    ap.add_argument("--mmloader-kwargs", default="{}", help="JSON: extra Loader options")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "profile.json"))
    args = ap.parse_args(argv[1:])
    if not shutil.which("perf"):
        print("perf is not installed (Debian: apt-get install linux-perf)", file=sys.stderr)
        return 2
    from benchmarks.pipelines import dataset

    # enough passes over the records that the measurement never runs out of samples before
    # perf is done (up to ~600 samples/s: uint8 on 2 cores does ~280 on small photo sets)
    need = 600 * (args.seconds * 4 / 3 + 2)
    times = max(16, -(-int(need) // max(1, args.records)))
    shard = dataset.repeated(dataset.cached(args.records, photos=True, max_mp=args.max_mp), times)
    threads = args.threads or len(os.sched_getaffinity(0))
    out: Dict[str, object] = {}
    for i, fmt in enumerate(f for f in args.formats.split(",") if f):
        try:
            prof = _profile(args, shard, threads, fmt)
        except RuntimeError as e:
            print(f"{fmt}: {e}", file=sys.stderr)
            return 1
        if i == 0:
            out.update(prof)
        else:
            out[fmt] = prof
        print(f"{fmt}: {prof['cpu_ms_per_sample']:.2f} ms CPU per sample")
        for g in prof["groups"]:  # type: ignore[union-attr]
            print(f"{100 * g['share']:5.1f}%  {g['group']:50s} {', '.join(g['top'][:3])}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
