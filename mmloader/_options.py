"""The engine's option table (csrc/core/loader/options.c) on the Python side.

Every option of :class:`mmloader.Loader` is one row of that table: its name, type,
default, bounds, choices and doc.  This module reads it once (``OPTIONS``) and builds what
other code would otherwise spell by hand: the Loader keywords' defaults (``DEFAULTS``) and
the command lines' flags (``add_flags`` / ``flag_kwargs``: ``--micro-batch-size`` for
``micro_batch_size``, ``--mmloader-num-threads`` under Megatron's prefix; their help is the
doc's first sentence and the table's default).  A flag left out is not passed, so the Loader
takes the table's default.
"""

from __future__ import annotations

import argparse
import re
import functools
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, TypeVar

from . import _core

#: The table by name: type, default, min, max, choices, fingerprint, internal, secret,
#: python (resolved in Python, not by the engine), doc.
OPTIONS: Dict[str, Dict[str, Any]] = {o["name"]: o for o in _core.loader_options()}
#: Every Loader keyword that is a row, and its default.
DEFAULTS: Dict[str, Any] = {k: o["default"] for k, o in OPTIONS.items() if not o["internal"]}

_TYPES = {"int": int, "float": float, "str": str}


def summary(doc: str) -> str:
    """The first sentence of a row's doc (the command lines' help)."""
    return re.split(r"(?<=\.)\s+(?=[A-Z\"`(])", doc.strip(), maxsplit=1)[0]


def flag(name: str, prefix: str = "--") -> str:
    """The command-line flag of option `name`: prefix + the name with dashes."""
    return prefix + name.replace("_", "-")


def _dest(name: str, prefix: str) -> str:
    return flag(name, prefix).lstrip("-").replace("-", "_")


def add_flags(
    parser: Any,
    names: Sequence[str],
    prefix: str = "--",
    defaults: Optional[Mapping[str, Any]] = None,
) -> None:
    """One flag per option of `names` on an argparse parser (or group), typed, with the
    row's choices; booleans get ``--x`` / ``--no-x``.  Every default is None (not given:
    the Loader takes the table's), except those of `defaults`: a command's own default for
    an option (the demo's ``tokenizer="tiny"``), shown in its help as the command's."""
    own = dict(defaults or {})
    for name in names:
        o = OPTIONS[name]
        text = summary(o["doc"])
        if name in own:
            text += f" (default here: {own[name]})"
        elif o["default"] is not None:
            text += f" (default: {o['default']})"
        kw: Dict[str, Any] = dict(
            dest=_dest(name, prefix), default=own.get(name), help=text.replace("%", "%%")
        )
        if o["type"] == "bool":
            kw["action"] = argparse.BooleanOptionalAction
        elif o["type"] == "enum":
            kw["choices"] = o["choices"]
        else:
            kw["type"] = _TYPES[o["type"]]
            kw["metavar"] = "N" if o["type"] != "str" else None
        parser.add_argument(flag(name, prefix), **kw)


def flag_kwargs(args: Any, names: Sequence[str], prefix: str = "--") -> Dict[str, Any]:
    """Loader keywords from the flags add_flags made: only those given."""
    out: Dict[str, Any] = {}
    for name in names:
        v = getattr(args, _dest(name, prefix), None)
        if v is not None:
            out[name] = v
    return out


# ---- the pixel knobs before pixel_format was the only one -------------------------------
#
# compact_pixels= (the engine's float formats decoded into uint8 rows and expanded at
# emission, or written directly) and mmloader.torch.Loader's wire_format= (uint8 from the
# engine, expanded by the consumer) are spellings of pixel_format now; docs/pixels.md has
# the table.  Passing either is a ConfigError that names the pixel_format to write instead.
REMOVED_PIXEL_OPTIONS = ("compact_pixels", "wire_format")


def pixel_format_for(
    pixel_format: Optional[str],
    compact_pixels: Optional[bool] = None,
    wire_format: Optional[str] = None,
) -> Optional[str]:
    """The pixel_format that gives what the old spellings asked for: ``pixel_format``
    (None: the adapters' default) with ``compact_pixels`` and/or ``wire_format`` as
    given (None: not given).  None when no pixel_format says it (a wire_format that was
    an error then too)."""
    choices = OPTIONS["pixel_format"]["choices"]
    fmt = pixel_format or DEFAULTS["pixel_format"]
    dtype = str(fmt).split("-")[0]  # the choices without a "-": the dtypes
    if fmt not in choices or wire_format not in (None, fmt, dtype, "uint8"):
        return None
    if dtype == "uint8":
        return dtype
    if wire_format == "uint8":
        return f"{dtype}-consumer"
    if compact_pixels is False or fmt == f"{dtype}-decode":
        return f"{dtype}-decode"
    return dtype if wire_format is not None or compact_pixels else fmt


def removed_pixel_option_error(given: Mapping[str, Any]) -> _core.ConfigError:
    """The ConfigError for keywords `given` holding compact_pixels or wire_format."""
    old = {k: given[k] for k in REMOVED_PIXEL_OPTIONS if k in given}
    fmt = given.get("pixel_format")
    new = pixel_format_for(fmt, old.get("compact_pixels"), old.get("wire_format"))
    what = ", ".join(f"{k}={v!r}" for k, v in old.items())
    with_fmt = f" with pixel_format={fmt!r}" if fmt is not None else ""
    if new is None:
        fix = f"{what}{with_fmt} was not a valid combination either"
    elif "wire_format" in old and old["wire_format"] is None and new != "uint8":
        # "uint8 with a CUDA device": mmloader.torch.Loader's pixel_format=None
        dtype = new.split("-")[0]
        fix = (
            f"{what}{with_fmt} was pixel_format='{dtype}-consumer' with a CUDA device and "
            f"{new!r} otherwise" + (", what pixel_format=None does" if fmt is None else "")
        )
    else:
        fix = f"pixel_format={new!r} gives what {what}{with_fmt} did"
    return _core.ConfigError(
        f"{' and '.join(old)} {'are' if len(old) > 1 else 'is'} no longer an option: "
        f"{fix}.  pixel_format alone says what pixel_values holds and where its floats are "
        "made: " + ", ".join(OPTIONS["pixel_format"]["choices"]) + " (docs/pixels.md has "
        "the old spellings and their new ones)"
    )


_F = TypeVar("_F", bound=Callable[..., None])


def refuses_removed_pixel_options(init: _F) -> _F:
    """An ``__init__`` that raises :func:`removed_pixel_option_error` when given
    compact_pixels= or wire_format= (type checkers still see its own signature)."""

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        if any(k in kwargs for k in REMOVED_PIXEL_OPTIONS):
            raise removed_pixel_option_error(kwargs)
        init(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]
