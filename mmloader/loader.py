"""mmloader.Loader: the public data loader (one per data-parallel rank).

The work happens in C (mmloader._core._Loader): worker threads read, decode, preprocess
and tokenize samples with the GIL released, one collation thread builds batches in sample
order, and ``next()`` pops finished batches.  This module validates arguments, resolves
data paths, presets and the tokenizer, and implements state (resume) fingerprints.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import stat
import sys
import warnings
import weakref
from typing import (
    Any,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypedDict,
    Union,
    cast,
)

from . import _core, _options, mixture, recipes
from ._core import ConfigError, StateError
from .mixture import Source
from .presets import template_style, vision_config

PathLike = Union[str, "os.PathLike[str]"]
DataSpec = Union[PathLike, Sequence[PathLike], Source, Sequence[Union[Source, Dict[str, Any]]]]

STATE_VERSION = 1
#: The engine's option table (csrc/core/loader/options.c; see mml/options.h), by name: type,
#: default, bounds, choices, whether it enters the resume fingerprint, one line of doc.
OPTIONS = _options.OPTIONS
#: The Loader keywords the engine takes as table options.
_KEYWORDS = tuple(k for k, o in OPTIONS.items() if not (o["internal"] or o["python"]))
#: Every Loader keyword that is a row of the table (also those resolved in Python: preset,
#: tokenizer, the vision overrides), and its default.
_D = _options.DEFAULTS
_LABEL_MODES = OPTIONS["label_mode"]["choices"]
_REMOTE = ("http://", "https://", "s3://")
# Fingerprint keys a mixture change touches (allow_mixture_change=True accepts them).
_MIXTURE_KEYS = ("data", "num_samples", "mixture", "samples_per_epoch")
# The global plan's options: left out of the fingerprint when off.
_PLAN_KEYS = ("global_plan", "max_tokens_per_batch", "balance", "group_by_length")
# Options left out of the fingerprint when off, so that a state saved before they existed
# still loads: the global plan's, data_flatten and data_packing.
_OFF_KEYS = _PLAN_KEYS + ("data_flatten", "data_packing")
# Fingerprint keys a global plan may resume across (elastic resume at the global count).
_ELASTIC_KEYS = (
    "dp_rank",
    "dp_size",
    "micro_batch_size",
    "max_tokens_per_batch",
    "balance",
    "global_plan",
)
_VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
# What a folder given as data contributes (compression is told by content, not name).
_DATA_SUFFIXES = tuple(
    f"{base}{z}" for base in (".jsonl", ".json", ".tar") for z in ("", ".gz", ".zst")
) + (".tgz", ".parquet")


def _is_remote(p: str) -> bool:
    return p.startswith(_REMOTE)


def _file_kind(path: str) -> str:
    m = os.stat(path).st_mode
    for test, kind in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(m):
            return kind
    return "a special file"


def _expand_data(data: Union[PathLike, Sequence[PathLike]]) -> List[str]:
    """Paths, globs, folders (every data file inside) or URLs -> an ordered shard list."""
    items = [data] if isinstance(data, (str, os.PathLike)) else list(data)
    if not items:
        raise ConfigError("data is empty")
    out: List[str] = []
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise ConfigError(f"data entries must be paths or URLs, got {type(item).__name__}")
        p = os.fspath(item)
        if _is_remote(p):
            out.append(p)
        elif any(c in p for c in "*?["):
            found = sorted(glob.glob(os.path.expanduser(p), recursive=True))
            found = [f for f in found if os.path.isfile(f)]
            if not found:
                raise ConfigError(f"no data file matches {p!r}")
            out.extend(os.path.abspath(f) for f in found)
        elif os.path.isdir(p):
            found = sorted(
                f
                for f in glob.glob(os.path.join(p, "*"))
                if f.endswith(_DATA_SUFFIXES) and os.path.isfile(f)
            )
            if not found:
                raise ConfigError(
                    f"folder {p!r} holds no data file (*.jsonl, *.json, *.tar, "
                    "optionally .gz or .zst, or *.parquet)"
                )
            out.extend(os.path.abspath(f) for f in found)
        elif os.path.isfile(p):
            out.append(os.path.abspath(p))
        elif os.path.exists(p):  # a FIFO, a device, a socket: never opened (it may block)
            raise ConfigError(f"data file {p!r} is {_file_kind(p)}, not a regular file")
        else:
            raise ConfigError(f"data file {p!r} does not exist")
    return out


def _columns(name: str, v: Any) -> Optional[str]:
    """`columns` as the engine takes it: ``"column=key,..."`` from a ``{column: key}``
    mapping (or that string as given); None stays None."""
    if v is None or isinstance(v, str):
        return v
    if not isinstance(v, Mapping) or not v:
        raise ConfigError(f"{name} must be a non-empty {{column: key}} mapping or None, got {v!r}")
    for k, key in v.items():
        if not isinstance(k, str) or not isinstance(key, str) or not k or not key:
            raise ConfigError(f"{name}: column names and keys must be strings, got {k!r}: {key!r}")
        if any(c in k + key for c in ",="):
            raise ConfigError(f"{name}: {k!r}: {key!r} holds ',' or '='")
    return ",".join(f"{k}={key}" for k, key in v.items())


def _check_system_prompt(name: str, v: Any) -> None:
    if v is None:
        return
    if not isinstance(v, str):
        raise ConfigError(f"{name} must be a string or None, got {type(v).__name__}")
    bad = [t for t in _VISION_TOKENS if t in v]
    if bad:
        raise ConfigError(f"{name} must not contain {bad[0]}")


def _resolve_source(
    src: Source,
    preset: str,
    model_dir: Optional[str],
    vision_kw: Dict[str, Any],
    base: Dict[str, Any],
) -> Dict[str, Any]:
    """A source with every setting filled: its overrides, else the Loader's."""
    ov = src.overrides
    where = f"source {src.name!r}"
    try:
        shards = _expand_data(src.data)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    kw = dict(vision_kw)
    for k in ("min_pixels", "max_pixels", "max_image_pixels"):
        if k in ov:
            _check_int(f"{where}: {k}", ov[k], 1)
            kw[k] = ov[k]
    if "image_route" in ov:
        kw["image_route"] = ov["image_route"]
    recipe = ov.get("recipe", base["recipe"])
    recipes.check_route(f"{where}: ", recipe, kw.get("image_route", "processor"))
    recipes.check_video_prompt(
        f"{where}: ", recipe, base["qwen3_video_prompt"], _D["qwen3_video_prompt"]
    )
    kw = recipes.vision_kw(recipe, kw)
    try:
        vision = vision_config(preset, model_dir, **kw)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
    label_mode = ov.get("label_mode", base["label_mode"])
    if label_mode not in _LABEL_MODES:
        raise ConfigError(f"{where}: label_mode must be one of {_LABEL_MODES}, got {label_mode!r}")
    if recipe not in OPTIONS["recipe"]["choices"]:
        raise ConfigError(
            f"{where}: recipe must be one of {OPTIONS['recipe']['choices']}, got {recipe!r}"
        )
    rec = recipes.resolve(
        f"{where}: ",
        recipe,
        {k: ov.get(k, base[k]) for k in recipes.RECIPE_SETTINGS},
        label_mode,
        base["data_flatten"],
        base["tokenizer_max"],
    )
    image_whitespace = ov.get("image_whitespace", base["image_whitespace"])
    max_length = ov.get("max_length", base["max_length"])
    _check_int(f"{where}: max_length", max_length, 1, none_ok=True)
    system_prompt = ov.get("system_prompt", base["system_prompt"])
    _check_system_prompt(f"{where}: system_prompt", system_prompt)
    image_root = ov.get("image_root", base["image_root"])
    if image_root is not None and not isinstance(image_root, (str, os.PathLike)):
        raise ConfigError(f"{where}: image_root must be a path or URL prefix")
    return dict(
        name=src.name,
        columns=_columns(f"{where}: columns", ov.get("columns", base["columns"])),
        data=shards,
        weight=-1.0 if src.weight is None else float(src.weight),
        repeat=-1.0 if src.repeat is None else float(src.repeat),
        choose=-1 if src.choose is None else src.choose,
        image_root=None if image_root is None else os.fspath(image_root),
        vision=vision,
        system_prompt=system_prompt,
        image_whitespace=image_whitespace,
        max_length=max_length or 0,
        **rec,
    )


def default_num_threads() -> int:
    """CPUs this process may use divided by the ranks sharing the node (LOCAL_WORLD_SIZE)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    return max(1, cpus // local)


def _launcher_world() -> Optional[Tuple[int, int, str]]:
    """(rank, world size, where from) of an initialised torch.distributed, else of a
    launcher's RANK / WORLD_SIZE (torchrun, accelerate launch, deepspeed, Slurm via those),
    else None.  Both, when they disagree: ConfigError."""
    env = None
    r, w = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if r is not None and w is not None:
        try:
            env = (int(r), int(w), "the RANK / WORLD_SIZE environment variables")
        except ValueError:
            raise ConfigError(f"RANK={r!r} / WORLD_SIZE={w!r} are not integers") from None
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        got = (dist.get_rank(), dist.get_world_size(), "torch.distributed")
        if env is not None and env[:2] != got[:2]:
            raise ConfigError(
                f"torch.distributed is rank {got[0]} of {got[1]} but RANK / WORLD_SIZE say "
                f"{env[0]} of {env[1]}"
            )
        return got
    return env


def _megatron_dp() -> Optional[Tuple[int, int]]:
    """Megatron's data-parallel (rank, size) when its model parallelism is initialised in
    this process: under tensor / pipeline / context parallelism the ranks of one model
    replica read the same data, so the world's rank and size would be wrong."""
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is None or not ps.model_parallel_is_initialized():
        return None
    return ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()


def resolve_dp(dp_rank: Optional[int], dp_size: Optional[int]) -> Tuple[int, int]:
    """The data-parallel (rank, size) a Loader runs with.  Given: as given.  Not given:
    Megatron's data-parallel group when its model parallelism is initialised, else those
    of an initialised torch.distributed (or a launcher's RANK / WORLD_SIZE), so ranks
    never train on the same samples by default; 0 / 1 in a single process.  Under
    a distributed launch, a given dp_size must divide the world size (data parallelism
    beside tensor / pipeline parallelism) and both or neither must be given:
    ConfigError otherwise."""
    world = _launcher_world()
    if world is None or world[1] <= 1:
        return (0 if dp_rank is None else dp_rank, 1 if dp_size is None else dp_size)
    rank, size, where = world
    if dp_rank is None and dp_size is None:
        return _megatron_dp() or (rank, size)
    if dp_rank is None or dp_size is None:
        raise ConfigError(
            f"{where} runs {size} processes: give both dp_rank and dp_size (the "
            "data-parallel group's), or neither (rank and size of the whole world)"
        )
    _check_int("dp_size", dp_size, 1)
    if size % dp_size:
        raise ConfigError(
            f"dp_size={dp_size} does not divide the {size} processes of {where} "
            "(data-parallel ranks times model-parallel ranks make the world)"
        )
    return dp_rank, dp_size


def _check_int(name: str, v: Any, lo: Optional[int] = None, none_ok: bool = False) -> None:
    if v is None and none_ok:
        return
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{name} must be an integer, got {v!r}")
    if lo is not None and v < lo:
        raise ConfigError(f"{name} must be >= {lo}, got {v}")


def _parse_device(device: Any) -> int:
    """ "cpu" -> -1; "cuda" / "cuda:N" / torch.device -> N (CUDA must be usable)."""
    d = str(device)
    if d == "cpu":
        return -1
    if d == "cuda" or d.startswith("cuda:"):
        try:
            index = int(d[5:]) if d.startswith("cuda:") else 0
        except ValueError:
            raise ConfigError(f"bad device {device!r}") from None
        if index < 0:
            raise ConfigError(f"bad device {device!r}: the index must be >= 0")
        if not _core.cuda_available():
            raise ConfigError(
                f"device={d!r} needs a CUDA runtime and GPU; none is usable "
                f"here: {_core.cuda_unavailable_reason()}"
            )
        if not 0 <= index < _core.cuda_device_count():
            raise ConfigError(
                f"device={device!r}: there are {_core.cuda_device_count()} CUDA device(s)"
            )
        return index
    raise ConfigError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")


def _tokenizer_max(tokenizer: Any, model_dir: Optional[PathLike]) -> Tuple[bool, Optional[int]]:
    """(known, value) of the checkpoint tokenizer's model_max_length: model_dir's (where
    Qwen's train_qwen.py loads its processor from), else the tokenizer file's folder."""
    from .tokenizer import TOKENIZER_NAMES

    if model_dir is not None:
        folder: Optional[str] = os.fspath(model_dir)
    elif isinstance(tokenizer, (str, os.PathLike)):
        path = os.fspath(tokenizer)
        path = TOKENIZER_NAMES.get(path, path)
        folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    else:
        return False, None
    return True, recipes.tokenizer_model_max_length(folder)


def _resolve_tokenizer(tokenizer: Any, model_dir: Optional[str]):
    from .tokenizer import TOKENIZER_NAMES, Tokenizer

    if tokenizer is None:
        if model_dir is not None and os.path.exists(os.path.join(model_dir, "tokenizer.json")):
            tokenizer = os.path.join(model_dir, "tokenizer.json")
        elif model_dir is not None:
            raise ConfigError(
                f"model_dir {model_dir!r} holds no tokenizer.json: pass tokenizer= (the "
                "model's tokenizer.json or a folder holding it)"
            )
        else:
            raise ConfigError(
                "no tokenizer: pass model_dir= (a checkpoint folder with tokenizer.json) or "
                "tokenizer= (its tokenizer.json); the small test tokenizer, whose ids match "
                'no real model, only by name: tokenizer="tiny"'
            )
    if isinstance(tokenizer, str) and tokenizer in TOKENIZER_NAMES:
        tokenizer = TOKENIZER_NAMES[tokenizer]
    if isinstance(tokenizer, (str, os.PathLike)):
        path = os.fspath(tokenizer)
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(path):
            raise ConfigError(f"tokenizer file {path!r} does not exist")
        try:
            tokenizer = Tokenizer.from_file(path)
        except Exception as e:  # noqa: BLE001 - re-raised as a configuration error
            raise ConfigError(f"cannot load tokenizer {path!r}: {e}") from e
    if not isinstance(tokenizer, _core.Tokenizer):
        raise ConfigError(
            f"tokenizer must be a path or an mmloader.Tokenizer, got {type(tokenizer).__name__}"
        )
    return tokenizer, _tokenizer_identity(tokenizer)


_PROBE = (
    "The quick brown fox jumps over 13 lazy dogs; don't stop! \u00c4pfel, \u6f22\u5b57, "
    "\U0001f600\n\t<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
    "<|im_end|>\n"
)


def _tokenizer_identity(tok: Any) -> str:
    """Same for the same tokenizer however it was given (path or object)."""
    h = hashlib.sha256(str(tok.vocab_size).encode())
    h.update(json.dumps(tok.encode(_PROBE)).encode())
    return h.hexdigest()[:16]


class SourceStats(TypedDict):
    """One source's part of :meth:`Loader.stats` (``stats()["sources"][name]``)."""

    num_samples: int
    per_epoch: int
    samples: int
    skipped: int
    skipped_by_reason: Dict[str, int]
    tokens: int
    image_tokens: int
    bytes: int
    share: float
    expected_share: float


class _RemoteStats(TypedDict, total=False):
    fetch: Dict[str, Any]  # remote data only: requests, retries, latency


class LoaderStats(_RemoteStats):
    """What :meth:`Loader.stats` returns (its docstring says what each key means)."""

    wait_time_ratio: float
    wait_s: float
    wait_emit_s: float
    wall_s: float
    read_s: float
    vision_s: float
    decode_s: float
    tokenize_s: float
    collate_s: float
    queue_depth: int
    prefetch: int
    window: int
    in_flight: int
    num_threads: int
    samples: int
    good_samples: int
    skipped: int
    batches: int
    bytes_read: int
    images: int
    real_tokens: int
    token_slots: int
    packing_efficiency: float
    pinned: bool
    device: str
    pool_cached_bytes: int
    pool_live_bytes: int
    pool_live_peak_bytes: int
    pool_peak_bytes: int
    window_bytes: int
    scratch_mapped_bytes: int
    scratch_mapped_peak_bytes: int
    page_faults: int
    page_faults_per_batch: Optional[float]
    pixel_rows_moved: int
    pixel_rows_expanded: int
    pixel_rows_expanded_in_place: int
    pixel_rows_expanded_shared: int
    video_plan_waits: int
    video_decode_waits: int
    video_preload_peak_bytes: int
    video_preloads_refused: int
    video_open_peak_bytes: int
    samples_reread: int
    room_waits: int
    consumer_waits: int
    collator_room_waits: int
    skipped_by_reason: Dict[str, int]
    sources: Dict[str, SourceStats]


# Loader keywords with no row in the option table (structured values), documented here once.
_UNTABLED_DOCS = {
    "data": (
        None,
        "A shard path, a glob, a folder (its ``*.jsonl`` / ``*.json`` / ``*.tar`` files, plain "
        "or ``.gz`` / ``.zst``), an ``http(s)://`` or ``s3://`` URL (``s3://`` may hold a glob), "
        "or a list of those.  A shard is JSON lines or one JSON array of records (see "
        "``data_format``), optionally gzip- or zstd-compressed (told by its first bytes; a "
        "compressed shard is decompressed once into a temporary file in ``$TMPDIR`` while it "
        "is indexed).  Or a mixture: a list of :class:`mmloader.Source` (or dicts with the "
        "same fields), or the path of a YAML/JSON mixture file (see :mod:`mmloader.mixture`).  "
        "Each source may override image_root, columns, min_pixels, max_pixels, max_image_pixels, "
        "image_route, image_whitespace, system_prompt, label_mode and max_length for its "
        "samples (an image entry's own min_pixels/max_pixels/resized_height/resized_width win "
        "over both).",
    ),
    "image_mean, image_std": (
        "max_image_pixels",
        "Normalisation of each channel (3 numbers each; None: the preset's / model_dir's).",
    ),
    "device": (
        "pin_memory",
        "\"cpu\", or \"cuda[:N]\": batches are copied from pinned buffers to that GPU on the "
        "loader's own stream; ``__dlpack__(stream=s)`` (what torch.from_dlpack calls on the "
        "current stream) makes stream ``s`` wait for the copy, without a device-wide "
        "synchronisation.  A device buffer is reused only after the work queued on the streams "
        "it was exported to, before its release, has completed.  Raises ConfigError (saying "
        "why) when CUDA is unusable.",
    ),
}


def _default_text(o: Dict[str, Any]) -> str:
    """ " Default: X." (nothing for None: the doc says what None does)."""
    return "" if o["default"] is None else f" Default: {o['default']!r}."


def _options_doc() -> str:
    """The Args section of Loader's docstring: every keyword's row of the option table, in
    the table's order, with its default; the keywords without a row from _UNTABLED_DOCS."""
    import textwrap

    entries: List[Tuple[str, str]] = []
    after = {row: (name, doc) for name, (row, doc) in _UNTABLED_DOCS.items() if row}
    for name, (row, doc) in _UNTABLED_DOCS.items():
        if row is None:
            entries.append((name, doc))
    for name in _D:
        o = OPTIONS[name]
        entries.append((name, o["doc"] + _default_text(o)))
        if name in after:
            entries.append(after[name])
    out = ["    Args:"]
    for name, doc in entries:
        out.append(
            textwrap.fill(
                f"{name}: {doc}",
                width=92,
                initial_indent=" " * 8,
                subsequent_indent=" " * 12,
                break_on_hyphens=False,
            )
        )
    return "\n".join(out) + "\n"


def _loader_doc(doc: str) -> str:
    head = doc.split("    Args:")[0]
    return head + _options_doc()


#: Names the core Loader had until the adapters took them (a clear AttributeError).
_ADAPTER_STATE_NAMES = frozenset(
    (
        "save_state",
        "restore_state",
        "save_state_rank",
        "restore_state_rank",
        "save_state_global",
        "restore_state_global",
        "dp_group",
    )
)


class Loader:
    """Multimodal SFT batches for one data-parallel rank, produced by native threads.

    Iterate it like a DataLoader: ``for batch in loader`` yields dicts of
    :class:`mmloader.Tensor` (convert with ``torch.from_dlpack``; zero copy) and stops at
    the end of each epoch; the next iteration runs the next epoch (reshuffled).

    Args: (the section below is generated from the option table: see ``_options_doc``)
    """

    @_options.refuses_removed_pixel_options
    def __init__(
        self,
        data: DataSpec,
        *,
        data_format: str = _D["data_format"],
        index: Union[None, bool, PathLike] = _D["index"],
        image_root: Optional[PathLike] = _D["image_root"],
        columns: Union[None, str, Mapping[str, str]] = _D["columns"],
        micro_batch_size: Optional[int] = _D["micro_batch_size"],
        seq_length: Optional[int] = _D["seq_length"],
        shuffle: bool = _D["shuffle"],
        seed: int = _D["seed"],
        dp_rank: Optional[int] = _D["dp_rank"],
        dp_size: Optional[int] = _D["dp_size"],
        num_threads: Optional[int] = _D["num_threads"],
        prefetch: int = _D["prefetch"],
        start: str = _D["start"],
        window: Optional[int] = _D["window"],
        max_memory: Optional[int] = _D["max_memory"],
        on_error: str = _D["on_error"],
        max_error_rate: float = _D["max_error_rate"],
        preset: str = _D["preset"],
        model_dir: Optional[PathLike] = _D["model_dir"],
        tokenizer: Any = _D["tokenizer"],
        min_pixels: Optional[int] = _D["min_pixels"],
        max_pixels: Optional[int] = _D["max_pixels"],
        max_image_pixels: Optional[int] = _D["max_image_pixels"],
        image_mean: Optional[Sequence[float]] = None,
        image_std: Optional[Sequence[float]] = None,
        legacy_resize: Optional[bool] = _D["legacy_resize"],
        fast_decode: Optional[bool] = _D["fast_decode"],
        strict_jpeg: bool = _D["strict_jpeg"],
        image_route: str = _D["image_route"],
        max_length: Optional[int] = _D["max_length"],
        packing: bool = _D["packing"],
        pack_length: Optional[int] = _D["pack_length"],
        pad_to_multiple: Optional[int] = _D["pad_to_multiple"],
        keys: str = _D["keys"],
        shift_labels: bool = _D["shift_labels"],
        label_mode: str = _D["label_mode"],
        image_whitespace: str = _D["image_whitespace"],
        qwen3_video_prompt: str = _D["qwen3_video_prompt"],
        recipe: str = _D["recipe"],
        cutoff_len: Optional[int] = _D["cutoff_len"],
        mask_history: bool = _D["mask_history"],
        train_on_prompt: bool = _D["train_on_prompt"],
        enable_thinking: bool = _D["enable_thinking"],
        image_max_pixels: Optional[int] = _D["image_max_pixels"],
        image_min_pixels: Optional[int] = _D["image_min_pixels"],
        video_fps: Optional[float] = _D["video_fps"],
        video_maxlen: Optional[int] = _D["video_maxlen"],
        video_max_pixels: Optional[int] = _D["video_max_pixels"],
        video_min_pixels: Optional[int] = _D["video_min_pixels"],
        model_max_length: Optional[int] = _D["model_max_length"],
        video_min_frames: Optional[int] = _D["video_min_frames"],
        video_max_frames: Optional[int] = _D["video_max_frames"],
        data_flatten: bool = _D["data_flatten"],
        data_packing: bool = _D["data_packing"],
        dataloader_drop_last: bool = _D["dataloader_drop_last"],
        mrope: bool = _D["mrope"],
        attention_mask: bool = _D["attention_mask"],
        text_only_vision: str = _D["text_only_vision"],
        pixel_format: str = _D["pixel_format"],
        mm_token_type_ids: bool = _D["mm_token_type_ids"],
        cycle: bool = _D["cycle"],
        pin_memory: bool = _D["pin_memory"],
        device: str = "cpu",
        s3_endpoint: Optional[str] = _D["s3_endpoint"],
        s3_region: Optional[str] = _D["s3_region"],
        aws_access_key_id: Optional[str] = _D["aws_access_key_id"],
        aws_secret_access_key: Optional[str] = _D["aws_secret_access_key"],
        aws_session_token: Optional[str] = _D["aws_session_token"],
        max_inflight: Optional[int] = _D["max_inflight"],
        plan_only: bool = _D["plan_only"],
        max_tokens_per_batch: Optional[int] = _D["max_tokens_per_batch"],
        balance: Optional[str] = _D["balance"],
        group_by_length: Optional[int] = _D["group_by_length"],
        global_plan: bool = _D["global_plan"],
        samples_per_epoch: Optional[int] = _D["samples_per_epoch"],
        allow_mixture_change: bool = _D["allow_mixture_change"],
        mixture_tolerance: Optional[float] = _D["mixture_tolerance"],
        system_prompt: Optional[str] = _D["system_prompt"],
        max_images_per_sample: int = _D["max_images_per_sample"],
        max_sample_pixels: int = _D["max_sample_pixels"],
        max_sample_pixel_bytes: int = _D["max_sample_pixel_bytes"],
        max_record_bytes: int = _D["max_record_bytes"],
        max_json_depth: int = _D["max_json_depth"],
        max_object_bytes: int = _D["max_object_bytes"],
        max_jpeg_scans: int = _D["max_jpeg_scans"],
        max_shard_bytes: int = _D["max_shard_bytes"],
        max_shard_records: int = _D["max_shard_records"],
        allow_paths_outside_root: bool = _D["allow_paths_outside_root"],
        allow_remote_images_in_local_data: bool = _D["allow_remote_images_in_local_data"],
        fetch_timeout_s: float = _D["fetch_timeout_s"],
        fetch_stall_s: float = _D["fetch_stall_s"],
        fetch_min_rate: float = _D["fetch_min_rate"],
        fetch_max_retries: int = _D["fetch_max_retries"],
        fetch_retry_budget_s: float = _D["fetch_retry_budget_s"],
        next_timeout_s: float = _D["next_timeout_s"],
    ) -> None:
        # Every keyword that is a row of the engine's option table goes to the engine as
        # is; the table (csrc/core/loader/options.c) checks types, bounds and names.
        given = locals()
        opts: Dict[str, Any] = {k: given[k] for k in _KEYWORDS}
        self._c: Optional[_core._Loader] = None
        mix = mixture.resolve(data)
        # not a mixture: data is paths (resolve() returned None)
        shards = _expand_data(cast("Sequence[PathLike]", data)) if mix is None else []
        if mix is not None:
            mixture.check_names(mix[0])
            if samples_per_epoch is None:
                samples_per_epoch = opts["samples_per_epoch"] = mix[1]
            elif mix[1] is not None and mix[1] != samples_per_epoch:
                raise ConfigError(
                    f"samples_per_epoch={samples_per_epoch} differs from the "
                    f"mixture file's {mix[1]}"
                )
        elif samples_per_epoch is not None:
            raise ConfigError(
                "samples_per_epoch needs a mixture (mmloader.Source list or mixture file)"
            )
        if balance is None:  # the table's "none"
            opts["balance"] = "none"
        if mixture_tolerance is None:  # never warn
            opts["mixture_tolerance"] = -1.0
        elif isinstance(mixture_tolerance, (int, float)) and mixture_tolerance <= 0:
            raise ConfigError(
                f"mixture_tolerance must be a number in (0, 1] or None, got {mixture_tolerance!r}"
            )
        _check_system_prompt("system_prompt", system_prompt)
        if opts["num_threads"] is None:
            opts["num_threads"] = default_num_threads()
        opts["dp_rank"], opts["dp_size"] = dp_rank, dp_size = resolve_dp(dp_rank, dp_size)
        if image_root is not None:
            opts["image_root"] = os.fspath(image_root)
        opts["columns"] = _columns("columns", columns)
        if index is False:
            opts["index"] = ""  # never read one
        elif index is True:
            opts["index"] = None
        elif index is not None:
            opts["index"] = os.fspath(index)
        recipes.check_route("", recipe, image_route)
        recipes.check_video_prompt("", recipe, qwen3_video_prompt, _D["qwen3_video_prompt"])
        # data_flatten: every source's recipe is checked (a mixture's loader-wide recipe
        # may be another, its sources' their own)
        if data_packing:  # its make_supervised_data_module: the flattened collator
            if mix is None:  # (a mixture's sources: each one's recipe, as data_flatten)
                recipes.check_flatten("", recipe, True, "data_packing")
            data_flatten = opts["data_flatten"] = True
        flat = bool(data_flatten) and (mix is None or recipe == recipes.QWEN_VL_FINETUNE)
        tok_max = _tokenizer_max(tokenizer, model_dir)
        opts.update(
            recipes.resolve(
                "", recipe, {k: opts[k] for k in recipes.RECIPE_SETTINGS}, label_mode, flat, tok_max
            )
        )
        if data_flatten:  # its positions are get_rope_index's, always
            opts["mrope"] = True
        _core.check_loader_options(opts)  # ConfigError before any expensive work
        if pixel_format.endswith("-consumer"):
            dtype = pixel_format.split("-")[0]
            raise ConfigError(
                f"pixel_format={pixel_format!r} ships uint8 patches for the consumer to expand "
                "where the tensor is: mmloader.torch.Loader (and the Megatron and Bridge "
                "adapters) do that; mmloader.Loader's batches are the engine's own, so use "
                f"pixel_format={dtype!r} here (the engine expands), or 'uint8' and "
                "mmloader.torch.expand_pixels"
            )
        device_index = _parse_device(device)
        if pin_memory and device_index < 0 and not _core.cuda_available():
            warnings.warn(
                "pin_memory=True: CUDA is unavailable "
                f"({_core.cuda_unavailable_reason()}); batches use ordinary host "
                "memory",
                RuntimeWarning,
                stacklevel=2,
            )
        if model_dir is not None:
            model_dir = os.fspath(model_dir)
        # the vision settings, also the base of each source's (its overrides on top)
        vision_kw = dict(
            min_pixels=min_pixels,
            max_pixels=max_pixels,
            max_image_pixels=max_image_pixels,
            image_mean=image_mean,
            image_std=image_std,
            legacy_resize=legacy_resize,
            fast_decode=fast_decode,
            strict_jpeg=bool(strict_jpeg),
            image_route=image_route,
        )
        try:
            vision = vision_config(preset, model_dir, **recipes.vision_kw(recipe, vision_kw))
            tmpl = template_style(preset)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        tok, tok_id = _resolve_tokenizer(tokenizer, model_dir)
        sources = None
        if mix is not None:
            base = dict(
                image_root=image_root,
                columns=opts["columns"],
                system_prompt=system_prompt,
                image_whitespace=image_whitespace,
                label_mode=label_mode,
                max_length=max_length,
                recipe=recipe,
                qwen3_video_prompt=qwen3_video_prompt,
                data_flatten=bool(data_flatten),
                tokenizer_max=tok_max,
                **{k: given[k] for k in recipes.RECIPE_SETTINGS},
            )
            sources = [_resolve_source(src, preset, model_dir, vision_kw, base) for src in mix[0]]

        cfg = dict(
            opts, data=shards, vision=vision, template=tmpl, device=device_index, sources=sources
        )
        self._c = _core._Loader(cfg, tok)
        self._next = self._c.next
        self._stream = (-1, 0)
        if pin_memory and device_index < 0 and _core.cuda_available():
            self._next = self._next_pinned
        self._finalizer = weakref.finalize(self, self._c.close)
        info = self._c.info()
        self._packing = bool(packing)
        self._cycle = bool(cycle)
        self._batches_per_epoch = info["batches_per_epoch"]
        self.num_samples: int = info["num_samples"]
        self.samples_per_rank: int = info["samples_per_rank"]
        #: draws per epoch over all ranks (num_samples without a mixture)
        self.samples_per_epoch: int = info["samples_per_epoch"]
        #: shards added from a dataset index whose token counts are used (of num_shards)
        self.index_shards: int = info["index_shards"]
        self.num_shards: int = info["num_shards"]
        self.tokenizer = tok
        #: the vision settings the loader runs with (mmloader.presets.vision_config)
        self.vision_config: Dict[str, Any] = dict(vision)
        self._mbs = self._c.options()["micro_batch_size"]  # None with a token budget
        plan = self._c.plan_info(0)
        self._plan = plan is not None
        if plan is not None:  # epoch 0's (each epoch's plan has its own)
            self.samples_per_rank = plan["rank_samples"]
        self._dp_size = dp_size
        self._allow_mixture_change = bool(allow_mixture_change)
        try:
            qft = all(s["recipe"] == recipes.QWEN_VL_FINETUNE for s in sources or [opts])
            recipes.check_last_batch(
                qft, bool(dataloader_drop_last), self.samples_per_rank, self._mbs, bool(cycle)
            )
        except ConfigError:
            self._c.close()
            raise
        # The resume fingerprint: the options the table marks, as the engine runs them.
        self._fingerprint: Dict[str, Any] = {
            "data": info["data_hash"],
            "num_samples": info["num_samples"],
            **{
                k: int(v) if isinstance(v, bool) else v
                for k, v in self._c.options().items()
                if OPTIONS[k]["fingerprint"] and not (k in _OFF_KEYS and v in (0, "none"))
            },  # as states before them
            "vision": hashlib.sha256(json.dumps(vision, sort_keys=True).encode()).hexdigest()[:16],
            "tokenizer": tok_id,
        }
        if sources is not None:
            self._fingerprint["samples_per_epoch"] = self.samples_per_epoch
            self._fingerprint["mixture"] = [
                [
                    e["name"],
                    e["data_hash"],
                    e["num_samples"],
                    e["per_epoch"],
                    mixture.settings_hash(
                        {k: v for k, v in s.items() if k not in ("data", "name", "image_root")}
                    ),
                ]
                for e, s in zip(info["sources"], sources)
            ]

    # ---- iteration ---------------------------------------------------------------------
    def __iter__(self) -> Iterator[Dict[str, "_core.Tensor"]]:
        return self

    def __next__(self) -> Dict[str, "_core.Tensor"]:
        """The next batch; StopIteration once at the end of each epoch (unless cycle)."""
        return self._next()

    def _next_pinned(self) -> Dict[str, "_core.Tensor"]:
        # pin_memory: guard the batch also on torch's current stream (a trainer copying
        # with .cuda(non_blocking=True) inside `with torch.cuda.stream(s)`).
        c = self._core()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            cur = torch.cuda.current_stream()
            s = (cur.device.index or 0, cur.cuda_stream)
            if s != self._stream:
                c.set_consumer_stream(*s)
                self._stream = s
        return c.next()

    def __len__(self) -> int:
        """Batches per epoch: padded batches, and any global plan (``global_plan=True``:
        packed batches too, from the planning pass; quick with a dataset index).  Without a
        plan a packed epoch's count is only known at its end: TypeError, like a DataLoader
        over an IterableDataset."""
        if self._plan:  # the global plan knows every epoch's steps
            plan = self._core().plan_info(self.epoch)
            assert plan is not None  # self._plan: every epoch has one
            return plan["steps"]
        if self._packing:
            raise TypeError(
                "len() is undefined with packing=True and no global plan (packs per epoch "
                "depend on sample lengths): pass global_plan=True, whose planning pass counts "
                "every epoch's packs before training"
            )
        return self._batches_per_epoch

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch `epoch` from its beginning (drops prefetched batches if needed)."""
        _check_int("epoch", epoch, 0)
        c = self._core()
        if tuple(c.cursor()) != (epoch, 0, 0):
            c.seek(epoch, 0, 0)

    @property
    def dp_rank(self) -> int:
        """This loader's data-parallel rank (given, or from torch.distributed / RANK)."""
        return int(self._fingerprint["dp_rank"])

    @property
    def dp_size(self) -> int:
        """The data-parallel group's size (given, or torch.distributed's / WORLD_SIZE)."""
        return int(self._fingerprint["dp_size"])

    @property
    def epoch(self) -> int:
        """The epoch of the next batch."""
        return self._core().cursor()[0]

    # ---- state -------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """Where the consumer stands: resume with :meth:`load_state_dict`.

        Describes the batches delivered by ``next`` (not those prefetched).  A plain dict
        of ints and strings (``torch.load(weights_only=True)`` accepts it).
        """
        epoch, pos, bie = self._core().cursor()
        state = {
            "version": STATE_VERSION,
            "epoch": epoch,
            "pos": pos,
            "batch_in_epoch": bie,
            "fingerprint": dict(self._fingerprint),
        }
        if self._plan:  # the global sample count, the same on every rank
            q = self._core().plan_position()
            assert q is not None  # self._plan
            state["plan_start"], state["plan_pos"] = q
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues exactly after the batch the state was taken at.

        Raises StateError when the state comes from a different configuration (data, seed,
        dp_rank/dp_size, batch size, sequence/packing settings, vision or tokenizer).
        """
        c = self._core()
        if not isinstance(state, dict):
            raise StateError(
                f"state must be a dict from Loader.state_dict(), got {type(state).__name__}"
            )
        if "version" not in state:
            raise StateError("state has no field 'version'")
        if state.get("version") != STATE_VERSION:
            raise StateError(
                f"unsupported state version {state.get('version')!r} "
                f"(this mmloader writes {STATE_VERSION})"
            )
        fp = state.get("fingerprint")
        if not isinstance(fp, dict):
            raise StateError("state has no field 'fingerprint' (a dict)")
        diffs = [k for k, v in self._fingerprint.items() if fp.get(k) != v]
        diffs += [k for k in _MIXTURE_KEYS + _OFF_KEYS if k in fp and k not in self._fingerprint]
        if self._plan != ("plan_pos" in state):
            raise StateError(
                "the state was saved "
                + ("without" if self._plan else "with")
                + " a global plan (global_plan, max_tokens_per_batch, balance, "
                "group_by_length) and this loader has " + ("one" if self._plan else "none")
            )
        elastic = self._plan
        if elastic:  # any rank's state of a global plan is the global count
            diffs = [k for k in diffs if k not in _ELASTIC_KEYS]
        other = [k for k in diffs if k not in _MIXTURE_KEYS]
        mixed = [k for k in diffs if k in _MIXTURE_KEYS]
        if other:
            raise StateError(
                "the state was saved under a different configuration: "
                + "; ".join(
                    f"{k} (saved {fp.get(k)!r}, loader {self._fingerprint.get(k)!r})" for k in diffs
                )
            )
        parts: List[int] = []
        for k in ("epoch", "pos", "batch_in_epoch"):
            if k not in state:
                raise StateError(f"state has no field {k!r}")
            v = state[k]
            if isinstance(v, bool) or not isinstance(v, int):
                raise StateError(
                    f"state field {k} must be an int, got {type(v).__name__} {v!r:.40}"
                )
            if not -(2**63) <= v < 2**63:
                raise StateError(f"state field {k}={v} is outside the 64-bit range")
            parts.append(v)
        cur = (parts[0], parts[1], parts[2])  # ranges and consistency: the engine's seek
        if self._plan:
            return self._load_plan_state(state, fp, cur, mixed)
        if mixed:
            if "mixture" in self._fingerprint or "mixture" in fp:
                what = mixture.describe_change(
                    fp.get("mixture"), self._fingerprint.get("mixture") or []
                )
                what = what or [
                    f"{k} (saved {fp.get(k)!r}, loader {self._fingerprint.get(k)!r})" for k in mixed
                ]
                msg = "the state was saved under a different mixture: " + "; ".join(what)
            else:
                msg = "the state was saved under a different configuration: " + "; ".join(
                    f"{k} (saved {fp.get(k)!r}, loader {self._fingerprint.get(k)!r})" for k in mixed
                )
            if not self._allow_mixture_change:
                raise StateError(
                    msg + " (Loader(allow_mixture_change=True) continues under "
                    "the new data from the same sample count)"
                )
            cur = self._remap_cursor(cur, fp)
        if tuple(c.cursor()) != cur:
            c.seek(*cur)

    def _load_plan_state(
        self, state: Dict[str, Any], fp: Dict[str, Any], cur: Tuple[int, int, int], mixed: List[str]
    ) -> None:
        """A state of the global plan: the exact cursor under the same plan settings, else
        the saved global count (another dp_size, micro_batch_size, budget or balance)."""
        if mixed:
            raise StateError(
                "a global plan resumes only under the same data and mixture: " + "; ".join(mixed)
            )
        q = []
        for k in ("plan_start", "plan_pos"):
            v = state.get(k)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**63:
                raise StateError(f"state field {k} must be a non-negative int, got {v!r:.40}")
            q.append(v)
        same = all(fp.get(k) == self._fingerprint.get(k) for k in _ELASTIC_KEYS)
        if same:
            self._core().seek_plan(*cur, q[0])
        else:  # elastic: this epoch's plan starts at the saved global count
            self._core().seek_plan(cur[0], 0, 0, q[1])

    def _remap_cursor(self, cur: Tuple[int, int, int], fp: Dict[str, Any]) -> Tuple[int, int, int]:
        """The same count of this rank's stream positions under the current epoch size
        (batch_in_epoch as if no sample had been skipped)."""
        try:
            old_total = int(fp.get("samples_per_epoch") or fp["num_samples"])
        except (KeyError, TypeError, ValueError):
            raise StateError("state lacks num_samples") from None
        old_rank = max(1, old_total // self._dp_size)
        epoch, pos, _ = cur
        done = epoch * old_rank + min(pos, old_rank)
        n = self.samples_per_rank
        epoch, pos = divmod(done, n)
        return (epoch, pos, 0 if self._packing else min(pos // self._mbs, len(self)))

    def __getattr__(self, name: str) -> Any:
        if name in _ADAPTER_STATE_NAMES:
            where = "" if name == "dp_group" else f" or mmloader.megatron.state.{name}(loader, ...)"
            raise AttributeError(
                f"mmloader.Loader has no {name}: Megatron-LM's and Energon's names for the "
                "state are the Megatron adapter's, mmloader.megatron.Loader (an "
                f"mmloader.torch.Loader with them){where}; this Loader's are state_dict / "
                "load_state_dict"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ---- observability and lifetime ----------------------------------------------------
    def stats(self) -> LoaderStats:
        """Engine statistics: wait_time_ratio (wait_s, the time blocked in next, / wall_s,
        the wall time since the first next), wait_emit_s (of wait_s, the time after the
        batch waited for was composed, its pixels decoded: waiting for or in its emission,
        which with pixel_format float32/bfloat16 expands its uint8 rows; the rest of wait_s
        is the batch still being read and decoded), per-stage busy seconds (read_s, vision_s,
        tokenize_s, collate_s; decode_s is the decoder's part of vision_s),
        queue_depth (finished batches waiting), prefetch, window and num_threads (as in
        effect), in_flight (samples being processed now), samples and good_samples (taken
        by the collator, once each: they run
        ahead of the consumer by the batches queued and the one being composed, into the
        next epoch at an epoch's end), batches (delivered), skipped and skipped_by_reason
        (failures the consumer has passed), bytes_read (record and image bytes read or
        fetched), images, real_tokens and token_slots (over delivered batches) and
        packing_efficiency (their ratio), pinned and device (where batches are),
        pool_live_bytes and pool_cached_bytes (the host buffer pool: in use, kept mapped
        for reuse), page_faults (minor page faults of the engine's own threads) and
        page_faults_per_batch (the same per batch delivered after the first
        2 * prefetch + 8, when the buffer pool has filled; None before), pixel_rows_moved
        (image and video rows copied because a sample failed only at decode; 0 otherwise),
        pixel_rows_expanded (pixel_format float32/bfloat16: rows expanded from uint8 at
        emission),
        pixel_rows_expanded_in_place (those of them expanded in their own buffer, grown
        to the float bytes: no second buffer), pixel_rows_expanded_shared (those of them
        expanded by a second worker, which helps while the consumer has no batch ready),
        the engine's memory in parts (besides pool_live_bytes and pool_cached_bytes; the
        cache is trimmed to the most bytes in use at once over the last ~128 batches):
        pool_live_peak_bytes and pool_peak_bytes (the most in use at one time, and in use +
        cached), window_bytes (the window's record and encoded-image buffers, spares
        included) and scratch_mapped_bytes / scratch_mapped_peak_bytes (decoder scratch
        that scales with the image, e.g. a progressive JPEG's coefficients: the whole
        process's, now and at most),
        video_plan_waits / video_decode_waits (times a worker waited on the network for a
        remote video: opening and probing it to plan the sample / decoding it; the decode's
        packets are fetched when the sample is planned, so the latter stays 0),
        video_preload_peak_bytes (the most remote video bytes held at once ahead of their
        use: first blocks and preloaded packets, counted in max_memory) and
        video_preloads_refused (decodes not preloaded for want of max_memory room: they
        read on demand), video_open_peak_bytes (the most bytes held at once by the videos
        kept open from their probe to their decode: demuxer state and frame tables,
        counted in max_memory), samples_reread (samples whose image bytes were dropped to
        make room under max_memory for an earlier sample's decode and read again by their
        own: files, shard members and Parquet blobs, fetched ones fetched again and
        checked to be the same bytes; never videos), room_waits
        (the workers' waits for max_memory room -- to read a sample, for a decode's
        scratch, for an emission -- one per look that found none), consumer_waits
        (next()'s waits under max_memory, one per look that found nothing for it: each
        ends when a batch is queued, when the memory ledger may have to decide that the
        batch can never fit, or when next()'s own 0.1 s slice for Ctrl-C runs out),
        collator_room_waits (the collation thread's waits for a batch's buffer -- max_memory
        room or its turn behind ``prefetch`` batches -- one per look that found none), and
        ``fetch`` (requests, retries, latency) when data is remote, and ``sources``:
        per source (one, "data", without a mixture), its good samples collated, skipped (and
        by reason), tokens, image tokens and bytes, with ``share`` (of the good samples
        collated) beside ``expected_share`` (its draws / the epoch's)."""
        st = self._core().stats()
        srcs = st["sources"]
        good = sum(s["samples"] for s in srcs.values())
        for s in srcs.values():
            s["share"] = s["samples"] / good if good else 0.0
            s["expected_share"] = s["per_epoch"] / self.samples_per_epoch
        return cast(LoaderStats, st)

    def close(self) -> None:
        """Stops and joins every thread; batches already delivered stay valid."""
        if self._c is not None:
            self._finalizer()

    @property
    def closed(self) -> bool:
        return self._c is None or self._c.closed

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _core(self) -> _core._Loader:
        if self._c is None or self._c.closed:
            raise _core.Error("the loader is closed")
        return self._c

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"cursor={tuple(self._core().cursor())}"
        return (
            f"mmloader.Loader(samples={self.num_samples}, "
            f"per_rank={self.samples_per_rank}, {state})"
        )


Loader.__doc__ = _loader_doc(Loader.__doc__ or "")
