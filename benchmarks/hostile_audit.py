"""Issue 29's audit, rerunnable: every hostile case of the issue, each in a fresh child
process under the same caps, with its outcome, wall time and peak RSS.

    python benchmarks/hostile_audit.py [CASE ...] [--repo DIR] [--cap-gib 6] [--limit-s 120]
                                       [--work DIR] [--json OUT]

Each case runs `python -c CHILD` (a fresh interpreter: nothing of this process's memory
counts) with RLIMIT_AS at --cap-gib GiB, under `nice -n 19`, killed after --limit-s
seconds; mmloader is imported from --repo (default: this checkout; point it at another
build's checkout to compare).  Peak RSS is the child's VmHWM, read from /proc every 20 ms
while it runs (so a child that is killed still has one), in MB.  Servers (the
fault-injecting one of tests/servers) run in this process and count the requests and
body bytes they served.  Inputs are made once under --work (default
$TMPDIR/mml-hostile-audit; the 3 GB compression bombs take about a minute); the
children's $TMPDIR is --work/tmp, emptied after each case.

The cases follow the issue's numbering (1-14); the outcome is the child's own line: the
error class and the first 160 characters of its message, or what it delivered.  The
issue's "before" figures were taken on main 8151a69 the same way (6 GB caps)."""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "servers")]
from tar_bytes import tar_header, tar_member  # noqa: E402  (tests/, on the path above)

REC = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}
LINE = json.dumps(REC) + "\n"
SECRET = "c2VjcmV0LXNpZ25hdHVyZQ"

# ---- the child -----------------------------------------------------------------------

CHILD = r'''
import json, os, signal, sys, threading, time, warnings
warnings.simplefilter("ignore")
signal.signal(signal.SIGINT, signal.default_int_handler)
import mmloader
TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
what, a = sys.argv[1], json.loads(sys.argv[2])


def first(e):
    s = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {s[:160]}"


def make(data, kw):
    args = dict(tokenizer=TINY, micro_batch_size=1, num_threads=2, prefetch=2, shuffle=False,
                max_error_rate=1.0)
    args.update(kw)
    return mmloader.Loader(data, **args)


def skipped(L):
    s = L.stats().get("skipped_by_reason") or {}
    return f", skipped {json.dumps(s)}" if s else ""


def build():
    L = make(a["data"], a.get("kw", {}))
    return f"built: {len(L)} samples"


def epoch():
    L = make(a["data"], a.get("kw", {}))
    n, it = 0, iter(L)
    try:
        for b in it:
            n += 1
            del b
            if n == a.get("batches", -1):
                break
    except mmloader.Error as e:
        return f"{n} batches, then {first(e)}{skipped(L)}"
    return f"{n} batches{skipped(L)}"


def rate():
    def one(path):
        L = make(path, dict(micro_batch_size=64))
        t = time.perf_counter()
        n = sum(len(b["input_ids"]) for b in L)
        return n, n / (time.perf_counter() - t)
    n, peer = one(a["peer"])
    m, got = one(a["data"])
    return f"{m} samples at {got:,.0f}/s; the same records without blank lines {peer:,.0f}/s"


def sigint_build():
    sent = []
    def interrupt():
        sent.append(time.perf_counter())
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    import inspect
    known = inspect.signature(mmloader.Loader).parameters
    kw = {k: v for k, v in a.get("kw", {}).items() if k in known or "kwargs" in known}
    note = f" (this build has no {', '.join(sorted(set(a.get('kw', {})) - set(kw)))})" if (
        len(kw) < len(a.get("kw", {}))) else ""
    timer = threading.Timer(a["after_s"], interrupt)
    timer.daemon = True
    timer.start()
    out, ended = "Loader() returned", None
    try:
        try:
            make(a["data"], kw)
            out = "built"
        except KeyboardInterrupt:
            return f"KeyboardInterrupt {time.perf_counter() - sent[0]:.2f} s after SIGINT{note}"
        except mmloader.Error as e:
            ended = time.perf_counter()
            out = first(e)
        ended = ended or time.perf_counter()
        timer.cancel()
    except KeyboardInterrupt:  # the signal, taken only once Loader() had returned
        ended = ended or time.perf_counter()
    if sent:
        out += f" {ended - sent[0]:.1f} s after SIGINT, which it ignored"
    return out + note


def fetch():
    from mmloader import _core
    f = _core.Fetcher(**a["kw"])
    return f"ok, {len(f.get(a['url']))} bytes"


def redact():
    from mmloader import _core
    leaks = sum(a["secret"] in _core.redact(t) for t in a["texts"])
    msgs = []
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        L = make(a["data"], dict(num_threads=1))
        list(L)
    msgs = [str(x.message) for x in w]
    L = make(a["data"], dict(num_threads=1, on_error="raise"))
    try:
        next(iter(L))
    except mmloader.Error as e:
        msgs.append(str(e))
    leaks_msg = sum(a["secret"] in m for m in msgs)
    return (f"_core.redact: {leaks} of {len(a['texts'])} texts leak; loader messages: "
            f"{leaks_msg} of {len(msgs)} leak")


def damaged_partial():
    from mmloader import dsindex
    class Stop(Exception):
        pass
    def stop(shard_no, shards, done, total):
        if done > 0:
            raise Stop
    out = a["out"]
    try:
        dsindex.build(a["data"], out=out + "/a", progress=stop, tokenizer=TINY)
    except Stop:
        pass
    done = dsindex.sidecar_path(a["data"], out + "/a")
    part = os.path.join(out, "a", os.path.basename(done) + ".partial")
    b = bytearray(open(part, "rb").read())
    b[len(b) // 2] ^= 0x10
    open(part, "wb").write(bytes(b))
    s = dsindex.build(a["data"], out=out + "/a", tokenizer=TINY)
    dsindex.build(a["data"], out=out + "/b", tokenizer=TINY)
    same = open(done, "rb").read() == open(dsindex.sidecar_path(a["data"], out + "/b"), "rb").read()
    return (f"resumed {s.get('resumed')} of {s.get('samples')} entries; index "
            + ("equal to a fresh build" if same else "DIFFERS from a fresh build"))


try:
    out = globals()[what]()
except BaseException as e:  # noqa: BLE001 - reported, not handled
    out = first(e)
print(json.dumps(out), flush=True)
'''


def vm_hwm_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_child(args: dict, what: str, repo: str, cap_gib: float, limit_s: float, work: str):
    tmp = os.path.join(work, "tmp")
    os.makedirs(tmp, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=repo, TMPDIR=tmp)
    cap = int(cap_gib * (1 << 30))

    def limits():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        os.nice(19)

    t0 = time.monotonic()
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, what, json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=work,
        preexec_fn=limits,
    )
    peak = 0.0
    while p.poll() is None and time.monotonic() - t0 < limit_s:
        peak = max(peak, vm_hwm_mb(p.pid))
        time.sleep(0.02)
    killed = p.poll() is None
    if killed:
        p.kill()
    out, err = p.communicate()
    dt = time.monotonic() - t0
    shutil.rmtree(tmp, ignore_errors=True)
    if killed:
        return f"still running after {limit_s:.0f} s (killed)", dt, peak
    try:
        return json.loads(out.strip().splitlines()[-1]), dt, peak
    except (ValueError, IndexError):
        tail = (err.strip().splitlines() or ["(no output)"])[-1]
        return f"child died (rc {p.returncode}): {tail[:160]}", dt, peak


# ---- inputs --------------------------------------------------------------------------


def zst_of(path: str, chunk: bytes, times: int) -> str:
    if not os.path.exists(path):
        import zstandard

        c = zstandard.ZstdCompressor(level=3).compressobj()
        with open(path + ".tmp", "wb") as f:
            for _ in range(times):
                f.write(c.compress(chunk))
            f.write(c.compress(LINE.encode()))
            f.write(c.flush())
        os.replace(path + ".tmp", path)
    return path


def write(path: str, data) -> str:
    if not os.path.exists(path):
        mode = "wb" if isinstance(data, bytes) else "w"
        with open(path, mode) as f:
            f.write(data)
    return path


def image_rec(ref, n=1, keys=None):
    part = dict({"type": "image", "image": ref}, **(keys or {}))
    return {
        "messages": [
            {"role": "user", "content": [part] * n + [{"type": "text", "text": "Describe."}]},
            {"role": "assistant", "content": "A picture."},
        ]
    }


def shard(path: str, recs) -> str:
    return write(path, "".join(json.dumps(r) + "\n" for r in recs))


def small_jpeg(path: str) -> str:
    from photos import Image

    b = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 30, 60)).save(b, "JPEG")
    return write(path, b.getvalue())


# ---- cases ---------------------------------------------------------------------------


class Ctx:
    def __init__(self, a):
        self.a, self.work, self.rows = a, a.work, []

    def p(self, name):
        return os.path.join(self.work, name)

    def run(self, case, title, what, args, srv=None):
        r0, b0 = (len(srv.log), srv.bytes_sent) if srv else (0, 0)
        out, dt, peak = run_child(
            args, what, self.a.repo, self.a.cap_gib, self.a.limit_s, self.work
        )
        served = f"{len(srv.log) - r0} req, {(srv.bytes_sent - b0) / 1e6:.1f} MB" if srv else ""
        row = dict(
            case=case, title=title, outcome=out, seconds=round(dt, 2), peak_rss_mb=round(peak)
        )
        if srv:
            row["served"] = served
        self.rows.append(row)
        print(
            f"| {case} | {title} | {out} | {dt:.1f} | {peak:.0f} |"
            + (f" {served} |" if srv else " |"),
            flush=True,
        )


def c1(x: Ctx):
    braces = zst_of(x.p("braces.jsonl.zst"), b"{}\n" * (1 << 20), 1000)
    x.run(
        "1",
        f"3 GB of '{{}}' lines, {os.path.getsize(braces) / 1e3:.0f} KB .zst",
        "build",
        dict(data=braces),
    )
    blank = zst_of(x.p("blank.jsonl.zst"), b"\n" * (3 << 20), 1000)
    x.run(
        "1",
        f"3 GB of blank lines, {os.path.getsize(blank) / 1e3:.0f} KB .zst",
        "build",
        dict(data=blank),
    )
    nl = x.p("newlines.jsonl")
    if not os.path.exists(nl):
        with open(nl, "wb") as f:
            for _ in range(200):
                f.write(b"\n" * (1 << 20))
            f.write(LINE.encode())
    x.run("1", "plain file of 200 MB of newlines", "build", dict(data=nl))


def c2(x: Ctx):
    peer = write(x.p("records.jsonl"), LINE * 4096)
    data = write(x.p("blank-then-records.jsonl"), "\n" * (10 << 20) + LINE * 4096)
    x.run("2", "10 MB of blank lines before 4096 records", "rate", dict(data=data, peer=peer))


def c3(x: Ctx):
    rec = {
        "messages": [
            {"role": "user", "content": "<image>hi"},
            {"role": "assistant", "content": "ok"},
        ]
    }
    rec = json.dumps(rec).encode()
    sparse = x.p("sparse.tar")
    if not os.path.exists(sparse):
        with open(sparse, "wb") as f:
            f.write(tar_member("a.json", rec))
            f.write(tar_header("a.jpg", 2 << 30))
            f.seek(2 << 30, 1)  # a hole: the member's 2 GiB cost no disk
            f.write(tar_member("b.json", json.dumps(REC).encode()) + b"\0" * 1024)
    x.run("3", "WebDataset member of 2 GiB (sparse)", "epoch", dict(data=sparse))

    body = " size=%d\n" % (2**63 - 100)
    n = len(body) + 2
    while len(str(n)) + len(body) != n:
        n += 1
    pax = (str(n) + body).encode()
    p = write(
        x.p("pax.tar"),
        tar_member("a.json", json.dumps(REC).encode())
        + tar_header("pax", len(pax), b"x")
        + pax
        + b"\0" * (-len(pax) % 512)
        + tar_header("b.json", 0)
        + tar_member("c.json", json.dumps(REC).encode())
        + b"\0" * 1024,
    )
    x.run("3", "pax size 2^63-100", "build", dict(data=p))


def c4(x: Ctx):
    from bombs import jpeg_scan_bomb

    for side, scans in ((8000, 1000), (8000, 20000)):
        name = f"scans-{side}-{scans}.jpg"
        if not os.path.exists(x.p(name)):
            write(x.p(name), jpeg_scan_bomb(side, scans))
        data = shard(x.p(f"scans-{scans}.jsonl"), [image_rec(name)])
        kb = os.path.getsize(x.p(name)) / 1e3
        x.run(
            "4", f"progressive JPEG {side}^2, {scans} scans ({kb:.0f} KB)", "epoch", dict(data=data)
        )


def c5(x: Ctx):
    from bombs import png_tail_bomb

    for mib in (1024, 8192):
        name = f"tail-{mib}.png"
        if not os.path.exists(x.p(name)):
            write(x.p(name), png_tail_bomb(512, mib))
        data = shard(x.p(f"tail-{mib}.jsonl"), [image_rec(name)])
        mb = os.path.getsize(x.p(name)) / 1e6
        x.run(
            "5",
            f"PNG with {mib} MiB inflating past its last row ({mb:.1f} MB)",
            "epoch",
            dict(data=data),
        )


def c6(x: Ctx):
    small_jpeg(x.p("a.jpg"))
    for keys, n, title in (
        (
            {"min_pixels": 10**8, "max_pixels": 10**8},
            1,
            "min_pixels=max_pixels=1e8 on a 32x24 JPEG",
        ),
        (
            {"resized_height": 10**6, "resized_width": 10**6},
            64,
            "64 images, resized_height/width=1e6",
        ),
        ({"min_pixels": 10**12, "max_pixels": 10**12}, 1, "min_pixels=max_pixels=1e12"),
    ):
        data = shard(
            x.p(f"keys-{n}-{len(json.dumps(keys))}.jsonl"), [image_rec("a.jpg", n, keys)] * 2
        )
        x.run(
            "6",
            title,
            "epoch",
            dict(data=data, kw=dict(max_images_per_sample=256, num_threads=1, prefetch=1)),
        )


def c7(x: Ctx):
    from faultserver import FaultServer

    for total, what in ((None, "*"), (1 << 62, "2^62")):
        with FaultServer(infinite={"/inf.jsonl": LINE.encode()}, infinite_total=total) as srv:
            url = srv.url("/inf.jsonl")
            title = f"remote shard answering 206 to every range, total {what}"
            x.run("7", title, "build", dict(data=url, kw=dict(index=False)), srv)
    # Ctrl-C during construction: a shard whose server never answers (the index build waits
    # in its fetch), and a local .zst of 1 G '{}' lines with the limits lifted (the build
    # runs for minutes)
    with FaultServer(
        objects={"/d.jsonl": LINE.encode()}, fault_rate=1.0, faults=["silent"], stall_s=300
    ) as srv:
        x.run(
            "7",
            "SIGINT 1 s into Loader() of a shard whose server never answers",
            "sigint_build",
            dict(data=srv.url("/d.jsonl"), after_s=1.0, kw=dict(index=False)),
            srv,
        )
    braces = zst_of(x.p("braces.jsonl.zst"), b"{}\n" * (1 << 20), 1000)
    lifted = dict(max_shard_records=1 << 31, max_shard_bytes=1 << 40)
    x.run(
        "7",
        "SIGINT 1 s into Loader() of the 3 GB '{}' .zst, limits lifted",
        "sigint_build",
        dict(data=braces, after_s=1.0, kw=lifted),
    )


def c8(x: Ctx):
    from faultserver import FaultServer

    n = (100 << 20) // len(LINE)
    big = (LINE * n).encode()
    with FaultServer(objects={"/big.jsonl": big}, ranges=False) as srv:
        x.run(
            "8",
            "100 MiB shard on a server that ignores Range, 3 batches of 4",
            "epoch",
            dict(data=srv.url("/big.jsonl"), kw=dict(micro_batch_size=4, shuffle=True), batches=3),
            srv,
        )
    video = x.video()
    if not video:
        return
    data = open(video, "rb").read()
    for ranges in (False, True):
        for elem in ({}, {"nframes": 4}):
            with FaultServer(objects={f"/v{i}.mp4": data for i in range(4)}, ranges=ranges) as srv:
                recs = [
                    {
                        "conversations": [
                            {"from": "human", "value": f"<video>{i}"},
                            {"from": "gpt", "value": "x"},
                        ],
                        "videos": [dict(elem, video=srv.url(f"/v{i}.mp4"))],
                    }
                    for i in range(4)
                ]
                sh = shard(x.p(f"video-{ranges}-{len(elem)}-{srv.port}.jsonl"), recs)
                how = "honours" if ranges else "ignores"
                x.run(
                    "8",
                    f"4 samples, each its own {len(data) / 1e6:.0f} MB mp4 ({elem or 'default fps'}), server {how} Range",
                    "epoch",
                    dict(data=sh, kw=dict(preset="qwen2.5-vl", mrope=True)),
                    srv,
                )
                os.unlink(sh)


def c9(x: Ctx):
    from faultserver import FaultServer

    objs = {f"/bkt/d{i:05d}.jsonl": LINE.encode() for i in range(2500)}
    with FaultServer(objects=objs, list_cycle=True) as srv:
        kw = dict(
            s3_endpoint=f"http://127.0.0.1:{srv.port}",
            s3_region="us-east-1",
            aws_access_key_id="x",
            aws_secret_access_key="y",
        )
        x.run(
            "9",
            "S3 listing whose tokens cycle A, B, A, ...",
            "build",
            dict(data="s3://bkt/d*.jsonl", kw=kw),
            srv,
        )


def c10(x: Ctx):
    from faultserver import FaultServer

    kw = dict(max_object_bytes=1 << 20, stall_s=2, retry_budget_s=30, max_retries=8)
    for kind in ("endless", "bigheaders", "badchunk", "redirect"):
        with FaultServer(objects={"/x.bin": b"x" * 1000}, script={"/x.bin": [kind] * 100}) as srv:
            x.run(
                "10",
                f"GET answered '{kind}' every time",
                "fetch",
                dict(url=srv.url("/x.bin"), kw=kw),
                srv,
            )


def c11(x: Ctx):
    from faultserver import FaultServer

    with FaultServer(objects={}) as srv:
        tails = [
            '"&X-Amz-Signature=' + SECRET,
            "<&token=" + SECRET,
            "`&sig=" + SECRET,
            "#access_token=" + SECRET,
        ]
        recs = [image_rec(srv.url("/missing.jpg") + "?x=1" + t) for t in tails] + [REC]
        data = shard(x.p(f"redact-{srv.port}.jsonl"), recs)
        texts = [f"image {srv.url('/a.jpg')}?x=1{t}: 404" for t in tails]
        x.run(
            "11",
            "secrets after \", <, ` and in a #fragment",
            "redact",
            dict(data=data, texts=texts, secret=SECRET),
            srv,
        )
        os.unlink(data)


def c12(x: Ctx):
    from mmloader.datagen import make_dataset

    d = x.p("partial")
    shutil.rmtree(d, ignore_errors=True)
    ds = make_dataset(
        d + "/data",
        n_samples=300,
        seed=1,
        n_shards=1,
        n_images=4,
        min_size=24,
        max_size=48,
        text_only_fraction=0.9,
    )
    x.run(
        "12",
        "a bit flipped mid-file in an interrupted build's .partial",
        "damaged_partial",
        dict(data=ds["shards"][0], out=d),
    )


def c13(x: Ctx):
    import zstandard

    g = write(x.p("padded.jsonl.gz"), gzip.compress(LINE.encode() * 8) + b"\0" * 1000)
    x.run("13", "gzip with trailing zero padding (8 records)", "build", dict(data=g))
    z = write(
        x.p("skippable.jsonl.zst"),
        struct.pack("<II", 0x184D2A50, 8)
        + b"metadata"
        + zstandard.ZstdCompressor().compress(LINE.encode() * 8),
    )
    x.run("13", "zstd starting with a skippable frame (8 records)", "build", dict(data=z))


def c14(x: Ctx):
    s = write(x.p("sixteen.jsonl"), LINE * 16)
    x.run("14", "prefetch=1048576 on 16 samples", "epoch", dict(data=s, kw=dict(prefetch=1 << 20)))
    fifo = x.p("fifo.jsonl")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    x.run("14", "a FIFO as the shard", "build", dict(data=fifo))
    x.run("14", "/dev/zero as the shard", "build", dict(data="/dev/zero"))


CASES = {
    str(i): f
    for i, f in enumerate([c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14], 1)
}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("cases", nargs="*", default=list(CASES), help="case numbers (default: all)")
    ap.add_argument("--repo", default=ROOT, help="the checkout whose mmloader the children import")
    ap.add_argument("--cap-gib", type=float, default=6.0, help="RLIMIT_AS of each child")
    ap.add_argument("--limit-s", type=float, default=120.0, help="wall limit of each child")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "mml-hostile-audit"))
    ap.add_argument(
        "--video", default="", help="an mp4 for case 8 (default: a 21 MB one made with ffmpeg)"
    )
    ap.add_argument("--json", default="", help="also write the rows here")
    a = ap.parse_args()
    a.repo = os.path.abspath(a.repo)
    os.makedirs(a.work, exist_ok=True)
    x = Ctx(a)

    def video():
        if a.video:
            return a.video
        path = x.p("v.mp4")
        if not os.path.exists(path):
            ffmpeg = shutil.which("ffmpeg")
            if not ffmpeg:
                print("(case 8's videos skipped: no ffmpeg; pass --video)", flush=True)
                return ""
            # 20 s of 640x480 at 30 fps, GOP 60, moov last: about 21 MB
            subprocess.run(
                [ffmpeg, "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=s=640x480:r=30"]
                + [
                    "-vf",
                    "noise=alls=40:allf=t",
                    "-t",
                    "20",
                    "-c:v",
                    "libx264",
                    "-preset",
                    "ultrafast",
                ]
                + ["-b:v", "8400k", "-maxrate", "8400k", "-bufsize", "8M", "-g", "60", "-bf", "0"]
                + ["-pix_fmt", "yuv420p", path],
                check=True,
            )
        return path

    x.video = video
    rev = subprocess.run(
        ["git", "-C", a.repo, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    print(
        f"mmloader from {a.repo} ({rev.stdout.strip() or '?'}), children capped at {a.cap_gib:g} GiB "
        f"(RLIMIT_AS) and {a.limit_s:g} s, load {os.getloadavg()[0]:.1f}\n",
        flush=True,
    )
    print(
        "| case | input | outcome | s | peak RSS MB | served |\n|---|---|---|---:|---:|---|",
        flush=True,
    )
    for c in a.cases:
        CASES[c](x)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                dict(repo=a.repo, rev=rev.stdout.strip(), cap_gib=a.cap_gib, rows=x.rows),
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
