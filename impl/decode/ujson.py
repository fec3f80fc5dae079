"""ujson.loads + numpy, guarded: ujson is more lenient than JSON.

ujson builds Python objects like orjson (a little slower here). It accepts things the
reference rejects: NaN / Infinity literals, raw control characters in strings, numbers like
`01`, `1.` or a bare `-`. A vectorised pre-scan sends any body that could hold one of those
to the reference: `NaN` or `Infinity` anywhere, a byte below 0x20 (so pretty-printed bodies
take the slow path), a run of more than MAX_INT_DIGITS digits (ujson follows
`sys.int_max_str_digits`), a number (after `[ , :` or whitespace, optionally signed) starting with
0 and another digit, a digit and a dot not followed by a digit, a minus after `[ , :` or
whitespace not followed by a digit. The scan also fires on string contents (a false alarm
only costs speed), so a lenient parse never gets through. The scan costs ~10 passes over the
body: ujson is here as a comparison point, not a contender.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np
import ujson

from impl.decode import Completion
from impl.decode._common import as_bytes, completion_from_document, reference
from impl.decode._limits import check_depth, may_hold_long_integer

_DIGIT = np.zeros(256, dtype=bool)
_DIGIT[ord("0") : ord("9") + 1] = True
_BEFORE_NUMBER = np.zeros(256, dtype=bool)  # what may precede a number outside strings
_BEFORE_NUMBER[[ord(c) for c in "[,: \t\n\r"]] = True


def _suspect(body: bytes) -> bool:
    """Could ujson read this body differently from the reference? (False alarms allowed.)"""
    raw = np.frombuffer(body, dtype=np.uint8)
    if len(raw) < 3 or raw.min() < 0x20 or b"NaN" in body or b"Infinity" in body:
        return True
    digit = _DIGIT[raw]
    cur, nxt = raw[1:-1], digit[2:]
    starts_number = _BEFORE_NUMBER[raw[:-2]]
    zero_digit = (cur == ord("0")) & nxt
    leading_zero = zero_digit & starts_number
    minus_zero = zero_digit[1:] & (raw[1:-2] == ord("-")) & starts_number[:-1]  # `-01`
    bare_dot = (cur == ord(".")) & digit[:-2] & ~nxt
    lone_minus = (cur == ord("-")) & starts_number & ~nxt
    return bool(leading_zero.any() or minus_zero.any() or bare_dot.any() or lone_minus.any())


class UjsonDecoder:
    def decode(
        self, body: bytes, *, prompt_tokens: Seq[int] | None = None, topk_prompt_logprobs: int = 0
    ) -> Completion:
        body = as_bytes(body)
        if _suspect(body) or may_hold_long_integer(body):
            return reference(body, prompt_tokens, topk_prompt_logprobs)
        try:
            doc = ujson.loads(body)
        except (ValueError, OverflowError, RecursionError):
            return reference(body, prompt_tokens, topk_prompt_logprobs)
        check_depth(body)  # ujson itself stops at 1024 levels, the contract at MAX_DEPTH
        return completion_from_document(doc, body, prompt_tokens, topk_prompt_logprobs)


def create() -> UjsonDecoder:
    return UjsonDecoder()
