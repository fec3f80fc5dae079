"""The server's routes, one module per resource; `include` wires them into an app."""

from __future__ import annotations

from fastapi import FastAPI

from impl.server.routes import client, futures, health, sampling, sessions


def include(app: FastAPI) -> None:
    for module in (client, sessions, health):
        app.include_router(module.router)
    app.router.routes.extend(sampling.routes())
    app.router.routes.extend(futures.routes())
    app.router.routes.extend(health.routes())
