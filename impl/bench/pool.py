"""Pool section of `hotpath bench`: client CPU per forwarded request as requests in flight grow.

For each implementation and in-flight count N, the fake router runs in barrier mode with N (it
holds every answer until N requests have arrived, so exactly N are in flight at once), and a
fresh child process (`python -m impl.bench.pool child NAME URL N`, so no state leaks between
implementations, as in msgspec's runner) sends one burst of N requests through a forwarder with
`max_connections=N` and prints one JSON line: its CPU seconds (time.process_time: every thread
of the process, so Rust runtimes count too) and wall seconds for the burst. The burst starts on
a pool holding one connection (one /healthz request first triggers lazy set-up: sessions,
runtimes, imports), so it includes opening the N connections, as every implementation must.
An instant upstream would hide the effect: requests finish as fast as they are sent.

A count whose burst would take too long is not run: once an implementation's last burst, scaled
to the next count, predicts more than `BUDGET_SECONDS` of wall time (or a burst failed), its
larger counts are reported as not run (`-`), never guessed. A failed request ends the burst at
once (the barrier could never fill).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import time
import urllib.request
from typing import Any

from impl import registry
from impl.bench._common import Section, render_table

FAMILY = "pool"
COUNTS = (256, 1024, 4096, 8192)
QUICK_COUNTS = (64, 256)
#: Wall-time budget of one burst. A burst predicted to exceed it (the last burst's wall time
#: scaled by the count) is not run: httpx at 4096 in flight takes ~150 s here. Raise it with
#: HOTPATH_POOL_BUDGET=600 for the full table.
BUDGET_SECONDS = float(os.environ.get("HOTPATH_POOL_BUDGET", "60"))
BODY_BYTES = 256
REQUEST = b'{"model":"m","prompt":[128000,9906,11,1917],"max_tokens":16,"logprobs":1}'
HEADERS = {"Content-Type": "application/json"}


async def _burst(name: str, url: str, in_flight: int) -> dict[str, Any]:
    from impl.harness.router import filler_body

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


def child(name: str, url: str, in_flight: int) -> None:
    """The measuring process: one burst, one JSON line on stdout."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(_burst(name, url, in_flight))
    else:
        result = uvloop.run(_burst(name, url, in_flight))
    print(json.dumps(result), flush=True)


def _stats(router_url: str, *, reset: bool = False) -> dict[str, Any]:
    query = "?reset=1" if reset else ""
    with urllib.request.urlopen(f"{router_url}/stats{query}", timeout=30) as response:
        return json.loads(response.read())


def measure(name: str, router_url: str, in_flight: int, timeout: float = 3600.0) -> dict[str, Any]:
    """One burst of `in_flight` requests by `name` in a fresh process, against a barrier router."""
    _stats(router_url, reset=True)
    url = router_url + "/v1/completions"
    command = [sys.executable, "-m", "impl.bench.pool", "child", name, url, str(in_flight)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{name} at {in_flight}: exit {done.returncode}\n{done.stderr[-2000:]}")
    result = json.loads(lines[-1])
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


def measure_all(names: list[str], counts: tuple[int, ...]) -> list[dict[str, Any]]:
    """Every (implementation, count), smallest count first, within the time budget."""
    results: list[dict[str, Any]] = []
    over_budget: dict[str, str] = {}
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
                    larger = [c for c in counts if c > count]
                    predicted = result["wall_seconds"] * (larger[0] / count) if larger else 0.0
                    if predicted > BUDGET_SECONDS:
                        over_budget[name] = (
                            f"{name}: larger counts not run: {result['wall_seconds']:.0f} s wall "
                            f"at {count} in flight predicts {predicted:.0f} s at {larger[0]}, over "
                            f"the {BUDGET_SECONDS:.0f} s budget (HOTPATH_POOL_BUDGET)"
                        )
        finally:
            router.stop()
    return results


def growth(costs: dict[int, float]) -> float | None:
    """Cost at the largest measured count over cost at the smallest."""
    if len(costs) < 2:
        return None
    return costs[max(costs)] / costs[min(costs)]


def run(quick: bool) -> Section:
    counts = QUICK_COUNTS if quick else COUNTS
    names = list(registry.available(FAMILY))
    results = measure_all(names, counts)
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
        factor = growth(costs)
        span = f" ({min(costs)}→{max(costs)})" if factor else ""
        table_rows.append(
            [name, *cells, f"×{factor:.1f}{span}" if factor else ("n/a" if reason else "-")]
        )
    headers = ["implementation", *(f"{c} in flight" for c in counts), "growth"]
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
        "`-` = not run (time budget).",
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
