"""Qwen-VL presets: vision preprocessing numbers and chat-template style per model family.

`vision_config()` resolves, in increasing priority: the preset, a model directory's
`preprocessor_config.json`, explicit keyword overrides.  The dict it returns is what the C
core consumes (see csrc/include/mml/vision.h).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

from ._options import OPTIONS

PRESETS: Dict[str, Dict[str, Any]] = {
    "qwen2-vl": dict(
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
        min_pixels=3136,
        max_pixels=12845056,
        image_mean=[0.48145466, 0.4578275, 0.40821073],
        image_std=[0.26862954, 0.26130258, 0.27577711],
        video_min_pixels=3136,
        video_max_pixels=12845056,
        video_family="qwen2-vl",
        template="qwen2-vl",
    ),
    "qwen3-vl": dict(
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        min_pixels=65536,
        max_pixels=16777216,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        video_min_pixels=4096,
        video_max_pixels=25165824,
        video_family="qwen3-vl",
        template="qwen3-vl",
    ),
}
# Qwen2/2.5-VL checkpoints ship no video_preprocessor_config.json: their video processor
# takes min/max_pixels from preprocessor_config.json.  Qwen3-VL's has its own size
# (shortest_edge 4096, longest_edge 25165824).
PRESETS["qwen2.5-vl"] = dict(PRESETS["qwen2-vl"], video_family="qwen2.5-vl")

VISION_KEYS = (
    "patch_size",
    "merge_size",
    "temporal_patch_size",
    "min_pixels",
    "max_pixels",
    "image_mean",
    "image_std",
    "legacy_resize",
    "fast_decode",
    "max_image_pixels",
    "max_jpeg_scans",
    "pillow_h_first",
    "strict_jpeg",
    "image_route",
    "video_min_pixels",
    "video_max_pixels",
    "video_family",
)

# What a user's pipeline does with an image reference before the processor (docs: Loader)
IMAGE_ROUTES = tuple(OPTIONS["image_route"]["choices"])  # the option table's
VIDEO_FAMILIES = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl")

DEFAULT_MAX_IMAGE_PIXELS = 178956970  # Pillow's decompression-bomb error threshold


def _video_from_model_dir(model_dir: str, out: Dict[str, Any]) -> None:
    path = os.path.join(model_dir, "video_preprocessor_config.json")
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        vc = json.load(f)
    size = vc.get("size") or {}
    for src, dst in (
        ("shortest_edge", "video_min_pixels"),
        ("min_pixels", "video_min_pixels"),
        ("longest_edge", "video_max_pixels"),
        ("max_pixels", "video_max_pixels"),
    ):
        v = size.get(src, vc.get(src) if src.endswith("pixels") else None)
        if v is not None:
            out[dst] = int(v)


def _from_model_dir(model_dir: str) -> Dict[str, Any]:
    path = os.path.join(model_dir, "preprocessor_config.json")
    out: Dict[str, Any] = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            pc = json.load(f)
        _image_from_model_dir(pc, out)
        if not os.path.exists(os.path.join(model_dir, "video_preprocessor_config.json")):
            # no video config: the video processor reads these too
            for k in ("min_pixels", "max_pixels"):
                if k in out:
                    out["video_" + k] = out[k]
    _video_from_model_dir(model_dir, out)
    return out


def _image_from_model_dir(pc: Dict[str, Any], out: Dict[str, Any]) -> None:
    size = pc.get("size") or {}
    if "shortest_edge" in size:
        out["min_pixels"] = int(size["shortest_edge"])
    if "longest_edge" in size:
        out["max_pixels"] = int(size["longest_edge"])
    for k in ("min_pixels", "max_pixels", "patch_size", "merge_size", "temporal_patch_size"):
        if pc.get(k) is not None:
            out[k] = int(pc[k])
    for k in ("image_mean", "image_std"):
        if pc.get(k) is not None:
            out[k] = [float(x) for x in pc[k]]


def vision_config(
    preset: str = OPTIONS["preset"]["default"], model_dir: Optional[str] = None, **overrides: Any
) -> Dict[str, Any]:
    """Vision settings for `preset`, updated from `model_dir` and then `overrides`.

    Raises ValueError for an unknown preset, an unknown key or an inconsistent value.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    cfg = dict(PRESETS[preset])
    cfg.update(
        legacy_resize=False,
        fast_decode=False,
        max_image_pixels=DEFAULT_MAX_IMAGE_PIXELS,
        pillow_h_first=False,
        strict_jpeg=False,
        image_route="processor",
    )
    if model_dir is not None:
        if not os.path.isdir(model_dir):
            raise ValueError(f"model_dir {model_dir!r} is not a directory")
        cfg.update(_from_model_dir(model_dir))
    for k, v in overrides.items():
        if v is None:
            continue
        if k not in VISION_KEYS:
            raise ValueError(f"unknown vision option {k!r}")
        cfg[k] = v
    for k in ("patch_size", "merge_size", "temporal_patch_size"):
        if int(cfg[k]) < 1:
            raise ValueError(f"{k} must be >= 1, got {cfg[k]}")
    if not 0 < int(cfg["min_pixels"]) <= int(cfg["max_pixels"]):
        raise ValueError(
            f"need 0 < min_pixels <= max_pixels, got {cfg['min_pixels']}, {cfg['max_pixels']}"
        )
    for k in ("image_mean", "image_std"):
        if len(cfg[k]) != 3:
            raise ValueError(f"{k} needs 3 values, got {cfg[k]}")
    if any(float(s) == 0 for s in cfg["image_std"]):
        raise ValueError("image_std must not contain 0")
    if not 0 < int(cfg["video_min_pixels"]) <= int(cfg["video_max_pixels"]):
        raise ValueError(
            f"need 0 < video_min_pixels <= video_max_pixels, got "
            f"{cfg['video_min_pixels']}, {cfg['video_max_pixels']}"
        )
    if cfg["video_family"] not in VIDEO_FAMILIES:
        raise ValueError(
            f"video_family must be one of {VIDEO_FAMILIES}, got {cfg['video_family']!r}"
        )
    if "max_jpeg_scans" in cfg and (
        isinstance(cfg["max_jpeg_scans"], bool)
        or not isinstance(cfg["max_jpeg_scans"], int)
        or not 0 <= cfg["max_jpeg_scans"] < 2**31
    ):
        raise ValueError(
            f"max_jpeg_scans must be an int >= 0 (0: no limit), got {cfg['max_jpeg_scans']!r}"
        )
    if cfg["image_route"] not in IMAGE_ROUTES:
        raise ValueError(f"image_route must be one of {IMAGE_ROUTES}, got {cfg['image_route']!r}")
    return cfg


def template_style(preset: str) -> str:
    """The chat template family of a preset ("qwen2-vl" or "qwen3-vl")."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[preset]["template"]
