"""qwen3_video_prompt: the Qwen3-VL video prompt form, against each transformers version's
own Qwen3VLProcessor.

transformers' Qwen3VLProcessor writes a video as one "<t seconds><|vision_start|>pads
<|vision_end|>" block per temporal patch.  From 4.57 (Qwen3-VL's first release) to 5.9 its
__call__ replaced the chat template's whole "<|vision_start|><|video_pad|><|vision_end|>"
with the blocks; from 5.10 to 5.24 (replace_video_token, ProcessorMixin's expansion) only
<|video_pad|> is replaced, so the template's outer pair stays: two tokens more per video,
the pixels unchanged; 5.25 collapses the pair again (get_text_with_replacements).
"blocks" (the default) is checked against the suite's transformers (5.25),
"blocks-in-pair" against transformers 5.24 in its own venv
(scripts/setup-transformers524.sh; skipped, saying so, without it).  Each reference is
tests/video_reference.py (qwen-vl-utils 0.0.14 + the processor + get_rope_index), run
with that interpreter; compared: input_ids, grids, pixel_values_videos, mm_token_type_ids,
position_ids, rope_deltas, bitwise (test_video_frames.compare).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import mmloader
from test_video_files import batches, make_case
from test_video_frames import REAL, TINY, compare

pytest.importorskip("av")

HERE = os.path.dirname(os.path.abspath(__file__))
VENV524 = os.environ.get("MMLOADER_TRANSFORMERS524_VENV", "/work/venvs/transformers-5.24")


def _python(form):
    """The interpreter whose transformers writes `form`, or a skip saying why not."""
    if form == "blocks":
        import transformers

        major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
        assert (major, minor) >= (5, 25) or (major, minor) < (5, 10), transformers.__version__
        return sys.executable
    py = os.path.join(VENV524, "bin", "python")
    if not os.path.isfile(os.path.join(VENV524, ".mmloader-requirements")):
        pytest.skip(
            f"no transformers 5.24 venv: run scripts/setup-transformers524.sh (makes {VENV524})"
        )
    return py


def _reference(python, items):
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "tvshim"))
    env.pop("PYTHONHOME", None)
    p = subprocess.run(
        [python, os.path.join(HERE, "video_reference.py")],
        input=json.dumps({"op": "process_many", "items": items}),
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = []
    for r in items:
        with np.load(r["out"]) as z:
            out.append({k: z[k] for k in z.files})
    return out


FORMS = ["blocks", "blocks-in-pair"]


@pytest.mark.parametrize(
    "form,names",
    [
        (FORMS[0], ["h264-mp4"]),
        (FORMS[1], ["h264-mp4"]),
        pytest.param(FORMS[0], ["hevc-mkv", "mpeg4-avi"], marks=pytest.mark.slow),
        pytest.param(FORMS[1], ["hevc-mkv", "mpeg4-avi"], marks=pytest.mark.slow),
    ],
)
def test_form_matches_that_transformers(tmp_path, form, names):
    """Each form equals its transformers' processor, token for token; the other form
    differs from it by the outer pair (so the test tells the two apart)."""
    python = _python(form)
    tok = os.path.abspath(REAL) if os.path.isdir(REAL) else TINY
    made = [make_case(str(tmp_path), "qwen3-vl", tok, n) for n in names]
    refs = _reference(python, [r for _, r in made])
    other = FORMS[1 - FORMS.index(form)]
    for (shard, _), ref in zip(made, refs):
        (got,), st = batches(shard, "qwen3-vl", tok, qwen3_video_prompt=form)
        assert st["skipped"] == 0
        compare(got, ref, "qwen3-vl")
        assert got["input_ids"].shape[1] == ref["input_ids"].shape[1]
        (alt,), _ = batches(shard, "qwen3-vl", tok, qwen3_video_prompt=other)
        assert alt["input_ids"].shape[1] - got["input_ids"].shape[1] == (
            2 if form == FORMS[0] else -2
        )


def test_default_and_choices(tmp_path):
    from mmloader._options import DEFAULTS, OPTIONS

    assert list(OPTIONS["qwen3_video_prompt"]["choices"]) == FORMS
    assert DEFAULTS["qwen3_video_prompt"] == FORMS[0]
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}]}) + "\n")
    with pytest.raises(mmloader.ConfigError, match="qwen3_video_prompt"):
        mmloader.Loader(str(p), preset="qwen3-vl", tokenizer=TINY, qwen3_video_prompt="5.9")
    # the spellings before transformers 5.25 name the new choice
    for old, new in (("transformers>=5.10", "blocks-in-pair"), ("transformers<5.10", "blocks")):
        with pytest.raises(mmloader.ConfigError, match=new):
            mmloader.Loader(str(p), preset="qwen3-vl", tokenizer=TINY, qwen3_video_prompt=old)


def test_llama_factory_writes_its_own_form(tmp_path):
    """recipe="llama-factory" writes LLaMA-Factory's form (the blocks alone, as it does):
    another qwen3_video_prompt there is a ConfigError, loader-wide and for a source."""
    p = tmp_path / "d.jsonl"
    p.write_text(
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello"},
                ]
            }
        )
        + "\n"
    )
    kw = dict(preset="qwen3-vl", tokenizer=TINY, qwen3_video_prompt="blocks-in-pair")
    with pytest.raises(mmloader.ConfigError, match="qwen3_video_prompt"):
        mmloader.Loader(str(p), recipe="llama-factory", **kw)
    src = [mmloader.Source(str(p), name="lf", recipe="llama-factory")]
    with pytest.raises(mmloader.ConfigError, match="qwen3_video_prompt"):
        mmloader.Loader(src, **kw)
