"""The fake router's counters: what `GET /stats` reports, summed over its worker processes.

`Stats` keeps every counter in one int64 array under one lock, created before the workers
fork, so `--workers N` report one sum and `peak_in_flight` is the true peak of that sum.
`CountingServer` counts connections at the socket, but only those that carried a completion
request, so a client's own `/stats` and `/healthz` polls stay out of the count.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

from aiohttp import web

#: the faults the router injects (per request by header, or at random rates with --fail)
FAULTS = ("500", "html", "truncate", "reset")

_FIELDS = (
    "served", "in_flight", "peak_in_flight", "connections", "peak_connections", "faults",
    "generating", "peak_generating", "rendered", "refused", "packed",
    *(f"injected_{kind}" for kind in FAULTS),
)  # fmt: skip
_INDEX = {name: i for i, name in enumerate(_FIELDS)}
_PEAK = {
    "in_flight": "peak_in_flight",
    "connections": "peak_connections",
    "generating": "peak_generating",
}


class Stats:
    """Counters in one int64 array under one lock, shared by every worker process (fork)."""

    def __init__(self, workers: int = 1) -> None:
        ctx = multiprocessing.get_context("fork")
        self._values = ctx.RawArray("q", len(_FIELDS))
        self._lock = ctx.Lock()
        self.workers = workers

    def add(self, name: str, delta: int = 1) -> None:
        values, i = self._values, _INDEX[name]
        with self._lock:
            values[i] += delta
            peak = _PEAK.get(name)
            if peak is not None and values[i] > values[_INDEX[peak]]:
                values[_INDEX[peak]] = values[i]

    def snapshot(self, *, reset: bool = False) -> dict[str, Any]:
        with self._lock:
            data = dict(zip(_FIELDS, self._values, strict=True))
            if reset:
                for name in (
                    "served",
                    "faults",
                    "refused",
                    "packed",
                    *(f"injected_{k}" for k in FAULTS),
                ):
                    self._values[_INDEX[name]] = 0
                for name, peak in _PEAK.items():
                    self._values[_INDEX[peak]] = self._values[_INDEX[name]]
        out = {k: v for k, v in data.items() if not k.startswith("injected_")}
        out["injected"] = {k: data[f"injected_{k}"] for k in FAULTS if data[f"injected_{k}"]}
        out["workers"] = self.workers
        return out


class CountingServer(web.Server):
    """aiohttp's low-level server, counting open connections that carried a completion request.

    Counting at the socket but only connections that carried a `/v1/completions` request keeps
    a client's own `/stats` and `/healthz` polls out of the count, so an idle upstream reads 0.
    """

    def __init__(self, handler, stats: Stats, **kwargs) -> None:
        super().__init__(handler, **kwargs)
        self._stats = stats
        self._counted: set[Any] = set()

    def count_connection(self, handler: Any) -> None:
        """Count a connection (its protocol handler) once, when it first carries a completion."""
        if handler is not None and handler not in self._counted:
            self._counted.add(handler)
            self._stats.add("connections")

    def connection_lost(self, handler, exc=None) -> None:
        super().connection_lost(handler, exc)
        if handler in self._counted:
            self._counted.discard(handler)
            self._stats.add("connections", -1)
