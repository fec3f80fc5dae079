"""The gate demo's end-to-end case: a commit that makes each sample's path F times as long.

`make gate-demo ARGS="--e2e-slowdown 1.5"` commits, on the snapshot of the working tree, this
patch to the hot routes (`impl/server/routes/sampling.py`): asample notes when each sample
arrived, and the answer that delivers a result (retrieve_future's payload, with per-request
polling or after a session poll reported it) first waits (F - 1) times as long as the sample has
been in the server. No CPU is spent (a sleep), so only the end-to-end stage can see it.

A delay of (F - 1) times the server's time makes the server's share of a sample F times as
long, not the sample: the latency the client measures also holds the client's own share (the
submit, the result's parse and check, its event loop, the loopback hops), which no server-side
sleep lengthens, so the sample grows 1 + (F - 1) x s times for a server share s. The demo
therefore measures what it injects (`achieved`: the stage's own side-by-side rounds, the
unchanged snapshot against the commit) and, when that falls short of F, scales the delay by
(F - 1) / (achieved - 1) (the share averaged over the measurements) and measures again
(`calibrate`, at most `CORRECTIONS` times), so that the commit the gate judges is F times
slower end to end as measured here; both figures print beside the gate's verdicts.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: the module the patch is appended to
MODULE = "impl/server/routes/sampling.py"
#: rounds of a measurement of the achieved slowdown, and how often the delay is corrected
ROUNDS, CORRECTIONS = 5, 2
#: achieved within this fraction of the asked slowdown's excess: no correction
CLOSE_ENOUGH = 0.1

_PATCH = """

# gate demo: a deliberate ~{factor}x end-to-end slowdown: the answer delivering a result waits
# {extra!r} times as long as its sample has been in the server (a sleep: no CPU)
import asyncio as _demo_asyncio
import time as _demo_time

_demo_arrived = {{}}
_asample_at_once, _retrieve_at_once = asample, retrieve_future


async def asample(scope, receive, send):
    arrived = _demo_time.monotonic()

    async def noting(message):
        if message["type"] == "http.response.body" and message.get("body"):
            try:
                _demo_arrived[orjson.loads(message["body"])["request_id"]] = arrived
            except (ValueError, KeyError, TypeError):
                pass
        await send(message)

    await _asample_at_once(scope, receive, noting)


async def retrieve_future(scope, receive, send):
    body = []

    async def reading():
        message = await receive()
        body.append(message.get("body", b""))
        return message

    async def delaying(message):
        if message["type"] == "http.response.start" and (b"content-type", PROTOBUF) in [
            tuple(h) for h in message.get("headers", [])
        ]:
            try:
                request_id = orjson.loads(b"".join(body))["request_id"]
            except (ValueError, KeyError, TypeError):
                request_id = None
            arrived = _demo_arrived.pop(request_id, None)
            if arrived is not None:
                await _demo_asyncio.sleep({extra!r} * (_demo_time.monotonic() - arrived))
        await send(message)

    await _retrieve_at_once(scope, reading, delaying)
"""


def patch(factor: float | None, extra: float | None = None) -> str:
    """The text appended to MODULE for an end-to-end slowdown of `factor` (> 1): the delay is
    `extra` times the sample's time in the server (default factor - 1)."""
    if factor is None or factor <= 1:
        raise ValueError("the e2e case needs a factor above 1 (--e2e-slowdown 1.5)")
    return _PATCH.format(factor=factor, extra=round(factor - 1 if extra is None else extra, 6))


def achieved(repo: Path, base: str, head: str, out: Path) -> tuple[float, float]:
    """(p50 latency, results/s) of `head`'s server against `base`'s, HEAD/base and base/HEAD,
    medians of ROUNDS side-by-side rounds of the stage's own scenario, run in `repo`."""
    command = [sys.executable, "-m", "impl.ci.gate_e2e", "--base", base, "--head", head]
    command += ["--rounds", str(ROUNDS), "--factor", "1000", "--reference", "none"]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    out.unlink(missing_ok=True)
    with out.with_suffix(".log").open("w") as log:
        subprocess.run([*command, "--json", str(out)], cwd=repo, env=env, stdout=log, stderr=log)
    if not out.exists():
        raise SystemExit(
            f"gate-demo: measuring the e2e commit failed, see {out.with_suffix('.log')}"
        )
    written = json.loads(out.read_text())
    return written["latency_ratio"], written["throughput_ratio"]


def calibrate(
    factor: float, commit: Callable[[float], str], measure: Callable[[str], tuple[float, float]]
) -> tuple[str, float, list[tuple[float, float, float]]]:
    """The e2e commit whose measured p50 slowdown is `factor` (or as near as CORRECTIONS
    corrections get): (its hash, its delay, each measurement's (delay, p50, results/s)).
    `commit(extra)` makes the commit with that delay; `measure(commit)` its achieved ratios.
    Each correction sets the delay from the share of the latency it scales, (p50 - 1) / delay,
    averaged over every measurement so far (each within 0.1 to 1), so that one noisy
    measurement does not swing the next delay."""
    extra = factor - 1
    made = commit(extra)
    steps = [(extra, *measure(made))]
    for _ in range(CORRECTIONS):
        latency = steps[-1][1]
        if abs(latency - factor) <= CLOSE_ENOUGH * (factor - 1):
            break  # close enough
        shares = [min(max((p50 - 1) / delay, 0.1), 1.0) for delay, p50, _ in steps]
        extra = (factor - 1) / statistics.fmean(shares)
        made = commit(extra)
        steps.append((extra, *measure(made)))
    return made, extra, steps


def measured(written: dict[str, Any]) -> str:
    """The end-to-end stage's figures from a gate run's --json (`n/a` when it did not run)."""
    e2e = written.get("e2e") or {}
    if e2e.get("latency_ratio") is None:
        return "n/a"
    rounds = len(e2e.get("pairs") or [])
    return (
        f"p50 {e2e['latency_ratio']:.2f}x, results/s {e2e['throughput_ratio']:.2f}x "
        f"({rounds} rounds)"
    )
