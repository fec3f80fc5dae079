"""Hostile requests: each gets a short 4xx in the one error shape, the keep-alive connection
answers the next request, and nothing the client sent is echoed beyond ~100 characters."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import socket
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.server import API_KEY, start_server, start_upstream

pytestmark = pytest.mark.heavy

SMALL = 4096  # every error response is shorter than this
HOT = ("/api/v1/asample", "/api/v1/retrieve_future", "/api/v1/retrieve_futures")
FASTAPI_ROUTES = (
    "/api/v1/create_session",
    "/api/v1/create_sampling_session",
    "/api/v1/session_heartbeat",
    "/api/v1/telemetry",
    "/api/v1/client/config",
    "/api/v1/sessions/s/finish",
    "/api/v1/join_sampling_session",
)
ALL_ROUTES = HOT + FASTAPI_ROUTES


@pytest.fixture(scope="module")
def server():
    with start_upstream() as upstream, start_server(upstream.url, "--poll-hold", "0.1") as process:
        yield process


class Connection:
    """One HTTP/1.1 keep-alive connection (http.client), to check that it survives an error."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.http = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        self.http.connect()
        self.local = self.http.sock.getsockname()

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        headers = {"X-API-Key": API_KEY, "Content-Type": "application/json"}
        self.http.request("POST", path, body=body, headers=headers)
        response = self.http.getresponse()
        return response.status, response.read()

    def still_usable(self) -> bool:
        """The next request goes out on the same socket and is answered."""
        assert self.http.sock is not None, "the server closed the connection"
        assert self.http.sock.getsockname() == self.local
        self.http.request("GET", "/healthz")
        response = self.http.getresponse()
        return response.status == 200 and json.loads(response.read())["status"] == "ok"

    def close(self) -> None:
        self.http.close()


def _refused(server, path: str, body: bytes, status: int, words: str) -> str:
    connection = Connection(server.url)
    try:
        got, raw = connection.post(path, body)
        assert got == status, (path, body[:200], raw[:300])
        assert len(raw) < SMALL, (path, len(raw))
        detail = json.loads(raw)["detail"]
        assert isinstance(detail, str) and words in detail, (path, detail)
        assert connection.still_usable()
        return detail
    finally:
        connection.close()


def _nested(depth: int, inner: bytes = b"1") -> bytes:
    return b'{"request_id": "r", "seq_id": 1, "session_id": "s", "x": ' + (
        b"[" * (depth - 1) + inner + b"]" * (depth - 1) + b"}"
    )


@pytest.mark.parametrize("path", ALL_ROUTES)
def test_deep_nesting_is_400(server, path):
    """~1000 levels (the RecursionError of the issue) and 33 levels: 400, same wording."""
    for depth in (1000, 33):
        _refused(server, path, _nested(depth), 400, "nested deeper than 32 levels")


def test_nesting_at_the_limit_is_accepted(server):
    """32 levels in an ignored field: parsed, so the unknown request id gets its 404."""
    _refused(server, "/api/v1/retrieve_future", _nested(32), 404, "unknown request_id")
    _refused(server, "/api/v1/session_heartbeat", _nested(32), 404, "unknown session_id")


@pytest.mark.parametrize("path", ALL_ROUTES)
@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinity_are_400(server, path, literal):
    _refused(server, path, b'{"session_id": "s", "x": ' + literal + b"}", 400, "malformed JSON")


@pytest.mark.parametrize("path", ALL_ROUTES)
def test_invalid_utf8_is_400(server, path):
    _refused(server, path, b'{"session_id": "s\xff\xfe", "request_id": "\xc3"}', 400, "JSON")


@pytest.mark.parametrize("path", FASTAPI_ROUTES)
def test_integer_over_4300_digits_is_400(server, path):
    """FastAPI's parser (the stdlib) cannot read it: refused before it gets there."""
    _refused(server, path, b'{"session_id": "s", "x": ' + b"7" * 4301 + b"}", 400, "JSON")


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/api/v1/retrieve_future", {"request_id": 5}, "$.request_id"),
        ("/api/v1/asample", {"sampling_session_id": "x", "seq_id": "1"}, "$.seq_id"),
        ("/api/v1/create_session", {"tags": "a"}, "tags"),
        ("/api/v1/create_session", {"tags": [1, 2]}, "tags.0"),
        ("/api/v1/create_sampling_session", {"session_id": "s"}, "sampling_session_seq_id"),
        (
            "/api/v1/create_sampling_session",
            {"session_id": "s", "sampling_session_seq_id": 10**30, "base_model": "m"},
            "sampling_session_seq_id",
        ),
        ("/api/v1/session_heartbeat", [1, 2], "body"),
        ("/api/v1/telemetry", [1, 2], "body"),
    ],
)
def test_wrong_types_are_422(server, path, body, words):
    detail = _refused(server, path, json.dumps(body).encode(), 422, words)
    assert detail.startswith("invalid request body")


LONG = "q" * 300


@pytest.mark.parametrize(
    ("path", "body", "name"),
    [
        ("/api/v1/retrieve_future", {"request_id": LONG}, "request_id"),
        ("/api/v1/session_heartbeat", {"session_id": LONG}, "session_id"),
        (
            "/api/v1/create_sampling_session",
            {"session_id": LONG, "sampling_session_seq_id": 0, "base_model": "m"},
            "session_id",
        ),
        (f"/api/v1/sessions/{LONG}/finish", {}, "session_id"),
        ("/api/v1/create_session", {"tags": [LONG]}, "tag"),
        ("/api/v1/join_sampling_session", {"sampling_session_id": LONG}, "sampling_session_id"),
        (
            "/api/v1/retrieve_futures",
            {"target": {"sampling_session_id": LONG}},
            "sampling_session_id",
        ),
    ],
)
def test_long_ids_are_422_naming_the_limit(server, path, body, name):
    detail = _refused(server, path, json.dumps(body).encode(), 422, f"{name} is 300 characters")
    assert "the limit is 256" in detail and LONG[:101] not in detail


def test_long_sampling_session_id_is_422(server):
    body = {
        "sampling_session_id": LONG,
        "seq_id": 0,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1]}]},
        "sampling_params": {},
    }
    _refused(server, "/api/v1/asample", json.dumps(body).encode(), 422, "the limit is 256")


def test_unknown_ids_are_quoted_short(server):
    """An id within the limit but unknown: the 404 quotes at most 100 of its characters."""
    name = "z" * 250
    detail = _refused(
        server, "/api/v1/retrieve_future", json.dumps({"request_id": name}).encode(), 404, "z" * 100
    )
    assert "z" * 101 not in detail and "250 characters" in detail


def test_too_many_tags_is_422(server):
    body = json.dumps({"tags": [str(i) for i in range(65)]}).encode()
    _refused(server, "/api/v1/create_session", body, 422, "65 tags; the limit is 64")


@pytest.mark.parametrize("path", ALL_ROUTES)
def test_body_over_the_route_cap_is_413(server, path):
    """The small routes' cap is 64 KiB (telemetry's 1 MiB, retrieve_futures' 16 MiB); asample's
    is sized by --max-prompt-tokens."""
    size = {
        "/api/v1/asample": 13 << 20,
        "/api/v1/telemetry": 1 << 20,
        "/api/v1/retrieve_futures": 16 << 20,
    }.get(path, 64 << 10)
    body = b'{"request_id": "' + b"a" * size + b'"}'
    detail = _refused(server, path, body, 413, "request body over")
    assert ("--max-prompt-tokens" if path == "/api/v1/asample" else "--max-body-bytes") in detail


def test_telemetry_takes_a_large_batch(server):
    """100 events with stack traces (~500 KB) fit telemetry's cap."""
    event = {"event": "exception", "trace": "x" * 5000, "ts": 1.5}
    body = json.dumps({"events": [event] * 100}).encode()
    connection = Connection(server.url)
    try:
        status, raw = connection.post("/api/v1/telemetry", body)
        assert (status, json.loads(raw)) == (200, {"status": "accepted"})
    finally:
        connection.close()


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
@pytest.mark.slow
def test_concurrent_huge_junk_is_refused_with_bounded_memory():
    """16 concurrent 30 MiB junk requests (the issue's case): all short 4xx; peak RSS grows by
    less than 600 MB; a sample still completes afterwards."""
    junk = b'{"request_id": "' + b"j" * (30 << 20) + b'"}'
    with start_upstream() as upstream, start_server(upstream.url) as process:
        before = _peak_rss_kib(process.pid)

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=process.url, timeout=120) as client:
                headers = {"X-API-Key": API_KEY}
                paths = [HOT[i % 2] for i in range(16)]
                return await asyncio.gather(
                    *(client.post(path, content=junk, headers=headers) for path in paths)
                )

        responses = asyncio.run(burst())
        grown_mb = (_peak_rss_kib(process.pid) - before) / 1024
        assert [r.status_code for r in responses] == [413] * 16
        assert all(len(r.content) < SMALL for r in responses)
        assert grown_mb < 600, grown_mb
        from tests.support.server import Api

        api = Api(process.url)
        ssid = api.sampling_session()
        reply = api.asample(ssid, 0, seed=1)
        assert reply.status_code == 200, reply.text
        assert api.result(reply.json()["request_id"]).status_code == 200
        api.close()


def test_chunked_body_over_the_cap_is_413(server):
    """No Content-Length: read up to the cap, then refused; the connection survives."""
    parts = urlsplit(server.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        head = (
            "POST /api/v1/retrieve_future HTTP/1.1\r\nHost: x\r\nX-API-Key: "
            f"{API_KEY}\r\nTransfer-Encoding: chunked\r\n\r\n"
        ).encode()
        chunk = b"a" * 32768
        sock.sendall(head + b"".join(b"8000\r\n" + chunk + b"\r\n" for _ in range(4)))
        sock.sendall(b"0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while data.count(b"HTTP/1.1") < 2 or not data.rstrip().endswith(b"}"):
            more = sock.recv(65536)
            if not more:
                break
            data += more
    first, second = data.split(b"HTTP/1.1 ")[1:3]
    assert first.startswith(b"413") and b"--max-body-bytes" in first
    assert second.startswith(b"200") and b'"status":"ok"' in second


@pytest.mark.parametrize("path", ["/api/v1/retrieve_future", "/api/v1/create_session"])
def test_declared_length_over_the_drain_limit_is_refused_unread(server, path):
    """Content-Length of 1 GiB, 1 KiB sent: 413 at once (nothing more is waited for) and the
    connection is closed, since the rest will not be read."""
    parts = urlsplit(server.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nX-API-Key: {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {1 << 30}\r\n\r\n"
        ).encode()
        sock.sendall(head + b"{" + b" " * 1023)
        data = b""
        while True:
            more = sock.recv(65536)
            if not more:
                break  # closed by the server
            data += more
    assert data.startswith(b"HTTP/1.1 413"), data[:200]
    assert b"connection: close" in data.lower() and len(data) < SMALL


def test_limits_come_from_the_settings():
    """Each flag sets its limit; zero or negative values are refused at start-up."""
    from impl.server.limits import Limits
    from impl.server.settings import Settings

    limits = Limits.from_settings(
        Settings(max_id_length=64, max_body_bytes=100, max_prompt_tokens=10, max_tags=2)
    )
    assert "the limit is 64 (--max-id-length)" in limits.id_problem("request_id", "x" * 65)
    assert limits.id_problem("request_id", "x" * 64) is None
    assert limits.body_cap("/api/v1/session_heartbeat") == (100, "--max-body-bytes")
    assert limits.body_cap("/api/v1/telemetry")[0] == 1600
    assert limits.body_cap("/api/v1/retrieve_futures") == (25600, "256 x --max-body-bytes")
    assert limits.asample_body_bytes == 10 * 12 + 100
    for name in ("max_id_length", "max_body_bytes", "max_prompt_tokens", "max_tags"):
        with pytest.raises(ValueError, match=name):
            Settings(**{name: 0})
    # below the longest id the server itself hands out, its own ids would get 422
    with pytest.raises(ValueError, match="max_id_length must be >= 64"):
        Settings(max_id_length=63)
