"""Forwarding: one asample -> one POST to `{router}/v1/completions`, decoded once, encoded once.

`ForwardRunner.submit` runs a forward (`impl.server.job.Job`, made by `build_request`) in a
background task (the pool's object that posts is the pool contract's `Forwarder`; this is the
server's runner of forwards). The picked decode design (`impl.server.offloop`: inline, threads,
decode or fetch processes) is handed the request (`Decoding.sample`): on the loop the picked
pool posts it at once (the requests at the engine are bounded by the pool's connections,
`--upstream-connections`), with the `fetch` design a fetch process does, and only the
SampleResponse bytes reach this process. When the answer's headers arrive, the forward's
`Admission` takes the body's size from the `BodyBudget` (`impl.server.budget`) before the body
is read; a connect-phase error or a 5xx is retried once, a failure after the request was sent
is final (the engine may still be generating, a retry would generate twice;
`impl.server.upstream`). The store completes or fails the record with a message saying what
went wrong; the forward counts the upstream wait, the decode and encode times and the retries.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from impl.server import upstream
from impl.server.budget import Admission, BodyBudget
from impl.server.job import Job
from impl.server.offloop.decoding import Call, Decoding
from impl.server.store import FutureStore, Record, StoreUnavailable
from impl.server.upstream import UpstreamFailed

log = logging.getLogger("hotpath.server")


class ForwardRunner:
    """Runs forwards in background tasks and completes or fails their records."""

    def __init__(
        self,
        *,
        pool: Any,
        decoding: Decoding,
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
        counting the hand-over); the upstream wait is counted for every request the router
        answered."""
        admission = Admission(self.budget, job.expected_bytes)
        call = Call(self.url, job.body, job.decode, job.expected_bytes, admission, self.post)
        try:
            got = await self.decoding.sample(call)
            admission.settle(got.body_bytes)
            self.attempts += got.attempts
            failure = got.failure
            kind = getattr(failure, "kind", None)
            replied = failure is None or kind not in ("connect", "read")
            metrics = self.metrics
            if metrics is not None:
                if got.attempts == 2:
                    metrics.retries.inc()
                if replied:
                    metrics.upstream_wait(got.upstream_seconds)
            if failure is not None:
                raise failure
            if metrics is not None:
                metrics.decode(got.decode_seconds)
                metrics.encode(got.encode_seconds)
            return got.payload
        finally:
            admission.release()

    async def aclose(self) -> None:
        self.decoding.closing = True
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.decoding.aclose()
        await self.pool.aclose()
