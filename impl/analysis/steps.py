"""The per-step figure: where each result's time went, baseline vs picked, from load reports.

`hotpath loadtest --compare baseline --report PATH` records, for each run, the server's
per-step split over the measured window (scraped from its `/metrics`: upstream_wait, decode,
encode, store, serve, with the implementation that ran each step). `load_step_reports()` reads
every such report in a directory (`HOTPATH_STEP_REPORTS`, default notebooks/data/steps);
`plot_step_split()` draws one panel per report: per step, the mean time per run for the
baseline and the picked server, on a log scale (the steps span five orders of magnitude),
each bar labelled with its implementation.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from impl.analysis.figures import NOTEBOOKS, _figure, _missing
from impl.harness import steps


def reports_path() -> Path:
    return Path(os.environ.get("HOTPATH_STEP_REPORTS") or NOTEBOOKS / "data" / "steps")


def load_step_reports(directory: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """name (file stem) -> load report, for every report whose runs carry a per-step split."""
    out = {}
    for path in sorted(Path(directory or reports_path()).glob("*.json")):
        data = json.loads(path.read_text())
        if any(run["summary"].get("steps") for run in data.get("runs", [])):
            out[path.stem] = data
    return out


def step_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per run and step: label, step, mean ms per run, implementation(s), runs."""
    rows = []
    for run in report["runs"]:
        summary = run["summary"]
        split = summary.get("steps") or []
        means = steps.per_result_ms(split)
        names: dict[str, list[str]] = {}
        counts: dict[str, int] = {}
        for row in split:
            names.setdefault(row["step"], []).append(row["implementation"])
            counts[row["step"]] = counts.get(row["step"], 0) + row["count"]
        for step in steps.STEPS:
            if step in means:
                rows.append(
                    {
                        "run": summary["label"],
                        "step": step,
                        "mean_ms": round(means[step], 4),
                        "implementation": "/".join(names[step]),
                        "count": counts[step],
                    }
                )
    return rows


def _title(name: str, report: dict[str, Any]) -> str:
    scenario = report["runs"][0].get("scenario") or {}
    return (
        f"{name}: {scenario.get('num_requests')} samples × {scenario.get('max_tokens')} tokens "
        f"({scenario.get('router_body')} bodies)"
    )


def plot_step_split(reports: dict[str, Any]) -> Figure:
    """Per report, grouped bars: each step's mean time per run, baseline vs picked (log y)."""
    if not reports:
        return _missing("where each result's time went", f"no load reports in {reports_path()}")
    fig, axes = _figure(ncols=len(reports), width=6.4, height=4.8)
    for ax, (name, report) in zip(axes, reports.items(), strict=True):
        rows = step_rows(report)
        labels = [run["summary"]["label"] for run in report["runs"]]
        present = [s for s in steps.STEPS if any(r["step"] == s for r in rows)]
        width = 0.8 / max(1, len(labels))
        for i, label in enumerate(labels):
            mine = {r["step"]: r for r in rows if r["run"] == label}
            xs = [j + (i - (len(labels) - 1) / 2) * width for j in range(len(present))]
            heights = [mine[s]["mean_ms"] if s in mine else 0 for s in present]
            bars = ax.bar(xs, heights, width, label=label)
            for bar, step in zip(bars, present, strict=True):
                if step in mine:
                    ax.annotate(
                        mine[step]["implementation"],
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", rotation=90, fontsize=7,
                        xytext=(0, 2), textcoords="offset points",
                    )  # fmt: skip
        ax.set_yscale("log")
        ax.set_xticks(range(len(present)), present)
        ax.set_ylabel("mean ms per run of the step (log)")
        ax.set_title(_title(name, report), fontsize=9)
        ax.legend(fontsize=8, loc="upper right")
        low, high = ax.get_ylim()
        ax.set_ylim(low, high * 50)  # room for the labels above the tallest bar
    env = next(iter(reports.values())).get("environment", {})
    fig.suptitle("Where each result's time went (server /metrics during hotpath loadtest)")
    fig.supxlabel(
        f"hotpath loadtest --compare baseline @ {env.get('git_sha')} · Python "
        f"{env.get('python')} · {env.get('cpu')} ×{env.get('cpus')} · "
        f"{str(env.get('time', ''))[:16]}",
        x=0.995, ha="right", fontsize=7, alpha=0.6,
    )  # fmt: skip
    return fig
