"""`hotpath loadtest --background-load FRACTION`: a fixed CPU burner beside the load run.

A production server runs on a host whose cores are busy with other work. Measured on a shared
machine, "under load" is whatever the other jobs happen to do; this makes it a scenario: one
burner process per core this process may use, each busy FRACTION of every 10 ms period
(arithmetic in a loop) and asleep for the rest, like a neighbour on the same host. The
burners run at the priority the load test gives the server (they inherit it, as the server
does: no nice), so they compete with it as an equal, not as a background job.

They stop by themselves: `BackgroundLoad` stops them by PID when the load test ends (or fails),
and each burner also exits when its parent is gone (it checks every period) or after its
`--seconds` deadline, so a killed load test leaves nothing running. `python -m
impl.harness.burner --fraction F --seconds S` runs one burner in the foreground.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

#: one busy-then-idle cycle, seconds
PERIOD = 0.01


def check_fraction(fraction: float) -> float:
    """`fraction` if it is a usable share of each period (0 < f <= 1), else ValueError."""
    if not 0 < fraction <= 1:
        raise ValueError(f"--background-load must be in (0, 1], got {fraction!r}")
    return fraction


def burn(fraction: float, seconds: float, parent: int, period: float = PERIOD) -> int:
    """Be busy `fraction` of every `period` until `seconds` passed or `parent` is no longer
    this process's parent; the number of periods run."""
    clock = time.perf_counter
    end = clock() + seconds
    cycles = 0
    x = 1
    while os.getppid() == parent:
        start = clock()
        if start >= end:
            break
        busy_until = start + fraction * period
        while clock() < busy_until:
            for _ in range(200):  # plain interpreter work between clock reads
                x = (x * 1103515245 + 12345) & 0xFFFFFFFF
        cycles += 1
        rest = start + period - clock()
        if rest > 0:
            time.sleep(rest)
    return cycles


def cores() -> int:
    """The cores this process may run on (one burner each)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


class BackgroundLoad:
    """Burner processes, one per core (or `processes`), each busy `fraction` of every 10 ms,
    for at most `seconds`; `stop()` ends them by PID and measures what they burned."""

    def __init__(self, fraction: float, *, seconds: float, processes: int | None = None) -> None:
        self.fraction = check_fraction(fraction)
        self.seconds = seconds
        self.count = processes or cores()
        self.procs: list[subprocess.Popen] = []
        self.cpu_seconds = 0.0
        self.wall_seconds = 0.0
        self._started = 0.0

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def start(self) -> None:
        command = [
            sys.executable,
            "-m",
            "impl.harness.burner",
            "--fraction",
            repr(self.fraction),
            "--seconds",
            repr(self.seconds),
            "--parent",
            str(os.getpid()),
        ]
        self._started = time.monotonic()
        for _ in range(self.count):
            self.procs.append(subprocess.Popen(command, stdin=subprocess.DEVNULL))

    def stop(self) -> None:
        """Stop every burner by its PID (SIGTERM, then SIGKILL), adding up their CPU time."""
        import psutil

        from impl.harness.procs import stop_pid

        for proc in self.procs:
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(proc.pid).cpu_times()
                self.cpu_seconds += times.user + times.system
            stop_pid(proc, timeout=5.0)
        if self._started:
            self.wall_seconds = time.monotonic() - self._started
        self.procs = []

    def stats(self) -> dict[str, Any]:
        """What the report keeps: the scenario and what the burners actually used."""
        return {
            "fraction": self.fraction,
            "processes": self.count,
            "period_ms": PERIOD * 1e3,
            "cpu_seconds": round(self.cpu_seconds, 2),
            "wall_seconds": round(self.wall_seconds, 2),
        }


def start(fraction: float | None, *, seconds: float) -> BackgroundLoad | None:
    """A started BackgroundLoad (None without a fraction), stopped at interpreter exit too."""
    if not fraction:
        return None
    load = BackgroundLoad(fraction, seconds=seconds)
    atexit.register(load.stop)
    load.start()
    return load


@contextlib.contextmanager
def running(fraction: float | None, *, seconds: float) -> Iterator[BackgroundLoad | None]:
    """A BackgroundLoad for the duration of the block (None: no background load)."""
    load = start(fraction, seconds=seconds)
    try:
        yield load
    finally:
        if load is not None:
            load.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m impl.harness.burner", description=__doc__)
    parser.add_argument("--fraction", type=float, required=True, help="busy share of each 10 ms")
    parser.add_argument("--seconds", type=float, default=3600.0, help="stop after this long")
    parser.add_argument(
        "--parent", type=int, default=None, help="exit once this PID is no longer the parent"
    )
    args = parser.parse_args(argv)
    check_fraction(args.fraction)
    burn(args.fraction, args.seconds, args.parent if args.parent else os.getppid())
    return 0


if __name__ == "__main__":
    sys.exit(main())
