"""The 36 ImageProcessor digests that a change to the exact (or fast_decode) path must keep
(issue 34): sha256 of pixel_values and image_grid_thw for the 14 photos of
bench_recipe_caps.py (3-12 MP re-encodes of tests/photos.py), one call of all 14 per
combination of

    pixel_format  uint8 / float32 / bfloat16
    preset        qwen2.5-vl / qwen3-vl
    cap           the model's limits / 768x768 / 200,704 pixels
    decode        exact / fast_decode=True

    python3 benchmarks/exact_digests.py > /tmp/digests-new.txt
    MML_DISABLE_AVX512=1 python3 benchmarks/exact_digests.py > /tmp/digests-avx2.txt
    MML_DISABLE_AVX2=1 python3 benchmarks/exact_digests.py > /tmp/digests-portable.txt
    diff /tmp/digests-base.txt /tmp/digests-new.txt   # (made the same way on the base)

The mmloader imported is the one of the working directory's tree (run from a checkout's
root: `cd BASE && python3 /path/to/exact_digests.py` gives that build's digests).  One line per combination,
then one line with the digest of all 36 lines; the bytes hashed are non-empty (checked).
"""

from __future__ import annotations

import hashlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.getcwd())

import numpy as np  # noqa: E402

import mmloader  # noqa: E402  (the working directory's, before bench_recipe_caps's path)

sys.path.insert(1, HERE)
from bench_recipe_caps import make_photos  # noqa: E402

CAPS = {"model": None, "768x768": 768 * 768, "200704": 200704}


def digests(files: list) -> list:
    lines = []
    for fmt in ("uint8", "float32", "bfloat16"):
        for preset in ("qwen2.5-vl", "qwen3-vl"):
            for cap_name, cap in CAPS.items():
                for fast in (False, True):
                    kw = {"pixel_format": fmt, "fast_decode": fast}
                    if cap is not None:
                        kw["max_pixels"] = cap
                    out = mmloader.ImageProcessor(preset, **kw)(files)
                    h = hashlib.sha256()
                    for name in ("pixel_values", "image_grid_thw"):
                        a = np.asarray(out[name])
                        if a.size == 0:
                            raise SystemExit(f"empty {name} for {fmt} {preset} {cap_name}")
                        h.update(name.encode() + str(a.shape).encode() + str(a.dtype).encode())
                        h.update(np.ascontiguousarray(a).view(np.uint8).tobytes())
                    mode = "fast_decode" if fast else "exact"
                    lines.append(f"{fmt:8s} {preset:10s} {cap_name:8s} {mode:11s} {h.hexdigest()}")
    return lines


def main() -> None:
    lines = digests(make_photos())
    for line in lines:
        print(line)
    all36 = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    print(f"all {len(lines)}: {all36}")


if __name__ == "__main__":
    main()
