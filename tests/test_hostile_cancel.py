"""Hostile input, round 2 (issue 29): work inside one native call that close(), Ctrl-C and
an index build's stop could not interrupt.  Each test failed before its fix:

- a huge WebP (still, or the first frame of an animation) was decoded by one libwebp call
  with no progress hook: close() waited for it (seconds per image, minutes with
  max_image_pixels lifted); libwebp's incremental decoder now takes the bytes in slices,
  the cancel flag checked between them;
- a long video (one GOP of 900 1080p frames) was decoded by one FFmpeg loop: close()
  waited for every frame; the byte source, the demuxer's interrupt callback and the packet
  loops now check the flag;
- Ctrl-C during `mmloader index` (dsindex.build) stopped the writer, then joined workers
  that finished their chunk of 256 samples first, each fetch waiting out its timeouts and
  retries (an image server that never answers: minutes); the workers now leave at once;
- Ctrl-C during a Loader's planning pass (the global plan's token counts, every sample
  measured at construction) waited for every remaining sample: its threads checked the
  cancel flag only inside fetches and probes; they now check it between samples.

Times are compared with a peer measured in the same run (the whole decode), never with a
fixed number of seconds, except where the old behaviour took minutes."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from child import child_env

import mmloader
from mmloader import _core

from bombs import webp_animated, webp_huge
from photos import Image

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
SMALL = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
REPLY = {"role": "assistant", "content": "A picture."}


def shard(tmp_path, recs, name="d.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return str(p)


def image_record(ref):
    return {"messages": [{"role": "user", "content": "<image>Describe."}, REPLY], "images": [ref]}


def loader(path, **kw):
    args = dict(tokenizer=TINY, micro_batch_size=1, num_threads=1, prefetch=1, shuffle=False)
    args.update(SMALL, **kw)
    return mmloader.Loader(path, **args)


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def close_under_way(path, wait_s=0.3, **kw):
    """Seconds close() takes while the loader's one worker is inside the first sample's
    decode (next() gave up after `wait_s`, well inside the decode: it is under way)."""
    L = loader(path, next_timeout_s=wait_s, **kw)
    with pytest.raises(mmloader.Error, match="no batch for"):
        next(L)
    return timed(L.close)


# ---- WebP ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def huge_webp(tmp_path_factory):
    d = tmp_path_factory.mktemp("webp")
    still = webp_huge(6000)
    (d / "still.webp").write_bytes(still)
    (d / "anim.webp").write_bytes(webp_animated(still, 3))
    whole = min(timed(lambda: _core.image_decode(still)) for _ in range(2))  # the peer
    return d, whole


@pytest.mark.parametrize("name", ["still.webp", "anim.webp"])
def test_close_stops_a_huge_webp_decode(huge_webp, name):
    d, whole = huge_webp
    path = shard(d, [image_record(name)], name=name + ".jsonl")
    # next() gives up a sixth into the decode (a fixed 0.3 s was past the whole decode on
    # a quiet machine, which then delivered the batch)
    took = close_under_way(path, wait_s=whole / 6)
    # before: close() waited for the rest of the decode (about `whole` less the wait)
    assert took < whole / 4, (took, whole)


@pytest.fixture(scope="module")
def flat_webp(tmp_path_factory):
    """A flat lossy 9000x9000 WebP (about 214 KB): its first partition is nearly every
    byte, and libwebp decodes no row before that partition is complete, so its last feed
    decodes all the rows in one call: no feed size helps."""
    d = tmp_path_factory.mktemp("flat")
    b = io.BytesIO()
    Image.new("RGB", (9000, 9000), (120, 130, 140)).save(b, "WEBP", quality=50, method=0)
    (d / "flat.webp").write_bytes(b.getvalue())
    whole = min(timed(lambda: _core.image_decode(b.getvalue())) for _ in range(2))  # the peer
    return d, whole


def test_close_abandons_a_flat_webp_decode(flat_webp):
    """image_aside.c invariants 1-2: the one libwebp call of seconds runs on a thread of its
    own that close() leaves behind (it frees what it holds when it ends).  Before, close()
    waited for the call (0.12-0.28 s here against a whole decode of 1.1-1.4 s; the issue
    measured 0.9-1.3 s against 3.85 s); now a few milliseconds."""
    d, whole = flat_webp
    path = shard(d, [image_record("flat.webp")], name="flat.jsonl")
    took = close_under_way(path, wait_s=whole / 6)
    assert took < whole / 10, (took, whole)


FLAT_CHILD = """
import atexit, io, json, signal, sys, threading, time
# registered before the loader's weakref.finalize (atexit runs the last registered first):
# runs once the loader has been closed at exit
atexit.register(lambda: print(json.dumps(dict(closed=time.time())), flush=True))
import mmloader
from mmloader import _core
signal.signal(signal.SIGINT, signal.default_int_handler)
mode, data_path, shard_path, tok = sys.argv[1:5]
data = open(data_path, "rb").read()
t = time.perf_counter()
_core.image_decode(data)  # the peer: the whole decode, in this process, now
whole = time.perf_counter() - t
L = mmloader.Loader(shard_path, tokenizer=tok, micro_batch_size=1, num_threads=1, prefetch=1,
                    shuffle=False, min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16,
                    next_timeout_s=whole / 10 if mode == "exit" else 600)
if mode == "exit":  # next() gives up a tenth into the decode; the script ends there
    try:
        next(L)
    except mmloader.Error:
        pass
    print(json.dumps(dict(whole=whole, last=time.time())), flush=True)
    sys.exit(0)  # (the atexit line follows)
sent = []
def interrupt():
    sent.append(time.perf_counter())
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
threading.Timer(whole / 10, interrupt).start()
try:
    next(L)
    out = "delivered"
except KeyboardInterrupt:
    out = "interrupted"
raised = time.perf_counter()
L.close()
closed = time.perf_counter()
print(json.dumps(dict(whole=whole, out=out, raised=raised - sent[0], close=closed - raised)))
"""


def flat_child(tmp_path, flat_webp, mode):
    d, _ = flat_webp
    path = shard(d, [image_record("flat.webp")], name="flat.jsonl")
    script = tmp_path / "child.py"
    script.write_text(FLAT_CHILD)
    env = child_env()
    args = [sys.executable, str(script), mode, str(d / "flat.webp"), path, TINY]
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    r = {}
    for line in p.stdout.strip().splitlines()[-2:]:
        r.update(json.loads(line))
    return r


def test_ctrl_c_abandons_a_flat_webp_decode(tmp_path, flat_webp):
    """image_aside.c invariant 2, through Ctrl-C: SIGINT a tenth into the flat 9000x9000
    decode (the loader's one worker inside libwebp's one long call) raises
    KeyboardInterrupt from next() before the decode could have ended, and the close()
    after it takes under a tenth of the whole decode measured in the same child just
    before (a ratio: it holds on a machine 3x slower or faster).  Before image_aside.c
    (4af1319) that close() waited for the rest of the call: 0.068-0.086 s against a whole
    decode of 0.44-0.45 s, four runs at load 3; now 0.001-0.002 s against 0.44-0.49 s."""
    r = flat_child(tmp_path, flat_webp, "sigint")
    assert r["out"] == "interrupted" and r["raised"] < r["whole"], r
    assert r["close"] < r["whole"] / 10, r


def test_exit_abandons_a_flat_webp_decode(tmp_path, flat_webp):
    """The same at interpreter exit: the script ends while the decode is a tenth in (no
    close(); the loader's finalizer closes it at exit).  From the script's last line to the
    end of that close (an atexit handler that runs after it): under a tenth of the whole
    decode measured in the same child.  Before image_aside.c (4af1319) exit waited for the
    rest of the call: 0.10-0.23 s against a whole decode of 0.44-0.58 s, four runs at load
    3; now 0.002-0.004 s against 0.44-0.46 s."""
    r = flat_child(tmp_path, flat_webp, "exit")
    assert r["closed"] - r["last"] < r["whole"] / 10, r


def test_webp_decoded_aside_is_unchanged(huge_webp):
    """image_aside.c invariant 3: a photo decoded aside (36 MP) has Pillow's pixels."""
    d, _ = huge_webp
    data = (d / "still.webp").read_bytes()
    px, h, w = _core.image_decode(data)
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert ref.shape == (h, w, 3) and np.frombuffer(px, np.uint8).tobytes() == ref.tobytes()


def test_huge_webp_still_decodes_whole(huge_webp):
    d, _ = huge_webp
    path = shard(d, [image_record("anim.webp"), image_record("still.webp")], name="both.jsonl")
    with loader(path) as L:
        a, b = [np.from_dlpack(x["pixel_values"]).copy() for x in L]
    assert a.shape == b.shape and (a == b).all()  # the animation's first frame is the still


# ---- video --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_video(tmp_path_factory):
    ffmpeg = shutil.which("ffmpeg")
    if not ffmpeg:
        pytest.skip("Debian's ffmpeg CLI is not installed (apt-get install ffmpeg)")
    d = tmp_path_factory.mktemp("video")
    path = d / "long.mp4"
    subprocess.run(
        # a moving test pattern, not a flat colour: a flat frame decodes in well under a
        # millisecond, so on a fast machine the whole GOP took 0.55 s and a close() of
        # 0.14 s (thread joins, not the decode) failed the ratio
        [ffmpeg, "-v", "error", "-f", "lavfi", "-i", "testsrc2=s=1920x1080:r=30", "-t", "30"]
        + ["-c:v", "libx264", "-preset", "ultrafast", "-g", "100000", "-bf", "0"]
        + ["-pix_fmt", "yuv420p", str(path)],
        check=True,
    )
    whole = timed(lambda: _core.video_decode(str(path), [899]))  # the peer: the one GOP
    return d, whole


def test_close_stops_a_long_video_decode(long_video):
    d, whole = long_video
    rec = {
        "messages": [{"role": "user", "content": "<video>What happens?"}, REPLY],
        "videos": ["long.mp4"],
    }
    took = close_under_way(shard(d, [rec]), wait_s=whole / 6)
    # before: close() waited until every frame of the GOP was decoded
    assert took < whole / 4, (took, whole)


# ---- index build --------------------------------------------------------------------------


def test_ctrl_c_during_an_index_build_stops_its_workers(fault_server, tmp_path):
    """The records' images are on a server that never answers: each worker waits in a
    fetch (fetch_timeout_s, then retries) when Ctrl-C arrives."""
    b = io.BytesIO()
    Image.new("RGB", (32, 24), (9, 99, 199)).save(b, "JPEG")
    srv = fault_server(
        objects={"/a.jpg": b.getvalue()}, fault_rate=1.0, faults=["silent"], stall_s=300
    )
    path = shard(tmp_path, [image_record(srv.url(f"/a.jpg?{i}")) for i in range(600)])
    env = child_env()
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import signal
            from mmloader import dsindex
            signal.signal(signal.SIGINT, signal.default_int_handler)
            print("ready", flush=True)
            dsindex.build({path!r}, out={str(tmp_path / "ix")!r}, tokenizer={TINY!r},
                          threads=4)
        """),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert p.stdout.readline().strip() == "ready"
    time.sleep(2.0)  # the workers are waiting on the server
    t = time.perf_counter()
    p.send_signal(signal.SIGINT)
    try:
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()  # (before the fix it ran for minutes)
    took = time.perf_counter() - t
    assert "KeyboardInterrupt" in err, err
    # before: minutes (each worker's chunk of 256 samples, every fetch timing out)
    assert took < 10, took
    partial = [f for f in os.listdir(tmp_path / "ix") if f.endswith(".partial")]
    assert partial, os.listdir(tmp_path / "ix")  # stopped resumably


# ---- planning pass ------------------------------------------------------------------------


def text_shard(path, n):
    line = '{"messages": [{"role": "user", "content": "question %d about things"}, '
    line += '{"role": "assistant", "content": "a %d"}]}\n'
    with open(path, "w") as f:
        f.writelines(line % (i, i) for i in range(n))
    return str(path)


def test_ctrl_c_during_a_long_planning_pass(tmp_path):
    """A global plan over 400k local records: the planning pass measures every one at
    construction. The peer is the same pass over 40k of them (time T, in the same child);
    Ctrl-C arrives 2T into the 400k pass (about 8T of it left) and must stop it within T/2
    (before: the rest of the pass, 5.1 s with T = 0.72 s at 20k/200k). One thread, so the
    ratio holds under load; the interrupt's fixed cost (100 ms polls, joins) is allowed beside
    T/2, as T can be under a quarter of a second."""
    small = text_shard(tmp_path / "small.jsonl", 40_000)
    big = text_shard(tmp_path / "big.jsonl", 400_000)
    env = child_env()
    code = textwrap.dedent(f"""
        import json, signal, threading, time, mmloader
        signal.signal(signal.SIGINT, signal.default_int_handler)
        kw = dict(tokenizer={TINY!r}, max_tokens_per_batch=4096, micro_batch_size=None,
                  num_threads=1, index=False)
        t = time.perf_counter()
        L = mmloader.Loader({small!r}, **kw)
        peer = time.perf_counter() - t
        n = len(L)
        L.close()
        sent = []
        def interrupt():
            sent.append(time.perf_counter())
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        threading.Timer(2 * peer, interrupt).start()
        try:
            mmloader.Loader({big!r}, **kw)
            out = "finished"
        except KeyboardInterrupt:
            out = "interrupted"
        print(json.dumps(dict(out=out, peer=peer, n=n, took=time.perf_counter() - sent[0])))
    """)
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["n"] > 0 and r["out"] == "interrupted", r
    # T/2, plus the interrupt's fixed cost (100 ms polls, the joins): on a fast machine T is
    # ~0.15 s (Python 3.12's run: 0.101 s to stop against T/2 = 0.077 s), while the pass
    # before the fix ran on for ~8T
    assert r["took"] < r["peer"] / 2 + 0.25, r
