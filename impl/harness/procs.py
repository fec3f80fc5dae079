"""Start, watch and stop the processes of a load run: the fake router, the server, py-spy.

Every process is started here as a child on loopback and stopped by its PID (SIGTERM, then
SIGKILL). `Sampler` is a thread that, while the load runs, samples the server's RSS, open fds and
CPU time through psutil and the latency of `GET /healthz` on a fresh connection each time (as a
load balancer's health check would see it), and scrapes `GET /metrics` every few seconds (the
per-step split of each result's time over the measured window, `impl.harness.steps`).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

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
    process = subprocess.Popen(command, cwd=_ROOT, stdout=subprocess.PIPE, stderr=output, text=True)
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
) -> Proc:
    """`hotpath serve` on a free port; ready when GET /healthz answers 200."""
    port = free_port(host)
    command = hotpath_command(
        "serve", "--host", host, "--port", str(port), "--router-url", router_url, *extra
    )
    if baseline:
        command.append("--baseline")
    output = tempfile.TemporaryFile()  # noqa: SIM115 -- closed by Proc.stop
    process = subprocess.Popen(
        command,
        cwd=_ROOT,
        stdout=output,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
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


def get_json(url: str, timeout: float = 10.0) -> tuple[int, Any]:
    """GET `url` on a fresh connection: (status, parsed JSON or None)."""
    status, body, _ = probe(url, timeout)
    return status, body


def probe(url: str, timeout: float = 10.0) -> tuple[int, Any, float]:
    """GET `url` on a fresh connection: (status, parsed JSON or None, seconds to connect).

    A failure after the connection was made carries the connect time as `.connected` on the
    exception (a probe that connects at once and then waits for its answer is a server that
    took the connection but did not serve it, not a full listen queue)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    started = time.perf_counter()
    connected = None
    try:
        conn.connect()
        connected = time.perf_counter() - started
        conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""))
        response = conn.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as exc:
        exc.connected = connected
        raise
    finally:
        conn.close()
    try:
        return response.status, json.loads(body), connected
    except ValueError:
        return response.status, None, connected


def scrape_steps(url: str, timeout: float = 10.0) -> Any:
    """The per-step totals of a server's GET /metrics, or None (metrics off, or no answer)."""
    from impl.harness import steps

    try:
        with urllib.request.urlopen(url + "/metrics", timeout=timeout) as response:
            return steps.parse(response.read().decode())
    except (OSError, ValueError, ImportError):
        return None


class Sampler(threading.Thread):
    """Samples a server's RSS, fds, CPU time and /healthz latency every `interval` seconds, and
    its /metrics every `metrics_every` samples."""

    def __init__(
        self,
        pid: int | None,
        url: str | None,
        interval: float = 0.5,
        router_pid: int | None = None,
        metrics_every: int = 4,
    ) -> None:
        super().__init__(daemon=True, name="hotpath-sampler")
        self.pid, self.url, self.interval = pid, url, interval
        self.metrics_every = metrics_every
        self._router = None
        if router_pid:
            with contextlib.suppress(psutil.Error):
                self._router = psutil.Process(router_pid)
        self.cpu_end = None
        self.healthz: Any = None
        self._halt = threading.Event()
        self._proc = None
        if pid:
            with contextlib.suppress(psutil.Error):
                self._proc = psutil.Process(pid)
        self.restart()

    def _cpu(self, root: psutil.Process | None = ...) -> float | None:
        root = self._proc if root is ... else root
        if root is None:
            return None
        total = 0.0
        with contextlib.suppress(psutil.Error):
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    times = proc.cpu_times()
                    total += times.user + times.system
        return total

    def restart(self) -> None:
        """Start the measured window now (after warm-up): CPU from here, peaks from here."""
        self.cpu_start = self._cpu()
        self.router_cpu_start = self._cpu(self._router)
        self.peak_rss = self.peak_fds = 0
        self.healthz_latencies: list[float] = []
        #: per probe: seconds into the window, /healthz latency, of which TCP connect (None:
        #: the connection was never made; set on a failed probe that did connect), then
        #: from the server's answer its worst event-loop lag of the last ~10 s and its worst
        #: recent GC pause (ms)
        self.healthz_timeline: list[tuple[float, float, float | None, Any, Any]] = []
        self.healthz_failures = 0
        self._window_start = time.monotonic()
        #: per-step totals from /metrics at the window's start, and per scrape since:
        #: (seconds into the window, {step: [count, seconds]} since the start)
        self.steps_start = scrape_steps(self.url) if self.url else None
        self.steps_last = self.steps_start
        self.steps_timeline: list[tuple[float, dict[str, list[float]]]] = []

    def _sample_process(self) -> None:
        if self._proc is None:
            return
        rss = fds = 0
        with contextlib.suppress(psutil.Error):
            for proc in [self._proc, *self._proc.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    rss += proc.memory_info().rss
                    fds += proc.num_fds()
        self.peak_rss, self.peak_fds = max(self.peak_rss, rss), max(self.peak_fds, fds)

    def _sample_healthz(self) -> None:
        if not self.url:
            return
        started = time.perf_counter()
        connected = None
        try:
            status, body, connected = probe(self.url + "/healthz", timeout=10.0)
        except (OSError, http.client.HTTPException) as exc:
            status, body, connected = 0, None, getattr(exc, "connected", None)
        latency = time.perf_counter() - started
        self.healthz_latencies.append(latency)
        lag = pause = None
        if status == 200 and isinstance(body, dict):
            lag = (body.get("event_loop_lag_ms") or {}).get("max_recent")
            pause = (body.get("gc") or {}).get("max_recent_ms")
        offset = round(time.monotonic() - self._window_start, 3)
        connected = None if connected is None else round(connected, 4)
        self.healthz_timeline.append((offset, round(latency, 4), connected, lag, pause))
        if status == 200:
            self.healthz = body
        else:
            self.healthz_failures += 1

    def _sample_metrics(self) -> None:
        from impl.harness import steps

        if not self.url or self.steps_start is None:
            return  # the server exports no metrics (--no-metrics): nothing to follow
        totals = scrape_steps(self.url)
        if totals is None:
            return
        self.steps_last = totals
        by_step: dict[str, list[float]] = {}
        for row in steps.split(self.steps_start, totals):
            entry = by_step.setdefault(row["step"], [0, 0.0])
            entry[0] += row["count"]
            entry[1] = round(entry[1] + row["seconds"], 6)
        offset = round(time.monotonic() - self._window_start, 3)
        self.steps_timeline.append((offset, by_step))

    def run(self) -> None:
        beat = 0
        while not self._halt.is_set():
            began = time.monotonic()
            self._sample_process()
            self._sample_healthz()
            beat += 1
            if beat % self.metrics_every == 0:
                self._sample_metrics()
            self._halt.wait(max(0.0, self.interval - (time.monotonic() - began)))

    def finish(self) -> dict[str, Any]:
        """Stop sampling; the figures for the report."""
        self._halt.set()
        if self.is_alive():
            self.join(15)
        self._sample_process()
        self._sample_healthz()  # every window has at least one, however short the run
        self._sample_metrics()
        self.cpu_end = self._cpu()
        cpu = router_cpu = None
        if self.cpu_start is not None and self.cpu_end is not None:
            cpu = round(self.cpu_end - self.cpu_start, 2)
        router_end = self._cpu(self._router)
        if self.router_cpu_start is not None and router_end is not None:
            router_cpu = round(router_end - self.router_cpu_start, 2)
        return {
            "peak_rss_bytes": self.peak_rss or None,
            "peak_fds": self.peak_fds or None,
            "cpu_seconds": cpu,
            "router_cpu_seconds": router_cpu,
            "healthz_failures": self.healthz_failures,
        }

    def step_split(self) -> list[dict[str, Any]]:
        """Per step and implementation over the window (empty without metrics)."""
        from impl.harness import steps

        return steps.split(self.steps_start, self.steps_last)


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


def fetch_json(url: str, timeout: float = 10.0) -> Any:
    """GET a JSON document or None (the router's /stats, the server's /healthz)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None
