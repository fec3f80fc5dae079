"""httpx's API over aiohttp's connection pool (`httpx-aiohttp`'s AiohttpTransport).

Technique: an `httpx.AsyncClient(transport=AiohttpTransport(client=<factory>))` whose aiohttp
session is built exactly like `impl.pool.aiohttp`'s (limit, Happy Eyeballs off, timeouts), so
code written against httpx keeps its API while connections come from aiohttp's O(1) connector.
httpx's per-request timeouts are passed down as `ClientTimeout(sock_connect, sock_read, connect)`.

Why in between: the pool cost stays flat like aiohttp's, but every request still builds httpx
Request/Response objects and streams the body through httpx's byte-stream layer.

Caveat (why errors are classified from the cause): httpx-aiohttp 0.2 maps every
`aiohttp.ClientConnectionError` (which includes `ServerDisconnectedError` and resets after the
request was sent) to `httpx.ConnectTimeout`, and lets unmapped aiohttp errors escape. Its mapped
exceptions chain the original (`raise ... from exc`), so this module classifies the aiohttp cause
with the same rule as `impl.pool.aiohttp`, and httpx's own errors as the reference does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from impl.pool import Admit, ForwardError, Reply
from impl.pool._common import HttpxForwarder, Options, aiohttp_error, aiohttp_session


class HttpxAiohttpForwarder(HttpxForwarder):
    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], admit: Admit | None = None
    ) -> Reply:
        try:
            return await super().post(url, body, headers, admit)
        except aiohttp.ClientError as exc:  # left unmapped by httpx-aiohttp
            raise aiohttp_error(exc) from exc
        except ForwardError as err:  # err <- httpx exception <- aiohttp exception (if any)
            original = getattr(err.__cause__, "__cause__", None)
            if isinstance(original, aiohttp.ClientError):
                raise aiohttp_error(original) from original
            raise


def create(**options: Any) -> HttpxAiohttpForwarder:
    """httpx.AsyncClient over an aiohttp session built like `impl.pool.aiohttp`'s."""
    opts = Options(**options)
    transport = AiohttpTransport(client=lambda: aiohttp_session(opts))
    timeout = httpx.Timeout(None, connect=opts.connect_timeout, read=opts.read_timeout, pool=None)
    client = httpx.AsyncClient(transport=transport, timeout=timeout, trust_env=False)
    return HttpxAiohttpForwarder(httpx, client)
