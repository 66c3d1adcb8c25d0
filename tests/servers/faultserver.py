"""A small fault-injecting HTTP/1.1 object server for the fetch tests and benchmarks.

Serves objects (an in-memory dict of path -> bytes, and/or a directory) on 127.0.0.1 with
keep-alive, HEAD and byte ranges, and injects faults deterministically: whether request
number n of a given (method, path, Range) faults, and how, is a pure function of
(seed, method, path, Range, n).  A retried request is request n+1, so with a fault rate
below 1 every object is eventually served, and the same seed replays the same faults.

Faults (names usable in `faults` and in `script`):
  503       503 SlowDown with S3's XML body and Retry-After
  500       500 InternalError (XML)
  429       429 Too Many Requests with Retry-After
  reset     the connection is reset (RST) before any reply
  truncate  headers promise the full Content-Length; half the body comes, then the
            connection closes (FIN)
  stall     headers and a part of the body come, then nothing for `stall_s` seconds
  404, 403  permanent errors with S3-style XML (NoSuchKey, AccessDenied)
  endless   200 with no Content-Length (Connection: close), the object, then bytes
            without end (until the client hangs up)
  drip      the headers, then the body one byte every `drip_s` seconds
  silent    the request is read and never answered (the connection idles `stall_s`)
  redirect  302 to the same URL (a redirect loop)
  bigheaders  200 whose headers run to 1 MiB (past any client's header limit)
  badchunk  200 with Transfer-Encoding: chunked and a chunk size that is not hex
`fault_rates` ({"503": 0.01, "reset": 0.005, ...}) gives each kind its own rate instead of
`fault_rate` spread over `faults`.
It also answers ListObjectsV2 (GET /BUCKET?list-type=2&prefix=..., paginated with
max-keys and continuation-token) over the objects under /BUCKET/, so s3:// globs can be
tested with faults (point the S3 endpoint at the server; it does not check signatures).
Hostile objects and listings (issue 29): `infinite` paths answer every Range with 206 and
bytes without end (a repeated pattern, Content-Range total `*` or `infinite_total`);
`ranges=False` ignores Range like Python's own http.server (200 with everything);
`list_cycle=True` makes ListObjectsV2 continuation tokens cycle (A, B, A, ...).
`bytes_sent` counts the body bytes written.
Also: first-byte latency with jitter, per-connection bandwidth limits, paths that are
always missing (404) or forbidden (403), ETag / If-Match (412), and a hook called after
each request (tests use it to change an object between requests).

From tests:
    with FaultServer(objects={"/a.jpg": data}, fault_rate=0.1, seed=1) as srv:
        url = srv.url("/a.jpg")
From the command line:
    python tests/servers/faultserver.py --root DIR --latency 0.03 --fault-rate 0.1
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import socket
import struct
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, Iterable, List, Optional, Sequence

XML_ERR = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
    '<Message>{msg}</Message><Resource>{res}</Resource><RequestId>0</RequestId></Error>'
)
ERRORS = {
    "503": (503, "SlowDown", "Please reduce your request rate."),
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "429": (429, "TooManyRequests", "Too many requests."),
    "404": (404, "NoSuchKey", "The specified key does not exist."),
    "403": (403, "AccessDenied", "Access Denied"),
}
TRANSIENT = ("503", "500", "429", "reset", "truncate")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024

    def handle_error(self, request, client_address) -> None:
        # clients hanging up mid-reply (a loader closing with requests in flight) are normal
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class FaultServer:
    """Fault-injecting object server on 127.0.0.1 (ephemeral port by default)."""

    def __init__(
        self,
        objects: Optional[Dict[str, bytes]] = None,
        root: Optional[str] = None,
        seed: int = 0,
        latency: float = 0.0,
        jitter: float = 0.0,
        fault_rate: float = 0.0,
        faults: Sequence[str] = TRANSIENT,
        retry_after: Optional[float] = 0,
        bandwidth: Optional[int] = None,
        script: Optional[Dict[str, List[str]]] = None,
        missing: Iterable[str] = (),
        forbidden: Iterable[str] = (),
        stall_s: float = 3.0,
        port: int = 0,
        hook: Optional[Callable[[str, str, str, int], None]] = None,
        tls: Optional[tuple] = None,
        ranges: bool = True,
        fault_rates: Optional[Dict[str, float]] = None,
        drip_s: float = 0.5,
        infinite: Optional[Dict[str, bytes]] = None,
        infinite_total: Optional[int] = None,
        list_cycle: bool = False,
    ):
        self.objects = dict(objects or {})
        self.root = root
        self.seed = seed
        self.latency, self.jitter = latency, jitter
        self.fault_rate, self.faults = fault_rate, tuple(faults)
        self.retry_after, self.bandwidth = retry_after, bandwidth
        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.missing, self.forbidden = set(missing), set(forbidden)
        self.stall_s = stall_s
        self.port = port
        self.hook = hook  # hook(method, path, range, n) runs after a request is served
        self.tls = tls  # (certfile, keyfile): serve https
        self.ranges = ranges  # False: ignore Range headers (always 200 with everything)
        self.fault_rates = dict(fault_rates or {})
        self.drip_s = drip_s
        self.infinite = dict(infinite or {})  # path -> pattern repeated without end
        self.infinite_total = infinite_total  # Content-Range total of those (None: "*")
        self.list_cycle = list_cycle
        self.list_hook: Optional[Callable[[str, dict, bool], str]] = None  # its own pages
        self.bytes_sent = 0
        self.lock = threading.Lock()
        self.counts: Dict[tuple, int] = {}
        self.log: List[tuple] = []  # (time, method, path, range, outcome, connection id)
        self.connections = 0
        # requests being served now: counted from the parsed request until just before
        # the first byte of the reply (or the reset) goes out.  That span lies inside the
        # client's in-flight time of the request, so max_active never exceeds the client's
        # peak concurrency; a handler still finishing after its reply does not count.
        self.active = 0
        self.max_active = 0
        self._files: Dict[tuple, bytes] = {}
        self._etags: Dict[int, tuple] = {}
        self._httpd: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "FaultServer":
        handler = type("Handler", (_Handler,), {"fs": self})
        self._httpd = _Server(("127.0.0.1", self.port), handler)
        self.port = self._httpd.server_address[1]
        if self.tls:
            import ssl

            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*self.tls)
            self._httpd.socket = ctx.wrap_socket(self._httpd.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(5)
            self._httpd = None

    def __enter__(self) -> "FaultServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def url(self, path: str) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def outcomes(self, path: Optional[str] = None) -> List[str]:
        with self.lock:
            return [e[4] for e in self.log if path is None or e[2] == path]

    # -- decisions ---------------------------------------------------------------------------
    def _lookup(self, path: str) -> tuple:
        """(data, etag) of an object, or (None, None).  Files and ETags are cached."""
        data = self.objects.get(path)
        if data is None and self.root:
            full = os.path.realpath(os.path.join(self.root, path.lstrip("/")))
            if full.startswith(os.path.realpath(self.root) + os.sep) and os.path.isfile(full):
                key = (full, os.stat(full).st_mtime_ns)
                with self.lock:
                    data = self._files.get(key)
                if data is None:
                    with open(full, "rb") as fh:
                        data = fh.read()
                    with self.lock:
                        self._files[key] = data
        if data is None:
            return None, None
        with self.lock:
            etag = self._etags.get(id(data))
            if etag is None or etag[0] is not data:
                etag = (data, '"%s"' % hashlib.md5(data).hexdigest())
                self._etags[id(data)] = etag
        return data, etag[1]

    def _decide(self, method: str, path: str, rng: str) -> tuple:
        key = (method, path, rng)
        with self.lock:
            n = self.counts.get(key, 0)
            self.counts[key] = n + 1
        if path in self.missing:
            return "404", n
        if path in self.forbidden:
            return "403", n
        sc = self.script.get(path)
        if sc is not None and n < len(sc):
            return sc[n], n
        if (self.fault_rate > 0 and self.faults) or self.fault_rates:
            h = hashlib.blake2b(
                f"{self.seed}|{method}|{path}|{rng}|{n}".encode(), digest_size=16
            ).digest()
            u, k = struct.unpack("<QQ", h)
            u /= 2.0**64
            if self.fault_rates:
                for kind, rate in sorted(self.fault_rates.items()):
                    if u < rate:
                        return kind, n
                    u -= rate
            elif u < self.fault_rate:
                return self.faults[k % len(self.faults)], n
        return "ok", n


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fs: FaultServer

    def setup(self) -> None:
        super().setup()
        # headers and body go out in separate writes: without this, Nagle + delayed ACK
        # add ~40 ms to every response
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.fs.lock:
            self.fs.connections += 1
            self.conn_id = self.fs.connections

    def log_message(self, *a) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._counted(head=True)

    def do_GET(self) -> None:
        self._counted(head=False)

    def _counted(self, head: bool) -> None:
        fs = self.fs
        with fs.lock:
            fs.active += 1
            fs.max_active = max(fs.max_active, fs.active)
        self._active = True
        try:
            self._serve(head)
            if fs.hook:
                path = self.path.split("?", 1)[0]
                rng = self.headers.get("Range", "")
                fs.hook(self.command, path, rng, fs.counts.get((self.command, path, rng), 1) - 1)
        finally:
            self._leave()

    def _leave(self) -> None:
        """Ends the request's active span (see FaultServer.active); idempotent."""
        if getattr(self, "_active", False):
            self._active = False
            with self.fs.lock:
                self.fs.active -= 1

    def flush_headers(self) -> None:  # the reply's first bytes
        self._leave()
        super().flush_headers()

    def _record(self, path: str, rng: str, outcome: str) -> None:
        with self.fs.lock:
            self.fs.log.append((time.monotonic(), self.command, path, rng, outcome, self.conn_id))

    def _reset(self) -> None:
        self._leave()
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        except OSError:
            pass

    def _send_error(self, kind: str, path: str, head: bool) -> None:
        status, code, msg = ERRORS[kind]
        body = XML_ERR.format(code=code, msg=msg, res=path).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        if kind in ("503", "429") and self.fs.retry_after is not None:
            self.send_header("Retry-After", str(self.fs.retry_after))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _write(self, data: bytes) -> None:
        bw = self.fs.bandwidth
        if not bw:  # in 1 MiB pieces: bytes_sent counts what went out before a hang-up
            view = memoryview(data)
            for i in range(0, len(data), 1 << 20):
                self.wfile.write(view[i : i + (1 << 20)])
                with self.fs.lock:
                    self.fs.bytes_sent += len(view[i : i + (1 << 20)])
            return
        with self.fs.lock:
            self.fs.bytes_sent += len(data)
        step = max(1, bw // 50)
        for i in range(0, len(data), step):
            self.wfile.write(data[i : i + step])
            self.wfile.flush()
            time.sleep(len(data[i : i + step]) / bw)

    def _endless(self, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        chunk = bytes(range(256)) * 256
        try:
            self._write(data)
            for _ in range(1 << 16):  # 4 GiB at most
                self._write(chunk)
        except OSError:
            pass

    def _infinite(self, pattern: bytes, rng: str, head: bool) -> None:
        """An object without end: 206 to every Range (its bytes: pattern repeated)."""
        start, end = 0, None
        if rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            try:
                start, end = int(a), (int(b) + 1 if b else None)
            except ValueError:
                start, end = 0, None
        if end is None:  # no Range or an open one: 200 (or 206) without a length, endless
            self.send_response(206 if rng else 200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            if not head:
                try:
                    for i in range(1 << 16):
                        self._write(pattern * max(1, (1 << 16) // len(pattern)))
                except OSError:
                    pass
            return
        n = len(pattern)
        rep = pattern * ((end - start) // n + 2)
        body = rep[start % n : start % n + (end - start)]
        total = "*" if self.fs.infinite_total is None else str(self.fs.infinite_total)
        self.send_response(206)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Range", f"bytes {start}-{end - 1}/{total}")
        self.end_headers()
        if not head:
            self._write(body)

    def _protocol_fault(self, kind: str, path: str) -> None:
        """Faults no retry can fix: a redirect loop, huge headers, a broken chunk size."""
        if kind == "redirect":  # to itself; the kept-alive connection is then reset
            self.send_response(302)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            self.wfile.flush()
            time.sleep(0.05)
            self._reset()
            return
        if kind == "bigheaders":
            self.send_response(200)
            for i in range(1024):
                self.send_header(f"X-Filler-{i}", "x" * 1000)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)  # badchunk
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.write(b"zz\r\nhello\r\n0\r\n\r\n")
        self.close_connection = True

    def _serve(self, head: bool) -> None:
        fs = self.fs
        path, _, query = self.path.partition("?")
        path = urllib.parse.unquote(path)
        rng = self.headers.get("Range", "")
        listing = "list-type=2" in query and path.count("/") == 1
        if listing:
            rng += "?" + query  # pages are distinct requests (faults, log)
        kind, n = fs._decide(self.command, path, rng)
        if fs.latency or fs.jitter:
            # jitter is deterministic too: a function of the request's identity
            r = random.Random(f"{fs.seed}|{path}|{rng}|{n}").random()
            time.sleep(fs.latency + fs.jitter * r)
        data, etag = (None, None) if listing else fs._lookup(path)
        if kind == "ok" and data is None and not listing and path not in fs.infinite:
            kind = "404"
        self._record(path, rng, kind)
        if kind == "reset":
            self._reset()
            return
        if kind == "silent":
            time.sleep(fs.stall_s)
            self.close_connection = True
            return
        if kind == "endless" and data is not None and not head:
            self._endless(data)
            return
        if kind in ("redirect", "bigheaders", "badchunk"):
            self._protocol_fault(kind, path)
            return
        if path in fs.infinite and kind == "ok":
            self._infinite(fs.infinite[path], rng, head)
            return
        if kind in ERRORS:
            self._send_error(kind, path, head)
            return
        if listing:
            self._list(path.strip("/"), urllib.parse.parse_qs(query), head)
            return
        if data is None:
            self._send_error("404", path, head)
            return
        im = self.headers.get("If-Match")
        if im is not None and im.strip() not in ("*", etag):
            self.send_response(412)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        status, start, end = 200, 0, len(data)
        if rng.startswith("bytes=") and fs.ranges:
            a, _, b = rng[6:].partition("-")
            try:
                start = int(a)
                end = min(int(b) + 1, len(data)) if b else len(data)
            except ValueError:
                start, end = 0, len(data)
            else:
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status = 206
        body = data[start:end]
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", etag)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if head:
            return
        if kind == "truncate":  # half the body, then an orderly close (FIN)
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if kind == "drip":
            try:
                for i in range(len(body)):
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
                    time.sleep(fs.drip_s)
            except OSError:
                pass
            self.close_connection = True
            return
        if kind == "stall":
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            time.sleep(fs.stall_s)
            self.close_connection = True
            return
        self._write(body)

    def _list(self, bucket: str, q: dict, head: bool) -> None:
        """ListObjectsV2 (path style): keys of objects under /bucket/, paginated."""
        fs = self.fs
        if fs.list_hook is not None:  # a test's own page (hostile listings)
            body = fs.list_hook(bucket, q, head).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self._write(body)
            return
        keys = {
            p[len(bucket) + 2 :]: len(d)
            for p, d in fs.objects.items()
            if p.startswith("/" + bucket + "/")
        }
        broot = os.path.join(fs.root, bucket) if fs.root else None
        if broot and os.path.isdir(broot):
            for dirpath, _, files in os.walk(broot):
                for name in files:
                    full = os.path.join(dirpath, name)
                    keys.setdefault(
                        os.path.relpath(full, broot).replace(os.sep, "/"), os.path.getsize(full)
                    )
        prefix = q.get("prefix", [""])[0]
        max_keys = int(q.get("max-keys", ["1000"])[0])
        after = (
            bytes.fromhex(q["continuation-token"][0]).decode()
            if "continuation-token" in q
            else None
        )
        todo = sorted(k for k in keys if k.startswith(prefix) and (after is None or k > after))
        page, more = todo[:max_keys], len(todo) > max_keys

        def esc(t):
            return (
                t.replace("&", "&amp;")
                .replace("<", "&lt;")
                .replace(">", "&gt;")
                .replace('"', "&quot;")
            )

        parts = [
            '<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult>',
            f"<Name>{esc(bucket)}</Name><Prefix>{esc(prefix)}</Prefix>",
            f"<KeyCount>{len(page)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>",
            f"<IsTruncated>{'true' if more else 'false'}</IsTruncated>",
        ]
        parts += [f"<Contents><Key>{esc(k)}</Key><Size>{keys[k]}</Size></Contents>" for k in page]
        if more:
            # list_cycle: the second page points back to the first (tokens A, B, A, ...)
            nxt = "\x00" if fs.list_cycle and after not in (None, "\x00") else page[-1]
            parts.append(f"<NextContinuationToken>{nxt.encode().hex()}</NextContinuationToken>")
        parts.append("</ListBucketResult>")
        body = "".join(parts).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self._write(body)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Fault-injecting HTTP object server (127.0.0.1).")
    ap.add_argument("--root", required=True, help="directory to serve")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--latency", type=float, default=0.0, help="first-byte latency, seconds")
    ap.add_argument("--jitter", type=float, default=0.0, help="extra latency, uniform 0..jitter")
    ap.add_argument("--fault-rate", type=float, default=0.0)
    ap.add_argument("--faults", default=",".join(TRANSIENT))
    ap.add_argument("--retry-after", type=float, default=0)
    ap.add_argument("--bandwidth", type=int, default=None, help="bytes/s per connection")
    args = ap.parse_args(argv)
    srv = FaultServer(
        root=args.root,
        port=args.port,
        seed=args.seed,
        latency=args.latency,
        jitter=args.jitter,
        fault_rate=args.fault_rate,
        faults=[f for f in args.faults.split(",") if f],
        retry_after=args.retry_after,
        bandwidth=args.bandwidth,
    ).start()
    print(f"listening on http://127.0.0.1:{srv.port}/", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
