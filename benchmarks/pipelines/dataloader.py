"""The PyTorch DataLoader baseline: the same per-sample code as a map-style Dataset, one
worker process per core, pinned memory, the usual prefetch_factor=2."""

from __future__ import annotations

import warnings
from typing import Any, Dict, Iterator, List, Optional

import numpy as np

from .common import Config, preload, Worker, collate, load_records


def available() -> Optional[str]:
    try:
        import torch.utils.data  # noqa: F401
    except ImportError as e:  # pragma: no cover - torch is a test requirement
        return f"torch is not installed ({e})"
    return None


class SampleDataset:
    """Map-style dataset: record index -> processed sample (numpy arrays)."""

    def __init__(self, cfg: Config):
        self.records = load_records(cfg)
        self.worker = Worker(cfg)  # each worker process builds its processor lazily

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> Dict[str, np.ndarray]:
        shard, line = self.records[i]
        return self.worker.process(shard, line)


def _collate(samples: List[Dict[str, np.ndarray]]) -> Dict[str, Any]:
    return collate(samples)


class Pipeline:
    def __init__(self, cfg: Config):
        import torch

        self.cfg = cfg
        self.dataset = SampleDataset(cfg)
        workers = int(cfg.get("workers") or cfg["threads"])
        # pin_memory needs an accelerator; on a CPU-only torch it is a no-op that warns.
        warnings.filterwarnings("ignore", message=".*pin_memory.*")
        self.loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_size=cfg["batch_size"],
            shuffle=False,
            num_workers=workers,
            collate_fn=_collate,
            pin_memory=True,
            prefetch_factor=2 if workers else None,
            persistent_workers=False,
        )
        self._it = None

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        self._it = iter(self.loader)
        return self._it

    def close(self) -> None:
        it, self._it = self._it, None
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()


__all__ = ["available", "build", "preload"]


def build(cfg: Config) -> Pipeline:
    return Pipeline(cfg)
