"""Inspect how mmloader reads a record and renders it with a Qwen-VL chat template.

The loader does this inside its C workers; these helpers run the same C code on one
record so you can check what the model will see:

    >>> import mmloader
    >>> print(mmloader.render_chat({"image": "a.jpg", "conversations": [
    ...     {"from": "human", "value": "<image>\\nWhat is this?"},
    ...     {"from": "gpt", "value": "A cat."}]}, preset="qwen2.5-vl", image_tokens=4))

Label modes (which tokens are trained; every other label is -100):
  "all_assistant"    every assistant turn's content and its closing "<|im_end|>\\n" (default)
  "last_assistant"   only the last assistant turn's content and closing "<|im_end|>\\n"
  "no_nonfinal_end"  every assistant turn's content; "<|im_end|>\\n" only on the last one
Image placeholder tokens are never trained.  A token that straddles the start of an
assistant turn's content (e.g. "\\n\\n" when the content starts with a newline) is trained.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Sequence, Tuple, Union

from . import _core
from ._options import DEFAULTS, OPTIONS
from .presets import template_style

LABEL_MODES = tuple(OPTIONS["label_mode"]["choices"])  # the option table's

Record = Union[str, bytes, Dict[str, Any]]
ImageTokens = Union[None, int, Sequence[int]]


def _line(record: Record) -> Union[str, bytes]:
    if isinstance(record, dict):
        return json.dumps(record, ensure_ascii=False)
    if isinstance(record, (str, bytes)):
        return record
    hint = (
        ' (a list of messages is a record\'s "messages": pass {"messages": [...]})'
        if isinstance(record, (list, tuple))
        else ""
    )
    raise TypeError(
        f"record must be a dict or a JSONL line (str or bytes), not {type(record).__name__}" + hint
    )


def parse_record(record: Record) -> Dict[str, Any]:
    """The neutral conversation of one record (a JSONL line or its dict).

    Returns {"messages": [{"role": str, "parts": [{"type": "text", "text": str} |
    {"type": "image", "image": int}]}], "images": [reference, ...]}, images in the order
    they appear.  Raises mmloader.SampleError for a bad record or an image count mismatch.
    """
    return _core.parse_record(_line(record))


def render_chat(
    record: Record,
    preset: str = DEFAULTS["preset"],
    image_tokens: ImageTokens = None,
    image_whitespace: str = DEFAULTS["image_whitespace"],
) -> str:
    """The text the chat template of `preset` renders for `record`, image pads expanded.

    image_tokens: the number of <|image_pad|> tokens of each image (one int for all, or
    one per image); required when the record has images.  image_whitespace: "in_place" or
    "qwen-vl-finetune" (see mmloader.Loader).
    """
    return _core.render_record(
        _line(record), template_style(preset), image_tokens, image_whitespace
    )


def encode_chat(
    record: Record,
    tokenizer: Any,
    preset: str = DEFAULTS["preset"],
    label_mode: str = DEFAULTS["label_mode"],
    image_tokens: ImageTokens = None,
    image_whitespace: str = DEFAULTS["image_whitespace"],
) -> Tuple[List[int], List[int]]:
    """(input_ids, labels) of `record` as the loader produces them, with `tokenizer` an
    mmloader.Tokenizer.  See the module docstring for label modes."""
    if label_mode not in LABEL_MODES:
        raise ValueError(f"unknown label_mode {label_mode!r}; choose one of {LABEL_MODES}")
    return _core.encode_record(
        _line(record), tokenizer, template_style(preset), label_mode, image_tokens, image_whitespace
    )


__all__ = ["LABEL_MODES", "parse_record", "render_chat", "encode_chat"]
