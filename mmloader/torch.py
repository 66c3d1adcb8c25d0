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
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from . import _core
from . import loader as _loader
from ._options import DEFAULTS, OPTIONS, refuses_removed_pixel_options
from .loader import PathLike
from .presets import vision_config as _preset_vision

__all__ = ["Loader", "to_torch", "expand_pixels", "pixel_table"]  # and TrainerCallback (lazy)


def __getattr__(name: str) -> Any:
    # TrainerCallback imports transformers: only when asked for
    if name == "TrainerCallback":
        from .trainer import MMLoaderCallback

        return MMLoaderCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_PACKING_KEYS = ("cu_seqlens", "cu_seqlens_unpadded", "cu_seqlens_padded", "max_seqlen")


def to_torch(batch: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """Views every tensor of an :class:`mmloader.Loader` batch as a ``torch.Tensor``
    (``torch.from_dlpack``: no copy)."""
    return {k: torch.from_dlpack(v) for k, v in batch.items()}


# ---- uint8 pixels -> the processor's float values ------------------------------------------

_TABLES: Dict[Tuple[Any, ...], torch.Tensor] = {}


def pixel_table(
    preset: str = DEFAULTS["preset"],
    *,
    model_dir: Optional[str] = None,
    image_mean: Optional[Sequence[float]] = None,
    image_std: Optional[Sequence[float]] = None,
    rescale_factor: float = 1 / 255,
    videos: bool = False,
) -> torch.Tensor:
    """The float32 ``[3, 256]`` table of what the HF processor makes of each byte value of
    each channel — the value mmloader's ``pixel_format="float32"`` writes.  Images: its PIL
    backend's arithmetic, ``float32(float64(v) * rescale_factor)`` then
    ``(x - float32(mean[c])) / float32(std[c])`` in float32.  ``videos=True``: the video
    processor's torchvision backend, which fuses rescale and normalise,
    ``(float32(v) - m) / s`` in float32 with ``m = float32(mean[c]) * float32(1 /
    rescale_factor)`` (and ``s`` alike).  Mean and std come from the preset, then
    ``model_dir``'s preprocessor_config.json, then the arguments."""
    cfg = _preset_vision(preset, model_dir, image_mean=image_mean, image_std=image_std)
    mean = np.asarray(cfg["image_mean"], dtype=np.float64).astype(np.float32)
    std = np.asarray(cfg["image_std"], dtype=np.float64).astype(np.float32)
    if videos:
        x = np.arange(256, dtype=np.float32)
        scale = np.float32(1.0 / float(rescale_factor))
        mean, std = mean * scale, std * scale
    else:
        x = (np.arange(256, dtype=np.float64) * float(rescale_factor)).astype(np.float32)
    return torch.from_numpy((x[None, :] - mean[:, None]) / std[:, None])


def _table_on(table: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The flat [768] table in `dtype` on `device`, made once per (values, device, dtype)."""
    key = (table.numpy().tobytes(), str(device), dtype)
    t = _TABLES.get(key)
    if t is None:
        t = _TABLES[key] = table.reshape(-1).to(dtype).to(device)
    return t


def expand_pixels(
    pixel_values: torch.Tensor,
    image_grid_thw: Optional[torch.Tensor] = None,
    *,
    preset: str = DEFAULTS["preset"],
    model_dir: Optional[str] = None,
    image_mean: Optional[Sequence[float]] = None,
    image_std: Optional[Sequence[float]] = None,
    rescale_factor: float = 1 / 255,
    temporal_patch_size: Optional[int] = None,
    patch_size: Optional[int] = None,
    dtype: torch.dtype = torch.float32,
    table: Optional[torch.Tensor] = None,
    videos: bool = False,
    vision_config: Optional[Mapping[str, Any]] = None,
) -> torch.Tensor:
    """Turns ``pixel_format="uint8"`` patches into the ``pixel_values`` (or, with
    ``videos=True``, the ``pixel_values_videos``) the HF processor gives, on the device the
    patches are on: torch ops on a GPU (any non-CPU device), the core's loop on the CPU
    (GIL released).

    ``pixel_values`` is uint8 ``[patches, 3*P*P]`` (one frame per row, images) or
    ``[patches, 3*T*P*P]`` (rows that keep their T frames: a video's); the result is
    ``[patches, 3*T*P*P]`` in ``dtype``: one gather through the per-channel 256-entry
    :func:`pixel_table` (or ``table``), each image row's frame then repeated T times.
    ``videos=True`` takes the video processor's table (``pixel_table(..., videos=True)``:
    its fused rescale + normalise rounds differently from the image processor's) and
    requires rows of 3*T*P*P bytes.

    Exactness: with ``dtype=torch.float32`` the result is bit for bit the float32 the HF
    processor computes (and mmloader's ``pixel_format="float32"``); with ``torch.bfloat16``
    it is exactly those values ``.to(torch.bfloat16)`` (round to nearest even, =
    ``pixel_format="bfloat16"``).  Every entry of the table is the reference's value, and a
    gather copies values without arithmetic.

    ``image_grid_thw`` (optional; the ``video_grid_thw`` with ``videos=True``) is checked
    against the row count when it is on the CPU (a GPU grid is not read back, which would
    synchronise).  P and T default to the preset's (``model_dir`` overrides them, like mean
    and std).  ``vision_config=loader.vision_config`` takes patch sizes, mean and std from the
    loader that made the batch (no preset to repeat; ``mmloader.torch.Loader.expand_pixels``
    does that for a whole batch).
    """
    if vision_config is not None:
        v = vision_config
        patch_size = patch_size or int(v["patch_size"])
        temporal_patch_size = temporal_patch_size or int(v["temporal_patch_size"])
        image_mean = image_mean if image_mean is not None else v["image_mean"]
        image_std = image_std if image_std is not None else v["image_std"]
    if pixel_values.dtype != torch.uint8 or pixel_values.dim() != 2:
        raise TypeError(
            "expand_pixels: pixel_values must be a 2-D uint8 tensor (the "
            f"pixel_format='uint8' batches), got {pixel_values.dtype} "
            f"{tuple(pixel_values.shape)}"
        )
    if dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(
            f"expand_pixels: dtype must be torch.float32 or torch.bfloat16, got {dtype}"
        )
    if patch_size is None or temporal_patch_size is None:
        cfg = _preset_vision(preset, model_dir)
        patch_size = patch_size or int(cfg["patch_size"])
        temporal_patch_size = temporal_patch_size or int(cfg["temporal_patch_size"])
    P, T = int(patch_size), int(temporal_patch_size)
    n, cols = pixel_values.shape
    if cols == 3 * P * P and not videos:
        frames = 1
    elif cols == 3 * T * P * P:
        frames = T
    else:
        sizes = (
            f"are not 3*T*P*P = {3 * T * P * P} (video rows keep their T frames)"
            if videos
            else f"are neither 3*P*P = {3 * P * P} nor 3*T*P*P = {3 * T * P * P}"
        )
        raise ValueError(
            f"expand_pixels: rows of {cols} bytes {sizes} (patch_size {P}, temporal_patch_size "
            f"{T}): pass vision_config=loader.vision_config (the preset is {preset!r})"
        )
    if image_grid_thw is not None and image_grid_thw.device.type == "cpu":
        g = image_grid_thw.reshape(-1, 3).to(torch.int64)
        want = int((g[:, 0] * g[:, 1] * g[:, 2]).sum()) if g.shape[0] else 0
        placeholder = n == 1 and g.shape[0] == 1 and int(g[0, 0]) == 0
        if want != n and not placeholder:
            raise ValueError(
                f"expand_pixels: the grid holds {want} patches but pixel_values has {n} rows"
            )
    if table is None:
        table = pixel_table(
            preset,
            model_dir=model_dir,
            image_mean=image_mean,
            image_std=image_std,
            rescale_factor=rescale_factor,
            videos=videos,
        )
    if tuple(table.shape) != (3, 256):
        raise ValueError(f"expand_pixels: table must be [3, 256], got {tuple(table.shape)}")
    if pixel_values.device.type == "cpu":  # the core's loop: one lookup per value, no index
        out = torch.empty((n, 3 * T * P * P), dtype=dtype)
        dst = out.view(torch.int16) if dtype == torch.bfloat16 else out
        _core.expand_pixels(
            pixel_values.contiguous().numpy(),
            dst.numpy(),
            table.to(torch.float32).contiguous().numpy(),
            P,
            frames,
            T,
            dtype == torch.bfloat16,
        )
        return out
    flat = _table_on(table.to(torch.float32).cpu(), pixel_values.device, dtype)
    return _gather(flat, pixel_values, 3 * P * P * frames, T if frames == 1 else 1)


def _gather(flat: torch.Tensor, u8: torch.Tensor, cols: int, repeat: int) -> torch.Tensor:
    """flat[c*256 + byte] for every byte of u8 [n, cols] (channel c = its third of the row),
    each row's values repeated `repeat` times per channel: [n, 3 * repeat * cols/3].

    What a GPU runs: index_select of each value once through an int32 index, then one
    broadcast copy into the repeats.  On an H200 (262144 rows of 3x14x14, T=2) it wrote
    float32 at 618 GB/s and bfloat16 at 352 where one advanced-indexing gather through the
    index broadcast over the repeats (written once, but indexed per output value) ran at
    376 / 191, bit for bit the same output.  The CPU tests run it against the core's loop
    (mml_pixels_expand, what expand_pixels runs on the CPU)."""
    n, pp = u8.shape[0], cols // 3
    offset = torch.arange(0, 768, 256, dtype=torch.int32, device=u8.device).view(1, 3, 1)
    idx = (u8.reshape(n, 3, pp).to(torch.int32) + offset).reshape(-1)
    vals = torch.index_select(flat, 0, idx).view(n, 3, 1, pp)
    return vals.expand(n, 3, repeat, pp).reshape(n, 3 * repeat * pp)


#: mmloader.Loader's keywords: Loader below takes each of them (tests/test_stubs.py checks
#: that its signature names each with Loader's type and default, but those of _OWN_DEFAULTS)
_LOADER_PARAMS = inspect.signature(_loader.Loader.__init__).parameters
_LOADER_KEYWORDS = tuple(_LOADER_PARAMS)[2:]
#: device has no row (a "cuda:N" string): Loader's default, not spelled again
_DEVICE_DEFAULT: str = _LOADER_PARAMS["device"].default
#: the keywords whose default here is None, resolved by ``keys`` or ``device`` (see Loader's
#: docstring)
#: the pixel_format choices whose floats this adapter makes (from uint8 the engine ships)
_CONSUMER_FORMATS = tuple(c for c in OPTIONS["pixel_format"]["choices"] if c.endswith("-consumer"))
_OWN_DEFAULTS = ("mrope", "attention_mask", "text_only_vision", "mm_token_type_ids", "pixel_format")


def _check_packed_qwen_keys(kwargs: Dict[str, Any], packing_keys: bool) -> None:
    """Packed batches for a Hugging Face Qwen-VL model: the key sets that keep each
    sample's attention to itself, or ConfigError (see the module docstring)."""
    why = None
    if packing_keys:
        why = (
            "packing_keys=True: transformers' Qwen-VL passes extra keyword arguments on to "
            "its vision tower, which takes cu_seqlens for its own (a shape error), and its "
            "language model reads no cu_seqlens"
        )
    elif not kwargs.get("mrope", True):
        why = (
            "mrope=False: 2-D position_ids carry no text row, so the model cannot tell "
            "the packed samples apart and attends across them"
        )
    elif kwargs.get("attention_mask", False):
        why = (
            "attention_mask=True: with a mask the model takes no per-sample boundaries "
            "from position_ids and attends across the packed samples"
        )
    if why is not None:
        raise _loader.ConfigError(
            f"mmloader.torch.Loader(packing=True, keys='qwen'): {why}.  The defaults "
            "(mrope=True, attention_mask=False, packing_keys=False) give batches a Hugging "
            "Face model attends per sample; keys='megatron' gives the packing tensors"
        )


class _Epoch(torch.utils.data.IterableDataset):
    """What ``Loader.dataset`` gives: the current epoch's batches, those already delivered
    as ``None`` (for accelerate's skip_first_batches to skip)."""

    def __init__(self, loader: "Loader") -> None:
        self._loader = loader

    def __iter__(self) -> Iterator[Any]:
        L = self._loader
        if not L._restored:
            raise _loader.StateError(
                "a trainer resumes this mmloader.torch.Loader in the middle of an epoch, but "
                "no state was restored into it: pass callbacks=[mmloader.torch."
                "TrainerCallback(loader)] to the Trainer (it saves the loader's state in "
                "each checkpoint and restores it on resume_from_checkpoint)"
            )
        for _ in range(L._inner.state_dict()["batch_in_epoch"]):
            yield None
        # not `yield from L`: closing this generator early (the trainer stops at its step
        # count) would close the loader too
        for batch in L:
            yield batch

    def __len__(self) -> int:
        return len(self._loader)


class Loader:
    """An :class:`mmloader.Loader` whose batches are ``dict[str, torch.Tensor]``.

    Arguments are those of :class:`mmloader.Loader` (see its docstring), with its types
    and defaults, except five whose default here is None: four decided by ``keys`` so that
    a batch fits the model (see the module docstring), and ``pixel_format`` by ``device``:

    - ``mrope``: None is True with ``keys="qwen"`` (Loader's False with "megatron");
    - ``mm_token_type_ids``: None is True with ``keys="qwen"`` (else Loader's False);
    - ``attention_mask``: None is ``not packing`` with ``keys="qwen"`` (else Loader's True);
    - ``text_only_vision``: None is "omit" with ``keys="qwen"`` and "placeholder" with
      "megatron" (every batch has the same keys);
    - ``pixel_format``: None is "float32-consumer" with a CUDA ``device`` (uint8 patches
      copied, 8x fewer host-to-device bytes than float32, expanded on the GPU) and
      Loader's "float32" otherwise.

    With ``pixel_format="float32-consumer"`` or ``"bfloat16-consumer"`` the engine makes
    uint8 patches and each batch's ``pixel_values`` and ``pixel_values_videos`` are expanded
    by :func:`expand_pixels` where they are (on the GPU after the copy), bit for bit the
    values ``"float32"`` / ``"bfloat16"`` give (the engine expanding them; what a CUDA
    ``device`` copies then is float).

    One argument is this adapter's own: ``packing_keys`` keeps the packing tensors
    (``cu_seqlens``, ``cu_seqlens_unpadded`` or ``cu_seqlens_padded``, ``max_seqlen``) in
    packed batches (None: only with ``keys="megatron"``).

    Iterating yields the batches of one epoch; iterate again for the next.  ``len()`` is
    the number of batches per epoch when that is known (padded batches, any global plan);
    with ``packing=True`` and no plan it raises TypeError, like a DataLoader over an
    IterableDataset.
    """

    @refuses_removed_pixel_options
    def __init__(
        self,
        data: _loader.DataSpec,
        *,
        packing_keys: Optional[bool] = None,
        data_format: str = DEFAULTS["data_format"],
        index: Union[None, bool, PathLike] = DEFAULTS["index"],
        image_root: Optional[PathLike] = DEFAULTS["image_root"],
        columns: Union[None, str, Mapping[str, str]] = DEFAULTS["columns"],
        micro_batch_size: Optional[int] = DEFAULTS["micro_batch_size"],
        seq_length: Optional[int] = DEFAULTS["seq_length"],
        shuffle: bool = DEFAULTS["shuffle"],
        seed: int = DEFAULTS["seed"],
        dp_rank: Optional[int] = DEFAULTS["dp_rank"],
        dp_size: Optional[int] = DEFAULTS["dp_size"],
        num_threads: Optional[int] = DEFAULTS["num_threads"],
        prefetch: int = DEFAULTS["prefetch"],
        start: str = DEFAULTS["start"],
        window: Optional[int] = DEFAULTS["window"],
        max_memory: Optional[int] = DEFAULTS["max_memory"],
        on_error: str = DEFAULTS["on_error"],
        max_error_rate: float = DEFAULTS["max_error_rate"],
        preset: str = DEFAULTS["preset"],
        model_dir: Optional[PathLike] = DEFAULTS["model_dir"],
        tokenizer: Any = DEFAULTS["tokenizer"],
        min_pixels: Optional[int] = DEFAULTS["min_pixels"],
        max_pixels: Optional[int] = DEFAULTS["max_pixels"],
        max_image_pixels: Optional[int] = DEFAULTS["max_image_pixels"],
        image_mean: Optional[Sequence[float]] = None,
        image_std: Optional[Sequence[float]] = None,
        legacy_resize: Optional[bool] = DEFAULTS["legacy_resize"],
        fast_decode: Optional[bool] = DEFAULTS["fast_decode"],
        strict_jpeg: bool = DEFAULTS["strict_jpeg"],
        image_route: str = DEFAULTS["image_route"],
        max_length: Optional[int] = DEFAULTS["max_length"],
        packing: bool = DEFAULTS["packing"],
        pack_length: Optional[int] = DEFAULTS["pack_length"],
        pad_to_multiple: Optional[int] = DEFAULTS["pad_to_multiple"],
        keys: str = DEFAULTS["keys"],
        shift_labels: bool = DEFAULTS["shift_labels"],
        label_mode: str = DEFAULTS["label_mode"],
        image_whitespace: str = DEFAULTS["image_whitespace"],
        qwen3_video_prompt: str = DEFAULTS["qwen3_video_prompt"],
        recipe: str = DEFAULTS["recipe"],
        cutoff_len: Optional[int] = DEFAULTS["cutoff_len"],
        mask_history: bool = DEFAULTS["mask_history"],
        train_on_prompt: bool = DEFAULTS["train_on_prompt"],
        enable_thinking: bool = DEFAULTS["enable_thinking"],
        image_max_pixels: Optional[int] = DEFAULTS["image_max_pixels"],
        image_min_pixels: Optional[int] = DEFAULTS["image_min_pixels"],
        video_fps: Optional[float] = DEFAULTS["video_fps"],
        video_maxlen: Optional[int] = DEFAULTS["video_maxlen"],
        video_max_pixels: Optional[int] = DEFAULTS["video_max_pixels"],
        video_min_pixels: Optional[int] = DEFAULTS["video_min_pixels"],
        model_max_length: Optional[int] = DEFAULTS["model_max_length"],
        video_min_frames: Optional[int] = DEFAULTS["video_min_frames"],
        video_max_frames: Optional[int] = DEFAULTS["video_max_frames"],
        data_flatten: bool = DEFAULTS["data_flatten"],
        data_packing: bool = DEFAULTS["data_packing"],
        dataloader_drop_last: bool = DEFAULTS["dataloader_drop_last"],
        mrope: Optional[bool] = None,
        attention_mask: Optional[bool] = None,
        text_only_vision: Optional[str] = None,
        pixel_format: Optional[str] = None,
        mm_token_type_ids: Optional[bool] = None,
        cycle: bool = DEFAULTS["cycle"],
        pin_memory: bool = DEFAULTS["pin_memory"],
        device: str = _DEVICE_DEFAULT,
        s3_endpoint: Optional[str] = DEFAULTS["s3_endpoint"],
        s3_region: Optional[str] = DEFAULTS["s3_region"],
        aws_access_key_id: Optional[str] = DEFAULTS["aws_access_key_id"],
        aws_secret_access_key: Optional[str] = DEFAULTS["aws_secret_access_key"],
        aws_session_token: Optional[str] = DEFAULTS["aws_session_token"],
        max_inflight: Optional[int] = DEFAULTS["max_inflight"],
        plan_only: bool = DEFAULTS["plan_only"],
        max_tokens_per_batch: Optional[int] = DEFAULTS["max_tokens_per_batch"],
        balance: Optional[str] = DEFAULTS["balance"],
        group_by_length: Optional[int] = DEFAULTS["group_by_length"],
        global_plan: bool = DEFAULTS["global_plan"],
        samples_per_epoch: Optional[int] = DEFAULTS["samples_per_epoch"],
        allow_mixture_change: bool = DEFAULTS["allow_mixture_change"],
        mixture_tolerance: Optional[float] = DEFAULTS["mixture_tolerance"],
        system_prompt: Optional[str] = DEFAULTS["system_prompt"],
        max_images_per_sample: int = DEFAULTS["max_images_per_sample"],
        max_sample_pixels: int = DEFAULTS["max_sample_pixels"],
        max_sample_pixel_bytes: int = DEFAULTS["max_sample_pixel_bytes"],
        max_record_bytes: int = DEFAULTS["max_record_bytes"],
        max_json_depth: int = DEFAULTS["max_json_depth"],
        max_object_bytes: int = DEFAULTS["max_object_bytes"],
        max_jpeg_scans: int = DEFAULTS["max_jpeg_scans"],
        max_shard_bytes: int = DEFAULTS["max_shard_bytes"],
        max_shard_records: int = DEFAULTS["max_shard_records"],
        allow_paths_outside_root: bool = DEFAULTS["allow_paths_outside_root"],
        allow_remote_images_in_local_data: bool = DEFAULTS["allow_remote_images_in_local_data"],
        fetch_timeout_s: float = DEFAULTS["fetch_timeout_s"],
        fetch_stall_s: float = DEFAULTS["fetch_stall_s"],
        fetch_min_rate: float = DEFAULTS["fetch_min_rate"],
        fetch_max_retries: int = DEFAULTS["fetch_max_retries"],
        fetch_retry_budget_s: float = DEFAULTS["fetch_retry_budget_s"],
        next_timeout_s: float = DEFAULTS["next_timeout_s"],
    ) -> None:
        given = locals()
        kwargs: Dict[str, Any] = {k: given[k] for k in _LOADER_KEYWORDS}
        # this adapter's own defaults (None in its signature: see the class docstring)
        qwen = keys == "qwen"
        if text_only_vision is None:
            # Megatron keys: a fixed key set (the zero-patch placeholder), so a forward step
            # reads the same keys from every batch
            kwargs["text_only_vision"] = "omit" if qwen else "placeholder"
        for name, qwen_value in (
            ("mrope", True),
            ("mm_token_type_ids", True),
            ("attention_mask", not packing),
        ):
            if kwargs[name] is None:
                kwargs[name] = qwen_value if qwen else DEFAULTS[name]
        if packing_keys is None:
            packing_keys = not qwen
        self._packed_qwen = qwen and packing
        if self._packed_qwen:
            _check_packed_qwen_keys(kwargs, packing_keys)
        self._drop = () if packing_keys else _PACKING_KEYS
        if pixel_format is None:
            on_gpu = torch.device(device).type == "cuda"
            pixel_format = "float32-consumer" if on_gpu else DEFAULTS["pixel_format"]
        #: the pixel_format this loader runs with (its None resolved)
        self.pixel_format: str = pixel_format
        consumer = pixel_format in _CONSUMER_FORMATS
        if consumer:
            kwargs["pixel_format"] = "uint8"  # the engine's part; expanded in __next__
        else:
            kwargs["pixel_format"] = pixel_format
        self._expand: Optional[Dict[str, Any]] = None
        self._restored = False
        self._inner = _loader.Loader(data, **kwargs)
        if pin_memory and torch.cuda.is_available() and self._inner.stats()["pinned"]:
            # torch answers is_pinned() False for every pointer until it has initialised
            # CUDA itself (ATen's Context::isPinnedPtr): the batches read before the
            # trainer's first CUDA call would look pageable (and .pin_memory() copy them)
            torch.cuda.init()
        if consumer:
            v = self._inner.vision_config
            ms = dict(image_mean=v["image_mean"], image_std=v["image_std"])
            self._expand = dict(
                patch_size=int(v["patch_size"]),
                temporal_patch_size=int(v["temporal_patch_size"]),
                dtype=torch.bfloat16 if pixel_format.startswith("bfloat16") else torch.float32,
            )
            self._tables = (pixel_table(**ms), pixel_table(**ms, videos=True))

    # ---- iteration (DataLoader-like) ---------------------------------------------------
    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        return self

    def __next__(self) -> Dict[str, torch.Tensor]:
        """The next batch; StopIteration at the end of each epoch (unless cycle=True)."""
        batch = next(self._inner)
        out = {k: torch.from_dlpack(v) for k, v in batch.items() if k not in self._drop}
        if self._packed_qwen:
            # transformers builds the per-sample attention of a packed row from
            # position_ids[0] only when the forward runs without a KV cache, and the Qwen-VL
            # configs default to use_cache=True (transformers' masking_utils)
            # (a 0-d tensor, so the batch stays a dict of tensors that .to() / .clone() take)
            out["use_cache"] = torch.zeros((), dtype=torch.bool)
        if self._expand is not None:
            if "pixel_values" in out:
                out["pixel_values"] = self._expanded(out["pixel_values"], out["image_grid_thw"])
            if "pixel_values_videos" in out:
                out["pixel_values_videos"] = expand_pixels(
                    out["pixel_values_videos"],
                    out["video_grid_thw"],
                    table=self._tables[1],
                    videos=True,
                    **self._expand,
                )
        return out

    def _expanded(self, pixels: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        assert self._expand is not None
        out = expand_pixels(pixels, grid, table=self._tables[0], **self._expand)
        if pixels.shape[0] == 1:
            # perhaps the text-only placeholder (grid t == 0): zeros in the float formats;
            # decided on the device, without reading the grid back
            out = torch.where(
                grid[:1, :1] != 0, out, torch.zeros((), dtype=out.dtype, device=out.device)
            )
        return out

    def __len__(self) -> int:
        return len(self._inner)

    def set_epoch(self, epoch: int) -> None:
        """Makes the next batch one of epoch ``epoch`` (like ``DistributedSampler.set_epoch``):
        its first, unless the loader already stands inside that epoch (restored by
        :meth:`load_state_dict`, or partly read): then it continues there, so a trainer that
        calls ``set_epoch`` at the start of each epoch never rewinds a restored loader."""
        if epoch != self._inner.epoch:
            self._inner.set_epoch(epoch)

    def expand_pixels(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        """``batch`` with its uint8 ``pixel_values`` / ``pixel_values_videos`` (from
        ``pixel_format="uint8"``) expanded to float32 by :func:`expand_pixels`, with this
        loader's vision settings (patch sizes, mean, std: no preset to repeat)."""
        out = dict(batch)
        v = self._inner.vision_config
        for key, grid, videos in (
            ("pixel_values", "image_grid_thw", False),
            ("pixel_values_videos", "video_grid_thw", True),
        ):
            if key in out and out[key].dtype == torch.uint8:
                out[key] = expand_pixels(out[key], out.get(grid), vision_config=v, videos=videos)
        return out

    # ---- what accelerate's skip_first_batches reads (transformers.Trainer's resume) ----
    #: batches come whole from the engine: no re-batching (a DataLoader's batch_size=None)
    batch_size = None
    drop_last = False
    prefetch_factor = None  # no worker processes: the engine prefetches (``prefetch``)

    @property
    def dataset(self) -> "torch.utils.data.IterableDataset[Any]":
        """The rest of the current epoch as an IterableDataset of whole batches, the
        batches this loader already delivered in the epoch standing first as ``None``:
        accelerate's ``skip_first_batches`` (what ``Trainer`` calls on resume) skips those
        and continues exactly where a restored loader stands (see :class:`TrainerCallback`).
        """
        return _Epoch(self)

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
        self._restored = True

    # ---- the rest ---------------------------------------------------------------------
    @property
    def loader(self) -> "_loader.Loader":
        """The underlying :class:`mmloader.Loader` (batches of :class:`mmloader.Tensor`)."""
        return self._inner

    def stats(self) -> "_loader.LoaderStats":
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
