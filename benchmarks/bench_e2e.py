"""End to end: JSONL + images -> Qwen2.5-VL batches, mmloader against its peers, one run.

    python3 -m pytest benchmarks/bench_e2e.py --benchmark-only -q -s          # a few minutes
    python3 -m pytest benchmarks/bench_e2e.py --benchmark-only -q -s --e2e-full   # larger

Every pipeline does the same work on the same generated dataset (benchmarks/pipelines/
dataset.py: mmloader.datagen's multi-turn records in three formats, their images rewritten
as JPEG and PNG photos and screenshots from 320x240 to 1080p, 10% progressive JPEG) with
the same tokenizer file (test_same_work checks the batches are identical), from local disk and from the
fault-injecting server with 30 ms first-byte latency, feeding a simulated trainer step.
Each measurement runs in a fresh interpreter (benchmarks/pipelines/runner.py) so memory
peaks are per pipeline.  At the end the suite writes benchmarks/results/e2e.json and from
it (benchmarks/report.py) benchmarks/results.md and the plots under benchmarks/results/,
and prints the goals, met or not.

Options (or environment): --e2e-full (MML_BENCH_FULL=1), --e2e-samples N
(MML_BENCH_SAMPLES), --e2e-out DIR (MML_BENCH_OUT); MML_BENCH_TOKENIZER picks the
tokenizer.json (default: ../shared/data/qwen3-tokenizer, else mmloader's tiny one);
MML_BENCH_PIPELINES=naive,mmloader runs only those; MML_BENCH_WAIT_SAMPLES sets the size
of the wait-time set (default 256, 512 with --e2e-full).
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from typing import Any, Dict, List, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks import report  # noqa: E402
from benchmarks.pipelines import dataset, server  # noqa: E402
from benchmarks.pipelines.common import default_tokenizer_file, make_config  # noqa: E402
from benchmarks.pipelines.runner import run_subprocess  # noqa: E402

PIPELINES = [  # (name in the results, module in benchmarks/pipelines)
    ("naive", "naive"), ("dataloader", "dataloader"), ("improved", "improved"),
    ("spdl", "spdl_pipe"), ("ray", "ray_pipe"), ("mmloader", "mmloader_pipe")]
SOURCES = ("local", "remote")
LATENCY_S = 0.03
STEP_MS = 10.0  # the trainer step of the throughput runs
WAIT_FACTORS = (0.8, 1.0, 1.2, 1.5, 2.0)  # trainer step / mmloader batch production time


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


class Suite:
    """Settings, the dataset, the server and the results of one run of the suite."""

    def __init__(self, full: bool, samples: Optional[int], out: str):
        self.full = full
        self.cores = _cores()
        self.samples = samples or (256 if full else 64)
        self.wait_samples = int(os.environ.get("MML_BENCH_WAIT_SAMPLES") or 0) or max(
            self.samples, 512 if full else 256)
        only = os.environ.get("MML_BENCH_PIPELINES")
        self.only = set(only.split(",")) if only else None
        self.batch_size = 8
        self.threads_sweep = [1, 2, 4, 8, 16] if full else [1, 2, 4]
        self.out = out
        self.tokenizer, self.tokenizer_kind = default_tokenizer_file()
        self.shard = dataset.cached(self.wait_samples)
        self.root = os.path.dirname(self.shard)
        self.subset = dataset.subset(self.shard, self.samples)
        self.server: Optional[server.Server] = None
        self.url = ""
        self.runs: List[Dict[str, Any]] = []
        self.load_start = os.getloadavg()

    def shards(self, source: str, shard: str) -> List[str]:
        if source == "local":
            return [shard]
        if not self.url:
            reason = server.available()
            if reason:
                pytest.skip(reason)
            self.server = server.Server(self.root, latency=LATENCY_S)
            self.url = self.server.start()
        return [self.url + os.path.basename(shard)]

    def config(self, module: str, source: str, shard: Optional[str] = None, **kw: Any):
        settings: Dict[str, Any] = dict(module=module, batch_size=self.batch_size,
                                        threads=self.cores, inflight=64, prefetch=4,
                                        tokenizer=self.tokenizer, step_ms=STEP_MS)
        settings.update(kw)
        return make_config(self.shards(source, shard or self.subset), **settings)

    def measure(self, benchmark, group: str, pipeline: str, source: str, cfg: Dict[str, Any],
                **params: Any) -> Dict[str, Any]:
        if self.only is not None and pipeline not in self.only:
            pytest.skip(f"MML_BENCH_PIPELINES leaves {pipeline} out")
        res = benchmark.pedantic(run_subprocess, args=(cfg,), kwargs={"timeout": 900},
                                 rounds=1, iterations=1)
        run = {"group": group, "pipeline": pipeline, "source": source, "params": params,
               "result": res}
        self.runs.append(run)
        benchmark.extra_info.update({k: v for k, v in res.items() if not isinstance(v, dict)})
        if "skipped" in res:
            print(f"\n[e2e] {group} {pipeline} {source}: skipped: {res['skipped']}")
            pytest.skip(res["skipped"])
        if "error" in res:
            pytest.fail(f"{pipeline} ({source}) failed: {res['error']}")
        print(f"\n[e2e] {group:10s} {pipeline:10s} {source:6s} {params} "
              f"{res['samples_per_s']:8.1f} samples/s  cpu {res['cpu_s_per_sample']:.3f} s/sample"
              f"  wait {100 * res['wait_ratio']:5.1f}%  ttfb {res['ttfb_s']:.2f} s"
              f"  mem {res['peak_mem_mb']:.0f} MB")
        return res

    def find(self, group: str, pipeline: str, source: str) -> Optional[Dict[str, Any]]:
        for r in self.runs:
            if (r["group"], r["pipeline"], r["source"]) == (group, pipeline, source):
                res = r["result"]
                return res if "samples_per_s" in res else None
        return None

    def meta(self) -> Dict[str, Any]:
        versions = {}
        for mod in ("torch", "transformers", "tokenizers", "PIL", "numpy", "spdl", "ray",
                    "aiohttp"):
            try:
                versions[mod] = __import__(mod).__version__
            except Exception:  # noqa: BLE001 - absent or broken: recorded as such
                versions[mod] = None
        cpu = ""
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next((ln.split(":", 1)[1].strip() for ln in f
                            if ln.startswith("model name")), "")
        except OSError:
            pass
        return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "cores": self.cores, "cpu": cpu, "python": platform.python_version(),
                "versions": versions, "full": self.full, "samples": self.samples,
                "wait_samples": self.wait_samples, "batch_size": self.batch_size,
                "step_ms": STEP_MS, "latency_s": LATENCY_S, "tokenizer": self.tokenizer_kind,
                "loadavg_start": self.load_start, "loadavg_end": os.getloadavg(),
                "dataset": dataset.describe(self.shard)}

    def finish(self) -> None:
        if self.server is not None:
            self.server.stop()
        os.makedirs(self.out, exist_ok=True)
        path = os.path.join(self.out, "e2e.json")
        with open(path, "w") as f:
            json.dump({"meta": self.meta(), "runs": self.runs}, f, indent=1)
        md = report.generate(path, out_dir=self.out,
                             md_path=os.path.join(os.path.dirname(self.out), "results.md"))
        print("\n" + md)


@pytest.fixture(scope="module")
def suite(request):
    opt = request.config.getoption
    full = bool(opt("--e2e-full", default=False)) or os.environ.get("MML_BENCH_FULL") == "1"
    samples = opt("--e2e-samples", default=None) or os.environ.get("MML_BENCH_SAMPLES")
    out = (opt("--e2e-out", default=None) or os.environ.get("MML_BENCH_OUT")
           or os.path.join(HERE, "results"))
    s = Suite(full, int(samples) if samples else None, out)
    yield s
    s.finish()


def test_same_work(benchmark, suite):
    """The reference Python pipeline and mmloader produce the same batches (ids, labels,
    grids equal; pixels within float rounding) from the same records: the runs below
    compare equal work."""
    benchmark.group = "e2e-parity"
    cfg = suite.config("naive", "local", batches=2)
    cfg["parity"] = True
    res = benchmark.pedantic(run_subprocess, args=(cfg,), kwargs={"timeout": 900},
                             rounds=1, iterations=1)
    suite.runs.append({"group": "parity", "pipeline": "mmloader", "source": "local",
                       "params": {}, "result": res})
    if "skipped" in res:
        pytest.skip(res["skipped"])
    assert "error" not in res, res.get("error")
    print(f"\n[e2e] parity: {res['batches']} batches, {res['samples']} samples, pixel max abs "
          f"diff {res['pixel_max_abs_diff']:.2e}, mismatches {res['mismatch'] or 'none'}")
    assert not res["mismatch"], res["mismatch"]
    assert res["pixel_max_abs_diff"] < 1e-3


@pytest.mark.parametrize("source,name,module",
                         [(src, n, m) for src in SOURCES for n, m in PIPELINES],
                         ids=[f"{src}-{n}" for src in SOURCES for n, _ in PIPELINES])
def test_throughput(benchmark, suite, source, name, module):
    """Every pipeline, the same samples, trainer step STEP_MS: samples/s, CPU, memory."""
    benchmark.group = f"e2e-{source}"
    suite.measure(benchmark, "throughput", name, source, suite.config(module, source))


def _thread_cases():
    return [(p, src, n) for p in ("mmloader", "dataloader") for src in SOURCES
            for n in (1, 2, 4, 8, 16)]


@pytest.mark.parametrize("name,source,threads", _thread_cases(),
                         ids=[f"{p}-{s}-{n}" for p, s, n in _thread_cases()])
def test_threads(benchmark, suite, name, source, threads):
    """mmloader's throughput against its thread count (with --e2e-full also remote, and
    the DataLoader's against its worker count)."""
    if (threads not in suite.threads_sweep or (source == "remote" and not suite.full)
            or (name == "dataloader" and (not suite.full or threads > 4))):
        pytest.skip("not in this configuration (--e2e-full runs it)")
    benchmark.group = f"e2e-threads-{source}"
    module = "mmloader_pipe" if name == "mmloader" else "dataloader"
    suite.measure(benchmark, "threads", name, source,
                  suite.config(module, source, threads=threads), threads=threads)


def test_production(benchmark, suite):
    """mmloader's batch production time on the wait-time set (trainer step 0): the unit
    of the wait-time runs."""
    benchmark.group = "e2e-wait"
    suite.measure(benchmark, "production", "mmloader", "local",
                  suite.config("mmloader_pipe", "local", shard=suite.shard, step_ms=0.0))


def _wait_cases():
    return [(p, f) for p in ("mmloader", "dataloader") for f in WAIT_FACTORS]


@pytest.mark.parametrize("name,factor", _wait_cases(),
                         ids=[f"{p}-{f}" for p, f in _wait_cases()])
def test_wait_ratio(benchmark, suite, name, factor):
    """Wait-time ratio against the trainer step, in multiples of mmloader's batch
    production time (goal: <= 2% at 1.2x); the DataLoader at 1.2x too (at every step
    with --e2e-full)."""
    if name == "dataloader" and not suite.full and factor != 1.2:
        pytest.skip("not in this configuration (--e2e-full runs it)")
    prod = suite.find("production", "mmloader", "local")
    if prod is None:
        pytest.skip("no mmloader production time (test_production did not run or failed)")
    benchmark.group = "e2e-wait"
    prod_ms = 1000.0 * suite.batch_size / prod["samples_per_s"]
    step = factor * prod_ms
    module = "mmloader_pipe" if name == "mmloader" else "dataloader"
    suite.measure(benchmark, "wait", name, "local",
                  suite.config(module, "local", shard=suite.shard, step_ms=step),
                  factor=factor, step_ms=step, production_ms=prod_ms)
