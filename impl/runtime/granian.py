"""granian: the app under granian's Rust HTTP server (hyper), ASGI interface, embedded.

Technique: granian's embedded server (`granian.server.embed`) runs its Rust worker on this
process's uvloop event loop, on the socket `hotpath serve` already listens on (handed over
as a `SocketHolder` of a duplicate descriptor, so the start-up responder's socket is the one
granian accepts on). hyper parses HTTP/1.1 on a Rust thread; each request reaches the app as
an ASGI call scheduled on the loop. An ASGI wrapper (`_Wrapped`) keeps what uvicorn gives the
server: the lifespan state (for the drain on SIGTERM) and one `uvicorn.access` record per
response (not the probes), so the picked access-log handler writes the same lines.
Why it is here: granian's own benchmarks put it ahead of uvicorn on small ASGI requests.
Caveats (the family's capability table): hyper refuses an over-long head or too many fields
with a bare 431 (no JSON detail; its buffer is at least 8 KiB, its field limit 100); its
header read timeout closes the connection without a 408 and also closes idle keep-alive
connections (no --keep-alive of its own); no body read timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from impl.server.picks import Picks
    from impl.server.settings import Settings
    from impl.server.starting import Starting

log = logging.getLogger("hotpath.server")
#: hyper's smallest read buffer (it refuses a smaller one)
MIN_BUFFER = 8192


class _Wrapped:
    """The app, seen by granian: notes the lifespan state and when start-up completed, and
    writes uvicorn's access record per response."""

    def __init__(self, app: Any, on_started: Any) -> None:
        from impl.accesslog._common import ACCESS_LOGGER, ACCESS_MESSAGE
        from impl.server.protocol import QUIET_PATHS

        self.app = app
        self.state: dict[str, Any] = {}
        self.on_started = on_started
        self.access = logging.getLogger(ACCESS_LOGGER)
        self.message = ACCESS_MESSAGE
        self.quiet = QUIET_PATHS

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            self.state = scope.setdefault("state", {})

            async def lifespan_send(message: dict[str, Any]) -> None:
                await send(message)
                if message["type"] == "lifespan.startup.complete":
                    self.on_started(self.state)

            return await self.app(scope, receive, lifespan_send)
        if kind != "http" or scope["path"] in self.quiet or not self.access.hasHandlers():
            return await self.app(scope, receive, send)

        async def logged_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                client = scope.get("client")
                address = f"{client[0]}:{client[1]}" if client else ""
                query = scope.get("query_string") or b""
                path = scope["path"] + ("?" + query.decode("latin-1") if query else "")
                self.access.info(
                    self.message,
                    address,
                    scope["method"],
                    path,
                    scope["http_version"],
                    message["status"],
                )
            await send(message)

        await self.app(scope, receive, logged_send)


def _log_config(settings: Settings, accesslog: str) -> dict[str, Any]:
    """The picked access-log handler's config (as uvicorn gets it), granian's own messages on
    stderr like uvicorn's."""
    from impl.accesslog import uvicorn_log_config

    config = uvicorn_log_config(accesslog)
    config["loggers"]["_granian"] = {"handlers": ["default"], "propagate": False}
    config["loggers"]["granian.access"] = {"handlers": [], "propagate": False}
    config["loggers"]["uvicorn.error"]["level"] = settings.log_level.upper()
    return config


class GranianRuntime:
    name = "granian"

    def serve(
        self, settings: Settings, picks: Picks, sock: socket.socket, starting: Starting | None
    ) -> bool:
        import uvloop

        return uvloop.run(self._serve(settings, picks, sock, starting))

    async def _serve(
        self, settings: Settings, picks: Picks, sock: socket.socket, starting: Starting | None
    ) -> bool:
        from granian._granian import SocketHolder
        from granian.constants import HTTPModes, Interfaces
        from granian.http import HTTP1Settings
        from granian.server.embed import Server

        from impl.server.app import create_app
        from impl.server.cli import tune_runtime

        loop = asyncio.get_running_loop()
        started = asyncio.Event()

        def on_started(state: dict[str, Any]) -> None:
            loop.call_soon(started.set)

        wrapped = _Wrapped(create_app(settings, picks), on_started)
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 0:
            sock.listen(settings.backlog)  # a --workers child's SO_REUSEPORT socket
        holder = SocketHolder(os.dup(sock.fileno()), False, settings.backlog)

        class OnOurSocket(Server):
            def _init_shared_socket(self) -> None:
                self._ssp, self._shd, self._sfd = None, holder, holder.get_fd()

        server = OnOurSocket(
            wrapped,
            address=settings.host,
            port=settings.port,
            interface=Interfaces.ASGI,
            http=HTTPModes.http1,
            websockets=False,
            backlog=settings.backlog,
            http1_settings=HTTP1Settings(
                header_read_timeout=max(1, round(settings.header_timeout * 1000)),
                keep_alive=True,
                max_buffer_size=max(MIN_BUFFER, settings.max_header_bytes),
            ),
            log_dictconfig=_log_config(settings, picks.accesslog.name),
            log_access=False,
        )
        server.workers_kill_timeout = max(1, round(settings.shutdown_timeout))
        stopping: list[asyncio.Task[None]] = []

        def on_signal(count: list[int] = [0]) -> None:  # noqa: B006 -- a counter per serve
            count[0] += 1
            if count[0] > 1 or not started.is_set():
                server.stop()  # a second signal (or one during start-up): no drain
            elif not stopping:
                stopping.append(loop.create_task(self._drain(settings, wrapped, server)))

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)

        async def announce() -> None:
            await started.wait()
            await asyncio.sleep(0)  # the worker calls serve right after the lifespan
            if starting is not None:
                starting.stop()  # granian answers on the socket now
            tune_runtime(settings, picks.accesslog.name)
            state = wrapped.state.get("server")
            if state is not None:
                state.gc.count_frozen()
            host, port = sock.getsockname()[:2]
            print(f"hotpath-server listening on http://{host}:{port}", flush=True)

        announcer = loop.create_task(announce())
        try:
            await server.serve()
        except TimeoutError:  # a worker outlived the graceful timeout
            for worker in server.wrks:
                worker.kill()
        finally:
            announcer.cancel()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            for task in stopping:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return started.is_set()

    @staticmethod
    async def _drain(settings: Settings, wrapped: _Wrapped, server: Any) -> None:
        """/readyz at 503 for --drain-delay, held polls answered at once, then granian stops
        its worker (which finishes what is in flight) and the lifespan ends."""
        state = wrapped.state.get("server")
        if state is not None:
            state.draining = True
            if settings.drain_delay > 0:
                log.info("draining: serving %.1f s more with /readyz at 503", settings.drain_delay)
            end = time.monotonic() + settings.drain_delay
            while time.monotonic() < end:
                await asyncio.sleep(min(0.1, settings.drain_delay))
            state.poll_hold = 0.0
            state.store.wake_all()
        server.stop()


def create() -> GranianRuntime:
    return GranianRuntime()
