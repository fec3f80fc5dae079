"""The gate's instruction-count stage, and accepting an intended cost change.

`impl.ci.gate` runs this stage after its time and CPU-time benchmarks: `asv run` of
`bench_icount.InstructionCount.track_instructions` (every step of `impl.ci.icount_steps`) on
BASE and HEAD, one fresh process per step and commit. A count does not vary between processes
(docs/ci.md), so one run per commit decides and nothing is confirmed: a step
fails when HEAD's count is ICOUNT_FACTOR (1.05) times BASE's or more, or when it was counted
on BASE and has no count on HEAD (the step broke).

Accepting a change. A commit in BASE..HEAD whose message has a line `Gate-accept: NAME`
accepts a rise (or a failure) of every gated benchmark NAME matches: a step (`decode-262k`), a
benchmark (`bench_decode.Decode.time_decode`, `track_instructions`) or its full asv name with
parameters; `Gate-accept: all` accepts everything. An accepted benchmark is still measured and
printed, marked accepted. Where Valgrind is not installed the stage is skipped, saying so.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from impl.ci import icount
from impl.ci.icount_steps import STEPS

BENCHMARK = "bench_icount.InstructionCount.track_instructions"
ICOUNT_FACTOR = 1.05
ACCEPT = re.compile(r"^\s*gate-accept:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
HOW_TO_ACCEPT = (
    "gate: if the cost change is intended, accept it with a line in the commit message naming "
    "what rose, e.g. `Gate-accept: {example}` (git commit --amend), and run the gate again"
)


def family_of(step: str) -> str:
    """The family a step measures (`decode-262k` -> decode); the server's routes: `server`."""
    head = step.split("-")[0]
    return head if head in ("decode", "encode", "accesslog") else "server"


def gated(families: set[str] | None = None) -> list[tuple[str, tuple[Any, ...]]]:
    """The stage's benchmarks: (asv name, parameter values), one per step (of `families`)."""
    return [(BENCHMARK, (s,)) for s in STEPS if families is None or family_of(s) in families]


def label(name: str, params: tuple[Any, ...] | None) -> str:
    """`name(param, ...)` as asv prints it; `name` when unparametrized."""
    return f"{name}({', '.join(map(repr, params))})" if params else name


def accepted_names(messages: str) -> list[str]:
    """The NAMEs of the `Gate-accept: NAME[, NAME]` lines in commit messages."""
    found = []
    for line in ACCEPT.findall(messages):
        found.extend(part.strip() for part in re.split(r"[,\s]+", line) if part.strip())
    return found


def is_accepted(name: str, params: tuple[Any, ...] | None, accepted: list[str]) -> bool:
    """Whether an accept line names this benchmark (see the module docstring)."""
    words = {name, name.rsplit(".", 1)[-1], label(name, params), *map(str, params or ())}
    return any(a.lower() == "all" or a in words for a in accepted)


def compare(values: dict[str, dict[str, Any]], factor: float, accepted: list[str]) -> set[str]:
    """Print the stage's table; the labels of the steps that rose by `factor` or more, not
    accepted. `values`: label -> {"base", "head", "ratio", "params"}."""
    print(f"\ngate: instruction counts (fail at {factor}x or more)")
    print(f"| {'step':<20} | {'base':>15} | {'HEAD':>15} | ratio  | verdict |")
    print(f"|{'-' * 22}|{'-' * 17}|{'-' * 17}|--------|---------|")
    failed = set()
    for name, row in values.items():
        ratio = row["ratio"]
        if ratio is None and row["base"] and row["head"] is None:
            verdict = "FAIL"  # counted on the base, not on HEAD: the step broke
            failed.add(name)
        elif ratio is None:
            verdict = "n/a"
        elif ratio >= factor and is_accepted(name.split("(")[0], row["params"], accepted):
            verdict = "accepted"
        elif ratio >= factor:
            verdict = "FAIL"
            failed.add(name)
        else:
            verdict = "pass"
        cells = [
            f"{row[side]:>15,.0f}" if row[side] else f"{'n/a':>15}" for side in ("base", "head")
        ]
        shown = f"{ratio:.4f}" if ratio else "n/a   "
        step = row["step"]
        print(f"| {step:<20} | {cells[0]} | {cells[1]} | {shown} | {verdict:<7} |")
    return failed


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
