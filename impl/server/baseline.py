"""`--baseline`: the server as it ran before the fixes, kept to measure before and after.

What changes (the families' slow ends are chosen by `picks.py` from `IMPLEMENTATIONS`):
- httpx pool, rich access log, the reference decoder, the validated (pydantic) encoder;
- results are stored as legacy JSON (what the old server dumped), and every protobuf poll
  converts that JSON back to SampleResponse bytes, under one global lock, in a worker thread
  (that lock is what caps proto delivery); JSON cannot carry -inf, and
  empty fields come back absent, so those rare results differ from the fast path's bytes;
- the retrieved-TTL clock starts when the response is built, before it is sent: a poll whose
  client had already gone away still starts it, and the client's retry can find the result
  evicted (404, fatal in the SDK). `BaselineStore.clock_starts_on_build` tells the route.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import orjson

from impl.decode import TOPK_PAD_LOGPROB, TOPK_PAD_TOKEN, Completion, Sequence, TopK
from impl.server.store import DONE, Record, Retention
from impl.server.store.memory import MemoryStore

IMPLEMENTATIONS = {
    "decode": "json",
    "encode": "validated",
    "pool": "httpx",
    "accesslog": "rich",
    "runtime": "uvicorn_httptools",
}


def json_to_completion(text: bytes) -> Completion:
    """The Completion a legacy JSON result describes (the inverse of `proto_to_json`)."""
    data = orjson.loads(text)
    sequences = []
    for seq in data["sequences"]:
        tokens = np.asarray(seq["tokens"], dtype=np.int32)
        lps = seq["logprobs"]
        logprobs = (
            np.asarray(lps, np.float32) if lps is not None else np.zeros(len(tokens), np.float32)
        )
        sequences.append(Sequence(tokens, logprobs, seq["stop_reason"]))
    prompt = data.get("prompt_logprobs")
    prompt_logprobs = None
    if prompt is not None:
        prompt_logprobs = np.array([np.nan if v is None else v for v in prompt], dtype=np.float32)
    topk = None
    rows = data.get("topk_prompt_logprobs")
    if rows is not None:
        k = max((len(row) for row in rows if row), default=0)
        ids = np.full((len(rows), k), TOPK_PAD_TOKEN, dtype=np.int32)
        lps = np.full((len(rows), k), TOPK_PAD_LOGPROB, dtype=np.float32)
        for i, row in enumerate(rows):
            for j, (token, logprob) in enumerate(row or ()):
                ids[i, j] = token
                lps[i, j] = logprob
        topk = TopK(ids, lps)
    return Completion(sequences, prompt_logprobs, topk)


class BaselineStore(MemoryStore):
    """MemoryStore keeping JSON and re-encoding protobuf on every poll under one lock."""

    clock_starts_on_build = True

    def __init__(self, retention: Retention, *, encoder: Any, **kwargs: Any) -> None:
        super().__init__(retention, **kwargs)
        self.encoder = encoder
        self.lock = asyncio.Lock()

    async def complete(self, record: Record, payload: bytes) -> None:
        self._finish(record, DONE, self.to_json(payload), None)

    async def json(self, record: Record) -> bytes:
        return record.payload

    def _to_proto(self, text: bytes) -> bytes:
        return self.encoder.encode(json_to_completion(text))

    async def proto(self, record: Record) -> bytes:
        async with self.lock:
            return await asyncio.to_thread(self._to_proto, record.payload)
