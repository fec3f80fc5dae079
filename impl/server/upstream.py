"""The router request and what its answer means: one rule for the server's loop and fetch processes.

`post` sends one completions request through a pool (the pool contract's `Forwarder`), asking
for vLLM's packed candidates as `--upstream-logprobs` says (`set_logprobs`), and retries once on
a connect-phase error or a 5xx; a failure after the request was sent is final
(the engine may still be generating, a retry would generate twice). `body_of` is the body of a
200 answer, or `UpstreamFailed` quoting what the router said instead. The server's loop
(`impl.server.forward`) and the fetch processes (`impl.server.offloop.fetch`) both call
these, so a sample fails with the same message wherever its request was sent from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from impl.pool import Admit, ConnectError, ReadError, Reply

HEADERS = {"Content-Type": "application/json"}
_QUOTE = 200


class UpstreamFailed(Exception):
    """The sample cannot complete; the message is what retrieve_future reports, `kind` its
    class in the metrics (connect, read, http_5xx, http_status, decode, choices, decode_worker)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def quote(body: bytes) -> str:
    """The first 200 bytes of an answer, for a failure message."""
    text = body[:_QUOTE].decode("utf-8", "replace")
    return repr(text) + ("…" if len(body) > _QUOTE else "")


#: `--upstream-logprobs`: how completions ask for candidates (one setting per process)
LOGPROBS = ("json", "packed", "auto")
#: what a packed request adds to the JSON one (vLLM's packed completion logprobs)
PACKED_FIELDS = b',"packed_top_logprobs":true,"return_tokens_as_token_ids":true}'
_mode = {"logprobs": "json"}
#: router URLs that refused a packed request (auto asks them in JSON from then on)
_refused: set[str] = set()


def set_logprobs(mode: str) -> None:
    """This process's `--upstream-logprobs`: json asks as vLLM's usual body, packed for
    vLLM's packed candidates (a refusal fails the sample), auto for packed unless the router
    refused it once (then JSON, at once and for the rest of this process's life)."""
    if mode not in LOGPROBS:
        raise ValueError(f"--upstream-logprobs must be one of {', '.join(LOGPROBS)}, not {mode!r}")
    _mode["logprobs"] = mode
    _refused.clear()


def logprobs() -> str:
    """This process's `--upstream-logprobs` (what its fetch processes are started with)."""
    return _mode["logprobs"]


def packed_request(body: bytes) -> bytes:
    """The request body (a JSON object, as `impl.server.job.build_request` makes it) asking
    for packed candidates."""
    return body[: body.rindex(b"}")] + PACKED_FIELDS


def refused_packed(reply: Reply) -> bool:
    """Whether the router's reply refuses the packed request (vLLM answers 400 naming the
    field; a server without the field ignores it and answers as usual)."""
    return reply.status == 400 and b"packed_top_logprobs" in reply.body[:4096]


async def post(
    pool: Any,
    url: str,
    body: bytes,
    on_attempt: Callable[[int], None] | None = None,
    admit: Admit | None = None,
) -> Reply:
    """The router's reply; retried once on a connect-phase error or a 5xx (`on_attempt(n)` is
    called before attempt n, 1 or 2; `admit` is the pool contract's, awaited between each
    answer's headers and its body). With `--upstream-logprobs` packed or auto the request asks
    for packed candidates; auto asks again in JSON (attempts from 1 again) when the router
    refuses them, and remembers that router."""
    mode = _mode["logprobs"]
    if mode == "json" or (mode == "auto" and url in _refused):
        return await _post(pool, url, body, on_attempt, admit)
    reply = await _post(pool, url, packed_request(body), on_attempt, admit)
    if mode == "auto" and refused_packed(reply):
        _refused.add(url)
        reply = await _post(pool, url, body, on_attempt, admit)
    return reply


async def _post(
    pool: Any,
    url: str,
    body: bytes,
    on_attempt: Callable[[int], None] | None,
    admit: Admit | None,
) -> Reply:
    for attempt in (1, 2):
        if on_attempt is not None:
            on_attempt(attempt)
        try:
            reply = await pool.post(url, body, HEADERS, admit)
        except ConnectError as exc:
            if attempt == 2:
                raise UpstreamFailed(
                    f"could not connect to the router at {url} (tried twice): {exc}", "connect"
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


def body_of(reply: Reply) -> bytes:
    """The completion body of a 200 answer; UpstreamFailed for any other status."""
    if reply.status != 200:
        again = " (after one retry)" if reply.status >= 500 else ""
        raise UpstreamFailed(
            f"the router answered HTTP {reply.status}{again}: {quote(reply.body)}",
            "http_5xx" if reply.status >= 500 else "http_status",
        )
    return reply.body
