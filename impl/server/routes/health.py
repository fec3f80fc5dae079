"""`GET /healthz`: picks and why, store counts, stored bytes, event-loop lag, GC pauses."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from impl.server.routes.deps import ServerState

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(state: ServerState) -> dict[str, Any]:
    """Liveness and what the server is running; no API key needed."""
    return {
        "status": "ok",
        "baseline": state.settings.baseline,
        "picks": state.picks.as_json(),
        "store": state.store.stats(),
        "sessions": state.sessions.stats(),
        "forwards_in_flight": len(state.forwarder.tasks),
        "forward_attempts": state.forwarder.attempts,
        "event_loop_lag_ms": state.lag.snapshot(),
        "gc": state.gc.snapshot(),
        "uptime_s": round(state.uptime(), 1),
    }
