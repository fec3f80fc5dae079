"""The off-loop contract (impl.server.offloop.decoding): every design is a `Decoding`, and the
loop's path (`through_loop`) settles the hold before converting and says which failures came
after the router answered.

The designs' real paths (a real pool, a fake router on a socket, child processes) are in
test_processes.py and test_fetch.py; here `post` is the injected callable the forward passes.
"""

from __future__ import annotations

import asyncio

import pytest

from impl import registry
from impl.pool import Reply
from impl.server import offloop
from impl.server.offloop.decoding import Call, DecodeJob, Decoding, through_loop
from impl.server.upstream import UpstreamFailed

JOB = DecodeJob(None, 1, 0, False)


@pytest.mark.parametrize("design", ["inline", "threads", "processes", "fetch"])
def test_every_design_is_a_decoding(design):
    decoder = registry.create("decode", registry.reference("decode"))
    encoder = registry.create("encode", registry.reference("encode"))
    made = offloop.create(
        design, decoder=decoder, encoder=encoder, decoder_name=registry.reference("decode"),
        encoder_name=registry.reference("encode"), count=1, min_bytes=0, pool_name="httpx",
    )  # fmt: skip
    assert isinstance(made, Decoding) and made.name == design
    assert not hasattr(made, "to_proto") and not hasattr(made, "fetches")


class _Hold:
    def __init__(self) -> None:
        self.settled: list[int] = []

    async def __call__(self, status: int, length: int | None) -> None:
        return None

    def settle(self, actual: int) -> None:
        self.settled.append(actual)


def _call(reply: Reply | Exception, hold: _Hold) -> Call:
    async def post(request: bytes, admit: _Hold) -> Reply:
        assert admit is hold
        if isinstance(reply, Exception):
            raise reply
        return reply

    return Call("http://127.0.0.1:1/v1/completions", b"{}", JOB, 100, hold, post)


def test_the_hold_is_settled_before_the_body_converts():
    hold, seen = _Hold(), []

    async def convert(body: bytes, job: DecodeJob) -> tuple[bytes, float, float]:
        seen.append(list(hold.settled))
        return b"proto", 0.5, 0.25

    got = asyncio.run(through_loop(_call(Reply(200, b"x" * 42, "application/json"), hold), convert))
    assert seen == [[42]]
    assert (got.payload, got.failure, got.body_bytes, got.attempts) == (b"proto", None, 42, 0)
    assert (got.decode_seconds, got.encode_seconds) == (0.5, 0.25) and got.upstream_seconds >= 0


def test_no_answer_is_raised_an_answer_that_fails_is_returned():
    """A request the router did not answer raises; a 5xx answer, an unreadable body or a bug
    in the conversion comes back as the failure, with the answered body's size."""

    async def convert(body: bytes, job: DecodeJob) -> tuple[bytes, float, float]:
        if body == b"bug":
            raise KeyError("a bug")
        raise UpstreamFailed("unreadable", "decode")

    with pytest.raises(UpstreamFailed, match="refused"):
        asyncio.run(through_loop(_call(UpstreamFailed("refused", "connect"), _Hold()), convert))
    for body, status, kind in ((b"busy", 503, "http_5xx"), (b"{", 200, "decode")):
        got = asyncio.run(through_loop(_call(Reply(status, body, "text/plain"), _Hold()), convert))
        assert isinstance(got.failure, UpstreamFailed) and got.failure.kind == kind
        assert got.body_bytes == len(body) and got.payload == b""
    got = asyncio.run(through_loop(_call(Reply(200, b"bug", "text/plain"), _Hold()), convert))
    assert isinstance(got.failure, KeyError)
