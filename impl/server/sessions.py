"""Sessions and sampling sessions: the few ids the SDK creates before it samples (in memory).

A session belongs to the caller NAME that created it (`impl.server.callers`), and so do its
sampling sessions: every method takes the asking caller's NAME and answers another caller as
it answers an id that never existed (None / False), so the routes' 404s cannot tell them
apart. Session ids are random (`impl.server.store.ids`). A sampling session id is derived from its
session and seq id, so the SDK's retried create_sampling_session gets the same id back. `join`
hands each further client of a sampling session (an unpickled SDK SamplingClient) its own
clone number, so clones' seq_ids (`clone * 1_000_000_000 + n`) never collide. The methods are
async so that a shared version (`impl/server/store/redis/sessions.py`, for several server
processes) has the same interface.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from impl.server.store.ids import new_id


@dataclass
class Session:
    owner: str = ""
    created: float = field(default_factory=time.time)
    last_heartbeat: float = field(default_factory=time.time)
    sampling: set[str] = field(default_factory=set)


class Sessions:
    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        #: sampling_session_id -> (owner, base model forwarded as the router's `model`)
        self.sampling: dict[str, tuple[str, str]] = {}
        #: sampling_session_id -> clone numbers handed out so far (the original client is 0)
        self.clones: dict[str, int] = {}

    def _session(self, session_id: str, owner: str) -> Session | None:
        session = self.sessions.get(session_id)
        return session if session is not None and session.owner == owner else None

    async def create(self, owner: str = "") -> str:
        session_id = f"session-{new_id()}"
        self.sessions[session_id] = Session(owner)
        return session_id

    async def create_sampling(
        self, session_id: str, seq_id: int, base_model: str, owner: str = ""
    ) -> str | None:
        """The sampling session's id, or None when `owner` has no session `session_id`."""
        session = self._session(session_id, owner)
        if session is None:
            return None
        sampling_id = f"{session_id}:sample:{seq_id}"
        self.sampling[sampling_id] = (owner, base_model)
        session.sampling.add(sampling_id)
        return sampling_id

    async def join(self, sampling_session_id: str, owner: str = "") -> int | None:
        """A new clone number of the sampling session (1, 2, ...), or None when unknown."""
        if await self.base_model(sampling_session_id, owner) is None:
            return None
        clone = self.clones.get(sampling_session_id, 0) + 1
        self.clones[sampling_session_id] = clone
        return clone

    async def base_model(self, sampling_session_id: str, owner: str = "") -> str | None:
        """The base model of `owner`'s sampling session, or None (unknown, or another's)."""
        found = self.sampling.get(sampling_session_id)
        if found is None or found[0] != owner:
            return None
        return found[1]

    async def heartbeat(self, session_id: str, owner: str = "") -> bool:
        session = self._session(session_id, owner)
        if session is None:
            return False
        session.last_heartbeat = time.time()
        return True

    async def finish(self, session_id: str, owner: str = "") -> bool:
        if self._session(session_id, owner) is None:
            return False
        session = self.sessions.pop(session_id)
        for sampling_id in session.sampling:
            self.sampling.pop(sampling_id, None)
            self.clones.pop(sampling_id, None)
        return True

    def stats(self) -> dict[str, int]:
        return {
            "sessions": len(self.sessions),
            "sampling_sessions": len(self.sampling),
            "clones": sum(self.clones.values()),
        }
