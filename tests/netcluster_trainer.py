"""A trainer process for tests/test_ray_netcluster.py, run inside a node of the emulated
cluster (scripts/netcluster.py):  python3 netcluster_trainer.py CONFIG.json OUT.json

CONFIG: address, mode ("stream" | "kill" | "frictions"), data, n (events), kw (Loader
arguments), ray (mmloader.ray.Loader arguments).  OUT: what happened, as JSON.  In "kill"
mode it prints "READY <ip of producer 1's node>" after `warm` batches, waits for a line on
stdin (the test has killed that node), then times every next().
"""

import hashlib
import json
import os
import sys
import time
import warnings

import numpy as np
import ray

import mmloader
import mmloader.ray as mray


def digest(batch):
    h = hashlib.sha256()
    for k in sorted(batch):
        a = np.ascontiguousarray(batch[k])
        h.update(f"{k}|{a.dtype}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def events(it, n, times=None):
    out = []
    while len(out) < n:
        t0 = time.monotonic()
        try:
            b = next(it)
        except StopIteration:
            out.append(["end"])
            continue
        except mmloader.SampleError as e:
            out.append(["error", type(e).__name__, str(e)])
            continue
        if times is not None:
            times.append(time.monotonic() - t0)
        out.append(["batch", digest(b)])
        del b
    return out


def stream(cfg):
    with mray.Loader(cfg["data"], **cfg["ray"], **cfg["kw"]) as L:
        got = events(L, cfg["n"])
        s = L.stats()
    return {"events": got, "stats": _stats(s)}


def _stats(s):
    keep = ("batches", "bytes", "bytes_transferred", "lost", "rerouted", "suspected")
    out = {k: s[k] for k in keep}
    out["producer_ips"] = [p["node_ip"] for p in s["producers"]]
    return out


def kill(cfg):
    alive_ips = lambda: {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}  # noqa: E731
    with mray.Loader(cfg["data"], **cfg["ray"], **cfg["kw"]) as L:
        got = events(L, cfg["warm"])
        before = []
        got += events(L, cfg["warm"], before)
        victim = L.stats()["producers"][1]["node_ip"]
        print("READY", victim, flush=True)
        sys.stdin.readline()  # the test killed the node
        after = []
        got += events(L, cfg["recover"], after)
        victim_alive = victim in alive_ips()  # Ray has not noticed yet?
        got += events(L, cfg["n"] - len(got), after)
        s = L.stats()
    return {
        "events": got,
        "stats": _stats(s),
        "victim": victim,
        "victim_alive_in_ray_after_recovery": victim_alive,
        "max_wait_before_s": max(before),
        "max_wait_after_s": max(after),
    }


def frictions(cfg):
    out = {}

    def attempt(name, fn):
        t0 = time.monotonic()
        try:
            fn()
            out[name] = {"ok": True}
        except Exception as e:  # noqa: BLE001 - reported to the test
            out[name] = {"ok": False, "type": type(e).__name__, "msg": str(e)}
        out[name]["s"] = time.monotonic() - t0

    kw = cfg["kw"]
    data = cfg["data"]

    def nomml():
        mray.Loader(data, producers=1, producer_resources={"CPU": 1, "nomml": 1}, **kw).close()

    def relative():
        os.chdir(os.path.dirname(data))
        with mray.Loader(
            os.path.basename(data), producers=1, producer_resources={"CPU": 1, "data": 1}, **kw
        ) as L:
            out["relative_events"] = events(L, 2)

    def unplaceable():
        mray.Loader(data, producers=2, producer_resources={"CPU": 1, "gpu_data": 1}, **kw)

    def node_local():
        mray.Loader(data, producers=2, placement="node-local", **kw)

    for name, fn in (
        ("nomml", nomml),
        ("relative", relative),
        ("unplaceable", unplaceable),
        ("node_local", node_local),
    ):
        attempt(name, fn)
    return out


def main():
    cfg = json.load(open(sys.argv[1]))
    warnings.simplefilter("ignore")
    ray.init(
        address=cfg["address"], log_to_driver=False, _node_ip_address=os.environ["MMLNC_NODE_IP"]
    )
    res = {"stream": stream, "kill": kill, "frictions": frictions}[cfg["mode"]](cfg)
    with open(sys.argv[2], "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
