"""Loaders and figures for the notebooks: `hotpath bench` JSON, asv results, py-spy profiles.

The notebooks under notebooks/ stay thin: they call `load_results()`, one `plot_*` function per
figure and `save()`. Figures are built on `matplotlib.figure.Figure` (no pyplot state, no GUI
backend: the Agg canvas renders them), saved as PNG under `figures_dir()` and shown inline.

Paths: `HOTPATH_RESULTS` (default notebooks/data/, the committed sample) and
`HOTPATH_FIGURES` (default notebooks/figures) override where data is read and figures written.
Every figure's footer says which run produced it (git SHA, CPU, date), so a figure can always
be traced to what produced it.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"


def results_path() -> Path:
    """`HOTPATH_RESULTS`, else notebooks/data (the committed sample: every *.json in it)."""
    return Path(os.environ.get("HOTPATH_RESULTS") or NOTEBOOKS / "data")


def figures_dir() -> Path:
    return Path(os.environ.get("HOTPATH_FIGURES") or NOTEBOOKS / "figures")


def load_results(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """`hotpath bench --json` results: one file, or every *.json of a directory, merged.

    Each section keeps the environment of the run that produced it (`section["environment"]`,
    `section["quick"]`); when several files hold the same family, the most recent run wins.
    """
    target = Path(path or results_path())
    files = sorted(target.glob("*.json")) if target.is_dir() else [target]
    runs = [json.loads(f.read_text()) for f in files]
    runs.sort(key=lambda run: run.get("environment", {}).get("time", ""))
    sections: dict[str, dict[str, Any]] = {}
    for run in runs:
        for sec in run.get("sections", []):
            sections[sec["family"]] = {
                **sec,
                "environment": run.get("environment", {}),
                "quick": run.get("quick", False),
                "full": run.get("full", False),
            }
    return {
        "files": [str(f) for f in files],
        "environment": runs[-1].get("environment", {}) if runs else {},
        "sections": list(sections.values()),
    }


def section(results: dict[str, Any], family: str) -> dict[str, Any] | None:
    """The section of `family` (the last one if several), or None."""
    found = [s for s in results.get("sections", []) if s.get("family") == family]
    return found[-1] if found else None


def rows(results: dict[str, Any], family: str, table: str | None = None) -> list[dict[str, Any]]:
    """The rows of `family`'s section, only those of `table` when given; [] if absent."""
    sec = section(results, family)
    if sec is None:
        return []
    return [r for r in sec["rows"] if table is None or r.get("table") == table]


def provenance(results: dict[str, Any], family: str | None = None) -> str:
    """One line saying what produced the numbers (of `family`'s section when given)."""
    sec = section(results, family) if family else None
    env = (sec or results).get("environment", {})
    quick = " --quick" if (sec or results).get("quick") else ""
    return (
        f"hotpath bench{quick} @ {env.get('git_sha')} · Python {env.get('python')} · "
        f"{env.get('cpu')} ×{env.get('cpus')} · {str(env.get('time', ''))[:16]}"
    )


def load_asv(results_dir: str | os.PathLike[str] = ROOT / ".asv" / "results") -> list[dict]:
    """Flat rows from asv result files: benchmark, params {name: value}, value, commit, machine.

    asv (result-file api version 2) stores per machine and commit `{"results": {benchmark:
    [result, params, ...]}, "result_columns": [...], "commit_hash": ...}`; `result` follows the
    Cartesian product of `params` (each value a Python literal as text); `benchmarks.json` at
    the top of the results tree names the params. A failed or skipped case has value None.
    """
    import ast
    import itertools

    root = Path(results_dir)
    try:
        names = {
            k: v.get("param_names", []) for k, v in _read_json(root / "benchmarks.json").items()
        }
    except (OSError, ValueError, AttributeError):
        names = {}

    def literal(text: str) -> Any:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text

    out = []
    for path in sorted(root.glob("*/*.json")):
        if path.name == "machine.json":
            continue
        data = _read_json(path)
        columns = data.get("result_columns", ["result", "params"])
        for name, entry in data.get("results", {}).items():
            record = dict(zip(columns, entry, strict=False))
            values, params = record.get("result"), record.get("params") or []
            if values is None:
                continue
            param_names = names.get(name) or [f"param{i + 1}" for i in range(len(params))]
            for combo, value in zip(itertools.product(*params), values, strict=False):
                out.append(
                    {
                        "benchmark": name,
                        "params": dict(zip(param_names, map(literal, combo), strict=False)),
                        "value": value,
                        "commit": data.get("commit_hash"),
                        "date": data.get("date"),
                        "machine": path.parent.name,
                    }
                )
    return out


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text())


# -- figures ------------------------------------------------------------------------------------


def _figure(ncols: int = 1, width: float = 6.4, height: float = 4.4) -> tuple[Figure, list]:
    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _footer(fig: Figure, results: dict[str, Any], family: str) -> None:
    fig.supxlabel(provenance(results, family), x=0.995, ha="right", fontsize=7, alpha=0.6)


def _missing(title: str, why: str) -> Figure:
    fig, (ax,) = _figure()
    ax.set_axis_off()
    ax.text(0.5, 0.5, f"{title}\n\n{why}", ha="center", va="center", wrap=True)
    return fig


def _lines(ax: Any, series: dict[str, list[tuple[float, float]]], marker: str = "o") -> None:
    for name, points in series.items():
        points = sorted(points)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=marker, label=name)


def _series(
    items: Iterable[dict[str, Any]], x: str, y: Any, key: str = "implementation"
) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in items:
        value = y(r) if callable(y) else r.get(y)
        if r.get(x) is not None and value is not None and r.get("parity") is not False:
            out[r[key]].append((r[x], value))
    return dict(out)


def plot_decode(results: dict[str, Any]) -> Figure:
    """Decode time and MB/s against generated tokens per implementation, per body kind (log-log)."""
    data = [r for r in rows(results, "decode") if r.get("tokens") and r.get("seconds")]
    if not data:
        return _missing("decode", "no decode rows in these results")
    data = [r for r in data if r.get("render", "json") == "json"]  # orjson: plot_decode_kinds
    sizes_of = defaultdict(set)
    for r in data:
        sizes_of[r.get("body", "")].add(r["tokens"])
    kinds = sorted((k for k in sizes_of if len(sizes_of[k]) > 1), key=lambda k: (k != "vllm", k))
    names = list(dict.fromkeys(r["implementation"] for r in data))
    colors = {name: f"C{i % 10}" for i, name in enumerate(names)}
    fig = Figure(figsize=(12.8, 4.2 * len(kinds)), layout="constrained")
    grid = fig.subplots(len(kinds), 2, squeeze=False)
    for (left, right), kind in zip(grid, kinds, strict=True):
        subset = [r for r in data if r.get("body", "") == kind]
        for name, points in _series(subset, "tokens", "seconds").items():
            points.sort()
            xs = [p[0] for p in points]
            left.plot(xs, [p[1] for p in points], marker="o", label=name, color=colors[name])
        mbps = _series(subset, "tokens", lambda r: r["size_bytes"] / r["seconds"] / 1e6)
        for name, points in mbps.items():
            points.sort()
            xs = [p[0] for p in points]
            right.plot(xs, [p[1] for p in points], marker="o", label=name, color=colors[name])
        sizes = sorted({(r["tokens"], r["size_bytes"]) for r in subset})
        body = f"{kind} bodies" if kind else "bodies"
        largest = f"{sizes[-1][1] / 1e6:.1f} MB at {sizes[-1][0]:,} tokens" if sizes else ""
        left.set(xscale="log", yscale="log", xlabel="generated tokens", ylabel="seconds per body")
        right.set(xscale="log", yscale="log", xlabel="generated tokens", ylabel="MB/s of JSON")
        left.set_title(f"decode time, {body} ({largest})", fontsize=10)
        right.set_title(f"decode throughput, {body}", fontsize=10)
        left.legend(fontsize=8)
    _footer(fig, results, "decode")
    return fig


def plot_decode_kinds(results: dict[str, Any]) -> Figure:
    """GB/s of every decoder on every body kind and rendering at the largest size (log scale)."""
    data = [r for r in rows(results, "decode") if r.get("tokens") and r.get("seconds")]
    largest = max((r["tokens"] for r in data), default=0)
    data = [r for r in data if r["tokens"] == largest and r.get("body") != "minimal"]
    if not data:
        return _missing("decode by body kind", "no decode rows in these results")
    bodies = list(dict.fromkeys(r["input"] for r in data))
    names = list(dict.fromkeys(r["implementation"] for r in data))
    fig, (ax,) = _figure(width=12.8, height=5.2)
    for i, name in enumerate(names):
        at = {r["input"]: r for r in data if r["implementation"] == name}
        xs = [j for j, b in enumerate(bodies) if b in at and at[b].get("parity") is not False]
        gbps = [at[bodies[j]]["size_bytes"] / at[bodies[j]]["seconds"] / 1e9 for j in xs]
        ax.plot(xs, gbps, marker="o", label=name, color=f"C{i % 10}")
    ax.set_xticks(range(len(bodies)), [b.removesuffix(f"-{largest}") for b in bodies])
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    ax.set(yscale="log", ylabel="GB/s of JSON (median)", xlabel=f"body at {largest:,} tokens")
    ax.set_title("decode throughput per body kind and rendering (vllm = synthetic, json)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncols=2)
    _footer(fig, results, "decode")
    return fig


def plot_encode(results: dict[str, Any]) -> Figure:
    """Encode cost (Completion -> SampleResponse bytes) and proto -> legacy JSON, per tokens."""
    enc = rows(results, "encode", "encode")
    if not enc:
        return _missing("encode", "no encode rows in these results")
    fig, (left, right) = _figure(2)
    _lines(left, _series(enc, "tokens", "seconds"))
    for r in rows(results, "encode", "decode-comparison"):
        left.scatter([r["tokens"]], [r["seconds"]], marker="x", color="k", zorder=3)
        left.annotate(
            r["implementation"],
            (r["tokens"], r["seconds"]),
            xytext=(-6, -10),
            textcoords="offset points",
            fontsize=7,
            ha="right",
        )
    _lines(right, _series(rows(results, "encode", "json"), "tokens", "seconds"))
    left.set(xscale="log", yscale="log", xlabel="tokens (one sequence)", ylabel="seconds")
    right.set(xscale="log", yscale="log", xlabel="tokens (one sequence)", ylabel="seconds")
    left.set_title("Completion -> SampleResponse bytes")
    right.set_title("stored proto -> legacy JSON")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    _footer(fig, results, "encode")
    return fig


def plot_pool(results: dict[str, Any]) -> Figure:
    """Forwarding CPU per request against requests in flight, per pool implementation."""
    data = [r for r in rows(results, "pool") if r.get("cpu_ms_per_request") is not None]
    if not data:
        return _missing("pool", "no measured pool rows in these results")
    fig, (ax,) = _figure()
    failed = [r for r in data if r.get("ok") is False]
    _lines(
        ax,
        _series([r for r in data if r.get("ok") is not False], "in_flight", "cpu_ms_per_request"),
    )
    if failed:
        ax.scatter(
            [r["in_flight"] for r in failed],
            [r["cpu_ms_per_request"] for r in failed],
            marker="x",
            color="k",
            label="failed requests",
        )
    skipped = sorted({r["implementation"] for r in rows(results, "pool") if r.get("skipped")})
    title = "pool: client CPU per forwarded request"
    if skipped:
        title += f"\n(larger counts not run, over the time budget: {', '.join(skipped)})"
    ax.set(xscale="log", yscale="log", xlabel="requests in flight", ylabel="CPU ms per request")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.xaxis.set_minor_formatter(NullFormatter())
    _footer(fig, results, "pool")
    return fig


def plot_accesslog(results: dict[str, Any]) -> Figure:
    """Access-log cost per request: per record on the calling thread, and in a real uvicorn."""
    data = rows(results, "accesslog")
    if not data:
        return _missing("accesslog", "no accesslog rows in these results")
    names = [r["implementation"] for r in data]
    fig, (left, right) = _figure(2)
    y = range(len(names))
    left.barh([i + 0.2 for i in y], [r["info_us"] for r in data], 0.4, label="logger.info")
    left.barh([i - 0.2 for i in y], [r["handle_us"] for r in data], 0.4, label="handler.handle")
    right.barh([i + 0.2 for i in y], [r["server_total_us"] for r in data], 0.4, label="process CPU")
    right.barh([i - 0.2 for i in y], [r["server_loop_us"] for r in data], 0.4, label="loop thread")
    for ax in (left, right):
        ax.set_yticks(list(y), names)
        ax.set_xscale("log")
        ax.legend(fontsize=8)
    left.set(xlabel="µs per record (calling thread)", title="per access record")
    right.set(xlabel="µs CPU per HTTP request", title="uvicorn serving a trivial route")
    _footer(fig, results, "accesslog")
    return fig


#: (label, summary key, lower is better)
ENDTOEND_FIGURES = (
    ("results/s", "results_per_second", False),
    ("wall seconds", "wall_seconds", True),
    ("server CPU seconds", "server_cpu_seconds", True),
    ("latency p99 (s)", "latency_p99", True),
)


def baseline_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The end-to-end rows that compare the baseline server with the picked one (the off-loop
    row compares the picked server decoding inline with it, and has no baseline side)."""
    return [r for r in rows(results, "endtoend") if "baseline" in r]


def plot_endtoend(results: dict[str, Any]) -> Figure:
    """Baseline vs picked server per harness scenario: throughput, wall time, CPU, p99 (the
    off-loop row compares inline with picked instead, and is not part of this figure)."""
    data = baseline_rows(results)
    if not data:
        return _missing("end to end", "no endtoend rows in these results")
    fig, axes = _figure(len(ENDTOEND_FIGURES), width=3.6)
    labels = [f"{r['scenario']}\n{r['samples']}×{r['max_tokens']}" for r in data]
    y = range(len(data))
    for ax, (label, key, lower) in zip(axes, ENDTOEND_FIGURES, strict=True):
        before = [r["baseline"].get(key) or 0 for r in data]
        after = [r["picked"].get(key) or 0 for r in data]
        ax.barh([i + 0.2 for i in y], before, 0.4, label="baseline", color="tab:red")
        ax.barh([i - 0.2 for i in y], after, 0.4, label="picked", color="tab:green")
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            if a and b:
                better = b / a if lower else a / b
                ax.annotate(f"{better:.1f}×", (max(a, b), i), fontsize=8, va="center")
        ax.set_yticks(list(y), labels if ax is axes[0] else [""] * len(data))
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(right=max(before + after + [1e-9]) * 4)
        ax.set_title(label + (" (lower is better)" if lower else ""), fontsize=9)
    axes[0].legend(fontsize=8)
    _footer(fig, results, "endtoend")
    return fig


def endtoend_table(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per scenario: baseline, picked and the improvement ratio of each figure."""
    out = []
    for r in baseline_rows(results):
        for label, key, lower in ENDTOEND_FIGURES:
            b, a = r["baseline"].get(key), r["picked"].get(key)
            better = (b / a if lower else a / b) if a and b else None
            out.append(
                {
                    "scenario": r["scenario"],
                    "figure": label,
                    "baseline": b,
                    "picked": a,
                    "better by": better,
                }
            )
    return out


def profile_summaries(directory: str | os.PathLike[str] = ROOT / "profiles") -> dict[str, Any]:
    """`impl.profile.summarize` of every committed speedscope file, by file stem."""
    from impl.profile import summarize

    return {
        p.name.removesuffix(".speedscope.json"): summarize(p)
        for p in sorted(Path(directory).glob("*.speedscope.json"))
    }


def plot_profile_tops(summaries: dict[str, Any], top: int = 5) -> Figure:
    """Top self-time functions of each profile, as horizontal bars (share of samples)."""
    if not summaries:
        return _missing("profiles", "no speedscope files")
    nrows = (len(summaries) + 1) // 2
    fig = Figure(figsize=(15, 1.9 * nrows + 0.5), layout="constrained")
    axes = fig.subplots(nrows, 2, squeeze=False).ravel()
    for ax, (name, summary) in zip(axes, summaries.items(), strict=False):
        items = summary["self"][:top][::-1]
        ax.barh(range(len(items)), [share * 100 for _, share in items], color="tab:orange")
        ax.set_yticks(range(len(items)), [_label(key) for key, _ in items], fontsize=7)
        ax.set_xlim(0, 100)
        ax.set_title(f"{name} ({summary['samples']} samples)", fontsize=9, loc="left")
        ax.tick_params(axis="x", labelsize=7)
    for ax in axes[len(summaries) :]:
        ax.set_axis_off()
    fig.supxlabel("% of samples in the function itself (self time)", fontsize=8)
    return fig


def _label(key: str, width: int = 60) -> str:
    return key if len(key) <= width else key[: width - 1] + "…"


def save(fig: Figure, name: str) -> Any:
    """Write `name`.png under `figures_dir()`; returns an inline image for the notebook."""
    directory = figures_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.png"
    fig.savefig(path, dpi=110, metadata={"Software": None})
    try:
        from IPython.display import Image
    except ImportError:
        return path
    return Image(filename=str(path))


def execute_notebooks(paths: Iterable[Path] | None = None) -> list[Path]:
    """Run notebooks headless in their directory (figures land in `figures_dir()`)."""
    import nbclient
    import nbformat

    done = []
    for path in sorted(paths or NOTEBOOKS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        client = nbclient.NotebookClient(
            nb,
            kernel_name="python3",
            timeout=300,
            resources={"metadata": {"path": str(path.parent)}},
        )
        client.execute()
        done.append(path)
        print(f"ran {path.relative_to(ROOT)}")
    return done


if __name__ == "__main__":
    # `python -m impl.analysis.figures [NOTEBOOK ...]` (or `python -m impl.analysis`): regenerate
    # notebooks/figures/ from the results.
    import sys

    os.environ.setdefault("MPLBACKEND", "Agg")
    execute_notebooks([Path(p).resolve() for p in sys.argv[1:]] or None)
