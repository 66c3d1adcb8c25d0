"""Measures one pipeline in this (fresh) process and prints one JSON line.

    python -m benchmarks.pipelines.runner '{"pipeline": "naive", "shards": [...], ...}'

The consumer loop is a simulated trainer: it takes a batch, then is busy for `step_ms`
(a sleep: the host thread of a GPU trainer waits on the device, it does not burn CPU).
Figures (all over one pass of `limit` samples, or `batches` batches when given):

  samples_per_s    samples after the first batch / wall time after the first batch (a
                   single-batch run: its samples / time from iter() on): the steady rate,
                   flattered for pipelines that finished many batches before the first
  e2e_samples_per_s  all samples / time from iter() to the last batch: includes the
                   pipeline's warm-up inside iteration (worker start, first fetches)
  ttfb_s           iter() to the first batch (pipeline start-up included, imports not)
  wait_ratio       time blocked in next() / wall time, after the first batch
  cpu_s_per_sample CPU time (user+system) of this process and all its descendants from
                   iter() to the last batch, over the samples delivered
  peak_mem_mb      largest sum of PSS (proportional set size: a page shared by k
                   processes counts 1/k in each) over this process and its live
                   descendants, sampled every 200 ms (the process list every second):
                   the memory the pipeline holds
  peak_rss_mb      ru_maxrss of this process + ru_maxrss of its reaped children (the
                   largest child, not their sum; a forked helper counts its parent's
                   pages), for reference

Imports happen before the clock starts; every pipeline imports torch (the trainer's) and
what its own work needs (transformers for the Python peers).
"""
from __future__ import annotations

import importlib
import json
import os
import resource
import sys
import threading
import time
from typing import Any, Dict, List

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _children_map() -> Dict[int, List[int]]:
    kids: Dict[int, List[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        kids.setdefault(int(fields[1]), []).append(int(name))
    return kids


def _descendants(root: int) -> List[int]:
    kids = _children_map()
    out, todo = [], list(kids.get(root, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _proc_cpu_rss(pid: int):
    """(utime+stime+cutime+cstime seconds, RSS bytes) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    cpu = sum(int(x) for x in fields[11:15]) / _TICK
    return cpu, int(fields[21]) * _PAGE


def tree_cpu() -> float:
    """CPU seconds of this process, its reaped children and its live descendants."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = me.ru_utime + me.ru_stime + ch.ru_utime + ch.ru_stime
    for pid in _descendants(os.getpid()):
        r = _proc_cpu_rss(pid)
        if r is not None:
            total += r[0]
    return total


def _pss(pid: int) -> int:
    """PSS bytes of a live process (RSS where smaps_rollup is unreadable), 0 if gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    r = _proc_cpu_rss(pid)
    return r[1] if r is not None else 0


class TreeMemory(threading.Thread):
    """Samples the PSS sum of this process tree until stopped; keeps the peak."""

    def __init__(self, period: float = 0.2, rescan: float = 1.0):
        super().__init__(name="pss-sampler", daemon=True)
        self.period, self.rescan = period, rescan  # scanning /proc costs ~5 ms: not often
        self.peak = 0
        self.halt = threading.Event()

    def run(self) -> None:
        me = os.getpid()
        pids, scanned = [me], 0.0
        while not self.halt.is_set():
            now = time.monotonic()
            if now - scanned >= self.rescan:
                pids, scanned = [me] + _descendants(me), now
            self.peak = max(self.peak, sum(_pss(pid) for pid in pids))
            self.halt.wait(self.period)

    def stop(self) -> int:
        self.halt.set()
        self.join()
        return self.peak


def _batch_rows(batch: Any) -> int:
    ids = batch["input_ids"]
    shape = getattr(ids, "shape", None)
    if shape is None and hasattr(ids, "__dlpack__"):
        import numpy as np
        shape = np.from_dlpack(ids).shape
    if "cu_seqlens" in batch:  # packed: [1, L] rows; samples = len(cu_seqlens) - 1
        cs = batch["cu_seqlens"]
        return int(getattr(cs, "shape", (0,))[0]) - 1
    return int(shape[0])


def measure(cfg: Dict[str, Any]) -> Dict[str, Any]:
    import torch  # noqa: F401  (the trainer's import, for every pipeline alike)
    mod = importlib.import_module(f"benchmarks.pipelines.{cfg['module']}")
    reason = mod.available()
    if reason:
        return {"skipped": reason}
    if hasattr(mod, "preload"):
        mod.preload(cfg)
    step = float(cfg.get("step_ms", 0)) / 1000.0
    max_batches = int(cfg.get("batches") or 0)
    mem = TreeMemory()
    mem.start()

    t0 = time.perf_counter()
    pipe = mod.build(cfg)
    cpu0 = tree_cpu()
    t_iter = time.perf_counter()
    it = iter(pipe)
    first = next(it)
    t_first = time.perf_counter()
    n_first = _batch_rows(first)
    del first
    waited = 0.0
    samples = 0
    batches = 1
    while not max_batches or batches < max_batches:
        if step:
            time.sleep(step)
        t = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        waited += time.perf_counter() - t
        samples += _batch_rows(batch)
        batches += 1
        del batch
    t_end = time.perf_counter()
    cpu1 = tree_cpu()
    extra = mod.extra_stats(pipe) if hasattr(mod, "extra_stats") else {}
    pipe.close()
    del it, pipe
    peak_mem = mem.stop()
    me = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = t_end - t_first
    total = samples + n_first
    if samples:
        rate = samples / wall
    else:  # a single batch: count it from iter() on
        wall = t_end - t_iter
        rate = total / wall if wall > 0 else 0.0
    return {
        "samples": total, "batches": batches,
        "samples_per_s": rate,
        "e2e_samples_per_s": total / (t_end - t_iter) if t_end > t_iter else 0.0,
        "ttfb_s": t_first - t0,
        "wait_ratio": waited / wall if wall > 0 else 0.0,
        "cpu_s_per_sample": (cpu1 - cpu0) / total if total else 0.0,
        "peak_mem_mb": peak_mem / 2**20,
        "peak_rss_mb": (me.ru_maxrss + ch.ru_maxrss) / 1024.0,
        "peak_self_rss_mb": me.ru_maxrss / 1024.0,
        "wall_s": wall, "step_ms": step * 1000.0, **extra,
    }


def _numpy(x: Any):
    import numpy as np
    if hasattr(x, "numpy"):
        x = x.numpy()
    return np.asarray(x)


def parity(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """Checks that the reference (naive) pipeline and mmloader do the same work: the first
    `batches` batches of both, compared key by key."""
    import numpy as np
    import torch  # noqa: F401
    ref_mod = importlib.import_module("benchmarks.pipelines.naive")
    mml_mod = importlib.import_module("benchmarks.pipelines.mmloader_pipe")
    reason = mml_mod.available()
    if reason:
        return {"skipped": reason}
    ref_mod.preload(cfg)
    mml_cfg = dict(cfg, limit=0)
    ref, mml = ref_mod.build(cfg), mml_mod.build(mml_cfg)
    out: Dict[str, Any] = {"batches": 0, "samples": 0, "mismatch": []}
    worst = 0.0
    try:
        for a, b in zip(ref, mml):
            for key in ("input_ids", "labels", "attention_mask", "image_grid_thw"):
                x, y = _numpy(a[key]), _numpy(b[key])
                if x.shape != y.shape or not np.array_equal(x, y.astype(x.dtype)):
                    out["mismatch"].append(f"batch {out['batches']} {key}: "
                                           f"{x.shape} vs {y.shape}")
            x, y = _numpy(a["pixel_values"]), _numpy(b["pixel_values"])
            if x.shape != y.shape:
                out["mismatch"].append(f"batch {out['batches']} pixel_values: "
                                       f"{x.shape} vs {y.shape}")
            elif x.size:
                worst = max(worst, float(np.abs(x - y).max()))
            out["batches"] += 1
            out["samples"] += int(_numpy(a["input_ids"]).shape[0])
            if out["batches"] >= int(cfg.get("batches") or 2):
                break
    finally:
        mml.close()
    out["pixel_max_abs_diff"] = worst
    return out


def run_subprocess(cfg: Dict[str, Any], timeout: float = 600.0) -> Dict[str, Any]:
    """Runs measure(cfg) in a fresh interpreter; returns its figures (or {"error": ...})."""
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.pipelines.runner",
                               json.dumps(cfg)], cwd=root, env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in proc.stdout.splitlines()[::-1]:
        if line.startswith("MMLBENCH "):
            return json.loads(line[len("MMLBENCH "):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
    return {"error": f"exit {proc.returncode}: " + "\n".join(tail)}


def main(argv: List[str]) -> int:
    cfg = json.loads(argv[1])
    out = parity(cfg) if cfg.get("parity") else measure(cfg)
    sys.stdout.flush()
    print("MMLBENCH " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
