"""The load client's session poller: one `retrieve_futures` long-poll loop per sampling session,
as the Tinker SDK 0.38 runs it (`tinker/lib/session_futures_poller.py`) when client/config says
`sample_use_retrieve_futures`.

Each sample registers a waiter for its request id; the loop polls with the cursor of the previous
answer and the ids fetched since (acks), wakes the waiters of the completions it is told about,
and idles while nothing is waited for and nothing is left to report (a poll with no waiter asks
`timeout: 0`, an ack-only poll). Errors as the SDK treats them: connection errors, timeouts,
408/409/429/5xx are retried after 1 s (the server's 503 while its shared store is away is
counted as `store_unavailable`); a 400 three times; anything else (404 unknown session,
410 unknown cursor, ...) ends the poller and fails every current and later waiter.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from impl.harness.client.config import STORE_UNAVAILABLE, store_unavailable

PATH = "/api/v1/retrieve_futures"
#: client timeouts: an ack-only poll is answered at once; a long poll is held up to the
#: server's --poll-hold
ACK_TIMEOUT, POLL_TIMEOUT = 5.0, 45.0
_BAD_REQUEST_TRIES = 3

Post = Callable[..., Awaitable[tuple[int, str, bytes]]]


class PollerFailed(Exception):
    """The poller met a non-retryable answer; every waiter gets this message."""


class SessionPoller:
    """One sampling session's poller (create it on the client process's event loop)."""

    def __init__(
        self,
        post: Post,
        loads: Callable[[bytes], Any],
        sampling_session_id: str,
        retries: Counter[str],
        *,
        poll_timeout: float = POLL_TIMEOUT,
        cloned_sampler_id: int = 0,
    ) -> None:
        self._post = post
        self._loads = loads
        self._retries = retries
        self._poll_timeout = poll_timeout
        self._target = {
            "type": "sampling_session",
            "sampling_session_id": sampling_session_id,
            "cloned_sampler_id": cloned_sampler_id,
        }
        self.cursor = 0
        self.acked_cursor = 0
        self.waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.completions: dict[str, dict[str, Any]] = {}
        self.retrieved: set[str] = set()
        self.failure: str | None = None
        self._has_work = asyncio.Event()
        self._task = asyncio.create_task(self._loop())

    async def wait_for(self, request_id: str) -> dict[str, Any]:
        """The completion (`{"state", "request_id", ...}`) of `request_id`, once reported."""
        completion = self.completions.pop(request_id, None)
        if completion is not None:
            return completion
        if self.failure is not None:
            raise PollerFailed(self.failure)
        waiter = asyncio.get_running_loop().create_future()
        self.waiters[request_id] = waiter
        self._has_work.set()
        try:
            return await waiter
        finally:
            self.waiters.pop(request_id, None)

    def mark_retrieved(self, request_id: str) -> None:
        """Acknowledge `request_id` on the next poll."""
        self.retrieved.add(request_id)
        self._has_work.set()

    async def close(self) -> None:
        """Stop the loop after one last ack-only poll for anything not yet reported."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        if self.failure is None and (self.retrieved or self.cursor > self.acked_cursor):
            try:
                await self._once(ack_only=True)
            except (TimeoutError, aiohttp.ClientError, OSError, PollerFailed, _Retry):
                self._retries["session_poll_final_ack_error"] += 1

    def _fail(self, message: str) -> None:
        self.failure = message
        for waiter in self.waiters.values():
            if not waiter.done():
                waiter.set_exception(PollerFailed(message))

    async def _loop(self) -> None:
        bad_requests = 0
        while True:
            if not self.waiters and not self.retrieved and self.cursor <= self.acked_cursor:
                self._has_work.clear()
                await self._has_work.wait()
            try:
                await self._once(ack_only=not self.waiters)
                bad_requests = 0
            except (TimeoutError, aiohttp.ClientError, OSError):
                self._retries["session_poll_connection"] += 1
                await asyncio.sleep(1)
            except _Retry as retry:
                self._retries[retry.kind] += 1
                if retry.status == 400:
                    if bad_requests >= _BAD_REQUEST_TRIES:
                        self._fail(f"retrieve_futures: HTTP 400 {_BAD_REQUEST_TRIES + 1} times")
                        return
                    bad_requests += 1
                await asyncio.sleep(1)
            except PollerFailed as exc:
                self._fail(str(exc))
                return

    async def _once(self, *, ack_only: bool) -> None:
        retrieved = sorted(self.retrieved)
        payload: dict[str, Any] = {
            "target": self._target,
            "prev_cursor": self.cursor,
            "retrieved_request_ids": retrieved,
        }
        if ack_only:
            payload["timeout"] = 0
        status, _, body = await self._post(
            PATH, payload, timeout=ACK_TIMEOUT if ack_only else self._poll_timeout
        )
        if status != 200:
            if status in (400, 408, 409, 429) or status >= 500:
                raise _Retry(status, body)
            raise PollerFailed(f"retrieve_futures: HTTP {status}: {body[:200]!r}")
        try:
            reply = self._loads(body)
            cursor, completions = reply["cursor"], reply["completions"]
        except (ValueError, KeyError, TypeError):
            raise PollerFailed(f"retrieve_futures: unexpected answer {body[:200]!r}") from None
        self.retrieved.difference_update(retrieved)
        self.acked_cursor = max(self.acked_cursor, payload["prev_cursor"])
        self.cursor = cursor
        for completion in completions:
            waiter = self.waiters.pop(completion["request_id"], None)
            if waiter is None:
                self.completions[completion["request_id"]] = completion
            elif not waiter.done():
                waiter.set_result(completion)


class _Retry(Exception):
    """A retryable answer; `kind` is how its retry is counted (the store's 503 by its name)."""

    def __init__(self, status: int, body: bytes = b"") -> None:
        super().__init__(status)
        self.status = status
        unavailable = store_unavailable(status, body)
        self.kind = STORE_UNAVAILABLE if unavailable else f"session_poll_{status}"
