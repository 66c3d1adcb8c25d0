"""Parquet shards (issue 35): the Hugging Face Hub's layout, images embedded as
`datasets` Image structs {bytes, path}.

The reference is the same rows exported as JSONL + image files: every Parquet file —
written by `datasets` itself (Dataset.from_dict(...).to_parquet() with the Image
feature) and by pyarrow directly with each codec, page version and encoding the reader
supports — must give bitwise-identical batches.  Images are real photos (matplotlib's
sample_data) re-encoded at test time as JPEG, PNG and WebP.
"""

import io
import json
import os

import pytest
from child import child_env

import mmloader
from conftest import as_np, same, take

PIL = pytest.importorskip("PIL.Image")
matplotlib = pytest.importorskip("matplotlib")
pa = pytest.importorskip("pyarrow", reason="pyarrow (with datasets: requirements-test.txt)")
pq = pytest.importorskip("pyarrow.parquet")
datasets = pytest.importorskip("datasets", reason="datasets (requirements-test.txt)")

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
SAMPLE_DATA = os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "sample_data")
PHOTOS = ["grace_hopper.jpg", "logo2.png", "Minduka_Present_Blue_Pack.png"]
N = 14


@pytest.fixture(scope="module")
def photos():
    out = []
    for i, name in enumerate(PHOTOS * 2):
        im = PIL.open(os.path.join(SAMPLE_DATA, name)).convert("RGB")
        im = im.resize((64 + 24 * i, 48 + 16 * (i % 3)))
        buf = io.BytesIO()
        fmt, ext = [("JPEG", "jpg"), ("PNG", "png"), ("WEBP", "webp")][i % 3]
        im.save(buf, fmt, quality=90) if fmt != "PNG" else im.save(buf, fmt)
        out.append((ext, buf.getvalue()))
    return out


def rows(photos, n=N):
    """(messages, [(ext, bytes), ...]) with 0, 1 or 2 images; text with quotes,
    backslashes, newlines and non-ASCII so the JSON the reader writes is exercised."""
    out = []
    for i in range(n):
        k = i % 3
        imgs = [photos[(i + j) % len(photos)] for j in range(k)]
        msgs = [
            {"role": "user", "content": "<image>" * k + f'Row {i}: "what" is\\ shown?\n'},
            {"role": "assistant", "content": f"Answer {i} — ünïcode\t{'x' * i}."},
        ]
        out.append((msgs, imgs))
    return out


def write_jsonl(tmp, items):
    """The same rows as JSONL + image files (the reference)."""
    os.makedirs(os.path.join(tmp, "img"), exist_ok=True)
    with open(os.path.join(tmp, "ref.jsonl"), "w") as f:
        for i, (msgs, imgs) in enumerate(items):
            names = []
            for j, (ext, data) in enumerate(imgs):
                names.append(f"img/{i}.{j}.{ext}")
                with open(os.path.join(tmp, names[-1]), "wb") as g:
                    g.write(data)
            f.write(json.dumps({"messages": msgs, "images": names}) + "\n")
    return os.path.join(tmp, "ref.jsonl")


FEATURES = {
    "messages": [{"role": "string", "content": "string"}],
    "images": "images",
}


def hf_features():
    d = datasets
    return d.Features(
        {
            "messages": d.List({"role": d.Value("string"), "content": d.Value("string")}),
            "images": d.List(d.Image()),
            "id": d.Value("int64"),
            "score": d.Value("float32"),
        }
    )


def hf_dict(items):
    return {
        "messages": [m for m, _ in items],
        "images": [[{"bytes": b, "path": None} for _, b in imgs] for _, imgs in items],
        "id": list(range(len(items))),
        "score": [0.5 * i for i in range(len(items))],
    }


def epoch(data, **kw):
    args = dict(
        tokenizer=TINY,
        micro_batch_size=3,
        num_threads=2,
        prefetch=2,
        shuffle=False,
        min_pixels=28 * 28 * 4,
        max_pixels=28 * 28 * 16,
    )
    args.update(kw)
    with mmloader.Loader(data, **args) as L:
        return [as_np(b) for b in L]


@pytest.fixture(scope="module")
def ref(tmp_path_factory, photos):
    tmp = str(tmp_path_factory.mktemp("pqref"))
    items = rows(photos)
    return items, epoch(write_jsonl(tmp, items)), tmp


@pytest.mark.parametrize("batch_size", [None, 4], ids=["one-row-group", "row-groups-of-4"])
def test_datasets_to_parquet_matches_jsonl_and_files(ref, tmp_path, batch_size):
    items, want, _ = ref
    ds = datasets.Dataset.from_dict(hf_dict(items), features=hf_features())
    p = str(tmp_path / "train-00000-of-00001.parquet")
    ds.to_parquet(p, **({"batch_size": batch_size} if batch_size else {}))
    groups = pq.ParquetFile(p).metadata.num_row_groups
    assert groups == (1 if batch_size is None else -(-N // batch_size))
    with mmloader.Loader(p, tokenizer=TINY, micro_batch_size=3) as L:
        assert L.num_samples == N
    same(want, epoch(p))
    same(want, epoch(str(tmp_path / "*.parquet")))  # a glob
    same(want, epoch(str(tmp_path)))  # a Hub-style folder of *.parquet


def arrow_table(items, image_column="images"):
    """The rows as pyarrow writes them, with what the reader must assemble but the
    record does not read: a nested list with nulls inside each message, a null image
    list for rows without images (null and [] both mean none), an extra struct column."""
    img_t = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    msg_t = pa.struct(
        [("role", pa.string()), ("content", pa.string()), ("w", pa.list_(pa.int64()))]
    )
    msgs = [
        [
            dict(m, w=None if (i + j) % 3 == 0 else [i, None, j][: 1 + (i + j) % 3])
            for j, m in enumerate(ms)
        ]
        for i, (ms, _) in enumerate(items)
    ]
    imgs = [
        None if not im and i % 2 == 0 else [{"bytes": b, "path": None} for _, b in im]
        for i, (_, im) in enumerate(items)
    ]
    return pa.table(
        {
            "messages": pa.array(msgs, pa.list_(msg_t)),
            image_column: pa.array(imgs, pa.list_(img_t)),
            "extra": pa.array([{"a": i, "b": [i, None]} for i in range(len(items))]),
        }
    )


@pytest.mark.parametrize("codec", ["snappy", "zstd", "gzip", "none"])
@pytest.mark.parametrize("page", ["1.0", "2.0"])
@pytest.mark.parametrize("dictionary", [True, False], ids=["dict", "plain"])
def test_pyarrow_codecs_pages_and_encodings(ref, tmp_path, codec, page, dictionary):
    items, want, _ = ref
    p = str(tmp_path / "d.parquet")
    pq.write_table(
        arrow_table(items),
        p,
        compression=codec,
        data_page_version=page,
        use_dictionary=dictionary,
        row_group_size=5,
        data_page_size=700,  # several pages per column chunk
    )
    same(want, epoch(p))


def test_single_image_struct_llava_layout_and_paths(ref, tmp_path, photos):
    """LLaVA's layout with one Image struct per row (`image`, not a list; datasets'
    schema, written with pyarrow since datasets would embed the files); rows whose struct
    holds only a path resolve it like a JSON record's (against the shard's folder)."""
    items, _, tmp = ref
    conv, imgs, ref_lines = [], [], []
    os.makedirs(tmp_path / "img", exist_ok=True)
    for i in range(9):
        ext, data = photos[i % len(photos)]
        q = f"<image>\nRow {i}?"
        conv.append([{"from": "human", "value": q}, {"from": "gpt", "value": f"A {i}"}])
        name = f"img/{i}.{ext}"
        (tmp_path / name).write_bytes(data)
        ref_lines.append(json.dumps({"conversations": conv[-1], "image": name}) + "\n")
        imgs.append({"bytes": None, "path": name} if i % 2 else {"bytes": data, "path": "x"})
    (tmp_path / "ref.jsonl").write_text("".join(ref_lines))
    conv_t = pa.list_(pa.struct([("from", pa.string()), ("value", pa.string())]))
    img_t = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"conversations": pa.array(conv, conv_t), "image": pa.array(imgs, img_t)})
    pq.write_table(table, str(tmp_path / "llava.parquet"), row_group_size=4)
    same(epoch(str(tmp_path / "ref.jsonl")), epoch(str(tmp_path / "llava.parquet")))


def test_shuffled_sharded_mixed_with_jsonl_and_resumed(ref, tmp_path):
    items, _, tmp = ref
    jsonl = os.path.join(tmp, "ref.jsonl")
    pq.write_table(arrow_table(items[:6]), str(tmp_path / "a.parquet"), row_group_size=4)
    pq.write_table(arrow_table(items[6:]), str(tmp_path / "b.parquet"), row_group_size=3)
    shards = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    for rank in range(2):
        kw = dict(shuffle=True, seed=7, dp_rank=rank, dp_size=2)
        same(epoch(jsonl, image_root=tmp, **kw), epoch(shards, **kw))
    # exact resume: a fresh loader from the state after 2 batches gives the next ones
    kw = dict(tokenizer=TINY, micro_batch_size=2, shuffle=True, seed=3, num_threads=2)
    with mmloader.Loader(shards, **kw) as L:
        take(L, 2)
        state = L.state_dict()
        want = take(L, 3)
    with mmloader.Loader(shards, **kw) as R:
        R.load_state_dict(state)
        same(want, take(R, 3))

    # a mixture: the Parquet source draws exactly as its JSONL export does
    def mix(first):
        return [
            mmloader.Source(first, weight=2.0, name="x", image_root=tmp),
            mmloader.Source(jsonl, weight=1.0, name="y", image_root=tmp),
        ]

    same(epoch(mix(jsonl), seed=1, shuffle=True), epoch(mix(shards), seed=1, shuffle=True))


def test_bad_rows_name_shard_row_group_and_row(ref, tmp_path, photos):
    items, _, _ = ref
    bad = [list(x) for x in items[:8]]
    bad[5][1] = [("jpg", b"\xff\xd8\xff not a jpeg")] + bad[5][1][1:]
    p = str(tmp_path / "bad.parquet")
    pq.write_table(arrow_table([tuple(x) for x in bad]), p, row_group_size=3)
    with pytest.raises(mmloader.SampleError) as e:
        epoch(p, micro_batch_size=1, on_error="raise")
    assert "bad.parquet[row group 1, row 5]" in str(e.value), str(e.value)
    with mmloader.Loader(p, tokenizer=TINY, micro_batch_size=1, shuffle=False) as L:
        got = [as_np(b) for b in L]
        st = L.stats()
    assert len(got) == 8 and st["skipped"] == 1, st


def test_hostile_files_fail_naming_file_and_reason(ref, tmp_path):
    items, _, _ = ref
    p = tmp_path / "d.parquet"
    pq.write_table(arrow_table(items), str(p), row_group_size=5)
    data = p.read_bytes()
    cases = {
        "truncated": data[:4] + data[len(data) // 2 :],
        "footer-garbage": data[:-40] + b"\xff" * 32 + data[-8:],
        "footer-too-long": data[:-8] + b"\xff\xff\xff\x7f" + b"PAR1",
    }
    for name, blob in cases.items():
        q = tmp_path / f"{name}.parquet"
        q.write_bytes(blob)
        with pytest.raises(mmloader.Error) as e:
            mmloader.Loader(str(q), tokenizer=TINY, micro_batch_size=1)
        assert f"{name}.parquet" in str(e.value), (name, str(e.value))
    # a column chunk above max_object_bytes is refused, naming the row group and column
    md = pq.read_metadata(str(p))
    rg = md.row_group(0)
    limit = max(rg.column(j).total_compressed_size for j in range(rg.num_columns)) - 1
    assert md.serialized_size < limit
    with pytest.raises(mmloader.Error) as e:
        mmloader.Loader(str(p), tokenizer=TINY, micro_batch_size=1, max_object_bytes=limit)
    m = str(e.value)
    assert (
        "row group 0, column images.list.element.bytes" in m and f"max_object_bytes={limit}" in m
    ), m
    # an unsupported codec names the file, row group and column
    pq.write_table(arrow_table(items), str(p), compression="brotli")
    with pytest.raises(mmloader.Error) as e:
        mmloader.Loader(str(p), tokenizer=TINY, micro_batch_size=1)
    m = str(e.value)
    assert "d.parquet" in m and "row group 0, column" in m and "codec" in m, m


def test_remote_shards_read_by_row_group(ref, tmp_path, fault_server, moto_s3):
    """Over HTTP (with injected faults: retried) and S3, a Parquet shard is read with
    ranged GETs, the footer and then windows of a column chunk's pages: no request for
    the whole object, and none larger than the largest row group's read columns; an
    s3:// glob of shards is a source too."""
    items, want, _ = ref
    p = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(arrow_table(items), str(p), row_group_size=4)
    data = p.read_bytes()
    md = pq.read_metadata(str(p))
    biggest = max(
        md.row_group(g).column(j).total_compressed_size
        for g in range(md.num_row_groups)
        for j in range(md.num_columns)
    )
    assert biggest < len(data) // 2
    srv = fault_server(objects={"/hub/train.parquet": data}, fault_rate=0.1, seed=3)
    same(want, epoch(srv.url("/hub/train.parquet")))
    gets = [e for e in srv.log if e[1] == "GET" and e[2] == "/hub/train.parquet"]
    assert gets and all(str(e[3]).startswith("bytes=") for e in gets), gets
    for e in gets:
        a, b = str(e[3])[6:].split("-")
        assert int(b) - int(a) + 1 <= max(biggest, md.serialized_size + 8), e
    url = moto_s3.put("hub/train.parquet", data)
    s3 = dict(
        s3_endpoint=moto_s3.endpoint,
        s3_region=moto_s3.region,
        aws_access_key_id=moto_s3.access_key,
        aws_secret_access_key=moto_s3.secret_key,
    )
    same(want, epoch(url, **s3))
    # an s3:// glob of Hub-style shards, listed and read the same way (at the bucket's
    # root: moto mis-verifies signed listings of prefixes holding '/', test_fetch_loader.py)
    for k, part in enumerate([items[:6], items[6:]]):
        q = tmp_path / f"pq-train-{k:05d}-of-00002.parquet"
        pq.write_table(arrow_table(part), str(q), row_group_size=4)
        moto_s3.put(q.name, q.read_bytes())
    same(want, epoch(f"s3://{moto_s3.bucket}/pq-train-*.parquet", **s3))


def test_dataset_index_and_global_plan(ref, tmp_path):
    """`python -m mmloader index` of a Parquet shard: its counts are used (no header
    pass) and batches stay the JSONL export's; the global plan decides the same batches
    from a Parquet shard as from its export."""
    from mmloader import dsindex

    items, want, tmp = ref
    p = str(tmp_path / "train.parquet")
    pq.write_table(arrow_table(items), p, row_group_size=4)
    vision = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
    # text that compresses well: the decoded rows (members) lie far past the file's size
    long = [
        (
            [dict(m, content=m["content"].replace("<image>", "") + " and so on" * 400) for m in ms],
            [],
        )
        for ms, _ in items
    ]
    q = str(tmp_path / "long.parquet")
    pq.write_table(arrow_table(long), q, compression="zstd")
    assert os.path.getsize(q) < N * 2 * 4000 // 4
    dsindex.build(q, tokenizer=TINY, threads=2, **vision)
    with mmloader.Loader(q, tokenizer=TINY, micro_batch_size=3, max_length=100000, **vision) as L:
        assert L.index_shards == 1 and len(L) == N // 3
    s = dsindex.build(p, tokenizer=TINY, threads=2, **vision)
    assert s["samples"] == N and s["images"] == sum(len(i) for _, i in items), s
    with mmloader.Loader(
        p, tokenizer=TINY, micro_batch_size=3, num_threads=2, shuffle=False, **vision
    ) as L:
        got = [as_np(b) for b in L]
        assert L.index_shards == 1
    same(want, got)
    plan = dict(global_plan=True, max_tokens_per_batch=200, shuffle=True, seed=5)
    same(
        epoch(os.path.join(tmp, "ref.jsonl"), micro_batch_size=None, **plan),
        epoch(p, micro_batch_size=None, **plan),
    )


def noise_rows(n, size=96):
    """n rows of one incompressible PNG each (random pixels), so a row group's bytes are
    its images' and a ranged read's size shows which rows it fetched."""
    import numpy as np

    rng = np.random.default_rng(5)
    out = []
    for i in range(n):
        buf = io.BytesIO()
        PIL.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, "PNG")
        msgs = [
            {"role": "user", "content": f"<image>Row {i}?"},
            {"role": "assistant", "content": f"Answer {i}."},
        ]
        out.append((msgs, [("png", buf.getvalue())]))
    return out


def read_columns_bytes(path):
    """The bytes of the column chunks a record reads (every column of arrow_table's but
    `extra`), row group by row group."""
    md = pq.read_metadata(path)
    return [
        sum(
            md.row_group(g).column(j).total_compressed_size
            for j in range(md.num_columns)
            if not md.row_group(g).column(j).path_in_schema.startswith("extra")
        )
        for g in range(md.num_row_groups)
    ]


FIRST_BATCH = r"""
import json, sys
import mmloader

def rchar():
    with open("/proc/self/io") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("rchar"))

path, tok = sys.argv[1], sys.argv[2]
before = rchar()
with mmloader.Loader(path, tokenizer=tok, micro_batch_size=2, num_threads=2, prefetch=1,
                     shuffle=False, min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16) as L:
    next(iter(L))
    read = rchar() - before
    print(json.dumps({"rchar": read, "parquet": L.stats()["parquet"]}))
"""


def test_rows_decoded_per_row_group_in_the_workers(tmp_path, fault_server):
    """Issue 35: a Parquet shard is never decoded whole up front (no copy in $TMPDIR, no
    read of the whole file for a few rows): its rows are read by the workers a row group
    at a time, each row group decoded once while the samples in flight share it
    (loader_parquet.c P1), and the bytes read are exactly the read columns' chunks."""
    import subprocess
    import sys

    items = noise_rows(256)
    p = str(tmp_path / "train.parquet")
    pq.write_table(arrow_table(items), p, row_group_size=2, compression="none")
    size = os.path.getsize(p)
    chunks = read_columns_bytes(p)
    assert len(chunks) == 128 and size > 6 << 20
    # a child with $TMPDIR pointing nowhere (a spill file could not be made) reads the
    # footer and the row groups of the first samples in flight, not the file
    env = child_env(TMPDIR=str(tmp_path / "no-such-dir"))
    out = subprocess.run(
        [sys.executable, "-c", FIRST_BATCH, p, TINY],
        cwd="/tmp",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    q = got["parquet"]
    assert got["rchar"] < size // 4, (got, size)
    assert 0 < q["row_groups_decoded"] < 32 and q["bytes_read"] <= sum(chunks[:32]), (q, size)
    # a whole epoch with 4 threads: each row group decoded once, its chunks read once
    want = epoch(write_jsonl(str(tmp_path), items), micro_batch_size=4, num_threads=4)
    args = dict(tokenizer=TINY, micro_batch_size=4, num_threads=4, shuffle=False)
    with mmloader.Loader(p, min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16, **args) as L:
        got = [as_np(b) for b in L]
        q = L.stats()["parquet"]
    same(want, got)
    assert q["row_groups_decoded"] == 128, q
    assert q["bytes_read"] == sum(chunks), (q, sum(chunks))
    # and over HTTP: ranged GETs of the footer and of those chunks, never the object
    with open(p, "rb") as f:
        srv = fault_server(objects={"/d/train.parquet": f.read()})
    with mmloader.Loader(srv.url("/d/train.parquet"), **dict(args, prefetch=1)) as L:
        next(iter(L))
        spans = [str(e[3])[6:].split("-") for e in srv.log if e[1] == "GET"]
    assert spans and all(len(s) == 2 for s in spans), srv.log
    assert sum(int(b) - int(a) + 1 for a, b in spans) < size // 2, (spans, size)


def test_a_row_waits_for_its_pages_not_its_row_group(tmp_path, fault_server):
    """Issue 35: a row group's column chunks are read by windows of their pages as its
    rows need them (parquet_chunk.c DESIGN 1, parquet_rows.c invariant 3,
    loader_parquet.c P1): the first batch of a 20 MB row group reads a few of its 1.6 MB
    pages, locally and by ranged GETs, not the group; a whole epoch reads each chunk
    at most twice (DESIGN 5) and its batches are the JSONL export's."""
    items = noise_rows(96, size=256)
    p = str(tmp_path / "one-group.parquet")
    pq.write_table(  # pages of 8 images, ~1.6 MB (pyarrow's default here: one page)
        arrow_table(items),
        p,
        row_group_size=96,
        compression="none",
        use_dictionary=False,
        write_batch_size=8,
    )
    md = pq.read_metadata(p)
    assert md.num_row_groups == 1
    chunk = read_columns_bytes(p)[0]
    assert chunk > 16 << 20
    args = dict(tokenizer=TINY, micro_batch_size=2, num_threads=2, prefetch=1, shuffle=False)
    args.update(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16, window=4)
    with mmloader.Loader(p, **args) as L:  # (4 samples in flight)
        next(iter(L))
        first = L.stats()["parquet"]["bytes_read"]
    assert 0 < first < chunk // 4, (first, chunk)
    want = epoch(write_jsonl(str(tmp_path), items), **args)
    with mmloader.Loader(p, **args) as L:
        got = [as_np(b) for b in L]
        q = L.stats()["parquet"]
    same(want, got)
    assert q["row_groups_decoded"] == 1 and chunk <= q["bytes_read"] <= 2 * chunk, (q, chunk)
    with open(p, "rb") as f:
        data = f.read()
    srv = fault_server(objects={"/d/one-group.parquet": data})
    with mmloader.Loader(srv.url("/d/one-group.parquet"), **args) as L:
        next(iter(L))
        spans = [str(e[3])[6:].split("-") for e in srv.log if e[1] == "GET"]
    sizes = [int(b) - int(a) + 1 for a, b in spans]
    assert sizes and sum(sizes) < chunk // 4, (sizes, chunk)


def test_a_compressed_row_group_holds_its_pages_not_its_windows(tmp_path):
    """A snappy row group's windows are dropped once decoded (parquet_chunk.c DESIGN 5):
    after an epoch the cache holds about the decoded pages (not also the stored bytes
    read), each chunk is read at most twice, and the batches are the JSONL export's."""
    items = noise_rows(64, size=256)
    p = str(tmp_path / "snappy.parquet")
    pq.write_table(
        arrow_table(items),
        p,
        row_group_size=16,
        compression="snappy",
        use_dictionary=False,
        write_batch_size=4,
    )
    md = pq.read_metadata(p)
    cols = [
        md.row_group(g).column(j)
        for g in range(md.num_row_groups)
        for j in range(md.num_columns)
        if not md.row_group(g).column(j).path_in_schema.startswith("extra")
    ]
    stored = sum(c.total_compressed_size for c in cols)
    decoded = sum(c.total_uncompressed_size for c in cols)
    args = dict(tokenizer=TINY, micro_batch_size=4, num_threads=2, shuffle=False)
    args.update(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
    want = epoch(write_jsonl(str(tmp_path), items), **args)
    with mmloader.Loader(p, **args) as L:
        got = [as_np(b) for b in L]
        q = L.stats()["parquet"]
    same(want, got)
    assert q["row_groups_decoded"] == 4 and stored <= q["bytes_read"] <= 2 * stored, q
    assert decoded <= q["cache_bytes"] <= decoded * 1.1 + (1 << 20), (q, decoded)


def test_columns_map_a_datasets_own_names_per_source(ref, tmp_path):
    """`columns` (one option-table row, also per source): a dataset's own column names
    read as the record keys they stand for; a column named like a mapped key is then not
    read; bad mappings fail at construction naming what is wrong."""
    items, want, tmp = ref
    t = arrow_table(items)
    own = pa.table(
        {
            "dialog": t.column("messages"),
            "pics": t.column("images"),
            # what a record would misread without the mapping: never read with it
            "images": pa.array([["nowhere.jpg"]] * len(items), pa.list_(pa.string())),
        }
    )
    p = str(tmp_path / "own.parquet")
    pq.write_table(own, p, row_group_size=4)
    cols = {"dialog": "messages", "pics": "images"}
    same(want, epoch(p, columns=cols))
    same(want, epoch(p, columns="dialog=messages,pics=images"))  # the command line's form
    jsonl = os.path.join(tmp, "ref.jsonl")

    def mix(first, **kw):
        return [
            mmloader.Source(first, weight=2.0, name="x", **kw),
            mmloader.Source(jsonl, weight=1.0, name="y", image_root=tmp),
        ]

    same(
        epoch(mix(jsonl, image_root=tmp), seed=1, shuffle=True),
        epoch(mix(p, columns=cols), seed=1, shuffle=True),
    )
    # the dataset index is built and used under the same mapping (its settings key)
    from mmloader import dsindex

    vision = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
    s = dsindex.build(p, tokenizer=TINY, threads=2, columns=cols, **vision)
    assert s["samples"] == N and s["images"] == sum(len(i) for _, i in items), s
    with mmloader.Loader(p, tokenizer=TINY, micro_batch_size=3, columns=cols, **vision) as L:
        assert L.index_shards == 1
    kw = dict(tokenizer=TINY, micro_batch_size=1)
    bad = {
        "the file lacks it": ({"dialogue": "messages"}, '"dialogue"', "dialog, pics, images"),
        "not a record key": ({"dialog": "chat"}, '"chat"', "not a key"),
        "a key twice": ({"dialog": "messages", "pics": "messages"}, "twice", "columns="),
    }
    for what, (m, a, b) in bad.items():
        with pytest.raises(mmloader.ConfigError) as e:
            mmloader.Loader(p, columns=m, **kw)
        assert a in str(e.value) and b in str(e.value), (what, str(e.value))
    with pytest.raises(mmloader.ConfigError) as e:  # a JSONL shard has no columns
        mmloader.Loader(jsonl, columns=cols, image_root=tmp, **kw)
    assert "ref.jsonl is not a Parquet file" in str(e.value), str(e.value)
    with pytest.raises(mmloader.ConfigError) as e:  # per source: named
        mmloader.Loader(mix(p, columns={"dialog": "chat"}), **kw)
    assert "source 'x'" in str(e.value) or "source x" in str(e.value), str(e.value)
    # the mapping enters the resume fingerprint: a state under another mapping is refused
    with mmloader.Loader(p, columns=cols, **kw) as L:
        next(iter(L))
        state = L.state_dict()
    with mmloader.Loader(p, columns=dict(cols, pics="image"), **kw) as R:
        with pytest.raises(mmloader.Error):
            R.load_state_dict(state)


def test_videos_in_structs_match_video_files(tmp_path, photos):
    """`datasets`' Video feature is a {bytes, path} struct too: videos embedded in a row
    (h264 mp4, vp9 webm; one beside an image) give the batches of the same rows exported
    as JSONL + video files; a struct holding only a path resolves it as a record's."""
    pytest.importorskip("av")
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_video import make_video

    a = make_video(tmp_path / "a.mp4", "libx264", n=24, w=64, h=48, fps=12)
    b = make_video(tmp_path / "b.webm", "libvpx-vp9", n=20, w=65, h=48, fps=10)
    vids = {"a.mp4": open(a, "rb").read(), "b.webm": open(b, "rb").read()}
    img_ext, img = photos[0]
    (tmp_path / f"p.{img_ext}").write_bytes(img)
    rows = []  # (prompt, [video names], [image names], embed the videos?)
    for i in range(8):
        v = ["a.mp4", "b.webm"][i % 2]
        rows.append((f"<video>Row {i}: what happens?", [v], [], i % 3 != 2))
    rows.append(("<image><video>Both?", ["b.webm"], [f"p.{img_ext}"], True))
    ref, conv, vcol, icol = [], [], [], []
    for i, (q, vs, ims, embed) in enumerate(rows):
        msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": f"A {i}."}]
        ref.append(json.dumps({"messages": msgs, "images": ims, "videos": vs}) + "\n")
        conv.append(msgs)
        vcol.append(
            [{"bytes": vids[v], "path": None} if embed else {"bytes": None, "path": v} for v in vs]
        )
        icol.append([{"bytes": img, "path": None} for _ in ims])
    (tmp_path / "ref.jsonl").write_text("".join(ref))
    st = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    msg_t = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    table = pa.table(
        {
            "messages": pa.array(conv, msg_t),
            "images": pa.array(icol, pa.list_(st)),
            "videos": pa.array(vcol, pa.list_(st)),
        }
    )
    pq.write_table(table, str(tmp_path / "v.parquet"), row_group_size=3)
    kw = dict(micro_batch_size=2, max_pixels=28 * 28 * 64)
    want = epoch(str(tmp_path / "ref.jsonl"), **kw)
    assert any("pixel_values_videos" in b for b in want)
    args = dict(tokenizer=TINY, num_threads=2, shuffle=False, min_pixels=28 * 28 * 4, **kw)
    with mmloader.Loader(str(tmp_path / "v.parquet"), **args) as L:
        got = [as_np(b) for b in L]
        q = L.stats()["parquet"]
    same(want, got)
    assert q["row_groups_decoded"] == 3, q  # each row group once, its videos read from it


def test_elastic_resume_matches_the_jsonl_export(tmp_path, photos):
    """The global plan over Parquet shards: 2 ranks take 2 steps, their (global) state
    resumes on 3 ranks with another token budget; every rank's batches before and after
    are bitwise the JSONL export's under the same steps, and no sample is repeated."""
    items = rows(photos, 42)
    jsonl = write_jsonl(str(tmp_path), items)
    pq.write_table(arrow_table(items[:20]), str(tmp_path / "a.parquet"), row_group_size=5)
    pq.write_table(arrow_table(items[20:]), str(tmp_path / "b.parquet"), row_group_size=4)
    shards = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    base = dict(
        tokenizer=TINY,
        micro_batch_size=None,
        num_threads=2,
        shuffle=True,
        seed=11,
        min_pixels=28 * 28 * 4,
        max_pixels=28 * 28 * 16,
    )

    def run(data):
        first, states = [], []
        for r in range(2):
            with mmloader.Loader(data, dp_rank=r, dp_size=2, max_tokens_per_batch=400, **base) as L:
                first.append(take(L, 2))
                states.append(L.state_dict())
        assert states[0]["plan_pos"] == states[1]["plan_pos"] > 0
        rest = []
        for r in range(3):
            kw = dict(dp_rank=r, dp_size=3, max_tokens_per_batch=600, balance="tokens")
            with mmloader.Loader(data, **kw, **base) as L:
                L.load_state_dict(states[0])
                rest.append([as_np(b) for b in L])
        return first, rest

    want, got = run(jsonl), run(shards)
    for a, b in zip(want[0] + want[1], got[0] + got[1]):
        same(a, b)
    ids = [bytes(b["input_ids"].tobytes()) for g in got[0] + got[1] for b in g]
    assert len(ids) == 2 * 2 + sum(len(g) for g in got[1]) and len(set(ids)) == len(ids)


MEMORY = r"""
import json, resource, sys, time
import mmloader

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS"))

path, tok, cap = sys.argv[1], sys.argv[2], int(sys.argv[3])
kw = dict(tokenizer=tok, micro_batch_size=4, num_threads=2, prefetch=2, shuffle=False,
          min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
kw.update(json.loads(sys.argv[4]) if len(sys.argv) > 4 else {})
pause = kw.pop("pause_s", 0)  # a slow consumer: the prefetch fills what the cap allows
if cap:
    kw["max_memory"] = cap
before, peak = rss(), 0
with mmloader.Loader(path, **kw) as L:
    n = 0
    for b in L:
        n += 1
        peak = max(peak, rss())
        time.sleep(pause)
    s = L.stats()
print(json.dumps({"batches": n, "rss_growth": peak - before, "pool_peak": s["pool_peak_bytes"],
                  "parquet": s["parquet"]}))
"""


def test_max_memory_bounds_the_row_group_cache(tmp_path):
    """Under max_memory the decoded row groups stay within their room (a quarter of the
    cap) plus the groups the workers are copying from (loader_parquet.c P2), the pool
    within the rest of the cap, and the process's RSS grows by less than the cap; without a cap the
    same epoch keeps every row group (what the cap evicts)."""
    import subprocess
    import sys

    p = str(tmp_path / "big.parquet")
    pq.write_table(arrow_table(noise_rows(128, size=256)), p, row_group_size=16, compression="none")
    env = child_env()

    def child(cap, kw=None):
        out = subprocess.run(
            [sys.executable, "-c", MEMORY, p, TINY, str(cap), json.dumps(kw or {})],
            cwd="/tmp",
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    free = child(0)
    group = free["parquet"]["cache_peak_bytes"] // 8  # one decoded row group, about
    assert free["batches"] == 32 and free["parquet"]["cache_bytes"] > 7 * group, free
    cap = 96 << 20  # its room (24 MiB) holds fewer groups than the file's 8 (~33 MB)
    got = child(cap)
    q = got["parquet"]
    assert got["batches"] == 32 and q["cache_room"] == cap // 4, got
    assert q["cache_peak_bytes"] <= q["cache_room"] + 2 * group, (got, group)
    assert q["cache_bytes"] <= q["cache_room"] < free["parquet"]["cache_bytes"], got
    if not os.environ.get("MML_ASAN_BUILD"):  # ASan's shadow and quarantine are not ours
        assert got["rss_growth"] < cap, got
    # A slow consumer and a deep prefetch: batches fill what the cap leaves, and the
    # cache's room is set aside out of the cap (P2), so the pool, the 2 workers' scratch
    # reserve and the cache's room fit it together (before: the pool took the whole cap
    # beside the scratch, 40 + 32 + 22 MiB of an 88 MiB cap).
    cap = 88 << 20
    got = child(cap, dict(prefetch=32, micro_batch_size=8, max_pixels=256 * 256, pause_s=0.3))
    q = got["parquet"]
    assert got["batches"] == 16 and q["cache_room"] == cap // 4, got
    assert got["pool_peak"] + 2 * (16 << 20) + q["cache_room"] <= cap, got


def test_a_malformed_row_group_fails_its_rows_only(ref, tmp_path):
    """Pages are decoded in the workers now: a row group whose page header is garbage
    (its footer metadata fine) fails each of its rows, named with the column, while the
    other row groups' rows are delivered; construction still succeeds (the footer is)."""
    items, want, _ = ref
    p = tmp_path / "d.parquet"
    pq.write_table(arrow_table(items), str(p), row_group_size=5, compression="none")
    md = pq.read_metadata(str(p))
    col = md.row_group(1).column(0)  # messages' first leaf
    data = bytearray(p.read_bytes())
    off = col.dictionary_page_offset or col.data_page_offset
    data[off : off + 12] = b"\xff" * 12
    p.write_bytes(bytes(data))
    with pytest.raises(mmloader.SampleError) as e:
        epoch(str(p), micro_batch_size=1, on_error="raise")
    m = str(e.value)
    assert "d.parquet[row group 1, row 5]" in m and "row group 1, column messages" in m, m
    kw = dict(tokenizer=TINY, micro_batch_size=1, shuffle=False, max_error_rate=1.0)
    with pytest.warns(UserWarning, match="row group 1"):
        with mmloader.Loader(str(p), **kw) as L:
            got = [as_np(b) for b in L]
            st = L.stats()
    assert len(got) == N and st["skipped"] == 5, st  # (the epoch keeps its batches)
    assert st["parquet"]["row_groups_decoded"] == 3, st["parquet"]  # the bad one once
