"""The gate's instruction-count stage.

`impl.ci.gate` runs this stage after its time and CPU-time benchmarks: `asv run` of
`bench_icount.InstructionCount.track_instructions` (every step of `impl.ci.icount_steps`) on
BASE and HEAD, one fresh process per step and commit. A count does not vary between processes
(docs/ci.md), so one run per commit decides and nothing is confirmed: a step
fails when HEAD's count is ICOUNT_FACTOR (1.05) times BASE's or more, or when it was counted
on BASE and has no count on HEAD (the step broke).

A `Gate-accept: NAME` line in a commit message of BASE..HEAD accepts a rise of the steps NAME
names (`impl.ci.stage.is_accepted`: a step such as `decode-262k`, `track_instructions`, or
`all`). Where Valgrind is not installed the stage is skipped, saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from impl.ci import icount
from impl.ci.icount_steps import STEPS
from impl.ci.stage import Row, is_accepted, judge, label, print_table

BENCHMARK = "bench_icount.InstructionCount.track_instructions"
ICOUNT_FACTOR = 1.05


def family_of(step: str) -> str:
    """The family a step measures (`decode-262k` -> decode); the server's routes: `server`."""
    head = step.split("-")[0]
    return head if head in ("decode", "encode", "accesslog") else "server"


def gated(families: set[str] | None = None) -> list[tuple[str, tuple[Any, ...]]]:
    """The stage's benchmarks: (asv name, parameter values), one per step (of `families`)."""
    return [(BENCHMARK, (s,)) for s in STEPS if families is None or family_of(s) in families]


def rows(values: dict[str, dict[str, Any]], factor: float, accepted: list[str]) -> list[Row]:
    """One row per step: it fails at `factor` or more, unless accepted, and when it was
    counted on the base and not on HEAD (the step broke). `values`: label -> {"step", "base",
    "head", "ratio", "params"}."""
    out = []
    for name, row in values.items():
        taken = is_accepted(name.split("(")[0], row["params"], accepted)
        base, head, ratio = row["base"], row["head"], row["ratio"]
        found = judge(base, head, ratio, factor, inclusive=True, accepted=taken)
        out.append(Row(row["step"], base, head, ratio, found))
    return out


class Counts:
    """The instruction-count stage of BASE and HEAD (`impl.ci.stage.Stage`). `measure` counts
    the steps of `families` on both commits with `run` (the timer stage's `asv run` of the
    given benchmarks: one fresh process per step and commit); `compare` reads the counts with
    `results` (`impl.ci.gate_timers.gated_results`), prints and returns the rows."""

    def __init__(
        self,
        base: str,
        head: str,
        factor: float,
        accepted: list[str],
        families: set[str] | None,
        results: Callable[..., Any],
        run: Callable[[list[tuple[str, tuple[Any, ...]]]], bool] | None = None,
    ) -> None:
        self.base, self.head, self.factor, self.accepted = base, head, factor, accepted
        self.families, self.results, self.run = families, results, run
        self.title = f"instruction counts (fail at {factor}x or more)"
        #: label -> the step's count on each commit and their ratio, once compared
        self.counts: dict[str, dict[str, Any]] = {}

    def measure(self) -> bool:
        return self.run is None or self.run(gated(self.families))

    def compare(self) -> list[Row]:
        self.counts = values(self.base, self.head, self.results, self.families)
        table = rows(self.counts, self.factor, self.accepted)
        print_table(self.title, table, what="step", digits=4)
        return table


def values(
    base: str, head: str, results: Callable[..., Any], families: set[str] | None = None
) -> dict[str, dict[str, Any]]:
    """Per step (by label): its count on base and on HEAD and HEAD / base. `results` is
    `impl.ci.gate.gated_results` (asv's stored rows of one commit, cut to given combinations)."""
    table: dict[str, dict[str, Any]] = {}
    for name, params in gated(families):
        step = params[0] if params else name.rsplit(".", 1)[-1]
        row: dict[str, Any] = {"step": step, "params": params, "base": None, "head": None}
        row["ratio"] = None
        for side, commit in (("base", base), ("head", head)):
            for stored in results(commit, [(name, params)]):
                value = stored[2][0]
                row[side] = value if value is not None and value == value else None
        if row["base"] and row["head"] is not None:
            row["ratio"] = row["head"] / row["base"]
        table[label(name, params)] = row
    return table


def skipped_reason() -> str | None:
    """Why this machine cannot count instructions (the stage is skipped), or None."""
    return icount.unavailable_reason()
