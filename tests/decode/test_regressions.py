"""Every input that ever made a decoder disagree with the reference, as every decoder decodes it.

The fuzzer (`make fuzz`, impl/decode/fuzz) keeps each disagreement it finds in
tests/fixtures/decode-regressions/ (one `.case` file: a JSON header with the top-k argument,
what disagreed and how the input was made, then the body's bytes). The first ones are the two
bugs of issue 27, found by the fuzzer with their fixes reverted: onepass_nogil taking a lone
`-` or an empty element at a 64-byte block's edge as a number, and orjson refusing integers
beyond 64 bits where the reference reads integers.
"""

from __future__ import annotations

import pytest

from impl import registry
from impl.decode import DecodeError, fuzz
from impl.decode.parity import assert_same
from tests.decode.test_parity import decoder_params

FAMILY = "decode"
REFERENCE = registry.create(FAMILY, registry.reference(FAMILY))
CASES = fuzz.regressions()


@pytest.fixture(scope="module", params=decoder_params())
def decoder(request):
    return registry.create(FAMILY, request.param)


def test_the_regression_cases_are_there():
    assert len(CASES) >= 2, fuzz.REGRESSIONS


@pytest.mark.parametrize("path", CASES, ids=lambda path: path.stem)
def test_answered_as_the_reference_does(path, decoder):
    """The same arrays bit for bit, or DecodeError where the reference raises it."""
    case, _ = fuzz.load(path)
    try:
        want = REFERENCE.decode(case.body, topk_prompt_logprobs=case.k)
    except DecodeError:
        with pytest.raises(DecodeError):
            decoder.decode(case.body, topk_prompt_logprobs=case.k)
        return
    assert_same(decoder.decode(case.body, topk_prompt_logprobs=case.k), want)
