"""Data file formats: JSON lines, JSON arrays, gzip / zstd compressed, local, HTTP and S3.

The reference is the same records as plain JSONL: every other file format must give the
bitwise-identical batches (the JSONL path is itself checked against the reference
processor and chat template elsewhere).  Errors must name the file and the byte offset.
"""

import gzip
import json
import os

import pytest

import mmloader
from mmloader.datagen import make_dataset
from conftest import as_np, same

zstandard = pytest.importorskip("zstandard")

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
SMALL = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("files"))
    d = make_dataset(root, n_samples=24, seed=5, n_shards=1, n_images=8, min_size=32, max_size=120)
    with open(d["shards"][0], encoding="utf-8") as f:
        d["records"] = [json.loads(line) for line in f]
    return d


def make(data, **kw):
    args = dict(
        tokenizer=TINY,
        micro_batch_size=4,
        num_threads=2,
        prefetch=2,
        shuffle=False,
        image_root=kw.pop("image_root", None),
        **SMALL,
    )
    args.update(kw)
    return mmloader.Loader(data, **args)


def epoch(data, **kw):
    with make(data, **kw) as L:
        return [as_np(b) for b in L]


def write(path, data: bytes):
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def json_array(records, indent):
    return json.dumps(records, ensure_ascii=False, indent=indent).encode()


def zst(data: bytes, frames=1) -> bytes:
    c = zstandard.ZstdCompressor(level=3)
    step = max(1, len(data) // frames)
    return b"".join(c.compress(data[i : i + step]) for i in range(0, len(data), step))


def variants(records):
    """File name -> bytes: the same records in every supported file format."""
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
    crlf = lines.replace(b"\n", b"\r\n")
    return {
        "pretty.json": json_array(records, 2),
        "compact.json": json_array(records, None),
        "bom.json": b"\xef\xbb\xbf" + json_array(records, 1),
        "lines-named.json": lines,  # JSON lines behind a .json name: told by content
        "crlf.jsonl": crlf,
        "data.jsonl.gz": gzip.compress(lines),
        "members.jsonl.gz": gzip.compress(lines[:1000]) + gzip.compress(lines[1000:]),
        "data.jsonl.zst": zst(lines),
        "frames.jsonl.zst": zst(lines, frames=3),
        "array.json.gz": gzip.compress(json_array(records, 2)),
        "array.json.zst": zst(json_array(records, 4)),
        "gzip-named.jsonl": gzip.compress(lines),  # compression by magic bytes, not name
    }


def test_every_local_format_gives_the_jsonl_batches(ds, tmp_path):
    ref = epoch(ds["shards"], image_root=ds["root"])
    for name, data in variants(ds["records"]).items():
        p = write(tmp_path / name, data)
        with make(p, image_root=ds["root"]) as L:
            assert L.num_samples == len(ds["records"]), name
        same(ref, epoch(p, image_root=ds["root"]))


def test_shuffled_and_sharded_json_array_matches_jsonl(ds, tmp_path):
    p = write(tmp_path / "a.json", json_array(ds["records"], 2))
    for rank in range(2):
        kw = dict(image_root=ds["root"], shuffle=True, seed=3, dp_rank=rank, dp_size=2)
        same(epoch(ds["shards"], **kw), epoch(p, **kw))


def test_folder_takes_every_data_file(ds, tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    recs = ds["records"]
    write(folder / "a.json", json_array(recs[:8], 2))
    write(
        folder / "b.jsonl.gz",
        gzip.compress("".join(json.dumps(r) + "\n" for r in recs[8:16]).encode()),
    )
    write(folder / "c.jsonl.zst", zst("".join(json.dumps(r) + "\n" for r in recs[16:]).encode()))
    write(folder / "notes.txt", b"not data")
    ref = epoch(ds["shards"], image_root=ds["root"])
    same(ref, epoch(str(folder), image_root=ds["root"]))


def test_data_format_override(ds, tmp_path):
    # a JSON array forced to be read as lines: each line is then a bad record
    p = write(tmp_path / "a.json", json_array(ds["records"][:4], 2))
    with pytest.raises(mmloader.Error, match=r"a\.json:1: bad record"):
        with make(p, data_format="jsonl", on_error="raise", image_root=ds["root"]) as L:
            next(iter(L))
    # JSON lines forced to be an array: refused at construction with the byte offset
    q = write(tmp_path / "l.jsonl", b'{"a": 1}\n{"b": 2}\n')
    with pytest.raises(
        mmloader.Error,
        match=r"l\.jsonl: malformed JSON array: expected '\[' "
        r"at byte 0, found '\{'",
    ):
        make(q, data_format="json")
    with pytest.raises(mmloader.ConfigError, match="data_format must be one of"):
        make(q, data_format="parquet")


@pytest.mark.parametrize(
    "text, needle",
    [
        (
            b'[{"a": 1} {"b": 2}]',
            r"expected ',' or '\]' at byte 10 after element 0 \(which starts "
            r"at byte 1\), found '\{'",
        ),
        (b'[{"a": 1},]', r"expected element 1 at byte 10, found '\]'"),
        (b'[{"a": [1}]', r"'\}' at byte 9 closes a '\[' in element 0 \(which starts at byte 1\)"),
        (b'[{"a": 1}] x', r"data after the closing '\]' at byte 11"),
        (
            b'[{"a": 1}, {"b": "unterminated}]',
            r"element 1 \(at byte 11\) is not closed at the end "
            r"of the data \(byte 32\)",
        ),
        (b'[{"a": 1}', r"no closing '\]' \(the data ends at byte 9 after 1 elements\)"),
        (
            b'[' + b'[' * 1100 + b']' * 1100 + b']',
            r"element 0 \(at byte 1\) nests deeper than 1024",
        ),
    ],
    ids=[
        "missing-comma",
        "trailing-comma",
        "mismatched",
        "after-end",
        "unterminated",
        "no-close",
        "too-deep",
    ],
)
def test_malformed_array_names_the_byte(tmp_path, text, needle):
    p = write(tmp_path / "bad.json", text)
    with pytest.raises(mmloader.Error, match="bad.json: malformed JSON array: " + needle):
        make(p)


def test_bad_element_is_a_bad_record_naming_element_and_byte(ds, tmp_path):
    recs = ds["records"][:8]
    text = json_array(recs, None)
    good = json.dumps(recs[3])
    bad = good.replace('"', "'", 2)  # not JSON, but structurally an element
    text = text.replace(good.encode(), bad.encode(), 1)
    at = text.index(bad.encode())
    p = write(tmp_path / "one-bad.json", text)
    with make(p, image_root=ds["root"]) as L, pytest.warns(UserWarning, match="bad_record"):
        n = sum(b["input_ids"].shape[0] for b in L)
        st = L.stats()
    assert n == 8  # 2 batches: the short epoch is filled from its start
    assert st["skipped_by_reason"] == {"bad_record": 1}  # not counted again while filling
    with pytest.raises(
        mmloader.Error, match=rf"one-bad\.json\[3\] \(byte {at}\): bad record: invalid JSON"
    ):
        with make(p, image_root=ds["root"], on_error="raise") as L:
            for _ in L:
                pass


def test_jsonl_line_numbers_inside_compressed_files(ds, tmp_path):
    lines = [json.dumps(r) for r in ds["records"][:6]]
    lines[4] = "{not json"
    text = ("\n".join(lines[:2]) + "\n\n" + "\n".join(lines[2:]) + "\n").encode()
    for name, data in (("x.jsonl.gz", gzip.compress(text)), ("x.jsonl.zst", zst(text))):
        p = write(tmp_path / name, data)
        with pytest.raises(mmloader.Error, match=rf"{name}:6: bad record: invalid JSON"):
            with make(p, image_root=ds["root"], on_error="raise", micro_batch_size=1) as L:
                for _ in L:
                    pass


@pytest.mark.parametrize(
    "name, data, needle",
    [
        ("cut.jsonl.gz", gzip.compress(b'{"a": 1}\n' * 1000)[:-9], "truncated gzip data"),
        ("cut.jsonl.zst", zst(b'{"a": 1}\n' * 1000)[:-5], "truncated zstd data"),
        ("junk.jsonl.gz", b"\x1f\x8b" + b"\x00" * 40, "gzip data error near compressed byte"),
        (
            "junk.jsonl.zst",
            b"\x28\xb5\x2f\xfd" + b"\xff" * 40,
            "zstd data error near compressed byte",
        ),
    ],
)
def test_corrupt_compressed_files_are_refused(tmp_path, name, data, needle):
    p = write(tmp_path / name, data)
    with pytest.raises(mmloader.Error, match=rf"{name}: {needle}"):
        make(p)


def test_spill_folder_follows_tmpdir(ds, tmp_path, monkeypatch):
    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setenv("TMPDIR", str(spill))
    p = write(
        tmp_path / "d.jsonl.gz",
        gzip.compress("".join(json.dumps(r) + "\n" for r in ds["records"]).encode()),
    )
    with make(p, image_root=ds["root"]) as L:
        assert sum(1 for _ in L) == 6
    assert os.listdir(spill) == []  # the decompressed copy is never visible as a file
    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))
    with pytest.raises(mmloader.Error, match="cannot create a file for its decompressed copy"):
        make(p)


def test_large_array_streams_across_chunks(tmp_path):
    # elements that straddle the 1 MiB read chunks, strings with escaped quotes and
    # brackets, and nested lists
    recs = []
    for i in range(300):
        text = ("x" * (i * 9973 % 18000)) + ' \\"[{ }]\\" ' + "é" * (i % 7)
        recs.append(
            {
                "conversations": [
                    {"from": "human", "value": text},
                    {"from": "gpt", "value": str(i)},
                ],
                "meta": [[i, {"k": [1, 2, {"z": None}]}]],
            }
        )
    p = write(tmp_path / "big.json", json_array(recs, 1))
    q = write(
        tmp_path / "big.jsonl",
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs).encode(),
    )
    assert os.path.getsize(p) > 2 << 20
    same(epoch(q, micro_batch_size=5), epoch(p, micro_batch_size=5))


def test_remote_formats(ds, tmp_path, fault_server, moto_s3):
    ref = epoch(ds["shards"], image_root=ds["root"])
    files = variants(ds["records"])
    names = ["pretty.json", "data.jsonl.gz", "frames.jsonl.zst", "array.json.zst"]
    srv = fault_server(objects={"/" + n: files[n] for n in names})
    for n in names:
        same(ref, epoch(srv.url(n), image_root=ds["root"]))
    s3 = dict(
        s3_endpoint=moto_s3.endpoint,
        s3_region=moto_s3.region,
        aws_access_key_id=moto_s3.access_key,
        aws_secret_access_key=moto_s3.secret_key,
    )
    for n in names:
        url = moto_s3.put(f"files/{n}", files[n])
        same(ref, epoch(url, image_root=ds["root"], **s3))
