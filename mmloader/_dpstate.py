"""A loader's state across its data-parallel ranks: this rank's, or every rank's gathered
to one rank and scattered back (Energon's semantics, which the Megatron adapter's names
and mmloader.torch.TrainerCallback use).  Works on any loader with ``state_dict`` /
``load_state_dict`` / ``dp_rank`` / ``dp_size`` (a core or torch one)."""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional, Sequence

from ._core import StateError

State = Dict[str, Any]


def save_state_rank(loader: Any) -> State:
    """This rank's state (Energon's name for ``state_dict``)."""
    return loader.state_dict()


def restore_state_rank(loader: Any, state: Optional[State]) -> None:
    """Restores a state from :func:`save_state_rank`; None means the initial state
    (Energon's convention: nothing to restore)."""
    if state is not None:
        loader.load_state_dict(state)


def _dp_dist(loader: Any, group: Any) -> Any:
    """torch.distributed when the loader's data-parallel ranks can talk, else None; raises
    when the group does not match dp_rank / dp_size."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is None or not dist.is_available() or not dist.is_initialized():
        if loader.dp_size > 1:
            raise StateError(
                "save_state_global / restore_state_global with dp_size > 1 need "
                "torch.distributed initialised (or use save_state_rank / restore_state_rank)"
            )
        return None
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    if (size, rank) != (loader.dp_size, loader.dp_rank):
        raise StateError(
            f"this loader is data-parallel rank {loader.dp_rank} of {loader.dp_size} but its "
            f"process group has rank {rank} of {size}: set loader.dp_group to the "
            "data-parallel group"
        )
    return dist


def save_state_global(
    loader: Any, global_dst_rank: int = 0, group: Any = None
) -> Optional[List[State]]:
    """Every data-parallel rank's state, gathered to global rank ``global_dst_rank``: the
    list indexed by ``dp_rank`` there, None on the other ranks (Energon's semantics).  Every
    rank of ``group`` (the data-parallel group; None: the default group) must call it.  Not
    distributed (``dp_size == 1`` and no process group): ``[state]``."""
    state = loader.state_dict()
    dist = _dp_dist(loader, group)
    if dist is None:
        return [state]
    try:
        dist.get_group_rank(group or dist.group.WORLD, global_dst_rank)
    except (RuntimeError, ValueError):
        raise ValueError(
            f"save_state_global: global rank {global_dst_rank} is not in this loader's "
            "data-parallel group"
        ) from None
    out: Optional[List[Any]] = (
        [None] * loader.dp_size if dist.get_rank() == global_dst_rank else None
    )
    dist.gather_object(state, out, dst=global_dst_rank, group=group)
    return out


def restore_state_global(
    loader: Any,
    state: Optional[Sequence[Optional[State]]],
    *,
    src_rank: Optional[int] = None,
    group: Any = None,
) -> None:
    """Restores the states of :func:`save_state_global` (Energon's semantics).

    ``src_rank=None``: ``state`` is the whole list on every rank and each rank takes
    ``state[dp_rank]``.  Otherwise only rank ``src_rank`` of ``group`` (a rank within the
    group) passes the list, the others pass None, and the states are scattered from it;
    every rank of the group must call it then.  Under a global plan the states are one
    global count: a list saved on another dp_size restores too (elastic resume).
    """
    size, rank = loader.dp_size, loader.dp_rank
    if loader._plan and isinstance(state, (list, tuple)) and state and len(state) != size:
        if any(
            not isinstance(s, dict) or s.get("plan_pos") != state[0].get("plan_pos") for s in state
        ):
            raise StateError(
                "restore_state_global: the ranks' states disagree on plan_pos (they were "
                "not saved at the same step)"
            )
        return restore_state_rank(loader, state[0])
    dist = _dp_dist(loader, group) if src_rank is not None else None
    if dist is None:
        if not isinstance(state, (list, tuple)) or len(state) != size:
            raise StateError(
                f"restore_state_global: expected the list of {size} data-parallel states "
                f"from save_state_global, got {type(state).__name__}"
            )
        return restore_state_rank(loader, state[rank])
    src = dist.get_global_rank(group, src_rank) if group is not None else src_rank
    if dist.get_rank() == src:
        if not isinstance(state, (list, tuple)) or len(state) != size:
            raise StateError(
                f"restore_state_global: rank {src_rank} must pass the list of {size} "
                "data-parallel states"
            )
        scatter = list(state)
    else:
        scatter = [None] * size
    got: List[Any] = [None]
    dist.scatter_object_list(got, scatter, src=src, group=group)
    restore_state_rank(loader, got[0])
