"""The uvicorn side of the runtime family: one `uvicorn.Server` for either HTTP protocol.

`uvicorn_httptools` and `uvicorn_h11` differ only in the protocol class uvicorn instantiates
per connection; everything else is this module: the config (factory app, uvloop, backlog,
keep-alive, graceful timeout, the picked access-log handler), the ready line once uvicorn
really listens, the drain on SIGTERM (/readyz 503 for `--drain-delay`, held polls answered as
soon as shutdown starts) and the eager accept loop (`impl.server.accept`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import uvicorn

    from impl.server.picks import Picks
    from impl.server.settings import Settings
    from impl.server.starting import Starting

log = logging.getLogger("hotpath.server")


def config(settings: Settings, picks: Picks, http: Any, **extra: Any) -> uvicorn.Config:
    """The uvicorn config: factory app, uvloop, `http` (a protocol class or uvicorn's name),
    backlog, keep-alive, access log; `extra` goes to `uvicorn.Config` as is."""
    import uvicorn

    from impl.accesslog import uvicorn_log_config
    from impl.server.app import create_app

    result = uvicorn.Config(
        functools.partial(create_app, settings, picks),
        factory=True,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=http,
        ws="none",
        lifespan="on",
        backlog=settings.backlog,
        timeout_keep_alive=settings.keep_alive,
        timeout_graceful_shutdown=settings.shutdown_timeout,
        log_config=uvicorn_log_config(picks.accesslog.name),
        log_level=None,  # uvicorn would apply it to the access logger too
        access_log=picks.accesslog.name != "null",
        **extra,
    )
    # --log-level governs uvicorn's own messages; the access log is the picked handler's.
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).setLevel(settings.log_level.upper())
    return result


def server(
    settings: Settings, picks: Picks, cfg: uvicorn.Config, starting: Starting | None = None
) -> uvicorn.Server:
    """The uvicorn Server that runs `cfg` (and stops the start-up responder `starting` once
    it listens)."""
    import uvicorn

    from impl.server.cli import tune_runtime

    class Server(uvicorn.Server):
        """uvicorn's Server that prints the ready line once it really listens, drains with
        /readyz at 503 on SIGTERM (`--drain-delay`), and answers held polls (try_again) as
        soon as shutdown starts, not after the graceful timeout."""

        async def shutdown(self, sockets=None) -> None:
            state = getattr(self.lifespan, "state", {}).get("server")
            if state is not None:
                state.draining = True
                await self._drain(settings.drain_delay)
            for acceptor in state.acceptors if state is not None else ():
                acceptor.stop()
            if state is not None:
                state.poll_hold = 0.0
                state.store.wake_all()
            await super().shutdown(sockets)

        async def _drain(self, seconds: float) -> None:
            """Keep serving `seconds` (a second SIGINT cuts it short): /readyz says 503."""
            if seconds > 0:
                log.info("draining: serving %.1f s more with /readyz at 503", seconds)
            end = asyncio.get_running_loop().time() + seconds
            while not self.force_exit and asyncio.get_running_loop().time() < end:
                await asyncio.sleep(min(0.1, seconds))

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if starting is not None:
                starting.stop()  # uvicorn answers on the socket now
            if self.started:
                if settings.eager_accept and not settings.baseline:
                    self._accept_eagerly()
                tune_runtime(settings, picks.accesslog.name)
                state = getattr(self.lifespan, "state", {}).get("server")
                if state is not None:
                    state.gc.count_frozen()  # /healthz reports this count, never re-walks
                host, port = self.servers[0].sockets[0].getsockname()[:2]
                print(f"hotpath-server listening on http://{host}:{port}", flush=True)

        def _accept_eagerly(self) -> None:
            """An EagerAccept per listening socket, with uvicorn's protocol factory."""
            from impl.server.accept import EagerAccept

            factory = functools.partial(
                self.config.http_protocol_class,
                config=self.config,
                server_state=self.server_state,
                app_state=self.lifespan.state,
            )
            state = self.lifespan.state.get("server")
            for listener in (sock for server in self.servers for sock in server.sockets or ()):
                acceptor = EagerAccept(listener, factory, limit=settings.backlog)
                acceptor.start()
                if state is not None:
                    state.acceptors.append(acceptor)

    return Server(cfg)


class UvicornRuntime:
    """A runtime that is uvicorn with one HTTP protocol (`http()` gives the config's)."""

    name = "uvicorn"

    def http(self, settings: Settings) -> Any:
        raise NotImplementedError

    def extra(self, settings: Settings) -> dict[str, Any]:
        return {}

    def config(self, settings: Settings, picks: Picks) -> uvicorn.Config:
        return config(settings, picks, self.http(settings), **self.extra(settings))

    def serve(
        self, settings: Settings, picks: Picks, sock: socket.socket, starting: Starting | None
    ) -> bool:
        running = server(settings, picks, self.config(settings, picks), starting)
        running.run(sockets=[sock])
        return bool(running.started)
