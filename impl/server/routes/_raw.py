"""Pure-ASGI plumbing for the hot routes: documented like FastAPI routes, served without it.

`RawRoute` is an `APIRoute` (so it appears in the OpenAPI schema with the request and response
schemas given in `openapi_extra`) whose ASGI app is the raw handler: no dependency solving, no
pydantic, no JSONResponse. `HotpathApp` in app.py dispatches these paths before the middleware
stack. The helpers write a complete response and tell whether the client is already gone
(each handler asks `state.callers` who is calling, `impl.server.callers`); bodies are read
with `impl.server.limits.read_capped` (a per-route cap).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from fastapi.routing import APIRoute

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

JSON = b"application/json"
PROTOBUF = b"application/x-protobuf"


class RawRoute(APIRoute):
    """An APIRoute for the schema whose requests go straight to a pure ASGI callable."""

    def __init__(self, path: str, asgi: ASGIApp, **kwargs: Any) -> None:
        async def documented() -> None:  # pragma: no cover - never called, only introspected
            """Schema placeholder: the raw handler serves the route."""

        kwargs.setdefault("description", (asgi.__doc__ or "").strip())
        kwargs.setdefault("name", asgi.__name__)
        super().__init__(path, documented, **kwargs)
        self.app = asgi
        self.raw = asgi


async def respond(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes = JSON,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", b"%d" % len(body)),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def header(scope: Scope, wanted: bytes) -> bytes:
    for name, value in scope["headers"]:
        if name == wanted:
            return value
    return b""


def client_gone(receive: Receive) -> bool:
    """True when the server already knows the client disconnected; never waits.

    Runs one step of `receive()`: uvicorn returns `http.disconnect` at once for a connection it
    has seen close, and otherwise suspends on its message event, which means the client is
    still there (the request body was read in full, so nothing else can be pending). The
    suspended step is closed, leaving nothing behind: the same check Starlette's
    `Request.is_disconnected()` makes with a cancelled scope, without a task or a scope.
    granian's `receive()` gives a future instead of a coroutine: done when it already holds
    `http.disconnect`, else cancelled (the same answer, nothing left behind).
    """
    step: Any = receive()
    if not hasattr(step, "send"):  # a future (granian), not a coroutine (uvicorn)
        if not step.done():
            step.cancel()
            return False
        held = None if step.cancelled() or step.exception() else step.result()
        return (held or {}).get("type") == "http.disconnect"
    try:
        step.send(None)
    except StopIteration as done:
        return (done.value or {}).get("type") == "http.disconnect"
    step.close()
    return False
