"""The embedded store, kept running: started again when it dies, losing nothing it acknowledged.

`hotpath serve --workers N` (no `--store`) and `--store embedded` run their own redis-server
(`embedded.py`). A `Keeper` is that redis-server's supervisor, a thread in the process that
started it (the workers' supervisor, or the one server process): the thread waits on the child,
so a dead one is reaped at once (never left `<defunct>`), logs how it ended (exit status or
signal, and the end of its log), and starts it again on the same unix socket in the same private
directory, where the append-only file holds every write it acknowledged: the server processes'
client reconnects to the same URL and finds every result stored before the crash. Meanwhile the
server processes answer 503 + Retry-After (their health check calls the store away,
`health.py`), and the samples they were forwarding wait to be stored.

A restart that fails (the binary gone, the disk full, a damaged append-only file) is tried
again after 0.2, 0.5, 1, 2, then every 5 s, for as long as the server runs: the store may come
back (space freed). The first failure of an outage is logged with the reason, then once a
minute. The keeper writes its state to `keeper.json` beside the socket, so every server process
on that socket (the workers are other processes) shows it on `/healthz` (`store_backend` →
`embedded`) and gives it as the reason on `/readyz`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from typing import Any

from impl._figures import figures
from impl.server.store.redis import embedded

log = logging.getLogger("hotpath.server")
STATUS_FILE = "keeper.json"
#: Seconds between restart attempts that failed (the last one repeats).
BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0)
#: A restart still failing is logged again after this many seconds.
LOG_EVERY = 60.0


def how_it_ended(code: int) -> str:
    """An exit status in words: `killed by SIGKILL`, `exit status 1`."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit status {code}"


class Keeper:
    """A supervised embedded redis-server: `start()`, `url`, `stop()`."""

    def __init__(self, *, timeout: float = 15.0, extra: tuple[str, ...] = ()) -> None:
        self.timeout = timeout
        self.extra = extra  # server options, each start (embedded.memory_options)
        self.directory = tempfile.mkdtemp(prefix="hotpath-store-")
        self.socket = os.path.join(self.directory, "redis.sock")
        self.server: embedded.EmbeddedRedis | None = None
        self.state = "starting"
        self.restarts = 0
        self.last_exit: str | None = None
        self.error: str | None = None
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def pid(self) -> int | None:
        return self.server.pid if self.server is not None else None

    def start(self) -> None:
        """Start redis-server and its keeper thread; RuntimeError if the first start fails.

        The thread starts every redis-server itself: a child's parent-death signal follows the
        thread that started it, and this thread lives as long as the child does."""
        self._thread = threading.Thread(target=self._run, name="hotpath-store-keeper", daemon=True)
        self._thread.start()
        self._started.wait()
        if self.server is None:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise RuntimeError(self.error or "the embedded store did not start")

    def _run(self) -> None:
        try:
            self.server = embedded.start(self.timeout, directory=self.directory, extra=self.extra)
            self._set("running")  # before start() returns: keeper.json is there for every process
        except RuntimeError as exc:
            self.error = str(exc)
            return
        finally:
            self._started.set()
        while not self._stopping.is_set():
            code = self.server.process.wait()
            if self._stopping.is_set():
                return
            self._restart(self.server.pid, code)

    def _restart(self, pid: int, code: int) -> None:
        """Start redis-server again on the same dir until it runs or the keeper stops."""
        self.restarts += 1
        self.last_exit = how_it_ended(code)
        log.warning(
            "the embedded store (redis-server pid %d) exited (%s): starting it again on %s; "
            "its log ends: %s",
            pid,
            self.last_exit,
            self.socket,
            embedded.tail(os.path.join(self.directory, "redis.log"), 300).strip(),
        )
        self._set("restarting")
        began = time.monotonic()
        logged = 0.0
        for attempt in itertools.count():
            try:
                server = embedded.start(self.timeout, directory=self.directory, extra=self.extra)
            except RuntimeError as exc:
                self.error = str(exc)
                self._set("restarting")
                if not logged or time.monotonic() - logged > LOG_EVERY:
                    logged = time.monotonic()
                    log.error(
                        "the embedded store could not be started again (attempt %d): %s; "
                        "retrying (store calls answer 503 meanwhile)",
                        attempt + 1,
                        exc,
                    )
                if self._stopping.wait(BACKOFF[min(attempt, len(BACKOFF) - 1)]):
                    return
                continue
            self.server, self.error = server, None
            if self._stopping.is_set():  # stop() came while it started
                server.stop(keep=True)
                return
            log.warning(
                "the embedded store is back (redis-server pid %d) after %.1f s",
                server.pid,
                time.monotonic() - began,
            )
            self._set("running")
            return

    def _set(self, state: str) -> None:
        """Record the state, in `keeper.json` first (read by every server process), then here:
        whoever sees the new `state` on this object finds it in the file too."""
        status = {**self.status(), "state": state}
        path = os.path.join(self.directory, STATUS_FILE)
        with contextlib.suppress(OSError):
            with open(path + ".tmp", "w") as f:
                json.dump(status, f)
            os.replace(path + ".tmp", path)
        self.state = state

    def status(self) -> dict[str, Any]:
        return figures(self, "state", "pid", "restarts", "last_exit", "error")

    def stop(self) -> None:
        """Stop redis-server (SIGTERM by PID) and the keeper; the private dir goes too."""
        self._stopping.set()
        if self.server is not None:
            self.server.stop(keep=True)
        if self._thread is not None:
            self._thread.join(self.timeout + 15.0)
        if self.server is not None:  # started while stopping
            self.server.stop(keep=True)
        shutil.rmtree(self.directory, ignore_errors=True)


def status_of(url: str) -> dict[str, Any] | None:
    """The keeper's state for a store URL on its socket (any server process can read it), or
    None when the store is not a kept embedded one."""
    if not url.startswith("unix://"):
        return None
    path = os.path.join(os.path.dirname(url[len("unix://") :]), STATUS_FILE)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
