from . import functional  # noqa: F401
from .functional import InterpolationMode  # noqa: F401
