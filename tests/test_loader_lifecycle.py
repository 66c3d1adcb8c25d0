"""Loader shutdown and process hygiene: close, del, breaking out of a loop, Ctrl-C during
iteration, interpreter exit, forked children; no threads or file descriptors leak."""

import gc
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from child import child_env

import mmloader
from mmloader.datagen import make_dataset

from conftest import fds_down_to, n_fds, n_threads, threads_down_to

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TINY = os.path.join(ROOT, "mmloader", "data", "tiny-tokenizer.json")
SMALL = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ds"))
    return make_dataset(root, n_samples=24, seed=2, n_images=8, min_size=32, max_size=128)


def make(data, **kw):
    args = dict(tokenizer=TINY, micro_batch_size=2, num_threads=3, prefetch=2, **SMALL)
    args.update(kw)
    return mmloader.Loader(data, **args)


def test_close_del_break_leave_nothing(ds):
    gc.collect()  # the baseline must not count descriptors of an earlier test's garbage
    base_t, base_f = n_threads(), n_fds()
    for how in ("close", "del", "break", "context"):
        L = make(ds["shards"])
        if how == "context":
            with L:
                next(L)
            assert L.closed
        else:
            for i, _ in enumerate(L):
                if i == 2:
                    break
            assert n_threads() > base_t  # workers are running
            if how == "close":
                L.close()
                L.close()  # idempotent
                with pytest.raises(mmloader.Error, match="closed"):
                    next(L)
            del L
            gc.collect()
        # at most the baseline: a thread or descriptor of an earlier test may end meanwhile
        assert threads_down_to(base_t) <= base_t, how
        assert fds_down_to(base_f) <= base_f, how


def test_memory_flat_over_many_batches(ds):
    L = make(ds["shards"], cycle=True)
    for _ in range(20):
        next(L)
    gc.collect()
    with open("/proc/self/statm") as f:
        rss0 = int(f.read().split()[1])
    for _ in range(200):
        next(L)
    with open("/proc/self/statm") as f:
        rss1 = int(f.read().split()[1])
    L.close()
    assert (rss1 - rss0) * os.sysconf("SC_PAGE_SIZE") < 64 << 20


def run_py(code, **kw):
    env = child_env()
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def test_interpreter_exit_without_close(ds):
    p = run_py(f"""
        import mmloader
        L = mmloader.Loader({ds['shards']!r}, tokenizer={TINY!r}, micro_batch_size=2,
                            num_threads=4, prefetch=8, cycle=True, min_pixels={SMALL['min_pixels']},
                            max_pixels={SMALL['max_pixels']})
        next(L)
        keep = L  # never closed: the finalizer must stop the threads at exit
        print("ok", flush=True)
    """)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "ok" in out


def test_ctrl_c_during_iteration(ds):
    p = run_py(f"""
        import signal, sys, time, mmloader
        # what a user at a terminal has; started from a shell without job control (CI,
        # `cmd &`, nohup) the child would inherit SIGINT ignored and never be interrupted
        signal.signal(signal.SIGINT, signal.default_int_handler)
        L = mmloader.Loader({ds['shards']!r}, tokenizer={TINY!r}, micro_batch_size=2,
                            num_threads=1, prefetch=1, cycle=True)
        next(L)
        try:  # the signal may come as soon as "ready" is out
            print("ready", flush=True)
            while True:
                next(L)  # mostly blocked in next(): full-size images, one thread
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            L.close()
            sys.exit(3)
    """)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 3, (out, err)
    assert "interrupted" in out


def test_forked_child_raises(ds):
    L = make(ds["shards"])
    next(L)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            next(L)
        except mmloader.Error as e:
            code = 0 if "forked child" in str(e) else 2
        except BaseException:
            code = 3
        os.write(w, b"x")
        os._exit(code)
    os.close(w)
    os.read(r, 1)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    next(L)  # the parent is unaffected
    L.close()


def test_close_from_another_thread_while_next_waits(ds):
    import threading

    L = make(ds["shards"], num_threads=1, prefetch=1, cycle=True)
    next(L)
    errors = []

    def consume():
        try:
            while True:
                next(L)
        except mmloader.Error as e:
            errors.append(e)

    t = threading.Thread(target=consume)
    t.start()
    L.close()  # the consumer is (most likely) inside next() with the GIL released
    t.join(timeout=60)
    assert not t.is_alive()
    assert errors and "closed" in str(errors[0])


# A capped loader whose workers wait for max_memory room: the consumer holds two batches of
# images up to 1200 px under a 130 MiB cap with prefetch 4, so the batches ahead cannot all
# be built and the workers wait for room (stats room_waits counts their waits).  close() and
# Ctrl-C must stop them: the workers' waits end on the ledger's change count (loader_admit.c
# W4), which close pokes.  The bounds below only catch a hang (the guarantee is about a
# second; the figures are printed).
CAPPED = dict(micro_batch_size=8, num_threads=2, prefetch=4, max_pixels=256 * 28 * 28, cycle=True)
CAP = 130 << 20
# ... and one whose collation thread waits for a batch's buffer: packed (pack_length 1024)
# under a 48 MiB cap, the consumer holding one pack, the next pack's buffer cannot be
# granted (stats collator_room_waits counts its waits).  Its wait is on its own event count
# without a bound (loader_admit.c W2), which close pokes.
PACKED = dict(num_threads=2, prefetch=4, max_pixels=256 * 28 * 28, cycle=True, packing=True)
WAITERS = {
    "workers": (dict(CAPPED, max_memory=CAP), 2, "room_waits"),
    "collator": (dict(PACKED, pack_length=1024, max_memory=48 << 20), 1, "collator_room_waits"),
}


@pytest.fixture(scope="module")
def big_ds(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("big"))
    return make_dataset(root, n_samples=48, seed=1, n_images=16, min_size=160, max_size=1200)


def wait_for_room_waits(L, held, stat="room_waits"):
    import time

    for _ in range(1000):  # at most 10 s: the premise, not a timing
        if L.stats()[stat] > 0:
            return
        time.sleep(0.01)
    raise AssertionError(f"no {stat} with {held} batches held")


@pytest.mark.parametrize("who", sorted(WAITERS))
def test_capped_close_while_waiting_for_room(big_ds, who):
    import threading
    import time

    opts, n_held, stat = WAITERS[who]
    L = mmloader.Loader(big_ds["shards"], tokenizer=TINY, **opts)
    held = [next(L) for _ in range(n_held)]
    wait_for_room_waits(L, len(held), stat)
    t0 = time.perf_counter()
    done = threading.Event()
    closer = threading.Thread(target=lambda: (L.close(), done.set()))
    closer.start()
    closer.join(timeout=10)
    print(f"close() with the {who} waiting for room: {time.perf_counter() - t0:.3f} s")
    assert done.is_set(), f"close() did not return: the {who}' wait for room was not ended"
    with pytest.raises(mmloader.Error, match="closed"):
        next(L)
    assert held[0]["input_ids"].numpy().size > 0  # batches handed out stay valid


def test_capped_collator_waits_for_room_without_polling(big_ds):
    # Nothing gives room back while the consumer holds its pack, so nothing wakes the
    # collation thread (with the 5 ms bound it looked ~96 times in 0.5 s); the pack's
    # release does, and the epoch goes on.
    import time

    opts, n_held, stat = WAITERS["collator"]
    L = mmloader.Loader(big_ds["shards"], tokenizer=TINY, **opts)
    held = [next(L) for _ in range(n_held)]
    wait_for_room_waits(L, len(held), stat)
    time.sleep(0.3)  # the workers do what they can meanwhile
    before = L.stats()[stat]
    time.sleep(0.5)
    waits = L.stats()[stat] - before
    print(f"the collation thread's waits for a buffer in 0.5 s with a pack held: {waits}")
    assert waits < 20, waits
    del held
    assert [next(L)["input_ids"].numpy().size > 0 for _ in range(3)] == [True] * 3
    L.close()


@pytest.mark.parametrize("who", sorted(WAITERS))
def test_capped_ctrl_c_while_waiting_for_room(big_ds, tmp_path, who):
    opts, n_held, stat = WAITERS[who]
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import signal, time, mmloader
            signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal
            L = mmloader.Loader({big_ds['shards']!r}, tokenizer={TINY!r}, **{opts!r})
            held = [next(L) for _ in range({n_held})]
            for _ in range(1000):  # at most 10 s
                if L.stats()[{stat!r}]:
                    break
                time.sleep(0.01)
            print("ready" if L.stats()[{stat!r}] else "no wait for room", flush=True)
            while True:  # never closed: KeyboardInterrupt ends the process, whose exit
                time.sleep(1)  # must stop the threads waiting for room
            """),
        ],
        env=child_env(),
        cwd=str(tmp_path),  # outside the repository: the child imports the tests' mmloader
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read() if p.poll() else ""
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == -signal.SIGINT, (p.returncode, err[-2000:])
    assert "KeyboardInterrupt" in err
