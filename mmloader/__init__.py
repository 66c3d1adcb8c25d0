"""mmloader: a native multimodal data loader for Qwen-VL style supervised fine-tuning."""

from . import _core  # noqa: F401
from ._core import (  # noqa: F401
    ConfigError,
    CudaError,
    Error,
    FetchError,
    OutOfMemoryError,
    SampleError,
    StateError,
)
from .template import encode_chat, render_chat  # noqa: F401

__version__ = "0.1.0"
from .tokenizer import Tokenizer  # noqa: E402,F401
from .vision import ImageProcessor, smart_resize  # noqa: F401,E402
from ._core import Tensor  # noqa: E402,F401
from .loader import Loader, LoaderStats  # noqa: E402,F401
from .mixture import Source  # noqa: E402,F401
from . import presets  # noqa: E402,F401
