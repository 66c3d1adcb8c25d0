"""The end-to-end benchmark's machinery in seconds (the suite itself runs for ~20 minutes:
benchmarks/bench_e2e.py): the photo dataset, one in-process measurement with the steady-
state figures, the same-work comparison, and the generated report with every target."""

from __future__ import annotations

import json
import os
import re
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
    long = dataset.repeated(shard, 40)  # far more than 0.2 s of samples on a fast machine
    with open(long) as f:
        assert sum(1 for _ in f) == 480
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
    # why batches come late, what a batch costs: steady-state spreads in ms, batch bytes
    iv, w = res["interval_ms"], res["next_wait_ms"]
    assert 0 < iv["p50"] <= iv["p90"] <= iv["p99"] <= iv["max"] and iv["n"] >= 1
    assert w["n"] == iv["n"] + 1 and 0 <= w["p50"] <= w["max"]  # n waits, n - 1 intervals
    assert 0 <= res["slow_interval_share"] < 1 and 0 <= res["waiting_share"] <= 1
    assert res["batch_mb"] > 0.01  # 4 samples' pixel_values, ids, masks


def test_memory_counts_shared_memory_held_by_a_descriptor_once():
    """A DataLoader batch in flight is a tmpfs object held by a descriptor and mapped by
    nobody: in no PSS, yet real memory.  tree_memory counts it, and a page of it that the
    process maps and touches (in its Pss_Shmem) only once."""
    import mmap

    me = [os.getpid()]
    size = 16 << 20
    base, base_extra = runner.tree_memory(me)
    name = f"/dev/shm/mml-test-{os.getpid()}"
    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.unlink(name)  # as torch does: the descriptor is all that holds it
    try:
        os.ftruncate(fd, size)
        assert runner.shm_held(me) == 0  # sparse: nothing allocated yet
        os.write(fd, b"x" * size)
        held, extra = runner.tree_memory(me)
        assert runner.shm_held(me) >= size
        assert extra - base_extra >= size and held - base >= size * 0.9
        with mmap.mmap(fd, size) as m:
            for off in range(0, size, 4096):  # touch every page: now in this PSS too
                m[off]
            touched, extra_touched = runner.tree_memory(me)
            assert extra_touched - base_extra < size // 4  # no longer counted beside PSS
            # counted once, not twice: against `held` (just before), not `base` (a full
            # suite's run once saw this process grow 15 MB between `base` and here)
            assert abs(touched - held) < size // 2
    finally:
        os.close(fd)
    assert runner.shm_held(me) < size


def test_decode_only_floor_on_one_and_on_two_threads(shard):
    from benchmarks.pipelines import decode_only

    cfg = make_config([shard], module="decode_only", threads=2, min_samples=24, repeats=2)
    out = decode_only.measure(cfg)
    assert len(out["runs"]) == 2
    for r in out["runs"]:
        assert r["threads"] == 2 and r["records"] == 12
        assert r["samples"] >= 24 and r["threaded_samples"] >= 24
        assert r["samples"] % 12 == 0 and r["threaded_samples"] % 12 == 0  # whole passes
        assert r["cpu_s_per_sample"] > 0 and r["threaded_cpu_s_per_sample"] > 0
        assert r["threaded_samples_per_s"] > 0 and r["pil_cpu_s_per_sample"] > 0


def test_decode_floor_runs_beside_each_repeat_of_the_pipelines():
    """The floor the CPU ratios divide by is measured in every repeat, right before that
    repeat's throughput runs, not once at the start (the CPU a sample costs on a shared
    machine moves with the load of the moment)."""
    from types import SimpleNamespace

    from benchmarks import bench_e2e

    def item(name, **params):
        return SimpleNamespace(originalname=name, callspec=SimpleNamespace(params=params))

    names = ["test_throughput", "test_wait_ratio", "test_decode_only"]
    items = [item(n, repeat=r) for r in (2, 0, 1) for n in names]
    items += [item("test_same_work"), item("test_max_memory")]
    order = [
        (i.originalname, i.callspec.params.get("repeat"))
        for i in sorted(items, key=bench_e2e.collection_order)
    ]
    assert order[0] == ("test_same_work", None)
    for r in (0, 1, 2):
        at = order.index(("test_decode_only", r))
        assert order[at + 1] == ("test_throughput", r)
        assert all(rep != r for _, rep in order[:at])  # nothing of repeat r before it


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
    runs[0]["result"]["own_pss_mb"] = 50.0  # mmloader r0 by PSS alone; the rest have none
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
    # by PSS alone: medians 50 (one run) and none for the DataLoader -> no row
    assert not any(n.startswith("the same by PSS alone") for n in got)
    rule = [(v, met) for name, v, _, met, _ in report.targets(data) if name.startswith("every run")]
    assert rule == [("12 of 12 runs", True)]  # 600 samples x 31 s each, 3 repeats
    data["runs"][0]["result"]["wall_s"] = 20.0  # one run short of 30 s: the rule is not met
    assert [m for n, _, _, m, _ in report.targets(data) if n.startswith("every run")] == [False]
    assert got["samples/s vs NVIDIA DALI CPU, local disk"] == (None, None)  # no DALI run
    md = report.markdown(data)
    assert "| **mmloader** | 60.0 (10.0-70.0) | 6.00x |" in md
    assert "not measured" in md  # remote, uint8, wait: no runs, said so
    assert "shared with other work during the run" in md  # no record of other work: said so
    # the floor on the pipeline's 2 threads: 0.015 s -> 0.012 / 0.015 = 0.8x; one thread 1.2x
    dec = data["runs"][-1]["result"]
    dec.update(threads=2, threaded_cpu_s_per_sample=0.015, threaded_samples_per_s=130.0)
    got = {name: (v, met) for name, v, _, met, _ in report.targets(data)}
    name = "CPU per sample / decode-only CPU per sample, float32 output"
    assert got[name + " (floor: 2 threads decoding at once, as the pipeline)"] == (
        pytest.approx(0.8),
        True,
    )
    one = got["the same against the one-thread decode-only floor, float32 output"]
    assert one[0] == pytest.approx(1.2) and one[1] is None
    md = report.markdown(data)
    assert "15.00 ms with 2 threads decoding at once" in md and "10.00 ms on one" in md
    data["meta"].update(cores=2, other_cores_during=[0.02, 0.05, 0.01], steal_cores_during=[0.0])
    assert "The machine was otherwise quiet: work outside the suite took 0.02" in (
        report.markdown(data)
    )
    data["meta"]["other_cores_during"] = [0.9, 1.1, 0.2]
    assert "**The machine was shared with other work during the run**: work outside the " in (
        report.markdown(data)
    )
    path = tmp_path / "e2e.json"
    path.write_text(json.dumps(data))
    readme = tmp_path / "README.md"
    readme.write_text(f"a\n{report.START}\nold\n{report.END}\nb\n")
    report.fill_readme(str(path), str(readme))
    text = readme.read_text()
    assert "\nold\n" not in text and "| **mmloader** | 60.0" in text and text.endswith("b\n")
    # --e2e-out DIR: results.md goes inside DIR with its plot links relative to it (it was
    # written beside DIR, /tmp/x -> /tmp/results.md, linking a results/ folder not there)
    out = tmp_path / "out"
    out.mkdir()
    (out / "e2e.json").write_text(json.dumps(data))
    md = report.generate(str(out / "e2e.json"))
    assert (out / "results.md").read_text() == md
    assert not (tmp_path / "results.md").exists() and "](results/" not in md
    for link in re.findall(r"!\[[^]]*\]\(([^)]+)\)", md):
        assert (out / link).exists(), link
    bench = os.path.join(ROOT, "benchmarks")
    assert report.md_path_for(os.path.join(bench, "results")) == os.path.join(bench, "results.md")


def test_report_says_why_batches_are_late_and_what_memory_is():
    """The lines after the profile: mmloader's batch-interval spread at step 0, the waits
    of the 1.2x runs, own memory in mean batches and the pool; nothing without the runs."""

    def spread(p50, mx):
        return {"p50": p50, "p90": mx / 2, "p99": mx, "max": mx, "n": 100}

    runs = [
        _run(
            "throughput",
            "mmloader",
            "local",
            r,
            own_mem_mb=own,
            batch_mb=50.0,
            interval_ms=spread(p50, 400.0),
            slow_interval_share=share,
            batch_max_mb=200.0,
            batch_pair_max_mb=320.0 + 40 * r,
            loader_stats={
                "prefetch": 4,
                "pool_live_bytes": 300 << 20,
                "pool_cached_bytes": 0,
                "pool_peak_bytes": 420 << 20,
                "pool_live_peak_bytes": 400 << 20,
                "window_bytes": 10 << 20,
                "scratch_mapped_peak_bytes": 30 << 20,
            },
        )
        for r, (own, p50, share) in enumerate([(500.0, 100.0, 0.1), (600.0, 120.0, 0.3)])
    ]
    runs.append(_run("throughput", "dataloader", "local", 0, own_mem_mb=1000.0, batch_mb=50.0))
    wait = _run("wait", "mmloader", "local", 0, waiting_share=0.25, next_wait_ms=spread(0, 90))
    wait["params"] = {"factor": 1.2, "step_ms": 120.0, "production_ms": 100.0}
    data = {"meta": {"batch_size": 8}, "runs": runs + [wait]}
    late = " ".join(report.lateness_lines(data))
    assert "110 ms at the median, 200 ms at p90, 400 ms at p99" in late  # medians of 2 runs
    assert "20% of the batches take over 1.2x the median" in late and "the 4 prefetched" in late
    assert "25% of next() calls waited over 1 ms; the waits were 90 ms at p99" in late
    mem = " ".join(report.memory_lines(data))
    assert "PyTorch DataLoader 1000 MB = 20.0 x 50 MB" in mem
    assert "mmloader 550 MB = 11.0 x 50 MB" in mem and "held 300 MB in buffers" in mem
    assert "the pool 420 MB, of it 400 MB in use at one time" in mem and "20 MB more" in mem
    assert "is 340 (320-360) MB, the largest single batch 200 (200-200) MB" in mem
    assert "1/3 of the DataLoader's own memory is 333 MB, so that target is below" in mem
    assert "Own memory over the floor: 210 MB." in mem
    assert report.lateness_lines({"meta": {}, "runs": []}) == []
    assert report.memory_lines({"meta": {}, "runs": []}) == []
