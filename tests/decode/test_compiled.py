"""The compiled decoders' own JSON validation: what their C++ walks accept, Python's json accepts.

`simdjson_nogil` (stage 1's index, then a walk) and `onepass_nogil` (one pass over the bytes,
with bulk checks of regular arrays) validate every value they skip themselves, so seeded random
edits of valid values are put where vLLM bodies have values the decoders skip, and every byte
of a small realistic body is replaced in turn; whenever a compiled fast path answers (instead
of handing the body to the reference), the stdlib must parse the same body and the decode must
equal the reference's. Every test runs for both; an unavailable one skips with its hint.
"""

from __future__ import annotations

import collections
import importlib
import itertools
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from impl import registry
from impl.decode import MAX_DEPTH, MAX_INT_DIGITS, DecodeError
from impl.workloads import realtext, synthetic
from tests.decode.test_parity import assert_same
from tests.support.decode_corpus import GOOD_VALUES, mutants

FAMILY = "decode"
REFERENCE = registry.create(FAMILY, registry.reference(FAMILY))
COMPILED = {
    "simdjson_nogil": "_simdjson_nogil",
    "onepass_nogil": "_onepass_nogil",
    "onepass_nogil_avx2": "_onepass_nogil_avx2",
}


class Compiled:
    """One compiled decoder: the registry's decoder and its extension's raw functions."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.decoder = registry.create(FAMILY, name)
        self.ext = importlib.import_module(f"impl.decode.{COMPILED[name]}")

    def fast_path(self, body: bytes, k: int = 0):
        return self.ext.decode(body, None, k, MAX_DEPTH, MAX_INT_DIGITS)


def _params() -> list:
    params = []
    for name in COMPILED:
        reason = registry.unavailable_reason(FAMILY, name)
        marks = [pytest.mark.skip(reason=str(reason))] if reason is not None else []
        params.append(pytest.param(name, id=name, marks=marks))
    return params


@pytest.fixture(params=_params())
def compiled(request) -> Compiled:
    return Compiled(request.param)


def as_the_reference(compiled: Compiled, case: bytes) -> bool:
    """The decoder answers `case` as the reference does: the same arrays, or DecodeError (and
    then the fast path hands it over). True when the fast path itself answered."""
    try:
        want = REFERENCE.decode(case)
    except DecodeError:
        assert compiled.fast_path(case) is None, case
        with pytest.raises(DecodeError):
            compiled.decoder.decode(case)
        return False
    answered = compiled.fast_path(case) is not None
    assert_same(compiled.decoder.decode(case), want)
    return answered


def as_python_parses(compiled: Compiled, case: bytes, where: object) -> str:
    """The fast path answers `case` only if Python's json parses it, and then as the reference:
    "rejected" (not JSON, and the fast path refused it), "answered" or "handed over" (JSON the
    fast path left to the full parse). `where` names the case in a failure."""
    fast = compiled.fast_path(case)
    try:
        json.loads(case)
    except ValueError:
        assert fast is None, where
        return "rejected"
    if fast is None:
        return "handed over"
    assert_same(compiled.decoder.decode(case), REFERENCE.decode(case))
    return "answered"


NUMBERS = b"[-0.5,1,-0,0,10,-12.5E-7,1E+2,0.5e-3,-0.0,1e5,2e-308,123456789012345678901234567890]"
ALPHABET = b'{}[]:,"01-+.eEtrufalsnx\\ /u'
#: where a value is inserted in a small body: just inside this array or object
PLACES = {
    "tokens": b'"tokens":[',
    "top-logprobs": b'"top_logprobs":[',
    "usage": b'"usage":{',
    "text-offset": b'"text_offset":[',
}


def _small_body(place: str) -> tuple[bytes, int]:
    """A 3-token, 2-choice body and the offset just inside PLACES[place]."""
    small = synthetic.body_for(3, kind="vllm", n=2, seed=5)
    return small, small.index(PLACES[place]) + len(PLACES[place])


@pytest.mark.parametrize("base", [GOOD_VALUES, NUMBERS], ids=["every-value", "numbers"])
@pytest.mark.parametrize("place", ["top-logprobs", "usage", "text-offset", "tokens"])
@pytest.mark.heavy
def test_accepts_only_what_python_accepts(base, place, compiled):
    small, at = _small_body(place)
    template = b'"x":%s,' if place == "usage" else b"%s,"
    decoder = compiled.decoder
    answered = valid = 0
    for value in mutants(seed=len(base) + len(place), count=1500, base=base, alphabet=ALPHABET):
        body = small[:at] + template % value + small[at:]
        try:
            json.loads(body)
            valid += 1
        except ValueError:
            assert compiled.fast_path(body) is None, f"accepted invalid JSON {value!r}"
            with pytest.raises(DecodeError):
                decoder.decode(body)
            continue
        if compiled.fast_path(body) is not None:
            answered += 1
            assert_same(decoder.decode(body), REFERENCE.decode(body))
    assert valid > 50 and answered > valid // 2  # both outcomes really exercised


@pytest.mark.parametrize("array", ["token_logprobs", "top_logprobs"])
@pytest.mark.heavy
def test_bulk_arrays_accept_only_what_python_accepts(array, compiled):
    """Seeded edits of a whole kept `token_logprobs` array or skipped `top_logprobs` array of
    a 40-token body (onepass_nogil checks both 64 bytes a block, as a stream): the fast path
    answers only what Python's json parses, and then exactly as the reference (a changed
    element count included: that is the reference's DecodeError, never an answer)."""
    body = synthetic.body_for(40, kind="vllm", seed=11)
    head, rest = body.split(b'"%s":[' % array.encode(), 1)
    head += b'"%s":[' % array.encode()
    depth, end = 1, 0
    while depth:  # the array's closing bracket (no brackets inside its strings here)
        depth += {ord("["): 1, ord("]"): -1}.get(rest[end], 0)
        end += 1
    content, tail = rest[: end - 1], rest[end - 1 :]
    assert len(content) > 5 * 64
    seen = collections.Counter(
        as_python_parses(compiled, head + value + tail, value)
        for value in mutants(seed=len(array), count=2500, base=content, alphabet=ALPHABET)
    )
    assert seen["answered"] > 100 and seen["rejected"] > 1000  # both outcomes really exercised


# Numbers in, near and just outside the form the bulk checks take (-?d.d+(e[+-]dd)?)
NEAR_LOGPROBS = [b"-1.5e-05e-05", b"-1.5e-055", b"-1.5e-5", b"-1.5e+05", b"-1.5E-05", b"-1.5e05"]
NEAR_LOGPROBS += [b"-15.5", b"-01.5", b"1.", b".5", b"-.5", b"-1.5e", b"-1.5e-", b"-1.5e-0"]
NEAR_LOGPROBS += [b"--1.5", b"-1.-5", b"-1.5.5", b"-1.5e-05.5", b"1.5-", b"+1.5", b"-1.5e--05"]
NEAR_LOGPROBS += [b"-1e-05", b"-0.0", b"0.0", b"-9999.0", b"-1.5e-99", b"-1.5e+99", b"-1.5e-05-"]
NEAR_LOGPROBS += [b"-1.5e-0500", b"-1.5ee-05", b"-1.5e-05e", b"-1", b"0", b"null", b'"-1.5"']
NEAR_LOGPROBS += [b"-0.1234567890123456789012345", b"-1.2345678901234567890e-05", b"-1,5"]
# the whole form (issue 32): two whole digits, one exponent digit (orjson), and just outside
NEAR_LOGPROBS += [b"-10.5", b"-99.25", b"-12.34567890123456", b"-12.345678901234567"]
NEAR_LOGPROBS += [b"-12.3456789012345678", b"-99.99999999999999999", b"-05.5", b"-00.5"]
NEAR_LOGPROBS += [b"-100.5", b"-10.", b"-10", b"-1.5e-5e", b"-1.5e-5.", b"-1.5e5", b"-12.5e-7"]
NEAR_LOGPROBS += [b"-1.5e+5", b"-1.5e-0", b"-12.5e-05", b"-1.5e-", b"-0.00007738019485259429"]
NEAR_LOGPROBS += [b"-0.0000000000000000000001", b"-1.0e-9", b"-9.999999999999999e-5"]


@pytest.mark.parametrize("where", [0, 3, 17, 39])
@pytest.mark.parametrize("array", ["token_logprobs", "top_logprobs"])
def test_numbers_near_the_logprob_form(array, where, compiled):
    """A number in, near or just outside the form the bulk checks take, as a kept logprob or
    as a skipped top-logprob value, at the start, inside the first 64-byte block or further
    in: the reference's answer (DecodeError or the same arrays), never another."""
    body = synthetic.body_for(40, kind="vllm", seed=13)
    head, rest = body.split(b'"%s":[' % array.encode(), 1)
    head += b'"%s":[' % array.encode()
    if array == "token_logprobs":
        content, tail = rest.split(b"]", 1)
        pieces = content.split(b",")
    else:
        content, tail = rest.split(b"}]", 1)
        pieces = content.split(b"},{")
    answered = 0
    for value in NEAR_LOGPROBS:
        items = list(pieces)
        if array == "token_logprobs":
            items[where] = value
            case = head + b",".join(items) + b"]" + tail
        else:
            key, _ = items[where].split(b":", 1)
            items[where] = key + b":" + value
            case = head + b"},{".join(items) + b"}]" + tail
        answered += as_the_reference(compiled, case)
    assert answered >= 10  # the fast path itself answered the valid ones


def _logprob_array_body(elements: list[bytes], kept: bool) -> bytes:
    """A one-choice body whose kept `token_logprobs` (or, `kept=False`, a skipped array in
    `usage`) holds `elements` as written."""
    array = b"[" + b",".join(elements) + b"]"
    ids = b",".join(b"%d" % (100 + i) for i in range(len(elements)))
    kept_lps = array if kept else b"null"
    return (
        b'{"id":"cmpl-1","choices":[{"index":0,"text":"x","logprobs":{"token_logprobs":%s},'
        b'"finish_reason":"length","token_ids":[%s]}],"usage":{"x":%s}}'
        % (kept_lps, ids, b"[]" if kept else array)
    )


def _elements_spanning(length: int) -> list[bytes]:
    """Logprobs in vLLM's form (-0.d, 1 to 16 digits: read by the bulk check) that take exactly
    `length` (>= 5) bytes with a comma after each."""
    out = []
    while length > 20:
        out.append(b"-0." + b"3" * 16)
        length -= 20
    return [*out, b"-0." + b"7" * (length - 4)]


@pytest.mark.parametrize(
    "bad", [b"-", b"", b"-.", b"1.", b"-1e", b"01", b"-05.5", b"-1.5e-", b"-1.5e-5e"], ids=repr
)
@pytest.mark.parametrize("kept", [True, False], ids=["kept", "skipped"])
def test_malformed_number_at_every_64_byte_block_offset(bad, kept, compiled):
    """A malformed element (a lone `-` or empty ones included) of a logprob array that the bulk
    check reads 64 bytes a block, its closing comma at every offset of a block (the first
    element's length shifts it): never answered, DecodeError like the reference. (Issue 27: a
    lone `-` or an empty element whose comma was a block's last byte was read as -0.0 or 0.0,
    the check that rejects it carried into the next block after the element was taken.)"""
    for offset in range(64, 128):  # where the malformed element starts in the array
        elements = [*_elements_spanning(offset), bad] + [b"-1.5e-05"] * 40
        case = _logprob_array_body(elements, kept)
        with pytest.raises(ValueError):
            json.loads(case)
        assert compiled.fast_path(case) is None, (offset, bad)
        with pytest.raises(DecodeError):
            compiled.decoder.decode(case)
    good = _logprob_array_body([b"-0.5", b"-0.25", b"-1.5e-05"] * 30, kept)
    assert compiled.fast_path(good) is not None  # the shape itself is answered


# top_logprobs elements in, near and just outside the flat-object form the bulk check takes
NEAR_FLAT_OBJECTS = [b"{:-1.5}", b'{"a"-1.5}', b'{"a":-1.5,}', b'{"a":-1.5"b":-2.5}', b'{"a"}']
NEAR_FLAT_OBJECTS += [b'{"a":-1.5,"b"}', b'{,"a":-1.5}', b'{"a":-1.5}{"b":-1.5}', b'{"a":-1.5}}']
NEAR_FLAT_OBJECTS += [b'{"a":-1.5},,{"b":-1.5}', b'{{"a":-1.5}', b'{"a"::-1.5}', b'{"a":-1.5:}']
NEAR_FLAT_OBJECTS += [b'{"a":"b"}', b'{"a":-1.5,"b":}', b'"a":-1.5}', b'{"a":-1.5', b'{"a":-1.5 }']
NEAR_FLAT_OBJECTS += [b'{"a\\"":-1.5}', b'{"a":-1.5,"a":-1.5}', b'{"":-1.5}', b'{"a":[-1.5]}']
NEAR_FLAT_OBJECTS += [b"{}", b"[]", b"-1.5", b'{"a":-1.5}]', b'{"a":-1.5},-1.5', b'{"a":-1.5,:-1}']
NEAR_FLAT_OBJECTS += [b'{"a":-1.5}:-1.5', b'{"a":-1.5},"b"', b'{"a",-1.5}', b'{"a":-1.5,,"b":-1.5}']
NEAR_FLAT_OBJECTS += [b'{"a":{"b":-1.5}}', b'{"a":-1.5}"b"', b'{"\x01":-1.5}', b'{"\xc3\xa9":-1.5}']
NEAR_FLAT_OBJECTS += [b'{"a":-1.5}\x00', b'{"a":-1.5,"b":-2.5e-05}', b'{"a":-1.5,"b":-2.5e-05e-05}']
NEAR_FLAT_OBJECTS += [b'{"a":-1.5}{', b'{"a:-1.5}', b'{"a":-1.5"}', b'{a":-1.5}', b'{"a":--1.5}']


@pytest.mark.parametrize("where", [0, 3, 17, 39])
def test_objects_near_the_flat_form(where, compiled):
    """A top_logprobs element in, near or just outside the flat-object form the bulk check
    takes, at the start, inside the first 64-byte block or further in: the reference's answer
    (DecodeError or the same arrays), never another."""
    body = synthetic.body_for(40, kind="vllm", seed=17)
    head, rest = body.split(b'"top_logprobs":[{', 1)
    head += b'"top_logprobs":['
    content, tail = rest.split(b"}]", 1)
    pieces = content.split(b"},{")
    answered = 0
    for value in NEAR_FLAT_OBJECTS:
        items = [b"{%s}" % piece for piece in pieces]
        items[where] = value
        case = head + b",".join(items) + b"]" + tail
        answered += as_the_reference(compiled, case)
    assert answered >= 8  # the fast path itself answered the valid ones


SUBSTITUTES = [bytes([c]) for c in b'"\\,:{}[]0159-+.eE tn\x00\x1f\x7f'] + [b"\xc3", b"\x80"]


# String contents that keep to the bulk checks since issue 32 (escapes; UTF-8 in the AVX2
# build) and just outside them (\\u escapes, lone surrogates, bad escapes, cut or invalid UTF-8,
# control bytes)
BULK_STRINGS = [b"\\n", b'\\"', b"\\\\", b'\\\\\\"', b'a\\"b\\\\', b"\\/\\b\\f\\r\\t"]
BULK_STRINGS += [b"\\u00e9", b"\\ud83d\\ude00", b"\\ud83d", b"\\ude00", b"\\x", b"\\u12", b"\\"]
BULK_STRINGS += [b"\xc3\xa9", b"\xe6\x97\xa5\xe6\x9c\xac", b"\xf0\x9f\x99\x82", b"\xe2\x80\x8d"]
BULK_STRINGS += [b"\xc3", b"\xe6\x97", b"\xf0\x9f\x99", b"\xed\xa0\x80", b"\xc0\xaf", b"\x80"]
BULK_STRINGS += [b"\xf4\x90\x80\x80", b"\x1f", b"\x7f", b"\xc3\xa9\\n\xc3\xa9", b"\\\xc3\xa9"]


@pytest.mark.parametrize("array", ["tokens", "top_logprobs"])
@pytest.mark.heavy
def test_strings_in_bulk_arrays_at_every_block_offset(array, compiled):
    """A token, or a top-logprob key, with escapes or non-ASCII bytes, valid or not, shifted
    through every offset of a 64-byte block (so an escape's backslash, or a UTF-8 sequence,
    sits across two blocks at some shift), among ASCII neighbours and after one other such
    string: the reference's answer (DecodeError or the same arrays), never another."""
    body = synthetic.body_for(40, kind="vllm", seed=19)
    answered = 0
    for content in BULK_STRINGS:
        for shift in range(66):
            pad = b"p" * shift
            if array == "tokens":
                head, rest = body.split(b'"tokens":[', 1)
                case = head + b'"tokens":["%s","\xc3\xa9","%s",' % (pad, content) + rest
            else:
                head, rest = body.split(b'"top_logprobs":[', 1)
                inserted = b'{"%s":-0.5},{"\\n":-1.5},{"%s":-1.5,"x":-2.5e-05},' % (pad, content)
                case = head + b'"top_logprobs":[' + inserted + rest
            answered += as_the_reference(compiled, case)
    assert answered >= 66 * 10  # the valid ones answered by the fast path itself


@pytest.mark.slow
def test_every_byte_replaced_or_dropped(compiled):
    """Each byte of a realistic 48-token body (its arrays span several of onepass_nogil's
    64-byte bulk windows) replaced by each of 21 bytes, or dropped: the fast path answers only
    for what Python's json parses, and then exactly as the reference."""
    body = synthetic.body_for(48, kind="vllm", seed=7)
    assert body.count(b",") > 250
    seen: collections.Counter[str] = collections.Counter()
    for at in range(len(body)):
        for new in [b"", *SUBSTITUTES]:
            case = body[:at] + new + body[at + 1 :]
            if case != body:
                seen[
                    as_python_parses(compiled, case, (at, new, case[max(at - 20, 0) : at + 20]))
                ] += 1
    assert seen["answered"] > 1000 and seen["rejected"] > 1000  # both outcomes really exercised


TOKEN_IDS = [b"2147483647", b"2147483648", b"4294967297", b"18446744073709551617", b"-1", b"00"]
TOKEN_IDS += [b"9" * n for n in (10, 18, 19, 20, 40)] + [b"1.0", b"1e2", b'"7"', b"null"]


@pytest.mark.parametrize("where", [0, 5, 30])
def test_token_ids_out_of_int32_or_not_integers(where, compiled):
    """A token id that is not an int32 integer, first, inside the first 64-byte run of ids, or
    further in: the reference's answer (DecodeError or the same arrays), never a wrapped id."""
    body = synthetic.body_for(40, kind="vllm", seed=9)
    head, ids = body.split(b'"token_ids":[', 1)
    ids, tail = ids.split(b"]", 1)
    for value in TOKEN_IDS:
        items = ids.split(b",")
        items[where] = value
        case = head + b'"token_ids":[' + b",".join(items) + b"]" + tail
        as_the_reference(compiled, case)


def test_buffers_reused_between_different_bodies(compiled):
    """The per-thread result buffers carry nothing from one body to the next: long and short
    bodies, one and two choices, with and without prompt logprobs, in turn."""
    cases = [
        (synthetic.body_for(5000, kind="vllm", seed=1), 0),
        (synthetic.body_for(7, kind="vllm", n=3, prompt_logprobs=2, seed=2), 2),
        (synthetic.body_for(40, kind="minimal", n=2, seed=3), 0),
        (synthetic.body_for(0, kind="vllm", seed=4), 0),
    ]
    for body, k in cases + cases[::-1]:
        want = REFERENCE.decode(body, topk_prompt_logprobs=k)
        assert_same(compiled.decoder.decode(body, topk_prompt_logprobs=k), want)


def test_limits_are_the_reference_s(compiled):
    """Nesting deeper than MAX_DEPTH and integers longer than MAX_INT_DIGITS: never answered."""
    body = synthetic.body_for(3, kind="vllm", seed=1)[:-1]
    for depth, answered in ((MAX_DEPTH, True), (MAX_DEPTH + 1, False)):
        nested = b"[" * (depth - 1) + b"]" * (depth - 1)
        assert (compiled.fast_path(body + b',"x":' + nested + b"}") is not None) is answered
    for digits, answered in ((MAX_INT_DIGITS, True), (MAX_INT_DIGITS + 1, False)):
        assert (compiled.fast_path(body + b',"x":-' + b"9" * digits + b"}") is not None) is answered


def test_fast_path_answers_realistic_bodies(compiled):
    """No hand-over on generator bodies, prompt logprobs with top-k included."""
    for kind in ("minimal", "vllm"):
        for k in (0, 2):
            body = synthetic.body_for(50, kind=kind, n=2, prompt_logprobs=k, seed=3)
            assert compiled.fast_path(body, k) is not None


def _kinds() -> list:
    params = []
    for kind in realtext.KINDS:
        for how in realtext.RENDERS:
            reason = realtext.unavailable_reason(kind, how)
            marks = [pytest.mark.skip(reason=str(reason))] if reason is not None else []
            params.append(pytest.param(kind, how, id=f"{kind}-{how}", marks=marks))
    return params


@pytest.mark.parametrize(("kind", "how"), _kinds())
def test_fast_path_answers_real_text_bodies(kind, how, compiled):
    """Every body kind in both renderings: answered by the fast path (no hand-over), with top-k
    prompt logprobs and without, and equal to the reference."""
    for n, k, tokens in ((2, 2, 600), (1, 0, 5000)):
        body = realtext.body_for(tokens, kind=kind, render_as=how, n=n, prompt_logprobs=k or None)
        assert compiled.fast_path(body, k) is not None
        kwargs = {"topk_prompt_logprobs": k} if k else {}
        assert_same(compiled.decoder.decode(body, **kwargs), REFERENCE.decode(body, **kwargs))


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
def test_prompt_tokens_argument_in_every_form(convert, k, compiled):
    body = synthetic.body_for(20, kind="vllm", n=2, prompt_len=6, prompt_logprobs=2, seed=4)
    prompt = convert(_prompt_of(body))
    decoder = compiled.decoder
    try:
        want = REFERENCE.decode(body, prompt_tokens=prompt, topk_prompt_logprobs=k)
    except DecodeError:
        with pytest.raises(DecodeError):
            decoder.decode(body, prompt_tokens=prompt, topk_prompt_logprobs=k)
        return
    assert_same(decoder.decode(body, prompt_tokens=prompt, topk_prompt_logprobs=k), want)


@pytest.mark.parametrize("k", [-1, 0, 1, 5, 1 << 17])
def test_topk_argument_values(k, compiled):
    body = synthetic.body_for(20, kind="vllm", prompt_len=6, prompt_logprobs=2, seed=6)
    decoder = compiled.decoder
    want = REFERENCE.decode(body, topk_prompt_logprobs=k)
    assert_same(decoder.decode(body, topk_prompt_logprobs=k), want)


def test_body_types_and_page_ends(compiled):
    """bytes, bytearray and memoryview bodies; bodies ending at every offset of a page."""
    decoder = compiled.decoder
    body = synthetic.body_for(40, kind="minimal", seed=2)
    want = REFERENCE.decode(body)
    for form in (bytes, bytearray, memoryview):
        assert_same(decoder.decode(form(body)), want)
    for pad in range(0, 4200, 61):  # the copy-or-not decision near a page boundary
        padded = body[:-1] + b" " * pad + b"}"
        assert compiled.fast_path(padded) is not None
        assert_same(decoder.decode(padded), want)


def test_escapes_and_digit_runs_at_every_offset(compiled):
    """Strings and numbers of every length around the word-at-a-time scans' 8-byte steps."""
    body = synthetic.body_for(3, kind="vllm", seed=1)
    at = body.index(b'"tokens":[') + len(b'"tokens":[')
    decoder = compiled.decoder
    for length in range(12):
        for where in range(length):
            for escape, valid in ((b"\\n", True), (b"\\x", False), (b'\\"', True)):
                text = b"a" * where + escape + b"b" * (length - where - 1)
                case = body[:at] + b'"' + text + b'",' + body[at:]
                assert (compiled.fast_path(case) is not None) is valid, text
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
            assert (compiled.fast_path(case) is not None) is valid, value


def _python_number(token: bytes) -> float | None:
    """What the reference makes of a logprob token: json's int or float, as a finite double."""
    try:
        value = json.loads(token)
    except ValueError:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if np.isfinite(value) else None


def _not_sure(token: bytes) -> bool:
    """Where the reader may hand over: more than 18 whole digits, more than 19 significant
    digits, or an exponent of more than 8 digits or beyond a double's range."""
    mantissa, _, exponent = token.lower().lstrip(b"-").partition(b"e")
    whole, _, frac = mantissa.partition(b".")
    significant = (whole + frac).lstrip(b"0")
    return len(whole) > 18 or len(significant) > 19 or len(exponent.lstrip(b"+-")) > 8


def _random_tokens(seed: int, count: int) -> list[bytes]:
    """Logprobs as vLLM prints them (float32 values' shortest double repr), and decimal strings
    of every digit count, exponent and leading-zero shape around the fast paths' limits."""
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.integers(-9, 4, count)
    floats = (rng.standard_exponential(count) * -scale).astype(np.float32)
    tokens = [repr(float(value)).encode() for value in floats]
    for _ in range(count):
        whole = b"0" if rng.random() < 0.4 else str(rng.integers(1, 10**9)).encode()
        whole = whole * int(rng.integers(1, 3)) if whole != b"0" else whole
        frac = b"".join(b"%d" % d for d in rng.integers(0, 10, int(rng.integers(0, 26))))
        if frac and rng.random() < 0.3:
            frac = b"0" * int(rng.integers(1, 6)) + frac
        token = (b"-" if rng.random() < 0.5 else b"") + whole + (b"." + frac if frac else b"")
        if rng.random() < 0.5:
            sign = [b"", b"-", b"+"][int(rng.integers(0, 3))]
            token += b"eE"[int(rng.integers(0, 2))].to_bytes(1, "big")
            token += sign + b"0" * int(rng.integers(0, 3)) + b"%d" % rng.integers(0, 340)
        tokens.append(token)
    return tokens


EDGE_NUMBERS = [
    b"0",
    b"-0",
    b"0.0",
    b"-0.0",
    b"-0e5",
    b"0e-400",
    b"1",
    b"-1",
    b"1e0",
    b"1E+2",
    b"1e-0005",
    b"-12.5",
    b"100.25",
    b"-9999.0",
    b"-3.630383071140386e-05",
    b"-0.0017505870200693607",
    b"-0.00000000000000000000012345678901234567890123",
    b"0.1",
    b"0.30000000000000004",
    b"9007199254740993",
    b"9007199254740993.0",
    b"9007199254740992.5",
    b"123456789012345678",
    b"1234567890123456789",
    b"-1234567890123456789.5",
    b"1.7976931348623157e308",
    b"1.7976931348623159e308",
    b"2e308",
    b"-1e400",
    b"4.9e-324",
    b"2.2250738585072014e-308",
    b"2.2250738585072011e-308",
    b"1e-320",
    b"1e-400",
    b"-2.4e-324",
    b"2.5e-324",
    b"-7.3e-4000",
    b"1e+000000001",
    b"1e000000000000000000001",
    b"1.00000000000000011102230246251565404236316680908203125",
    b"1.00000000000000011102230246251565404236316680908203124",
    b"0." + b"1" * 29,
    b"0." + b"1" * 30,
    b"0." + b"1" * 31,
    b"-0." + b"1" * 30,
    b"7." + b"3" * 30 + b"e-1",
    b"00",
    b"01.5",
    b"-01",
    b".5",
    b"5.",
    b"1.e5",
    b"1e",
    b"1e+",
    b"+1",
    b"--1",
    b"1-2",
    b"1.2.3",
    b"1e5e5",
    b"1e5.5",
    b"0x10",
    b"1ee5",
    b"-",
    b"1e5 ",
]


def _every_power(seed: int) -> list[bytes]:
    """Three numbers for each decimal exponent from below a double's smallest to above its
    largest (every entry of the Eisel-Lemire table, and past it), mantissas of 1..19 digits."""
    rng = np.random.default_rng(seed)
    tokens = []
    for power in range(-350, 320):
        for _ in range(3):
            digits = int(rng.integers(1, 20))
            mantissa = str(int(rng.integers(10 ** (digits - 1), 10**digits, dtype=np.uint64)))
            cut = int(rng.integers(1, digits + 1))
            if cut < digits:
                mantissa = mantissa[:cut] + "." + mantissa[cut:]
            sign = "-" if rng.random() < 0.5 else ""
            tokens.append(f"{sign}{mantissa}e{power}".encode())
    return tokens


@pytest.mark.parametrize("source", ["edges", "random", "every-power"])
def test_logprob_numbers_read_exactly(source, compiled):
    """The kept-number reader gives Python's double bit for bit, or hands over (never a guess)."""
    tokens = {
        "edges": lambda: EDGE_NUMBERS,
        "random": lambda: _random_tokens(seed=14, count=4000),
        "every-power": lambda: _every_power(seed=16),
    }[source]()
    answered = 0
    for token in (t for t in tokens if t.strip() == t):  # a token in a body has no spaces
        got = compiled.ext.number(token)
        want = _python_number(token)
        if got is None:
            assert want is None or _not_sure(token), token
            continue
        answered += 1
        assert want is not None and np.float64(got).tobytes() == np.float64(want).tobytes(), token
    assert answered > len(tokens) // 2


def test_logprob_numbers_in_a_body_match_the_reference(compiled):
    """The same numbers as token_logprobs of a body: the decode equals the reference's."""
    tokens = [t for t in EDGE_NUMBERS + _random_tokens(seed=15, count=500) if t.strip() == t]
    decoder = compiled.decoder
    for token in tokens:
        body = (
            b'{"choices":[{"index":0,"token_ids":[7,8],"logprobs":{"text_offset":[0,1],'
            b'"token_logprobs":[-0.5,%s],"top_logprobs":null},"finish_reason":"stop"}]}' % token
        )
        try:
            want = REFERENCE.decode(body)
        except DecodeError:
            assert compiled.fast_path(body) is None, token
            with pytest.raises(DecodeError):
                decoder.decode(body)
            continue
        assert_same(decoder.decode(body), want)


def _float32_midpoints(seed: int, count: int) -> list[bytes]:
    """Doubles halfway between two neighbouring float32 values and the doubles right beside
    them, as Python prints them and with orjson's one-digit exponents: read one double off, a
    midpoint's float32 is the other neighbour's, so the kept float32 shows the double's every
    bit. Whole parts of one and two digits, fractions of 1 to 17 digits, zeros."""
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.integers(-9, 2, count)
    low = (-rng.standard_exponential(count) * scale).astype(np.float32)
    high = np.nextafter(low, np.float32(0))
    middle = (low.astype(np.float64) + high.astype(np.float64)) / 2  # exact in a double
    values = [*middle, *np.nextafter(middle, -np.inf), *np.nextafter(middle, np.inf)]
    tokens = [repr(float(value)).encode() for value in values] + [b"0.0", b"-0.0", b"-0.000"]
    return tokens + [t.replace(b"e-0", b"e-") for t in tokens if b"e-0" in t]


def test_bulk_logprobs_read_exactly(compiled):
    """Long token_logprobs arrays (read by the bulk path, 64 bytes a block, in batches) of
    float32 midpoints and their neighbours: the decode equals the reference's float32 for
    float32, each of which a double one unit off would change."""
    tokens = _float32_midpoints(seed=21, count=3000)
    random.Random(22).shuffle(tokens)
    for first in range(0, len(tokens), 1500):
        body = _logprob_array_body(tokens[first : first + 1500], kept=True)
        assert compiled.fast_path(body) is not None
        assert_same(compiled.decoder.decode(body), REFERENCE.decode(body))


@pytest.mark.parametrize("place", ["text-offset", "usage", "top-logprobs"])
def test_skipped_numbers_in_arrays_and_objects(place, compiled):
    """Skipped numbers (array-of-scalars loop and the general loop): valid exactly when Python
    says so, at the 32-byte quick check's edge and at MAX_INT_DIGITS."""
    small, at = _small_body(place)
    template = {"top-logprobs": b'{"x":%s},', "usage": b'"x":%s,'}.get(place, b"%s,")
    decoder = compiled.decoder
    digits = MAX_INT_DIGITS
    values = [*EDGE_NUMBERS, b"1" * digits, b"-" + b"1" * digits, b"1" * (digits + 1)]
    values += [b"1" * digits + b".5", b"1" * (digits + 1) + b"e5"]  # floats: no digit limit
    values += [b"1" * n for n in range(28, 36)] + [b"-0." + b"5" * n for n in range(26, 34)]
    values += [b"1." + b"2" * n + b"e-7" for n in range(25, 32)]
    for value in values:
        body = small[:at] + template % value + small[at:]
        try:
            json.loads(body)
            python_valid = _within_int_limit(value)
        except ValueError:
            python_valid = False
        assert (compiled.fast_path(body) is not None) is python_valid, value[:40]
        if python_valid:
            assert_same(decoder.decode(body), REFERENCE.decode(body))
        else:
            with pytest.raises(DecodeError):
                decoder.decode(body)


def _within_int_limit(value: bytes) -> bool:
    is_int = not any(c in value for c in b".eE")
    return not is_int or len(value.lstrip(b"-")) <= MAX_INT_DIGITS


ESCAPE_CASES = [  # string content (between the quotes), valid for Python's json?
    (b"\\\\", True),  # an escaped backslash right before the closing quote
    (b'\\"', True),  # an escaped quote right before the closing quote
    (b'ab\\\\\\"', True),
    (b"\\u00e9\\u0000\\/\\b\\f\\n\\r\\t", True),
    (b"\\uD83D\\uDE00", True),  # a surrogate pair
    (b"\\ud800", True),  # lone surrogates: Python takes them (handed to the reference)
    (b"\\udc00", True),
    (b"\\ud800x", True),
    (b"\\ud800\\u0041", True),
    (b"\\u12", False),
    (b"\\u12g4", False),
    (b"\\x", False),
    (b"\\", False),  # escapes the closing quote: the string never ends
    (b"\\U0041", False),
    (b"\\ ", False),
]


@pytest.mark.parametrize("where", ["tokens", "key", "text", "end"])
def test_escapes_at_string_ends(where, compiled):
    """The whole-body escape check agrees with Python's json wherever a string sits."""
    small = synthetic.body_for(3, kind="vllm", n=2, seed=5)
    decoder = compiled.decoder
    for content, valid in ESCAPE_CASES:
        string = b'"' + content + b'"'
        if where == "tokens":
            at = small.index(b'"tokens":[') + len(b'"tokens":[')
            body = small[:at] + string + b"," + small[at:]
        elif where == "key":
            at = small.index(b'"usage":{') + len(b'"usage":{')
            body = small[:at] + string + b":1," + small[at:]
        elif where == "text":
            body = small.replace(b'"text":"', b'"text":"' + content, 1)
        else:
            body = small[:-1] + b',"z":' + string + b"}"
        try:
            json.loads(body)
            python_valid = True
        except ValueError:
            python_valid = False
        assert python_valid is valid, content
        if not valid:
            assert compiled.fast_path(body) is None, content
            with pytest.raises(DecodeError):
                decoder.decode(body)
        else:
            assert_same(decoder.decode(body), REFERENCE.decode(body))
            if b"\\ud8" not in content.lower() and b"\\udc" not in content.lower():
                assert compiled.fast_path(body) is not None, content


# bytes at the edges of UTF-8's ranges (ASCII, continuations, each kind of lead)
UTF8_EDGES = [0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0]
UTF8_EDGES += [0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xF7, 0xF8, 0xFF]


# code points at the edges of each encoded length and around the surrogates
UTF8_CHARS = [chr(c) for c in (0x41, 0x7F, 0x80, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFD, 0xFFFF)]
UTF8_CHARS += [chr(c) for c in (0x10000, 0x10FFFF, 0xE9, 0x65E5, 0x1F642)]


def _utf8_runs() -> list[bytes]:
    """Every pair of edge bytes, seeded runs of 3 to 7 of them, and seeded strings of valid
    characters at the edges (some cut short by a byte)."""
    rng = random.Random(27)
    runs = [bytes(pair) for pair in itertools.product(UTF8_EDGES, repeat=2)]
    runs += [bytes(rng.choices(UTF8_EDGES, k=rng.randint(3, 7))) for _ in range(1500)]
    for _ in range(800):
        text = "".join(rng.choices(UTF8_CHARS, k=rng.randint(1, 6))).encode()
        runs.append(text[:-1] if rng.random() < 0.2 else text)
    return runs


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("where", ["token", "text"])
def test_utf8_checked_as_python_decodes(where, compiled):
    """A string is answered exactly when its bytes are valid UTF-8 as Python decodes them
    (no overlong form, surrogate, code point above U+10FFFF or cut sequence): every pair of
    bytes at the edges of UTF-8's ranges and seeded runs of them, in a token (a short string:
    checked byte by byte) and at every offset of the text (a long one: 16 or 32 bytes at a
    time). The reference takes invalid UTF-8 too, so the decode always equals it."""
    body = synthetic.body_for(3, kind="vllm", seed=5)
    answered = 0
    for i, run in enumerate(_utf8_runs()):
        if where == "token":
            content = run
            case = body.replace(b'"tokens":[', b'"tokens":["' + content + b'",', 1)
        else:
            content = b"\xc3\xa9" * (16 + i % 40) + run + b"z" * (i % 5)
            case = body.replace(b'"text":"', b'"text":"' + content, 1)
        fast = compiled.fast_path(case)
        assert (fast is not None) is _is_utf8(content), (where, run)
        answered += fast is not None
        if i % 50 == 0:
            assert_same(compiled.decoder.decode(case), REFERENCE.decode(case))
    assert 500 < answered < 2500  # both outcomes really exercised


# what -march=x86-64-v3 -mpclmul compiles for, as /proc/cpuinfo names it
AVX2_BUILD_FLAGS = {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
AVX2_BUILD_FLAGS.add("pclmulqdq")


def test_avx2_build_imported_only_where_the_cpu_runs_it(monkeypatch):
    """The baseline build says whether this CPU runs the AVX2 build (as /proc/cpuinfo does);
    the AVX2 decoder is available exactly then, and without it importing the wrapper fails
    with the reason (the AVX2 module itself is never loaded: it may not run here)."""
    reason = registry.unavailable_reason(FAMILY, "onepass_nogil")
    if reason is not None:
        pytest.skip(str(reason))
    base = importlib.import_module("impl.decode._onepass_nogil")
    assert base.TARGET == "baseline"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        flags = set(cpuinfo.read_text().split())
        assert AVX2_BUILD_FLAGS.issubset(flags) == base.CPU_AVX2
    if base.CPU_AVX2:
        assert registry.unavailable_reason(FAMILY, "onepass_nogil_avx2") is None
        assert importlib.import_module("impl.decode._onepass_nogil_avx2").TARGET == "avx2"
    monkeypatch.setattr(base, "CPU_AVX2", False)
    monkeypatch.delitem(sys.modules, "impl.decode.onepass_nogil_avx2", raising=False)
    monkeypatch.delitem(sys.modules, "impl.decode._onepass_nogil_avx2", raising=False)
    with pytest.raises(ImportError, match="lacks AVX2"):
        importlib.import_module("impl.decode.onepass_nogil_avx2")
    assert "impl.decode._onepass_nogil_avx2" not in sys.modules


# (tokens[i], token_logprobs[i], top_logprobs[i]): a first member that repeats the token and
# its logprob byte for byte (onepass_nogil's echoed_objects takes it as it is), one that almost
# does, and alternatives after it, valid or not
ECHOES = [
    (b'"a"', b"-0.5", b'{"a":-0.5}'),
    (b'"\\""', b"-0.5", b'{"\\"":-0.5}'),
    (b'"\\\\"', b"-0.5", b'{"\\\\":-0.5}'),
    (b'"\\",x"', b"-0.5", b'{"\\",x":-0.5}'),
    (b'"\\"', b"-0.5", b'{"\\":-0.5}'),  # the token itself is not a string
    (b'"\\""', b"-0.5", b'{"\\":-0.5}'),
    (b'"\xc3\xa9\\u00e9"', b"-0.5", b'{"\xc3\xa9\\u00e9":-0.5}'),
    (b'"\xc3"', b"-0.5", b'{"\xc3":-0.5}'),
    (b'"a"', b"null", b'{"a":null}'),
    (b'"a"', b"-12", b'{"a":-12}'),
    (b'"a"', b" -0.5 ", b'{"a": -0.5 }'),
    (b'"a"', b" -0.5 ", b'{"a":-0.5}'),
    (b'"a"', b"-0.5", b'{"a":-0.5 }'),
    (b'"a"', b"-0.5", b'{"a":-0.50}'),
    (b'"a"', b"-0.5", b'{"a":-0.5e}'),
    (b'"a"', b"-0.5", b'{"a":-0.5}}'),
    (b'"a"', b"-0.5", b'{"ab":-0.5}'),
    (b'"a"', b"-0.5", b'{"a",-0.5}'),
    (b'"a"', b"-0.5", b'{"ax:-0.5}'),  # the same bytes but for the closing quote
    (b'"a"', b"-0.5", b'{"a"-0.5}'),
    (b'"a"', b"-0.5", b'{"a":-0.5,"b":-1.5}'),
    (b'"a"', b"-0.5", b'{"a":-0.5,"b":-1.5,"c":-9999.0}'),
    (b'"a"', b"-0.5", b'{"a":-0.5, "b" : -1.5 }'),
    (b'"a"', b"-0.5", b'{"a":-0.5,"b":{"c":[1,2.5,"d"]},"e":true}'),
    (b'"a"', b"-0.5", b'{"a":-0.5,"b":-1.5,}'),
    (b'"a"', b"-0.5", b'{"a":-0.5,"b"}'),
    (b'"a"', b"-0.5", b'{"a":-0.5,"b":-1.5e}'),
    (b'"a"', b"-0.5", b'{"a":-0.5,"b":01}'),
    (b'"a"', b"-0.5", b'{"a":-0.5,"b\x01":-1.5}'),
    (b'"a"', b"-0.5", b'{"a":-0.5,"\xc3":-1.5}'),
    (b'"a"', b"-0.5", b'{"a":-0.5,"b":' + b"[" * 70 + b"]" * 70 + b"}"),
    (b'"a"', b"-0.5", b'{"a":-0.5,"b":' + b"1" * 5000 + b"}"),
    (b'"a"', b"-0.5", b'["a",-0.5]'),
]


def _echo_body(
    tokens: list[bytes], logprobs: list[bytes], top: list[bytes], tokens_last: bool = False
) -> bytes:
    """A vllm body whose logprobs arrays are these elements' bytes joined by bare commas, in
    vLLM's order (or with `tokens` after top_logprobs)."""
    body = synthetic.body_for(40, kind="vllm", seed=23)
    head, rest = body.split(b'"token_logprobs":[', 1)
    tail = rest.split(b"}]},", 1)[1]
    arrays = [
        b'"token_logprobs":[%s]' % b",".join(logprobs),
        b'"tokens":[%s]' % b",".join(tokens),
        b'"top_logprobs":[%s]' % b",".join(top),
    ]
    if tokens_last:
        arrays.append(arrays.pop(1))
    return head + b",".join(arrays) + b"}," + tail


@pytest.mark.parametrize("where", [0, 3, 38, 39])
@pytest.mark.heavy
def test_top_logprobs_that_repeat_tokens(where, compiled):
    """A top_logprobs element whose first member repeats (or almost repeats) its position's
    token and logprob, the alternatives after it valid or not, at the first, a middle, the
    last but one and the last position; and the same bodies with `tokens` one element short,
    cut inside that element, or with `tokens` after top_logprobs: the reference's answer."""
    body = synthetic.body_for(40, kind="vllm", seed=23)
    logprobs = json.loads(body)["choices"][0]["logprobs"]
    tokens = [json.dumps(t, ensure_ascii=False).encode() for t in logprobs["tokens"]]
    values = [repr(v).encode() for v in logprobs["token_logprobs"]]
    top = [
        json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode()
        for d in logprobs["top_logprobs"]
    ]
    assert _echo_body(tokens, values, top) == body
    answered = 0
    for token, value, element in ECHOES:
        t, v, e = list(tokens), list(values), list(top)
        t[where], v[where], e[where] = token, value, element
        case = _echo_body(t, v, e)
        answered += as_the_reference(compiled, case)
        as_the_reference(compiled, _echo_body(t[:-1], v, e))
        as_the_reference(compiled, _echo_body(t, v, e, tokens_last=True))
        cut = case.index(element, case.index(b'"top_logprobs"'))
        for length in range(len(element)):
            as_the_reference(compiled, case[: cut + length])
    assert answered >= 15  # the valid ones answered by the fast path itself
