"""Command line: ``python -m mmloader demo [--samples N] [--out DIR]``, ``python -m mmloader
index DATA... [--preset P] [--tokenizer T] [--out DIR]`` and ``python -m mmloader profile``.

The demo writes a small synthetic multimodal dataset (once; reused when present), reads
it with mmloader.Loader and prints throughput and the consumer's wait-time ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional

from ._options import add_flags, flag_kwargs

# The Loader options the demo takes (flags and help from the option table).
DEMO_FLAGS = ("micro_batch_size", "num_threads", "max_pixels", "tokenizer", "seed")
#: The demo's own defaults (shown in its --help): the bundled test tokenizer, no model needed.
DEMO_DEFAULTS = {"tokenizer": "tiny"}


def _demo(args: argparse.Namespace) -> int:
    from . import Loader
    from .datagen import load_manifest, make_dataset

    out = os.path.abspath(args.out)
    try:
        ds = load_manifest(out)
        if ds["n_samples"] != args.samples:
            raise KeyError("size changed")
        print(f"using the dataset in {out} ({ds['n_samples']} samples)")
    except (OSError, KeyError, ValueError):
        try:
            import PIL  # noqa: F401  (the dataset generator writes its images with Pillow)
        except ImportError:
            print(
                "demo: writing the demo dataset needs Pillow: pip install 'mmloader[demo]' "
                "(or pip install pillow)",
                file=sys.stderr,
            )
            return 2
        t0 = time.perf_counter()
        ds = make_dataset(out, n_samples=args.samples, seed=0)
        print(
            f"wrote {ds['n_samples']} samples and {ds['n_images']} images to {out} "
            f"in {time.perf_counter() - t0:.1f}s"
        )
    loader = Loader(ds["shards"], **flag_kwargs(args, DEMO_FLAGS))
    with loader:
        t0 = time.perf_counter()
        batches = samples = images = 0
        for epoch in range(args.epochs):
            for batch in loader:
                batches += 1
                samples += batch["input_ids"].shape[0]
                if "image_grid_thw" in batch:
                    images += batch["image_grid_thw"].shape[0]
                if args.step_ms:
                    time.sleep(args.step_ms / 1000.0)  # a simulated trainer step
        dt = time.perf_counter() - t0
        st = loader.stats()
    print(
        f"{batches} batches, {samples} samples, {st['images']} images in {dt:.2f}s: "
        f"{samples / dt:.1f} samples/s, {st['images'] / dt:.1f} images/s "
        f"with {st['num_threads']} thread(s)"
    )
    busy = (
        f"busy seconds: read {st['read_s']:.2f}, vision {st['vision_s']:.2f}, "
        f"tokenize {st['tokenize_s']:.2f}, collate {st['collate_s']:.2f}; "
        f"skipped {st['skipped']}"
    )
    if args.step_ms:
        print(
            f"wait-time ratio {100 * st['wait_time_ratio']:.1f}% (time the trainer waited "
            f"/ wall time, a simulated {args.step_ms:g} ms trainer step per batch); {busy}"
        )
    else:  # with no step the consumer does nothing but wait: a ratio would say nothing
        print(f"{busy} (no trainer step: --step-ms MS simulates one)")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    # the docstring's first paragraph, whole (its first line alone stopped mid-sentence)
    about = " ".join((__doc__ or "").split("\n\n")[0].split())
    p = argparse.ArgumentParser(prog="python -m mmloader", description=about)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="generate a small dataset and time the loader on it")
    d.add_argument("--samples", type=int, default=512, help="records to generate (512)")
    d.add_argument("--out", default="demo-data", help="dataset folder (./demo-data)")
    d.add_argument("--epochs", type=int, default=1)
    d.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        help="simulated trainer step per batch, in ms (default 0: none)",
    )
    add_flags(
        d.add_argument_group("loader options (mmloader.Loader)"),
        DEMO_FLAGS,
        defaults=DEMO_DEFAULTS,
    )
    from .profile import add_arguments as profile_arguments

    profile_arguments(
        sub.add_parser(
            "profile", help="run the loader on DATA: per-stage breakdown, bottleneck, suggestions"
        )
    )
    from .dsindex import add_arguments as index_arguments

    index_arguments(
        sub.add_parser(
            "index",
            help="write the dataset index of DATA (offsets, token counts, image sizes): "
            "instant loader start, length filtering before any read",
        )
    )
    args = p.parse_args(argv)
    if args.cmd == "index":
        from .dsindex import main_args as index_main

        return index_main(args)
    if args.cmd == "demo":
        return _demo(args)
    if args.cmd == "profile":
        from .profile import main_args

        return main_args(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
