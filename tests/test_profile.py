"""mmloader.profile and `python -m mmloader profile`: the per-stage breakdown, the bottleneck
rules (on given figures), and the command on real data, local and from the fault server."""

import os
import subprocess
import sys

import pytest
from child import child_env

from mmloader import profile as P

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prof(stats, wall=10.0, cpu=None, cores=2, samples=400, remote=False, timeline=None):
    """A Profile from given figures (what `run` would have recorded)."""
    st = dict(num_threads=2, prefetch=4, window=48, wall_s=wall, good_samples=samples)
    st.update(stats)
    return P.Profile(
        batches=samples // 8,
        samples=samples,
        wall_s=wall,
        cpu_s=cpu if cpu is not None else 0.2 * wall,
        step_s=0.0,
        cores=cores,
        consumer_wait_s=st.get("wait_s", 0.0),
        first_batch_s=0.1,
        stats=st,
        timeline=timeline or [],
        remote=remote,
    )


def test_consumer_bound_when_the_trainer_rarely_waits():
    p = prof(
        dict(
            wait_s=0.1,
            wait_time_ratio=0.01,
            read_s=0.2,
            decode_s=1.0,
            vision_s=2.5,
            tokenize_s=0.3,
            collate_s=0.4,
        ),
        cpu=3.0,
    )
    d = P.diagnose(p)
    assert d.bottleneck == "consumer"
    assert any("--num-threads 1" in s for s in d.suggestions)  # 2.8 s of 20 s thread time


def test_cpu_bound_names_the_heaviest_stage():
    p = prof(
        dict(
            wait_s=6.0,
            wait_time_ratio=0.6,
            read_s=0.2,
            decode_s=6.0,
            vision_s=17.0,
            tokenize_s=1.0,
            collate_s=0.5,
        ),
        cpu=19.0,
    )
    d = P.diagnose(p)
    assert d.bottleneck == "CPU"
    assert any("resize / patchify" in e for e in d.evidence)
    assert any("more cores" in s for s in d.suggestions)


def test_cpu_bound_with_fewer_threads_than_cores_suggests_more_threads():
    p = prof(
        dict(
            num_threads=1,
            wait_s=6.0,
            wait_time_ratio=0.6,
            decode_s=4.0,
            vision_s=9.5,
            tokenize_s=0.3,
        ),
        cpu=9.9,
        cores=4,
    )
    d = P.diagnose(p)
    assert d.bottleneck == "CPU"
    assert any("--num-threads from 1 to 4" in s for s in d.suggestions)


def _fetching(inflight, n=5):
    return [
        P.Point(t=i + 1.0, cpu_s=0.1 * i, stats={"fetch": {"inflight": inflight}}) for i in range(n)
    ]


def test_remote_latency_bound_suggests_requests_in_flight():
    # 400 requests in 10 s with ~1.2 in flight: 30 ms each, all of it first-byte latency
    fetch = dict(
        requests=400,
        bytes=400 * 100_000,
        latency_p50_s=0.03,
        latency_p90_s=0.032,
        latency_p99_s=0.04,
        inflight=1,
        failures=0,
        retries_5xx=0,
    )
    p = prof(
        dict(
            wait_s=8.0,
            wait_time_ratio=0.8,
            read_s=0.1,
            decode_s=1.0,
            vision_s=1.5,
            tokenize_s=0.2,
            fetch=fetch,
        ),
        remote=True,
        timeline=_fetching(1.2),
    )
    d = P.diagnose(p)
    assert d.bottleneck == "I/O latency"
    assert any("--max-inflight" in s for s in d.suggestions)
    text = P.report(p, d)
    assert "first byte p50 30 ms" in text and "bottleneck: I/O latency" in text


def test_remote_bandwidth_bound_when_transfers_dominate():
    # 100 requests of 4 MB in 10 s with 8 in flight: 800 ms each against 30 ms to first byte
    fetch = dict(
        requests=100,
        bytes=100 * 4_000_000,
        latency_p50_s=0.03,
        latency_p90_s=0.04,
        latency_p99_s=0.05,
        inflight=8,
    )
    p = prof(
        dict(
            wait_s=8.0,
            wait_time_ratio=0.8,
            read_s=0.1,
            decode_s=1.0,
            vision_s=1.5,
            tokenize_s=0.2,
            fetch=fetch,
        ),
        remote=True,
        timeline=_fetching(8.0),
    )
    assert P.diagnose(p).bottleneck == "network bandwidth"


def test_idle_workers_and_a_waiting_trainer_mean_too_little_queued():
    p = prof(
        dict(
            wait_s=5.0,
            wait_time_ratio=0.5,
            read_s=0.1,
            decode_s=1.0,
            vision_s=1.0,
            tokenize_s=0.1,
            collate_s=0.1,
        ),
        cpu=2.5,
    )
    d = P.diagnose(p)
    assert d.bottleneck == "pipeline depth"
    assert any("--window from 48 to 96" in s for s in d.suggestions)


def test_breakdown_splits_decode_out_of_vision():
    p = prof(dict(wait_s=2.0, read_s=1.0, decode_s=1.5, vision_s=4.0, tokenize_s=1.0))
    rows = {name: v for name, v, _ in P.breakdown(p)}
    assert rows["decode"] == 1.5 and rows["resize / patchify"] == 2.5


def test_breakdown_shares_and_combined_vision_stage():
    p = prof(dict(wait_s=2.0, read_s=1.0, vision_s=4.0, tokenize_s=1.0, collate_s=1.0))
    rows = {name: (v, share) for name, v, share in P.breakdown(p)}
    # without decode_s the vision figure covers decode and resize together
    assert rows["decode + resize / patchify"] == (4.0, pytest.approx(0.2))
    assert rows["collate"][1] == pytest.approx(0.1)  # of the one collation thread
    assert rows["consumer wait"][1] == pytest.approx(0.2)  # of wall time
    assert rows["fetch / read"][1] == pytest.approx(0.05)  # of 2 threads x 10 s


# ----------------------------------------------------------------------------- on real data


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from mmloader.datagen import make_dataset

    root = str(tmp_path_factory.mktemp("profile-data"))
    return make_dataset(
        root, n_samples=24, seed=3, n_shards=1, n_images=8, min_size=40, max_size=200
    )


def _cli(*args, timeout=240):
    env = child_env()
    return subprocess.run(
        [sys.executable, "-m", "mmloader", "profile", "--tokenizer", "tiny", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _check_output(r, batches):
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"{batches} batches" in out
    for stage in ("fetch / read", "tokenize", "collate", "consumer wait"):
        assert stage in out
    assert "wait-time ratio:" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("bottleneck: "))
    assert line[len("bottleneck: ") :] in P.BOTTLENECKS
    assert "suggestions:" in out
    return out


def test_profile_command_local_with_plot(dataset, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "timeline.png"
    # 10 batches of 4 from 24 samples: crosses an epoch end
    r = _cli(
        dataset["shards"][0],
        "--batches",
        "10",
        "--micro-batch-size",
        "4",
        "--num-threads",
        "2",
        "--prefetch",
        "2",
        "--max-pixels",
        str(28 * 28 * 64),
        "--plot",
        str(png),
    )
    _check_output(r, 10)
    assert "10/10 batches" in r.stderr  # the progress bar
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_profile_command_remote_30ms(dataset):
    sys.path.insert(0, os.path.join(REPO, "tests", "servers"))
    from faultserver import FaultServer

    with FaultServer(root=dataset["root"], latency=0.03) as srv:
        url = srv.url(os.path.basename(dataset["shards"][0]))
        r = _cli(
            url,
            "--batches",
            "4",
            "--micro-batch-size",
            "4",
            "--num-threads",
            "2",
            "--quiet",
            "--max-pixels",
            str(28 * 28 * 64),
            "--max-inflight",
            "16",
        )
    out = _check_output(r, 4)
    assert "fetch: " in out and "requests" in out
    assert "first byte p50" in out


def test_profile_command_rejects_bad_arguments(tmp_path):
    r = _cli(str(tmp_path / "none.jsonl"), "--batches", "0")
    assert r.returncode == 2
    assert "--batches must be >= 1" in r.stderr
