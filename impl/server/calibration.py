"""Start-up calibrations: a short measurement per family when `hotpath bench` recorded nothing.

`impl.pick` takes one of these as its `calibrator` when the server starts with no measurements
recorded on this machine (`hotpath serve --no-calibrate` skips them). Each takes the candidate
names and returns rows in the measurements format (`{"input", "size_bytes", "cost": {name:
seconds}}`, lower is better); an implementation whose result differs from the reference's is
left out of its row, as `hotpath bench` leaves it out. The pool has none: its cost only shows
with hundreds of requests in flight, too long for a start-up, so it falls back to the
preference order. The three together take a few seconds (docs/measurements.md).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from impl import registry
from impl.measure import median_seconds

Rows = list[dict[str, Any]]

#: (generated tokens, body kind) of the decode calibration: a small and a realistic body
DECODE_INPUTS = ((128, "minimal"), (2048, "vllm"))
#: generated tokens of the encode calibration
ENCODE_TOKENS = (128, 32768)


def _timed_rows(
    family: str,
    candidates: list[str],
    inputs: list[tuple[str, Any]],
    call: Callable[[Any, Any], Any],
    equal: Callable[[Any, Any], bool],
    size: Callable[[Any, Any], int],
) -> Rows:
    """Median seconds of `call(implementation, input)` per input, for every candidate whose
    result `equal`s the reference's; `size(input, reference result)` is the row's size."""
    reference = registry.create(family, registry.reference(family))
    created = {name: registry.create(family, name) for name in candidates}
    rows = []
    for label, value in inputs:
        want = call(reference, value)
        cost = {}
        for name, implementation in created.items():
            if equal(call(implementation, value), want):
                cost[name] = median_seconds(
                    lambda i=implementation, v=value: call(i, v), min_time=0.02, repeat=3
                )
        rows.append({"input": label, "size_bytes": size(value, want), "cost": cost})
    return rows


def decode(candidates: list[str]) -> Rows:
    """Median seconds per decode of two seeded bodies (`auto` follows the others: left out)."""
    from impl.decode.parity import same
    from impl.workloads.synthetic import body_for

    inputs = [(f"{kind}-{n}", body_for(n, kind=kind)) for n, kind in DECODE_INPUTS]
    names = [name for name in candidates if name != "auto"]
    return _timed_rows(
        "decode", names, inputs, lambda d, body: d.decode(body), same, lambda body, _: len(body)
    )


def encode(candidates: list[str]) -> Rows:
    """Median seconds per encode of seeded Completions; bytes must equal the reference's."""
    from impl.encode import samples

    inputs = [(f"tokens-{n}", samples.sized(n)) for n in ENCODE_TOKENS]
    return _timed_rows(
        "encode",
        candidates,
        inputs,
        lambda e, completion: e.encode(completion),
        lambda got, want: got == want,
        lambda _, want: len(want),
    )


def accesslog(candidates: list[str]) -> Rows:
    """Calling-thread CPU seconds per access record, to os.devnull (`null` never counts: it
    loses every line)."""
    from impl.accesslog._common import access_record

    record = access_record("127.0.0.1:50123", "GET", "/api/v1/retrieve_future", "1.1", 200)
    cost = {}
    with open(os.devnull, "w") as devnull:
        for name in candidates:
            if name == "null":
                continue
            handler = registry.create("accesslog", name, stream=devnull)
            try:
                cost[name] = median_seconds(
                    lambda h=handler: h.handle(record),
                    min_time=0.02,
                    repeat=3,
                    clock=time.thread_time,  # a listener thread's work is not the caller's
                )
            finally:
                handler.close()
    return [{"input": "per-record handle (calibration)", "size_bytes": None, "cost": cost}]


CALIBRATORS: dict[str, Callable[[list[str]], Rows]] = {
    "decode": decode,
    "encode": encode,
    "accesslog": accesslog,
}


def calibrator(family: str) -> Callable[[list[str]], Rows] | None:
    """The start-up calibration of `family`, or None where it has none (the pool)."""
    registry.reference(family)  # LookupError naming the known families for a bad name
    return CALIBRATORS.get(family)
