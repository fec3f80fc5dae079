"""`hotpath serve --workers N`: N server processes answering one port, all on one shared store.

This process is a supervisor. It starts the embedded redis-server when no `--store` URL was
given (and keeps it running: started again when it dies, `store/redis/keeper.py`), holds the
port (a socket bound with SO_REUSEPORT that never listens, so `--port 0` resolves once; a
second one answers the probes until the workers listen, `impl.server.starting`), and starts N
`hotpath serve` children whose settings arrive as `HOTPATH_*` variables: the same settings and
picks, the store's URL, `--worker-index i` and `--reuse-port` (and, unless set, a fresh
`PROMETHEUS_MULTIPROC_DIR`, so that any worker's /metrics answers for all). Each child binds
its own listening socket to that port with SO_REUSEPORT, so the kernel spreads new connections
across the processes and no process hands sockets to another. Once every child printed its
ready line, the supervisor prints its own. A child that exits unexpectedly (kill -9) is logged
and started again; meanwhile the others answer every call, and the forwards it owned are taken
over when their lease lapses. SIGTERM or SIGINT stops the children by PID, then the embedded
store. SIGHUP is passed on to every child by PID (each reads the `--api-keys` file again).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO

from impl import registry
from impl._process import die_with_parent
from impl.server.picks import Picks, choose_or_explain
from impl.server.settings import Settings, env_name
from impl.server.starting import Starting
from impl.server.store.redis.embedded import memory_options
from impl.server.store.redis.keeper import Keeper

log = logging.getLogger("hotpath.server")
_READY = re.compile(r"^hotpath-server listening on (http://\S+)$")


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) with SO_REUSEPORT (and SO_REUSEADDR), not listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def child_environment(settings: Settings, picks: Picks, index: int) -> dict[str, str]:
    """The environment of worker `index`: every setting as a `HOTPATH_*` variable."""
    env = dict(os.environ)
    values = dataclasses.asdict(settings)
    values.update(workers=1, worker_index=index, reuse_port=True, calibrate=False)
    for family in registry.all_families():
        values[family] = getattr(picks, family).name
    for name, value in values.items():
        if value is None:
            env.pop(env_name(name), None)
        elif isinstance(value, bool):
            env[env_name(name)] = "1" if value else "0"
        else:
            env[env_name(name)] = str(value)
    return env


class Worker:
    """One child `hotpath serve`; a thread relays its stdout and notes its ready line."""

    def __init__(self, index: int, env: dict[str, str]) -> None:
        self.index = index
        self.ready = threading.Event()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "impl.cli", "serve"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            preexec_fn=die_with_parent,
        )
        self.relay = threading.Thread(target=self._relay, args=(self.process.stdout,), daemon=True)
        self.relay.start()

    def _relay(self, stream: IO[bytes]) -> None:
        out = sys.stdout.buffer
        for line in stream:
            if not self.ready.is_set() and _READY.match(line.decode(errors="replace").strip()):
                self.ready.set()
                log.info("worker %d (pid %d) is listening", self.index, self.process.pid)
                continue
            with contextlib.suppress(OSError, ValueError):
                out.write(line)
                out.flush()

    def terminate(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)

    def stop(self, timeout: float) -> None:
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout)


def start_embedded_store(max_result_bytes: int) -> Keeper | None:
    """The embedded redis-server of `--store embedded` (one process or several), supervised
    (`impl.server.store.redis.keeper`) and its memory capped for `--max-result-bytes`; None, the
    reason printed for `hotpath serve`, when it cannot start."""
    keeper = Keeper(extra=memory_options(max_result_bytes))
    try:
        keeper.start()
    except RuntimeError as exc:
        print(f"hotpath serve: {exc}", file=sys.stderr)
        return None
    return keeper


def supervise(settings: Settings) -> int:
    """Run `settings.workers` server processes until SIGTERM/SIGINT; the exit status.

    While it picks the implementations, starts the embedded store and waits for its workers,
    a second socket on the held port answers the probes (`impl.server.starting`)."""
    stopping = threading.Event()
    signals = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in signals}
    workers: list[Worker] = []

    def hangup(*_: object) -> None:
        """SIGHUP: every worker reads the key file again (by PID)."""
        for worker in workers:
            if worker.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.process.pid, signal.SIGHUP)

    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, hangup)
    holder = reuse_port_socket(settings.host, settings.port)
    host, port = holder.getsockname()[:2]
    front = reuse_port_socket(host, port)
    front.listen(settings.backlog)
    starting: Starting | None = Starting(front, "picking the implementations").start()
    store = None
    metrics_dir = None
    try:
        picks = choose_or_explain(settings)
        if picks is None:
            return 2
        if settings.store_kind() == "embedded":
            starting.why = "starting the embedded store"
            store = start_embedded_store(settings.max_result_bytes)
            if store is None:
                return 2
            log.info("embedded store: redis-server pid %d on %s", store.pid, store.url)
        if settings.metrics and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            # any worker's /metrics answers for all of them (prometheus-client multiprocess mode)
            metrics_dir = tempfile.mkdtemp(prefix="hotpath-metrics-")
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        shared = dataclasses.replace(
            settings, port=port, store=store.url if store else settings.store
        )
        starting.why = "starting the worker processes"
        workers.extend(
            Worker(i, child_environment(shared, picks, i)) for i in range(settings.workers)
        )
        if not _await_ready(workers, stopping, timeout=120.0):
            return 3
        starting.stop(drain=True)  # the workers listen: answer what is queued here, then close
        front.close()
        starting = None
        print(f"hotpath-server listening on http://{host}:{port}", flush=True)
        while not stopping.wait(0.2):
            for i, worker in enumerate(workers):
                code = worker.process.poll()
                if code is not None:
                    log.warning(
                        "worker %d (pid %d) exited with %s; starting it again",
                        i,
                        worker.process.pid,
                        code,
                    )
                    workers[i] = Worker(i, child_environment(shared, picks, i))
        return 0
    finally:
        if starting is not None:
            starting.stop()
            front.close()
        for worker in workers:  # all at once: each gets the whole shutdown time
            worker.terminate()
        for worker in workers:
            worker.stop(settings.shutdown_timeout + settings.drain_delay + 5.0)
        holder.close()
        if store is not None:
            store.stop()
        if metrics_dir is not None:
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
            shutil.rmtree(metrics_dir, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _await_ready(workers: list[Worker], stopping: threading.Event, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    for worker in workers:
        while not worker.ready.wait(0.1):
            if worker.process.poll() is not None or stopping.is_set():
                print(f"hotpath serve: worker {worker.index} did not start", file=sys.stderr)
                return False
            if time.monotonic() > deadline:
                print(f"hotpath serve: worker {worker.index} not ready in time", file=sys.stderr)
                return False
    return True
