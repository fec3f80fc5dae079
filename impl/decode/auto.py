"""Per body size, the decoder measured fastest on this machine.

At creation it reads the decode measurements `hotpath bench` recorded (`impl.pick.load()`,
or rows passed in), keeps for each measured input size the fastest available implementation
(itself excluded, parity failures are never recorded) and precomputes the log-scale midpoints
between sizes; `decode` is then one `bisect` on `len(body)` and a call. With no measurements it
uses the first available name of the family's `PREFERENCE` order for every size. It releases
the GIL (`releases_gil`) exactly when every decoder it may delegate to does.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence as Seq
from typing import Any

from impl import pick, registry
from impl.decode import PREFERENCE, Completion, Decoder, releases_gil


def plan(rows: list[dict[str, Any]], candidates: Seq[str]) -> list[tuple[int, str]]:
    """(size_bytes, fastest candidate) per measured row, ascending by size."""
    best: dict[int, tuple[float, str]] = {}
    for row in rows:
        cost = {name: value for name, value in row.get("cost", {}).items() if name in candidates}
        size = row.get("size_bytes")
        if not cost or not size:
            continue
        name = min(cost, key=lambda name: (cost[name], name))
        if size not in best or cost[name] < best[size][0]:
            best[size] = (cost[name], name)
    return [(size, best[size][1]) for size in sorted(best)]


class AutoDecoder:
    def __init__(self, rows: list[dict[str, Any]] | None = None) -> None:
        candidates = [name for name in registry.available("decode") if name != "auto"]
        if rows is None:
            rows = pick.load().get("decode", [])
        steps = plan(rows, candidates)
        if not steps:
            fallback = next((name for name in PREFERENCE if name in candidates), "json")
            steps = [(1, fallback)]
        self.steps = steps
        # Bodies below the log-midpoint between two measured sizes go to the smaller's pick.
        self._bounds = [math.sqrt(a * b) for (a, _), (b, _) in itertools.pairwise(steps)]
        self._decoders: dict[str, Decoder] = {
            name: registry.create("decode", name) for name in {name for _, name in steps}
        }
        self._by_step = [self._decoders[name] for _, name in steps]
        self.releases_gil = all(map(releases_gil, self._decoders.values()))

    def choose(self, size: int) -> str:
        """The implementation a body of `size` bytes is decoded with."""
        return self.steps[bisect.bisect(self._bounds, size)][1]

    def decoder_for(self, size: int) -> Decoder:
        """The decoder object a body of `size` bytes is handed to."""
        return self._by_step[bisect.bisect(self._bounds, size)]

    def decode(
        self, body: bytes, *, prompt_tokens: Seq[int] | None = None, topk_prompt_logprobs: int = 0
    ) -> Completion:
        decoder = self._by_step[bisect.bisect(self._bounds, len(body))]
        return decoder.decode(
            body, prompt_tokens=prompt_tokens, topk_prompt_logprobs=topk_prompt_logprobs
        )


def create(rows: list[dict[str, Any]] | None = None) -> AutoDecoder:
    return AutoDecoder(rows)
