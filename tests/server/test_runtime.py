"""Parity of the HTTP runtimes (impl/runtime): the same requests get the same answers.

One server per available runtime, all with the same tight limits, against one stand-in
upstream. Each request below (hostile bodies, the probes, unknown paths and methods, heads at
and over the limits) is sent over a raw socket to every runtime; the status, the headers that
matter (content-type, content-length, retry-after) and the body bytes must equal the
reference's (uvicorn with httptools). Then each guarantee of `impl.runtime.GUARANTEES` is
checked on each runtime; where the capability table says a runtime does not give one, the
check is skipped with the table's reason (and the server never picks that runtime by itself).
The real SDK's exact results through each runtime are tests/server/test_sdk.py's
(`runtime-*` stacks).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request

import pytest

from impl import registry
from impl.runtime import LACKS
from tests.support.server import API_KEY, Api, address_of, exchange, start_server

pytestmark = pytest.mark.heavy

RUNTIMES = registry.names("runtime")
LIMITS = ("--max-header-bytes", "8192", "--max-headers", "20")
LIMITS += ("--header-timeout", "1", "--body-timeout", "1", "--poll-hold", "0.1")
LIMITS += ("--keep-alive", "2", "--accesslog", "plain")
HEADERS = (b"content-type", b"content-length", b"retry-after")
SMALL = 4096


def _available(name: str) -> None:
    reason = registry.unavailable_reason("runtime", name)
    if reason:
        pytest.skip(reason)


def _gives(name: str, guarantee: str) -> None:
    """Skip, with the capability table's reason, a check of what `name` does not give."""
    why = LACKS[name].get(guarantee)
    if why:
        pytest.skip(f"runtime {name} does not give {guarantee}: {why}")


@pytest.fixture(scope="module")
def servers(upstream):
    """name -> server process, for every available runtime."""
    started = {}
    try:
        for name in registry.available("runtime"):
            started[name] = start_server(upstream.url, "--runtime", name, *LIMITS)
        yield started
    finally:
        for process in started.values():
            process.stop()


def parsed(answer: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    """(status, the headers that matter, body) of one response."""
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0].startswith(b"HTTP/1.1 "), answer[:200]
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() in HEADERS:
            headers[name.strip().lower()] = value.strip()
    return status, headers, body


def request(
    method: bytes, path: bytes, body: bytes = b"", *headers: bytes, length: bool = True
) -> bytes:
    lines = [method + b" " + path + b" HTTP/1.1", b"Host: t", b"Connection: close"]
    lines += [b"X-API-Key: " + API_KEY.encode(), b"Content-Type: application/json", *headers]
    if length and (body or method == b"POST"):
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _nested(depth: int) -> bytes:
    return b'{"request_id": "r", "x": ' + b"[" * depth + b"1" + b"]" * depth + b"}"


def _chunked(size: int) -> bytes:
    chunk = b"a" * 4096
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(size // 4096))
    return chunks + b"0\r\n\r\n"


CASES = {
    "livez": request(b"GET", b"/livez"),
    "readyz": request(b"GET", b"/readyz"),
    "unknown-path": request(b"GET", b"/nope"),
    "wrong-method": request(b"GET", b"/api/v1/asample"),
    "deep-nesting": request(b"POST", b"/api/v1/retrieve_future", _nested(10_000)),
    "nan": request(b"POST", b"/api/v1/retrieve_future", b'{"request_id": NaN}'),
    "invalid-utf8": request(b"POST", b"/api/v1/create_session", b'{"tags": ["\xff\xfe"]}'),
    "wrong-types": request(b"POST", b"/api/v1/retrieve_future", b'{"request_id": 5}'),
    "long-id": request(b"POST", b"/api/v1/retrieve_future", b'{"request_id": "%s"}' % (b"r" * 300)),
    "unknown-future": request(b"POST", b"/api/v1/retrieve_future", b'{"request_id": "r1"}'),
    "no-api-key": request(b"POST", b"/api/v1/create_session", b"{}").replace(
        b"X-API-Key: " + API_KEY.encode() + b"\r\n", b""
    ),
    "body-over-cap": request(b"POST", b"/api/v1/create_session", b"{" + b" " * (70 << 10) + b"}"),
    "declared-over-cap": request(
        b"POST", b"/api/v1/retrieve_future", b"", b"Content-Length: 100000000", length=False
    ),
    "chunked-over-cap": request(
        b"POST",
        b"/api/v1/create_session",
        _chunked(80 << 10),
        b"Transfer-Encoding: chunked",
        length=False,
    ),
    "head-under-limit": request(b"GET", b"/livez", b"", b"X-Pad: " + b"a" * 7000),
    "fields-at-limit": request(b"GET", b"/livez", b"", *(b"a%d: b" % i for i in range(16))),
}


@pytest.mark.parametrize("name", RUNTIMES[1:])
@pytest.mark.parametrize("case", list(CASES))
def test_same_answer_as_the_reference(servers, name, case):
    _available(name)
    reference = parsed(exchange(servers[RUNTIMES[0]], CASES[case]))
    got = parsed(exchange(servers[name], CASES[case]))
    assert got == reference, (case, got[:2], reference[:2], got[2][:300], reference[2][:300])


def _refused(answer: bytes, status: int, flag: str) -> None:
    got, _, body = parsed(answer)
    assert got == status, answer[:300]
    assert len(answer) < SMALL
    assert flag in json.loads(body)["detail"]


@pytest.mark.parametrize("name", RUNTIMES)
def test_head_over_the_limit_gets_431(servers, name):
    _available(name)
    _gives(name, "head_bytes")
    for size in (9000, 1 << 20):
        answer = exchange(servers[name], request(b"GET", b"/livez", b"", b"X-Big: " + b"a" * size))
        _refused(answer, 431, "--max-header-bytes")


@pytest.mark.parametrize("name", RUNTIMES)
def test_too_many_fields_get_431(servers, name):
    _available(name)
    _gives(name, "header_count")
    many = request(b"GET", b"/livez", b"", *(b"a%d: b" % i for i in range(25)))
    _refused(exchange(servers[name], many), 431, "--max-headers")


@pytest.mark.parametrize("name", RUNTIMES)
def test_slow_head_gets_408(servers, name):
    _available(name)
    _gives(name, "header_timeout")
    sock = socket.create_connection(address_of(servers[name]))
    sock.sendall(b"GET /livez HTTP/1.1\r\nHost: t\r\n")
    sock.settimeout(20)
    answer = sock.recv(SMALL)
    sock.close()
    _refused(answer, 408, "--header-timeout")


@pytest.mark.parametrize("name", RUNTIMES)
def test_slow_body_gets_408(servers, name):
    _available(name)
    _gives(name, "body_timeout")
    partial = request(b"POST", b"/api/v1/retrieve_future", b"", b"Content-Length: 100")
    answer = exchange(servers[name], partial.replace(b"Content-Length: 0\r\n", b"") + b"{")
    _refused(answer, 408, "--body-timeout")


@pytest.mark.parametrize("name", RUNTIMES)
def test_keep_alive_answers_twice_then_closes_when_idle(servers, name):
    """Two requests on one connection; idle past --keep-alive (2 s), the server closes it."""
    _available(name)
    _gives(name, "keep_alive")
    sock = socket.create_connection(address_of(servers[name]))
    sock.settimeout(20)
    for _ in range(2):
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: t\r\n\r\n")
        data = b""
        while not data.endswith(b'{"status":"ok"}'):
            data += sock.recv(SMALL)
        assert data.startswith(b"HTTP/1.1 200")
    started = time.monotonic()
    assert sock.recv(SMALL) == b""  # closed by the server
    assert 1.0 < time.monotonic() - started < 15
    sock.close()


@pytest.mark.parametrize("name", RUNTIMES)
def test_access_log_has_a_line_per_request_but_not_the_probes(servers, name):
    _available(name)
    _gives(name, "accesslog")
    server = servers[name]
    marker = f"/access-{name}"
    exchange(server, request(b"GET", marker.encode()))
    exchange(server, request(b"GET", b"/readyz"))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(marker in line for line in server.lines):
        time.sleep(0.05)
    lines = [line for line in server.lines if marker in line]
    assert len(lines) == 1 and f'"GET {marker} HTTP/1.1" 404' in lines[0], lines
    assert not any('"GET /readyz ' in line or '"GET /livez ' in line for line in server.lines)


def _delivered(server) -> float:
    """The server's count of results marked delivered (/metrics)."""
    text = urllib.request.urlopen(server.url + "/metrics", timeout=30).read().decode()
    lines = [line for line in text.splitlines() if line.startswith("hotpath_store_delivered_total")]
    assert lines, "no delivered counter on /metrics"
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


@pytest.mark.parametrize("name", RUNTIMES)
def test_a_result_fetched_by_retrieve_future_is_marked_delivered(servers, name):
    """The per-request poll's answer with a result: the body arrives and the result is marked
    delivered (its retrieved TTL starts), with nothing in the log (the delivery check reads
    the runtime's `receive()` once without waiting, whatever awaitable it gives)."""
    _available(name)
    server, api = servers[name], Api(servers[name].url)
    try:
        before = _delivered(server)
        request_id = api.asample(api.sampling_session(), 0, seed=11).json()["request_id"]
        answer = api.result(request_id, proto=False)
        assert answer.status_code == 200 and answer.json()["sequences"], answer.text[:300]
        deadline = time.monotonic() + 10
        while _delivered(server) < before + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _delivered(server) == before + 1
        assert "Traceback" not in server.stderr()
    finally:
        api.close()


@pytest.mark.parametrize("name", RUNTIMES)
def test_healthz_shows_the_runtime_and_what_it_lacks(servers, name):
    _available(name)
    shown = json.loads(urllib.request.urlopen(servers[name].url + "/healthz").read())
    assert shown["picks"]["runtime"]["name"] == name
    assert shown["picks"]["runtime"]["lacks"] == sorted(LACKS[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNTIMES)
def test_sigterm_drains_with_readyz_at_503(upstream, name):
    """--drain-delay 2: after SIGTERM /readyz answers 503 while the server still serves, then
    the process exits by itself (uvicorn re-raises the SIGTERM it caught once it has shut
    down, granian returns 0)."""
    _available(name)
    _gives(name, "drain")
    server = start_server(upstream.url, "--runtime", name, "--drain-delay", "2")
    try:
        os.kill(server.pid, signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(server.url + "/readyz", timeout=10)
        assert refused.value.code == 503
        with urllib.request.urlopen(server.url + "/livez", timeout=10) as live:
            assert live.status == 200
        assert server.process.wait(30) in (0, -signal.SIGTERM)
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNTIMES)
def test_two_workers_serve_one_port(upstream, name):
    """--workers 2 with the runtime: both processes answer on the one port."""
    _available(name)
    _gives(name, "workers")
    from impl.server.store.redis import embedded

    if embedded.binary() is None:
        pytest.skip(embedded.INSTALL_HINT)
    with start_server(upstream.url, "--runtime", name, "--workers", "2") as server:
        pids = set()
        deadline = time.monotonic() + 30
        while len(pids) < 2 and time.monotonic() < deadline:
            pids.add(server.get("/healthz")["process"]["pid"])
        assert len(pids) == 2
