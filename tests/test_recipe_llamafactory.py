"""recipe="llama-factory" against LLaMA-Factory itself, sample by sample.

The reference is LLaMA-Factory 0.9.5 from PyPI, run in its own venv
(scripts/setup-llamafactory.sh: it pins transformers 5.6) by tests/llamafactory_reference.py:
its dataset converters, SupervisedDatasetProcessor._encode_data_example (template,
mm_plugin, infer_seqlen truncation, labels) and mm_plugin.get_mm_inputs, on its own demo
files (data/ of its source distribution: mllm_demo, alpaca en/zh, glaive tool calls en/zh,
identity).  mmloader reads the same files through Loader(recipe="llama-factory").  Compared:
input_ids, labels, image_grid_thw and pixel_values (bitwise).

Skips (with the reason) when the venv is not there or the Qwen tokenizer is absent.  The
default run takes the first samples of each file; the whole 2,696 are @slow.
"""

import hashlib
import json
import os
import subprocess

import numpy as np
import pytest

import mmloader
from conftest import as_np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VENV = os.environ.get("MMLOADER_LLAMAFACTORY_VENV", "/work/venvs/llamafactory")
DATA = os.path.join(VENV, "llamafactory-data")
TOKDIR = os.path.join(ROOT, "..", "shared", "data", "qwen3-tokenizer")
if not os.path.isdir(TOKDIR):
    TOKDIR = "/work/shared/data/qwen3-tokenizer"
TOKENIZER = os.path.join(TOKDIR, "tokenizer.json")
FILES = {  # dataset_info.json name -> file
    "mllm_demo": "mllm_demo.json",
    "alpaca_en_demo": "alpaca_en_demo.json",
    "alpaca_zh_demo": "alpaca_zh_demo.json",
    "glaive_toolcall_en_demo": "glaive_toolcall_en_demo.json",
    "glaive_toolcall_zh_demo": "glaive_toolcall_zh_demo.json",
    "identity": "identity.json",
}
TEXT = [k for k in FILES if k != "mllm_demo"]
PRESET = {"qwen2_vl": "qwen2.5-vl", "qwen3_vl_nothink": "qwen3-vl", "qwen3_vl": "qwen3-vl"}


def _ready():
    stamp = os.path.join(VENV, ".mmloader-requirements")
    if not os.path.isfile(stamp) or not os.path.isfile(os.path.join(DATA, "dataset_info.json")):
        return "no LLaMA-Factory venv: run scripts/setup-llamafactory.sh (makes " + VENV + ")"
    if not os.path.isfile(TOKENIZER):
        return "the Qwen tokenizer (shared/data/qwen3-tokenizer) is absent"
    return None


pytestmark = pytest.mark.skipif(_ready() is not None, reason=str(_ready()))


def reference(tmp, jobs):
    """Runs LLaMA-Factory on the jobs in one process; the npz of each (cached by content)."""
    outs, todo = [], []
    for job in jobs:
        key = hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()[:16]
        out = os.path.join(str(tmp), f"lf-{key}.npz")
        outs.append(out)
        if not os.path.exists(out):
            todo.append(
                dict(
                    job, out=out, dataset_dir=DATA, tokenizer=TOKDIR, preset=PRESET[job["template"]]
                )
            )
    if todo:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(HERE, "lfshim"), os.path.join(HERE, "tvshim")]
        )
        env.pop("PYTHONHOME", None)
        r = subprocess.run(
            [os.path.join(VENV, "bin", "python"), os.path.join(HERE, "llamafactory_reference.py")],
            input=json.dumps({"jobs": todo}),
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
        )
        assert r.returncode == 0, r.stderr[-4000:]
    return [dict(np.load(o)) for o in outs]


@pytest.fixture(scope="module")
def lfcache(tmp_path_factory):
    return tmp_path_factory.mktemp("llamafactory")


def _jobs():
    """The default run's reference jobs, run in one LLaMA-Factory start."""
    jobs = [dict(template=t, datasets=list(FILES), limit=N) for t in PRESET]
    for t in ("qwen2_vl", "qwen3_vl"):
        for st in SETTINGS:
            jobs.append(_settings_job(t, st))
    return jobs


def _settings_job(template, settings):
    names = ["glaive_toolcall_en_demo", "alpaca_zh_demo", "mllm_demo"]
    if settings.get("cutoff_len", 2048) < 400:
        names.remove("mllm_demo")  # its images alone exceed the cut (refused: see below)
    data_args = dict(settings)
    if template == "qwen3_vl":
        data_args["enable_thinking"] = True
    return dict(template=template, datasets=names, limit=N, data_args=data_args)


@pytest.fixture(scope="module")
def refs(lfcache):
    jobs = _jobs()
    got = reference(lfcache, jobs)
    return {json.dumps(j, sort_keys=True): r for j, r in zip(jobs, got)}


def ours(name, template, limit=None, **kw):
    """(input_ids, labels, grid, pixels) per sample of one demo file, in file order."""
    preset = PRESET[template]
    if template == "qwen3_vl":
        kw.setdefault("enable_thinking", True)
    loader = mmloader.Loader(
        os.path.join(DATA, FILES[name]),
        data_format="json",
        preset=preset,
        tokenizer=TOKENIZER,
        recipe="llama-factory",
        shuffle=False,
        micro_batch_size=1,
        text_only_vision="omit",
        on_error="raise",
        num_threads=2,
        **kw,
    )
    out = []
    for b in loader:
        b = as_np(b)
        out.append(
            (b["input_ids"][0], b["labels"][0], b.get("image_grid_thw"), b.get("pixel_values"))
        )
        if limit and len(out) == limit:
            break
    return out


def compare(name, ref, mine):
    names = [str(x) for x in ref["names"]]
    idx = [i for i, n in enumerate(names) if n.startswith(name + "/")]
    assert idx, f"LLaMA-Factory produced no {name} sample"
    assert len(ref["dropped"]) == 0
    assert len(mine) == len(idx), (name, len(mine), len(idx))
    for (ids, labels, grid, pixels), i in zip(mine, idx):
        assert ids.tolist() == ref[f"ids_{i}"].tolist(), names[i]
        assert labels.tolist() == ref[f"labels_{i}"].tolist(), names[i]
        if f"grid_{i}" in ref:
            assert grid is not None and grid.tolist() == ref[f"grid_{i}"].tolist(), names[i]
            assert pixels.dtype == ref[f"pixels_{i}"].dtype, names[i]
            assert np.array_equal(pixels, ref[f"pixels_{i}"]), names[i]
        else:
            assert grid is None, names[i]
    return len(idx)


N = 12  # samples per file in the default run


@pytest.mark.parametrize("template", ["qwen2_vl", "qwen3_vl_nothink", "qwen3_vl"])
def test_demo_files(refs, template):
    """LLaMA-Factory's defaults (cutoff_len 2048): the demo files' first samples, images
    and text; qwen3_vl = enable_thinking=True."""
    ref = refs[json.dumps(dict(template=template, datasets=list(FILES), limit=N), sort_keys=True)]
    total = sum(compare(n, ref, ours(n, template, limit=N)) for n in FILES)
    assert total == N * (len(FILES) - 1) + 6  # mllm_demo holds 6


SETTINGS = [
    dict(cutoff_len=64),  # cuts most glaive/alpaca samples: source and target shares
    dict(cutoff_len=40, mask_history=True),  # last turns first
    dict(mask_history=True),
    dict(train_on_prompt=True, cutoff_len=400),
]


@pytest.mark.parametrize(
    "settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())
)
@pytest.mark.parametrize("template", ["qwen2_vl", "qwen3_vl"])
def test_settings(refs, template, settings):
    """cutoff_len, mask_history and train_on_prompt under LLaMA-Factory's names."""
    job = _settings_job(template, settings)
    ref = refs[json.dumps(job, sort_keys=True)]
    for n in job["datasets"]:
        compare(n, ref, ours(n, template, limit=N, **settings))


def test_cut_through_an_image_is_refused():
    """A cutoff_len that would cut an image's tokens skips the sample (too_long): LLaMA-Factory
    would hand the model fewer image tokens than features, which it refuses."""
    loader = mmloader.Loader(
        os.path.join(DATA, "mllm_demo.json"),
        data_format="json",
        preset="qwen2.5-vl",
        tokenizer=TOKENIZER,
        recipe="llama-factory",
        cutoff_len=32,
        shuffle=False,
        micro_batch_size=1,
        on_error="raise",
    )
    with pytest.raises(mmloader.Error, match="cutoff_len=32 would cut"):
        next(iter(loader))


@pytest.mark.slow
@pytest.mark.parametrize("template", ["qwen2_vl", "qwen3_vl_nothink"])
def test_all_demo_samples(lfcache, template):
    """All 2,696 image and text samples of the six demo files (0.9.5's copies)."""
    (ref,) = reference(lfcache, [dict(template=template, datasets=list(FILES))])
    assert sum(compare(n, ref, ours(n, template)) for n in FILES) == 2696


def test_v1_text_parts_read_as_strings(tmp_path):
    """LLaMA-Factory's newer layout ({"type": "text", "value": ...} parts, its v1 demo file)
    gives the same ids and labels as the same messages written as strings."""
    v1 = os.path.join(DATA, "v1_sft_demo.jsonl")
    rows = [json.loads(x) for x in open(v1, encoding="utf-8")][:40]
    flat = tmp_path / "flat.jsonl"
    with open(flat, "w", encoding="utf-8") as f:
        for r in rows:
            msgs = [
                {"role": m["role"], "content": "".join(p["value"] for p in m["content"])}
                for m in r["messages"]
            ]
            f.write(json.dumps({"messages": msgs}, ensure_ascii=False) + "\n")
    small = tmp_path / "v1.jsonl"
    small.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))

    def run(path):
        kw = dict(preset="qwen3-vl", tokenizer=TOKENIZER, shuffle=False, micro_batch_size=1)
        return [as_np(b) for b in mmloader.Loader(str(path), on_error="raise", **kw)]

    a, b = run(small), run(flat)
    assert len(a) == len(b) == 40
    for x, y in zip(a, b):
        assert x["input_ids"].tolist() == y["input_ids"].tolist()
        assert x["labels"].tolist() == y["labels"].tolist()


def test_v1_loss_weight_other_than_the_labels_is_refused(tmp_path):
    p = tmp_path / "w.jsonl"
    rec = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "value": "hi"}], "loss_weight": 1.0},
            {"role": "assistant", "content": [{"type": "text", "value": "yo"}]},
        ]
    }
    p.write_text(json.dumps(rec) + "\n")
    loader = mmloader.Loader(
        str(p), preset="qwen3-vl", tokenizer=TOKENIZER, on_error="raise", micro_batch_size=1
    )
    with pytest.raises(mmloader.Error, match="loss_weight"):
        next(iter(loader))


def test_settings_need_the_recipe():
    with pytest.raises(mmloader.ConfigError, match="needs recipe='llama-factory'"):
        mmloader.Loader(os.path.join(DATA, "identity.json"), tokenizer=TOKENIZER, cutoff_len=10)
    with pytest.raises(mmloader.ConfigError, match="label_mode"):
        mmloader.Loader(
            os.path.join(DATA, "identity.json"),
            tokenizer=TOKENIZER,
            recipe="llama-factory",
            label_mode="last_assistant",
        )
    with pytest.raises(mmloader.ConfigError, match="incompatible"):
        mmloader.Loader(
            os.path.join(DATA, "identity.json"),
            tokenizer=TOKENIZER,
            recipe="llama-factory",
            mask_history=True,
            train_on_prompt=True,
        )
    with pytest.raises(mmloader.ConfigError, match="Qwen3-VL"):
        mmloader.Loader(
            os.path.join(DATA, "identity.json"),
            tokenizer=TOKENIZER,
            recipe="llama-factory",
            enable_thinking=True,
        )


def test_per_source_recipe():
    """A mixture: one source under LLaMA-Factory's recipe (cutoff_len 64), one under the
    processor's; each sample as its own source's recipe makes it."""
    path = os.path.join(DATA, "glaive_toolcall_en_demo.json")
    src = [
        mmloader.Source(path, name="lf", choose=6, recipe="llama-factory", cutoff_len=64),
        mmloader.Source(path, name="hf", choose=6),
    ]
    loader = mmloader.Loader(
        src, data_format="json", tokenizer=TOKENIZER, shuffle=False, micro_batch_size=1
    )
    lens = [len(as_np(b)["input_ids"][0]) for b in loader]
    assert len(lens) == 12
    assert sum(n <= 64 for n in lens) >= 6 and max(lens) > 64
