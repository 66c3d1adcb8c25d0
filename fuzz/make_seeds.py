"""Writes the seed corpus of the fuzz targets into fuzz/corpus/<target>/ (committed; rerun
after changing it: python3 fuzz/make_seeds.py).  Images are re-encoded at run time from a
photo inside scikit-image's or matplotlib's wheel when one is installed, else drawn."""
import io
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def records():
    recs = [
        {"image": "a.jpg", "conversations": [{"from": "human", "value": "<image>\nWhat?"},
                                             {"from": "gpt", "value": "A cat."}]},
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "<image><image>Compare."},
                      {"role": "assistant", "content": "Same."}], "images": ["a", "b"]},
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "x.png"},
                                                   {"type": "text", "text": "caf\u00e9?"}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]},
        {"messages": [{"role": "user", "content": [{"image_url": {"url": "https://h/a.jpg"}}]},
                      {"role": "tool", "content": None}], "images": []},
    ]
    for i, r in enumerate(recs):
        put("record", f"rec{i}.json", json.dumps(r, ensure_ascii=i % 2 == 0))
    put("record", "deep.json", '{"x":' + "[" * 40 + "]" * 40 + ',"messages":[]}')
    put("record", "nul.json", '{"messages":[{"role":"user","content":"a\\u0000b"}]}')


def tokenizer():
    with open(os.path.join(ROOT, "mmloader", "data", "tiny-tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    keep = {k: v for k, v in tok["model"]["vocab"].items() if v < 300}
    merges = [m for m in tok["model"]["merges"]
              if (m if isinstance(m, list) else m.split(" "))[0] in keep
              and (m if isinstance(m, list) else m.split(" "))[1] in keep
              and "".join(m if isinstance(m, list) else m.split(" ")) in keep][:200]
    tok["model"]["vocab"] = keep
    tok["model"]["merges"] = merges
    tok["added_tokens"] = tok.get("added_tokens", [])[:4]
    put("tokenizer-load", "small.json", json.dumps(tok, ensure_ascii=False))
    tok["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in merges]
    tok["normalizer"] = {"type": "NFC"}
    put("tokenizer-load", "small-string-merges.json", json.dumps(tok))


def texts():
    for i, t in enumerate(["Hello world", "<|im_start|>user\ncaf\u00e9 123<|im_end|>",
                           "  \t\n\u00e9\u0301 \U0001F600 don't", "x" * 300]):
        put("bpe-encode", f"t{i}.txt", t)
    put("bpe-encode", "bad-utf8.bin", b"a\xff\xfe\xc3(\xed\xa0\x80b")


def photo():
    from PIL import Image
    for mod, rel in (("skimage", "data/astronaut.png"), ("matplotlib", "mpl-data/sample_data/grace_hopper.jpg")):
        try:
            m = __import__(mod)
            return Image.open(os.path.join(os.path.dirname(m.__file__), rel)).convert("RGB")
        except Exception:
            continue
    return Image.radial_gradient("L").convert("RGB")


def images():
    im = photo().resize((24, 16))

    def enc(img, fmt, **kw):
        b = io.BytesIO()
        img.save(b, fmt, **kw)
        return b.getvalue()
    jpegs = {"baseline": enc(im, "JPEG", quality=80), "progressive": enc(im, "JPEG", progressive=True),
             "gray": enc(im.convert("L"), "JPEG"), "cmyk": enc(im.convert("CMYK"), "JPEG"),
             "sub444": enc(im, "JPEG", subsampling=0)}
    for k, v in jpegs.items():
        put("image-jpeg", k + ".bin", v[3:])  # the target puts the magic back
    pngs = {"rgb": enc(im, "PNG"), "rgba": enc(im.convert("RGBA"), "PNG"),
            "palette": enc(im.convert("P"), "PNG"), "gray": enc(im.convert("L"), "PNG"),
            "interlaced": enc(im, "PNG", interlace=1), "gray16": enc(im.convert("I;16"), "PNG")}
    for k, v in pngs.items():
        put("image-png", k + ".bin", v[8:])
    others = {"webp": (4, {"lossy": enc(im, "WEBP", quality=70), "lossless": enc(im, "WEBP", lossless=True),
                           "alpha": enc(im.convert("RGBA"), "WEBP")}),
              "gif": (4, {"p": enc(im.convert("P"), "GIF"),
                          "anim": enc(im.convert("P"), "GIF", save_all=True,
                                      append_images=[im.rotate(90).convert("P")])}),
              "bmp": (2, {"rgb": enc(im, "BMP"), "p": enc(im.convert("P"), "BMP")}),
              "tiff": (3, {"raw": enc(im, "TIFF"), "lzw": enc(im, "TIFF", compression="tiff_lzw"),
                           "gray": enc(im.convert("L"), "TIFF")})}
    for fmt, (strip, seeds) in others.items():
        for k, v in seeds.items():
            if fmt == "tiff" and not v.startswith(b"II*"):
                continue  # the target forces little-endian TIFF
            put("image-" + fmt, k + ".bin", v[strip:])


def resize_and_state():
    for i, (h, w, f) in enumerate([(480, 640, 28), (1, 1, 28), (10000, 20, 32), (28, 5600, 14)]):
        put("resize", f"r{i}.bin", struct.pack("<iih", h, w, f) + struct.pack("<qq", 3136, 12845056)
            + bytes([i, 17, 23, 40, 9, i]) + bytes(range(48)))
    for i, (pack, e, p, b) in enumerate([(0, 0, 0, 0), (0, 1, 9, 2), (1, 0, 5, 2), (0, 0, 40, 7)]):
        put("state", f"s{i}.bin", bytes([pack]) + struct.pack("<QQQ", e + 2, p + 2, b + 2))


def videos():
    """Tiny videos (16x16, 6 frames, keyframe every 3) in each container the core reads."""
    try:
        import av
        import numpy as np
    except ImportError:
        return
    for name, codec, fmt in [("h264.mp4", "libx264", "mp4"), ("h264.mkv", "libx264", "matroska"),
                             ("vp9.webm", "libvpx-vp9", "webm"), ("mpeg4.avi", "mpeg4", "avi"),
                             ("hevc.mov", "libx265", "mov")]:
        buf = io.BytesIO()
        c = av.open(buf, "w", format=fmt)
        s = c.add_stream(codec, rate=12)
        s.width = s.height = 16
        s.pix_fmt = "yuv420p"
        s.codec_context.gop_size = 3
        if codec == "libx265":
            s.options = {"x265-params": "log-level=none"}
        for i in range(6):
            img = np.full((16, 16, 3), i * 40, np.uint8)
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
        c.close()
        put("video", name, buf.getvalue())


def dsindex():
    """Index files of tiny text-only shards: JSONL (a blank line, a bad record), a JSON
    array and a WebDataset tar (needs the built extension)."""
    import io
    import sys
    import tarfile
    import tempfile
    import warnings
    sys.path.insert(0, os.path.dirname(HERE))
    try:
        from mmloader import dsindex as dx
    except ImportError:
        return
    rec = '{"messages":[{"role":"user","content":"q%d"},{"role":"assistant","content":"a"}]}'
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "a.jsonl"), "w") as f:
            f.write("\n".join([rec % 0, "", rec % 1, "{bad", rec % 2]) + "\n")
        with open(os.path.join(d, "b.json"), "w") as f:
            f.write("[" + ", ".join(rec % i for i in range(3)) + "]")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            for i in range(3):
                for name, body in [(f"{i:03d}.json", (rec % i).encode()), (f"{i:03d}.txt", b"x")]:
                    info = tarfile.TarInfo(name)
                    info.size = len(body)
                    t.addfile(info, io.BytesIO(body))
        with open(os.path.join(d, "c.tar"), "wb") as f:
            f.write(buf.getvalue())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dx.build(d, threads=1)
        for n in ("a.jsonl", "b.json", "c.tar"):
            with open(os.path.join(d, n + dx.SUFFIX), "rb") as f:
                put("dsindex", n + ".mmlidx", f.read())


def shards():
    """Shards for the shard reader (fuzz-shard.c: any layout; the tar target: WebDataset).
    The first byte of each seed picks the feed chunk size."""
    import gzip
    import tarfile
    import zlib

    rec = '{"messages":[{"role":"user","content":"q%d"},{"role":"assistant","content":"a"}]}'
    jsonl = ("\n".join([rec % 0, "", "", rec % 1, "  ", rec % 2]) + "\n").encode()
    arr = ("[" + ", ".join(rec % i for i in range(3)) + "]").encode()
    skippable = struct.pack("<II", 0x184D2A50, 4) + b"meta"
    zstd_frame = None
    try:
        import zstandard

        zstd_frame = zstandard.ZstdCompressor(level=3).compress(jsonl)
    except ImportError:
        pass
    seeds = {
        "plain.jsonl": jsonl,
        "array.json": arr,
        "bom.jsonl": b"\xef\xbb\xbf" + jsonl,
        "members.jsonl.gz": gzip.compress(jsonl[:40]) + gzip.compress(jsonl[40:]),
        "padded.jsonl.gz": gzip.compress(jsonl) + b"\0" * 64,
        "deflate.gz": zlib.compress(jsonl),
    }
    if zstd_frame:
        seeds["frame.jsonl.zst"] = zstd_frame
        seeds["skippable.jsonl.zst"] = skippable + zstd_frame
    for i, (n, body) in enumerate(sorted(seeds.items())):
        put("shard", n, bytes([i * 29 % 256]) + body)

    def tar(members, fmt=tarfile.USTAR_FORMAT, pax=None):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt, pax_headers=pax) as t:
            for name, body in members:
                info = tarfile.TarInfo(name)
                info.size = len(body)
                t.addfile(info, io.BytesIO(body))
        return buf.getvalue()

    group = []
    for i in range(3):
        group += [(f"s/{i:03d}.json", (rec % i).encode()), (f"s/{i:03d}.0.jpg", b"\xff\xd8x"),
                  (f"s/{i:03d}.mp4", b"v")]
    long = "d/" + "x" * 120
    tars = {
        "ustar.tar": tar(group),
        "gnu-long.tar": tar([(long + ".json", b"{}"), (long + ".png", b"p")], tarfile.GNU_FORMAT),
        "pax.tar": tar([("a.json", b"{}"), ("a.webp", b"w")], tarfile.PAX_FORMAT, {"c": "1"}),
        "nojson.tar": tar([("a.txt", b"t"), ("b.json", b"{}")]),
        "gz.tar.gz": gzip.compress(tar(group)),
    }
    for i, (n, body) in enumerate(sorted(tars.items())):
        put("tar", n, bytes([i * 53 % 256]) + body)


def parquets():
    """Parquet files for fuzz-parquet.c (pyarrow, when installed): datasets' layout (a
    list of {bytes, path} image structs, messages as a list of structs) plus numbers,
    booleans and nulls, in each codec, page version and encoding the reader supports."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return
    img_t = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    msg_t = pa.struct([("role", pa.string()), ("content", pa.string())])
    table = pa.table(
        {
            "messages": pa.array(
                [[{"role": "user", "content": "<image>hi"}, {"role": "assistant", "content": "yo"}],
                 None, []],
                pa.list_(msg_t),
            ),
            "images": pa.array(
                [[{"bytes": b"\xff\xd8\xffjpeg", "path": None}], [None], None], pa.list_(img_t)
            ),
            "image": pa.array([{"bytes": None, "path": "a.png"}, None, {"bytes": b"x", "path": ""}],
                              img_t),
            "n": pa.array([1, None, -3], pa.int64()),
            "f": pa.array([0.5, float("nan"), None], pa.float32()),
            "b": pa.array([True, None, False]),
            "nested": pa.array([[[1, None], []], None, [[2]]], pa.list_(pa.list_(pa.int32()))),
        }
    )
    variants = [("snappy", "1.0", True), ("zstd", "2.0", False), ("gzip", "1.0", False),
                ("none", "2.0", True)]
    for codec, page, dictionary in variants:
        buf = io.BytesIO()
        pq.write_table(table, buf, compression=codec, data_page_version=page,
                       use_dictionary=dictionary, row_group_size=2, store_schema=False)
        put("parquet", f"{codec}-v{page[0]}-{'dict' if dictionary else 'plain'}.parquet",
            buf.getvalue())


if __name__ == "__main__":
    records()
    tokenizer()
    texts()
    images()
    resize_and_state()
    videos()
    dsindex()
    shards()
    parquets()
