"""mmloader.megatron.bridge: mmloader as the dataset of a Megatron-Bridge recipe.

Megatron-Bridge takes a dataset as ``cfg.dataset``: a ``DatasetProvider`` whose
``build_datasets(context)`` returns the train / valid / test datasets.  With
``dataloader_type="external"`` Bridge wraps each in its ``RerunDataIterator`` as it is, and
its forward steps (``vlm_step`` for Qwen2.5-VL, ``qwen3_vl_step`` for Qwen3-VL) call ``next``
on every rank (no tensor-parallel broadcast; every pipeline stage reads).  Five lines of a
Qwen-VL recipe::

    from mmloader.megatron.bridge import MMLoaderDataset

    cfg = qwen25_vl_7b_sft_config()          # or qwen3_vl_8b_sft_config()
    cfg.dataset = MMLoaderDataset(
        data="s3://bucket/sft/*.jsonl", model_dir="/models/Qwen2.5-VL-7B-Instruct",
        preset="qwen2.5-vl", seq_length=cfg.model.seq_length, seed=cfg.rng.seed)

What the batches hold (the keys and dtypes ``vlm_step`` / ``qwen3_vl_step`` read):
``tokens`` int64 ``[B, L]``, ``labels`` int64 (shifted, -100 where not trained),
``loss_mask`` float32, ``position_ids`` int64 ``[B, L]`` (the Qwen-VL models compute M-RoPE
themselves) and ``visual_inputs``: a Bridge ``GenericVisualInputs`` with ``pixel_values``
float32 ``[patches, patch_dim]`` and ``image_grid_thw`` int64 ``[images, 3]`` (None without
images), ``pixel_values_videos`` float32 ``[video patches, patch_dim]``, ``video_grid_thw``
int64 ``[videos, 3]`` and, Qwen2.5-VL, ``second_per_grid_ts`` float32 ``[videos]`` (None
without videos), or None for a batch with neither.  With ``packing=True`` (``vlm_step`` only: ``qwen3_vl_step`` refuses
collate-time packing and packs in the step) a batch is one ``[1, seq_length]`` row plus
Bridge's packed layout: ``cu_seqlens_q`` / ``cu_seqlens_kv`` (real boundaries),
``cu_seqlens_q_padded`` / ``cu_seqlens_kv_padded`` (slot boundaries covering the row), all
int32, and ``max_seqlen_q`` / ``max_seqlen_kv`` (int32 scalars).

Where the batches are: on the current CUDA device when there is one (``device`` in
``loader_kwargs`` overrides it), copied there with ``pixel_values`` and ``pixel_values_videos``
as uint8 patches and expanded on the device into exactly the float32 values
(``mmloader.torch.Loader``'s default ``pixel_format="float32-consumer"`` with a CUDA device;
``loader_kwargs={"pixel_format": "float32"}`` copies float32).

Where the settings come from: data-parallel rank and size from ``context.pg_collection.dp``
(context-parallel and tensor-parallel ranks of a data-parallel rank read the same batches),
micro-batch size from Bridge's ``cfg.train.micro_batch_size`` (megatron-core's microbatch
calculator, which Bridge's setup initialises from it) unless given, ``seq_length`` and
``seed`` from the fields (the recipe's ``cfg.model.seq_length`` and ``cfg.rng.seed``), and
``pad_to_multiple`` (packing) from the context-parallel size (``2 * cp``).

Resume: the train iterator has ``save_state`` / ``restore_state``, which Bridge's own
dataloader checkpointing calls (``checkpointing.maybe_save_dataloader_state`` at every
checkpoint into ``dataloader_save``, default ``<checkpoint.save>/energon``, and
``maybe_load_dataloader_state`` on resume), so a resumed run continues with exactly the next
batch; and Energon's ``save_state_rank`` / ``restore_state_rank`` / ``save_state_global`` /
``restore_state_global`` over the data-parallel group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from megatron.bridge.data.base import DatasetBuildContext, DatasetProvider
from megatron.bridge.training.utils.visual_inputs import GenericVisualInputs

from .._options import DEFAULTS
from .state import Loader
from . import default_device

__all__ = ["MMLoaderDataset", "BridgeBatches"]

_PACKED = (
    ("cu_seqlens", ("cu_seqlens_q", "cu_seqlens_kv")),
    ("cu_seqlens_padded", ("cu_seqlens_q_padded", "cu_seqlens_kv_padded")),
    ("max_seqlen", ("max_seqlen_q", "max_seqlen_kv")),
)


_VIDEO_KEYS = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


def visual_inputs(b: Dict[str, Any]) -> Optional[GenericVisualInputs]:
    """The batch's images and videos as Bridge's ``GenericVisualInputs``: ``pixel_values`` /
    ``image_grid_thw`` unless the batch has only the text-only placeholder (grid of zeros),
    ``pixel_values_videos`` / ``video_grid_thw`` (+ ``second_per_grid_ts``, Qwen2.5-VL) when
    it has videos; None for a batch with neither."""
    grid = b.get("image_grid_thw")
    images = grid is not None and int(grid[0, 0]) != 0
    videos = {k: b[k] for k in _VIDEO_KEYS if k in b}
    if not images and not videos:
        return None
    if images:
        videos.update(pixel_values=b["pixel_values"], image_grid_thw=grid)
    return GenericVisualInputs(**videos)


class BridgeBatches:
    """An iterator of batches in the layout of Bridge's VLM steps, over an
    :class:`mmloader.torch.Loader` (``.loader``) whose state it saves and restores."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return self

    def __next__(self) -> Dict[str, Any]:
        b = next(self.loader)
        out: Dict[str, Any] = {k: b[k] for k in ("tokens", "labels", "loss_mask", "position_ids")}
        out["visual_inputs"] = visual_inputs(b)
        for ours, names in _PACKED:
            if ours in b:
                v = b[ours].reshape(()) if ours == "max_seqlen" else b[ours]
                out.update((n, v) for n in names)
        return out

    # Megatron-Bridge's dataloader checkpointing (iterable.save_state / restore_state)
    def save_state(self) -> Dict[str, Any]:
        return self.loader.state_dict()

    def restore_state(self, state: Dict[str, Any]) -> None:
        self.loader.load_state_dict(state)

    # Energon's names
    def save_state_rank(self) -> Dict[str, Any]:
        return self.loader.save_state_rank()

    def restore_state_rank(self, state: Optional[Dict[str, Any]]) -> None:
        self.loader.restore_state_rank(state)

    def save_state_global(self, global_dst_rank: int = 0) -> Optional[List[Dict[str, Any]]]:
        return self.loader.save_state_global(global_dst_rank)

    def restore_state_global(self, state: Any, *, src_rank: Optional[int] = None) -> None:
        self.loader.restore_state_global(state, src_rank=src_rank)

    def close(self) -> None:
        self.loader.close()


@dataclass(kw_only=True)
class MMLoaderDataset(DatasetProvider):
    """A Megatron-Bridge ``DatasetProvider`` (``cfg.dataset``) of mmloader batches.

    Args:
        data: training data (paths, globs, folders, ``http(s)://`` / ``s3://`` URLs).
        seq_length: padded row length, or the pack length with ``packing`` (the recipe's
            ``cfg.model.seq_length``).
        valid_data: validation data; None: no validation dataset.
        model_dir, preset: tokenizer and vision settings (see :class:`mmloader.Loader`).
        micro_batch_size: default: Bridge's ``cfg.train.micro_batch_size``; when given it
            must equal it.
        seed: shuffling seed (the recipe's ``cfg.rng.seed``).
        packing: collate-time packing in Bridge's layout (``vlm_step``; ``qwen3_vl_step``
            refuses it).
        pad_to_multiple: packed slot rounding; default ``2 * cp`` with context parallelism.
        loader_kwargs: further :class:`mmloader.Loader` arguments (``num_threads``,
            ``max_pixels``, ``image_root``, ...).
    """

    data: Any
    seq_length: int
    valid_data: Any = None
    model_dir: Optional[str] = None
    preset: str = DEFAULTS["preset"]
    micro_batch_size: Optional[int] = None
    seed: int = 1234
    packing: bool = DEFAULTS["packing"]
    pad_to_multiple: Optional[int] = None
    loader_kwargs: Dict[str, Any] = field(default_factory=dict)
    dataloader_type: Optional[str] = "external"
    skip_getting_attention_mask_from_dataset: bool = True

    def finalize(self) -> None:
        super().finalize()
        if self.dataloader_type != "external":
            raise ValueError(
                "MMLoaderDataset batches itself: dataloader_type must be "
                f"'external', got {self.dataloader_type!r}"
            )

    def build_datasets(self, context: DatasetBuildContext) -> Tuple[Any, Any, Any]:
        """Train and validation batch iterators for this rank (every rank reads its own)."""
        kw = self._loader_kwargs(context)
        dp = context.pg_collection.dp if context.pg_collection is not None else None
        out: List[Any] = []
        for data, samples, extra in (
            (self.data, context.train_samples, {}),
            (self.valid_data, context.valid_samples, {"shuffle": False}),
        ):
            if data is None or not samples:
                out.append(None)
                continue
            loader = Loader(data, **{**kw, **extra})
            loader.dp_group = dp
            out.append(BridgeBatches(loader))
        return out[0], out[1], None

    def _loader_kwargs(self, context: DatasetBuildContext) -> Dict[str, Any]:
        mbs = _bridge_micro_batch_size()
        if self.micro_batch_size is not None and mbs is not None and mbs != self.micro_batch_size:
            raise ValueError(
                f"MMLoaderDataset.micro_batch_size ({self.micro_batch_size}) must "
                f"equal train.micro_batch_size ({mbs})"
            )
        mbs = self.micro_batch_size or mbs
        if mbs is None:
            raise ValueError(
                "MMLoaderDataset: no micro-batch size: Bridge's microbatch "
                "calculator is not initialised and micro_batch_size is unset"
            )
        pgs = context.pg_collection
        dp_rank, dp_size = (pgs.dp.rank(), pgs.dp.size()) if pgs is not None else (0, 1)
        cp = pgs.cp.size() if pgs is not None and getattr(pgs, "cp", None) is not None else 1
        kw: Dict[str, Any] = dict(
            model_dir=self.model_dir,
            preset=self.preset,
            micro_batch_size=mbs,
            seed=self.seed,
            dp_rank=dp_rank,
            dp_size=dp_size,
            keys="megatron",
            shift_labels=True,
            attention_mask=False,
            mrope=False,
            cycle=True,
            text_only_vision="placeholder",
            packing=self.packing,
            device=default_device(),
        )
        if self.packing:
            kw.update(
                pack_length=self.seq_length,
                seq_length=None,
                pad_to_multiple=self.pad_to_multiple or (2 * cp if cp > 1 else None),
            )
        else:
            kw["seq_length"] = self.seq_length
        kw.update(self.loader_kwargs)
        return kw


def _bridge_micro_batch_size() -> Optional[int]:
    try:
        from megatron.core.num_microbatches_calculator import get_micro_batch_size

        return int(get_micro_batch_size())
    except (AssertionError, AttributeError, TypeError, ImportError):
        return None
