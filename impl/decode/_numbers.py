"""Vectorised JSON number-grammar checks, then numpy parsing of a comma-separated run.

`np.fromstring(text, sep=",")` is lenient (it reads `01`, `1.`, `.5`, `+1`, `inf`); these
checks accept exactly JSON's `-?(0|[1-9]\\d*)(\\.\\d+)?([eE][+-]?\\d+)?` elements separated by
single commas (no whitespace), so that what numpy parses is what the reference would accept.
Anything else returns None and the caller parses that array with the stdlib instead.
"""

from __future__ import annotations

import numpy as np

_DIGIT = np.zeros(256, dtype=bool)
_DIGIT[ord("0") : ord("9") + 1] = True
_INT_BYTES = b"0123456789,-"
_FLOAT_BYTES = _INT_BYTES + b"+.eE"
_COMMA, _MINUS, _PLUS, _DOT = ord(","), ord("-"), ord("+"), ord(".")


def _signed_digits(c: np.ndarray, starts: np.ndarray, ends: np.ndarray):
    """Signs and digit starts of nonempty spans; None unless each span is `-?` then a digit,
    with no leading zero, and ends in a digit."""
    neg = c[starts] == _MINUS
    digits = starts + neg
    if np.any(digits >= ends) or not _DIGIT[c[digits]].all() or not _DIGIT[c[ends - 1]].all():
        return None
    zero = (c[digits] == ord("0")) & (digits + 1 < ends)
    if zero.any() and _DIGIT[c[digits[zero] + 1]].any():
        return None  # a leading zero: `01`
    return neg, digits


def _integer_parts(c: np.ndarray, commas: np.ndarray):
    """Element bounds, signs and digit starts; None unless each element starts `-?digit`."""
    starts = np.concatenate(([0], commas + 1))
    ends = np.concatenate((commas, [len(c)]))
    if np.any(starts >= ends):
        return None  # an empty element: `[1,,2]`, `[1,]`
    signed = _signed_digits(c, starts, ends)
    if signed is None:
        return None
    return starts, ends, *signed


def parse_ints(content: bytes) -> np.ndarray | None:
    """Compact JSON integers -> int64, or None when the run is not exactly that."""
    if not content:
        return np.zeros(0, dtype=np.int64)
    if content.translate(None, _INT_BYTES):  # (bytes.translate: faster than a numpy gather)
        return None
    c = np.frombuffer(content, dtype=np.uint8)
    parts = _integer_parts(c, np.flatnonzero(c == _COMMA))
    if parts is None:
        return None
    starts, ends, neg, digits = parts
    if np.count_nonzero(c == _MINUS) != np.count_nonzero(neg) or np.any(ends - digits > 18):
        return None  # a minus inside a number, or too many digits for int64 to be exact
    values = np.fromstring(content, dtype=np.int64, sep=",")
    return values if len(values) == len(starts) else None


def parse_floats(content: bytes) -> np.ndarray | None:
    """Compact JSON numbers -> float64 (correctly rounded), or None when not exactly that."""
    if not content:
        return np.zeros(0, dtype=np.float64)
    if content.translate(None, _FLOAT_BYTES):
        return None
    c = np.frombuffer(content, dtype=np.uint8)
    commas = np.flatnonzero(c == _COMMA)
    parts = _integer_parts(c, commas)
    if parts is None:
        return None
    starts, ends, neg, digits = parts
    dots = np.flatnonzero(c == _DOT)
    exps = np.flatnonzero((c | 0x20) == ord("e"))
    signs = np.flatnonzero((c == _MINUS) | (c == _PLUS))
    # Neighbours (a number never ends in . e or a sign: its last byte is a digit, checked).
    if len(dots) and not (_DIGIT[c[dots - 1]].all() and _DIGIT[c[dots + 1]].all()):
        return None
    if len(exps):
        after = c[exps + 1]
        if not (
            _DIGIT[c[exps - 1]].all()
            and (_DIGIT[after] | (after == _MINUS) | (after == _PLUS)).all()
        ):
            return None
    if len(signs):
        before = np.where(signs > 0, c[np.maximum(signs - 1, 0)], _COMMA)
        leading = (c[signs] == _MINUS) & (before == _COMMA)
        if not (((before | 0x20) == ord("e")) | leading).all() or not _DIGIT[c[signs + 1]].all():
            return None
    # At most one dot and one exponent per element, the dot first.
    dot_elem, exp_elem = np.searchsorted(commas, dots), np.searchsorted(commas, exps)
    if np.any(np.diff(dot_elem) == 0) or np.any(np.diff(exp_elem) == 0):
        return None
    if len(dots) and len(exps):
        exp_at = np.full(len(starts), len(c))
        exp_at[exp_elem] = exps
        if np.any(dots > exp_at[dot_elem]):
            return None
    values = np.fromstring(content, dtype=np.float64, sep=",")
    if len(values) != len(starts):
        return None
    # The integer literal `-0` is the int 0 to the reference (0.0), not the float -0.0.
    minus_zero = neg & (c[digits] == ord("0")) & (ends == digits + 1)
    if minus_zero.any():
        values[minus_zero] = 0.0
    return values


def spans_are_numbers(
    c: np.ndarray, starts: np.ndarray, ends: np.ndarray, special: np.ndarray
) -> bool:
    """Whether every span `c[starts[k]:ends[k]]` (nonempty, sorted) is one JSON number.

    The spans may hold only digits and `-+.eE`; `special` are the positions of the non-digits
    in them (sorted). Checks: `-?` then a digit, no leading zero, a digit last; a dot between
    digits; an exponent after a digit, before a digit or sign; a sign first (minus) or after
    the exponent, before a digit; at most one dot and one exponent per span, the dot first.
    """
    if _signed_digits(c, starts, ends) is None:
        return False
    if not len(special):
        return True
    byte = c[special]
    span = np.searchsorted(starts, special, side="right") - 1
    first = starts[span] == special
    prev, after = c[special - 1], c[special + 1]  # a special byte is never last (digit last)
    is_dot, is_exp = byte == _DOT, (byte | 0x20) == ord("e")
    is_sign = ~is_dot & ~is_exp
    ok_dot = is_dot & _DIGIT[prev] & _DIGIT[after] & ~first
    ok_exp = is_exp & _DIGIT[prev] & (_DIGIT[after] | (after == _MINUS) | (after == _PLUS))
    ok_sign = is_sign & _DIGIT[after] & (((byte == _MINUS) & first) | ((prev | 0x20) == ord("e")))
    if not (ok_dot | (ok_exp & ~first) | ok_sign).all():
        return False
    dot_span, exp_span = span[is_dot], span[is_exp]
    if np.any(np.diff(dot_span) == 0) or np.any(np.diff(exp_span) == 0):
        return False  # two dots or two exponents in one number
    if len(dot_span) and len(exp_span):
        exp_at = np.full(len(starts), len(c))
        exp_at[exp_span] = special[is_exp]
        if np.any(special[is_dot] > exp_at[dot_span]):
            return False  # the dot after the exponent
    return True
