"""The decode-only cost of the run's images: the floor under any pipeline's CPU per sample.

Record by record (the same records, in the same order, as the pipelines): read each image
file and decode it to RGB8 rows with mmloader's decoders (`_core.decode_only`:
libjpeg-turbo / libpng / ..., rows discarded: no output buffer, no resize), and, for
reference, with Pillow (`Image.open(...).convert("RGB")`, what the Python peers start from).
CPU seconds per sample = process CPU time (all threads) over the samples, repeated over the
records until at least `min_samples` samples and `min_seconds` of CPU (Pillow:
`pil_min_seconds`).

mmloader's decoders run twice: on one thread (`cpu_s_per_sample`: a sample's decode cost
with the machine to itself) and on `threads` threads at once, the pipeline's thread count
(`threaded_cpu_s_per_sample`, and `threaded_samples_per_s`, the wall-clock rate: the
fastest any loader could decode these images with that many threads).  The second is the
floor of a pipeline that decodes on `threads` threads: cores decoding at once share the
caches and memory bandwidth (and on a VM possibly more), so each decode costs more CPU
than alone; `_core.decode_only` releases the GIL, so the threads decode concurrently.
`repeats` such measurements, the decoders alternating, in this one process (the result's
"runs"; its top level is the first).
"""

from __future__ import annotations

import io
import threading
import time
from typing import Any, Callable, Dict, List

from .common import Config, load_records, parse_record


def _images(cfg: Config) -> List[List[bytes]]:
    out = []
    for shard, line in load_records(cfg):
        _, locs = parse_record(shard, line)
        blobs = []
        for loc in locs:
            with open(loc, "rb") as f:
                blobs.append(f.read())
        out.append(blobs)
    return out


def _cpu_per_sample(
    samples: List[List[bytes]],
    fn: Callable[[List[bytes]], Any],
    min_samples: int,
    min_seconds: float,
) -> Dict[str, float]:
    n = 0
    c0 = time.process_time()
    while True:
        for blobs in samples:
            fn(blobs)
            n += 1
        cpu = time.process_time() - c0
        if n >= min_samples and cpu >= min_seconds:
            return {"cpu_s_per_sample": cpu / n, "samples": n}


def _threaded_cpu_per_sample(
    samples: List[List[bytes]],
    fn: Callable[[List[bytes]], Any],
    threads: int,
    min_samples: int,
    min_seconds: float,
) -> Dict[str, float]:
    """As _cpu_per_sample, the records shared out among `threads` threads at once (each
    takes the next record; a pass ends when all are done)."""
    n = 0
    lock = threading.Lock()
    c0, t0 = time.process_time(), time.perf_counter()
    while True:
        todo = iter(samples)

        def work() -> None:
            nonlocal n
            while True:
                with lock:
                    blobs = next(todo, None)
                if blobs is None:
                    return
                fn(blobs)
                with lock:
                    n += 1

        pool = [threading.Thread(target=work) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        cpu = time.process_time() - c0
        if n >= min_samples and cpu >= min_seconds:
            return {
                "cpu_s_per_sample": cpu / n,
                "samples": n,
                "samples_per_s": n / (time.perf_counter() - t0),
            }


def measure(cfg: Config) -> Dict[str, Any]:
    from PIL import Image

    from mmloader import _core

    samples = _images(cfg)  # file reads outside the clock: the page cache holds them anyway
    min_samples = int(cfg.get("min_samples") or len(samples))
    min_seconds = float(cfg.get("min_seconds") or 0.0)
    # Pillow is a reference figure only: one pass over the records is enough
    pil_min_seconds = float(cfg.get("pil_min_seconds", min_seconds) or 0.0)

    def pil(blobs: List[bytes]) -> None:
        for b in blobs:
            Image.open(io.BytesIO(b)).convert("RGB")

    def mml(blobs: List[bytes]) -> None:
        if blobs:
            _core.decode_only(blobs)

    threads = max(1, int(cfg.get("threads") or 1))
    runs = []
    for _ in range(max(1, int(cfg.get("repeats") or 1))):  # alternating, one process
        mine = _cpu_per_sample(samples, mml, min_samples, min_seconds)
        many = _threaded_cpu_per_sample(samples, mml, threads, min_samples, min_seconds)
        ref = _cpu_per_sample(samples, pil, min_samples, pil_min_seconds)
        runs.append(
            {
                "cpu_s_per_sample": mine["cpu_s_per_sample"],
                "samples": mine["samples"],
                "threads": threads,
                "threaded_cpu_s_per_sample": many["cpu_s_per_sample"],
                "threaded_samples": many["samples"],
                "threaded_samples_per_s": many["samples_per_s"],
                "pil_cpu_s_per_sample": ref["cpu_s_per_sample"],
                "images": sum(len(b) for b in samples),
                "records": len(samples),
            }
        )
    return {**runs[0], "runs": runs}
