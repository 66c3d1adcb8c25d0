"""Megatron-LM's and Energon's names for a loader's state, on the adapters' loader.

The core :class:`mmloader.Loader` has one state API, torchdata's (``state_dict`` /
``load_state_dict``).  Megatron-LM checkpoints its data iterator with
``iterable.save_state()`` / ``restore_state(state)``, and Megatron-Energon's
``SavableDataLoader`` with ``save_state_rank`` / ``restore_state_rank`` /
``save_state_global`` / ``restore_state_global`` over the data-parallel group.  Those names
live here: :class:`Loader` (what :func:`mmloader.megatron.make_provider` and the Bridge
adapter build) is an :class:`mmloader.torch.Loader` with them, and the functions below
apply Energon's semantics to any loader (a core one included).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from .. import torch as _mt
from .._dpstate import (
    State,
    restore_state_global,
    restore_state_rank,
    save_state_global,
    save_state_rank,
)

__all__ = [
    "Loader",
    "save_state_rank",
    "restore_state_rank",
    "save_state_global",
    "restore_state_global",
]


class Loader(_mt.Loader):
    """An :class:`mmloader.torch.Loader` (same arguments, same batches) with Megatron-LM's
    and Energon's names for its state, which the core Loader does not carry."""

    #: The torch.distributed group of the data-parallel ranks that save_state_global /
    #: restore_state_global gather over and scatter to (Energon's
    #: WorkerConfig.data_parallel_group); None: the default group.  make_provider sets it
    #: to Megatron's data-parallel group.
    dp_group: Any = None

    # Megatron-LM's names (maybe_save_dataloader_state calls iterable.save_state()).
    def save_state(self) -> State:
        """This loader's state (Megatron-LM's name for ``state_dict``)."""
        return self.state_dict()

    def restore_state(self, state: State) -> None:
        """Restores a state from :meth:`save_state` (``load_state_dict``)."""
        self.load_state_dict(state)

    # Energon's (megatron.energon.SavableDataLoader)
    def save_state_rank(self) -> State:
        """This rank's state (Energon's name for ``state_dict``)."""
        return save_state_rank(self)

    def restore_state_rank(self, state: Optional[State]) -> None:
        """Restores a state from :meth:`save_state_rank`; None: the initial state."""
        restore_state_rank(self, state)

    def save_state_global(self, global_dst_rank: int = 0) -> Optional[List[State]]:
        """Every data-parallel rank's state gathered to ``global_dst_rank`` over
        :attr:`dp_group` (see :func:`mmloader.megatron.state.save_state_global`)."""
        return save_state_global(self, global_dst_rank, self.dp_group)

    def restore_state_global(
        self, state: Optional[Sequence[Optional[State]]], *, src_rank: Optional[int] = None
    ) -> None:
        """Restores the states of :meth:`save_state_global` over :attr:`dp_group` (see
        :func:`mmloader.megatron.state.restore_state_global`)."""
        restore_state_global(self, state, src_rank=src_rank, group=self.dp_group)
