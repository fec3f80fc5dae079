"""Eager accept (impl/server/accept.py): connections waiting in the listen queue are accepted in
one wake-up, not one per event-loop turn, and every one of them is served."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import urllib.parse

import pytest
import uvloop

from impl.server.accept import EagerAccept
from tests.support.server import start_server

pytestmark = pytest.mark.heavy

WAITING = 50


class _Counting(asyncio.Protocol):
    made = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        type(self).made += 1


async def _turns_to_accept(eager: bool) -> tuple[int, dict[str, int] | None]:
    """Loop turns until WAITING connections, all queued before the loop looks, are made."""
    loop = asyncio.get_running_loop()
    _Counting.made = 0
    server = await loop.create_server(_Counting, "127.0.0.1", 0, backlog=512)
    acceptor = EagerAccept(server.sockets[0], _Counting, limit=512) if eager else None
    if acceptor is not None:
        acceptor.start()
    port = server.sockets[0].getsockname()[1]
    # the kernel completes each handshake and queues the connection: no loop turn needed
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(WAITING)]
    turns = 0
    try:
        while _Counting.made < WAITING and turns < 10 * WAITING:
            await asyncio.sleep(0)
            turns += 1
    finally:
        for client in clients:
            client.close()
        if acceptor is not None:
            acceptor.stop()
        server.close()
        await server.wait_closed()
    return turns, acceptor.stats() if acceptor is not None else None


def test_uvloop_alone_accepts_one_connection_per_turn():
    """Why the module exists: libuv (>= 1.45) accepts one connection per loop turn, so a
    queue of 50 needs about 50 turns (if this fails, libuv changed and the module may go)."""
    turns, _ = uvloop.run(_turns_to_accept(eager=False))
    assert turns >= WAITING - 2


def test_eager_accept_takes_the_whole_queue_in_one_wake_up():
    """With EagerAccept the same 50 queued connections are all made within a few turns."""
    turns, stats = uvloop.run(_turns_to_accept(eager=True))
    assert turns <= 3
    assert stats["accepted"] >= WAITING - 1 and stats["bursts"] == 1


def test_stop_leaves_the_listener_open():
    """Stopping the acceptor closes only its duplicate descriptor: the server still accepts."""

    async def scenario() -> int:
        loop = asyncio.get_running_loop()
        _Counting.made = 0
        server = await loop.create_server(_Counting, "127.0.0.1", 0)
        acceptor = EagerAccept(server.sockets[0], _Counting)
        acceptor.start()
        acceptor.stop()
        port = server.sockets[0].getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            for _ in range(50):
                await asyncio.sleep(0)
                if _Counting.made:
                    break
        server.close()
        await server.wait_closed()
        return _Counting.made

    assert uvloop.run(scenario()) == 1


def _queue_while_stopped(url: str, pid: int, count: int) -> list[bytes]:
    """Stop the server, queue `count` connections each with a GET /healthz, resume it, and
    return each connection's answer (the kernel accepts on the stopped process's behalf)."""
    parts = urllib.parse.urlsplit(url)
    os.kill(pid, signal.SIGSTOP)
    clients = []
    try:
        for _ in range(count):
            client = socket.create_connection((parts.hostname, parts.port), timeout=30)
            client.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
            clients.append(client)
    finally:
        os.kill(pid, signal.SIGCONT)
    answers = []
    for client in clients:
        with contextlib.closing(client):
            chunks = []
            while chunk := client.recv(65536):
                chunks.append(chunk)
            answers.append(b"".join(chunks))
    return answers


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "no-eager"])
def test_a_queued_burst_is_served_and_counted(upstream, eager):
    """64 connections queued while the server was stopped all get 200; with eager accept (the
    default) the server took them in bursts and says so on /healthz, with --no-eager-accept
    it says eager accept is off."""
    args = () if eager else ("--no-eager-accept",)
    with start_server(upstream.url, *args) as server:
        answers = _queue_while_stopped(server.url, server.pid, 64)
        assert all(answer.startswith(b"HTTP/1.1 200") for answer in answers)
        accept = server.get("/healthz")["accept"]
    if eager:
        assert accept["eager"] is True
        assert accept["accepted"] >= 63 and accept["bursts"] >= 1
    else:
        assert accept == {"eager": False, "accepted": 0, "bursts": 0}
