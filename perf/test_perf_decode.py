"""Decode: one vLLM completion body into a Completion, per body size and kind."""

import pytest
from conftest import create_or_skip, label

from benchmarks.common import decode_body
from impl import registry
from impl.decode.parity import same
from impl.measure import LARGEST_TOKENS

INPUTS = [(32768, "vllm"), (LARGEST_TOKENS, "minimal"), (LARGEST_TOKENS, "vllm")]


@pytest.mark.parametrize(("tokens", "kind"), INPUTS, ids=[f"{k}-{t}" for t, k in INPUTS])
@pytest.mark.parametrize("name", registry.names("decode"))
def test_decode(benchmark, name, tokens, kind):
    """The body of one choice of `tokens` tokens (`vllm`: logprobs=1 with tokens/top_logprobs)."""
    decoder = create_or_skip("decode", name)
    body = decode_body(tokens, kind)
    reference = registry.create("decode", registry.reference("decode"))
    assert same(decoder.decode(body), reference.decode(body)), "differs from the reference"
    label(benchmark, "decode", f"{kind} {tokens} tokens", name, size_bytes=len(body))
    benchmark(decoder.decode, body)
