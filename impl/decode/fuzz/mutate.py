"""Seed bodies and the mutations the fuzzer makes of them (see the package docstring).

Every mutation takes the body's bytes and a `random.Random` and returns new bytes; none needs
the result to be valid JSON (the reference decides what it is). They aim where the compiled
walks have their edges: the elements of the numeric arrays and of `top_logprobs` (checked 64
bytes a block by `onepass_nogil`'s bulk checks, in 16- and 32-byte vectors) replaced so that
one ends at or next to a block's edge, by malformed numbers or near-forms; truncations; byte
flips; nesting around the depth limit; long digit runs; escaped, duplicated and non-ASCII
keys; strings with invalid UTF-8, escapes and control characters; whitespace that shifts the
alignment; valid numbers of every form where logprobs are kept.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from impl.decode import MAX_DEPTH, MAX_INT_DIGITS
from impl.workloads import realtext

#: The arrays whose elements are aimed at (their key, as written in a body).
ARRAYS = (b"token_ids", b"token_logprobs", b"text_offset", b"prompt_token_ids", b"top_logprobs")

#: Malformed numbers and near-forms of the logprob form the bulk checks take.
BAD_NUMBERS = [
    b"-", b"", b"-.", b"1.", b".5", b"01", b"-01", b"1e", b"1e+", b"-1e+", b"1e-", b"+1",
    b"--1", b"1-2", b"1.2.3", b"1e5e5", b"1e5.5", b"0x10", b"1ee5", b"-1.5e-05e-05", b"-1.5e-055",
    b"-1.5ee-05", b"-1.5e--05", b"-1.-5", b"1.5-", b"-1,5", b"NaN", b"Infinity", b"-Infinity",
    b"nul", b"tru", b"null", b"true", b'"-1.5"', b"[]", b"{}", b"[-1.5]", b"-1.5 ", b" -1.5",
]  # fmt: skip
#: Valid numbers of every form (exponents, zeros, 17-20 digits, beyond a double's range).
GOOD_NUMBERS = [
    b"0", b"-0", b"0.0", b"-0.0", b"-0e5", b"1E+2", b"1e-0005", b"-12.5", b"-9999.0",
    b"-3.630383071140386e-05", b"-0.0017505870200693607", b"0.30000000000000004",
    b"9007199254740993", b"1234567890123456789", b"-1234567890123456789.5", b"2147483647",
    b"2147483648", b"-2147483649", b"18446744073709551616", b"1.7976931348623159e308", b"2e308",
    b"4.9e-324", b"2.4e-324", b"1e-400", b"-1.5e-05", b"-1.5E-05", b"-1.5e+05", b"-1e-05",
]  # fmt: skip
#: Bytes a flip puts in: structure, number characters, whitespace, controls, UTF-8 edges.
BYTES = b'{}[]:,"\\0123456789-+.eE tnfrua \t\n\r\x00\x01\x1f\x7f'
BYTES += b"\x80\xbf\xc0\xc3\xe0\xed\xf0\xf4\xff"


def seeds(max_tokens: int = 90) -> list[tuple[str, bytes, int | None]]:
    """(name, body, prompt logprobs k) of every body kind x rendering that can be made here:
    short bodies (their arrays still span several 64-byte blocks), one and two choices, with
    prompt logprobs and without."""
    out = []
    for kind in realtext.ROUTER_BODIES:
        for render in realtext.RENDERS:
            if realtext.unavailable_reason(kind, render) is not None:
                continue
            for tokens, n, k in ((max_tokens, 1, None), (max_tokens // 3, 2, 2), (7, 1, 0)):
                body = realtext.body_for(
                    tokens, kind=kind, render_as=render, n=n, prompt_logprobs=k, seed=tokens + n
                )
                out.append((f"{kind}-{render}-t{tokens}-n{n}-k{k}", body, k))
    return out


def _arrays(body: bytes) -> list[tuple[int, int]]:
    """(first byte, end) of the content of every array of ARRAYS in `body` (to the first
    ']' for numbers; top_logprobs to its matching bracket, brackets in strings ignored)."""
    spans = []
    for key in ARRAYS:
        for found in re.finditer(rb'"%s":\s*\[' % key, body):
            start = found.end()
            if key == b"top_logprobs":  # an array of objects (or nulls): "}]" or "l]" ends it
                close = _OBJECTS_END.search(body, start)
                end = close.start() + 1 if close else -1
            else:
                end = body.find(b"]", start)
            if end > start:
                spans.append((start, end))
    return spans


_OBJECTS_END = re.compile(rb"[}l]\][,}]")


def _elements(body: bytes, start: int, end: int) -> list[tuple[int, int]]:
    """(first byte, end) of the comma-separated pieces of [start, end) (a top_logprobs piece
    is one of its objects, or a member when the objects are cut at their commas too)."""
    out, first = [], start
    for at in range(start, end + 1):
        if at == end or body[at] == 0x2C:
            out.append((first, at))
            first = at + 1
    return out


def _aimed(rng: random.Random, start: int, pieces: list[tuple[int, int]]) -> int:
    """The index of a piece to replace: half the time one whose end (its comma) is at or next
    to an edge of a 64-byte block counted from the array's start (or of a 32- or 16-byte
    vector), else any."""
    if rng.random() < 0.5:
        width = rng.choice((64, 64, 64, 32, 16))
        edge = (width - 1, 0, 1)
        near = [i for i, (_, end) in enumerate(pieces) if (end - start) % width in edge]
        if near:
            return rng.choice(near)
    return rng.randrange(len(pieces))


def replace_element(rng: random.Random, body: bytes) -> bytes:
    """One element of a numeric array, or one member or object of top_logprobs, replaced by a
    malformed or valid number, a shortened or lengthened one, or nothing."""
    spans = _arrays(body)
    if not spans:
        return byte_flips(rng, body)
    start, end = rng.choice(spans)
    pieces = _elements(body, start, end)
    first, last = pieces[_aimed(rng, start, pieces)]
    piece = body[first:last]
    if b":" in piece and rng.random() < 0.7:  # a top_logprobs member: keep the key
        key, _, _ = piece.rpartition(b":")
        new = key + b":" + _number(rng)
    elif rng.random() < 0.2 and piece:  # one byte more or less: the next elements move
        new = piece[:-1] if rng.random() < 0.5 else piece + piece[-1:]
    else:
        new = _number(rng)
    return body[:first] + new + body[last:]


def _number(rng: random.Random) -> bytes:
    return rng.choice(BAD_NUMBERS if rng.random() < 0.6 else GOOD_NUMBERS)


def shift_to_edge(rng: random.Random, body: bytes) -> bytes:
    """A malformed number put so that its comma is exactly a block's last byte (or first):
    the elements before it padded with digits until it is."""
    spans = [span for span in _arrays(body) if body[span[0]] in b"-0123456789"]
    if not spans:
        return replace_element(rng, body)
    start, end = rng.choice(spans)
    pieces = _elements(body, start, end)
    if len(pieces) < 3:
        return replace_element(rng, body)
    target = rng.randrange(1, len(pieces))
    bad = rng.choice(BAD_NUMBERS[:12])
    first, last = pieces[target]
    comma = first + len(bad) - start  # where its comma would be, from the array's start
    want = rng.choice((63, 64, 62, 31, 32))
    pad = (want - comma) % 64
    # the element before gets `pad` more digits (its fraction's or exponent's: still a number)
    _, before_end = pieces[target - 1]
    return body[:before_end] + b"1" * pad + body[before_end:first] + bad + body[last:]


def truncate(rng: random.Random, body: bytes) -> bytes:
    """The body cut anywhere, or within its last 70 bytes."""
    if rng.random() < 0.5:
        return body[: max(len(body) - rng.randint(1, 70), 0)]
    return body[: rng.randrange(len(body))]


def byte_flips(rng: random.Random, body: bytes) -> bytes:
    """One to four bytes replaced, inserted or dropped."""
    data = bytearray(body)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(data) + 1)
        edit = rng.randrange(3)
        if edit == 0 and at < len(data):
            data[at] = rng.choice(BYTES)
        elif edit == 1:
            data.insert(at, rng.choice(BYTES))
        elif at < len(data):
            del data[at]
    return bytes(data)


def nest(rng: random.Random, body: bytes) -> bytes:
    """A member nested around the depth limit (the body's objects are 1-6 deep), or far past
    it, put into the top-level object or a choice."""
    depth = rng.choice((MAX_DEPTH - 3, MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH, 200, 3000))
    opener = rng.choice((b"[", b'{"a":'))
    closer = b"]" if opener == b"[" else b"}"
    value = opener * depth + rng.choice((b"", b"1", b"[]", b"{}")) + closer * depth
    where = rng.choice([m.end() for m in re.finditer(rb'\{"', body)] or [1])
    return body[:where] + b'x":' + value + b',"' + body[where:]


def digit_run(rng: random.Random, body: bytes) -> bytes:
    """A number replaced by a long run of digits (around 19 digits, the 32-byte checks, the
    integer digit limit), maybe with a sign, a fraction or an exponent."""
    length = rng.choice((16, 17, 18, 19, 20, 21, 30, 31, 32, 33, 34, 40, MAX_INT_DIGITS - 1))
    length = rng.choice((length, MAX_INT_DIGITS, MAX_INT_DIGITS + 1))
    run = ("1" + "".join(rng.choices("0123456789", k=length - 1))).encode()
    run = rng.choice((b"", b"-")) + run + rng.choice((b"", b".5", b"e-7", b".123e+4"))
    numbers = [m.span() for m in re.finditer(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", body)]
    if not numbers:
        return body
    first, last = rng.choice(numbers)
    return body[:first] + run + body[last:]


_KEYS = [b"index", b"token_ids", b"logprobs", b"token_logprobs", b"finish_reason", b"choices"]
_KEYS += [b"prompt_logprobs", b"prompt_token_ids", b"logprob", b"rank"]


def keys(rng: random.Random, body: bytes) -> bytes:
    """A key the walks read escaped (`\\u005f`), renamed, made non-ASCII or duplicated; or a
    member with an escaped or non-ASCII key or string added."""
    present = [key for key in _KEYS if b'"%s":' % key in body]
    choice = rng.randrange(4)
    if present and choice < 3:
        key = rng.choice(present)
        old = b'"%s":' % key
        if choice == 0:
            escaped = key.replace(b"_", b"\\u005f").replace(b"e", b"\\u0065", 1)
            new = b'"%s":' % escaped
        elif choice == 1:
            new = rng.choice((b'"%s\xc3\xa9":' % key, b'"%s ":' % key, b'"%s":' % key[:-1]))
        else:  # the member twice: the second one's value a copy of what follows the first
            at = body.find(old)
            value_end = re.search(rb"[,}]", body[at + len(old) :])
            value = body[at + len(old) : at + len(old) + value_end.start()] if value_end else b"1"
            return body[:at] + old + value + b"," + body[at:]
        count = body.count(old)
        nth = rng.randrange(count)
        at = -1
        for _ in range(nth + 1):
            at = body.find(old, at + 1)
        return body[:at] + new + body[at + len(old) :]
    strings = [b'"\\u00e9"', b'"\\ud800"', b'"\\ud83d\\ude00"', b'"\xff\xfe"', b'"\xed\xa0\x80"']
    strings += [b'"\xc3"', b'"\x01"', b'"a\\x"', b'"\xf4\x90\x80\x80"', b'"\xe6\x97\xa5"']
    member = rng.choice((b'"\\u0078":1,', b'"\xe6\x97\xa5\xe6\x9c\xac":%s,', b'"k":%s,'))
    if b"%s" in member:
        member %= rng.choice(strings)
    where = rng.choice([m.end() for m in re.finditer(rb"\{", body)] or [1])
    return body[:where] + member + body[where:]


def whitespace(rng: random.Random, body: bytes) -> bytes:
    """JSON whitespace (or a byte that is not) after one to three commas or colons: the
    elements after it move off their alignment."""
    data = body
    for _ in range(rng.randint(1, 3)):
        marks = [m.end() for m in re.finditer(rb"[,:\[{]", data)]
        if not marks:
            break
        at = rng.choice(marks)
        ws = rng.choice((b" ", b"\n", b"\t", b"\r\n  ", b" " * rng.randint(1, 70), b"\x0b"))
        data = data[:at] + ws + data[at:]
    return data


def numbers(rng: random.Random, body: bytes) -> bytes:
    """Kept logprobs replaced by seeded valid numbers of many forms (every digit count up to
    25, zeros, exponents up to +-340): the decoders must read each one exactly."""
    spans = [span for span in _arrays(body) if body.endswith(b'"token_logprobs":[', 0, span[0])]
    if not spans:
        return replace_element(rng, body)
    start, end = rng.choice(spans)
    pieces = _elements(body, start, end)
    out = []
    for _ in pieces:
        whole = rng.choice((b"0", b"1", b"9", b"%d" % rng.randrange(10**9)))
        frac = b"%d" % rng.randrange(10 ** rng.randint(1, 25))
        token = rng.choice((b"-", b"")) + whole + b"." + frac
        if rng.random() < 0.4:
            token += rng.choice((b"e", b"E")) + rng.choice((b"", b"-", b"+"))
            token += b"%d" % rng.randrange(340)
        out.append(token)
    return body[:start] + b",".join(out) + body[end:]


def splice(rng: random.Random, body: bytes) -> bytes:
    """A span of the body copied elsewhere in it (elements duplicated, arrays mixed)."""
    first = rng.randrange(len(body))
    span = body[first : first + rng.randint(1, 200)]
    at = rng.randrange(len(body))
    return body[:at] + span + body[at:]


#: (mutation, weight): most weight where the walks have had their bugs.
MUTATIONS: list[tuple[Callable[[random.Random, bytes], bytes], int]] = [
    (replace_element, 30),
    (shift_to_edge, 15),
    (numbers, 8),
    (byte_flips, 12),
    (truncate, 6),
    (whitespace, 6),
    (keys, 8),
    (digit_run, 5),
    (nest, 4),
    (splice, 6),
]


def mutate(rng: random.Random, body: bytes) -> tuple[bytes, str]:
    """One to three mutations of `body`, and their names."""
    functions, weights = zip(*MUTATIONS, strict=True)
    chosen = rng.choices(functions, weights, k=rng.choice((1, 1, 1, 2, 3)))
    for function in chosen:
        if body:
            body = function(rng, body)
    return body, "+".join(function.__name__ for function in chosen)
