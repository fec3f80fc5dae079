"""Where a router body becomes SampleResponse bytes: on the event loop, in threads, or in processes.

Decoding a realistic 262144-token body (~20 MB) takes tens of milliseconds of CPU or more even
with the fastest decoder, and simdjson's and numpy's long C calls hold the GIL: run on the event
loop, or in a worker thread, a burst of them stalls every other request, a fresh-connection
/healthz included (docs/measurements.md has the figures). The designs here share one contract,
`Decoding` (`impl.server.offloop.decoding`): a forward's one way in is `await
design.sample(call) -> Sampled` (the SampleResponse bytes or the failure, and the seconds of each
step):

- `inline`: decode and encode on the loop (the cheapest for small bodies, and the baseline);
- `threads`: a thread pool, for a decoder whose parse releases the GIL (`releases_gil`)
  (both in `impl.server.offloop.inline`);
- `processes`: decode processes (`impl.server.offloop.processes`), for any decoder;
- `fetch`: fetch processes (`impl.server.offloop.fetch`) that also send the router
  request and read its body with their own pool, so the body never enters the server's process
  (for requests whose expected body is `--offloop-min-bytes` or more). `auto` picks it for every
  decoder, as measured (`choose`).

Both process designs share their child-process plumbing (`impl.server.offloop.children`: start
on a socket pair, reap, replace, stop, the failure frames). Bodies under `--offloop-min-bytes`
stay inline in every design: handing them over costs the loop more than decoding them.
`BodyBudget` (`impl.server.budget`) caps the upstream body bytes held at once
(`--max-body-bytes-in-flight`).
"""

from __future__ import annotations

import os
from typing import Any

from impl.decode import releases_gil
from impl.server.offloop.decoding import Decoding
from impl.server.offloop.inline import Inline, Threads

DESIGNS = ("auto", "inline", "threads", "processes", "fetch")


def default_count() -> int:
    """Threads or processes when `--offloop-count` is not given: one per core this process may
    use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def nice_of(design: str, given: int | None) -> int:
    """The niceness of `design`'s processes: `given`, else 10 for decode processes (the loop
    first) and 0 for fetch processes (they receive the bodies too: at 10 they wait behind
    every other process; docs/experiments.md)."""
    if given is not None:
        return given
    return 0 if design == "fetch" else 10


def fetch_pool(given: str, picked: str) -> tuple[str, str]:
    """(pool, reason) of the fetch processes for `--offloop-pool` = `given` (`picked`: the
    server's pool pick, made on small answers)."""
    from impl import registry

    if given != "auto":
        return given, "--offloop-pool (explicit)"
    if registry.unavailable_reason("pool", "aiohttp") is None:
        return "aiohttp", (
            "long bodies: on 212k-token bodies aiohttp costs the least server CPU per result and "
            "its fetch processes the least memory (docs/measurements.md)"
        )
    return picked, "the server's pool pick (aiohttp, auto's choice for long bodies, is missing)"


def choose(design: str, decoder_name: str, decoder: Any, *, baseline: bool) -> tuple[str, str]:
    """(design, reason) for `--offloop` = `design` with the picked decoder."""
    if design not in DESIGNS:
        raise LookupError(f"unknown --offloop {design!r}; known: {', '.join(DESIGNS)}")
    if design != "auto":
        return design, "--offloop (explicit)"
    if baseline:
        return "inline", "--baseline (the configuration before the fixes)"
    gil = "releases the GIL" if releases_gil(decoder) else "holds the GIL while it parses"
    return "fetch", (
        f"decoder {decoder_name} {gil}; fetch processes send the router request and "
        "receive, decode and encode the body, so no body reaches the event loop (with decode "
        "processes the loop still receives each ~20 MB body and stalls on it): side by side on "
        "probe-128x262k, /healthz answers fastest with fetch processes, at the throughput of "
        "decode processes (docs/measurements.md; --offloop processes or inline to choose "
        "another design)"
    )


def create(
    design: str,
    *,
    decoder: Any,
    encoder: Any,
    decoder_name: str,
    encoder_name: str,
    count: int,
    min_bytes: int,
    nice: int = 0,
    pool_name: str = "",
    pool_options: dict[str, Any] | None = None,
) -> Decoding:
    """The object running `design` with `count` threads or processes (call `await start()`
    inside the running loop); `fetch` also needs the pool's registry name and its options."""
    if design == "inline":
        return Inline(decoder, encoder)
    if design == "threads":
        return Threads(decoder, encoder, count=count, min_bytes=min_bytes)
    common = {
        "decoder_name": decoder_name,
        "encoder_name": encoder_name,
        "count": count,
        "min_bytes": min_bytes,
        "nice": nice,
    }
    if design == "processes":
        from impl.server.offloop.processes import DecodeProcesses

        return DecodeProcesses(decoder, encoder, **common)
    if design == "fetch":
        from impl.server.offloop.fetch import FetchProcesses

        return FetchProcesses(
            decoder, encoder, pool_name=pool_name, pool_options=pool_options or {}, **common
        )
    raise LookupError(f"unknown decode design {design!r}; known: inline, threads, processes, fetch")
