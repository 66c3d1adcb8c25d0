"""The README and docs/ show code that works: every relative link resolves, every Python
block compiles and calls the Loaders with options that exist, every `python -m mmloader`
line uses flags its command has, and the blocks marked `<!-- doctest: run -->` run, in a
scratch folder holding `data/train-*.jsonl`, `train.jsonl` and a model folder (the
`/models/...` paths the pages show are replaced by it; `ckpt` names it too)."""

from __future__ import annotations

import ast
import glob
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from typing import Dict, Iterator, List, Set, Tuple

import pytest

import mmloader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
RUN_MARK = "<!-- doctest: run -->"
_FENCE = re.compile(r"^```(\w*)\s*$")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


class Block:
    def __init__(self, page: str, line: int, lang: str, code: str, run: bool):
        self.page, self.line, self.lang, self.code, self.run = page, line, lang, code, run

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
        run = i > 0 and lines[i - 1].strip() == RUN_MARK
        yield Block(page, i + 1, m.group(1), "\n".join(lines[i + 1 : j]), run)
        i = j + 1


def all_blocks(lang: str) -> List[Block]:
    return [b for p in PAGES for b in blocks(p) if b.lang == lang]


def test_pages_exist_and_the_readme_is_short():
    names = {os.path.basename(p) for p in PAGES}
    for need in ("data.md", "mixtures.md", "pixels.md", "remote.md", "benchmarks.md"):
        assert need in names
    assert len(open(PAGES[0], encoding="utf-8").read().split("\n")) <= 220


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


def _cli_flags(sub: str) -> Set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "mmloader", sub, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
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
    assert len([b for b in all_blocks("python") if b.run]) >= 3


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
    shared = os.path.join(ROOT, "..", "shared", "data", "qwen3-tokenizer", "tokenizer.json")
    tiny = os.path.join(ROOT, "mmloader", "data", "tiny-tokenizer.json")
    shutil.copy(shared if os.path.exists(shared) else tiny, model / "tokenizer.json")
    (model / "preprocessor_config.json").write_text(
        json.dumps({"min_pixels": 3136, "max_pixels": 200704})
    )
    return root


@pytest.mark.parametrize(
    "block", [b for b in all_blocks("python") if b.run], ids=lambda b: b.where()
)
def test_marked_blocks_run(block, scratch, monkeypatch):
    if "torch" in block.code:
        pytest.importorskip("torch", reason="the block uses torch")
    monkeypatch.chdir(scratch)
    code = re.sub(r'"/models/[^"]*"', repr(str(scratch / "model")), block.code)
    scope = {"__name__": "__doc_block__", "ckpt": str(scratch / "model")}
    exec(compile(code, block.where(), "exec"), scope)
    for v in scope.values():  # the blocks' loaders stop here, not at interpreter exit
        if hasattr(v, "close") and type(v).__module__.startswith("mmloader"):
            v.close()
