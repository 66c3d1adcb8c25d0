# Type stubs of the public mmloader package: the C classes are declared in _core.pyi,
# the Python modules are re-exported and typed by their own annotations.
from . import presets as presets
from .template import encode_chat as encode_chat, render_chat as render_chat
from .tokenizer import Tokenizer as Tokenizer
from .vision import ImageProcessor as ImageProcessor, smart_resize as smart_resize
from .loader import Loader as Loader, LoaderStats as LoaderStats
from .mixture import Source as Source

from ._core import (
    ConfigError as ConfigError,
    CudaError as CudaError,
    Error as Error,
    FetchError as FetchError,
    OutOfMemoryError as OutOfMemoryError,
    SampleError as SampleError,
    StateError as StateError,
    Tensor as Tensor,
)

__version__: str
