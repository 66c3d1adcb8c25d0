"""The engine's option table (csrc/core/loader/options.c) drives mmloader.Loader: its keywords,
defaults, checks and resume fingerprint; unknown keys and bad names are errors."""

import ast
import glob
import inspect
import os
import re

import pytest

import mmloader
from mmloader import _core
from mmloader.loader import OPTIONS, _OFF_KEYS
from mmloader.tokenizer import TINY_TOKENIZER_PATH

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Loader keywords with no row in the table (structured values: paths or sources, the device
# string, channel statistics), documented once in mmloader/loader.py _UNTABLED_DOCS.
UNTABLED = {"data", "image_mean", "image_std", "device"}


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    from mmloader.datagen import make_dataset

    root = str(tmp_path_factory.mktemp("opts"))
    return make_dataset(
        root, n_samples=8, seed=2, n_shards=1, n_images=4, min_size=32, max_size=64
    )["shards"][0]


def test_table_rows_are_well_formed():
    rows = _core.loader_options()
    names = [r["name"] for r in rows]
    assert len(names) == len(set(names))
    for r in rows:
        assert r["type"] in ("bool", "int", "float", "str", "enum"), r
        assert r["doc"], r["name"]
        if r["type"] == "enum":
            assert r["choices"] and r["default"] in r["choices"], r
        if r["type"] in ("int", "float") and r["default"] is not None:
            assert r["min"] <= r["default"] <= r["max"], r


def test_loader_keywords_are_the_table():
    params = inspect.signature(mmloader.Loader.__init__).parameters
    keywords = set(params) - {"self"}
    rows = {k for k, o in OPTIONS.items() if not o["internal"]}
    assert keywords - UNTABLED == rows
    python = {k for k, o in OPTIONS.items() if o["python"]}
    assert {"preset", "tokenizer", "min_pixels", "image_route"} <= python
    for name in rows:
        assert params[name].default == OPTIONS[name]["default"], name


def test_loader_docstring_is_generated_from_the_table():
    """Every keyword's entry in Loader.__doc__ is its row's doc (and default), in the table's
    order; the docstring in loader.py's source spells none of them."""
    doc = " ".join(mmloader.Loader.__doc__.split())
    at = -1
    for name, o in OPTIONS.items():
        if o["internal"]:
            continue
        entry = f"{name}: " + " ".join(o["doc"].split())
        assert entry in doc, name
        assert doc.index(entry) > at, f"{name} is out of the table's order"
        at = doc.index(entry)
    for name in UNTABLED - {"image_mean", "image_std"}:
        assert f" {name}: " in doc, name
    src = ast.parse(open(mmloader.loader.__file__).read())
    (cls,) = [n for n in src.body if isinstance(n, ast.ClassDef) and n.name == "Loader"]
    hand = ast.get_docstring(cls)
    spelled = [k for k in OPTIONS if re.search(rf"^\s*{k}\b.*:", hand, re.M)]
    assert not spelled, f"hand-written doc entries in Loader's docstring: {spelled}"


# ---- the table is the only spelling --------------------------------------------------------
#
# Each place below spells an option's name beside a default, a parser or its choices outside
# the table, with the reason it may.  Anything else found fails the test.
PY_DEFAULT_OK = {
    ("mmloader/datagen.py", "make_dataset", "seed"),  # the generator's own seed, not a Loader's
    ("mmloader/loader.py", "__init__", "device"),  # untabled: the "cuda:N" string
    # transformers' smart_resize, reproduced with its signature: its defaults, not a Loader's
    ("mmloader/vision.py", "smart_resize", "min_pixels"),
    ("mmloader/vision.py", "smart_resize", "max_pixels"),
    # Bridge's dataset field: Megatron's RNGConfig seed (1234), the seed its recipes train with
    ("mmloader/megatron/bridge.py", "MMLoaderDataset", "seed"),
}
C_DEFAULT_OK = {
    # a pool's own field (another struct), not the configuration's
    ("csrc/core/base/pool.c", "device"),
    # the engine resolving micro_batch_size=None (the row's doc names the 8)
    ("csrc/core/loader/loader.c", "micro_batch_size"),
    # the device row's -1 ("host") turned into to_device and a CUDA index
    ("csrc/py/options_py.c", "device"),
    # mml_vision_preset fills the vision level's own struct (below the loader, which cannot
    # read the table) with the MML_DEFAULT_ constant the row's default is
    ("csrc/core/vision/vision.c", "max_jpeg_scans"),
}
# The vision config's video_family takes the model family's names (mml_video_family).
C_ENUM_OK = {
    (f, row)
    for f in ("csrc/core/vision/vision.c", "csrc/py/vision_py.c")
    for row in ("preset", "template")
}
LEGACY_FLAGS = {"threads", "batch_size", "no_shuffle"}


def _py_files():
    return sorted(glob.glob(os.path.join(ROOT, "mmloader", "**", "*.py"), recursive=True))


def _rel(f):
    return os.path.relpath(f, ROOT)


def _literal(node) -> bool:
    """A value written out: a constant other than None, or arithmetic of constants (56 * 56)."""
    if isinstance(node, ast.Constant):
        return node.value is not None
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    if isinstance(node, ast.BinOp):
        return _literal(node.left) and _literal(node.right)
    return False


def test_python_spells_no_option_default_or_flag():
    """No function or class (a dataclass's fields) of mmloader gives a table option a literal
    default, and no command line declares an option's flag by hand (mmloader/_options.py
    builds them from the table)."""
    found = []
    for f in _py_files():
        rel = _rel(f)
        for node in ast.walk(ast.parse(open(f).read())):
            pairs = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                pos = a.posonlyargs + a.args
                pairs = [(x.arg, d) for x, d in zip(pos[len(pos) - len(a.defaults) :], a.defaults)]
                pairs += [(x.arg, d) for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            if isinstance(node, ast.ClassDef):
                pairs = [
                    (x.target.id, x.value)
                    for x in node.body
                    if isinstance(x, ast.AnnAssign) and isinstance(x.target, ast.Name) and x.value
                ]
            for name, d in pairs:
                if name in OPTIONS and _literal(d) and (rel, node.name, name) not in PY_DEFAULT_OK:
                    found.append(f"{rel}: {node.name}({name}={ast.unparse(d)})")
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                for x in node.args:
                    if isinstance(x, ast.Constant) and isinstance(x.value, str):
                        n = x.value.lstrip("-").replace("-", "_")
                        n = n[len("mmloader_") :] if n.startswith("mmloader_") else n
                        if n in OPTIONS or n in LEGACY_FLAGS:
                            found.append(f"{rel}: add_argument({x.value!r})")
    assert not found, found


def _c_rows():
    """{field path in mml_loader_cfg: option name}, read from options.c's CFG(...) rows."""
    src = open(os.path.join(ROOT, "csrc/core/loader/options.c")).read()
    return {
        m.group(2): m.group(1) for m in re.finditer(r'\{"(\w+)", MML_OPT_\w+, CFG\(([\w.]+)\)', src)
    }


def test_c_spells_no_option_default_or_parser():
    """Outside options.c no C file sets a configuration field of a row to a literal, pairs an
    option's name with a literal default, or lists two of an enum row's names (a parser of
    its own)."""
    rows = _c_rows()
    assert len(rows) > 40
    enums = {k: set(o["choices"]) for k, o in OPTIONS.items() if o["type"] == "enum"}
    found = []
    files = glob.glob(os.path.join(ROOT, "csrc", "**", "*.[ch]"), recursive=True)
    for f in sorted(files):
        rel = _rel(f)
        if rel == "csrc/core/loader/options.c":
            continue
        src = re.sub(r"/\*.*?\*/", "", open(f).read(), flags=re.S)
        for fld, name in rows.items():
            pat = r"(?:\.|->)" + re.escape(fld) + r"\s*=\s*(-?[0-9][\w.]*|MML_DEFAULT_\w+)\s*;"
            if re.search(pat, src) and (rel, name) not in C_DEFAULT_OK:
                found.append(f"{rel}: {name} set to a literal")
        for m in re.finditer(r'\{\s*"(\w+)"\s*,\s*(-?[0-9]\w*|MML_\w+)\s*\}', src):
            if m.group(1) in OPTIONS:
                found.append(f"{rel}: {m.group(0)}")
        for row, choices in enums.items():
            cmp = set(re.findall(r'strcmp\([^;]*?"([\w.\-]+)"\)', src)) & choices
            arrays = [
                set(re.findall(r'"([\w.\-]+)"', g)) & choices
                for g in re.findall(r'\{\s*("[^{}]*")\s*\}', src)
            ]
            if (len(cmp) >= 2 or any(len(x) >= 2 for x in arrays)) and (rel, row) not in C_ENUM_OK:
                found.append(f"{rel}: parses {row} ({sorted(choices)}) itself")
    assert not found, found


def test_the_scans_find_what_they_look_for():
    """The scans above are not vacuous: the spellings they look for are found in planted
    text."""
    planted = 'static const char *const k[] = {"qwen", "megatron"};\n{"seq_length", 0}'
    assert re.findall(r'\{\s*("[^{}]*")\s*\}', planted)
    assert re.search(r'\{\s*"(\w+)"\s*,\s*(-?[0-9]\w*|MML_\w+)\s*\}', planted)
    tree = ast.parse("def f(seq_length=4): pass\nap.add_argument('--seq-length')")
    fn, call = tree.body[0], tree.body[1].value
    assert fn.args.defaults[0].value == 4 and call.args[0].value == "--seq-length"
    field = ast.parse("class C:\n    max_pixels: int = 28 * 28 * 1280").body[0].body[0]
    assert isinstance(field, ast.AnnAssign) and _literal(field.value)
    assert not _literal(ast.parse("DEFAULTS['preset']").body[0].value)


def test_command_lines_take_the_tables_flags():
    import argparse

    from mmloader import _options, dsindex, profile
    from mmloader.__main__ import DEMO_FLAGS

    for names, add in (
        (profile.LOADER_FLAGS, profile.add_arguments),
        (dsindex.LOADER_FLAGS, dsindex.add_arguments),
    ):
        p = argparse.ArgumentParser()
        add(p)
        for name in names:
            assert _options.flag(name) in p._option_string_actions, name
    assert set(DEMO_FLAGS) <= set(OPTIONS)
    p = argparse.ArgumentParser()
    profile.add_arguments(p)
    a = p.parse_args(["x", "--micro-batch-size", "3", "--no-shuffle", "--preset", "qwen3-vl"])
    assert _options.flag_kwargs(a, profile.LOADER_FLAGS) == dict(
        micro_batch_size=3, shuffle=False, preset="qwen3-vl"
    )
    with pytest.raises(SystemExit):
        p.parse_args(["x", "--preset", "qwen9"])  # the table's choices


@pytest.mark.parametrize(
    "opts, match",
    [
        ({"keyz": "megatron"}, "unknown Loader option 'keyz'"),
        ({"keys": "hf"}, r"keys must be one of \('qwen', 'megatron'\), got 'hf'"),
        ({"label_mode": "x"}, "label_mode must be one of"),
        ({"text_only_vision": "none"}, "text_only_vision must be one of"),
        ({"on_error": "ignore"}, "on_error must be one of"),
        ({"data_format": "csv"}, "data_format must be one of"),
        ({"micro_batch_size": 0}, "micro_batch_size must be >= 1, got 0"),
        ({"micro_batch_size": 2.0}, "micro_batch_size must be an integer"),
        ({"micro_batch_size": True}, "micro_batch_size must be an integer"),
        (
            {"micro_batch_size": 4, "max_tokens_per_batch": 4096},
            r"give micro_batch_size \(fixed rows\) or max_tokens_per_batch .*not both",
        ),
        (
            {"max_tokens_per_batch": 4096, "packing": True, "pack_length": 4096},
            "with packing=True a batch is one pack of pack_length tokens",
        ),
        ({"max_tokens_per_batch": 4096, "seq_length": 1024}, "use micro_batch_size=4 instead"),
        ({"balance": "vision"}, "balance must be one of"),
        ({"group_by_length": 0}, "group_by_length must be >= 1"),
        ({"seq_length": 0}, "seq_length must be >= 1"),
        ({"max_error_rate": 2.0}, r"max_error_rate must be a number in \[0, 1\]"),
        ({"max_error_rate": float("nan")}, "max_error_rate must be a number"),
        ({"shuffle": "yes"}, "shuffle must be True or False"),
        ({"shuffle": 2}, "shuffle must be True or False"),
        ({"image_root": 3}, "image_root must be a string"),
        ({"dp_rank": 2, "dp_size": 2}, r"dp_rank must be < dp_size \(2\), got 2"),
        ({"packing": True}, "packing=True needs pack_length"),
        ({"pack_length": 64}, "pack_length is only meaningful with packing=True"),
        ({"micro_batch_size": 2**70}, "fits 64 bits"),
    ],
)
def test_bad_options_are_errors(opts, match):
    with pytest.raises(mmloader.ConfigError, match=match):
        _core.check_loader_options(opts)


def test_secret_values_never_shown():
    with pytest.raises(mmloader.ConfigError) as e:
        _core.check_loader_options({"aws_secret_access_key": 12345678})
    assert "12345678" not in str(e.value)
    assert "aws_secret_access_key" not in _core.check_loader_options({})


def test_defaults_and_none():
    got = _core.check_loader_options({"seq_length": None, "keys": "megatron"})
    assert got["seq_length"] == 0 and got["keys"] == "megatron"
    for name, o in OPTIONS.items():
        if o["default"] is not None and not (o["secret"] or o["python"]):
            assert got[name] == o["default"] or name == "keys", name


def test_engine_rejects_unknown_keys(shard):
    # The binding itself parses by the table: a typo no longer falls back to a default.
    tok = mmloader.Tokenizer.from_file(TINY_TOKENIZER_PATH)
    cfg = dict(
        data=[shard],
        vision=mmloader.presets.vision_config("qwen2.5-vl", None),
        num_threads=1,
        template="qwen2-vl",
    )
    _core._Loader(dict(cfg), tok).close()
    with pytest.raises(mmloader.ConfigError, match="unknown Loader option 'keyz'"):
        _core._Loader(dict(cfg, keyz="megatron"), tok)
    with pytest.raises(mmloader.ConfigError, match="template must be one of"):
        _core._Loader(dict(cfg, template="qwen9"), tok)


def test_loader_reports_its_options_and_fingerprint(shard):
    with mmloader.Loader(
        shard,
        tokenizer=TINY_TOKENIZER_PATH,
        micro_batch_size=2,
        num_threads=1,
        keys="megatron",
        seq_length=None,
    ) as L:
        opts = L._core().options()
        assert opts["keys"] == "megatron" and opts["micro_batch_size"] == 2
        assert opts["seq_length"] == 0 and opts["num_threads"] == 1
        fp = L.state_dict()["fingerprint"]
    # the global plan's options and data_flatten enter only when set (states from before
    # them stay readable)
    marked = {k for k, o in OPTIONS.items() if o["fingerprint"]} - set(_OFF_KEYS)
    assert set(fp) == marked | {"data", "num_samples", "vision", "tokenizer"}
    assert fp["keys"] == "megatron" and fp["shuffle"] == 1 and fp["seq_length"] == 0
