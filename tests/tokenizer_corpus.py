"""Deterministic test corpus for the tokenizer parity tests: scripts, emoji and ZWJ
sequences, combining marks and non-NFC input, CR/LF and whitespace runs, digits, mixed-case
contractions, special-token strings, control characters, random code points and long
single words.  make_corpus(n, seed) always returns the same strings."""

import random

SPECIAL_STRINGS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<|im_start",
    "<|im_end |>",
    "<think",
    "< think>",
    "<|IM_START|>",
    "<|im_start|><|im_end|>",
    "<<|im_end|>>",
    "<|vision_start|><|image_pad|><|vision_end|>",
]
WORDS = [
    "hello",
    "World",
    "the",
    "DATA",
    "loader",
    "Qwen",
    "tokenizer",
    "naïve",
    "café",
    "Straße",
    "ÆSIR",
    "don't",
    "DON'T",
    "it'S",
    "we'Re",
    "They'LL",
    "I'M",
    "you'VE",
    "she'D",
    "'s",
    "'t",
    "'re",
    "'ve",
    "'m",
    "'ll",
    "'d",
    "'S",
    "'LL",
    "'Ve",
    "x'ſa",
    "'ſ",
    "O'Neil",
    "rock'n'roll",
    "''",
    "'''s",
    "’s",
    "I’m",
    "'",
    "'1",
    "' s",
    "'\u017ft",
    "don'T",
    "'RE",
    "'lL",
    "'Ll",
    "i'd'",
    "e.g.",
    "U.S.A.",
    "snake_case",
    "camelCase",
    "kebab-case",
    "x86_64",
    "utf-8",
    "ﬁne",
    "ﬂow",
    "Kelvin\u212a",
    "Å\u212b",
]
WS = [
    " ",
    " ",
    " ",
    " ",
    "  ",
    "   ",
    "\t",
    "\t\t",
    "\n",
    "\r\n",
    "\r",
    "\n\n",
    " \n ",
    "\n ",
    " \n",
    "\r\r\n",
    "\u00a0",
    "\u3000",
    "\u2028",
    "\u0085",
    "\x0b",
    "\x0c",
    "\u1680",
    "\u200b",
    "\x1c",
    "\x1f",
    " \t \n\t",
    "\u2003\u2009",
    "\u202f",
    "\u205f",
    "",
]
PUNCT = [
    "...",
    "!!!",
    "?!",
    "---",
    "```",
    "<<>>",
    "$$",
    "@#%^&*()",
    "\\n",
    "://",
    "\"'",
    "“quoted”",
    "«»",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ".",
    ";",
    ":",
    "!",
    "?",
    "-",
    "—",
    "…",
    "•",
    "©",
    "™",
    "€",
    "¥",
    "½",
    "²",
    "\\",
    "/",
    "|",
    "~",
    "`",
    "_",
    "__init__",
    "+=",
    "->",
    "=>",
    "!=",
    "&&",
    "||",
    "#",
    "%",
    "。",
    "，",
    "！",
    "？",
    "「",
    "」",
    "、",
]
EMOJI = [
    "😀",
    "👍🏽",
    "👨\u200d👩\u200d👧\u200d👦",
    "🇯🇵",
    "1️⃣",
    "❤️",
    "🤷🏽\u200d♀️",
    "🏳️\u200d🌈",
    "👩🏿\u200d💻",
    "🫠",
    "🧑\u200d🤝\u200d🧑",
    "☺",
    "✔️",
    "🔥🔥🔥",
    "🙂\u200d↔️",
]
NFC_CASES = [
    "e\u0301",
    "a\u0308\u0301",
    "a\u0301\u0323",
    "a\u0323\u0301",
    "\u212b",
    "\u2126",
    "\u212a",
    "\u0344",
    "\u0958",
    "\u0915\u093c",
    "\u2adc",
    "\u1e9b\u0323",
    "\u1100\u1161\u11a8",
    "\u1100\u1161",
    "\uac00\u11a8",
    "\u0041\u030a",
    "\u00c5",
    "o\u0302\u0300",
    "\u1ec7",
    "e\u0323\u0302",
    "\u0387",
    "\u037e",
    "\u1f71",
    "\u0c48",
    "\u0c46\u0c56",
    "\u09cb",
    "\u09c7\u09be",
    "\u0b4b",
    "\u0dda",
    "\u1b06",
    "\u0301",
    "\u0301\u0301x",
    "Ä\u0301",
    "\u05d0\u05b7",
    "\ufb2e",
    "\u2000",
    "\u3099",
    "\u304b\u3099",
    "\u304c",
    "\uff76\uff9e",
    "\u0627\u0653",
    "\u0622",
    "\U0001d15e",
    "\U0001109a",
    "\U00011099\U000110ba",
    "\u0f73",
    "\u0f71\u0f72",
]
DIGITS = [
    "0",
    "7",
    "42",
    "2024",
    "3.14159",
    "1,000,000",
    "٣٤٥",
    "०१२",
    "１２３",
    "²³",
    "½",
    "Ⅻ",
    "𝟘𝟙",
    "१०",
    "〇",
    "五",
    "0x1F",
    "1e-9",
    "-12",
    "v1.2.3",
    "٠",
    "߀",
]


def rand_chars(rnd, lo, hi, n):
    return "".join(chr(rnd.randint(lo, hi)) for _ in range(n))


def rand_cp(rnd):
    while True:
        c = rnd.randint(0x20, 0x10FFFF) if rnd.random() < 0.3 else rnd.randint(0x20, 0xFFFF)
        if not 0xD800 <= c <= 0xDFFF:
            return chr(c)


def fragment(rnd):
    k = rnd.random()
    if k < 0.22:
        return rnd.choice(WORDS)
    if k < 0.30:
        return rand_chars(rnd, 0x4E00, 0x9FFF, rnd.randint(1, 12))
    if k < 0.33:
        return rand_chars(rnd, 0x3041, 0x30FF, rnd.randint(1, 8))
    if k < 0.37:  # Arabic letters, harakat, digits
        return "".join(
            rnd.choice(
                [
                    chr(rnd.randint(0x621, 0x64A)),
                    chr(rnd.randint(0x64B, 0x652)),
                    chr(rnd.randint(0x660, 0x669)),
                ]
            )
            for _ in range(rnd.randint(2, 10))
        )
    if k < 0.41:  # Devanagari with matras, virama, nukta
        return "".join(
            rnd.choice(
                [
                    chr(rnd.randint(0x905, 0x939)),
                    chr(rnd.randint(0x93E, 0x94D)),
                    "\u093c",
                    chr(rnd.randint(0x966, 0x96F)),
                ]
            )
            for _ in range(rnd.randint(2, 10))
        )
    if k < 0.44:  # Hangul syllables and conjoining jamo
        return "".join(
            rnd.choice(
                [
                    chr(rnd.randint(0xAC00, 0xD7A3)),
                    chr(rnd.randint(0x1100, 0x1112)),
                    chr(rnd.randint(0x1161, 0x1175)),
                    chr(rnd.randint(0x11A8, 0x11C2)),
                ]
            )
            for _ in range(rnd.randint(1, 8))
        )
    if k < 0.50:
        return rnd.choice(EMOJI)
    if k < 0.56:  # letters followed by combining marks in random order
        base = rnd.choice("aeiouAEIOUnNcCzZ") + "".join(
            chr(rnd.randint(0x300, 0x36F)) for _ in range(rnd.randint(1, 4))
        )
        return base
    if k < 0.62:
        return rnd.choice(NFC_CASES)
    if k < 0.70:
        return (
            rnd.choice(DIGITS)
            if rnd.random() < 0.6
            else str(rnd.randint(0, 10 ** rnd.randint(1, 15)))
        )
    if k < 0.78:
        return rnd.choice(PUNCT)
    if k < 0.84:
        return rnd.choice(SPECIAL_STRINGS)
    if k < 0.90:
        return "".join(rand_cp(rnd) for _ in range(rnd.randint(1, 6)))
    if k < 0.93:
        return "".join(
            chr(rnd.choice([rnd.randint(0, 0x1F), 0x7F, rnd.randint(0x80, 0x9F)]))
            for _ in range(rnd.randint(1, 4))
        )
    return "".join(
        rnd.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
        for _ in range(rnd.randint(1, 20))
    )


def long_word(rnd):
    n = rnd.randint(300, 4000)
    k = rnd.randrange(8)
    if k == 0:
        return "a" * n
    if k == 1:
        return "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))
    if k == 2:
        return "".join(rnd.choice("0123456789") for _ in range(n))
    if k == 3:
        return "".join(rnd.choice("!@#$%^&*()-=+[]{};:,.<>/?") for _ in range(n))
    if k == 4:
        return rand_chars(rnd, 0x4E00, 0x9FFF, n // 3)
    if k == 5:
        return "".join(
            rnd.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
            for _ in range(n)
        )
    if k == 6:
        return " " * n if rnd.random() < 0.5 else "\n" * (n // 10) + "x"
    return "ab" * (n // 2)


def make_corpus(n=10000, seed=5):
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        if rnd.random() < 0.02:
            out.append(long_word(rnd))
            continue
        parts = []
        for _ in range(rnd.randint(1, 10)):
            parts.append(fragment(rnd))
            parts.append(rnd.choice(WS) if rnd.random() < 0.8 else "")
        if rnd.random() < 0.1:
            parts.insert(0, rnd.choice(WS))
        out.append("".join(parts))
    return out
