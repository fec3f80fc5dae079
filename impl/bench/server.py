"""`hotpath bench` section for the server: HTTP overhead of the hot routes, in one run.

Method. Four apps (see `_server_apps.py`: the production app with its forward left unsent, the
same without its hot-path dispatch, a bare Starlette app doing the same JSON work with orjson,
and the idiomatic FastAPI version) each run in their own process under the same uvicorn
configuration (uvloop, httptools, no access log). This process drives each one over 8
keep-alive connections with prebuilt requests and checks every response (status, and try_again
or a request id in the body). The figure is the server process's CPU time per request, read
from /proc/PID/task/*/schedstat (nanoseconds, all threads) before and after each batch, so
client CPU and waiting do not count. Apps are measured in alternating batches (the order
rotates each round); the ratio to Starlette is the median of the per-round ratios, which
cancels slow drifts of a shared, noisy machine.

Lengths (requests per batch x rounds, per route and app): quick 400 x 3 (hotpath and starlette
only), default 2000 x 5, full 4000 x 9.

Routes: `retrieve_future` answering try_again (hotpath with --poll-hold 0 on a pending sample)
and `asample` (a new seq_id every request). The target: hotpath within 1.2x of Starlette.

    python -m impl.bench.server [--quick | --full]
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from impl.bench._common import Section
from impl.bench._server_apps import APPS, PENDING_ID
from impl.measure import format_seconds, median_seconds, render_table

ROUTES = ("retrieve_future", "asample")
CONNECTIONS = 8
API_KEY = "tml-bench"
PROMPT = list(range(1000, 1064))  # 64 prompt tokens


def _post(path: str, body: bytes, accept: str = "application/x-protobuf") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"accept: {accept}\r\nx-api-key: {API_KEY}\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body


def _asample_body(ssid: str, seq_id: int) -> bytes:
    return orjson.dumps(
        {
            "sampling_session_id": ssid,
            "seq_id": seq_id,
            "num_samples": 1,
            "type": "sample",
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]},
            "sampling_params": {
                "max_tokens": 256,
                "seed": seq_id,
                "temperature": 1.0,
                "top_k": -1,
                "top_p": 1.0,
            },
            "prompt_logprobs": False,
            "topk_prompt_logprobs": 0,
        }
    )


def cpu_ns(pid: int) -> int:
    """Nanoseconds on CPU of every thread of `pid` (Linux schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            total += int((task / "schedstat").read_text().split()[0])
    return total


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[int, bytes]:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    return status, await reader.readexactly(length)


async def drive(port: int, requests: list[bytes], check: Any) -> None:
    """Send `requests` over CONNECTIONS keep-alive connections; `check(status, body)` each."""

    async def one(chunk: list[bytes]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for request in chunk:
                check(*await _exchange(reader, writer, request))
        finally:
            writer.close()

    await asyncio.gather(*(one(requests[i::CONNECTIONS]) for i in range(CONNECTIONS)))


def _check_try_again(status: int, body: bytes) -> None:
    if status != 200 or orjson.loads(body) != {"type": "try_again"}:
        raise AssertionError(f"expected try_again, got {status} {body[:200]!r}")


def _check_asample(status: int, body: bytes) -> None:
    if status != 200 or "request_id" not in orjson.loads(body):
        raise AssertionError(f"expected a request id, got {status} {body[:200]!r}")


class AppProcess:
    def __init__(self, name: str) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, "-m", "impl.bench._server_apps", name],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.port = int(self.process.stdout.readline())
        self.ssid, self.pending = "bench", PENDING_ID
        self.seq = 0

    async def prepare(self) -> None:
        """Wait until it answers; for hotpath, a session and one pending sample to poll."""
        for _ in range(200):
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                break
            except OSError:
                await asyncio.sleep(0.05)
        else:
            raise RuntimeError(f"{self.name} app did not start")
        try:
            if self.name.startswith("hotpath"):
                _, body = await _exchange(reader, writer, _post("/api/v1/create_session", b"{}"))
                session = orjson.loads(body)["session_id"]
                request = orjson.dumps(
                    {"session_id": session, "sampling_session_seq_id": 0, "base_model": "bench"}
                )
                _, body = await _exchange(
                    reader, writer, _post("/api/v1/create_sampling_session", request)
                )
                self.ssid = orjson.loads(body)["sampling_session_id"]
                _, body = await _exchange(
                    reader, writer, _post("/api/v1/asample", _asample_body(self.ssid, 10**9))
                )
                self.pending = orjson.loads(body)["request_id"]
        finally:
            writer.close()

    def requests(self, route: str, count: int) -> list[bytes]:
        if route == "retrieve_future":
            poll = _post("/api/v1/retrieve_future", orjson.dumps({"request_id": self.pending}))
            return [poll] * count
        self.seq += count
        return [
            _post("/api/v1/asample", _asample_body(self.ssid, self.seq - count + i))
            for i in range(count)
        ]

    async def batch(self, route: str, count: int) -> float:
        """Server CPU seconds per request over one batch of `count` requests."""
        requests = self.requests(route, count)
        check = _check_try_again if route == "retrieve_future" else _check_asample
        before = cpu_ns(self.process.pid)
        await drive(self.port, requests, check)
        return (cpu_ns(self.process.pid) - before) / count / 1e9

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()


async def _measure(count: int, rounds: int, names: tuple[str, ...] = APPS) -> dict[str, Any]:
    apps = [AppProcess(name) for name in names]
    try:
        for app in apps:
            await app.prepare()
        results: dict[str, Any] = {}
        for route in ROUTES:
            per_app: dict[str, list[float]] = {app.name: [] for app in apps}
            for app in apps:  # warm-up batch, not recorded
                await app.batch(route, max(count // 4, 500))
            for r in range(rounds):
                for app in apps[r % len(apps) :] + apps[: r % len(apps)]:
                    per_app[app.name].append(await app.batch(route, count))
            ratios = {
                name: statistics.median(
                    a / b for a, b in zip(per_app[name], per_app["starlette"], strict=True)
                )
                for name in per_app
            }
            results[route] = {
                name: {
                    "cpu_s": statistics.median(values),
                    "ratio_to_starlette": ratios[name],
                    "samples": values,
                }
                for name, values in per_app.items()
            }
        return results
    finally:
        for app in apps:
            app.stop()


#: (requests per batch, rounds): quick, default, full.
LENGTHS = {"quick": (400, 3), "default": (2000, 5), "full": (4000, 9)}
#: --quick starts only the two apps the target compares (app start-up is most of its time).
QUICK_APPS = ("hotpath", "starlette")


def measure(
    quick: bool = False,
    *,
    count: int | None = None,
    rounds: int | None = None,
    full: bool = False,
    apps: tuple[str, ...] = APPS,
) -> dict[str, Any]:
    """{route: {app: {"cpu_s", "ratio_to_starlette", "samples"}}} measured in one run."""
    if not os.path.isdir("/proc/self/task"):
        raise NotImplementedError("needs Linux /proc schedstat for per-process CPU time")
    default_count, default_rounds = LENGTHS["quick" if quick else "full" if full else "default"]
    return asyncio.run(_measure(count or default_count, rounds or default_rounds, apps))


def delivery(tokens: int = 32768) -> dict[str, float]:
    """Seconds per poll to produce a stored result's response body, fast store vs baseline.

    In-process (no HTTP): the fast store serves the SampleResponse bytes it stored (and derives
    JSON once, on the first JSON poll); the baseline store keeps JSON and converts it back to
    protobuf through the validated encoder on every protobuf poll.
    """
    from impl import registry
    from impl.encode import proto_to_json, samples
    from impl.server.baseline import BaselineStore
    from impl.server.store import Retention

    completion = samples.sized(tokens)
    proto = registry.create("encode", "protobuf").encode(completion)
    baseline = BaselineStore(
        Retention(completed_ttl=60, retrieved_ttl=60, max_outstanding=1, max_result_bytes=1 << 40),
        encoder=registry.create("encode", "validated"),
        to_json=proto_to_json,
    )
    text = proto_to_json(proto)
    if baseline._to_proto(text) != proto:
        raise AssertionError("baseline JSON -> proto differs from the stored proto")
    return {
        "fast_proto_poll": median_seconds(lambda: proto, min_time=0.05),
        "fast_json_first_poll": median_seconds(lambda: proto_to_json(proto), min_time=0.2),
        "baseline_proto_poll": median_seconds(lambda: baseline._to_proto(text), min_time=0.2),
    }


def run(quick: bool, full: bool = False) -> Section:
    apps = QUICK_APPS if quick else APPS
    results = measure(quick, full=full, apps=apps)
    count, rounds = LENGTHS["quick" if quick else "full" if full else "default"]
    costs = delivery()
    rows = []
    for route in ROUTES:
        for name in apps:
            r = results[route][name]
            rows.append(
                [route, name, f"{r['cpu_s'] * 1e6:.1f} µs", f"{r['ratio_to_starlette']:.2f}x"]
            )
    table = render_table(["route", "app", "server CPU / request", "vs starlette"], rows)
    table += "\n\nbuilding the response body of a stored 32768-token result, per poll:\n"
    labels = {
        "fast_proto_poll": "protobuf, fast (stored bytes as they are)",
        "fast_json_first_poll": "JSON, fast (first poll only; cached)",
        "baseline_proto_poll": "protobuf, --baseline (JSON -> proto, locked)",
    }
    table += render_table(
        ["poll", "cost"], [[label, format_seconds(costs[key])] for key, label in labels.items()]
    )
    json_rows = [
        {"route": route, "app": name, **results[route][name]} for route in ROUTES for name in apps
    ] + [{"delivery_32768_tokens": costs}]
    hot = max(results[route]["hotpath"]["ratio_to_starlette"] for route in ROUTES)
    notes = (
        f"Target: hotpath within 1.20x of bare Starlette on both routes; worst here {hot:.2f}x. "
        "Server process CPU (all threads, /proc schedstat) per request, median of rounds; "
        "the ratio is the median of per-round ratios. asample excludes the forward itself. "
        f"This run: {rounds} rounds of {count} requests per route and app (after a warm-up "
        f"batch of {max(count // 4, 500)}), over {CONNECTIONS} keep-alive connections"
        + (" (--quick: hotpath and starlette only)." if quick else ".")
    )
    return Section(
        "server",
        "HTTP overhead of the hot routes (server CPU per request)",
        table,
        json_rows,
        [],
        notes,
    )


if __name__ == "__main__":
    section = run(quick="--quick" in sys.argv, full="--full" in sys.argv)
    print(section.title, section.table, section.notes, sep="\n\n")
