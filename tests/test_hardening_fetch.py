"""Hostile servers (issue 20): a remote object's size is capped (with or without
Content-Length), every request has a deadline and a minimum rate, retries are bounded in
count and in time, identical requests in flight are fetched once, next() names what it
waits on, and close() is prompt whatever the server does.  Each test failed before."""

import json
import os
import threading
import time

import pytest

import mmloader
from mmloader import _core

from test_hardening import jpeg, make, run  # the same loader settings as the record-side suite

FAST = dict(fetch_stall_s=1.0, fetch_retry_budget_s=4.0)


def rec(url: str) -> dict:
    return {
        "messages": [
            {"role": "user", "content": "<image>What?"},
            {"role": "assistant", "content": "A picture."},
        ],
        "images": [url],
    }


def write(tmp_path, records) -> str:
    (tmp_path / "a.jpg").write_bytes(jpeg())
    p = tmp_path / "data.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(p)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


# ---- the size of a remote object -------------------------------------------------------


def test_endless_body_without_content_length_is_cut(fault_server):
    srv = fault_server(objects={"/e.jpg": jpeg()}, script={"/e.jpg": ["endless"] * 100})
    f = _core.Fetcher(max_object_bytes=1 << 20, max_retries=2, stall_s=2)
    before = rss_mb()
    t0 = time.monotonic()
    with pytest.raises(mmloader.SampleError, match="max_object_bytes=1048576") as ei:
        f.get(srv.url("/e.jpg"))
    assert time.monotonic() - t0 < 20
    assert rss_mb() - before < 64  # not tens of GB
    assert "e.jpg" in str(ei.value)


def test_declared_size_over_the_limit_fails_at_once(fault_server):
    big = os.urandom(3 << 20)
    srv = fault_server(objects={"/big.bin": big, "/ok.bin": big[:1000]}, ranges=False)
    f = _core.Fetcher(max_object_bytes=1 << 20)
    with pytest.raises(mmloader.SampleError, match="max_object_bytes"):
        f.get(srv.url("/big.bin"))
    assert srv.outcomes("/big.bin") == ["ok"]  # refused from its headers: not retried
    assert f.get(srv.url("/ok.bin")) == big[:1000]


def test_loader_skips_an_oversized_remote_image(tmp_path, fault_server):
    srv = fault_server(
        objects={"/a.jpg": jpeg(), "/e.jpg": jpeg()}, script={"/e.jpg": ["endless"] * 100}
    )
    data = write(tmp_path, [rec(srv.url("/e.jpg")), rec(srv.url("/a.jpg"))])
    with make(data, max_object_bytes=1 << 20, **FAST) as L:
        batches, reasons, msgs = run(L)
    assert reasons == {"object_too_large": 1} and len(batches) == 2
    assert any("data.jsonl:1" in m and "max_object_bytes" in m for m in msgs)


# ---- deadlines ---------------------------------------------------------------------------


def test_drip_fed_body_fails_on_the_minimum_rate(fault_server):
    srv = fault_server(objects={"/d.jpg": jpeg()}, script={"/d.jpg": ["drip"] * 100}, drip_s=0.2)
    f = _core.Fetcher(stall_s=1, min_rate=1024, max_retries=1, retry_budget_s=30)
    t0 = time.monotonic()
    with pytest.raises(mmloader.FetchError, match="min_rate"):
        f.get(srv.url("/d.jpg"))
    assert time.monotonic() - t0 < 15  # two attempts of ~1-2 s, not minutes


def test_retries_are_bounded_in_time(fault_server):
    srv = fault_server(objects={"/s.jpg": jpeg()}, script={"/s.jpg": ["silent"] * 100}, stall_s=30)
    f = _core.Fetcher(stall_s=1, max_retries=50, retry_budget_s=3)
    t0 = time.monotonic()
    with pytest.raises(mmloader.FetchError, match="retry_budget_s=3"):
        f.get(srv.url("/s.jpg"))
    assert time.monotonic() - t0 < 8
    assert len(srv.outcomes("/s.jpg")) < 6


def test_identical_requests_in_flight_are_fetched_once(tmp_path, fault_server):
    srv = fault_server(objects={"/a.jpg": jpeg()}, latency=0.5)
    data = write(tmp_path, [rec(srv.url("/a.jpg")) for _ in range(16)])
    with make(data, num_threads=2, window=16) as L:
        batches, reasons, _ = run(L)
    assert len(batches) == 16 and not reasons
    assert len(srv.outcomes("/a.jpg")) <= 3  # 16 without coalescing


def test_next_names_what_it_waits_on(tmp_path, fault_server):
    srv = fault_server(objects={"/s.jpg": jpeg()}, script={"/s.jpg": ["silent"] * 100}, stall_s=30)
    url = srv.url("/s.jpg") + "?X-Amz-Signature=SECRETSIG"
    data = write(tmp_path, [rec(url), rec(url)])
    with make(data, fetch_stall_s=20, fetch_retry_budget_s=60, next_timeout_s=1.5) as L:
        t0 = time.monotonic()
        with pytest.raises(mmloader.Error, match="waiting") as ei:
            next(iter(L))
        assert time.monotonic() - t0 < 10
    m = str(ei.value)
    assert "data.jsonl:1" in m and "s.jpg" in m and "SECRETSIG" not in m


def test_close_is_prompt_while_fetches_hang(tmp_path, fault_server):
    srv = fault_server(objects={"/s.jpg": jpeg()}, script={"/s.jpg": ["silent"] * 100}, stall_s=60)
    data = write(tmp_path, [rec(srv.url("/s.jpg")) for _ in range(8)])
    L = make(data, fetch_stall_s=50, fetch_retry_budget_s=120)
    errors = []

    def consume():
        try:
            next(iter(L))
        except mmloader.Error as e:  # "the loader is closed"
            errors.append(e)

    th = threading.Thread(target=consume)
    th.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    L.close()
    th.join(10)
    assert not th.is_alive() and time.monotonic() - t0 < 5
    assert errors and "closed" in str(errors[0])


def test_fetch_options_checked_at_construction(tmp_path):
    data = write(tmp_path, [rec("a.jpg")])
    for k, v in (
        ("fetch_stall_s", 0),
        ("fetch_retry_budget_s", -1),
        ("fetch_min_rate", -5),
        ("next_timeout_s", 0),
        ("fetch_timeout_s", "x"),
    ):
        with pytest.raises(mmloader.ConfigError, match=k):
            make(data, **{k: v})


def test_blocking_gets_of_one_range_in_flight_each_own_their_bytes(fault_server):
    """Identical blocking GETs in flight are coalesced; each caller owns its copy of the
    body (a coalesced caller once got the copy the fetcher then freed: a double free when
    two workers read the same block of one video)."""
    data = os.urandom(300_000)
    srv = fault_server(objects={"/v.bin": data}, latency=0.3)
    out, errors = [], []
    with _core.Fetcher() as f:

        def get():
            try:
                for _ in range(3):
                    out.append(f.get(srv.url("/v.bin"), 4096, 100_000))
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        ts = [threading.Thread(target=get) for _ in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert not errors and len(out) == 18
    assert all(b == data[4096:104096] for b in out)
    assert len(srv.outcomes("/v.bin")) < 18  # they were coalesced
