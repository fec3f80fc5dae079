"""Encode family: every encoder gives the reference's bytes; bad input fails before any byte;
every proto->JSON derivation gives the reference's JSON value."""

from __future__ import annotations

import importlib.util
import json
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from impl import registry
from impl.decode import Completion, Sequence, TopK
from impl.encode import JSON_REFERENCE, json_implementation, proto_to_json
from tests.support.encode_corpus import (
    CASES,
    CORPUS,
    as_float32,
    encoder_params,
    expected_json,
    json_params,
    same_float32,
)

pytestmark = pytest.mark.skipif(
    registry.unavailable_reason("encode", registry.reference("encode")) is not None,
    reason=f"the reference encoder cannot run: {registry.unavailable_reason('encode', 'protobuf')}",
)


@pytest.fixture(scope="module")
def reference_bytes() -> dict[str, bytes]:
    encoder = registry.create("encode", registry.reference("encode"))
    return {case: encoder.encode(CORPUS[case]) for case in CASES}


@pytest.mark.parametrize("name", encoder_params())
def test_same_bytes_as_reference(name, reference_bytes):
    """Byte-for-byte equality on every corpus Completion."""
    encoder = registry.create("encode", name)
    for case in CASES:
        assert encoder.encode(CORPUS[case]) == reference_bytes[case], case


def test_reference_bytes_round_trip_through_protobuf(reference_bytes):
    """The reference's bytes parse back to the Completion's buffers (independent of any SDK)."""
    from impl.encode import sample_pb2

    for case in CASES:
        completion = CORPUS[case]
        msg = sample_pb2.SampleResponse.FromString(reference_bytes[case])
        assert len(msg.sequences) == len(completion.sequences)
        for got, seq in zip(msg.sequences, completion.sequences, strict=True):
            assert got.stop_reason == {"stop": 0, "length": 1}[seq.stop_reason]
            assert np.array_equal(np.frombuffer(got.tokens, "<i4"), seq.tokens)
            assert same_float32(np.frombuffer(got.logprobs, "<f4"), seq.logprobs)
            assert got.HasField("logprobs")
        assert msg.HasField("prompt_logprobs") == (completion.prompt_logprobs is not None)
        if completion.prompt_logprobs is not None:
            prompt = np.frombuffer(msg.prompt_logprobs, "<f4")
            assert same_float32(prompt, completion.prompt_logprobs)
        topk = completion.topk_prompt_logprobs
        assert msg.HasField("topk_prompt_logprobs") == (topk is not None)
        if topk is not None:
            got = msg.topk_prompt_logprobs
            assert (got.length, got.k) == topk.token_ids.shape
            ids = np.frombuffer(got.token_ids, "<i4")
            assert np.array_equal(ids, topk.token_ids.ravel())
            assert same_float32(np.frombuffer(got.logprobs, "<f4"), topk.logprobs.ravel())


def _seq(n: int, m: int | None = None, reason: str = "stop") -> Sequence:
    m = n if m is None else m
    return Sequence(np.arange(n, dtype=np.int32), np.zeros(m, np.float32), reason)  # type: ignore[arg-type]


BAD = {
    "length-mismatch": (Completion([_seq(3), _seq(5, 4)]), "5 tokens but 4 logprobs"),
    "unknown-stop-reason": (Completion([_seq(2, reason="eos")]), "unknown stop reason 'eos'"),
    "tokens-2d": (
        Completion([Sequence(np.zeros((2, 2), np.int32), np.zeros(4, np.float32), "stop")]),
        "must be 1-D",
    ),
    "tokens-float": (
        Completion([Sequence(np.zeros(2, np.float32), np.zeros(2, np.float32), "stop")]),
        "must hold integers",
    ),
    "tokens-outside-int32": (
        Completion([Sequence(np.array([1, 2**31]), np.zeros(2, np.float32), "length")]),
        "outside int32",
    ),
    "prompt-2d": (Completion([_seq(1)], prompt_logprobs=np.zeros((1, 2), np.float32)), "1-D"),
    "topk-shape-mismatch": (
        Completion(
            [_seq(1)],
            topk_prompt_logprobs=TopK(np.zeros((3, 2), np.int32), np.zeros((3, 3), np.float32)),
        ),
        r"token_ids \(3, 2\) but logprobs \(3, 3\)",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("name", encoder_params())
def test_bad_input_is_a_clear_value_error(name, case):
    completion, message = BAD[case]
    with pytest.raises(ValueError, match=message):
        registry.create("encode", name).encode(completion)


@pytest.mark.parametrize("name", encoder_params())
def test_other_integer_dtypes_are_accepted(name, reference_bytes):
    """int64 tokens / float64 logprobs within range encode like their int32/float32 originals."""
    seq = CORPUS["n1-stop"].sequences[0]
    wide = Completion(
        [Sequence(seq.tokens.astype(np.int64), seq.logprobs.astype(np.float64), "stop")]
    )
    assert registry.create("encode", name).encode(wide) == reference_bytes["n1-stop"]


def test_wire_copies_each_buffer_at_most_once():
    """Peak traced allocation of `wire` stays near the output size (no tobytes, no lists)."""
    if registry.unavailable_reason("encode", "wire"):
        pytest.skip(registry.unavailable_reason("encode", "wire"))
    encoder = registry.create("encode", "wire")
    completion = CORPUS["tokens-262144"]
    encoder.encode(completion)  # warm up
    tracemalloc.start()
    try:
        out = encoder.encode(completion)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(out) * 1.1 + 64 * 1024, (peak, len(out))


@pytest.mark.parametrize("name", json_params())
@pytest.mark.heavy
def test_json_matches_reference_and_completion(name, reference_bytes):
    """Parsed JSON equals the reference's and the plainly computed expected value (float32)."""
    derive = json_implementation(name)
    reference = json_implementation(JSON_REFERENCE)
    for case in CASES:
        got = as_float32(json.loads(derive(reference_bytes[case])))
        assert got == as_float32(json.loads(reference(reference_bytes[case]))), case
        assert got == expected_json(CORPUS[case]), case


def test_json_null_semantics(reference_bytes):
    """Stop reasons are strings; padded top-k rows are null; NaN prompt positions are null."""
    value = json.loads(proto_to_json(reference_bytes["prompt-topk-padded"]))
    assert [s["stop_reason"] for s in value["sequences"]] == ["stop", "length"]
    assert value["prompt_logprobs"][0] is None
    rows = value["topk_prompt_logprobs"]
    assert rows[0] is None and len(rows[-1]) == 5
    assert all(row is None or 1 <= len(row) <= 5 for row in rows)
    assert (
        json.loads(proto_to_json(reference_bytes["topk-all-padded"]))["topk_prompt_logprobs"]
        == [None] * 4
    )
    empty = json.loads(proto_to_json(reference_bytes["n1-empty-length"]))
    assert empty["sequences"] == [{"stop_reason": "length", "tokens": [], "logprobs": None}]
    assert empty["prompt_logprobs"] is None and empty["topk_prompt_logprobs"] is None


@pytest.mark.parametrize("name", json_params())
def test_json_rejects_unknown_stop_reason(name):
    data = b"\x0a\x02\x08\x07"  # one sequence with stop_reason = 7
    with pytest.raises(ValueError, match="stop_reason"):
        json_implementation(name)(data)


def _random_completion(data) -> Completion:
    """A Completion of random shape and values drawn by hypothesis (small sizes)."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    sequences = [
        Sequence(
            rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32),
            rng.standard_normal(n).astype(np.float32),
            data.draw(st.sampled_from(["stop", "length"])),
        )
        for n in data.draw(st.lists(st.integers(0, 70), max_size=5), label="lengths")
    ]
    prompt = None
    if data.draw(st.booleans(), label="prompt"):
        prompt = rng.standard_normal(data.draw(st.integers(0, 70))).astype(np.float32)
        prompt[rng.random(len(prompt)) < 0.3] = np.nan
    topk = None
    if data.draw(st.booleans(), label="topk"):
        shape = (data.draw(st.integers(0, 40)), data.draw(st.integers(0, 6)))
        ids = rng.integers(0, 3, shape, dtype=np.int32)
        lps = np.where(rng.random(shape) < 0.5, np.float32(-99999.0), np.float32(-1.5))
        topk = TopK(ids, lps.astype(np.float32))
    return Completion(sequences, prompt_logprobs=prompt, topk_prompt_logprobs=topk)


@pytest.mark.parametrize("name", encoder_params())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
@pytest.mark.heavy
def test_random_shapes_same_bytes_as_reference(name, data):
    """Random shapes (empty, varint boundaries, random padding): same bytes as the reference."""
    completion = _random_completion(data)
    reference = registry.create("encode", registry.reference("encode"))
    assert registry.create("encode", name).encode(completion) == reference.encode(completion)


@pytest.mark.parametrize("name", json_params())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
@pytest.mark.heavy
def test_random_shapes_json_matches_expected(name, data):
    """Random shapes, including rows padded in the middle or at rank 1 only."""
    completion = _random_completion(data)
    encoded = registry.create("encode", registry.reference("encode")).encode(completion)
    got = as_float32(json.loads(json_implementation(name)(encoded)))
    assert got == expected_json(completion)


@pytest.mark.parametrize("name", json_params())
def test_json_ignores_fields_it_does_not_know(name, reference_bytes):
    """Bytes with extra public fields (prompt_cache_hit_tokens = 7) give the same JSON."""
    data = reference_bytes["prompt-topk-padded"]
    derive = json_implementation(name)
    assert derive(data + b"\x20\x07") == derive(data)


def _decode_reference():
    name = registry.reference("decode")
    if importlib.util.find_spec(registry.entry("decode", name).module) is None:
        pytest.skip(f"the decode reference ({name}) is not written yet")
    reason = registry.unavailable_reason("decode", name)
    if reason:
        pytest.skip(reason)
    return registry.create("decode", name)


@pytest.mark.parametrize("name", encoder_params())
def test_decoded_harness_bodies(name):
    """Completions decoded from the fake router's bodies (n = 3, prompt and top-k logprobs)."""
    from impl.workloads.synthetic import body_for

    decoder = _decode_reference()
    reference = registry.create("encode", registry.reference("encode"))
    encoder = registry.create("encode", name)
    for tokens, kind, k in ((0, "vllm", None), (200, "minimal", None), (1000, "vllm", 5)):
        body = body_for(tokens, kind=kind, n=3, prompt_len=40, prompt_logprobs=k)
        completion = decoder.decode(body, topk_prompt_logprobs=k or 0)
        assert encoder.encode(completion) == reference.encode(completion), (tokens, kind, k)


def test_wire_is_much_faster_than_validated():
    """A ratio in one run, generous margin (measured ~100-300x): catches a per-token loop.
    Timed in this thread's CPU time, not wall-clock: another job preempting one of the calls
    on a shared core cannot move it."""
    for name in ("wire", "validated"):
        if registry.unavailable_reason("encode", name):
            pytest.skip(registry.unavailable_reason("encode", name))
    completion = CORPUS["tokens-32768"]
    best = {}
    for name in ("wire", "validated"):
        encoder = registry.create("encode", name)
        times = []
        for _ in range(5):
            start = time.thread_time()
            encoder.encode(completion)
            times.append(time.thread_time() - start)
        best[name] = min(times)
    assert best["validated"] > 10 * best["wire"], best


def test_unknown_json_derivation_lists_the_known_ones():
    with pytest.raises(LookupError, match="known: json, orjson"):
        json_implementation("no-such-json")
