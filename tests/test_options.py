"""The engine's option table (csrc/core/loader/options.c) drives mmloader.Loader: its keywords,
defaults, checks and resume fingerprint; unknown keys and bad names are errors."""

import inspect

import pytest

import mmloader
from mmloader import _core
from mmloader.loader import OPTIONS, _PLAN_KEYS
from mmloader.tokenizer import TINY_TOKENIZER_PATH

# Loader keywords resolved in Python (paths, presets, the tokenizer, the device string)
# rather than passed to the engine as table options.
PYTHON_LEVEL = {
    "data",
    "preset",
    "model_dir",
    "tokenizer",
    "min_pixels",
    "max_pixels",
    "max_image_pixels",
    "image_mean",
    "image_std",
    "legacy_resize",
    "fast_decode",
    "strict_jpeg",
    "image_route",
    "allow_mixture_change",
    "device",
}


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
    public = {k for k, o in OPTIONS.items() if not o["internal"]}
    assert keywords - PYTHON_LEVEL == public
    doc = mmloader.Loader.__doc__
    for name in public:
        assert params[name].default == OPTIONS[name]["default"], name
        assert name in doc, f"{name} is not documented in Loader's docstring"


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
        if o["default"] is not None and not o["secret"]:
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
    # the global plan's options enter only when set (states from before them stay readable)
    marked = {k for k, o in OPTIONS.items() if o["fingerprint"]} - set(_PLAN_KEYS)
    assert set(fp) == marked | {"data", "num_samples", "vision", "tokenizer"}
    assert fp["keys"] == "megatron" and fp["shuffle"] == 1 and fp["seq_length"] == 0
