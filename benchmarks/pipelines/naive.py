"""The naive serial pipeline: per sample fetch, PIL decode, transformers processor,
transformers tokenizer/template, in the training process, one sample after another."""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

from .common import Config, preload, Worker, batched, collate, load_records


def available() -> Optional[str]:
    return None


class Pipeline:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.records = load_records(cfg)
        self.worker = Worker(cfg)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        samples = (self.worker.process(shard, line) for shard, line in self.records)
        for group in batched(samples, self.cfg["batch_size"]):
            yield collate(group)

    def close(self) -> None:
        pass


__all__ = ["available", "build", "preload"]


def build(cfg: Config) -> Pipeline:
    return Pipeline(cfg)
