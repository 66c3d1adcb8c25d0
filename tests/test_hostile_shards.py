"""Hostile shards (issue 29, part A): compression and blank-line bombs bounded by
max_shard_bytes / max_shard_records, one endless compressed line by max_record_bytes,
blank lines that cost neither memory nor read time, WebDataset member sizes checked from
the tar header, valid gzip/zstd variants accepted, and non-regular data files refused by
what they are.  Each test failed before its fix."""

import gzip
import json
import os
import struct
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
from child import child_env
from tar_bytes import tar_header, tar_member

import mmloader

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
REC = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}
LINE = json.dumps(REC) + "\n"


def make(data, **kw):
    args = dict(
        tokenizer=TINY, micro_batch_size=1, num_threads=2, prefetch=2, shuffle=False, index=""
    )
    args.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mmloader.Loader(data, **args)


def zstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=3).compress(data)


# ---- compression and blank-line bombs ------------------------------------------------


def test_blank_line_bomb_is_refused_at_the_default_limit(tmp_path):
    # 17 M blank lines (a 1.4 KB .zst): before, each cost 8 bytes of index memory, and a
    # 3 GB one took the node; now the line count stops it early, naming the limit
    p = tmp_path / "blank.jsonl.zst"
    p.write_bytes(zstd(b"\n" * (17 << 20) + LINE.encode()))
    with pytest.raises(
        mmloader.SampleError, match=r"blank\.jsonl\.zst.*max_shard_records=16777216"
    ):
        make(str(p))


def test_record_and_byte_limits_are_options(tmp_path):
    p = tmp_path / "r.jsonl.gz"
    p.write_bytes(gzip.compress(LINE.encode() * 100))
    assert len(make(str(p), max_shard_records=100)) == 100
    with pytest.raises(mmloader.SampleError, match="max_shard_records=99"):
        make(str(p), max_shard_records=99)
    size = len(LINE) * 100
    assert len(make(str(p), max_shard_bytes=size)) == 100
    with pytest.raises(mmloader.SampleError, match=f"r.jsonl.gz.*max_shard_bytes={size - 1}"):
        make(str(p), max_shard_bytes=size - 1)
    # a local plain file is not a bomb: its size is what it is
    q = tmp_path / "plain.jsonl"
    q.write_text(LINE * 100)
    assert len(make(str(q), max_shard_bytes=10)) == 100


def test_blank_lines_do_not_slow_reads(tmp_path):
    # 2 M blank lines before 2048 records: each read walked the blank-line list from its
    # start (about 80x slower than without them); now a binary search over runs
    n = 2048
    plain = tmp_path / "plain.jsonl"
    plain.write_text(LINE * n)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n" * (2 << 20) + LINE * n)

    def epoch_s(path):
        loader = make(str(path), micro_batch_size=64)
        t0 = time.perf_counter()
        rows = sum(len(b["input_ids"]) for b in loader)
        assert rows == n
        return time.perf_counter() - t0

    epoch_s(plain)  # warm
    ratio = min(epoch_s(blank) for _ in range(2)) / min(epoch_s(plain) for _ in range(2))
    assert ratio < 4, ratio


def test_line_numbers_count_blank_runs(tmp_path):
    # messages still name the exact line after runs of blank lines
    p = tmp_path / "d.jsonl"
    p.write_text("\n" * 1000 + LINE + "\n\n" + LINE + "{not json\n" + "\n" + LINE)
    loader = make(str(p), max_error_rate=1.0, on_error="raise")
    with pytest.raises(mmloader.SampleError, match=r"d\.jsonl:1005\b"):
        list(loader)


# ---- WebDataset member sizes -----------------------------------------------------------


def test_member_over_max_object_bytes_is_refused_before_reading(tmp_path):
    rec = {
        "messages": [
            {"role": "user", "content": "<image>hi"},
            {"role": "assistant", "content": "ok"},
        ]
    }
    p = tmp_path / "s.tar"
    with open(p, "wb") as f:
        f.write(tar_member("a.json", json.dumps(rec).encode()))
        f.write(tar_member("a.jpg", b"\0" * (3 << 20)))
        f.write(tar_member("b.json", json.dumps(REC).encode()))
        f.write(b"\0" * 1024)
    loader = make(str(p), max_object_bytes=1 << 20, max_error_rate=1.0)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        list(loader)
    assert loader.stats()["skipped_by_reason"] == {"object_too_large": 1}
    assert any(
        "member a.jpg is 3145728 bytes, above max_object_bytes=1048576" in str(x.message) for x in w
    )


def test_impossible_pax_size_is_refused(tmp_path):
    def pax(k, v):
        body = f" {k}={v}\n"
        n = len(body) + 2
        while len(str(n)) + len(body) != n:
            n += 1
        return (str(n) + body).encode()

    rec = pax("size", str(2**63 - 100))
    p = tmp_path / "p.tar"
    p.write_bytes(
        tar_member("a.json", json.dumps(REC).encode())
        + tar_header("pax", len(rec), b"x")
        + rec
        + b"\0" * (-len(rec) % 512)
        + tar_header("b.json", 0)
        + tar_member("c.json", json.dumps(REC).encode())
        + b"\0" * 1024
    )
    with pytest.raises(mmloader.SampleError, match=r"p\.tar: bad or impossible member size"):
        make(str(p))


# ---- valid files that were refused -----------------------------------------------------


def test_gzip_with_zero_padding_and_zstd_with_skippable_frame(tmp_path):
    g = tmp_path / "g.jsonl.gz"
    g.write_bytes(gzip.compress(LINE.encode() * 8) + b"\0" * 1000)
    assert gzip.decompress(g.read_bytes()) == LINE.encode() * 8  # Python accepts it
    assert len(make(str(g))) == 8
    z = tmp_path / "z.jsonl.zst"
    z.write_bytes(struct.pack("<II", 0x184D2A50, 8) + b"metadata" + zstd(LINE.encode() * 8))
    assert len(make(str(z))) == 8  # was read as plain text: 2 garbage "records"


# ---- non-regular files -----------------------------------------------------------------


def test_fifo_and_device_shards_are_named_for_what_they_are(tmp_path):
    fifo = tmp_path / "f.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(mmloader.ConfigError, match=r"is a FIFO \(named pipe\), not a regular file"):
        make(str(fifo))
    with pytest.raises(mmloader.ConfigError, match="is a character device, not a regular file"):
        make("/dev/zero")


# ---- the bombs of the issue, in a child capped at 6 GB ---------------------------------

BOMB = textwrap.dedent("""
    import resource, sys, warnings
    def peak_kib():  # this process's peak RSS: VmHWM, not ru_maxrss, which keeps the
        # high-water mark of the memory before execve (pytest's own, through vfork)
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
    warnings.simplefilter("ignore")
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    import mmloader
    try:
        mmloader.Loader(sys.argv[1], tokenizer=sys.argv[2], index="")
        print("built")
    except mmloader.Error as e:
        print(type(e).__name__, e)
    print(peak_kib())
""")


@pytest.mark.slow
def test_zstd_brace_bomb_in_a_capped_child(tmp_path):
    # 3 GB of "{}" lines in a 290 KB .zst: before, 4.2 GB RSS and OutOfMemoryError after
    # 72 s; now refused at max_shard_records with the index at 128 MiB
    import zstandard

    p = tmp_path / "braces.jsonl.zst"
    c = zstandard.ZstdCompressor(level=3).compressobj()
    with open(p, "wb") as f:
        for _ in range(1000):
            f.write(c.compress(b"{}\n" * (1 << 20)))
        f.write(c.flush())
    assert os.path.getsize(p) < 400_000
    r = subprocess.run(
        [sys.executable, "-c", BOMB, str(p), TINY],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(TMPDIR=str(tmp_path)),
    )
    out = r.stdout.splitlines()
    assert out[0].startswith("SampleError") and "max_shard_records" in out[0], r.stdout + r.stderr
    assert int(out[1]) < 600_000, out  # KiB: the index's 128 MiB and the interpreter


# ---- a damaged partial dataset index -----------------------------------------------------


class Stop(Exception):
    pass


def test_damaged_partial_index_is_resumed_only_before_the_damage(tmp_path):
    # a byte changed in the middle of an interrupted build's .partial file (not a torn
    # tail) was resumed and shipped under a valid checksum (a sample's text tokens 100 ->
    # 1,048,676); now each entry carries a checksum and resuming stops at the damage
    from mmloader import dsindex
    from mmloader.datagen import make_dataset

    d = make_dataset(
        str(tmp_path / "d"),
        n_samples=300,
        seed=1,
        n_shards=1,
        n_images=4,
        min_size=24,
        max_size=48,
        text_only_fraction=0.9,
    )
    shard = d["shards"][0]

    def stop(shard_no, shards, done, total):
        if done > 0:
            raise Stop

    kw = dict(tokenizer=TINY)
    with pytest.raises(Stop):
        dsindex.build(shard, out=str(tmp_path / "a"), progress=stop, **kw)
    done_a = dsindex.sidecar_path(shard, str(tmp_path / "a"))
    partial = tmp_path / "a" / (os.path.basename(done_a) + ".partial")
    data = bytearray(partial.read_bytes())
    data[len(data) // 2] ^= 0x10  # one bit, mid-file: a number in some entry
    partial.write_bytes(bytes(data))
    s = dsindex.build(shard, out=str(tmp_path / "a"), **kw)
    assert 0 < s["resumed"] < 256 and s["samples"] == 300, s["resumed"]
    dsindex.build(shard, out=str(tmp_path / "b"), **kw)
    with open(done_a, "rb") as a, open(dsindex.sidecar_path(shard, str(tmp_path / "b")), "rb") as b:
        assert a.read() == b.read()


# ---- prefetch at its maximum -----------------------------------------------------------

PREFETCH = textwrap.dedent("""
    import sys, warnings
    def peak_kib():  # this process's peak RSS: VmHWM, not ru_maxrss, which keeps the
        # high-water mark of the memory before execve (pytest's own, through vfork)
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
    warnings.simplefilter("ignore")
    import mmloader
    loader = mmloader.Loader(sys.argv[1], tokenizer=sys.argv[2], micro_batch_size=1,
                             prefetch=1 << 20, shuffle=False, index="")
    n = sum(1 for _ in loader)
    loader.close()
    print(n, peak_kib())
""")


def test_maximum_prefetch_costs_what_is_queued(tmp_path):
    # prefetch=1048576 on 16 samples allocated (and at close touched) 1 M output slots of
    # ~2.3 KB: 2.3 GB RSS; the queue now grows with what is queued, up to a byte budget
    p = tmp_path / "s.jsonl"
    p.write_text(LINE * 16)
    r = subprocess.run(
        [sys.executable, "-c", PREFETCH, str(p), TINY],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(),
    )
    n, rss_kib = map(int, r.stdout.split())
    assert n == 16
    assert rss_kib < 500_000, rss_kib


# ---- one endless line ------------------------------------------------------------------------


def long_line_zst(path, mib: int) -> None:
    """A .jsonl.zst whose one record is a `mib` MiB line (a few KB compressed)."""
    import zstandard

    c = zstandard.ZstdCompressor(level=3).compressobj()
    head = b'{"messages": [{"role": "assistant", "content": "'
    with open(path, "wb") as f:
        f.write(c.compress(LINE.encode() + head))
        for _ in range(mib):
            f.write(c.compress(b"x" * (1 << 20)))
        f.write(c.compress(b'"}]}\n' + LINE.encode()))
        f.write(c.flush())


def test_one_endless_line_stops_at_max_record_bytes(tmp_path):
    # before: a compressed shard's line was inflated into $TMPDIR to any length (up to
    # max_shard_bytes, 8 GiB): the record was then skipped unread as record_too_large;
    # now the build stops once the line passes max_record_bytes, naming line and limit
    p = tmp_path / "long.jsonl.zst"
    long_line_zst(p, 96)
    assert os.path.getsize(p) < 100_000
    with pytest.raises(
        mmloader.SampleError, match=r"long\.jsonl\.zst.*line 2.*max_record_bytes=67108864"
    ):
        make(str(p))
    assert len(make(str(p), max_record_bytes=128 << 20)) == 3  # within the limit: kept
    # a local plain file is read where it lies: its long line is skipped when read
    q = tmp_path / "plain.jsonl"
    q.write_text(LINE + '{"x": "' + "x" * (1 << 20) + '"}\n' + LINE)
    assert len(make(str(q), max_record_bytes=1 << 19)) == 3
