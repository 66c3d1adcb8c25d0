#!/usr/bin/env python3
"""Regenerates csrc/core/text/unicode_delta.h: where the Unicode data of the `tokenizers`
library differs from the system's utf8proc, so that our pre-tokenizer and NFC match
`tokenizers` exactly.

`tokenizers` takes \\p{L}, \\p{N} and \\s from its Oniguruma (Unicode 16 in 0.23) and NFC from
unicode-normalization-alignments (older Unicode tables: combining marks, decompositions and
compositions added since are unknown to it).  utf8proc ships its own Unicode release.  This
script asks both, code point by code point, and writes the differences:

  - class overrides for the split regex (ranges, absolute classes);
  - code points whose combining class `tokenizers` takes as 0;
  - code points `tokenizers` does not decompose;
  - canonical pairs `tokenizers` does not compose.

    python3 tools/gen_unicode_tables.py           # rewrites the header
    python3 tools/gen_unicode_tables.py --check   # exits 1 if the header is stale

It needs `tokenizers` and libutf8proc (found with ctypes).  About a minute.
"""
import argparse
import ctypes
import ctypes.util
import os
import sys

from tokenizers import Regex, normalizers, pre_tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "csrc", "core", "text", "unicode_delta.h")
QWEN_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
OTHER, L, N, S = 0, 1, 2, 3
NAMES = {OTHER: "MML_UC_OTHER", L: "MML_UC_L", N: "MML_UC_N", S: "MML_UC_S"}
WHITE_SPACE = set(list(range(0x09, 0x0E)) + [0x20, 0x85, 0xA0, 0x1680] +
                  list(range(0x2000, 0x200B)) + [0x2028, 0x2029, 0x202F, 0x205F, 0x3000])
UTF8PROC_COMPOSE, UTF8PROC_DECOMPOSE, UTF8PROC_STABLE = 1 << 3, 1 << 4, 1 << 1


class Utf8proc:
    def __init__(self):
        name = ctypes.util.find_library("utf8proc") or "libutf8proc.so.2"
        lib = ctypes.CDLL(name)
        lib.utf8proc_category.argtypes = [ctypes.c_int32]
        lib.utf8proc_get_property.argtypes = [ctypes.c_int32]
        lib.utf8proc_get_property.restype = ctypes.POINTER(ctypes.c_int16 * 4)
        lib.utf8proc_decompose_char.argtypes = [ctypes.c_int32, ctypes.POINTER(ctypes.c_int32),
                                                ctypes.c_ssize_t, ctypes.c_int,
                                                ctypes.POINTER(ctypes.c_int)]
        lib.utf8proc_decompose_char.restype = ctypes.c_ssize_t
        lib.utf8proc_normalize_utf32.argtypes = [ctypes.POINTER(ctypes.c_int32), ctypes.c_ssize_t,
                                                 ctypes.c_int]
        lib.utf8proc_normalize_utf32.restype = ctypes.c_ssize_t
        lib.utf8proc_unicode_version.restype = ctypes.c_char_p
        self.lib = lib
        self.version = lib.utf8proc_unicode_version().decode()

    def cls(self, c):
        if c in WHITE_SPACE:
            return S
        cat = self.lib.utf8proc_category(c)
        return L if 1 <= cat <= 5 else N if 9 <= cat <= 11 else OTHER

    def ccc(self, c):
        return self.lib.utf8proc_get_property(c).contents[1]

    def decompose(self, c):
        buf = (ctypes.c_int32 * 32)()
        last = ctypes.c_int(0)
        n = self.lib.utf8proc_decompose_char(c, buf, 32, UTF8PROC_DECOMPOSE, ctypes.byref(last))
        return list(buf[:n])

    def compose(self, cps):
        buf = (ctypes.c_int32 * (len(cps) + 1))(*cps)
        n = self.lib.utf8proc_normalize_utf32(buf, len(cps), UTF8PROC_COMPOSE | UTF8PROC_STABLE)
        return list(buf[:n])


def hf_class(split, c):
    """The regex class of c in `tokenizers`, read from how it splits two contexts."""
    ch = chr(c)
    a = [p for p, _ in split.pre_tokenize_str(f"a{ch}a")]
    if a == [f"a{ch}a"]:
        return L
    if a == ["a", ch, "a"]:
        return N
    b = [p for p, _ in split.pre_tokenize_str(f".{ch}.")]
    return OTHER if b == [f".{ch}."] else S


def ranges(items):
    """[(lo, hi, value)] from a sorted list of (code point, value)."""
    out = []
    for c, v in items:
        if out and out[-1][1] == c - 1 and out[-1][2] == v:
            out[-1][1] = c
        else:
            out.append([c, c, v])
    return out


def generate():
    u = Utf8proc()
    split = pre_tokenizers.Split(Regex(QWEN_REGEX), behavior="isolated")
    nfc, nfd = normalizers.NFC(), normalizers.NFD()
    cps = [c for c in range(0x110000) if not (0xD800 <= c <= 0xDFFF) and c not in (10, 13)]

    class_diff = []
    for c in cps:
        mine = u.cls(c)
        theirs = hf_class(split, c)
        if theirs != mine:
            class_diff.append((c, theirs))

    ccc_zero, no_decomp, no_compose = [], [], []
    for c in cps:
        k = u.ccc(c)
        if k and k < 240:
            mark = "\u0301" if k < 230 else "\u0345"
            if nfc.normalize_str(f"q{mark}{chr(c)}") == f"q{mark}{chr(c)}":
                ccc_zero.append(c)
        if 0xAC00 <= c <= 0xD7A3:
            continue
        d = u.decompose(c)
        if len(d) > 1 or (d and d[0] != c):
            if nfd.normalize_str(chr(c)) == chr(c):
                no_decomp.append(c)
            if u.compose(d) == [c]:  # primary composite: its last pair
                head = u.compose(d[:-1])
                if len(head) == 1:
                    pair = chr(head[0]) + chr(d[-1])
                    if nfc.normalize_str(pair) != chr(c):
                        no_compose.append((head[0], d[-1], c))
    return u.version, ranges(class_diff), ranges([(c, 0) for c in ccc_zero]), \
        ranges([(c, 0) for c in no_decomp]), no_compose


def render(version, class_ranges, ccc_ranges, decomp_ranges, no_compose):
    import tokenizers
    lines = [
        "/*",
        " * unicode_delta.h — generated by tools/gen_unicode_tables.py; do not edit.",
        f" * Differences between utf8proc (Unicode {version}) and `tokenizers` {tokenizers.__version__}",
        " * (Oniguruma classes for the split regex; NFC tables of unicode-normalization-alignments).",
        " * Included only by pretok.c.",
        " */",
        "/* {first, last, class}: the split-regex class `tokenizers` gives these code points. */",
        "static const struct { int32_t lo, hi; uint8_t cls; } k_class_overrides[] = {",
    ]
    lines += [f"    {{0x{lo:04X}, 0x{hi:04X}, {NAMES[v]}}}," for lo, hi, v in class_ranges]
    lines += ["    {-1, -1, 0}};", "",
              "/* Combining marks `tokenizers` does not know: canonical combining class 0. */",
              "static const struct { int32_t lo, hi; } k_ccc_zero[] = {"]
    lines += [f"    {{0x{lo:04X}, 0x{hi:04X}}}," for lo, hi, _ in ccc_ranges]
    lines += ["    {-1, -1}};", "",
              "/* Characters `tokenizers` does not decompose. */",
              "static const struct { int32_t lo, hi; } k_no_decomp[] = {"]
    lines += [f"    {{0x{lo:04X}, 0x{hi:04X}}}," for lo, hi, _ in decomp_ranges]
    lines += ["    {-1, -1}};", "",
              "/* Canonical pairs {first, second, composite} `tokenizers` does not compose. */",
              "static const struct { int32_t a, b, c; } k_no_compose[] = {"]
    lines += [f"    {{0x{a:04X}, 0x{b:04X}, 0x{c:04X}}}," for a, b, c in no_compose]
    lines += ["    {-1, -1, -1}};", ""]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args(argv)
    text = render(*generate())
    if args.check:
        with open(args.out, encoding="utf-8") as f:
            same = f.read() == text
        print("up to date" if same else f"{args.out} is stale")
        return 0 if same else 1
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
