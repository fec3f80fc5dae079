"""Pool family parity: every forwarder against the reference, over real HTTP to the fake router.

The upstream is `hotpath router` in its own process on loopback (impl.harness.procs); per-request
headers choose the answer's size, an echo of the request, a delay, or a fault.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from impl import registry
from impl.harness.procs import Proc, start_router
from impl.harness.router.bodies import filler_body
from impl.pool import ConnectError, ReadError, Reply

pytestmark = pytest.mark.heavy

FAMILY = "pool"
REFERENCE = registry.reference(FAMILY)
SIZES = (0, 1, 100, 65_536, 1_048_583, 25 * 1024 * 1024)
ECHO_SIZES = (0, 10_000, 3 * 1024 * 1024 + 5)
PATH = "/v1/completions"
TIMEOUT = 120.0  # a hung forwarder fails the test instead of blocking the suite


def _param(name: str) -> Any:
    reason = registry.unavailable_reason(FAMILY, name)
    return pytest.param(name, marks=pytest.mark.skipif(reason is not None, reason=reason or ""))


NAMES = [_param(name) for name in registry.names(FAMILY)]


def forward(
    name: str, work: Callable[[Any], Awaitable[Any]], *, hang_after: float = TIMEOUT, **options: Any
) -> Any:
    """Run `work(forwarder)` in a fresh event loop, closing the forwarder whatever happens; after
    `hang_after` seconds it is called hung (asyncio.TimeoutError)."""

    async def main() -> Any:
        forwarder = registry.create(FAMILY, name, **options)
        try:
            return await asyncio.wait_for(work(forwarder), hang_after)
        finally:
            await forwarder.aclose()

    return asyncio.run(main())


def router_stats(router: Proc, *, reset: bool = False) -> dict[str, Any]:
    """The router's `/stats` (with `reset`: then zero its peaks and counters)."""
    query = "?reset=1" if reset else ""
    with urllib.request.urlopen(f"{router.url}/stats{query}", timeout=10) as response:
        return json.loads(response.read())


def wait_idle(router: Proc) -> None:
    """Wait until the router has seen every earlier connection close, then zero its peaks."""
    deadline = time.monotonic() + 10
    while router_stats(router)["connections"] and time.monotonic() < deadline:
        time.sleep(0.05)
    router_stats(router, reset=True)


@pytest.fixture(scope="module")
def router() -> Any:
    with start_router(["--mode", "instant", "--body-bytes", "256"]) as process:
        yield process


@pytest.fixture(scope="module")
def reference_replies(router: Proc) -> dict[tuple[str, int], Reply]:
    """The reference's replies for every body size and echo size, fetched once."""

    async def work(client: Any) -> dict[tuple[str, int], Reply]:
        replies = {}
        for size in SIZES:
            headers = {"X-Hotpath-Body-Bytes": str(size)}
            replies["body", size] = await client.post(router.url + PATH, b"{}", headers)
        for size in ECHO_SIZES:
            body = filler_body(size)
            replies["echo", size] = await client.post(
                router.url + PATH, body, {"X-Hotpath-Echo": "1"}
            )
        for fault in ("500", "html"):
            headers = {"X-Hotpath-Fault": fault}
            replies[fault, 0] = await client.post(router.url + PATH, b"{}", headers)
        return replies

    return forward(REFERENCE, work, max_connections=4)


@pytest.mark.parametrize("name", NAMES)
def test_bodies_match_reference(name: str, router: Proc, reference_replies: dict) -> None:
    """Same status, content type and bytes as the reference, answers of 0 B to 25 MB."""

    async def work(client: Any) -> list[Reply]:
        return [
            await client.post(
                router.url + PATH, b'{"prompt": [1]}', {"X-Hotpath-Body-Bytes": str(s)}
            )
            for s in SIZES
        ]

    replies = forward(name, work, max_connections=4)
    for size, reply in zip(SIZES, replies, strict=True):
        expected = reference_replies["body", size]
        assert (reply.status, reply.content_type) == (expected.status, expected.content_type)
        assert (reply.status, reply.content_type) == (200, "application/json")
        assert len(reply.body) == size
        assert reply.body == expected.body == filler_body(size), f"{name}: {size} B body differs"
        assert type(reply.body) is bytes


@pytest.mark.parametrize("name", NAMES)
def test_request_bodies_reach_upstream(name: str, router: Proc, reference_replies: dict) -> None:
    """The request body arrives whole (the router echoes it), 0 B to 3 MB."""

    async def work(client: Any) -> list[Reply]:
        url = router.url + PATH
        return [await client.post(url, filler_body(s), {"X-Hotpath-Echo": "1"}) for s in ECHO_SIZES]

    for size, reply in zip(ECHO_SIZES, forward(name, work), strict=True):
        assert reply == reference_replies["echo", size]
        assert reply.body == filler_body(size)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("fault", "status"), [("500", 500), ("html", 502)])
def test_error_status_is_a_reply(
    name: str, fault: str, status: int, router: Proc, reference_replies: dict
) -> None:
    """A 5xx comes back as a Reply with that status, content type and body, not an exception."""
    reply = forward(name, lambda c: c.post(router.url + PATH, b"{}", {"X-Hotpath-Fault": fault}))
    assert reply == reference_replies[fault, 0]
    assert reply.status == status and reply.body


@pytest.mark.parametrize("name", NAMES)
def test_refused_connection_is_connect_error(name: str) -> None:
    """Nothing listens on the port: ConnectError (safe to retry), not ReadError."""
    with socket.socket() as bound:  # bound, never listening: the kernel refuses connects
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}{PATH}"
        with pytest.raises(ConnectError) as info:
            forward(name, lambda c: c.post(url, b"{}", {}))
    kind, _, detail = str(info.value).partition(": ")
    assert kind and detail.strip(), str(info.value)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("fault", ["truncate", "reset"])
def test_failure_after_sending_is_read_error(name: str, fault: str, router: Proc) -> None:
    """Upstream closes mid-answer or resets after reading the request: ReadError, whose message
    names the library's exception class and says what happened (never empty)."""
    with pytest.raises(ReadError) as info:
        forward(name, lambda c: c.post(router.url + PATH, b"{}", {"X-Hotpath-Fault": fault}))
    kind, _, detail = str(info.value).partition(": ")
    assert kind.isidentifier() and detail.strip(), str(info.value)


@pytest.mark.parametrize("name", NAMES)
def test_usable_after_failures(name: str, router: Proc) -> None:
    """A forwarder keeps working after a refused connect and a reset on the same pool."""

    async def work(client: Any) -> Reply:
        for headers in ({"X-Hotpath-Fault": "reset"}, {"X-Hotpath-Fault": "truncate"}):
            with pytest.raises(ReadError):
                await client.post(router.url + PATH, b"{}", headers)
        return await client.post(router.url + PATH, b"{}", {"X-Hotpath-Body-Bytes": "10"})

    assert forward(name, work, max_connections=1) == Reply(200, filler_body(10), "application/json")


@pytest.mark.parametrize("name", NAMES)
def test_max_connections_respected(name: str, router: Proc) -> None:
    """64 concurrent slow requests through max_connections=8: the upstream never sees more."""
    wait_idle(router)

    async def work(client: Any) -> list[Reply]:
        headers = {"X-Hotpath-Delay": "0.05", "X-Hotpath-Body-Bytes": "32"}
        return await asyncio.gather(
            *(client.post(router.url + PATH, b"{}", headers) for _ in range(64))
        )

    replies = forward(name, work, max_connections=8)
    seen = router_stats(router)
    assert all(r == Reply(200, filler_body(32), "application/json") for r in replies)
    assert 2 <= seen["peak_connections"] <= 8, seen
    assert seen["peak_in_flight"] <= 8, seen


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.slow
def test_queued_behind_the_cap_waits_past_connect_timeout(name: str, router: Proc) -> None:
    """The wait for a free slot has no deadline: 4 requests of 1.5 s through 1 connection with a
    0.5 s connect timeout all complete (the last waits 4.5 s) instead of failing as ConnectError."""
    wait_idle(router)

    async def work(client: Any) -> list[Reply]:
        headers = {"X-Hotpath-Delay": "1.5", "X-Hotpath-Body-Bytes": "16"}
        return await asyncio.gather(
            *(client.post(router.url + PATH, b"{}", headers) for _ in range(4))
        )

    replies = forward(name, work, max_connections=1, connect_timeout=0.5)
    assert replies == [Reply(200, filler_body(16), "application/json")] * 4
    assert router_stats(router)["peak_in_flight"] == 1


@pytest.mark.slow  # httpx and httpx2 take about a minute each here; the others about a second
@pytest.mark.parametrize("name", NAMES)
def test_2048_concurrent_all_complete(name: str, router: Proc) -> None:
    """A burst of 2048 concurrent requests (2048 connects at once) all complete, none lost.

    The upstream answers at once, yet all 2048 wait in the client's pool together, which is
    where httpx's per-request cost grows (the pool benchmark measures that; this checks outcomes).
    """
    wait_idle(router)

    async def work(client: Any) -> list[Reply]:
        url = router.url + PATH
        headers = {"X-Hotpath-Body-Bytes": "64"}
        return await asyncio.gather(*(client.post(url, b"{}", headers) for _ in range(2048)))

    # httpx took 81 s here (quiet machine) and httpx2 45 s: the usual 120 s hang bound would fail
    # httpx on a machine 1.5x slower, so this burst gets 480 s (the suite's own timeout is 600 s).
    replies = forward(name, work, hang_after=480.0, max_connections=2048)
    assert len(replies) == 2048
    assert all(r == Reply(200, filler_body(64), "application/json") for r in replies)
    seen = router_stats(router)
    assert seen["served"] == 2048, seen
    assert 1 < seen["peak_connections"] <= 2048, seen


def test_barrier_router_holds_answers_until_n_arrive() -> None:
    """The benchmark's premise: in barrier mode nobody is answered before the Nth request."""
    with start_router(["--mode", "barrier", "--barrier", "8", "--body-bytes", "16"]) as barrier:

        async def work(client: Any) -> list[Reply]:
            url = barrier.url + PATH
            first = [asyncio.ensure_future(client.post(url, b"{}", {})) for _ in range(7)]
            deadline = time.monotonic() + 10
            while router_stats(barrier)["in_flight"] < 7 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)
            assert not any(task.done() for task in first), "answered before the barrier filled"
            return await asyncio.gather(*first, client.post(url, b"{}", {}))

        replies = forward(REFERENCE, work, max_connections=8)
        assert replies == [Reply(200, filler_body(16), "application/json")] * 8
        assert router_stats(barrier)["peak_in_flight"] == 8


# -- admit: the hook between an answer's headers and its body ---------------------------------


class Refused(Exception):
    """What the tests' `admit` raises: the contract says it propagates unchanged."""


@pytest.mark.parametrize("name", NAMES)
def test_admit_sees_status_and_length_before_the_body(
    name: str, router: Proc, reference_replies: dict
) -> None:
    """`admit(status, Content-Length)` is awaited once per answer, before its body is read, with
    the reference's arguments; the Reply is the same as without it (0 B to 25 MB, and a 500)."""
    cases = [{"X-Hotpath-Body-Bytes": str(size)} for size in SIZES]
    cases.append({"X-Hotpath-Fault": "500"})

    async def work(client: Any) -> list[tuple[Reply, list[tuple[int, int | None]]]]:
        out = []
        for headers in cases:
            seen: list[tuple[int, int | None]] = []

            async def admit(status: int, length: int | None, seen: list = seen) -> None:
                seen.append((status, length))
                await asyncio.sleep(0)

            out.append((await client.post(router.url + PATH, b"{}", headers, admit), seen))
        return out

    got = forward(name, work, max_connections=2)
    expected = forward(REFERENCE, work, max_connections=2)
    assert [seen for _, seen in got] == [seen for _, seen in expected]
    for (reply, seen), size in zip(got, SIZES, strict=False):
        assert reply == reference_replies["body", size]
        assert seen == [(200, size)]
    assert got[-1][0] == reference_replies["500", 0] and got[-1][1][0][0] == 500


@pytest.mark.parametrize("name", NAMES)
def test_admit_then_a_body_cut_short_is_read_error(name: str, router: Proc) -> None:
    """Admitted with the promised length of a 4 MiB answer, then the upstream closes after half
    of it: ReadError (the caller gives back what it admitted)."""
    seen: list[tuple[int, int | None]] = []
    headers = {"X-Hotpath-Fault": "truncate", "X-Hotpath-Body-Bytes": str(4 << 20)}

    async def admit(status: int, length: int | None) -> None:
        seen.append((status, length))

    with pytest.raises(ReadError):
        forward(name, lambda c: c.post(router.url + PATH, b"{}", headers, admit))
    assert seen == [(200, 4 << 20)]


@pytest.mark.parametrize("name", NAMES)
def test_an_error_in_admit_propagates_and_the_pool_goes_on(name: str, router: Proc) -> None:
    """What `admit` raises reaches the caller as it is (not a ForwardError), and the next
    request through the same single connection slot completes."""

    async def refuse(status: int, length: int | None) -> None:
        raise Refused(f"{status} {length}")

    async def work(client: Any) -> Reply:
        headers = {"X-Hotpath-Body-Bytes": str(3 << 20)}
        with pytest.raises(Refused, match=f"200 {3 << 20}"):
            await client.post(router.url + PATH, b"{}", headers, refuse)
        return await client.post(router.url + PATH, b"{}", {"X-Hotpath-Body-Bytes": "10"})

    assert forward(name, work, max_connections=1) == Reply(200, filler_body(10), "application/json")


BACKPRESSURE_BODY = 64 << 20


async def _slow_upstream(size: int, *, chunked: bool) -> tuple[Any, dict[str, Any]]:
    """An HTTP/1.1 upstream in this event loop that answers every POST with `size` bytes,
    counting the bytes the kernel took from it (write buffer limit 0: `drain` returns only once
    every byte written is in the socket)."""
    state: dict[str, Any] = {"sent": 0, "finished": asyncio.Event()}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            key, _, value = line.partition(b":")
            if key.strip().lower() == b"content-length":
                length = int(value)
        await reader.readexactly(length)
        writer.transport.set_write_buffer_limits(0)
        framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % size
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + framing + b"\r\n\r\n"
        )
        piece = b"x" * (256 << 10)
        while state["sent"] < size:
            part = piece[: size - state["sent"]]
            writer.write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
            await writer.drain()
            state["sent"] += len(part)
        if chunked:
            writer.write(b"0\r\n\r\n")
        await writer.drain()
        state["finished"].set()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, state


async def _until_still(state: dict[str, Any], seconds: float = 0.4, limit: float = 15.0) -> int:
    """The upstream's sent count once it stopped growing for `seconds` (or after `limit`)."""
    deadline = time.monotonic() + limit
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        if state["sent"] != last:
            last, since = state["sent"], time.monotonic()
        elif time.monotonic() - since >= seconds:
            break
        await asyncio.sleep(0.05)
    return last


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_the_body_waits_on_the_socket_while_admit_waits(name: str, chunked: bool) -> None:
    """While `admit` waits, the forwarder reads at most its own small buffer of a 64 MiB answer:
    the rest stays with the sender, held by TCP flow control (the upstream's writes stall), and
    once admitted the whole body arrives. Without Content-Length, `admit` gets None."""

    async def main() -> tuple[int, list[Any], Reply]:
        server, state = await _slow_upstream(BACKPRESSURE_BODY, chunked=chunked)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}{PATH}"
        forwarder = registry.create(FAMILY, name, max_connections=1)
        seen: list[Any] = []

        async def admit(status: int, length: int | None) -> None:
            seen.append((status, length, await _until_still(state)))
            seen.append(state["finished"].is_set())

        try:
            reply = await asyncio.wait_for(forwarder.post(url, b"{}", {}, admit), TIMEOUT)
        finally:
            await forwarder.aclose()
            server.close()
        return state["sent"], seen, reply

    sent, seen, reply = asyncio.run(main())
    (status, length, sent_while_waiting), finished_while_waiting = seen
    assert (status, length) == (200, None if chunked else BACKPRESSURE_BODY)
    assert not finished_while_waiting
    # kernel buffers (send + receive) and the library's read buffer: a few MiB, not 64
    assert sent_while_waiting < 16 << 20, f"{name} took {sent_while_waiting:,} B before admit"
    assert sent == BACKPRESSURE_BODY and len(reply.body) == BACKPRESSURE_BODY


@pytest.mark.parametrize("name", NAMES)
def test_receive_buffer_is_accepted_by_every_forwarder(name: str, router: Proc) -> None:
    """The `receive_buffer` option: every forwarder takes it and answers the same (aiohttp and
    httpx-aiohttp set it as SO_RCVBUF, the kernel doubling it; the others keep autotuning)."""
    headers = {"X-Hotpath-Body-Bytes": str(3 << 20)}
    reply = forward(
        name, lambda c: c.post(router.url + PATH, b"{}", headers), receive_buffer=1 << 17
    )
    assert reply == Reply(200, filler_body(3 << 20), "application/json")


def test_receive_buffer_sockets_set_so_rcvbuf() -> None:
    """aiohttp's socket factory for `receive_buffer`; None leaves aiohttp's own sockets."""
    import socket as socket_module

    from impl.pool._common import Options, receive_buffer_sockets

    assert receive_buffer_sockets(None) is None
    make = receive_buffer_sockets(1 << 17)
    info = (socket_module.AF_INET, socket_module.SOCK_STREAM, 6, "", ("127.0.0.1", 0))
    with make(info) as sock:
        size = sock.getsockopt(socket_module.SOL_SOCKET, socket_module.SO_RCVBUF)
    assert size == 2 << 17  # Linux doubles what it is given (its bookkeeping)
    with pytest.raises(ValueError, match="receive_buffer"):
        Options(receive_buffer=0)
