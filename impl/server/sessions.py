"""Sessions and sampling sessions: the few ids the SDK creates before it samples (in memory).

A sampling session id is derived from its session and seq id, so the SDK's retried
create_sampling_session gets the same id back. `join` hands each further client of a sampling
session (an unpickled SDK SamplingClient) its own clone number, so clones' seq_ids
(`clone * 1_000_000_000 + n`) never collide. The methods are async so that a shared version
(`impl/server/store/redis/sessions.py`, for several server processes) has the same interface.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field


@dataclass
class Session:
    created: float = field(default_factory=time.time)
    last_heartbeat: float = field(default_factory=time.time)
    sampling: set[str] = field(default_factory=set)


class Sessions:
    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        #: sampling_session_id -> base model (forwarded as the router's `model`)
        self.sampling: dict[str, str] = {}
        #: sampling_session_id -> clone numbers handed out so far (the original client is 0)
        self.clones: dict[str, int] = {}
        self._prefix = os.urandom(4).hex()
        self._count = 0

    async def create(self) -> str:
        self._count += 1
        session_id = f"session-{self._prefix}-{self._count}"
        self.sessions[session_id] = Session()
        return session_id

    async def create_sampling(self, session_id: str, seq_id: int, base_model: str) -> str | None:
        """The sampling session's id, or None when `session_id` is unknown."""
        session = self.sessions.get(session_id)
        if session is None:
            return None
        sampling_id = f"{session_id}:sample:{seq_id}"
        self.sampling[sampling_id] = base_model
        session.sampling.add(sampling_id)
        return sampling_id

    async def join(self, sampling_session_id: str) -> int | None:
        """A new clone number of the sampling session (1, 2, ...), or None when unknown."""
        if sampling_session_id not in self.sampling:
            return None
        clone = self.clones.get(sampling_session_id, 0) + 1
        self.clones[sampling_session_id] = clone
        return clone

    async def base_model(self, sampling_session_id: str) -> str | None:
        return self.sampling.get(sampling_session_id)

    async def heartbeat(self, session_id: str) -> bool:
        session = self.sessions.get(session_id)
        if session is None:
            return False
        session.last_heartbeat = time.time()
        return True

    async def finish(self, session_id: str) -> bool:
        session = self.sessions.pop(session_id, None)
        if session is None:
            return False
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
