"""Invalid bodies: every decoder raises DecodeError (a ValueError) quoting at most 200 bytes."""

from __future__ import annotations

import json

import pytest

from impl import registry
from impl.decode import DecodeError, _scan
from tests.decode.test_parity import decoder_params
from tests.support.decode_corpus import (
    BAD_VALUES,
    GOOD_VALUES,
    INVALID_FLATTENED,
    INVALID_IN_SKIPPED_REGION,
    Case,
    invalid_cases,
    mutants,
    skipped_region_valid_cases,
)

MUTATION_ALPHABET = b'{}[]:,"01-+.eEtrufalsnx\\'

FAMILY = "decode"


@pytest.fixture(scope="module", params=decoder_params())
def decoder(request):
    return registry.create(FAMILY, request.param)


@pytest.mark.parametrize("case", invalid_cases(), ids=lambda case: case.id)
@pytest.mark.heavy
def test_raises_decode_error(decoder, case: Case):
    with pytest.raises(DecodeError) as info:
        decoder.decode(case.body, **case.kwargs)
    message = str(info.value)
    assert "body starts" in message
    quoted = message.split("body starts ", 1)[1]
    assert len(quoted.encode()) <= 200 * 4 + 8  # repr of at most 200 bytes of the body


def test_message_says_what_and_quotes_200_bytes_at_most():
    body = b'{"choices":[{"index":0,"token_ids":[1,"x"]}]}' + b" " * 1000
    with pytest.raises(DecodeError, match="token id") as info:
        registry.create(FAMILY, registry.reference(FAMILY)).decode(body)
    assert "…" in str(info.value) and len(str(info.value)) < 320
    assert isinstance(info.value, ValueError)


def _ids(cases):
    return [name for name, _ in cases]


@pytest.mark.parametrize(
    "name, body", INVALID_IN_SKIPPED_REGION, ids=_ids(INVALID_IN_SKIPPED_REGION)
)
def test_malformed_value_in_skipped_region(decoder, name, body):
    """Values the fast paths do not consume are still validated (fromstring's skipped bytes)."""
    with pytest.raises(DecodeError):
        decoder.decode(body)


@pytest.mark.parametrize("name, body", INVALID_FLATTENED, ids=_ids(INVALID_FLATTENED))
def test_nested_arrays_flattening_to_the_right_count(decoder, name, body):
    """pysimdjson's as_buffer flattens `[[1],[2]]` to `[1,2]`; every decoder rejects it."""
    with pytest.raises(DecodeError):
        decoder.decode(body)


NUMBERS_ONLY = b'[{"a":-0.5,"b":[1,{"c":-0}]},"x",-12.5E-7,1E+2,0.5e-3,{},[],[[1]],0,-0.0,10,1e5]'


@pytest.mark.parametrize("base", [GOOD_VALUES, NUMBERS_ONLY], ids=["every-value", "numbers-only"])
@pytest.mark.heavy
def test_vectorised_validator_agrees_with_the_stdlib(base):
    """fromstring's vectorised check of big skipped values: sound and complete (compact JSON)."""
    checked = accepted = 0
    for value in mutants(seed=2, count=4000, base=base, alphabet=MUTATION_ALPHABET):
        body = b'{"v":' + value + b"}"
        try:
            index = _scan.Index(body)  # checks escapes, control bytes, brackets, NaN
        except _scan.Unsure:
            continue
        children = index.children(0).tolist()
        if len(children) != 1 or index.pos[children[0]] != 5:
            continue  # the value is a scalar or not one value
        try:
            json.loads(value)
            valid = True
        except ValueError:
            valid = False
        got = _scan._compact_valid(index, children[0])
        assert not got or valid, f"accepted invalid JSON {value!r}"
        assert got or not valid, f"rejected valid compact JSON {value!r}"
        checked, accepted = checked + 1, accepted + got
    assert checked > 1000 and 50 < accepted < checked  # both outcomes really exercised


@pytest.mark.heavy
def test_big_skipped_values_take_the_vectorised_check(monkeypatch):
    """On big vLLM bodies the vectorised check vouches for valid skipped values by itself."""
    results = []
    check = _scan._compact_valid
    monkeypatch.setattr(
        _scan, "_compact_valid", lambda *a: results.append(check(*a)) or results[-1]
    )
    fromstring = registry.create(FAMILY, "fromstring")
    for case in skipped_region_valid_cases():
        fromstring.decode(case.body)
    assert results and all(results)
    results.clear()
    for name, body in INVALID_IN_SKIPPED_REGION:
        if name.startswith("big-"):
            with pytest.raises(DecodeError):
                fromstring.decode(body)
    assert results.count(False) >= len(BAD_VALUES)  # rejected by the vectorised check itself
