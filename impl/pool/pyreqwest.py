"""pyreqwest: Python bindings of Rust's reqwest/hyper, its pool and I/O on a Tokio runtime.

Technique: one `pyreqwest.client.Client` built with `max_connections(N)` (a cap on requests in
flight, hence on connections), `pool_max_idle_per_host(N)`, `connect_timeout`, `pool_timeout`
(a day: the slot wait has no deadline in the contract), `read_timeout`, no total timeout,
redirects and status errors off; each request is built streamed (`build_streamed()`), so its
answer's headers come first and the body is then read as hyper's chunks
joined into one `bytes`; before that, at most the streamed read buffer (`READ_BUFFER`, 1 KiB)
and hyper's connection buffer are taken off the socket. `body_reader.bytes()` (one Rust buffer
copied to `bytes`) costs the same CPU per long body but its Rust allocator (mimalloc,
bundled) keeps what the buffers have grown to, far more than the chunks do
(docs/measurements.md).

Why fast: pooling, HTTP parsing and socket I/O run in Rust; Python sees one awaitable per request.
The CPU of the Tokio threads is the client process's CPU, so the pool table counts it.

Errors (caveat): pyreqwest raises its `ConnectError` both for a refused connect and for a reset
after the request was sent (reqwest calls both "connection error"), so the class alone cannot
tell the phases apart. hyper-util names the phase in the error chain, which pyreqwest exposes in
`details["causes"]`: "client error (Connect)" means the connector failed (nothing sent),
"client error (SendRequest)" that the connection failed while sending or awaiting the answer.
This module classifies by that cause (parity tests check both cases against the router), plus
`ConnectTimeoutError`/`PoolTimeoutError` -> `ConnectError`; every other `RequestError` (read
timeout, body error, closed mid-body) -> `ReadError`.

Caveat: the client is built on first use, inside the running loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pyreqwest.client import Client, ClientBuilder
from pyreqwest.exceptions import (
    BuilderError,
    ConnectTimeoutError,
    PoolTimeoutError,
    RequestError,
)

from impl.pool import Admit, ConnectError, ForwardError, ReadError, Reply
from impl.pool._common import KEEPALIVE_SECONDS, Options, content_length

_CONNECT_PHASE = "client error (Connect)"


def _error(exc: RequestError) -> ForwardError:
    causes = [cause.get("message", "") for cause in (exc.details.get("causes") or ())]
    text = f"{type(exc).__name__}: {exc.message}: {' / '.join(causes)}"
    if isinstance(exc, ConnectTimeoutError | PoolTimeoutError) or _CONNECT_PHASE in causes:
        return ConnectError(text)
    return ReadError(text)


#: pyreqwest needs a finite slot wait; the contract has none, so make it longer than any run.
SLOT_WAIT = timedelta(days=1)
#: What a streamed answer buffers before `admit` lets its body be read (pyreqwest's default is
#: 64 KiB). What an answer waiting in `admit` holds grows with it
#: (`python -m impl.probes.waiting_answers`; docs/measurements.md); reading a body costs the
#: same CPU at either size.
READ_BUFFER = 1 << 10


class PyreqwestForwarder:
    def __init__(self, options: Options) -> None:
        self._options = options
        self._client: Client | None = None

    def _build(self) -> Client:
        o = self._options
        return (
            ClientBuilder()
            .max_connections(o.max_connections)
            .pool_max_idle_per_host(o.max_connections)
            .pool_idle_timeout(timedelta(seconds=KEEPALIVE_SECONDS))
            .connect_timeout(timedelta(seconds=o.connect_timeout))
            .pool_timeout(SLOT_WAIT)
            .read_timeout(timedelta(seconds=o.read_timeout))
            .follow_redirects(False)
            .error_for_status(False)
            .http1_only()
            .build()
        )

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], admit: Admit | None = None
    ) -> Reply:
        client = self._client
        if client is None:
            client = self._client = self._build()
        try:
            request = client.post(url).headers(headers).body_bytes(body)
            request = request.streamed_read_buffer_limit(READ_BUFFER).build_streamed()
            async with request as response:
                length = content_length(response.get_header("content-length"))
                if admit is not None:
                    await admit(response.status, length)
                reader = response.body_reader
                parts = []
                # A declared length read in full ends the body: no further read is awaited
                # for the end (each read is a hand-over to the client's runtime and back).
                got, end = 0, -1 if length is None else length
                while got != end and (chunk := await reader.read_chunk()) is not None:
                    parts.append(chunk)
                    got += len(chunk)
                data = b"".join(parts)
                del parts
        except BuilderError as exc:  # an unusable URL or header: never sent
            raise ConnectError(f"invalid request: {exc}") from exc
        except RequestError as exc:
            raise _error(exc) from exc
        return Reply(response.status, data, response.get_header("content-type") or "")

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def create(**options: Any) -> PyreqwestForwarder:
    """The pyreqwest forwarder (see the pool contract in `impl.pool`)."""
    return PyreqwestForwarder(Options(**options))
