"""The off-loop contract: `Decoding`, the one method every design answers a forward through.

A forward (`impl.server.forward`) hands its design one `Call`: the router URL and request, what
decoding needs (`DecodeJob`), the expected body size, its hold on the server's body budget and
the loop's own `post` (the picked pool, with the retry rule of `impl.server.upstream`). The
design answers `await decoding.sample(call) -> Sampled`: the SampleResponse bytes, or the
failure, with the body's size, the attempts it made and the seconds of each step. How it gets
there is the design's:

- through the loop (`through_loop`): `call.post` sends the request on the server's loop, the
  hold is settled to the body's real size, and the design's own conversion turns the body into
  SampleResponse bytes (on the loop, in a thread or in a decode process);
- in a fetch process: the process sends the request, asks the hold for the body's size, reads,
  decodes and encodes it; only the SampleResponse bytes come back.

Through the loop, a request the router did not answer raises `call.post`'s `UpstreamFailed`;
whatever fails once it answered (its status, an unreadable body, a bug in the conversion) comes
back in `Sampled.failure`, so the forward still counts the wait of an answered request. A fetch
process returns every failure in `Sampled.failure` (its kind says whether the router answered).
Besides `sample` a design only starts, closes and reports (`stats`, for /healthz).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from impl.decode import Completion, DecodeError
from impl.server import upstream
from impl.server.upstream import UpstreamFailed

#: SampleResponse bytes, seconds decoding, seconds encoding
Converted = tuple[bytes, float, float]


@dataclasses.dataclass(frozen=True, slots=True)
class DecodeJob:
    """What turning a body into SampleResponse bytes needs besides the body (small, picklable)."""

    prompt_tokens: list[int] | None
    n: int
    topk: int
    include_prompt_logprobs: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Sampled:
    """What a design did with one router request: the SampleResponse bytes or the failure, the
    body's size, the attempts made by the design itself (0 when `call.post` counted them) and
    the seconds of each step."""

    payload: bytes
    failure: Exception | None
    body_bytes: int
    attempts: int
    upstream_seconds: float
    decode_seconds: float
    encode_seconds: float


class Hold(Protocol):
    """A forward's hold on the server's body budget (`impl.server.budget.Admission`)."""

    async def __call__(self, status: int, length: int | None) -> None:
        """The pool contract's `admit`: awaited between an answer's headers and its body."""
        ...

    def settle(self, actual: int) -> None:
        """The body is read: hold its real size."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """One router request as a forward hands it to its design (see the module docstring)."""

    url: str
    request: bytes
    job: DecodeJob
    expected_bytes: int
    hold: Hold
    #: the loop's pool: `await post(request, hold)` -> the router's reply (retried once)
    post: Callable[[bytes, Hold], Awaitable[Any]]


@runtime_checkable
class Decoding(Protocol):
    """An off-loop design: `inline`, `threads` (`impl.server.offloop.inline`), `processes`
    (`impl.server.offloop.processes`) or `fetch` (`impl.server.offloop.fetch`)."""

    #: the design's `--offloop` name
    name: str
    #: set when the server shuts down: no new processes, no more waiting for one
    closing: bool

    async def start(self) -> None:
        """Start the design's threads or processes (inside the running loop)."""
        ...

    async def sample(self, call: Call) -> Sampled:
        """One router request to SampleResponse bytes (see the module docstring)."""
        ...

    async def aclose(self) -> None: ...

    def stats(self) -> dict[str, Any]:
        """The design's figures for /healthz."""
        ...


def to_proto(decoder: Any, encoder: Any, body: bytes, job: DecodeJob) -> Converted:
    """SampleResponse bytes for one router body and the seconds decode and encode took, or
    UpstreamFailed saying what was wrong.

    The decoded numpy buffers live only in this call: they are released as soon as the proto
    bytes exist."""
    started = time.perf_counter()
    try:
        completion: Completion = decoder.decode(
            body, prompt_tokens=job.prompt_tokens, topk_prompt_logprobs=job.topk
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
    decoded = time.perf_counter()
    payload = encoder.encode(completion)
    return payload, decoded - started, time.perf_counter() - decoded


async def through_loop(
    call: Call, convert: Callable[[bytes, DecodeJob], Awaitable[Converted]]
) -> Sampled:
    """`call` sent by the loop's pool and its body turned into SampleResponse bytes by
    `convert`; the hold is settled to the body's size as soon as it is read. No reference to
    the body outlives this call."""
    started = time.perf_counter()
    reply = await call.post(call.request, call.hold)
    waited = time.perf_counter() - started
    body_bytes = len(reply.body)
    call.hold.settle(body_bytes)
    try:
        body = upstream.body_of(reply)
        del reply
        payload, decode_seconds, encode_seconds = await convert(body, call.job)
    except Exception as exc:  # the router answered: its wait counts, the failure is returned
        return Sampled(b"", exc, body_bytes, 0, waited, 0.0, 0.0)
    return Sampled(payload, None, body_bytes, 0, waited, decode_seconds, encode_seconds)
