"""The decode contract's limits, checked the same way by every decoder: nesting depth and
integer length (`MAX_DEPTH`, `MAX_INT_DIGITS` in `impl.decode`).

`check_depth` measures the body's nesting on its bytes, not by recursing, so the answer does
not depend on the interpreter's call stack (the stdlib parser recurses; orjson, ujson and
simdjson stop at 1024 levels): brackets outside strings are counted, strings being told apart
by their quotes once the quotes escaped by an odd run of backslashes are dropped. A body with
no more brackets than the limit costs a few `find` steps; otherwise one `bytes.translate` pass,
one nonzero pass and numpy over the structural bytes only (cost on the 262144-token vLLM body:
see docs/decode.md).

`may_hold_long_integer` is cheap and conservative: a run of more than MAX_INT_DIGITS digits
must cover two consecutive bytes of a stride of MAX_INT_DIGITS // 2, so only those samples and
the spans between them are looked at. The reference reads integers with a length check only
when it says True; the fast decoders whose parsers do not reject such integers themselves
(msgspec skips them, ujson and fromstring follow `sys.int_max_str_digits`) hand such bodies
to the reference.
"""

from __future__ import annotations

import numpy as np

from impl.decode import MAX_DEPTH, MAX_INT_DIGITS, DecodeError, decode_error

_MARKED = bytes(1 if byte in b'"[]{}\\' else 0 for byte in range(256))
_STEP = np.zeros(256, dtype=np.int8)
_STEP[[ord("["), ord("{")]], _STEP[[ord("]"), ord("}")]] = 1, -1
_STRIDE = MAX_INT_DIGITS // 2
_DIGIT = np.zeros(256, dtype=bool)
_DIGIT[ord("0") : ord("9") + 1] = True


def _escaped_quotes(raw: np.ndarray, slashes: np.ndarray) -> np.ndarray:
    """Positions of the quotes that an odd run of backslashes escapes."""
    starts = np.flatnonzero(np.diff(slashes, prepend=-2) != 1)
    lengths = np.diff(starts, append=len(slashes))
    after = slashes[starts] + lengths
    after = after[(lengths % 2 == 1) & (after < len(raw))]
    return after[raw[after] == ord('"')]


def nesting_depth(body: bytes) -> int:
    """Deepest nesting of arrays and objects outside strings (the top level is 1). Exact for
    valid JSON; for invalid JSON some number that the parsers' own errors make irrelevant."""
    raw = np.frombuffer(body, dtype=np.uint8)
    # bytes.translate to 0/1 and a bool nonzero: one pass, faster than a numpy gather.
    where = np.flatnonzero(np.frombuffer(body.translate(_MARKED), dtype=np.bool_))
    byte = raw[where]
    slash = byte == ord("\\")
    if slash.any():
        keep = ~slash
        keep[np.searchsorted(where, _escaped_quotes(raw, where[slash]))] = False
        where, byte = where[keep], byte[keep]
    inside = (np.cumsum(byte == ord('"'), dtype=np.int64) & 1).astype(bool)  # the quote too
    return int(np.cumsum(_STEP[byte[~inside]], dtype=np.int64).max(initial=0))


def _few_brackets(body: bytes) -> bool:
    """True when `body` holds at most MAX_DEPTH brackets (memchr steps, stops at MAX_DEPTH+1)."""
    seen = 0
    for bracket in (b"[", b"{"):
        at = body.find(bracket)
        while at >= 0:
            seen += 1
            if seen > MAX_DEPTH:
                return False
            at = body.find(bracket, at + 1)
    return True


def check_depth(body: bytes) -> None:
    """Raise the contract's DecodeError when `body` nests deeper than MAX_DEPTH."""
    if _few_brackets(body):
        return
    depth = nesting_depth(body)
    if depth > MAX_DEPTH:
        raise decode_error(f"nested {depth} levels deep; the limit is {MAX_DEPTH}", body)


def may_hold_long_integer(body: bytes) -> bool:
    """False when no run of more than MAX_INT_DIGITS digits is in `body` (exact for False;
    True means such a run exists, in a string or a number)."""
    raw = np.frombuffer(body, dtype=np.uint8)
    sampled = _DIGIT[raw[::_STRIDE]]
    starts = np.flatnonzero(sampled[:-1] & sampled[1:]) * _STRIDE  # two samples: a candidate
    if not len(starts):
        return False
    inner = starts[:, None] + np.arange(0, _STRIDE, 64)  # every 64th byte between must be too
    starts = starts[_DIGIT[raw[inner]].all(axis=1)]
    for start in starts.tolist():
        end = start + _STRIDE + 1
        if not body[start:end].isdigit():
            continue
        while start > 0 and 48 <= body[start - 1] <= 57:
            start -= 1
        while end < len(body) and 48 <= body[end] <= 57:
            end += 1
        if end - start > MAX_INT_DIGITS:
            return True
    return False


class LongInteger(DecodeError):
    """An integer literal longer than MAX_INT_DIGITS (raised inside the reference's parse)."""


def bounded_int(literal: str) -> int:
    """`int(literal)` for a JSON integer of at most MAX_INT_DIGITS digits, else LongInteger."""
    digits = len(literal) - literal.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise LongInteger(
            f"an integer of {digits} digits; the limit is {MAX_INT_DIGITS}; "
            f"it starts {literal[:20]!r}"
        )
    return int(literal)
