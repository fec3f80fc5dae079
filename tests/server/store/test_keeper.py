"""The embedded store's keeper (impl/server/store/redis/keeper.py), in this process, on a real
redis-server: killed, it is reaped and started again on the same socket with its data; if it
cannot start, the keeper says so (state, error, keeper.json) and keeps trying until it can."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from tests.support.wait import until

pytest.importorskip("redis", reason="the shared store needs redis-py: pip install 'hotpath[store]'")

import redis

from impl.server.store.redis import embedded
from impl.server.store.redis.keeper import Keeper, status_of

pytestmark = [
    pytest.mark.heavy,
    pytest.mark.skipif(embedded.binary() is None, reason=embedded.INSTALL_HINT),
]


def _gone(pid: int) -> bool:
    """The process is gone for good: reaped by its parent, not a zombie waiting for it."""
    try:
        psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return True
    return False


def test_a_killed_store_is_reaped_and_started_again_with_its_data():
    keeper = Keeper()
    keeper.start()
    try:
        client = redis.Redis.from_url(keeper.url)
        client.set("kept", b"before the kill")
        first = keeper.pid
        assert status_of(keeper.url) == {
            "state": "running", "pid": first, "restarts": 0, "last_exit": None, "error": None,
        }  # fmt: skip
        os.kill(first, signal.SIGKILL)
        until(lambda: keeper.restarts == 1 and keeper.state == "running")
        assert until(lambda: _gone(first))  # reaped at once: not left <defunct>
        assert keeper.pid != first and keeper.last_exit == "killed by SIGKILL"
        assert client.get("kept") == b"before the kill"  # same socket, its append-only file
        assert status_of(keeper.url)["restarts"] == 1
        client.close()
    finally:
        keeper.stop()
    assert not Path(keeper.directory).exists()  # the private dir goes with it


def test_a_store_that_cannot_start_again_is_reported_and_retried():
    """Its append-only manifest damaged, redis-server refuses to start: the keeper says
    `restarting` with the reason (here and in keeper.json, which every server process reads)
    and tries again; repaired, it comes back with the data."""
    keeper = Keeper()
    keeper.start()
    try:
        client = redis.Redis.from_url(keeper.url)
        client.set("kept", b"yes")
        client.close()
        manifest = next(Path(keeper.directory).rglob("*.manifest"))
        good = manifest.read_bytes()
        manifest.write_bytes(b"not a manifest\n")
        os.kill(keeper.pid, signal.SIGKILL)
        status = until(lambda: (s := status_of(keeper.url))["error"] and s)
        assert status["state"] == "restarting" and "did not start" in status["error"], status
        manifest.write_bytes(good)
        until(lambda: keeper.state == "running")
        client = redis.Redis.from_url(keeper.url)
        assert client.get("kept") == b"yes"
        client.close()
        assert status_of(keeper.url)["error"] is None
    finally:
        keeper.stop()
