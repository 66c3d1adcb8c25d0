"""mmloader.ray: producers on a Ray cluster, the in-process stream bitwise.

``mmloader.ray.Loader(data, producers=K, **loader_kwargs)`` starts K producer actors, each
holding an :class:`mmloader.Loader` of this rank's stream, and yields the same batches,
epoch ends and errors, in the same order, as ``mmloader.Loader(data, **loader_kwargs)``
in this process would, with the same ``state_dict()`` / ``load_state_dict()``.  Batch j
is made by producer j mod K; batches travel through Ray's object store as contiguous
NumPy arrays and reach the trainer as read-only views of that memory (no copy when the
object is on the trainer's node, one transfer by Ray's object manager when it is not).

Why the stream is exact, whatever skips or packing do to batch composition:
  A batch is a pure function of the cursor it starts from (the engine's determinism and
  exact-resume guarantees: ``seek(c); next()`` gives the batch an uninterrupted loader at
  cursor c would give).  Every request names its start cursor and every result carries
  it and the cursor after it.  The consumer accepts the result for batch j only when its
  start equals the end of the batch it delivered last; by induction each accepted batch
  equals the in-process one.  Start cursors of batches not yet made are guessed
  (padded mode: micro_batch_size positions per batch, no skips; or the boundaries a
  planner actor finds with a plan_only loader, which packing needs); a wrong guess is
  caught by the check: the speculative requests are cancelled and re-issued from the
  true cursor.  Guesses only decide speed, never content.  Each request also bounds the
  producer's work to the samples its batch is expected to take (the core's seek_ahead),
  so nothing is made only to be dropped.  A producer that dies is restarted by Ray
  (``max_restarts``) and its lost batches are re-requested from their start cursors.
  Batch j is first requested from producer j mod K; a retry may go to another.

Liveness (invariants tests cite):
  1. A thread (_Watch) pings every producer every 0.2 s, whether or not its earlier pings
     were answered, in a concurrency group of its own on the producer, so a busy
     producer answers at once; it only observes.
  2. The trainer's thread (every next(), every 0.1 s while it waits, every stats())
     suspects a producer whose ping failed, or whose oldest ping not followed by any
     answer waited past the deadline (4x the p99 of recent round trips, 0.5-1.5 s) as
     of the watch's last look, or a call to which failed, and moves every request it
     holds not yet here to a producer that answers, on another node, through
     produce_urgent: made next there, before that producer's own queue.
  3. Only the trainer's thread touches the requests in flight; a moved request is the
     same (start cursor) request, so moving never changes the stream.
  4. close() stops and joins the watch and fetch threads (within _JOIN_S); they make no
     Ray call once ray.is_initialized() is false (Ray's API would call ray.init()).

Placement (spread): with at least dp_size data nodes, rank r's producers go only to its
own share of the sorted node list (_spread), which every rank computes alike; fewer
nodes than ranks interleave, with a warning.  Placement never changes the stream.

Ray is an optional dependency: nothing else in mmloader imports it.
"""

from __future__ import annotations

import builtins
import collections
import concurrent.futures
import os
import threading
import time
import warnings
import weakref
from typing import Any, Counter, Deque, Dict, Iterator, List, Optional, Tuple

import numpy as np

from . import __version__, _core, _options
from . import loader as _loader
from ._core import ConfigError, Error, SampleError

try:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import (
        NodeAffinitySchedulingStrategy,
        PlacementGroupSchedulingStrategy,
    )
except ImportError as e:  # pragma: no cover - exercised only without ray
    raise ImportError("mmloader.ray needs Ray: pip install ray") from e

Cursor = Tuple[int, int, int]
PLACEMENTS = ("spread", "pack", "node-local")
# Loader options that belong to the trainer's process, not to a producer.
_REFUSED = {"device": "cpu", "pin_memory": False}
# Failures of the transport (not of the data): the batch is requested again.
_LOST = (
    ray.exceptions.RayActorError,
    ray.exceptions.ObjectLostError,
    ray.exceptions.ActorUnavailableError,
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.NodeDiedError,
)


class _Producer:
    """A Ray actor: one mmloader.Loader of the rank's stream; makes the batch at a cursor."""

    def __init__(self, data: Any, kwargs: Dict[str, Any]) -> None:
        import os

        from .loader import Loader

        ctx = ray.get_runtime_context()
        self._where = {
            "node_id": ctx.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
        }
        self._error: Optional[BaseException] = None
        try:  # a bad configuration is raised by info(), so the trainer sees the Error itself
            self._loader = Loader(data, **kwargs)
            self._c = self._loader._core()
        except Exception as e:  # noqa: BLE001
            self._error = e
        self._batches = 0
        self._busy_s = 0.0
        self._bytes = 0
        self._snap: Dict[str, Any] = dict(
            self._where, batches=0, busy_s=0.0, bytes=0, samples=0, skipped=0
        )
        # one batch at a time; a request moved here from a lost producer goes first
        self._turn = threading.Condition()
        self._making = False
        self._urgent = 0

    def info(self) -> Dict[str, Any]:
        if self._error is not None:
            raise self._error
        L = self._loader
        return dict(
            self._where,
            fingerprint=L._fingerprint,
            num_samples=L.num_samples,
            samples_per_rank=L.samples_per_rank,
            batches_per_epoch=L._batches_per_epoch,
        )

    def check_state(self, state: Dict[str, Any]) -> Cursor:
        """Validates a state_dict exactly as Loader.load_state_dict does; its cursor."""
        self._loader.load_state_dict(state)
        return self._c.cursor()

    def produce(
        self, start: Cursor, ahead: int
    ) -> Tuple[Dict[str, Any], Optional[Dict[str, np.ndarray]]]:
        """A batch asked in turn (the default concurrency group: one at a time, in order)."""
        with self._turn:
            while self._making or self._urgent:
                self._turn.wait()
            self._making = True
        return self._produce_now(start, ahead)

    @ray.method(concurrency_group="urgent")
    def produce_urgent(
        self, start: Cursor, ahead: int
    ) -> Tuple[Dict[str, Any], Optional[Dict[str, np.ndarray]]]:
        """A batch moved here from a producer that was lost: made as soon as the batch
        being made now is done, before this producer's own requests still queued."""
        with self._turn:
            self._urgent += 1
            while self._making:
                self._turn.wait()
            self._urgent -= 1
            self._making = True
        return self._produce_now(start, ahead)

    def _produce_now(
        self, start: Cursor, ahead: int
    ) -> Tuple[Dict[str, Any], Optional[Dict[str, np.ndarray]]]:
        try:
            return self._produce(start, ahead)
        finally:
            with self._turn:
                self._making = False
                self._turn.notify_all()

    def _produce(
        self, start: Cursor, ahead: int
    ) -> Tuple[Dict[str, Any], Optional[Dict[str, np.ndarray]]]:
        """Everything next() yields from cursor `start` up to and including one batch:
        epoch ends, sample errors (on_error="raise"), skip warnings, then the batch.  The
        engine starts no work beyond the `ahead` samples the batch is planned to take
        (plus one per skip), so nothing is made only to be dropped."""
        t0 = time.perf_counter()
        c = self._c
        c.seek(*start, ahead)
        skipped0 = c.stats()["skipped"]
        events: List[Tuple[str, str, str]] = []
        arrays = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            while True:
                try:
                    batch = self._loader._next()
                except StopIteration:
                    events.append(("end", "", ""))
                    continue
                except SampleError as e:  # on_error="raise": one sample; iteration goes on
                    events.append(("error", type(e).__name__, str(e)))
                    continue
                except Exception as e:  # noqa: BLE001 - sticky: the stream stops here
                    events.append(("fatal", type(e).__name__, str(e)))
                    break
                arrays = {k: np.from_dlpack(v) for k, v in batch.items()}
                break
        warns = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        nbytes = sum(a.nbytes for a in arrays.values()) if arrays else 0
        self._batches += arrays is not None
        self._bytes += nbytes
        self._busy_s += time.perf_counter() - t0
        self._snapshot()
        meta = {
            "start": tuple(start),
            "end": tuple(c.cursor()),
            "events": events,
            "warnings": warns,
            "node_id": self._where["node_id"],
            "nbytes": nbytes,
            "skipped": c.stats()["skipped"] - skipped0,
        }
        return meta, arrays  # arrays go to the object store out of band (pickle 5)

    def plan(self, start: Cursor, n: int) -> List[Cursor]:
        """(plan_only loader) The cursors after each of the next n batches from `start`;
        fewer when the stream stops (a fatal error: the producers will report it)."""
        c = self._c
        if tuple(c.cursor()) != tuple(start):
            c.seek(*start)
        out: List[Cursor] = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            while len(out) < n:
                try:
                    self._loader._next()
                except (StopIteration, SampleError):
                    continue
                except Exception:  # noqa: BLE001
                    break
                out.append(c.cursor())
        return out

    def _snapshot(self) -> None:
        s = self._loader.stats()
        self._snap = dict(
            self._where,
            batches=self._batches,
            busy_s=self._busy_s,
            bytes=self._bytes,
            samples=s["samples"],
            skipped=s["skipped"],
        )

    @ray.method(concurrency_group="ping")
    def stats(self) -> Dict[str, Any]:
        """The figures after the last batch made (taken in the producing thread): answers
        at once, like alive(), not after the batches queued here."""
        return dict(self._snap)

    def pid(self) -> int:
        return self._where["pid"]

    @ray.method(concurrency_group="ping")
    def alive(self) -> bool:
        """Answers at once, even while produce() runs (its own thread): the trainer's
        liveness probe for a producer whose batch is late."""
        return True


_FETCHERS: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()
_EXITING = threading.Event()
_ATEXIT = threading.Lock()
_atexit_registered = False


def _register_atexit() -> None:
    """Once, after ray.init (atexit runs handlers last-registered first, so this one runs
    before Ray's shutdown): fetch threads still waiting on Ray stop before Ray goes away."""
    global _atexit_registered
    with _ATEXIT:
        if not _atexit_registered:
            import atexit

            atexit.register(_stop_fetchers)
            _atexit_registered = True


def _connected() -> bool:
    """Ray is initialized in this process.  The watch and fetch threads ask before every
    Ray call: Ray's API calls ray.init() when it is not (with RAY_ADDRESS set, a connection
    to the cluster), so a thread still running after ray.shutdown() must not call it."""
    return ray.is_initialized()


def _join(threads: List[threading.Thread], timeout_s: float) -> List[threading.Thread]:
    """Joins threads within one deadline (never the calling thread); those still alive."""
    deadline = time.monotonic() + timeout_s
    me = threading.current_thread()
    for t in threads:
        if t is not me:
            t.join(max(0.0, deadline - time.monotonic()))
    return [t for t in threads if t is not me and t.is_alive()]


def _stop_fetchers(timeout_s: float = 2.0) -> None:
    _EXITING.set()
    deadline = time.monotonic() + timeout_s
    for t in list(_FETCHERS):
        t.join(max(0.0, deadline - time.monotonic()))


# Liveness: every producer is pinged every _PING_EVERY_S (the ping runs in a thread of its
# own on the producer, so a busy producer answers at once), whether or not its earlier
# pings were answered (up to _PINGS_MAX each).  A producer is suspect when its ping
# fails, or when its oldest ping not followed by any answer has waited past the deadline
# (a multiple of the p99 of recent round trips, within _DEADLINE_S unless
# producer_timeout_s fixes it), as of the last time the watch thread looked.
_PING_EVERY_S = 0.2
_PINGS_MAX = 16  # unanswered pings per producer (3.2 s of them)
_FETCH_POLL_S = 0.25  # a fetch thread's wait for its batch to be made, between checks
_JOIN_S = 1.0  # close() waits this long, in all, for the watch and fetch threads
_DEADLINE_S = (0.5, 1.5)  # floor, ceiling
_DEADLINE_RTT_P99 = 4.0


class _Watch:
    """A thread that pings the producers: round trips, the time of each one's oldest ping
    not followed by an answer, the time of its last answer.  It only observes; the
    trainer's thread decides (Loader._sweep), so the requests in flight are touched by one
    thread only.

    Why a healthy producer was suspected (12-23 times per run on the emulated cluster's
    full links): one ping at a time, so a ping whose packet the full link dropped waited
    for TCP's retransmission timeout (0.2 s, doubling) with nothing behind it to hasten
    the retransmission; pings were taken only when all of them were answered or at the
    next tick (up to 0.2 s late, and each round trip the slowest producer's); and the
    deadline ran on while this thread was not scheduled at all (a loaded machine).  Now
    a ping goes every tick regardless (a later one on the same connection recovers a lost
    one, and any answer proves the producer alive), each answer is taken when it comes,
    and lateness counts only up to the last time this thread looked."""

    def __init__(self, actors: List[Any], fixed_s: Optional[float], stop: threading.Event) -> None:
        self._actors = list(actors)
        n = len(self._actors)
        self._fixed = fixed_s
        self._rtts: Deque[float] = collections.deque(maxlen=64)
        self.rtt_log: Deque[float] = collections.deque(maxlen=4096)  # for stats()
        self.sent: List[Optional[float]] = [None] * n  # the oldest ping not followed by an answer
        self.answered = [0.0] * n  # when a ping was last answered
        self.failed = [False] * n  # the last ping raised (Ray: actor unavailable, died)
        self.looked = time.monotonic()  # when this thread last took answers
        self._stop = stop  # set by close() or the loader's finalizer
        self.thread = threading.Thread(target=self._run, name="mmloader-ray-watch", daemon=True)
        _FETCHERS.add(self.thread)
        self.thread.start()

    def deadline(self) -> float:
        if self._fixed is not None:
            return self._fixed
        rtts = list(self._rtts)
        if len(rtts) < 8:
            return _DEADLINE_S[1]
        return min(_DEADLINE_S[1], max(_DEADLINE_S[0], _DEADLINE_RTT_P99 * _pct(rtts, 0.99)))

    def late(self, p: int, now: float) -> bool:
        """Producer p's ping failed, or its oldest ping not followed by an answer had waited
        past the deadline when this thread last looked (a thread not scheduled for a while
        on a loaded machine does not make every producer late)."""
        sent = self.sent[p]
        return self.failed[p] or (
            sent is not None and min(now, self.looked) - sent > self.deadline()
        )

    def _run(self) -> None:
        n = len(self._actors)
        pending: Dict[Any, Tuple[int, float]] = {}  # ping -> (producer, when sent)
        mine: List[Deque[Any]] = [collections.deque() for _ in range(n)]  # oldest first
        tick = 0.0
        try:
            while not self._stop.is_set() and not _EXITING.is_set() and _connected():
                now = time.monotonic()
                if now >= tick:
                    for p, a in enumerate(self._actors):
                        if len(mine[p]) < _PINGS_MAX:
                            ref = a.alive.remote()
                            pending[ref] = (p, now)
                            mine[p].append(ref)
                            if self.sent[p] is None:
                                self.sent[p] = now
                    tick = now + _PING_EVERY_S
                left = max(0.01, tick - time.monotonic())
                if not pending:  # (ray.wait([]) returns at once: it would spin here)
                    self._stop.wait(left)
                    continue
                refs = list(pending)
                done, _ = ray.wait(refs, num_returns=1, timeout=left)
                if done:  # and every other answer already here
                    done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                t = time.monotonic()
                if self._stop.is_set() or not _connected():
                    break  # closed (or Ray shut down) while it waited: no more Ray calls
                for ref in done:
                    self._answer(ref, pending, mine, t)
                self.looked = t
        except Exception:  # noqa: BLE001 - Ray shut down under us: nothing left to watch
            pass

    def _answer(
        self, ref: Any, pending: Dict[Any, Tuple[int, float]], mine: List[Deque[Any]], t: float
    ) -> None:
        if ref not in pending:
            return  # an older ping, forgotten when a later one was answered
        p, sent = pending.pop(ref)
        try:
            ray.get(ref)
        except Exception:  # noqa: BLE001 - down (restarting, or its node died)
            self.failed[p] = True
            mine[p].remove(ref)
        else:
            self.failed[p] = False
            self.answered[p] = t
            self._rtts.append(t - sent)
            self.rtt_log.append(t - sent)
            while mine[p]:  # pings older than this one: it is alive, forget them
                old = mine[p].popleft()
                if old is ref:
                    break
                pending.pop(old, None)
        self.sent[p] = pending[mine[p][0]][1] if mine[p] else None


class _Request:
    """One batch asked of one producer; a thread of its own fetches the result to this
    node as soon as the producer has made it, so several batches cross the link at once."""

    __slots__ = (
        "start", "producer", "ref", "attempts", "future", "dropped", "_made", "_stop",
        "t_submit", "t_made", "t_got",
    )  # fmt: skip

    def __init__(
        self,
        start: Cursor,
        producer: int,
        ref: Any,
        stop: threading.Event,
        threads: "weakref.WeakSet[threading.Thread]",
    ) -> None:
        self.start, self.producer, self.ref, self.attempts = start, producer, ref, 0
        self._stop = stop  # the loader's: set by close() or its finalizer
        self.dropped = False
        self._made = False
        # when it was asked, made (the producer answered), and here (fetched to this node)
        self.t_submit = time.monotonic()
        self.t_made: Optional[float] = None
        self.t_got: Optional[float] = None
        self.future: "concurrent.futures.Future[Any]" = concurrent.futures.Future()
        t = threading.Thread(target=self._fetch, name="mmloader-ray-fetch", daemon=True)
        _FETCHERS.add(t)
        threads.add(t)
        t.start()

    def _gone(self) -> bool:
        """Nothing more to fetch: dropped, the loader closed, the process exiting, or Ray
        shut down (a Ray call would then start or connect to a cluster)."""
        return self.dropped or self._stop.is_set() or _EXITING.is_set() or not _connected()

    def _fetch(self) -> None:
        try:
            while not self._gone():
                # made yet? (no transfer while it may still be dropped); wakes every
                # _FETCH_POLL_S so close() can join it within about a second
                done, _ = ray.wait([self.ref], timeout=_FETCH_POLL_S, fetch_local=False)
                if done:
                    self.t_made = time.monotonic()
                    self._made = True
                    break
            if self._gone():
                self.future.cancel()
                return
            result = ray.get(self.ref)
            self.t_got = time.monotonic()
            self.future.set_result(result)
        except BaseException as e:  # noqa: BLE001 - raised in the trainer's thread
            self.t_got = time.monotonic()
            self.future.set_exception(e)

    def made(self) -> bool:
        """The producer has answered (a batch or an error)."""
        return self._made or self.future.done()


class Loader:
    """The stream of :class:`mmloader.Loader` for one data-parallel rank, made by Ray actors.

    Args:
        data: as for :class:`mmloader.Loader`; every producer's node must reach it (a
            shared file system, ``http(s)://`` or ``s3://``).
        producers: producer actors (K); batch j is made by producer j mod K.
        placement: "spread" (default: a SPREAD placement group, producers on different
            nodes as far as the cluster allows), "pack" (a PACK placement group: as few
            nodes as possible) or "node-local" (the node of this process).
        producer_resources: Ray resources of each producer, default ``{"CPU": 1}``; add a
            custom resource (e.g. ``{"CPU": 4, "data_node": 1}``) to use only nodes that
            advertise it.  ``num_threads`` defaults to the producer's CPUs.
        refs_in_flight: batches requested ahead of the trainer (default 2 * producers).
        zero_copy: True: batches are read-only NumPy views of object-store memory (a
            view keeps its object alive; memory is released when the batch is dropped);
            False: each array is copied out and the object released at once.
        as_torch: yield torch tensors (views of the same memory) instead of NumPy arrays.
        max_restarts: how often Ray restarts a producer that died.
        producer_timeout_s: how long a producer's ping may go unanswered before its
            requests move to others (its node or process died, or it is stuck).  None
            (default): adaptive, 4x the p99 of recent ping round trips, within 0.4-1.5 s;
            the watch pings every producer every 0.2 s, whether or not the trainer waits.
        placement_timeout_s: how long to wait for the cluster to place the producers.
        planner: run one more actor with ``plan_only=True`` that walks the stream ahead
            (records, image headers, tokens; no decoding) and gives each batch's exact
            boundaries; default: on with ``packing=True`` (required there), off in padded
            mode, where a batch is guessed to take micro_batch_size samples (turn it on
            for data with many skips).
        **loader_kwargs: :class:`mmloader.Loader` arguments (the stream's definition:
            batch size, seed, dp_rank/dp_size, ...).  ``tokenizer`` must be a path or a name (``"tiny"``).
            ``device`` and ``pin_memory`` are refused (move the views with ``.cuda()``).
    """

    def __init__(
        self,
        data: Any,
        *,
        producers: int = 2,
        placement: str = "spread",
        producer_resources: Optional[Dict[str, float]] = None,
        refs_in_flight: Optional[int] = None,
        zero_copy: bool = True,
        as_torch: bool = False,
        max_restarts: int = 3,
        placement_timeout_s: float = 120.0,
        planner: Optional[bool] = None,
        producer_timeout_s: Optional[float] = None,
        **loader_kwargs: Any,
    ) -> None:
        self._actors: List[Any] = []
        self._last_stats: Dict[int, Dict[str, Any]] = {}  # per producer: its last answer
        self._planner: Any = None
        self._pg = None
        self._inflight: Deque[_Request] = collections.deque()
        self._ready: Deque[Tuple[str, Any]] = collections.deque()
        # set by close() or the finalizer: the watch and fetch threads make no more Ray calls
        self._watch_stop = threading.Event()
        self._threads: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()  # fetchers
        if isinstance(producers, bool) or not isinstance(producers, int) or producers < 1:
            raise ConfigError(f"producers must be an integer >= 1, got {producers!r}")
        if placement not in PLACEMENTS:
            raise ConfigError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        if refs_in_flight is None:
            refs_in_flight = 2 * producers
        if (
            isinstance(refs_in_flight, bool)
            or not isinstance(refs_in_flight, int)
            or refs_in_flight < 1
        ):
            raise ConfigError(f"refs_in_flight must be an integer >= 1, got {refs_in_flight!r}")
        res = dict(producer_resources or {"CPU": 1})
        cpus = res.pop("CPU", 1)
        if not isinstance(cpus, (int, float)) or cpus < 0:
            raise ConfigError(f"producer_resources['CPU'] must be a number >= 0, got {cpus!r}")
        for k, v in _REFUSED.items():
            if loader_kwargs.get(k, v) != v:
                raise ConfigError(
                    f"mmloader.ray.Loader: {k}={loader_kwargs[k]!r} is not "
                    "supported; batches are host arrays (move them to the GPU "
                    "in the trainer)"
                )
        if "plan_only" in loader_kwargs:
            raise ConfigError("mmloader.ray.Loader: plan_only is not a stream option")
        if any(k in loader_kwargs for k in _options.REMOVED_PIXEL_OPTIONS):
            raise _options.removed_pixel_option_error(loader_kwargs)
        if str(loader_kwargs.get("pixel_format", "")).endswith("-consumer"):
            raise ConfigError(
                f"mmloader.ray.Loader: pixel_format={loader_kwargs['pixel_format']!r} is not "
                "supported; batches are the producers' host arrays (pixel_format 'uint8' and "
                "mmloader.torch.expand_pixels in the trainer ship the same uint8 patches)"
            )
        # this process's data-parallel rank (the producers run elsewhere, outside its group)
        loader_kwargs["dp_rank"], loader_kwargs["dp_size"] = _loader.resolve_dp(
            loader_kwargs.get("dp_rank"), loader_kwargs.get("dp_size")
        )
        self._packing = bool(loader_kwargs.get("packing", False))
        if planner is None:
            planner = self._packing
        if self._packing and not planner:
            raise ConfigError(
                "mmloader.ray.Loader: packing=True needs planner=True (pack "
                "boundaries depend on every earlier sample's length; without "
                "a plan the producers could only make one batch at a time)"
            )
        tok = loader_kwargs.get("tokenizer")
        if tok is not None and not isinstance(tok, (str, bytes)) and not hasattr(tok, "__fspath__"):
            raise ConfigError(
                "mmloader.ray.Loader: tokenizer must be a path or a name such as "
                "'tiny' (each producer loads it on its own node)"
            )
        plan = [
            k
            for k in ("global_plan", "max_tokens_per_batch", "balance", "group_by_length")
            if loader_kwargs.get(k) not in (None, False, 0, "none")
        ]
        if plan:
            raise ConfigError(
                f"mmloader.ray.Loader: {plan[0]} (the global plan) is not "
                "supported by Ray producers yet; use mmloader.Loader per rank"
            )
        kwargs = dict(loader_kwargs)
        kwargs.setdefault("num_threads", max(1, int(cpus)))
        kwargs["prefetch"] = 1  # a producer makes one batch per request
        # each request seeks (with its bound): work started at construction would be dropped
        kwargs["start"] = "next"
        self._max_error_rate = float(kwargs.get("max_error_rate", 0.1))
        kwargs["max_error_rate"] = 1.0  # judged here, over the stream the trainer sees
        self._mbs = int(kwargs.get("micro_batch_size") or 8)
        self._cycle = bool(kwargs.get("cycle", False))
        self._zero_copy = bool(zero_copy)
        self._as_torch = bool(as_torch)
        self._inflight_max = refs_in_flight
        if not ray.is_initialized():
            ray.init()
        _register_atexit()
        self._node = ray.get_runtime_context().get_node_id()
        if producer_timeout_s is not None and (
            isinstance(producer_timeout_s, bool)
            or not isinstance(producer_timeout_s, (int, float))
            or not producer_timeout_s > 0
        ):
            raise ConfigError(
                f"producer_timeout_s must be None (adaptive) or > 0, got {producer_timeout_s!r}"
            )
        self._producer_timeout_s = producer_timeout_s
        data = _absolute_data(data)
        kwargs = _absolute_paths(kwargs)

        opts: Dict[str, Any] = dict(
            num_cpus=cpus,
            resources=res or None,
            max_restarts=max_restarts,
            max_task_retries=0,
        )
        bundle = dict(res, CPU=cpus) if cpus else dict(res)
        n_actors = producers + (1 if planner else 0)
        nodes = _alive_nodes()
        self._node_ip = {n["NodeID"]: n["NodeManagerAddress"] for n in nodes}
        targets: List[Optional[str]] = []  # the node each actor is meant for (None: Ray's choice)
        # how the producers were placed (stats()["placement"])
        self._placement: Dict[str, Any] = dict(placement=placement, mode=placement, note=None)
        strategies: List[Any]
        if placement == "node-local":
            here = [n for n in nodes if n["NodeID"] == self._node]
            have = here[0]["Resources"] if here else {}
            if _slots(have, bundle, n_actors) < n_actors:
                raise ConfigError(
                    f"placement='node-local': this node ({self._node_ip.get(self._node, '?')}) "
                    f"has {_fmt_res(have)}, and {n_actors} actors need {bundle} each; give "
                    "the node resources (ray start --num-cpus=N), lower producer_resources "
                    "(e.g. {'CPU': 0}) or use placement='spread'"
                )
            strategies = [NodeAffinitySchedulingStrategy(self._node, soft=False)] * n_actors
            targets = [self._node] * n_actors
        elif placement == "spread":
            rank = int(loader_kwargs.get("dp_rank") or 0)
            size = int(loader_kwargs.get("dp_size") or 1)
            fit = _feasible_nodes(bundle, n_actors, placement_timeout_s)
            chosen, how = _spread(fit, self._node, bundle, n_actors, rank, size)
            self._placement.update(how)
            if how["mode"] == "interleaved" and size > 1:
                warnings.warn(
                    f"mmloader.ray.Loader(placement='spread'): {how['note']}, so every rank "
                    "uses every data node (interleaved) and a data node's link may carry "
                    "batches to several trainers at once; with at least dp_size data nodes "
                    "that hold a rank's producers, each rank gets data nodes of its own",
                    UserWarning,
                    stacklevel=2,
                )
            # soft: Ray restarts a producer elsewhere when its node dies
            strategies = [NodeAffinitySchedulingStrategy(t, soft=True) for t in chosen]
            targets = list(chosen)
        else:
            _feasible_nodes(bundle, n_actors, placement_timeout_s)
            self._pg = placement_group([dict(bundle) for _ in range(n_actors)], strategy="PACK")
            try:
                ray.get(self._pg.ready(), timeout=placement_timeout_s)
            except ray.exceptions.GetTimeoutError:
                self.close()
                raise ConfigError(
                    f"cannot place {n_actors} actors with {bundle} each within "
                    f"{placement_timeout_s:g} s (the cluster could hold them, but other work "
                    f"holds the resources; free: {ray.available_resources()})"
                ) from None
            strategies = [
                PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=i)
                for i in range(n_actors)
            ]
            table = ray.util.placement_group_table(self._pg).get("bundles_to_node_id", {})
            targets = [table.get(i) for i in range(n_actors)]
        cls = ray.remote(concurrency_groups={"ping": 1, "urgent": 1})(_Producer)  # type: ignore[call-overload]
        self._actors = [
            cls.options(scheduling_strategy=st, **opts).remote(data, kwargs)
            for st in strategies[:producers]
        ]
        if planner:  # one more actor: a plan_only loader walks the stream ahead
            self._planner = cls.options(scheduling_strategy=strategies[producers], **opts).remote(
                data, dict(kwargs, plan_only=True)
            )
        self._finalizer = weakref.finalize(
            self, _shutdown, self._all_actors(), self._pg, self._watch_stop
        )
        infos = self._start(targets, placement_timeout_s)
        info = infos[0]
        self.num_samples: int = info["num_samples"]
        self.samples_per_rank: int = info["samples_per_rank"]
        self._per_epoch: int = info["batches_per_epoch"]
        self._fingerprint: Dict[str, Any] = info["fingerprint"]

        # consumer state: the verified end of the stream delivered so far
        self._cursor: Cursor = (0, 0, 0)  # after what next() delivered (the state)
        self._head: Cursor = (0, 0, 0)  # after what is verified and queued in _ready
        self._next_producer = 0
        self._fatal: Optional[BaseException] = None
        self._samples = self._skipped = 0
        self._t_first: Optional[float] = None
        self._wait_s = 0.0
        self._n: Counter[str] = (
            collections.Counter()
        )  # batches, bytes, copied, transferred, replans, lost
        self._per_producer: List[Counter[str]] = [collections.Counter() for _ in self._actors]
        # the planner's chain: start cursor -> cursor after that batch
        self._planned: Dict[Cursor, Cursor] = {}
        self._plan_tail: Optional[Cursor] = (0, 0, 0) if self._planner else None
        self._plan_ref = None
        self._plan_chunk = max(16, 4 * refs_in_flight)
        # liveness: producers that missed a ping while the trainer waited (index -> when)
        self._actor_node: List[Optional[str]] = [i["node_id"] for i in infos[: len(self._actors)]]
        self._suspect: Dict[int, float] = {}
        self._watch = _Watch(self._actors, self._producer_timeout_s, self._watch_stop)
        self._max_attempts = 2 * len(self._actors) + 8  # per batch, before it is an Error
        # where the time goes: requests taken, and the trainer's waits (stats()["fetch"])
        self._history: Deque[_Times] = collections.deque(maxlen=1024)
        self._waits: Deque[Tuple[float, float]] = collections.deque(maxlen=1024)

    def _start(self, targets: List[Optional[str]], timeout_s: float) -> List[Dict[str, Any]]:
        """Waits for every actor's info(); a failure names the node and what to do."""
        actors = self._all_actors()
        refs = [a.info.remote() for a in actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if len(ready) < len(refs):
            pending = [self._where(targets[i]) for i, r in enumerate(refs) if r not in ready]
            self.close()
            raise ConfigError(
                f"{len(pending)} of {len(refs)} producers did not start within {timeout_s:g} s "
                f"(meant for {', '.join(pending)}; free: {ray.available_resources()})"
            )
        infos = []
        for i, ref in enumerate(refs):
            try:
                infos.append(ray.get(ref))
            except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
                self.close()
                raise _start_error(e, self._where(targets[i])) from None
        fps = {repr(sorted(i["fingerprint"].items())) for i in infos}
        if len(fps) != 1:
            self.close()
            raise ConfigError(
                "producers on different nodes see different data or settings: "
                + "; ".join(f"{i['node_ip']}: {i['fingerprint']}" for i in infos)
            )
        return infos

    def _where(self, node_id: Optional[str]) -> str:
        if node_id is None:
            return "a node Ray chose"
        return f"node {self._node_ip.get(node_id, '?')} (Ray node {node_id[:12]})"

    def _all_actors(self) -> List[Any]:
        return self._actors + ([self._planner] if self._planner is not None else [])

    # ---- requests ----------------------------------------------------------------------
    def _normalize(self, c: Cursor) -> Cursor:
        """Where the engine starts for cursor c: an epoch that is complete starts the next."""
        e, p, b = c
        done = b >= self._per_epoch if self._per_epoch >= 0 else p >= self.samples_per_rank
        return (e + 1, 0, 0) if done else c

    def _guess_after(self, start: Cursor) -> Optional[Cursor]:
        """The cursor after the batch at `start`: the planner's, or (padded, no planner)
        the one without skips; None when not known yet."""
        if self._planner is not None:
            return self._planned.get(start)
        e, p, b = self._normalize(start)
        return (e, p + self._mbs, b + 1)

    def _ahead(self, start: Cursor) -> int:
        """Samples the batch at `start` is expected to take (the producer starts no more,
        plus one per skip); 0: unknown, no bound."""
        end = self._guess_after(start)
        if end is None:
            return 0
        e, p, _ = self._normalize(start)
        if end[0] != e:
            return 0
        n = end[1] - p
        if self._packing and end[1] < self.samples_per_rank:
            n += 1  # the sample that did not fit closes the pack
        return max(1, n)

    def _submit(self, start: Cursor, producer: Optional[int] = None) -> _Request:
        """Asks for the batch at `start`: of the next producer in turn, or (a request moved
        from a lost producer) of `producer`, ahead of the requests queued there."""
        if producer is None:
            producer = self._next_producer
            self._next_producer = (producer + 1) % len(self._actors)
            if producer in self._suspect:
                producer = self._stand_in(producer)
            ref = self._actors[producer].produce.remote(start, self._ahead(start))
        else:
            ref = self._actors[producer].produce_urgent.remote(start, self._ahead(start))
        return _Request(start, producer, ref, self._watch_stop, self._threads)

    def _stand_in(self, p: int) -> int:
        """A producer to ask instead of suspect producer p: one that answers, on another
        node than any suspect when there is one, with the fewest requests in flight."""
        ok = [i for i in range(len(self._actors)) if i not in self._suspect]
        if not ok:
            return p
        bad = {self._actor_node[i] for i in self._suspect}
        # requests not yet made: a stand-in makes them, in order, before the moved one
        load = collections.Counter(r.producer for r in self._inflight if not r.made())
        return min(
            ok, key=lambda i: (self._actor_node[i] in bad, load[i], (i - p) % len(self._actors))
        )

    def _sweep(self) -> None:
        """Acts on what the watch thread saw, in the trainer's thread, for every request in
        flight (not only the one next() waits for): a producer whose ping is late past the
        deadline or failed, or a call to which failed (Ray's actor-unavailable or
        object-lost errors), is suspect: its requests not yet answered go at once to
        producers that answer, on other nodes, ahead of their own queue, without waiting
        for Ray's failure detection (node heartbeats: 15 s and more).  A suspect that
        answers a ping again (Ray restarted it, or it was only slow) gets requests again."""
        now = time.monotonic()
        w = self._watch
        new = False
        for p in range(len(self._actors)):
            if p in self._suspect:
                if w.answered[p] > self._suspect[p] and not w.late(p, now):
                    del self._suspect[p]
            elif w.late(p, now):
                self._suspect[p] = now
                self._n["suspected"] += 1
                new = True
        for r in self._inflight:
            if r.producer not in self._suspect and _failed(r):
                self._suspect[r.producer] = now
                self._n["suspected"] += 1
                new = True
        if new:
            self._reroute()

    def _reroute(self) -> None:
        """Moves every request of a suspect producer not yet here (or whose call failed)
        to a stand-in, a batch already made too: its only copy is in the suspect's node's
        object store, and when that node died the fetch waits for Ray to call the object
        lost (4.6 and 10.6 s in the emulated kill, against 3 s asked).  A producer that
        was only slow then sends that batch a second time (its fetch is dropped); with the
        watch's many pings a live producer is not suspected on a full link (0 per run
        measured, 12-23 before), so that cost is rare."""
        if not self._suspect:
            return
        for i, r in enumerate(self._inflight):
            if r.producer in self._suspect and (not r.future.done() or _failed(r)):
                if _failed(r) and r.attempts >= self._max_attempts:
                    continue  # _take raises it when it is the head
                r.dropped = True
                nr = self._submit(r.start, self._stand_in(r.producer))
                nr.attempts = r.attempts + _failed(r)
                self._inflight[i] = nr
                self._n["rerouted"] += 1

    def _replan(self) -> None:
        """The stream left the planned chain (a seek, or an image that failed only when
        decoded): plan again from the head."""
        if self._planner is None:
            return
        self._planned.clear()
        self._plan_ref = None  # a result still coming is for the old chain: dropped
        self._plan_tail = self._head

    def _plan(self, block: bool) -> None:
        """Takes the planner's result when there is one and keeps it planning ahead."""
        if self._planner is None:
            return
        if self._plan_ref is not None:
            ready, _ = ray.wait([self._plan_ref], timeout=None if block else 0)
            if ready:
                try:
                    chain = ray.get(self._plan_ref)
                except _LOST:
                    chain = []
                start = self._plan_tail
                for end in chain:
                    self._planned[start] = tuple(end)
                    start = tuple(end)
                self._plan_tail = start if chain else None
                self._plan_ref = None
        # forget what lies behind the head; plan more while fewer batches are planned
        # than requests can use
        for k in [k for k in self._planned if k < self._head]:
            del self._planned[k]
        if (
            self._plan_ref is None
            and self._plan_tail is not None
            and len(self._planned) < 2 * self._inflight_max + self._plan_chunk // 2
        ):
            self._plan_ref = self._planner.plan.remote(self._plan_tail, self._plan_chunk)

    def _fill(self) -> None:
        self._sweep()
        self._plan(block=False)
        if (
            self._planner is not None
            and not self._inflight
            and self._head not in self._planned
            and self._plan_ref is not None
        ):
            self._plan(block=True)  # the head batch's size is about to be known
        while len(self._inflight) < self._inflight_max:
            if self._inflight:
                start = self._guess_after(self._inflight[-1].start)
                if start is None:
                    break
            else:
                start = self._head
            self._inflight.append(self._submit(start))

    def _cancel(self) -> None:
        """Drops every request in flight (queued ones are cancelled, running ones finish
        and their results are neither fetched nor used)."""
        for r in self._inflight:
            r.dropped = True
            try:
                ray.cancel(r.ref)
            except Exception:  # noqa: BLE001 - already running or done
                pass
        self._inflight.clear()

    def _take(self) -> None:
        """Gets the oldest request's result, checks it continues the stream, and queues
        its events and batch in `_ready` (or re-issues it)."""
        self._fill()
        t0 = time.perf_counter()
        m0 = time.monotonic()
        try:
            while True:
                r = self._inflight[0]
                try:
                    meta, arrays = r.future.result(timeout=_PING_EVERY_S / 2)
                    break
                except concurrent.futures.TimeoutError:
                    self._sweep()  # a producer lost meanwhile? (re-issues its requests)
        except _LOST as e:
            self._n["lost"] += 1
            self._per_producer[r.producer]["lost"] += 1
            r.attempts += 1
            if r.attempts > self._max_attempts:
                raise Error(
                    f"mmloader.ray: batch at cursor {r.start} could not be made: "
                    f"{type(e).__name__}: {e}"
                ) from None
            # a call that failed is evidence enough (its node or process died, Ray may be
            # restarting it): the producer is suspect at once, its other requests move too,
            # and it gets requests again once it answers a ping (_sweep)
            if r.producer not in self._suspect:
                self._suspect[r.producer] = time.monotonic()
                self._n["suspected"] += 1
                self._reroute()
            alive = self._stand_in(r.producer)
            if alive == r.producer and r.attempts > 2:  # no stand-in: try the others in turn
                alive = (r.producer + r.attempts) % len(self._actors)
            nr = self._submit(r.start, alive)
            nr.attempts = r.attempts
            self._inflight[0] = nr
            return
        finally:
            self._wait_s += time.perf_counter() - t0
            self._waits.append((m0, time.monotonic()))
        self._inflight.popleft()
        # its times only: the request itself holds the batch (object-store memory)
        self._history.append((r.producer, r.t_submit, r.t_made, r.t_got))
        if tuple(meta["start"]) != self._head:  # the head request always starts at _head
            raise Error(
                f"mmloader.ray: internal error, batch from {meta['start']} "
                f"after cursor {self._head}"
            )
        self._actor_node[r.producer] = meta["node_id"]  # Ray may have moved it
        self._accept(meta, arrays, r.producer)
        self._head = tuple(meta["end"])
        if self._inflight and self._inflight[0].start != self._head:
            self._n["replans"] += 1  # a skip moved the stream: guesses are wrong from here
            self._cancel()
            if self._head not in self._planned:
                self._replan()

    def _accept(
        self, meta: Dict[str, Any], arrays: Optional[Dict[str, np.ndarray]], producer: int
    ) -> None:
        for w in meta["warnings"]:
            self._ready.append(("warn", w))
        e, p, b = self._normalize(meta["start"])
        for kind, name, msg in meta["events"]:
            if kind == "end":
                self._ready.append(("end", (e, 0, 0)))
            elif kind == "error":
                self._ready.append(("error", _exception(name, msg)))
            else:
                self._ready.append(("fatal", _exception(name, msg)))
        if arrays is None:
            return
        end = tuple(meta["end"])
        # samples the batch consumed, for max_error_rate over the delivered stream
        self._samples += end[1] - p
        self._skipped += meta["skipped"]
        nbytes = meta["nbytes"]
        pp = self._per_producer[producer]
        pp["batches"] += 1
        pp["bytes"] += nbytes
        self._n["received"] += 1
        self._n["bytes"] += nbytes
        if meta["node_id"] != self._node:
            self._n["transferred"] += nbytes
        if self._zero_copy:
            out = arrays
        else:
            out = {k: np.array(v, copy=True) for k, v in arrays.items()}
            self._n["copied"] += nbytes
        if self._as_torch:
            out = _to_torch(out)
        if self._samples >= 100 and self._skipped > self._max_error_rate * self._samples:
            self._ready.append(
                (
                    "fatal",
                    Error(
                        f"{self._skipped} of {self._samples} samples failed, above "
                        f"max_error_rate={self._max_error_rate:g} (judged per batch)"
                    ),
                )
            )
        else:
            self._ready.append(("batch", (out, end)))

    # ---- iteration ---------------------------------------------------------------------
    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return self

    def __next__(self) -> Dict[str, Any]:
        """The next batch; StopIteration once at the end of each epoch (unless cycle)."""
        self._check_open()
        if self._t_first is None:
            self._t_first = time.perf_counter()
        while True:
            if self._fatal is not None:
                raise self._fatal
            while not self._ready:
                self._take()
            kind, val = self._ready.popleft()
            if kind == "warn":
                warnings.warn(val, UserWarning, stacklevel=2)
            elif kind == "end":
                self._cursor = val
                if not self._cycle:
                    raise StopIteration
            elif kind == "error":
                raise val
            elif kind == "fatal":
                self._fatal = val
                self._cancel()
                self._ready.clear()
            else:
                batch, self._cursor = val
                self._n["batches"] += 1
                self._fill()
                return batch

    def __len__(self) -> int:
        """Batches per epoch (padded mode; packed batch counts depend on the data)."""
        if self._packing:
            raise TypeError(
                "len() is undefined with packing=True (packs per epoch depend on sample lengths)"
            )
        return self._per_epoch

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch `epoch` from its beginning."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"epoch must be an integer >= 0, got {epoch!r}")
        if self._cursor != (epoch, 0, 0):
            self._seek((epoch, 0, 0))

    @property
    def epoch(self) -> int:
        return self._cursor[0]

    def _seek(self, c: Cursor) -> None:
        self._cancel()
        self._ready.clear()
        self._fatal = None
        self._cursor = self._head = c
        self._replan()

    # ---- state -------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """Where the trainer stands (what it received): the same dict mmloader.Loader gives."""
        self._check_open()
        e, p, b = self._cursor
        return {
            "version": 1,
            "epoch": e,
            "pos": p,
            "batch_in_epoch": b,
            "fingerprint": dict(self._fingerprint),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues exactly after the batch the state was taken at (mmloader.Loader's or
        this class's state; validated by a producer with mmloader.Loader's own checks)."""
        self._check_open()
        try:
            c = ray.get(self._actors[0].check_state.remote(state))
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, Error):
                raise type(cause)(str(cause)) from None
            raise
        self._seek(tuple(c))

    save_state = state_dict
    restore_state = load_state_dict

    # ---- observability and lifetime ----------------------------------------------------
    def stats(self) -> Dict[str, Any]:
        """Transport and per-producer statistics.

        wait_time_ratio (time blocked in next / wall time since the first next), batches,
        bytes (batch bytes received), bytes_copied (copied on this node: 0 with zero_copy),
        bytes_transferred (batches made on other nodes: moved once by Ray's object
        manager), replans (speculative requests re-issued after a skip moved the stream),
        lost (requests re-issued after a producer or its object was lost), rerouted
        (requests moved to another producer because theirs missed a ping while the trainer
        waited), suspected (such missed pings), ping_rtt_s (the watch's ping round trips:
        pings, p50, p99, max, over_floor: slower than the adaptive deadline's floor), placement
        (mode "disjoint": this rank's data nodes are its own; "interleaved": shared with
        other ranks, note says why; data_nodes: their addresses), and
        ``producers`` / ``nodes``: node, batches, bytes and busy time of each producer and
        each node, with batches_per_s over the wall time.  A producer that Ray is
        restarting (or has lost) does not answer: it shows its last figures (none before
        its first answer) with ``available`` False.
        """
        self._check_open()
        self._sweep()  # what the watch saw: suspects and moved requests count from now
        wall = time.perf_counter() - self._t_first if self._t_first else 0.0
        n = max(1, self._n["batches"])
        remote = self._producer_stats()
        prods: List[Dict[str, Any]] = []
        nodes: Dict[str, Dict[str, Any]] = {}
        for i, (pp, rs) in enumerate(zip(self._per_producer, remote)):
            prods.append(
                {
                    "index": i,
                    "available": rs["available"],
                    "node_id": rs["node_id"],
                    "node_ip": rs["node_ip"],
                    "pid": rs["pid"],
                    "delivered": pp["batches"],
                    "lost": pp["lost"],
                    "made": rs["batches"],
                    "busy_s": rs["busy_s"],
                    "samples_read": rs["samples"],
                }
            )
            nd = nodes.setdefault(
                rs["node_id"], {"node_ip": rs["node_ip"], "producers": 0, "batches": 0, "bytes": 0}
            )
            nd["producers"] += 1
            nd["batches"] += pp["batches"]
            nd["bytes"] += pp["bytes"]
        for nd in nodes.values():
            nd["batches_per_s"] = nd["batches"] / wall if wall > 0 else 0.0
        return {
            "wait_time_ratio": self._wait_s / wall if wall > 0 else 0.0,
            "wall_s": wall,
            "wait_s": self._wait_s,
            "batches": self._n["batches"],
            "bytes": self._n["bytes"],
            "bytes_copied": self._n["copied"],
            "bytes_copied_per_batch": self._n["copied"] / n,
            "bytes_transferred": self._n["transferred"],
            "replans": self._n["replans"],
            "lost": self._n["lost"],
            "rerouted": self._n["rerouted"],
            "suspected": self._n["suspected"],
            "producer_timeout_s": self._watch.deadline(),
            "ping_rtt_s": _rtt_stats(list(self._watch.rtt_log)),
            "samples": self._samples,
            "skipped": self._skipped,
            "refs_in_flight": len(self._inflight),
            "consumer_node_id": self._node,
            "placement": dict(
                self._placement,
                data_nodes=sorted({p["node_ip"] for p in prods if p["node_ip"] is not None}),
            ),
            "producers": prods,
            "nodes": nodes,
            "fetch": _fetch_stats(list(self._history), list(self._waits), len(self._actors)),
        }

    def _producer_stats(self) -> List[Dict[str, Any]]:
        """Each producer's stats, or its last ones (``available`` False) while Ray
        restarts it or it does not answer (its node died, it is stuck): one producer down
        must not fail or hang the trainer's stats() call.  A suspect one is not asked."""
        refs = [
            None if i in self._suspect else a.stats.remote() for i, a in enumerate(self._actors)
        ]
        deadline = time.monotonic() + max(2.0, 5 * self._watch.deadline())
        out = []
        for i, ref in enumerate(refs):
            try:
                if ref is None:
                    raise ray.exceptions.GetTimeoutError("suspect")
                rs = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
                rs = dict(rs, available=True)
                self._last_stats[i] = rs
            except (*_LOST, ray.exceptions.GetTimeoutError):
                last = self._last_stats.get(i)
                none = dict(node_id=None, node_ip=None, pid=None, batches=0, busy_s=0.0, samples=0)
                rs = dict(last if last else none, available=False)
            out.append(rs)
        return out

    def producer_pids(self, timeout_s: float = 120.0) -> List[int]:
        """The process id of each producer (for fault tests); waits, up to `timeout_s`,
        for a producer that Ray is restarting."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return ray.get([a.pid.remote() for a in self._actors])
            except ray.exceptions.ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def close(self) -> None:
        """Kills the producers, frees their placement and stops this loader's threads (the
        watch and the fetch threads: joined, within about a second, so that nothing of the
        loader calls Ray after close() returns and ray.shutdown() can follow at once; a
        fetch thread still receiving a batch made before close() ends when that transfer
        does, and calls Ray no more).  Delivered batches stay valid (each holds its
        object-store memory until dropped)."""
        self._watch_stop.set()
        for r in self._inflight:
            r.dropped = True
        self._inflight.clear()
        self._ready.clear()
        fin = getattr(self, "_finalizer", None)
        if fin is not None:
            fin()
        else:
            _shutdown(self._all_actors(), self._pg)
        self._actors = []
        self._planner = None
        self._pg = None
        threads = list(self._threads)
        watch = getattr(self, "_watch", None)  # None: construction failed before it began
        if watch is not None:
            threads.append(watch.thread)
        _join(threads, _JOIN_S)

    @property
    def closed(self) -> bool:
        return not self._actors

    def _check_open(self) -> None:
        if not self._actors:
            raise Error("the loader is closed")

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"cursor={self._cursor}"
        return f"mmloader.ray.Loader(producers={len(self._actors)}, {state})"


def _shutdown(actors: List[Any], pg: Any, watch_stop: Optional[threading.Event] = None) -> None:
    if watch_stop is not None:
        watch_stop.set()
    if not _connected():
        # ray.shutdown() came first: Ray ended this driver's actors and placement groups;
        # a call now would start or connect to a cluster (RAY_ADDRESS) only to fail
        return
    for a in actors:
        try:
            ray.kill(a, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone, or Ray shut down
            pass
    if pg is not None:
        try:
            remove_placement_group(pg)
        except Exception:  # noqa: BLE001
            pass


# (producer, asked, made, fetched here): monotonic times of a request taken by next()
_Times = Tuple[int, float, Optional[float], Optional[float]]


def _failed(r: "_Request") -> bool:
    """The request's call failed in the transport (its producer or object was lost)."""
    f = r.future
    return f.done() and not f.cancelled() and isinstance(f.exception(), _LOST)


def _rtt_stats(rtts: List[float]) -> Dict[str, Any]:
    """The watch's ping round trips (the last 4096): how many, p50, p99, max, and how many
    took longer than the deadline's floor."""
    return {
        "pings": len(rtts),
        "p50": _pct(rtts, 0.5),
        "p99": _pct(rtts, 0.99),
        "max": max(rtts, default=0.0),
        "over_floor": sum(x > _DEADLINE_S[0] for x in rtts),
    }


def _pct(xs: List[float], q: float) -> float:
    """The q-quantile of xs (nearest rank); 0 for none."""
    if not xs:
        return 0.0
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(q * len(ys)))]


def _union(spans: List[Tuple[float, float]]) -> List[Tuple[float, float]]:
    out: List[Tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlap(xs: List[Tuple[float, float]], ys: List[Tuple[float, float]]) -> float:
    """Seconds in both unions of spans xs and ys."""
    xs, ys = _union(xs), _union(ys)
    i = j = 0
    t = 0.0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        t += max(0.0, b - a)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return t


def _fetch_stats(
    reqs: List[_Times], waits: List[Tuple[float, float]], producers: int
) -> Dict[str, Any]:
    """Where the time of the last (up to 1024) batches went, to tell why a link was idle:
    made_s (asked -> made), service_s (the producer's own time for it: from when it was
    asked or its producer's batch before was made, to made), transfer_s (made -> fetched
    to this node), transfers_mean (batches crossing the link at once, on average),
    transfer_share (of the span, time with at least one crossing), wait_s (the trainer
    in next()) and wait_idle_s (of that, time with nothing crossing: the producers were
    behind, not the link)."""
    done = [(p, a, b, c) for p, a, b, c in reqs if b is not None and c is not None]
    if not done:
        return {"requests": 0}
    made = [b - a for _, a, b, _ in done]
    xfer = [(b, c) for _, _, b, c in done]
    service: List[List[float]] = [[] for _ in range(producers)]
    last: Dict[int, float] = {}
    for p, a, b, _ in sorted(done, key=lambda x: x[2]):
        if 0 <= p < producers:
            service[p].append(b - max(a, last.get(p, a)))
        last[p] = b
    t0 = min(a for _, a, _, _ in done)
    t1 = max(c for _, _, _, c in done)
    span = max(1e-9, t1 - t0)
    w = [(max(a, t0), min(b, t1)) for a, b in waits if b > t0 and a < t1]
    wait = sum(b - a for a, b in _union(w))
    all_service = [x for xs in service for x in xs]
    return {
        "requests": len(done),
        "span_s": span,
        "made_s_p50": _pct(made, 0.5),
        "made_s_p99": _pct(made, 0.99),
        "service_s_p50": _pct(all_service, 0.5),
        "service_s_p99": _pct(all_service, 0.99),
        "transfer_s_p50": _pct([b - a for a, b in xfer], 0.5),
        "transfer_s_p99": _pct([b - a for a, b in xfer], 0.99),
        "transfers_mean": sum(b - a for a, b in xfer) / span,
        "transfer_share": sum(b - a for a, b in _union(xfer)) / span,
        "wait_s": wait,
        "wait_idle_s": wait - _overlap(w, xfer),
        "service_s_p50_per_producer": [_pct(xs, 0.5) for xs in service],
    }


def _exception(name: str, msg: str) -> BaseException:
    cls = getattr(_core, name, None)
    if isinstance(cls, type) and issubclass(cls, BaseException):
        return cls(msg)
    builtin = getattr(builtins, name, None)
    if isinstance(builtin, type) and issubclass(builtin, BaseException):
        return builtin(msg)
    return Error(f"{name}: {msg}")


def _to_torch(arrays: Dict[str, np.ndarray]) -> Dict[str, Any]:
    import torch

    with warnings.catch_warnings():  # read-only views: torch warns it cannot protect them
        warnings.simplefilter("ignore", UserWarning)
        return {k: torch.from_numpy(v) for k, v in arrays.items()}


_REMOTE = ("http://", "https://", "s3://")
_PATH_OPTIONS = ("tokenizer", "model_dir", "image_root", "index")


def _absolute(p: Any) -> Any:
    """A local path made absolute here, on the driver (a producer's working directory is
    its node's, not this process's); URLs and non-paths unchanged."""
    if isinstance(p, (str, os.PathLike)) and not isinstance(p, bytes):
        s = os.fspath(p)
        if not s.startswith(_REMOTE):
            return os.path.abspath(os.path.expanduser(s))
    return p


def _absolute_data(data: Any) -> Any:
    """`data` with every local path absolute (plain paths, sources of a mixture, a mixture
    file); a source keeps its name, so the stream's fingerprint does not change."""
    from .mixture import Source

    def source(x: Any) -> Any:
        src = Source.from_dict(x)
        over = dict(src.overrides)
        if "image_root" in over:
            over["image_root"] = _absolute(over["image_root"])
        paths = src.data if isinstance(src.data, str) else list(src.data)
        return Source(
            _absolute(paths) if isinstance(paths, str) else [_absolute(q) for q in paths],
            weight=src.weight,
            repeat=src.repeat,
            choose=src.choose,
            name=src.name,
            **over,
        )

    if isinstance(data, Source):
        return source(data)
    if isinstance(data, (str, os.PathLike)):
        return _absolute(data)
    if isinstance(data, (list, tuple)):
        return [source(x) if isinstance(x, (Source, dict)) else _absolute(x) for x in data]
    return data


def _absolute_paths(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    from .tokenizer import TOKENIZER_NAMES

    out = dict(kwargs)
    for k in _PATH_OPTIONS:
        if k not in out or isinstance(out[k], bool):
            continue
        if k == "tokenizer" and isinstance(out[k], str) and out[k] in TOKENIZER_NAMES:
            continue  # a name, not a path: each producer looks it up in its own install
        out[k] = _absolute(out[k])
    return out


def _alive_nodes() -> List[Dict[str, Any]]:
    def key(n: Dict[str, Any]) -> Tuple[Any, ...]:
        ip = n["NodeManagerAddress"]
        parts = ip.split(".")
        return (
            tuple(int(x) for x in parts) if all(x.isdigit() for x in parts) else (ip,),
            n["NodeID"],
        )

    return sorted((n for n in ray.nodes() if n.get("Alive")), key=key)


def _slots(have: Dict[str, float], bundle: Dict[str, float], most: int) -> int:
    """How many bundles fit in resources `have` (at most `most`)."""
    n = most
    for k, v in bundle.items():
        if v > 0:
            n = min(n, int(have.get(k, 0) / v + 1e-9))
    return n


def _fmt_res(r: Dict[str, float]) -> str:
    keep = {k: v for k, v in r.items() if not k.startswith(("node:", "memory", "object_store"))}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(keep.items())) + "}"


def _feasible_nodes(
    bundle: Dict[str, float], n_actors: int, timeout_s: float
) -> List[Dict[str, Any]]:
    """Alive nodes whose total resources hold the bundle; ConfigError within seconds when
    all of them together can never hold n_actors bundles (not after timeout_s: no amount of
    waiting frees resources a cluster does not have; a few seconds for nodes joining)."""
    deadline = time.monotonic() + min(5.0, timeout_s)
    while True:
        nodes = _alive_nodes()
        fit = [n for n in nodes if _slots(n["Resources"], bundle, 1)]
        if sum(_slots(n["Resources"], bundle, n_actors) for n in fit) >= n_actors:
            return fit
        if time.monotonic() >= deadline:
            have = "; ".join(
                f"{n['NodeManagerAddress']}: {_fmt_res(n['Resources'])}" for n in nodes
            )
            raise ConfigError(
                f"cannot place {n_actors} producers with {bundle} each: the cluster can "
                f"never hold them (its nodes: {have}); lower producers or "
                "producer_resources, or add nodes with these resources"
            )
        time.sleep(0.5)


def _round_robin(
    nodes: List[Dict[str, Any]], bundle: Dict[str, float], n: int, offset: int
) -> List[str]:
    """n actors over `nodes` in turn from node `offset`, a node taking no more of them than
    its total resources hold (the caller checked that all of them together hold n)."""
    d = len(nodes)
    room = [_slots(x["Resources"], bundle, n) for x in nodes]
    out: List[str] = []
    i = offset
    while len(out) < n:
        k = i % d
        if room[k] > 0:
            room[k] -= 1
            out.append(nodes[k]["NodeID"])
        i += 1
    return out


def _holds(nodes: List[Dict[str, Any]], bundle: Dict[str, float], n: int) -> bool:
    return sum(_slots(x["Resources"], bundle, n) for x in nodes) >= n


def _spread(
    nodes: List[Dict[str, Any]], me: str, bundle: Dict[str, float], n: int, rank: int, size: int
) -> Tuple[List[str], Dict[str, Any]]:
    """Rank-aware placement over the D data nodes (the alive nodes that hold a producer,
    sorted by address: the same list in every rank's process, so ranks agree without
    talking).  The node ids of this rank's n actors, and how they were chosen.

    Disjoint (D >= dp_size): rank r owns data nodes [r*D//size, (r+1)*D//size), a part no
    other rank uses, so no data node's link carries batches to two trainers (the ranks'
    transfers never share a link but at their own trainer's end); its actors go over its
    part in turn (batch j from producer j mod K: from each of its nodes in turn).  The
    rank's own node is left out of its part while the rest of the part holds the actors.
    Interleaved (fewer data nodes than ranks, or a rank's part cannot hold its actors):
    every rank uses every node, actor i of rank r on node (offset_r + i) mod D with the
    offsets spread evenly, so ranks taking their j-th batch at once pull from different
    nodes when they can; said in a warning and in stats()["placement"]."""
    d = len(nodes)
    part = nodes[(rank * d) // size : ((rank + 1) * d) // size] if d >= size else []
    if part:
        rest = [x for x in part if x["NodeID"] != me]
        if rest and _holds(rest, bundle, n):
            part = rest
        if _holds(part, bundle, n):
            info = dict(mode="disjoint", note=None)
            return _round_robin(part, bundle, n, 0), info
        note = (
            f"rank {rank}'s share of the {d} data nodes ({len(part)}) cannot hold its {n} "
            f"actors with {bundle} each"
        )
    else:
        note = f"{d} data node(s) for {size} ranks: fewer nodes than ranks"
    others = [x for x in nodes if x["NodeID"] != me]
    if _holds(others, bundle, n):
        nodes = others
    d = len(nodes)
    chosen = _round_robin(nodes, bundle, n, (rank * d) // max(1, size))
    return chosen, dict(mode="interleaved", note=note)


def _start_error(e: BaseException, where: str) -> BaseException:
    """The Error for a producer that failed to start on node `where`."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, Error):
        return type(cause)(f"{cause} (producer on {where})")
    text = str(e)
    if "No module named 'mmloader" in text or ("mmloader" in text and "ImportError" in text):
        return Error(
            f"mmloader is not importable on {where}, so no producer can run there: install "
            f"it on that node (the same version as here, {__version__}: pip install "
            f"mmloader=={__version__}), or ship it with ray.init(runtime_env=...) "
            f"({text.strip().splitlines()[-1][:300]})"
        )
    if isinstance(cause, BaseException):
        return Error(f"a producer failed to start on {where}: {type(cause).__name__}: {cause}")
    return Error(f"a producer failed to start on {where}: {text[-1000:]}")


def loaders(data: Any, *, dp_size: int, **kwargs: Any) -> List[Loader]:
    """One :class:`Loader` per data-parallel rank 0..dp_size-1, all from this driver; each
    rank's consumer requests and holds only its own batches."""
    return [Loader(data, dp_rank=r, dp_size=dp_size, **kwargs) for r in range(dp_size)]
