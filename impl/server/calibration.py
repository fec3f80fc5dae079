"""Start-up calibrations: a short measurement per family when `hotpath bench` recorded nothing.

`impl.pick` takes one of these as its `calibrator` when the server starts with no measurements
recorded on this machine (`hotpath serve --no-calibrate` skips them). Each takes the candidate
names and returns rows in the measurements format (`{"input", "size_bytes", "cost": {name:
seconds}}`, lower is better); an implementation whose result differs from the reference's is
left out of its row, as `hotpath bench` leaves it out. The pool has none: its cost only shows
with hundreds of requests in flight, too long for a start-up, so it falls back to the
preference order. About 1–2 s per family here.
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


def decode(candidates: list[str]) -> Rows:
    """Median seconds per decode of two seeded bodies (`auto` follows the others: left out)."""
    from impl.decode.parity import same
    from impl.harness.bodies import body_for

    reference = registry.create("decode", registry.reference("decode"))
    rows = []
    for tokens, kind in DECODE_INPUTS:
        body = body_for(tokens, kind=kind)
        want = reference.decode(body)
        cost = {}
        for name in candidates:
            decoder = registry.create("decode", name) if name != "auto" else None
            if decoder is None or not same(decoder.decode(body), want):
                continue
            cost[name] = median_seconds(
                lambda d=decoder, b=body: d.decode(b), min_time=0.02, repeat=3
            )
        rows.append({"input": f"{kind}-{tokens}", "size_bytes": len(body), "cost": cost})
    return rows


def encode(candidates: list[str]) -> Rows:
    """Median seconds per encode of seeded Completions; bytes must equal the reference's."""
    from impl.encode import samples

    reference = registry.create("encode", registry.reference("encode"))
    rows = []
    for tokens in ENCODE_TOKENS:
        completion = samples.sized(tokens)
        want = reference.encode(completion)
        cost = {}
        for name in candidates:
            encoder = registry.create("encode", name)
            if encoder.encode(completion) != want:
                continue
            cost[name] = median_seconds(
                lambda e=encoder, c=completion: e.encode(c), min_time=0.02, repeat=3
            )
        rows.append({"input": f"tokens-{tokens}", "size_bytes": len(want), "cost": cost})
    return rows


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
