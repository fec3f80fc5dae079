"""pyqwest: a Python client over Rust's reqwest/hyper, its pool and I/O on a Tokio runtime.

Technique: one `pyqwest.Client` over an `HTTPTransport(http_version=HTTP1, connect_timeout,
read_timeout, pool_max_idle_per_host=N)`, no total timeout, redirects and OpenTelemetry off.
Each request goes through `client.stream`, so the answer's headers come first (the contract's
`admit` runs there); its body is then read chunk by chunk (hyper's reads) and
joined into one `bytes`. `client.post` would buffer the whole answer in Rust before returning:
less CPU per long body, but no point between headers and body for `admit`. The connection cap is an
`asyncio.Semaphore(max_connections)` around each request: pyqwest's own
`max_connections_per_address` is set too but does not apply to a literal IP such as the router's
127.0.0.1 (measured: 62 connections for a cap of 8); with at most N requests in flight hyper
never needs more than N connections (the parity test checks it from the upstream's side).
Waiting for a slot has no deadline, as in the contract.

Why fast: connection pooling, HTTP parsing and socket I/O run in Rust threads; Python sees one
awaitable per request. The CPU of those threads is the client process's CPU, so the pool table
counts it (time.process_time covers every thread).

Errors, as pyqwest raises them (checked against the router's faults in the parity tests): a failed
connect is the builtin `ConnectionError` (`pyqwest.ConnectTimeout` is one) -> `ConnectError`;
`pyqwest.WriteError` (e.g. reset after the request was written), `pyqwest.ReadError`,
`RemoteProtocolError` (closed mid-body) and `TimeoutError` (read timeout) -> `ReadError`.

Caveats: pyqwest exposes no switch for hyper's Happy Eyeballs; it only matters for a host name
with several addresses, never for the literal IP the router listens on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pyqwest

from impl.pool import Admit, ConnectError, ReadError, Reply, describe
from impl.pool._common import KEEPALIVE_SECONDS, Options, acquire_slot, content_length

_AFTER_SEND = (pyqwest.WriteError, pyqwest.ReadError, pyqwest.RemoteProtocolError, TimeoutError)


class PyqwestForwarder:
    def __init__(self, options: Options) -> None:
        self._transport = pyqwest.HTTPTransport(
            http_version=pyqwest.HTTPVersion.HTTP1,
            connect_timeout=options.connect_timeout,
            read_timeout=options.read_timeout,
            pool_idle_timeout=KEEPALIVE_SECONDS,
            pool_max_idle_per_host=options.max_connections,
            max_connections_per_address=options.max_connections,
            follow_redirects=False,
            enable_otel=False,
        )
        self._client = pyqwest.Client(self._transport)
        # pyqwest's per-address cap does not apply to a literal IP (measured: 62 connections for
        # a cap of 8 to 127.0.0.1), so requests in flight, hence connections, are capped here.
        self._slots = asyncio.Semaphore(options.max_connections)

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], admit: Admit | None = None
    ) -> Reply:
        await acquire_slot(self._slots)
        try:
            async with self._client.stream("POST", url, headers, body) as response:
                status, answer = response.status, response.headers
                if admit is not None:
                    await admit(status, content_length(answer.get("content-length")))
                data = b"".join([chunk async for chunk in response.content])
        except ConnectionError as exc:  # includes pyqwest.ConnectTimeout; nothing was sent
            raise ConnectError(describe(exc)) from exc
        except _AFTER_SEND as exc:
            raise ReadError(describe(exc)) from exc
        except ValueError as exc:  # an unparseable URL: never sent
            raise ConnectError(f"invalid request: {exc}") from exc
        finally:
            self._slots.release()
        return Reply(status, data, answer.get("content-type", ""))

    async def aclose(self) -> None:
        await self._transport.aclose()


def create(**options: Any) -> PyqwestForwarder:
    """The pyqwest forwarder (see the pool contract in `impl.pool`)."""
    return PyqwestForwarder(Options(**options))
