"""uvicorn_h11: uvicorn with h11, the pure-Python HTTP/1.1 parser, for comparison.

Technique: uvicorn's `H11Protocol`, with h11's incomplete-event size set to
`--max-header-bytes` (h11 buffers at most that much of an unfinished head) and the probes
(`/livez`, `/readyz`) left out of the access log as the reference leaves them.
Why it is here: h11 is what uvicorn runs without httptools, and its parser is Python.
Caveats (the family's capability table): h11 bounds only a head still incomplete in its
buffer (400, not 431; a long head that arrives in one read is served); no header-count limit;
no head or body read timers.
"""

from __future__ import annotations

from typing import Any

from impl.runtime._uvicorn import UvicornRuntime


def protocol_class() -> type:
    """uvicorn's H11Protocol that does not access-log the probes."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from impl.server.protocol import QUIET_PATHS

    class QuietProbesH11Protocol(H11Protocol):
        def handle_events(self) -> None:
            super().handle_events()
            cycle = self.cycle
            if cycle is not None and cycle.scope.get("path") in QUIET_PATHS:
                cycle.access_log = False

    return QuietProbesH11Protocol


class H11Runtime(UvicornRuntime):
    name = "uvicorn_h11"

    def http(self, settings: Any) -> Any:
        return protocol_class()

    def extra(self, settings: Any) -> dict[str, Any]:
        return {"h11_max_incomplete_event_size": settings.max_header_bytes}


def create() -> H11Runtime:
    return H11Runtime()
