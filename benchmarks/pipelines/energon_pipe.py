"""Megatron-Energon doing the same work: the same records and images written as WebDataset
tar shards and `energon prepare`d (CrudeWebdataset), a TaskEncoder whose cooker runs the
same per-sample code as every Python peer (PIL decode, transformers' Qwen2-VL image
processor, template + tokenizer: common.Worker) on the raw image bytes, Energon's own
worker processes (`threads` of them) and batching, `get_loader` with prefetch_factor 2.

A sample in the tars: `KEY.json` (the JSONL line, as is) and `KEY.imgN.EXT` (its N-th
image's bytes, in the record's order).  The training run uses get_train_dataset (infinite,
Energon's own slice shuffling; the runner stops on time); the same-work check uses
get_val_dataset without workers, which keeps the record order.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from typing import Any, Dict, Iterator, List, Optional

from .common import Config, Worker, collate, parse_record, preload as _preload

SHARDS = 8


def available() -> Optional[str]:
    try:
        import megatron.energon  # noqa: F401
    except ImportError as e:
        return f"megatron-energon is not installed ({e}); `pip install megatron-energon`"
    return None


def preload(cfg: Config) -> None:
    _preload(cfg)
    import megatron.energon  # noqa: F401


def prepare(shard: str) -> str:
    """Writes `shard`'s records as WebDataset tars beside it and runs `energon prepare` on
    them (once; cached); returns the dataset folder."""
    root = shard[: -len(".jsonl")] + ".energon"
    done = os.path.join(root, ".nv-meta", "dataset.yaml")
    if os.path.exists(done):
        return root
    os.makedirs(root, exist_ok=True)
    with open(shard, encoding="utf-8") as f:
        lines = [ln.rstrip("\n") for ln in f if ln.strip()]
    per = -(-len(lines) // SHARDS)
    for s in range(SHARDS):
        with tarfile.open(os.path.join(root, f"shard-{s:06d}.tar"), "w") as tar:
            for i in range(s * per, min(len(lines), (s + 1) * per)):
                _, locs = parse_record(shard, lines[i])
                members = [(f"{i:08d}.json", lines[i].encode("utf-8"))]
                for k, loc in enumerate(locs):
                    with open(loc, "rb") as f:
                        members.append((f"{i:08d}.img{k}{os.path.splitext(loc)[1]}", f.read()))
                for name, data in members:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    cmd = [
        sys.executable,
        "-c",
        "from megatron.energon.cli.main import main; main()",
        "prepare",
        root,
        "--non-interactive",
        "--no-progress",
        "--split-parts",
        r"train:shard-.*\.tar",
        "--split-parts",
        r"val:shard-.*\.tar",
        "--sample-type",
        "CrudeWebdataset",
        "--num-workers",
        "2",
        "--force-overwrite",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode or not os.path.exists(done):
        raise RuntimeError(
            f"energon prepare failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}"
        )
    return root


def _task_encoder(cfg: Config, shard: str):
    from megatron.energon import Cooker, DefaultTaskEncoder, stateless

    worker = Worker(cfg)

    @stateless
    def cook(crude: Dict[str, Any]) -> Dict[str, Any]:
        line = crude["json"]
        line = line.decode("utf-8") if isinstance(line, bytes) else line
        _, locs = parse_record(shard, line)
        blobs = [crude[f"img{k}{os.path.splitext(loc)[1]}"] for k, loc in enumerate(locs)]
        return worker.process(shard, line, blobs)

    class TaskEncoder(DefaultTaskEncoder):
        """Raw bytes in (no Energon image decoding: the HF processor path decodes), the
        mmloader batch keys out."""

        decoder = None
        cookers = [Cooker(cook)]

        def encode_sample(self, sample: Dict[str, Any]) -> Dict[str, Any]:
            return sample

        def batch(self, samples: List[Dict[str, Any]]) -> Dict[str, Any]:
            return collate(samples)

        def encode_batch(self, batch: Dict[str, Any]) -> Dict[str, Any]:
            return batch

    return TaskEncoder()


class Pipeline:
    def __init__(self, cfg: Config, ordered: bool = False):
        from megatron.energon import WorkerConfig, get_loader, get_train_dataset, get_val_dataset

        shard = cfg["shards"][0]
        if len(cfg["shards"]) != 1 or "://" in shard:
            raise ValueError("the Energon peer reads one local shard (its prepared tars)")
        root = prepare(shard)
        workers = 0 if ordered else int(cfg.get("workers") or cfg["threads"])
        wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
        te = _task_encoder(cfg, shard)
        bs = int(cfg["batch_size"])
        if ordered:
            ds = get_val_dataset(
                root, split_part="val", worker_config=wc, batch_size=bs, task_encoder=te
            )
        else:
            ds = get_train_dataset(
                root,
                split_part="train",
                worker_config=wc,
                batch_size=bs,
                shuffle_buffer_size=None,
                max_samples_per_sequence=None,
                task_encoder=te,
            )
        self.loader = get_loader(ds, prefetch_factor=2)
        self._it = None

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        self._it = iter(self.loader)
        return self._it

    def close(self) -> None:
        it, self._it = self._it, None
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()


__all__ = ["available", "build", "preload", "prepare"]


def build(cfg: Config) -> Pipeline:
    return Pipeline(cfg)


def parity_build(cfg: Config) -> Pipeline:
    return Pipeline(cfg, ordered=True)
