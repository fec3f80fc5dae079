"""The asample intake (impl/server/intake.py): at most `per_turn` asamples proceed per event-loop
turn, in arrival order, while polls and fetches are never held. Counted in loop turns and in the
order answers arrive, never timed."""

from __future__ import annotations

import asyncio
import json
import selectors
import socket

import pytest

from impl.server.intake import Intake
from tests.support.server import API_KEY, Api, start_server

pytestmark = pytest.mark.heavy


async def _turns_of(
    intake: Intake, count: int, *, cancel: int | None = None, finishing: bool = False
) -> list[int]:
    """Start `count` asample-like tasks at once (after a poll or fetch was served, with
    `finishing`); the loop turn each was admitted in (a callback chain counts the turns), in the
    order they were started (-1: cancelled)."""
    loop = asyncio.get_running_loop()
    if finishing:
        intake.finishing()
    turn = 0
    ticking = True

    def tick() -> None:
        nonlocal turn
        turn += 1
        if ticking:
            loop.call_soon(tick)

    loop.call_soon(tick)
    admitted: list[int] = [-1] * count

    async def one(i: int) -> None:
        await intake.turn()
        admitted[i] = turn

    tasks = [asyncio.ensure_future(one(i)) for i in range(count)]
    if cancel is not None:
        await asyncio.sleep(0)  # every task is waiting or admitted
        tasks[cancel].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    ticking = False
    return admitted


def test_at_most_per_turn_asamples_proceed_per_loop_turn_in_arrival_order():
    intake = Intake(per_turn=4, contended=3600)
    admitted = asyncio.run(_turns_of(intake, 10, finishing=True))
    per_turn = {t: admitted.count(t) for t in set(admitted)}
    assert max(per_turn.values()) <= 4 and len(per_turn) >= 3  # 10 need three turns of 4
    assert admitted == sorted(admitted)  # first come, first admitted
    stats = intake.stats()
    assert stats["admitted"] == 10 and stats["deferred"] == 6 and stats["waiting"] == 0
    assert stats["peak_waiting"] == 6


def test_no_bound_admits_everything_at_once():
    intake = Intake(per_turn=0)
    admitted = asyncio.run(_turns_of(intake, 50, finishing=True))
    assert len(set(admitted)) == 1 and intake.stats()["deferred"] == 0


def test_nothing_going_out_nothing_bounded():
    """No poll or fetch served lately (a burst's first submissions, an engine generating):
    every asample proceeds in the turn it came, however many; after a fetch, 4 per turn."""
    intake = Intake(per_turn=4, contended=3600)
    admitted = asyncio.run(_turns_of(intake, 50))
    assert len(set(admitted)) == 1 and intake.stats()["deferred"] == 0
    admitted = asyncio.run(_turns_of(intake, 50, finishing=True))
    assert max(admitted.count(t) for t in set(admitted)) <= 4
    assert Intake(per_turn=4, contended=0).stats()["deferred"] == 0


def test_waiters_go_at_once_when_nothing_goes_out_any_more():
    """Asamples held back while a fetch was being served all proceed together once the
    contention has passed (nothing left to put first)."""

    async def go() -> list[int]:
        intake = Intake(per_turn=2, contended=3600)
        intake.finishing()
        waiting = [asyncio.ensure_future(intake.turn()) for _ in range(10)]
        await asyncio.sleep(0)
        intake.contended = 0
        intake.finishing()  # the window closes now
        await asyncio.gather(*waiting)
        return [intake.stats()["turns"], intake.stats()["admitted"]]

    turns, admitted = asyncio.run(go())
    assert admitted == 10 and turns <= 3


def test_a_cancelled_waiter_gives_its_place_to_the_next():
    intake = Intake(per_turn=2, contended=3600)
    admitted = asyncio.run(_turns_of(intake, 7, cancel=3, finishing=True))
    assert admitted[3] == -1  # the cancelled one never proceeds
    rest = [t for t in admitted if t != -1]
    assert len(rest) == 6 and max(rest.count(t) for t in set(rest)) <= 2
    assert intake.stats()["admitted"] == 6 and intake.stats()["waiting"] == 0


def test_negative_bound_is_refused():
    with pytest.raises(ValueError, match="per_turn"):
        Intake(per_turn=-1)


def _request(path: str, body: bytes, port: int, accept: str = "") -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-API-Key: {API_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{accept}\r\n"
    )
    return head.encode() + body


@pytest.mark.slow
def test_a_fetch_is_answered_while_a_burst_of_asamples_waits_its_turns(upstream):
    """A fetch, 200 asamples and another fetch of a finished result, written at once on 202
    open connections to a server admitting 2 asamples per turn while results go out: the last
    fetch is answered before most of the asamples (it is never held), every asample is answered
    all the same, and /healthz counts the deferred ones."""
    with start_server(upstream.url, "--intake-per-turn", "2") as server:
        api = Api(server.url)
        ssid = api.sampling_session()
        done = api.asample(ssid, 1, seed=1).json()["request_id"]
        assert api.result(done).status_code == 200  # finished and stored
        port = int(server.url.rsplit(":", 1)[1])
        requests = [
            _request(
                "/api/v1/asample",
                json.dumps(
                    {
                        "sampling_session_id": ssid,
                        "seq_id": seq_id,
                        "num_samples": 1,
                        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
                        "sampling_params": {"max_tokens": 4, "seed": seq_id},
                    }
                ).encode(),
                port,
            )
            for seq_id in range(2, 202)
        ]
        fetch = _request(
            "/api/v1/retrieve_future",
            json.dumps({"request_id": done}).encode(),
            port,
            "Accept: application/x-protobuf\r\n",
        )
        requests = [fetch, *requests, fetch]  # a result going out, the burst, then another
        sockets = [socket.create_connection(("127.0.0.1", port)) for _ in requests]
        selector = selectors.DefaultSelector()
        try:
            for i, sock in enumerate(sockets):
                selector.register(sock, selectors.EVENT_READ, i)
            for sock, request in zip(sockets, requests, strict=True):
                sock.sendall(request)
            order: list[int] = []  # request indices in the order their answers arrived
            while len(order) < len(sockets):
                events = selector.select(timeout=60)
                assert events, f"{len(sockets) - len(order)} requests unanswered after 60 s"
                for key, _ in events:
                    reply = key.fileobj.recv(65536)
                    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
                    order.append(key.data)
                    selector.unregister(key.fileobj)
        finally:
            selector.close()
            for sock in sockets:
                sock.close()
        assert sorted(order) == list(range(202))
        assert order.index(201) < 100, order.index(201)  # the last fetch: not behind the burst
        intake = api.healthz()["intake"]
        assert intake["per_turn"] == 2 and intake["deferred"] > 0
        assert intake["admitted"] == 201 and intake["waiting"] == 0
        api.close()
