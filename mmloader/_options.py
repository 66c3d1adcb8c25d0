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
from typing import Any, Dict, Mapping, Optional, Sequence

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
