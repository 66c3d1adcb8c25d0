"""mmloader.ray on an emulated cluster with shaped links: the {pack, spread} x {one
coordinator driver, direct per-rank fetch} ablation at two scales.

    sudo python3 benchmarks/bench_ray_netcluster.py       # root: namespaces, veth, tc

The cluster is scripts/netcluster.py: one network namespace per node on a bridge, each
node's link shaped with tc tbf to MML_NETCLUSTER_MBIT (200) Mbit/s both ways, Ray started
with `ray start` in each; the trainers' batches cross their node's link as on real NICs.
Scales: small = 1 trainer node, 2 data nodes, 2 producers; large = 2 trainer nodes (DP
ranks 0 and 1), 3 data nodes, 3 producers per rank.  Data nodes advertise room for every
rank's producers (as a big data node would).
Arms:
  pack                every rank's producers on ONE data node (the case study's failure):
                      placement="pack" plus a custom resource only data node 0 has
                      ("pin"), because Ray's PACK alone puts each rank's placement group on
                      a node of its own here (one node per rank, not one for all)
  ray-pack            placement="pack" alone (Ray's choice; large scale only)
  spread              placement="spread" (rank-aware, the default)
  coordinator         one driver on trainer 0 holds every rank's loader
                      (mmloader.ray.loaders(dp_size=N)) and takes their batches in turn
  direct              one trainer process per rank, on its own node (the default use)
Kill (scale "kill": 1 trainer, 4 data nodes, 3 producers, direct, spread): after a few
batches every process of producer 1's node is killed (its link stays up); the longest
next() after that, Ray's own time to declare the node dead, and every batch's digest
against the in-process mmloader.Loader, per run (one more node dies each run).
Each run: every rank takes MML_BENCH_RAY_BATCHES (24) batches after a warm-up batch and
the batches it had requested ahead (refs_in_flight, untimed: they were fetched while it
waited to start), started together; batches/s = all ranks' timed batches / the slowest
rank's time.  Bytes per NIC
are the bridge ports' counters over the run.  Link capacity is measured first: one data
node sending 18 MiB objects to trainer 0 through Ray.  Medians of MML_BENCH_RAY_RUNS (3).
MML_BENCH_RAY_SCALES (small,large,kill) and MML_BENCH_RAY_ARMS pick scales and arms;
MML_BENCH_RAY_MERGE=1 keeps the other scales of an earlier results file; MML_BENCH_RAY_KW
(JSON) adds mmloader.ray.Loader arguments to every arm (an A/B of e.g. refs_in_flight).
Writes benchmarks/results/ray-netcluster.json and benchmarks/results-ray-netcluster.md,
and the tables in docs/ray.md (`... docs`: those again from the JSON); the README links to
them and shows no table of its own (one benchmark table there: the end-to-end one).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

RUNS = int(os.environ.get("MML_BENCH_RAY_RUNS", "3"))
N = int(os.environ.get("MML_BENCH_RAY_BATCHES", "24"))
RATE = float(os.environ.get("MML_NETCLUSTER_MBIT", "200"))
MAX_PIXELS = int(os.environ.get("MML_BENCH_RAY_MAX_PIXELS", str(448 * 448)))
KW = dict(
    tokenizer="tiny", micro_batch_size=4, seed=0, num_threads=1, cycle=True, max_pixels=MAX_PIXELS
)
# mmloader.ray.Loader arguments beyond the arm's (e.g. '{"refs_in_flight": 6}': an A/B)
RAY_KW = json.loads(os.environ.get("MML_BENCH_RAY_KW", "{}"))
OUT = os.environ.get("MML_BENCH_OUT", os.path.join(HERE, "results"))
SCALES = {
    "small": dict(trainers=1, data=2, producers=2),
    "large": dict(trainers=2, data=3, producers=3),
}
KILL = dict(trainers=1, data=4, producers=3)
ARMS = [(p, t) for p in ("pack", "spread") for t in ("coordinator", "direct")]
LARGE_ONLY = [("ray-pack", "direct")]
LABEL = {
    "pack": "pack (one data node)",
    "ray-pack": "pack (Ray's PACK alone)",
    "spread": "spread (rank-aware)",
}
RESOURCES = {  # per producer: "pin" exists on data node 0 only
    "pack": {"CPU": 1, "data": 1, "pin": 1},
    "ray-pack": {"CPU": 1, "data": 1},
    "spread": {"CPU": 1, "data": 1},
}


def _dataset() -> str:
    from mmloader.datagen import make_dataset

    root = os.path.join("/tmp", "mmloader-bench-ray-net")
    if not os.path.exists(os.path.join(root, "ready")):
        make_dataset(
            root,
            n_samples=96,
            seed=0,
            n_images=48,
            min_size=448,
            max_size=640,
            text_only_fraction=0.0,
            two_image_fraction=0.0,
        )
        open(os.path.join(root, "ready"), "w").close()
    return root


# ---- inside a trainer node ---------------------------------------------------------------
def rank_main(cfg_path: str) -> None:
    """One trainer process: builds its loader(s), takes a warm-up batch, prints READY,
    waits for a line on stdin, takes N batches per rank, prints the result as JSON."""
    import ray

    import mmloader.ray as mray

    cfg = json.load(open(cfg_path))
    warnings.simplefilter("ignore")
    ray.init(
        address=cfg["address"], log_to_driver=False, _node_ip_address=os.environ["MMLNC_NODE_IP"]
    )
    placement = "pack" if cfg["placement"] == "ray-pack" else cfg["placement"]
    kw = dict(cfg["kw"], producers=cfg["producers"], placement=placement, **cfg["ray_kw"])
    kw["producer_resources"] = RESOURCES[cfg["placement"]]
    if cfg.get("kill"):
        return kill_main(cfg, kw)
    if cfg["ranks"] is None:  # direct: this process is rank cfg["rank"]
        Ls = [mray.Loader(cfg["data"], dp_rank=cfg["rank"], dp_size=cfg["dp"], **kw)]
    else:  # coordinator: every rank's loader in this one driver
        Ls = mray.loaders(cfg["data"], dp_size=cfg["dp"], **kw)
    for L in Ls:
        next(L)
    # the batches requested ahead (refs_in_flight) are made and fetched while the ranks
    # wait for "go": they are taken first, untimed, so that every arm is timed in its
    # steady state whatever its depth (else a deeper one looks faster by its head start)
    ahead = max(L.stats()["refs_in_flight"] for L in Ls)
    print("READY", flush=True)
    sys.stdin.readline()
    t_go = time.perf_counter()
    nbytes = 0
    for i in range(ahead + cfg["n"]):
        if i == ahead:
            t0 = time.perf_counter()
        for L in Ls:
            b = next(L)
            if i >= ahead:
                nbytes += sum(v.nbytes for v in b.values())
            del b
    t1 = time.perf_counter()
    dt = t1 - t0
    st = [L.stats() for L in Ls]
    res = {
        "batches": cfg["n"] * len(Ls),
        "seconds": dt,
        "seconds_all": t1 - t_go,
        "untimed_batches": ahead * len(Ls),
        "bytes": nbytes,
        "producer_ips": [[p["node_ip"] for p in s["producers"]] for s in st],
        "wait_time_ratio": [s["wait_time_ratio"] for s in st],
        # where each rank's time went (mmloader.ray's stats()["fetch"]) and each
        # producer's own time per batch made: why a link was idle, when one was
        "fetch": [s["fetch"] for s in st],
        "producer_s_per_batch": [
            [p["busy_s"] / max(1, p["made"]) for p in s["producers"]] for s in st
        ],
        "load": os.getloadavg()[0],
        "suspected": sum(s["suspected"] for s in st),
        "rerouted": sum(s["rerouted"] for s in st),
        "ping_rtt_s": [s["ping_rtt_s"] for s in st],  # the watch's pings, per rank
        "placement": [s["placement"] for s in st],
    }
    for L in Ls:
        L.close()
    print("RESULT " + json.dumps(res), flush=True)


def _digest(batch) -> str:
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    for k in sorted(batch):
        v = batch[k]
        a = np.ascontiguousarray(v if isinstance(v, np.ndarray) else np.from_dlpack(v))
        h.update(f"{k}|{a.dtype}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def kill_main(cfg: dict, kw: dict) -> None:
    """Kill run, in the trainer: `warm` batches, "READY <producer 1's node>", waits while
    the orchestrator kills that node, then times each next() of N more batches; after the
    stream, how long Ray took to declare the node dead (from the kill)."""
    import ray

    import mmloader.ray as mray

    digests, waits = [], []
    with mray.Loader(cfg["data"], **kw) as L:
        for _ in range(cfg["warm"]):
            digests.append(_digest(next(L)))
        victim = L.stats()["producers"][1]["node_ip"]
        print("READY " + victim, flush=True)
        sys.stdin.readline()  # the node is dead now
        t_kill = time.monotonic()
        for _ in range(cfg["n"]):
            t0 = time.monotonic()
            b = next(L)
            waits.append(time.monotonic() - t0)
            digests.append(_digest(b))
            del b
        stream_s = time.monotonic() - t_kill
        st = L.stats()
    alive_after_stream = any(n["Alive"] and n["NodeManagerAddress"] == victim for n in ray.nodes())
    dead_s = None
    while time.monotonic() - t_kill < 120:
        if not any(n["Alive"] and n["NodeManagerAddress"] == victim for n in ray.nodes()):
            dead_s = time.monotonic() - t_kill
            break
        time.sleep(0.25)
    res = {
        "victim": victim,
        "digests": digests,
        "waits": waits,
        "stream_s": stream_s,
        "victim_alive_in_ray_after_stream": alive_after_stream,
        "ray_declared_dead_s": dead_s,
        "rerouted": st["rerouted"],
        "suspected": st["suspected"],
        "lost": st["lost"],
    }
    print("RESULT " + json.dumps(res), flush=True)


# ---- the orchestrator (root namespace) ---------------------------------------------------
def _netcluster():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import netcluster

    return netcluster


def _link_probe(c) -> float:
    """Bytes/s one data node sends trainer 0 through Ray (18 MiB objects, 4 at once)."""
    code = (
        "import ray, numpy as np, time\n"
        f"ray.init(address={c.address!r}, log_to_driver=False)\n"
        "@ray.remote(num_cpus=1, resources={'data': 1})\n"
        "def make(i):\n"
        "    return np.full((18 << 20) // 4, i, dtype=np.float32)\n"
        "best = 0.0\n"
        "for _ in range(2):\n"
        "    refs = [make.remote(i) for i in range(4)]\n"
        "    ray.wait(refs, num_returns=4, fetch_local=False)\n"
        "    t = time.perf_counter()\n"
        "    ray.get(refs)\n"
        "    best = max(best, 4 * (18 << 20) / (time.perf_counter() - t))\n"
        "print(best)\n"
    )
    r = subprocess.run(
        c.command(0, [sys.executable, "-c", code]),
        env=c._env(c.nodes[0]),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return float(r.stdout.strip().splitlines()[-1])


def _local_digests(data: str, n: int) -> list:
    import mmloader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mmloader.Loader(data, **KW) as L:
            return [_digest(next(L)) for _ in range(n)]


def run_kill(data: str) -> dict:
    """The producer-node kill, RUNS times on one cluster (a node more dies each run)."""
    import tempfile

    nc = _netcluster()
    warm = 4
    want = _local_digests(data, warm + N)
    nodes = nc.layout(KILL["trainers"], KILL["data"], data_cpus=KILL["producers"])
    for nd in nodes:
        nd["object_store_mb"] = 1024
    runs = []
    with nc.NetCluster(nodes, rate_mbit=RATE) as c, tempfile.TemporaryDirectory() as tmp:
        for i in range(RUNS):
            cfg = dict(
                address=c.address, data=data, kw=KW, producers=KILL["producers"],
                placement="spread", dp=1, rank=0, ranks=None, n=N, warm=warm, kill=True,
                ray_kw=RAY_KW,
            )  # fmt: skip
            path = os.path.join(tmp, f"kill{i}.json")
            json.dump(cfg, open(path, "w"))
            p = c.popen(
                0,
                [sys.executable, os.path.abspath(__file__), "rank", path],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            )
            line = ""
            while not line.startswith("READY"):
                line = p.stdout.readline()
                if not line:
                    p.kill()
                    p.wait()
                    raise RuntimeError("kill run: the trainer did not start")
            victim = line.split()[1]
            idx = [nd.index for nd in c.nodes if nd.ip == victim]
            assert idx and c.nodes[idx[0]].name.startswith("data"), victim
            c.kill_node(idx[0])
            p.stdin.write("go\n")
            p.stdin.flush()
            out, _ = p.communicate(timeout=400)
            line = [x for x in out.splitlines() if x.startswith("RESULT ")]
            if not line:
                raise RuntimeError(f"kill run: the trainer failed ({p.returncode}): {out[-2000:]}")
            r = json.loads(line[-1][7:])
            r["exact"] = r.pop("digests") == want
            r["max_wait_s"] = max(r["waits"])
            print(
                f"[kill] run {i}: node {victim} killed; longest next() {r['max_wait_s']:.2f} s, "
                f"Ray declared it dead after {r['ray_declared_dead_s']} s, exact {r['exact']}",
                flush=True,
            )
            runs.append(r)
    return {
        "scale": dict(KILL),
        "runs": runs,
        "max_wait_s": statistics.median(r["max_wait_s"] for r in runs),
        "ray_declared_dead_s": statistics.median(
            r["ray_declared_dead_s"] for r in runs if r["ray_declared_dead_s"] is not None
        ),
    }


def _run_arm(c, data: str, scale: dict, placement: str, transport: str, tmp: str) -> dict:
    load_before = os.getloadavg()[0]
    dp = scale["trainers"]
    base = dict(
        address=c.address,
        data=data,
        kw=KW,
        producers=scale["producers"],
        placement=placement,
        dp=dp,
        n=N,
        ray_kw=RAY_KW,
    )
    if transport == "direct":
        cfgs = [(r, dict(base, rank=r, ranks=None)) for r in range(dp)]
    else:
        cfgs = [(0, dict(base, rank=0, ranks=list(range(dp))))]
    procs = []
    for i, (node, cfg) in enumerate(cfgs):
        path = os.path.join(tmp, f"rank{i}.json")
        json.dump(cfg, open(path, "w"))
        p = c.popen(
            node,
            [sys.executable, os.path.abspath(__file__), "rank", path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        procs.append(p)
    for p in procs:
        seen = []
        while True:  # Ray prints its own messages to the driver's stdout too
            line = p.stdout.readline()
            if not line or line.startswith("READY"):
                break
            seen.append(line)
        if not line:
            for q in procs:
                q.kill()
                q.wait()
            raise RuntimeError(f"a trainer did not start: {''.join(seen)[-2000:]}")
    nic0 = c.nic_bytes()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
                q.wait()
            raise RuntimeError("a trainer hung (240 s)") from None
        line = [x for x in out.splitlines() if x.startswith("RESULT ")]
        if not line:  # (a crash in Ray at exit after RESULT does not void the run)
            raise RuntimeError(f"a trainer failed ({p.returncode}): {out[-2000:]}")
        results.append(json.loads(line[-1][7:]))
    nic1 = c.nic_bytes()
    nic = {k: {d: nic1[k][d] - nic0[k][d] for d in ("rx", "tx")} for k in nic1}
    batches = sum(r["batches"] for r in results)
    secs = max(r["seconds"] for r in results)
    nbytes = sum(r["bytes"] for r in results)
    ips = [ip for r in results for ranks in r["producer_ips"] for ip in ranks]
    return {
        "seconds_all": max(r["seconds_all"] for r in results),  # the NICs' window
        "fetch": [f for r in results for f in r["fetch"]],
        "producer_s_per_batch": [x for r in results for x in r["producer_s_per_batch"]],
        "load": max(r["load"] for r in results),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "suspected": sum(r["suspected"] for r in results),
        "rerouted": sum(r["rerouted"] for r in results),
        "ping_rtt_s": [x for r in results for x in r.get("ping_rtt_s", [])],
        "placement": [x for r in results for x in r.get("placement", [])],
        "batches_per_s": batches / secs,
        "bytes_per_s": nbytes / secs,
        "batch_bytes": nbytes / batches,
        "nic": nic,
        "producer_ips": [ranks for r in results for ranks in r["producer_ips"]],
        "data_nodes_used": len(set(ips)),
        "seconds": secs,
    }


def _why(run: dict) -> str:
    """Per rank: the trainer's wait, the part of it with nothing crossing its link (the
    producers were behind), batches crossing at once, and the producers' time per batch."""
    out = []
    for f, ps in zip(run["fetch"], run["producer_s_per_batch"]):
        if not f.get("requests"):
            continue
        out.append(
            f"wait {f['wait_s']:.1f} s (idle link {f['wait_idle_s']:.1f} s), "
            f"crossing {f['transfers_mean']:.1f} at once, transfer p50 "
            f"{f['transfer_s_p50']:.2f} s, made p50 {f['made_s_p50']:.2f} s, service p50 "
            f"{f['service_s_p50']:.2f} s, producer s/batch " + "/".join(f"{x:.2f}" for x in ps)
        )
    moved = f"suspected {run.get('suspected', 0)}, rerouted {run.get('rerouted', 0)}; "
    for x in run.get("ping_rtt_s", []):
        moved += (
            f"pings {x['pings']}: rtt p50 {x['p50']:.3f} p99 {x['p99']:.3f} max {x['max']:.2f} s, "
            f"{x['over_floor']} over the deadline's floor; "
        )
    modes = sorted({p["mode"] for p in run.get("placement", [])})
    moved += f"placement {'/'.join(modes)}; load {run.get('load_before', 0):.1f} -> "
    moved += f"{run.get('load_after', 0):.1f}; "
    return moved + "; ".join(out)


def run_scale(name: str, data: str) -> dict:
    import tempfile

    nc = _netcluster()
    sc = SCALES[name]
    # data nodes: room for every rank's producers on one node
    cpus = sc["trainers"] * sc["producers"]
    nodes = nc.layout(sc["trainers"], sc["data"], data_cpus=cpus)
    for nd in nodes:  # room for every batch in flight: no spilling to disk
        nd["object_store_mb"] = 1024
    nodes[sc["trainers"]]["resources"]["pin"] = cpus  # data node 0: the "pack" arm's node
    out: dict = {"scale": dict(sc), "arms": {}}
    with nc.NetCluster(nodes, rate_mbit=RATE) as c, tempfile.TemporaryDirectory() as tmp:
        out["link_bytes_per_s"] = _link_probe(c)
        arms = os.environ.get("MML_BENCH_RAY_ARMS", "")  # e.g. "spread, direct;pack, direct"
        for placement, transport in ARMS + (LARGE_ONLY if name == "large" else []):
            if arms and f"{placement}, {transport}" not in arms.split(";"):
                continue
            runs = []
            failed = 0
            while len(runs) < RUNS:
                try:
                    runs.append(_run_arm(c, data, sc, placement, transport, tmp))
                except RuntimeError as e:  # a worker killed (the machine's OOM killer)
                    failed += 1
                    print(f"[{name}] {placement}, {transport}: run failed: {e}", flush=True)
                    if failed > RUNS:
                        raise
                    continue
                print(
                    f"[{name}] {placement}, {transport}: "
                    f"{runs[-1]['batches_per_s']:.2f} batches/s, data nodes "
                    f"{runs[-1]['producer_ips']}, load {runs[-1]['load']:.1f}, "
                    f"{_why(runs[-1])}",
                    flush=True,
                )
            out["arms"][f"{placement}, {transport}"] = {
                "batches_per_s": statistics.median(r["batches_per_s"] for r in runs),
                "runs": runs,
                "failed_runs": failed,
            }
    return out


def run_all() -> dict:
    nc = _netcluster()
    why = nc.available()
    if why:
        raise SystemExit(f"bench_ray_netcluster: {why}")
    data = _dataset()
    res = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cores": len(os.sched_getaffinity(0)),
        "rate_mbit": RATE,
        "runs": RUNS,
        "batches": N,
        "config": KW,
        "ray_config": RAY_KW,
        "load_start": os.getloadavg()[0],
        "scales": {},
    }
    path = os.path.join(OUT, "ray-netcluster.json")
    if os.environ.get("MML_BENCH_RAY_MERGE") == "1" and os.path.exists(path):
        old = json.load(open(path))
        res["scales"] = old["scales"]
        res["kill"] = old.get("kill")
        res["load_start"] = min(res["load_start"], old["load_start"])
        res["when"] = old["when"]
        res["load_end_earlier"] = old["load_end"]
    for name in os.environ.get("MML_BENCH_RAY_SCALES", ",".join([*SCALES, "kill"])).split(","):
        if name == "kill":
            res["kill"] = run_kill(data)
        else:
            res["scales"][name] = run_scale(name, data)
    res["load_end"] = os.getloadavg()[0]
    res["scales"] = {k: res["scales"][k] for k in SCALES if k in res["scales"]}
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "ray-netcluster.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = report(res)
    if OUT == os.path.join(HERE, "results"):
        write_docs(res)
    else:  # another MML_BENCH_OUT leaves the docs as they are
        with open(os.path.join(OUT, "results-ray-netcluster.md"), "w") as f:
            f.write(md)
    print(md)
    return res


def write_docs(res: dict) -> None:
    """The results' tables into benchmarks/results-ray-netcluster.md and docs/ray.md, nowhere
    else (python3 benchmarks/bench_ray_netcluster.py docs: again from benchmarks/results/)."""
    with open(os.path.join(HERE, "results-ray-netcluster.md"), "w") as f:
        f.write(report(res))
    _put(os.path.join(ROOT, "docs", "ray.md"), "ray-netcluster-results", report(res))


def _put(path: str, marker: str, text: str) -> None:
    """Replaces what lies between <!-- marker:start --> and <!-- marker:end --> in path."""
    a, b = f"<!-- {marker}:start -->\n", f"<!-- {marker}:end -->"
    doc = open(path, encoding="utf-8").read()
    if a in doc and b in doc:
        head, rest = doc.split(a, 1)
        note = "<!-- Generated by benchmarks/bench_ray_netcluster.py; do not edit by hand. -->\n"
        with open(path, "w", encoding="utf-8") as f:
            f.write(head + a + note + text + b + rest.split(b, 1)[1])


def _label(arm: str) -> str:
    placement, transport = arm.split(", ")
    return f"{LABEL[placement]}, {transport}"


def _share(s: dict, a: dict) -> float:
    """batches/s as a share of the trainers' combined links (link probe / batch bytes)."""
    batch = statistics.mean(x["batch_bytes"] for x in a["runs"])
    return a["batches_per_s"] / (s["scale"]["trainers"] * s["link_bytes_per_s"] / batch)


def _load(r: dict) -> str:
    """The 1-minute load averages seen at the start and end of each part of the run, and
    before and after each arm's run."""
    xs = [r["load_start"], r["load_end"], r.get("load_end_earlier", r["load_end"])]
    for s in r["scales"].values():
        for a in s["arms"].values():
            xs += [x[k] for x in a["runs"] for k in ("load_before", "load_after") if k in x]
    return f"load {min(xs):.1f}-{max(xs):.1f}"


def _crossing(run: dict) -> str:
    xs = [f["transfers_mean"] for f in run.get("fetch", []) if f.get("requests")]
    return f"{statistics.mean(xs):.1f}" if xs else "-"


def _producer_s(runs: list) -> str:
    xs = [x for r in runs for ps in r.get("producer_s_per_batch", []) for x in ps]
    return f"{statistics.median(xs):.2f}" if xs else "-"


def report(r: dict) -> str:
    mib = float(1 << 20)
    lines = [
        f"**Emulated** cluster (scripts/netcluster.py: one network namespace per node, each "
        f"link shaped with tc tbf to {r['rate_mbit']:g} Mbit/s both ways; one machine, "
        f"{r['cores']} cores shared with other jobs), {r['when']}, {_load(r)}; medians of "
        f"{r['runs']} runs of {r['batches']} batches per rank (each run in brackets), timed "
        "after the batches each rank had requested ahead; crossing: batches on their way "
        "to a trainer at once (mean per rank); producer s: a producer's own time per batch "
        "(median over producers and runs); suspected: live producers the loaders suspected "
        "(a ping late past the deadline), per run.",
        "",
        "| scale | placement, fetch | batches/s (runs) | of trainer links | MiB/s per "
        "trainer NIC (rx) | MiB/s per data NIC (tx) | data nodes per rank | crossing | "
        "producer s | suspected (runs) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in r["scales"].items():
        sc = s["scale"]
        label = f"{name}: {sc['trainers']} trainer(s), {sc['data']} data nodes, {sc['producers']} producers/rank"
        link = s["link_bytes_per_s"]
        for arm, a in s["arms"].items():
            runs = a["runs"]
            batch = statistics.mean(x["batch_bytes"] for x in runs)
            med = min(runs, key=lambda x: abs(x["batches_per_s"] - a["batches_per_s"]))
            secs = med.get("seconds_all", med["seconds"])  # the NIC counters' window
            tr = [
                f"{v['rx'] / secs / mib:.1f}"
                for k, v in med["nic"].items()
                if k.startswith("trainer")
            ]
            dn = [
                f"{v['tx'] / secs / mib:.1f}" for k, v in med["nic"].items() if k.startswith("data")
            ]
            used = sorted({len(set(ips)) for x in runs for ips in x["producer_ips"]})
            shared = sorted({len(set(ip for ips in x["producer_ips"] for ip in ips)) for x in runs})
            vals = ", ".join(f"{x['batches_per_s']:.2f}" for x in runs)
            lines.append(
                f"| {label} | {_label(arm)} | {a['batches_per_s']:.2f} ({vals}) | "
                f"{_share(s, a):.0%} | {' / '.join(tr)} | {' / '.join(dn)} | "
                f"{'/'.join(map(str, used))} ({'/'.join(map(str, shared))} in all) | "
                f"{_crossing(med)} | {_producer_s(runs)} | "
                f"{', '.join(str(x['suspected']) if 'suspected' in x else '-' for x in runs)} |"
            )
        lines.append(
            f"| {label} | (link: {link / mib:.1f} MiB/s each through Ray; batch "
            f"{batch / mib:.1f} MiB) | | | | | | | | |"
        )
    k = r.get("kill")
    if k:
        sc = k["scale"]
        lines += [
            "",
            f"Producer node killed ({sc['trainers']} trainer, {sc['data']} data nodes, "
            f"{sc['producers']} producers, spread, direct; every process of producer 1's node "
            f"killed after 4 batches, its link up; {r['batches']} batches timed after it):",
            "",
            "| run | longest next() after the kill | Ray declared the node dead after | "
            "rerouted / lost requests | stream equals in-process |",
            "|---|---|---|---|---|",
        ]
        for i, x in enumerate(k["runs"]):
            dead = x["ray_declared_dead_s"]
            lines.append(
                f"| {i + 1} | {x['max_wait_s']:.2f} s | "
                f"{'%.1f s' % dead if dead is not None else 'not within 120 s'} | "
                f"{x['rerouted']} / {x['lost']} | {'yes' if x['exact'] else 'NO'} |"
            )
        lines.append(f"| median | {k['max_wait_s']:.2f} s | {k['ray_declared_dead_s']:.1f} s | | |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "rank":
        rank_main(sys.argv[2])
    elif sys.argv[1:] == ["docs"]:
        write_docs(json.load(open(os.path.join(OUT, "ray-netcluster.json"))))
    else:
        run_all()
