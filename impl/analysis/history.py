"""The README's history figure: the committed asv history of main, one landing per x step.

`make results` (and `python -m impl.analysis.history [--results DIR] [--out PNG]`) reads the
results `make asv-history` committed under benchmarks/results/ (machine `hotpath-history`)
and draws three panels over the first-parent commits of main, oldest first: the fastest
decoder's GB/s on the history's real-text body, the small-2048 end-to-end results/s, and the
instructions of one 262,144-token decode as the gate counts them. Each point is a commit;
where a value moves by STEP_FRACTION or more from the previous point, the commit is named on
the graph. Nothing is measured here: a commit without results is absent, an n/a is a gap.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
MACHINE = "hotpath-history"
OUT = ROOT / "notebooks" / "figures" / "history.png"
DECODE = "history.Decode.time_decode"
ENDTOEND = "history.EndToEnd.track_results_per_second"
ICOUNT = "history.Instructions.track_instructions"
ICOUNT_STEP = "'decode-262k'"
#: a move this large between neighbouring points names its commit on the graph
STEP_FRACTION = 0.15


@dataclass
class Point:
    """One commit's figures (None: n/a or not measured)."""

    commit: str
    decode_seconds: float | None = None
    decoder: str | None = None
    results_per_second: float | None = None
    instructions: float | None = None


def _values(entry: dict, columns: list[str]) -> tuple[list, list]:
    row = dict(zip(columns, entry, strict=False))
    return row.get("result") or [], row.get("params") or []


def read_points(results: Path = RESULTS, machine: str = MACHINE) -> dict[str, Point]:
    """commit hash -> its Point, from every results file of `machine` under `results`."""
    points: dict[str, Point] = {}
    for path in sorted((results / machine).glob("*.json")):
        if path.name == "machine.json":
            continue
        data = json.loads(path.read_text())
        columns = data.get("result_columns", ["result", "params"])
        point = points.setdefault(data["commit_hash"], Point(data["commit_hash"]))
        for name, entry in data.get("results", {}).items():
            values, params = _values(entry, columns)
            if name == DECODE and values:
                timed = [(v, n) for v, n in zip(values, params[0], strict=False) if v]
                if timed:
                    point.decode_seconds, point.decoder = min(timed)
            elif name == ENDTOEND and values and values[0]:
                point.results_per_second = float(values[0])
            elif name == ICOUNT and values:
                for value, step in zip(values, params[0], strict=False):
                    if step == ICOUNT_STEP and value:
                        point.instructions = float(value)
    return points


def first_parent(points: dict[str, Point], branch: str = "main") -> list[tuple[int, Point]]:
    """The measured commits in first-parent order of `branch`, oldest first, each with its
    position among all of the branch's first-parent commits (1: the first)."""
    order = subprocess.run(
        ["git", "rev-list", "--first-parent", "--reverse", branch],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [(i, points[c]) for i, c in enumerate(order, 1) if c in points]


def body_bytes() -> int:
    """The size of the history's decode body (`benchmarks/history_compat.frozen_body`)."""
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import history, history_compat
    finally:
        sys.path.pop(0)
    return len(history_compat.frozen_body(history.DECODE_KIND, history.DECODE_TOKENS))


def steps(series: list[tuple[int, float, str]]) -> list[tuple[int, float, str]]:
    """The points whose value moved by STEP_FRACTION or more from the previous one."""
    out = []
    for (_, before, _), (x, after, commit) in itertools.pairwise(series):
        if abs(after - before) >= STEP_FRACTION * before:
            out.append((x, after, commit))
    return out


def draw(points: list[tuple[int, Point]], size: int) -> Figure:
    """The three panels over `points` (oldest first); `size`: the decode body's bytes."""
    size = size / 1e9  # GB
    panels = [
        ("decode, fastest decoder (GB/s)", lambda p: p.decode_seconds and size / p.decode_seconds),
        ("end to end, small-2048 (results/s)", lambda p: p.results_per_second),
        ("instructions per 262k-token decode", lambda p: p.instructions),
    ]
    fig = Figure(figsize=(11, 9), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True)
    for ax, (title, value) in zip(axes, panels, strict=True):
        series = [(i, v, p.commit[:7]) for i, p in points if (v := value(p))]
        if series:
            xs, ys, _ = zip(*series, strict=True)
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1)
            for x, y, commit in steps(series):
                ax.annotate(commit, (x, y), textcoords="offset points", xytext=(2, 6), fontsize=7)
        ax.set_title(title, loc="left", fontsize=10)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("landing (first-parent commit of main, 1: the first); named: a 15%+ step")
    first, last = points[0][1].commit[:7], points[-1][1].commit[:7]
    fig.suptitle(f"hotpath's history on machine {MACHINE}: {len(points)} commits, {first}..{last}")
    fig.text(0.01, 0.002, "timings carry the day's load; instruction counts do not", fontsize=7)
    return fig


def regressions(html: Path) -> list[str]:
    """asv's detected regressions of a published history (`html`/regressions.json), one
    markdown line each: the benchmark, its parameters, and each step's commits and values."""
    found = json.loads((html / "regressions.json").read_text())["regressions"]
    revisions = json.loads((html / "index.json").read_text())["revision_to_hash"]
    lines = []
    for name, _path, params, _index, last, best, jumps in found:
        shown = ", ".join(f"{k}={v}" for k, v in params.items())
        for before, after, value_before, value_after in jumps:
            start = revisions.get(str(before), "")[:7] if before is not None else ""
            commits = (
                f"{start}..{revisions[str(after)][:7]}" if start else revisions[str(after)][:7]
            )
            lines.append(
                f"- `{name}`{f' ({shown})' if shown else ''}: {commits}, "
                f"{value_before:.4g} -> {value_after:.4g} ({value_after / value_before:.2f}x; "
                f"last {last:.4g}, best {best:.4g})"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m impl.analysis.history", description=__doc__)
    parser.add_argument("--results", type=Path, default=RESULTS, help="(%(default)s)")
    parser.add_argument("--out", type=Path, default=OUT, help="(%(default)s)")
    parser.add_argument(
        "--regressions",
        type=Path,
        metavar="HTML",
        help="print asv's detected regressions of a published history (make dashboard's html)",
    )
    args = parser.parse_args(argv)
    if args.regressions:
        print("\n".join(regressions(args.regressions)) or "no regression detected")
        return 0
    points = first_parent(read_points(args.results))
    if not points:
        parser.error(f"no results of machine {MACHINE} under {args.results}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    draw(points, body_bytes()).savefig(args.out, dpi=110)
    print(f"history figure: {args.out} ({len(points)} commits)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
