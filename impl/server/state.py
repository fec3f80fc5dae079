"""What the lifespan builds and every route reads: one typed `State` (no module-level globals)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from impl.server.forward import Forwarder
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

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + self.interval

        def tick() -> None:
            nonlocal due
            now = loop.time()
            self.samples.append(max(0.0, now - due))
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


@dataclass
class State:
    settings: Settings
    picks: Picks
    store: FutureStore
    sessions: Sessions
    forwarder: Forwarder
    lag: LagMonitor
    started: float = field(default_factory=time.monotonic)
    #: Hot-route copies of settings, in the form the raw handlers write them.
    poll_hold: float = 0.0
    retry_after: bytes = b"1"

    def uptime(self) -> float:
        return time.monotonic() - self.started
