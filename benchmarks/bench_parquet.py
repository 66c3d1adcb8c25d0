"""Parquet shards as the Hub ships them (issue 35): start-up and samples/s of mmloader on
the Parquet files, of mmloader on the same rows exported as JSONL + image files, and of
`datasets` streaming the Parquet files into the HF processor under a PyTorch DataLoader.

    python3 -m pytest benchmarks/bench_parquet.py --benchmark-only -q -s

The dataset: N_ROWS rows of messages + 0-2 images (the scikit-image / matplotlib sample
photos of tests/photos.py re-encoded as JPEG at 0.3-2 MP), written by `datasets` itself
(`Dataset.from_dict(...).to_parquet()` with `List(Image())`, its default row groups) as
N_SHARDS files, and exported as JSONL + image files.  Every peer makes the same batches of
BATCH samples (Qwen2.5-VL: input_ids, labels, attention_mask, pixel_values,
image_grid_thw) at the same pixel limits and with the same tokenizer file
(benchmarks/pipelines/common.py's choice):

- mmloader-parquet: `mmloader.Loader` on the Parquet files (rows decoded a row group at a
  time by its worker threads);
- mmloader-jsonl: `mmloader.Loader` on the JSONL export;
- hf-streaming: `datasets.load_dataset("parquet", streaming=True)` (its Image column cast
  to `decode=False`), each row turned into a sample by benchmarks/pipelines/common.py's
  Worker (PIL decode, transformers' Qwen2VLImageProcessorPil, template, tokenizer) in a
  `torch.utils.data.DataLoader` with one worker process per core (each streams its share
  of the files), prefetch_factor 2, the same collate.

Each figure is one pass over the dataset: start-up = from building the pipeline to the
first batch; samples/s = samples after the first batch / the time after it.  REPEATS
repeats, the peers interleaved in each; the median (min-max).  The machine's 1-minute
load is printed beside the figures.  No assertion is made on the times.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)

import mmloader  # noqa: E402
from benchmarks.pipelines import common  # noqa: E402

Image = pytest.importorskip("PIL.Image")
datasets = pytest.importorskip("datasets")
torch = pytest.importorskip("torch")
photos = pytest.importorskip("photos")  # tests/photos.py: the sample photos

N_ROWS = int(os.environ.get("MML_BENCH_PQ_ROWS", "256"))
N_SHARDS = 4
BATCH = 8
REPEATS = int(os.environ.get("MML_BENCH_PQ_REPEATS", "3"))
PIXELS = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 256)


def load() -> float:
    return os.getloadavg()[0]


def make_images(n: int = 12) -> List[bytes]:
    rng = np.random.default_rng(0)
    names = sorted(photos._PHOTOS)
    out = []
    for k in range(n):
        pkg, fname = photos._PHOTOS[names[k % len(names)]]
        im = Image.open(photos.data_file(pkg, fname)).convert("RGB")
        mp = [0.3, 0.6, 1.0, 2.0][k % 4]
        f = (mp * 1e6 / (im.size[0] * im.size[1])) ** 0.5
        im = im.resize((max(32, int(im.size[0] * f)), max(32, int(im.size[1] * f))))
        b = io.BytesIO()
        im.save(b, "JPEG", quality=int(rng.integers(85, 96)))
        out.append(b.getvalue())
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("pqbench"))


def write_dataset(tmp: Any) -> Any:
    """(the folder of Parquet files, the JSONL export) of the rows, under tmp (a Path)."""
    imgs = make_images()
    rows = []
    for i in range(N_ROWS):
        k = i % 3
        pics = [imgs[(i + j) % len(imgs)] for j in range(k)]
        msgs = [
            {"role": "user", "content": "<image>" * k + f"Row {i}: what is shown here?"},
            {"role": "assistant", "content": f"Answer {i}: " + "a photo. " * (1 + i % 7)},
        ]
        rows.append((msgs, pics))
    os.makedirs(tmp / "img")
    with open(tmp / "data.jsonl", "w") as f:
        for i, (msgs, pics) in enumerate(rows):
            names = []
            for j, b in enumerate(pics):
                names.append(f"img/{i}.{j}.jpg")
                (tmp / names[-1]).write_bytes(b)
            f.write(json.dumps({"messages": msgs, "images": names}) + "\n")
    feats = datasets.Features(
        {
            "messages": datasets.List(
                {"role": datasets.Value("string"), "content": datasets.Value("string")}
            ),
            "images": datasets.List(datasets.Image()),
        }
    )
    os.makedirs(tmp / "pq")
    per = -(-N_ROWS // N_SHARDS)
    for s in range(N_SHARDS):
        part = rows[s * per : (s + 1) * per]
        ds = datasets.Dataset.from_dict(
            {
                "messages": [m for m, _ in part],
                "images": [[{"bytes": b, "path": None} for b in p] for _, p in part],
            },
            features=feats,
        )
        ds.to_parquet(str(tmp / "pq" / f"train-{s:05d}-of-{N_SHARDS:05d}.parquet"))
    return str(tmp / "pq"), str(tmp / "data.jsonl")


def run_mmloader(path: str) -> Dict[str, float]:
    tok, _ = common.default_tokenizer_file()
    t0 = time.perf_counter()
    with mmloader.Loader(
        path,
        tokenizer=tok,
        preset="qwen2.5-vl",
        micro_batch_size=BATCH,
        shuffle=False,
        num_threads=os.cpu_count() or 1,
        **PIXELS,
    ) as L:
        return consume(iter(L), t0)


class HFStream:
    """`datasets` streaming + the HF processor (common.Worker) per row, for a DataLoader."""

    def __init__(self, folder: str):
        files = sorted(os.path.join(folder, f) for f in os.listdir(folder))
        ds = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True)
        ds = ds.cast_column("images", datasets.List(datasets.Image(decode=False)))
        tok, _ = common.default_tokenizer_file()
        cfg = common.make_config([], tokenizer=tok, **PIXELS)
        worker = common.Worker(cfg)

        def sample(row: Dict[str, Any]) -> Dict[str, Any]:
            line = json.dumps({"messages": row["messages"], "images": ["x"] * len(row["images"])})
            return worker.process("hub", line, [im["bytes"] for im in row["images"]])

        self.ds = ds.map(sample, remove_columns=["messages", "images"])


def run_hf(folder: str) -> Dict[str, float]:
    import warnings

    warnings.filterwarnings("ignore", message=".*pin_memory.*")
    t0 = time.perf_counter()
    workers = os.cpu_count() or 1
    dl = torch.utils.data.DataLoader(
        HFStream(folder).ds,
        batch_size=BATCH,
        num_workers=workers,
        collate_fn=common.collate,
        prefetch_factor=2,
    )
    return consume(iter(dl), t0)


def consume(it: Any, t0: float) -> Dict[str, float]:
    first = next(it)
    t1 = time.perf_counter()
    n = 0
    for b in it:
        n += int(b["input_ids"].shape[0])
    t2 = time.perf_counter()
    return {
        "startup_s": t1 - t0,
        "samples_per_s": n / (t2 - t1) if t2 > t1 else float("nan"),
        "samples": n + int(first["input_ids"].shape[0]),
    }


PEERS: Dict[str, Callable[[Any], Dict[str, float]]] = {
    "mmloader-parquet": lambda d: run_mmloader(d[0]),
    "mmloader-jsonl": lambda d: run_mmloader(d[1]),
    "hf-streaming": lambda d: run_hf(d[0]),
}


def summary(runs: Dict[str, List[Dict[str, float]]], key: str, name: str) -> str:
    v = [r[key] for r in runs[name]]
    return f"{statistics.median(v):.3g} ({min(v):.3g}-{max(v):.3g})"


def test_parquet_startup_and_throughput(benchmark, data):
    runs: Dict[str, List[Dict[str, float]]] = {k: [] for k in PEERS}
    loads: List[float] = []

    def once():
        for _ in range(REPEATS):
            for name, fn in PEERS.items():
                loads.append(load())
                runs[name].append(fn(data))

    benchmark.pedantic(once, rounds=1, iterations=1, warmup_rounds=0)
    for name in PEERS:
        assert all(r["samples"] == N_ROWS for r in runs[name]), (name, runs[name])
    med = {n: statistics.median(r["samples_per_s"] for r in runs[n]) for n in PEERS}
    start = {n: statistics.median(r["startup_s"] for r in runs[n]) for n in PEERS}
    lines = [
        f"Parquet benchmark: {N_ROWS} rows, {N_SHARDS} shards, batches of {BATCH}, "
        f"{os.cpu_count()} cores, load {min(loads):.1f}-{max(loads):.1f} (1-minute), "
        f"median (min-max) of {REPEATS}",
        "",
        "| pipeline | start-up to the first batch (s) | samples/s | samples/s vs hf-streaming |",
        "|---|---:|---:|---:|",
    ]
    for n in PEERS:
        lines.append(
            f"| {n} | {summary(runs, 'startup_s', n)} | {summary(runs, 'samples_per_s', n)} | "
            f"{med[n] / med['hf-streaming']:.2f}x |"
        )
    lines.append("")
    lines.append(
        f"mmloader-parquet / mmloader-jsonl: samples/s {med['mmloader-parquet'] / med['mmloader-jsonl']:.2f}x, "
        f"start-up {start['mmloader-parquet'] / start['mmloader-jsonl']:.2f}x"
    )
    text = "\n".join(lines)
    print("\n" + text)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "parquet.json")
    with open(out, "w") as f:
        json.dump({"runs": runs, "loads": loads, "table": text}, f, indent=1)
