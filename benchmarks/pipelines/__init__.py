"""Peer pipelines for the end-to-end benchmark (benchmarks/bench_e2e.py).

Each module exposes `available() -> Optional[str]` (None, or why it cannot run here) and
`build(cfg) -> Pipeline`, an iterable of batches with `close()`.  They all do the work in
common.py; runner.py measures one of them in a fresh process.
"""

PIPELINES = ("naive", "dataloader", "improved", "spdl", "ray", "mmloader")
