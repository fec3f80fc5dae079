"""What the Prometheus metrics cost: server CPU per request with and without them, in one run.

Two measurements, each comparing the same server with metrics on (the default) and with
`--no-metrics`, side by side in alternating batches (the order rotates every round), reading
each server process's CPU time from /proc/PID/task/*/schedstat (all threads) around each batch:

- **full sample**: two real `hotpath serve` processes behind one fake router (`hotpath router`,
  instant, minimal bodies of 16 tokens); each sample is an asample and retrieve_future polls
  (held until the result is there) over 8 keep-alive connections, with the real forward (pool,
  decode, encode, store) in between, and every answer checked (a protobuf result). Each batch
  on the metrics side also scrapes `/metrics` once, as Prometheus would. The figure is server
  CPU per sample; the target is at most 5% more with metrics.
- **route only**: the cheapest requests, where the middleware's fixed cost weighs most: the
  bench apps of `impl/bench/server.py` (`hotpath` vs `hotpath-nometrics`, forward stubbed)
  answering retrieve_future try_again and asample.

The ratio is the median of the per-round ratios (metrics on / off), which cancels slow drifts
of a shared machine.

    python -m impl.bench.metrics_cost [--quick]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import urllib.parse
from typing import Any

import orjson

from impl.bench import server as route_bench
from impl.harness import procs
from impl.measure import render_table

TRY_AGAIN = b'{"type":"try_again"}'
CONNECTIONS = 8
TOKENS = 16
#: (samples per batch, rounds) for the full-sample measurement: quick, default.
LENGTHS = {"quick": (300, 4), "default": (1000, 7)}


def _body(ssid: str, seq_id: int) -> bytes:
    body = orjson.loads(route_bench._asample_body(ssid, seq_id))
    body["sampling_params"]["max_tokens"] = TOKENS
    return orjson.dumps(body)


class Side:
    """One `hotpath serve` process under test, with its sampling session."""

    def __init__(self, name: str, proc: procs.Proc) -> None:
        self.name, self.proc = name, proc
        self.port = urllib.parse.urlsplit(proc.url).port
        self.ssid = ""
        self.seq = 0
        self.scrapes = 0

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

    async def batch(self, count: int, scrape: bool) -> float:
        """Server CPU seconds per sample over `count` full samples (and one scrape)."""
        seqs = list(range(self.seq, self.seq + count))
        self.seq += count
        before = route_bench.cpu_ns(self.proc.pid)
        await asyncio.gather(*(self._samples(seqs[i::CONNECTIONS]) for i in range(CONNECTIONS)))
        if scrape:
            status, _, _ = await asyncio.to_thread(procs.probe, self.proc.url + "/metrics")
            if status != 200:
                raise AssertionError(f"{self.name}: GET /metrics answered {status}")
            self.scrapes += 1
        return (route_bench.cpu_ns(self.proc.pid) - before) / count / 1e9

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
        picks = [procs.fetch_json(s.proc.url + "/healthz")["picks"] for s in sides]
        if picks[0] != picks[1]:
            raise AssertionError(f"the two servers picked differently: {picks}")
        for side in sides:
            await side.prepare()
            await side.batch(max(count // 4, 100), scrape=False)  # warm-up, not recorded
        samples: dict[str, list[float]] = {s.name: [] for s in sides}
        for r in range(rounds):
            for side in sides[r % 2 :] + sides[: r % 2]:
                samples[side.name].append(await side.batch(count, scrape=side.name == "metrics"))
        counted = procs.fetch_json(sides[0].proc.url + "/healthz")["store"]["submitted"]
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


def measure(quick: bool = False) -> dict[str, Any]:
    """{"full_sample": {...}, "routes": {route: {...}}}: metrics on vs off, in one run."""
    count, rounds = LENGTHS["quick" if quick else "default"]
    full = asyncio.run(_full(count, rounds))
    routes = _routes(400 if quick else 2000, 3 if quick else 5)
    return {"full_sample": full, "routes": routes}


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
    for route, r in results["routes"].items():
        rows.append(
            [
                f"{route} (route only)",
                f"{r['per_request_cpu_s']['metrics'] * 1e6:.1f} µs",
                f"{r['per_request_cpu_s']['no-metrics'] * 1e6:.1f} µs",
                f"{r['ratio']:.3f}x",
            ]
        )
    table = render_table(["server CPU per", "metrics on", "--no-metrics", "ratio"], rows)
    return (
        f"{table}\n\nfull sample: {full['rounds']} rounds of {full['batch']} samples per side, "
        f"one /metrics scrape per batch on the metrics side; per-round ratios "
        + ", ".join(f"{r:.3f}" for r in full["round_ratios"])
        + f"; picks {full['picks']}. Target: at most 1.05x."
    )


if __name__ == "__main__":
    print(render(measure(quick="--quick" in sys.argv)))
