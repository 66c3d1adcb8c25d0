"""The end-to-end benchmark's machinery in seconds (the suite itself runs for ~20 minutes:
benchmarks/bench_e2e.py): the photo dataset, one in-process measurement with the steady-
state figures, the same-work comparison, and the generated report with every target."""

from __future__ import annotations

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

pytest.importorskip("PIL")
pytest.importorskip("skimage", reason="scikit-image ships the photos")
torch = pytest.importorskip("torch")

from benchmarks import report  # noqa: E402
from benchmarks.pipelines import dataset, runner  # noqa: E402
from benchmarks.pipelines.common import make_config  # noqa: E402
from mmloader.tokenizer import TINY_TOKENIZER_PATH  # noqa: E402


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    return dataset.cached(12, photos=True, max_mp=0.5, base=str(tmp_path_factory.mktemp("d")))


def test_photo_dataset_mixes_real_photos(shard):
    d = dataset.describe(shard)
    assert d["records"] == 12 and d["photos"] >= 1
    assert d["photos"] < d["images"]  # generated images too
    from PIL import Image

    img = os.path.join(os.path.dirname(shard), "images")
    names = [n for n in os.listdir(img) if n.startswith("photo-")]
    assert 0 < len(names) <= d["photos"], names  # photo files, each used by a record or more
    for name in names:
        with Image.open(os.path.join(img, name)) as im:
            assert im.width * im.height <= 0.51e6, name  # max_mp=0.5


def test_measure_reports_steady_state_and_own_memory(shard):
    long = dataset.repeated(shard, 4)
    with open(long) as f:
        assert sum(1 for _ in f) == 48
    cfg = make_config(
        [long],
        module="mmloader_pipe",
        batch_size=4,
        threads=2,
        prefetch=2,
        inflight=8,
        tokenizer=TINY_TOKENIZER_PATH,
        min_samples=24,
        min_seconds=0.2,
    )
    res = runner.measure(cfg)
    assert res["samples"] >= 24 and not res["exhausted"]
    assert res["faults_per_batch"] is not None and res["faults_per_batch"] >= 0
    assert res["steady_cpu_s_per_sample"] > 0
    assert res["own_mem_mb"] == pytest.approx(res["peak_mem_mb"] - res["idle_pss_mb"])
    assert res["idle_pss_mb"] > 0


def test_same_work_comparison_sees_a_difference(shard):
    cfg = make_config([shard], module="naive", batch_size=4, tokenizer=TINY_TOKENIZER_PATH)
    from benchmarks.pipelines import naive

    ref = list(naive.build(cfg))
    assert runner._compare(ref, ref, 2)["mismatch"] == []
    other = [dict(b) for b in ref]
    other[1]["labels"] = other[1]["labels"].clone()
    other[1]["labels"][0, -1] += 1
    other[0]["pixel_values"] = other[0]["pixel_values"] + 0.25
    got = runner._compare(ref, other, 2)
    assert got["mismatch"] == [
        "batch 1 labels: " + f"{tuple(ref[1]['labels'].shape)} vs {tuple(ref[1]['labels'].shape)}"
    ]
    assert got["pixel_max_abs_diff"] == pytest.approx(0.25, abs=1e-6)


def _run(group, pipeline, source, repeat, **res):
    return {
        "group": group,
        "pipeline": pipeline,
        "source": source,
        "repeat": repeat,
        "params": {},
        "result": res,
    }


def test_report_lists_every_target_from_medians(tmp_path, shard):
    runs = []
    for r, (m, d) in enumerate([(60.0, 10.0), (70.0, 10.0), (10.0, 20.0)]):
        for name, rate in (("mmloader", m), ("dataloader", d), ("spdl", d), ("energon", d)):
            runs.append(
                _run(
                    "throughput",
                    name,
                    "local",
                    r,
                    samples_per_s=rate,
                    samples=600,
                    wall_s=31.0,
                    steady_cpu_s_per_sample=0.012,
                    faults_per_batch=5.0,
                    own_mem_mb=100.0 if name == "mmloader" else 400.0,
                    peak_mem_mb=900.0,
                    ttfb_s=1.0,
                )
            )
    runs.append(
        _run("decode", "decode-only", "local", 0, cpu_s_per_sample=0.01, pil_cpu_s_per_sample=0.02)
    )
    data = {
        "meta": {
            "date": "d",
            "cores": 2,
            "python": "3",
            "repeats": 3,
            "min_samples": 512,
            "min_seconds": 30,
            "batch_size": 8,
            "latency_s": 0.03,
            "mode": "default",
            "dataset": dataset.describe(shard),
        },
        "runs": runs,
    }
    got = {name: (v, met) for name, v, _, met, _ in report.targets(data)}
    # medians: mmloader 60, DataLoader 10 -> 6.0x (the 10 / 20 repeat is an outlier)
    assert got["samples/s vs PyTorch DataLoader, local disk"] == (6.0, True)
    assert got["samples/s vs PyTorch DataLoader, 30 ms server"] == (None, None)
    assert got["CPU per sample / decode-only CPU per sample, float32 output"][0] == pytest.approx(
        1.2
    )
    assert got["own memory vs the DataLoader's own memory (same prefetch depth, local)"] == (
        0.25,
        True,
    )
    rule = [(v, met) for name, v, _, met, _ in report.targets(data) if name.startswith("every run")]
    assert rule == [("12 of 12 runs", True)]  # 600 samples x 31 s each, 3 repeats
    data["runs"][0]["result"]["wall_s"] = 20.0  # one run short of 30 s: the rule is not met
    assert [m for n, _, _, m, _ in report.targets(data) if n.startswith("every run")] == [False]
    assert got["samples/s vs NVIDIA DALI CPU, local disk"] == (None, None)  # no DALI run
    md = report.markdown(data)
    assert "| **mmloader** | 60.0 (10.0-70.0) | 6.00x |" in md
    assert "not measured" in md  # remote, uint8, wait: no runs, said so
    path = tmp_path / "e2e.json"
    path.write_text(json.dumps(data))
    readme = tmp_path / "README.md"
    readme.write_text(f"a\n{report.START}\nold\n{report.END}\nb\n")
    report.fill_readme(str(path), str(readme))
    text = readme.read_text()
    assert "old" not in text and "| **mmloader** | 60.0" in text and text.endswith("b\n")
