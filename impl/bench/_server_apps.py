"""The apps `impl/bench/server.py` compares, each served by the same uvicorn configuration.

- `hotpath`: the production app (`impl.server.app.create_app`) with the forward left unsent
  (`ForwardRunner.submit` replaced by a no-op after start-up), so an asample costs the route alone:
  auth, msgspec validation, session and dedup lookups, backpressure check, building the router
  body, creating the record, the response. The forward's own cost (pool, decode, encode) is
  what the pool/decode/encode sections measure.
- `hotpath-nometrics`: the production app with `--no-metrics` (`impl/probes/metrics_cost.py`
  compares it with `hotpath`: what the Prometheus metrics cost per request).
- `hotpath-routed`: the same app with the hot-path dispatch off, so the raw handlers are
  reached through FastAPI's middleware stack and router: what the dispatch saves.
- `starlette`: a bare Starlette app whose routes do the same JSON work with orjson: asample
  parses the body, writes the router body and the response; retrieve_future parses the body,
  finds the pending entry and answers try_again.
- `fastapi`: the same two routes written the idiomatic FastAPI way (`await request.json()`,
  `JSONResponse`), for reference.

    python -m impl.bench._server_apps APP   # serves APP on 127.0.0.1:0, prints the port
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import socket
import sys
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import Response
from starlette.routing import Route

TRY_AGAIN = b'{"type":"try_again"}'
PENDING_ID = "bench-pending"
APPS = ("hotpath", "hotpath-routed", "starlette", "fastapi")


def _router_body(data: dict[str, Any]) -> bytes:
    params = data["sampling_params"]
    body = {
        "model": "bench",
        "prompt": data["prompt"]["chunks"][0]["tokens"],
        "n": data.get("num_samples", 1),
        "temperature": params.get("temperature", 1.0),
        "top_p": params.get("top_p", 1.0),
        "top_k": params.get("top_k", -1),
        "logprobs": 1,
        "return_token_ids": True,
        "max_tokens": params["max_tokens"],
        "seed": params["seed"],
    }
    return orjson.dumps(body)


def starlette_app() -> Any:
    ids = itertools.count()
    pending = {PENDING_ID: None}

    async def asample(request: StarletteRequest) -> Response:
        data = orjson.loads(await request.body())
        _router_body(data)
        rid = f"r-{next(ids)}"
        body = orjson.dumps({"request_id": rid, "sample_sequence_ids": [f"{rid}:0"]})
        return Response(body, media_type="application/json")

    async def retrieve_future(request: StarletteRequest) -> Response:
        data = orjson.loads(await request.body())
        if data["request_id"] not in pending:
            return Response(b'{"detail":"unknown"}', status_code=404, media_type="application/json")
        return Response(TRY_AGAIN, media_type="application/json")

    return Starlette(
        routes=[
            Route("/api/v1/asample", asample, methods=["POST"]),
            Route("/api/v1/retrieve_future", retrieve_future, methods=["POST"]),
        ]
    )


def fastapi_app() -> Any:
    app = FastAPI()
    ids = itertools.count()
    pending = {PENDING_ID: None}

    @app.post("/api/v1/asample")
    async def asample(request: Request) -> JSONResponse:
        data = await request.json()
        _router_body(data)
        rid = f"r-{next(ids)}"
        return JSONResponse({"request_id": rid, "sample_sequence_ids": [f"{rid}:0"]})

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request) -> JSONResponse:
        data = await request.json()
        if data["request_id"] not in pending:
            return JSONResponse({"detail": "unknown"}, status_code=404)
        return JSONResponse({"type": "try_again"})

    return app


def hotpath_app(metrics: bool = True, **settings_: Any) -> Any:
    from impl.server.app import create_app
    from impl.server.settings import Settings

    settings = Settings(
        router_url="http://127.0.0.1:9", poll_hold=0.0, max_outstanding=1 << 30,
        accesslog="null", calibrate=False, log_level="warning", metrics=metrics,
        **settings_,
    )  # fmt: skip
    app = create_app(settings)
    started = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app: Any):
        async with started(app) as state:
            state["server"].forwards.submit = lambda record, job: None  # the route alone
            yield state

    app.router.lifespan_context = lifespan
    return app


def hotpath_routed_app() -> Any:
    app = hotpath_app()
    app.hot = {}  # every request through FastAPI's middleware stack and router
    return app


def serve(name: str) -> None:
    import uvicorn

    factory = {
        "hotpath": hotpath_app,
        "hotpath-routed": hotpath_routed_app,
        "hotpath-nometrics": functools.partial(hotpath_app, metrics=False),
        "starlette": starlette_app,
        "fastapi": fastapi_app,
    }[name]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        factory, factory=True, loop="uvloop", http="httptools", access_log=False,
        log_level="warning", timeout_keep_alive=75, backlog=4096,
    )  # fmt: skip
    print(sock.getsockname()[1], flush=True)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    serve(sys.argv[1])
