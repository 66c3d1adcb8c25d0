"""Recipes: whose data path a source's samples follow (``Loader(recipe=...)``).

- ``"processor"`` (default): the Hugging Face processor given the images, with
  qwen-vl-utils' per-image keys honoured; the Qwen-VL chat templates.
- ``"llama-factory"``: LLaMA-Factory's supervised data path (v0.9.5: data/template.py,
  processor/supervised.py): its qwen2_vl template for Qwen2-VL / Qwen2.5-VL presets,
  qwen3_vl_nothink for Qwen3-VL (qwen3_vl with ``enable_thinking=True``), each message
  tokenized on its own, ``cutoff_len`` truncation as its ``infer_seqlen`` splits source
  and target, ``mask_history`` and ``train_on_prompt``, and its mm_plugin's Pillow
  pre-resize of images (``image_max_pixels``, ``image_min_pixels``; images read with
  ``convert("RGB")``: alpha dropped, no EXIF turn).  Its settings keep LLaMA-Factory's
  names and defaults (``LLAMA_FACTORY_DEFAULTS``).
- ``"qwen-vl-finetune"``: Qwen's own fine-tuning code (QwenLM/Qwen3-VL
  ``qwen-vl-finetune``, 96588727: qwenvl/data/data_processor.py, train/argument.py):
  its ``_build_messages`` (user text around ``<image>`` stripped), the processor's chat
  template, images read by transformers' ``load_image`` (EXIF turn, ``convert("RGB")``),
  its ``DataArguments`` pixel limits as the defaults of ``min_pixels`` / ``max_pixels``
  (``QWEN_VL_FINETUNE_PIXELS``), ``preprocess_qwen_visual``'s labels and its collator's
  ``model_max_length`` cut (by default the checkpoint tokenizer's, as its collator is built
  on ``processor.tokenizer``: :func:`tokenizer_model_max_length`), and video files as its
  processor reads them (every frame for Qwen2/2.5-VL; Qwen3-VL: ``video_fps`` within
  ``video_min_frames`` / ``video_max_frames``; ``video_min_pixels`` / ``video_max_pixels``
  the video processor's limits).

``data_flatten=True`` (loader-wide: it shapes batches, not samples) follows its
``DataArguments.data_flatten``: its ``FlattenedDataCollatorForSupervisedDataset`` writes a
batch's samples back to back into one row with their cumulative lengths as the
attention_mask, and cuts nothing (``model_max_length`` is then refused, not ignored); the
engine's collator lays the batch out so (csrc/core/batch/collate.c).

``data_packing=True`` (loader-wide) follows its ``DataArguments.data_packing``: an entry of
its packed annotation files (``tools/pack_data.py``) is a list of records, which its
``_get_packed_item`` makes record by record and concatenates; here such a list is one
sample (sampled, sharded, skipped and resumed as a unit), each record made as on its own,
and batches are the flattened collator's (``data_flatten`` is implied, as its
``make_supervised_data_module`` picks that collator for either switch).

``video_fps``, ``video_min_pixels`` and ``video_max_pixels`` are named alike by both
frameworks: one setting each, which either recipe reads with its own framework's default
(``SHARED_SETTINGS``); the others belong to one recipe.

The settings are rows of the engine's option table (csrc/core/options.c); this module
only fills a recipe's defaults and refuses settings that belong to another recipe.
See docs/recipes.md.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Tuple

from ._core import ConfigError

PROCESSOR = "processor"
LLAMA_FACTORY = "llama-factory"
QWEN_VL_FINETUNE = "qwen-vl-finetune"
#: LLaMA-Factory's own defaults for its settings (hparams/data_args.py).
LLAMA_FACTORY_DEFAULTS: Dict[str, Any] = {
    "cutoff_len": 2048,
    "mask_history": False,
    "train_on_prompt": False,
    "enable_thinking": False,
    # hparams/model_args.py ProcessorArguments: mm_plugin's Pillow pre-resize of images
    "image_max_pixels": 768 * 768,
    "image_min_pixels": 32 * 32,
    # and of videos: frames sampled, each shrunk with Pillow like an image
    "video_fps": 2.0,
    "video_maxlen": 128,
    "video_max_pixels": 256 * 256,
    "video_min_pixels": 16 * 16,
}
_NONE_OFF = (  # None when off
    "model_max_length",
    "cutoff_len",
    "image_max_pixels",
    "image_min_pixels",
    "video_fps",
    "video_maxlen",
    "video_max_pixels",
    "video_min_pixels",
    "video_min_frames",
    "video_max_frames",
)
#: The settings that belong to recipe="llama-factory".
LLAMA_FACTORY_SETTINGS = tuple(LLAMA_FACTORY_DEFAULTS)
#: Qwen's qwen-vl-finetune defaults for its settings (train/argument.py: TrainingArguments'
#: model_max_length, DataArguments' video settings, which update_processor_pixels gives
#: the video processor).
QWEN_VL_FINETUNE_DEFAULTS: Dict[str, Any] = {
    # its padded collator cuts at processor.tokenizer.model_max_length, the checkpoint's
    # tokenizer_config.json value (train_qwen.py gives TrainingArguments.model_max_length,
    # 512 by default, only to the Trainer's own tokenizer): resolve()'s tokenizer_max
    "model_max_length": None,
    "video_fps": 2.0,
    "video_min_frames": 4,
    "video_max_frames": 8,
    "video_max_pixels": 1024 * 28 * 28,
    "video_min_pixels": 256 * 28 * 28,
}
#: The settings that belong to recipe="qwen-vl-finetune".
QWEN_VL_FINETUNE_SETTINGS = tuple(QWEN_VL_FINETUNE_DEFAULTS)
#: The settings both recipes read, each under the name both frameworks give it.
SHARED_SETTINGS = tuple(k for k in LLAMA_FACTORY_SETTINGS if k in QWEN_VL_FINETUNE_DEFAULTS)
#: Its DataArguments' min_pixels / max_pixels, which update_processor_pixels gives the image
#: processor: the defaults of the Loader's own min_pixels / max_pixels under the recipe.
QWEN_VL_FINETUNE_PIXELS: Dict[str, int] = {"min_pixels": 28 * 28 * 16, "max_pixels": 28 * 28 * 576}
#: Every recipe's own settings (Loader keywords, per-source overrides).
RECIPE_SETTINGS = LLAMA_FACTORY_SETTINGS + tuple(
    k for k in QWEN_VL_FINETUNE_SETTINGS if k not in SHARED_SETTINGS
)
_OWNERS = {
    k: tuple(
        r
        for r, keys in (
            (LLAMA_FACTORY, LLAMA_FACTORY_SETTINGS),
            (QWEN_VL_FINETUNE, QWEN_VL_FINETUNE_SETTINGS),
        )
        if k in keys
    )
    for k in RECIPE_SETTINGS
}
_NAMES = {LLAMA_FACTORY: "LLaMA-Factory", QWEN_VL_FINETUNE: "qwen-vl-finetune"}


def vision_kw(recipe: str, kw: Dict[str, Any]) -> Dict[str, Any]:
    """The vision settings (mmloader.presets.vision_config keywords) kw under a recipe.

    LLaMA-Factory 0.9.5 installs Pillow 11 (its gradio pins pillow < 12), whose resize
    always runs the horizontal pass first (Pillow 13 may start with the vertical one).
    qwen-vl-finetune: the processor's apply_chat_template reads images with transformers'
    load_image, and min_pixels / max_pixels not given are its DataArguments' defaults.
    """
    out = dict(kw)
    if recipe == LLAMA_FACTORY:
        out["pillow_h_first"] = True
    elif recipe == QWEN_VL_FINETUNE:
        out["image_route"] = "load_image"
        for k, d in QWEN_VL_FINETUNE_PIXELS.items():
            if out.get(k) is None:
                out[k] = d
    return out


def check_route(where: str, recipe: str, image_route: str) -> None:
    """Both recipes read images their own way: no other route."""
    if recipe in (LLAMA_FACTORY, QWEN_VL_FINETUNE) and image_route != "processor":
        raise ConfigError(
            f"{where}recipe={recipe!r} reads images as {_NAMES[recipe]} does: leave "
            f"image_route at its default (got {image_route!r})"
        )


# qwen3_video_prompt's spellings before transformers 5.25, and what each wrote
_OLD_VIDEO_PROMPTS = {
    "transformers>=5.10": "blocks-in-pair (transformers 5.10 to 5.24)",
    "transformers<5.10": "blocks (transformers 4.57 to 5.9, and 5.25 on)",
}


def check_video_prompt(where: str, recipe: str, qwen3_video_prompt: str, default: str) -> None:
    """LLaMA-Factory writes Qwen3-VL video prompts itself (its Qwen3VLPlugin: the blocks
    alone), and Qwen's code gets the blocks alone from its processor's apply_chat_template
    (transformers 4.57 and 5.25); another qwen3_video_prompt would not be followed:
    refused, not ignored.  The spellings before transformers 5.25 (which went back to the
    blocks alone) name versions that no longer tell the form: refused, naming the new one."""
    if qwen3_video_prompt in _OLD_VIDEO_PROMPTS:
        raise ConfigError(
            f"{where}qwen3_video_prompt={qwen3_video_prompt!r} is no longer a choice: "
            f"transformers 5.25 writes the blocks alone again; write "
            f"{_OLD_VIDEO_PROMPTS[qwen3_video_prompt]!r}"
        )
    if recipe in (LLAMA_FACTORY, QWEN_VL_FINETUNE) and qwen3_video_prompt != default:
        raise ConfigError(
            f"{where}recipe={recipe!r} writes {_NAMES[recipe]}'s own Qwen3-VL video "
            f"prompt (the timestamped blocks alone): leave qwen3_video_prompt at its default "
            f"(got {qwen3_video_prompt!r})"
        )


def check_flatten(where: str, recipe: str, on: bool, name: str = "data_flatten") -> None:
    """data_flatten and data_packing are Qwen's fine-tuning code's switches: its recipe only."""
    if on and recipe != QWEN_VL_FINETUNE:
        what = "flattened collator" if name == "data_flatten" else "packed annotation files"
        raise ConfigError(
            f"{where}{name} is a qwen-vl-finetune setting (Qwen's {what}): it "
            f"needs recipe={QWEN_VL_FINETUNE!r}, got recipe={recipe!r}"
        )


def check_last_batch(
    qft: bool, drop_last: bool, samples_per_rank: int, mbs: Optional[int], cycle: bool
) -> None:
    """Qwen's Trainer keeps an epoch's last partial batch (Hugging Face's
    dataloader_drop_last=False); mmloader's epochs end at the last full batch.  Under the
    recipe an epoch with such a tail is refused unless dataloader_drop_last=True says to
    train without it (docs/recipes.md: the epoch's last partial batch)."""
    if drop_last and not qft:
        raise ConfigError(
            "dataloader_drop_last is a qwen-vl-finetune setting (its Hugging Face Trainer's "
            f"last partial batch): it needs recipe={QWEN_VL_FINETUNE!r} (every source's)"
        )
    if not qft or drop_last or cycle or not mbs:
        return
    tail = samples_per_rank % mbs
    if tail:
        raise ConfigError(
            f"recipe={QWEN_VL_FINETUNE!r}: each rank's epoch of {samples_per_rank} samples "
            f"leaves {tail} after its last full batch of micro_batch_size={mbs}; Qwen's "
            "Trainer (dataloader_drop_last=False, the Hugging Face default) trains them as a "
            "last partial batch, which mmloader's epochs never hold.  Pass "
            "dataloader_drop_last=True to train without them (as its --dataloader_drop_last "
            "True does), or give a micro_batch_size that divides the epoch"
        )


def tokenizer_model_max_length(folder: Optional[str]) -> Optional[int]:
    """``model_max_length`` of the Hugging Face tokenizer in ``folder`` as transformers
    loads it (its tokenizer_config.json; absent there: no limit, None).  Qwen's padded
    collator cuts rows at this value of its processor's tokenizer.  ``folder`` None: not
    known (a Tokenizer object without model_dir): ConfigError when the recipe needs it."""
    if folder is None:
        return None
    path = os.path.join(folder, "tokenizer_config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            v = json.load(f).get("model_max_length")
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {path!r}: {e}") from None
    # transformers' own sentinel for "no limit" is 1e30 (VERY_LARGE_INTEGER)
    if v is None or not isinstance(v, (int, float)) or v >= 1e18:
        return None
    if v < 1:
        raise ConfigError(f"{path}: model_max_length={v!r} is not a positive length")
    return int(v)


def resolve(
    where: str,
    recipe: str,
    given: Dict[str, Any],
    label_mode: str,
    data_flatten: bool,
    tokenizer_max: Tuple[bool, Optional[int]] = (True, None),
) -> Dict[str, Any]:
    """The engine values of recipe, its settings and label_mode for one source.

    ``given``: the recipes' settings as the user gave them (None / False: not given).
    ``data_flatten``: the loader's batches are Qwen's flattened ones, whose collator cuts
    nothing (no model_max_length).  ``tokenizer_max``: (known, value) of the checkpoint
    tokenizer's model_max_length (:func:`tokenizer_model_max_length`), the default cut of
    Qwen's padded collator.
    """
    check_flatten(where, recipe, data_flatten)
    out: Dict[str, Any] = {"recipe": recipe, "label_mode": label_mode}
    bad = [
        k for k in RECIPE_SETTINGS if recipe not in _OWNERS[k] and given.get(k) not in (None, False)
    ]
    if bad:
        owners = _OWNERS[bad[0]]
        names = " or ".join(_NAMES[r] for r in owners)
        needs = " or ".join(f"recipe={r!r}" for r in owners)
        raise ConfigError(f"{where}{bad[0]} is a {names} setting: it needs {needs}")
    out.update({k: None if k in _NONE_OFF else False for k in RECIPE_SETTINGS})
    if recipe == QWEN_VL_FINETUNE:
        if label_mode != "all_assistant":
            raise ConfigError(
                f"{where}recipe={QWEN_VL_FINETUNE!r} labels as Qwen's code does: leave "
                "label_mode at its default"
            )
        for k, d in QWEN_VL_FINETUNE_DEFAULTS.items():
            v = given.get(k)
            out[k] = d if v is None else v
        if given.get("model_max_length") is None and not data_flatten:
            known, out["model_max_length"] = tokenizer_max
            if not known:
                raise ConfigError(
                    f"{where}recipe={QWEN_VL_FINETUNE!r} cuts each padded row at its "
                    "processor tokenizer's model_max_length (the checkpoint's "
                    "tokenizer_config.json), which a Tokenizer object without model_dir= "
                    "does not tell: pass model_dir= or model_max_length="
                )
        if data_flatten:  # its FlattenedDataCollatorForSupervisedDataset cuts nothing
            if given.get("model_max_length") is not None:
                raise ConfigError(
                    f"{where}model_max_length cuts rows in Qwen's padded collator; with "
                    "data_flatten=True its flattened collator cuts nothing: leave "
                    "model_max_length out (max_length skips long samples instead)"
                )
            out["model_max_length"] = None
        if out["video_max_pixels"] < out["video_min_pixels"]:
            raise ConfigError(f"{where}video_max_pixels cannot be smaller than video_min_pixels")
        if out["video_max_frames"] < out["video_min_frames"]:
            raise ConfigError(f"{where}video_max_frames cannot be smaller than video_min_frames")
        return out
    if recipe != LLAMA_FACTORY:
        return out
    for k, d in LLAMA_FACTORY_DEFAULTS.items():
        v = given.get(k)
        out[k] = d if v is None else v
    if label_mode != "all_assistant":
        raise ConfigError(
            f"{where}recipe={LLAMA_FACTORY!r} labels as LLaMA-Factory does: leave label_mode "
            "at its default (mask_history=True trains the last turn only)"
        )
    for kind in ("image", "video"):
        if out[f"{kind}_max_pixels"] < out[f"{kind}_min_pixels"]:
            raise ConfigError(f"{where}{kind}_max_pixels cannot be smaller than {kind}_min_pixels")
    if out["mask_history"] and out["train_on_prompt"]:
        raise ConfigError(f"{where}mask_history is incompatible with train_on_prompt")
    out["label_mode"] = "last_assistant" if out["mask_history"] else "all_assistant"
    return out
