"""The router request and what its answer means: one rule for the server's loop and fetch processes.

`post` sends one completions request through a pool (the pool contract's `Forwarder`) and
retries once on a connect-phase error or a 5xx; a failure after the request was sent is final
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


async def post(
    pool: Any,
    url: str,
    body: bytes,
    on_attempt: Callable[[int], None] | None = None,
    admit: Admit | None = None,
) -> Reply:
    """The router's reply; retried once on a connect-phase error or a 5xx (`on_attempt(n)` is
    called before attempt n, 1 or 2; `admit` is the pool contract's, awaited between each
    answer's headers and its body)."""
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
