"""Sessions shared by server processes: the `Sessions` interface on the shared store's engine.

A session created by one process must be known to every other: the SDK's next call may reach
any of them. `{p}s:<session_id>` is a hash (created, last heartbeat, its sampling session ids
separated by spaces); `{p}ss:<sampling_session_id>` holds the base model. Sampling sessions
never change once created, so each process caches their base model: asample, the hot call,
reads the engine only on a cache miss. A session finished in another process stays in this
process's cache (its already-submitted samples stay retrievable, as with the memory store).
"""

from __future__ import annotations

import os
import time
from typing import Any

from impl.server.store.redis.scripts import guard
from impl.server.store.redis.store import RedisStore

_FINISH = """
local sampling = redis.call('HGET', KEYS[1], 'sampling')
if not sampling then return 0 end
for id in string.gmatch(sampling, '%S+') do
  redis.call('DEL', ARGV[1] .. id, ARGV[2] .. id)
end
redis.call('DEL', KEYS[1])
return 1
"""

# KEYS: session, sampling session. ARGV: sampling id, base model.
_SAMPLING = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
local known = redis.call('HGET', KEYS[1], 'sampling') or ''
if not string.find(' ' .. known .. ' ', ' ' .. ARGV[1] .. ' ', 1, true) then
  redis.call('HSET', KEYS[1], 'sampling', known .. ' ' .. ARGV[1])
end
return 1
"""
_HEARTBEAT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'hb', ARGV[1])
return 1
"""


class RedisSessions:
    """Sessions and sampling sessions in Redis/Valkey, with a local base-model cache."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store  # its client and address; `guard` reads `address` and `health`
        self.address = store.address
        self.health = store.health
        self.client = store.client
        self.prefix = store.prefix
        self.models: dict[str, str] = {}
        self._prefix = os.urandom(4).hex()
        self._count = 0
        self.finish_script = self.client.register_script(_FINISH)
        self.sampling_script = self.client.register_script(_SAMPLING)
        self.heartbeat_script = self.client.register_script(_HEARTBEAT)

    @guard
    async def create(self) -> str:
        self._count += 1
        session_id = f"session-{self._prefix}-{self._count}"
        now = time.time()
        await self.client.hset(
            f"{self.prefix}s:{session_id}", mapping={"created": now, "hb": now, "sampling": ""}
        )
        return session_id

    @guard
    async def create_sampling(self, session_id: str, seq_id: int, base_model: str) -> str | None:
        sampling_id = f"{session_id}:sample:{seq_id}"
        created = await self.sampling_script(
            keys=[f"{self.prefix}s:{session_id}", f"{self.prefix}ss:{sampling_id}"],
            args=[sampling_id, base_model],
        )
        if not created:
            return None
        self.models[sampling_id] = base_model
        return sampling_id

    @guard
    async def join(self, sampling_session_id: str) -> int | None:
        """A new clone number of the sampling session (1, 2, ...), or None when unknown."""
        if await self.base_model(sampling_session_id) is None:
            return None
        return int(await self.client.incr(f"{self.prefix}clones:{sampling_session_id}"))

    async def base_model(self, sampling_session_id: str) -> str | None:
        model = self.models.get(sampling_session_id)
        if model is None:
            model = await self._fetch(sampling_session_id)
        return model

    @guard
    async def _fetch(self, sampling_session_id: str) -> str | None:
        raw = await self.client.get(f"{self.prefix}ss:{sampling_session_id}")
        if raw is None:
            return None
        model = raw.decode()
        self.models[sampling_session_id] = model
        return model

    @guard
    async def heartbeat(self, session_id: str) -> bool:
        beat = await self.heartbeat_script(
            keys=[f"{self.prefix}s:{session_id}"], args=[time.time()]
        )
        return bool(beat)

    @guard
    async def finish(self, session_id: str) -> bool:
        done = await self.finish_script(
            keys=[f"{self.prefix}s:{session_id}"],
            args=[f"{self.prefix}ss:", f"{self.prefix}sl:"],
        )
        return bool(done)

    def stats(self) -> dict[str, Any]:
        return {"created_here": self._count, "sampling_sessions_cached": len(self.models)}
