"""mmloader.megatron: mmloader as Megatron-LM's external data loader.

Megatron-LM (``--dataloader-type external``) calls a ``train_valid_test_datasets_provider``
on every rank and iterates what it returns through its ``RerunDataIterator``.  Three names
are all a training script needs::

    from mmloader import megatron as mml

    train_valid_test_datasets_provider = mml.make_provider()   # reads the --mmloader-* flags

    def forward_step(data_iterator, model, vp_stage=None):
        batch = mml.get_batch(data_iterator, vp_stage=vp_stage)  # TP broadcast, PackedSeqParams
        ...

    mml.pretrain(train_valid_test_datasets_provider, model_provider,
                 ModelType.encoder_or_decoder, forward_step)

:func:`pretrain` calls the installed ``megatron.training.pretrain`` in the form it has:
megatron-core 0.18 / 0.19 (``pretrain(cfg_container, ...)``: it parses the arguments with
``parse_and_validate_args`` and builds the config with ``pretrain_cfg_container_from_args``)
or the Megatron-LM of megatron-core <= 0.17 (``pretrain(..., extra_args_provider=,
args_defaults=)``).  Either way it adds :func:`add_arguments` as the extra-args hook (mmloader's
``--mmloader-*`` flags, and ``--dataloader-save``, which Megatron-LM reads but does not define)
and defaults ``--dataloader-type`` to ``external``.

What the provider does:

- It is marked ``is_distributed = True`` (every rank calls it).  It builds loaders only where
  Megatron reads data: tensor-parallel rank 0 of the first and last pipeline stages, and of
  every stage when packing (middle stages need the packed-sequence boundaries, as in
  Megatron-LM's own SFT data path); it returns ``None`` elsewhere.  :func:`get_batch`
  broadcasts to the other tensor-parallel ranks the way Megatron's own ``get_batch`` does.
- ``dp_rank`` / ``dp_size`` default to Megatron's data-parallel group
  (``parallel_state.get_data_parallel_rank/world_size()``; context-parallel ranks share data).
- ``micro_batch_size``, ``seq_length`` and ``seed`` default to Megatron's
  ``--micro-batch-size``, ``--seq-length`` and ``--seed``; ``keys="megatron"``,
  ``shift_labels=True`` and ``attention_mask=False`` (causal attention needs no mask tensor)
  by default, and the loaders cycle over epochs (``cycle=True``) because Megatron counts
  iterations, not epochs.
- Batches carry Megatron's names: ``tokens``, ``labels``, ``loss_mask``, ``position_ids`` and,
  when packed, ``cu_seqlens`` (real boundaries), ``cu_seqlens_padded`` (slot boundaries) and
  ``max_seqlen`` (int32), as Megatron-LM's ``pretrain_gpt.get_batch`` names them.  A batch
  without images carries the zero-patch placeholder (``pixel_values`` ``[1, patch_dim]`` of
  zeros, ``image_grid_thw`` ``[[0, 0, 0]]``), so every batch has the same keys;
  :func:`get_batch` turns it into ``pixel_values = image_grid_thw = None``.
- ``device`` defaults to the current CUDA device when there is one: the loader copies each
  batch to it on its own stream with ``pixel_values`` as uint8 patches (8x fewer
  host-to-device bytes than float32) and expands them there, bit for bit the float32 (or,
  with ``pixel_format="bfloat16-consumer"``, bfloat16) values (``pixel_format=None``, see
  :class:`mmloader.torch.Loader`); ``device="cpu"`` keeps batches on the host (``get_batch``
  copies them), and ``pixel_format="float32"`` copies float32.
- Context parallelism is left to the model: a vision-language model merges the image
  embeddings into the sequence before sharding it; ``pad_to_multiple=2 * cp_size`` keeps
  every packed sample divisible as Megatron's THD sharding requires.
- Resume: with ``--dataloader-save DIR`` Megatron writes ``train_iterator.iterable.save_state()``
  per data-parallel rank next to each checkpoint
  (``DIR/iter_NNNNNNN/mp_rank_00[_000]/train_dataloader_dprankNNN.pt``).  When Megatron
  resumes (``args.iteration > 0``) the provider loads that file and continues exactly after
  the last batch of the saved iteration.  The loaders (:class:`mmloader.megatron.Loader`, an
  :class:`mmloader.torch.Loader` with these names) also have Energon's state API
  (``save_state_rank`` / ``restore_state_rank`` / ``save_state_global`` /
  ``restore_state_global``) over Megatron's data-parallel group; the core
  :class:`mmloader.Loader` has only ``state_dict`` / ``load_state_dict``.
"""

from __future__ import annotations

import glob
import inspect
import os
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .._options import (
    REMOVED_PIXEL_OPTIONS,
    add_flags,
    flag_kwargs,
    removed_pixel_option_error,
)
from .state import Loader

__all__ = [
    "make_provider",
    "get_batch",
    "pretrain",
    "add_arguments",
    "loader_kwargs_from_args",
    "state_path",
    "packed_seq_params",
    "default_device",
    "Loader",
]


def _megatron_args() -> Any:
    """Megatron-LM's global args, or None (megatron-core alone, or not initialised)."""
    try:
        from megatron.training import get_args
    except ImportError:
        return None
    try:
        return get_args()
    except Exception:  # noqa: BLE001 - args not initialised
        return None


def _parallel_state() -> Any:
    try:
        from megatron.core import parallel_state
    except ImportError:
        return None
    try:
        return parallel_state if parallel_state.model_parallel_is_initialized() else None
    except Exception:  # noqa: BLE001
        return None


def state_path(save_dir: str, iteration: int, dp_rank: int) -> Optional[str]:
    """The file Megatron wrote the loader state of ``dp_rank`` to at ``iteration`` (saved by
    tensor-parallel rank 0 of the first pipeline stage), or None when there is none.

    Megatron names it ``save_dir/iter_{iteration:07d}/mp_rank_00[_000][_EEE]/
    train_dataloader_dprank{dp_rank:03d}.pt``.
    """
    base = os.path.join(save_dir, f"iter_{iteration:07d}")
    name = f"train_dataloader_dprank{dp_rank:03d}.pt"
    for sub in ("mp_rank_00", "mp_rank_00_000"):
        p = os.path.join(base, sub, name)
        if os.path.isfile(p):
            return p
    found = sorted(glob.glob(os.path.join(base, "mp_rank_00*", name)))
    return found[0] if found else None


def load_state(path: str) -> Dict[str, Any]:
    """The loader state in a file Megatron saved (``{"dataloader_state_dict": state}``)."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(saved, dict) and "dataloader_state_dict" in saved:
        return saved["dataloader_state_dict"]
    return saved


# ---- command-line arguments -------------------------------------------------------------

PREFIX = "--mmloader-"
# The Loader options Megatron's command line takes, as --mmloader-<name> (flags and help
# from the option table; with --mmloader-packing, Megatron's --seq-length is the pack length).
LOADER_FLAGS = (
    "model_dir",
    "preset",
    "image_root",
    "packing",
    "pad_to_multiple",
    "mrope",
    "num_threads",
    "min_pixels",
    "max_pixels",
)


def add_arguments(parser: Any) -> Any:
    """Megatron ``extra_args_provider``: mmloader's ``--mmloader-*`` flags, and
    ``--dataloader-save DIR`` (read by Megatron-LM's checkpointing and the provider's resume,
    but defined by no Megatron-LM argument set) unless the parser already has it."""
    if "--dataloader-save" not in parser._option_string_actions:
        parser.add_argument(
            "--dataloader-save",
            default=None,
            help="folder Megatron writes each data-parallel rank's loader "
            "state to at every checkpoint (mmloader resumes from it)",
        )
    g = parser.add_argument_group("mmloader")
    g.add_argument(
        "--mmloader-data",
        nargs="+",
        default=None,
        help="training data: JSONL shards, globs, folders, http(s):// or s3:// URLs",
    )
    g.add_argument(
        "--mmloader-valid-data",
        nargs="+",
        default=None,
        help="validation data (same forms); none: no validation loader",
    )
    add_flags(g, LOADER_FLAGS, prefix=PREFIX)
    return parser


def loader_kwargs_from_args(args: Any) -> Dict[str, Any]:
    """:class:`mmloader.Loader` arguments from the ``--mmloader-*`` flags of Megatron's
    ``args`` (``--seq-length`` is the pack length when packing)."""
    if getattr(args, "mmloader_data", None) is None:
        raise TypeError(
            "mmloader.megatron: no data: pass --mmloader-data (registered by "
            "mmloader.megatron.add_arguments, which mmloader.megatron.pretrain "
            "adds) or make_provider(data=...)"
        )
    kw = flag_kwargs(args, LOADER_FLAGS, prefix=PREFIX)
    kw["data"] = args.mmloader_data
    if kw.get("packing"):  # Megatron's --seq-length is the pack length
        kw.update(pack_length=args.seq_length, seq_length=None)
    if getattr(args, "mmloader_valid_data", None):
        kw["valid"] = {"data": args.mmloader_valid_data}
    return kw


# ---- pretrain ---------------------------------------------------------------------------


def pretrain(
    train_valid_test_datasets_provider: Callable[..., Any],
    model_provider: Any,
    model_type: Any,
    forward_step_func: Callable[..., Any],
    *,
    extra_args_provider: Optional[Callable[[Any], Any]] = None,
    args_defaults: Optional[Dict[str, Any]] = None,
    model_config: Any = None,
    **kwargs: Any,
) -> Any:
    """``megatron.training.pretrain`` in the form the installed Megatron-LM has.

    megatron-core 0.18 / 0.19: ``parse_and_validate_args(extra_args_provider=,
    args_defaults=)``, ``pretrain_cfg_container_from_args(args[, model_config])``, then
    ``pretrain(cfg, provider, model_type=, forward_step_func=, model_provider=)``.  Earlier
    Megatron-LM: ``pretrain(provider, model_provider, model_type, forward_step_func,
    extra_args_provider=, args_defaults=)``.  :func:`add_arguments` runs before
    ``extra_args_provider``; ``args_defaults`` defaults ``dataloader_type`` to
    ``"external"``; ``kwargs`` go to ``pretrain`` as they are.
    """
    from megatron.training import pretrain as megatron_pretrain

    return _call_pretrain(
        megatron_pretrain,
        train_valid_test_datasets_provider,
        model_provider,
        model_type,
        forward_step_func,
        extra_args_provider,
        args_defaults,
        model_config,
        kwargs,
    )


def _call_pretrain(
    fn: Callable[..., Any],
    provider: Any,
    model_provider: Any,
    model_type: Any,
    forward_step_func: Any,
    extra_args_provider: Any,
    args_defaults: Any,
    model_config: Any,
    kwargs: Dict[str, Any],
) -> Any:
    def extra(parser: Any) -> Any:
        parser = add_arguments(parser)
        return extra_args_provider(parser) if extra_args_provider is not None else parser

    defaults = {"dataloader_type": "external", **(args_defaults or {})}
    names = inspect.signature(fn).parameters
    if "cfg_container" not in names:  # megatron-core <= 0.17
        return fn(
            provider,
            model_provider,
            model_type,
            forward_step_func,
            extra_args_provider=extra,
            args_defaults=defaults,
            **kwargs,
        )
    from megatron.training.argument_utils import pretrain_cfg_container_from_args
    from megatron.training.arguments import parse_and_validate_args

    args = parse_and_validate_args(extra_args_provider=extra, args_defaults=defaults)
    cfg = pretrain_cfg_container_from_args(args, model_config)
    return fn(
        cfg,
        provider,
        model_provider=model_provider,
        model_type=model_type,
        forward_step_func=forward_step_func,
        **kwargs,
    )


# ---- the provider -----------------------------------------------------------------------

# Whether the last provider built in this process packs (get_batch on a middle pipeline
# stage reads a batch only then: all ranks build the same provider).
_PACKING = [False]


def make_provider(
    *,
    dp_rank: Optional[int] = None,
    dp_size: Optional[int] = None,
    valid: Optional[Dict[str, Any]] = None,
    test: Optional[Dict[str, Any]] = None,
    resume: bool = True,
    dataloader_save: Optional[str] = None,
    iteration: Optional[int] = None,
    all_ranks: bool = False,
    **loader_kwargs: Any,
) -> Callable[..., Tuple[Any, Any, Any]]:
    """A ``train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None)`` for
    ``--dataloader-type external`` returning ``(train, valid, test)`` loaders.

    Args:
        dp_rank, dp_size: this rank in the data-parallel group; default: Megatron's
            ``parallel_state`` (0 and 1 when it is not initialised).
        valid, test: keyword overrides for validation / test loaders (for example
            ``{"data": "val.jsonl"}``); None: no such loader.  They default to
            ``shuffle=False`` and cycle as well.
        resume: restore the train loader from the state Megatron saved when it resumes.
        dataloader_save, iteration: where and at which iteration that state lies; default:
            Megatron's ``args.dataloader_save`` and ``args.iteration``.
        all_ranks: build a loader on every rank instead of only where Megatron reads data.
        **loader_kwargs: :class:`mmloader.Loader` arguments; without ``data`` the data and
            the rest come from the ``--mmloader-*`` flags when the provider runs
            (:func:`loader_kwargs_from_args`), and these arguments override the flags.
    """

    if any(k in loader_kwargs for k in REMOVED_PIXEL_OPTIONS):  # at once, not in pretrain
        raise removed_pixel_option_error(loader_kwargs)

    def train_valid_test_datasets_provider(
        train_val_test_num_samples: Sequence[int] = (), vp_stage: Optional[int] = None
    ):
        """Builds the mmloader loaders for this rank (see mmloader.megatron.make_provider)."""
        ps = _parallel_state()
        args = _megatron_args()
        given = dict(loader_kwargs)
        vkw = valid
        if "data" not in given:  # the flags, under what the script passed
            flags = loader_kwargs_from_args(args)
            vkw = flags.pop("valid", valid)
            given = {**flags, **given}
        _PACKING[0] = bool(given.get("packing", False))
        if ps is not None and not all_ranks:
            first, last = _first_last_stage(ps, vp_stage)
            if ps.get_tensor_model_parallel_rank() != 0 or not (first or last or _PACKING[0]):
                return None, None, None
        kw = dict(
            keys="megatron",
            shift_labels=True,
            cycle=True,
            attention_mask=False,
            device=default_device(),
        )
        if args is not None:
            if getattr(args, "micro_batch_size", None):
                kw["micro_batch_size"] = args.micro_batch_size
            if getattr(args, "seq_length", None):
                kw["seq_length"] = args.seq_length
            if getattr(args, "seed", None) is not None:
                kw["seed"] = args.seed
        kw.update(given)
        rank = dp_rank if dp_rank is not None else (ps.get_data_parallel_rank() if ps else 0)
        size = dp_size if dp_size is not None else (ps.get_data_parallel_world_size() if ps else 1)
        kw.update(dp_rank=rank, dp_size=size)

        out: List[Any] = []
        for extra in ({}, vkw, test):
            if extra is None:
                out.append(None)
                continue
            loader = Loader(**({**kw, "shuffle": False, **extra} if out else kw))
            if ps is not None and dp_rank is None:
                loader.dp_group = ps.get_data_parallel_group()
            out.append(loader)
        if resume:
            _maybe_restore(out[0], rank, args, dataloader_save, iteration)
        return tuple(out)

    train_valid_test_datasets_provider.is_distributed = True  # type: ignore[attr-defined]
    return train_valid_test_datasets_provider


def default_device() -> str:
    """The device the adapters' loaders copy batches to by default: the current CUDA device
    ("cuda:N") when CUDA is usable, else "cpu"."""
    return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"


def _first_last_stage(ps: Any, vp_stage: Optional[int]) -> Tuple[bool, bool]:
    """Whether this rank (and, with a virtual pipeline, this model chunk) is the first / last
    pipeline stage: the ones that read data."""
    virtual = (
        vp_stage is not None and ps.get_virtual_pipeline_model_parallel_world_size() is not None
    )
    return (
        ps.is_pipeline_first_stage(ignore_virtual=not virtual, vp_stage=vp_stage),
        ps.is_pipeline_last_stage(ignore_virtual=not virtual, vp_stage=vp_stage),
    )


def _maybe_restore(
    loader: Loader, dp_rank: int, args: Any, save_dir: Optional[str], iteration: Optional[int]
) -> None:
    if save_dir is None and args is not None:
        save_dir = getattr(args, "dataloader_save", None)
    if iteration is None and args is not None:
        iteration = getattr(args, "iteration", None)
    if not iteration:
        return  # a fresh run
    if not save_dir:
        warnings.warn(
            f"mmloader.megatron: resuming at iteration {iteration} but Megatron's "
            "--dataloader-save is not set, so no loader state was saved; the data "
            "starts again from the beginning",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    path = state_path(save_dir, iteration, dp_rank)
    if path is None:
        raise FileNotFoundError(
            f"mmloader.megatron: resuming at iteration {iteration} but there is no saved "
            f"loader state for data-parallel rank {dp_rank} under {save_dir!r} (expected "
            f"iter_{iteration:07d}/mp_rank_00*/train_dataloader_dprank{dp_rank:03d}.pt); pass "
            "resume=False to start the data from the beginning"
        )
    loader.load_state_dict(load_state(path))


# ---- get_batch ------------------------------------------------------------------------

_DTYPES = {
    "torch.int64": torch.int64,
    "torch.int32": torch.int32,
    "torch.float32": torch.float32,
    "torch.bfloat16": torch.bfloat16,
    "torch.uint8": torch.uint8,
    "torch.bool": torch.bool,
}


def packed_seq_params(batch: Dict[str, torch.Tensor]) -> Any:
    """megatron-core ``PackedSeqParams`` (``qkv_format="thd"``) for a packed batch.

    Megatron keys: ``cu_seqlens`` (real boundaries) go to ``cu_seqlens_q/kv``,
    ``cu_seqlens_padded`` (slot boundaries, the tail padding in the last slot, so they cover
    the row) to ``cu_seqlens_q/kv_padded`` and ``max_seqlen`` to ``max_seqlen_q/kv``.  A
    ``keys="qwen"`` batch (``cu_seqlens`` slots, ``cu_seqlens_unpadded`` real) maps the same.
    """
    from megatron.core.packed_seq_params import PackedSeqParams

    if "cu_seqlens_padded" in batch:
        real = batch["cu_seqlens"].reshape(-1)
        padded = batch["cu_seqlens_padded"].reshape(-1)
    else:
        padded = batch["cu_seqlens"].reshape(-1).clone()
        padded[-1] = batch[_ids_key(batch)].shape[-1]
        real = (
            batch["cu_seqlens_unpadded"].reshape(-1) if "cu_seqlens_unpadded" in batch else padded
        )
    max_seqlen = int((padded[1:] - padded[:-1]).max().item())
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=real,
        cu_seqlens_kv=real,
        cu_seqlens_q_padded=padded,
        cu_seqlens_kv_padded=padded,
        max_seqlen_q=max_seqlen,
        max_seqlen_kv=max_seqlen,
    )


def _ids_key(batch: Dict[str, torch.Tensor]) -> str:
    return "tokens" if "tokens" in batch else "input_ids"


def _broadcast_data_cpu(
    names: List[str],
    data: Optional[Dict[str, torch.Tensor]],
    dtype: torch.dtype,
    group: Any,
    src: int,
) -> Dict[str, torch.Tensor]:
    """megatron-core's ``broadcast_data`` algorithm (sizes, then one flat buffer) for
    tensors that are not on a CUDA device (megatron-core's version moves them to CUDA)."""
    import torch.distributed as dist

    max_dim = 5
    sizes = torch.zeros(len(names) * max_dim, dtype=torch.long)
    if data is not None:
        for i, k in enumerate(names):
            assert data[k].dim() < max_dim, f"{k} has {data[k].dim()} dimensions"
            for j, n in enumerate(data[k].shape):
                sizes[i * max_dim + j] = n
    dist.broadcast(sizes, src, group=group)
    shapes = []
    for i in range(len(names)):
        shape = []
        for j in range(max_dim):
            n = int(sizes[i * max_dim + j])
            if n <= 0:
                break
            shape.append(n)
        shapes.append(shape)
    total = sum(int(torch.Size(s).numel()) for s in shapes)
    if data is not None:
        flat = torch.cat([data[k].contiguous().view(-1) for k in names])
    else:
        flat = torch.empty(total, dtype=dtype)
    dist.broadcast(flat, src, group=group)
    out, off = {}, 0
    for k, shape in zip(names, shapes):
        n = int(torch.Size(shape).numel())
        out[k] = flat.narrow(0, off, n).view(shape)
        off += n
    return out


# Host batches whose asynchronous copies to the GPU may still be reading them (the loader
# reuses a buffer once its last tensor is gone): each is kept with an event until it is done.
_PENDING: List[Tuple[Any, Dict[str, torch.Tensor]]] = []


def _to_device(batch: Dict[str, torch.Tensor], device: torch.device) -> Dict[str, torch.Tensor]:
    out = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    if device.type == "cuda" and any(v.device.type == "cpu" for v in batch.values()):
        ev = torch.cuda.Event()
        ev.record()
        _PENDING.append((ev, batch))
    while _PENDING and _PENDING[0][0].query():
        _PENDING.pop(0)
    return out


def _broadcast(
    batch: Optional[Dict[str, torch.Tensor]], group: Any, device: torch.device
) -> Dict[str, torch.Tensor]:
    """Rank 0 of ``group`` sends ``batch`` to the others: its key list, then one
    ``broadcast_data`` per dtype (megatron-core's own on CUDA)."""
    import torch.distributed as dist

    src = dist.get_process_group_ranks(group)[0]
    if batch is not None:  # the source
        batch = _to_device(batch, device)
    holder = [[(k, str(v.dtype)) for k, v in batch.items()] if batch is not None else None]
    dist.broadcast_object_list(holder, src=src, group=group)
    spec = holder[0]
    assert spec is not None  # every rank has the source's list now
    by_dtype: Dict[str, List[str]] = {}
    for k, dt in spec:
        by_dtype.setdefault(dt, []).append(k)
    out: Dict[str, torch.Tensor] = {}
    for dt, names in by_dtype.items():
        wire = torch.uint8 if dt == "torch.bool" else _DTYPES[dt]  # no bool collectives
        data = {k: batch[k].to(wire) for k in names} if batch is not None else None
        if device.type == "cuda":
            from megatron.core import tensor_parallel

            got = tensor_parallel.broadcast_data(names, data, wire, tp_group=group)
        else:
            got = _broadcast_data_cpu(names, data, wire, group, src)
        if dt == "torch.bool":
            got = {k: v.to(torch.bool) for k, v in got.items()}
        out.update(got)
    return {k: out[k] for k, _ in spec}


_PACKED_KEYS = ("cu_seqlens", "cu_seqlens_padded", "max_seqlen")
_MODEL_KEYS = (
    "tokens",
    "labels",
    "loss_mask",
    "position_ids",
    "attention_mask",
    "pixel_values",
    "image_grid_thw",
    "pixel_values_videos",
    "video_grid_thw",
    "second_per_grid_ts",
)


def get_batch(
    data_iterator: Any,
    *,
    tp_group: Any = None,
    device: Any = None,
    drop_placeholder: bool = True,
    vp_stage: Optional[int] = None,
    packed: Optional[bool] = None,
) -> Optional[Dict[str, Any]]:
    """The next batch as Megatron's GPT / Qwen-VL forward step wants it.

    On tensor-parallel rank 0 it reads ``data_iterator`` and broadcasts the batch to the
    other ranks of the tensor-parallel group (megatron-core ``broadcast_data``, one call per
    dtype); every rank returns the same dict on ``device`` (default: the current CUDA device,
    else CPU).

    The dict holds the batch's tensors (``tokens``, ``labels``, ``loss_mask``,
    ``position_ids``, ``attention_mask`` (None unless enabled), ``pixel_values``,
    ``image_grid_thw``, ``pixel_values_videos``, ``video_grid_thw``, ``second_per_grid_ts``
    (None in a batch without videos), ``cu_seqlens``, ...) plus ``packed_seq_params`` (a megatron-core
    ``PackedSeqParams`` for packed batches, else None).  With ``drop_placeholder`` the
    text-only placeholder (``image_grid_thw`` of zeros) becomes ``pixel_values = None`` and
    ``image_grid_thw = None``.

    Middle pipeline stages (neither first nor last) get None unless the batches are packed
    (``packed``; default: whether the provider built in this process packs): then they read
    their own iterator, like Megatron-LM's SFT path, and get ``packed_seq_params`` and the
    ``cu_seqlens`` tensors, with every other key None.
    """
    ps = _parallel_state()
    middle = False
    if ps is not None:
        first, last = _first_last_stage(ps, vp_stage)
        middle = not (first or last)
        if middle and not (_PACKING[0] if packed is None else packed):
            return None
    if device is None:
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
    device = torch.device(device)
    if tp_group is None and ps is not None:
        tp_group = ps.get_tensor_model_parallel_group()
    distributed = tp_group is not None and torch.distributed.get_world_size(tp_group) > 1
    batch: Optional[Dict[str, torch.Tensor]] = None
    if not distributed or torch.distributed.get_rank(tp_group) == 0:
        if data_iterator is None:
            raise ValueError(
                "mmloader.megatron.get_batch: this rank reads data but its data "
                "iterator is None (build it with mmloader.megatron.make_provider)"
            )
        batch = next(data_iterator)
        if middle:
            batch = {k: v for k, v in batch.items() if k in _PACKED_KEYS}
    if distributed:
        batch = _broadcast(batch, tp_group, device)
    else:
        assert batch is not None  # not distributed: this rank read it
        batch = _to_device(batch, device)
    out: Dict[str, Any] = dict(batch)
    for k in _MODEL_KEYS:
        out.setdefault(k, None)
    g = out["image_grid_thw"]
    if drop_placeholder and g is not None and g.shape[0] == 1 and int(g[0, 0].item()) == 0:
        out["pixel_values"] = None
        out["image_grid_thw"] = None
    out["packed_seq_params"] = packed_seq_params(batch) if "cu_seqlens" in batch else None
    return out
