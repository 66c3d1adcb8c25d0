"""mmloader.ray across shaped links: an emulated cluster (scripts/netcluster.py: network
namespaces on a bridge, each node's link limited by tc tbf, Ray started with `ray start`
in each), the trainer in its own namespace, every batch crossing two shaped links.

Slow (the cluster takes about a minute to start); needs root, iproute2 and ray, else the
tests skip and say which.  MML_NETCLUSTER_MBIT sets the link rate (default 200).
"""

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

pytest.importorskip("ray", reason="ray is not installed (pip install ray)")

import mmloader  # noqa: E402
from mmloader.datagen import make_dataset  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINER = os.path.join(ROOT, "tests", "netcluster_trainer.py")
KW = dict(tokenizer="tiny", micro_batch_size=4, seed=7, num_threads=1, max_pixels=128 * 28 * 28)
RATE = float(os.environ.get("MML_NETCLUSTER_MBIT", "200"))


def _netcluster():
    spec = importlib.util.spec_from_file_location(
        "netcluster", os.path.join(ROOT, "scripts", "netcluster.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def cluster():
    nc = _netcluster()
    why = nc.available()
    if why:
        pytest.skip(f"emulated cluster unavailable: {why}")
    nodes = nc.layout(trainers=1, data=3, data_cpus=2)
    # a node where mmloader is not importable (this repository hidden from its processes)
    nodes.append({"name": "nomml", "num_cpus": 1, "resources": {"nomml": 1}, "hide_repo": True})
    c = nc.NetCluster(nodes, rate_mbit=RATE).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("raynet"))
    make_dataset(root, n_samples=48, seed=3, n_images=10, min_size=64, max_size=320)
    return root


def _trainer(c, tmp_path, cfg, stdin=None):
    """Runs tests/netcluster_trainer.py in the trainer's node (node 0); its JSON result."""
    cfg = dict(cfg, address=c.address)
    cpath, opath = tmp_path / "cfg.json", tmp_path / "out.json"
    cpath.write_text(json.dumps(cfg))
    return c.popen(
        0,
        [sys.executable, TRAINER, str(cpath), str(opath)],
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    ), opath


def _result(p, opath, timeout=600):
    p.wait(timeout=timeout)
    assert p.returncode == 0, f"trainer failed ({p.returncode})"
    return json.loads(opath.read_text())


def _digest(batch):
    h = hashlib.sha256()
    for k in sorted(batch):
        a = np.ascontiguousarray(np.from_dlpack(batch[k]))
        h.update(f"{k}|{a.dtype}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _local(data, n, **kw):
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mmloader.Loader(data, **dict(KW, **kw)) as L:
            while len(out) < n:
                try:
                    out.append(["batch", _digest(next(L))])
                except StopIteration:
                    out.append(["end"])
    return out


def _len(data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return len(mmloader.Loader(data, **KW))


def test_frictions_are_clear_errors(cluster, dataset, tmp_path):
    p, o = _trainer(cluster, tmp_path, {"mode": "frictions", "data": dataset, "kw": KW})
    r = _result(p, o)
    nomml = cluster.nodes[-1]
    # a node without mmloader: which node, what to install
    assert r["nomml"]["type"] == "Error", r["nomml"]
    assert f"not importable on node {nomml.ip}" in r["nomml"]["msg"]
    assert f"pip install mmloader=={mmloader.__version__}" in r["nomml"]["msg"]
    # a relative path is resolved here, on the driver, not on the producer's node
    assert r["relative"]["ok"], r["relative"]
    assert r["relative_events"] == _local(dataset, 2)
    # a request the cluster can never hold: said at once (placement_timeout_s is 120 s),
    # with the nodes' resources
    assert r["unplaceable"]["type"] == "ConfigError", r["unplaceable"]
    assert "can never hold" in r["unplaceable"]["msg"] and "gpu_data" in r["unplaceable"]["msg"]
    print("unplaceable reported after", round(r["unplaceable"]["s"], 2), "s")
    # node-local on a trainer node with 0 CPUs
    assert r["node_local"]["type"] == "ConfigError", r["node_local"]
    assert f"node-local': this node ({cluster.nodes[0].ip}) has" in r["node_local"]["msg"]


def test_stream_over_shaped_links_is_bitwise(cluster, dataset, tmp_path):
    n = 2 * _len(dataset) + 2
    want = _local(dataset, n)
    rx0 = cluster.nic_bytes()
    p, o = _trainer(
        cluster,
        tmp_path,
        {
            "mode": "stream",
            "data": dataset,
            "n": n,
            "kw": KW,
            "ray": {"producers": 3, "producer_resources": {"CPU": 1, "data": 1}},
        },
    )
    r = _result(p, o)
    rx1 = cluster.nic_bytes()
    assert r["events"] == want
    s = r["stats"]
    data_ips = {nd.ip for nd in cluster.nodes if nd.name.startswith("data")}
    assert set(s["producer_ips"]) == data_ips  # spread: one producer on each data node
    assert s["bytes_transferred"] == s["bytes"] > 0
    # every batch crossed the trainer's shaped link
    assert rx1["trainer0"]["rx"] - rx0["trainer0"]["rx"] >= s["bytes"]


def test_producer_node_killed_stream_exact_without_ray_heartbeat(cluster, dataset, tmp_path):
    n = 2 * _len(dataset) + 2
    want = _local(dataset, n)
    p, o = _trainer(
        cluster,
        tmp_path,
        {
            "mode": "kill",
            "data": dataset,
            "n": n,
            "warm": 3,
            "recover": 6,
            "kw": KW,
            "ray": {"producers": 3, "producer_resources": {"CPU": 1, "data": 1}},
        },
        stdin=True,
    )
    line = p.stdout.readline().split()
    assert line and line[0] == "READY", line
    victim = [i for i, nd in enumerate(cluster.nodes) if nd.ip == line[1]]
    assert victim and cluster.nodes[victim[0]].name.startswith("data")
    assert cluster.kill_node(victim[0])
    p.stdin.write("go\n")
    p.stdin.flush()
    r = _result(p, o)
    assert r["events"] == want  # nothing lost, duplicated or reordered
    s = r["stats"]
    print({k: v for k, v in r.items() if k != "events"})
    assert s["rerouted"] + s["lost"] >= 1, s  # the dead node's requests were made again
    # the loader moved the dead node's batches before Ray declared the node dead (its
    # heartbeat timeout): it did not wait for Ray
    assert r["victim_alive_in_ray_after_recovery"], r
    print(
        f"longest wait in next(): {r['max_wait_before_s']:.2f} s before the kill, "
        f"{r['max_wait_after_s']:.2f} s after it ({RATE:g} Mbit/s links)"
    )
