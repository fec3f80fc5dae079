"""Pool family: the async HTTP client that forwards each sample to the vLLM router.

Contract: `registry.create("pool", name, max_connections=..., connect_timeout=60.0,
read_timeout=2048.0)` gives a `Forwarder`: `await post(url, body, headers, admit=None) ->
Reply`, `await aclose()`. Connect-phase failures raise `ConnectError`, failures after the
request was sent raise `ReadError`; no total deadline; Happy Eyeballs off where the library has
it. `admit(status, length)`, when given, is awaited once the answer's status line and headers
arrived and before its body is read (`length`: the Content-Length, None without one): while it
waits, the body stays unread in the socket beyond the library's own small read buffer, so TCP
flow control holds the sender. Whatever `admit` raises propagates unchanged (the answer is
dropped with its connection).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from impl._table import Entry


class ForwardError(Exception):
    """The upstream could not be reached or did not answer completely."""


class ConnectError(ForwardError):
    """Failed before the request was sent (refused, unreachable, connect timeout): safe to retry."""


class ReadError(ForwardError):
    """Failed after the request was sent (reset, closed mid-body, read timeout): not retried."""


def describe(exc: BaseException) -> str:
    """`"Class: message"` of a library's exception, for a ConnectError/ReadError to say what
    happened. An empty message (httpx's ReadError on a reset has none) is filled from the
    exceptions it was raised from, down to the OS error when there is one."""
    text, inner = str(exc), exc
    for _ in range(8):  # a bounded walk down __cause__ / __context__
        if text:
            break
        inner = inner.__cause__ or inner.__context__
        if inner is None:
            break
        text = f"{type(inner).__name__}: {inner}" if str(inner) else ""
    return f"{type(exc).__name__}: {text or 'no message (the connection was closed or reset)'}"


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str


#: `admit(status, content_length)`: awaited between an answer's headers and its body (above)
Admit = Callable[[int, int | None], Awaitable[None]]


class Forwarder(Protocol):
    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], admit: Admit | None = None
    ) -> Reply: ...

    async def aclose(self) -> None: ...


REFERENCE = "httpx"

IMPLEMENTATIONS: tuple[Entry, ...] = (
    Entry("httpx", "impl.pool.httpx", "httpx.AsyncClient; the reference", ("httpx",), "pool"),
    Entry("aiohttp", "impl.pool.aiohttp", "aiohttp TCPConnector", ("aiohttp",), "pool"),
    Entry("httpx2", "impl.pool.httpx2", "httpx2, the maintained httpx fork", ("httpx2",), "pool"),
    Entry(
        "httpx-aiohttp",
        "impl.pool.httpx_aiohttp",
        "httpx API over the aiohttp transport",
        ("httpx", "httpx_aiohttp"),
        "pool",
    ),
    Entry("pyqwest", "impl.pool.pyqwest", "pyqwest (Rust reqwest)", ("pyqwest",), "pool"),
    Entry("pyreqwest", "impl.pool.pyreqwest", "pyreqwest (Rust reqwest)", ("pyreqwest",), "pool"),
)

#: By CPU per request measured here (the README's pool table), cheapest first; used when nothing
#: is recorded.
PREFERENCE = ("pyreqwest", "pyqwest", "aiohttp", "httpx-aiohttp", "httpx2", "httpx")
