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


@pytest.fixture(scope="module")
def big_ds(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("big"))
    return make_dataset(root, n_samples=48, seed=1, n_images=16, min_size=160, max_size=1200)


def wait_for_room_waits(L, held):
    import time

    for _ in range(1000):  # at most 10 s: the premise, not a timing
        if L.stats()["room_waits"] > 0:
            return
        time.sleep(0.01)
    raise AssertionError(f"the workers never waited for room with {held} batches held")


def test_capped_close_while_workers_wait_for_room(big_ds):
    import threading
    import time

    L = mmloader.Loader(big_ds["shards"], tokenizer=TINY, max_memory=CAP, **CAPPED)
    held = [next(L), next(L)]
    wait_for_room_waits(L, len(held))
    t0 = time.perf_counter()
    done = threading.Event()
    closer = threading.Thread(target=lambda: (L.close(), done.set()))
    closer.start()
    closer.join(timeout=10)
    print(f"close() with the workers waiting for room: {time.perf_counter() - t0:.3f} s")
    assert done.is_set(), "close() did not return: a worker's wait for room was not ended"
    with pytest.raises(mmloader.Error, match="closed"):
        next(L)
    assert held[0]["input_ids"].numpy().size > 0  # batches handed out stay valid


def test_capped_ctrl_c_while_workers_wait_for_room(big_ds, tmp_path):
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import signal, time, mmloader
            signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal
            L = mmloader.Loader({big_ds['shards']!r}, tokenizer={TINY!r}, max_memory={CAP},
                                **{CAPPED!r})
            held = [next(L), next(L)]
            for _ in range(1000):  # at most 10 s
                if L.stats()["room_waits"]:
                    break
                time.sleep(0.01)
            print("ready" if L.stats()["room_waits"] else "no wait for room", flush=True)
            while True:  # never closed: KeyboardInterrupt ends the process, whose exit
                time.sleep(1)  # must stop the workers waiting for room
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
