"""uvicorn's httptools protocol with the HTTP limits it lacks: head size, header count, and how
long a head or a body may take to arrive.

uvicorn bounds nothing of a request's head with httptools (`h11_max_incomplete_event_size` is
h11's alone): httptools keeps appending a header's bytes until its end arrives, so a 32 MB
header costs 32 MB of the server's memory, and 20,000 headers are all parsed; and no timer runs
before a request's head is complete (uvicorn arms its keep-alive timer only after a response), so a
client that sends a byte a second (slowloris) holds its connection forever.
`LimitedHttpToolsProtocol` adds, per connection:

- **head bytes** (`--max-header-bytes`, 32 KiB like nginx's 4 x 8k header buffers): the bytes
  of a head are counted as they arrive, before httptools sees them; over the limit the server
  answers 431 and closes. The count starts at each request's first byte, so it is exact up to
  one read (a read that completes one request and starts the next is not counted twice);
- **header count** (`--max-headers`, 100 like Apache's LimitRequestFields): 431 as well,
  checked once the head is parsed (the head's byte limit already bounds what the fields take:
  at most ~8,000 fields in 32 KiB), before the application sees the request;
- **head time** (`--header-timeout`, 10 s): from a connection's opening (its first request)
  or a request's first byte (the next ones; between requests the keep-alive timeout governs),
  the head must be complete within it, else 408 (or, when not one byte came, a silent close);
- **body time** (`--body-timeout`, 60 s): from the end of the head, the body must be complete
  within it, else 408 (time the server itself paused reading, its flow control waiting on the
  application, is added back).

A refused connection is answered once (`{"detail": ...}`, `Connection: close`), then the
server stops writing but keeps reading and dropping what the client still sends for up to
`LINGER` seconds (nginx's lingering close): closing at once with unread bytes would reset the
connection and the client could lose the answer. Timers are armed only for a head or body
that spans reads (a request that arrives in one read costs none), and each refusal is counted
on /healthz (`http_refused`) and /metrics (`hotpath_http_refused_total{reason}`).

The probes (`/livez`, `/readyz`) are not access-logged: an orchestrator asks every few seconds,
and those lines would be most of a quiet server's log (the request metrics skip them too,
app.py); every other request is logged. `GET /livez` is answered here, on the event
loop, as soon as its head is parsed: one write of a constant response, no ASGI task (a
liveness probe asks whether the process and its loop answer; uvicorn's path through the
application costs two writes and a task; the app's own `/livez` route serves other
servers of the same app and the OpenAPI schema).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

#: Seconds a refused connection keeps reading (and dropping) before it closes.
LINGER = 2.0
#: A timer that fires this many seconds late found the loop stalled: the request gets a turn.
STALL = 1.0
#: refusal reasons, as counted
REASONS = ("header_bytes", "header_count", "header_timeout", "body_timeout")
_END = b"\r\n\r\n"


#: paths whose requests are not access-logged (the probes)
QUIET_PATHS = frozenset({"/livez", "/readyz"})
LIVE_BODY = b'{"status":"ok"}'


class _TooManyHeaders(Exception):
    """Raised in httptools' headers-complete callback: it stops the parser before the
    request reaches the application (httptools raises HttpParserCallbackError)."""


def protocol_class(settings: Any) -> type[HttpToolsProtocol]:
    """The protocol class uvicorn instantiates per connection, bound to `settings`' limits."""
    return type(
        "LimitedHttpToolsProtocol",
        (LimitedHttpToolsProtocol,),
        {
            "max_head": settings.max_header_bytes,
            "max_headers": settings.max_headers,
            "header_timeout": settings.header_timeout,
            "body_timeout": settings.body_timeout,
        },
    )


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with head-size, header-count and read-time limits (module docstring)."""

    max_head = 32 << 10
    max_headers = 100
    header_timeout = 10.0
    body_timeout = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # the next bytes belong to a request's head
        self._head_bytes = 0  # of it so far (not 0: the head has started)
        self._tail = b""  # the last 3 bytes of the head so far (an end split across reads)
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0  # loop time the timer is due
        self._closing = False

    # -- connection ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout, self._head_late)  # the first request's head

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return  # lingering: dropped
        if self._in_head:
            size = self._head_bytes + len(data)
            if size <= self.max_head and len(data) >= 3:  # `_over_head_limit`'s common case
                self._head_bytes, self._tail = size, data[-3:]
            elif self._over_head_limit(data):
                return self._refuse(431, "header_bytes", self._head_message())
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            return self._upgrade()
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _TooManyHeaders):  # raised in on_headers_complete
                message = f"more than {self.max_headers} header fields (--max-headers)"
                return self._refuse(431, "header_count", message)
            self.logger.warning("Invalid HTTP request received.")
            return self.send_400_response("Invalid HTTP request received.")
        if self._in_head:
            if self._head_bytes and self._timer is None:
                self._arm(self.header_timeout, self._head_late)
        elif self.cycle is not None and self.cycle.more_body and self._timer is None:
            self._arm(self.body_timeout, self._body_late)

    def _upgrade(self) -> None:
        if self._should_upgrade():
            self.handle_websocket_upgrade()
        else:
            self._unsupported_upgrade_warning()

    def _over_head_limit(self, data: bytes) -> bool:
        """Count `data` as head bytes; True when the head is (or will be) over the limit."""
        size = self._head_bytes + len(data)
        if size <= self.max_head:
            self._head_bytes = size
            self._tail = data[-3:] if len(data) >= 3 else (self._tail + data)[-3:]
            return False
        end = (self._tail + data).find(_END)  # the head may end in this read
        return end < 0 or self._head_bytes - len(self._tail) + end + len(_END) > self.max_head

    def _head_message(self) -> str:
        return f"request head over {self.max_head} bytes (--max-header-bytes)"

    # -- parser callbacks ---------------------------------------------------------------------
    def on_headers_complete(self) -> None:
        if len(self.headers) > self.max_headers:
            raise _TooManyHeaders
        self._in_head = False
        self._head_bytes, self._tail = 0, b""
        if self._timer is not None:
            self._disarm()
        if self.url == b"/livez" and self.parser.get_method() == b"GET" and self._idle():
            return self._answer_live()
        super().on_headers_complete()
        if self.scope.get("path") in QUIET_PATHS and self.cycle is not None:
            self.cycle.access_log = False

    def on_message_complete(self) -> None:
        self._in_head = True  # what comes next is the next request's head
        if self._timer is not None:
            self._disarm()
        if self.cycle is not None:  # None: the connection's first request was a /livez
            super().on_message_complete()

    def _idle(self) -> bool:
        """No response of this connection is under way (so one may be written now)."""
        return not self.pipeline and (self.cycle is None or self.cycle.response_complete)

    def _answer_live(self) -> None:
        """`GET /livez`, answered without the application (module docstring)."""
        keep_alive = self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
        headers = [b"%s: %s\r\n" % pair for pair in self.server_state.default_headers]
        self.transport.write(
            b"".join(
                (
                    STATUS_LINE[200],
                    *headers,
                    b"content-type: application/json\r\ncontent-length: %d\r\n" % len(LIVE_BODY),
                    b"" if keep_alive else b"connection: close\r\n",
                    b"\r\n",
                    LIVE_BODY,
                )
            )
        )
        if keep_alive:
            self.on_response_complete()  # the keep-alive timer, what uvicorn does after each
        else:
            self.transport.close()

    # -- timers and refusals ------------------------------------------------------------------
    def _arm(self, delay: float, callback: Any) -> None:
        if self._timer is not None:
            self._disarm()
        self._due = self.loop.time() + delay
        self._timer = self.loop.call_later(delay, callback)

    def _stalled(self, callback: Any) -> bool:
        """True (and `callback` due again next turn) when this timer fired over a second late:
        the loop itself was stalled, and the bytes that would have completed the request may
        be waiting to be read (uvloop runs timers, then what is soon due, then reads), so the
        timer is set again past the next read of the sockets."""
        if self.loop.time() - self._due <= STALL:
            return False
        self._due = self.loop.time()
        self._timer = self.loop.call_later(0.001, callback)
        return True

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_late(self) -> None:
        self._timer = None
        if not self._in_head or self.transport.is_closing() or self._stalled(self._head_late):
            return
        if not self._head_bytes:  # not one byte of a request: close without a word
            self._count("header_timeout")
            self.transport.close()
            return
        message = f"request head not received within {self.header_timeout:g} s (--header-timeout)"
        self._refuse(408, "header_timeout", message)

    def _body_late(self) -> None:
        self._timer = None
        cycle = self.cycle
        if self._in_head or cycle is None or not cycle.more_body or self.transport.is_closing():
            return
        if self._stalled(self._body_late):
            return
        if self.flow.read_paused:  # the server is not reading: its own delay does not count
            self._arm(1.0, self._body_late)
            return
        message = f"request body not received within {self.body_timeout:g} s (--body-timeout)"
        self._refuse(408, "body_timeout", message, refused_cycle=True)

    def _count(self, reason: str) -> None:
        """Count a refusal on the server's State (/healthz `http_refused`, /metrics)."""
        state = self.app_state.get("server")
        if state is not None:
            state.http_refused[reason] += 1

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown; a request still receiving its body gets 503 (it would
        otherwise wait for the graceful timeout and be cancelled into a 500)."""
        cycle = self.cycle
        if (
            cycle is not None
            and not self._in_head
            and cycle.more_body
            and not cycle.response_started
            and not self._closing
        ):
            message = "the server is shutting down; retry the request"
            return self._refuse(503, None, message, refused_cycle=True)
        super().shutdown()

    def _refuse(
        self, status: int, reason: str | None, message: str, refused_cycle: bool = False
    ) -> None:
        """Answer `status` once, then linger and close. The request refused is the current
        cycle's (`refused_cycle`: its body came too slowly), or one that has none yet (its
        head). A cycle still running is told the client is gone (its receive() says so, its
        sends are dropped); when its own response has begun, or it is another request's (a
        pipelined head refused behind it), the connection closes without an answer, which
        could not be told apart from that response. `reason`: what is counted (None: nothing,
        a shutdown)."""
        if reason is not None:
            self._count(reason)
        self._closing = True
        self._disarm()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            started = cycle.response_started
            cycle.disconnected = True
            cycle.message_event.set()
            if started or not refused_cycle:
                self.transport.close()
                return
        body = orjson.dumps({"detail": message})
        self.transport.write(
            b"".join(
                (
                    STATUS_LINE[status],
                    b"content-type: application/json\r\n",
                    b"content-length: %d\r\n" % len(body),
                    b"retry-after: 1\r\n" if status == 503 else b"",
                    b"connection: close\r\n\r\n",
                    body,
                )
            )
        )
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._timer = self.loop.call_later(LINGER, self.transport.close)
