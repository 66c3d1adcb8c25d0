"""mmloader.ray on a real multi-node Ray cluster simulated on this machine
(ray.cluster_utils.Cluster: a head node for the trainer and two data nodes).

Every stream is compared bitwise with mmloader.Loader in this process: batches (keys,
dtypes, shapes, bytes), epoch ends and raised sample errors, in order.
"""

import gc
import os
import re
import signal
import time
import warnings

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install ray)")
from ray.cluster_utils import Cluster  # noqa: E402

import mmloader  # noqa: E402
import mmloader.ray as mray  # noqa: E402
from mmloader.datagen import make_dataset  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KW = dict(
    tokenizer=mmloader.tokenizer.TINY_TOKENIZER_PATH,
    micro_batch_size=4,
    seed=7,
    num_threads=1,
    max_pixels=64 * 28 * 28,
)


@pytest.fixture(scope="module")
def cluster():
    # the raylets (and so the producer processes) inherit this environment
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = ROOT + (os.pathsep + old if old else "")
    c = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "object_store_memory": 96 << 20,
            "resources": {"trainer": 1},
        },
    )
    data_nodes = [
        c.add_node(num_cpus=2, object_store_memory=96 << 20, resources={"data": 2})
        for _ in range(2)
    ]
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    try:
        yield c, data_nodes
    finally:
        ray.shutdown()
        c.shutdown()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("rayds"))
    make_dataset(root, n_samples=48, seed=3, n_images=10, min_size=32, max_size=160)
    return root


@pytest.fixture(scope="module")
def skipping_dataset(tmp_path_factory):
    """Some records name a missing image: skips shift every later batch's composition."""
    root = str(tmp_path_factory.mktemp("rayskip"))
    d = make_dataset(root, n_samples=48, seed=4, n_images=10, min_size=32, max_size=160)
    for shard in d["shards"]:
        lines = open(shard, encoding="utf-8").read().splitlines()
        hit = 0
        for i, line in enumerate(lines):
            if "images/img-" in line and i % 5 == 1:
                lines[i] = line.replace("images/img-", "images/missing-", 1)
                hit += 1
        assert hit
        open(shard, "w", encoding="utf-8").write("\n".join(lines) + "\n")
    return root


def _events(it, n):
    """n results of next(): ("batch", {key: (dtype, shape, bytes)}) | ("end",) |
    ("error", type name, message)."""
    out = []
    while len(out) < n:
        try:
            b = next(it)
        except StopIteration:
            out.append(("end",))
            continue
        except mmloader.SampleError as e:
            out.append(("error", type(e).__name__, str(e)))
            continue
        arrs = {k: (v if isinstance(v, np.ndarray) else np.from_dlpack(v)) for k, v in b.items()}
        out.append(("batch", {k: (str(a.dtype), a.shape, a.tobytes()) for k, a in arrs.items()}))
    return out


def _local(data, n, state=None, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mmloader.Loader(data, **dict(KW, **kw)) as L:
            if state is not None:
                L.load_state_dict(state)
            return _events(L, n)


def _len(data, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return len(mmloader.Loader(data, **dict(KW, **kw)))


@pytest.fixture(autouse=True)
def _settled(cluster):
    """Waits until actors of earlier tests have given their resources back (placement
    decisions below depend on what is free)."""
    total = ray.cluster_resources()
    deadline = time.time() + 30
    while time.time() < deadline:
        free = ray.available_resources()
        if all(free.get(k, 0) >= total[k] for k in ("CPU", "data")):
            break
        time.sleep(0.2)


def _nodes(L):
    return [p["node_id"] for p in L.stats()["producers"]]


def test_spread_on_distinct_data_nodes_and_stream_is_bitwise(cluster, dataset):
    c, data_nodes = cluster
    n = 2 * _len(dataset) + 3  # two epochs and their ends
    want = _local(dataset, n)
    with mray.Loader(
        dataset, producers=2, placement="spread", producer_resources={"CPU": 1, "data": 1}, **KW
    ) as L:
        got = _events(L, n)
        s = L.stats()
        nodes = _nodes(L)
    assert got == want
    assert len(set(nodes)) == 2
    assert set(nodes) == {nd.node_id for nd in data_nodes}
    assert s["consumer_node_id"] not in nodes
    assert set(s["nodes"]) == set(nodes) and all(v["batches"] > 0 for v in s["nodes"].values())
    # zero copy: nothing copied here; every batch came from another node's store
    assert s["bytes_copied"] == 0 and s["bytes_transferred"] == s["bytes"] > 0
    # no work is made only to be dropped: producers read exactly their batches' samples
    assert (
        sum(p["samples_read"] for p in s["producers"])
        == sum(p["made"] for p in s["producers"]) * KW["micro_batch_size"]
    )


def test_skips_shift_batches_and_the_stream_stays_exact(cluster, skipping_dataset):
    n = _len(skipping_dataset) + 2
    want = _local(skipping_dataset, n)
    with mray.Loader(skipping_dataset, producers=3, producer_resources={"CPU": 0.5}, **KW) as L:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = _events(L, n)
        s = L.stats()
    assert got == want
    assert s["skipped"] > 0 and s["replans"] > 0  # guesses were wrong and were redone
    assert any("skipped a sample" in str(x.message) for x in w)


def test_planner_knows_plan_time_skips_and_packing_is_exact(cluster, skipping_dataset):
    # padded with a planner: missing images are found when planning, so no guess is wrong
    n = _len(skipping_dataset) + 2
    want = _local(skipping_dataset, n)
    with mray.Loader(
        skipping_dataset, producers=2, producer_resources={"CPU": 0.5}, planner=True, **KW
    ) as L:
        assert _events(L, n) == want
        assert L.stats()["replans"] == 0
    # packed: boundaries depend on every sample's length; the planner walks them ahead
    pk = dict(packing=True, pack_length=640)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mmloader.Loader(skipping_dataset, plan_only=True, **pk, **KW) as P:
            n = len(list(P)) + 3  # one epoch's packs, its end, two packs of the next
    want = _local(skipping_dataset, n, **pk)
    assert ("end",) in want
    with mray.Loader(
        skipping_dataset, producers=3, producer_resources={"CPU": 0.5}, **pk, **KW
    ) as L:
        assert _events(L, n) == want
        s = L.stats()
        assert s["replans"] == 0 and s["skipped"] > 0


def test_on_error_raise_delivers_the_same_errors_in_order(cluster, skipping_dataset):
    n = _len(skipping_dataset) + 6
    want = _local(skipping_dataset, n, on_error="raise")
    assert any(e[0] == "error" for e in want)
    with mray.Loader(
        skipping_dataset, producers=2, producer_resources={"CPU": 0.5}, on_error="raise", **KW
    ) as L:
        assert _events(L, n) == want


def test_pack_and_node_local_placement(cluster, dataset):
    c, data_nodes = cluster
    with mray.Loader(
        dataset, producers=2, placement="pack", producer_resources={"CPU": 1, "data": 1}, **KW
    ) as L:
        assert len(set(_nodes(L))) == 1
        assert _events(L, 3) == _local(dataset, 3)
    with mray.Loader(
        dataset, producers=2, placement="node-local", producer_resources={"CPU": 0.25}, **KW
    ) as L:
        me = ray.get_runtime_context().get_node_id()
        assert set(_nodes(L)) == {me}
        assert _events(L, 3) == _local(dataset, 3)
        assert L.stats()["bytes_transferred"] == 0


def test_killed_producer_is_restarted_nothing_lost_or_duplicated(cluster, dataset):
    n = _len(dataset) + 3
    want = _local(dataset, n)
    with mray.Loader(dataset, producers=2, producer_resources={"CPU": 1, "data": 1}, **KW) as L:
        got = _events(L, 3)
        victim = L.producer_pids()[1]
        assert L.stats()["producers"][1]["pid"] == victim
        os.kill(victim, signal.SIGKILL)
        got += _events(L, n - 3)
        # on a loaded machine Ray may still be restarting the producer here: stats() gives
        # its last figures, not an ActorUnavailableError
        s = L.stats()
        down = s["producers"][1]
        assert (down["pid"] == victim) != down["available"], down
        assert victim not in L.producer_pids()  # Ray restarted it
    assert got == want
    assert s["lost"] + s["rerouted"] >= 1  # re-issued (Ray's error, or a missed ping)


def test_stuck_producer_requests_move_before_the_trainer_reaches_them(cluster, dataset):
    """A producer that stops answering (SIGSTOP: its process lives, so Ray sees nothing)
    is found by the loader's own pings while the trainer is not even waiting, and every
    request it holds moves to the others at once, ahead of their queues; the stream
    stays exact.  (Before: only a late head batch triggered a ping, and stats() asked
    the stuck producer and hung.)"""
    n = _len(dataset) + 3
    want = _local(dataset, n)
    with mray.Loader(
        dataset, producers=3, refs_in_flight=6, producer_resources={"CPU": 0.5}, **KW
    ) as L:
        got = _events(L, 2)
        victim = L.producer_pids()[1]
        os.kill(victim, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 60
            s = L.stats()  # returns (not hung on the stuck producer)
            while s["suspected"] == 0 and time.monotonic() < deadline:
                time.sleep(0.1)
                s = L.stats()
            assert s["suspected"] >= 1, s  # found without a next() call
            assert s["producers"][1]["available"] is False
            assert s["producer_timeout_s"] > 0
            got += _events(L, n - 2)
        finally:
            os.kill(victim, signal.SIGCONT)
        f = L.stats()["fetch"]
        assert f["requests"] >= n - 2 and f["made_s_p50"] > 0 and f["transfer_s_p50"] >= 0
    assert got == want


def _watches():
    import threading

    return [t for t in threading.enumerate() if t.name == "mmloader-ray-watch" and t.is_alive()]


def test_watch_thread_ends_with_the_loader(cluster, dataset):
    """The thread that pings the producers ends on close() and when the loader is dropped
    without close() (its finalizer), instead of pinging killed actors forever."""
    before = len(_watches())
    for drop in (False, True):
        L = mray.Loader(dataset, producers=2, producer_resources={"CPU": 0.5}, **KW)
        next(L)
        assert len(_watches()) == before + 1
        if drop:
            del L
            gc.collect()
        else:
            L.close()
        deadline = time.monotonic() + 30
        while len(_watches()) > before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_watches()) == before


def test_resume_is_exact_both_ways(cluster, dataset):
    n = _len(dataset)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        local = mmloader.Loader(dataset, **KW)
        _events(local, 5)
        state = local.state_dict()
        local.close()
    want = _local(dataset, n, state=state)
    with mray.Loader(dataset, producers=2, producer_resources={"CPU": 0.5}, **KW) as L:
        L.load_state_dict(state)
        assert _events(L, n) == want
        # the Ray loader's own state resumes an in-process loader (and the reverse holds)
        s2 = L.state_dict()
        assert _events(L, 2) == _local(dataset, 2, state=s2)
        with pytest.raises(mmloader.StateError, match="different configuration"):
            L.load_state_dict(dict(state, fingerprint=dict(state["fingerprint"], seed=99)))


def test_all_dp_ranks_from_one_driver(cluster, dataset):
    ranks = mray.loaders(dataset, dp_size=2, producers=1, producer_resources={"CPU": 0.5}, **KW)
    try:
        assert len(ranks) == 2
        for r, L in enumerate(ranks):
            assert _events(L, 4) == _local(dataset, 4, dp_rank=r, dp_size=2)
    finally:
        for L in ranks:
            L.close()


def test_producers_stop_when_the_trainer_process_dies(cluster, dataset, tmp_path):
    import subprocess
    import sys

    c, _ = cluster
    script = tmp_path / "trainer.py"
    script.write_text(
        "import sys, time, ray, mmloader.ray as mray\n"
        f"ray.init(address={c.address!r}, log_to_driver=False)\n"
        f"L = mray.Loader({dataset!r}, producers=2, producer_resources={{'CPU': 0.5}}, "
        f"micro_batch_size=4, num_threads=1, tokenizer={KW['tokenizer']!r})\n"
        "next(L)\n"
        "print(*L.producer_pids(), flush=True)\n"
        "time.sleep(600)\n"
    )
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in p.stdout.readline().split()]
        assert len(pids) == 2
        for pid in pids:
            os.kill(pid, 0)  # alive while the trainer lives
    finally:
        p.kill()
        p.wait()
    deadline = time.time() + 60
    alive = pids
    while alive and time.time() < deadline:
        time.sleep(0.5)
        alive = [pid for pid in alive if _alive(pid)]
    assert not alive, "producers outlived their trainer"


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie not yet reaped by its raylet is gone too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _plasma_mib():
    from ray._private.internal_api import memory_summary

    s = memory_summary(ray.get_runtime_context().gcs_address, stats_only=True)
    return sum(int(m) for m in re.findall(r"Plasma memory usage (\d+) MiB", s))


def test_zero_copy_views_keep_objects_alive_and_close_frees_everything(cluster, dataset):
    gc.collect()
    base, deadline = _plasma_mib(), time.time() + 20
    while base > 0 and time.time() < deadline:  # objects of earlier tests being freed
        time.sleep(0.5)
        base = _plasma_mib()
    L = mray.Loader(
        dataset,
        producers=2,
        producer_resources={"CPU": 0.5},
        refs_in_flight=4,
        max_pixels=256 * 28 * 28,
        **{k: v for k, v in KW.items() if k != "max_pixels"},
    )
    kept = [next(L) for _ in range(3)]
    pix = kept[0]["pixel_values"]
    assert not pix.flags.writeable and pix.flags.c_contiguous  # a view, not a private copy
    digest = [{k: v.tobytes() for k, v in b.items()} for b in kept]
    actors = list(L._actors)
    L.close()
    with pytest.raises(mmloader.Error, match="closed"):
        next(L)
    # the producers are gone: ray.kill reaches an actor through the GCS, so a call sent at
    # once may still run before its process exits; each must fail within the deadline
    deadline = time.time() + 30
    for a in actors:
        with pytest.raises(ray.exceptions.RayActorError):
            while time.time() < deadline:
                ray.get(a.pid.remote(), timeout=30)
                time.sleep(0.2)
    gc.collect()
    assert [{k: v.tobytes() for k, v in b.items()} for b in kept] == digest  # still valid
    held = _plasma_mib()
    assert held > base
    del kept, pix
    gc.collect()
    deadline = time.time() + 30
    while _plasma_mib() > base and time.time() < deadline:
        time.sleep(0.5)
    assert _plasma_mib() <= base


def test_copying_get_copies_and_torch_views(cluster, dataset):
    torch = pytest.importorskip("torch")
    with mray.Loader(
        dataset, producers=1, producer_resources={"CPU": 0.5}, zero_copy=False, **KW
    ) as L:
        b = next(L)
        assert b["pixel_values"].flags.writeable
        s = L.stats()
        assert s["bytes_copied"] == s["bytes"] > 0
    with mray.Loader(
        dataset, producers=1, producer_resources={"CPU": 0.5}, as_torch=True, **KW
    ) as L:
        b = next(L)
        assert isinstance(b["input_ids"], torch.Tensor)
        want = _local(dataset, 1)[0][1]
        assert {
            k: (str(v.numpy().dtype), tuple(v.shape), v.numpy().tobytes()) for k, v in b.items()
        } == want


def test_refused_configurations(cluster, dataset):
    with pytest.raises(mmloader.ConfigError, match="packing=True needs planner"):
        mray.Loader(dataset, packing=True, pack_length=512, planner=False)
    with pytest.raises(mmloader.ConfigError, match="device"):
        mray.Loader(dataset, device="cuda")
    with pytest.raises(mmloader.ConfigError, match="placement"):
        mray.Loader(dataset, placement="everywhere")
    with pytest.raises(mmloader.ConfigError, match="tokenizer must be a path"):
        mray.Loader(
            dataset, tokenizer=mmloader.Tokenizer.from_file(mmloader.tokenizer.TINY_TOKENIZER_PATH)
        )
    with pytest.raises(mmloader.ConfigError, match="does not exist"):  # raised by a producer
        mray.Loader(
            os.path.join(dataset, "nope.jsonl"), producers=1, producer_resources={"CPU": 0.5}
        )
    with pytest.raises(mmloader.ConfigError, match="cannot place"):
        mray.Loader(
            dataset,
            producers=2,
            producer_resources={"CPU": 1, "gpu_data": 1},
            placement_timeout_s=2,
        )


def test_rank_aware_spread_gives_each_rank_data_nodes_of_its_own(cluster, dataset):
    """With at least dp_size data nodes, each rank's producers are on data nodes no other
    rank uses (decided by each rank alone, from the same sorted node list), so no data
    node's link carries batches to two trainers at once; the streams stay exact."""
    c, data_nodes = cluster
    res = {"CPU": 0.5, "data": 1}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        r0 = mray.Loader(dataset, producers=2, producer_resources=res, dp_rank=0, dp_size=2, **KW)
        try:
            with mray.Loader(
                dataset, producers=2, producer_resources=res, dp_rank=1, dp_size=2, **KW
            ) as r1:
                n0, n1 = _nodes(r0), _nodes(r1)
                assert len(set(n0)) == len(set(n1)) == 1 and not set(n0) & set(n1), (n0, n1)
                assert set(n0) | set(n1) == {nd.node_id for nd in data_nodes}
                for r, L in enumerate((r0, r1)):
                    p = L.stats()["placement"]
                    assert p["mode"] == "disjoint" and p["note"] is None, p
                    assert len(p["data_nodes"]) == 1
                    assert _events(L, 4) == _local(dataset, 4, dp_rank=r, dp_size=2)
        finally:
            r0.close()


def test_fewer_data_nodes_than_ranks_interleave_and_say_so(cluster, dataset):
    """3 ranks, 2 data nodes: the ranks share data nodes, interleaved (producer j of the
    ranks on different nodes where it can), with a warning and stats() saying why."""
    c, data_nodes = cluster
    res = {"CPU": 0.5, "data": 1}
    loaders = []
    try:
        for r in range(3):
            with pytest.warns(UserWarning, match="fewer nodes than ranks.*interleaved"):
                loaders.append(
                    mray.Loader(
                        dataset, producers=1, producer_resources=res, dp_rank=r, dp_size=3, **KW
                    )
                )
        first = [_nodes(L)[0] for L in loaders]
        assert set(first) == {nd.node_id for nd in data_nodes}  # both nodes in use
        for r, L in enumerate(loaders):
            p = L.stats()["placement"]
            assert p["mode"] == "interleaved" and "2 data node(s) for 3 ranks" in p["note"], p
            assert _events(L, 2) == _local(dataset, 2, dp_rank=r, dp_size=3)
    finally:
        for L in loaders:
            L.close()


def test_relative_data_path_is_resolved_on_the_driver(cluster, dataset, monkeypatch):
    # the producers' working directory is their node's, not this process's
    monkeypatch.chdir(os.path.dirname(dataset))
    rel = os.path.basename(dataset)
    with mray.Loader(rel, producers=1, producer_resources={"CPU": 0.5}, **KW) as L:
        assert _events(L, 3) == _local(dataset, 3)
    src = [mmloader.Source(rel, name="sft")]
    with mray.Loader(src, producers=1, producer_resources={"CPU": 0.5}, **KW) as L:
        assert _events(L, 3) == _local(src, 3)  # a source keeps its name: same stream
        assert L.state_dict()["fingerprint"] == _fp(src)


def test_tokenizer_name_is_not_a_path(cluster, dataset, tmp_path, monkeypatch):
    # "tiny" names the bundled tokenizer: it was made a path under the driver's working
    # directory (".../tiny", which exists on no node) and every producer failed to load it
    monkeypatch.chdir(tmp_path)
    kw = dict(KW, tokenizer="tiny")
    with mray.Loader(dataset, producers=1, producer_resources={"CPU": 0.5}, **kw) as L:
        assert _events(L, 3) == _local(dataset, 3)  # KW: the same tokenizer by its path
    # a relative path is still a path, resolved here: a copy of the file under another name
    os.symlink(mmloader.tokenizer.TINY_TOKENIZER_PATH, tmp_path / "tok.json")
    kw = dict(KW, tokenizer="tok.json")
    with mray.Loader(dataset, producers=1, producer_resources={"CPU": 0.5}, **kw) as L:
        assert _events(L, 2) == _local(dataset, 2)


def _fp(data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mmloader.Loader(data, **KW) as L:
            return L.state_dict()["fingerprint"]


def test_placement_that_can_never_succeed_is_refused_at_once(cluster, dataset):
    # default placement_timeout_s (120 s): the cluster has no "gpu_data" at all, so
    # waiting cannot help; the error says so at once, with the nodes' resources
    with pytest.raises(mmloader.ConfigError, match="can never hold them .*trainer"):
        mray.Loader(dataset, producers=2, producer_resources={"CPU": 1, "gpu_data": 1}, **KW)
    # node-local on a node without room for the producers (the head has 1 CPU)
    with pytest.raises(mmloader.ConfigError, match=r"node-local.*has \{CPU: 1"):
        mray.Loader(
            dataset, producers=2, placement="node-local", producer_resources={"CPU": 1}, **KW
        )


def _ray_threads():
    import threading

    return {t for t in threading.enumerate() if t.name.startswith("mmloader-ray-") and t.is_alive()}


@pytest.fixture
def calls_while_shut_down(cluster, monkeypatch):
    """Records every call of Ray's API made while Ray is not initialized (each would call
    ray.init(): with RAY_ADDRESS set, connect to the cluster, which then cannot be shut
    down), and refuses it instead of connecting.  Reconnects to the cluster afterwards."""
    import threading
    import traceback

    from ray._private import auto_init_hook, client_mode_hook

    calls = []

    def refuse():
        if not ray.is_initialized():
            name = threading.current_thread().name
            calls.append((name, "".join(traceback.format_stack(limit=8))))
            raise RuntimeError("a Ray call after ray.shutdown()")

    monkeypatch.setattr(auto_init_hook, "auto_init_ray", refuse)
    monkeypatch.setattr(client_mode_hook, "auto_init_ray", refuse)
    try:
        yield calls
    finally:
        monkeypatch.undo()
        if not ray.is_initialized():
            ray.init(address=cluster[0].address, log_to_driver=False)


def test_close_joins_its_threads_and_nothing_calls_ray_after_shutdown(
    cluster, dataset, calls_while_shut_down
):
    """close() stops and joins the watch and fetch threads (about a second at most), so
    ray.shutdown() right after it is the end of Ray in this process: no thread of the
    loader calls Ray after it (each such call would connect to the cluster again, and
    then the cluster cannot be shut down)."""
    calls = calls_while_shut_down
    before = _ray_threads()
    L = mray.Loader(dataset, producers=2, producer_resources={"CPU": 0.5}, refs_in_flight=8, **KW)
    pids = L.producer_pids()
    _events(L, 2)
    time.sleep(1.0)  # the 8 requests in flight are made and here
    for pid in pids:  # stuck producers: what next() asks for now is never made
        os.kill(pid, signal.SIGSTOP)
    try:
        _events(L, 1)  # asks for one more batch, of a stuck producer
        fetching = {t for t in _ray_threads() - before if t.name == "mmloader-ray-fetch"}
        assert fetching  # a thread waits for that batch to be made
        t0 = time.monotonic()
        L.close()
        took = time.monotonic() - t0
        left = _ray_threads() - before
        assert not left, left  # joined, not only told to stop
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    print(f"close() with a request of a stuck producer in flight: {took:.2f} s")
    ray.shutdown()
    time.sleep(1.0)
    assert calls == [], calls[0][1]

    L.close()  # again, after ray.shutdown(): nothing to do, no Ray call
    del L
    gc.collect()
    assert calls == [], calls[0][1]
    assert not ray.is_initialized()
