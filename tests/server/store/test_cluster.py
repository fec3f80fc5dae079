"""The shared store on a real Redis/Valkey Cluster (3 primaries, 3 replicas; support/cluster.py):
the key layout, wake-ups across processes by sharded pub/sub, a write lost in a failover written
again and forwarded again, acknowledgement by replicas, and a real `hotpath serve` on it."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid

import pytest

from tests.support import cluster as nodes
from tests.support import engines
from tests.support.server import Api, start_server
from tests.support.store_options import store_options

redis = pytest.importorskip("redis", reason="the shared store needs redis-py: pip install redis")

from impl.server.job import Job  # noqa: E402
from impl.server.offloop.decoding import DecodeJob  # noqa: E402
from impl.server.store import DONE, PENDING, Retention, StoreUnavailable  # noqa: E402
from impl.server.store.redis import embedded, slots  # noqa: E402
from impl.server.store.redis.cluster import ClusterStore, is_cluster  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(nodes.cli() is None, reason="redis-cli is missing (redis-tools)"),
]
JOB = Job(b'{"prompt":[1,2,3],"n":1}', DecodeJob([1, 2, 3], 1, 0, True), 4096)


def _start(name: str) -> nodes.Cluster:
    return nodes.Cluster(embedded.binaries()[name]).start()


@pytest.fixture(scope="module", params=engines.params())
def cluster(request):
    running = _start(request.param)
    yield running
    running.stop()


@pytest.fixture(params=engines.params())
def own_cluster(request):
    """A cluster of the test's own (its nodes get killed)."""
    running = _start(request.param)
    yield running
    running.stop()


def _store(url: str, prefix: str, **overrides) -> ClusterStore:
    options = store_options(prefix=prefix, **overrides)
    return ClusterStore(url, Retention.take(options), **options)


def _prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}:"


def _primary_of(cluster: nodes.Cluster, request_id: str) -> nodes.Node:
    """The node serving the slot group of `request_id`."""
    tag = slots.TAGS[slots.group_of_id(request_id)]
    client = redis.RedisCluster.from_url(cluster.url)
    try:
        return cluster.node_at(client.get_node_from_key(f"x{{{tag}}}").port)
    finally:
        client.close()


def test_a_record_and_its_session_keys_share_one_slot_and_groups_spread(cluster):
    assert is_cluster(cluster.url)

    async def go():
        store = _store(cluster.url, _prefix())
        await store.open()
        record = await store.create(("sess-a", 7), 1, JOB)
        await store.complete(record, b"proto")
        keys = []
        for node in cluster.primaries():
            keys += [k.decode() for k in node.client().keys(f"{store.prefix}*")]
        mine = [k for k in keys if record.request_id in k or "sess-a" in k]
        assert len(mine) >= 4, keys  # record, payload, dedup key, session log hash and list
        assert {redis.crc.key_slot(k.encode()) for k in mine} == {
            slots.SLOTS[slots.group_of("sess-a")]
        }
        # every primary serves some of the groups (the contiguous ranges of --cluster create)
        assert len(set(store._group_primaries().values())) == 3
        assert await store.get("not-an-id-of-ours") is None
        assert (await store.get(record.request_id)).payload == b"proto"
        await store.aclose()

    asyncio.run(go())


def test_a_completion_in_one_process_wakes_a_poll_in_another(cluster):
    async def go():
        prefix = _prefix()
        a, b = _store(cluster.url, prefix), _store(cluster.url, prefix)
        await a.open()
        await b.open()  # starts its listener
        for _ in range(100):  # the subscriptions are made by b's listener
            if b.listening:
                break
            await asyncio.sleep(0.05)
        records = [await a.create((f"s{i}", 1), 1) for i in range(8)]  # several groups
        seen = [await b.get(r.request_id) for r in records]
        loop = asyncio.get_running_loop()
        for record in records:
            loop.call_later(0.2, lambda r=record: asyncio.ensure_future(a.complete(r, b"p")))
        await asyncio.gather(*(b.wait(s, 20) for s in seen))
        assert all(s.state == DONE and s.payload == b"p" for s in seen)
        assert b.held_polls.counts["future"]["woken"] == len(records)
        await b.refresh()
        assert b.stats()["completed"] == len(records) and b.stats()["pending"] == 0
        await a.aclose()
        await b.aclose()

    asyncio.run(go())


def test_with_acks_a_create_waits_for_a_replica(cluster):
    async def go():
        store = _store(cluster.url, _prefix(), ack_replicas=1)
        await store.open()
        record = await store.create(("acked", 1), 1, JOB)
        assert store.pipe.waits == 1
        primary = _primary_of(cluster, record.request_id)
        (replica,) = cluster.replicas_of(primary)
        replica.kill(signal.SIGSTOP)
        try:
            with pytest.raises(StoreUnavailable, match="confirmed by 0 of 1 replicas"):
                await store.create(("acked", 2), 1, JOB)
        finally:
            replica.kill(signal.SIGCONT)
        await store.aclose()

    asyncio.run(go())


def test_a_result_lost_in_a_failover_is_written_and_forwarded_again(own_cluster):
    """The replica is stopped and cut off while a record is created and finished, so its
    primary's kill -9 loses both; once the replica is promoted, the writer finds the record
    missing, writes it again and forwards it again."""
    cluster = own_cluster

    async def go():
        store = _store(cluster.url, _prefix(), lease=2.0)
        forwarded: list = []
        store.on_takeover = lambda record, body, options: forwarded.append(
            (record, Job.unpack(body, options))
        )
        await store.open()
        probe = await store.create(("lost", 1), 1, JOB)  # finds the group's nodes
        await store.complete(probe, b"kept")
        primary = _primary_of(cluster, probe.request_id)
        (replica,) = cluster.replicas_of(primary)
        replica.kill(signal.SIGSTOP)  # it cannot reconnect, and gets nothing more
        primary.client().client_kill_filter(_type="replica")
        record = await store.create(("lost", 2), 1, JOB)
        await store.complete(record, b"first")
        assert store.recovery.describe()["unconfirmed_writes"] >= 1
        primary.kill(signal.SIGKILL)
        replica.kill(signal.SIGCONT)
        deadline = time.monotonic() + 60
        while not forwarded and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        ((again, job),) = forwarded
        assert again.request_id == record.request_id and job == JOB
        assert store.recovery.reforwards == 1
        seen = await store.get(record.request_id)
        assert seen.state == PENDING
        await store.complete(again, b"second")
        assert (await store.get(record.request_id)).payload == b"second"
        assert (await store.get(probe.request_id)).payload == b"kept"
        await store.aclose()

    asyncio.run(go())


def test_a_server_on_a_cluster_answers_samples_and_session_polls(cluster, upstream):
    with start_server(upstream.url, "--store", cluster.url) as server:
        api = Api(server.url)
        try:
            ssid = api.sampling_session()
            submitted = api.asample(ssid, 0, seed=5)
            assert submitted.status_code == 200, submitted.text
            request_id = submitted.json()["request_id"]
            assert slots.group_of_id(request_id) == slots.group_of(ssid)
            assert api.result(request_id).status_code == 200
            again = api.asample(ssid, 0, seed=5)  # dedup across the cluster
            assert again.json()["request_id"] == request_id
            deadline = time.monotonic() + 10  # each process reads the counters every 0.2 s
            health = api.healthz()
            while health["store"]["deduplicated"] < 1 and time.monotonic() < deadline:
                time.sleep(0.2)
                health = api.healthz()
            assert health["store_backend"]["kind"] == "redis-cluster"
            assert len(health["store_backend"]["primaries"]) == 3
            assert health["store"]["submitted"] >= 1 and health["store"]["deduplicated"] == 1
        finally:
            api.close()
