"""Per body size and feature class, the decoder measured fastest on this machine.

At creation it reads the decode measurements `hotpath bench` recorded (`impl.pick.load()`, or
rows passed in). Each row carries the body's size, its feature class (`impl.decode._features`:
non-ASCII share, escapes, number layout; rows recorded before classes are class "any"), what
computing that class cost, and the cost of every available implementation (itself excluded,
parity failures never recorded).

The plan: `steps`, the fastest per measured size over all rows (log-scale midpoints between
sizes, as before classes), and per measured class its own steps, which speak for sizes within
`REACH`x of that class's rows (unbounded on a side where they are within `REACH`x of the
smallest or largest size measured). The size axis is cut into `segments`. Where no class is
measured faster with another decoder by more than `MARGIN` plus what its class costs, `decode`
is one `bisect` on `len(body)` and a call, as cheap as a size-only plan. Only in a segment
where some class is does `decode` compute the body's class (a few µs, from three 1 KB windows)
and take that class's pick (the all-rows pick for a class not measured there); and only when
that lowers the worst ratio to the fastest over the classes there, since then every body in
the segment pays for the class. `hotpath bench`'s auto/fastest ratio includes that cost.

With no measurements it uses the first available name of the family's `PREFERENCE` order for
every size. It releases the GIL (`releases_gil`) exactly when every decoder it may delegate to
does.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence as Seq
from typing import Any, NamedTuple

from impl import pick, registry
from impl.decode import PREFERENCE, Completion, Decoder, releases_gil
from impl.decode._features import ANY, classify

#: a class's own measurements count for bodies up to this factor smaller or larger than its rows
REACH = 4.0
#: a class gets its own pick only when the all-rows pick is this much slower on its rows
MARGIN = 0.02


class Step(NamedTuple):
    size: int
    name: str
    cost: dict[str, float]
    #: what computing the body's feature class cost on this row's body (0 when not recorded)
    features_seconds: float


class Segment(NamedTuple):
    """Bodies from `lower` bytes up: `name`, or per feature class `by_class[class]`."""

    lower: float
    name: str
    by_class: dict[str, str]


def _steps(rows: list[dict[str, Any]], candidates: Seq[str]) -> list[Step]:
    """The fastest candidate per measured size (its row's costs with it), ascending by size."""
    best: dict[int, Step] = {}
    for row in rows:
        cost = {name: value for name, value in row.get("cost", {}).items() if name in candidates}
        size = row.get("size_bytes")
        if not cost or not size:
            continue
        name = min(cost, key=lambda name: (cost[name], name))
        if size not in best or cost[name] < best[size].cost[best[size].name]:
            best[size] = Step(size, name, cost, row.get("features_seconds", 0.0))
    return [best[size] for size in sorted(best)]


def plan(rows: list[dict[str, Any]], candidates: Seq[str]) -> list[tuple[int, str]]:
    """(size_bytes, fastest candidate) per measured row, ascending by size (every class)."""
    return [(step.size, step.name) for step in _steps(rows, candidates)]


def _bounds(steps: Seq[Step]) -> list[float]:
    """Bodies below the log-midpoint between two measured sizes go to the smaller's pick."""
    return [math.sqrt(a.size * b.size) for a, b in itertools.pairwise(steps)]


def segments(rows: list[dict[str, Any]], candidates: Seq[str]) -> list[Segment]:
    """The size axis cut where any pick changes; per segment the all-rows pick and overrides."""
    everything = _steps(rows, candidates)
    if not everything:
        return []
    by_class: dict[str, list[Step]] = {}
    for cls in sorted({row.get("features", ANY) for row in rows} - {ANY}):
        steps = _steps([row for row in rows if row.get("features") == cls], candidates)
        if steps:
            by_class[cls] = steps
    cuts = set(_bounds(everything))
    reach = {cls: _reach(steps, everything) for cls, steps in by_class.items()}
    for cls, steps in by_class.items():
        cuts.update(_bounds(steps))
        cuts.update(edge for edge in reach[cls] if 0 < edge < math.inf)
    out: list[Segment] = []
    for lower in [0.0, *sorted(cuts)]:
        name = everything[bisect.bisect(_bounds(everything), lower)].name
        here = {
            cls: steps[bisect.bisect(_bounds(steps), lower)]
            for cls, steps in by_class.items()
            if reach[cls][0] <= lower < reach[cls][1]
        }
        overrides = _overrides(name, here)
        if out and (out[-1].name, out[-1].by_class) == (name, overrides):
            continue  # the same choice as the segment below: no cut here
        out.append(Segment(lower, name, overrides))
    return out


def _reach(steps: list[Step], everything: list[Step]) -> tuple[float, float]:
    """Sizes a class's rows speak for: REACH x beyond its own, unbounded where all rows end."""
    low = 0.0 if steps[0].size / REACH <= everything[0].size else steps[0].size / REACH
    high = math.inf if steps[-1].size * REACH >= everything[-1].size else steps[-1].size * REACH
    return low, high


def _overrides(name: str, here: dict[str, Step]) -> dict[str, str]:
    """{class: its pick} where a class's pick beats `name` by more than MARGIN and the class's cost.

    Empty (decide by size alone) unless that lowers the worst ratio to the fastest over the
    classes measured here: once the class is computed, every body in the segment pays for it.
    """
    overrides = {
        cls: step.name
        for cls, step in here.items()
        if step.name != name
        and step.cost.get(name, math.inf)
        > (1 + MARGIN) * (step.cost[step.name] + step.features_seconds)
    }
    if not overrides:
        return {}

    def ratio(step: Step, pick: str, extra: float) -> float:
        return (step.cost.get(pick, math.inf) + extra) / step.cost[step.name]

    by_size = max(ratio(step, name, 0.0) for step in here.values())
    by_class = max(
        ratio(step, overrides.get(cls, name), step.features_seconds) for cls, step in here.items()
    )
    return overrides if by_class < by_size else {}


class AutoDecoder:
    def __init__(self, rows: list[dict[str, Any]] | None = None) -> None:
        candidates = [name for name in registry.available("decode") if name != "auto"]
        if rows is None:
            rows = pick.load().get("decode", [])
        self.steps = plan(rows, candidates)
        self.segments = segments(rows, candidates)
        if not self.segments:
            fallback = next((name for name in PREFERENCE if name in candidates), "json")
            self.steps = [(1, fallback)]
            self.segments = [Segment(0.0, fallback, {})]
        names = {s.name for s in self.segments} | {
            n for s in self.segments for n in s.by_class.values()
        }
        self._decoders: dict[str, Decoder] = {
            name: registry.create("decode", name) for name in names
        }
        self._bounds = [segment.lower for segment in self.segments[1:]]
        # Per segment: the decoder when the class cannot change it (None where it can), ...
        self._fixed = [None if s.by_class else self._decoders[s.name] for s in self.segments]
        # ... and where it can, the all-rows decoder and {class: decoder}.
        self._default = [self._decoders[s.name] for s in self.segments]
        self._by_class = [
            {cls: self._decoders[name] for cls, name in s.by_class.items()} for s in self.segments
        ]
        self.releases_gil = all(map(releases_gil, self._decoders.values()))

    def choose(self, body: bytes) -> str:
        """The name of the implementation `body` is decoded with."""
        segment = self.segments[bisect.bisect(self._bounds, len(body))]
        if not segment.by_class:
            return segment.name
        return segment.by_class.get(classify(body), segment.name)

    def decoder_for(self, body: bytes) -> Decoder:
        """The decoder object `body` is handed to (what `decode` does before the decode)."""
        i = bisect.bisect(self._bounds, len(body))
        decoder = self._fixed[i]
        if decoder is None:
            decoder = self._by_class[i].get(classify(body), self._default[i])
        return decoder

    def decode(
        self, body: bytes, *, prompt_tokens: Seq[int] | None = None, topk_prompt_logprobs: int = 0
    ) -> Completion:
        # `decoder_for`'s lines, inlined: no extra method call on every decode
        i = bisect.bisect(self._bounds, len(body))
        decoder = self._fixed[i]
        if decoder is None:
            decoder = self._by_class[i].get(classify(body), self._default[i])
        return decoder.decode(
            body, prompt_tokens=prompt_tokens, topk_prompt_logprobs=topk_prompt_logprobs
        )


def create(rows: list[dict[str, Any]] | None = None) -> AutoDecoder:
    return AutoDecoder(rows)
