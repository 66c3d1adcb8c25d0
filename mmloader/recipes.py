"""Recipes: whose data path a source's samples follow (``Loader(recipe=...)``).

- ``"processor"`` (default): the Hugging Face processor given the images, with
  qwen-vl-utils' per-image keys honoured; the Qwen-VL chat templates.
- ``"llama-factory"``: LLaMA-Factory's supervised data path (v0.9.5: data/template.py,
  processor/supervised.py): its qwen2_vl template for Qwen2-VL / Qwen2.5-VL presets,
  qwen3_vl_nothink for Qwen3-VL (qwen3_vl with ``enable_thinking=True``), each message
  tokenized on its own, ``cutoff_len`` truncation as its ``infer_seqlen`` splits source
  and target, ``mask_history`` and ``train_on_prompt``.  Its settings keep LLaMA-Factory's
  names and defaults (``LLAMA_FACTORY_DEFAULTS``).

The settings are rows of the engine's option table (csrc/core/options.c); this module
only fills a recipe's defaults and refuses settings that belong to another recipe.
See docs/recipes.md.
"""

from __future__ import annotations

from typing import Any, Dict

from ._core import ConfigError

PROCESSOR = "processor"
LLAMA_FACTORY = "llama-factory"
#: LLaMA-Factory's own defaults for its settings (hparams/data_args.py).
LLAMA_FACTORY_DEFAULTS: Dict[str, Any] = {
    "cutoff_len": 2048,
    "mask_history": False,
    "train_on_prompt": False,
    "enable_thinking": False,
}
#: The settings that belong to recipe="llama-factory".
LLAMA_FACTORY_SETTINGS = tuple(LLAMA_FACTORY_DEFAULTS)


def vision_overrides(recipe: str) -> Dict[str, Any]:
    """The vision settings a recipe implies (mmloader.presets.vision_config keys).

    LLaMA-Factory 0.9.5 installs Pillow 11 (its gradio pins pillow < 12), whose resize
    always runs the horizontal pass first (Pillow 13 may start with the vertical one).
    """
    return {"pillow_h_first": True} if recipe == LLAMA_FACTORY else {}


def resolve(where: str, recipe: str, given: Dict[str, Any], label_mode: str) -> Dict[str, Any]:
    """The engine values of recipe, its settings and label_mode for one source.

    ``given``: the llama-factory settings as the user gave them (None / False: not given).
    """
    out: Dict[str, Any] = {"recipe": recipe, "label_mode": label_mode}
    if recipe != LLAMA_FACTORY:
        bad = [k for k in LLAMA_FACTORY_SETTINGS if given.get(k) not in (None, False)]
        if bad:
            raise ConfigError(
                f"{where}{bad[0]} is a LLaMA-Factory setting: it needs recipe={LLAMA_FACTORY!r}"
            )
        out.update({k: None if k == "cutoff_len" else False for k in LLAMA_FACTORY_SETTINGS})
        return out
    for k, d in LLAMA_FACTORY_DEFAULTS.items():
        v = given.get(k)
        out[k] = d if v is None else v
    if label_mode != "all_assistant":
        raise ConfigError(
            f"{where}recipe={LLAMA_FACTORY!r} labels as LLaMA-Factory does: leave label_mode "
            "at its default (mask_history=True trains the last turn only)"
        )
    if out["mask_history"] and out["train_on_prompt"]:
        raise ConfigError(f"{where}mask_history is incompatible with train_on_prompt")
    out["label_mode"] = "last_assistant" if out["mask_history"] else "all_assistant"
    return out
