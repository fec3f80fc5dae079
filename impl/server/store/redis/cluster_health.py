"""The ping thread's view of a Redis Cluster (`health.StoreHealth`'s rules): the store is there
while every primary answers a ping and a slot table covering every slot can be read.

A failed ping drops the client; the next ping builds one again from every node known so far
(the node named by `--store` may be the one that died, and its replica the new primary), and
while no such table can be read (a shard without a primary) the store counts as away.
"""

from __future__ import annotations

import contextlib
from typing import Any

from impl.server.store.redis.health import StoreHealth


class ClusterHealth(StoreHealth):
    """The ping thread's view of a cluster: every primary answers, every slot is served."""

    def _connect(self) -> Any:
        import redis

        client = redis.RedisCluster.from_url(
            self.url, socket_timeout=self.timeout, socket_connect_timeout=self.timeout
        )
        self.known = [n.name for n in client.get_nodes()]
        return client

    def _ping(self, client: Any) -> Any:
        import redis

        if isinstance(client, _Unbuilt):
            try:
                client = self._rebuild()
            except redis.RedisClusterException as exc:  # no node known answers
                raise redis.ConnectionError(str(exc)) from exc
        try:
            client.ping(target_nodes=redis.RedisCluster.PRIMARIES)
        except redis.RedisClusterException as exc:  # its slot table found no node answering
            raise redis.ConnectionError(str(exc)) from exc
        self.known = [n.name for n in client.get_nodes()]
        return client

    def _reset(self, client: Any) -> Any:
        """A node failed: read the slot table again, from any node known (its replica may
        have been promoted), rebuilt at the next ping."""
        with contextlib.suppress(Exception):
            client.close()
        return _Unbuilt()

    def _rebuild(self) -> Any:
        import redis
        from redis.cluster import ClusterNode

        nodes = [ClusterNode(*name.rsplit(":", 1)) for name in self.known if ":" in name]
        if not nodes:
            return self._connect()
        return redis.RedisCluster(
            startup_nodes=nodes, socket_timeout=self.timeout, socket_connect_timeout=self.timeout
        )


class _Unbuilt:
    """The ping thread's client until the slot table is read again."""

    def close(self) -> None:
        pass
