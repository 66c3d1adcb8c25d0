"""Ray Data doing the same work: records as a dataset, the per-sample work in a map stage
run by `threads` actors (each holds its processor and tokenizer), iter_batches with
`prefetch` batches prefetched, collated in the trainer process.  Order is preserved."""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Optional

import numpy as np

from .common import REPO_ROOT, Config, preload, Worker, collate, load_records


def available() -> Optional[str]:
    try:
        import ray.data  # noqa: F401
    except ImportError as e:
        return f"ray[data] is not installed ({e}); `pip install \"ray[data]\"`"
    return None


class _Process:
    def __init__(self, cfg: Config):
        self.worker = Worker(cfg)

    def __call__(self, row: Dict[str, Any]) -> Dict[str, np.ndarray]:
        return self.worker.process(row["shard"], row["line"])


class Pipeline:
    def __init__(self, cfg: Config):
        import ray
        import ray.data

        self.cfg = cfg
        records = load_records(cfg)
        threads = int(cfg["threads"])
        path = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
        ray.init(
            num_cpus=threads,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            object_store_memory=256 << 20,
            runtime_env={"env_vars": {"PYTHONPATH": path}},
        )
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True
        ctx.enable_progress_bars = False
        self.ds = ray.data.from_items(
            [{"shard": s, "line": ln} for s, ln in records],
            override_num_blocks=max(1, len(records) // 4),
        ).map(_Process, fn_constructor_args=(cfg,), concurrency=threads)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        for cols in self.ds.iter_batches(
            batch_size=int(self.cfg["batch_size"]),
            batch_format="numpy",
            prefetch_batches=int(self.cfg["prefetch"]),
        ):
            n = len(cols["input_ids"])
            samples: List[Dict[str, np.ndarray]] = [
                {
                    k: np.asarray(cols[k][i])
                    for k in ("input_ids", "labels", "pixel_values", "image_grid_thw")
                }
                for i in range(n)
            ]
            for s in samples:  # zero-image samples come back with an empty first dimension
                s["pixel_values"] = s["pixel_values"].reshape(-1, _cols(self.cfg))
                s["image_grid_thw"] = s["image_grid_thw"].reshape(-1, 3)
            yield collate(samples)

    def close(self) -> None:
        import ray

        ray.shutdown()


def _cols(cfg: Config) -> int:
    return 3 * int(cfg["temporal_patch_size"]) * int(cfg["patch_size"]) ** 2


__all__ = ["available", "build", "preload"]


def build(cfg: Config) -> Pipeline:
    return Pipeline(cfg)
