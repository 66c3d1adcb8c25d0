#!/usr/bin/env python3
"""The engine's layering (csrc/core/<subsystem>/): a subsystem includes only itself and
subsystems on lower levels, so the include graph between folders has no cycle and reads
bottom-up.  tests/test_c_limits.py keeps it in the default suite.

    python3 scripts/c_layers.py        the levels, the folder graph and what breaks it (exit 1)

A public header csrc/include/mml/<name>.h belongs to the folder of csrc/core/*/<name>.c
(HEADER_HOME names the few without such a file); a private header belongs to its folder."""

from __future__ import annotations

import glob
import os
import re
import sys
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE = os.path.join(ROOT, "csrc", "core")
#: bottom to top; folders on one level must not include each other
LEVELS = [
    ["base"],  # status and messages, buffers and the pool, JSON text
    ["fetch", "text", "image", "parquet"],  # HTTP(S)/S3 bytes; tokenizer, records, template;
    # decoders; Parquet files into JSON rows and blobs
    ["vision", "index"],  # resize, normalise, patchify; shard indexes and the index file
    ["video"],  # probe, sparse decode, frame sampling and resize
    ["batch"],  # collation into tensors, pinned/device memory
    ["loader"],  # options, sampler, mixtures, the global plan, threads, placement
]
HEADER_HOME = {
    "batch": "base",
    "parquet": "parquet",
}  # mml/batch.h: base/pool.c; mml/parquet.h: parquet/*.c
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def level_of() -> Dict[str, int]:
    return {f: i for i, fs in enumerate(LEVELS) for f in fs}


def homes() -> Dict[str, str]:
    """{public header name: folder} from where its .c file lives."""
    out = dict(HEADER_HOME)
    for c in glob.glob(os.path.join(CORE, "*", "*.c")):
        out.setdefault(os.path.basename(c)[:-2], os.path.basename(os.path.dirname(c)))
    return out


def edges() -> List[Tuple[str, str, str, str]]:
    """(from folder, to folder, file, include) for every include between two folders."""
    home = homes()
    out = []
    files = glob.glob(os.path.join(CORE, "*", "*.[ch]"))
    files += glob.glob(os.path.join(ROOT, "csrc", "include", "mml", "*.h"))
    for path in sorted(files):
        rel = os.path.relpath(path, ROOT)
        if rel.startswith(os.path.join("csrc", "include")):
            src = home.get(os.path.basename(path)[:-2], "?")
        else:
            src = os.path.basename(os.path.dirname(path))
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for inc in _INCLUDE.findall(text):
            if inc.startswith("mml/"):
                dst = home.get(os.path.basename(inc)[:-2], "?")
            else:
                target = os.path.normpath(os.path.join(os.path.dirname(path), inc))
                dst = os.path.basename(os.path.dirname(target))
            if dst != src:
                out.append((src, dst, rel, inc))
    return out


def violations() -> List[str]:
    """One line per include that runs sideways or up, or touches an unknown folder."""
    lv = level_of()
    bad = []
    for d in sorted(os.listdir(CORE)):
        if os.path.isdir(os.path.join(CORE, d)) and d not in lv:
            bad.append(f"csrc/core/{d}/: not on any level of scripts/c_layers.py LEVELS")
    for f in sorted(glob.glob(os.path.join(CORE, "*.[ch]"))):
        bad.append(f"{os.path.relpath(f, ROOT)}: outside the subsystem folders")
    for src, dst, rel, inc in edges():
        if src not in lv or dst not in lv:
            bad.append(f'{rel}: #include "{inc}" ({src} -> {dst}): unknown folder')
        elif lv[dst] >= lv[src]:
            bad.append(f'{rel}: #include "{inc}" ({src} -> {dst}): not a lower level')
    return bad


def main() -> int:
    lv = level_of()
    for i, fs in enumerate(LEVELS):
        print(f"[c_layers] level {i}: {' '.join(fs)}")
    pairs = sorted({(s, d) for s, d, _, _ in edges()}, key=lambda p: (-lv.get(p[0], 99), p))
    for s, d in pairs:
        print(f"  {s} -> {d}")
    bad = violations()
    for b in bad:
        print(f"[c_layers] BREAKS THE LAYERS: {b}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
