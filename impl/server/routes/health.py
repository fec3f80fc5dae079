"""The probes, as operators use them (Kubernetes' conventions), and the detail behind them.

- `GET /livez`: liveness. The process and its event loop answer: a constant, no store call,
  no state read (raw ASGI, like the hot routes: a probe costs the least a request can).
- `GET /readyz`: readiness. 200 when this process can serve samples; 503 with the reasons
  while the shared store is away or silent for over `--store-timeout` (with the embedded
  store's keeper state when it is one), and while the server drains after SIGTERM
  (`--drain-delay`). Before the app runs (picks calibrating, the lifespan starting) the
  start-up responder answers it 503 (`impl.server.starting`).
- `GET /healthz`: the detail: ready or not and why, picks and why, decode design and why, the
  store (kind, address, round trip, availability, calls refused while away, the keeper) and
  its counts, why held polls answered (`impl.server.store.held`), connections refused by the
  HTTP limits (`impl.server.protocol`), the answering process, event-loop lag, GC pauses.
  Always 200 (an operator reads it; the probes decide).
- `GET /metrics`: the same and more in Prometheus text format (see impl/server/metrics.py).
"""

from __future__ import annotations

import os
from typing import Any

import orjson
from fastapi import APIRouter
from fastapi.responses import Response

from impl.server.routes._raw import RawRoute, Receive, Scope, Send, respond
from impl.server.routes.deps import ApiError, ServerState
from impl.server.state import State
from impl.server.store.redis.keeper import status_of

router = APIRouter(tags=["health"])
LIVE = b'{"status":"ok"}'
READY = b'{"status":"ready"}'


def not_ready(state: State) -> list[str]:
    """Why this process cannot serve samples now (empty: it can)."""
    why = []
    if state.draining:
        why.append("draining: the server received SIGTERM and is shutting down")
    store = state.store.unavailable()
    if store is not None:
        keeper = status_of(state.settings.store)
        if keeper is not None and keeper["state"] != "running":
            store += (
                f"; the embedded store is {keeper['state']} (restarts {keeper['restarts']}, "
                f"last exit: {keeper['last_exit']}, last error: {keeper['error']})"
            )
        why.append(store)
    return why


async def livez(scope: Scope, receive: Receive, send: Send) -> None:
    """Liveness: the process and its event loop answer (no store call)."""
    await respond(send, 200, LIVE)


async def readyz(scope: Scope, receive: Receive, send: Send) -> None:
    """Readiness: 200 when this process can serve samples, else 503 with the reasons (the
    shared store away or silent, draining after SIGTERM)."""
    state = scope["state"]["server"]
    why = not_ready(state)
    if not why:
        return await respond(send, 200, READY)
    body = orjson.dumps({"status": "not ready", "why": why})
    await respond(send, 503, body, headers=((b"retry-after", state.retry_after),))


def routes() -> list[RawRoute]:
    probe = {"content": {"application/json": {"schema": {"type": "object"}}}}
    return [
        RawRoute(
            "/livez",
            livez,
            methods=["GET"],
            tags=["health"],
            openapi_extra={"responses": {"200": {"description": "alive", **probe}}},
        ),
        RawRoute(
            "/readyz",
            readyz,
            methods=["GET"],
            tags=["health"],
            openapi_extra={
                "responses": {
                    "200": {"description": "ready to serve samples", **probe},
                    "503": {"description": '{"status": "not ready", "why": [...]}', **probe},
                }
            },
        ),
    ]


@router.get("/healthz")
async def healthz(state: ServerState) -> dict[str, Any]:
    """What the server is running and whether it is ready (always 200; no API key needed)."""
    why = not_ready(state)
    backend = state.store.describe()
    keeper = status_of(state.settings.store)
    if keeper is not None:
        backend["embedded"] = keeper
    return {
        "status": "ok" if not why else "not ready",
        "ready": not why,
        "why_not_ready": why,
        "baseline": state.settings.baseline,
        "picks": state.picks.as_json(),
        "store": state.store.stats(),
        "store_backend": backend,
        "process": {"pid": os.getpid(), "worker": state.settings.worker_index},
        "session_poll": {
            "on": state.settings.session_poll_off() is None,
            "why_off": state.settings.session_poll_off(),
        },
        "sessions": state.sessions.stats(),
        "callers": state.callers.describe(),
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
        "http_refused": dict(state.http_refused),
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
