"""Turns the end-to-end suite's JSON (benchmarks/results/e2e.json) into the results table
(benchmarks/results.md, and docs/benchmarks.md between its results markers) and the
plots under benchmarks/results/.

    python3 benchmarks/report.py [benchmarks/results/e2e.json]
    python3 benchmarks/report.py --readme [FILE]    # also fills docs/benchmarks.md's results block

bench_e2e.py calls generate() (and fill_readme()) at the end of every run; no figure here is
typed by hand.  Every figure is the median over the repeats of a measurement, with the
min-max beside it.  The profile section comes from benchmarks/results/profile.json when
scripts/profile-e2e.sh wrote one.  Plots need matplotlib; without it only the Markdown.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ORDER = [
    "naive",
    "dataloader",
    "improved",
    "spdl",
    "ray",
    "energon",
    "dali",
    "mmloader",
    "mmloader-uint8",
    "mmloader-fast",
]
LABEL = {
    "naive": "naive serial (PIL + transformers)",
    "dataloader": "PyTorch DataLoader (workers = cores) + PIL + HF processor",
    "improved": "case-study pipeline (asyncio + processes + prefetch)",
    "spdl": "SPDL (threads)",
    "ray": "Ray Data",
    "energon": "Megatron-Energon (prepared WebDataset, TaskEncoder, workers = cores)",
    "dali": "NVIDIA DALI CPU (decode + resize + normalise) + HF layout + tokenizer",
    "mmloader": "**mmloader**",
    "mmloader-uint8": "**mmloader**, pixel_format=uint8",
    "mmloader-fast": "**mmloader**, fast_decode=True",
}
FAULTS_MAX = 100  # "about zero" page faults per batch (a fresh float32 batch: ~50k)
Result = Dict[str, Any]


def _runs(
    data: Dict[str, Any], group: str, source: Optional[str] = None, pipeline: Optional[str] = None
) -> List[Dict[str, Any]]:
    return [
        r
        for r in data["runs"]
        if r["group"] == group
        and (source is None or r["source"] == source)
        and (pipeline is None or r["pipeline"] == pipeline)
    ]


RATE = "rate"  # samples/s in steady state (after the warm-up), else after the first batch


def _value(res: Result, key: str) -> Optional[float]:
    """A run's figure; RATE: its steady-state samples/s (no batch the pipeline made before
    the first one or during the warm-up flatters it), samples_per_s for a run too short
    for a steady state."""
    if key == RATE:
        return res.get("steady_samples_per_s") or res.get("samples_per_s")
    return res.get(key)


def _med(xs: List[float]) -> Optional[float]:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def stat(
    data: Dict[str, Any], group: str, source: str, pipeline: str, key: str
) -> Optional[Tuple[float, float, float, int]]:
    """(median, min, max, n) of `key` over the successful runs, or None."""
    vals = [
        _value(r["result"], key)
        for r in _runs(data, group, source, pipeline)
        if _value(r["result"], key) is not None
        and "error" not in r["result"]
        and "skipped" not in r["result"]
    ]
    if not vals:
        return None
    return _med(vals), min(vals), max(vals), len(vals)


def own_mb(data: Dict[str, Any], source: str, pipeline: str) -> Optional[float]:
    """Median over runs of the pipeline's own memory (peak memory of the tree, PSS plus
    fd-held shared memory, minus the same process before the pipeline was built)."""
    s = stat(data, "throughput", source, pipeline, "own_mem_mb")
    return s[0] if s else None


def decode_cpu(data: Dict[str, Any], threaded: bool = True) -> Optional[float]:
    """The decode-only floor (median CPU per sample): by default mmloader's decoders on the
    pipeline's thread count at once (what the CPU-per-sample targets divide by: the
    pipeline decodes on that many threads at once, and decodes sharing the cores cost
    more CPU each than one alone); threaded=False: on one thread.  A run from before the
    threaded floor was measured has only the one-thread figure."""
    s = None
    if threaded:
        s = stat(data, "decode", "local", "decode-only", "threaded_cpu_s_per_sample")
    s = s or stat(data, "decode", "local", "decode-only", "cpu_s_per_sample")
    return s[0] if s else None


def decode_threads(data: Dict[str, Any]) -> int:
    """The thread count of the threaded decode-only floor (1 when it was not measured)."""
    for r in _runs(data, "decode", "local", "decode-only"):
        if r["result"].get("threaded_cpu_s_per_sample") is not None:
            return int(r["result"].get("threads") or 1)
    return 1


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def _rate(data, source, pipeline) -> Optional[float]:
    s = stat(data, "throughput", source, pipeline, RATE)
    return s[0] if s else None


def _cpu(data, source, pipeline) -> Optional[float]:
    s = stat(data, "throughput", source, pipeline, "steady_cpu_s_per_sample")
    return s[0] if s else None


def rule_counts(data: Dict[str, Any]) -> Tuple[int, int]:
    """(runs that delivered >= min_samples samples AND ran >= min_seconds, runs measured)
    over the throughput, wait-time and max_memory runs: issue 15's rule for a run."""
    meta = data["meta"]
    done = [
        r["result"]
        for r in data["runs"]
        if r["group"] in ("throughput", "wait", "cap") and "samples_per_s" in r["result"]
    ]
    ok = [
        r
        for r in done
        if r["samples"] >= meta["min_samples"] and r["wall_s"] >= meta["min_seconds"]
    ]
    return len(ok), len(done)


def _repeats_done(data: Dict[str, Any]) -> Tuple[int, int]:
    """(fewest, most) successful repeats of a throughput (pipeline, source) in the run."""
    n: Dict[Tuple[str, str], int] = {}
    for r in _runs(data, "throughput"):
        if "samples_per_s" in r["result"]:
            key = (r["pipeline"], r["source"])
            n[key] = n.get(key, 0) + 1
    return (min(n.values()), max(n.values())) if n else (0, 0)


def targets(data: Dict[str, Any]) -> List[Tuple[str, Any, str, Optional[bool], str]]:
    """(target, measured, wanted, met, how shown) — measured None where a run is missing."""
    meta = data["meta"]
    ok, done = rule_counts(data)
    few, _ = _repeats_done(data)
    out: List[Tuple[str, Any, str, Optional[bool], str]] = [
        (
            f"every run >= {meta['min_samples']} samples and >= {meta['min_seconds']:g} s; "
            f"median of >= 3 runs (fewest repeats of a pipeline: {few})",
            f"{ok} of {done} runs" if done else None,
            "all, >= 3 repeats",
            None if not done else (ok == done and few >= 3),
            "s",
        )
    ]
    if meta.get("max_pixels"):  # a recipe-cap run: issue 34's end-to-end targets
        ex, fa = _rate(data, "local", "mmloader"), _rate(data, "local", "mmloader-fast")
        for what, v, want in (
            ("exact path", _ratio(fa, ex), 3.0),
            ("DataLoader", _ratio(fa, _rate(data, "local", "dataloader")), 8.0),
        ):
            out.append(
                (
                    f"fast_decode=True samples/s vs the {what}, max_pixels={meta['max_pixels']}",
                    v,
                    f">= {want:g}x",
                    None if v is None else v >= want,
                    "x",
                )
            )
    lat = f"{1000 * data['meta']['latency_s']:.0f} ms server"
    for peer, source, want, where in (
        ("dataloader", "local", 6.0, "local disk"),
        ("dataloader", "remote", 10.0, lat),
        ("spdl", "local", 3.0, "local disk"),
        ("energon", "local", 4.0, "local disk"),
    ):
        v = _ratio(_rate(data, source, "mmloader"), _rate(data, source, peer))
        out.append(
            (
                f"samples/s vs {LABEL[peer].split(' (')[0].split(' +')[0]}, {where}",
                v,
                f">= {want:g}x",
                None if v is None else v >= want,
                "x",
            )
        )
    v = _ratio(_rate(data, "local", "mmloader"), _rate(data, "local", "dali"))
    out.append(("samples/s vs NVIDIA DALI CPU, local disk", v, "(no target set)", None, "x"))
    dec, dec1, nt = decode_cpu(data), decode_cpu(data, threaded=False), decode_threads(data)
    for name, want in (("mmloader", 1.5), ("mmloader-uint8", 1.2)):
        v = _ratio(_cpu(data, "local", name), dec)
        fmt = "float32" if name == "mmloader" else "uint8"
        out.append(
            (
                f"CPU per sample / decode-only CPU per sample, {fmt} output"
                + (f" (floor: {nt} threads decoding at once, as the pipeline)" if nt > 1 else ""),
                v,
                f"<= {want:g}x",
                None if v is None else v <= want,
                "x",
            )
        )
        if nt > 1:  # the same against the one-thread floor, for reference
            v = _ratio(_cpu(data, "local", name), dec1)
            out.append(
                (
                    f"the same against the one-thread decode-only floor, {fmt} output",
                    v,
                    f"(<= {want:g}x)",
                    None,
                    "x",
                )
            )
    for key, what in (
        ("faults_per_batch", "the whole process (trainer loop included)"),
        ("engine_faults_per_batch", "mmloader's own threads (Loader.stats())"),
    ):
        f = stat(data, "throughput", "local", "mmloader", key)
        out.append(
            (
                f"page faults per batch in steady state, float32, local: {what}",
                f[0] if f else None,
                f"~0 (<= {FAULTS_MAX})",
                None if not f else f[0] <= FAULTS_MAX,
                "n",
            )
        )
    v = _ratio(own_mb(data, "local", "mmloader"), own_mb(data, "local", "dataloader"))
    out.append(
        (
            "own memory vs the DataLoader's own memory (same prefetch depth, local)",
            v,
            "<= 1/3",
            None if v is None else v <= 1 / 3,
            "r",
        )
    )
    pss = [stat(data, "throughput", "local", p, "own_pss_mb") for p in ("mmloader", "dataloader")]
    if pss[0] and pss[1]:  # the figure before the fd-held shared memory was counted
        out.append(
            (
                "the same by PSS alone (the DataLoader's batches in shared memory left out)",
                _ratio(pss[0][0], pss[1][0]),
                "(<= 1/3)",
                None,
                "r",
            )
        )
    cap = _runs(data, "cap")
    if cap and "peak_mem_mb" in cap[-1]["result"]:
        r = cap[-1]["result"]
        own = r["own_mem_mb"]
        lim = cap[-1]["params"]["max_memory"] / 2**20
        out.append(
            (f"own memory with max_memory={lim:.0f} MiB", own, f"<= {lim:.0f} MB", own <= lim, "mb")
        )
    else:
        why = cap[-1]["result"].get("skipped") if cap else None
        out.append(
            (
                "own memory never above max_memory" + (f" ({why})" if why else ""),
                None,
                "<= max_memory",
                None,
                "mb",
            )
        )
    w12 = [
        r["result"]["wait_ratio"]
        for r in _runs(data, "wait", "local", "mmloader")
        if abs(r["params"].get("factor", 0) - 1.2) < 1e-9 and "wait_ratio" in r["result"]
    ]
    v = _med(w12) if w12 else None
    out.append(
        (
            "wait-time ratio, trainer step = 1.2x batch production",
            v,
            "<= 2%",
            None if v is None else v <= 0.02,
            "%",
        )
    )
    return out


def recipe_lines(json_path: str) -> List[str]:
    """A recipe-cap run's summary (bench_e2e.py MML_BENCH_MAX_PIXELS): per pipeline the
    median steady samples/s (min-max) and CPU per sample, the ratios fast/exact,
    fast/DataLoader, exact/DataLoader against issue 34's end-to-end targets, the load."""
    with open(json_path) as f:
        data = json.load(f)
    meta = data["meta"]
    during = meta.get("loadavg_during") or [0.0]
    other = meta.get("other_cores_during") or []
    out = [
        f"recipe cap: max_pixels={meta.get('max_pixels') or 'model limits'}, photos "
        f"{meta.get('photo_mp') or 'the default mix'} MP, {meta['cores']} cores, "
        f"1-min load around the runs median {_med(during):.1f} "
        f"({min(during):.1f}-{max(during):.1f})"
        + (
            f", other work {_med(other):.2f} of the cores (median; "
            f"{min(other):.2f}-{max(other):.2f})"
            if other
            else ""
        )
    ]
    for p in ("dataloader", "mmloader", "mmloader-fast"):
        r = stat(data, "throughput", "local", p, RATE)
        c = stat(data, "throughput", "local", p, "steady_cpu_s_per_sample")
        if r is None:
            out.append(f"  {p:14s} {_why_missing(data, 'local', p) or 'not measured'}")
            continue
        out.append(
            f"  {p:14s} {r[0]:7.1f} samples/s ({r[1]:.1f}-{r[2]:.1f}, {r[3]} runs)  "
            f"cpu {1000 * c[0] if c else float('nan'):.1f} ms/sample"
        )
    names = ("dataloader", "mmloader", "mmloader-fast")
    dl, ex, fa = (_rate(data, "local", p) for p in names)
    cdl, cex, cfa = (_cpu(data, "local", p) for p in names)
    # the same ratio within each repeat (the peers ran back to back: the load they shared)
    by_rep: Dict[int, Dict[str, float]] = {}
    for r in _runs(data, "throughput", "local"):
        v = _value(r["result"], RATE)
        if v is not None and "error" not in r["result"]:
            by_rep.setdefault(r["repeat"], {})[r["pipeline"]] = v
    for what, v, c, (a, b), want in (
        ("fast_decode / exact", _ratio(fa, ex), _ratio(cex, cfa), names[2:0:-1], 3.0),
        ("fast_decode / DataLoader", _ratio(fa, dl), _ratio(cdl, cfa), names[2::-2], 8.0),
        ("exact / DataLoader", _ratio(ex, dl), _ratio(cdl, cex), names[1::-1], None),
    ):
        met = "" if want is None or v is None else (" met" if v >= want else " NOT met")
        aim = f" (target >= {want:g}x{met})" if want else ""
        per = [x[a] / x[b] for x in by_rep.values() if x.get(a) and x.get(b)]
        out.append(
            f"  {what:26s} {'-' if v is None else f'{v:.2f}x'}{aim}; within a repeat "
            + (f"{min(per):.2f}-{max(per):.2f}x" if per else "-")
            + f"; CPU per sample, inverse {'-' if c is None else f'{c:.2f}x'}"
        )
    return out


def _show(v: Optional[float], how: str) -> str:
    if v is None:
        return "not measured"
    if how == "s":
        return str(v)
    return {
        "x": f"{v:.2f}x",
        "%": f"{100 * v:.2f}%",
        "r": f"{v:.2f}",
        "n": f"{v:.0f}",
        "mb": f"{v:.0f} MB",
    }[how]


def _mmm(s: Optional[Tuple[float, float, float, int]], fmt: str, scale: float = 1.0) -> str:
    if s is None:
        return "-"
    med, lo, hi, n = s
    if n == 1:
        return format(med * scale, fmt)
    return f"{format(med * scale, fmt)} ({format(lo * scale, fmt)}-{format(hi * scale, fmt)})"


def _why_missing(data, source, pipeline) -> Optional[str]:
    for r in _runs(data, "throughput", source, pipeline):
        res = r["result"]
        if "skipped" in res:
            return res["skipped"]
        if "error" in res:
            return "failed: " + res["error"].strip().splitlines()[-1]
    return None


def _throughput_table(data: Dict[str, Any], source: str) -> List[str]:
    meta = data["meta"]
    names = sorted(
        {r["pipeline"] for r in _runs(data, "throughput", source)},
        key=lambda p: ORDER.index(p) if p in ORDER else 99,
    )
    if not names:
        return []
    title = (
        "From local disk"
        if source == "local"
        else f"From the {1000 * meta['latency_s']:g} ms server"
    )
    base = _rate(data, source, "dataloader")
    dec = decode_cpu(data)
    done = max((stat(data, "throughput", source, p, RATE) or (0, 0, 0, 0))[3] for p in names)
    plan = (
        ""
        if done == meta["repeats"]
        else f" of the {meta['repeats']} planned: the run's time budget was spent"
    )
    lines = [
        f"**{title}** ({done} run(s) per pipeline{plan}; median, min-max in brackets)",
        "",
        "| pipeline | samples/s | vs DataLoader | CPU ms/sample | CPU / decode-only "
        "| faults/batch | own memory (MB) | of it shm (MB) | peak memory (MB) "
        "| first batch (s) | samples x s per run |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in names:
        rate = stat(data, "throughput", source, p, RATE)
        if rate is None:
            why = _why_missing(data, source, p) or "no run"
            lines.append(f"| {LABEL.get(p, p)} | {why[:140]} | | | | | | | | | |")
            continue
        cpu = stat(data, "throughput", source, p, "steady_cpu_s_per_sample")
        own = stat(data, "throughput", source, p, "own_mem_mb")
        n = stat(data, "throughput", source, p, "samples")
        wall = stat(data, "throughput", source, p, "wall_s")
        capped = sum(1 for r in _runs(data, "throughput", source, p) if r["result"].get("capped"))
        lines.append(
            f"| {LABEL.get(p, p)} | {_mmm(rate, '.1f')} | "
            f"{_show(_ratio(rate[0], base), 'x') if base else '-'} | "
            f"{_mmm(cpu, '.1f', 1000)} | "
            f"{_show(_ratio(cpu[0] if cpu else None, dec), 'x') if dec else '-'} | "
            f"{_mmm(stat(data, 'throughput', source, p, 'faults_per_batch'), '.0f')} | "
            f"{_mmm(own, '.0f')} | "
            f"{_mmm(stat(data, 'throughput', source, p, 'shm_mb'), '.0f')} | "
            f"{_mmm(stat(data, 'throughput', source, p, 'peak_mem_mb'), '.0f')} | "
            f"{_mmm(stat(data, 'throughput', source, p, 'ttfb_s'), '.1f')} | "
            f"{n[0]:.0f} x {wall[0]:.0f}{f' ({capped} capped)' if capped else ''} |"
        )
    return lines + [""]


def _check(data: Dict[str, Any]) -> None:
    if "repeats" not in data["meta"]:
        raise ValueError(
            "this e2e.json was written by the suite before repeats and medians: "
            "rerun benchmarks/bench_e2e.py"
        )


QUIET_CORES = 0.15  # other work under this many cores on average: "otherwise quiet"


def _quiet_sentence(meta: Dict[str, Any]) -> str:
    """What else ran on the machine during the measurements: the CPU the machine spent
    outside the suite's own process tree (/proc/stat minus the suite's tree), per
    measurement; a run before this was recorded only has the load average."""
    other = meta.get("other_cores_during") or []
    steal = meta.get("steal_cores_during") or []
    common = (
        "absolute figures follow the CPU share a pipeline got; the ratios between "
        "pipelines, measured in this one run with the repeats interleaved, are what counts."
    )
    if not other:
        return f"**The machine was shared with other work during the run** (see the load): {common}"
    med, top = _med(other), max(other)
    fig = (
        f"work outside the suite took {med:.2f} of the {meta['cores']} cores (median over "
        f"the measurements; at most {top:.2f})"
        + (f", the hypervisor stole {_med(steal):.2f} (at most {max(steal):.2f})" if steal else "")
        + " (/proc/stat busy time minus the CPU time of the suite's own process tree)"
    )
    if med <= QUIET_CORES and top <= 2 * QUIET_CORES:
        return f"The machine was otherwise quiet: {fig}."
    return f"**The machine was shared with other work during the run**: {fig}; {common}"


def markdown(
    data: Dict[str, Any], img_prefix: str = "results/", results_dir: Optional[str] = None
) -> str:
    """The results section; the profile and the plots are read from results_dir (default
    benchmarks/results)."""
    _check(data)
    results_dir = results_dir or os.path.join(HERE, "results")
    meta = data["meta"]
    ds = meta.get("dataset", {})
    during = meta.get("loadavg_during") or []
    cmd = "python3 -m pytest benchmarks/bench_e2e.py --benchmark-only -q -s" + {
        "smoke": " --e2e-smoke",
        "full": " --e2e-full",
    }.get(meta.get("mode", ""), "")
    if meta.get("max_pixels"):  # a recipe-cap run: the knobs that made it
        mp = ",".join(f"{x:g}" for x in meta.get("photo_mp") or [])
        cmd = (
            f"MML_BENCH_MAX_PIXELS={meta['max_pixels']} "
            + (f"MML_BENCH_PHOTO_MP={mp} " if mp else "")
            + cmd
        )
    src = os.path.relpath(os.path.join(results_dir, "e2e.json"), os.path.dirname(HERE))
    lines = [
        f"<!-- Generated by benchmarks/report.py from {src.replace(os.sep, '/')}; "
        "do not edit by hand. -->",
        "### End-to-end results",
        "",
        f"Run {meta['date']} (`{cmd}`) on {meta['cores']} cores "
        f"({meta.get('cpu') or 'unknown CPU'}), Python {meta['python']}, load average "
        f"{meta.get('loadavg_start', [0])[0]:.1f} at the start and "
        f"{meta.get('loadavg_end', [0])[0]:.1f} at the end"
        + (
            f" (1-min load average around the measurements, the run's own 2-3 busy "
            f"threads included: median {_med(during):.1f}, "
            f"{min(during):.1f}-{max(during):.1f})"
            if during
            else ""
        )
        + ". "
        + _quiet_sentence(meta),
        "",
        f"Dataset: {ds.get('records', '?')} records ({ds.get('turns_per_record', '?')} "
        f"turns each on average), {ds.get('images', '?')} images, {ds.get('image_mb', '?')} MB:"
        + (
            f" only real photos (scikit-image / matplotlib sample photos re-encoded as JPEG "
            f"at {', '.join(f'{m:g}' for m in meta['photo_mp'])} MP); mean "
            if meta.get("photo_mp")
            else f" {ds.get('photos', '?')} real photos (scikit-image / matplotlib sample "
            f"photos re-encoded at 0.3-12 MP) and generated photos and screenshots; mean "
        )
        + f"{ds.get('mean_mp', '?')} MP, largest {ds.get('max_mp', '?')} MP; by size "
        + ", ".join(f"{k} MP: {v}" for k, v in sorted(ds.get("megapixels", {}).items()))
        + "; by kind "
        + ", ".join(f"{k} {v}" for k, v in sorted(ds.get("image_kinds", {}).items()))
        + f". Batches of {meta['batch_size']} samples, Qwen2.5-VL preset and "
        + (
            f"max_pixels={meta['max_pixels']} for every pipeline (a recipe cap), "
            if meta.get("max_pixels")
            else "default pixel limits, "
        )
        + f"{meta.get('tokenizer')} tokenizer, float32 `pixel_values` unless said. "
        f"Each measurement: a fresh process, at least {meta['min_samples']} samples and "
        f"{meta['min_seconds']:g} s (the records repeat, each pass shuffled)"
        + (
            f", or {meta['max_seconds']:g} s at most (a run that stopped there is counted "
            "'capped' in the last column)"
            if meta.get("max_seconds")
            else ""
        )
        + ", trainer step 0 (the loader's own rate); "
        f"{meta['repeats']} repeats, interleaved; the run took "
        f"{meta.get('elapsed_s', 0) / 60:.0f} min. Remote: the fault-injecting server on the same "
        f"machine, {1000 * meta['latency_s']:g} ms first-byte latency, no faults.",
        "",
    ]
    for r in _runs(data, "parity"):
        res = r["result"]
        who = LABEL.get(r["pipeline"], r["pipeline"]).replace("**", "")
        if "batches" not in res:
            why = res.get("skipped") or res.get("error", "?").strip().splitlines()[-1]
            lines.append(f"- Same work, {who}: not checked ({why[:160]}).")
            continue
        same = (
            "identical input_ids, labels, attention_mask and image_grid_thw"
            if not res["mismatch"]
            else "**differences**: " + "; ".join(res["mismatch"][:3])
        )
        lines.append(
            f"- Same work, {who}: on the first {res['samples']} samples, against the "
            f"reference Python code, {same}; pixel_values differ by at most "
            f"{res['pixel_max_abs_diff']:.1e} (mean {res.get('pixel_mean_abs_diff', 0):.1e})."
        )
    lines.append("")
    dec = stat(data, "decode", "local", "decode-only", "cpu_s_per_sample")
    pil = stat(data, "decode", "local", "decode-only", "pil_cpu_s_per_sample")
    many = stat(data, "decode", "local", "decode-only", "threaded_cpu_s_per_sample")
    many_rate = stat(data, "decode", "local", "decode-only", "threaded_samples_per_s")
    nt = decode_threads(data)
    if dec and many and nt > 1:
        lines += [
            f"Decode-only CPU per sample of the same images (read + decode to RGB8, nothing "
            f"else), mmloader's decoders (libjpeg-turbo, libpng, ...): "
            f"{_mmm(many, '.2f', 1000)} ms with {nt} threads decoding at once, as the "
            f"pipelines do ({_mmm(many_rate, '.0f')} samples/s: the fastest any loader "
            f"decodes these images on {nt} threads), {_mmm(dec, '.2f', 1000)} ms on one "
            f"thread alone; Pillow, one thread: {_mmm(pil, '.2f', 1000)} ms. "
            f'"CPU / decode-only" below divides by the {nt}-thread figure: the pipeline '
            f"decodes on {nt} threads at once, and decodes that share the machine's caches "
            "and memory bandwidth each cost more CPU than one alone, so the one-thread "
            "figure would count that contention as the pipeline's own overhead (the "
            "targets table gives both ratios).",
            "",
        ]
    elif dec:
        lines += [
            f"Decode-only CPU per sample of the same images (one thread, read + decode "
            f"to RGB8, nothing else): {_mmm(dec, '.2f', 1000)} ms with mmloader's "
            f"decoders (libjpeg-turbo, libpng, ...), {_mmm(pil, '.2f', 1000)} ms with "
            "Pillow. \"CPU / decode-only\" below divides by the former.",
            "",
        ]
    for source in ("local", "remote"):
        lines += _throughput_table(data, source)
    wait = [r for r in _runs(data, "wait") if "wait_ratio" in r["result"]]
    if wait:
        prods = [r["params"]["production_ms"] for r in wait]
        prod = _med(prods)
        lines += [
            f"**Wait-time ratio against the trainer step** (mmloader's batch production "
            f"time: {_mmm((prod, min(prods), max(prods), len(prods)), '.1f')} ms per batch "
            f"of {meta['batch_size']}, before each wait-time run the median of its local "
            "throughput runs so far, in steady state; the trainer sleeps for the step after "
            "each batch; the wait-time ratio is time blocked in next() over the time after "
            "the first batch, and the same after the warm-up)",
            "",
            "| pipeline | step / production | step (ms) | wait-time ratio | after the warm-up "
            "| samples/s delivered |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        keys = sorted(
            {(r["pipeline"], r["params"]["factor"]) for r in wait},
            key=lambda k: (ORDER.index(k[0]) if k[0] in ORDER else 99, k[1]),
        )
        for p, f in keys:
            rs = [r for r in wait if r["pipeline"] == p and r["params"]["factor"] == f]

            def mmm(key: str, fmt: str = ".2f", scale: float = 100, rs=rs) -> str:
                vals = [_value(r["result"], key) for r in rs]
                vals = [v for v in vals if v is not None]
                if not vals:
                    return "-"
                return _mmm((_med(vals), min(vals), max(vals), len(vals)), fmt, scale)

            steps = [r["params"]["step_ms"] for r in rs]
            lines.append(
                f"| {p} | {f:.1f}x | {_med(steps):.1f} | {mmm('wait_ratio')}% "
                f"| {mmm('steady_wait_ratio')}% | {mmm(RATE, '.1f', 1)} |"
            )
        lines.append("")
    thr = [r for r in _runs(data, "threads") if "samples_per_s" in r["result"]]
    if thr:
        counts = sorted({r["params"]["threads"] for r in thr})
        lines += [
            "**Throughput against threads** (samples/s, local; the DataLoader: worker processes)",
            "",
            "| pipeline | " + " | ".join(map(str, counts)) + " |",
            "|---|" + "---:|" * len(counts),
        ]
        for p in ORDER:
            rs = {
                r["params"]["threads"]: _value(r["result"], RATE) for r in thr if r["pipeline"] == p
            }
            if rs:
                lines.append(
                    f"| {p} | "
                    + " | ".join(f"{rs[t]:.1f}" if t in rs else "-" for t in counts)
                    + " |"
                )
        lines.append("")
    lines += [
        "**Targets** (issue 15"
        + (
            "; at this recipe cap also issue 34's end-to-end fast_decode targets"
            if meta.get("max_pixels")
            else ""
        )
        + "; ratios of medians measured in this run)",
        "",
        "| target | measured | wanted | |",
        "|---|---:|---:|---|",
    ]
    for name, v, want, met, how in targets(data):
        mark = "-" if met is None else ("met" if met else "**not met**")
        lines.append(f"| {name} | {_show(v, how)} | {want} | {mark} |")
    lines.append(
        "| expand_pixels output bandwidth; uint8 H2D vs a raw pinned cudaMemcpyAsync | "
        "not measured: no GPU was lent to this run (scripts/gpu-check.sh measures both) "
        "| >= 80% | - |"
    )
    lines.append("")
    prof = profile_lines(os.path.join(results_dir, "profile.json"))
    if prof:
        lines += prof
    lines += lateness_lines(data) + memory_lines(data)
    lines += [
        "Figures: samples/s, CPU ms/sample (user+system, the process and all its "
        "children) and faults/batch (minor+major) are steady-state figures of the process "
        "tree: from the end of a warm-up (a quarter of the minimum run time, at least 3 "
        "batches) to the end, over the samples and the batches in that span (so batches a "
        "pipeline prefetched before the first one do not flatter its rate); peak memory = "
        "largest memory of the process tree: its PSS sum (a page shared by k processes "
        "counts 1/k each) plus the shared memory it holds that no PSS shows (\"of it "
        "shm\", at that peak: tmpfs/memfd objects held open by a descriptor, each counted "
        "once at its allocated size, minus the tree's Pss_Shmem; the DataLoader's and "
        "Energon's workers hand each batch over as such objects (torch's fd sharing), "
        "which sit in no process's PSS while the batch is in flight, or while it is mapped "
        "but not yet touched); own memory = peak memory minus the same figure for "
        "the same process with the same imports and no pipeline (measured in each run "
        "after the imports, before the pipeline is built); first batch = construction to "
        "first batch (imports excluded). mmloader keeps prefetch=4 batches, the DataLoader and Energon "
        "prefetch_factor=2 x 2 workers = 4 batches: the same depth. Peers that only run "
        "with `--e2e-full` (naive serial, case-study pipeline, Ray Data, and SPDL behind the "
        "server) are left out of the default run for its time budget; Energon and DALI read "
        "local files only.",
        "",
    ]
    imgs = [("throughput.png", "samples/s by pipeline (median, min-max)")]
    if thr:
        imgs.append(("throughput_vs_threads.png", "throughput against threads"))
    lines += [
        f"![{alt}]({img_prefix}{name})"
        for name, alt in imgs
        if os.path.exists(os.path.join(results_dir, name))
    ]
    return "\n".join(lines) + "\n"


def profile_lines(path: str) -> List[str]:
    """The 'where the CPU goes' section from benchmarks/profile_e2e.py's JSON, if present:
    the float32 profile (the JSON's top level) and, when the run made one, the uint8 one
    (its "uint8" key)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        prof = json.load(f)
    lines: List[str] = []
    for one in [prof] + ([prof["uint8"]] if isinstance(prof.get("uint8"), dict) else []):
        lines += _profile_table(one)
    return lines


def _profile_table(prof: Dict[str, Any]) -> List[str]:
    """One profile_e2e.py profile (one pixel_format): its table and what remains."""
    fmt = prof.get("pixel_format", "float32")
    lines = [
        f"**Where mmloader's CPU goes, pixel_format={fmt}** (`python3 benchmarks/profile_e2e.py`: "
        f"{prof['tool']}; {prof['what']}; {prof['samples']} samples; "
        f"{prof['cpu_ms_per_sample']:.1f} ms CPU per sample in that run)",
        "",
        "| share | where | top functions |",
        "|---:|---|---|",
    ]
    share = {}
    for row in prof["groups"]:
        share[row["group"].split(" (")[0]] = row["share"]
        lines.append(
            f"| {100 * row['share']:.1f}% | {row['group']} | {', '.join(row['top'][:4])} |"
        )

    def pct(prefix: str) -> float:
        return 100 * sum(v for k, v in share.items() if k.startswith(prefix))

    floor = pct("image decoders")
    engine = pct("kernel: page") + pct("memmove") + pct("mmloader: normalise")
    lines += [
        "",
        f"What remains ({fmt}): the decoders, the floor any loader pays, are {floor:.0f}% "
        f"of mmloader's CPU here; {engine:.0f}% is memory traffic the engine creates "
        f"itself: page faults and zeroing of freshly mapped memory "
        f"({pct('kernel: page'):.0f}%), memmove ({pct('memmove'):.0f}%) and writing "
        f"the pixel layout ({pct('mmloader: normalise'):.0f}%); resize is "
        f"{pct('mmloader: resize'):.0f}%, the Python side (the trainer loop and the "
        f"batch hand-off) {pct('Python'):.0f}%. CPU per sample can approach the "
        "decode-only floor only as the engine's own share goes to zero.",
        "",
    ]
    return lines


def _sub(
    data: Dict[str, Any], group: str, pipeline: str, key: str, sub: str, factor: Optional[float]
) -> Optional[Tuple[float, float, float, int]]:
    """(median, min, max, n) over the local runs of `key`[`sub`] (a nested figure: a
    spread, the loader's stats), the wait-time runs at `factor` only."""
    vals = []
    for r in _runs(data, group, "local", pipeline):
        if factor is not None and abs(r["params"].get("factor", 0) - factor) > 1e-9:
            continue
        v = (r["result"].get(key) or {}).get(sub)
        if v is not None:
            vals.append(float(v))
    return (_med(vals), min(vals), max(vals), len(vals)) if vals else None


def lateness_lines(data: Dict[str, Any]) -> List[str]:
    """Why batches come late (the wait-time target): the spread of mmloader's batch
    intervals at step 0 and of the waits in the 1.2x runs (runner.py's interval_ms,
    next_wait_ms), medians over the runs."""
    spreads = []
    for q in QS:
        one = _sub(data, "throughput", "mmloader", "interval_ms", q, None)
        if one is None:
            return []
        spreads.append(one)
    p50, p90, p99, top = (v[0] for v in spreads)
    slow = stat(data, "throughput", "local", "mmloader", "slow_interval_share")
    depth = _sub(data, "throughput", "mmloader", "loader_stats", "prefetch", None)
    text = (
        f"Why batches come late: at step 0 (mmloader's local throughput runs, steady state, "
        f"median over {spreads[0][3]} run(s)) the time between consecutive batches, its "
        f"production time per batch, is {p50:.0f} ms at the median, {p90:.0f} ms at p90, "
        f"{p99:.0f} ms at p99 and {top:.0f} ms at most"
        + (f"; {100 * slow[0]:.0f}% of the batches take over 1.2x the median" if slow else "")
        + ": a trainer step of 1.2x the median hides such a batch only while the "
        + (f"{depth[0]:.0f} " if depth else "")
        + "prefetched batches last."
    )
    ws = [
        r["result"]["waiting_share"]
        for r in _runs(data, "wait", "local", "mmloader")
        if abs(r["params"].get("factor", 0) - 1.2) < 1e-9
        and r["result"].get("waiting_share") is not None
    ]
    w99 = _sub(data, "wait", "mmloader", "next_wait_ms", "p99", 1.2)
    wmax = _sub(data, "wait", "mmloader", "next_wait_ms", "max", 1.2)
    if ws and w99 and wmax:
        text += (
            f" In the 1.2x runs {100 * (_med(ws) or 0):.0f}% of next() calls waited over 1 ms; "
            f"the waits were {w99[0]:.0f} ms at p99 and {wmax[0]:.0f} ms at most (median "
            f"over {len(ws)} run(s))."
        )
    return [text, ""]


QS = ("p50", "p90", "p99", "max")


def memory_lines(data: Dict[str, Any]) -> List[str]:
    """What the pipelines' own memory is, in batches: own memory (local, median) over the
    mean batch (its arrays: runner.py's batch_mb), and mmloader's pool at the end of its
    float32 runs (Loader.stats())."""
    rows = []
    for p in ORDER:
        b = stat(data, "throughput", "local", p, "batch_mb")
        own = own_mb(data, "local", p)
        if b and own is not None and b[0] > 0:
            name = LABEL[p].replace("**", "").split(" (")[0].split(" +")[0]
            rows.append(f"{name} {own:.0f} MB = {own / b[0]:.1f} x {b[0]:.0f} MB")
    if not rows:
        return []
    text = (
        "What the own memory is (local, median; own memory = that many mean batches, a "
        f"batch's arrays of {data['meta']['batch_size']} samples): " + "; ".join(rows) + "."
    )
    live = _sub(data, "throughput", "mmloader", "loader_stats", "pool_live_bytes", None)
    cached = _sub(data, "throughput", "mmloader", "loader_stats", "pool_cached_bytes", None)
    if live and cached:
        text += (
            f" At the end of its float32 runs mmloader's pool held {live[0] / 2**20:.0f} MB "
            f"in buffers still in use and {cached[0] / 2**20:.0f} MB cached for reuse "
            "(Loader.stats(), median)."
        )
    text += _own_parts(data)
    return [text, ""]


def _own_parts(data: Dict[str, Any]) -> str:
    """mmloader's float32 own memory in parts (Loader.stats() high-water marks, medians of
    the local runs) beside the floor at its depth: the largest two batches in a row (the
    trainer's batch and the next one)."""

    def mb(key: str) -> Optional[float]:
        v = _sub(data, "throughput", "mmloader", "loader_stats", key, None)
        return v[0] / 2**20 if v else None

    peak, live_peak = mb("pool_peak_bytes"), mb("pool_live_peak_bytes")
    pair = stat(data, "throughput", "local", "mmloader", "batch_pair_max_mb")
    big = stat(data, "throughput", "local", "mmloader", "batch_max_mb")
    own = own_mb(data, "local", "mmloader")
    if peak is None or live_peak is None or not pair or not big:
        return ""
    win, scr = mb("window_bytes"), mb("scratch_mapped_peak_bytes")
    text = (
        f" Its parts (float32, high-water marks): the pool {peak:.0f} MB, of it "
        f"{live_peak:.0f} MB in use at one time (the batch being expanded, its uint8 rows, "
        "the uint8 rows of the batches being decoded, the trainer's batch while it holds "
        f"one) and {peak - live_peak:.0f} MB more cached"
    )
    if win is not None:
        text += f"; the window's encoded bytes {win:.0f} MB (at the end)"
    if scr is not None:
        text += f"; decoder scratch at most {scr:.0f} MB"
    text += (
        f". The floor at this depth, the largest two float32 batches in a row (the "
        f"trainer's and the next), is {pair[0]:.0f} ({pair[1]:.0f}-{pair[2]:.0f}) MB, the "
        f"largest single batch {big[0]:.0f} ({big[1]:.0f}-{big[2]:.0f}) MB"
    )
    dl = own_mb(data, "local", "dataloader")
    if dl:
        text += f"; 1/3 of the DataLoader's own memory is {dl / 3:.0f} MB, so that target " + (
            "is below this floor." if pair[0] > dl / 3 else "is above this floor."
        )
    else:
        text += "."
    if own is not None:
        text += f" Own memory over the floor: {own - pair[0]:.0f} MB."
    return text


def plots(data: Dict[str, Any], out_dir: str) -> List[str]:
    """Writes the PNGs; returns their paths (none without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    os.makedirs(out_dir, exist_ok=True)
    written = []
    fig, ax = plt.subplots(figsize=(7, 4))
    names = [
        p
        for p in ORDER
        if stat(data, "throughput", "local", p, RATE) or stat(data, "throughput", "remote", p, RATE)
    ]
    for k, source in enumerate(("local", "remote")):
        xs, ys, lo, hi = [], [], [], []
        for i, p in enumerate(names):
            s = stat(data, "throughput", source, p, RATE)
            if s:
                xs.append(i + (k - 0.5) * 0.38)
                ys.append(s[0])
                lo.append(s[0] - s[1])
                hi.append(s[2] - s[0])
        if xs:
            ax.bar(
                xs,
                ys,
                width=0.38,
                yerr=[lo, hi],
                capsize=3,
                label="local disk"
                if source == "local"
                else f"{1000 * data['meta']['latency_s']:g} ms server",
            )
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("samples/s (median, min-max)")
    ax.set_title(f"End to end, {data['meta']['cores']} shared cores")
    ax.grid(True, axis="y", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, "throughput.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    thr = [r for r in _runs(data, "threads") if "samples_per_s" in r["result"]]
    if thr:
        fig, ax = plt.subplots(figsize=(6, 4))
        for p in ORDER:
            pts = sorted(
                (r["params"]["threads"], _value(r["result"], RATE))
                for r in thr
                if r["pipeline"] == p
            )
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=p)
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("threads (DataLoader: worker processes)")
        ax.set_ylabel("samples/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out_dir, "throughput_vs_threads.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def md_path_for(out_dir: str) -> str:
    """Where results.md goes for the suite's output folder: benchmarks/results.md for the
    default folder (benchmarks/results), else inside the folder itself (never beside it:
    an --e2e-out of /tmp/x must not write /tmp/results.md)."""
    out_dir = os.path.abspath(out_dir)
    if out_dir == os.path.join(HERE, "results"):
        return os.path.join(HERE, "results.md")
    return os.path.join(out_dir, "results.md")


def generate(json_path: str, out_dir: Optional[str] = None, md_path: Optional[str] = None) -> str:
    """Writes results.md (md_path, default md_path_for(out_dir)) and the plots from the
    suite's JSON; returns the Markdown (its image links relative to results.md)."""
    with open(json_path) as f:
        data = json.load(f)
    out_dir = os.path.abspath(out_dir or os.path.dirname(os.path.abspath(json_path)))
    md_path = md_path or md_path_for(out_dir)
    _check(data)
    plots(data, out_dir)
    rel = os.path.relpath(out_dir, os.path.dirname(os.path.abspath(md_path)))
    prefix = "" if rel == os.curdir else rel.replace(os.sep, "/") + "/"
    md = markdown(data, img_prefix=prefix, results_dir=out_dir)
    with open(md_path, "w") as f:
        f.write(md)
    return md


START, END = "<!-- results:start -->", "<!-- results:end -->"


def fill_readme(json_path: str, readme: str) -> None:
    """Replaces what lies between the results markers of `readme` (docs/benchmarks.md) by
    the generated table (image links relative to that file)."""
    with open(json_path) as f:
        data = json.load(f)
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    a, b = text.find(START), text.find(END)
    if a < 0 or b < a:
        raise SystemExit(f"{readme}: no {START} ... {END} block")
    rel = os.path.relpath(os.path.join(HERE, "results"), os.path.dirname(os.path.abspath(readme)))
    block = markdown(data, img_prefix=rel.replace(os.sep, "/") + "/")
    block = block.replace("### End-to-end results\n", "", 1)
    text = text[: a + len(START)] + "\n" + block + text[b:]
    with open(readme, "w", encoding="utf-8") as f:
        f.write(text)


def main(argv: List[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="results table and plots from the e2e JSON")
    ap.add_argument("json", nargs="?", default=os.path.join(HERE, "results", "e2e.json"))
    ap.add_argument(
        "--readme",
        nargs="?",
        const=os.path.join(os.path.dirname(HERE), "docs", "benchmarks.md"),
        default=None,
        help="also fill docs/benchmarks.md's results block",
    )
    args = ap.parse_args(argv[1:])
    sys.stdout.write(generate(args.json))
    if args.readme:
        fill_readme(args.json, args.readme)
        print(f"filled {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
