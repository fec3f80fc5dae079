"""`GET /healthz`: picks and why, decode design and why, the store (kind, address, round trip)
and its counts, why held polls answered (`impl.server.store.held`), the answering process,
event-loop lag, GC pauses.
`GET /metrics`: the same and more in Prometheus text format (see impl/server/metrics.py)."""

from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from impl.server.routes.deps import ApiError, ServerState

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(state: ServerState) -> dict[str, Any]:
    """Liveness and what the server is running; no API key needed."""
    return {
        "status": "ok",
        "baseline": state.settings.baseline,
        "picks": state.picks.as_json(),
        "store": state.store.stats(),
        "store_backend": state.store.describe(),
        "process": {"pid": os.getpid(), "worker": state.settings.worker_index},
        "session_poll": {
            "on": state.settings.session_poll_off() is None,
            "why_off": state.settings.session_poll_off(),
        },
        "sessions": state.sessions.stats(),
        "polls": dict(state.polls),
        "held_polls": state.store.held_polls.snapshot(),
        "intake": state.intake.stats(),
        "forwards_in_flight": len(state.forwards.tasks),
        "forward_attempts": state.forwards.attempts,
        "offloop": {
            "design": state.forwards.decoding.name,
            "reason": state.offloop_reason,
            **state.forwards.decoding.stats(),
            "body_budget": state.forwards.budget.stats(),
        },
        "accept": {
            "eager": bool(state.acceptors),
            **{k: sum(a.stats()[k] for a in state.acceptors) for k in ("accepted", "bursts")},
        },
        "event_loop_lag_ms": state.lag.snapshot(),
        "gc": state.gc.snapshot(),
        "uptime_s": round(state.uptime(), 1),
    }


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text exposition format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        404: {"description": "metrics are off (--no-metrics)"},
    },
)
async def metrics(state: ServerState) -> Response:
    """Prometheus metrics (request latencies per route and status, per-step times, store,
    upstream failures, loop lag, GC pauses, picks); no API key needed, as for /healthz."""
    if state.metrics is None:
        raise ApiError(404, "metrics are off: the server runs with --no-metrics")
    body, content_type = state.metrics.exposition(state)
    return Response(body, media_type=content_type)
