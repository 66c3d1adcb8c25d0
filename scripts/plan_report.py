#!/usr/bin/env python3
"""How evenly the global plan spreads work over DP ranks, measured on delivered batches.

A skewed mixture (many short text-only samples, fewer samples with 1-2 images of very
different sizes) is loaded by `--ranks` Loaders (one per DP rank, run one after the other)
for one epoch under each composition below, with balance off and on.  For every global
step the ranks' costs are read back from their batches (vision tokens from
image_grid_thw, tokens from the attention mask / cu_seqlens), and the report gives

  max/mean  sum over steps of the most loaded rank's cost / sum of the mean rank's cost
            (a synchronous step waits for its slowest rank: 1.00 is no waiting); the
            epoch's last step (what is left over) is excluded, "all" includes it
  worst     the worst single step's max/mean
  fill      real tokens / (steps * ranks * budget): how full the batches are

    python3 scripts/plan_report.py [--ranks 4] [--samples 600] [--out report.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any, Dict, List

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import mmloader  # noqa: E402
from mmloader.datagen import make_dataset  # noqa: E402

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")

COMPOSITIONS = [
    ("fixed rows, micro_batch_size=16", dict(micro_batch_size=16, global_plan=True), None),
    ("token budget 8192 (padded)", dict(max_tokens_per_batch=8192), 8192),
    (
        "token budget 8192 + group_by_length=512",
        dict(max_tokens_per_batch=8192, group_by_length=512),
        8192,
    ),
    ("packing, pack_length=8192", dict(packing=True, pack_length=8192, global_plan=True), 8192),
]


def costs(b: Dict[str, Any]) -> tuple:
    g = b.get("image_grid_thw")
    vis = 0 if g is None else int((g[:, 0] * g[:, 1] * g[:, 2]).sum()) // 4
    tok = int(b["cu_seqlens"][-1]) if "cu_seqlens" in b else int(b["attention_mask"].sum())
    return vis, tok


def ratio(steps: List[List[int]]) -> tuple:
    mx = sum(max(s) for s in steps)
    mean = sum(sum(s) / len(s) for s in steps)
    worst = max((max(s) / (sum(s) / len(s)) for s in steps if sum(s)), default=1.0)
    return (mx / mean if mean else 1.0), worst


def run(data, ranks: int, kw: Dict[str, Any]) -> Dict[str, Any]:
    per_rank = []
    for r in range(ranks):
        with mmloader.Loader(
            data,
            tokenizer=TINY,
            dp_rank=r,
            dp_size=ranks,
            seed=1,
            num_threads=2,
            min_pixels=28 * 28 * 4,
            max_pixels=28 * 28 * 1024,
            **kw,
        ) as L:
            per_rank.append([costs({k: np.asarray(v.numpy()) for k, v in b.items()}) for b in L])
    steps = list(zip(*per_rank))
    vis = [[c[0] for c in s] for s in steps]
    tok = [[c[1] for c in s] for s in steps]
    return dict(
        steps=len(steps),
        vis=ratio(vis[:-1]),
        vis_all=ratio(vis)[0],
        tok=ratio(tok[:-1]),
        tokens=sum(map(sum, tok)),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument(
        "--samples", type=int, default=600, help="text-only samples (and half as many with images)"
    )
    ap.add_argument("--out", help="also write the table to this file")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="mml-plan-report-")
    text = make_dataset(
        os.path.join(root, "text"),
        n_samples=a.samples,
        seed=1,
        n_shards=1,
        text_only_fraction=1.0,
        two_image_fraction=0.0,
    )
    img = make_dataset(
        os.path.join(root, "img"),
        n_samples=a.samples // 2,
        seed=2,
        n_shards=1,
        n_images=24,
        min_size=56,
        max_size=900,
        text_only_fraction=0.0,
        two_image_fraction=0.3,
    )
    data = [
        mmloader.Source(text["shards"], name="text"),
        mmloader.Source(img["shards"], name="images"),
    ]
    lines = [
        f"Skewed mixture: {a.samples} text-only samples + {a.samples // 2} samples with "
        f"1-2 images (56-900 px, up to 1024 vision tokens each); {a.ranks} DP ranks; "
        "costs read from the delivered batches.",
        "",
        "| composition | balance | steps | vision max/mean | (all steps) | worst step "
        "| tokens max/mean | fill |",
        "|---|---|---|---|---|---|---|---|",
    ]
    t0 = time.time()
    for name, kw, budget in COMPOSITIONS:
        for bal in (None, "tokens", "vision_tokens"):
            r = run(data, a.ranks, dict(kw, balance=bal))
            fill = f"{r['tokens'] / (r['steps'] * a.ranks * budget):.2f}" if budget else "-"
            lines.append(
                f"| {name} | {bal or 'none'} | {r['steps']} | {r['vis'][0]:.3f} | "
                f"{r['vis_all']:.3f} | {r['vis'][1]:.2f} | {r['tok'][0]:.3f} | "
                f"{fill} |"
            )
            print(lines[-1], flush=True)
    lines += ["", f"({time.time() - t0:.0f} s)"]
    text_out = "\n".join(lines)
    print("\n" + text_out)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text_out + "\n")


if __name__ == "__main__":
    main()
