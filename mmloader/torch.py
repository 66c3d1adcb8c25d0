"""mmloader.torch: a drop-in replacement for ``torch.utils.data.DataLoader``.

``mmloader.torch.Loader`` takes the same arguments as :class:`mmloader.Loader` and yields
``dict[str, torch.Tensor]``: every tensor is a zero-copy view (``torch.from_dlpack``) of the
loader's output buffer, which stays valid for as long as the tensor lives.  It offers the
interface of torchdata's ``StatefulDataLoader`` (``state_dict`` / ``load_state_dict``), so it
can replace a DataLoader in an existing loop and its checkpointing::

    loader = mmloader.torch.Loader("train.jsonl", model_dir=ckpt, micro_batch_size=4,
                                   seq_length=4096)
    for epoch in range(epochs):
        for batch in loader:                 # one epoch per iteration
            loss = model(**batch).loss
            ...
        torch.save({"model": model.state_dict(), "data": loader.state_dict()}, path)

    loader.load_state_dict(torch.load(path, weights_only=True)["data"])

Defaults that differ from :class:`mmloader.Loader`, so that ``model(**batch)`` is right for a
Hugging Face Qwen-VL model (``keys="qwen"``):

- ``mrope=True``: ``position_ids`` are the model's own M-RoPE positions (``[3, B, L]``; a
  2-D ``position_ids`` would make the model drop the image positions).
- ``mm_token_type_ids=True``: transformers >= 5 needs it to compute M-RoPE for images.
- ``text_only_vision="omit"``: a batch without images has no ``pixel_values`` /
  ``image_grid_thw`` (a placeholder would go through the vision tower).
- With ``packing=True``: ``attention_mask=False`` and ``position_ids`` ``[4, 1, L]`` whose
  first row restarts at 0 for each sample; transformers derives the per-sample attention
  from it when the model runs without a cache (``use_cache=False``, as in training).  The
  packing tensors ``cu_seqlens`` / ``cu_seqlens_unpadded`` / ``max_seqlen`` are left out
  (``packing_keys=False``): transformers' Qwen-VL forwards extra keyword arguments to its
  vision tower, which would take ``cu_seqlens`` for its own.
"""
from __future__ import annotations

import inspect
from typing import Any, Dict, Iterator, List, Optional

import torch

from . import loader as _loader

__all__ = ["Loader", "to_torch"]

_PACKING_KEYS = ("cu_seqlens", "cu_seqlens_unpadded", "cu_seqlens_padded", "max_seqlen")


def to_torch(batch: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """Views every tensor of an :class:`mmloader.Loader` batch as a ``torch.Tensor``
    (``torch.from_dlpack``: no copy)."""
    return {k: torch.from_dlpack(v) for k, v in batch.items()}


def _accepts(name: str) -> bool:
    try:
        return name in inspect.signature(_loader.Loader.__init__).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False


class Loader:
    """An :class:`mmloader.Loader` whose batches are ``dict[str, torch.Tensor]``.

    Arguments are those of :class:`mmloader.Loader` (see its docstring); with ``keys="qwen"``
    the defaults are ``mrope=True``, ``mm_token_type_ids=True``, ``text_only_vision="omit"``
    and, when packing, ``attention_mask=False`` (see the module docstring); with
    ``keys="megatron"``, ``text_only_vision="placeholder"`` (every batch has the same keys).
    ``packing_keys``: keep the packing tensors (``cu_seqlens``, ``cu_seqlens_unpadded`` or
    ``cu_seqlens_padded``, ``max_seqlen``) in packed batches (default: only with
    ``keys="megatron"``).  Iterating yields the batches of one epoch; iterate again for
    the next.  ``len()`` is the number of batches per epoch when that is known (padded
    batches); with ``packing=True`` it raises TypeError, like a DataLoader over an
    IterableDataset.
    """

    def __init__(self, data: Any, *, packing_keys: Optional[bool] = None, **kwargs: Any) -> None:
        qwen = kwargs.get("keys", "qwen") == "qwen"
        if "text_only_vision" not in kwargs and _accepts("text_only_vision"):
            # Megatron keys: a fixed key set (the zero-patch placeholder), so a forward step
            # reads the same keys from every batch
            kwargs["text_only_vision"] = "omit" if qwen else "placeholder"
        if qwen:
            kwargs.setdefault("mrope", True)
            if _accepts("mm_token_type_ids"):
                kwargs.setdefault("mm_token_type_ids", True)
            kwargs.setdefault("attention_mask", not kwargs.get("packing", False))
        if packing_keys is None:
            packing_keys = not qwen
        self._drop = () if packing_keys else _PACKING_KEYS
        self._inner = _loader.Loader(data, **kwargs)

    # ---- iteration (DataLoader-like) ---------------------------------------------------
    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        return self

    def __next__(self) -> Dict[str, torch.Tensor]:
        """The next batch; StopIteration at the end of each epoch (unless cycle=True)."""
        batch = next(self._inner)
        return {k: torch.from_dlpack(v) for k, v in batch.items() if k not in self._drop}

    def __len__(self) -> int:
        return len(self._inner)

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch ``epoch`` from its beginning (like ``DistributedSampler.set_epoch``)."""
        self._inner.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self._inner.epoch

    # ---- state (torchdata StatefulDataLoader interface) --------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """Where the consumer stands (batches received, not prefetched): a plain dict that
        ``torch.save`` writes and ``torch.load(weights_only=True)`` reads back."""
        return self._inner.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Continues exactly after the batch ``state_dict`` was taken at (the next batch is
        bitwise identical).  Raises :class:`mmloader.StateError` for a state from another
        configuration."""
        self._inner.load_state_dict(state_dict)

    # Megatron's names for the same thing (train_iterator.iterable.save_state()).
    save_state = state_dict
    restore_state = load_state_dict

    # Energon's state API (see mmloader.Loader.save_state_rank and the others).
    def save_state_rank(self) -> Dict[str, Any]:
        return self._inner.save_state_rank()

    def restore_state_rank(self, state: Optional[Dict[str, Any]]) -> None:
        self._inner.restore_state_rank(state)

    def save_state_global(self, global_dst_rank: int = 0) -> Optional[List[Dict[str, Any]]]:
        return self._inner.save_state_global(global_dst_rank)

    def restore_state_global(self, state: Any, *, src_rank: Optional[int] = None) -> None:
        self._inner.restore_state_global(state, src_rank=src_rank)

    save_state_rank.__doc__ = _loader.Loader.save_state_rank.__doc__
    restore_state_rank.__doc__ = _loader.Loader.restore_state_rank.__doc__
    save_state_global.__doc__ = _loader.Loader.save_state_global.__doc__
    restore_state_global.__doc__ = _loader.Loader.restore_state_global.__doc__

    @property
    def dp_group(self) -> Any:
        """The data-parallel process group of the global state calls (see
        :attr:`mmloader.Loader.dp_group`)."""
        return self._inner.dp_group

    @dp_group.setter
    def dp_group(self, group: Any) -> None:
        self._inner.dp_group = group

    # ---- the rest ---------------------------------------------------------------------
    @property
    def loader(self) -> "_loader.Loader":
        """The underlying :class:`mmloader.Loader` (batches of :class:`mmloader.Tensor`)."""
        return self._inner

    def stats(self) -> Dict[str, Any]:
        """See :meth:`mmloader.Loader.stats` (includes ``packing_efficiency``)."""
        return self._inner.stats()

    def close(self) -> None:
        """Stops the engine's threads; tensors already handed out stay valid."""
        self._inner.close()

    @property
    def closed(self) -> bool:
        return self._inner.closed

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        # num_samples, samples_per_rank, tokenizer, ... of the underlying loader
        if name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return "mmloader.torch." + repr(self._inner).split("mmloader.", 1)[-1]
