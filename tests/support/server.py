"""Start and stop `hotpath serve` and the stand-in upstream (support/fake_vllm.py) as processes.

Both bind port 0 and print a ready line; `start_*` waits for it (failing with the process's
stderr if it does not come) and the returned handle stops the process by PID.

Why this is not `impl.harness.procs.start_server`: the load harness starts the server on a
port it reserved and waits for `/healthz`, and sends its output to a file, because under load
the access log is millions of lines. Tests bind port 0 (no race for a port), read the port from
the ready line, and keep stdout (the access log) in memory so a test can assert on its lines
(`Process.lines`), with stderr apart for start-up errors. The shared parts come from `procs`:
`read_ready_line` and `stop_pid`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import IO, Any

from impl.harness.procs import read_ready_line, stop_pid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
API_KEY = "tml-test-key"
_SERVER_READY = re.compile(r"^hotpath-server listening on (http://\S+)$")
_UPSTREAM_READY = re.compile(r"^fake-vllm listening on (http://\S+)$")


@dataclass
class Process:
    """A started process; its stdout (the access log, for the server) is read by a thread into
    `lines`, so a chatty process never blocks on a full pipe."""

    url: str
    pid: int
    process: subprocess.Popen = field(repr=False)
    errors: IO[bytes] = field(repr=False)
    lines: list[str] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        def drain() -> None:
            for line in self.process.stdout:
                self.lines.append(line)

        self._drain = threading.Thread(target=drain, daemon=True)
        self._drain.start()

    def stderr(self) -> str:
        self.errors.seek(0)
        return self.errors.read().decode(errors="replace")

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=30) as response:
            return json.loads(response.read())

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM by PID, then SIGKILL if it has not exited within `timeout` seconds."""
        stdout, self.process.stdout = self.process.stdout, None  # the drain thread reads it
        stop_pid(self.process, timeout)
        self._drain.join(timeout=5)  # EOF once the process is gone
        if stdout is not None and not self._drain.is_alive():
            stdout.close()
        self.errors.close()

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(
    command: list[str],
    ready: re.Pattern[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> Process:
    """Run `command` and wait for its ready line."""
    errors = tempfile.TemporaryFile()  # noqa: SIM115 -- a file: a chatty process never blocks
    full_env = {**os.environ, "TINKER_TELEMETRY": "0", **(env or {})}
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=errors, text=True, env=full_env
    )
    match = read_ready_line(process, lambda line: ready.match(line.strip()), timeout)
    if match:
        return Process(match.group(1), process.pid, process, errors)
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait()
    errors.seek(0)
    stderr = errors.read().decode(errors="replace")
    errors.close()
    raise RuntimeError(f"not ready: {' '.join(command)}\n{stderr[-3000:]}")


def start_upstream() -> Process:
    return start(
        [sys.executable, os.path.join(ROOT, "tests", "support", "fake_vllm.py")], _UPSTREAM_READY
    )


def start_server(
    router_url: str, *args: str, env: dict[str, str] | None = None, measurements: str | None = None
) -> Process:
    """`hotpath serve --port 0` against `router_url`; no recorded measurements, no calibration
    (picks come from the preference order unless `args` or `env` say otherwise)."""
    env = {
        "HOTPATH_MEASUREMENTS": measurements or os.devnull,  # nothing recorded
        **(env or {}),
    }
    command = [
        sys.executable,
        "-m",
        "impl.cli",
        "serve",
        "--port",
        "0",
        "--router-url",
        router_url,
        "--no-calibrate",
        "--log-level",
        "warning",
        *args,
    ]
    return start(command, _SERVER_READY, env=env)


class Api:
    """A small httpx client for the server's sampling flow (what the SDK does, step by step)."""

    def __init__(self, url: str, *, api_key: str = API_KEY, timeout: float = 60.0) -> None:
        import httpx

        self.url = url
        self.http = httpx.Client(base_url=url, headers={"X-API-Key": api_key}, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return self.http.post(path, json=body, **kwargs)

    def healthz(self) -> dict[str, Any]:
        return self.http.get("/healthz").json()

    def held_polls(self, kind: str) -> dict[str, int]:
        """Why the answering process's held polls of `kind` (`future`: retrieve_future,
        `session`: retrieve_futures) answered so far: /healthz `held_polls`."""
        return self.healthz()["held_polls"][kind]

    def sampling_session(self, base_model: str = "fake/model") -> str:
        session = self.post("/api/v1/create_session", {"tags": [], "sdk_version": "test"})
        session.raise_for_status()
        sampling = self.post(
            "/api/v1/create_sampling_session",
            {
                "session_id": session.json()["session_id"],
                "sampling_session_seq_id": 0,
                "base_model": base_model,
            },
        )
        sampling.raise_for_status()
        return sampling.json()["sampling_session_id"]

    def asample(
        self,
        ssid: str,
        seq_id: int,
        *,
        seed: int,
        prompt: list[int] | None = None,
        n: int = 1,
        max_tokens: int = 8,
        **extra: Any,
    ) -> Any:
        body = {
            "sampling_session_id": ssid,
            "seq_id": seq_id,
            "num_samples": n,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": prompt or [128000, 1, 2, 3]}]},
            "sampling_params": {"max_tokens": max_tokens, "seed": seed, "temperature": 1.0},
            **extra,
        }
        return self.post("/api/v1/asample", body)

    def retrieve(self, request_id: str, *, proto: bool = True) -> Any:
        headers = {"Accept": "application/x-protobuf"} if proto else {}
        return self.post("/api/v1/retrieve_future", {"request_id": request_id}, headers=headers)

    def result(self, request_id: str, *, proto: bool = True, deadline: float = 60.0) -> Any:
        """The first retrieve_future answer that is not try_again."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            response = self.retrieve(request_id, proto=proto)
            is_json = response.headers.get("content-type", "").startswith("application/json")
            if (
                is_json
                and response.status_code == 200
                and response.json().get("type") == "try_again"
            ):
                continue
            return response
        raise TimeoutError(f"{request_id} still pending after {deadline} s")

    def wait_healthz(self, predicate: Any, *, deadline: float = 30.0) -> dict[str, Any]:
        """Poll /healthz until `predicate(health)` holds; the last health on timeout."""
        end = time.monotonic() + deadline
        while True:
            health = self.healthz()
            if predicate(health) or time.monotonic() > end:
                return health
            time.sleep(0.05)


def grown(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The counters that grew from `before` to `after`, by how much (e.g. held-poll reasons)."""
    return {k: after[k] - before.get(k, 0) for k in after if after[k] > before.get(k, 0)}


def address_of(server) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def exchange(server, data: bytes, *, wait: float = 30.0) -> bytes:
    """Send `data` (in a thread: the server may answer before it has read it all) and read
    until the server closes the connection or `wait` seconds pass."""
    sock = socket.create_connection(address_of(server))

    def send() -> None:
        with contextlib.suppress(OSError):  # closed by the server after its answer
            sock.sendall(data)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    sock.settimeout(wait)
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    sender.join(5)
    sock.close()
    return answer
