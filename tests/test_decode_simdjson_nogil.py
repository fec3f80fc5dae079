"""simdjson_nogil's own JSON validation: what its C++ walk accepts, Python's json accepts.

The walk validates every value it skips itself (simdjson indexes the bytes, the grammar check
is ours), so seeded random edits of valid values are put where vLLM bodies have values the
decoder skips; whenever the compiled fast path answers (instead of handing the body to the
reference), the stdlib must parse the same body and the decode must equal the reference's.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from decode_corpus import GOOD_VALUES, mutants
from test_decode_parity import assert_same

from impl import registry
from impl.decode import MAX_DEPTH, MAX_INT_DIGITS, DecodeError
from impl.harness import bodies

FAMILY = "decode"
REASON = registry.unavailable_reason(FAMILY, "simdjson_nogil")
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))
REFERENCE = registry.create(FAMILY, registry.reference(FAMILY))

NUMBERS = b"[-0.5,1,-0,0,10,-12.5E-7,1E+2,0.5e-3,-0.0,1e5,2e-308,123456789012345678901234567890]"
ALPHABET = b'{}[]:,"01-+.eEtrufalsnx\\ /u'


def fast_path(body: bytes, k: int = 0):
    from impl.decode import _simdjson_nogil

    return _simdjson_nogil.decode(body, None, k, MAX_DEPTH, MAX_INT_DIGITS)


@pytest.mark.parametrize("base", [GOOD_VALUES, NUMBERS], ids=["every-value", "numbers"])
@pytest.mark.parametrize("place", ["top-logprobs", "usage", "text-offset"])
def test_accepts_only_what_python_accepts(base, place):
    small = bodies.body_for(3, kind="vllm", n=2, seed=5)
    after, template = {
        "top-logprobs": (b'"top_logprobs":[', b"%s,"),
        "usage": (b'"usage":{', b'"x":%s,'),
        "text-offset": (b'"text_offset":[', b"%s,"),
    }[place]
    at = small.index(after) + len(after)
    decoder = registry.create(FAMILY, "simdjson_nogil")
    answered = valid = 0
    for value in mutants(seed=len(base) + len(place), count=1500, base=base, alphabet=ALPHABET):
        body = small[:at] + template % value + small[at:]
        try:
            json.loads(body)
            valid += 1
        except ValueError:
            assert fast_path(body) is None, f"accepted invalid JSON {value!r}"
            with pytest.raises(DecodeError):
                decoder.decode(body)
            continue
        if fast_path(body) is not None:
            answered += 1
            assert_same(decoder.decode(body), REFERENCE.decode(body))
    assert valid > 50 and answered > valid // 2  # both outcomes really exercised


def test_limits_are_the_reference_s():
    """Nesting deeper than MAX_DEPTH and integers longer than MAX_INT_DIGITS: never answered."""
    body = bodies.body_for(3, kind="vllm", seed=1)[:-1]
    for depth, answered in ((MAX_DEPTH, True), (MAX_DEPTH + 1, False)):
        nested = b"[" * (depth - 1) + b"]" * (depth - 1)
        assert (fast_path(body + b',"x":' + nested + b"}") is not None) is answered
    for digits, answered in ((MAX_INT_DIGITS, True), (MAX_INT_DIGITS + 1, False)):
        assert (fast_path(body + b',"x":-' + b"9" * digits + b"}") is not None) is answered


def test_fast_path_answers_realistic_bodies():
    """No hand-over on generator bodies, prompt logprobs with top-k included."""
    for kind in ("minimal", "vllm"):
        for k in (0, 2):
            body = bodies.body_for(50, kind=kind, n=2, prompt_logprobs=k, seed=3)
            assert fast_path(body, k) is not None


def _prompt_of(body: bytes) -> list[int]:
    return json.loads(body)["choices"][0]["prompt_token_ids"]


@pytest.mark.parametrize(
    "convert",
    [
        list,
        tuple,
        lambda p: np.array(p, dtype=np.int64),
        lambda p: np.array(p, dtype=np.int32),
        lambda p: np.array(p, dtype=np.uint64),
        lambda p: [np.int64(t) for t in p],  # not plain ints: the reference decides
        lambda p: [True, *p[1:]],  # a bool is an int to int(): the reference decides
        lambda p: [float(t) for t in p],
        lambda p: p[:-1],  # one short: DecodeError
        lambda p: [*p[:-1], 2**70],  # beyond int64: the reference decides
    ],
    ids=["list", "tuple", "int64", "int32", "uint64", "np-ints", "bool", "floats", "short", "big"],
)
@pytest.mark.parametrize("k", [0, 2])
def test_prompt_tokens_argument_in_every_form(convert, k):
    body = bodies.body_for(20, kind="vllm", n=2, prompt_len=6, prompt_logprobs=2, seed=4)
    prompt = convert(_prompt_of(body))
    decoder = registry.create(FAMILY, "simdjson_nogil")
    try:
        want = REFERENCE.decode(body, prompt_tokens=prompt, topk_prompt_logprobs=k)
    except DecodeError:
        with pytest.raises(DecodeError):
            decoder.decode(body, prompt_tokens=prompt, topk_prompt_logprobs=k)
        return
    assert_same(decoder.decode(body, prompt_tokens=prompt, topk_prompt_logprobs=k), want)


@pytest.mark.parametrize("k", [-1, 0, 1, 5, 1 << 17])
def test_topk_argument_values(k):
    body = bodies.body_for(20, kind="vllm", prompt_len=6, prompt_logprobs=2, seed=6)
    decoder = registry.create(FAMILY, "simdjson_nogil")
    want = REFERENCE.decode(body, topk_prompt_logprobs=k)
    assert_same(decoder.decode(body, topk_prompt_logprobs=k), want)


def test_body_types_and_page_ends():
    """bytes, bytearray and memoryview bodies; bodies ending at every offset of a page."""
    decoder = registry.create(FAMILY, "simdjson_nogil")
    body = bodies.body_for(40, kind="minimal", seed=2)
    want = REFERENCE.decode(body)
    for form in (bytes, bytearray, memoryview):
        assert_same(decoder.decode(form(body)), want)
    for pad in range(0, 4200, 61):  # the copy-or-not decision near a page boundary
        padded = body[:-1] + b" " * pad + b"}"
        assert fast_path(padded) is not None
        assert_same(decoder.decode(padded), want)


def test_escapes_and_digit_runs_at_every_offset():
    """Strings and numbers of every length around the word-at-a-time scans' 8-byte steps."""
    body = bodies.body_for(3, kind="vllm", seed=1)
    at = body.index(b'"tokens":[') + len(b'"tokens":[')
    decoder = registry.create(FAMILY, "simdjson_nogil")
    for length in range(12):
        for where in range(length):
            for escape, valid in ((b"\\n", True), (b"\\x", False), (b'\\"', True)):
                text = b"a" * where + escape + b"b" * (length - where - 1)
                case = body[:at] + b'"' + text + b'",' + body[at:]
                assert (fast_path(case) is not None) is valid, text
                if valid:
                    assert_same(decoder.decode(case), REFERENCE.decode(case))
    for length in range(1, 22):
        for value, valid in (
            (b"1" * length, True),
            (b"-" + b"7" * length + b".5", True),
            (b"0." + b"3" * length + b"e-" + b"1" * min(length, 3), True),
            (b"1" * length + b"x", False),
            (b"2." + b"5" * length + b"e", False),
            (b"0" + b"1" * length, False),
        ):
            case = body[:at] + value + b"," + body[at:]
            assert (fast_path(case) is not None) is valid, value
