"""The in-process designs, and the contract every design shares.

`to_proto` turns one router body into SampleResponse bytes with the picked decoder and encoder
(`UpstreamFailed` saying why not); `Inline` runs it on the event loop (the cheapest for small
bodies, and the baseline), `Threads` in a thread pool for a decoder whose parse releases the GIL
(`releases_gil`). `Inline` is also the base of every design (`impl.server.offloop`): `await
design.to_proto(body, job) -> (bytes, decode seconds, encode seconds)`, or for the fetch design
`fetch(url, request, job, admit) -> Fetched` (`admit`: the pool contract's, the server's body
budget). `DecodeJob` is what decoding needs besides the body.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from impl.decode import Completion, DecodeError
from impl.pool import Admit
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
class Fetched:
    """What a fetch process did with one router request: the SampleResponse bytes or the
    failure, the body's size, the attempts made (0-2) and the seconds of each step."""

    payload: bytes
    failure: UpstreamFailed | None
    body_bytes: int
    attempts: int
    upstream_seconds: float
    decode_seconds: float
    encode_seconds: float


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


class Inline:
    """Decode and encode on the event loop."""

    name = "inline"

    def __init__(self, decoder: Any, encoder: Any) -> None:
        self.decoder, self.encoder = decoder, encoder
        #: set when the server shuts down: no new processes
        self.closing = False
        self.inline = 0
        self.offloop = 0

    async def start(self) -> None:
        return None

    async def to_proto(self, body: bytes, job: DecodeJob) -> Converted:
        self.inline += 1
        return to_proto(self.decoder, self.encoder, body, job)

    def fetches(self, expected_bytes: int) -> bool:
        """True when `fetch` sends the request (the fetch design), False: the loop's pool does."""
        return False

    async def fetch(self, url: str, request: bytes, job: DecodeJob, admit: Admit) -> Fetched:
        raise NotImplementedError(f"the {self.name} design does not fetch")

    async def aclose(self) -> None:
        return None

    def stats(self) -> dict[str, Any]:
        return {"inline": self.inline, "offloop": self.offloop}


class Threads(Inline):
    """Bodies of `min_bytes` or more decode in a thread pool (for a GIL-releasing decoder)."""

    name = "threads"

    def __init__(self, decoder: Any, encoder: Any, *, count: int, min_bytes: int) -> None:
        super().__init__(decoder, encoder)
        self.count, self.min_bytes = count, min_bytes
        self.executor = ThreadPoolExecutor(count, thread_name_prefix="hotpath-decode")

    async def to_proto(self, body: bytes, job: DecodeJob) -> Converted:
        if len(body) < self.min_bytes:
            return await super().to_proto(body, job)
        self.offloop += 1
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.executor, to_proto, self.decoder, self.encoder, body, job
        )

    async def aclose(self) -> None:
        # cancel queued decodes; running ones finish (a C call cannot be interrupted)
        await asyncio.to_thread(self.executor.shutdown, True, cancel_futures=True)

    def stats(self) -> dict[str, Any]:
        # "workers": the earlier name of "count", kept for /healthz readers
        count = {"count": self.count, "workers": self.count}
        return {**super().stats(), **count, "min_bytes": self.min_bytes}
