"""The future store's contract: one record per sample, from asample until its result is evicted.

`FutureStore` is the interface the routes and the forward runner use (async, so a shared store
can stand in for the embedded one); `Record` is one sample's future, and the constants name its
states. The implementations are `impl.server.store.memory.MemoryStore` (embedded, one process)
and `impl.server.store.redis.store.RedisStore` (shared by several processes).

Retention has two clocks. A completed (or failed) result is kept `completed_ttl` seconds while
undelivered; once its response really reached a client (`delivered`, called by the route after
the last byte was handed to a still-connected client), it is kept `retrieved_ttl` seconds from
then. Pending records hold no request body: only ids, waiters and counters. A repeated
`(sampling_session_id, seq_id)` maps to the same record (the SDK retries with the same seq_id).
Once a delivered record is evicted, its key still answers with the same request_id for
`dedup_ttl` seconds (its poll then gets 404, like any evicted future): an attempt the client gave
up on and the server reaches late (minutes behind, under overload) must not generate the sample
a second time. A key whose result expired undelivered is forgotten, so a re-submit generates.
Each record belongs to the caller NAME that submitted it (`Record.owner`); the routes answer
another caller's request ids with 404, and count pending samples per owner (`outstanding_of`)
for each caller's share of `max_outstanding`. Every finished or failed sample is also appended
to its sampling session's completion log (`impl.server.store.completions`), which
`retrieve_futures` reads with a cursor and acknowledges.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable
from typing import Any, Protocol

from impl.server.store.completions import Entry, Target
from impl.server.store.held import HeldPolls

PENDING, DONE, FAILED = "pending", "done", "failed"
#: the owner of a record a store answers pending for without having it (a cluster's failover
#: lost it, and its writer is writing it again): any caller may poll it
UNKNOWN_OWNER = "\x00unknown"
#: Payloads above this many bytes are converted to JSON in a worker thread.
THREAD_JSON_BYTES = 1 << 20
#: Most completions one retrieve_futures answer carries (the rest go with the next poll).
SESSION_ANSWER_LIMIT = 8192

Key = tuple[str, int]


@dataclasses.dataclass(frozen=True, slots=True)
class Retention:
    """The rules every store applies (this module's docstring): how long a result is kept
    undelivered and once delivered, how long a delivered key still deduplicates, the caps
    behind a 429 (`pressure`), and how a busy session's completions are batched."""

    completed_ttl: float
    retrieved_ttl: float
    max_outstanding: int
    max_result_bytes: int
    dedup_ttl: float = 600.0
    session_batch_wait: float = 0.25
    session_batch_size: int = 32

    def refusal(self, pending: int, stored: int, where: str = "") -> str | None:
        """Why asample must be refused (429) with `pending` samples pending and `stored` result
        bytes stored (`where`: " in the shared store"), or None."""
        if pending >= self.max_outstanding:
            return f"{pending} samples pending{where} (limit {self.max_outstanding})"
        if stored >= self.max_result_bytes:
            return f"{stored} result bytes stored{where} (limit {self.max_result_bytes})"
        return None

    @classmethod
    def take(cls, options: dict[str, Any]) -> Retention:
        """The Retention of the keywords in `options`, removed from it (the rest stay)."""
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{name: options.pop(name) for name in names if name in options})


class Record:
    """One sample's future. `payload` is SampleResponse proto bytes (or the baseline's JSON)."""

    __slots__ = (
        "deadline",
        "delivered",
        "error",
        "fresh",
        "json",
        "json_future",
        "key",
        "owner",
        "payload",
        "request_id",
        "sequence_ids",
        "size",
        "state",
        "waiters",
    )

    def __init__(self, request_id: str, key: Key | None, n: int, owner: str = "") -> None:
        self.request_id = request_id
        self.key = key
        #: the NAME of the caller that submitted it (impl.server.callers); another gets 404
        self.owner = owner
        self.sequence_ids = [f"{request_id}:{i}" for i in range(n)]
        self.state = PENDING
        self.payload: bytes | None = None
        self.error: str | None = None
        self.json: bytes | None = None
        self.json_future: asyncio.Future[bytes] | None = None
        self.waiters: list[asyncio.Future[str]] | None = None
        self.deadline = 0.0
        self.size = 0
        self.delivered = False
        #: False when `create` found the key already claimed (a shared store's race): the
        #: caller must not forward it a second time.
        self.fresh = True


async def to_json_off_loop(to_json: Any, payload: bytes) -> bytes:
    """`to_json(payload)`, in a worker thread when the payload is above THREAD_JSON_BYTES (the
    event loop keeps serving meanwhile)."""
    if len(payload) > THREAD_JSON_BYTES:
        return await asyncio.to_thread(to_json, payload)
    return to_json(payload)


class StoreUnavailable(Exception):
    """The shared store cannot be reached; the message says where and why (answered as 503)."""


class FutureStore(Protocol):
    """What the routes and the forward runner need from a store of sample futures."""

    #: True when delivery is counted when the response is built, not when it was sent.
    clock_starts_on_build: bool
    #: True when `create` itself answers a key claimed before (fresh=False): one atomic call
    #: instead of lookup then create, and no race between processes.
    dedup_on_create: bool

    async def lookup(self, key: Key) -> Record | None:
        """The live record of a `(sampling_session_id, seq_id)`, if one was submitted."""

    async def create(self, key: Key | None, n: int, job: Any = None, owner: str = "") -> Record:
        """A new pending record with `n` sequence ids and a fresh random request id
        (`impl.server.store.ids`), owned by the caller NAME `owner` (`job`: the forward, kept by a
        shared store so that another process can take it over)."""

    async def get(self, request_id: str) -> Record | None: ...

    async def complete(self, record: Record, payload: bytes) -> None: ...

    async def fail(self, record: Record, message: str) -> None: ...

    async def abandon(self, record: Record, message: str) -> None:
        """This process stops forwarding `record` (shutdown): fail it, or hand it over."""

    async def wait(self, record: Record, timeout: float) -> None:
        """Return when `record` is no longer pending or after `timeout` seconds."""

    async def proto(self, record: Record) -> bytes:
        """A completed record's SampleResponse protobuf bytes."""

    async def json(self, record: Record) -> bytes:
        """The legacy JSON form of a completed record's payload (derived once, cached)."""

    async def delivered(self, record: Record) -> None:
        """The record's result reached a client: start the retrieved-TTL clock."""

    async def session_completions(
        self, target: Target, cursor: int, hold: float, *, limit: int = SESSION_ANSWER_LIMIT
    ) -> tuple[list[Entry], int] | None:
        """retrieve_futures: the completions of `target` after `cursor`, and the new cursor.

        First drops every completion at or before `cursor` (the client has seen them). While
        none is left, waits up to `hold` seconds for one (0: answers at once). Once there are
        some, answers at once unless a batch is filling (`impl.server.store.completions.hold_for`:
        two or more waiting and more pending, arriving faster than polls carry them); a filling
        batch is answered when `session_batch_size` (or `limit`) are waiting, when none of the
        target's samples is pending any more, when the completions pause, or
        `session_batch_wait` seconds after the oldest arrived (never past `hold`), so an idle
        session's completion goes at once and a busy session gets one answer per batch. At most
        `limit` completions per answer. The new cursor is
        the last position answered, or `cursor` itself when nothing is answered. None when
        `cursor` is neither 0 nor a position this store handed out for `target` (a cursor from
        a server that has since restarted, or from another session).
        """

    async def acknowledge(self, target: Target, request_ids: Iterable[str]) -> int:
        """retrieve_futures' `retrieved_request_ids`: each completed record of `target` not yet
        delivered counts as delivered now (its retrieved-TTL clock starts). Ids that are
        unknown, evicted, still pending, of another target, or already delivered are ignored
        (the SDK re-sends acks after a failed poll). Returns how many clocks started."""

    def pressure(self) -> str | None:
        """Why asample must be refused now (429), or None."""

    def outstanding_of(self, owner: str) -> int:
        """Samples of caller `owner` pending (every process's, on a shared store: as of its
        last refresh plus this process's since)."""

    def outstanding_by_owner(self) -> dict[str, int]:
        """owner -> samples pending, for every owner with some (the per-caller gauge)."""

    def stats(self) -> dict[str, int]: ...

    #: why this process's held polls answered (`impl.server.store.held`; /healthz `held_polls`)
    held_polls: HeldPolls

    def unavailable(self) -> str | None:
        """Why the store cannot serve now (a shared store away or silent; /readyz), or None."""

    def describe(self) -> dict[str, Any]:
        """What /healthz shows about the store: its kind and address (no secrets)."""

    def start(self) -> None: ...

    async def open(self) -> None:
        """Connect and start background work (the lifespan calls it; `start` for tests)."""

    async def aclose(self) -> None:
        """Stop background work and disconnect, after the forwards were stopped."""

    def wake_all(self) -> None:
        """Release every held poll (shutdown)."""

    def close(self) -> None: ...
