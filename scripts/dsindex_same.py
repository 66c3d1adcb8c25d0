#!/usr/bin/env python3
"""Builds the dataset indexes (.mmlidx) of the test datasets with two builds of mmloader
and checks they are byte-identical: a refactor of the measuring path must not change what
an index records.

    python3 scripts/dsindex_same.py REF_CHECKOUT [NEW_CHECKOUT] [--work DIR] [--entries]

Each checkout must be built in place (scripts/build.sh); NEW defaults to this one.  The
datasets (those of tests/test_dsindex.py and tests/test_dsindex_video.py: images of many
sizes and formats, a bad record, a missing image, a WebDataset shard, frame-list videos,
video files, a corrupt video) are generated once under --work and indexed by each build
under the same settings (presets, pixel formats, limits).  Exit 1 on any difference.
With --entries, indexes whose bytes differ only in the settings text (and so the key and
checksum: a change that widens what the key covers) count as the same when every entry
(offsets' samples, statuses, token counts, images) is; the settings texts are printed."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VISION = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)


def make_data(work: str) -> Dict[str, Any]:
    """The datasets, generated with this checkout's generator (once)."""
    sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
    import numpy as np
    from PIL import Image

    from mmloader.datagen import make_dataset
    from test_dsindex import as_tar

    d = make_dataset(
        os.path.join(work, "img"),
        n_samples=40,
        seed=5,
        n_shards=2,
        n_images=10,
        min_size=24,
        max_size=200,
    )
    with open(d["shards"][0], "a") as f:
        f.write("not json\n")
        rec = {
            "conversations": [
                {"from": "human", "value": "<image>?"},
                {"from": "gpt", "value": "A."},
            ],
            "images": ["nowhere.png"],
        }
        f.write(json.dumps(rec) + "\n")
    big = make_dataset(
        os.path.join(work, "big"),
        n_samples=8,
        seed=2,
        n_shards=1,
        n_images=8,
        min_size=700,
        max_size=1200,
        text_only_fraction=0.0,
    )
    wds = as_tar(d["shards"][1], os.path.join(work, "img", "data.tar"))
    vroot = os.path.join(work, "vid")
    os.makedirs(vroot, exist_ok=True)
    rng = np.random.default_rng(7)
    frames = []
    for size, ext in (((96, 64), "jpg"), ((150, 100), "png")):
        for i in range(4):
            p = os.path.join(vroot, f"f{size[0]}_{i}.{ext}")
            Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(p)
            frames.append(p)
    ans = {"from": "gpt", "value": "An answer."}

    def rec(text: str, **kw: Any) -> Dict[str, Any]:
        return dict({"conversations": [{"from": "human", "value": text}, ans]}, **kw)

    recs = [
        rec("<image> and <video>?", images=[frames[0]], videos=[frames[1:4]]),
        rec(
            "<video> then <video>",
            videos=[frames[4:], {"video": frames[:3], "sample_fps": 1.0, "raw_fps": 30.0}],
        ),
        rec("<video>small", videos=[{"video": frames[4:], "min_pixels": 3136, "max_pixels": 6272}]),
        rec("Just text."),
        rec("<video>gone", videos=[[frames[0], "missing.jpg"]]),
    ]
    try:
        from test_video import make_video

        a = make_video(os.path.join(vroot, "a.mp4"), "libx264", n=48, w=64, h=48, fps=24)
        b = make_video(os.path.join(vroot, "b.webm"), "libvpx-vp9", n=30, w=65, h=48, fps=10)
        with open(os.path.join(vroot, "junk.mp4"), "wb") as f:
            f.write(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 16)
        recs += [
            rec("<video>?", videos=[{"video": str(a), "fps": 2.0}]),
            rec("<video> and <video>", videos=["b.webm", {"video": str(a), "nframes": 6}]),
            rec("<video>long", videos=[{"video": str(b), "nframes": 64}]),
            rec("<video>junk", videos=["junk.mp4"]),
            rec("<video>window", videos=[{"video": "a.mp4", "video_start": 0.5, "video_end": 1.5}]),
        ]
    except Exception as e:  # no PyAV / encoder here: frame lists only
        print(f"[dsindex_same] no video files ({e})")
    vshard = os.path.join(vroot, "mixed.jsonl")
    with open(vshard, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs * 2)
    return {"img": d["shards"], "big": big["shards"], "wds": [wds], "vid": [vshard]}


#: (name, data key, Loader settings)
BUILDS: List[Any] = [
    ("img", "img", dict(VISION)),
    ("img-q3", "img", dict(VISION, preset="qwen3-vl")),
    ("img-limits", "img", dict(VISION, max_sample_pixels=20000, max_length=300)),
    ("big", "big", dict(VISION)),
    ("wds", "wds", dict(VISION)),
    ("vid", "vid", dict(VISION)),
    ("vid-q3", "vid", dict(VISION, preset="qwen3-vl")),
    ("vid-u8", "vid", dict(VISION, pixel_format="uint8")),
]

CHILD = """
import json, sys
from mmloader import dsindex
tok, out, data, kw = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
s = dsindex.build(data, tokenizer=tok, threads=2, out=out, **kw)
print(json.dumps({k: s[k] for k in ("samples", "good", "bad")}))
"""


def build_with(checkout: str, out: str, data: List[str], kw: Dict[str, Any]) -> str:
    tok = os.path.join(ROOT, "mmloader", "data", "tiny-tokenizer.json")
    env = dict(os.environ, PYTHONPATH=checkout)
    r = subprocess.run(
        [sys.executable, "-c", CHILD, tok, out, json.dumps(data), json.dumps(kw)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
        timeout=600,
    )
    if r.returncode:
        raise SystemExit(f"build in {checkout} failed:\n{r.stderr[-3000:]}")
    return r.stdout.strip().splitlines()[-1]


def same_entries(ref: List[str], new: List[str]) -> Any:
    """(whether the indexes agree on everything but the settings text and key, a note)."""
    sys.path[:0] = [ROOT]
    from mmloader import dsindex

    notes = set()
    for r, n in zip(ref, new):
        x, y = dsindex.read(r), dsindex.read(n)
        if x["settings"] != y["settings"]:
            extra = (
                y["settings"][len(x["settings"]) :]
                if y["settings"].startswith(x["settings"])
                else y["settings"]
            )
            notes.add(f"entries compared; the settings text gains:{extra}")
        for k in ("settings", "key"):
            x.pop(k), y.pop(k)
        if x != y:
            return False, "entries differ"
    return True, "; ".join(sorted(notes))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ref")
    ap.add_argument("new", nargs="?", default=ROOT)
    ap.add_argument("--work", default=None)
    ap.add_argument("--entries", action="store_true", help="allow another settings text")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="dsindex_same-")
    data = make_data(os.path.join(work, "data"))
    bad = 0
    for name, key, kw in BUILDS:
        outs = []
        for tag, co in (("ref", a.ref), ("new", a.new)):
            out = os.path.join(work, name, tag)
            os.makedirs(out, exist_ok=True)
            summary = build_with(os.path.abspath(co), out, data[key], kw)
            outs.append((out, summary))
        files = sorted(os.listdir(outs[0][0]))
        same = files == sorted(os.listdir(outs[1][0])) and all(
            open(os.path.join(outs[0][0], f), "rb").read()
            == open(os.path.join(outs[1][0], f), "rb").read()
            for f in files
        )
        note = ""
        if not same and a.entries and files == sorted(os.listdir(outs[1][0])):
            same, note = same_entries(
                [os.path.join(outs[0][0], f) for f in files],
                [os.path.join(outs[1][0], f) for f in files],
            )
        bad += not same
        print(f"{'same' if same else 'DIFFERENT':9} {name:10} {len(files)} file(s) {outs[0][1]}")
        if note:
            print(f"          {note}")
        if not same:
            print(f"          new: {outs[1][1]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
