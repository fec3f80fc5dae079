"""The HTTP calls a load-client process makes, each with the Tinker SDK 0.38's retries.

`SdkCalls` is a mixin of `impl.harness.client.sdk_shaped.ClientProcess` (it reads the client
process's config, session, counters and session poller): `_call` for the session set-up calls,
`_submit` for asample (408/409/5xx/connection errors retried with backoff and the SAME seq_id;
429 backed off without counting against the tries), `_poll` for retrieve_future (re-polled at once
on try_again/408, fetched again after a `complete_metadata` answer; 5xx/429/connection
errors/timeouts retried with backoff; 404 fatal; 410 raises `Resubmit`), `_wait_and_fetch` to
wait for a sample by its own poll or through the session poller. Every request is counted by
path.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import aiohttp

from impl.harness.client.config import (
    STORE_UNAVAILABLE,
    ClientConfig,
    Failure,
    prompt_for,
    store_unavailable,
)
from impl.harness.client.session_poll import PollerFailed, SessionPoller

try:
    import orjson

    dumps, loads = orjson.dumps, orjson.loads
except ImportError:  # pragma: no cover - orjson is in the server extra
    import json

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    loads = json.loads

PROTO = "application/x-protobuf"


class Resubmit(Exception):
    """410 from retrieve_future: the promise is gone, submit the sample again."""


class SdkCalls:
    """The client process's HTTP calls (a mixin: the state lives on the client process)."""

    config: ClientConfig
    session: aiohttp.ClientSession
    sampling_session_id: str
    requests: Counter[str]
    retries: Counter[str]
    examples: dict[str, str]
    poller: SessionPoller | None
    _fetch_gate: asyncio.Semaphore
    _headers: dict[str, dict[str, str]]
    _timeouts: dict[float, aiohttp.ClientTimeout]
    _rng: random.Random

    # -- HTTP -------------------------------------------------------------------------------
    async def _post(
        self, path: str, payload: Any, *, timeout: float = 60.0, accept: str = ""
    ) -> tuple[int, str, bytes]:
        self.requests[path] += 1
        headers = self._headers[accept]
        limits = self._timeouts.get(timeout)
        if limits is None:
            limits = self._timeouts[timeout] = aiohttp.ClientTimeout(total=timeout, sock_connect=60)
        async with self.session.post(
            self.config.url + path, data=dumps(payload), headers=headers, timeout=limits
        ) as response:
            return response.status, response.content_type, await response.read()

    async def _backoff(self, attempt: int) -> None:
        delay = min(self.config.backoff_base * 2**attempt, self.config.backoff_cap)
        await asyncio.sleep(delay * (0.5 + self._rng.random() / 2))

    async def _call(self, path: str, payload: Any) -> dict[str, Any]:
        """A session call with the SDK's retries; raises Failure when it cannot succeed."""
        for attempt in range(self.config.tries):
            try:
                status, _, body = await self._post(path, payload)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                kind, last = "session", f"{path}: {type(exc).__name__}: {exc}"
                self.retries["session_connection"] += 1
            else:
                if status == 200:
                    return loads(body)
                last = f"{path}: HTTP {status}: {body[:200]!r}"
                if not (status in (408, 409, 429) or status >= 500):
                    raise Failure(f"http_{status}", last)
                kind = STORE_UNAVAILABLE if store_unavailable(status, body) else "session"
                self.retries[kind if kind == STORE_UNAVAILABLE else f"session_{status}"] += 1
            await self._backoff(attempt)
        raise Failure(kind, last)

    # -- one sample -------------------------------------------------------------------------
    async def _submit(self, index: int, seq_id: int) -> str:
        config = self.config
        prompt, seed = prompt_for(index, config)
        payload = {
            "sampling_session_id": self.sampling_session_id,
            "seq_id": seq_id,
            "num_samples": config.num_samples,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": prompt}]},
            "sampling_params": {"max_tokens": config.max_tokens, "temperature": 1.0, "seed": seed},
            "prompt_logprobs": False,
            "topk_prompt_logprobs": 0,
        }
        attempt = 0
        while True:
            try:
                status, _, body = await self._post("/api/v1/asample", payload)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                kind, last = "asample_connection", f"{type(exc).__name__}: {exc}"
            else:
                if status == 200:
                    reply = loads(body)
                    ids = reply.get("sample_sequence_ids")
                    if not isinstance(ids, list) or len(ids) != config.num_samples:
                        raise Failure("bad_response", f"asample sample_sequence_ids={ids!r}")
                    return reply["request_id"]
                last = f"HTTP {status}: {body[:200]!r}"
                if status == 429:  # backpressure: the SDK backs off without a retry budget
                    self.retries["asample_429"] += 1
                    await self._backoff(min(attempt, 3))
                    continue
                if not (status in (408, 409) or status >= 500):
                    raise Failure(f"http_{status}", f"asample {last}")
                kind = STORE_UNAVAILABLE if store_unavailable(status, body) else f"asample_{status}"
            self.retries[kind] += 1
            self.examples.setdefault(f"retry:{kind}", last[:300])
            attempt += 1
            if attempt >= config.tries:
                raise Failure(kind, f"asample after {attempt} tries: {last}")
            await self._backoff(attempt - 1)

    async def _poll(self, request_id: str, *, metadata_first: bool = True) -> bytes:
        payload = {"request_id": request_id, "allow_metadata_only": metadata_first}
        errors = bad_requests = 0
        while True:
            try:
                status, ctype, body = await self._post(
                    "/api/v1/retrieve_future",
                    payload,
                    timeout=self.config.poll_timeout,
                    accept=PROTO,
                )
            except TimeoutError:
                kind, last = "poll_timeout", f"no answer within {self.config.poll_timeout} s"
            except (aiohttp.ClientError, OSError) as exc:
                kind, last = "poll_connection", f"{type(exc).__name__}: {exc}"
            else:
                if status == 200:
                    if ctype == PROTO:
                        return body
                    try:
                        reply = loads(body)
                    except ValueError:
                        raise Failure(
                            "bad_response", f"poll answered {ctype}: {body[:200]!r}"
                        ) from None
                    if isinstance(reply, dict) and reply.get("type") == "try_again":
                        self.retries["poll_try_again"] += 1
                        errors = 0
                        continue
                    if isinstance(reply, dict) and reply.get("status") == "complete_metadata":
                        if not payload["allow_metadata_only"]:
                            raise Failure("bad_response", "complete_metadata twice")
                        self.retries["poll_metadata_first"] += 1
                        payload = {"request_id": request_id, "allow_metadata_only": False}
                        continue
                    if isinstance(reply, dict) and "error" in reply:
                        category = reply.get("category", "unknown")
                        raise Failure(f"sample_error_{category}", str(reply["error"])[:300])
                    raise Failure("bad_response", f"poll answered {ctype}: {body[:200]!r}")
                last = f"HTTP {status}: {body[:200]!r}"
                if status == 408:
                    self.retries["poll_try_again"] += 1
                    continue
                if status == 404:
                    raise Failure("lost", f"retrieve_future {request_id}: {last}")
                if status == 410:
                    raise Resubmit
                if status == 400 and bad_requests < 3:
                    bad_requests += 1
                    self.retries["poll_400"] += 1
                    continue
                if not (status == 429 or status >= 500):
                    raise Failure(f"http_{status}", f"retrieve_future {last}")
                kind = STORE_UNAVAILABLE if store_unavailable(status, body) else f"poll_{status}"
            self.retries[kind] += 1
            self.examples.setdefault(f"retry:{kind}", last[:300])
            errors += 1
            if errors >= self.config.tries:
                raise Failure(kind, f"retrieve_future after {errors} tries: {last}")
            await self._backoff(errors - 1)

    async def _wait_and_fetch(self, request_id: str) -> bytes:
        """The result's bytes: polled per request, or reported by the session poller and then
        fetched once (without a metadata round when the poller gave the size)."""
        if self.poller is None:
            return await self._poll(request_id)
        try:
            completion = await self.poller.wait_for(request_id)
        except PollerFailed as exc:
            raise Failure("session_poll", str(exc)[:300]) from None
        sized = bool(completion.get("response_payload_uncompressed_size"))
        try:
            async with self._fetch_gate:
                return await self._poll(request_id, metadata_first=not sized)
        finally:
            self.poller.mark_retrieved(request_id)
