"""One long-lived child interpreter for a reference script's jobs (tests/qwenft_reference.py):
a test module that asks for many references pays the child's imports (torch, transformers:
~4.6 s of CPU each, ~10 s on the shared machine) once, not once a reference.

The script, started with --serve, reads one request a line ({"jobs": [...]}, what its
one-shot mode reads whole from stdin), runs the jobs as its one-shot mode runs them, in
order, and answers one line on the stdout it started with: {"ok": true} or {"ok": false,
"error": the traceback}.  Its own prints go to stderr, kept in a file for the failure
messages.  A request that fails, a child that dies and a reply that does not come in time
are assertion failures naming why (the child is then stopped, and the next request starts
a fresh one)."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import tempfile
import time
from typing import Dict, List, Optional


class RefChild:
    def __init__(self, argv: List[str], env: Dict[str, str], cwd: str):
        self.argv, self.env, self.cwd = argv + ["--serve"], env, cwd
        self.proc: Optional[subprocess.Popen] = None
        self.err = None

    def _start(self) -> subprocess.Popen:
        self.err = tempfile.TemporaryFile()
        return subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            env=self.env,
            cwd=self.cwd,
        )

    def _stderr_tail(self) -> str:
        if self.err is None:
            return ""
        self.err.seek(0, os.SEEK_END)
        self.err.seek(max(0, self.err.tell() - 4000))
        return self.err.read().decode("utf-8", "replace")

    def run(self, jobs: List[dict], timeout: float) -> None:
        """Runs the jobs; AssertionError with the child's traceback and stderr if they fail."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write((json.dumps({"jobs": jobs}) + "\n").encode())
            proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            raise AssertionError("the reference child exited: " + self._stderr_tail()) from None
        line = b""
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + timeout
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0:
                    tail = self._stderr_tail()
                    self.close(kill=True)
                    raise AssertionError(
                        f"no reply from the reference child in {timeout} s: {tail}"
                    )
                if not sel.select(min(left, 1.0)):
                    continue
                chunk = os.read(proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    tail = self._stderr_tail()
                    self.close()
                    raise AssertionError(f"the reference child exited ({proc.poll()}): {tail}")
                line += chunk
        reply = json.loads(line)
        assert reply["ok"], reply["error"][-4000:] + "\n" + self._stderr_tail()

    def close(self, kill: bool = False) -> None:
        """Ends the child (SIGTERM; SIGKILL with kill=True or 10 s later): every reply it
        gave was written to disk before the reply, so nothing is lost, and torch's exit
        takes seconds on a loaded machine that a test need not wait for."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
        if kill:
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
