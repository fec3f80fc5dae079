"""What the Prometheus metrics cost: server CPU per request with and without them, in one run.

Three measurements, each comparing the same server with metrics on (the default) and with
`--no-metrics` side by side, reading CPU time from /proc/PID/task/*/schedstat (all threads):

- **full sample**: two real `hotpath serve` processes behind one fake router (`hotpath router`,
  instant, minimal bodies of 16 tokens); each sample is an asample and retrieve_future polls
  (held until the result is there) over 8 keep-alive connections per server, with the real
  forward (pool, decode, encode, store) in between, and every answer checked (a protobuf
  result). Both servers are loaded at the same time in each round, so both see the same
  machine; after a round each one's CPU is read once it has gone quiet. Each round also
  scrapes the metrics side's `/metrics` once, as Prometheus would. The figure is server CPU
  per sample; the target is at most 5% more with metrics.
- **route only**: the cheapest requests, where the middleware's fixed cost weighs most: the
  bench apps of `impl/bench/server.py` (`hotpath` vs `hotpath-nometrics`, forward stubbed)
  answering retrieve_future try_again and asample, in alternating batches.
- **in process**: the same two apps called as ASGI apps in this process (no HTTP, no uvicorn,
  `time.process_time`), alternating rounds: the metrics' own cost per request without the
  noise of two server processes on a shared machine.

The ratio is the median of the per-round ratios (metrics on / off), which cancels slow drifts
of a shared machine.

    python -m impl.probes.metrics_cost [--quick]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import urllib.parse
from typing import Any

import orjson

from impl.bench import server as route_bench
from impl.harness import procs, watch
from impl.measure import render_table

TRY_AGAIN = b'{"type":"try_again"}'
CONNECTIONS = 8
TOKENS = 16
#: (samples per batch, rounds) for the full-sample measurement: quick, default.
LENGTHS = {"quick": (300, 4), "default": (600, 8)}


def _body(ssid: str, seq_id: int) -> bytes:
    body = orjson.loads(route_bench._asample_body(ssid, seq_id))
    body["sampling_params"]["max_tokens"] = TOKENS
    return orjson.dumps(body)


async def settled_cpu_ns(pid: int, quiet_ns: int = 500_000, limit: float = 2.0) -> int:
    """The process's CPU time once it has gone quiet (< 0.5 ms of CPU in 20 ms): work a batch
    leaves behind (the access-log listener thread writing its lines, closing connections)
    is counted in that batch, not in whichever batch of this server comes next."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    last = route_bench.cpu_ns(pid)
    while loop.time() < deadline:
        await asyncio.sleep(0.02)
        now = route_bench.cpu_ns(pid)
        if now - last < quiet_ns:
            return now
        last = now
    return last


class Side:
    """One `hotpath serve` process under test, with its sampling session."""

    def __init__(self, name: str, proc: procs.Proc) -> None:
        self.name, self.proc = name, proc
        self.port = urllib.parse.urlsplit(proc.url).port
        self.ssid = ""
        self.seq = 0
        self.scrapes = 0
        self.wall: list[float] = []  # seconds per round

    async def prepare(self) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            post = route_bench._post
            _, body = await route_bench._exchange(
                reader, writer, post("/api/v1/create_session", b"{}")
            )
            request = orjson.dumps(
                {
                    "session_id": orjson.loads(body)["session_id"],
                    "sampling_session_seq_id": 0,
                    "base_model": "bench",
                }
            )
            _, body = await route_bench._exchange(
                reader, writer, post("/api/v1/create_sampling_session", request)
            )
            self.ssid = orjson.loads(body)["sampling_session_id"]
        finally:
            writer.close()

    async def batch(self, count: int, scrape: bool) -> None:
        """`count` full samples over CONNECTIONS connections (and one scrape)."""
        seqs = list(range(self.seq, self.seq + count))
        self.seq += count
        await asyncio.gather(*(self._samples(seqs[i::CONNECTIONS]) for i in range(CONNECTIONS)))
        if scrape:
            status, _, _ = await asyncio.to_thread(watch.probe, self.proc.url + "/metrics")
            if status != 200:
                raise AssertionError(f"{self.name}: GET /metrics answered {status}")
            self.scrapes += 1

    async def _samples(self, seqs: list[int]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        exchange, post = route_bench._exchange, route_bench._post
        try:
            for seq in seqs:
                status, body = await exchange(
                    reader, writer, post("/api/v1/asample", _body(self.ssid, seq))
                )
                if status != 200:
                    raise AssertionError(f"{self.name}: asample {status} {body[:200]!r}")
                poll = orjson.dumps({"request_id": orjson.loads(body)["request_id"]})
                while True:
                    status, body = await exchange(
                        reader, writer, post("/api/v1/retrieve_future", poll)
                    )
                    if status != 200 or (body[:1] == b"{" and body != TRY_AGAIN):
                        raise AssertionError(f"{self.name}: poll {status} {body[:200]!r}")
                    if body != TRY_AGAIN:
                        break  # protobuf SampleResponse bytes
        finally:
            writer.close()


async def _round(sides: list[Side], count: int, scrape: bool = True) -> list[float]:
    """Both servers loaded at once (the same machine conditions for both): each one's CPU
    seconds per sample over `count` samples; the metrics side is scraped once."""
    before = [await settled_cpu_ns(side.proc.pid) for side in sides]
    began = time.monotonic()
    await asyncio.gather(*(s.batch(count, scrape and s.name == "metrics") for s in sides))
    sides[0].wall.append(time.monotonic() - began)
    after = [await settled_cpu_ns(side.proc.pid) for side in sides]
    return [(b - a) / count / 1e9 for a, b in zip(before, after, strict=True)]


async def _scrape_cost(side: Side, scrapes: int = 20) -> float:
    """Server CPU seconds per GET /metrics on an idle server."""
    before = await settled_cpu_ns(side.proc.pid)
    for _ in range(scrapes):
        status, _, _ = await asyncio.to_thread(watch.probe, side.proc.url + "/metrics")
        if status != 200:
            raise AssertionError(f"{side.name}: GET /metrics answered {status}")
    return (await settled_cpu_ns(side.proc.pid) - before) / scrapes / 1e9


async def _full(count: int, rounds: int) -> dict[str, Any]:
    with procs.stopped_at_exit() as started:
        router = procs.start_router(["--mode", "instant", "--body", "minimal"])
        started.append(router)
        sides = []
        for name, extra in (("metrics", []), ("no-metrics", ["--no-metrics"])):
            flags = ["--log-level", "warning", "--no-calibrate", *extra]  # same picks on both
            proc = procs.start_server(router.url, extra=flags)
            started.append(proc)
            sides.append(Side(name, proc))
        picks = [watch.fetch_json(s.proc.url + "/healthz")["picks"] for s in sides]
        if picks[0] != picks[1]:
            raise AssertionError(f"the two servers picked differently: {picks}")
        for side in sides:
            await side.prepare()
        await _round(sides, max(count // 4, 100), scrape=False)  # warm-up, not recorded
        samples: dict[str, list[float]] = {s.name: [] for s in sides}
        for _ in range(rounds):
            for side, cpu in zip(sides, await _round(sides, count), strict=True):
                samples[side.name].append(cpu)
        counted = watch.fetch_json(sides[0].proc.url + "/healthz")["store"]["submitted"]
        scrape_cpu = await _scrape_cost(sides[0])
    ratios = [a / b for a, b in zip(samples["metrics"], samples["no-metrics"], strict=True)]
    return {
        "per_sample_cpu_s": {name: statistics.median(v) for name, v in samples.items()},
        "ratio": statistics.median(ratios),
        "round_ratios": ratios,
        "samples": samples,
        "picks": {f: p["name"] for f, p in picks[0].items()},
        "batch": count,
        "rounds": rounds,
        "submitted_on_metrics_side": counted,
        "scrapes": sides[0].scrapes,
        "round_wall_s": statistics.median(sides[0].wall),
        "scrape_cpu_s": scrape_cpu,
    }


def _routes(count: int, rounds: int) -> dict[str, Any]:
    apps = ("hotpath", "hotpath-nometrics", "starlette")
    results = route_bench.measure(count=count, rounds=rounds, apps=apps)
    out = {}
    for route, per_app in results.items():
        on, off = per_app["hotpath"]["samples"], per_app["hotpath-nometrics"]["samples"]
        out[route] = {
            "per_request_cpu_s": {
                "metrics": statistics.median(on),
                "no-metrics": statistics.median(off),
            },
            "ratio": statistics.median(a / b for a, b in zip(on, off, strict=True)),
        }
    return out


async def _asgi(app: Any, state: Any, path: str, body: bytes) -> bytes:
    """One request through the app's ASGI callable in this process; the response body."""
    scope = {
        "type": "http", "method": "POST", "path": path, "query_string": b"", "root_path": "",
        "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 1), "state": state,
        "headers": [(b"content-type", b"application/json"), (b"x-api-key", b"tml-bench"),
                    (b"accept", b"application/x-protobuf")],
    }  # fmt: skip
    messages = iter([{"type": "http.request", "body": body, "more_body": False}])
    sent: list[bytes] = []

    async def receive() -> dict[str, Any]:
        return next(messages)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message.get("body", b""))

    await app(scope, receive, send)
    return b"".join(sent)


async def _in_process(count: int, rounds: int) -> dict[str, Any]:
    from impl.bench._server_apps import hotpath_app

    sides = {}
    for metrics in (True, False):
        app = hotpath_app(metrics=metrics)
        context = app.router.lifespan_context(app)
        state = await context.__aenter__()
        server = state["server"]
        owner = server.callers.identify(b"tml-bench").name  # the key its requests carry
        session = await server.sessions.create(owner)
        ssid = await server.sessions.create_sampling(session, 0, "bench", owner)
        body = await _asgi(app, state, "/api/v1/asample", _body(ssid, 10**9))
        poll = orjson.dumps({"request_id": orjson.loads(body)["request_id"]})
        sides[metrics] = (app, state, context, ssid, poll)
    results: dict[str, Any] = {}
    try:
        for route in ("retrieve_future", "asample"):
            samples: dict[bool, list[float]] = {True: [], False: []}
            for r in range(rounds):
                for metrics in (True, False) if r % 2 == 0 else (False, True):
                    app, state, _, ssid, poll = sides[metrics]
                    if route == "asample":
                        first = r * count
                        bodies = [_body(ssid, first + i) for i in range(count)]
                        path = "/api/v1/asample"
                    else:
                        bodies, path = [poll] * count, "/api/v1/retrieve_future"
                    began = time.process_time()
                    for body in bodies:
                        await _asgi(app, state, path, body)
                    samples[metrics].append((time.process_time() - began) / count)
            ratios = [a / b for a, b in zip(samples[True], samples[False], strict=True)]
            results[route] = {
                "per_request_cpu_s": {
                    "metrics": statistics.median(samples[True]),
                    "no-metrics": statistics.median(samples[False]),
                },
                "ratio": statistics.median(ratios),
                "timed": count * rounds,  # requests each side served in the timed rounds
                "counted": _counted(sides[True][1], f"/api/v1/{route}"),
            }
    finally:
        for _app, _, context, _, _ in sides.values():
            await context.__aexit__(None, None, None)
    return results


def _counted(state: Any, path: str) -> int:
    """Requests to `path` the metrics side's request histogram counted (its /metrics body)."""
    body, _ = state["server"].metrics.exposition(state["server"])
    prefix = "hotpath_http_request_duration_seconds_count{"
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in body.decode().splitlines()
        if line.startswith(prefix) and f'route="{path}"' in line
    )


def measure(quick: bool = False) -> dict[str, Any]:
    """{"full_sample", "routes", "in_process"}: metrics on vs off, each side by side."""
    count, rounds = LENGTHS["quick" if quick else "default"]
    full = asyncio.run(_full(count, rounds))
    routes = _routes(400 if quick else 1000, 3 if quick else 5)
    in_process = asyncio.run(_in_process(1000 if quick else 2000, 6 if quick else 8))
    return {"full_sample": full, "routes": routes, "in_process": in_process}


def render(results: dict[str, Any]) -> str:
    full = results["full_sample"]
    rows = [
        [
            f"full sample ({TOKENS} tokens, real forward)",
            f"{full['per_sample_cpu_s']['metrics'] * 1e6:.1f} µs",
            f"{full['per_sample_cpu_s']['no-metrics'] * 1e6:.1f} µs",
            f"{full['ratio']:.3f}x",
        ]
    ]
    requests = [(f"{route} (route only)", r) for route, r in results["routes"].items()]
    requests += [(f"{route} (in process)", r) for route, r in results["in_process"].items()]
    for name, r in requests:
        rows.append(
            [
                name,
                f"{r['per_request_cpu_s']['metrics'] * 1e6:.1f} µs",
                f"{r['per_request_cpu_s']['no-metrics'] * 1e6:.1f} µs",
                f"{r['ratio']:.3f}x",
            ]
        )
    table = render_table(["server CPU per", "metrics on", "--no-metrics", "ratio"], rows)
    return (
        f"{table}\n\nfull sample: {full['rounds']} rounds of {full['batch']} samples per side, "
        f"both servers loaded at once, one /metrics scrape per round (a round: "
        f"{full['round_wall_s']:.1f} s; one scrape costs {full['scrape_cpu_s'] * 1e3:.2f} ms of "
        "server CPU on an idle server); per-round ratios "
        + ", ".join(f"{r:.3f}" for r in full["round_ratios"])
        + f"; picks {full['picks']}. Target: at most 1.05x."
    )


if __name__ == "__main__":
    print(render(measure(quick="--quick" in sys.argv)))
