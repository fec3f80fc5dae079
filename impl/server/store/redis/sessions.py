"""Sessions shared by server processes: the `Sessions` interface on the shared store's engine.

A session created by one process must be known to every other: the SDK's next call may reach
any of them. `{p}s:<session_id>` is a hash (created, last heartbeat, `o`: the owner's caller
NAME, its sampling session ids separated by spaces); `{p}ss:<sampling_session_id>` holds
`"<owner> <base model>"`. Every call carries the asking caller's NAME, and another caller's
session answers as an unknown one (the scripts compare `o`; `base_model` compares the cached
owner), so the routes' 404s cannot tell them apart. Session ids are random
(`impl.server.store.ids`). Sampling sessions never change once created, so each process caches
their owner and base model: asample, the hot call, reads the engine only on a cache miss. A
session finished in another process stays in this process's cache (its already-submitted
samples stay retrievable, as with the memory store).
"""

from __future__ import annotations

import time
from typing import Any

from impl.server.store.ids import new_id
from impl.server.store.redis.scripts import guard
from impl.server.store.redis.store import RedisStore

# KEYS: session. ARGV: sampling-session key prefix, log key prefix, owner.
_FINISH = """
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[3] then return 0 end
local sampling = redis.call('HGET', KEYS[1], 'sampling')
if not sampling then return 0 end
for id in string.gmatch(sampling, '%S+') do
  redis.call('DEL', ARGV[1] .. id, ARGV[2] .. id)
end
redis.call('DEL', KEYS[1])
return 1
"""


def adding(owner: int, first: str = "") -> str:
    """A script that answers 0 unless KEYS[1] is the session of caller ARGV[`owner`]; else
    it runs `first` and adds sampling id ARGV[1] to the session's list (once), answering 1."""
    return f"""
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[{owner}] then return 0 end
{first}local known = redis.call('HGET', KEYS[1], 'sampling') or ''
if not string.find(' ' .. known .. ' ', ' ' .. ARGV[1] .. ' ', 1, true) then
  redis.call('HSET', KEYS[1], 'sampling', known .. ' ' .. ARGV[1])
end
return 1
"""


# KEYS: session, sampling session. ARGV: sampling id, base model, owner.
_SAMPLING = adding(3, "redis.call('SET', KEYS[2], ARGV[3] .. ' ' .. ARGV[2])\n")
# KEYS: session. ARGV: now, owner.
_HEARTBEAT = """
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[2] then return 0 end
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
        #: sampling_session_id -> (owner, base model), as created (they never change)
        self.models: dict[str, tuple[str, str]] = {}
        self._count = 0
        self.finish_script = self.client.register_script(_FINISH)
        self.sampling_script = self.client.register_script(_SAMPLING)
        self.heartbeat_script = self.client.register_script(_HEARTBEAT)

    @guard
    async def create(self, owner: str = "") -> str:
        self._count += 1
        session_id = f"session-{new_id()}"
        now = time.time()
        await self.client.hset(
            f"{self.prefix}s:{session_id}",
            mapping={"created": now, "hb": now, "sampling": "", "o": owner},
        )
        return session_id

    @guard
    async def create_sampling(
        self, session_id: str, seq_id: int, base_model: str, owner: str = ""
    ) -> str | None:
        sampling_id = f"{session_id}:sample:{seq_id}"
        created = await self.sampling_script(
            keys=[f"{self.prefix}s:{session_id}", f"{self.prefix}ss:{sampling_id}"],
            args=[sampling_id, base_model, owner],
        )
        if not created:
            return None
        self.models[sampling_id] = (owner, base_model)
        return sampling_id

    @guard
    async def join(self, sampling_session_id: str, owner: str = "") -> int | None:
        """A new clone number of the sampling session (1, 2, ...), or None when unknown."""
        if await self.base_model(sampling_session_id, owner) is None:
            return None
        return int(await self.client.incr(f"{self.prefix}clones:{sampling_session_id}"))

    async def base_model(self, sampling_session_id: str, owner: str = "") -> str | None:
        """The base model of `owner`'s sampling session, or None (unknown, or another's)."""
        found = self.models.get(sampling_session_id)
        if found is None:
            found = await self._fetch(sampling_session_id)
            if found is None:
                return None
        return found[1] if found[0] == owner else None

    @guard
    async def _fetch(self, sampling_session_id: str) -> tuple[str, str] | None:
        raw = await self.client.get(f"{self.prefix}ss:{sampling_session_id}")
        if raw is None:
            return None
        owner, _, model = raw.decode().partition(" ")
        self.models[sampling_session_id] = (owner, model)
        return owner, model

    @guard
    async def heartbeat(self, session_id: str, owner: str = "") -> bool:
        beat = await self.heartbeat_script(
            keys=[f"{self.prefix}s:{session_id}"], args=[time.time(), owner]
        )
        return bool(beat)

    @guard
    async def finish(self, session_id: str, owner: str = "") -> bool:
        done = await self.finish_script(
            keys=[f"{self.prefix}s:{session_id}"],
            args=[f"{self.prefix}ss:", f"{self.prefix}sl:", owner],
        )
        return bool(done)

    def stats(self) -> dict[str, Any]:
        return {"created_here": self._count, "sampling_sessions_cached": len(self.models)}
