"""The dataset index (python -m mmloader index, Loader(index=)): what it records is what the
loader computes, batches with an index are bitwise those without, builds resume after an
interruption, and an index that no longer matches its shard is refused."""

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import time
import warnings

import pytest
from child import child_env

import mmloader
from mmloader import dsindex
from mmloader.datagen import make_dataset
from conftest import as_np, same

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
VISION = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)


def epoch(data, **kw):
    args = dict(
        tokenizer=TINY,
        micro_batch_size=3,
        num_threads=2,
        prefetch=2,
        seed=3,
        max_error_rate=1.0,
        **VISION,
    )
    args.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mmloader.Loader(data, **args) as L:
            out = [as_np(b) for b in L]
            return out, L.index_shards, L.stats()


def build(data, **kw):
    return dsindex.build(data, tokenizer=TINY, threads=2, **dict(VISION, **kw))


@pytest.fixture
def ds(tmp_path):
    return make_dataset(
        str(tmp_path), n_samples=40, seed=5, n_shards=2, n_images=10, min_size=24, max_size=200
    )


def lengths(data, **kw):
    """Each sample's token count in stream order (no shuffle, one sample per batch)."""
    b, _, _ = epoch(data, micro_batch_size=1, shuffle=False, index=False, **kw)
    return [x["input_ids"].shape[1] for x in b]


def indexed_lengths(paths):
    out = []
    for p in paths:
        x = dsindex.read(p)
        out += [
            t + sum(i[2] for i in im)
            for t, s, im in zip(x["text_tokens"], x["status"], x["images"])
            if s == 0
        ]
    return out


def test_counts_are_the_loaders(ds):
    s = build(ds["shards"])
    assert s["samples"] == 40 and s["good"] == 40 and s["shards"] == 2
    paths = [p + ".mmlidx" for p in ds["shards"]]
    assert indexed_lengths(paths) == lengths(ds["shards"])
    x = dsindex.read(paths[0])
    assert x["version"] == dsindex.FORMAT_VERSION and x["layout"] == "jsonl"
    assert "max_pixels=50176" in x["settings"]
    PIL = pytest.importorskip("PIL.Image")
    real = {PIL.open(p).size for p in ds["images"]}
    sizes = {im[:2] for ims in x["images"] for im in ims}
    assert sizes and sizes <= real  # header sizes, exactly as Pillow reads them


def test_reads_headers_only(tmp_path):
    d = make_dataset(
        str(tmp_path),
        n_samples=8,
        seed=2,
        n_shards=1,
        n_images=8,
        min_size=700,
        max_size=1200,
        text_only_fraction=0.0,
    )
    s = build(d["shards"])
    _, _, st = epoch(d["shards"], index=False)
    assert s["good"] == 8 and s["images"] >= 8
    # whole images only where a header is not in the first 16 KiB; records are read
    assert s["bytes_read"] < st["bytes_read"] / 4, (s["bytes_read"], st["bytes_read"])


def test_cli_build_summary_and_up_to_date(ds, tmp_path):
    with open(ds["shards"][0], "a") as f:
        f.write("not json\n")
        f.write(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": "<image>hi"},
                        {"role": "assistant", "content": "x"},
                    ],
                    "images": ["images/missing.jpg"],
                }
            )
            + "\n"
        )
    out = tmp_path / "idx"
    cmd = [
        sys.executable,
        "-m",
        "mmloader",
        "index",
        ds["root"],
        "--tokenizer",
        TINY,
        "--out",
        str(out),
        "--max-pixels",
        str(VISION["max_pixels"]),
        "--min-pixels",
        str(VISION["min_pixels"]),
        "--num-threads",
        "2",
    ]
    env = child_env()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "2 shard(s), 42 samples (40 planned)" in r.stdout
    assert "bad_record: 1" in r.stdout and "missing_file: 1" in r.stdout
    assert "data-00000.jsonl:21: bad record" in r.stdout  # the example names shard and line
    assert "samples/s" in r.stdout and "bytes read per sample" in r.stdout
    assert (
        r.stderr.count("[index] shard 2/2: 20 samples") == 1
    )  # progress (one line a shard off a tty)
    assert sorted(os.listdir(out)) == sorted(
        os.path.basename(dsindex.sidecar_path(s, str(out))) for s in ds["shards"]
    )
    r2 = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r2.returncode == 0 and "2 shard(s) already up to date" in r2.stdout
    a, n, _ = epoch(ds["shards"], index=str(out))
    b, n0, _ = epoch(ds["shards"], index=False)
    assert n == 2 and n0 == 0
    same(a, b)


class Stop(Exception):
    pass


def test_resume_after_interruption(tmp_path):
    # text-only samples: more than one chunk (256) per shard
    d = make_dataset(
        str(tmp_path / "d"),
        n_samples=700,
        seed=1,
        n_shards=1,
        n_images=8,
        min_size=24,
        max_size=64,
        text_only_fraction=0.9,
    )
    shard = d["shards"][0]

    def stop(shard_no, shards, done, total):
        if done > 0:
            raise Stop

    with pytest.raises(Stop):
        build(shard, out=str(tmp_path / "a"), progress=stop)
    done_a = dsindex.sidecar_path(shard, str(tmp_path / "a"))
    partial = tmp_path / "a" / (os.path.basename(done_a) + ".partial")
    assert partial.exists() and not os.path.exists(done_a)
    # a build killed mid-write leaves a torn last entry: it is dropped on resume
    partial.write_bytes(partial.read_bytes()[:-5])
    s = build(shard, out=str(tmp_path / "a"))
    assert 0 < s["resumed"] < 700 and s["samples"] == 700 and not partial.exists()
    fresh = build(shard, out=str(tmp_path / "b"))
    assert fresh["resumed"] == 0
    with open(done_a, "rb") as a, open(dsindex.sidecar_path(shard, str(tmp_path / "b")), "rb") as b:
        assert a.read() == b.read()
    # a partial file of other settings is not resumed from
    with pytest.raises(Stop):
        build(shard, out=str(tmp_path / "c"), progress=stop, max_pixels=28 * 28 * 32)
    assert build(shard, out=str(tmp_path / "c"))["resumed"] == 0


def as_json_array(shard, dest):
    with open(shard) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    with open(dest, "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(r) for r in recs) + "\n]\n")
    return dest


def as_tar(shard, dest):
    """The records as a WebDataset shard, each image a member of its sample."""
    base = os.path.dirname(shard)
    buf = io.BytesIO()
    with open(shard) as f, tarfile.open(fileobj=buf, mode="w") as tar:
        for i, line in enumerate(f):
            r = json.loads(line)
            imgs = r.pop("images", None) or r.pop("image", None) or []
            if isinstance(imgs, str):
                imgs = [imgs]
            members = []
            for j, p in enumerate(imgs):
                ext = p.rsplit(".", 1)[1]
                members.append((f"{i:06d}.{j}.{ext}", open(os.path.join(base, p), "rb").read()))
            r["images"] = [m[0].split(".", 1)[1] for m in members]
            for name, data in [(f"{i:06d}.json", json.dumps(r).encode())] + members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with open(dest, "wb") as f:
        f.write(buf.getvalue())
    return dest


@pytest.mark.parametrize("fmt", ["jsonl", "json", "webdataset", "jsonl.gz"])
def test_batches_with_index_are_bitwise_those_without(ds, tmp_path, fmt):
    shards = ds["shards"]
    if fmt == "json":
        shards = [as_json_array(s, s[:-1]) for s in shards]
    elif fmt == "webdataset":
        shards = [as_tar(s, s[:-6] + ".tar") for s in shards]
    elif fmt == "jsonl.gz":
        shards = []
        for s in ds["shards"]:
            with open(s, "rb") as f, open(s + ".gz", "wb") as g:
                g.write(gzip.compress(f.read()))
            shards.append(s + ".gz")
    s = build(shards)
    assert s["good"] == 40, s
    for p in shards:
        assert dsindex.read(p + ".mmlidx")["layout"] == fmt.split(".")[0]
    for kw in (
        dict(max_length=120),
        dict(packing=True, pack_length=160),
        dict(seq_length=150, micro_batch_size=2),
    ):
        a, n, st = epoch(shards, **kw)
        b, n0, st0 = epoch(shards, index=False, **kw)
        assert n == 2 and n0 == 0
        same(a, b)
        assert st["skipped"] == st0["skipped"] > 0, kw
        assert st["skipped_by_reason"] == st0["skipped_by_reason"] == {"too_long": st["skipped"]}
        # too-long samples are skipped from the index before their bytes are read
        assert st["bytes_read"] < st0["bytes_read"]


def test_same_file_names_in_one_index_folder(tmp_path):
    # a mixture of two datagen datasets: both shards are data-0000X.jsonl, in two folders
    text = make_dataset(
        str(tmp_path / "text"), n_samples=12, seed=2, n_shards=1, n_images=4, text_only_fraction=1.0
    )
    img = make_dataset(
        str(tmp_path / "img"),
        n_samples=12,
        seed=3,
        n_shards=1,
        n_images=4,
        min_size=24,
        max_size=120,
    )
    assert os.path.basename(text["shards"][0]) == os.path.basename(img["shards"][0])
    mix = [
        mmloader.Source(text["shards"][0], weight=1, name="text"),
        mmloader.Source(img["shards"][0], weight=2, name="img"),
    ]
    out = tmp_path / "idx"
    s = build(mix, out=str(out))
    assert s["shards"] == 2 and s["samples"] == 24
    names = [dsindex.sidecar_path(sh, str(out)) for sh in (text["shards"][0], img["shards"][0])]
    assert names[0] != names[1] and sorted(os.listdir(out)) == sorted(map(os.path.basename, names))
    assert [dsindex.read(n)["samples"] for n in names] == [12, 12]
    # each shard finds its own index: none is refused as stale, batches are those without
    a, n, _ = epoch(mix, index=str(out))
    b, n0, _ = epoch(mix, index=False)
    assert (n, n0) == (2, 0)
    same(a, b)
    # next to the shards the name stays <shard>.mmlidx
    assert dsindex.sidecar_path(text["shards"][0]) == text["shards"][0] + ".mmlidx"


def test_stale_index_is_refused(ds):
    build(ds["shards"])
    shard = ds["shards"][1]
    st = os.stat(shard)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # touched: same size
    with pytest.raises(
        mmloader.ConfigError,
        match=r"data-00001\.jsonl no longer matches its "
        r"index .*modified since it was indexed",
    ):
        epoch(ds["shards"])
    with open(shard, "a") as f:
        f.write(open(ds["shards"][0]).readline())
    with pytest.raises(mmloader.ConfigError, match=r"data-00001\.jsonl no longer matches .*size"):
        epoch(ds["shards"])
    a, n, _ = epoch(ds["shards"], index=False)  # never read: works as before
    assert n == 0
    build(ds["shards"])  # brought up to date
    b, n, _ = epoch(ds["shards"])
    assert n == 2
    same(a, b)


def test_corrupt_index_is_refused(ds):
    build(ds["shards"])
    p = ds["shards"][0] + ".mmlidx"
    data = bytearray(open(p, "rb").read())
    data[200] ^= 0x40
    open(p, "wb").write(bytes(data))
    with pytest.raises(mmloader.ConfigError, match=r"data-00000\.jsonl\.mmlidx: corrupt"):
        epoch(ds["shards"])
    open(p, "wb").write(
        b"MMLINDEX" + (2).to_bytes(4, "little") + (128).to_bytes(4, "little") + b"\0" * 112
    )
    with pytest.raises(mmloader.ConfigError, match="format version"):
        epoch(ds["shards"])


def test_other_settings_use_offsets_not_counts(ds):
    build(ds["shards"])
    kw = dict(max_length=120, max_pixels=28 * 28 * 32)
    with pytest.warns(UserWarning, match="its index was built with other settings"):
        with mmloader.Loader(
            ds["shards"],
            tokenizer=TINY,
            micro_batch_size=3,
            min_pixels=VISION["min_pixels"],
            max_length=120,
            max_pixels=28 * 28 * 32,
            max_error_rate=1.0,
        ) as L:
            assert L.index_shards == 0
            next(iter(L))
    a, n, _ = epoch(ds["shards"], **kw)
    b, _, _ = epoch(ds["shards"], index=False, **kw)
    assert n == 0
    same(a, b)


def test_mixture_sources_keyed_by_their_settings(ds):
    mix = [
        mmloader.Source(ds["shards"][0], weight=1, name="a"),
        mmloader.Source(ds["shards"][1], weight=1, name="b", max_pixels=28 * 28 * 16),
    ]
    s = build(mix)
    assert s["shards"] == 2
    x0, x1 = (dsindex.read(p + ".mmlidx") for p in ds["shards"])
    assert x0["key"] != x1["key"] and "max_pixels=12544" in x1["settings"]
    a, n, _ = epoch(mix, max_length=150)
    b, _, _ = epoch(mix, max_length=150, index=False)
    assert n == 2
    same(a, b)
    # source b's settings changed: its counts no longer apply, a's still do
    mix[1] = mmloader.Source(ds["shards"][1], weight=1, name="b", max_pixels=28 * 28 * 24)
    a, n, _ = epoch(mix, max_length=150)
    b, _, _ = epoch(mix, max_length=150, index=False)
    assert n == 1
    same(a, b)


def test_s3_etag(ds, moto_s3, tmp_path):
    pre = f"dsx{int(time.time() * 1e6)}"
    for p in ds["images"]:
        moto_s3.put(f"{pre}/images/" + os.path.basename(p), open(p, "rb").read())
    urls = [
        moto_s3.put(f"{pre}/" + os.path.basename(s), open(s, "rb").read()) for s in ds["shards"]
    ]
    cred = dict(
        s3_endpoint=moto_s3.endpoint,
        s3_region=moto_s3.region,
        aws_access_key_id=moto_s3.access_key,
        aws_secret_access_key=moto_s3.secret_key,
    )
    with pytest.raises(mmloader.ConfigError, match="is remote: give out="):
        build(urls, **cred)
    out = tmp_path / "idx"
    s = build(urls, out=str(out), **cred)
    assert s["good"] == 40
    assert dsindex.read(dsindex.sidecar_path(urls[0], str(out)))["etag"]
    # the index folder may be local or remote (uploaded next to the shards)
    for name in os.listdir(out):
        moto_s3.put(f"{pre}/{name}", (out / name).read_bytes())
    a, n, _ = epoch(urls, max_length=120, index=str(out), **cred)
    b, n2, _ = epoch(urls, max_length=120, index=f"s3://{moto_s3.bucket}/{pre}/", **cred)
    c, n0, st = epoch(urls, max_length=120, **cred)  # remote shards: looked for only if asked
    assert (n, n2, n0) == (2, 2, 0) and st["fetch"]["failures"] == 0
    same(a, c)
    same(b, c)
    # the object replaced by one of the same size: its ETag changes
    body = bytearray(open(ds["shards"][0], "rb").read())
    body[-2:-1] = b" "  # inside the last record's JSON: whitespace
    moto_s3.put(f"{pre}/data-00000.jsonl", bytes(body))
    with pytest.raises(mmloader.ConfigError, match=r"data-00000\.jsonl no longer matches .*ETag"):
        epoch(urls, index=str(out), **cred)


def test_global_plan_takes_counts_from_the_index(ds):
    build(ds["shards"])
    kw = dict(
        max_tokens_per_batch=700, balance="tokens", dp_size=2, micro_batch_size=None, max_length=300
    )
    for rank in (0, 1):
        a, n, st = epoch(ds["shards"], dp_rank=rank, **kw)
        b, n0, st0 = epoch(ds["shards"], dp_rank=rank, index=False, **kw)
        assert n == 2 and n0 == 0
        same(a, b)
        assert st["skipped_by_reason"] == st0["skipped_by_reason"]

    def plan_len(**over):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with mmloader.Loader(ds["shards"], tokenizer=TINY, **VISION, **dict(kw, **over)) as L:
                return len(L)

    want = plan_len()
    for p in ds["images"]:  # the plan is made from the index alone: no image is read
        os.rename(p, p + ".away")
    assert plan_len() == want
    assert plan_len(index=False) < want  # the planning pass finds the images missing
