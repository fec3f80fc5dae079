"""Faults injected into a load run: `--kill-one-at SECONDS` kills one server process (SIGKILL).

The server must run several processes (`--server-workers N`, i.e. `hotpath serve --workers N`):
at SECONDS into the measured window, a thread asks /healthz over fresh connections until it
meets a worker (a child of the supervisor) with forwards in flight, and kills that PID with
SIGKILL, as an out-of-memory kill or a crash would. What became of every sample is the run's
own count (completed, failed by class, unfinished); the fault adds the victim, when, how many
forwards it had in flight, and at the end the store's takeover and finished-twice counters.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any

import psutil

from impl.harness.watch import fetch_json, get_json


class KillOne(threading.Thread):
    """Kills one worker of the server supervisor `supervisor_pid` at `at` seconds."""

    def __init__(self, url: str, supervisor_pid: int, at: float) -> None:
        super().__init__(daemon=True, name="hotpath-kill-one")
        self.url, self.supervisor_pid, self.at = url, supervisor_pid, at
        self.outcome: dict[str, Any] = {"at_seconds": at, "killed_pid": None}
        self._halt = threading.Event()

    def _workers(self) -> set[int]:
        with contextlib.suppress(psutil.Error):
            children = psutil.Process(self.supervisor_pid).children()
            return {c.pid for c in children if "impl.cli" in " ".join(c.cmdline())}
        return set()

    def run(self) -> None:
        if self._halt.wait(self.at):
            return
        workers = self._workers()
        if len(workers) < 2:
            self.outcome["error"] = "the server runs fewer than 2 worker processes"
            return
        fallback = None
        for _ in range(200):  # fresh connections land on the workers at random
            with contextlib.suppress(OSError, ValueError):
                status, health = get_json(self.url + "/healthz", timeout=5.0)
                pid = (health or {}).get("process", {}).get("pid")
                if status == 200 and pid in workers:
                    fallback = fallback or (pid, health)
                    if health.get("forwards_in_flight", 0) > 0:
                        self._kill(pid, health)
                        return
        if fallback is not None:  # nobody has a forward in flight: kill one anyway
            self._kill(*fallback)
        else:
            self.outcome["error"] = "no worker answered /healthz"

    def _kill(self, pid: int, health: dict[str, Any]) -> None:
        os.kill(pid, signal.SIGKILL)
        self.outcome.update(
            killed_pid=pid,
            killed_worker=health["process"].get("worker"),
            killed_at_monotonic=time.monotonic(),
            its_forwards_in_flight=health.get("forwards_in_flight"),
            its_forwards_owned=(health.get("store_backend") or {}).get("forwards_owned"),
        )

    def finish(self) -> dict[str, Any]:
        """Stop (if it has not fired) and the outcome, with the store's counters now."""
        self._halt.set()
        self.join(30)
        self.outcome.pop("killed_at_monotonic", None)
        time.sleep(0.5)  # each process re-reads the shared store's counters every 0.2 s
        store = (fetch_json(self.url + "/healthz") or {}).get("store") or {}
        for name in ("takeovers", "finished_twice", "pending", "completed", "failed"):
            self.outcome[f"store_{name}"] = store.get(name)
        return self.outcome
