"""Encode: Completion -> SampleResponse bytes, per size; stored bytes -> legacy JSON."""

import pytest
from conftest import create_or_skip, label

from impl import registry
from impl.encode import JSON_IMPLEMENTATIONS, json_implementation, json_unavailable_reason, samples
from impl.measure import LARGEST_TOKENS

#: a mid-size and the largest of `impl.measure.TOKENS`
SIZES = (8192, LARGEST_TOKENS)


@pytest.mark.parametrize("tokens", SIZES, ids=lambda t: f"{t}tok")
@pytest.mark.parametrize("name", registry.names("encode"))
def test_encode(benchmark, name, tokens):
    """One Completion of `tokens` tokens into wire bytes."""
    encoder = create_or_skip("encode", name)
    completion = samples.sized(tokens)
    reference = registry.create("encode", registry.reference("encode"))
    assert encoder.encode(completion) == reference.encode(completion), "bytes differ"
    label(benchmark, "encode", f"{tokens} tokens", name)
    benchmark(encoder.encode, completion)


@pytest.mark.parametrize("tokens", SIZES, ids=lambda t: f"{t}tok")
@pytest.mark.parametrize("name", [row.name for row in JSON_IMPLEMENTATIONS])
def test_proto_to_json(benchmark, name, tokens):
    """Stored SampleResponse bytes into the legacy JSON body."""
    reason = json_unavailable_reason(name)
    if reason:
        pytest.skip(reason)
    derive = json_implementation(name)
    reference = registry.create("encode", registry.reference("encode"))
    data = reference.encode(samples.sized(tokens))
    label(benchmark, "encode-json", f"{tokens} tokens", name)
    benchmark(derive, data)
