"""Where each result's time went, from the server's `/metrics` scraped during a load run.

The server's `hotpath_step_duration_seconds{step,implementation}` histograms hold, per step
(upstream_wait, decode, encode, store, serve), how many times it ran and the seconds it took.
`parse` reads a scrape with prometheus-client's own parser; `split` turns the difference
between the scrape at the start of the measured window and the one at its end into rows: per
step, the implementation, how many times it ran, its total seconds and its mean per run. Pure
functions (the scraping is `impl.harness.watch.ServerWatch`'s), so tests can feed them text.
"""

from __future__ import annotations

from typing import Any

STEP_METRIC = "hotpath_step_duration_seconds"
#: the order a result goes through them
STEPS = ("upstream_wait", "decode", "encode", "store", "serve")

Totals = dict[tuple[str, str], tuple[float, float]]  # (step, implementation) -> (count, seconds)


def parse(text: str) -> Totals:
    """(step, implementation) -> (count, seconds) from one /metrics exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    counts: dict[tuple[str, str], float] = {}
    sums: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != STEP_METRIC:
            continue
        for sample in family.samples:
            key = (sample.labels.get("step", ""), sample.labels.get("implementation", ""))
            if sample.name == STEP_METRIC + "_count":
                counts[key] = sample.value
            elif sample.name == STEP_METRIC + "_sum":
                sums[key] = sample.value
    return {key: (counts[key], sums.get(key, 0.0)) for key in counts}


def split(before: Totals | None, after: Totals | None) -> list[dict[str, Any]]:
    """Per step and implementation, what ran between two scrapes (steps that never ran are left
    out): count, seconds, mean_ms per run; ordered as a result goes through them."""
    if after is None:
        return []
    before = before or {}
    rows = []
    for (step, implementation), (count, seconds) in after.items():
        count0, seconds0 = before.get((step, implementation), (0.0, 0.0))
        ran = count - count0
        if ran <= 0:
            continue
        spent = seconds - seconds0
        rows.append(
            {
                "step": step,
                "implementation": implementation,
                "count": int(ran),
                "seconds": round(spent, 6),
                "mean_ms": round(spent / ran * 1e3, 4),
            }
        )
    order = {step: i for i, step in enumerate(STEPS)}
    rows.sort(key=lambda r: (order.get(r["step"], len(order)), r["implementation"]))
    return rows


def per_result_ms(rows: list[dict[str, Any]]) -> dict[str, float]:
    """step -> mean milliseconds per run of that step, summed over its implementations (serve:
    protobuf and JSON answers together), in result order."""
    counts: dict[str, float] = {}
    seconds: dict[str, float] = {}
    for row in rows:
        counts[row["step"]] = counts.get(row["step"], 0) + row["count"]
        seconds[row["step"]] = seconds.get(row["step"], 0.0) + row["seconds"]
    return {step: seconds[step] / counts[step] * 1e3 for step in counts}


def table(runs: list[tuple[str, list[dict[str, Any]]]]) -> str:
    """Where each result's time went, one column per run (label, rows): per step its mean per
    run and implementation(s); with two runs, how many times faster the second is."""
    from impl.measure import render_table

    if not any(rows for _, rows in runs):
        return "where each result's time went: - (no /metrics: --no-metrics, or not scraped)"
    means = [per_result_ms(rows) for _, rows in runs]
    names = [_implementations(rows) for _, rows in runs]
    body = []
    for step in STEPS:
        if not any(step in m for m in means):
            continue
        row = [step]
        for mean, name in zip(means, names, strict=True):
            row.append(f"{_ms(mean[step])} ({name[step]})" if step in mean else "-")
        if len(runs) == 2:
            a, b = means[0].get(step), means[1].get(step)
            row.append(_ratio(a / b) if a and b else "")
        body.append(row)
    header = ["step (mean per run)", *(label for label, _ in runs)]
    if len(runs) == 2:
        header.append("faster by")
    return "where each result's time went (server /metrics):\n" + render_table(header, body)


def _implementations(rows: list[dict[str, Any]]) -> dict[str, str]:
    out: dict[str, list[str]] = {}
    for row in rows:
        out.setdefault(row["step"], []).append(row["implementation"])
    return {step: "/".join(names) for step, names in out.items()}


def _ratio(value: float) -> str:
    return f"{value:,.0f}x" if value >= 100 else f"{value:.1f}x"


def _ms(value: float) -> str:
    return f"{value / 1e3:.2f} s" if value >= 1000 else f"{value:.3g} ms"
