"""Where a router body becomes SampleResponse bytes: on the event loop, in threads, or in processes.

Decoding a realistic 262144-token body (~20 MB) takes 60-160 ms of CPU even with the fastest
decoder, and simdjson's and numpy's long C calls hold the GIL: run on the event loop, or in a
worker thread, 64 of them stall every other request (a fresh-connection /healthz waited up to
1.9 s). The designs here share one contract, `await design.to_proto(body, job) -> (bytes, decode
seconds, encode seconds)` (`UpstreamFailed` saying why not):

- `inline`: decode and encode on the loop (the cheapest for small bodies, and the baseline);
- `threads`: a thread pool, for a decoder whose parse releases the GIL (`releases_gil`);
- `processes`: decode worker processes (`impl.server.offloop.processes`), for any decoder;
- `fetch`: fetch worker processes (`impl.server.offloop.fetch`) that also send the router
  request and read its body with the picked pool, so the body never enters the server's process
  (`fetch(url, request, job) -> Fetched` instead of `to_proto`, for requests whose expected body
  is `--offloop-min-bytes` or more). `auto` picks it for every decoder, as measured (`choose`).

Bodies under `--offloop-min-bytes` stay inline in every design: handing them over costs the
loop more than decoding them. `BodyBudget` caps the upstream body bytes held at once
(`--max-body-bytes-in-flight`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from impl.decode import Completion, DecodeError, releases_gil

DESIGNS = ("auto", "inline", "threads", "processes", "fetch")


class UpstreamFailed(Exception):
    """The sample cannot complete; the message is what retrieve_future reports, `kind` its
    class in the metrics (connect, read, http_5xx, http_status, decode, choices, decode_worker)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


#: SampleResponse bytes, seconds decoding, seconds encoding
Converted = tuple[bytes, float, float]


@dataclasses.dataclass(frozen=True, slots=True)
class DecodeJob:
    """What turning a body into SampleResponse bytes needs besides the body (small, picklable)."""

    prompt_tokens: list[int] | None
    n: int
    topk: int
    include_prompt_logprobs: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Fetched:
    """What a fetch worker did with one router request: the SampleResponse bytes or the
    failure, the body's size, the attempts made (0-2) and the seconds of each step."""

    payload: bytes
    failure: UpstreamFailed | None
    body_bytes: int
    attempts: int
    upstream_seconds: float
    decode_seconds: float
    encode_seconds: float


def to_proto(decoder: Any, encoder: Any, body: bytes, job: DecodeJob) -> Converted:
    """SampleResponse bytes for one router body and the seconds decode and encode took, or
    UpstreamFailed saying what was wrong.

    The decoded numpy buffers live only in this call: they are released as soon as the proto
    bytes exist."""
    started = time.perf_counter()
    try:
        completion: Completion = decoder.decode(
            body, prompt_tokens=job.prompt_tokens, topk_prompt_logprobs=job.topk
        )
    except DecodeError as exc:
        raise UpstreamFailed(
            f"the router's completion body is unreadable: {exc}", "decode"
        ) from None
    if len(completion.sequences) != job.n:
        raise UpstreamFailed(
            f"the router returned {len(completion.sequences)} choices for n={job.n}", "choices"
        )
    if not job.include_prompt_logprobs and completion.prompt_logprobs is not None:
        completion = dataclasses.replace(completion, prompt_logprobs=None)
    decoded = time.perf_counter()
    payload = encoder.encode(completion)
    return payload, decoded - started, time.perf_counter() - decoded


def default_workers() -> int:
    """Decode workers when `--decode-workers` is not given: one per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def worker_nice(design: str, given: int | None) -> int:
    """The niceness of `design`'s worker processes: `given`, else 10 for decode workers (the
    loop first) and 0 for fetch workers (they receive the bodies too: at 10 they waited behind
    every other process, 2.7 vs 7.4 results/s on probe-128x262k, 32 samples, load 6-7)."""
    if given is not None:
        return given
    return 0 if design == "fetch" else 10


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
        f"decoder {decoder_name} {gil}; fetch worker processes send the router request and "
        "receive, decode and encode the body, so no body reaches the event loop (with decode "
        "worker processes the loop still received each ~20 MB body, stalling it 80-430 ms): "
        "side by side on probe-128x262k, 32 samples, load 7-13, /healthz p99 58-104 ms vs "
        "99-126 ms with decode worker processes and 0.58-1.26 s inline; results/s 0.9-1.2x "
        "processes (--offloop processes or inline to choose another design)"
    )


class BodyBudget:
    """At most `cap` upstream body bytes held at once; FIFO waiters; one body may exceed it alone.

    A forward reserves its expected body size before it sends the request and settles it to
    the real size once the body arrived; the reservation is released when the proto bytes
    exist (or the forward failed). While the budget is full, requests wait before they are sent.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.used = 0
        self.peak = 0
        self.holders = 0
        self.peak_holders = 0
        self.waited = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def acquire(self, size: int) -> None:
        if not self._waiters and self._fits(size):
            self._take(size)
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((size, future))
        self.waited += 1
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(size)  # granted while being cancelled: give it back
            else:
                self._waiters.remove((size, future))
                self._wake()
            raise

    def settle(self, reserved: int, actual: int) -> int:
        """Replace a reservation by the real size (the body is already here); the new size."""
        self.used += actual - reserved
        self.peak = max(self.peak, self.used)
        if actual < reserved:
            self._wake()
        return actual

    def release(self, size: int) -> None:
        self.used -= size
        self.holders -= 1
        self._wake()

    def _fits(self, size: int) -> bool:
        return self.holders == 0 or self.used + size <= self.cap

    def _take(self, size: int) -> None:
        self.used += size
        self.holders += 1
        self.peak = max(self.peak, self.used)
        self.peak_holders = max(self.peak_holders, self.holders)

    def _wake(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0]):
            size, future = self._waiters.popleft()
            if not future.done():
                self._take(size)
                future.set_result(None)

    def stats(self) -> dict[str, int]:
        return {
            "cap_bytes": self.cap,
            "bytes": self.used,
            "peak_bytes": self.peak,
            "bodies": self.holders,
            "peak_bodies": self.peak_holders,
            "waiting": len(self._waiters),
            "waited_total": self.waited,
        }


class Inline:
    """Decode and encode on the event loop."""

    name = "inline"

    def __init__(self, decoder: Any, encoder: Any) -> None:
        self.decoder, self.encoder = decoder, encoder
        #: set when the server shuts down: no new workers
        self.closing = False
        self.inline = 0
        self.offloop = 0

    async def start(self) -> None:
        return None

    async def to_proto(self, body: bytes, job: DecodeJob) -> Converted:
        self.inline += 1
        return to_proto(self.decoder, self.encoder, body, job)

    def fetches(self, expected_bytes: int) -> bool:
        """True when `fetch` sends the request (the fetch design), False: the loop's pool does."""
        return False

    async def fetch(self, url: str, request: bytes, job: DecodeJob) -> Fetched:
        raise NotImplementedError(f"the {self.name} design does not fetch")

    async def aclose(self) -> None:
        return None

    def stats(self) -> dict[str, Any]:
        return {"inline": self.inline, "offloop": self.offloop}


class Threads(Inline):
    """Bodies of `min_bytes` or more decode in a thread pool (for a GIL-releasing decoder)."""

    name = "threads"

    def __init__(self, decoder: Any, encoder: Any, *, workers: int, min_bytes: int) -> None:
        super().__init__(decoder, encoder)
        self.workers, self.min_bytes = workers, min_bytes
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="hotpath-decode")

    async def to_proto(self, body: bytes, job: DecodeJob) -> Converted:
        if len(body) < self.min_bytes:
            return await super().to_proto(body, job)
        self.offloop += 1
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.executor, to_proto, self.decoder, self.encoder, body, job
        )

    async def aclose(self) -> None:
        # cancel queued decodes; running ones finish (a C call cannot be interrupted)
        await asyncio.to_thread(self.executor.shutdown, True, cancel_futures=True)

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "workers": self.workers, "min_bytes": self.min_bytes}


def create(
    design: str,
    *,
    decoder: Any,
    encoder: Any,
    decoder_name: str,
    encoder_name: str,
    workers: int,
    min_bytes: int,
    nice: int = 0,
    pool_name: str = "",
    pool_options: dict[str, Any] | None = None,
) -> Inline:
    """The object running `design` (call `await start()` inside the running loop); `fetch`
    also needs the pool's registry name and its contract options."""
    if design == "inline":
        return Inline(decoder, encoder)
    if design == "threads":
        return Threads(decoder, encoder, workers=workers, min_bytes=min_bytes)
    if design == "processes":
        from impl.server.offloop.processes import Processes

        return Processes(
            decoder,
            encoder,
            decoder_name=decoder_name,
            encoder_name=encoder_name,
            workers=workers,
            min_bytes=min_bytes,
            nice=nice,
        )
    if design == "fetch":
        from impl.server.offloop.fetch import FetchWorkers

        return FetchWorkers(
            decoder,
            encoder,
            decoder_name=decoder_name,
            encoder_name=encoder_name,
            pool_name=pool_name,
            pool_options=pool_options or {},
            workers=workers,
            min_bytes=min_bytes,
            nice=nice,
        )
    raise LookupError(f"unknown decode design {design!r}; known: inline, threads, processes, fetch")
