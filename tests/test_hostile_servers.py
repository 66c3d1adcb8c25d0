"""Hostile servers, round 2 (issue 29, items 7-11): failures no retry can fix fail at once
with their real cause, an endless object or listing is bounded, a server that ignores
Range costs one download per object, and one redaction rule covers every message.  Each
test failed before its fix (tools/hostile_fetch.py measures the same cases)."""

import time

import pytest

import mmloader
from mmloader import _core

# ---- failures that cannot succeed fail at once (item 10) -------------------------------


@pytest.mark.parametrize(
    "kind, cause",
    [
        ("endless", "passed max_object_bytes=1048576 without a declared size"),
        ("bigheaders", "Too large response headers"),
        ("badchunk", "chunked-encoding"),
    ],
)
def test_unfixable_failures_are_not_retried(fault_server, kind, cause):
    srv = fault_server(objects={"/x.bin": b"x" * 1000}, script={"/x.bin": [kind] * 100})
    f = _core.Fetcher(max_object_bytes=1 << 20, max_retries=8, stall_s=2, retry_budget_s=30)
    t0 = time.monotonic()
    with pytest.raises(mmloader.Error, match=cause) as ei:
        f.get(srv.url("/x.bin"))
    assert len(srv.outcomes("/x.bin")) == 1, srv.outcomes("/x.bin")  # was 9 (8 retries)
    assert "retries" not in str(ei.value) and "x.bin" in str(ei.value)
    assert time.monotonic() - t0 < 5


def test_reset_is_still_retried(fault_server):
    srv = fault_server(objects={"/x.bin": b"x" * 1000}, script={"/x.bin": ["reset", "reset"]})
    f = _core.Fetcher(max_retries=8, backoff_base_s=0.01)
    assert f.get(srv.url("/x.bin")) == b"x" * 1000
    assert srv.outcomes("/x.bin") == ["reset", "reset", "ok"]


def test_redirect_loop_names_itself(fault_server):
    # each 302 comes on a connection the server then resets: curl kept that first message
    # ("Connection reset by peer") and the loop was reported as a reset
    srv = fault_server(objects={"/x.bin": b"x"}, script={"/x.bin": ["redirect"] * 100})
    f = _core.Fetcher(max_retries=8)
    with pytest.raises(mmloader.FetchError, match=r"redirect loop: more than 5 redirects") as ei:
        f.get(srv.url("/x.bin"))
    assert "reset" not in str(ei.value)
    assert len(srv.outcomes("/x.bin")) == 6  # the request and 5 redirects, never retried


# ---- one redaction rule (item 11) ------------------------------------------------------

SECRET = "c2VjcmV0LXNpZ25hdHVyZQ"


@pytest.mark.parametrize(
    "tail",
    [
        '"&X-Amz-Signature=' + SECRET,  # after a quote
        "<&token=" + SECRET,  # after '<'
        "`&sig=" + SECRET,  # after a backtick
        "#access_token=" + SECRET,  # in the fragment
    ],
)
def test_secret_never_in_sample_message_or_warning(tmp_path, fault_server, tail):
    import json
    import warnings

    from test_hardening import TINY

    srv = fault_server(objects={})
    url = srv.url("/missing.jpg") + "?x=1" + tail
    r = {
        "messages": [
            {"role": "user", "content": "<image>x"},
            {"role": "assistant", "content": "y"},
        ],
        "images": [url],
    }
    data = tmp_path / "d.jsonl"
    ok = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}
    data.write_text(json.dumps(r) + "\n" + json.dumps(ok) + "\n")
    kw = dict(tokenizer=TINY, micro_batch_size=1, num_threads=1, shuffle=False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with mmloader.Loader(str(data), max_error_rate=1.0, **kw) as L:
            list(L)
    msgs = [str(x.message) for x in w]
    with mmloader.Loader(str(data), on_error="raise", **kw) as L:
        with pytest.raises(mmloader.SampleError) as ei:
            next(iter(L))
    texts = msgs + [str(ei.value), repr(ei.value), _core.redact(url), _core.redact("x " + url)]
    assert any("missing.jpg" in t for t in msgs)
    for t in texts:
        assert SECRET not in t, t
        assert "missing.jpg" in t or t in (_core.redact(url), _core.redact("x " + url))


# ---- S3 listings that cycle (item 9) ---------------------------------------------------


def test_cycling_listing_fails_at_once(fault_server):
    objs = {f"/bkt/d{i:05d}.jsonl": b"{}\n" for i in range(2500)}  # 3 pages of 1000
    srv = fault_server(objects=objs, list_cycle=True)  # tokens A, B, A, B, ...
    f = _core.Fetcher(
        endpoint=f"http://127.0.0.1:{srv.port}", access_key="x", secret_key="y", max_retries=1
    )
    t0 = time.monotonic()
    with pytest.raises(mmloader.FetchError, match="went back or repeated") as ei:
        f.list("s3://bkt/d")
    assert "s3://bkt/d" in str(ei.value)
    assert len(srv.log) <= 3  # was 100,000 pages with every key kept
    assert time.monotonic() - t0 < 10


def test_cycling_tokens_of_empty_pages_fail(fault_server):
    # pages without keys: only the tokens show the cycle
    srv = fault_server(objects={}, list_cycle=True)
    state = {"n": 0}

    def lister(bucket, q, head):  # noqa: ARG001 - the server's own listing is replaced
        state["n"] += 1
        tok = "B" if q.get("continuation-token", [""])[0] == "41" else "A"
        return (
            '<?xml version="1.0"?><ListBucketResult><IsTruncated>true</IsTruncated>'
            f"<NextContinuationToken>{tok.encode().hex()}</NextContinuationToken>"
            "</ListBucketResult>"
        )

    srv.list_hook = lister
    f = _core.Fetcher(endpoint=f"http://127.0.0.1:{srv.port}", access_key="x", secret_key="y")
    with pytest.raises(mmloader.FetchError, match="continuation token came back"):
        f.list("s3://bkt/")
    assert state["n"] <= 3


def test_listing_still_pages_forward(fault_server):
    objs = {f"/bkt/d{i:05d}.jsonl": b"{}\n" for i in range(2500)}
    srv = fault_server(objects=objs)
    f = _core.Fetcher(endpoint=f"http://127.0.0.1:{srv.port}", access_key="x", secret_key="y")
    assert len(f.list("s3://bkt/d")) == 2500


# ---- servers that ignore Range (item 8) ------------------------------------------------


class _CountingHandler:
    """Python's own http.server (it ignores Range: 200 with the whole file), counting the
    bytes it sends and the GETs it answers."""

    @staticmethod
    def serve(root):
        import functools
        import http.server
        import threading

        stats = {"bytes": 0, "gets": 0}

        class H(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                stats["gets"] += 1
                super().do_GET()

            def copyfile(self, src, dst):
                while True:
                    b = src.read(1 << 20)
                    if not b:
                        return
                    dst.write(b)
                    stats["bytes"] += len(b)

        srv = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(H, directory=str(root))
        )
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv, stats


def _text_line(i):
    import json

    return (
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": f"Say {i}."},
                    {"role": "assistant", "content": "Something."},
                ]
            }
        )
        + "\n"
    )


def test_range_ignoring_server_serves_each_object_once(tmp_path):
    """fetch_whole.c invariant 1: a 12 MiB shard on Python's http.server is indexed and its
    records read with ONE whole download (plus the first chunk that showed the server
    ignores Range); before, every 8 MiB index chunk and every record read downloaded it
    whole (here 40 reads: ~40 x 12 MiB)."""
    from test_hardening import TINY

    line = _text_line(0)
    n = (12 << 20) // len(line)
    (tmp_path / "big.jsonl").write_text("".join(_text_line(i % 1000) for i in range(n)))
    size = (tmp_path / "big.jsonl").stat().st_size
    srv, stats = _CountingHandler.serve(tmp_path)
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/big.jsonl"
        # max_memory: the shard's text is not kept by the loader, so records are ranged GETs
        with mmloader.Loader(
            url,
            tokenizer=TINY,
            micro_batch_size=4,
            num_threads=2,
            shuffle=True,
            max_memory=1 << 30,
            fetch_retry_budget_s=20,
            index=False,
        ) as L:
            it = iter(L)
            for _ in range(10):
                next(it)
        assert stats["bytes"] < 2.5 * size, (stats, size)
        assert stats["gets"] <= 4, stats
    finally:
        srv.shutdown()
        srv.server_close()


def test_range_ignoring_server_object_over_the_cap_is_refused(fault_server):
    data = bytes(range(256)) * (40 << 10)  # 10 MiB
    srv = fault_server(objects={"/v.bin": data}, ranges=False)
    f = _core.Fetcher(whole_cache_bytes=4 << 20, max_retries=1)
    assert f.get(srv.url("/v.bin"), 0, 1000) == data[:1000]  # the server shows itself
    with pytest.raises(mmloader.Error, match="ignores Range requests.*raise those limits"):
        f.get(srv.url("/v.bin"), 5 << 20, 1000)
    sent = srv.bytes_sent
    assert sent < 3 * len(data)


def test_range_ignoring_server_fetcher_slices(fault_server):
    data = bytes(range(256)) * (40 << 10)  # 10 MiB
    srv = fault_server(objects={"/v.bin": data}, ranges=False)
    f = _core.Fetcher(max_retries=1)
    u = srv.url("/v.bin")
    for off, n in [(0, 1000), (9 << 20, 4096), (123, 5 << 20), (len(data) - 10, 100), (0, -1)]:
        want = data[off:] if n < 0 else data[off : off + n]
        assert f.get(u, off, n) == want
    gets = [o for o in srv.outcomes("/v.bin")]
    assert len(gets) <= 3, gets  # the first read (cut after its slice) and one whole GET
    assert srv.bytes_sent < 2.5 * len(data)


# ---- an endless remote shard (item 7) --------------------------------------------------

LINE = _text_line(0).encode()


@pytest.mark.parametrize("total", [None, 1 << 62])  # Content-Range total "*", or absurd
def test_endless_remote_shard_refused_at_once(fault_server, total):
    from test_hardening import TINY

    srv = fault_server(infinite={"/inf.jsonl": LINE}, infinite_total=total)
    url = srv.url("/inf.jsonl") + "?X-Amz-Signature=" + SECRET
    t0 = time.monotonic()
    with pytest.raises(mmloader.Error) as ei:
        mmloader.Loader(url, tokenizer=TINY, micro_batch_size=2, num_threads=1, index=False)
    msg = str(ei.value)
    assert "inf.jsonl" in msg and SECRET not in msg
    assert ("max_shard_bytes=" in msg) if total else ("does not declare the object's size" in msg)
    assert len(srv.log) <= 2  # was 4,506 requests and 3.3 GB after 120 s, still going
    assert time.monotonic() - t0 < 10


def test_remote_shard_whose_size_changes_is_refused(fault_server):
    from test_hardening import TINY

    data = LINE * ((20 << 20) // len(LINE))
    srv = fault_server(objects={"/d.jsonl": data})

    def grow(method, path, rng, n):  # after the first chunk the object is replaced
        srv.objects["/d.jsonl"] = data + LINE * 1000

    srv.hook = grow
    with pytest.raises(mmloader.Error, match="size changed while it was indexed"):
        mmloader.Loader(srv.url("/d.jsonl"), tokenizer=TINY, micro_batch_size=2, index=False)


def test_ranged_read_of_an_object_over_max_object_bytes(fault_server):
    # a range of a large object is its range: it was refused from the object's size
    data = bytes(range(256)) * (8 << 10)  # 2 MiB
    srv = fault_server(objects={"/big.bin": data})
    f = _core.Fetcher(max_object_bytes=1 << 20)
    assert f.get(srv.url("/big.bin"), 100, 1000) == data[100:1100]
    with pytest.raises(mmloader.Error, match="above max_object_bytes"):
        f.get(srv.url("/big.bin"))
