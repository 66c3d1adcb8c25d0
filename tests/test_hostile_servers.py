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
