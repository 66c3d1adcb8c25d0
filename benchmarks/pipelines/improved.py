"""The case study's improved pipeline, reproduced on one machine: asyncio fetching (aiohttp,
many requests in flight), process workers for decode/preprocess/tokenize (the samples come
back pickled), and a prefetch thread that keeps `prefetch` collated batches ahead of the
trainer.  Output order is the record order."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures as cf
import multiprocessing as mp
import queue
import threading
import time
from typing import Any, Deque, Dict, Iterator, List, Optional

import numpy as np

from .common import Config, preload, Worker, collate, load_records, parse_record

_worker: Optional[Worker] = None


def available() -> Optional[str]:
    try:
        import aiohttp  # noqa: F401
    except ImportError as e:
        return f"aiohttp is not installed ({e})"
    return None


def _init(cfg: Config) -> None:
    global _worker
    _worker = Worker(cfg)
    _worker.processor, _worker.tokenizer  # build both before the first sample


def _ready(_: int) -> int:
    time.sleep(0.05)
    return 0


def _process(shard: str, line: str, blobs: List[bytes]) -> Dict[str, np.ndarray]:
    assert _worker is not None
    return _worker.process(shard, line, blobs)


_END = object()


class Pipeline:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.records = load_records(cfg)
        workers = int(cfg.get("workers") or cfg["threads"])
        self.pool = cf.ProcessPoolExecutor(
            workers, mp_context=mp.get_context("fork"), initializer=_init, initargs=(cfg,)
        )
        # start every worker now, before the prefetch thread exists (fork is not thread-safe)
        list(self.pool.map(_ready, range(workers)))
        self.queue: "queue.Queue[Any]" = queue.Queue(maxsize=cfg["prefetch"])
        self.stop = threading.Event()
        self.thread: Optional[threading.Thread] = None
        self.window = workers * 2 + cfg["batch_size"]  # samples fetched/processing at once

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        self.thread = threading.Thread(target=self._run, name="prefetch", daemon=True)
        self.thread.start()
        while True:
            item = self.queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    # --- the prefetch thread

    def _put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            asyncio.run(self._produce())
            self._put(_END)
        except BaseException as e:  # hand the failure to the consumer
            self._put(e)

    async def _produce(self) -> None:
        import aiohttp

        loop = asyncio.get_running_loop()
        conn = aiohttp.TCPConnector(limit=self.cfg["inflight"])
        async with aiohttp.ClientSession(connector=conn) as session:

            async def get(loc: str) -> bytes:
                if "://" in loc:
                    async with session.get(loc) as r:
                        r.raise_for_status()
                        return await r.read()
                return await loop.run_in_executor(None, _read_file, loc)

            async def sample(shard: str, line: str) -> Dict[str, np.ndarray]:
                _, locs = parse_record(shard, line)
                blobs = list(await asyncio.gather(*(get(x) for x in locs)))
                return await loop.run_in_executor(self.pool, _process, shard, line, blobs)

            pending: Deque["asyncio.Task[Dict[str, np.ndarray]]"] = collections.deque()
            batch: List[Dict[str, np.ndarray]] = []
            it = iter(self.records)
            while True:
                while len(pending) < self.window:
                    nxt = next(it, None)
                    if nxt is None:
                        break
                    pending.append(asyncio.ensure_future(sample(*nxt)))
                if not pending:
                    break
                batch.append(await pending.popleft())
                if len(batch) == self.cfg["batch_size"]:
                    out = collate(batch)
                    batch = []
                    if not await loop.run_in_executor(None, self._put, out):
                        return
            if batch:
                await loop.run_in_executor(None, self._put, collate(batch))

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=30)
        self.pool.shutdown(wait=True, cancel_futures=True)


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


__all__ = ["available", "build", "preload"]


def build(cfg: Config) -> Pipeline:
    return Pipeline(cfg)
