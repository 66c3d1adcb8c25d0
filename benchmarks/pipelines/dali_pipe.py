"""NVIDIA DALI's CPU pipeline doing the pixel work: decode, resize and normalise in DALI's
C++ worker threads (device_id=None: no GPU), the rest in the trainer process as a DALI
user writes it: the target size of each image from its header (Pillow reads only the
header; transformers' smart_resize), the HF patch layout (numpy), template + tokenizer
(common.Worker.encode), collate.

Per batch of `batch_size` records, an external source hands DALI the records' encoded
images and their target sizes; fn.decoders.image (RGB) -> fn.resize (cubic, antialiased)
-> fn.crop_mirror_normalize (float32, HWC, the processor's mean/std); DALI keeps
`prefetch` batches in flight.  DALI's cubic resize is not Pillow's: grids, ids and labels
equal the reference's, pixel values differ slightly (the same-work check reports by how
much).
"""

from __future__ import annotations

import collections
import io
from typing import Any, Deque, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .common import (
    Config,
    Worker,
    batched,
    collate,
    load_records,
    parse_record,
    preload as _preload,
)

MEAN = (0.48145466, 0.4578275, 0.40821073)  # OPENAI_CLIP_MEAN / STD, the Qwen2-VL processor's
STD = (0.26862954, 0.26130258, 0.27577711)


def available() -> Optional[str]:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError as e:
        return f"NVIDIA DALI is not installed ({e}); `pip install nvidia-dali-cuda120`"
    return None


def preload(cfg: Config) -> None:
    _preload(cfg)
    import nvidia.dali.fn  # noqa: F401
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize  # noqa


def _patchify(img: np.ndarray, cfg: Config) -> Tuple[np.ndarray, List[int]]:
    """HWC float32 (already resized and normalised) -> the processor's pixel_values rows
    and (t, h, w) grid."""
    p, m, tp = cfg["patch_size"], cfg["merge_size"], cfg["temporal_patch_size"]
    h, w, c = img.shape
    x = np.ascontiguousarray(img.transpose(2, 0, 1))[None]  # 1, C, H, W
    x = np.repeat(x, tp, axis=0)  # the processor tiles a still image over the T patch
    gt, gh, gw = 1, h // p, w // p
    x = x.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, c * tp * p * p), [gt, gh, gw]


class Pipeline:
    def __init__(self, cfg: Config):
        from nvidia.dali import fn, pipeline_def, types
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        self.cfg = cfg
        self.smart_resize = smart_resize
        self.worker = Worker(cfg)
        self.worker.tokenizer
        self.groups = batched(iter(load_records(cfg)), int(cfg["batch_size"]))
        self.fed: Deque[Tuple[List[Tuple[Any, List[int]]], int]] = collections.deque()
        self.dummy = self._dummy()
        bs = int(cfg["batch_size"])

        @pipeline_def(
            batch_size=4 * bs,
            num_threads=int(cfg["threads"]),
            device_id=None,
            prefetch_queue_depth=int(cfg["prefetch"]),
            exec_dynamic=True,
        )
        def graph():
            enc, size = fn.external_source(
                source=self._next, num_outputs=2, batch=True, dtype=[types.UINT8, types.FLOAT]
            )
            img = fn.decoders.image(enc, device="cpu", output_type=types.RGB)
            img = fn.resize(img, size=size, interp_type=types.INTERP_CUBIC, antialias=True)
            return fn.crop_mirror_normalize(
                img,
                dtype=types.FLOAT,
                output_layout="HWC",
                mean=[255 * v for v in MEAN],
                std=[255 * v for v in STD],
            )

        self.pipe = graph()
        self.pipe.build()

    @staticmethod
    def _dummy() -> np.ndarray:
        from PIL import Image

        b = io.BytesIO()
        Image.new("RGB", (28, 28)).save(b, "PNG")
        return np.frombuffer(b.getvalue(), np.uint8)

    def _next(self):
        """DALI's source: the encoded images of the next batch of records and their target
        sizes (a placeholder image when the batch has none: DALI needs one)."""
        from PIL import Image

        group = next(self.groups)  # StopIteration ends DALI's epoch
        c = self.cfg
        enc, size, samples = [], [], []
        for shard, line in group:
            messages, locs = parse_record(shard, line)
            for loc in locs:
                data = self.worker.fetch(loc)
                with Image.open(io.BytesIO(data)) as im:
                    w, h = im.size
                enc.append(np.frombuffer(data, np.uint8))
                size.append(
                    np.asarray(
                        self.smart_resize(
                            h,
                            w,
                            factor=c["patch_size"] * c["merge_size"],
                            min_pixels=c["min_pixels"],
                            max_pixels=c["max_pixels"],
                        ),
                        np.float32,
                    )
                )
            samples.append((messages, len(locs)))
        real = len(enc)
        if not real:
            enc, size = [self.dummy], [np.asarray([28, 28], np.float32)]
        self.fed.append((samples, real))
        return enc, size

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        merge2 = self.cfg["merge_size"] ** 2
        cols = 3 * self.cfg["temporal_patch_size"] * self.cfg["patch_size"] ** 2
        while True:
            try:
                (out,) = self.pipe.run()
            except StopIteration:
                return
            samples, real = self.fed.popleft()
            imgs = [np.asarray(out[i]) for i in range(real)]
            batch, k = [], 0
            for messages, n in samples:
                rows = [_patchify(imgs[k + j], self.cfg) for j in range(n)]
                k += n
                grid = np.asarray([g for _, g in rows], np.int64).reshape(-1, 3)
                pv = (
                    np.concatenate([r for r, _ in rows])
                    if rows
                    else np.zeros((0, cols), np.float32)
                )
                ids, labels = self.worker.encode(
                    messages, [int(np.prod(g)) // merge2 for g in grid]
                )
                batch.append(
                    {"input_ids": ids, "labels": labels, "pixel_values": pv, "image_grid_thw": grid}
                )
            yield collate(batch)

    def close(self) -> None:
        del self.pipe


__all__ = ["available", "build", "preload"]


def build(cfg: Config) -> Pipeline:
    return Pipeline(cfg)
