"""The compiled decoders' output buffers (`impl/decode/_native/common/buffers.h`).

The arrays a compiled decoder returns wrap OutputBuffers whose blocks come back to a small pool
when their last reference goes, for the next decode to copy into. What the pool must never do:
hand out a block an array still uses, keep more than it says, or hide memory from tracemalloc.
Every test runs for each compiled decoder; an unavailable one skips with its hint.
"""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

from impl.workloads import synthetic
from tests.decode.test_compiled import REFERENCE, compiled  # noqa: F401 (the fixture)
from tests.decode.test_parity import assert_same

TOKENS = 40_000  # 160,000 bytes per array: pooled (at least 64 KiB)
POOL_BLOCKS, POOL_BYTES = 16, 64 << 20


def _arrays(completion) -> list[np.ndarray]:
    return [a for s in completion.sequences for a in (s.tokens, s.logprobs)]


@pytest.mark.heavy
def test_arrays_are_writable_and_their_own(compiled):  # noqa: F811
    """As with the bytearrays before: writable arrays, and writing to one changes no other."""
    body = synthetic.body_for(TOKENS, kind="vllm", seed=1)
    first = compiled.decoder.decode(body)
    second = compiled.decoder.decode(body)
    for a in _arrays(first):
        assert a.flags.writeable
        a[:] = 0
    assert_same(second, REFERENCE.decode(body))


@pytest.mark.slow
def test_a_block_is_reused_only_after_its_arrays_are_gone(compiled):  # noqa: F811
    """Blocks of dropped results are handed out again; those of live arrays never are: arrays
    held across later decodes keep their values."""
    held_body = synthetic.body_for(TOKENS, kind="vllm", seed=2)
    held = compiled.decoder.decode(held_body)
    snapshot = [a.copy() for a in _arrays(held)]
    reused = compiled.ext.pool_stats()[2]
    for seed in range(4):
        body = synthetic.body_for(TOKENS, kind="vllm", seed=10 + seed)
        got = compiled.decoder.decode(body)
        assert_same(got, REFERENCE.decode(body))
        del got
        gc.collect()
    assert compiled.ext.pool_stats()[2] >= reused + 6  # the last three decodes took pooled blocks
    for a, want in zip(_arrays(held), snapshot, strict=True):
        assert np.array_equal(a, want)
    assert_same(held, REFERENCE.decode(held_body))


@pytest.mark.heavy
def test_the_pool_keeps_at_most_its_bounds(compiled):  # noqa: F811
    """Dropping many results at once: the pool keeps at most 16 blocks and 64 MiB."""
    body = synthetic.body_for(TOKENS, kind="vllm", seed=3)
    results = [compiled.decoder.decode(body) for _ in range(POOL_BLOCKS)]  # 32 blocks
    del results
    gc.collect()
    blocks, kept, _ = compiled.ext.pool_stats()
    assert 0 < blocks <= POOL_BLOCKS
    assert kept <= POOL_BYTES


@pytest.mark.heavy
def test_tracemalloc_sees_the_buffers(compiled):  # noqa: F811
    """The blocks are allocated where tracemalloc traces them (as the bytearrays were): of 40
    arrays held at once, at most 16 can come from blocks allocated before tracing started."""
    body = synthetic.body_for(TOKENS, kind="vllm", seed=4)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        held = [compiled.decoder.decode(body) for _ in range(20)]
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    per_array = TOKENS * 4
    assert grown >= (2 * len(held) - POOL_BLOCKS) * per_array


def test_two_builds_compared_by_their_arrays_contents(compiled):  # noqa: F811
    """`python -m impl.probes.decode_builds` compares two builds' answers by their bytes (the
    buffers themselves compare by identity): a build against itself, loaded a second time from
    its file, agrees; an answer with one value changed does not."""
    from impl.probes.decode_builds import _contents, compare, load_build

    module = compiled.ext.__name__.rsplit(".", 1)[1]
    again = load_build(compiled.ext.__file__, module)
    body = synthetic.body_for(300, kind="vllm", seed=5)
    assert compare(compiled.ext, again, body, rounds=1)["median_ratio"] > 0
    got = compiled.fast_path(body)
    ids = bytearray(got[0][0][0])
    ids[0] ^= 1
    changed = ([(ids, *got[0][0][1:])], *got[1:])
    assert _contents(changed) != _contents(got)
    assert _contents(compiled.fast_path(body)) == _contents(got)
