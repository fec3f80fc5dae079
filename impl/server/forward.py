"""Forwarding: one asample -> one POST to `{router}/v1/completions`, decoded once, encoded once.

`build_request` turns a validated `AsampleRequest` into the router's JSON (prompt token ids,
`logprobs: 1` as an integer, `return_token_ids: true`, prompt_logprobs when asked, stop strings
or stop token ids). `ForwardRunner.submit` runs the forward in a background task (the pool's
object that posts is the pool contract's `Forwarder`; this is the server's runner of forwards):
the picked pool posts the request at once (the requests at the engine are bounded by the pool's
connections, `--upstream-connections`), and when the answer's headers arrive its `Admission`
takes the body's size from the `BodyBudget` before the body is read (the pool contract's
`admit`): a body that does not fit yet waits unread in its socket; a
connect-phase error or a 5xx is retried once, a failure after the request was sent is final
(the engine may still be generating, a retry would generate twice; `impl.server.upstream`). The
picked decode design (`impl.server.offloop`: inline, threads or decode processes) turns the
body into SampleResponse bytes with the picked decoder and encoder; with the `fetch` design a
fetch process sends the request, reads the body, decodes and encodes it, and only the
SampleResponse bytes reach this process. The store completes or fails the record with a message
saying what went wrong.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from typing import Any

import orjson

from impl.server import upstream
from impl.server.offloop.inline import DecodeJob, Inline
from impl.server.schemas import AsampleRequest
from impl.server.store import FutureStore, Record, StoreUnavailable
from impl.server.upstream import UpstreamFailed

log = logging.getLogger("hotpath.server")


class SampleRejected(ValueError):
    """The request is valid JSON of the right shape but cannot be forwarded (a 422)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Job:
    """What a forward needs (the request body lives here, never in the store)."""

    body: bytes
    decode: DecodeJob
    #: bytes the router's answer is expected to take (reserved in the BodyBudget)
    expected_bytes: int

    def pack(self) -> tuple[bytes, str]:
        """The router body and options as a shared store keeps them (for a takeover)."""
        decode = self.decode
        keep = int(decode.prompt_tokens is not None)
        options = f"{decode.n} {decode.topk} {int(decode.include_prompt_logprobs)} {keep}"
        return self.body, f"{options} {self.expected_bytes}"

    @classmethod
    def unpack(cls, body: bytes, options: str) -> Job:
        """The Job `pack` kept, for the process taking a record over."""
        n, topk, include, keep, expected = (int(part) for part in options.split(" "))
        prompt = orjson.loads(body)["prompt"] if keep else None
        return cls(body, DecodeJob(prompt, n, topk, bool(include)), expected)


def build_request(request: AsampleRequest, model: str) -> Job:
    """The router request for a validated asample (SampleRejected for unsupported options)."""
    chunks = request.prompt.chunks
    tokens = chunks[0].tokens if len(chunks) == 1 else [t for c in chunks for t in c.tokens]
    params = request.sampling_params
    topk = request.topk_prompt_logprobs
    include = bool(request.prompt_logprobs)
    body: dict[str, Any] = {
        "model": model,
        "prompt": tokens,
        "n": request.num_samples,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "logprobs": 1,
        "return_token_ids": True,
    }
    if params.max_tokens is not None:
        body["max_tokens"] = params.max_tokens
    if params.seed is not None:
        body["seed"] = params.seed
    if include or topk:
        body["prompt_logprobs"] = topk
    stop = params.stop
    if isinstance(stop, str):
        body["stop"] = [stop]
    elif stop is not None:
        if all(isinstance(s, str) for s in stop):
            body["stop"] = stop
        elif all(isinstance(s, int) for s in stop):
            body["stop_token_ids"] = stop
            if not stop:  # the SDK's `stop=[]`: no stop tokens at all, EOS included
                body["ignore_eos"] = True
        else:
            raise SampleRejected("sampling_params.stop mixes strings and token ids")
    # The prompt is kept only when the decoder needs it (prompt logprobs are keyed by token).
    keep = tokens if include or topk else None
    decode = DecodeJob(keep, request.num_samples, topk, include)
    expected = expected_body_bytes(
        request.num_samples, params.max_tokens, len(tokens), topk, include or bool(topk)
    )
    return Job(orjson.dumps(body), decode, expected)


#: A logprobs=1 vLLM body takes ~82 bytes per generated token (token id, logprob, the top-1
#: entry with its decoded text); prompt logprobs ~40 per prompt token plus ~45 per top-k entry.
BYTES_PER_TOKEN = 96
BYTES_PER_PROMPT_TOKEN = 48
BYTES_PER_TOPK_ENTRY = 64
BODY_OVERHEAD = 2048
#: vLLM's completions default when max_tokens is not given.
DEFAULT_MAX_TOKENS = 16


def expected_body_bytes(
    n: int, max_tokens: int | None, prompt_len: int, topk: int, prompt_logprobs: bool
) -> int:
    """An upper estimate of the router's body size, reserved before the request is sent."""
    tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    size = BODY_OVERHEAD + n * (tokens * BYTES_PER_TOKEN + 512)
    if prompt_logprobs:
        size += prompt_len * (BYTES_PER_PROMPT_TOKEN + topk * BYTES_PER_TOPK_ENTRY)
    return size


class BodyBudget:
    """At most `cap` upstream body bytes held at once; FIFO waiters; one body may exceed it alone.

    A forward takes its body's size when the router's answer starts to arrive (its
    Content-Length, or the expected size for an answer without one: `Admission`), settles it to
    the real size once the body is read, and releases it when the proto bytes exist (or the
    forward failed). While the budget is full, further answers wait unread in their sockets
    (TCP flow control holds the router); requests are never kept from being sent by it.
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


class Admission:
    """One forward's hold on the `BodyBudget`: the pool contract's `admit` (awaited between the
    router answer's headers and its body) takes the body's Content-Length, or `expected` when
    the answer has none; a second answer (the retry after a 5xx) first gives the first one's
    share back. `settle` replaces the hold by the size really read; `release` ends it.

    A body is held once while it is read: every pool keeps what it read so far (its chunks, or
    aiohttp's one buffer for a long answer) and makes one `bytes` of it when the last byte
    arrives (a join or a copy, synchronous on the event loop that read it). That second copy
    exists for one body at a time per loop (the server's, each fetch process's) and only while
    it runs, so the bound is the budget plus one body per loop, like the decoded arrays, which
    the budget does not count either."""

    __slots__ = ("budget", "expected", "held", "holding")

    def __init__(self, budget: BodyBudget, expected: int) -> None:
        self.budget, self.expected = budget, expected
        self.held, self.holding = 0, False

    async def __call__(self, status: int, length: int | None) -> None:
        self.release()
        size = self.expected if length is None else length
        await self.budget.acquire(size)
        self.held, self.holding = size, True

    def settle(self, actual: int) -> None:
        if self.holding:
            self.held = self.budget.settle(self.held, actual)

    def release(self) -> None:
        if self.holding:
            self.holding = False
            self.budget.release(self.held)


class ForwardRunner:
    """Runs forwards in background tasks and completes or fails their records."""

    def __init__(
        self,
        *,
        pool: Any,
        decoding: Inline,
        store: FutureStore,
        url: str,
        budget: BodyBudget,
        metrics: Any = None,
    ) -> None:
        self.pool = pool
        #: impl.server.metrics.Metrics, or None with --no-metrics
        self.metrics = metrics
        self.decoding = decoding
        self.store = store
        self.url = url
        self.budget = budget
        self.tasks: set[asyncio.Task[None]] = set()
        self.attempts = 0

    def take_over(self, record: Record, body: bytes, options: str) -> None:
        """Forward a record a shared store took over from a process that went away."""
        self.submit(record, Job.unpack(body, options))

    def submit(self, record: Record, job: Job) -> None:
        task = asyncio.get_running_loop().create_task(self._run(record, job))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, record: Record, job: Job) -> None:
        metrics = self.metrics
        try:
            payload = await self.result(job)
        except UpstreamFailed as exc:
            if metrics is not None:
                metrics.upstream_failure(exc.kind)
            await self._settle(self.store.fail, record, str(exc))
        except asyncio.CancelledError:
            if metrics is not None:
                metrics.upstream_failure("shutdown")
            await self.store.abandon(record, "the server shut down before the sample completed")
            raise
        except Exception as exc:  # a bug: fail the sample, keep serving, log the traceback
            log.exception("forward of %s failed unexpectedly", record.request_id)
            if metrics is not None:
                metrics.upstream_failure("internal")
            message = f"internal server error: {type(exc).__name__}: {exc}"
            await self._settle(self.store.fail, record, message)
        else:
            started = time.perf_counter()
            await self._settle(self.store.complete, record, payload)
            if metrics is not None:
                metrics.store(time.perf_counter() - started)

    async def _settle(self, finish: Any, record: Record, outcome: Any) -> None:
        """Store the outcome, retrying while a shared store is unreachable: a result the
        engine was computing is never dropped because the store blinked. Not logged per
        sample: the store logs the outage once and counts each call it refused."""
        delay = 0.1
        while True:
            try:
                return await finish(record, outcome)
            except StoreUnavailable:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def post(self, body: bytes, admit: Admission | None = None) -> Any:
        """The router's reply; retried once on a connect-phase error or a 5xx."""
        return await upstream.post(self.pool, self.url, body, self._attempt, admit)

    def _attempt(self, attempt: int) -> None:
        self.attempts += 1
        if attempt == 2 and self.metrics is not None:
            self.metrics.retries.inc()

    async def result(self, job: Job) -> bytes:
        """SampleResponse proto bytes for `job`, or UpstreamFailed saying why not.

        The body's bytes are held in the budget from when its headers arrive until the proto
        bytes exist; no reference to the body outlives this call. The decode and encode
        metrics are the time of those two steps wherever they ran (in a decode process: not
        counting the hand-over)."""
        admission = Admission(self.budget, job.expected_bytes)
        try:
            if self.decoding.fetches(job.expected_bytes):
                return await self._fetched(job, admission)
            metrics = self.metrics
            started = time.perf_counter()
            reply = await self.post(job.body, admission)
            if metrics is not None:
                metrics.upstream_wait(time.perf_counter() - started)
            admission.settle(len(reply.body))
            body = upstream.body_of(reply)
            del reply
            payload, decode_seconds, encode_seconds = await self.decoding.to_proto(body, job.decode)
            if metrics is not None:
                metrics.decode(decode_seconds)
                metrics.encode(encode_seconds)
            return payload
        finally:
            admission.release()

    async def _fetched(self, job: Job, admission: Admission) -> bytes:
        """`result` through a fetch process: the body never enters this process; the fetch
        process asks for the budget when the answer's headers arrive (`admission`), and the
        hold ends when it answers."""
        metrics = self.metrics
        got = await self.decoding.fetch(self.url, job.body, job.decode, admission)
        admission.settle(got.body_bytes)
        self.attempts += got.attempts
        replied = got.failure is None or got.failure.kind not in ("connect", "read")
        if metrics is not None:
            if got.attempts == 2:
                metrics.retries.inc()
            if replied:  # as on the loop: the wait of a request the router answered
                metrics.upstream_wait(got.upstream_seconds)
        if got.failure is not None:
            raise got.failure
        if metrics is not None:
            metrics.decode(got.decode_seconds)
            metrics.encode(got.encode_seconds)
        return got.payload

    async def aclose(self) -> None:
        self.decoding.closing = True
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.decoding.aclose()
        await self.pool.aclose()
