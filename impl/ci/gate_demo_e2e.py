"""The gate demo's end-to-end case: a commit that makes each sample's path F times as long.

`make gate-demo ARGS="--e2e-slowdown 1.5"` commits, on the snapshot of the working tree, this
patch to the hot routes (`impl/server/routes/sampling.py`): asample notes when each sample
arrived, and the answer that delivers a result (retrieve_future's payload, with per-request
polling or after a session poll reported it) first waits (F - 1) times as long as the sample has
been in the server. No CPU is spent (a sleep), so only the end-to-end stage can see it: the
server's time per sample grows F times, and the latency the client measures nearly as much
(the client's own share of it is not delayed).
"""

from __future__ import annotations

from typing import Any

#: the module the patch is appended to
MODULE = "impl/server/routes/sampling.py"

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


def patch(factor: float | None) -> str:
    """The text appended to MODULE for an end-to-end slowdown of `factor` (> 1)."""
    if factor is None or factor <= 1:
        raise ValueError("the e2e case needs a factor above 1 (--e2e-slowdown 1.5)")
    return _PATCH.format(factor=factor, extra=round(factor - 1, 6))


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
