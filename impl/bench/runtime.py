"""`hotpath bench` section `runtime`: the HTTP runtimes side by side on the server's own traffic.

Every request crosses the runtime first, so its cost is measured on the load harness's
scenarios, with one `hotpath serve --runtime NAME` per available runtime running at once
(the implementations of every other family pinned to the reference's picks, so only the
runtime differs) and the runs alternating between them, the order rotating each round. On a
shared machine the ratios to the reference measured within a round are the figures to trust;
the absolute ones move with the load.

- small-2048 (session polling): results/s and server CPU per result (all threads, from
  /proc), per round; the ratio to the reference is the median of the per-round ratios.
- probe-128x262k: /healthz p50/p99 on a fresh connection every 50 ms while 262k-token bodies
  arrive (a load balancer's probe under the heaviest bodies).
- RSS after long results: the server's RSS before, after N 32k-token results are served,
  and once they are dropped (`--retrieved-ttl` past, the store swept): the retention some
  runtimes' users report.
- connection bursts: 2048 and 8192 connections opened at once, each sending one
  `GET /readyz` (an app route on every runtime); seconds until all are answered, failures,
  server CPU per connection. The soft open-file limit is raised to the hard one here (the
  servers inherit it) and the servers listen with `--backlog 8192`.

The small-2048 costs are recorded for the runtime pick (`impl.pick`); the server's automatic
pick still never chooses a runtime that lacks a guarantee the settings ask for
(`impl.runtime.LACKS`). Lengths: quick (128 small results, 8 probe bodies, 16 long results,
bursts of 256 and 1024), default (small-2048 x 3 rounds, 32 probe bodies, 128 long results,
bursts of 2048 and 8192), full (5 rounds, 64 probe bodies).

    hotpath bench --only runtime [--quick | --full]
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import statistics
import sys
import time
from typing import Any

from impl import registry
from impl.bench._common import Section
from impl.bench.server import cpu_ns
from impl.harness import load, presets, procs, report
from impl.measure import render_table

#: the long results' servers drop a delivered result after this many seconds
RETRIEVED_TTL = 2.0
BURST_BACKLOG = 8192


def _lengths(quick: bool, full: bool) -> dict[str, Any]:
    if quick:
        return dict(small=128, rounds=1, probe=8, long=16, bursts=(256, 1024))
    return dict(
        small=2048, rounds=5 if full else 3, probe=64 if full else 32, long=128, bursts=(2048, 8192)
    )


def _rotated(names: list[str], index: int) -> list[str]:
    shift = index % len(names)
    return names[shift:] + names[:shift]


def _rss_bytes(pid: int) -> int | None:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return None


def raise_open_files() -> tuple[int, int]:
    """The soft open-file limit raised to the hard one (children inherit it): (soft, hard)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


class Servers:
    """One router and one server per runtime, started together, stopped at exit."""

    def __init__(self, scenario: presets.Scenario, names: list[str], extra: tuple[str, ...] = ()):
        self.scenario, self.names = scenario, names
        self.extra = ("--retrieved-ttl", str(RETRIEVED_TTL), *extra)
        self.by_name: dict[str, procs.Proc] = {}

    def __enter__(self) -> Servers:
        self._stack = contextlib.ExitStack()
        started = self._stack.enter_context(procs.stopped_at_exit())
        self.router = procs.start_router([*self.scenario.router_args(), "--seed", "0"])
        started.append(self.router)
        base = (*self.scenario.server_args, *self.extra)
        first = procs.start_server(self.router.url, extra=(*base, "--runtime", self.names[0]))
        try:  # its picks, pinned on every server (the first included), so only the runtime differs
            _, shown = procs.get_json(first.url + "/healthz", timeout=10.0)
        finally:
            first.stop()
        pinned: list[str] = []
        for family, picked in report.picks(shown).items():
            if family != "runtime":
                pinned += [f"--{family}", picked]
        for name in self.names:
            server = procs.start_server(self.router.url, extra=(*base, *pinned, "--runtime", name))
            started.append(server)
            self.by_name[name] = server
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.__exit__(*exc)

    def run(self, name: str, scenario: presets.Scenario) -> dict[str, Any]:
        server = self.by_name[name]
        common = dict(url=server.url, router_url=self.router.url, server_pid=server.pid)
        return load.run_scenario(
            scenario, label=name, progress_bar=False, settle_seconds=30.0, **common
        )


def _small(names: list[str], count: int, rounds: int) -> dict[str, Any]:
    scenario = presets.get("small-2048").with_overrides(
        num_requests=count, poll="session", timeout=300.0
    )
    per_round: list[dict[str, dict[str, Any]]] = []
    with Servers(scenario, names) as servers:
        for index in range(rounds):
            summaries = {}
            for name in _rotated(names, index):
                print(f"-- small-2048 round {index + 1}: {name}", file=sys.stderr, flush=True)
                summaries[name] = report.summarize(servers.run(name, scenario))
            per_round.append(summaries)
    reference = names[0]
    out: dict[str, Any] = {}
    for name in names:
        runs = [r[name] for r in per_round]
        cpu = [r["server_cpu_ms_per_result"] for r in runs]
        rate = [r["results_per_second"] for r in runs]
        ratios = [
            r[name]["server_cpu_ms_per_result"] / r[reference]["server_cpu_ms_per_result"]
            for r in per_round
            if r[name]["server_cpu_ms_per_result"] and r[reference]["server_cpu_ms_per_result"]
        ]
        rate_ratios = [
            r[name]["results_per_second"] / r[reference]["results_per_second"]
            for r in per_round
            if r[name]["results_per_second"] and r[reference]["results_per_second"]
        ]
        out[name] = {
            "cpu_ms_per_result": statistics.median(c for c in cpu if c) if any(cpu) else None,
            "results_per_second": statistics.median(x for x in rate if x) if any(rate) else None,
            "cpu_ratio": statistics.median(ratios) if ratios else None,
            "cpu_ratios": ratios,
            "rate_ratio": statistics.median(rate_ratios) if rate_ratios else None,
            "http_requests_per_result": runs[-1]["http_requests_per_result"],
            "completed": sum(r["completed"] for r in runs),
            "requested": sum(r["requested"] for r in runs),
            "failed": sum(r["failed"] for r in runs),
        }
    return out


def _probe(names: list[str], count: int) -> dict[str, Any]:
    scenario = presets.get("probe-128x262k").with_overrides(num_requests=count, timeout=600.0)
    out = {}
    with Servers(scenario, names) as servers:
        for name in names:
            print(f"-- probe-128x262k: {name}", file=sys.stderr, flush=True)
            summary = report.summarize(servers.run(name, scenario.with_overrides()))
            out[name] = {
                key: summary[key]
                for key in (
                    "healthz_p50",
                    "healthz_p99",
                    "healthz_max",
                    "healthz_failures",
                    "results_per_second",
                    "server_cpu_ms_per_result",
                    "server_peak_rss_bytes",
                    "completed",
                    "requested",
                    "failed",
                )
            }
    return out


def _long_rss(names: list[str], count: int) -> dict[str, Any]:
    scenario = presets.get("long-512x32k").with_overrides(
        num_requests=count, max_outstanding=min(count, 512), timeout=600.0
    )
    out = {}
    with Servers(scenario, names) as servers:
        for name in names:
            pid = servers.by_name[name].pid
            before = _rss_bytes(pid)
            print(f"-- long-512x32k x {count}: {name}", file=sys.stderr, flush=True)
            summary = report.summarize(servers.run(name, scenario))
            served = _rss_bytes(pid)
            time.sleep(RETRIEVED_TTL + 5.0)  # past the TTL, and the store's sweep
            procs.get_json(servers.by_name[name].url + "/healthz", timeout=10.0)
            out[name] = {
                "rss_before": before,
                "rss_served": served,
                "rss_dropped": _rss_bytes(pid),
                "peak_rss": summary["server_peak_rss_bytes"],
                "completed": summary["completed"],
                "requested": summary["requested"],
                "failed": summary["failed"],
            }
    return out


async def _burst(port: int, count: int) -> tuple[float, int]:
    """`count` connections opened at once, one `GET /readyz` each: (seconds, failures)."""
    request = b"GET /readyz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"

    async def one() -> bool:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 60)
            writer.write(request)
            data = await asyncio.wait_for(reader.read(), 60)
            writer.close()
            return data.startswith(b"HTTP/1.1 200")
        except (TimeoutError, OSError):
            return False

    started = time.perf_counter()
    answers = await asyncio.gather(*(one() for _ in range(count)))
    return time.perf_counter() - started, answers.count(False)


def _bursts(names: list[str], sizes: tuple[int, ...]) -> dict[str, Any]:
    import uvloop

    soft, hard = raise_open_files()
    if soft < max(sizes) * 2 + 256:
        raise RuntimeError(f"open-file limit {soft} (hard {hard}) is too low for {max(sizes)}")
    scenario = presets.get("small-2048")
    extra = ("--backlog", str(BURST_BACKLOG))
    out: dict[str, Any] = {name: {} for name in names}
    with Servers(scenario, names, extra) as servers:
        for index, size in enumerate(sizes):
            for name in _rotated(names, index):
                server = servers.by_name[name]
                port = int(server.url.rsplit(":", 1)[1])
                print(f"-- burst {size}: {name}", file=sys.stderr, flush=True)
                cpu_before = cpu_ns(server.pid)
                seconds, failures = uvloop.run(_burst(port, size))
                cpu = (cpu_ns(server.pid) - cpu_before) / 1e9
                out[name][str(size)] = {
                    "seconds": seconds,
                    "failures": failures,
                    "server_cpu_us_per_connection": cpu / size * 1e6,
                    "rss_after": _rss_bytes(server.pid),
                }
                time.sleep(
                    1.0
                )  # the closed connections' sockets leave TIME_WAIT-free (server side)
    return out


def _mb(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e6:,.0f}"


def _f(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _tables(names, small, probe, rss, bursts, sizes) -> str:
    rows = []
    for name in names:
        s, p, r = small[name], probe[name], rss[name]
        rows.append(
            (
                name,
                _f(s["results_per_second"], ",.0f"),
                _f(s["cpu_ms_per_result"], ".3f"),
                _f(s["cpu_ratio"], ".2f") + "x",
                _f(p["healthz_p50"], ".3f"),
                _f(p["healthz_p99"], ".3f"),
                f"{_mb(r['rss_before'])} / {_mb(r['rss_served'])} / {_mb(r['rss_dropped'])}",
                *(
                    f"{_f(bursts[name][str(n)]['seconds'], '.2f')} s, "
                    f"{_f(bursts[name][str(n)]['server_cpu_us_per_connection'], '.0f')} us/conn, "
                    f"{bursts[name][str(n)]['failures']} failed"
                    for n in sizes
                ),
                "yes" if not (s["failed"] or p["failed"] or r["failed"]) else "NO",
            )
        )
    return render_table(
        [
            "runtime",
            "small res/s",
            "CPU ms/result",
            "CPU vs ref",
            "/healthz p50 s",
            "p99 s",
            "RSS MB before/served/dropped",
            *(f"burst {n}" for n in sizes),
            "no failures",
        ],
        rows,
    )


def measure(quick: bool = True, full: bool = False) -> dict[str, Any]:
    """Every figure of the section: {"lengths", "names" (available, the reference first),
    "missing" {name: why unavailable}, "small", "probe", "rss", "bursts" {name: figures}}."""
    lengths = _lengths(quick, full)
    names = registry.available("runtime")
    missing = {
        name: registry.unavailable_reason("runtime", name)
        for name in registry.names("runtime")
        if name not in names
    }
    return {
        "lengths": lengths,
        "names": names,
        "missing": missing,
        "small": _small(names, lengths["small"], lengths["rounds"]),
        "probe": _probe(names, lengths["probe"]),
        "rss": _long_rss(names, lengths["long"]),
        "bursts": _bursts(names, lengths["bursts"]),
    }


def run(quick: bool, full: bool = False) -> Section:
    measured = measure(quick, full)
    lengths, names, missing = measured["lengths"], measured["names"], measured["missing"]
    small, probe, rss, bursts = (measured[k] for k in ("small", "probe", "rss", "bursts"))
    rows = []
    for name in names:
        failed = small[name]["failed"] + probe[name]["failed"] + rss[name]["failed"]
        rows.append(
            {
                "runtime": name,
                "small": small[name],
                "probe": probe[name],
                "rss": rss[name],
                "bursts": bursts[name],
                "parity": not failed,
            }
        )
    for name, reason in missing.items():
        rows.append({"runtime": name, "unavailable": reason})
    costs = {n: small[n]["cpu_ratio"] for n in names if small[n]["cpu_ratio"] is not None}
    measurements = [{"input": "small-2048", "size_bytes": None, "cost": costs}] if costs else []
    commands = [
        f"small-2048: --num-requests {lengths['small']} --poll session, "
        f"{lengths['rounds']} rounds alternating",
        f"probe-128x262k: --num-requests {lengths['probe']}",
        f"long-512x32k: --num-requests {lengths['long']}",
        f"bursts: {', '.join(map(str, lengths['bursts']))} connections at once, GET /readyz, "
        f"server --backlog {BURST_BACKLOG}",
    ]
    notes = "\n".join(
        [
            "Scenarios (one server per runtime, the other families pinned to the reference's "
            f"picks, every server with --retrieved-ttl {RETRIEVED_TTL}): " + "; ".join(commands),
            "CPU vs ref: median over rounds of the server CPU per result divided by the "
            f"reference's ({names[0]}) in the same round.",
            *(f"{name}: unavailable ({reason})" for name, reason in missing.items()),
        ]
    )
    return Section(
        family="runtime",
        title="HTTP runtimes side by side (load harness, one server per runtime)",
        table=_tables(names, small, probe, rss, bursts, lengths["bursts"]),
        rows=rows,
        measurements=measurements,
        notes=notes,
    )
