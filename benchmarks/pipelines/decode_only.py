"""The decode-only cost of the run's images: the floor under any pipeline's CPU per sample.

Record by record (the same records, in the same order, as the pipelines), one thread:
read each image file and decode it to RGB8 rows with mmloader's decoders
(`_core.decode_only`: libjpeg-turbo / libpng / ..., rows discarded: no output buffer, no
resize), and, for reference, with Pillow (`Image.open(...).convert("RGB")`, what the Python
peers start from).  CPU seconds per sample = process CPU time over the samples, repeated
over the records until at least `min_samples` samples and `min_seconds` of CPU; `repeats`
such measurements, the two decoders alternating, in this one process (the result's
"runs"; its top level is the first).
"""

from __future__ import annotations

import io
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


def measure(cfg: Config) -> Dict[str, Any]:
    from PIL import Image

    from mmloader import _core

    samples = _images(cfg)  # file reads outside the clock: the page cache holds them anyway
    min_samples = int(cfg.get("min_samples") or len(samples))
    min_seconds = float(cfg.get("min_seconds") or 0.0)

    def pil(blobs: List[bytes]) -> None:
        for b in blobs:
            Image.open(io.BytesIO(b)).convert("RGB")

    def mml(blobs: List[bytes]) -> None:
        if blobs:
            _core.decode_only(blobs)

    runs = []
    for _ in range(max(1, int(cfg.get("repeats") or 1))):  # alternating, one process
        mine = _cpu_per_sample(samples, mml, min_samples, min_seconds)
        ref = _cpu_per_sample(samples, pil, min_samples, min_seconds)
        runs.append(
            {
                "cpu_s_per_sample": mine["cpu_s_per_sample"],
                "samples": mine["samples"],
                "pil_cpu_s_per_sample": ref["cpu_s_per_sample"],
                "images": sum(len(b) for b in samples),
                "records": len(samples),
            }
        )
    return {**runs[0], "runs": runs}
