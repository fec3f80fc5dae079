"""The chaos suite: real redis-servers, real server processes, the harness's SDK-shaped client
processes, loopback only; each fault lands while a bounded load is in flight.

Under load (512 samples, a fake engine that takes 1 s per generation, the harness's client
retrying as the SDK does, every result's tokens checked exactly): kill -9 of the store and a
start again; SIGSTOP then SIGCONT of the store; kill -9 of the embedded store; kill -9 of a
server process. Each run asserts: every sample completes (0 lost, 0 wrong), no response but
503 among the 5xx (server-side, from /metrics of every process; and client-side, in what the
client retried), recovery without restarting the server (same processes, /readyz 200 again),
a clean log (no traceback, no unretrieved error) and the server's RSS bounded. Then hostile
clients against one process: 200 slowloris connections (a byte a second) are closed by the
default header timeout; 20 concurrent 32 MB headers get 431 with the RSS growing < 50 MB;
20,000 headers get 431.

The figures (time to /readyz 503, time to recover, RSS growth, slowloris close times) are
printed and, with HOTPATH_CHAOS_REPORT=PATH, written to PATH as JSON; they are not asserted
against a clock (the machine is shared). Marked `chaos`: `pytest -m chaos` runs the suite
alone (about 2-3 minutes), `-m "not chaos"` leaves it out.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import socket
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.support.engines import is_engine
from tests.support.faults import (
    OwnStore,
    RssWatch,
    bad_statuses,
    never_logged,
    server_on_own_store,
    statuses,
    tree_rss,
)
from tests.support.server import start_server
from tests.support.wait import until

pytest.importorskip("redis", reason="the shared store needs redis-py: pip install 'hotpath[store]'")

from impl.harness import faults, load, presets, procs, watch
from impl.server.store.redis import embedded

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.skipif(embedded.binary() is None, reason=embedded.INSTALL_HINT),
]
SCENARIO = presets.Scenario(
    num_requests=512, max_tokens=16, concurrency=64, max_outstanding=192, client_processes=2,
    distinct_prompts=16, timeout=150.0, router_mode="latency", gen_seconds=1.0,
    max_num_seqs=512, healthz_interval=0.25,
)  # fmt: skip
#: a 5xx other than 503 in what the client retried (asample_500, poll_502, session_504, ...)
_BAD_RETRY = re.compile(r"_(50[0-24-9]|5[1-9][0-9])$")
#: the server processes' RSS may grow this much over a faulted run of 512 small samples
RSS_BOUND = 200 << 20
FIGURES: dict[str, dict] = {}


def _record(name: str, **figures) -> None:
    FIGURES[name] = figures
    print(f"\n{name}: {json.dumps(figures)}")
    path = os.environ.get("HOTPATH_CHAOS_REPORT")
    if path:
        Path(path).write_text(json.dumps(FIGURES, indent=1))


@pytest.fixture(scope="module")
def router():
    with procs.start_router([*SCENARIO.router_args(), "--seed", "0"]) as process:
        yield process


class Load(threading.Thread):
    """The harness's run (client processes, exact checks) against `url`, in a thread."""

    def __init__(self, url: str, router_url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.router_url = url, router_url
        self.result: dict = {}

    def run(self) -> None:
        self.result = load.run_scenario(
            SCENARIO, label="chaos", url=self.url, router_url=self.router_url,
            verify="exact", warmup=0, progress_bar=False,
        )  # fmt: skip

    def wait_in_flight(self, share: float = 0.2) -> None:
        """Return once the engine served `share` of the samples (the rest is in flight)."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            stats = watch.fetch_json(self.router_url + "/stats?") or {}
            if stats.get("served", 0) >= SCENARIO.num_requests * share:
                return
            time.sleep(0.05)
        raise AssertionError("the load never got going")

    def finish(self) -> dict:
        self.join(SCENARIO.timeout + 90)
        assert not self.is_alive(), "the load did not end"
        return self.result


def _serve_processes(pid: int) -> set[int]:
    root = psutil.Process(pid)
    return {p.pid for p in [root, *root.children(recursive=True)] if "serve" in p.cmdline()}


def _status(url: str) -> int:
    try:
        status, _ = watch.get_json(url, timeout=5.0)
    except OSError:
        return 0
    return status


def _time_to(url: str, status: int, since: float) -> float:
    """Seconds from `since` until GET `url` answers `status`."""
    until(lambda: _status(url) == status, deadline=60.0)
    return round(time.monotonic() - since, 3)


def _check(run: dict, server, rss: RssWatch, before: set[int]) -> dict:
    """What every chaos run must show; returns its figures."""
    growth = rss.stop()
    assert run["completed"] == SCENARIO.num_requests, (run["failed"], run["examples"])
    assert not run["failed"], run["examples"]
    bad_retries = {k: v for k, v in run["retries"].items() if _BAD_RETRY.search(k)}
    assert not bad_retries, (bad_retries, run["examples"])
    counts = statuses(server.url)
    assert not bad_statuses(counts), counts
    assert _serve_processes(server.pid) == before  # recovered without a restart
    assert _status(server.url + "/readyz") == 200
    assert growth < RSS_BOUND, growth
    return {
        "completed": run["completed"],
        "retries": run["retries"],
        "answers_503": counts.get(503, 0),
        "rss_growth_mb": round(growth / 2**20, 1),
        "wall_s": round(run["wall_seconds"], 1),
    }


def _clean(log: str) -> None:
    assert not never_logged(log), never_logged(log)


def _under_load(server, router, share: float = 0.2) -> tuple[RssWatch, Load]:
    """The server's RSS watched and the harness's load started, `share` of it served already."""
    rss = RssWatch(server.pid)
    rss.start()
    run = Load(server.url, router.url)
    run.start()
    run.wait_in_flight(share)
    return rss, run


def _store_outage(router, tmp_path, fault) -> tuple[float, float, dict, str]:
    """`fault(engine, readyz_url)` under load on the store of a 2-worker server; it returns the
    seconds to /readyz 503 and ends the outage. Then: those seconds, the seconds to /readyz 200
    once the outage ended, the run's figures (`_check`ed) and the server's log."""
    with server_on_own_store(router.url, str(tmp_path), "--workers", "2") as own:
        server = own.server
        before = _serve_processes(server.pid)
        rss, run = _under_load(server, router)
        to_503 = fault(own.engine, server.url + "/readyz")
        to_200 = _time_to(server.url + "/readyz", 200, time.monotonic())
        figures = _check(run.finish(), server, rss, before)
    return to_503, to_200, figures, own.log


@pytest.mark.slow
def test_the_store_is_killed_and_started_again(router, tmp_path):
    def kill_and_start(engine: OwnStore, readyz: str) -> float:
        killed = time.monotonic()
        engine.kill()
        to_503 = _time_to(readyz, 503, killed)
        time.sleep(2.0)
        engine.start()
        return to_503

    to_503, to_200, figures, log = _store_outage(router, tmp_path, kill_and_start)
    # logged per outage, not per request: at most one line each way per process
    assert 1 <= log.count("is unavailable") <= 2 and log.count("is back after") <= 2, log[-3000:]
    _record("store_kill", readyz_503_after_s=to_503, readyz_200_after_restart_s=to_200, **figures)


@pytest.mark.slow
def test_the_store_is_stalled_and_continued(router, tmp_path):
    def stop_and_continue(engine: OwnStore, readyz: str) -> float:
        stopped = time.monotonic()
        engine.pause()
        try:
            to_503 = _time_to(readyz, 503, stopped)
            time.sleep(max(0.0, 3.0 - (time.monotonic() - stopped)))
        finally:
            engine.resume()
        return to_503

    to_503, to_200, figures, log = _store_outage(router, tmp_path, stop_and_continue)
    assert "no answer within 1 s" in log
    _record("store_stall", readyz_503_after_s=to_503, readyz_200_after_cont_s=to_200, **figures)


@pytest.mark.slow
def test_the_embedded_store_is_killed(router):
    with start_server(router.url, "--workers", "2") as server:
        before = _serve_processes(server.pid)
        (store,) = [p for p in psutil.Process(server.pid).children() if is_engine(p.name())]
        rss, run = _under_load(server, router)
        killed = time.monotonic()
        store.kill()

        def kept() -> dict | None:
            keeper = server.get("/healthz")["store_backend"].get("embedded") or {}
            return keeper if keeper.get("restarts") == 1 and keeper["state"] == "running" else None

        keeper = until(kept, deadline=60.0)
        back = round(time.monotonic() - killed, 3)  # restarted (a ping may not have seen it go)
        figures = _check(run.finish(), server, rss, before)
        assert keeper["last_exit"] == "killed by SIGKILL" and keeper["pid"] != store.pid
        assert not store.is_running() or store.status() != psutil.STATUS_ZOMBIE  # reaped
        log = server.stderr()
    _clean(log)
    _record("embedded_kill", restarted_after_s=back, **figures)


@pytest.mark.slow
def test_a_server_process_is_killed(router):
    """kill -9 of a worker with forwards in flight (the harness's --kill-one-at: one with
    forwards if a probe finds one, else any worker)."""
    with start_server(router.url, "--workers", "2", "--store-lease", "2") as server:
        rss, run = _under_load(server, router, 0.05)  # early: most of the load still to come
        killer = faults.KillOne(server.url, server.pid, 0.0)
        killer.start()
        killer.join(120)
        victim = killer.outcome["killed_pid"]
        assert victim, killer.outcome
        result = run.finish()
        after = until(
            lambda: len(found := _serve_processes(server.pid)) == 3 and found, deadline=60.0
        )
        assert victim not in after  # supervisor and 2 workers, one of them new
        figures = _check(result, server, rss, after)
        # /healthz's store figures are its process's view of the engine, read every 0.2 s: the
        # last taken-over records finish just before the run ends, so wait for a view that
        # counts every completion the client saw, then nothing may be left pending
        store = until(
            lambda: (
                (view := server.get("/healthz")["store"])["completed"] >= result["completed"]
                and view
            ),
            "a store view counting every completion",
            deadline=10.0,
        )
        assert store["pending"] == 0, store
        log = server.stderr()
    _clean(log)
    _record(
        "worker_kill",
        its_forwards_in_flight=killer.outcome.get("its_forwards_in_flight"),
        takeovers=store["takeovers"],
        **figures,
    )


# -- hostile clients against one process -----------------------------------------------------


@pytest.fixture(scope="module")
def single(router):
    with start_server(router.url) as server:
        yield server


def _address(server) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


@pytest.mark.slow
def test_slowloris_connections_are_closed_by_the_header_timeout(single):
    """200 connections sending their head a byte a second: each is answered 408 and closed
    once the default header timeout (10 s, from the connection's opening) has passed; a
    normal request meanwhile is served."""
    head = b"GET /livez HTTP/1.1\r\nHost: slow\r\nX-Pad: " + b"a" * 100 + b"\r\n\r\n"
    opened: dict[socket.socket, float] = {}
    for _ in range(200):
        sock = socket.create_connection(_address(single))
        opened[sock] = time.monotonic()
        sock.setblocking(False)
    closed: dict[socket.socket, float] = {}
    answers: dict[socket.socket, bytes] = {}
    served_meanwhile = None
    start = min(opened.values())
    position, next_byte = 0, start
    with selectors.DefaultSelector() as selector:
        for sock in opened:
            selector.register(sock, selectors.EVENT_READ)
        while len(closed) < len(opened) and time.monotonic() - start < 60:
            if time.monotonic() >= next_byte:  # one more byte on every open connection
                for sock in opened.keys() - closed.keys():
                    with contextlib.suppress(OSError):
                        sock.send(head[position : position + 1])
                position = min(position + 1, len(head) - 3)  # never the end of the head
                next_byte += 1.0
            for key, _ in selector.select(timeout=max(0.0, next_byte - time.monotonic())):
                sock = key.fileobj
                try:
                    data = sock.recv(4096)
                except OSError:
                    data = b""
                if data:
                    answers[sock] = answers.get(sock, b"") + data
                else:
                    closed[sock] = time.monotonic() - opened[sock]
                    selector.unregister(sock)
            if served_meanwhile is None and time.monotonic() - start > 3:
                served_meanwhile = _status(single.url + "/livez")
    for sock in opened:
        sock.close()
    assert len(closed) == 200, f"{200 - len(closed)} still open after 60 s"
    assert len(answers) == 200
    assert all(answer.startswith(b"HTTP/1.1 408") for answer in answers.values()), answers
    assert served_meanwhile == 200
    refused = single.get("/healthz")["http_refused"]
    assert refused["header_timeout"] >= 200, refused
    times = sorted(closed.values())
    _record("slowloris", connections=200, header_timeout_s=10,
            closed_after_open_s_min=round(times[0], 3),
            closed_after_open_s_max=round(times[-1], 3))  # fmt: skip


def _send_and_read(address, data: bytes) -> bytes:
    sock = socket.create_connection(address)

    def send() -> None:
        with contextlib.suppress(OSError):  # closed by the server after its answer
            sock.sendall(data)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    sock.settimeout(60)
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except OSError:
        pass
    sender.join(30)
    sock.close()
    return answer


@pytest.mark.heavy
def test_huge_and_many_headers_get_431_with_bounded_memory(single):
    """20 concurrent 32 MB headers: 431 each, the server's RSS grows < 50 MB; 20,000 headers:
    431; a request after them is served."""
    address = _address(single)
    big = b"GET /livez HTTP/1.1\r\nHost: h\r\nX-Big: " + b"a" * (32 << 20) + b"\r\n\r\n"
    start_rss = tree_rss(single.pid)
    rss = RssWatch(single.pid)
    rss.start()
    answers: list[bytes] = [b""] * 20

    def one(i: int) -> None:
        answers[i] = _send_and_read(address, big)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    growth = rss.stop()
    assert all(a.startswith(b"HTTP/1.1 431") for a in answers), [a[:60] for a in answers]
    assert growth < 50 << 20, growth
    many = b"GET /livez HTTP/1.1\r\nHost: h\r\n" + b"".join(
        b"x-%d: y\r\n" % i for i in range(20_000)
    )
    assert _send_and_read(address, many + b"\r\n").startswith(b"HTTP/1.1 431")
    assert _status(single.url + "/livez") == 200
    _record("huge_headers", concurrent=20, header_mb=32, rss_start_mb=round(start_rss / 2**20, 1),
            rss_growth_mb=round(growth / 2**20, 1))  # fmt: skip
