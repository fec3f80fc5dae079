"""Pure functions over the numbers a load run collected: percentiles, tables, the JSON report.

A *run* is the dict `impl.harness.load` assembles: `label`, `scenario`, `wall_seconds`,
`requested`, `completed`, `failed` {class: count}, `retries` {kind: count}, `latencies` [seconds
per completed sample], `result_bytes`, `tokens`, `server` {peak_rss_bytes, store_peak_rss_bytes
(an embedded store process, apart), cores (the server's CPU affinity), peak_fds, cpu_seconds},
`healthz_latencies` [seconds], `healthz_timeline` [(offset s, latency s, connect s, the server's
recent event-loop lag and GC pause, ms)], `healthz` (the server's last /healthz JSON), `steps`
[per step and implementation over the window, from /metrics: count, seconds, mean_ms], `router`
(the router's /stats JSON), `examples` {class: first error message}. Nothing here does I/O, so
the tests can feed it numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from impl.harness import steps
from impl.measure import render_table


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of one run (what the table shows and the JSON report keeps)."""
    wall = run.get("wall_seconds") or 0.0
    completed = run.get("completed", 0)
    latencies = run.get("latencies", [])
    healthz = run.get("healthz_latencies", [])
    server = run.get("server") or {}
    router = run.get("router") or {}
    requests = run.get("requests") or {}
    served = run.get("server_polls") or {}
    cpu = server.get("cpu_seconds")

    def per_result(count: float | None) -> float | None:
        return count / completed if completed and count is not None else None

    client_polls = requests.get("/api/v1/retrieve_future", 0)
    client_polls += requests.get("/api/v1/retrieve_futures", 0)
    server_polls = sum(v for k, v in served.items() if k.startswith("retrieve_future_"))
    server_polls += served.get("retrieve_futures", 0)
    return {
        "label": run.get("label", ""),
        "requested": run.get("requested", 0),
        "completed": completed,
        "failed": sum((run.get("failed") or {}).values()),
        "failed_by_class": dict(sorted((run.get("failed") or {}).items())),
        "retries": dict(sorted((run.get("retries") or {}).items())),
        "wall_seconds": wall,
        "results_per_second": completed / wall if wall > 0 else None,
        "mb_per_second": run.get("result_bytes", 0) / 1e6 / wall if wall > 0 else None,
        "latency_p50": percentile(latencies, 50),
        "latency_p90": percentile(latencies, 90),
        "latency_p99": percentile(latencies, 99),
        "server_peak_rss_bytes": server.get("peak_rss_bytes"),
        "store_peak_rss_bytes": server.get("store_peak_rss_bytes"),
        "retention_prediction_bytes": retention_prediction(run),
        "results_per_second_per_core": per_core(completed, wall, server.get("cores")),
        "results_per_server_cpu_second": completed / cpu if completed and cpu else None,
        "server_peak_fds": server.get("peak_fds"),
        "server_cpu_seconds": server.get("cpu_seconds"),
        "router_cpu_seconds": server.get("router_cpu_seconds"),
        "client_cpu_seconds": run.get("client_cpu_seconds"),
        "healthz_p50": percentile(healthz, 50),
        "healthz_p99": percentile(healthz, 99),
        "healthz_max": max(healthz) if healthz else None,
        "loop_lag_max": loop_lag_max(run.get("healthz_timeline", [])),
        "healthz_failures": server.get("healthz_failures"),
        "healthz_samples": len(healthz),
        "router_peak_in_flight": router.get("peak_in_flight"),
        "poll": run.get("poll") or None,
        "requests": dict(sorted(requests.items())),
        "server_polls": dict(sorted(served.items())),
        "http_requests_per_result": per_result(sum(requests.values()) if requests else None),
        "poll_requests_per_result": per_result(client_polls if requests else None),
        "server_polls_per_result": per_result(server_polls if served else None),
        "server_cpu_ms_per_result": per_result(cpu * 1e3 if cpu is not None else None),
        "router_injected": router.get("injected"),
        "picks": picks(run.get("healthz")),
        "steps": run.get("steps") or [],
        "decode_design": decode_design(run.get("healthz")),
    }


def retrieved_ttl(scenario: dict[str, Any] | None) -> float:
    """Seconds the server keeps a delivered result: `--retrieved-ttl` among the scenario's
    server flags, else the server's default."""
    args = list((scenario or {}).get("server_args") or ())
    for i, arg in enumerate(args):
        if arg == "--retrieved-ttl" and i + 1 < len(args):
            return float(args[i + 1])
        if arg.startswith("--retrieved-ttl="):
            return float(arg.split("=", 1)[1])
    from impl.server.settings import Settings

    return Settings.retrieved_ttl


def retention_prediction(run: dict[str, Any]) -> float | None:
    """Bytes a server holds for delivered results in steady state: delivered bytes/s x the
    retrieved TTL (docs/scenarios.md: completion rate x result size x retrieved TTL)."""
    wall = run.get("wall_seconds") or 0.0
    if wall <= 0 or not run.get("result_bytes"):
        return None
    return run["result_bytes"] / wall * retrieved_ttl(run.get("scenario"))


def per_core(completed: int, wall: float, cores: int | None) -> float | None:
    """results/s divided by the cores the server may run on (its CPU affinity)."""
    return completed / wall / cores if completed and wall > 0 and cores else None


def loop_lag_max(timeline: Sequence[Sequence[Any]]) -> float | None:
    """Seconds: the worst event-loop lag the server reported in any /healthz answer."""
    lags = [row[3] for row in timeline if len(row) > 3 and isinstance(row[3], (int, float))]
    return max(lags) / 1e3 if lags else None


def decode_design(healthz: dict[str, Any] | None) -> str | None:
    """Where the server decodes bodies (inline, threads, processes) from a /healthz body."""
    offloop = healthz.get("offloop") if isinstance(healthz, dict) else None
    if not isinstance(offloop, dict):
        return None
    count = offloop.get("count", offloop.get("workers"))  # "workers": reports before 26
    return str(offloop.get("design")) + (f" x{count}" if count else "")


def picks(healthz: dict[str, Any] | None) -> dict[str, str]:
    """family -> implementation name from a /healthz body (accepts a few plausible shapes)."""
    if not isinstance(healthz, dict):
        return {}
    raw = healthz.get("picks") or healthz.get("implementations") or {}
    out: dict[str, str] = {}
    if isinstance(raw, dict):
        for family, value in raw.items():
            out[family] = value.get("name", str(value)) if isinstance(value, dict) else str(value)
    elif isinstance(raw, list):
        for item in raw:
            if isinstance(item, dict) and "family" in item:
                out[item["family"]] = str(item.get("name"))
    return out


def _fmt_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 1:
        return f"{value:.2f} s"
    return f"{value * 1e3:.1f} ms"


def _fmt_num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _fmt_mb(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e6:,.0f} MB"


#: (row label, summary key, formatter, True when higher is better; None: no ratio)
_ROWS: tuple[tuple[str, str, Any, bool | None], ...] = (
    ("completed", "completed", lambda v: f"{v:,}", True),
    ("failed", "failed", lambda v: f"{v:,}", False),
    ("wall time", "wall_seconds", _fmt_seconds, False),
    ("results/s", "results_per_second", _fmt_num, True),
    ("MB/s of results", "mb_per_second", lambda v: _fmt_num(v, 2), True),
    ("latency p50", "latency_p50", _fmt_seconds, False),
    ("latency p90", "latency_p90", _fmt_seconds, False),
    ("latency p99", "latency_p99", _fmt_seconds, False),
    ("server peak RSS", "server_peak_rss_bytes", _fmt_mb, False),
    ("store peak RSS", "store_peak_rss_bytes", _fmt_mb, False),
    ("retention prediction", "retention_prediction_bytes", _fmt_mb, None),
    ("results/s per core", "results_per_second_per_core", lambda v: _fmt_num(v, 2), True),
    ("results per server CPU s", "results_per_server_cpu_second", _fmt_num, True),
    ("server peak open fds", "server_peak_fds", lambda v: "-" if v is None else f"{v:,}", False),
    ("server CPU seconds", "server_cpu_seconds", _fmt_num, False),
    ("server CPU ms/result", "server_cpu_ms_per_result", lambda v: _fmt_num(v, 3), False),
    ("HTTP requests/result", "http_requests_per_result", lambda v: _fmt_num(v, 3), False),
    ("poll requests/result", "poll_requests_per_result", lambda v: _fmt_num(v, 3), False),
    ("polls served/result", "server_polls_per_result", lambda v: _fmt_num(v, 3), False),
    ("router CPU seconds", "router_cpu_seconds", _fmt_num, False),
    ("client CPU seconds", "client_cpu_seconds", _fmt_num, False),
    ("/healthz p50", "healthz_p50", _fmt_seconds, False),
    ("/healthz p99", "healthz_p99", _fmt_seconds, False),
    ("/healthz max", "healthz_max", _fmt_seconds, False),
    ("server loop lag max", "loop_lag_max", _fmt_seconds, False),
    ("/healthz failed", "healthz_failures", lambda v: "-" if v is None else str(v), None),
    ("router peak in flight", "router_peak_in_flight", lambda v: "-" if v is None else v, None),
)


def _extras(summary: dict[str, Any]) -> list[str]:
    lines = []
    if summary["failed_by_class"]:
        lines.append("failed by class: " + _kv(summary["failed_by_class"]))
    if summary["retries"]:
        lines.append("client retries: " + _kv(summary["retries"]))
    if summary["router_injected"]:
        lines.append("router injected: " + _kv(summary["router_injected"]))
    if summary["requests"]:
        lines.append(f"client HTTP requests ({summary['poll']} poll): " + _kv(summary["requests"]))
    if summary["server_polls"]:
        lines.append("polls served: " + _kv(summary["server_polls"]))
    if summary["picks"]:
        lines.append("server picks: " + _kv(summary["picks"]))
    if summary.get("decode_design"):
        lines.append("decode design: " + summary["decode_design"])
    return lines


def _kv(mapping: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in mapping.items())


def render_run(summary: dict[str, Any]) -> str:
    """The table of one run, then its failures, retries, injected faults and picks."""
    rows = [
        (label, fmt(summary[key]) if summary[key] is not None else "-")
        for label, key, fmt, _ in _ROWS
    ]
    table = render_table([summary["label"] or "run", "value"], rows)
    split = steps.table([(summary["label"] or "run", summary.get("steps") or [])])
    return "\n".join([table, *_extras(summary), split])


def ratio(before: float | None, after: float | None, higher_is_better: bool) -> float | None:
    """How many times better `after` is than `before` (>1 = better); None when undefined."""
    if before is None or after is None or before <= 0 or after <= 0:
        return None
    return after / before if higher_is_better else before / after


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float | None]:
    """Improvement ratio per figure (>1 means `after` is better) from two summaries."""
    return {
        key: ratio(before[key], after[key], better)
        for _, key, _, better in _ROWS
        if key not in ("completed", "failed") and better is not None
    }


def render_compare(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Before/after side by side with the improvement ratio per figure."""
    ratios = compare(before, after)
    rows = []
    for label, key, fmt, _ in _ROWS:
        b = fmt(before[key]) if before[key] is not None else "-"
        a = fmt(after[key]) if after[key] is not None else "-"
        r = ratios.get(key)
        rows.append((label, b, a, "" if r is None else f"{r:.1f}x"))
    table = render_table(["", before["label"], after["label"], "better by"], rows)
    lines = [table]
    for summary in (before, after):
        extras = _extras(summary)
        if extras:
            lines.append(f"[{summary['label']}] " + "; ".join(extras))
    lines.append(steps.table([(s["label"], s.get("steps") or []) for s in (before, after)]))
    return "\n".join(lines)


def render_many(summaries: list[dict[str, Any]]) -> str:
    """Several runs side by side (the first is the reference), each with its ratio to it."""
    first = summaries[0]
    header = ["", first["label"]]
    for summary in summaries[1:]:
        header += [summary["label"], "vs " + first["label"]]
    rows = []
    for label, key, fmt, better in _ROWS:
        row = [label, fmt(first[key]) if first[key] is not None else "-"]
        for summary in summaries[1:]:
            row.append(fmt(summary[key]) if summary[key] is not None else "-")
            r = ratio(first[key], summary[key], better) if better is not None else None
            row.append("" if r is None or key in ("completed", "failed") else f"{r:.2f}x")
        rows.append(tuple(row))
    return render_table(header, rows)


def verdict(summary: dict[str, Any]) -> list[str]:
    """What went wrong in a run (empty: every requested sample completed and checked out)."""
    problems = []
    if summary["failed"]:
        problems.append(f"{summary['failed']} failed: {_kv(summary['failed_by_class'])}")
    missing = summary["requested"] - summary["completed"] - summary["failed"]
    if missing:
        problems.append(f"{missing} neither completed nor failed")
    return problems


def checked_summary(run: dict[str, Any], what: str) -> dict[str, Any]:
    """`summarize(run)`, or a RuntimeError starting with `what` listing the `verdict`'s problems
    (for callers whose figures mean nothing once a sample was lost or failed)."""
    summary = summarize(run)
    problems = verdict(summary)
    if problems:
        raise RuntimeError(f"{what}: " + "; ".join(problems))
    return summary


def report_json(
    runs: list[dict[str, Any]], *, environment: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON report: each run's summary and raw counts (not every latency), ratios if two."""
    out: dict[str, Any] = {"environment": environment or {}, "runs": []}
    for run in runs:
        out["runs"].append(
            {
                "summary": summarize(run),
                "scenario": run.get("scenario"),
                "examples": run.get("examples", {}),
                "warmup": run.get("warmup"),
                # the warm-up's results still stored, waited out before the window (settle)
                "settle": run.get("settle"),
                "healthz": run.get("healthz"),
                "fault": run.get("fault"),
                # per probe: [s into the run, latency s, connect s, server loop lag ms, GC pause ms]
                "healthz_timeline": run.get("healthz_timeline", []),
                # per /metrics scrape: [s into the run, {step: [count, seconds] since start}]
                "steps_timeline": run.get("steps_timeline", []),
                "router": run.get("router"),
                "commands": run.get("commands"),
            }
        )
    if len(runs) == 2:
        out["ratios"] = compare(out["runs"][0]["summary"], out["runs"][1]["summary"])
    return out
