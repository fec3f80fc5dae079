"""aiohttp ClientSession over a TCPConnector: the flat-cost forwarder.

Technique: `TCPConnector(limit=max_connections, happy_eyeballs_delay=None)` and
`ClientTimeout(total=None, connect=None, sock_connect=connect_timeout,
sock_read=read_timeout)`; the answer's headers come first (`session.post` as a context
manager), then the whole body with `response.read()`, or, for an answer of 1 MiB or more with
a Content-Length and no Content-Encoding, chunk by chunk into one `bytearray` of that length
(`_read_into`).

Why fast: the connector keeps idle connections in a per-key deque and waiters in a FIFO, so taking
and returning a connection is O(1) whatever the number in flight; the HTTP parser is C
(llhttp). Per-request CPU stays flat from hundreds to thousands of requests in flight.

Caveats: Happy Eyeballs is turned off: under uvloop, cancelled parallel connect attempts caused
"file descriptor is used by transport" errors that failed unrelated forwards (docs/scenarios.md).
aiohttp's `connect` timeout would include the wait for a free slot under the limit, which the
contract leaves without a deadline, so only `sock_connect` bounds the connect. The session is
created on first use, inside the running loop, as aiohttp requires.

Why long answers go into one buffer: `response.read()` keeps the chunks (tens of KB each, on the
heap) until the last arrives and joins them. With several 17 MB answers being read at once the
heap grows to hold them all and stays grown after they are freed (docs/measurements.md, the
headline entry); a buffer of 1 MiB or more is its
own mapping (`return_big_buffers`), each chunk is freed as soon as it is copied, and the heap
stays small. It costs a second copy of the body (the `bytes` made from the buffer), unless the
forwarder was given `buffers` (a fetch process's `impl.server.offloop.buffers.BodyBuffers`):
then a long 200 answer is read into one of its kept buffers and `Reply.body` is a `memoryview`
of it, which its reader gives back once done.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp

from impl.pool import Admit, Reply
from impl.pool._common import Options, aiohttp_error, aiohttp_session

#: answers of this many bytes or more (with a Content-Length) are read into one buffer
LARGE_ANSWER = 1 << 20


async def _read_into(
    content: aiohttp.StreamReader, length: int, into: memoryview | None = None
) -> memoryview | bytes:
    """The `length` bytes of an answer, chunk by chunk into one buffer (`into`, a writable view
    of `length` bytes, returned filled; without it, a new buffer copied to `bytes`); aiohttp
    raises ClientPayloadError on a body that ends short, and one that runs long is refused."""
    if into is not None:
        await _fill(content, into, length)
        return into
    buffer = bytearray(length)
    view = memoryview(buffer)
    try:
        await _fill(content, view, length)
    finally:
        view.release()
    return bytes(buffer)


async def _fill(content: aiohttp.StreamReader, view: memoryview, length: int) -> None:
    at = 0
    async for chunk in content.iter_any():
        end = at + len(chunk)
        if end > length:
            raise aiohttp.ClientPayloadError(f"more than its Content-Length {length} bytes")
        view[at:end] = chunk
        at = end
    if at != length:
        raise aiohttp.ClientPayloadError(f"{at} of its Content-Length {length} bytes")


class AiohttpForwarder:
    def __init__(self, options: Options) -> None:
        self._options = options
        self._session: aiohttp.ClientSession | None = None
        #: kept receive buffers for long 200 answers (module docstring); None: `bytes` bodies
        self.buffers: Any = None

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], admit: Admit | None = None
    ) -> Reply:
        session = self._session
        if session is None:
            session = self._session = aiohttp_session(self._options)
        try:
            async with session.post(url, data=body, headers=headers) as response:
                if admit is not None:
                    await admit(response.status, response.content_length)
                length = response.content_length
                if (
                    length is not None
                    and length >= LARGE_ANSWER
                    and not response.headers.get("Content-Encoding")
                ):
                    into = None
                    if self.buffers is not None and response.status == 200:
                        into = self.buffers.take(length)
                    try:
                        data = await _read_into(response.content, length, into)
                    except BaseException:
                        if into is not None:
                            self.buffers.give(into)
                        raise
                else:
                    data = await response.read()
                return Reply(response.status, data, response.headers.get("Content-Type", ""))
        except (aiohttp.ClientError, aiohttp.InvalidURL) as exc:
            raise aiohttp_error(exc) from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def create(**options: Any) -> AiohttpForwarder:
    """The aiohttp forwarder (see the pool contract in `impl.pool`)."""
    return AiohttpForwarder(Options(**options))
