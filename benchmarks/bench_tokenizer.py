"""Tokenizer throughput on one thread: mmloader.Tokenizer against Hugging Face `tokenizers`
(same tokenizer.json, one Rayon thread) and `tiktoken` (an Encoding built from the same
vocabulary ranks and split regex), encoding the same SFT-style corpus in the same run.

    python3 -m pytest benchmarks/bench_tokenizer.py --benchmark-only -q -s

The corpus: chat-formatted conversations (Qwen template, image placeholders) whose turns
are English prose (docstrings of the Python standard library), Python source, and Chinese,
Japanese, Russian, Arabic and Hindi text with numbers and punctuation, built
deterministically.  Uses the real Qwen3 tokenizer when ../shared holds it, else the tiny
packaged one.  Lines starting with "[bench_tokenizer]" are the figures.
"""

import inspect
import json
import os
import random
import sys

os.environ["RAYON_NUM_THREADS"] = "1"  # tokenizers: one thread
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import pytest  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
sys.path.insert(0, REPO_ROOT)

import mmloader  # noqa: E402

QWEN_JSON = os.path.join(
    os.environ.get("MML_QWEN_TOKENIZER_DIR")
    or os.path.join(REPO_ROOT, "..", "shared", "data", "qwen3-tokenizer"),
    "tokenizer.json",
)
TOK_PATH = QWEN_JSON if os.path.exists(QWEN_JSON) else mmloader.tokenizer.TINY_TOKENIZER_PATH
QWEN_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
ROUNDS = 3

OTHER = [
    "我们今天讨论一下这张图片中的内容：天空很蓝，街道上有很多行人，右边有一家咖啡店。",
    "请用三句话总结这篇文章的主要观点，并给出你的理由。数据集包含 12,345 张图片。",
    "この画像には猫が二匹写っています。左の猫は眠っていて、右の猫はこちらを見ています。",
    "На фотографии изображена улица вечером: фонари горят, людей немного.",
    "تظهر الصورة سوقاً مزدحماً في وسط المدينة مع الكثير من الألوان.",
    "इस चित्र में एक नदी के किनारे पर एक छोटा सा गाँव दिखाई देता है।",
]


def sft_corpus(n_conv=1500, seed=1):
    mods = [
        "json",
        "os",
        "collections",
        "itertools",
        "functools",
        "re",
        "argparse",
        "pathlib",
        "typing",
        "dataclasses",
        "logging",
        "subprocess",
        "threading",
        "asyncio",
        "random",
        "statistics",
        "textwrap",
        "string",
        "csv",
        "sqlite3",
    ]
    prose, code = [], []
    for name in mods:
        m = __import__(name)
        for _, obj in inspect.getmembers(m):
            doc = inspect.getdoc(obj) if callable(obj) else None
            if doc and len(doc) > 80:
                prose.append(doc)
        try:
            code.append(inspect.getsource(m)[:20000])
        except (OSError, TypeError):
            pass
    prose.sort()
    rnd = random.Random(seed)
    convs = []
    for _ in range(n_conv):
        turns = ["<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"]
        for t in range(rnd.randint(1, 3)):
            k = rnd.random()
            if k < 0.5:
                q = rnd.choice(prose)[:600]
            elif k < 0.75:
                q = rnd.choice(OTHER) * rnd.randint(1, 3)
            else:
                src = rnd.choice(code)
                i = rnd.randrange(max(1, len(src) - 800))
                q = "Explain this code:\n```python\n" + src[i : i + 800] + "\n```"
            if t == 0 and rnd.random() < 0.7:
                q = "<|vision_start|>" + "<|image_pad|>" * rnd.randint(4, 64) + "<|vision_end|>" + q
            a = rnd.choice(prose)[:900] if rnd.random() < 0.7 else rnd.choice(OTHER) * 2
            turns.append(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n")
        convs.append("".join(turns))
    return convs


def tiktoken_from(path):
    tiktoken = pytest.importorskip("tiktoken")
    d = json.load(open(path, encoding="utf-8"))
    # GPT-2 byte table: symbol -> byte
    byte_of, extra = {}, 0
    for b in range(256):
        printable = 33 <= b <= 126 or 161 <= b <= 172 or b >= 174
        byte_of[chr(b) if printable else chr(256 + extra)] = b
        extra += 0 if printable else 1
    ranks = {bytes(byte_of[c] for c in tok): i for tok, i in d["model"]["vocab"].items()}
    special = {t["content"]: t["id"] for t in d["added_tokens"]}
    return tiktoken.Encoding(
        "bench", pat_str=QWEN_REGEX, mergeable_ranks=ranks, special_tokens=special
    )


_figures = {}


@pytest.fixture(scope="module")
def setup():
    tokenizers = pytest.importorskip("tokenizers")
    corpus = sft_corpus()
    ours = mmloader.Tokenizer.from_file(TOK_PATH)
    ref = tokenizers.Tokenizer.from_file(TOK_PATH)
    ids = ours.encode_batch(corpus)
    ntok = sum(map(len, ids))
    nbytes = sum(len(s.encode()) for s in corpus)
    print(
        f"\n[bench_tokenizer] tokenizer {TOK_PATH}: {len(corpus)} conversations, "
        f"{nbytes / 1e6:.2f} MB, {ntok} tokens"
    )
    yield corpus, ours, ref, ntok
    if {"mmloader", "tokenizers"} <= set(_figures):
        m = _figures["mmloader"]
        c = _figures.get("mmloader_cold_cache")
        for peer in ("tokenizers", "tokenizers_batch1", "tiktoken"):
            if peer in _figures:
                cold = f", cold cache {c / _figures[peer]:.2f}x" if c else ""
                print(
                    f"[bench_tokenizer] mmloader / {peer}: {m / _figures[peer]:.2f}x{cold} "
                    f"({m / 1e6:.2f} vs {_figures[peer] / 1e6:.2f} M tokens/s, one thread)"
                )


def record(benchmark, name, ntok):
    tps = ntok / benchmark.stats.stats.min
    _figures[name] = tps
    print(f"[bench_tokenizer] {name}: {tps / 1e6:.2f} M tokens/s")


def test_mmloader_encode(benchmark, setup):
    corpus, ours, _, ntok = setup
    enc = ours.encode
    out = benchmark.pedantic(lambda: [enc(s) for s in corpus], rounds=ROUNDS, iterations=1)
    assert sum(map(len, out)) == ntok
    record(benchmark, "mmloader", ntok)


def test_mmloader_encode_cold_cache(benchmark, setup):
    """Each round on a freshly loaded tokenizer: its word caches start empty."""
    corpus, _, _, ntok = setup

    def fresh():
        return (mmloader.Tokenizer.from_file(TOK_PATH).encode,), {}

    out = benchmark.pedantic(
        lambda enc: [enc(s) for s in corpus], setup=fresh, rounds=ROUNDS, iterations=1
    )
    assert sum(map(len, out)) == ntok
    record(benchmark, "mmloader_cold_cache", ntok)


def test_tokenizers_encode(benchmark, setup):
    corpus, _, ref, ntok = setup
    enc = ref.encode
    out = benchmark.pedantic(lambda: [enc(s).ids for s in corpus], rounds=ROUNDS, iterations=1)
    assert sum(map(len, out)) == ntok
    record(benchmark, "tokenizers", ntok)


def test_tokenizers_encode_batch_one_thread(benchmark, setup):
    corpus, _, ref, ntok = setup
    out = benchmark.pedantic(
        lambda: [e.ids for e in ref.encode_batch(corpus)], rounds=ROUNDS, iterations=1
    )
    assert sum(map(len, out)) == ntok
    record(benchmark, "tokenizers_batch1", ntok)


def test_tiktoken_encode(benchmark, setup):
    corpus, _, _, ntok = setup
    enc = tiktoken_from(TOK_PATH)
    f = enc.encode
    out = benchmark.pedantic(
        lambda: [f(s, allowed_special="all") for s in corpus], rounds=ROUNDS, iterations=1
    )
    # tiktoken skips NFC and may split rare words differently; counts agree closely
    assert abs(sum(map(len, out)) - ntok) < 0.01 * ntok
    record(benchmark, "tiktoken", ntok)


def test_mmloader_encode_batch_all_threads(benchmark, setup):
    corpus, ours, _, ntok = setup
    out = benchmark.pedantic(lambda: ours.encode_batch(corpus), rounds=ROUNDS, iterations=1)
    assert sum(map(len, out)) == ntok
    record(benchmark, "mmloader_batch_all_threads", ntok)
