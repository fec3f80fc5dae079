"""What the fake router answers with: request checks, rendered vLLM bodies, filler bodies.

`Bodies.key` reads a completion request as the router does (400 for malformed JSON, 422 for a
bad field, 400 in vLLM's error shape for a packed request vLLM refuses) and reduces it to a
16-byte digest of (prompt, n, max_tokens, seed, prompt_logprobs, packed); `Bodies.get`
renders the body for it once (in a thread, however many ask at once;
`impl.workloads.realtext.answer` makes the body of the router's `--body` and `--render`)
and keeps it in an LRU cache within a byte budget.
`filler_body` is the `--body-bytes N` answer: exactly N bytes of valid JSON.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from functools import cache
from typing import Any

import numpy as np

from impl.harness.router.stats import Stats
from impl.workloads import packed

try:
    import orjson

    _loads, _JSONError = orjson.loads, orjson.JSONDecodeError
except ImportError:  # pragma: no cover - orjson is in the server extra
    import json

    _loads, _JSONError = json.loads, json.JSONDecodeError


@cache
def filler_body(size: int) -> bytes:
    """Exactly `size` bytes of valid JSON (an object with one padded string; empty for 0)."""
    if size <= 0:
        return b""
    if size < 12:
        return b"0" + b" " * (size - 1)
    head = b'{"filler":"'
    return head + b"x" * (size - len(head) - 2) + b'"}'


class BadRequest(Exception):
    def __init__(self, status: int, text: str, content_type: str = "text/plain") -> None:
        super().__init__(text)
        self.status, self.text, self.content_type = status, text, content_type


def _packed_refusal(message: str) -> BadRequest:
    return BadRequest(400, packed.error_body(message).decode(), "application/json")


def _digest(prompt: list[int], params: tuple) -> bytes:
    """16 bytes that stand for (prompt, params) in the cache: hashing and comparing a cache key
    then costs the same for a 25M-token prompt as for a 4-token one."""
    try:
        tokens = np.asarray(prompt, dtype=np.int64).tobytes()
    except OverflowError:  # ids beyond int64: rare, slower, still exact
        tokens = repr(prompt).encode()
    hasher = hashlib.blake2b(tokens, digest_size=16)
    hasher.update(repr(params).encode())
    return hasher.digest()


class Bodies:
    """Rendered completion bodies, cached by a digest of the request (LRU within a byte
    budget). The digest, not the prompt, is the key: a huge prompt is hashed once per request
    and held by no cache entry."""

    def __init__(
        self,
        kind: str,
        budget_bytes: int,
        stats: Stats,
        render: str = "json",
        refuse_packed: bool = False,
    ) -> None:
        self.kind, self.render, self.budget, self.stats = kind, render, budget_bytes, stats
        self.refuse_packed = refuse_packed
        self._cache: OrderedDict[bytes, Any] = OrderedDict()
        self._bytes = 0

    def key(self, payload: bytes) -> tuple:
        """(digest, prompt, n, max_tokens, seed, prompt_logprobs, packed) of a request, or
        BadRequest. `packed` is True when the answer is the packed rendering: the router
        renders `packed` and the request asks for it (and qualifies, as vLLM checks); a router
        of another rendering ignores the field, as a vLLM without it does, unless it
        `refuse_packed`s (then 400, vLLM's error)."""
        try:
            request = _loads(payload)
        except (_JSONError, UnicodeDecodeError):
            raise BadRequest(400, "malformed JSON in request body") from None
        if not isinstance(request, dict):
            raise BadRequest(400, "request body must be a JSON object")
        prompt = request.get("prompt")
        if not isinstance(prompt, list) or not all(type(t) is int for t in prompt):
            raise BadRequest(422, "prompt: a list of token ids is required")
        if isinstance(request.get("logprobs"), bool):
            raise BadRequest(422, "logprobs: Input should be a valid integer, got a boolean")
        n, max_tokens = request.get("n", 1), request.get("max_tokens", 16)
        plp = request.get("prompt_logprobs")
        if type(n) is not int or n < 1 or type(max_tokens) is not int or max_tokens < 0:
            raise BadRequest(422, "n must be >= 1 and max_tokens >= 0 (integers)")
        if plp is not None and (type(plp) is not int or plp < 0):
            raise BadRequest(422, "prompt_logprobs must be a non-negative integer")
        seed = request.get("seed")
        wants = packed.wants_packed(request)
        if wants and self.refuse_packed:
            raise _packed_refusal("packed_top_logprobs is not supported by this server")
        if wants and self.render == "packed":
            reason = packed.request_error(request)
            if reason is not None:
                raise _packed_refusal(reason)
        params = (n, max_tokens, 0 if seed is None else int(seed), plp, wants)
        return (_digest(prompt, params), prompt, *params)

    def packs(self, request: tuple) -> bool:
        """Whether the answer to `request` (from `key`) is the packed rendering."""
        return self.render == "packed" and request[-1]

    async def get(self, request: tuple) -> bytes:
        """The body for `request` (from `key`): cached, or rendered once (in a thread) however
        many ask at once."""
        key = request[0]
        entry = self._cache.get(key)
        if isinstance(entry, bytes):
            self._cache.move_to_end(key)
            return entry
        if entry is None:  # a client that goes away does not cancel the shared render
            entry = self._cache[key] = asyncio.ensure_future(self._fill(key, request[1:]))
        return await asyncio.shield(entry)

    async def _fill(self, key: bytes, request: tuple) -> bytes:
        try:
            loop = asyncio.get_running_loop()
            body = await loop.run_in_executor(None, self._render, request)
        except BaseException:
            self._cache.pop(key, None)
            raise
        self._cache[key] = body
        self._bytes += len(body)
        self.stats.add("rendered")
        for old_key in [k for k, v in self._cache.items() if isinstance(v, bytes) and k != key]:
            if self._bytes <= self.budget:
                break
            self._bytes -= len(self._cache.pop(old_key))
        return body

    def _render(self, request: tuple) -> bytes:
        from impl.workloads.realtext import answer

        prompt, n, max_tokens, seed, plp, wants = request
        how = self.render
        if how == "packed" and not wants:  # vLLM keeps the usual schema without the flag
            how = "json"
        return answer(
            self.kind, how, prompt, n=n, max_tokens=max_tokens, seed=seed,
            prompt_logprobs=plp,
        )  # fmt: skip
