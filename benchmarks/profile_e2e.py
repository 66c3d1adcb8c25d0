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
interpreter; torch; everything else.
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
        r"resize|resample|bicubic|rows_h|row_v|transpose_in|clip8|pack4",
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
LINE = re.compile(r"^\s+([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.+?)\s*$")


def _group(dso: str, sym: str) -> str:
    for name, sym_re, dso_re in GROUPS:
        if re.search(dso_re, dso) and re.search(sym_re, sym):
            return name
    return "other"


def parse(report: str) -> Tuple[List[Dict[str, object]], float]:
    """perf report --sort dso,sym text -> groups (share, top symbols), kernel share."""
    shares: Dict[str, float] = {}
    top: Dict[str, List[Tuple[float, str]]] = {}
    kernel = 0.0
    for line in report.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        pct, dso, _, sym = float(m.group(1)) / 100, m.group(2), m.group(3), m.group(4)
        if "kernel" in dso:
            kernel += pct
        g = _group(dso, sym)
        shares[g] = shares.get(g, 0.0) + pct
        top.setdefault(g, []).append((pct, sym))
    groups = [
        {
            "group": g,
            "share": s,
            "top": [f"{sym} {100 * p:.1f}%" for p, sym in sorted(top[g], reverse=True)[:4]],
        }
        for g, s in sorted(shares.items(), key=lambda kv: -kv[1])
    ]
    rest = 1.0 - sum(shares.values())
    if rest > 0.001:
        groups.append({"group": "symbols under 0.05% each", "share": rest, "top": []})
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
        if rec.returncode == 0:
            break
    assert rec is not None
    return rec, scope


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--records", type=int, default=512)
    ap.add_argument("--max-mp", type=float, default=12.0, help="the dataset's largest photo")
    ap.add_argument("--threads", type=int, default=0, help="default: the cores")
    ap.add_argument("--mmloader-kwargs", default="{}", help="JSON: extra Loader options")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "profile.json"))
    args = ap.parse_args(argv[1:])
    if not shutil.which("perf"):
        print("perf is not installed (Debian: apt-get install linux-perf)", file=sys.stderr)
        return 2
    from benchmarks.pipelines import dataset
    from benchmarks.pipelines.common import make_config

    shard = dataset.repeated(dataset.cached(args.records, photos=True, max_mp=args.max_mp), 16)
    threads = args.threads or len(os.sched_getaffinity(0))
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
        mmloader_kwargs=json.loads(args.mmloader_kwargs),
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
        print((rec.stderr + stderr)[-3000:], file=sys.stderr)
        return 1
    res = next(
        json.loads(ln[len("MMLBENCH ") :])
        for ln in stdout.splitlines()[::-1]
        if ln.startswith("MMLBENCH ")
    )
    rep = subprocess.run(
        [
            "perf",
            "report",
            "-i",
            data,
            "--stdio",
            "--no-children",
            "--sort",
            "dso,sym",
            "--percent-limit",
            "0.05",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    n = re.search(r"# Samples: (\S+)", rep)
    groups, kernel = parse(rep)
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = {
        "tool": f"perf record -F 499 -e cpu-clock, {scope}",
        "what": f"mmloader, {threads} threads, local disk, steady state: the {args.seconds:g} s "
        f"after the warm-up of a {res['samples']}-sample, {res['wall_s']:.0f} s measurement, "
        f"options {args.mmloader_kwargs}; measured {when} on "
        f"{rev or 'an unknown commit'}, 1-min load average {load0:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after",
        "samples": n.group(1) if n else "?",
        "kernel_share": kernel,
        "cpu_ms_per_sample": 1000 * (res.get("steady_cpu_s_per_sample") or res["cpu_s_per_sample"]),
        "faults_per_batch": res.get("faults_per_batch"),
        "groups": groups,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    shutil.rmtree(tmp, ignore_errors=True)
    for g in groups:
        print(f"{100 * g['share']:5.1f}%  {g['group']:50s} {', '.join(g['top'][:3])}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
