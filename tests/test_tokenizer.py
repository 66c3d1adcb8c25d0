"""mmloader.Tokenizer against Hugging Face `tokenizers` (the reference): the real Qwen3
tokenizer (skipped when absent) and the small tokenizer shipped with mmloader, on a
deterministic corpus of 10,000 strings; 100% identical ids are required."""

import concurrent.futures
import json
import os
import random
import subprocess
import sys
import unicodedata

import pytest

import mmloader
from mmloader import _core
from tokenizer_corpus import SPECIAL_STRINGS, make_corpus

tokenizers = pytest.importorskip("tokenizers")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# MML_QWEN_TOKENIZER_DIR overrides the location (e.g. when testing from a worktree).
QWEN_DIR = os.environ.get("MML_QWEN_TOKENIZER_DIR") or os.path.join(
    REPO_ROOT, "..", "shared", "data", "qwen3-tokenizer"
)
QWEN_JSON = os.path.join(QWEN_DIR, "tokenizer.json")
TINY_JSON = mmloader.tokenizer.TINY_TOKENIZER_PATH
QWEN_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@pytest.fixture(scope="module")
def corpus():
    return make_corpus(10000, seed=5)


@pytest.fixture(scope="module", params=["qwen3", "tiny"])
def pair(request):
    if request.param == "qwen3":
        if not os.path.exists(QWEN_JSON):
            pytest.skip(
                f"real Qwen tokenizer not found at {QWEN_JSON} "
                "(CI clones shared/ beside the repository)"
            )
        path = QWEN_JSON
    else:
        path = TINY_JSON
    return mmloader.Tokenizer.from_file(path), tokenizers.Tokenizer.from_file(path)


@pytest.fixture(scope="module")
def reference_ids(pair, corpus):
    _, ref = pair
    return [ref.encode(s).ids for s in corpus]


def first_mismatch(ours, want, corpus):
    for i, (a, b) in enumerate(zip(ours, want)):
        if a != b:
            return f"corpus[{i}] = {corpus[i][:200]!r}: ours {a[:40]} != ref {b[:40]}"
    return None


def test_corpus_is_rich(corpus):
    text = "".join(corpus)
    assert len(corpus) >= 10000
    for probe in [
        "\r\n",
        "\r",
        "\t",
        "  ",
        "\u200d",
        "<|im_start|>",
        "DON'T",
        "\u0301",
        "\u0915",
        "\u0627",
        "\U0001f44d",
    ]:
        assert probe in text, probe
    assert any(unicodedata.normalize("NFC", s) != s for s in corpus)
    assert max(len(s) for s in corpus) > 2000


def test_parity_encode_batch(pair, corpus, reference_ids):
    ours, _ = pair
    got = ours.encode_batch(corpus)
    assert first_mismatch(got, reference_ids, corpus) is None
    assert got == reference_ids


def test_parity_encode_one_by_one(pair, corpus, reference_ids):
    ours, _ = pair
    got = [ours.encode(s) for s in corpus[:3000]]
    assert first_mismatch(got, reference_ids, corpus) is None


def test_roundtrip_is_nfc(pair, corpus):
    ours, _ = pair
    got = ours.encode_batch(corpus)
    assert len(got) == len(corpus) > 0
    for s, ids in zip(corpus, got):
        assert ours.decode(ids) == unicodedata.normalize("NFC", s), repr(s[:100])


def test_decode_matches_reference(pair, corpus, reference_ids):
    ours, ref = pair
    for ids in reference_ids[:2000]:
        assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids)
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=False)
    rnd = random.Random(3)  # arbitrary ids: split UTF-8 sequences decode to U+FFFD
    for _ in range(300):
        ids = [rnd.randrange(ours.vocab_size) for _ in range(rnd.randint(1, 12))]
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=False), ids


def test_lookups(pair):
    ours, ref = pair
    assert ours.vocab_size == ref.get_vocab_size(with_added_tokens=True)
    assert ours.get_vocab_size() == ours.vocab_size
    vocab = ref.get_vocab(with_added_tokens=True)
    rnd = random.Random(1)
    for tok, i in rnd.sample(sorted(vocab.items()), 2000):
        assert ours.token_to_id(tok) == i
        assert ours.id_to_token(i) == ref.id_to_token(i)
    for tok in [
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|image_pad|>",
        "<|video_pad|>",
        "<tool_call>",
    ]:
        assert ours.token_to_id(tok) == ref.token_to_id(tok) is not None
        assert ours.is_special(ours.token_to_id(tok)) == (tok != "<tool_call>")
    assert ours.token_to_id("no such token here") is None
    assert ours.id_to_token(10**9) is None and ours.id_to_token(-1) is None


def test_qwen_known_ids():
    if not os.path.exists(QWEN_JSON):
        pytest.skip(f"real Qwen tokenizer not found at {QWEN_JSON}")
    t = mmloader.Tokenizer.from_file(QWEN_DIR)  # a directory works too
    assert t.encode("Hello world") == [9707, 1879]
    assert [
        t.token_to_id(s)
        for s in [
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            "<|vision_start|>",
            "<|vision_end|>",
            "<|image_pad|>",
            "<|video_pad|>",
        ]
    ] == [151643, 151644, 151645, 151652, 151653, 151655, 151656]
    assert t.vocab_size == 151669
    ph = "<|vision_start|>" + "<|image_pad|>" * 4 + "<|vision_end|>"
    assert t.encode(ph) == [151652] + [151655] * 4 + [151653]


def test_pre_tokenizer_pieces_match(corpus):
    split = tokenizers.pre_tokenizers.Split(tokenizers.Regex(QWEN_REGEX), behavior="isolated")
    for s in corpus[:4000]:
        assert _core._tok_pre_split(s) == [p for p, _ in split.pre_tokenize_str(s)], repr(s[:100])


def check_classes(cps):
    split = tokenizers.pre_tokenizers.Split(tokenizers.Regex(QWEN_REGEX), behavior="isolated")
    for i in range(0, len(cps), 8192):
        # ... and the case-insensitive contractions: which characters fold to s/t/m/d/re/ve/ll
        s = "".join(
            f"a{c}a.{c}.1{c}1 {c}'{c}\n'{c}a.'{c}ea.'{c}la.'l{c}a.'r{c}a."
            for c in map(chr, cps[i : i + 8192])
        )
        assert _core._tok_pre_split(s) == [p for p, _ in split.pre_tokenize_str(s)], hex(cps[i])


def test_pre_tokenizer_code_point_classes():
    """Code points in contexts that tell \\p{L}, \\p{N}, \\s and the rest apart: the whole
    BMP and a sample of the other planes (all of them: the slow test below)."""
    check_classes(
        [c for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF]
        + list(range(0x10000, 0x110000, 13))
        + list(range(0x2EBF0, 0x2EE60))
    )


@pytest.mark.slow
def test_pre_tokenizer_every_code_point_class():
    check_classes([c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF])


def test_nfc_matches_reference():
    nfc = tokenizers.normalizers.NFC()
    interesting = [
        c
        for c in range(0x110000)
        if not 0xD800 <= c <= 0xDFFF
        and (unicodedata.combining(chr(c)) or unicodedata.decomposition(chr(c)))
    ]
    interesting += (
        list(range(0x1100, 0x1113))
        + list(range(0x1161, 0x1176))
        + list(range(0x11A8, 0x11C3))
        + [0x11930, 0x11935, 0x11938, 0x0B47, 0x0B3E]
    )
    rnd = random.Random(11)
    for _ in range(100):
        parts = [
            "".join(
                chr(rnd.choice(interesting)) if rnd.random() < 0.8 else rnd.choice("aEo \u0915")
                for _ in range(rnd.randint(1, 8))
            )
            for _ in range(1000)
        ]
        s = "|".join(parts)
        assert _core._tok_nfc(s) == nfc.normalize_str(s)
    s = "".join(f"a{chr(c)}\u0323{chr(c)}\u0301{chr(c)}." for c in interesting)
    assert _core._tok_nfc(s) == nfc.normalize_str(s)
    assert _core._tok_nfc_quick("plain ascii and café")
    assert not _core._tok_nfc_quick("cafe\u0301")


def test_contractions_and_long_s():
    split = tokenizers.pre_tokenizers.Split(tokenizers.Regex(QWEN_REGEX), behavior="isolated")
    for s in ["x'ſa", "'ſ", "it'S", "WE'RE", "they'Ll", "I'M", "'D'T", "'re'", "’s", "'\u212aa"]:
        assert _core._tok_pre_split(s) == [p for p, _ in split.pre_tokenize_str(s)], s


def test_merges_as_strings_load_the_same(corpus):
    d = json.load(open(TINY_JSON, encoding="utf-8"))
    d["model"]["merges"] = [" ".join(m) for m in d["model"]["merges"]]
    text = json.dumps(d, ensure_ascii=False)
    ours, ref = mmloader.Tokenizer.from_str(text), tokenizers.Tokenizer.from_str(text)
    sample = corpus[:2000]
    assert ours.encode_batch(sample) == [e.ids for e in ref.encode_batch(sample)]


def test_ignore_merges(corpus):
    d = json.load(open(TINY_JSON, encoding="utf-8"))
    d["model"]["ignore_merges"] = True
    text = json.dumps(d, ensure_ascii=False)
    ours, ref = mmloader.Tokenizer.from_str(text), tokenizers.Tokenizer.from_str(text)
    sample = corpus[:2000]
    assert ours.encode_batch(sample) == [e.ids for e in ref.encode_batch(sample)]


@pytest.mark.parametrize(
    "opts",
    [
        dict(normalized=True),
        dict(lstrip=True),
        dict(rstrip=True),
        dict(lstrip=True, rstrip=True),
        dict(single_word=True),
        dict(normalized=True, special=True),
    ],
)
def test_added_token_options(opts, corpus):
    ref = tokenizers.Tokenizer.from_file(TINY_JSON)
    special = opts.pop("special", False)
    new = [
        tokenizers.AddedToken(t, special=special, **opts)
        for t in ["café", "word", "<mask>", "ﬁx", "Ω"]
    ]
    (ref.add_special_tokens if special else ref.add_tokens)(new)
    ours = mmloader.Tokenizer.from_str(ref.to_str())
    rnd = random.Random(7)
    texts = []
    for s in corpus[:1500]:
        words = [
            "café",
            "cafe\u0301",
            "word",
            "words",
            " word ",
            "<mask>",
            "  <mask>  ",
            "fix",
            "ﬁx",
            "Ω",
            "\u2126",
            "aword",
            "word_",
            "(word)",
        ]
        k = rnd.randrange(len(s) + 1)
        texts.append(s[:k] + rnd.choice(words) + s[k:] + rnd.choice(words))
    assert ours.encode_batch(texts) == [e.ids for e in ref.encode_batch(texts)]


def test_special_token_strings_are_split_out(pair):
    ours, ref = pair
    for s in SPECIAL_STRINGS:
        for t in [s, f"a{s}b", f" {s} ", f"{s}{s}", f"\n{s}\n"]:
            assert ours.encode(t) == ref.encode(t).ids, t


def test_lone_surrogates():
    """A str holding a lone surrogate (e.g. from a JSON "\\ud800" escape) cannot become UTF-8.
    `tokenizers` refuses it with TypeError; we refuse it with UnicodeEncodeError.  Valid
    surrogate pairs in JSON escapes decode to ordinary characters and encode normally."""
    ours = mmloader.Tokenizer.tiny()
    ref = tokenizers.Tokenizer.from_file(TINY_JSON)
    for bad in [json.loads('"a\\ud800b"'), json.loads('"\\udfff"'), "x\udc80"]:
        with pytest.raises(UnicodeEncodeError):
            ours.encode(bad)
        with pytest.raises(UnicodeEncodeError):
            ours.encode_batch(["ok", bad])
        with pytest.raises(TypeError):
            ref.encode(bad)
    good = json.loads('"smile \\ud83d\\ude00 ok"')
    assert good == "smile \U0001f600 ok"
    assert ours.encode(good) == ref.encode(good).ids


def test_bytes_input_replaces_invalid_utf8():
    """Bytes are taken as UTF-8; invalid sequences become U+FFFD exactly like
    bytes.decode("utf-8", "replace") (what the engine does with raw record bytes)."""
    ours = mmloader.Tokenizer.tiny()
    ref = tokenizers.Tokenizer.from_file(TINY_JSON)
    rnd = random.Random(9)
    cases = [
        b"a\xffb",
        b"\xed\xa0\x80",
        b"\xe2\x82",
        b"\xf0\x9f\x98",
        b"\xc0\xaf",
        b"\xf4\x90\x80\x80",
        "héllo".encode() + b"\x80",
        b"<|im_start|>\xfe<|im_end|>",
    ]
    cases += [bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 30))) for _ in range(2000)]
    for b in cases:
        assert ours.encode(b) == ref.encode(b.decode("utf-8", "replace")).ids, b


def test_encode_batch_threads_and_types(corpus):
    ours = mmloader.Tokenizer.tiny()
    want = [ours.encode(s) for s in corpus[:500]]
    for n in [1, 2, 3, 8]:
        assert ours.encode_batch(corpus[:500], num_threads=n) == want
    assert ours.encode_batch(iter(corpus[:10])) == want[:10]
    assert ours.encode_batch([]) == []
    with pytest.raises(TypeError):
        ours.encode_batch(["a", 3])
    with pytest.raises(ValueError):
        ours.encode_batch(["a"], num_threads=-1)


def test_python_threads_share_one_tokenizer(corpus):
    ours = mmloader.Tokenizer.tiny()
    want = [ours.encode(s) for s in corpus[:800]]
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        for _ in range(3):
            assert list(ex.map(ours.encode, corpus[:800])) == want


def test_decode_errors_and_options():
    t = mmloader.Tokenizer.tiny()
    ids = t.encode("<|im_start|>user\nhi<|im_end|>")
    assert t.decode(ids) == "<|im_start|>user\nhi<|im_end|>"
    assert t.decode(ids, skip_special_tokens=True) == "user\nhi"
    with pytest.raises(ValueError):
        t.decode([1, 10**9])
    with pytest.raises(ValueError):
        t.decode([-100])
    with pytest.raises(TypeError):
        t.decode(["a"])


def test_pickle_reloads():
    import pickle

    t = mmloader.Tokenizer.tiny()
    u = pickle.loads(pickle.dumps(t))
    assert isinstance(u, mmloader.Tokenizer) and u.encode("hello <|im_end|>") == t.encode(
        "hello <|im_end|>"
    )
    s = mmloader.Tokenizer.from_str(open(TINY_JSON, encoding="utf-8").read())
    assert pickle.loads(pickle.dumps(s)).vocab_size == t.vocab_size


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        mmloader.Tokenizer.from_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(mmloader.ConfigError, match="invalid JSON"):
        mmloader.Tokenizer.from_file(bad)
    d = json.load(open(TINY_JSON, encoding="utf-8"))
    d["normalizer"] = {"type": "NFKC"}
    with pytest.raises(mmloader.ConfigError, match="NFKC"):
        mmloader.Tokenizer.from_str(json.dumps(d))
    d = json.load(open(TINY_JSON, encoding="utf-8"))
    d["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+"
    with pytest.raises(mmloader.ConfigError, match="pre_tokenizer"):
        mmloader.Tokenizer.from_str(json.dumps(d))
    with pytest.raises(TypeError):
        mmloader.Tokenizer()


@pytest.mark.slow
def test_unicode_delta_is_current():
    """csrc/core/text/unicode_delta.h still describes this tokenizers + utf8proc pair."""
    if not tokenizers.__version__.startswith("0.23."):
        pytest.skip("unicode_delta.h was generated against tokenizers 0.23")
    import ctypes
    import ctypes.util

    lib = ctypes.CDLL(ctypes.util.find_library("utf8proc") or "libutf8proc.so.2")
    lib.utf8proc_unicode_version.restype = ctypes.c_char_p
    version = lib.utf8proc_unicode_version().decode()
    header = open(
        os.path.join(REPO_ROOT, "csrc", "core", "text", "unicode_delta.h"), encoding="utf-8"
    ).read()
    if f"(Unicode {version})" not in header:
        pytest.skip(f"unicode_delta.h was generated against another utf8proc (this one: {version})")
    r = subprocess.run(
        [sys.executable, os.path.join(REPO_ROOT, "tools", "gen_unicode_tables.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_tiny_tokenizer_is_small_and_reproducible():
    assert os.path.getsize(TINY_JSON) < 1_000_000
    d = json.load(open(TINY_JSON, encoding="utf-8"))
    qwen_like = {
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|image_pad|>",
        "<|video_pad|>",
    }
    contents = {t["content"]: t for t in d["added_tokens"]}
    assert qwen_like <= set(contents)
    assert any(not t["special"] for t in d["added_tokens"])
    assert d["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == QWEN_REGEX
    if not tokenizers.__version__.startswith("0.23."):
        pytest.skip("the packaged file was trained with tokenizers 0.23")
    r = subprocess.run(
        [sys.executable, os.path.join(REPO_ROOT, "tools", "make_tiny_tokenizer.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
