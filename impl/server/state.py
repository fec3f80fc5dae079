"""What the lifespan builds and every route reads: one typed `State` (no module-level globals)."""

from __future__ import annotations

import asyncio
import gc
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from impl.server.callers import Callers
from impl.server.forward import ForwardRunner
from impl.server.intake import Intake
from impl.server.limits import Limits
from impl.server.picks import Picks
from impl.server.sessions import Sessions
from impl.server.settings import Settings
from impl.server.store import FutureStore


class LagMonitor:
    """Event-loop lag: how late a timer set every `interval` seconds fires (recent window)."""

    def __init__(self, interval: float = 0.25, window: int = 40) -> None:
        self.interval = interval
        self.samples: deque[float] = deque(maxlen=window)
        self._handle: asyncio.TimerHandle | None = None
        #: also called with each sample (seconds), e.g. the metrics' histogram
        self.observe: Callable[[float], None] | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + self.interval

        def tick() -> None:
            nonlocal due
            now = loop.time()
            lag = max(0.0, now - due)
            self.samples.append(lag)
            if self.observe is not None:
                self.observe(lag)
            due = now + self.interval
            self._handle = loop.call_at(due, tick)

        self._handle = loop.call_at(due, tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()

    def snapshot(self) -> dict[str, float]:
        samples = list(self.samples) or [0.0]
        return {
            "last": round(samples[-1] * 1e3, 3),
            "max_recent": round(max(samples) * 1e3, 3),
            "mean_recent": round(sum(samples) / len(samples) * 1e3, 3),
        }


class GcMonitor:
    """Garbage-collector pauses (gc.callbacks): count, total and recent worst per generation.

    A full (generation 2) collection walks every tracked object, and a server holding thousands
    of connections, tasks and records has many: its pause stops the event loop like any other
    blocking call, so /healthz shows it beside the loop lag.
    """

    def __init__(self, window: int = 64) -> None:
        self.pauses: deque[tuple[int, float]] = deque(maxlen=window)
        #: objects frozen when the monitor started (see `start`)
        self.frozen = 0
        self.counts = [0, 0, 0]
        self.total = [0.0, 0.0, 0.0]
        self._began = 0.0
        #: also called with (generation, seconds) for each collection, e.g. by the metrics
        self.observe: Callable[[int, float], None] | None = None

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        pause = time.perf_counter() - self._began
        generation = info["generation"]
        self.counts[generation] += 1
        self.total[generation] += pause
        self.pauses.append((generation, pause))
        if self.observe is not None:
            self.observe(generation, pause)

    def count_frozen(self) -> None:
        """Count the frozen objects (once the server froze them at start-up), for `snapshot`.

        Not counted per snapshot: gc.get_freeze_count() walks every frozen object (tens of
        thousands in the server, scattered in memory), milliseconds per call, and under
        probe-128x262k /healthz is asked every 50 ms."""
        self.frozen = gc.get_freeze_count()

    def start(self) -> None:
        self.count_frozen()
        gc.callbacks.append(self._callback)

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def snapshot(self) -> dict[str, object]:
        recent = list(self.pauses)
        return {
            "collections": list(self.counts),
            "total_ms": [round(t * 1e3, 1) for t in self.total],
            "max_recent_ms": round(max((p for _, p in recent), default=0.0) * 1e3, 3),
            "frozen_objects": self.frozen,
            "threshold": list(gc.get_threshold()),
        }


@dataclass
class State:
    settings: Settings
    picks: Picks
    store: FutureStore
    sessions: Sessions
    forwards: ForwardRunner
    lag: LagMonitor
    #: the decode design and why it was chosen (shown on /healthz)
    offloop_reason: str = ""
    gc: GcMonitor = field(default_factory=GcMonitor)
    #: impl.server.metrics.Metrics, or None with --no-metrics
    metrics: Any = None
    started: float = field(default_factory=time.monotonic)
    #: poll answers by kind: retrieve_future payload / try_again / metadata / failed /
    #: not_found, retrieve_futures polls and completions reported (shown on /healthz)
    polls: Counter[str] = field(default_factory=Counter)
    #: Hot-route copies of settings, in the form the raw handlers write them.
    poll_hold: float = 0.0
    retry_after: bytes = b"1"
    limits: Limits = field(default_factory=Limits)
    #: impl.server.accept.EagerAccept per listening socket (set once the server listens)
    acceptors: list[Any] = field(default_factory=list)
    #: connections refused before the app, by reason (impl.server.protocol.REASONS)
    http_refused: Counter[str] = field(default_factory=Counter)
    #: set on SIGTERM: /readyz answers 503 while the server drains (--drain-delay)
    draining: bool = False
    #: asamples admitted per loop turn (impl.server.intake)
    intake: Intake = field(default_factory=lambda: Intake(0))
    #: who may sample: each request's caller from its X-API-Key (impl.server.callers)
    callers: Callers = field(default_factory=lambda: Callers(None, max_outstanding=1 << 62))

    def uptime(self) -> float:
        return time.monotonic() - self.started
