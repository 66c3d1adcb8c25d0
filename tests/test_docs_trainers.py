"""docs/trainers.md: its code blocks run, in order, in one namespace (a tiny random-weight
Qwen2.5-VL model, the real Qwen tokenizer, a small generated dataset), and the resumed
Trainer run ends at the step the first one planned."""

import os
import re
import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from mmloader.datagen import make_dataset  # noqa: E402
from test_hf_training import QWEN_TOK, needs_qwen, tiny_model  # noqa: E402

DOC = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "trainers.md"
)


def blocks():
    with open(DOC) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


@pytest.mark.slow
@needs_qwen
def test_the_docs_code_runs(tmp_path):
    ds = make_dataset(
        str(tmp_path / "d"), n_samples=8, seed=2, n_shards=1, n_images=4, min_size=32, max_size=64
    )
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    shutil.copy(QWEN_TOK, model_dir / "tokenizer.json")
    model = tiny_model("qwen2.5-vl")
    model._weight_conversions = []  # see the page: transformers 5.24's resume key names
    ns = dict(data=ds["shards"], model_dir=str(model_dir), model=model, out=str(tmp_path / "o"))
    code = blocks()
    assert len(code) == 3
    for c in code:
        exec(compile(c, DOC, "exec"), ns)
    assert ns["trainer"].state.global_step == 3
