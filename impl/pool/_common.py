"""Shared pieces of the pool implementations: options, error mapping, the httpx-shaped forwarder.

Timeout semantics every implementation follows (the pool contract):
- `connect_timeout` bounds the TCP connect. Exceeding it is a `ConnectError` (nothing was sent);
- waiting for a free slot under `max_connections` has no deadline: a request queued behind a busy
  engine waits (docs/families.md, pool), as do requests queued behind the connection cap;
- `read_timeout` bounds each gap between reads of the answer (not the whole answer): exceeding it
  is a `ReadError`;
- no total deadline: a request the engine is still working on waits as long as bytes keep coming
  or the engine has not answered within `read_timeout`.
`admit` (the contract's hook between an answer's headers and its body) is awaited after the
library returned the headers and before the body is read; each library reads the body only when
asked (aiohttp pauses the socket past 32 KiB buffered, httpcore reads 64 KiB at a time,
pyreqwest's streamed answers buffer 1 KiB plus hyper's connection buffer), so a waiting `admit`
leaves the rest in the kernel's socket buffers and TCP flow control stops the sender
(tests/pool/test_parity.py measures how much the upstream got to send meanwhile).
Idle keep-alive connections are dropped by the client after `KEEPALIVE_SECONDS`, shorter than the
upstream's keep-alive (the router keeps 75 s), so a reused connection is never one the upstream
is closing.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from impl.pool import Admit, ConnectError, ForwardError, ReadError, Reply, describe

DEFAULT_MAX_CONNECTIONS = 1024
KEEPALIVE_SECONDS = 30.0
#: aiohttp's read buffer per answer (its default 64 KiB; reading pauses past twice this): an
#: answer waiting for `admit` holds it (`python -m impl.probes.waiting_answers` measures it:
#: docs/measurements.md); reading a body costs the same CPU at either size.
READ_BUFSIZE = 16 << 10


@dataclass(frozen=True)
class Options:
    """The pool contract's options, checked once."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    connect_timeout: float = 60.0
    read_timeout: float = 2048.0
    #: SO_RCVBUF of each connection (bytes; None: the kernel autotunes it), where the library
    #: lets it be set (aiohttp and httpx-aiohttp; the others ignore it): an answer waiting for
    #: `admit` holds at most about twice this of kernel memory on the receiving side
    receive_buffer: int | None = None

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        if self.receive_buffer is not None and self.receive_buffer < 1:
            raise ValueError(f"receive_buffer must be >= 1 byte, got {self.receive_buffer}")
        if self.connect_timeout <= 0 or self.read_timeout <= 0:
            raise ValueError("connect_timeout and read_timeout must be > 0 seconds")


def content_length(value: str | None) -> int | None:
    """An answer's Content-Length header as a number (None when absent or not a number)."""
    if value is None or not value.strip().isdigit():
        return None
    return int(value)


async def acquire_slot(slots: asyncio.Semaphore) -> None:
    """Take one of `max_connections` slots, waiting as long as it takes (no deadline)."""
    await slots.acquire()


def aiohttp_error(exc: BaseException) -> ForwardError:
    """The contract error for an aiohttp client exception (connect phase vs after sending)."""
    import aiohttp

    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
        return ConnectError(describe(exc))
    if isinstance(exc, aiohttp.InvalidURL):
        return ConnectError(f"invalid URL: {exc}")
    # ServerDisconnectedError, ClientPayloadError, ClientOSError on an established connection,
    # SocketTimeoutError (sock_read), ClientResponseError (unparseable answer): after sending.
    return ReadError(describe(exc))


def receive_buffer_sockets(size: int | None) -> Callable[[Any], socket.socket] | None:
    """aiohttp's `socket_factory` making sockets with SO_RCVBUF = `size` (None: the default)."""
    if size is None:
        return None

    def make(addr_info: Any) -> socket.socket:
        family, kind, proto = addr_info[:3]
        sock = socket.socket(family=family, type=kind, proto=proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
        return sock

    return make


def aiohttp_session(options: Options, **session_kwargs: Any) -> Any:
    """An aiohttp ClientSession as the contract wants it (call inside a running event loop)."""
    import aiohttp

    connector = aiohttp.TCPConnector(
        limit=options.max_connections,
        limit_per_host=0,  # the one cap is `limit`; the router is a single host
        happy_eyeballs_delay=None,  # one connect attempt per request (docs/families.md, pool)
        keepalive_timeout=KEEPALIVE_SECONDS,
        ttl_dns_cache=None,
        socket_factory=receive_buffer_sockets(options.receive_buffer),
    )
    timeout = aiohttp.ClientTimeout(
        total=None,
        connect=None,  # aiohttp's `connect` includes the slot wait, which has no deadline
        sock_connect=options.connect_timeout,
        sock_read=options.read_timeout,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        trust_env=False,
        read_bufsize=READ_BUFSIZE,
        **session_kwargs,
    )


class HttpxForwarder:
    """`post` over any httpx-API client (httpx, httpx2, httpx over the aiohttp transport)."""

    def __init__(self, httpx: ModuleType, client: Any) -> None:
        self._client = client
        self._connect_errors = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
        self._unsent_errors = (httpx.InvalidURL, httpx.UnsupportedProtocol)
        self._errors = (httpx.HTTPError, httpx.InvalidURL)

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], admit: Admit | None = None
    ) -> Reply:
        try:
            async with self._client.stream("POST", url, content=body, headers=headers) as response:
                if admit is not None:
                    await admit(
                        response.status_code, content_length(response.headers.get("content-length"))
                    )
                data = await response.aread()
        except self._connect_errors as exc:
            raise ConnectError(describe(exc)) from exc
        except self._unsent_errors as exc:
            raise ConnectError(f"invalid URL: {exc}") from exc
        except self._errors as exc:  # ReadError, ReadTimeout, RemoteProtocolError, WriteError, ...
            raise ReadError(describe(exc)) from exc
        return Reply(response.status_code, data, response.headers.get("content-type", ""))

    async def aclose(self) -> None:
        await self._client.aclose()


def httpx_client(httpx: ModuleType, options: Options, **kwargs: Any) -> Any:
    """An httpx-API AsyncClient with the contract's limits and timeouts."""
    limits = httpx.Limits(
        max_connections=options.max_connections,
        max_keepalive_connections=options.max_connections,  # the default 20 would churn sockets
        keepalive_expiry=KEEPALIVE_SECONDS,
    )
    timeout = httpx.Timeout(
        None,
        connect=options.connect_timeout,
        read=options.read_timeout,
        pool=None,  # the wait for a free slot has no deadline
    )
    return httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False, **kwargs)
