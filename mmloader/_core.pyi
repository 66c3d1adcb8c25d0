# Type stub of mmloader._core, the C extension (csrc/py/*.c).  It declares every name the
# module exports, public API and test hooks alike; tests/test_packaging.py checks that the
# names here and the module's are the same set.  Dicts whose keys are documented in the
# docstrings (stats, info, plans, probes) are typed Dict[str, Any].
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
    overload,
)

import numpy as np
from typing_extensions import Buffer, TypeAlias

# what the C functions take as a buffer (bytes, bytearray, memoryview, NumPy arrays, ...)
_BufferLike: TypeAlias = Union[Buffer, np.ndarray]

kDLCPU: int
kDLCUDA: int
kDLCUDAHost: int

# ---- exceptions ---------------------------------------------------------------------------

class Error(RuntimeError):
    """Base class of mmloader errors."""

class ConfigError(Error, ValueError):
    """Invalid loader or processor configuration."""

class StateError(Error, ValueError):
    """A state_dict that does not fit this loader."""

class SampleError(Error):
    """A sample could not be produced (bad record, image, fetch, or too long)."""

class FetchError(SampleError):
    """A remote object could not be fetched."""

class CudaError(Error):
    """CUDA is unavailable or failed."""

class OutOfMemoryError(Error, MemoryError):
    """The engine could not allocate memory (also a MemoryError)."""

# ---- tensors ------------------------------------------------------------------------------

class Tensor:
    """A batch tensor: zero-copy view of a pooled buffer (torch.from_dlpack(t) / t.numpy())."""

    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def ndim(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def device(self) -> str: ...
    @property
    def is_pinned(self) -> bool: ...
    def numpy(self) -> Any: ...
    def __len__(self) -> int: ...
    def __dlpack__(
        self,
        *,
        stream: Optional[Any] = ...,
        max_version: Optional[Tuple[int, int]] = ...,
        dl_device: Optional[Tuple[int, int]] = ...,
        copy: Optional[bool] = ...,
    ) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...

# ---- engine classes -----------------------------------------------------------------------

class Tokenizer:
    """Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json."""

    def __init__(
        self, path: Optional[Any] = ..., json: Optional[Union[str, bytes]] = ...
    ) -> None: ...
    def encode(self, text: Union[str, bytes]) -> List[int]: ...
    def encode_batch(
        self, texts: Iterable[Union[str, bytes]], num_threads: int = ...
    ) -> List[List[int]]: ...
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...
    def token_to_id(self, token: str, /) -> Optional[int]: ...
    def id_to_token(self, id: int, /) -> Optional[str]: ...
    def is_special(self, id: int, /) -> bool: ...
    @property
    def vocab_size(self) -> int: ...

class VisionProcessor:
    """Native Qwen-VL image preprocessing with a reusable scratch."""

    def __init__(self, cfg: Mapping[str, Any], pixel_format: str = ...) -> None: ...
    def process(
        self, items: Sequence[Tuple[Any, ...]], /
    ) -> Tuple[Buffer, int, int, List[Tuple[int, int, int]]]:
        """items: (0, encoded) or (1, rgb_buffer, height, width); -> (buffer, rows, cols,
        grids)."""

class Fetcher:
    """One I/O thread with a libcurl multi handle; 0 means the default."""

    def __init__(
        self,
        *,
        access_key: Optional[str] = ...,
        secret_key: Optional[str] = ...,
        session_token: Optional[str] = ...,
        region: Optional[str] = ...,
        endpoint: Optional[str] = ...,
        max_inflight: int = ...,
        max_retries: int = ...,
        timeout_s: float = ...,
        connect_timeout_s: float = ...,
        stall_s: float = ...,
        backoff_base_s: float = ...,
        backoff_max_s: float = ...,
        range_chunk: int = ...,
        list_page_size: int = ...,
        io_threads: int = ...,
        ca_bundle: Optional[str] = ...,
        max_object_bytes: int = ...,
        min_rate: float = ...,
        retry_budget_s: float = ...,
        whole_cache_bytes: int = ...,
    ) -> None: ...
    def __enter__(self) -> "Fetcher": ...
    def __exit__(self, *exc: object) -> None: ...
    def get(self, url: str, offset: int = ..., length: int = ...) -> bytes: ...
    def get_many(self, urls: Iterable[str], *, on_error: str = ...) -> List[Optional[bytes]]: ...
    def size(self, url: str, /) -> int: ...
    def list(self, prefix: str, pattern: Optional[str] = ...) -> List[str]: ...
    def stats(self) -> Dict[str, Any]: ...
    def close(self) -> None: ...

class DeviceStage:
    """The loader's host-to-device copy stage on its own (tests, benchmarks)."""

    def __init__(self, device: int = ..., max_cached_bytes: int = ...) -> None: ...
    def copy(self, arrays: Mapping[str, Any], /) -> Dict[str, Tensor]: ...
    def pinned(
        self, arrays: Mapping[str, Any], stream: Optional[Any] = ...
    ) -> Dict[str, Tensor]: ...
    @overload
    def bench(
        self,
        nbytes: int,
        ntensors: int,
        iters: int,
        *,
        hold: bool = ...,
        timings: Literal[False] = ...,
    ) -> float: ...
    @overload
    def bench(
        self, nbytes: int, ntensors: int, iters: int, *, hold: bool = ..., timings: Literal[True]
    ) -> Tuple[float, float]: ...
    def usage(self) -> Dict[str, int]: ...
    def stats(self) -> Dict[str, Dict[str, int]]: ...
    def close(self) -> None: ...

class _Loader:
    """Engine of mmloader.Loader (use that class)."""

    def __init__(self, config: Dict[str, Any], tokenizer: Tokenizer) -> None: ...
    def next(self) -> Dict[str, Tensor]: ...
    def cursor(self) -> Tuple[int, int, int]: ...
    def seek(self, epoch: int, pos: int, batch_in_epoch: int, ahead: int = ..., /) -> None: ...
    def seek_plan(self, epoch: int, pos: int, batch_in_epoch: int, q0: int, /) -> None: ...
    def plan_info(self, epoch: int, /) -> Optional[Dict[str, int]]: ...
    def plan_position(self) -> Optional[Tuple[int, int]]: ...
    def set_consumer_stream(self, device: int, stream: int, /) -> None: ...
    def info(self) -> Dict[str, Any]: ...
    def stats(self) -> Dict[str, Any]: ...
    def options(self) -> Dict[str, Any]: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...

# ---- options ------------------------------------------------------------------------------

def loader_options() -> List[Dict[str, Any]]: ...
def check_loader_options(options: Mapping[str, Any], /) -> Dict[str, Any]: ...

# ---- fetching (one-shot, with a Fetcher's keyword arguments) ------------------------------

def fetch_get(url: str, offset: int = ..., length: int = ..., **cfg: Any) -> bytes: ...
def fetch_many(
    urls: Iterable[str], *, on_error: str = ..., **cfg: Any
) -> List[Optional[bytes]]: ...
def fetch_size(url: str, **cfg: Any) -> int: ...
def fetch_list(prefix: str, pattern: Optional[str] = ..., **cfg: Any) -> List[str]: ...
def redact(text: str, /) -> str: ...

# ---- records and templates ----------------------------------------------------------------

def parse_record(
    line: Union[str, bytes], max_images_per_sample: int = ..., max_json_depth: int = ...
) -> Dict[str, Any]: ...
def render_record(
    line: Union[str, bytes],
    style: str = ...,
    image_tokens: Union[int, Sequence[int], None] = ...,
    image_whitespace: str = ...,
    video_tokens: Optional[Sequence[Tuple[Any, ...]]] = ...,
) -> str: ...
def encode_record(
    line: Union[str, bytes],
    tokenizer: Tokenizer,
    style: str = ...,
    label_mode: str = ...,
    image_tokens: Union[int, Sequence[int], None] = ...,
    image_whitespace: str = ...,
    video_tokens: Optional[Sequence[Tuple[Any, ...]]] = ...,
) -> Tuple[List[int], List[int]]: ...
def json_dumps(text: Union[str, bytes], /) -> str: ...

# ---- images -------------------------------------------------------------------------------

def smart_resize(
    height: int,
    width: int,
    factor: int = ...,
    min_pixels: int = ...,
    max_pixels: int = ...,
    legacy: int = ...,
) -> Tuple[int, int]: ...
def vision_plan(cfg: Mapping[str, Any], data: _BufferLike, /) -> Dict[str, Any]: ...
def image_decode(
    data: _BufferLike, scale_denom: int = ..., alpha: int = ..., max_image_pixels: int = ...
) -> Tuple[bytes, int, int]: ...
def data_uri_decode(ref: str, /) -> bytes: ...
def scratch_mapped() -> Tuple[int, int]: ...
def decode_only(
    images: Sequence[_BufferLike], scales: Optional[Sequence[int]] = None, /
) -> int: ...
def resize_bicubic(
    rgb: _BufferLike, height: int, width: int, dst_h: int, dst_w: int, h_first: bool = ..., /
) -> bytes: ...
def expand_pixels(
    src_u8: _BufferLike,
    dst: _BufferLike,
    table_f32_768: _BufferLike,
    patch_size: int,
    frames: int,
    temporal_patch_size: int,
    bfloat16: bool,
    /,
) -> None: ...

# ---- videos -------------------------------------------------------------------------------

def video_probe(
    name: str,
    *,
    data: Optional[_BufferLike] = ...,
    fetcher: Optional[Fetcher] = ...,
    max_bytes: int = ...,
    max_pixels: int = ...,
) -> Dict[str, Any]: ...
def video_decode(
    name: str,
    indices: Sequence[int],
    *,
    data: Optional[_BufferLike] = ...,
    fetcher: Optional[Fetcher] = ...,
    max_bytes: int = ...,
    threads: int = ...,
    block: int = ...,
    max_pixels: int = ...,
) -> Dict[str, Any]: ...
def video_sample(line: str, total_frames: int, fps: float, /) -> Dict[str, Any]: ...
def video_frame_size(
    line: str, factor: int, nframes: int, height: int, width: int, /
) -> Tuple[int, int]: ...
def video_list_frame_size(
    line: str, factor: int, height: int, width: int, /
) -> Tuple[int, int]: ...
def video_timestamps(
    indices: Sequence[int], fps: float, temporal_patch_size: int, /
) -> List[float]: ...
def resize_aa_bicubic(
    buf: _BufferLike, planes: int, w: int, h: int, out_w: int, out_h: int, round: bool = ..., /
) -> bytes: ...
def resize_aa_bicubic_u8(
    buf: _BufferLike, planes: int, w: int, h: int, out_w: int, out_h: int, /
) -> bytes: ...

# ---- dataset index ------------------------------------------------------------------------

def build_index(
    loader: _Loader,
    shard: int,
    out: str,
    threads: int = ...,
    progress: Optional[Callable[..., Any]] = ...,
) -> Dict[str, Any]: ...
def read_index(path: str, /) -> Dict[str, Any]: ...
def index_path(shard: str, out: Optional[str] = ..., /) -> str: ...
def loader_shards(loader: _Loader, /) -> List[str]: ...

# ---- CUDA (the runtime is loaded at run time; nothing is linked) --------------------------

def cuda_available() -> bool: ...
def cuda_device_count() -> int: ...
def cuda_current_device() -> int: ...
def cuda_load() -> str: ...
def cuda_unavailable_reason() -> Optional[str]: ...

# ---- test hooks ---------------------------------------------------------------------------

def _collate(
    samples: Sequence[Mapping[str, Any]], cfg: Dict[str, Any], /
) -> List[Tuple[Dict[str, Tensor], Dict[str, int]]]: ...
def _mrope_positions(
    ids: Sequence[int],
    grids: Sequence[Tuple[int, int, int]],
    spatial_merge: int,
    image_pad_id: int,
    /,
) -> Tuple[bytes, int]: ...
def _sha256(data: _BufferLike, /) -> bytes: ...
def _sigv4_authorization(
    method: str,
    uri: str,
    query: str,
    headers: Sequence[Tuple[str, str]],
    payload_hash: str,
    date: str,
    region: str,
    service: str,
    access_key: str,
    secret_key: str,
    /,
) -> str: ...
def _tok_nfc(text: str, /) -> str: ...
def _tok_nfc_quick(text: str, /) -> bool: ...
def _tok_pre_split(text: str, /) -> List[str]: ...
