"""One load-client process: drives a Tinker-compatible server over HTTP exactly as the SDK does.

Per client process: client/config, create_session, create_sampling_session, then `lanes` (the
cap on outstanding samples) each taking the next request index: `asample` under a semaphore of
concurrent dispatches, then `retrieve_future` polls with `Accept: application/x-protobuf` and a
45 s client timeout, re-polling at once on try_again/408. Retries follow the SDK 0.38: asample
on 408/409/5xx/connection errors with backoff and the SAME seq_id, 429 with backoff (not counted
against the tries, bounded by the run's deadline); polls on 5xx/429/connection errors/timeouts
with backoff; 404 is fatal (the server lost the result); 410 resubmits. Polls set
`allow_metadata_only` like the SDK and fetch again after a `complete_metadata` answer.

`poll` picks how a sample waits: `request` holds a `retrieve_future` poll (one connection) per
sample; `session` runs one `retrieve_futures` poller per client process
(`impl.harness.client.session_poll`), each sample waits for its completion to be reported, then
fetches its payload once (at most `concurrency` fetches at once per client process, like submits);
`auto` does what the SDK does: session when client/config says `sample_use_retrieve_futures`.
Every HTTP request is counted by path (`requests` in the result). Every result is parsed from
the SampleResponse wire bytes and checked: one sequence per sample, `max_tokens` tokens (choice
0; others may stop early on EOS), logprobs as long as tokens, and with `verify="exact"` the very
tokens the router's body kind makes for the (prompt, seed)
(`impl.workloads.realtext.generated_tokens`).

What a client process is told (`ClientConfig`), the prompt of each request index, how a
SampleResponse is read and what a failed sample is are `impl.harness.client.config`.

The HTTP calls themselves, each with the SDK's retries, are `impl.harness.client.calls`.

The aiohttp connector binds the client process's own 127.0.0.x source address, so several
client processes do not share one address's ephemeral ports.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

import aiohttp
import numpy as np

from impl.harness.client.calls import PROTO, Resubmit, SdkCalls, loads
from impl.harness.client.config import ClientConfig, Failure, parse_sample_response, prompt_for
from impl.harness.client.session_poll import SessionPoller


class ClientProcess(SdkCalls):
    """One client process's run: counters the parent process reads, and the sessions."""

    def __init__(self, config: ClientConfig, progress: Any = None, go: Any = None) -> None:
        self.config = config
        self.progress = progress  # a shared array [completed, failed, ready] or None
        self.go = go  # an Event the parent sets when every client process is ready
        self.completed = 0
        self.failed: Counter[str] = Counter()
        self.retries: Counter[str] = Counter()
        self.requests: Counter[str] = Counter()  # HTTP requests sent, by path
        self.poller: SessionPoller | None = None
        self.examples: dict[str, str] = {}
        self.latencies: list[float] = []
        self.result_bytes = 0
        self.tokens = 0
        self._expected: dict[int, list[np.ndarray]] = {}
        self._seq = 0
        self.warmup: dict[str, Any] = {}
        self._rng = random.Random(config.seed * 7 + config.indices[0])
        base = {"X-API-Key": config.api_key, "Content-Type": "application/json"}
        self._headers = {"": base, PROTO: {**base, "Accept": PROTO}}
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    def _check(self, index: int, data: bytes) -> None:
        config = self.config
        try:
            sequences = parse_sample_response(data)
        except (ValueError, IndexError) as exc:
            raise Failure(
                "bad_response", f"unparseable SampleResponse ({len(data)} B): {exc}"
            ) from None
        if len(sequences) != config.num_samples:
            raise Failure("wrong_result", f"{len(sequences)} sequences, asked {config.num_samples}")
        expected = self._expected_tokens(index) if config.verify == "exact" else None
        for k, (_, tokens, logprobs) in enumerate(sequences):
            if (k == 0 and len(tokens) != config.max_tokens) or len(tokens) > config.max_tokens:
                raise Failure(
                    "wrong_result", f"sequence {k}: {len(tokens)} tokens, asked {config.max_tokens}"
                )
            if logprobs is not None and len(logprobs) != len(tokens):
                raise Failure(
                    "wrong_result",
                    f"sequence {k}: {len(logprobs)} logprobs for {len(tokens)} tokens",
                )
            if expected is not None and not np.array_equal(tokens, expected[k]):
                raise Failure(
                    "wrong_result", f"sequence {k}: tokens differ from what the router generated"
                )
            self.tokens += len(tokens)

    def _expected_tokens(self, index: int) -> list[np.ndarray]:
        config = self.config
        p = index % max(config.distinct_prompts, 1)
        if p not in self._expected:
            from impl.workloads.realtext import generated_tokens

            prompt, seed = prompt_for(index, config)
            self._expected[p] = generated_tokens(
                config.router_body, prompt, n=config.num_samples, max_tokens=config.max_tokens,
                seed=seed,
            )  # fmt: skip
        return self._expected[p]

    async def one(self, index: int) -> None:
        started = time.monotonic()
        try:
            while True:
                self._seq += 1
                request_id = await self._submit(index, self._seq)
                try:
                    data = await self._wait_and_fetch(request_id)
                    break
                except Resubmit:
                    self.retries["resubmit_410"] += 1
            self._check(index, data)
        except Failure as failure:
            self._record_failure(failure)
            return
        self._record_success(started, len(data))

    def _record_failure(self, failure: Failure) -> None:
        """Count a sample that failed, by class, with one example message per class."""
        self.failed[failure.kind] += 1
        self.examples.setdefault(failure.kind, failure.message[:300])
        if self.progress is not None:
            self.progress[1] += 1

    def _record_success(self, started: float, size: int) -> None:
        """Count a checked result: its latency since `started` and its size in bytes."""
        self.latencies.append(time.monotonic() - started)
        self.result_bytes += size
        self.completed += 1
        if self.progress is not None:
            self.progress[0] += 1

    async def warm_up(self, indices: range) -> None:
        """Sample each distinct prompt `warmup` times, then forget it: the router renders and
        caches its bodies and every process warms its code paths outside the measured run."""
        config = self.config
        firsts = indices[: max(config.distinct_prompts, 1)]
        warm = [i for i in firsts for _ in range(config.warmup)]
        if not warm:
            return
        gate = asyncio.Semaphore(max(1, min(config.max_outstanding, 64)))

        async def gated(index: int) -> None:
            async with gate:
                await self.one(index)

        await asyncio.gather(*(gated(i) for i in warm))
        self.warmup = {"completed": self.completed, "failed": dict(self.failed)}
        self.completed, self.result_bytes, self.tokens = 0, 0, 0
        self.failed.clear()
        self.retries.clear()
        self.requests.clear()
        self.examples.clear()
        self.latencies.clear()
        if self.progress is not None:
            self.progress[0] = self.progress[1] = 0

    # -- the run ----------------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        config = self.config
        indices = range(*config.indices)
        local = (config.source_address, 0) if config.source_address else None
        connector = aiohttp.TCPConnector(
            limit=0,
            local_addr=local,
            keepalive_timeout=75.0,
            happy_eyeballs_delay=None,
            ttl_dns_cache=None,
        )
        started = time.monotonic()
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
            self.session = session
            try:
                flags = await self._call("/api/v1/client/config", {"sdk_version": "0.38.0"})
                session_id = (
                    await self._call(
                        "/api/v1/create_session",
                        {
                            "tags": [],
                            "user_metadata": None,
                            "sdk_version": "0.38.0",
                            "type": "create_session",
                        },
                    )
                )["session_id"]
                self.sampling_session_id = (
                    await self._call(
                        "/api/v1/create_sampling_session",
                        {
                            "session_id": session_id,
                            "sampling_session_seq_id": 0,
                            "base_model": config.base_model,
                        },
                    )
                )["sampling_session_id"]
            except Failure as failure:
                self.failed[failure.kind] += len(indices)
                self.examples.setdefault(failure.kind, failure.message[:300])
                if self.progress is not None:
                    self.progress[1], self.progress[2] = len(indices), 1
                return self.result(time.monotonic() - started)
            if config.poll == "session" or (
                config.poll == "auto" and flags.get("sample_use_retrieve_futures")
            ):
                # A poll answer can report thousands of completions at once; their fetches
                # share `concurrency` like submits do, not one new connection each.
                self._fetch_gate = asyncio.Semaphore(max(config.concurrency, 1))
                self.poller = SessionPoller(
                    self._post,
                    loads,
                    self.sampling_session_id,
                    self.retries,
                    poll_timeout=config.poll_timeout,
                )
            await self.warm_up(indices)
            if self.progress is not None:
                self.progress[2] = 1
            while self.go is not None and not self.go.is_set():
                await asyncio.sleep(0.01)
            started, cpu_started = time.monotonic(), time.process_time()
            heartbeat = asyncio.create_task(self._heartbeat(session_id))
            submit_gate = asyncio.Semaphore(max(config.concurrency, 1))
            self._submit = _gated(self._submit, submit_gate)
            pending = iter(indices)

            async def lane() -> None:
                for index in pending:
                    await self.one(index)

            lanes = [
                asyncio.create_task(lane())
                for _ in range(min(config.max_outstanding, len(indices)))
            ]
            done, not_done = await asyncio.wait(lanes, timeout=config.timeout)
            for task in not_done:
                task.cancel()
            await asyncio.gather(*not_done, return_exceptions=True)
            for task in done:
                if task.exception() is not None:
                    self.failed["client_error"] += 1
                    self.examples.setdefault("client_error", repr(task.exception())[:300])
            heartbeat.cancel()
            if self.poller is not None:
                await self.poller.close()
            unfinished = len(indices) - self.completed - sum(self.failed.values())
            if unfinished > 0:
                self.failed["unfinished"] += unfinished
                self.examples.setdefault("unfinished", "not done when the run's deadline passed")
            wall = time.monotonic() - started
        return self.result(wall, time.process_time() - cpu_started)

    async def _heartbeat(self, session_id: str) -> None:
        while True:
            await asyncio.sleep(10)
            try:
                await self._post(
                    "/api/v1/session_heartbeat", {"session_id": session_id}, timeout=10
                )
            except (TimeoutError, aiohttp.ClientError, OSError):
                self.retries["heartbeat_error"] += 1

    def result(self, wall: float, cpu: float = 0.0) -> dict[str, Any]:
        return {
            "warmup": self.warmup,
            "cpu_seconds": cpu,
            "completed": self.completed,
            "failed": dict(self.failed),
            "retries": dict(self.retries),
            "requests": dict(self.requests),
            "poll": "request" if self.poller is None else "session",
            "examples": self.examples,
            "latencies": self.latencies,
            "result_bytes": self.result_bytes,
            "tokens": self.tokens,
            "wall_seconds": wall,
        }


def _gated(fn, gate: asyncio.Semaphore):
    async def wrapper(*args: Any) -> Any:
        async with gate:
            return await fn(*args)

    return wrapper


def run_client_process(
    config: ClientConfig, progress: Any = None, go: Any = None
) -> dict[str, Any]:
    """Entry point of a client process (or inline): run to completion or the timeout."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(ClientProcess(config, progress, go).run())
    return uvloop.run(ClientProcess(config, progress, go).run())
