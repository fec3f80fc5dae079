"""Counts kept in plain Python on the hot path, added into prometheus-client's objects at each
sync (every second and before each scrape): why the metrics cost little (metrics.py).

- `Tally`: one histogram child's observations (a bisect and two additions, where
  prometheus-client's `observe` takes a lock twice);
- `Mirror`: a labelled counter following counts another object keeps (held polls, store calls
  refused, connections refused by the HTTP limits): each sync adds the increase;
- `SyncTimer`: calls `Metrics.sync` every second on the event loop.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any


class Tally:
    """Observations of one histogram child counted in plain Python; `flush` adds them into the
    child. Only the event-loop thread may call `observe` and `flush` (no lock). It reads the
    child's `_upper_bounds`, `_buckets` and `_sum` (prometheus-client's histogram internals,
    unchanged since 0.4; tests/server/test_metrics.py fails if they change)."""

    __slots__ = ("bounds", "child", "counts", "total")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.bounds = list(child._upper_bounds)  # ends with +Inf
        self.counts = [0] * len(self.bounds)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1  # le: seconds <= bound
        self.total += seconds

    def flush(self) -> None:
        counts, total = self.counts, self.total
        if not any(counts):
            return
        self.counts, self.total = [0] * len(self.bounds), 0.0
        for bucket, n in zip(self.child._buckets, counts, strict=True):
            if n:
                bucket.inc(n)
        self.child._sum.inc(total)


class Mirror:
    """A labelled counter that follows counts kept elsewhere (plain ints on the hot path):
    `sync` adds each label's increase since the last sync."""

    def __init__(self, counter: Any, labels: list[tuple[str, ...]] = ()) -> None:
        self.counter = counter
        self.synced: dict[tuple[str, ...], int] = {}
        for known in labels:  # exported at 0 from the start
            counter.labels(*known)

    def sync(self, counts: dict[tuple[str, ...], int]) -> None:
        for labels, count in counts.items():
            delta = count - self.synced.get(labels, 0)
            if delta > 0:
                self.counter.labels(*labels).inc(delta)
                self.synced[labels] = count


class SyncTimer:
    """Calls `metrics.sync(state)` every `interval` seconds on the event loop."""

    def __init__(self, metrics: Any, state: Any, interval: float = 1.0) -> None:
        self.metrics, self.state, self.interval = metrics, state, interval
        self._handle: Any = None

    def start(self) -> None:
        import asyncio

        loop = asyncio.get_running_loop()

        def tick() -> None:
            self.metrics.sync(self.state)
            self._handle = loop.call_later(self.interval, tick)

        self._handle = loop.call_later(self.interval, tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
