"""The HTTP limits before the application (impl/server/protocol.py), over real sockets.

What each hostile head or body gets: a head over --max-header-bytes or with more than
--max-headers fields gets 431 in the one error shape, `Connection: close`, and the connection
closes after the answer (the client can read it: the server reads and drops the rest); a head
or body that does not arrive in time gets 408 (an idle connection that never sent a byte is
closed without a word); a head just under the limits is served; every refusal is counted on
/healthz and /metrics. The memory bound under 20 x 32 MB heads and the slowloris run at the
default timeout are the chaos suite's (tests/chaos/).
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.support.server import address_of, exchange, start_server

pytestmark = pytest.mark.heavy

SMALL = 4096


@pytest.fixture(scope="module")
def server(upstream):
    args = ("--max-header-bytes", "4096", "--max-headers", "20")
    args += ("--header-timeout", "1", "--body-timeout", "1")
    with start_server(upstream.url, *args) as process:
        yield process


def one_response(sock: socket.socket) -> bytes:
    """One whole response from a kept-alive connection (head, then Content-Length bytes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(SMALL)
    top, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in top.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(SMALL)
    return top + b"\r\n\r\n" + body


def head(*headers: bytes, path: bytes = b"/livez") -> bytes:
    return b"GET " + path + b" HTTP/1.1\r\nHost: t\r\n" + b"".join(headers) + b"\r\n"


def _refused(answer: bytes, status: bytes, flag: str) -> dict:
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]
    headers, _, body = answer.partition(b"\r\n\r\n")
    assert b"connection: close" in headers.lower() and len(answer) < SMALL
    detail = json.loads(body)["detail"]
    assert flag in detail, detail
    return detail


@pytest.mark.parametrize("size", [5000, 100 << 10, 1 << 20, 16 << 20])
@pytest.mark.slow
def test_a_header_over_the_limit_gets_431(server, size):
    """One header of `size` bytes (5 KB to 16 MB): 431, read by the client in full."""
    answer = exchange(server, head(b"X-Big: " + b"a" * size + b"\r\n"))
    _refused(answer, b"431", "--max-header-bytes")


def test_a_head_at_the_limit_is_served(server):
    """The limit counts the whole head (request line, headers, the empty line): a head of
    exactly --max-header-bytes is served, one byte more is refused."""
    base = head(b"Connection: close\r\n", b"X-Pad: \r\n")
    pad = 4096 - len(base)
    exact = head(b"Connection: close\r\n", b"X-Pad: " + b"a" * pad + b"\r\n")
    assert len(exact) == 4096
    assert exchange(server, exact).startswith(b"HTTP/1.1 200")
    over = head(b"Connection: close\r\n", b"X-Pad: " + b"a" * (pad + 1) + b"\r\n")
    _refused(exchange(server, over), b"431", "--max-header-bytes")


def test_many_headers_get_431(server):
    """More than --max-headers fields (small ones, far under the byte limit): 431; 20,000 of
    them: 431 by the byte limit; the limit itself is served."""
    many = head(*(b"a%d: b\r\n" % i for i in range(25)))
    _refused(exchange(server, many), b"431", "--max-headers")
    flood = head(*(b"x-%d: y\r\n" % i for i in range(20_000)))
    _refused(exchange(server, flood), b"431", "--max-header-bytes")
    enough = head(b"Connection: close\r\n", *(b"a%d: b\r\n" % i for i in range(18)))
    assert exchange(server, enough).startswith(b"HTTP/1.1 200")


def test_a_slow_head_gets_408_and_an_idle_connection_is_closed(server):
    """--header-timeout 1: a head still incomplete after 1 s gets 408; a connection that
    never sent a byte is closed without an answer; a keep-alive connection idle between
    requests is not cut by it (the keep-alive timeout governs)."""
    slow = socket.create_connection(address_of(server))
    slow.sendall(b"GET /livez HTTP/1.1\r\nHost: t\r\n")
    slow.settimeout(30)
    answer = slow.recv(SMALL)
    slow.close()
    _refused(answer, b"408", "--header-timeout")
    idle = socket.create_connection(address_of(server))
    idle.settimeout(30)
    assert idle.recv(SMALL) == b""  # closed, nothing said
    idle.close()
    alive = socket.create_connection(address_of(server))
    alive.settimeout(30)
    alive.sendall(head())
    assert one_response(alive).startswith(b"HTTP/1.1 200")
    time.sleep(1.5)  # longer than the header timeout, between two requests
    alive.sendall(head())
    assert one_response(alive).startswith(b"HTTP/1.1 200")
    alive.close()


def test_a_slow_body_gets_408(server):
    """--body-timeout 1: a body that stops arriving gets 408 (the route never sees it)."""
    sock = socket.create_connection(address_of(server))
    sock.sendall(
        b"POST /api/v1/retrieve_future HTTP/1.1\r\nHost: t\r\nX-API-Key: tml-x\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    )
    sock.settimeout(30)
    answer = b""
    while chunk := sock.recv(SMALL):
        answer += chunk
    sock.close()
    _refused(answer, b"408", "--body-timeout")


def test_refusals_are_counted(server):
    """/healthz `http_refused` and /metrics `hotpath_http_refused_total` count each reason."""
    exchange(server, head(b"X-Big: " + b"a" * 5000 + b"\r\n"))
    with socket.create_connection(address_of(server)) as slow:
        slow.sendall(b"GET /livez HTTP/1.1\r\n")
        slow.settimeout(30)
        slow.recv(SMALL)
    health = server.get("/healthz")["http_refused"]
    assert health["header_bytes"] >= 1 and health["header_timeout"] >= 1, health
    import urllib.request

    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    assert 'hotpath_http_refused_total{reason="header_bytes"}' in text
    assert 'hotpath_http_refused_total{reason="body_timeout"}' in text


def test_limits_come_from_the_settings():
    """Each limit is a flag; zero or negative is refused at start-up."""
    from impl.server.settings import Settings

    for name in ("max_header_bytes", "max_headers", "header_timeout", "body_timeout"):
        with pytest.raises(ValueError, match=name):
            Settings(**{name: 0})


class _Transport:
    """Just enough of an asyncio transport for the protocol (what it wrote, whether closed)."""

    def __init__(self) -> None:
        self.written, self.closed = b"", False

    def get_extra_info(self, name: str, default=None):
        return {"peername": ("127.0.0.1", 1), "sockname": ("127.0.0.1", 2)}.get(name, default)

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


@pytest.mark.slow
def test_a_timer_that_fires_late_gives_the_request_a_turn():
    """In-process: the loop stalls 1.5 s past a head's deadline, and the head's last bytes
    were there meanwhile (delivered, as uvloop reads them, after the late timer): the timer
    waits one more turn and the request is served, not refused 408. Without a stall, the
    same timer refuses (the control case)."""
    import asyncio

    import uvicorn
    from uvicorn.server import ServerState

    from impl.server.protocol import protocol_class
    from impl.server.settings import Settings

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def run(stall: bool) -> bytes:
        config = uvicorn.Config(app, loop="asyncio", http="httptools", lifespan="off")
        config.load()
        cls = protocol_class(Settings(header_timeout=0.2))
        protocol = cls(config=config, server_state=ServerState(), app_state={})
        transport = _Transport()
        loop = asyncio.get_running_loop()
        protocol.connection_made(transport)
        protocol.data_received(b"GET /x HTTP/1.1\r\n")
        if stall:
            loop.call_later(0.1, time.sleep, 1.5)  # the loop stalls past the 0.2 s deadline
            loop.call_later(0.25, protocol.data_received, b"Host: t\r\n\r\n")
        await asyncio.sleep(2.0)
        return transport.written

    assert b"HTTP/1.1 200" in asyncio.run(run(stall=True))
    assert asyncio.run(run(stall=False)).startswith(b"HTTP/1.1 408")
