"""Kept receive buffers: every decoder gives the same Completion from a kept buffer's view as
from bytes (JSON and packed renderings, malformed bodies give the same error), the compiled
decoders read such a view in place and refuse a bytearray without the NUL, and the buffers
are reused, dropped when something still reads them, and bounded when idle."""

from __future__ import annotations

import numpy as np
import pytest

from impl import registry
from impl.decode import DecodeError
from impl.decode import _nogil as nogil
from impl.decode.parity import assert_same
from impl.server.offloop.buffers import STEP, BodyBuffers
from impl.workloads import realtext, synthetic
from tests.decode.test_parity import decoder_params

FAMILY = "decode"
COMPILED = ("simdjson_nogil", "onepass_nogil", "onepass_nogil_avx2")


def _kept(buffers: BodyBuffers, body: bytes) -> memoryview:
    view = buffers.take(len(body))
    view[:] = b"\xff" * len(body)  # a reused buffer holds an earlier body's bytes
    view[:] = body
    return view


def _bodies() -> list[bytes]:
    bodies = [synthetic.body_for(3000, n=2, prompt_logprobs=2, seed=5)]
    if realtext.unavailable_reason("prose") is None:
        bodies.append(realtext.body_for(3000, kind="prose", render_as="packed", seed=5))
    return bodies


@pytest.mark.heavy
@pytest.mark.parametrize("name", decoder_params())
def test_a_kept_buffer_decodes_as_bytes(name):
    decoder = registry.create(FAMILY, name)
    buffers = BodyBuffers()
    for body in _bodies():
        view = _kept(buffers, body)
        assert_same(
            decoder.decode(view, topk_prompt_logprobs=2),
            decoder.decode(body, topk_prompt_logprobs=2),
        )
        buffers.give(view)
    broken = _bodies()[0][:-7]
    view = _kept(buffers, broken)
    with pytest.raises(DecodeError) as from_view:
        decoder.decode(view)
    with pytest.raises(DecodeError) as from_bytes:
        decoder.decode(broken)
    assert str(from_view.value) == str(from_bytes.value)
    buffers.give(view)
    assert buffers.pinned == 0  # no decoder kept a view over the body


@pytest.mark.parametrize(
    "name", [n for n in COMPILED if registry.unavailable_reason(FAMILY, n) is None]
)
def test_compiled_decoders_read_a_kept_buffer_in_place(name):
    decoder = registry.create(FAMILY, name)
    body = _bodies()[0]
    view = _kept(BodyBuffers(), body)
    assert nogil.in_place(view) is view.obj
    whole = view.obj
    assert decoder.fast_path(whole, None, 2, len(body)) is not None
    whole[len(body)] = ord(" ")
    assert nogil.in_place(view) is None  # copied to bytes instead: still decodes
    assert_same(
        decoder.decode(view, topk_prompt_logprobs=2), decoder.decode(body, topk_prompt_logprobs=2)
    )
    with pytest.raises(ValueError, match="NUL"):
        decoder.fast_path(whole, None, 2, len(body))
    with pytest.raises(ValueError, match="NUL"):
        decoder.fast_path(whole, None, 2, len(whole))
    assert nogil.in_place(memoryview(whole)[1 : len(body)]) is None  # not the buffer's start


def test_buffers_are_reused_pinned_and_bounded():
    buffers = BodyBuffers(keep_bytes=3 * STEP)
    first = buffers.take(STEP - 1)
    address = first.obj
    buffers.give(first)
    again = buffers.take(STEP // 2)
    assert again.obj is address and buffers.reused == 1 and len(again) == STEP // 2
    held = np.frombuffer(again, np.uint8)  # something still reads the body
    buffers.give(again)
    assert buffers.pinned == 1 and buffers.idle_bytes() == 0
    del held
    views = [buffers.take(STEP) for _ in range(3)]  # each needs room for its NUL: 2 steps
    assert buffers.made == 4
    for view in views:
        buffers.give(view)
    assert buffers.idle_bytes() <= 3 * STEP
