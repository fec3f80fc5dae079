"""The in-process designs: `Inline` decodes on the event loop, `Threads` in a thread pool.

Both send the router request with the loop's pool and turn the body into SampleResponse bytes
with the picked decoder and encoder (`impl.server.offloop.decoding.through_loop`); `Inline`
converts on the loop (the cheapest for small bodies, and the baseline), `Threads` converts
bodies of `min_bytes` or more in a thread pool, for a decoder whose parse releases the GIL
(`releases_gil`). Both are `impl.server.offloop.decoding.Decoding`s; `convert` (one body the
loop received, to SampleResponse bytes) is also what `impl.probes.offloop` measures.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from impl.server.offloop.decoding import Call, Converted, DecodeJob, Sampled, through_loop, to_proto


class Inline:
    """Decode and encode on the event loop."""

    name = "inline"

    def __init__(self, decoder: Any, encoder: Any) -> None:
        self.decoder, self.encoder = decoder, encoder
        self.closing = False
        self.inline = 0
        self.offloop = 0

    async def start(self) -> None:
        return None

    async def sample(self, call: Call) -> Sampled:
        return await through_loop(call, self.convert)

    async def convert(self, body: bytes, job: DecodeJob) -> Converted:
        """SampleResponse bytes of one body the loop received (UpstreamFailed: why not)."""
        self.inline += 1
        return to_proto(self.decoder, self.encoder, body, job)

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

    async def convert(self, body: bytes, job: DecodeJob) -> Converted:
        if len(body) < self.min_bytes:
            return await super().convert(body, job)
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
