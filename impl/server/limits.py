"""Request limits and the one error shape every route answers with.

Every error, from every route, is `{"detail": "<one short sentence>"}` (`schemas.ErrorDetail`)
with a 4xx status, and quotes at most `QUOTE` characters of what the client sent; so a hostile
request costs a response of a few hundred bytes, never an echo of its own size.

Limits (flags, see `Settings`) are checked as early as the request allows:
- body size per route: the `Content-Length` header is refused before a byte is read; a
  chunked body is read only up to the cap. The rest of an over-cap body is read and dropped
  (a chunk at a time, up to `DRAIN_LIMIT`), so the keep-alive connection stays usable; past
  that (or a larger declared length, refused unread) the 413 closes the connection;
- nesting depth (`MAX_REQUEST_DEPTH`), NaN / Infinity, invalid UTF-8 and integers too long
  for Python: 400, checked by `strict_json` before FastAPI's own parser sees the body (the
  hot routes' msgspec decoders reject all of these themselves, except depth);
- ids, tags and prompt lengths: 422 naming the limit, checked by the routes.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

#: Most characters of client input an error message quotes.
QUOTE = 100
#: The smallest --max-id-length: every id this server hands out must pass every route's check
#: (the longest it makes is a sampling session id, "session-<8 hex>-<count>:sample:<seq id>",
#: at most 37 + 8 + 16 = 61 characters).
MIN_ID_LENGTH = 64
#: Deepest nesting of arrays and objects a request body may have (the top level is depth 1;
#: the SDK's bodies nest 5 deep).
MAX_REQUEST_DEPTH = 32
#: Bytes of an over-cap body read and dropped to keep the connection; past this, it closes.
DRAIN_LIMIT = 64 << 20
#: JSON bytes per prompt token an asample body is allowed (a 10-digit id and a comma, + 1).
BYTES_PER_PROMPT_TOKEN = 12
#: Telemetry's cap in units of --max-body-bytes: the SDK sends up to 100 events per batch,
#: each possibly with a stack trace.
TELEMETRY_FACTOR = 16
#: retrieve_futures' cap in the same units: its `retrieved_request_ids` acknowledge every
#: result fetched since the previous poll (16 MiB: ~370k ids).
POLL_FACTOR = 256
_FACTORS = {"/api/v1/telemetry": TELEMETRY_FACTOR, "/api/v1/retrieve_futures": POLL_FACTOR}


@dataclass(frozen=True)
class Limits:
    """The request limits of one server (from `Settings`)."""

    max_id_length: int = 256
    max_body_bytes: int = 64 << 10
    max_prompt_tokens: int = 1 << 20
    max_tags: int = 64

    @property
    def asample_body_bytes(self) -> int:
        """asample's body cap: the largest prompt plus one small body for everything else."""
        return self.max_prompt_tokens * BYTES_PER_PROMPT_TOKEN + self.max_body_bytes

    def body_cap(self, path: str) -> tuple[int, str]:
        """The body cap of a route other than asample, and the flag that sets it."""
        factor = _FACTORS.get(path)
        if factor is not None:
            return self.max_body_bytes * factor, f"{factor} x --max-body-bytes"
        return self.max_body_bytes, "--max-body-bytes"

    @classmethod
    def from_settings(cls, settings: Any) -> Limits:
        return cls(
            max_id_length=settings.max_id_length,
            max_body_bytes=settings.max_body_bytes,
            max_prompt_tokens=settings.max_prompt_tokens,
            max_tags=settings.max_tags,
        )

    def id_problem(self, name: str, value: str) -> str | None:
        """Why `value` is not an acceptable id called `name`, or None."""
        if len(value) > self.max_id_length:
            return (
                f"{name} is {len(value)} characters long; the limit is {self.max_id_length} "
                f"(--max-id-length)"
            )
        return None


def quote(text: str, limit: int = QUOTE) -> str:
    """`repr(text)` of at most `limit` characters of it, with '…' when it was cut."""
    if len(text) <= limit:
        return repr(text)
    return repr(text[:limit]) + f"… ({len(text)} characters)"


def shorten(message: str, limit: int = 2 * QUOTE) -> str:
    """A library's error message cut to `limit` characters (it may quote the client's input)."""
    return message if len(message) <= limit else message[:limit] + "…"


def error_body(message: str) -> bytes:
    """The one error shape: `{"detail": message}`."""
    return orjson.dumps({"detail": message})


def unavailable_message(exc: Exception) -> str:
    """The detail of a 503 while the shared store is away (with Retry-After, on every route)."""
    return f"{exc}; retry later"


def declared_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class OverCap:
    """What `read_capped` returns for a body over the cap: `drained` when the rest was read
    (the connection can carry the next request), else the response must close it."""

    def __init__(self, drained: bool) -> None:
        self.drained = drained

    @property
    def headers(self) -> tuple[tuple[bytes, bytes], ...]:
        return () if self.drained else ((b"connection", b"close"),)


async def read_capped(
    scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]], cap: int
) -> bytes | OverCap:
    """The whole body, or OverCap when it is over `cap` bytes. The rest of an over-cap body is
    read and dropped a chunk at a time when it is (or turns out) no larger than DRAIN_LIMIT;
    a larger declared length is refused at once, unread, and the connection closed."""
    declared = declared_length(scope)
    if declared is not None and declared > DRAIN_LIMIT:
        return OverCap(drained=False)
    size = 0
    if declared is None or declared <= cap:
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return OverCap(drained=False)  # the client went away
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > cap:
                break
            chunks.append(chunk)
            if not message.get("more_body"):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
    else:
        message = {"more_body": True}
    while message.get("more_body"):
        if size > DRAIN_LIMIT:
            return OverCap(drained=False)
        message = await receive()
        if message["type"] != "http.request":
            return OverCap(drained=False)
        size += len(message.get("body", b""))
    return OverCap(drained=True)


def size_message(cap: int, flag: str) -> str:
    return f"request body over {cap} bytes, this route's limit ({flag})"


def too_deep(doc: Any, limit: int = MAX_REQUEST_DEPTH) -> bool:
    """True when `doc` (parsed JSON) nests arrays and objects more than `limit` deep."""
    level = [doc]
    depth = 0
    while level:
        containers = [v for v in level if type(v) is dict or type(v) is list]
        if not containers:
            return False
        depth += 1
        if depth > limit:
            return True
        level = [
            item
            for container in containers
            for item in (container.values() if type(container) is dict else container)
        ]
    return False


def may_be_deep(body: bytes, limit: int = MAX_REQUEST_DEPTH) -> bool:
    """False when `body` cannot nest deeper than `limit`: it has no more brackets than that."""
    return body.count(b"[") + body.count(b"{") > limit


def nested_too_deep(body: bytes) -> bool:
    """True when the JSON `body` nests deeper than MAX_REQUEST_DEPTH (cheap for flat bodies)."""
    if not may_be_deep(body):
        return False
    try:
        return too_deep(orjson.loads(body))
    except orjson.JSONDecodeError as exc:  # orjson's own limit is 1024 levels
        return "recursion" in str(exc)


def strict_json(body: bytes) -> str | None:
    """Why `body` is not acceptable JSON for a request (400), or None when it is.

    orjson rejects NaN / Infinity, invalid UTF-8 and very deep bodies without recursion;
    the depth walk applies the request limit; the stdlib (what FastAPI parses with) then
    must accept it too, which rules out integers too long for Python (`int_max_str_digits`).
    """
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return f"malformed JSON body: {shorten(str(exc))}"
    if may_be_deep(body) and too_deep(doc):  # orjson.loads above: not parsed twice
        return f"JSON body nested deeper than {MAX_REQUEST_DEPTH} levels"
    try:
        json.loads(body)
    except (ValueError, RecursionError) as exc:
        return f"malformed JSON body: {shorten(str(exc))}"
    return None
