"""An emulated multi-node Ray cluster on one machine: network namespaces, shaped links.

    python3 scripts/netcluster.py up --trainers 2 --data 3 --rate-mbit 200   # until Ctrl-C
    python3 scripts/netcluster.py cleanup    # namespaces left by runs that were killed

Needs root, ``ip`` (iproute2) and ``tc``.  Layout (PREFIX = "mmlnc<pid>-", one per process):

    PREFIX sw            a namespace holding only the bridge "br0" (no uplink: nothing leaves)
    PREFIX n0 .. n<N-1>  one namespace per node, 10.201.0.<i+1>/24 on "eth0", a veth to the
                         bridge; its link is shaped with tc tbf at rate_mbit in both
                         directions (eth0's egress: what the node sends; the bridge port's
                         egress: what it receives), so Ray's object-manager traffic between
                         nodes crosses two shaped links like two NICs on a switch.

Node 0 runs the Ray head (``ray start --head``), every node a raylet (``ray start``), each
with its own temp dir under /tmp/mmlnc<pid>/; ports are the defaults, each namespace has
its own port space.  Processes of a node are found by ``ip netns pids`` and ended by pid
(never ``ray stop``, which kills Ray processes host-wide by name).  A node may hide this
repository (``hide_repo``: its processes see an empty directory there, a machine without
mmloader installed).  Every address lives in namespaces made here; the root namespace gets
no interface, route or address.

Invariants:
  1. Teardown kills only pids inside this cluster's namespaces, then deletes them.
  2. Each node's link carries at most rate_mbit each way (tbf on both ends of its veth).
  3. nic_bytes() counts each node's link (rx, tx) from the bridge side, so traffic between
     processes of one node (through its loopback or shared memory) is not counted.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBNET = "10.201.0"
PORT = 6379


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def available() -> Optional[str]:
    """None when an emulated cluster can be made here, else why not (for a test skip)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs '{tool}' (apt-get install iproute2)"
    if shutil.which("ray") is None:
        return "needs the 'ray' command (pip install ray)"
    probe = f"mmlnc{os.getpid()}-probe"
    r = _run("ip", "netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    try:
        r = _run("ip", "-n", probe, "link", "add", "name", "br0", "type", "bridge", check=False)
        if r.returncode != 0:
            return f"cannot create a bridge in a namespace: {r.stderr.strip()}"
        r = _run(
            "ip",
            "-n",
            probe,
            "link",
            "add",
            "name",
            "va",
            "type",
            "veth",
            "peer",
            "name",
            "vb",
            check=False,
        )
        if r.returncode != 0:
            return f"cannot create a veth pair: {r.stderr.strip()}"
        r = _run(
            "tc", "-n", probe, "qdisc", "add", "dev", "va", "root", "tbf",
            "rate", "100mbit", "burst", "64kb", "latency", "50ms", check=False,
        )  # fmt: skip
        if r.returncode != 0:
            return f"tc tbf does not work here: {r.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


class Node:
    def __init__(self, index: int, ns: str, ip: str, spec: Dict) -> None:
        self.index, self.ns, self.ip, self.spec = index, ns, ip, spec
        self.name = spec.get("name", f"n{index}")
        self.temp_dir = ""
        self.node_id: Optional[str] = None


class NetCluster:
    """N nodes, each a namespace with a shaped link and a Ray raylet; node 0 is the head.

    nodes: one dict per node: num_cpus, resources (dict), object_store_mb (default 256),
    name, hide_repo (bool).  rate_mbit: each link's rate, both ways.
    """

    def __init__(self, nodes: Sequence[Dict], rate_mbit: float = 200.0) -> None:
        if not nodes:
            raise ValueError("at least one node")
        self.prefix = f"mmlnc{os.getpid()}-"
        self.rate_mbit = float(rate_mbit)
        self.sw = self.prefix + "sw"
        self.base = f"/tmp/mmlnc{os.getpid()}"
        self.nodes = [
            Node(i, f"{self.prefix}n{i}", f"{SUBNET}.{i + 1}", dict(s)) for i, s in enumerate(nodes)
        ]
        self.address = f"{self.nodes[0].ip}:{PORT}"
        self._up = False

    # ---- lifetime ----------------------------------------------------------------------
    def start(self, timeout_s: float = 120.0) -> "NetCluster":
        self._up = True
        atexit.register(self.stop)
        try:
            self._network()
            # the head first, then the others two at a time: `ray start` gives a raylet
            # 30 s to register, which a loaded 2-core machine can miss (then: again)
            self._ray_start(self.nodes[:1])
            for i in range(1, len(self.nodes), 2):
                self._ray_start(self.nodes[i : i + 2])
            self.wait_for_nodes(len(self.nodes), timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> "NetCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _network(self) -> None:
        _run("ip", "netns", "add", self.sw)
        _run("ip", "-n", self.sw, "link", "add", "name", "br0", "type", "bridge")
        _run("ip", "-n", self.sw, "link", "set", "br0", "up")
        _run("ip", "-n", self.sw, "link", "set", "lo", "up")
        for n in self.nodes:
            _run("ip", "netns", "add", n.ns)
            port = f"p{n.index}"
            # made in the node's namespace: the peer moves into the switch's
            _run(
                "ip",
                "-n",
                n.ns,
                "link",
                "add",
                "name",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                port,
            )
            _run("ip", "-n", n.ns, "link", "set", port, "netns", self.sw)
            _run("ip", "-n", self.sw, "link", "set", port, "master", "br0")
            _run("ip", "-n", self.sw, "link", "set", port, "up")
            _run("ip", "-n", n.ns, "addr", "add", f"{n.ip}/24", "dev", "eth0")
            _run("ip", "-n", n.ns, "link", "set", "eth0", "up")
            _run("ip", "-n", n.ns, "link", "set", "lo", "up")
            # a default route on the node's own link: Ray finds its node IP by the route
            # to a public address; the switch has no uplink, so nothing leaves
            _run("ip", "-n", n.ns, "route", "add", "default", "dev", "eth0")
            self._shape(n.ns, "eth0")
            self._shape(self.sw, port)

    def _shape(self, ns: str, dev: str) -> None:
        burst = max(64 * 1024, int(self.rate_mbit * 1e6 / 8 / 100))  # >= 10 ms at rate
        _run(
            "tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
            "rate", f"{self.rate_mbit:g}mbit", "burst", str(burst), "latency", "50ms",
        )  # fmt: skip

    def _env(self, n: Node) -> Dict[str, str]:
        env = dict(os.environ)
        pp = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if n.spec.get("hide_repo"):
            pp = [p for p in pp if os.path.abspath(p) != ROOT]
        else:
            pp = [ROOT] + pp
        env["PYTHONPATH"] = os.pathsep.join(pp)
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        # every node sees the whole machine's memory, shared with other jobs: Ray's OOM
        # killer would kill this cluster's workers for memory others use
        env["RAY_memory_monitor_refresh_ms"] = "0"
        env.pop("RAY_ADDRESS", None)
        # a token left in ~/.ray/auth_token by any earlier local ray.init() (Ray >= 2.5x)
        # turns token authentication on for `ray start`, and the nodes then refuse each
        # other (AuthenticationError): this cluster is private to its namespaces
        env.setdefault("RAY_AUTH_MODE", "disabled")
        # a driver must say which node it is on: with several raylets on one host, Ray
        # connects a driver to the head's (ray.init(..., _node_ip_address=MMLNC_NODE_IP))
        env["MMLNC_NODE_IP"] = n.ip
        return env

    def command(self, node: int, argv: Sequence[str]) -> List[str]:
        """argv run inside node `node`'s namespace (and, with hide_repo, without the repo)."""
        n = self.nodes[node]
        pre = ["ip", "netns", "exec", n.ns]
        if n.spec.get("hide_repo"):
            # a mount namespace of its own where this repository is an empty directory
            script = 'mount -t tmpfs none "$0" && exec "$@"'
            return pre + ["unshare", "-m", "sh", "-c", script, ROOT] + list(argv)
        return pre + list(argv)

    def _ray_start(self, nodes: Sequence[Node], tries: int = 3) -> None:
        failed = self._ray_start_once(nodes)
        for attempt in range(1, tries):
            if not failed:
                return
            for n, _ in failed:
                self.kill_node(n.index)
            time.sleep(1.0)
            failed = self._ray_start_once([n for n, _ in failed])
        if failed:
            n, out = failed[0]
            raise RuntimeError(f"ray start on {n.name} ({n.ip}) failed {tries} times:\n{out}")

    def _ray_start_once(self, nodes: Sequence[Node]) -> List:
        procs = []
        for n in nodes:
            n.temp_dir = os.path.join(self.base, n.name)
            os.makedirs(n.temp_dir, exist_ok=True)
            s = n.spec
            argv = [
                "ray", "start", f"--node-ip-address={n.ip}", f"--temp-dir={n.temp_dir}",
                f"--num-cpus={s.get('num_cpus', 1)}",
                f"--resources={json.dumps(s.get('resources', {}))}",
                f"--object-store-memory={int(s.get('object_store_mb', 256)) << 20}",
                "--disable-usage-stats",
            ]  # fmt: skip
            if n.index == 0:
                argv += ["--head", f"--port={PORT}", "--include-dashboard=false"]
            else:
                argv += [f"--address={self.address}"]
            p = subprocess.Popen(
                self.command(n.index, argv),
                env=self._env(n),
                cwd=n.temp_dir,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            procs.append((n, p))
        failed = []
        for n, p in procs:
            out, _ = p.communicate(timeout=300)
            if p.returncode != 0:
                failed.append((n, out[-3000:]))
        return failed

    def popen(self, node: int, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Starts argv inside node `node` (e.g. a trainer: ``[sys.executable, script]``)."""
        kw.setdefault("env", self._env(self.nodes[node]))
        return subprocess.Popen(self.command(node, argv), **kw)

    def wait_for_nodes(self, n: int, timeout_s: float = 120.0) -> None:
        """Waits until the head lists n alive nodes; records each node's Ray node id."""
        code = (
            "import json, ray\n"
            f"ray.init(address={self.address!r}, log_to_driver=False)\n"
            "print(json.dumps([(x['NodeManagerAddress'], x['NodeID']) "
            "for x in ray.nodes() if x['Alive']]))\n"
        )
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            r = subprocess.run(
                self.command(0, [sys.executable, "-c", code]),
                env=self._env(self.nodes[0]),
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
            if r.returncode == 0:
                alive = dict(json.loads(r.stdout.strip().splitlines()[-1]))
                for nd in self.nodes:
                    nd.node_id = alive.get(nd.ip, nd.node_id)
                if len(alive) >= n:
                    return
                last = f"{len(alive)} of {n} nodes alive"
            else:
                last = r.stderr[-2000:]
            time.sleep(1.0)
        raise RuntimeError(f"cluster not up within {timeout_s:g} s: {last}")

    def pids(self, node: int) -> List[int]:
        r = _run("ip", "netns", "pids", self.nodes[node].ns, check=False)
        return [int(x) for x in r.stdout.split()] if r.returncode == 0 else []

    def kill_node(self, node: int, sig: int = signal.SIGKILL) -> List[int]:
        """Kills every process of node `node` (its raylet, workers, producers): a machine
        that died.  Its link stays up, so peers see resets, not silence."""
        pids = self.pids(node)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids

    def nic_bytes(self) -> Dict[str, Dict[str, int]]:
        """Per node: bytes its link received (rx) and sent (tx) so far."""
        out = {}
        for n in self.nodes:
            base = f"/sys/class/net/p{n.index}/statistics"
            # counters of the bridge port: its tx is what the node received
            r = _run(
                "ip", "netns", "exec", self.sw, "cat", f"{base}/tx_bytes", f"{base}/rx_bytes",
                check=False,
            )  # fmt: skip
            vals = [int(x) for x in r.stdout.split()] if r.returncode == 0 else [0, 0]
            out[n.name] = {"rx": vals[0], "tx": vals[1]}
        return out

    def stop(self) -> None:
        """Kills every process in this cluster's namespaces (by pid), deletes them."""
        if not self._up:
            return
        self._up = False
        for _ in range(3):  # processes may fork while we kill (raylets starting workers)
            left = False
            for i in range(len(self.nodes)):
                left |= bool(self.kill_node(i))
            if not left:
                break
            time.sleep(0.3)
        _cleanup(self.prefix)
        shutil.rmtree(self.base, ignore_errors=True)


def _namespaces() -> List[str]:
    r = _run("ip", "netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _cleanup(prefix: str) -> None:
    for ns in _namespaces():
        if ns.startswith(prefix):
            for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _run("ip", "netns", "del", ns, check=False)


def cleanup_stale() -> List[str]:
    """Deletes namespaces (and kills their processes) of clusters whose process is gone."""
    gone = set()
    for ns in _namespaces():
        if ns.startswith("mmlnc") and "-" in ns:
            pid = ns[5:].split("-", 1)[0]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                gone.add(f"mmlnc{pid}-")
    for p in sorted(gone):
        _cleanup(p)
        shutil.rmtree(f"/tmp/{p[:-1]}", ignore_errors=True)
    return sorted(gone)


def layout(trainers: int, data: int, data_cpus: int, trainer_cpus: int = 0) -> List[Dict]:
    """Trainer nodes first (node 0, the head, is trainer 0), then data nodes with resource
    "data" = data_cpus."""
    nodes = [
        {"name": f"trainer{i}", "num_cpus": trainer_cpus, "resources": {"trainer": 1}}
        for i in range(trainers)
    ]
    nodes += [
        {"name": f"data{i}", "num_cpus": data_cpus, "resources": {"data": data_cpus}}
        for i in range(data)
    ]
    return nodes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a cluster, print it, wait for Ctrl-C, tear down")
    up.add_argument("--trainers", type=int, default=1)
    up.add_argument("--data", type=int, default=2)
    up.add_argument("--data-cpus", type=int, default=4)
    up.add_argument("--rate-mbit", type=float, default=200.0)
    sub.add_parser("cleanup", help="remove namespaces of clusters whose process is gone")
    a = ap.parse_args()
    if a.cmd == "cleanup":
        print("removed:", " ".join(cleanup_stale()) or "nothing")
        return
    why = available()
    if why:
        sys.exit(f"netcluster: {why}")
    c = NetCluster(layout(a.trainers, a.data, a.data_cpus), rate_mbit=a.rate_mbit)
    with c:
        for n in c.nodes:
            print(f"{n.name:10s} {n.ip:12s} ns={n.ns} node_id={n.node_id}")
        print(f"head: {c.address}; run a trainer with: ip netns exec {c.nodes[0].ns} python3 ...")
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
