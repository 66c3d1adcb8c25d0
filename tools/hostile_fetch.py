"""Hostile servers against the fetch layer (issue 29, items 7-11), measured.

Each case runs in a child process capped at 6 GiB of address space (RLIMIT_AS) and a wall
limit; the server runs in this process and counts the body bytes it wrote.  Prints one row
per case: outcome (the first line of the error, or "ok ..."), seconds, requests and bytes
served, and the child's peak RSS.

    python tools/hostile_fetch.py [CASE ...] [--limit-s 60]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "servers"))
sys.path.insert(0, os.environ.get("MML_PATH") or os.path.join(HERE, ".."))

from faultserver import FaultServer  # noqa: E402

CAP = 6 << 30
LINE = json.dumps(
    {
        "messages": [
            {"role": "user", "content": "Say something."},
            {"role": "assistant", "content": "Something."},
        ]
    }
).encode() + b"\n"


def tiny_tok() -> str:
    import mmloader

    return os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")


def loader(data, **kw):
    import mmloader

    args = dict(
        tokenizer=tiny_tok(),
        micro_batch_size=4,
        num_threads=2,
        prefetch=2,
        shuffle=True,
        fetch_stall_s=2.0,
        fetch_retry_budget_s=10.0,
    )
    args.update(kw)
    return mmloader.Loader(data, **args)


# ---- what the child does -------------------------------------------------------------


def child_loader_batches(data, nbatches, kw):
    with loader(data, **kw) as L:
        it = iter(L)
        for _ in range(nbatches):
            next(it)
    return f"ok, {nbatches} batches"


def child_fetch(url, kw):
    from mmloader import _core

    f = _core.Fetcher(**kw)
    b = f.get(url)
    return f"ok, {len(b)} bytes"


def child_redact(texts):
    from mmloader import _core

    leaks = [t for t in texts if "SECRET" in _core.redact(t)]
    return f"{len(leaks)} of {len(texts)} leak" if leaks else f"0 of {len(texts)} leak"


def _child(q, fn, args):
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))
    t0 = time.monotonic()
    try:
        out = fn(*args)
    except BaseException as e:  # noqa: BLE001 - reported, not handled
        out = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if not str(e):
            out += traceback.format_exc(limit=2)
    q.put((out, time.monotonic() - t0))


def measure(name, srv, fn, args, limit_s):
    q = mp.get_context("fork").Queue()
    p = mp.get_context("fork").Process(target=_child, args=(q, fn, args))
    b0, r0 = (srv.bytes_sent, len(srv.log)) if srv else (0, 0)
    t0 = time.monotonic()
    p.start()
    out, dt = None, None
    while p.is_alive() and time.monotonic() - t0 < limit_s:
        try:
            out, dt = q.get(timeout=0.2)
            break
        except Exception:  # noqa: BLE001 - queue.Empty
            pass
    if out is None:
        p.kill()
        out, dt = f"still running after {limit_s:.0f} s (killed)", time.monotonic() - t0
    _, status, ru = os.wait4(p.pid, 0)
    served = (srv.bytes_sent - b0, len(srv.log) - r0) if srv else (0, 0)
    print(
        f"{name:22s} | {out[:150]:150s} | {dt:6.1f} s | {served[1]:7d} req "
        f"| {served[0] / 1e6:9.1f} MB | rss {ru.ru_maxrss / 1024:7.0f} MB",
        flush=True,
    )


# ---- cases ---------------------------------------------------------------------------


def case_endless206(limit_s):
    with FaultServer(infinite={"/inf.jsonl": LINE}) as srv:
        measure("endless 206 shard", srv, child_loader_batches, (srv.url("/inf.jsonl"), 1, {}), limit_s)


def shard_bytes(mib):
    n = (mib << 20) // len(LINE)
    return LINE * n


def case_norange_shard(limit_s):
    with FaultServer(objects={"/big.jsonl": shard_bytes(100)}, ranges=False) as srv:
        measure("no-Range 100 MiB shard", srv, child_loader_batches, (srv.url("/big.jsonl"), 3, {}), limit_s)


def case_list_cycle(limit_s):
    objs = {f"/bkt/d{i:05d}.jsonl": LINE for i in range(2500)}
    with FaultServer(objects=objs, list_cycle=True) as srv:
        kw = dict(s3_endpoint=f"http://127.0.0.1:{srv.port}", s3_region="us-east-1")
        os.environ.update(AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="y")
        measure("S3 listing A,B,A,...", srv, child_loader_batches, ("s3://bkt/d*.jsonl", 1, kw), limit_s)


def case_nonretryable(limit_s):
    kw = dict(max_object_bytes=1 << 20, stall_s=2, retry_budget_s=30)
    for kind in ("endless", "bigheaders", "badchunk", "redirect"):
        with FaultServer(objects={"/x.bin": b"x" * 1000}, script={"/x.bin": [kind] * 100}) as srv:
            measure(f"non-retryable {kind}", srv, child_fetch, (srv.url("/x.bin"), kw), limit_s)


def case_redact(limit_s):
    texts = [
        'image "https://h/a.jpg?x=1"&token=SECRET": 404',
        "image <https://h/a.jpg?x=<&sig=SECRET>: 404",
        "image `https://h/a.jpg?x=`&X-Amz-Signature=SECRET`",
        "image https://h/a.jpg#access_token=SECRET",
        "image https://h/a.jpg?x=1#token=SECRET",
        'image https://u:p"SECRET@h/a.jpg',
    ]
    measure("redact (_core.redact)", None, child_redact, (texts,), limit_s)


CASES = {
    "endless206": case_endless206,
    "norange": case_norange_shard,
    "listcycle": case_list_cycle,
    "nonretryable": case_nonretryable,
    "redact": case_redact,
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="*", default=list(CASES))
    ap.add_argument("--limit-s", type=float, default=60)
    a = ap.parse_args()
    for c in a.cases:
        CASES[c](a.limit_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
