"""The decode contract's limits (MAX_DEPTH, MAX_INT_DIGITS): at the limit every decoder equals the
reference; one past it every decoder raises the reference's DecodeError, in ignored fields too,
whatever the interpreter's recursion limit or `sys.int_max_str_digits`."""

from __future__ import annotations

import sys

import pytest

from impl import registry
from impl.decode import MAX_DEPTH, MAX_INT_DIGITS, DecodeError, _limits
from impl.workloads import synthetic
from tests.decode.test_parity import REFERENCE, assert_same, decoder_params

CHOICE = (
    b'{"index": 0, "token_ids": [5, 6], "logprobs": {"token_logprobs": [-0.5, -0.25]}, '
    b'"finish_reason": "stop"'
)


@pytest.fixture(scope="module", params=decoder_params())
def decoder(request):
    return registry.create("decode", request.param)


def with_extra(extra: bytes, where: str) -> bytes:
    """A valid body with the ignored field `"x": extra` at the top level, in a choice, or in a
    realistic vLLM body (top level)."""
    if where == "vllm":
        return synthetic.body_for(64, kind="vllm")[:-1] + b', "x": ' + extra + b"}"
    if where == "choice":
        return b'{"choices": [' + CHOICE + b', "x": ' + extra + b"}]}"
    return b'{"choices": [' + CHOICE + b'}], "x": ' + extra + b"}"


def nested(levels: int, style: str) -> bytes:
    """A value `levels` deep (arrays, objects, or arrays whose strings hold brackets)."""
    if style == "arrays":
        return b"[" * levels + b"1" + b"]" * levels
    if style == "empty":  # nothing at the bottom: simdjson counts one level less there
        return b"[" * levels + b"]" * levels
    if style == "objects":
        return b'{"a": ' * levels + b"1" + b"}" * levels
    return b'["]]}}\\"[", ' * levels + b'"\\\\"' + b"]" * levels


def depth_of(where: str) -> int:
    """Levels that enclose the extra field's value (the top-level object is depth 1)."""
    return 3 if where == "choice" else 1


def expect_same_error(decoder, body: bytes, words: str) -> None:
    with pytest.raises(DecodeError) as want:
        REFERENCE.decode(body)
    with pytest.raises(DecodeError) as got:
        decoder.decode(body)
    assert words in str(want.value), str(want.value)[:200]
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("where", ["top", "choice", "vllm"])
@pytest.mark.parametrize("style", ["arrays", "empty", "objects", "strings"])
def test_depth_limit_plus_minus_one(decoder, where, style):
    """Depth MAX_DEPTH - 1 and MAX_DEPTH decode as the reference does; MAX_DEPTH + 1 is refused
    by every decoder with the reference's message."""
    for depth in (MAX_DEPTH - 1, MAX_DEPTH):
        body = with_extra(nested(depth - depth_of(where), style), where)
        assert _limits.nesting_depth(body) == depth
        assert_same(decoder.decode(body), REFERENCE.decode(body))
    body = with_extra(nested(MAX_DEPTH + 1 - depth_of(where), style), where)
    expect_same_error(decoder, body, f"nested {MAX_DEPTH + 1} levels deep; the limit is 64")


@pytest.mark.parametrize("levels", [988, 1000, 5000, 100_000])
def test_deep_bodies_of_the_issue(decoder, levels):
    """The depths at which decoders used to disagree (the call stack decided) and beyond."""
    expect_same_error(decoder, with_extra(nested(levels, "arrays"), "top"), "levels deep")


def test_depth_does_not_follow_the_recursion_limit(decoder):
    """A higher recursion limit does not let a deeper body through; a lower one (with room for
    MAX_DEPTH frames) does not refuse a body at the limit."""
    limit = sys.getrecursionlimit()
    body = with_extra(nested(MAX_DEPTH - 1, "arrays"), "top")
    try:
        sys.setrecursionlimit(100_000)
        expect_same_error(decoder, with_extra(nested(2000, "arrays"), "top"), "levels deep")
        sys.setrecursionlimit(limit)
        assert_same(decoder.decode(body), REFERENCE.decode(body))
    finally:
        sys.setrecursionlimit(limit)


def _digits(n: int) -> bytes:
    return b"9" + b"8" * (n - 1)


@pytest.mark.parametrize("where", ["top", "choice", "vllm"])
@pytest.mark.parametrize("sign", [b"", b"-"])
def test_integer_digits_limit(decoder, where, sign):
    """MAX_INT_DIGITS digits decode; one more is refused by every decoder, in an ignored field."""
    body = with_extra(sign + _digits(MAX_INT_DIGITS), where)
    assert_same(decoder.decode(body), REFERENCE.decode(body))
    body = with_extra(sign + _digits(MAX_INT_DIGITS + 1), where)
    expect_same_error(decoder, body, f"an integer of {MAX_INT_DIGITS + 1} digits")


def test_long_integer_as_a_token_id(decoder):
    body = b'{"choices": [{"index": 0, "token_ids": [' + _digits(MAX_INT_DIGITS + 1) + b"]}]}"
    expect_same_error(decoder, body, "an integer of 4301 digits")


@pytest.mark.parametrize(
    "extra",
    [
        b'"' + _digits(6000) + b'"',  # digits in a string
        _digits(6000) + b".5",  # a float's integral part
        b"0." + _digits(6000),  # a float's fraction
        b"1e" + _digits(5),
    ],
    ids=["string", "float-int-part", "fraction", "exponent"],
)
def test_long_digit_runs_that_are_not_integers(decoder, extra):
    """Long runs of digits that are not integer literals are not limited."""
    body = with_extra(extra, "top")
    assert _limits.may_hold_long_integer(body) == (len(extra) > 4000)
    assert_same(decoder.decode(body), REFERENCE.decode(body))


def test_integer_limit_does_not_follow_int_max_str_digits(decoder):
    """With Python's own limit off, the contract's still holds."""
    before = sys.get_int_max_str_digits()
    try:
        sys.set_int_max_str_digits(0)
        body = with_extra(_digits(MAX_INT_DIGITS + 1), "choice")
        expect_same_error(decoder, body, "an integer of 4301 digits")
    finally:
        sys.set_int_max_str_digits(before)


def test_nesting_depth_reads_strings_and_escapes():
    cases = {
        b'{"a": "]]]]", "b": [[1]]}': 3,
        b'{"a": "\\\\"}': 1,
        b'{"a": "\\"[[[", "b": []}': 2,
        b'{"a": "\\\\\\"]]", "b": [[[]]]}': 4,
        b"[]": 1,
        b"1": 0,
    }
    for body, depth in cases.items():
        assert _limits.nesting_depth(body) == depth, body


def test_may_hold_long_integer_finds_every_position():
    """The sampled search finds a run of MAX_INT_DIGITS + 1 digits at any offset and never
    reports one of MAX_INT_DIGITS."""
    for offset in range(0, 2 * _limits._STRIDE + 3, 97):
        pad = b" " * offset
        assert _limits.may_hold_long_integer(pad + _digits(MAX_INT_DIGITS + 1) + b" ")
        assert not _limits.may_hold_long_integer(pad + _digits(MAX_INT_DIGITS) + b" 1")


@pytest.mark.skipif(
    registry.unavailable_reason("decode", "simdjson") is not None,
    reason=str(registry.unavailable_reason("decode", "simdjson")),
)
def test_simdjson_wrapped_parse_applies_the_limit(monkeypatch):
    """Bodies of 1 MB or more are parsed inside one-element arrays that make simdjson's own
    1024-level limit the contract's: the same answers as the reference at the limit ±1 (every
    body here takes that path), and a body that is not one value is never accepted."""
    import impl.decode.simdjson as module

    monkeypatch.setattr(module, "_WRAP_FROM", 0)
    decoder = registry.create("decode", "simdjson")
    for where in ("top", "choice", "vllm"):
        for style in ("arrays", "empty", "objects", "strings"):
            for depth in (MAX_DEPTH - 1, MAX_DEPTH):
                body = with_extra(nested(depth - depth_of(where), style), where)
                assert_same(decoder.decode(body), REFERENCE.decode(body))
            body = with_extra(nested(MAX_DEPTH + 1 - depth_of(where), style), where)
            expect_same_error(decoder, body, "levels deep")
    valid = with_extra(b"1", "top")
    for body in (b"", b"1], [2", valid + b"], [" + valid, b"[" + valid + b"]", b"]" + valid):
        with pytest.raises(DecodeError):
            REFERENCE.decode(body)
        with pytest.raises(DecodeError):
            decoder.decode(body)
