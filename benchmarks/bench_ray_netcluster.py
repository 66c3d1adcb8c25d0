"""mmloader.ray on an emulated cluster with shaped links: the {pack, spread} x {one
coordinator driver, direct per-rank fetch} ablation at two scales.

    sudo python3 benchmarks/bench_ray_netcluster.py       # root: namespaces, veth, tc

The cluster is scripts/netcluster.py: one network namespace per node on a bridge, each
node's link shaped with tc tbf to MML_NETCLUSTER_MBIT (200) Mbit/s both ways, Ray started
with `ray start` in each; the trainers' batches cross their node's link as on real NICs.
Scales: small = 1 trainer node, 2 data nodes, 2 producers; large = 2 trainer nodes (DP
ranks 0 and 1), 3 data nodes, 3 producers per rank.  Data nodes advertise room for every
rank's producers (as a big data node would), so Ray's PACK may put all of them on one.
Arms:
  pack / spread       placement="pack" (a PACK placement group) or "spread" (rank-aware)
  coordinator         one driver on trainer 0 holds every rank's loader
                      (mmloader.ray.loaders(dp_size=N)) and takes their batches in turn
  direct              one trainer process per rank, on its own node (the default use)
Each run: every rank takes MML_BENCH_RAY_BATCHES (24) batches after a warm-up batch,
started together; batches/s = all ranks' batches / the slowest rank's time.  Bytes per NIC
are the bridge ports' counters over the run.  Link capacity is measured first: one data
node sending 18 MiB objects to trainer 0 through Ray.  Medians of MML_BENCH_RAY_RUNS (3).
MML_BENCH_RAY_SCALES (small,large) and MML_BENCH_RAY_ARMS pick scales and arms.
Writes benchmarks/results/ray-netcluster.json and benchmarks/results-ray-netcluster.md.
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
OUT = os.environ.get("MML_BENCH_OUT", os.path.join(HERE, "results"))
SCALES = {
    "small": dict(trainers=1, data=2, producers=2),
    "large": dict(trainers=2, data=3, producers=3),
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
    kw = dict(cfg["kw"], producers=cfg["producers"], placement=cfg["placement"])
    kw["producer_resources"] = {"CPU": 1, "data": 1}
    if cfg["ranks"] is None:  # direct: this process is rank cfg["rank"]
        Ls = [mray.Loader(cfg["data"], dp_rank=cfg["rank"], dp_size=cfg["dp"], **kw)]
    else:  # coordinator: every rank's loader in this one driver
        Ls = mray.loaders(cfg["data"], dp_size=cfg["dp"], **kw)
    for L in Ls:
        next(L)
    print("READY", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    nbytes = 0
    for _ in range(cfg["n"]):
        for L in Ls:
            b = next(L)
            nbytes += sum(v.nbytes for v in b.values())
            del b
    dt = time.perf_counter() - t0
    st = [L.stats() for L in Ls]
    res = {
        "batches": cfg["n"] * len(Ls),
        "seconds": dt,
        "bytes": nbytes,
        "producer_ips": [[p["node_ip"] for p in s["producers"]] for s in st],
        "wait_time_ratio": [s["wait_time_ratio"] for s in st],
    }
    for L in Ls:
        L.close()
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


def _run_arm(c, data: str, scale: dict, placement: str, transport: str, tmp: str) -> dict:
    dp = scale["trainers"]
    base = dict(
        address=c.address,
        data=data,
        kw=KW,
        producers=scale["producers"],
        placement=placement,
        dp=dp,
        n=N,
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
        "batches_per_s": batches / secs,
        "bytes_per_s": nbytes / secs,
        "batch_bytes": nbytes / batches,
        "nic": nic,
        "producer_ips": [ranks for r in results for ranks in r["producer_ips"]],
        "data_nodes_used": len(set(ips)),
        "seconds": secs,
    }


def run_scale(name: str, data: str) -> dict:
    import tempfile

    nc = _netcluster()
    sc = SCALES[name]
    # data nodes: room for every rank's producers on one node
    cpus = sc["trainers"] * sc["producers"]
    nodes = nc.layout(sc["trainers"], sc["data"], data_cpus=cpus)
    for nd in nodes:  # room for every batch in flight: no spilling to disk
        nd["object_store_mb"] = 1024
    out: dict = {"scale": dict(sc), "arms": {}}
    with nc.NetCluster(nodes, rate_mbit=RATE) as c, tempfile.TemporaryDirectory() as tmp:
        out["link_bytes_per_s"] = _link_probe(c)
        arms = os.environ.get("MML_BENCH_RAY_ARMS", "")  # e.g. "spread, direct;pack, direct"
        for placement in ("pack", "spread"):
            for transport in ("coordinator", "direct"):
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
                        f"{runs[-1]['producer_ips']}",
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
        "load_start": os.getloadavg()[0],
        "scales": {},
    }
    for name in os.environ.get("MML_BENCH_RAY_SCALES", ",".join(SCALES)).split(","):
        res["scales"][name] = run_scale(name, data)
    res["load_end"] = os.getloadavg()[0]
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "ray-netcluster.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = report(res)
    with open(os.path.join(HERE, "results-ray-netcluster.md"), "w") as f:
        f.write(md)
    if OUT == os.path.join(HERE, "results"):
        _put(os.path.join(ROOT, "docs", "ray.md"), "ray-netcluster-results", md)
        _put(os.path.join(ROOT, "README.md"), "ray-netcluster-table", short(res))
    print(md)
    return res


def _put(path: str, marker: str, text: str) -> None:
    """Replaces what lies between <!-- marker:start --> and <!-- marker:end --> in path."""
    a, b = f"<!-- {marker}:start -->\n", f"<!-- {marker}:end -->"
    doc = open(path, encoding="utf-8").read()
    if a in doc and b in doc:
        head, rest = doc.split(a, 1)
        note = "<!-- Generated by benchmarks/bench_ray_netcluster.py; do not edit by hand. -->\n"
        with open(path, "w", encoding="utf-8") as f:
            f.write(head + a + note + text + b + rest.split(b, 1)[1])


def short(r: dict) -> str:
    """The README's table: batches/s per arm and scale, share of the trainers' links."""
    names = list(r["scales"])
    head = " | ".join(
        f"{n}: {s['scale']['trainers']} trainer(s), {s['scale']['data']} data nodes"
        for n, s in r["scales"].items()
    )
    lines = [
        f"Emulated cluster, {r['rate_mbit']:g} Mbit/s links (tc tbf), one 2-core machine; "
        f"batches/s (share of the trainers' links), medians of {r['runs']} runs:",
        "",
        f"| placement, fetch | {head} |",
        "|---" * (1 + len(names)) + "|",
    ]
    for arm in r["scales"][names[0]]["arms"]:
        cells = []
        for n in names:
            s = r["scales"][n]
            a = s["arms"][arm]
            batch = statistics.mean(x["batch_bytes"] for x in a["runs"])
            cap = s["scale"]["trainers"] * s["link_bytes_per_s"] / batch
            cells.append(f"{a['batches_per_s']:.2f} ({a['batches_per_s'] / cap:.0%})")
        lines.append(f"| {arm} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def report(r: dict) -> str:
    mib = float(1 << 20)
    lines = [
        f"**Emulated** cluster (scripts/netcluster.py: one network namespace per node, each "
        f"link shaped with tc tbf to {r['rate_mbit']:g} Mbit/s both ways; one machine, "
        f"{r['cores']} cores shared), {r['when']}, load {r['load_start']:.1f} -> "
        f"{r['load_end']:.1f}; medians of {r['runs']} runs of {r['batches']} batches per rank.",
        "",
        "| scale | placement, fetch | batches/s (runs) | of trainer links | MiB/s per "
        "trainer NIC (rx) | MiB/s per data NIC (tx) |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in r["scales"].items():
        sc = s["scale"]
        label = f"{name}: {sc['trainers']} trainer(s), {sc['data']} data nodes, {sc['producers']} producers/rank"
        link = s["link_bytes_per_s"]
        for arm, a in s["arms"].items():
            runs = a["runs"]
            batch = statistics.mean(x["batch_bytes"] for x in runs)
            cap = sc["trainers"] * link / batch
            med = min(runs, key=lambda x: abs(x["batches_per_s"] - a["batches_per_s"]))
            tr = [
                f"{v['rx'] / med['seconds'] / mib:.1f}"
                for k, v in med["nic"].items()
                if k.startswith("trainer")
            ]
            dn = [
                f"{v['tx'] / med['seconds'] / mib:.1f}"
                for k, v in med["nic"].items()
                if k.startswith("data")
            ]
            vals = ", ".join(f"{x['batches_per_s']:.2f}" for x in runs)
            lines.append(
                f"| {label} | {arm} | {a['batches_per_s']:.2f} ({vals}) | "
                f"{a['batches_per_s'] / cap:.0%} | {' / '.join(tr)} | {' / '.join(dn)} |"
            )
        lines.append(
            f"| {label} | (link: {link / mib:.1f} MiB/s each through Ray; batch "
            f"{batch / mib:.1f} MiB) | | | | |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "rank":
        rank_main(sys.argv[2])
    else:
        run_all()
