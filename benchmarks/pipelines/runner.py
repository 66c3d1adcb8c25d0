"""Measures one pipeline in this (fresh) process and prints one JSON line.

    python -m benchmarks.pipelines.runner '{"pipeline": "naive", "shards": [...], ...}'

The consumer loop is a simulated trainer: it takes a batch, then is busy for `step_ms`
(a sleep: the host thread of a GPU trainer waits on the device, it does not burn CPU).
It stops after `batches` batches when given, else at the first batch at which it holds at
least `min_samples` samples AND `min_seconds` have passed since the first batch (the
dataset is long enough that no pipeline runs out; `exhausted` says if one did), or when
`max_seconds` have passed (`capped`: a slow pipeline on a loaded machine; the records are
shuffled per pass, so any prefix is a fair sample of the mix).  Figures:

  samples_per_s    samples after the first batch / wall time after the first batch (a
                   single-batch run: its samples / time from iter() on): the steady rate,
                   flattered for pipelines that finished many batches before the first
  e2e_samples_per_s  all samples / time from iter() to the last batch: includes the
                   pipeline's warm-up inside iteration (worker start, first fetches)
  ttfb_s           iter() to the first batch (pipeline start-up included, imports not)
  wait_ratio       time blocked in next() / wall time, after the first batch
  cpu_s_per_sample CPU time (user+system) of this process and all its descendants from
                   iter() to the last batch, over the samples delivered
  peak_mem_mb      largest memory of the process tree, sampled every 500 ms (the
                   process list every second): the sum of PSS (proportional set size: a
                   page shared by k processes counts 1/k in each) over this process and
                   its live descendants, plus the shared memory the tree holds that no
                   PSS shows (shm_mb); the memory the pipeline holds (the sampler's own
                   CPU is not counted in the CPU figures)
  shm_mb           at that peak: the tmpfs / memfd objects (/dev/shm, memfd:) the tree
                   holds open by a file descriptor, each counted once at its allocated
                   size, minus the shared memory the tree's PSS already counts
                   (Pss_Shmem).  The DataLoader's (and Energon's) workers hand batches
                   over as such objects (torch's file_descriptor sharing: shm_open +
                   unlink, the fd passed); a batch in flight is held by a descriptor
                   and mapped by no process, or mapped but never touched, so it is in
                   no process's PSS, yet it is real memory (/proc/meminfo Shmem)
  peak_pss_mb      largest PSS sum alone (the figure before shm_mb was counted)
  peak_rss_mb      ru_maxrss of this process + ru_maxrss of its reaped children (the
                   largest child, not their sum; a forked helper counts its parent's
                   pages), for reference
  faults_per_batch page faults (minor + major) of the process tree from the first batch
                   after a warm-up (a quarter of min_seconds, at least 3 batches) to the
                   end, over the batches in that span: the steady state

  idle_pss_mb      memory (as peak_mem_mb) of this process after the imports, before
                   the pipeline is built (the same process, the same imports, no pipeline)
  own_mem_mb       peak_mem_mb - idle_pss_mb: the pipeline's own memory
  own_pss_mb       peak_pss_mb - idle_pss_mb: the same by PSS alone
  steady_cpu_s_per_sample  cpu_s_per_sample over the same span as faults_per_batch
  steady_samples_per_s, steady_wait_ratio  samples/s and wait_ratio over that span (no
                   batch the pipeline made before the first one counts: the production
                   rate the wait-time runs are set from); None under 3 batches
  batch_mb         mean bytes of a batch's arrays (tensors), all batches: what a batch
                   held in a queue or a pool costs
  interval_ms, slow_interval_share, next_wait_ms, waiting_share
                   over the same span: the time between consecutive batches (p50, p90,
                   p99, max; at step 0 the pipeline's production time per batch), the
                   share of those over 1.2x their median (the batches a trainer step of
                   1.2x the production time does not hide by itself), each next()'s
                   wait, and the share of next() calls that waited over 1 ms: why
                   batches come late

{"steady_file": PATH} writes PATH when the steady state begins (a profiler attaches then).

Other modes: {"decode": true} decodes the images of the run's records, one thread, with mmloader's
decoder and with Pillow (decode_only.py); {"parity": ["<module>", ...]} compares pipelines'
first batches with the reference (naive) pipeline's.

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
from typing import Any, Dict, List, Optional, Tuple

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
        fields = stat[stat.rindex(b")") + 2 :].split()
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


def _proc_stat(pid: int):
    """(utime+stime+cutime+cstime seconds, RSS bytes, minflt+majflt+their children's) of
    a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    cpu = sum(int(x) for x in fields[11:15]) / _TICK
    return cpu, int(fields[21]) * _PAGE, sum(int(x) for x in fields[7:11])


def tree_cpu() -> float:
    """CPU seconds of this process, its reaped children and its live descendants."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = me.ru_utime + me.ru_stime + ch.ru_utime + ch.ru_stime
    for pid in _descendants(os.getpid()):
        r = _proc_stat(pid)
        if r is not None:
            total += r[0]
    return total


def tree_faults() -> int:
    """Page faults (minor + major) of this process, its reaped children and its live
    descendants."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = me.ru_minflt + me.ru_majflt + ch.ru_minflt + ch.ru_majflt
    for pid in _descendants(os.getpid()):
        r = _proc_stat(pid)
        if r is not None:
            total += r[2]
    return total


def _pss(pid: int) -> Tuple[int, int]:
    """(PSS bytes, of it shared memory: Pss_Shmem) of a live process (RSS, 0 where
    smaps_rollup is unreadable), (0, 0) if gone."""
    pss = shmem = -1
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    pss = int(line.split()[1]) * 1024
                elif line.startswith(b"Pss_Shmem:"):
                    shmem = int(line.split()[1]) * 1024
    except OSError:
        pass
    if pss >= 0:
        return pss, max(shmem, 0)
    r = _proc_stat(pid)
    return (r[1] if r is not None else 0), 0


SHM_PREFIXES = ("/dev/shm/", "/run/shm/", "/memfd:")


def shm_held(pids: List[int]) -> int:
    """Allocated bytes of the shared-memory objects (tmpfs files under /dev/shm, memfds)
    that the processes `pids` hold open by a file descriptor, each object counted once
    (by device and inode) however many descriptors and processes hold it."""
    seen: Dict[Tuple[int, int], int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            try:
                if not os.readlink(path).startswith(SHM_PREFIXES):
                    continue
                st = os.stat(path)
            except OSError:  # closed meanwhile
                continue
            seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return sum(seen.values())


def tree_memory(pids: List[int]) -> Tuple[int, int]:
    """(memory, of it shared memory no PSS counts) of the processes `pids`, bytes: the
    PSS sum plus the fd-held shared memory beyond the PSS's own shared-memory part (a
    page of such an object that a process has mapped and touched is in its Pss_Shmem:
    counted once)."""
    pss = shmem = 0
    for pid in pids:
        p, s = _pss(pid)
        pss += p
        shmem += s
    extra = max(0, shm_held(pids) - shmem)
    return pss + extra, extra


class TreeMemory(threading.Thread):
    """Samples the memory of this process tree (tree_memory: PSS + fd-held shared memory)
    until stopped; keeps the peak (`peak`, and `peak_shm`, its shared-memory part, at that
    moment) and the peak PSS alone (`peak_pss`).  Reading smaps_rollup walks the page
    tables (kernel time that grows with the memory mapped), so it samples twice a second
    and keeps its own CPU time (`cpu`, seconds), which measure() takes out of the
    pipeline's CPU.  enabled=False: no sampling (profiling)."""

    def __init__(self, period: float = 0.5, rescan: float = 1.0, enabled: bool = True):
        super().__init__(name="pss-sampler", daemon=True)
        self.period, self.rescan, self.enabled = period, rescan, enabled
        self.peak = self.peak_shm = self.peak_pss = 0
        self.cpu = 0.0
        self.halt = threading.Event()

    def run(self) -> None:
        me = os.getpid()
        t0 = time.thread_time()
        pids, scanned = [me], 0.0
        while self.enabled and not self.halt.is_set():
            now = time.monotonic()
            if now - scanned >= self.rescan:
                pids, scanned = [me] + _descendants(me), now
            total, shm = tree_memory(pids)
            if total > self.peak:
                self.peak, self.peak_shm = total, shm
            self.peak_pss = max(self.peak_pss, total - shm)
            self.cpu = time.thread_time() - t0
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


def _batch_bytes(batch: Any) -> int:
    """Bytes of the batch's arrays (tensors, numpy arrays; lists and scalars not counted)."""
    n = 0
    for v in batch.values() if hasattr(batch, "values") else ():
        nb = getattr(v, "nbytes", None)
        n += int(nb) if isinstance(nb, int) else 0
    return n


def _spread(xs: List[float]) -> Optional[Dict[str, float]]:
    """Median, p90, p99 and largest of `xs` (seconds) in ms; None when empty."""
    if not xs:
        return None
    s = sorted(xs)

    def q(f: float) -> float:
        return 1000.0 * s[min(len(s) - 1, int(f * len(s)))]

    return {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": 1000.0 * s[-1], "n": len(s)}


def _lateness(intervals: List[float], waits: List[float]) -> Dict[str, Any]:
    """Steady-state spread of batch arrivals: the interval between consecutive batches
    (at step 0 the pipeline's production time per batch), the share of intervals over
    1.2x their median (batches a 1.2x trainer step does not hide by itself), and each
    next()'s wait with the share of calls that waited over 1 ms."""
    iv = _spread(intervals)
    slow = None
    if iv:
        med = iv["p50"] / 1000.0
        slow = sum(1 for x in intervals if x > 1.2 * med) / len(intervals)
    return {
        "interval_ms": iv,
        "slow_interval_share": slow,
        "next_wait_ms": _spread(waits),
        "waiting_share": (sum(1 for w in waits if w > 1e-3) / len(waits)) if waits else None,
    }


def _available(mod: Any, cfg: Dict[str, Any]) -> Optional[str]:
    import inspect

    takes_cfg = bool(inspect.signature(mod.available).parameters)
    return mod.available(cfg) if takes_cfg else mod.available()


def _import(cfg: Dict[str, Any]):
    import torch  # noqa: F401  (the trainer's import, for every pipeline alike)

    mod = importlib.import_module(f"benchmarks.pipelines.{cfg['module']}")
    reason = _available(mod, cfg)
    if not reason and hasattr(mod, "preload"):
        mod.preload(cfg)
    return mod, reason


def idle_pss(seconds: float = 1.5) -> float:
    """The baseline of the pipeline's own memory: this process, with the pipeline's imports
    done (and preload) and no pipeline built yet, its peak PSS over `seconds` (MB)."""
    import gc

    gc.collect()
    mem = TreeMemory(period=0.25)
    mem.start()
    time.sleep(seconds)
    return mem.stop() / 2**20


def measure(cfg: Dict[str, Any]) -> Dict[str, Any]:
    mod, reason = _import(cfg)
    if reason:
        return {"skipped": reason}
    idle_mb = idle_pss()
    step = float(cfg.get("step_ms", 0)) / 1000.0
    max_batches = int(cfg.get("batches") or 0)
    min_samples = int(cfg.get("min_samples") or 0)
    min_seconds = float(cfg.get("min_seconds") or 0.0)
    max_seconds = float(cfg.get("max_seconds") or 0.0)  # 0: no cap
    warm_s = min_seconds / 4
    mem = TreeMemory(enabled=cfg.get("pss", True))
    mem.start()

    t0 = time.perf_counter()
    pipe = mod.build(cfg)
    cpu0 = tree_cpu() - mem.cpu
    t_iter = time.perf_counter()
    it = iter(pipe)
    first = next(it)
    t_first = time.perf_counter()
    n_first = _batch_rows(first)
    nbytes = _batch_bytes(first)
    # the largest batch and the largest two in a row: what holding the trainer's batch
    # and the next one costs at the worst moment (the floor of own memory at that depth)
    last_bytes = big = nbytes
    pair = 0
    del first
    arrivals: List[float] = []  # after each next() from the end of the warm-up on
    waits: List[float] = []
    waited = 0.0
    samples = 0
    batches = 1
    exhausted = capped = False
    steady = None  # (batches, faults) at the end of the warm-up
    while True:
        now = time.perf_counter()
        if max_batches:
            if batches >= max_batches:
                break
        elif samples + n_first >= min_samples and now - t_first >= min_seconds:
            break
        elif max_seconds and now - t_first >= max_seconds:
            capped = True
            break
        if steady is None and batches >= 3 and now - t_first >= warm_s:
            steady = (batches, tree_faults(), tree_cpu() - mem.cpu, samples, now, waited)
            if cfg.get("steady_file"):  # tells a profiler attaching now (profile_e2e.py)
                with open(cfg["steady_file"], "w") as f:
                    f.write(str(os.getpid()))
        if step:
            time.sleep(step)
        t = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            exhausted = not max_batches
            break
        t_got = time.perf_counter()
        waited += t_got - t
        if steady is not None:
            arrivals.append(t_got)
            waits.append(t_got - t)
        samples += _batch_rows(batch)
        nb = _batch_bytes(batch)
        nbytes += nb
        big, pair, last_bytes = max(big, nb), max(pair, last_bytes + nb), nb
        batches += 1
        del batch
    t_end = time.perf_counter()
    cpu1 = tree_cpu() - mem.cpu
    faults = steady_cpu = steady_rate = steady_wait = None
    if steady and batches > steady[0]:
        faults = (tree_faults() - steady[1]) / (batches - steady[0])
        steady_cpu = (cpu1 - steady[2]) / (samples - steady[3])
        if batches - steady[0] >= 3:  # a rate over one or two batches is noise
            steady_rate = (samples - steady[3]) / (t_end - steady[4])
            steady_wait = (waited - steady[5]) / (t_end - steady[4])
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
        "samples": total,
        "batches": batches,
        "exhausted": exhausted,
        "capped": capped,
        "samples_per_s": rate,
        "e2e_samples_per_s": total / (t_end - t_iter) if t_end > t_iter else 0.0,
        "ttfb_s": t_first - t0,
        "wait_ratio": waited / wall if wall > 0 else 0.0,
        "cpu_s_per_sample": (cpu1 - cpu0) / total if total else 0.0,
        "steady_cpu_s_per_sample": steady_cpu,
        "steady_samples_per_s": steady_rate,
        "steady_wait_ratio": steady_wait,
        "faults_per_batch": faults,
        "peak_mem_mb": peak_mem / 2**20,
        "shm_mb": mem.peak_shm / 2**20,
        "peak_pss_mb": mem.peak_pss / 2**20,
        "idle_pss_mb": idle_mb,
        "own_mem_mb": peak_mem / 2**20 - idle_mb,
        "own_pss_mb": mem.peak_pss / 2**20 - idle_mb,
        "peak_rss_mb": (me.ru_maxrss + ch.ru_maxrss) / 1024.0,
        "peak_self_rss_mb": me.ru_maxrss / 1024.0,
        "wall_s": wall,
        "step_ms": step * 1000.0,
        "batch_mb": nbytes / batches / 2**20,
        "batch_max_mb": big / 2**20,
        "batch_pair_max_mb": pair / 2**20,
        **_lateness([b - a for a, b in zip(arrivals, arrivals[1:])], waits),
        **extra,
    }


def _numpy(x: Any):
    import numpy as np

    if hasattr(x, "numpy"):
        x = x.numpy()
    return np.asarray(x)


def _compare(ref_batches: List[Dict[str, Any]], pipe: Any, n: int) -> Dict[str, Any]:
    import numpy as np

    out: Dict[str, Any] = {"batches": 0, "samples": 0, "mismatch": []}
    worst = total = 0.0
    count = 0
    for a, b in zip(ref_batches, pipe):
        for key in ("input_ids", "labels", "attention_mask", "image_grid_thw"):
            x, y = _numpy(a[key]), _numpy(b[key])
            if x.shape != y.shape or not np.array_equal(x, y.astype(x.dtype)):
                out["mismatch"].append(f"batch {out['batches']} {key}: {x.shape} vs {y.shape}")
        x, y = _numpy(a["pixel_values"]), _numpy(b["pixel_values"]).astype(np.float32)
        if x.shape != y.shape:
            out["mismatch"].append(f"batch {out['batches']} pixel_values: {x.shape} vs {y.shape}")
        elif x.size:
            d = np.abs(x - y)
            worst = max(worst, float(d.max()))
            total += float(d.sum(dtype=np.float64))
            count += d.size
        out["batches"] += 1
        out["samples"] += int(_numpy(a["input_ids"]).shape[0])
        if out["batches"] >= n:
            break
    out["pixel_max_abs_diff"] = worst
    out["pixel_mean_abs_diff"] = total / count if count else 0.0
    return out


def parity(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """Checks that the reference (naive) pipeline and each of cfg["parity"]'s pipelines do
    the same work: the first `batches` batches, compared key by key (pixels: the largest
    and the mean absolute difference).  Returns {module: result}."""
    import torch  # noqa: F401

    n = int(cfg.get("batches") or 2)
    ref_mod = importlib.import_module("benchmarks.pipelines.naive")
    ref_mod.preload(cfg)
    ref_batches = []
    for b in ref_mod.build(cfg):
        ref_batches.append(b)
        if len(ref_batches) >= n:
            break
    out: Dict[str, Any] = {}
    for other in cfg["parity"]:
        mod = importlib.import_module(f"benchmarks.pipelines.{other}")
        reason = _available(mod, cfg)
        if reason:
            out[other] = {"skipped": reason}
            continue
        try:
            if hasattr(mod, "preload"):
                mod.preload(cfg)
            pipe = mod.parity_build(cfg) if hasattr(mod, "parity_build") else mod.build(cfg)
            try:
                out[other] = _compare(ref_batches, pipe, n)
            finally:
                pipe.close()
        except Exception as e:  # noqa: BLE001 - reported per pipeline
            out[other] = {"error": f"{type(e).__name__}: {e}"}
    return out


def run_subprocess(
    cfg: Dict[str, Any], timeout: float = 600.0, root: Optional[str] = None
) -> Dict[str, Any]:
    """Runs measure(cfg) in a fresh interpreter; returns its figures (or {"error": ...}).
    root: the checkout whose runner and mmloader run (default: this one)."""
    import subprocess

    root = root or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.pipelines.runner", json.dumps(cfg)],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in proc.stdout.splitlines()[::-1]:
        if line.startswith("MMLBENCH "):
            return json.loads(line[len("MMLBENCH ") :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
    return {"error": f"exit {proc.returncode}: " + "\n".join(tail)}


def main(argv: List[str]) -> int:
    cfg = json.loads(argv[1])
    if cfg.get("parity"):
        out = parity(cfg)
    elif cfg.get("decode"):
        from benchmarks.pipelines import decode_only

        out = decode_only.measure(cfg)
    else:
        out = measure(cfg)
    sys.stdout.flush()
    print("MMLBENCH " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
