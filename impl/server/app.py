"""`create_app(settings)`: the FastAPI app, its lifespan and its hot-path dispatch.

The lifespan picks (or receives) each family's implementation by registry name, so a bad name
fails at start-up; opens the pool, the store and the event-loop lag monitor; yields one typed
`State` that routes read from `request.state.server` (raw routes: `scope["state"]["server"]`);
and on shutdown wakes held polls, cancels forwards and closes the pool.

`HotpathApp` sends the hot routes (asample, retrieve_future, retrieve_futures) and the probes
(`/livez`, `/readyz`) straight to their raw ASGI handlers before FastAPI's middleware stack and
router; every other request, and the OpenAPI schema, is plain FastAPI. A shared store that is
away answers 503 + Retry-After on every route (`StoreUnavailable`, on the raw routes and here).
With metrics on (the default), every HTTP request but the probes first passes the metrics'
pure ASGI middleware (`impl.server.metrics.Metrics.http`), which times and counts it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse

import impl.encode
from impl.server import limits as limits_module
from impl.server import offloop, routes, upstream
from impl.server import picks as picks_module
from impl.server.baseline import BaselineStore
from impl.server.budget import BodyBudget
from impl.server.callers import Callers
from impl.server.forward import ForwardRunner
from impl.server.intake import Intake
from impl.server.limits import Limits
from impl.server.offloop.children import return_big_buffers
from impl.server.picks import Picks
from impl.server.protocol import QUIET_PATHS as QUIET
from impl.server.routes._raw import RawRoute, respond
from impl.server.routes.deps import ApiError
from impl.server.schemas import openapi_components
from impl.server.sessions import Sessions
from impl.server.settings import Settings
from impl.server.state import LagMonitor, State
from impl.server.store import FutureStore, Retention, StoreUnavailable
from impl.server.store.memory import MemoryStore

log = logging.getLogger("hotpath.server")


class HotpathApp(FastAPI):
    """FastAPI, except that requests to a RawRoute skip the middleware stack and router."""

    def __init__(self, *args: Any, limits: Limits | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: (method, path) -> raw ASGI handler, filled by create_app from the RawRoutes.
        self.hot: dict[tuple[str, str], Any] = {}
        self.limits = limits or Limits()
        #: impl.server.metrics.Metrics while the lifespan runs with metrics on
        self.metrics: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # the probes skip the metrics (an orchestrator's probes would be most of the counts)
        if self.metrics is not None and scope["type"] == "http" and scope["path"] not in QUIET:
            # a hot route's handler is timed directly (what `dispatch` would call)
            handler = self.hot.get((scope["method"], scope["path"])) or self.dispatch
            await self.metrics.http(scope, receive, send, handler)
            return
        await self.dispatch(scope, receive, send)

    async def dispatch(self, scope: Any, receive: Any, send: Any) -> None:
        """A hot route's raw handler, else FastAPI once the body passed the limits (what the
        metrics middleware wraps)."""
        if scope["type"] == "http":
            handler = self.hot.get((scope["method"], scope["path"]))
            if handler is not None:
                await handler(scope, receive, send)
                return
            if scope["method"] != "GET":
                receive = await self._checked_body(scope, receive, send)
                if receive is None:
                    return
        await super().__call__(scope, receive, send)

    async def _checked_body(self, scope: Any, receive: Any, send: Any) -> Any:
        """A `receive` that replays the body once it passed the size cap and `strict_json`,
        or None after answering 413 / 400 (FastAPI's own parser would answer 500 for some)."""
        cap, flag = self.limits.body_cap(scope["path"])
        body = await limits_module.read_capped(scope, receive, cap)
        if isinstance(body, limits_module.OverCap):
            message = limits_module.error_body(limits_module.size_message(cap, flag))
            await respond(send, 413, message, headers=body.headers)
            return None
        problem = limits_module.strict_json(body) if body else None
        if problem is not None:
            await respond(send, 400, limits_module.error_body(problem))
            return None
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return replay


def _store(settings: Settings, encoder: Any) -> FutureStore:
    retention = Retention(
        completed_ttl=settings.completed_ttl,
        retrieved_ttl=settings.retrieved_ttl,
        dedup_ttl=settings.dedup_ttl,
        max_outstanding=settings.max_outstanding,
        max_result_bytes=settings.max_result_bytes,
        session_batch_wait=settings.session_batch_wait,
        session_batch_size=settings.session_batch,
    )
    if settings.store_kind() == "url":  # `embedded` was resolved to its URL by `serve`
        from impl.server.store.redis import cluster
        from impl.server.store.redis.store import RedisStore

        options = dict(
            to_json=impl.encode.proto_to_json,
            lease=settings.store_lease,
            prefix=settings.store_prefix,
            timeout=settings.store_timeout,
        )
        if cluster.is_cluster(settings.store):
            return cluster.ClusterStore(
                settings.store, retention, ack_replicas=settings.store_ack_replicas, **options
            )
        if settings.store_ack_replicas:
            raise ValueError(
                "--store-ack-replicas needs a Redis/Valkey Cluster store; "
                f"{settings.store} is a single engine"
            )
        return RedisStore(settings.store, retention, **options)
    if settings.baseline:  # the old JSON dump: the reference (stdlib json) derivation
        return BaselineStore(
            retention, encoder=encoder, to_json=impl.encode.json_implementation("json")
        )
    return MemoryStore(retention, to_json=impl.encode.proto_to_json)


@contextlib.asynccontextmanager
async def lifespan(
    app: FastAPI, settings: Settings, picks: Picks | None
) -> AsyncIterator[dict[str, State]]:
    return_big_buffers()  # stored results of 1 MiB and more leave the RSS when evicted
    picks = picks or picks_module.choose(settings)
    parts = picks_module.create(picks, settings)
    store = _store(settings, parts["encoder"])
    metrics = _metrics(app, settings, picks)
    design, reason = offloop.choose(
        settings.offloop, picks.decode.name, parts["decoder"], baseline=settings.baseline
    )
    log.info("decode design %s: %s", design, reason)
    upstream.set_logprobs(settings.upstream_logprobs)  # before the fetch processes start
    fetch_pool, why = offloop.fetch_pool(settings.offloop_pool, picks.pool.name)
    if design == "fetch":
        log.info("fetch processes' pool %s: %s", fetch_pool, why)
    runner = offloop.create(
        design,
        decoder=parts["decoder"],
        encoder=parts["encoder"],
        decoder_name=picks.decode.name,
        encoder_name=picks.encode.name,
        count=settings.offloop_count or offloop.default_count(),
        min_bytes=settings.offloop_min_bytes,
        nice=offloop.nice_of(design, settings.offloop_nice),
        pool_name=fetch_pool,
        pool_options=picks_module.pool_options(settings),
    )
    await runner.start()
    forwards = ForwardRunner(
        pool=parts["pool"],
        decoding=runner,
        store=store,
        url=settings.completions_url,
        budget=BodyBudget(settings.max_body_bytes_in_flight),
        metrics=metrics,
    )
    sessions: Any = Sessions()
    if settings.store_kind() == "url":  # shared sessions; forwards of a process gone come here
        from impl.server.store.redis.cluster import ClusterStore
        from impl.server.store.redis.cluster_sessions import ClusterSessions
        from impl.server.store.redis.sessions import RedisSessions

        sessions = (
            ClusterSessions(store) if isinstance(store, ClusterStore) else RedisSessions(store)
        )
        store.on_takeover = forwards.take_over
    state = State(
        settings,
        picks,
        store,
        sessions,
        forwards,
        LagMonitor(),
        metrics=metrics,
        offloop_reason=reason,
    )
    state.poll_hold = settings.poll_hold
    state.retry_after = str(settings.retry_after).encode()
    state.limits = Limits.from_settings(settings)
    state.intake = Intake(0 if settings.baseline else settings.intake_per_turn)
    state.callers = Callers(
        settings.api_keys,
        max_outstanding=settings.max_outstanding,
        per_key=settings.max_outstanding_per_key,
    )
    await store.open()
    state.callers.start()
    state.lag.start()
    state.gc.start()
    sync = None
    if metrics is not None:
        from impl.server.tallies import SyncTimer

        state.lag.observe, state.gc.observe = metrics.loop_lag, metrics.gc_pause
        sync = SyncTimer(metrics, state)
        sync.start()
        app.metrics = metrics
    try:
        yield {"server": state}
    finally:
        app.metrics = None
        if sync is not None:
            sync.stop()
            metrics.close()
        state.gc.stop()
        state.lag.stop()
        state.callers.stop()
        store.close()  # wakes held polls
        await forwards.aclose()  # a shared store hands unfinished forwards over
        await store.aclose()


def _metrics(app: FastAPI, settings: Settings, picks: Picks) -> Any:
    """The Metrics object when metrics are on (prometheus-client is in the `server` extra)."""
    if not settings.metrics:
        return None
    try:
        from impl.server.metrics import Metrics
    except ImportError as exc:
        raise RuntimeError(
            f"metrics need prometheus-client ({exc}): pip install 'hotpath[server]', "
            "or run with --no-metrics"
        ) from exc
    names = {family: p["name"] for family, p in picks.as_json().items()}
    store = "redis" if settings.store_kind() != "memory" else "memory"
    paths = frozenset(path for _, path in app.hot)
    return Metrics(names, baseline=settings.baseline, hot_paths=paths, store=store)


def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)


def _store_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """503 + Retry-After while the shared store is away, on the FastAPI routes as on the hot
    ones (the request changed nothing there: the client retries it as it is)."""
    retry_after = request.state.server.retry_after.decode()
    return JSONResponse(
        {"detail": limits_module.unavailable_message(exc)},
        status_code=503,
        headers={"Retry-After": retry_after},
    )


def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's validation errors in the one error shape: a short sentence, never the input
    (FastAPI's own handler echoes it, and fails with a 500 on NaN)."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if any(error.get("type") == "json_invalid" for error in errors):
        return JSONResponse({"detail": "malformed JSON body"}, status_code=400)
    parts = []
    for error in errors[:3]:
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        parts.append(f"{where or 'body'}: {error.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    message = limits_module.shorten("invalid request body: " + "; ".join(parts) + more, 300)
    return JSONResponse({"detail": message}, status_code=422)


def _configure_openapi(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            schema.setdefault("components", {}).setdefault("schemas", {}).update(
                openapi_components()
            )
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(settings: Settings, picks: Picks | None = None) -> FastAPI:
    """The server app (uvicorn `--factory` style: `functools.partial(create_app, settings)`)."""
    app = HotpathApp(
        title="hotpath",
        version="0.2.0",
        description="Tinker-SDK-compatible sampling API forwarding to a vLLM router.",
        lifespan=functools.partial(lifespan, settings=settings, picks=picks),
        limits=Limits.from_settings(settings),
    )
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StoreUnavailable, _store_unavailable)
    routes.include(app)
    app.hot = {
        (method, r.path): r.raw
        for r in app.router.routes
        if isinstance(r, RawRoute)
        for method in r.methods
    }
    _configure_openapi(app)
    return app
