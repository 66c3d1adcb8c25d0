"""SPDL (Meta's thread-based data loading) doing the same work: an async fetch stage with
`inflight` requests in flight (aiohttp), a decode/preprocess/tokenize stage on `threads`
threads (SPDL's model: no worker processes, rely on libraries releasing the GIL),
aggregation into batches, a collate stage and a sink buffer of `prefetch` batches."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .common import Config, preload, Worker, collate, load_records, parse_record


def available() -> Optional[str]:
    try:
        import aiohttp  # noqa: F401
        import spdl.pipeline  # noqa: F401
    except ImportError as e:
        return f"spdl is not installed ({e}); `pip install spdl`"
    return None


class Pipeline:
    def __init__(self, cfg: Config):
        from spdl.pipeline import PipelineBuilder

        self.cfg = cfg
        self.records = load_records(cfg)
        self.worker = Worker(cfg)  # shared by the threads (processor and tokenizer are)
        self.worker.processor, self.worker.tokenizer
        self._session = None
        threads = int(cfg["threads"])
        self.pipeline = (
            PipelineBuilder()
            .add_source(self.records)
            .pipe(self._fetch, concurrency=int(cfg["inflight"]), output_order="input")
            .pipe(self._process, concurrency=threads, output_order="input")
            .aggregate(int(cfg["batch_size"]))
            .pipe(collate)
            .add_sink(int(cfg["prefetch"]))
            .build(num_threads=threads + 1)
        )

    async def _fetch(self, rec: Tuple[str, str]) -> Tuple[str, str, List[bytes]]:
        shard, line = rec
        _, locs = parse_record(shard, line)
        if self._session is None and any("://" in x for x in locs):
            import aiohttp

            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=int(self.cfg["inflight"]))
            )

        async def get(loc: str) -> bytes:
            if "://" in loc:
                async with self._session.get(loc) as r:
                    r.raise_for_status()
                    return await r.read()
            return await asyncio.to_thread(_read_file, loc)

        return shard, line, list(await asyncio.gather(*(get(x) for x in locs)))

    def _process(self, item: Tuple[str, str, List[bytes]]) -> Dict[str, np.ndarray]:
        return self.worker.process(*item)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        self.pipeline.start()
        return iter(self.pipeline.get_iterator(timeout=600))

    def close(self) -> None:
        self.pipeline.stop()


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


__all__ = ["available", "build", "preload"]


def build(cfg: Config) -> Pipeline:
    return Pipeline(cfg)
