"""WebDataset tar shards (local, HTTP, S3; plain and compressed).

The reference is the same samples as JSONL with the images as files: every WebDataset
layout must give bitwise-identical batches.  Images are real photos (matplotlib's
sample_data: grace_hopper.jpg, logo2.png, Minduka_Present_Blue_Pack.png) re-encoded at
test time; shards are written with Python's tarfile (GNU and pax formats, long names).
"""

import gzip
import io
import json
import os
import tarfile

import pytest

import mmloader
from conftest import as_np, same

PIL = pytest.importorskip("PIL.Image")
matplotlib = pytest.importorskip("matplotlib")

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
SAMPLE_DATA = os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "sample_data")
PHOTOS = ["grace_hopper.jpg", "logo2.png", "Minduka_Present_Blue_Pack.png"]


@pytest.fixture(scope="module")
def photos():
    """Real photos re-encoded: small JPEGs, PNGs and WebPs of different sizes."""
    out = []
    for i, name in enumerate(PHOTOS * 2):
        im = PIL.open(os.path.join(SAMPLE_DATA, name)).convert("RGB")
        im = im.resize((64 + 24 * i, 48 + 16 * (i % 3)))
        buf = io.BytesIO()
        fmt, ext = [("JPEG", "jpg"), ("PNG", "png"), ("WEBP", "webp")][i % 3]
        im.save(buf, fmt, quality=90) if fmt != "PNG" else im.save(buf, fmt)
        out.append((ext, buf.getvalue()))
    return out


def samples(photos, n=12):
    """(key, record, [(ext, bytes), ...]) with 0, 1 or 2 images."""
    out = []
    for i in range(n):
        k = i % 3
        imgs = [photos[(i + j) % len(photos)] for j in range(k)]
        tags = "<image>" * k
        rec = {
            "conversations": [
                {"from": "human", "value": f"{tags}Sample {i}: what is shown?"},
                {"from": "gpt", "value": f"Answer {i}."},
            ]
        }
        out.append((f"{i:06d}", rec, imgs))
    return out


def write_reference(tmp, items):
    """The same samples as JSONL + image files."""
    lines = []
    for key, rec, imgs in items:
        names = []
        for j, (ext, data) in enumerate(imgs):
            name = f"img/{key}.{j}.{ext}"
            os.makedirs(os.path.join(tmp, "img"), exist_ok=True)
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)
            names.append(name)
        lines.append(json.dumps(dict(rec, images=names)) + "\n")
    p = os.path.join(tmp, "ref.jsonl")
    with open(p, "w") as f:
        f.writelines(lines)
    return p


def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def tar_bytes(items, style="indexed", fmt=tarfile.GNU_FORMAT, prefix=""):
    """A WebDataset shard.  style: how images are named and referenced:
    indexed   000001.json + 000001.0.jpg, 000001.1.png; the record lists no images
    single    one image per sample as 000001.jpg (samples with 2 images use .0/.1)
    listed    the record lists its members ("0.jpg") in reverse tar order
    """
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for key, rec, imgs in items:
            key = prefix + key
            names = [
                f"{j}.{ext}" if not (style == "single" and len(imgs) == 1) else ext
                for j, (ext, _) in enumerate(imgs)
            ]
            r = dict(rec)
            order = list(range(len(imgs)))
            if style == "listed":
                r["images"] = names
                order = order[::-1]
            add(tar, f"{key}.json", json.dumps(r).encode())
            for j in order:
                add(tar, f"{key}.{names[j]}", imgs[j][1])
            add(tar, f"{key}.txt", b"ignored member")
        add(tar, "README", b"no key: not part of a sample")
        add(tar, "extra.cls", b"a group without json: not a sample")
    return buf.getvalue()


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
    tmp = str(tmp_path_factory.mktemp("wds"))
    items = samples(photos)
    return items, epoch(write_reference(tmp, items)), tmp


@pytest.mark.parametrize("style", ["indexed", "single", "listed"])
@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["gnu", "pax"])
def test_local_shards_match_jsonl_and_files(ref, tmp_path, style, fmt):
    items, want, _ = ref
    p = tmp_path / "shard-000000.tar"
    p.write_bytes(tar_bytes(items, style, fmt))
    with mmloader.Loader(str(p), tokenizer=TINY, micro_batch_size=3) as L:
        assert L.num_samples == len(items)
    same(want, epoch(str(p)))


def test_long_names_compressed_and_auto_detected(ref, tmp_path):
    items, want, _ = ref
    deep = "a/" + "very-long-folder-name/" * 8  # > 100 bytes: GNU 'L' / pax path records
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        data = tar_bytes(items, "indexed", fmt, prefix=deep)
        (tmp_path / "d.tar.gz").write_bytes(gzip.compress(data))
        same(want, epoch(str(tmp_path / "d.tar.gz")))
        (tmp_path / "noext").write_bytes(data)  # told by the ustar magic
        same(want, epoch(str(tmp_path / "noext")))


def test_sharded_and_shuffled(ref, tmp_path):
    items, _, tmp = ref
    (tmp_path / "a.tar").write_bytes(tar_bytes(items[:7]))
    (tmp_path / "b.tar").write_bytes(tar_bytes(items[7:], "listed"))
    jsonl = os.path.join(tmp, "ref.jsonl")
    for rank in range(2):
        kw = dict(shuffle=True, seed=4, dp_rank=rank, dp_size=2)
        same(
            epoch(jsonl, image_root=tmp, **kw),
            epoch([str(tmp_path / "a.tar"), str(tmp_path / "b.tar")], **kw),
        )
    same(epoch(jsonl, image_root=tmp), epoch(str(tmp_path)))  # a folder of shards


def test_remote_shards(ref, fault_server, moto_s3):
    items, want, _ = ref
    data = tar_bytes(items)
    srv = fault_server(objects={"/wds/s.tar": data}, fault_rate=0.1, seed=2)
    same(want, epoch(srv.url("/wds/s.tar")))
    # records and images are range reads of the shard, never a whole-object GET after indexing
    url = moto_s3.put("wds/s.tar", data)
    s3 = dict(
        s3_endpoint=moto_s3.endpoint,
        s3_region=moto_s3.region,
        aws_access_key_id=moto_s3.access_key,
        aws_secret_access_key=moto_s3.secret_key,
    )
    same(want, epoch(url, **s3))


def test_member_errors_name_the_sample(ref, tmp_path):
    items, _, _ = ref
    key, rec, imgs = items[1]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        add(tar, "k1.json", json.dumps(dict(rec, images=["missing.jpg"])).encode())
        add(tar, "k2.json", json.dumps(rec).encode())  # one <image>, no image member
        add(tar, "k3.json", json.dumps(rec).encode())
        add(tar, "k3.jpg", b"not an image")
    p = tmp_path / "bad.tar"
    p.write_bytes(buf.getvalue())
    with pytest.raises(mmloader.SampleError) as e:
        with mmloader.Loader(
            str(p), tokenizer=TINY, micro_batch_size=1, shuffle=False, on_error="raise"
        ) as L:
            it = iter(L)
            errors = []
            for _ in range(3):
                try:
                    next(it)
                except mmloader.SampleError as x:
                    errors.append(str(x))
            raise mmloader.SampleError("\n".join(errors))
    msgs = str(e.value).split("\n")
    assert msgs[0].startswith(f"{p}[k1]: image missing.jpg:")
    assert msgs[1].startswith(f"{p}[k2]: image count mismatch")
    assert msgs[2].startswith(f"{p}[k3]: image k3.jpg:")


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda d: d[:700], r"truncated tar \(ends at byte 700 inside a member\)"),
        (lambda d: d[:100], r"truncated tar \(ends at byte 100 inside a header\)"),
        (
            lambda d: d[:148] + b"9" + d[149:],
            r"not a tar archive \(bad header checksum\) at byte 0",
        ),
    ],
)
def test_corrupt_tar_is_refused(ref, tmp_path, mutate, needle):
    items, _, _ = ref
    p = tmp_path / "c.tar"
    p.write_bytes(mutate(tar_bytes(items[:3])))
    with pytest.raises(mmloader.Error, match=r"c\.tar: " + needle):
        mmloader.Loader(str(p), tokenizer=TINY, micro_batch_size=1)
