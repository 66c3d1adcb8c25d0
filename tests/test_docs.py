"""The README and docs/ show code that works: every relative link resolves, every Python
block compiles and calls the Loaders with options that exist, every `python -m mmloader`
line uses flags its command has, and the blocks marked to run do run, as written, where
what they name exists:

- `<!-- doctest: run -->`: in a scratch folder holding `data/train-*.jsonl`, `train.jsonl`
  and a model folder (a `/models/NAME` path the pages show is replaced by it, keeping what
  follows; `ckpt` names it too).
- `<!-- doctest: run llamafactory -->`: in a folder whose `data/` is LLaMA-Factory's own demo
  data (the venv scripts/setup-llamafactory.sh makes), with the Qwen tokenizer.
- `<!-- doctest: run ray -->`: against a Ray cluster started here (ray.cluster_utils: a head
  node for the trainer, a data node with the `data_node` resource) that `ray.init(address=
  "auto")` finds, and moto's S3 server holding the scratch data as `s3://bucket/sft/`
  (credentials and endpoint in the environment, as a cluster's nodes have them); `rank`
  and `world` are 0 and 1.
- `<!-- doctest: run trainer -->`: with `model` a tiny random-weight Qwen2.5-VL (the real
  transformers model, sized to mmloader's bundled tiny tokenizer: a padded 4 x 4096 batch's
  logits are 0.2 GB where Qwen's 151,936 ids make them 10 GB), `ckpt` a folder holding that
  tokenizer, `train.jsonl` of 8 records, `args` TrainingArguments and `Trainer`
  transformers' own; then the block's trainer trains, and the block run again, as in a later
  process, resumes from a checkpoint; see test_trainer_blocks_run.
- `<!-- doctest: run megatron -->`: with Megatron-LM (megatron.training: megatron-core >=
  0.18, the venv scripts/test-megatron-current.sh makes) and Megatron-Bridge; see
  test_megatron_blocks_run.

Each environment's test skips, saying why, where its packages or data are absent."""

from __future__ import annotations

import ast
import glob
import importlib.util
import inspect
import json
import math
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

import mmloader
from child import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
RUN_MARK = re.compile(r"^<!-- doctest: run(?: ([a-z]+))? -->$")
RUN_ENVS = ("scratch", "llamafactory", "ray", "megatron", "trainer")
_FENCE = re.compile(r"^```(\w*)\s*$")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


class Block:
    def __init__(self, page: str, line: int, lang: str, code: str, env: Optional[str]):
        self.page, self.line, self.lang, self.code = page, line, lang, code
        self.env = env  # where it runs (RUN_ENVS); None: compiled and checked, not run

    def where(self) -> str:
        return f"{os.path.relpath(self.page, ROOT)}:{self.line}"


def blocks(page: str) -> Iterator[Block]:
    lines = open(page, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m or not m.group(1):
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        mark = RUN_MARK.match(lines[i - 1].strip()) if i > 0 else None
        env = (mark.group(1) or "scratch") if mark else None
        yield Block(page, i + 1, m.group(1), "\n".join(lines[i + 1 : j]), env)
        i = j + 1


def all_blocks(lang: str) -> List[Block]:
    return [b for p in PAGES for b in blocks(p) if b.lang == lang]


def test_pages_exist_and_the_readme_is_short():
    names = {os.path.basename(p) for p in PAGES}
    for need in ("data.md", "mixtures.md", "pixels.md", "remote.md", "benchmarks.md"):
        assert need in names
    assert len(open(PAGES[0], encoding="utf-8").read().split("\n")) <= 200


def test_the_readme_links_every_page():
    readme = open(PAGES[0], encoding="utf-8").read()
    linked = {os.path.normpath(t.split("#", 1)[0]) for t in _LINK.findall(readme)}
    pages = {os.path.relpath(p, ROOT) for p in PAGES[1:]}
    assert pages - linked == set(), "docs/ pages the README does not link"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_relative_links_resolve(page):
    text = open(page, encoding="utf-8").read()
    bad = []
    for target in _LINK.findall(text):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        path = os.path.join(os.path.dirname(page), target.split("#", 1)[0])
        if not os.path.exists(path):
            bad.append(target)
    assert bad == [], f"{os.path.relpath(page, ROOT)}: links to nothing: {bad}"


def _accepted(fn) -> Tuple[Set[str], bool]:
    """(keyword names, takes **kwargs)."""
    params = inspect.signature(fn).parameters.values()
    names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    return names, any(p.kind == p.VAR_KEYWORD for p in params)


def _api() -> Dict[str, Set[str]]:
    """Callable name as a page writes it -> the keywords it accepts."""
    core, _ = _accepted(mmloader.Loader.__init__)
    out = {"Loader": core, "mmloader.Loader": core}
    src, more = _accepted(mmloader.Source.__init__)
    out["Source"] = src | (core if more else set())
    try:
        import mmloader.torch as mt

        names, more = _accepted(mt.Loader.__init__)
        out["mmloader.torch.Loader"] = names | (core if more else set())
    except ImportError:
        pass
    try:
        import mmloader.ray as mr

        names, more = _accepted(mr.Loader.__init__)
        out["mmloader.ray.Loader"] = names | (core if more else set())
    except ImportError:
        pass
    return out


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return _dotted(node.value) + "." + node.attr
    return ""


@pytest.mark.parametrize("block", all_blocks("python"), ids=lambda b: b.where())
def test_python_blocks_compile_and_use_options_that_exist(block):
    tree = ast.parse(block.code, filename=block.where())  # a SyntaxError fails here
    api = _api()
    # `from mmloader.torch import Loader` makes a bare Loader the torch one
    alias = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                alias[a.asname or a.name] = f"{node.module}.{a.name}"
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        name = alias.get(name, name)
        if name not in api:
            continue
        for kw in node.keywords:
            if kw.arg is not None and kw.arg not in api[name]:
                bad.append(f"{name}({kw.arg}=...)")
    assert bad == [], f"{block.where()}: options that do not exist: {bad}"


# Module names a page's blocks use only after one of them (this one or one above) imports them
MODULES = {"mmloader", "mml", "torch", "ray", "np", "numpy", "transformers"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_python_blocks_import_the_modules_they_use(page):
    bound: Set[str] = set()
    bad = []
    for b in blocks(page):
        if b.lang != "python":
            continue
        tree = ast.parse(b.code)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in MODULES}
        bad += [f"{b.where()}: {name}" for name in sorted(used - bound)]
    assert bad == [], f"used before any block of the page imports it: {bad}"


def _cli_flags(sub: str) -> Set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "mmloader", sub, "--help"],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(ROOT),  # outside the tree: the child imports what the tests do
        env=child_env(),
        check=True,
    ).stdout
    return set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", out))


def _shell_commands() -> List[Tuple[Block, List[str]]]:
    out = []
    for b in all_blocks("sh"):
        text = re.sub(r"\\\n", " ", b.code)
        for line in text.split("\n"):
            line = line.split(" #", 1)[0].strip()
            if line.startswith("python -m mmloader "):
                out.append((b, shlex.split(line)))
    return out


@pytest.mark.parametrize("block,argv", _shell_commands(), ids=lambda x: getattr(x, "where", str)())
def test_shell_lines_use_flags_the_cli_has(block, argv):
    sub = argv[3]
    flags = {a.split("=", 1)[0] for a in argv[4:] if a.startswith("--")}
    unknown = flags - _cli_flags(sub)
    assert unknown == set(), f"{block.where()}: python -m mmloader {sub} has no {unknown}"


def test_some_blocks_run():
    assert len([b for b in all_blocks("python") if b.env == "scratch"]) >= 3


def test_run_marks_name_an_environment():
    """A mark naming no environment would leave its block unrun, silently."""
    bad = []
    for p in PAGES:
        for n, line in enumerate(open(p, encoding="utf-8").read().split("\n"), 1):
            if "doctest:" in line:
                m = RUN_MARK.match(line.strip())
                if not m or (m.group(1) or "scratch") not in RUN_ENVS:
                    bad.append(f"{os.path.relpath(p, ROOT)}:{n}: {line.strip()}")
    assert bad == [], bad


def _runs(env: str) -> List[Block]:
    return [b for b in all_blocks("python") if b.env == env]


SHARED_TOKENIZER = os.path.join(ROOT, "..", "shared", "data", "qwen3-tokenizer", "tokenizer.json")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """data/train-*.jsonl (and train.jsonl) with their images, and a model folder."""
    pytest.importorskip("PIL", reason="the dataset generator writes images with Pillow")
    from mmloader.datagen import make_dataset

    root = tmp_path_factory.mktemp("docs")
    ds = make_dataset(str(root / "data"), n_samples=48, seed=1, max_size=200)
    for i, shard in enumerate(ds["shards"]):
        os.replace(shard, root / "data" / f"train-{i}.jsonl")
    shutil.copy(root / "data" / "train-0.jsonl", root / "train.jsonl")
    # the images are named relative to the shards' folder: train.jsonl needs them beside it
    for f in os.listdir(root / "data"):
        if os.path.isdir(root / "data" / f):
            os.symlink(root / "data" / f, root / f)
    model = root / "model"
    model.mkdir()
    tiny = os.path.join(ROOT, "mmloader", "data", "tiny-tokenizer.json")
    shared = os.path.exists(SHARED_TOKENIZER)
    shutil.copy(SHARED_TOKENIZER if shared else tiny, model / "tokenizer.json")
    (model / "preprocessor_config.json").write_text(
        json.dumps({"min_pixels": 3136, "max_pixels": 200704})
    )
    return root


def _run(block: Block, model, scope: Dict[str, object], close: bool = True) -> Dict[str, object]:
    """Runs the block (in the folder the caller chdirs to), its /models/NAME paths made
    model's, with scope's names defined; closes the loaders it made (close=False: the
    caller does)."""
    code = re.sub(
        r'"/models/[^"/]+(/[^"]*)?"',
        lambda m: repr(str(model) + (m.group(1) or "")),
        block.code,
    )
    scope = {"__name__": "__doc_block__", "ckpt": str(model), **scope}
    try:
        exec(compile(code, block.where(), "exec"), scope)
    except BaseException:
        close = True
        raise
    finally:
        for v in scope.values() if close else ():  # the loaders stop here, not at exit
            if hasattr(v, "close") and type(v).__module__.startswith("mmloader"):
                v.close()
    return scope


@pytest.mark.parametrize("block", _runs("scratch"), ids=lambda b: b.where())
def test_marked_blocks_run(block, scratch, monkeypatch):
    if "torch" in block.code:
        pytest.importorskip("torch", reason="the block uses torch")
    monkeypatch.chdir(scratch)
    _run(block, scratch / "model", {})


# ---- LLaMA-Factory's demo data --------------------------------------------------------------

LF_VENV = os.environ.get("MMLOADER_LLAMAFACTORY_VENV", "/work/venvs/llamafactory")


@pytest.mark.parametrize("block", _runs("llamafactory"), ids=lambda b: b.where())
def test_llamafactory_blocks_run(block, tmp_path, monkeypatch):
    """The recipe page's block on the file it names, LLaMA-Factory's own data/mllm_demo.json
    (and its images), with the Qwen tokenizer LLaMA-Factory's Qwen templates need."""
    data = os.path.join(LF_VENV, "llamafactory-data")
    if not os.path.isfile(os.path.join(data, "dataset_info.json")):
        pytest.skip(f"no LLaMA-Factory demo data: run scripts/setup-llamafactory.sh (makes {data})")
    if not os.path.exists(SHARED_TOKENIZER):
        pytest.skip("the Qwen tokenizer (shared/data/qwen3-tokenizer) is absent")
    os.symlink(data, tmp_path / "data")
    (tmp_path / "model").mkdir()
    shutil.copy(SHARED_TOKENIZER, tmp_path / "model" / "tokenizer.json")
    monkeypatch.chdir(tmp_path)
    _run(block, tmp_path / "model", {})


# ---- a Ray cluster and S3 -------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster(scratch):
    """moto's S3 server holding the scratch data under s3://bucket/sft/, then a Ray cluster
    (trainer head, one data node with the data_node resource) whose raylets, and so the
    producers, inherit the S3 endpoint and credentials from the environment."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install ray)")
    boto3 = pytest.importorskip("boto3", reason="boto3 (for moto's S3 server) is not installed")
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    from ray.cluster_utils import Cluster

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    moto = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    mp = pytest.MonkeyPatch()
    cluster = None
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if moto.poll() is not None or time.monotonic() > deadline:
                    pytest.skip("moto's S3 server did not start")
                time.sleep(0.1)
        for k in [k for k in os.environ if k.startswith("AWS_")]:
            mp.delenv(k)
        mp.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        mp.setenv("AWS_ACCESS_KEY_ID", "docs")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "docs-secret")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1")
        s3.create_bucket(Bucket="bucket")
        for dirpath, _, files in os.walk(scratch / "data"):
            for f in files:
                path = os.path.join(dirpath, f)
                s3.upload_file(path, "bucket", "sft/" + os.path.relpath(path, scratch / "data"))
        old = os.environ.get("PYTHONPATH")
        mp.setenv("PYTHONPATH", ROOT + (os.pathsep + old if old else ""))  # the producers'
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 1, "object_store_memory": 96 << 20},
        )
        # logical CPUs: the blocks ask for 4 per producer, as on a real data node
        cluster.add_node(num_cpus=32, object_store_memory=256 << 20, resources={"data_node": 8})
        cluster.wait_for_nodes()
        mp.setenv("RAY_ADDRESS", cluster.address)  # what ray.init(address="auto") connects to
        yield cluster
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        mp.undo()
        moto.terminate()
        moto.wait(10)


@pytest.mark.parametrize("block", _runs("ray"), ids=lambda b: b.where())
def test_ray_blocks_run(block, ray_cluster, scratch, monkeypatch):
    import ray

    monkeypatch.chdir(scratch)
    try:
        scope = _run(block, scratch / "model", {"rank": 0, "world": 1})
    finally:
        ray.shutdown()  # the next block connects again, as a new trainer process would
    assert "loader" in scope


# ---- the Hugging Face Trainer ----------------------------------------------------------------


@pytest.mark.parametrize("block", _runs("trainer"), ids=lambda b: b.where())
def test_trainer_blocks_run(block, tmp_path, monkeypatch):
    """The README's PyTorch / Trainer block as written (micro_batch_size=4, seq_length=4096)
    with a real transformers model and Trainer: its loop takes the model's loss of every
    batch of the epoch (2 batches), then its Trainer trains the 2 steps of epoch 0,
    checkpointing each.  Run again (a new loader and Trainer, the model of other initial
    weights), its Trainer resumes from checkpoint-1, in the middle of the epoch, and gets the
    batch and the loss of step 2 bitwise, though the block's own loop has just read the
    loader to the end of epoch 0.  The model takes the bundled tiny tokenizer's 3,265 ids
    (Qwen's 151,936 make a 4 x 4096 batch's float32 logits 10 GB): 3.3 GB peak here."""
    torch = pytest.importorskip("torch", reason="the block uses torch")
    transformers = pytest.importorskip("transformers", reason="the block uses transformers")
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate")
    pytest.importorskip("PIL", reason="the dataset generator writes images with Pillow")
    import hashlib

    from mmloader.datagen import make_dataset
    from test_hf_training import tiny_model

    ds = make_dataset(
        str(tmp_path / "d"), n_samples=8, seed=2, n_shards=1, n_images=4, min_size=32, max_size=64
    )
    os.replace(ds["shards"][0], tmp_path / "train.jsonl")
    for f in os.listdir(tmp_path / "d"):  # the images, named relative to the records
        os.symlink(tmp_path / "d" / f, tmp_path / f)
    tok = os.path.join(ROOT, "mmloader", "data", "tiny-tokenizer.json")
    (tmp_path / "model").mkdir()
    shutil.copy(tok, tmp_path / "model" / "tokenizer.json")
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path)

    class Trainer(transformers.Trainer):
        """transformers' Trainer, noting a digest of each step's batch."""

        steps: List[str] = []

        def training_step(self, model, inputs, *a, **k):
            h = hashlib.sha256()
            for key in sorted(inputs):
                t = inputs[key]
                h.update(f"{key} {t.dtype} {tuple(t.shape)}".encode())
                h.update(t.contiguous().numpy().tobytes())
            self.steps.append(h.hexdigest())
            return super().training_step(model, inputs, *a, **k)

    def run(seed: int, resume: Optional[str]) -> Tuple[List[str], Dict[int, float], object]:
        model = tiny_model("qwen2.5-vl", seed=seed, tokenizer=tok)
        # transformers 5.24's resume would not restore this model's weights (docs/trainers.md)
        model._weight_conversions = []
        args = transformers.TrainingArguments(
            output_dir=str(out), max_steps=2, save_steps=1, logging_steps=1, learning_rate=1e-3,
            report_to=[], use_cpu=True, disable_tqdm=True,
        )  # fmt: skip
        Trainer.steps = []
        scope: Dict[str, object] = {"model": model, "args": args, "Trainer": Trainer}
        scope = _run(block, tmp_path / "model", scope, close=False)
        trainer, loader = scope["trainer"], scope["loader"]
        try:
            assert loader.epoch == 1, "the block's loop reads one whole epoch"
            assert len(loader) == 2
            trainer.train(resume_from_checkpoint=resume)
        finally:
            loader.close()
        assert trainer.state.global_step == 2
        losses = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
        return Trainer.steps, losses, trainer.model

    init = {k: v.clone() for k, v in tiny_model("qwen2.5-vl", tokenizer=tok).state_dict().items()}
    steps, losses, model = run(0, None)
    assert len(set(steps)) == 2, "two steps of two different batches"
    assert sorted(losses) == [1, 2] and all(math.isfinite(v) for v in losses.values())
    assert any(not torch.equal(v, init[k]) for k, v in model.state_dict().items()), "trained"
    again, again_losses, _ = run(1, str(out / "checkpoint-1"))
    assert again == steps[1:], "the resumed Trainer got other batches"
    assert again_losses[2] == losses[2]


# ---- Megatron-LM and Megatron-Bridge --------------------------------------------------------

# The `...` of the page's command line: Megatron-LM's own flags, for a tiny GPT
MEGATRON_MODEL_FLAGS = (
    "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 512 "
    "--max-position-embeddings 512 --micro-batch-size 2 --global-batch-size 2 "
    "--train-iters 2 --save-interval 1 --eval-iters 0 --eval-interval 1000 --seed 7 "
    "--tokenizer-type NullTokenizer --vocab-size 1000 --transformer-impl local "
    "--no-gradient-accumulation-fusion"
).split()


class _ModelProviderReached(Exception):
    """The block's script reached its own model_provider: past everything mmloader does."""


def _megatron_argv(scratch, ckpt) -> List[str]:
    """docs/megatron.md's torchrun line, as train.py's sys.argv: its flags with the scratch
    data and model in place of its S3 glob and /models path, then Megatron-LM's own."""
    (cmd,) = [
        b.code
        for b in blocks(os.path.join(ROOT, "docs", "megatron.md"))
        if b.lang == "sh" and "train.py" in b.code
    ]
    words = shlex.split(re.sub(r"\\\n", " ", cmd))
    out = ["train.py"]
    for w in words[words.index("train.py") + 1 :]:
        if w == "...":
            continue
        w = w.replace("s3://bucket/sft/", str(scratch / "data") + "/")
        w = re.sub(r"^/models/[^/]+", str(scratch / "model"), w)
        out.append(w.replace("$CKPT", str(ckpt)))
    return out + MEGATRON_MODEL_FLAGS


@pytest.mark.parametrize("block", _runs("megatron"), ids=lambda b: b.where())
def test_megatron_blocks_run(block, scratch, tmp_path, monkeypatch):
    """Megatron-LM's block runs as a training script would: sys.argv is the page's torchrun
    line, and mml.pretrain runs the installed Megatron-LM's argument parsing and pretrain.
    pretrain needs CUDA: on a machine without it Megatron-LM stops at its own check ("Megatron
    requires CUDA"), elsewhere at the script's model_provider.  Then what pretrain does next
    with the data runs: Megatron's parsed args hold mmloader's flags, the block's provider
    builds the loaders from them and its forward_step takes a batch.  Bridge's block needs
    Transformer Engine (its recipes import it) and the model's config from the Hub."""
    torch = pytest.importorskip("torch", reason="Megatron needs torch")
    pytest.importorskip(
        "megatron.training",
        reason="megatron.training (megatron-core >= 0.18) is not installed: "
        "scripts/test-megatron-current.sh runs these blocks in its venv",
    )
    if "megatron.bridge" in block.code:
        if importlib.util.find_spec("megatron.bridge") is None:
            pytest.skip("Megatron-Bridge is not installed (scripts/test-megatron-current.sh)")
        pytest.importorskip(
            "transformer_engine",
            reason="Megatron-Bridge's recipes import Transformer Engine, which has no CPU "
            "build (tests/test_megatron_current.py runs MMLoaderDataset through Bridge's "
            "data path and steps)",
        )
        monkeypatch.chdir(scratch)
        _run(block, scratch / "model", {})
        return
    from megatron.core.enums import ModelType
    from megatron.core.num_microbatches_calculator import destroy_num_microbatches_calculator
    from megatron.training import get_args
    from megatron.training.global_vars import destroy_global_vars

    def model_provider(*a, **k):
        raise _ModelProviderReached()

    monkeypatch.chdir(scratch)
    monkeypatch.setattr(sys, "argv", _megatron_argv(scratch, tmp_path / "ckpt"))
    for k, v in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1").items():
        monkeypatch.setenv(k, v)  # what torchrun sets
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    # the rest of the user's script: its model and the ModelType it imports
    scope = {"__name__": "__doc_block__", "ModelType": ModelType, "model_provider": model_provider}
    code = compile(block.code, block.where(), "exec")
    try:
        if torch.cuda.is_available():
            with pytest.raises(_ModelProviderReached):
                exec(code, scope)
        else:
            with pytest.raises(AssertionError, match="Megatron requires CUDA"):
                exec(code, scope)
        args = get_args()
        assert args.mmloader_data == [str(scratch / "data" / "*.jsonl")]
        assert args.dataloader_type == "external"  # mml.pretrain's default
        assert args.dataloader_save == str(tmp_path / "ckpt" / "dataloader")
        train, valid, test = scope["train_valid_test_datasets_provider"]([4, 0, 0])
        try:
            assert valid is None and test is None
            assert scope["forward_step"](train, None) is None  # the page's `...`
            batch = scope["mml"].get_batch(train)
            assert batch["tokens"].shape == (1, 512)  # --mmloader-packing: one pack of 512
            assert batch["position_ids"].shape == (3, 1, 512)  # --mmloader-mrope
            assert batch["packed_seq_params"].qkv_format == "thd"
        finally:
            train.close()
    finally:
        destroy_global_vars()
        destroy_num_microbatches_calculator()
