"""The shape every gate stage has: measure both commits, compare them row by row, decide, print.

`impl.ci.gate` runs three stages on the base commit and HEAD: the timers (`gate_timers`: asv's
`time_` and `track_` benchmarks), the instruction counts (`gate_icount`) and the end-to-end
comparison of the two servers (`gate_e2e`). Each is a `Stage`:

- `measure()` runs what it measures on both commits (nothing is judged yet; False: it could
  not run);
- `compare()` turns what was measured into `Row`s: one per compared figure, its value on each
  commit, HEAD's ratio (above 1 is worse), and the `Verdict` of the stage's rule (`judge`
  for a plain ratio and factor; the timer stage adds asv's statistics, `impl.ci.significance`);
- `print_table(title, rows)` prints any stage's rows as one table, and a row whose verdict
  `fails` fails the gate.

What a stage does between measuring and deciding (the timer and end-to-end stages measure
again before they fail a figure) stays the stage's own; the order of the stages
and the exit status are `impl.ci.gate`'s. A commit of BASE..HEAD whose message has a line
`Gate-accept: NAME` accepts a worse figure that NAME names (`is_accepted`): it is still
measured and printed, marked accepted.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Iterable
from typing import Any, Protocol

ACCEPT = re.compile(r"^\s*gate-accept:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
HOW_TO_ACCEPT = (
    "gate: if the cost change is intended, accept it with a line in the commit message naming "
    "what rose, e.g. `Gate-accept: {example}` (git commit --amend), and run the gate again"
)


class Verdict(enum.Enum):
    """What the comparison of one figure decided (the value is the table's word)."""

    PASS = "pass"
    #: beyond the factor, but the samples do not differ significantly: passes
    NOISE = "pass ~"
    BETTER = "better"
    WORSE = "FAIL"
    #: measured on the base commit, no result on HEAD: HEAD broke it
    BROKE = "FAIL !"
    #: worse, but a `Gate-accept:` line names it
    ACCEPTED = "accepted"
    #: not measured on one commit (or either), or not comparable: not judged
    NOT_COMPARED = "n/a"

    @property
    def fails(self) -> bool:
        return self in (Verdict.WORSE, Verdict.BROKE)


@dataclasses.dataclass(frozen=True)
class Row:
    """One compared figure: its value on each commit, HEAD's ratio (above 1: HEAD is worse),
    the verdict; `cells` are the two values as printed (default: `value_cell`)."""

    name: str
    base: float | None
    head: float | None
    ratio: float | None
    verdict: Verdict
    cells: tuple[str, str] | None = None


class Stage(Protocol):
    """A gate stage (see the module docstring)."""

    #: the stage's table title, e.g. "instruction counts (fail at 1.05x or more)"
    title: str

    def measure(self) -> bool:
        """Run the stage's measurements on both commits; False when they could not run."""
        ...

    def compare(self) -> list[Row]:
        """The rows of what was measured, each with its verdict."""
        ...


def measured(value: float | None) -> bool:
    """Whether `value` is a result (not a failure, None, nor a skip, NaN)."""
    return value is not None and value == value


def judge(
    base: float | None,
    head: float | None,
    ratio: float | None,
    factor: float,
    *,
    inclusive: bool = False,
    accepted: bool = False,
) -> Verdict:
    """The verdict of a plain factor: worse when `ratio` is beyond `factor` (at it too, when
    `inclusive`), accepted instead when `accepted`; broke when measured on base only."""
    if ratio is None:
        return Verdict.BROKE if measured(base) and not measured(head) else Verdict.NOT_COMPARED
    if ratio > factor or (inclusive and ratio >= factor):
        return Verdict.ACCEPTED if accepted else Verdict.WORSE
    return Verdict.PASS


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
    """Whether an accept line names this figure: a step (`decode-262k`), a benchmark
    (`bench_decode.Decode.time_decode`, `time_decode`), its full asv name with parameters, or
    `all`."""
    words = {name, name.rsplit(".", 1)[-1], label(name, params), *map(str, params or ())}
    return any(a.lower() == "all" or a in words for a in accepted)


def value_cell(value: float | None) -> str:
    """A value as the tables print it (integers with thousands separators)."""
    if value is None:
        return "failed"
    if value != value:
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def print_table(
    title: str, rows: Iterable[Row], *, what: str = "benchmark", digits: int = 2
) -> None:
    """Print `rows` under `gate: TITLE`: name, base, HEAD, ratio (`digits` decimals), verdict."""
    lines = [
        (
            row.name,
            *(row.cells or (value_cell(row.base), value_cell(row.head))),
            "n/a" if row.ratio is None else f"{row.ratio:.{digits}f}",
            row.verdict.value,
        )
        for row in rows
    ]
    header = (what, "base", "HEAD", "ratio", "verdict")
    widths = [max(len(cells[i]) for cells in [header, *lines]) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        name, *rest = (cell.ljust(w) if i in (0, 4) else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(cells, widths, strict=True)))  # fmt: skip
        return "| " + " | ".join([name, *rest]) + " |"

    print(f"\ngate: {title}")
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for cells in lines:
        print(line(cells))
