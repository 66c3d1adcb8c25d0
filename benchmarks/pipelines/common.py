"""The per-sample work every peer pipeline does, written the way a Python training script does it.

One sample = one JSONL record: fetch the record's images (local file or HTTP GET), decode
them with PIL, run the transformers Qwen2-VL image processor (PIL backend), render the
Qwen2.5-VL chat template with each image placeholder expanded to its token count, tokenize
the whole string with the transformers tokenizer, and label the assistant turns.  A batch is
`collate()` of `batch_size` samples: right-padded input_ids / labels / attention_mask plus
the concatenated pixel_values and image_grid_thw, as torch tensors (the keys mmloader emits).

The naive, DataLoader, case-study, SPDL and Ray Data pipelines all call these functions, so
they differ only in how they schedule the same work.  Settings come from one plain dict
(`Config`), which crosses process boundaries as JSON.
"""

from __future__ import annotations

import io
import json
import os
import urllib.parse
import urllib.request
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

IGNORE_INDEX = -100
PAD_ID = 151643  # <|endoftext|>
DEFAULT_SYSTEM = "You are a helpful assistant."
IMAGE_TAG = "<image>"

Config = Dict[str, Any]


def default_tokenizer_file() -> Tuple[str, str]:
    """(path to tokenizer.json, which one) — $MML_BENCH_TOKENIZER, else the real Qwen
    tokenizer when shared/ has it, else the tiny one mmloader ships."""
    if os.environ.get("MML_BENCH_TOKENIZER"):
        path = os.environ["MML_BENCH_TOKENIZER"]
        return path, ("qwen3" if "qwen3-tokenizer" in path else os.path.basename(path))
    real = os.path.join(REPO_ROOT, "..", "shared", "data", "qwen3-tokenizer", "tokenizer.json")
    if os.path.exists(real):
        return os.path.abspath(real), "qwen3"
    tiny = os.path.join(REPO_ROOT, "mmloader", "data", "tiny-tokenizer.json")
    return tiny, "tiny"


def make_config(shards: Sequence[str], **kw: Any) -> Config:
    """The settings every pipeline reads; `shards` are JSONL paths or http(s) URLs."""
    tok, _ = default_tokenizer_file()
    cfg: Config = dict(
        shards=list(shards),
        limit=0,
        batch_size=8,
        threads=os.cpu_count() or 1,
        inflight=64,
        prefetch=4,
        tokenizer=tok,
        min_pixels=3136,
        max_pixels=12845056,
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
    )
    cfg.update(kw)
    return cfg


def preload(cfg: Config) -> None:
    """Imports what the Python peers use (outside the timed region)."""
    import PIL.Image  # noqa: F401
    import transformers  # noqa: F401
    from transformers import PreTrainedTokenizerFast  # noqa: F401
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl  # noqa: F401


# ----------------------------------------------------------------------------- records


def _read_source(src: str) -> bytes:
    if src.startswith(("http://", "https://")):
        with urllib.request.urlopen(src, timeout=60) as r:
            return r.read()
    with open(src, "rb") as f:
        return f.read()


def _resolve(base: str, ref: str) -> str:
    """An image reference as the loader resolves it: absolute stays, relative is relative
    to the shard's folder (or URL)."""
    if "://" in ref or os.path.isabs(ref):
        return ref
    if "://" in base:
        return urllib.parse.urljoin(base, ref)
    return os.path.join(os.path.dirname(base), ref)


def load_records(cfg: Config) -> List[Tuple[str, str]]:
    """The first `limit` records (0: all) of the shards, in order, as (shard, JSON line)."""
    out: List[Tuple[str, str]] = []
    limit = int(cfg.get("limit") or 0)
    for shard in cfg["shards"]:
        for line in _read_source(shard).decode("utf-8").splitlines():
            if line.strip():
                out.append((shard, line))
                if limit and len(out) >= limit:
                    return out
    return out


def parse_record(shard: str, line: str) -> Tuple[List[Dict[str, Any]], List[str]]:
    """(messages, image locations).  messages: [{"role", "parts": [str | int image index]}].

    Accepts LLaVA ("conversations"/"image"), messages + "images", and HF content parts."""
    rec = json.loads(line)
    images: List[str] = []
    if "conversations" in rec:
        img = rec.get("image") or rec.get("images") or []
        images = [img] if isinstance(img, str) else list(img)
        roles = {"human": "user", "gpt": "assistant", "system": "system"}
        msgs = [
            {"role": roles.get(m["from"], m["from"]), "content": m["value"]}
            for m in rec["conversations"]
        ]
    else:
        images = list(rec.get("images") or [])
        msgs = rec["messages"]
    out: List[Dict[str, Any]] = []
    next_tag = 0
    for m in msgs:
        content = m["content"]
        parts: List[Any] = []
        if isinstance(content, str):
            pieces = content.split(IMAGE_TAG)
            for k, piece in enumerate(pieces):
                if k:
                    parts.append(next_tag)
                    next_tag += 1
                if piece:
                    parts.append(piece)
        else:
            for p in content:
                if p.get("type") == "image":
                    ref = p.get("image") or p.get("url") or p.get("path")
                    images.append(ref)
                    parts.append(len(images) - 1)
                    next_tag += 1
                else:
                    parts.append(p["text"])
        out.append({"role": m["role"], "parts": parts})
    if next_tag != len(images):
        raise ValueError(f"{shard}: {next_tag} <image> tags for {len(images)} images")
    return out, [_resolve(shard, r) for r in images]


# ----------------------------------------------------------------------------- workers


class Worker:
    """Per-process state: the image processor and the tokenizer (built once, lazily)."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self._proc = None
        self._tok = None
        self._session = None

    @property
    def processor(self):
        if self._proc is None:
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
                Qwen2VLImageProcessorPil,
            )

            c = self.cfg
            self._proc = Qwen2VLImageProcessorPil(
                min_pixels=c["min_pixels"],
                max_pixels=c["max_pixels"],
                patch_size=c["patch_size"],
                merge_size=c["merge_size"],
                temporal_patch_size=c["temporal_patch_size"],
            )
        return self._proc

    @property
    def tokenizer(self):
        if self._tok is None:
            from transformers import PreTrainedTokenizerFast

            self._tok = PreTrainedTokenizerFast(tokenizer_file=self.cfg["tokenizer"])
        return self._tok

    # --- the four steps of a sample

    def fetch(self, loc: str) -> bytes:
        if "://" in loc:
            if self._session is None:
                import requests  # keep-alive connection pool, as a training script would

                self._session = requests.Session()
            r = self._session.get(loc, timeout=60)
            r.raise_for_status()
            return r.content
        with open(loc, "rb") as f:
            return f.read()

    def process(
        self, shard: str, line: str, blobs: Optional[List[bytes]] = None
    ) -> Dict[str, np.ndarray]:
        """One sample, from record line (and, when given, its fetched image bytes)."""
        from PIL import Image

        messages, locs = parse_record(shard, line)
        if blobs is None:
            blobs = [self.fetch(loc) for loc in locs]
        pixel_values = np.zeros(
            (0, 3 * self.cfg["temporal_patch_size"] * self.cfg["patch_size"] ** 2), np.float32
        )
        grid = np.zeros((0, 3), np.int64)
        if blobs:
            imgs = [Image.open(io.BytesIO(b)).convert("RGB") for b in blobs]
            out = self.processor(images=imgs, return_tensors="np")
            pixel_values = np.asarray(out["pixel_values"], np.float32)
            grid = np.asarray(out["image_grid_thw"], np.int64)
        merge2 = self.cfg["merge_size"] ** 2
        counts = [int(np.prod(g)) // merge2 for g in grid]
        ids, labels = self.encode(messages, counts)
        return {
            "input_ids": ids,
            "labels": labels,
            "pixel_values": pixel_values,
            "image_grid_thw": grid,
        }

    def encode(
        self, messages: List[Dict[str, Any]], image_tokens: List[int]
    ) -> Tuple[np.ndarray, np.ndarray]:
        """Qwen2.5-VL template, whole-string tokenization, labels on assistant turns
        (content and its closing <|im_end|>\\n)."""
        text: List[str] = []
        spans: List[Tuple[int, int]] = []
        pos = 0

        def put(s: str) -> None:
            nonlocal pos
            text.append(s)
            pos += len(s)

        if not messages or messages[0]["role"] != "system":
            put(f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n")
        for m in messages:
            put(f"<|im_start|>{m['role']}\n")
            start = pos
            for p in m["parts"]:
                if isinstance(p, int):
                    put("<|vision_start|>" + "<|image_pad|>" * image_tokens[p] + "<|vision_end|>")
                else:
                    put(p)
            put("<|im_end|>\n")
            if m["role"] == "assistant":
                spans.append((start, pos))
        enc = self.tokenizer("".join(text), add_special_tokens=False, return_offsets_mapping=True)
        ids = np.asarray(enc["input_ids"], np.int64)
        labels = np.full_like(ids, IGNORE_INDEX)
        starts = np.asarray([o[0] for o in enc["offset_mapping"]], np.int64)
        for a, b in spans:
            sel = (starts >= a) & (starts < b)
            labels[sel] = ids[sel]
        return ids, labels


def collate(samples: List[Dict[str, np.ndarray]]) -> Dict[str, Any]:
    """Right-pads to the longest sample; torch tensors with the keys mmloader emits."""
    import torch

    n = len(samples)
    length = max(len(s["input_ids"]) for s in samples)
    ids = torch.full((n, length), PAD_ID, dtype=torch.int64)
    labels = torch.full((n, length), IGNORE_INDEX, dtype=torch.int64)
    mask = torch.zeros((n, length), dtype=torch.int64)
    for i, s in enumerate(samples):
        k = len(s["input_ids"])
        ids[i, :k] = torch.from_numpy(s["input_ids"])
        labels[i, :k] = torch.from_numpy(s["labels"])
        mask[i, :k] = 1
    pv = torch.from_numpy(np.concatenate([s["pixel_values"] for s in samples]))
    grid = torch.from_numpy(np.concatenate([s["image_grid_thw"] for s in samples]))
    return {
        "input_ids": ids,
        "labels": labels,
        "attention_mask": mask,
        "pixel_values": pv,
        "image_grid_thw": grid,
    }


def batched(items: Iterator[Any], size: int) -> Iterator[List[Any]]:
    buf: List[Any] = []
    for x in items:
        buf.append(x)
        if len(buf) == size:
            yield buf
            buf = []
    if buf:
        yield buf
