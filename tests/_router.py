"""Start and stop `hotpath router` subprocesses for tests (and benchmarks): by PID, on port 0.

    router = start_router("--mode", "barrier", "--barrier", "64")
    try:
        ... router.url ...  router.stats() ...
    finally:
        router.stop()

or `with start_router(...) as router:`. `start_router` waits for the router's readiness line
(see `impl.harness.router`) and fails with the router's stderr if it does not come.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass, field
from typing import IO, Any

from impl.harness.procs import read_ready_line

_READY = re.compile(r"^hotpath-router listening on (http://\S+)$")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class RouterProcess:
    url: str
    pid: int
    process: subprocess.Popen = field(repr=False)
    errors: IO[bytes] = field(repr=False)

    def stderr(self) -> str:
        """What the router wrote to stderr so far (for failure messages)."""
        if self.errors.closed:
            return ""
        self.errors.seek(0)
        return self.errors.read().decode(errors="replace")

    def stats(self, *, reset: bool = False) -> dict[str, Any]:
        """The router's `/stats` (optionally zeroing its peaks and counters after reading)."""
        query = "?reset=1" if reset else ""
        with urllib.request.urlopen(f"{self.url}/stats{query}", timeout=10) as response:
            return json.loads(response.read())

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM by PID, then SIGKILL if it has not exited within `timeout` seconds."""
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.process.wait(timeout)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.errors.close()

    def __enter__(self) -> RouterProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_router(*args: str, timeout: float = 20.0) -> RouterProcess:
    """A running `hotpath router --port 0 *args`; waits until it listens."""
    command = [sys.executable, "-m", "impl.cli", "router", "--port", "0", *args]
    errors = tempfile.TemporaryFile()  # noqa: SIM115 -- a file, not a pipe: a chatty router never blocks
    process = subprocess.Popen(command, cwd=_ROOT, stdout=subprocess.PIPE, stderr=errors, text=True)
    match = read_ready_line(process, lambda line: _READY.match(line.strip()), timeout)
    if match:
        return RouterProcess(match.group(1), process.pid, process, errors)
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait()
    errors.seek(0)
    stderr = errors.read().decode(errors="replace")
    errors.close()
    raise RuntimeError(f"router did not become ready: {' '.join(command)}\n{stderr[-2000:]}")
