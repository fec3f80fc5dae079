"""Start and stop the processes of a load run: the fake router, the server, py-spy.

Every process is started here as a child on loopback and stopped by its PID (SIGTERM, then
SIGKILL), and gets SIGTERM from the kernel if the process that started it dies first (even by
SIGKILL: the parent-death signal), so an interrupted run leaves no router or server behind.
Watching them while the load runs (the `ServerWatch` thread, /healthz probes, /metrics scrapes)
is `impl.harness.watch`.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from impl._process import die_with_parent
from impl.harness.watch import get_json

_URL = re.compile(r"(http://[0-9.]+:[0-9]+)")
_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Proc:
    """A child process with its URL, PID and a file holding its output."""

    name: str
    url: str
    process: subprocess.Popen = field(repr=False)
    output: IO[bytes] = field(repr=False)
    command: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    def tail(self, size: int = 3000) -> str:
        """The end of what the process wrote (stdout and stderr)."""
        with contextlib.suppress(OSError, ValueError):
            self.output.seek(0, os.SEEK_END)
            end = self.output.tell()
            self.output.seek(max(0, end - size))
            return self.output.read().decode(errors="replace")
        return ""

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM by PID, then SIGKILL after `timeout` seconds; idempotent."""
        stop_pid(self.process, timeout)
        with contextlib.suppress(OSError, ValueError):
            self.output.close()

    def __enter__(self) -> Proc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def stopped_at_exit() -> Iterator[list[Proc]]:
    """A list to append started processes to; all are stopped at exit, and on an error each
    one's output tail is written to stderr first (what a router or server said before it)."""
    started: list[Proc] = []
    try:
        yield started
    except KeyboardInterrupt:  # SIGINT/SIGTERM: stop them, nothing to explain
        raise
    except BaseException:
        for proc in started:
            sys.stderr.write(f"--- {proc.name} output (tail) ---\n{proc.tail()}\n")
        raise
    finally:
        for proc in started:
            proc.stop()


def stop_pid(process: subprocess.Popen, timeout: float = 10.0) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout)
    if process.stdout is not None:
        with contextlib.suppress(OSError):
            process.stdout.close()


def hotpath_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "impl.cli", *args]


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for a server that cannot report a port-0 bind)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


#: how the router is started (`hotpath router`)
ROUTER_COMMAND: list[str] = [sys.executable, "-m", "impl.cli", "router"]


def read_ready_line(
    process: subprocess.Popen, matcher: Callable[[str], re.Match[str] | None], timeout: float
) -> re.Match[str] | None:
    """The first line of `process`'s (text) stdout that `matcher` accepts, or None if the process
    closed its stdout or `timeout` seconds passed first (never blocks past the deadline)."""
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                return None
            line = process.stdout.readline()
            if not line:
                return None
            match = matcher(line)
            if match:
                return match
    finally:
        selector.close()
    return None


def start_router(args: list[str], *, host: str = "127.0.0.1", timeout: float = 30.0) -> Proc:
    """`hotpath router --port 0 ARGS`; waits for its ready line (the URL it listens on)."""
    command = [*ROUTER_COMMAND, "--host", host, "--port", "0", *args]
    output = tempfile.TemporaryFile()  # noqa: SIM115 -- closed by Proc.stop
    process = subprocess.Popen(
        command,
        cwd=_ROOT,
        stdout=subprocess.PIPE,
        stderr=output,
        text=True,
        preexec_fn=die_with_parent,
    )
    match = read_ready_line(process, _URL.search, timeout)
    if match:
        return Proc("router", match.group(1), process, output, command)
    proc = Proc("router", "", process, output, command)
    text = proc.tail()
    proc.stop()
    raise RuntimeError(f"router did not become ready: {' '.join(command)}\n{text}")


def start_server(
    router_url: str,
    *,
    baseline: bool = False,
    extra: list[str] | tuple[str, ...] = (),
    host: str = "127.0.0.1",
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Proc:
    """`hotpath serve` on a free port; ready when GET /healthz answers 200. `cwd`: run the
    server of the source tree there (`python -m` imports `impl` from the working directory),
    e.g. another commit's, with this interpreter."""
    port = free_port(host)
    command = hotpath_command(
        "serve", "--host", host, "--port", str(port), "--router-url", router_url, *extra
    )
    if baseline:
        command.append("--baseline")
    output = tempfile.TemporaryFile()  # noqa: SIM115 -- closed by Proc.stop
    process = subprocess.Popen(
        command,
        cwd=cwd or _ROOT,
        stdout=output,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        preexec_fn=die_with_parent,
    )
    proc = Proc("server", f"http://{host}:{port}", process, output, command)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        # Not ready yet, or the port answers something else (another process took it between
        # our pick and our bind: the server then exits and the loop ends).
        with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
            status, _ = get_json(proc.url + "/healthz", timeout=2.0)
            if status == 200:
                return proc
        time.sleep(0.2)
    text = proc.tail()
    proc.stop()
    raise RuntimeError(f"server did not become ready: {' '.join(command)}\n{text}")


class PySpyMissing(RuntimeError):
    """py-spy is not installed beside this Python or on PATH."""


def pyspy_executable() -> str:
    """The py-spy executable: beside this Python (a venv's bin/), else on PATH."""
    exe = Path(sys.executable).with_name("py-spy")
    if exe.exists():
        return str(exe)
    found = shutil.which("py-spy")
    if found is None:
        raise PySpyMissing(
            f"profiles are recorded with py-spy, which is not installed here (looked beside "
            f"{sys.executable} and on PATH); install with pip install 'hotpath[dev]' "
            f"(or pip install 'py-spy>=0.3.14')"
        )
    return found


def start_pyspy(pid: int, prefix: Path, *, rate: int = 100) -> list[subprocess.Popen]:
    """Two non-blocking py-spy recorders of `pid`: PREFIX.speedscope.json and PREFIX.svg."""
    binary = pyspy_executable()
    prefix.parent.mkdir(parents=True, exist_ok=True)
    recorders = []
    for fmt, suffix in (("speedscope", ".speedscope.json"), ("flamegraph", ".svg")):
        command = [
            binary,
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate),
            "--nonblocking",
            "--subprocesses",
            "--format",
            fmt,
            "-o",
            str(prefix) + suffix,
        ]
        recorders.append(
            subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )
    return recorders


def stop_pyspy(recorders: list[subprocess.Popen], timeout: float = 60.0) -> None:
    """SIGINT makes py-spy write its file; SIGKILL if it does not exit in time."""
    for proc in recorders:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)
    for proc in recorders:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            stop_pid(proc, 1.0)
