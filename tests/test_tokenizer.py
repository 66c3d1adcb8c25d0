"""mmloader.Tokenizer against Hugging Face `tokenizers` (the reference) on the real Qwen3
tokenizer (skipped when absent) and on the small tokenizer shipped with mmloader."""
import json
import os

import pytest

import mmloader

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# MML_QWEN_TOKENIZER_DIR overrides the location (e.g. when testing from a worktree).
QWEN_DIR = os.environ.get("MML_QWEN_TOKENIZER_DIR") or os.path.join(
    REPO_ROOT, "..", "shared", "data", "qwen3-tokenizer")
QWEN_JSON = os.path.join(QWEN_DIR, "tokenizer.json")

tokenizers = pytest.importorskip("tokenizers")


def qwen_path():
    if not os.path.exists(QWEN_JSON):
        pytest.skip(f"real Qwen tokenizer not found at {QWEN_JSON} "
                    "(CI clones shared/ beside the repository)")
    return QWEN_JSON


@pytest.fixture(scope="module")
def qwen():
    p = qwen_path()
    return mmloader.Tokenizer.from_file(p), tokenizers.Tokenizer.from_file(p)


SMOKE = [
    "", "Hello world", "<|im_start|>user\nHi there's 'S a   b\r\n\n  x<|im_end|>\n",
    "日本語のテキスト 123456 ümlaut e\u0301", "  \t\t ab\n\n\n  ", "<think>\nok</think>",
    "🤷🏽\u200d♀️ ok", "a" * 3000,
]


def test_qwen_smoke(qwen):
    ours, ref = qwen
    for s in SMOKE:
        assert ours.encode(s) == ref.encode(s).ids, repr(s)


def test_qwen_special_ids(qwen):
    ours, _ = qwen
    assert ours.token_to_id("<|im_start|>") == 151644
    assert ours.token_to_id("<|image_pad|>") == 151655
    assert ours.token_to_id("no such token") is None
    assert ours.vocab_size == 151669
