"""Sessions on a Redis Cluster: `RedisSessions` with its two multi-key scripts split by slot.

On one engine, a sampling session is added to its session, and a session is finished with its
sampling sessions and their completion logs, each in one script. On a cluster those keys lie in
different slots (a session's hash, each sampling session's key, each log in its slot group), so
each change is done key by key, in an order that leaves nothing a reader could mistake:

- a sampling session: its key first, then the session's script adds it to the session's list
  if the session exists (if it does not, the key is deleted again and the call answers None);
- finishing: the session's script returns its sampling sessions and deletes the session, then
  each sampling session's key and completion-log hash are deleted.
"""

from __future__ import annotations

from impl.server.store.redis.scripts import guard
from impl.server.store.redis.sessions import RedisSessions, adding

# KEYS: session. ARGV: sampling id, owner. 1 when added, 0 when the session does not exist or
# is another caller's.
_ADD = adding(2)
# KEYS: session. ARGV: owner. Its sampling ids (space-separated), deleting it; false when there
# is none or it is another caller's.
_TAKE = """
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[1] then return false end
local sampling = redis.call('HGET', KEYS[1], 'sampling')
if not sampling then return false end
redis.call('DEL', KEYS[1])
return sampling
"""


class ClusterSessions(RedisSessions):
    """RedisSessions on a ClusterStore."""

    def __init__(self, store) -> None:
        super().__init__(store)
        self.add_script = self.client.register_script(_ADD)
        self.take_script = self.client.register_script(_TAKE)

    @guard
    async def create_sampling(
        self, session_id: str, seq_id: int, base_model: str, owner: str = ""
    ) -> str | None:
        sampling_id = f"{session_id}:sample:{seq_id}"
        sampling_key = f"{self.prefix}ss:{sampling_id}"
        await self.client.set(sampling_key, f"{owner} {base_model}")
        added = await self.add_script(
            keys=[f"{self.prefix}s:{session_id}"], args=[sampling_id, owner]
        )
        if not added:
            await self.client.delete(sampling_key)
            return None
        self.models[sampling_id] = (owner, base_model)
        return sampling_id

    @guard
    async def finish(self, session_id: str, owner: str = "") -> bool:
        sampling = await self.take_script(keys=[f"{self.prefix}s:{session_id}"], args=[owner])
        if sampling is None:
            return False
        for sampling_id in sampling.decode().split():
            await self.client.delete(f"{self.prefix}ss:{sampling_id}")
            await self.client.delete(self.store.session_logs.meta_key(sampling_id))
        return True
