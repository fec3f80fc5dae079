"""The load harness under faults: the server's store away is its own failure class, and an
interrupted `hotpath loadtest` leaves nothing running.

Real processes: `hotpath serve` on a redis-server of the test's own (killed by the test), the
harness's client processes, and `hotpath loadtest` itself interrupted by SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from impl.harness.client.config import STORE_UNAVAILABLE, store_unavailable
from impl.harness.client.session_poll import SessionPoller
from impl.server.store.redis import embedded
from tests.support import engines
from tests.support.faults import OwnStore
from tests.support.runs import few_samples
from tests.support.server import start_server

ROOT = Path(__file__).resolve().parents[2]
STORE_DOWN = (
    b'{"detail":"the shared store at redis://127.0.0.1:1/0 is unavailable '
    b'(ConnectionError: refused); retry later"}'
)
needs_redis = pytest.mark.skipif(embedded.binary() is None, reason=embedded.INSTALL_HINT)


def test_the_stores_503_is_told_apart():
    assert store_unavailable(503, STORE_DOWN)
    assert store_unavailable(503, STORE_DOWN.decode())
    assert not store_unavailable(503, b"Service Unavailable")  # uvicorn's own, or a proxy's
    assert not store_unavailable(500, STORE_DOWN)
    assert not store_unavailable(None, "")


def test_the_session_poller_counts_the_stores_503_and_closes_cleanly():
    """A retrieve_futures answered 503 (store away) is retried and counted as
    store_unavailable; the last ack-only poll at close meeting one does not raise (it crashed
    the client process before: `client_crash: _Retry: 503`)."""

    async def go():
        answers = iter([(503, "application/json", STORE_DOWN)] * 100)

        async def post(path, payload, *, timeout):
            return next(answers)

        retries: Counter[str] = Counter()
        poller = SessionPoller(post, lambda body: body, "ss", retries)
        poller.mark_retrieved("r1")  # something to acknowledge at close
        await asyncio.sleep(0.05)
        await poller.close()
        return retries

    retries = asyncio.run(go())
    assert retries[STORE_UNAVAILABLE] >= 1
    assert retries["session_poll_final_ack_error"] == 1
    assert not any(k.startswith("session_poll_503") for k in retries)


@needs_redis
@pytest.mark.heavy
def test_samples_that_meet_a_dead_store_fail_as_store_unavailable(upstream, tmp_path):
    """The store is killed and never comes back: every sample fails with the class
    store_unavailable (after its tries), none as a crash."""
    engine = OwnStore(str(tmp_path))
    try:
        with start_server(upstream.url, "--store", engine.url) as server:
            engine.kill()
            run = few_samples(server.url, tries=2, backoff_base=0.01)
    finally:
        engine.stop()
    assert run["failed"] == {STORE_UNAVAILABLE: 8}, run["examples"]
    assert "shared store" in run["examples"][STORE_UNAVAILABLE]
    assert "client_crash" not in run["examples"]
    assert run["retries"][STORE_UNAVAILABLE] >= 1


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


@needs_redis
@pytest.mark.parametrize(
    ("sig", "extra"),
    [
        (signal.SIGTERM, ["--server-workers", "2"]),  # supervisor, workers, embedded store
        (signal.SIGINT, []),
    ],
    ids=["sigterm-workers2", "sigint"],
)
@pytest.mark.slow
def test_an_interrupted_loadtest_stops_everything_it_started(sig, extra):
    """SIGTERM (or SIGINT) to `hotpath loadtest` mid-run: it exits with 128 + the signal and
    every process it started (router, server and what the server started: workers, fetch
    processes, the embedded redis-server; the client processes) is gone."""
    command = [
        sys.executable, "-m", "impl.cli", "loadtest", "--num-requests", "100000",
        "--router-mode", "latency", "--gen-seconds", "30", "--max-num-seqs", "100000",
        "--timeout", "300", "--warmup", "0", "--no-progress", *extra,
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "HOTPATH_MEASUREMENTS": os.devnull},
    )
    seen: dict[int, psutil.Process] = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until the client processes run (the load)
            for child in _descendants(process.pid):
                seen.setdefault(child.pid, child)
            names = " ".join(" ".join(p.cmdline()) for p in _descendants(process.pid))
            if "spawn_main" in names and "serve" in names and "router" in names:
                break
            assert process.poll() is None, process.stderr.read().decode()[-3000:]
            time.sleep(0.2)
        time.sleep(1.0)  # the samples are in flight
        for child in _descendants(process.pid):
            seen.setdefault(child.pid, child)
        kinds = " ".join(" ".join(p.cmdline()) for p in seen.values())
        assert "router" in kinds and "serve" in kinds and "spawn_main" in kinds, kinds
        if extra:
            assert any(engine in kinds for engine in engines.PROCESSES), kinds  # the store
        os.kill(process.pid, sig)
        code = process.wait(90)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    _, alive = psutil.wait_procs(list(seen.values()), timeout=30)
    for orphan in alive:  # the test failed: leave nothing behind
        orphan.kill()
    assert code == 128 + sig, process.stderr.read().decode()[-3000:]
    assert not alive, [" ".join(p.cmdline()) for p in alive]
    assert "stopped every process it started" in process.stderr.read().decode()
