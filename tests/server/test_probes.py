"""The probes as operators use them: /livez, /readyz beside /healthz, from start-up to drain.

/livez answers 200 whenever the process and its loop answer; /readyz answers 503 with the
reasons while the server cannot serve samples (picks calibrating or the app starting, the
shared store away: tests/server/store/test_faults.py, draining after SIGTERM) and 200
otherwise; /healthz keeps the detail and says the same.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import pytest

from impl.harness.procs import free_port
from impl.server.starting import Starting, listening_socket
from tests.support.server import Api, start_server

pytestmark = pytest.mark.heavy


def test_probes_on_a_ready_server(upstream):
    with start_server(upstream.url) as server, httpx.Client(base_url=server.url) as http:
        live, ready = http.get("/livez"), http.get("/readyz")
        assert (live.status_code, live.json()) == (200, {"status": "ok"})
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
        health = http.get("/healthz").json()
        assert health["ready"] is True and health["why_not_ready"] == []
        paths = http.get("/openapi.json").json()["paths"]
        assert {"/livez", "/readyz"} <= set(paths)
        assert "503" in paths["/readyz"]["get"]["responses"]


@pytest.mark.slow
def test_readyz_is_503_while_draining_after_sigterm(upstream):
    """--drain-delay 3: after SIGTERM /readyz answers 503 (draining) while the server still
    serves everything else, then it exits."""
    with start_server(upstream.url, "--drain-delay", "3") as server:
        api = Api(server.url)
        try:
            ssid = api.sampling_session()
            os.kill(server.pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while (ready := httpx.get(server.url + "/readyz")).status_code == 200:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert ready.status_code == 503 and "draining" in ready.json()["why"][0]
            assert ready.headers["retry-after"] == "1"
            assert httpx.get(server.url + "/livez").status_code == 200
            response = api.asample(ssid, 0, seed=4)  # still served while it drains
            assert response.status_code == 200, response.text
            health = httpx.get(server.url + "/healthz").json()
            assert health["ready"] is False and health["status"] == "not ready"
            assert server.process.wait(30) in (0, -signal.SIGTERM)
        finally:
            api.close()


def _ask(address: tuple[str, int], request: bytes) -> tuple[int, dict, bytes]:
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    top, _, body = data.partition(b"\r\n\r\n")
    lines = top.split(b"\r\n")
    headers = dict(line.decode().lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def test_the_start_up_responder():
    """Before the app runs: /livez 200, /readyz and /healthz 503 saying why, any other request
    503 + Retry-After; every answer closes its connection; `stop(drain=True)` answers what
    waits in the backlog before the socket is closed."""
    sock = listening_socket("127.0.0.1", 0, 16)
    address = sock.getsockname()[:2]
    starting = Starting(sock, "picking the implementations").start()
    try:
        status, _, body = _ask(address, b"GET /livez HTTP/1.1\r\nHost: t\r\n\r\n")
        assert (status, json.loads(body)) == (200, {"status": "ok"})
        for path in (b"/readyz", b"/healthz"):
            status, _, body = _ask(address, b"GET " + path + b" HTTP/1.1\r\n\r\n")
            assert status == 503
            assert json.loads(body) == {
                "status": "starting",
                "why": ["picking the implementations"],
            }
        status, headers, body = _ask(address, b"POST /api/v1/asample HTTP/1.1\r\n\r\n{}")
        assert status == 503 and headers["retry-after"] == "1"
        assert headers["connection"] == "close"
        assert "the server is starting (picking the implementations)" in json.loads(body)["detail"]
    finally:
        starting.stop()
    queued = socket.create_connection(address, timeout=10)  # in the backlog, not accepted
    queued.sendall(b"GET /readyz HTTP/1.1\r\n\r\n")
    starting.stop(drain=True)
    assert queued.recv(4096).startswith(b"HTTP/1.1 503")
    queued.close()
    sock.close()


@pytest.mark.slow
def test_readyz_is_503_while_picks_calibrate(upstream):
    """Nothing measured here, calibration on: the port answers from the start (no refused
    connection), /readyz 503 "starting" while the picks calibrate, then 200 once it serves."""
    with tempfile.NamedTemporaryFile(suffix=".json") as empty:
        env = {"HOTPATH_MEASUREMENTS": empty.name}
        # not support.server.start_server: it waits for the ready line, printed once uvicorn serves
        port = free_port()
        command = [sys.executable, "-m", "impl.cli", "serve", "--port", str(port),
                   "--router-url", upstream.url, "--calibrate"]  # fmt: skip
        process = subprocess.Popen(
            command, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        seen = []
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    response = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10)
                except httpx.TransportError:
                    time.sleep(0.05)  # the interpreter is still importing: not listening yet
                    continue
                seen.append((response.status_code, response.json()))
                if response.status_code == 200:
                    break
                time.sleep(0.1)
        finally:
            process.terminate()
            process.wait(30)
    starting = [body for status, body in seen if status == 503]
    assert starting, seen
    assert starting[0] == {"status": "starting", "why": ["picking the implementations"]}
    assert seen[-1] == (200, {"status": "ready"}), seen[-3:]


@pytest.mark.parametrize("flag", ["--drain-delay", "--store-timeout"])
def test_probe_flags_are_checked(flag):
    from impl.server.settings import Settings

    name = flag[2:].replace("-", "_")
    with pytest.raises(ValueError, match=name):
        Settings(**{name: -1})


@pytest.mark.slow
def test_livez_answered_by_the_protocol_keeps_http_semantics(upstream):
    """GET /livez (answered as soon as its head is parsed, impl/server/protocol.py): several on
    one kept-alive connection, then one with `Connection: close` (closed after it), HTTP/1.0
    (closed); `/livez?probe=1` goes through the application's route: the same answer."""
    with start_server(upstream.url) as server:
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            for _ in range(3):
                sock.sendall(b"GET /livez HTTP/1.1\r\nHost: t\r\n\r\n")
                answer = b""
                while not answer.endswith(b'{"status":"ok"}'):
                    answer += sock.recv(4096)
                assert answer.startswith(b"HTTP/1.1 200") and b"connection: close" not in answer
            sock.sendall(b"GET /livez HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200") and b"connection: close" in answer
        status, _, body = _ask((host, int(port)), b"GET /livez HTTP/1.0\r\n\r\n")
        assert (status, body) == (200, b'{"status":"ok"}')
        routed = httpx.get(server.url + "/livez?probe=1")
        assert (routed.status_code, routed.json()) == (200, {"status": "ok"})
        httpx.get(server.url + "/healthz")
        deadline = time.monotonic() + 10
        while "/healthz" not in "".join(server.lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "/healthz" in "".join(server.lines)  # the access log runs...
        assert "/livez" not in "".join(server.lines)  # ...and the probes are not in it
