"""Pool section of `hotpath bench`: client CPU per forwarded request as requests in flight grow.

For each implementation and in-flight count N, the fake router runs in barrier mode with N (it
holds every answer until N requests have arrived, so exactly N are in flight at once), and a
fresh child process (so no state leaks between implementations, as in msgspec's runner) sends
one burst of N requests through a forwarder with `max_connections=N` and reports its CPU seconds
(time.process_time: every thread of the process, so Rust runtimes count too) and wall seconds
for the burst. The children are forked from a multiprocessing forkserver that has imported this
module and nothing else (no interpreter start-up per burst; no burst ever ran in the server);
`python -m impl.bench.pool child NAME URL N` runs one such burst by hand and prints its JSON.
The burst starts on a pool holding one connection (one /healthz request first triggers lazy
set-up: sessions, runtimes, imports), so it includes opening the N connections, as every
implementation must.
An instant upstream would hide the effect: requests finish as fast as they are sent.

A count whose burst would take too long is not run: once an implementation's last burst, scaled
to the next count, predicts more than the time budget of wall time (or a burst failed), its
larger counts are reported as not run (`-`), never guessed. The scaling is quadratic after one
burst (per-request cost may grow with the count, as httpx's does) and the exponent measured
between the last two bursts (at least 1) after that. A failed request ends the burst at once
(the barrier could never fill).

Lengths: default = 64, 256, 1024, 4096 in flight with a 20 s budget per burst; `full` = also
8192, with a 200 s budget (here that runs httpx to 1024 and httpx2 to 4096, as the old 60 s
default with linear prediction did); quick = 32 and 128. HOTPATH_POOL_BUDGET=SECONDS sets
any run's budget.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import os
import resource
import sys
import time
import traceback
import urllib.request
from typing import Any

from impl import registry
from impl.bench._common import Section
from impl.measure import render_table

FAMILY = "pool"
FULL_COUNTS = (64, 256, 1024, 4096, 8192)
#: 64 is cheap and gives the implementations whose bursts get too slow (httpx) a growth figure.
COUNTS = (64, 256, 1024, 4096)
QUICK_COUNTS = (32, 128)
#: Wall-time budget of one burst (default run, `full` run). A burst predicted to exceed it is
#: not run: httpx at 1024 in flight and httpx2 at 4096 take over a minute each here. Set it
#: with HOTPATH_POOL_BUDGET=600 for more of the table.
BUDGET_SECONDS, FULL_BUDGET_SECONDS = 20.0, 200.0


def budget(full: bool = False) -> float:
    """Seconds one burst may be predicted to take: HOTPATH_POOL_BUDGET, else by run length."""
    default = FULL_BUDGET_SECONDS if full else BUDGET_SECONDS
    return float(os.environ.get("HOTPATH_POOL_BUDGET", default))


def predict(walls: dict[int, float], count: int) -> float:
    """Wall seconds of a burst of `count`, scaled from the bursts measured (count: seconds)."""
    last = max(walls)
    exponent = 2.0
    if len(walls) >= 2:
        before = max(c for c in walls if c < last)
        if walls[before] > 0 and walls[last] > 0:
            exponent = max(1.0, math.log(walls[last] / walls[before]) / math.log(last / before))
    return walls[last] * (count / last) ** exponent


BODY_BYTES = 256
REQUEST = b'{"model":"m","prompt":[128000,9906,11,1917],"max_tokens":16,"logprobs":1}'
HEADERS = {"Content-Type": "application/json"}


async def _burst(name: str, url: str, in_flight: int) -> dict[str, Any]:
    from impl.harness.router.bodies import filler_body

    forwarder = registry.create(FAMILY, name, max_connections=in_flight)
    expected = filler_body(BODY_BYTES)
    try:
        await forwarder.post(url.replace("/v1/completions", "/healthz"), b"", {})  # lazy set-up
        wall, cpu = time.perf_counter(), time.process_time()
        post = forwarder.post
        tasks = [asyncio.ensure_future(post(url, REQUEST, HEADERS)) for _ in range(in_flight)]
        try:
            replies: list[Any] = await asyncio.gather(*tasks)
        except Exception as exc:  # one failure means the barrier can never fill: stop the rest
            for task in tasks:
                task.cancel()
            replies = [exc, *await asyncio.gather(*tasks, return_exceptions=True)]
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        await forwarder.aclose()
    bad = [r for r in replies if getattr(r, "body", None) != expected or r.status != 200]
    return {
        "implementation": name,
        "in_flight": in_flight,
        "cpu_seconds": cpu,
        "wall_seconds": wall,
        "failed": len(bad),
        "first_failure": repr(bad[0])[:300] if bad else None,
    }


def _one_burst(name: str, url: str, in_flight: int) -> dict[str, Any]:
    """The measuring process's work: one burst on a fresh event loop."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_burst(name, url, in_flight))
    return uvloop.run(_burst(name, url, in_flight))


def child(name: str, url: str, in_flight: int) -> None:
    """One burst in this process, one JSON line on stdout (by hand: `python -m ... child`)."""
    print(json.dumps(_one_burst(name, url, in_flight)), flush=True)


def _forked_child(name: str, url: str, in_flight: int, conn: Any) -> None:
    try:
        conn.send(("ok", _one_burst(name, url, in_flight)))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}"))
    finally:
        conn.close()


def _context() -> Any:
    """Forkserver context whose server preloads this module only (set before it starts)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def _stats(router_url: str, *, reset: bool = False) -> dict[str, Any]:
    query = "?reset=1" if reset else ""
    with urllib.request.urlopen(f"{router_url}/stats{query}", timeout=30) as response:
        return json.loads(response.read())


def measure(name: str, router_url: str, in_flight: int, timeout: float = 3600.0) -> dict[str, Any]:
    """One burst of `in_flight` requests by `name` in a fresh process, against a barrier router."""
    _stats(router_url, reset=True)
    url = router_url + "/v1/completions"
    context = _context()
    receive, send = context.Pipe(duplex=False)
    process = context.Process(
        target=_forked_child, args=(name, url, in_flight, send), name=f"pool-{name}-{in_flight}"
    )
    process.start()
    send.close()
    try:
        if not receive.poll(timeout):
            raise RuntimeError(f"{name} at {in_flight}: no result in {timeout:.0f} s")
        status, result = receive.recv()
    except EOFError:
        status, result = "error", "the child exited without a result"
    finally:
        receive.close()
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join()
    if status != "ok":
        raise RuntimeError(f"{name} at {in_flight}: exit {process.exitcode}\n{result}")
    result["router_peak_in_flight"] = _stats(router_url)["peak_in_flight"]
    result["cpu_ms_per_request"] = result["cpu_seconds"] * 1e3 / in_flight
    result["ok"] = result["failed"] == 0 and result["router_peak_in_flight"] == in_flight
    return result


def start_barrier_router(in_flight: int) -> Any:
    """A `hotpath router` in barrier mode with `in_flight` (stop it with `.stop()`)."""
    from impl.harness import procs

    return procs.start_router(
        ["--mode", "barrier", "--barrier", str(in_flight), "--body-bytes", str(BODY_BYTES)]
    )


def measure_all(
    names: list[str], counts: tuple[int, ...], budget_seconds: float | None = None
) -> list[dict[str, Any]]:
    """Every (implementation, count), smallest count first, within the time budget."""
    limit = budget() if budget_seconds is None else budget_seconds
    results: list[dict[str, Any]] = []
    over_budget: dict[str, str] = {}
    walls: dict[str, dict[int, float]] = {name: {} for name in names}
    for count in counts:
        router = start_barrier_router(count)
        try:
            for name in names:
                if name in over_budget:
                    results.append(
                        {"implementation": name, "in_flight": count, "skipped": over_budget[name]}
                    )
                    continue
                print(f"  pool: {name} at {count} in flight", file=sys.stderr, flush=True)
                result = measure(name, router.url, count)
                results.append(result)
                print(f"  pool: {json.dumps(result)}", file=sys.stderr, flush=True)
                if not result["ok"]:
                    over_budget[name] = f"{name}: larger counts not run: {count} failed"
                else:
                    walls[name][count] = result["wall_seconds"]
                    larger = [c for c in counts if c > count]
                    predicted = predict(walls[name], larger[0]) if larger else 0.0
                    if predicted > limit:
                        over_budget[name] = (
                            f"{name}: larger counts not run: {result['wall_seconds']:.1f} s wall "
                            f"at {count} in flight predicts {predicted:.0f} s at {larger[0]}, over "
                            f"the {limit:.0f} s budget (HOTPATH_POOL_BUDGET; `--full`: 200 s)"
                        )
        finally:
            router.stop()
    return results


#: Growth is taken from this count up when possible (smaller bursts amortise fixed costs less).
GROWTH_FROM = 256


def growth(costs: dict[int, float]) -> float | None:
    """Cost at the largest measured count over cost at the smallest."""
    if len(costs) < 2:
        return None
    return costs[max(costs)] / costs[min(costs)]


def run(quick: bool, full: bool = False) -> Section:
    counts = QUICK_COUNTS if quick else FULL_COUNTS if full else COUNTS
    names = list(registry.available(FAMILY))
    results = measure_all(names, counts, budget(full))
    reference = registry.reference(FAMILY)
    ref_costs = {
        r["in_flight"]: r["cpu_ms_per_request"]
        for r in results
        if r["implementation"] == reference and r.get("ok")
    }
    at = max(ref_costs, default=None)  # the ratio is taken where the reference ran last
    table_rows = []
    for name in registry.names(FAMILY):
        reason = registry.unavailable_reason(FAMILY, name)
        mine = [r for r in results if r["implementation"] == name]
        costs = {r["in_flight"]: r["cpu_ms_per_request"] for r in mine if "cpu_ms_per_request" in r}
        cells = []
        for count in counts:
            row = next((r for r in mine if r["in_flight"] == count), None)
            if row is None or "cpu_ms_per_request" not in row:
                cells.append("-")
            else:
                cells.append(f"{row['cpu_ms_per_request']:.3f}" + ("" if row["ok"] else " !"))
        # from 256 when two counts >= 256 ran: below that a burst's fixed costs dominate
        steady = {count: cost for count, cost in costs.items() if count >= GROWTH_FROM}
        span_costs = steady if len(steady) >= 2 else costs
        factor = growth(span_costs)
        span = f" ({min(span_costs)}→{max(span_costs)})" if factor else ""
        vs_ref = "-"
        if at is not None and costs.get(at):
            vs_ref = f"{ref_costs[at] / costs[at]:.1f}x"
        parity = "✓" if mine and all(r.get("ok", True) for r in mine) else "✗" if mine else "-"
        table_rows.append(
            [
                name,
                *cells,
                f"×{factor:.1f}{span}" if factor else ("n/a" if reason else "-"),
                vs_ref,
                parity,
            ]
        )
    ref_header = f"vs {reference} at {at}" if at is not None else "vs ref"
    headers = ["implementation", *(f"{c} in flight" for c in counts), "growth", ref_header]
    headers.append("parity")
    measurements = []
    for count in counts:
        cost = {
            r["implementation"]: r["cpu_ms_per_request"]
            for r in results
            if r["in_flight"] == count and r.get("ok")
        }
        if cost:
            measurements.append({"input": f"in-flight-{count}", "size_bytes": None, "cost": cost})
    rows = [dict(r, parity=r.get("ok", True)) for r in results]
    skipped = [
        f"{name}: {registry.unavailable_reason(FAMILY, name)}"
        for name in registry.names(FAMILY)
        if name not in names
    ]
    notes = [
        "ms of client-process CPU per request (time.process_time over one burst, all threads), "
        "upstream in barrier mode so exactly N requests are in flight; the burst opens its N "
        "connections. `!` = some replies were wrong or fewer than N were in flight; "
        "`-` = not run (time budget). 'growth' = CPU per request at the largest count over the "
        "smallest, from 256 up when two such counts ran (a 32/64-request burst spreads its fixed "
        "costs over fewer requests, so it can look dearer per request). "
        "'vs' = the reference's CPU per request over this one's, "
        "at the largest count the reference ran; parity ✓ = every reply of every burst was the "
        "router's body, with exactly N in flight.",
        *dict.fromkeys(r["skipped"] for r in results if "skipped" in r),
        *skipped,
    ]
    return Section(
        family=FAMILY,
        title="pool: ms of client CPU per forwarded request, by requests in flight",
        table=render_table(headers, table_rows),
        rows=rows,
        measurements=measurements,
        notes="\n".join(notes),
    )


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        section = run(quick="--quick" in sys.argv)
        print(section.table)
        print(section.notes)
