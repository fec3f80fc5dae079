"""Helpers of the fault tests: a redis-server of the test's own, server figures, logs, RSS.

`OwnStore` is a real redis-server on a free loopback port with its append-only file in the
test's directory (so a kill -9 and a start again lose nothing it acknowledged), killed,
stopped and continued by its PID. The rest reads what a server said: its responses by status
from /metrics, the lines of its log that must never appear, the RSS of its process tree.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil

from impl.harness.procs import free_port
from impl.server.store.redis import embedded
from tests.support.server import start_server

#: What a server's log must never say under faults.
NEVER_LOGGED = ("Traceback", "never retrieved", "Exception in ASGI application")
_STATUS = re.compile(r"^hotpath_http_request_duration_seconds_count\{(.*)\} ([0-9.e+]+)$")


class OwnStore:
    """A redis-server on 127.0.0.1:PORT, data in `directory` (appendonly), stopped by PID."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.port = free_port()
        self.server: embedded.EmbeddedRedis | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.server is not None
        return self.server.pid

    def start(self) -> None:
        options = ("--port", str(self.port), "--bind", "127.0.0.1")
        self.server = embedded.start(directory=self.directory, extra=options)

    def kill(self) -> None:
        """kill -9, and reap it."""
        os.kill(self.pid, signal.SIGKILL)
        self.server.process.wait(10)

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.server is not None and self.server.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)  # a stopped engine cannot handle SIGTERM
            self.server.stop(keep=True)


@dataclass
class OnOwnStore:
    """What `server_on_own_store` yields: the engine to fault, the server, and (once the block
    ended) the server's log."""

    engine: OwnStore
    server: Any
    log: str = ""


@contextlib.contextmanager
def server_on_own_store(upstream_url: str, directory: str, *flags: str) -> Iterator[OnOwnStore]:
    """`hotpath serve --store` on an `OwnStore` in `directory`, for the block to kill or pause;
    after it the engine is stopped and the server's log must hold nothing of NEVER_LOGGED."""
    engine = OwnStore(directory)
    try:
        with start_server(upstream_url, "--store", engine.url, *flags) as server:
            own = OnOwnStore(engine, server)
            yield own
            own.log = server.stderr()
    finally:
        engine.stop()
    assert not never_logged(own.log), never_logged(own.log)


def statuses(url: str) -> Counter[int]:
    """The server's responses so far by status (every route; /metrics, all processes)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    counts: Counter[int] = Counter()
    for line in text.splitlines():
        match = _STATUS.match(line)
        if match:
            status = re.search(r'status="(\d+)"', match.group(1))
            counts[int(status.group(1))] += int(float(match.group(2)))
    return counts


def bad_statuses(counts: Counter[int]) -> dict[int, int]:
    """The 5xx answers other than 503 (the only 5xx the server may give under faults)."""
    return {status: n for status, n in counts.items() if status >= 500 and status != 503}


def never_logged(text: str) -> list[str]:
    """The lines of a server's log that must not be there (tracebacks, unretrieved errors)."""
    return [line for line in text.splitlines() if any(bad in line for bad in NEVER_LOGGED)]


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and its descendants that are server processes (not the
    redis-server or decode/fetch children, whose memory is not the HTTP front's)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if "serve" in process.cmdline():
                total += process.memory_info().rss
    return total


class RssWatch(threading.Thread):
    """The peak of `tree_rss(pid)`, sampled every 50 ms until `stop()`."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.start_rss = tree_rss(pid)
        self.peak = self.start_rss
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.05):
            self.peak = max(self.peak, tree_rss(self.pid))

    def stop(self) -> int:
        """Stop; the growth of the peak over the RSS at start, in bytes."""
        self._halt.set()
        self.join(5)
        return self.peak - self.start_rss
