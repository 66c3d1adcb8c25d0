"""Starts the fault-injecting object server (tests/servers/faultserver.py) in its own
process, serving a dataset folder with a first-byte latency, for the remote runs."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

from .common import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "tests", "servers", "faultserver.py")


def available() -> Optional[str]:
    if not os.path.exists(SCRIPT):
        return "tests/servers/faultserver.py is not in this checkout"
    return None


class Server:
    """`with Server(root, latency=0.03) as url:` — url is http://127.0.0.1:PORT/."""

    def __init__(self, root: str, latency: float = 0.03, fault_rate: float = 0.0):
        self.args = [
            sys.executable,
            SCRIPT,
            "--root",
            root,
            "--latency",
            str(latency),
            "--fault-rate",
            str(fault_rate),
        ]
        self.proc: Optional[subprocess.Popen] = None
        self.url = ""

    def start(self) -> str:
        self.proc = subprocess.Popen(
            self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.stop()
            raise RuntimeError(f"fault server did not start: {line} {err[-500:]}")
        self.url = line[len("listening on ") :]
        return self.url

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
