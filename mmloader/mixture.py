"""Dataset mixtures: :class:`Source`, mixture files, and how they reach the engine.

A mixture is a list of sources, each naming its shards, how many samples it contributes
per epoch (``weight``, ``repeat`` or ``choose``) and, optionally, its own settings that
override the Loader's for its samples.  The same mixture can be given three ways, which
give the same stream:

    Loader([Source("docvqa/*.jsonl", weight=0.3, max_pixels=2408448),
            Source("llava/*.jsonl", weight=0.6), Source("text/*.jsonl", weight=0.1)])
    Loader([{"data": "docvqa/*.jsonl", "weight": 0.3, "max_pixels": 2408448}, ...])
    Loader("mixture.yaml")     # or .json: {"sources": [...], "samples_per_epoch": N}

Blending happens in the engine (mml/mixture.h) as a pure function of (seed, epoch,
position): nothing here is per sample.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ._core import ConfigError
from .recipes import RECIPE_SETTINGS

PathLike = Union[str, "os.PathLike[str]"]

#: Loader settings a source may override (its samples use the source's value).
SOURCE_OVERRIDES = (
    "image_root",
    "columns",
    "min_pixels",
    "max_pixels",
    "max_image_pixels",
    "image_route",
    "image_whitespace",
    "system_prompt",
    "label_mode",
    "max_length",
    "recipe",
) + RECIPE_SETTINGS  # the recipes' own settings, per source too
_COUNTS = ("weight", "repeat", "choose")
_FIELDS = ("data", "name") + _COUNTS + SOURCE_OVERRIDES
_FILE_KEYS = ("sources", "samples_per_epoch")
_MIXTURE_EXT = (".yaml", ".yml", ".json")
_MIXTURE_MAX = 4 << 20  # bytes: a larger .json is data


def _number(label: str, key: str, v: Any, integer: bool = False) -> None:
    ok = not isinstance(v, bool) and isinstance(v, int if integer else (int, float))
    if not ok or v < 0 or v != v or v == float("inf"):
        kind = "a non-negative integer" if integer else "a finite number >= 0"
        raise ConfigError(f"source {label!r}: {key} must be {kind}, got {v!r}")


class Source:
    """One dataset of a mixture.

    Args:
        data: what ``Loader(data=...)`` takes for plain data: a path, glob, folder or URL,
            or a list of them.
        weight: relative share of the epoch.  The weighted sources share the epoch left
            after the fixed counts below, in proportion to their weights.
        repeat: a fixed count of ``round(repeat * len(source))`` samples per epoch
            (up-sampling above 1, down-sampling below).
        choose: a fixed count of exactly this many samples per epoch.
        name: how stats, messages and the state name the source (default: ``data``).
        **overrides: Loader settings for this source's samples: image_root, columns, min_pixels,
            max_pixels, max_image_pixels, image_route, image_whitespace, system_prompt,
            label_mode, max_length, recipe and its settings (cutoff_len, mask_history,
            train_on_prompt, enable_thinking, image_max_pixels, image_min_pixels, video_fps,
            video_maxlen, video_max_pixels, video_min_pixels; model_max_length,
            video_fps, video_min_frames, video_max_frames, video_max_pixels and
            video_min_pixels for recipe="qwen-vl-finetune"; see :mod:`mmloader.recipes`).

    Give at most one of weight, repeat and choose; none means ``repeat=1`` (each sample
    once per epoch).  Within a source the order is
    reshuffled every epoch; a source drawn more often than its size repeats with a fresh
    permutation, one drawn less often continues where the previous epoch stopped.
    """

    __slots__ = ("data", "name", "weight", "repeat", "choose", "overrides")

    def __init__(
        self,
        data: Union[PathLike, Sequence[PathLike]],
        *,
        weight: Optional[float] = None,
        repeat: Optional[float] = None,
        choose: Optional[int] = None,
        name: Optional[str] = None,
        **overrides: Any,
    ) -> None:
        paths: Union[str, List[str]]
        if isinstance(data, (str, os.PathLike)):
            paths = os.fspath(data)
        elif (
            isinstance(data, (list, tuple))
            and data
            and all(isinstance(x, (str, os.PathLike)) for x in data)
        ):
            paths = [os.fspath(x) for x in data]
        else:
            raise ConfigError(
                f"source {name!r}: data must be a path, glob, folder or URL, or "
                f"a non-empty list of them, got {data!r}"
            )
        label = name if name is not None else (paths if isinstance(paths, str) else ",".join(paths))
        if not isinstance(label, str) or not label:
            raise ConfigError(f"source name must be a non-empty string, got {name!r}")
        for k in overrides:
            if k not in SOURCE_OVERRIDES:
                raise ConfigError(
                    f"source {label!r}: unknown field {k!r} (a source takes {', '.join(_FIELDS)})"
                )
        given = [
            k
            for k, v in (("weight", weight), ("repeat", repeat), ("choose", choose))
            if v is not None
        ]
        if len(given) > 1:
            raise ConfigError(
                f"source {label!r}: give only one of weight, repeat and choose "
                f"(got {' and '.join(given)})"
            )
        if weight is not None:
            _number(label, "weight", weight)
        if repeat is not None:
            _number(label, "repeat", repeat)
        if choose is not None:
            _number(label, "choose", choose, integer=True)
        self.data = paths
        self.name = label
        self.weight = weight
        self.repeat = repeat
        self.choose = choose
        self.overrides = {k: v for k, v in overrides.items() if v is not None}

    @classmethod
    def from_dict(cls, d: Dict[str, Any], where: str = "") -> "Source":
        """A source from a dict with the same fields as the constructor."""
        if isinstance(d, Source):
            return d
        if not isinstance(d, dict):
            raise ConfigError(
                f"{where}a source must be a dict or mmloader.Source, got {type(d).__name__}"
            )
        label = d.get("name") or d.get("data")
        for k in d:
            if k not in _FIELDS:
                raise ConfigError(
                    f"{where}source {label!r}: unknown field {k!r} (a source "
                    f"takes {', '.join(_FIELDS)})"
                )
        if "data" not in d:
            raise ConfigError(f"{where}source {label!r}: no data")
        kw = dict(d)
        return cls(kw.pop("data"), **kw)

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"data": self.data, "name": self.name}
        for k in _COUNTS:
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        d.update(self.overrides)
        return d

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Source) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items() if k != "data")
        return f"mmloader.Source({self.data!r}, {args})"


def _is_mixture_file(p: str) -> bool:
    ext = os.path.splitext(p)[1].lower()
    if ext not in _MIXTURE_EXT or not os.path.isfile(p):
        return False
    if ext != ".json":
        return True
    # A .json data file is an array of records, or JSON lines named .json; a mixture is one
    # small object with a "sources" list.
    if os.path.getsize(p) > _MIXTURE_MAX:
        return False
    with open(p, "rb") as f:
        raw = f.read()
    if not raw.lstrip().startswith(b"{"):
        return False
    try:
        doc = json.loads(raw)
    except ValueError:
        return False
    return isinstance(doc, dict) and "sources" in doc


def _rebase(base: str, p: Any) -> Any:
    if isinstance(p, list):
        return [_rebase(base, x) for x in p]
    if not isinstance(p, str) or p.startswith(("http://", "https://", "s3://")):
        return p
    p = os.path.expanduser(p)
    return p if os.path.isabs(p) else os.path.join(base, p)


def load_mixture_file(path: PathLike) -> Tuple[List[Source], Optional[int]]:
    """Reads a YAML or JSON mixture file: ``{"sources": [...], "samples_per_epoch": N}``.

    Relative ``data`` and ``image_root`` paths are taken from the file's folder."""
    path = os.fspath(path)
    try:
        with open(path, "r", encoding="utf-8") as f:
            text = f.read()
        if path.lower().endswith(".json"):
            doc = json.loads(text)
        else:
            try:
                import yaml
            except ImportError:
                raise ConfigError(
                    f"mixture file {path}: reading YAML needs PyYAML "
                    "(pip install pyyaml), or write the file as JSON"
                ) from None
            doc = yaml.safe_load(text)
    except (OSError, ValueError) as e:
        raise ConfigError(f"mixture file {path}: {e}") from None
    except Exception as e:  # yaml.YAMLError
        raise ConfigError(f"mixture file {path}: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("sources"), list) or not doc["sources"]:
        raise ConfigError(
            f"mixture file {path}: expected a mapping with a non-empty 'sources' list"
        )
    for k in doc:
        if k not in _FILE_KEYS:
            raise ConfigError(
                f"mixture file {path}: unknown field {k!r} (a mixture file "
                f"takes {', '.join(_FILE_KEYS)})"
            )
    base = os.path.dirname(os.path.abspath(path))
    sources = []
    for i, d in enumerate(doc["sources"]):
        where = f"mixture file {path}, sources[{i}]: "
        if isinstance(d, dict):
            d = dict(d)
            for k in ("data", "image_root"):
                if k in d:
                    d[k] = _rebase(base, d[k])
        sources.append(Source.from_dict(d, where))
    spe = doc.get("samples_per_epoch")
    if spe is not None and (isinstance(spe, bool) or not isinstance(spe, int) or spe < 1):
        raise ConfigError(
            f"mixture file {path}: samples_per_epoch must be an integer >= 1, got {spe!r}"
        )
    return sources, spe


def resolve(data: Any) -> Optional[Tuple[List[Source], Optional[int]]]:
    """(sources, samples_per_epoch from a file) when `data` is a mixture, else None."""
    if isinstance(data, Source):
        return [data], None
    if isinstance(data, (str, os.PathLike)):
        p = os.fspath(data)
        return load_mixture_file(p) if _is_mixture_file(p) else None
    if isinstance(data, dict):
        raise ConfigError(
            "data: a single source is given as a list of one dict, or as mmloader.Source"
        )
    items = list(data) if isinstance(data, (list, tuple)) else None
    if not items or not any(isinstance(x, (Source, dict)) for x in items):
        return None
    if not all(isinstance(x, (Source, dict)) for x in items):
        raise ConfigError(
            "data mixes plain paths with sources: wrap every path in "
            "mmloader.Source(...) (or a dict)"
        )
    sources = [Source.from_dict(x, f"data[{i}]: ") for i, x in enumerate(items)]
    return sources, None


def check_names(sources: Sequence[Source]) -> None:
    seen = set()
    for s in sources:
        if s.name in seen:
            raise ConfigError(f"two sources are named {s.name!r}: give each a distinct name=")
        seen.add(s.name)


def settings_hash(d: Dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def describe_change(saved: Any, now: List[List[Any]]) -> List[str]:
    """What differs between two fingerprints' source lists ([name, data hash, samples,
    count, settings hash] each)."""
    if not isinstance(saved, list):
        return ["the state was saved without a mixture (plain data)"]
    old = {e[0]: e for e in saved if isinstance(e, list) and len(e) == 5}
    new = {e[0]: e for e in now}
    out = [f"source {n!r} added" for n in new if n not in old]
    out += [f"source {n!r} removed" for n in old if n not in new]
    for n, e in new.items():
        o = old.get(n)
        if o is None:
            continue
        if o[1] != e[1] or o[2] != e[2]:
            out.append(f"source {n!r}: its data changed ({o[2]} -> {e[2]} samples)")
        if o[3] != e[3]:
            out.append(f"source {n!r}: {o[3]} -> {e[3]} samples per epoch (reweighted)")
        if o[4] != e[4]:
            out.append(f"source {n!r}: its settings changed")
    if not out and [e[0] for e in saved] != [e[0] for e in now]:
        out.append("the sources are in a different order")
    return out
