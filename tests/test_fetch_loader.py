"""The Loader on remote data, end to end: S3 (moto, SigV4 enforced) and the fault server
standing in for S3 (with ListObjectsV2, 10% transient faults).  Remote epochs must equal
local epochs bitwise, resume exactly, be independent of thread count, skip and count
permanent failures, and fail clearly on wrong credentials without showing secrets."""

from __future__ import annotations

import json
import os

import pytest

import mmloader
from conftest import as_np, same  # noqa: E402

from mmloader import datagen

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
SMALL = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
FAST = dict(tokenizer=TINY, micro_batch_size=4, num_threads=2, prefetch=2, seed=7, **SMALL)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("fe2e"))
    return datagen.make_dataset(
        root, n_samples=40, seed=9, n_shards=3, n_images=10, min_size=32, max_size=120
    )


def run(data, n=None, epochs=1, state=None, **kw):
    """Batches (as numpy copies), the loader's stats and its state after them."""
    args = dict(FAST)
    args.update(kw)
    out = []
    with mmloader.Loader(data, **args) as L:
        if state is not None:
            L.load_state_dict(state)
        for _ in range(epochs):
            for b in L:
                out.append(as_np(b))
                if n is not None and len(out) == n:
                    break
            if n is not None and len(out) == n:
                break
        return out, L.stats(), L.state_dict()


def upload_tree(ds, put, shard_prefix, image_prefix):
    """Shards under shard_prefix (image refs unchanged: relative 'images/...'), images
    under image_prefix + 'images/...'."""
    for s in ds["shards"]:
        with open(s, "rb") as f:
            put(shard_prefix + os.path.basename(s), f.read())
    for p in ds["images"]:
        with open(p, "rb") as f:
            put(image_prefix + "images/" + os.path.basename(p), f.read())


def fault_objects(ds, bucket, shard_dir, image_dir):
    objs = {}
    upload_tree(ds, lambda k, d: objs.__setitem__(f"/{bucket}/{k}", d), shard_dir, image_dir)
    return objs


def test_s3_epoch_resume_and_remote_image_root(ds, moto_s3):
    """A full epoch from S3 equals the local epoch bitwise; images resolve against a
    remote image_root; resume mid-epoch continues exactly."""
    local, _, _ = run(ds["shards"], epochs=2)
    # moto mis-verifies signed listings of prefixes holding '/', so shards sit at the
    # bucket root here (the fault-server tests below list under folders)
    upload_tree(ds, moto_s3.put, "e2e-", "e2e-img/")
    creds = dict(
        s3_endpoint=moto_s3.endpoint,
        s3_region=moto_s3.region,
        aws_access_key_id=moto_s3.access_key,
        aws_secret_access_key=moto_s3.secret_key,
    )
    data = f"s3://{moto_s3.bucket}/e2e-data-*.jsonl"
    root = f"s3://{moto_s3.bucket}/e2e-img/"
    remote, st, _ = run(data, epochs=2, image_root=root, **creds)
    same(local, remote)
    assert st["fetch"]["requests"] > len(ds["images"]) and st["fetch"]["failures"] == 0
    assert sum(st["skipped_by_reason"].values()) == 0
    assert secret_free(st, moto_s3.secret_key)
    # resume: 3 batches, save, fresh loader, the rest of the two epochs
    head, _, state = run(data, n=3, image_root=root, **creds)
    tail, _, _ = run(data, epochs=2, state=state, image_root=root, **creds)
    same(local, head + tail)


def secret_free(obj, secret):
    return secret not in repr(obj)


def test_faults_lose_nothing_and_threads_do_not_matter(ds, fault_server):
    """s3:// glob under a folder (listing through the fault server), 10% transient faults
    of every kind on shards, images and listings: bitwise the local batches, whatever the
    number of threads; the retries show in stats."""
    local, _, _ = run(ds["shards"])
    srv = fault_server(
        objects=fault_objects(ds, "bkt", "train/shards/", "train/"),
        fault_rate=0.10,
        seed=21,
        latency=0.002,
        jitter=0.004,
    )
    kw = dict(
        s3_endpoint=srv.url("/"),
        aws_access_key_id="AK",
        aws_secret_access_key="SK",
        image_root="s3://bkt/train/",
    )
    r1, st1, _ = run("s3://bkt/train/shards/data-*.jsonl", num_threads=1, **kw)
    r3, st3, _ = run("s3://bkt/train/shards/data-*.jsonl", num_threads=3, max_inflight=5, **kw)
    same(local, r1)
    same(local, r3)
    for st in (st1, st3):
        assert sum(st["skipped_by_reason"].values()) == 0
        f = st["fetch"]
        assert f["failures"] == 0
    injected = sum(o != "ok" for o in srv.outcomes())
    assert injected > 0


def test_permanent_404_is_skipped_and_counted(ds, fault_server):
    objs = fault_objects(ds, "bkt", "", "")
    with open(ds["shards"][0]) as f:
        lines = f.read().splitlines()
    # a record naming a missing image, in the middle of an otherwise good shard
    bad = {
        "messages": [
            {"role": "user", "content": "<image>what is this?"},
            {"role": "assistant", "content": "nothing"},
        ],
        "images": ["images/not-there.jpg"],
    }
    lines.insert(2, json.dumps(bad))
    objs["/bkt/mixed.jsonl"] = ("\n".join(lines) + "\n").encode()
    srv = fault_server(objects=objs)
    kw = dict(
        s3_endpoint=srv.url("/"),
        aws_access_key_id="AK",
        aws_secret_access_key="SK",
        shuffle=False,
        micro_batch_size=1,
        max_error_rate=1.0,
    )
    with pytest.warns(UserWarning, match=r"mixed\.jsonl:3.*not-there\.jpg.*404"):
        got, st, _ = run("s3://bkt/mixed.jsonl", **kw)
    assert len(got) >= len(lines) - 1  # (the engine may refill a skipped slot)
    assert st["skipped_by_reason"].get("missing_file", 0) >= 1
    assert set(st["skipped_by_reason"]) == {"missing_file"}
    assert set(srv.outcomes("/bkt/images/not-there.jpg")) == {"404"}
    f = st["fetch"]
    assert f["failures"] >= 1 and f["retries_5xx"] + f["retries_reset"] + f["retries_timeout"] == 0
    with pytest.raises(mmloader.SampleError, match=r"not-there\.jpg.*404 NoSuchKey"):
        run("s3://bkt/mixed.jsonl", **dict(kw, on_error="raise"))


def test_wrong_credentials_fail_clearly(ds, moto_s3):
    url = moto_s3.put("cred-data.jsonl", open(ds["shards"][0], "rb").read())
    wrong = "wrong-SECRET-abcdefghijklmnopqrstuvwxyz0123"
    creds = dict(
        s3_endpoint=moto_s3.endpoint,
        s3_region=moto_s3.region,
        aws_access_key_id=moto_s3.access_key,
        aws_secret_access_key=wrong,
    )
    for data in (url, f"s3://{moto_s3.bucket}/cred-*.jsonl"):
        with pytest.raises(mmloader.Error) as e:
            run(data, **creds)
        msg = str(e.value)
        assert "403" in msg and "SignatureDoesNotMatch" in msg, msg
        assert wrong not in msg and moto_s3.secret_key not in msg
