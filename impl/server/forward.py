"""Forwarding: one asample -> one POST to `{router}/v1/completions`, decoded once, encoded once.

`build_request` turns a validated `AsampleRequest` into the router's JSON (prompt token ids,
`logprobs: 1` as an integer, `return_token_ids: true`, prompt_logprobs when asked, stop strings
or stop token ids). `Forwarder.submit` runs the forward in a background task: the picked pool
posts it; a connect-phase error or a 5xx is retried once, a failure after the request was sent
is final (the engine may still be generating, a retry would generate twice). The reply is
decoded by the picked decoder and encoded to SampleResponse proto bytes by the picked encoder,
and the store completes or fails the record with a message saying what went wrong.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

import orjson

from impl.decode import Completion, DecodeError
from impl.pool import ConnectError, ReadError
from impl.server.schemas import AsampleRequest
from impl.server.store import FutureStore, Record, StoreUnavailable

log = logging.getLogger("hotpath.server")

_HEADERS = {"Content-Type": "application/json"}
_QUOTE = 200


class SampleRejected(ValueError):
    """The request is valid JSON of the right shape but cannot be forwarded (a 422)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Job:
    """What a forward needs (the request body lives here, never in the store)."""

    body: bytes
    prompt_tokens: list[int] | None
    n: int
    topk: int
    include_prompt_logprobs: bool


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
    return Job(orjson.dumps(body), keep, request.num_samples, topk, include)


def _quote(body: bytes) -> str:
    text = body[:_QUOTE].decode("utf-8", "replace")
    return repr(text) + ("…" if len(body) > _QUOTE else "")


class UpstreamFailed(Exception):
    """The sample cannot complete; the message is what retrieve_future reports, `kind` its
    class in the metrics (connect, read, http_5xx, http_status, decode, choices)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class Forwarder:
    """Runs forwards in background tasks and completes or fails their records."""

    def __init__(
        self,
        *,
        pool: Any,
        decoder: Any,
        encoder: Any,
        store: FutureStore,
        url: str,
        metrics: Any = None,
    ):
        self.pool = pool
        #: impl.server.metrics.Metrics, or None with --no-metrics
        self.metrics = metrics
        self.decoder = decoder
        self.encoder = encoder
        self.store = store
        self.url = url
        self.tasks: set[asyncio.Task[None]] = set()
        self.attempts = 0

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
        engine was computing is never dropped because the store blinked."""
        delay = 0.1
        while True:
            try:
                return await finish(record, outcome)
            except StoreUnavailable as exc:
                log.warning("storing %s waits for the store: %s", record.request_id, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def post(self, body: bytes) -> Any:
        """The router's reply; retried once on a connect-phase error or a 5xx."""
        for attempt in (1, 2):
            self.attempts += 1
            if attempt == 2 and self.metrics is not None:
                self.metrics.retries.inc()
            try:
                reply = await self.pool.post(self.url, body, _HEADERS)
            except ConnectError as exc:
                if attempt == 2:
                    raise UpstreamFailed(
                        f"could not connect to the router at {self.url} (tried twice): {exc}",
                        "connect",
                    ) from None
                continue
            except ReadError as exc:
                raise UpstreamFailed(
                    f"the router connection failed after the request was sent ({exc}); "
                    "not retried: the engine may still be generating",
                    "read",
                ) from None
            if reply.status >= 500 and attempt == 1:
                continue
            return reply
        raise AssertionError("unreachable")

    async def result(self, job: Job) -> bytes:
        """SampleResponse proto bytes for `job`, or UpstreamFailed saying why not."""
        metrics = self.metrics
        started = time.perf_counter()
        reply = await self.post(job.body)
        if metrics is not None:
            posted = time.perf_counter()
            metrics.upstream_wait(posted - started)
        if reply.status != 200:
            again = " (after one retry)" if reply.status >= 500 else ""
            raise UpstreamFailed(
                f"the router answered HTTP {reply.status}{again}: {_quote(reply.body)}",
                "http_5xx" if reply.status >= 500 else "http_status",
            )
        try:
            completion: Completion = self.decoder.decode(
                reply.body, prompt_tokens=job.prompt_tokens, topk_prompt_logprobs=job.topk
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
        if metrics is None:
            return self.encoder.encode(completion)
        decoded = time.perf_counter()
        metrics.decode(decoded - posted)
        payload = self.encoder.encode(completion)
        metrics.encode(time.perf_counter() - decoded)
        return payload

    async def aclose(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.pool.aclose()
