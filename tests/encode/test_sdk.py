"""Encode family pinned to the real Tinker SDK: its own proto decoder reads our bytes back
into the Completion (tokens, float32 logprobs, stop reasons, NaN prompt positions as None,
fully padded top-k rows as None), and the legacy JSON says what the SDK says."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from impl import registry
from impl.decode import TOPK_PAD_LOGPROB, TOPK_PAD_TOKEN
from impl.encode import json_implementation
from tests.support.encode_corpus import (
    CASES,
    CORPUS,
    as_float32,
    encoder_params,
    json_params,
    same_float32,
)

pytestmark = pytest.mark.heavy

if importlib.util.find_spec("tinker") is None:
    pytest.skip(
        "the Tinker SDK is not installed: pip install 'hotpath[sdk]' (tinker==0.38.*)",
        allow_module_level=True,
    )
response_conv = pytest.importorskip(
    "tinker.proto.response_conv", reason="tinker is installed but has no tinker.proto.response_conv"
)
public_pb = pytest.importorskip("tinker.proto.tinker_public_pb2")


@pytest.fixture(scope="module")
def reference_bytes() -> dict[str, bytes]:
    if registry.unavailable_reason("encode", registry.reference("encode")):
        pytest.skip(registry.unavailable_reason("encode", registry.reference("encode")))
    encoder = registry.create("encode", registry.reference("encode"))
    return {case: encoder.encode(CORPUS[case]) for case in CASES}


def _check_sdk_response(response, completion) -> None:
    assert len(response.sequences) == len(completion.sequences)
    for got, seq in zip(response.sequences, completion.sequences, strict=True):
        assert got.stop_reason == seq.stop_reason
        assert got.tokens_np.dtype == np.int32
        assert np.array_equal(got.tokens_np, seq.tokens)
        if len(seq.tokens):
            assert same_float32(got.logprobs_np, seq.logprobs)
        else:  # the SDK reads empty logprobs bytes as "not requested"
            assert got.logprobs_np is None and got.tokens == []
    prompt = completion.prompt_logprobs
    if prompt is None or len(prompt) == 0:  # the SDK reads absent and empty both as None
        assert response.prompt_logprobs_np is None
    else:
        assert same_float32(response.prompt_logprobs_np, prompt)
        as_list = response.prompt_logprobs
        assert [v is None for v in as_list] == np.isnan(prompt).tolist()
    topk = completion.topk_prompt_logprobs
    if topk is None or topk.token_ids.size == 0:
        assert response.topk_prompt_logprobs_np is None
    else:
        assert np.array_equal(response.topk_prompt_logprobs_np.token_ids, topk.token_ids)
        assert same_float32(response.topk_prompt_logprobs_np.logprobs, topk.logprobs)
        padded = (topk.token_ids == TOPK_PAD_TOKEN) & (topk.logprobs == TOPK_PAD_LOGPROB)
        rows = response.topk_prompt_logprobs
        assert [row is None for row in rows] == padded.all(axis=1).tolist()
        assert [len(row) for row in rows if row] == [int((~p).sum()) for p in padded if not p.all()]


@pytest.mark.parametrize("name", encoder_params())
def test_sdk_decodes_every_corpus_item(name):
    """`tinker.proto.response_conv.deserialize_sample_response` gives back the Completion."""
    encoder = registry.create("encode", name)
    for case in CASES:
        completion = CORPUS[case]
        response = response_conv.deserialize_sample_response(encoder.encode(completion))
        try:
            _check_sdk_response(response, completion)
        except AssertionError as exc:
            raise AssertionError(f"{name} / {case}: {exc}") from exc


def test_sdk_schema_reserializes_to_the_same_bytes(reference_bytes):
    """The SDK's own generated message re-serializes our bytes unchanged: same schema, order."""
    for case in CASES:
        data = reference_bytes[case]
        msg = public_pb.SampleResponse.FromString(data)
        assert msg.SerializeToString() == data, case
        assert msg.prompt_cache_hit_tokens == 0


@pytest.mark.parametrize("name", json_params())
def test_json_says_what_the_sdk_says(name, reference_bytes):
    """Legacy JSON equals the SDK's list views of the same bytes (float32 values)."""
    derive = json_implementation(name)
    for case in CASES:
        response = response_conv.deserialize_sample_response(reference_bytes[case])
        sdk = {
            "sequences": [
                {"stop_reason": s.stop_reason, "tokens": s.tokens, "logprobs": s.logprobs}
                for s in response.sequences
            ],
            "prompt_logprobs": response.prompt_logprobs,
            "topk_prompt_logprobs": response.topk_prompt_logprobs,
        }
        sdk = json.loads(json.dumps(sdk))  # tuples -> lists, as JSON would carry them
        sdk = as_float32(_finite_or_none(sdk))
        assert as_float32(json.loads(derive(reference_bytes[case]))) == sdk, case


def _finite_or_none(value):
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    return value


def test_sdk_reads_decoded_harness_bodies():
    """A realistic path: fake-router body -> decode reference -> encode -> the SDK's decoder."""
    from impl.workloads.synthetic import body_for

    name = registry.reference("decode")
    if importlib.util.find_spec(registry.entry("decode", name).module) is None:
        pytest.skip(f"the decode reference ({name}) is not written yet")
    decoder = registry.create("decode", name)
    encoder = registry.create("encode", registry.reference("encode"))
    for tokens, k in ((0, None), (1000, 5)):
        body = body_for(tokens, n=3, prompt_len=40, prompt_logprobs=k)
        completion = decoder.decode(body, topk_prompt_logprobs=k or 0)
        response = response_conv.deserialize_sample_response(encoder.encode(completion))
        _check_sdk_response(response, completion)
