#!/usr/bin/env python3
"""Soak: a long run of the loader against the fault-injecting server (tests/servers),
compared batch by batch with a fault-free run of the same data read from local disk.

Faults (per request, deterministic in --seed): 1% 503, 0.5% cut bodies, 0.5% connection
resets, a few stalls: the transient faults a retry survives.  (An endless body, which
passes max_object_bytes without a declared size, cannot succeed by retrying: the loader
skips that sample at once, so it is tested on its own in tests/test_hostile_servers.py,
not here, where every batch must equal the fault-free run's.)  0.5% of the images are corrupt files (a data
fault, the same in both runs: those samples are skipped and counted in both).  Checks: no
crash, no hang, every batch equal to the fault-free one, resident memory and open file
descriptors flat (sampled over the run and reported).

    python3 scripts/soak.py --batches 20000 --out soak.json     (the full soak)
    python3 scripts/soak.py --batches 300                        (what CI runs, via pytest)
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import io
import json
import os
import random
import sys
import tempfile
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "servers"))

FAULT_RATES = {"503": 0.01, "truncate": 0.005, "reset": 0.005, "stall": 0.0004}
CORRUPT_FRACTION = 0.005


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _socket_inodes_on_port(port: int) -> set:
    """Inodes of the TCP sockets whose LOCAL port is `port`: the in-process server's listening
    and accepted sockets (the loader's own connections have it as their remote port)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if int(cols[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(cols[9])
        except OSError:
            pass
    return inodes


def open_fds(server_port: int = 0) -> Dict[str, int]:
    """Descriptors of this process, and those not held by the in-process server on
    `server_port`: a handler thread stalling or streaming an endless body keeps its accepted
    socket for seconds after the client gave up, which is the server's, not the loader's."""
    server = _socket_inodes_on_port(server_port) if server_port else set()
    total = own = 0
    for fd in os.listdir("/proc/self/fd"):
        total += 1
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if not (link.startswith("socket:[") and link[8:-1] in server):
            own += 1
    return {"all": total, "own": own}


def make_data(root: str, n_samples: int, n_images: int, seed: int) -> Dict[str, Any]:
    """n_samples records over n_images small JPEG/PNG files; CORRUPT_FRACTION of the files
    (at least one) cut short with garbage after their headers."""
    from PIL import Image

    rng = random.Random(seed)
    os.makedirs(os.path.join(root, "img"), exist_ok=True)
    names, corrupt = [], set()
    n_bad = max(1, round(n_images * CORRUPT_FRACTION))
    for i in range(n_images):
        w, h = rng.randint(24, 72), rng.randint(24, 72)
        im = Image.new("RGB", (w, h), tuple(rng.randrange(256) for _ in range(3)))
        for _ in range(6):  # a little structure, so resizing has work to do
            x, y = rng.randrange(w), rng.randrange(h)
            im.paste(
                tuple(rng.randrange(256) for _ in range(3)), (x, y, min(w, x + 9), min(h, y + 7))
            )
        ext = "png" if i % 5 == 0 else "jpg"
        b = io.BytesIO()
        im.save(b, "PNG" if ext == "png" else "JPEG", quality=85)
        data = b.getvalue()
        if i < n_bad:  # corrupt: valid header, then garbage
            data = data[: len(data) // 3] + bytes(rng.randrange(256) for _ in range(64))
            corrupt.add(i)
        name = f"img/{i:05d}.{ext}"
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)
        names.append(name)
    shard = os.path.join(root, "data.jsonl")
    with open(shard, "w") as f:
        for i in range(n_samples):
            k = rng.choice([0, 1, 1, 1, 2])
            imgs = [rng.randrange(n_images) for _ in range(k)]
            rec = {
                "messages": [
                    {"role": "user", "content": "<image>" * k + f"Question {i}?"},
                    {"role": "assistant", "content": f"Answer {i * 7}."},
                ],
                "images": [names[j] for j in imgs],
            }
            f.write(json.dumps(rec) + "\n")
    return {"shard": shard, "root": root, "corrupt": sorted(corrupt), "n_images": n_images}


def digest(batch) -> str:
    h = hashlib.blake2b(digest_size=16)
    for k in sorted(batch):
        a = batch[k].numpy()
        h.update(k.encode())
        h.update(str(a.shape).encode() + str(a.dtype).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def run(loader, batches: int, samples: int = 20, server_port: int = 0) -> Dict[str, Any]:
    out: List[str] = []
    trace = []
    every = max(1, batches // samples)
    t0 = time.monotonic()
    it = iter(loader)
    for i in range(batches):
        out.append(digest(next(it)))
        if i % every == 0 or i == batches - 1:
            fds = open_fds(server_port)
            trace.append(
                {
                    "batch": i + 1,
                    "s": round(time.monotonic() - t0, 1),
                    "rss_mb": round(rss_mb(), 1),
                    "fds": fds["own"],
                    "fds_all": fds["all"],
                }
            )
    return {
        "digests": out,
        "trace": trace,
        "seconds": time.monotonic() - t0,
        "stats": loader.stats(),
    }


def soak(
    batches: int = 20000, seed: int = 0, workdir: str = None, micro_batch_size: int = 2, log=print
) -> Dict[str, Any]:
    import mmloader
    from faultserver import FaultServer

    tok = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
    tmp = tempfile.TemporaryDirectory(prefix="mml-soak-") if workdir is None else None
    root = workdir or tmp.name
    n_samples = min(4000, max(200, batches * micro_batch_size // 4))
    data = make_data(root, n_samples=n_samples, n_images=400, seed=seed)
    common = dict(
        tokenizer=tok,
        micro_batch_size=micro_batch_size,
        num_threads=2,
        prefetch=2,
        cycle=True,
        seed=seed,
        min_pixels=28 * 28 * 4,
        max_pixels=28 * 28 * 16,
        max_error_rate=0.5,
    )
    log(
        f"[soak] {n_samples} samples, {data['n_images']} images ({len(data['corrupt'])} corrupt)"
        f", {batches} batches of {micro_batch_size}"
    )
    with mmloader.Loader(data["shard"], image_root=root, **common) as L:
        ref = run(L, batches)
    log(f"[soak] fault-free reference (local files): {ref['seconds']:.0f} s")
    srv = FaultServer(
        root=root, seed=seed, fault_rates=FAULT_RATES, retry_after=0, stall_s=2.0
    ).start()
    try:
        with mmloader.Loader(
            data["shard"],
            image_root=srv.url("/"),
            fetch_stall_s=0.5,
            fetch_retry_budget_s=60,
            fetch_min_rate=1024,
            max_object_bytes=1 << 20,
            **common,
        ) as L:
            got = run(L, batches, server_port=srv.port)
        faults = collections.Counter(srv.outcomes())
    finally:
        srv.stop()
    mismatch = [i for i, (a, b) in enumerate(zip(ref["digests"], got["digests"])) if a != b]
    trace = got["trace"]
    report = {
        "batches": batches,
        "micro_batch_size": micro_batch_size,
        "samples": n_samples,
        "images": data["n_images"],
        "corrupt_images": len(data["corrupt"]),
        "requests": sum(faults.values()),
        "faults_injected": {k: v for k, v in faults.items() if k != "ok"},
        "mismatched_batches": len(mismatch),
        "first_mismatch": mismatch[:5],
        "seconds_faulty": round(got["seconds"], 1),
        "seconds_reference": round(ref["seconds"], 1),
        "skipped_by_reason": got["stats"]["skipped_by_reason"],
        "skipped_by_reason_reference": ref["stats"]["skipped_by_reason"],
        "fetch": got["stats"].get("fetch", {}),
        "trace": trace,
        "rss_mb_first_last_max": [
            trace[0]["rss_mb"],
            trace[-1]["rss_mb"],
            max(t["rss_mb"] for t in trace),
        ],
        "fds_first_last_max": [trace[0]["fds"], trace[-1]["fds"], max(t["fds"] for t in trace)],
    }
    log(
        f"[soak] faulty run: {got['seconds']:.0f} s, {report['requests']} requests, faults "
        f"{report['faults_injected']}, skipped {report['skipped_by_reason']}"
    )
    log(
        f"[soak] mismatched batches: {len(mismatch)}; RSS MB first/last/max "
        f"{report['rss_mb_first_last_max']}; fds {report['fds_first_last_max']}"
    )
    if tmp:
        tmp.cleanup()
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the report (JSON) here")
    a = ap.parse_args()
    rep = soak(a.batches, a.seed)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rep, f, indent=1)
    ok = rep["mismatched_batches"] == 0
    print("[soak] " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
