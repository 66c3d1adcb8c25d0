"""The reusable dataset index: ``python -m mmloader index DATA...`` and :func:`build`.

One sidecar file per shard (``<shard>.mmlidx`` next to it, or in ``out``: see
:func:`sidecar_path`) holds the
shard's record offsets and, per sample, its status, text token count and each image's
header size and exact vision-token count (format: docs/index-format.md).  A
:class:`mmloader.Loader` that finds it does not scan the shard at start and skips samples
that are too long from the counts, before reading them.

The build runs in C threads with the GIL released, through the loader's own parser,
template, tokenizer and fetcher; it reads only image headers (the first 16 KiB; a ranged
GET for remote images; a multi-scan JPEG whole, to count its scans for max_jpeg_scans),
never decodes, and is resumable: an interrupted shard goes on from its partial file,
finished shards are kept.  A sample's status is the one the global plan's planning pass
gives it (no trainable turn and the limits included), so a plan from the index is that
plan.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional

from . import _core
from ._core import ConfigError
from ._options import add_flags, flag_kwargs

#: the index file format this mmloader writes and reads
FORMAT_VERSION = 1


def sidecar_path(shard: str, out: Optional[str] = None) -> str:
    """Where the index of `shard` goes: ``<shard>.mmlidx`` next to it, or in folder (or
    URL prefix) `out` as ``<shard's file name>.<16 hex digits>.mmlidx``, keyed by a hash
    of the shard path so that shards of one file name in other folders do not collide
    (the core's one naming rule, docs/index-format.md)."""
    return _core.index_path(os.fspath(shard), None if out is None else os.fspath(out))


def read(path: str) -> Dict[str, Any]:
    """A dataset index file as a dict (header fields, and per sample ``text_tokens``,
    ``status`` (0: planned) and ``images`` as (width, height, tokens) tuples), checked as
    the loader checks it."""
    return _core.read_index(os.fspath(path))


def _merge(total: Dict[str, Any], s: Dict[str, Any]) -> None:
    for k in (
        "samples",
        "good",
        "resumed",
        "images",
        "text_tokens",
        "image_tokens",
        "videos",
        "video_tokens",
        "bytes_read",
        "seconds",
    ):
        total[k] = total.get(k, 0) + s[k]
    for k in ("image_token_hist", "bad"):
        d = total.setdefault(k, {})
        for b, n in s[k].items():
            d[b] = d.get(b, 0) + n
    ex = total.setdefault("examples", {})
    for r, m in s["examples"].items():
        ex.setdefault(r, m)
    total["shards"] = total.get("shards", 0) + 1
    total["up_to_date"] = total.get("up_to_date", 0) + int(s["up_to_date"])


def build(
    data: Any,
    *,
    out: Optional[str] = None,
    threads: Optional[int] = None,
    progress: Optional[Callable[[int, int, int, int], None]] = None,
    **loader_kw: Any,
) -> Dict[str, Any]:
    """Builds (or brings up to date) the index of every shard of `data`.

    Args:
        data: what :class:`mmloader.Loader` takes (paths, globs, folders, URLs, a mixture).
        out: folder for the index files (default: next to each shard; required for
            remote shards).
        threads: worker threads (default: the CPUs this process may use; 16 when some data
            is remote, where requests in flight, not CPUs, set the pace).
        progress: called as progress(shard_number, shards, done, total) while building.
        loader_kw: the Loader settings the counts are for (preset, tokenizer, min_pixels,
            max_pixels, image_root, system_prompt, image_route, ...): a Loader uses an
            index's counts only under the same settings.

    Returns the summary over all shards: samples, good, images, text_tokens,
    image_tokens, videos, video_tokens (frame lists and probed video files),
    image_token_hist ({bucket lower bound: images}), bad ({reason: count}),
    examples ({reason: first message}), bytes_read, seconds, shards, up_to_date, and
    per-shard summaries under "per_shard".
    """
    from .loader import Loader, default_num_threads

    for k in ("index", "micro_batch_size", "plan_only", "packing"):
        if k in loader_kw:
            raise ConfigError(f"build(): {k} is not an index setting")
    if out is not None:
        out = os.fspath(out)
        os.makedirs(out, exist_ok=True)
    loader = Loader(
        data, index=False, micro_batch_size=1, shuffle=False, num_threads=1, **loader_kw
    )
    try:
        shards: List[str] = _core.loader_shards(loader._core())
        remote = [s for s in shards if s.startswith(("http://", "https://", "s3://"))]
        if remote and out is None:
            raise ConfigError(
                f"data shard {remote[0]} is remote: give out= (--out), a local "
                "folder for its index files (copy them next to the shards, or "
                "pass Loader(index=...) that folder or URL prefix)"
            )
        if threads is None:
            threads = 16 if remote else default_num_threads()
        total: Dict[str, Any] = {"per_shard": {}}
        for i, shard in enumerate(shards):
            dest = sidecar_path(shard, out)
            cb = None
            if progress is not None:

                def cb(done: int, n: int, i: int = i) -> None:
                    progress(i, len(shards), done, n)

            s = _core.build_index(loader._core(), i, dest, threads, cb)
            if progress is not None:
                progress(i, len(shards), s["samples"], s["samples"])
            s["index"] = dest
            total["per_shard"][shard] = s
            _merge(total, s)
        return total
    finally:
        loader.close()


# ---- command line -------------------------------------------------------------------


# The Loader settings the index command takes (flags and help from the option table);
# num_threads is the builder's threads.
LOADER_FLAGS = (
    "preset",
    "model_dir",
    "tokenizer",
    "min_pixels",
    "max_pixels",
    "image_root",
    "columns",
    "image_route",
    "system_prompt",
    "data_format",
    "s3_endpoint",
    "num_threads",
)


def add_arguments(p: Any) -> None:
    p.add_argument("data", nargs="+", help="shards, globs, folders, URLs, or a mixture file")
    p.add_argument(
        "--out", default=None, help="folder for the index files (default: next to each shard)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_flags(p.add_argument_group("loader settings the counts are for"), LOADER_FLAGS)


def _bar(shard: int, shards: int, done: int, total: int, t0: float) -> None:
    w = 30
    f = done / total if total else 1.0
    rate = done / max(1e-9, time.perf_counter() - t0)
    sys.stderr.write(
        f"\r[index] shard {shard + 1}/{shards} [{'#' * int(f * w):<{w}}] "
        f"{done}/{total} samples, {rate:,.0f}/s "
    )
    sys.stderr.flush()


def print_summary(s: Dict[str, Any], file: Any = sys.stdout) -> None:
    n = s["samples"]
    built = n - s["resumed"]
    per = s["bytes_read"] / built if built else 0.0
    print(
        f"{s['shards']} shard(s), {n} samples ({s['good']} planned), {s['images']} images; "
        f"{s['up_to_date']} shard(s) already up to date, {s['resumed']} samples taken "
        "from earlier runs",
        file=file,
    )
    tok = s["text_tokens"] + s["image_tokens"] + s["video_tokens"]
    print(
        f"tokens: {tok:,} ({s['text_tokens']:,} text + {s['image_tokens']:,} image + "
        f"{s['video_tokens']:,} video in {s['videos']:,} videos)"
        + (f", {tok / s['good']:.1f} per sample" if s["good"] else ""),
        file=file,
    )
    if built:
        print(
            f"indexed {built} samples in {s['seconds']:.2f} s: {built / max(s['seconds'], 1e-9):,.0f} "
            f"samples/s, {per:,.0f} bytes read per sample",
            file=file,
        )
    if s["image_token_hist"]:
        print("image tokens per image:", file=file)
        for b in sorted(s["image_token_hist"]):
            print(f"  {b:>7}-{2 * b - 1:<7} {s['image_token_hist'][b]:>10}", file=file)
    if s["bad"]:
        print("bad samples by reason:", file=file)
        for r, c in sorted(s["bad"].items(), key=lambda kv: -kv[1]):
            print(f"  {r}: {c}  (first: {s['examples'].get(r, '')})", file=file)


def main_args(a: Any) -> int:
    kw = flag_kwargs(a, LOADER_FLAGS)
    threads = kw.pop("num_threads", None)
    data = a.data if len(a.data) > 1 else a.data[0]
    t0 = time.perf_counter()
    tty = sys.stderr.isatty()

    printed = set()

    def show(i: int, k: int, d: int, n: int) -> None:
        if tty:
            _bar(i, k, d, n, t0)
        elif d == n and i not in printed:  # not a terminal: one line per finished shard
            printed.add(i)
            print(f"[index] shard {i + 1}/{k}: {n} samples", file=sys.stderr)

    bar: Optional[Callable[[int, int, int, int], None]] = None if a.quiet else show
    try:
        s = build(data, out=a.out, threads=threads, progress=bar, **kw)
    except KeyboardInterrupt:
        print("\ninterrupted: run the same command again to resume", file=sys.stderr)
        return 130
    except _core.Error as e:
        print(f"\nindex: {e}", file=sys.stderr)
        return 1
    if bar and tty:
        sys.stderr.write("\n")
    print_summary(s)
    return 0
