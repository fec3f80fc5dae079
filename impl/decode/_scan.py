"""A structural index of a JSON body in numpy (simdjson's "stage 1"): strings and brackets.

One table lookup over the body finds quotes, backslashes, brackets and the capitals that start
NaN / Infinity; quotes escaped by an odd run of backslashes are dropped, so string spans are
exact; every escape and raw control byte is checked; brackets outside strings give depths and
matching pairs (balanced, same kind). Used by `fromstring` to find real keys without parsing
what it does not need, and (`check_skipped`) to prove what it skipped valid JSON, vectorised.
Anything it cannot vouch for raises `Unsure`.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from impl.decode import MAX_DEPTH
from impl.decode._common import Unsure
from impl.decode._numbers import spans_are_numbers

_QUOTE, _SLASH, _OPEN, _CLOSE, _LETTER, _CTRL = 1, 2, 3, 4, 5, 6
_CLASS = np.zeros(256, dtype=np.uint8)
_CLASS[:32] = _CTRL  # raw control bytes: JSON whitespace outside strings, invalid elsewhere
_CLASS[ord('"')], _CLASS[ord("\\")] = _QUOTE, _SLASH
_CLASS[[ord("{"), ord("[")]], _CLASS[[ord("}"), ord("]")]] = _OPEN, _CLOSE
_CLASS[[ord("N"), ord("I")]] = _LETTER
_ESCAPES = frozenset(b'"\\/bfnrtu')
_HEX = frozenset(b"0123456789abcdefABCDEF")
_MARKED = bytes(1 if _CLASS[byte] else 0 for byte in range(256))
_WS = b" \t\n\r"
_SMALL = 16384  # skipped values up to this size are checked by the stdlib parser

# The string-free copy of a region: X (invalid there, whitespace included: such a region is
# handed to the stdlib), { } [ ] : , " (a whole string) and V (a byte of a scalar).
_X, _OBJ, _OBJ_END, _ARR, _ARR_END, _COLON, _COMMA, _STR, _V = range(9)
_RCLASS = np.zeros(256, dtype=np.uint8)
for _byte, _cls in zip(b'{}[]:,"', range(1, 8), strict=True):
    _RCLASS[_byte] = _cls
_RCLASS[list(b"0123456789+-.eEtrufalsn")] = _V
_RTABLE = _RCLASS.tobytes()  # for bytes.translate: faster than a numpy gather
_SPECIAL = bytes(1 if byte in b"+-.eEtrufalsn" else 0 for byte in range(256))  # not digits
_LITERAL_LETTER = np.zeros(256, dtype=bool)
_LITERAL_LETTER[list(b"trufalsn")] = True
_PAIRS = np.zeros(81, dtype=bool)  # which class may follow which (context rules apart)
for _a, _followers in (
    (_OBJ, (_OBJ_END, _STR)),
    (_ARR, (_ARR_END, _OBJ, _ARR, _STR, _V)),
    (_COLON, (_OBJ, _ARR, _STR, _V)),
    (_COMMA, (_OBJ, _ARR, _STR, _V)),
    (_STR, (_COLON, _COMMA, _OBJ_END, _ARR_END)),
    (_V, (_V, _COMMA, _OBJ_END, _ARR_END)),
    (_OBJ_END, (_COMMA, _OBJ_END, _ARR_END)),
    (_ARR_END, (_COMMA, _OBJ_END, _ARR_END)),
):
    _PAIRS[[_a * 9 + b for b in _followers]] = True
# Scalar bytes again, finer, for the number grammar: B (anything else), 0, 1-9, - + . e/E and
# the other letters of true/false/null; and which of them may follow which inside a number.
_B, _D0, _D19, _MINUS, _PLUS, _DOT, _EXP, _WORD = range(8)
_NCLASS = np.zeros(256, dtype=np.uint8)
_NCLASS[ord("0")], _NCLASS[list(b"123456789")] = _D0, _D19
_NCLASS[[ord("-"), ord("+"), ord("."), ord("e"), ord("E")]] = _MINUS, _PLUS, _DOT, _EXP, _EXP
_NCLASS[list(b"trufalsn")] = _WORD
_NTABLE = _NCLASS.tobytes()
_NPAIRS = np.zeros(64, dtype=bool)
for _a, _followers in (
    (_B, (_B, _D0, _D19, _MINUS)),
    (_MINUS, (_D0, _D19)),
    (_PLUS, (_D0, _D19)),
    (_DOT, (_D0, _D19)),
    (_EXP, (_D0, _D19, _PLUS, _MINUS)),
    (_D0, (_B, _D0, _D19, _DOT, _EXP)),
    (_D19, (_B, _D0, _D19, _DOT, _EXP)),
):
    _NPAIRS[[_a * 8 + b for b in _followers]] = True
_NPAIRS_OK = bytes(np.flatnonzero(_NPAIRS).tolist())  # codes translate() deletes
_ZERO_FIRST = bytes(1 if code in (_B * 8 + _D0, _MINUS * 8 + _D0) else 0 for code in range(256))
_DOT_OR_EXP = bytes(1 if byte in b".eE" else 0 for byte in range(256))
_DEPTH_STEP = np.zeros(9, dtype=np.int16)
_DEPTH_STEP[[_OBJ, _ARR]], _DEPTH_STEP[[_OBJ_END, _ARR_END]] = 1, -1
_THROUGH_SCALAR = _PAIRS[np.arange(81) // 9 * 9 + _V] & _PAIRS[_V * 9 + np.arange(81) % 9]


class Index:
    """String spans and matched brackets of one body."""

    def __init__(self, body: bytes) -> None:
        raw = np.frombuffer(body, dtype=np.uint8)
        # bytes.translate to 0/1 then a bool nonzero: faster than a numpy table gather.
        where = np.flatnonzero(np.frombuffer(body.translate(_MARKED), dtype=np.bool_))
        kind = _CLASS[raw[where]]
        quotes = where[kind == _QUOTE]
        escaped = []
        for pos in where[kind == _SLASH].tolist():  # rare: find the quotes a backslash escapes
            if pos and raw[pos - 1] == 92:
                continue  # inside a run already measured
            end = pos
            while end < len(raw) and raw[end] == 92:
                end += 1
            if (end - pos) % 2 and end < len(raw):  # the last backslash escapes raw[end]
                if raw[end] not in _ESCAPES or (
                    raw[end] == 117 and not _HEX.issuperset(body[end + 1 : end + 5].ljust(4))
                ):
                    raise Unsure  # an invalid escape (or a backslash outside a string)
                if raw[end] == 34:
                    escaped.append(end)
        if escaped:
            quotes = np.delete(quotes, np.searchsorted(quotes, escaped))
        if len(quotes) % 2:
            raise Unsure
        self.quotes = quotes
        ctrl = where[kind == _CTRL]
        if len(ctrl) and (
            np.any((np.searchsorted(quotes, ctrl) % 2) == 1)  # raw inside a string
            or not np.isin(raw[ctrl], (9, 10, 13)).all()  # not whitespace outside
        ):
            raise Unsure
        marks = (kind >= _OPEN) & (kind != _CTRL)  # brackets, capitals: outside strings?
        where, kind = where[marks], kind[marks]
        outside = (np.searchsorted(quotes, where) % 2) == 0
        if np.any(outside & (kind == _LETTER)):
            raise Unsure  # NaN / Infinity literal (or garbage) outside strings
        keep = outside & (kind != _LETTER)
        self.pos = where[keep]
        is_open = kind[keep] == _OPEN
        depth = np.cumsum(np.where(is_open, 1, -1))
        if not len(depth) or depth[-1] != 0 or np.any(depth[:-1] <= 0) or depth.max() > MAX_DEPTH:
            raise Unsure  # not exactly one balanced top-level value
        if body[: self.pos[0]].strip(_WS) or body[self.pos[-1] + 1 :].strip(_WS):
            raise Unsure
        self.level = np.where(is_open, depth, depth + 1).astype(np.int16)
        order = np.argsort(self.level, kind="stable")  # a radix sort for int16
        opens, closes = order[0::2], order[1::2]
        byte = raw[self.pos]
        if not (is_open[opens].all() and not is_open[closes].any()):
            raise Unsure
        if np.any(self.level[opens] != self.level[closes]) or np.any(
            byte[opens] + 2 != byte[closes]
        ):
            raise Unsure  # mismatched bracket kinds
        self.close = np.empty(len(self.pos), dtype=np.int64)
        self.close[opens] = closes
        self.is_open, self.byte, self.body, self.raw = is_open, byte, body, raw
        self.skeletons: list[int] = []  # values whose own bytes the stdlib parsed
        self.seen: set[int] = set()  # values checked whole (stdlib or the number checks)

    def children(self, i: int) -> np.ndarray:
        lo, hi = i + 1, int(self.close[i])
        mask = self.is_open[lo:hi] & (self.level[lo:hi] == self.level[i] + 1)
        return np.flatnonzero(mask) + lo

    def skeleton(self, i: int) -> Any:
        """The value at bracket i with nested values replaced by `[j]` placeholders."""
        pieces, start = [], int(self.pos[i])
        for j in self.children(i).tolist():
            pieces += [self.body[start : self.pos[j]], b"[%d]" % j]
            start = int(self.pos[self.close[j]]) + 1
        pieces.append(self.body[start : self.pos[self.close[i]] + 1])
        self.skeletons.append(i)
        try:
            return json.loads(b"".join(pieces).decode("utf-8", "surrogateescape"))
        except ValueError:
            raise Unsure from None

    def value(self, i: int) -> Any:
        """The whole value at bracket i parsed by the stdlib (small values only)."""
        self.seen.add(i)
        try:
            text = self.body[self.pos[i] : self.pos[self.close[i]] + 1]
            return json.loads(text.decode("utf-8", "surrogateescape"))
        except ValueError:
            raise Unsure from None

    def flat(self, i: int) -> bytes | None:
        """The content of array i if it holds no nested value and no string, else None."""
        start, end = int(self.pos[i]) + 1, int(self.pos[self.close[i]])
        nested = self.close[i] != i + 1
        strings = np.searchsorted(self.quotes, start) != np.searchsorted(self.quotes, end)
        return None if nested or strings else self.body[start:end]


def ref(index: Index, value: Any, kind: int) -> int | None:
    """The bracket index of a placeholder of the given kind, None for anything else."""
    if type(value) is list and len(value) == 1 and index.byte[value[0]] == kind:
        return value[0]
    return None


def check_skipped(index: Index) -> None:
    """Prove that the values no one parsed are valid JSON (else `Unsure`).

    Every byte of the body is then checked: skeletons by the stdlib, consumed arrays by the
    number checks or the stdlib, and here each other child of a skeleton: small ones by the
    stdlib, big ones by `_compact_valid` (the stdlib when that cannot vouch for them).
    """
    done = index.seen.union(index.skeletons)
    for parent in index.skeletons:
        for j in index.children(parent).tolist():
            if j in done:
                continue
            size = int(index.pos[index.close[j]] - index.pos[j])
            if size < _SMALL or not _compact_valid(index, j):
                index.value(j)


def _compact_valid(index: Index, i: int) -> bool:
    """Whether value i (no whitespace outside strings) is valid JSON, strings being checked.

    Strings (contents already checked by `Index`: escapes, control bytes) are cut down to one
    `"`; on that copy the structural bytes are found, and each pair of neighbours (with or
    without a scalar between them) must be allowed; a string is a key exactly where it is
    followed by `:` (after `{`, or after a comma inside an object); a comma inside an object
    is followed by a key; scalars are `true`, `false`, `null` or JSON numbers.
    """
    lo, hi = int(index.pos[i]), int(index.pos[index.close[i]]) + 1
    c = index.raw[lo:hi]
    q0, q1 = np.searchsorted(index.quotes, (lo, hi))
    opens, closes = index.quotes[q0:q1:2] - lo, index.quotes[q0 + 1 : q1 : 2] - lo
    flat_strings = len(opens) and index.close[i] == i + 1 and c[0] == ord("[")  # ["a","b"]?
    if (
        flat_strings
        and opens[0] == 1
        and closes[-1] == len(c) - 2
        and np.all(opens[1:] - closes[:-1] == 2)
    ):
        return bool((c[closes[:-1] + 1] == ord(",")).all())
    if len(opens):  # keep each opening quote, drop the rest of the string
        keep = np.empty(2 * len(opens) + 1, dtype=np.int64)
        keep[0::2] = np.append(opens, len(c) - 1) - np.insert(closes, 0, -1)
        keep[1::2] = closes - opens
        flags = np.zeros(len(keep), dtype=bool)
        flags[0::2] = True
        c = c[np.repeat(flags, keep)]
    text = c.tobytes()
    cls = np.frombuffer(text.translate(_RTABLE), dtype=np.uint8)
    tok = np.flatnonzero(cls != _V)  # structural bytes (and X); the first and last: brackets
    kinds = cls[tok]
    scalar = np.diff(tok) > 1  # a scalar between two structural neighbours
    pair = kinds[:-1] * 9 + kinds[1:]
    if not np.where(scalar, _THROUGH_SCALAR[pair], _PAIRS[pair]).all():
        return False  # also: any X byte (nothing may follow or precede it)
    strings = np.flatnonzero(kinds == _STR)  # neighbours are structural (pairs checked)
    before, key = kinds[strings - 1], kinds[strings + 1] == _COLON
    if np.any(key & ((before == _COLON) | (before == _ARR))) or np.any(~key & (before == _OBJ)):
        return False
    commas = np.flatnonzero(kinds == _COMMA)
    depth = np.cumsum(_DEPTH_STEP[kinds], dtype=np.int16)  # open containers after each
    openers = np.flatnonzero((kinds == _OBJ) | (kinds == _ARR))
    by_depth = np.zeros(int(depth.max()) + 1, dtype=np.uint8)
    by_depth[depth[openers]] = kinds[openers]
    if np.all(by_depth[depth[openers]] == kinds[openers]):  # one kind per depth (vLLM's)
        in_object = by_depth[depth[commas]] == _OBJ
    else:  # the container open after the last bracket before each comma, from the tree
        ordinal = np.cumsum((kinds >= _OBJ) & (kinds <= _ARR_END)) - 1
        in_object = _container_kinds(index, i)[ordinal[commas]] == _OBJ
    follows = np.minimum(commas + 2, len(kinds) - 1)
    claims_object = ~scalar[commas] & (kinds[commas + 1] == _STR) & (kinds[follows] == _COLON)
    if np.any(in_object != claims_object):
        return False
    if not scalar.any():
        return True
    n = np.frombuffer(text.translate(_NTABLE), dtype=np.uint8)
    if not np.any(n == _WORD):  # numbers only (vLLM's): pairs, leading zeros, one . and e
        code = (n[:-1] * 8 + n[1:]).tobytes()
        if code.translate(None, _NPAIRS_OK):  # (bytes.translate: faster than numpy here)
            return False  # a pair of bytes no number holds
        zero = np.flatnonzero(np.frombuffer(code.translate(_ZERO_FIRST), dtype=np.bool_))
        zero = zero[(n[zero] == _B) | (n[zero - 1] == _B)]  # `0` or `-0` first in a number
        if np.any((n[zero + 2] == _D0) | (n[zero + 2] == _D19)):
            return False  # a leading zero
        marks = np.flatnonzero(np.frombuffer(text.translate(_DOT_OR_EXP), dtype=np.bool_))
        number = np.searchsorted(tok, marks)  # same number: no structural byte between
        same = number[1:] == number[:-1]
        later = (n[marks[1:]] == _DOT) | (n[marks[:-1]] == _EXP)
        return not np.any(same & later)  # . . / e . / e e in one number
    starts, ends = tok[:-1][scalar] + 1, tok[1:][scalar]
    special = np.flatnonzero(np.frombuffer(text.translate(_SPECIAL), dtype=np.bool_))
    first = c[starts]
    word = (first == ord("t")) | (first == ord("f")) | (first == ord("n"))
    if word.any():
        for literal in (b"true", b"false", b"null"):
            at = starts[first == literal[0]]
            if np.any(ends[first == literal[0]] - at != len(literal)):
                return False
            got = c[at[:, None] + np.arange(len(literal))]
            if not (got == np.frombuffer(literal, dtype=np.uint8)).all():
                return False
        special = special[~word[np.searchsorted(starts, special, side="right") - 1]]
        starts, ends = starts[~word], ends[~word]
    if len(special) and _LITERAL_LETTER[c[special]].any():
        return False  # a letter inside a number
    return not len(starts) or spans_are_numbers(c, starts, ends, special)


def _container_kinds(index: Index, i: int) -> np.ndarray:
    """For each bracket of value i: the class of the container open right after it."""
    lo, hi = i, int(index.close[i]) + 1
    is_open, level = index.is_open[lo:hi], index.level[lo:hi].astype(np.int64)
    opens = np.flatnonzero(is_open)
    order = np.argsort(level[opens], kind="stable")  # by level, then position
    keys = (level[opens] * (hi - lo) + opens)[order]
    up = np.searchsorted(keys, (level[opens] - 1) * (hi - lo) + opens) - 1
    parent = np.where(up >= 0, opens[order[np.maximum(up, 0)]], -1)
    own = np.where(index.byte[lo:hi][opens] == ord("{"), _OBJ, _ARR).astype(np.uint8)
    parent_kind = np.where(parent >= 0, own[np.searchsorted(opens, np.maximum(parent, 0))], _X)
    parent_kind[0] = _X  # value i itself: nothing of it is open after it closes
    kind = np.empty(hi - lo, dtype=np.uint8)
    kind[opens] = own
    closers = (index.close[lo:hi][opens] - lo).astype(np.int64)
    kind[closers] = parent_kind
    return kind
