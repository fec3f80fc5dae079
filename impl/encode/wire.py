"""Wire encoder: SampleResponse bytes written directly — tags, varint lengths, raw buffers.

Technique: every length is known up front (`nbytes` of each array), so the message is one
list of small header byte strings and the arrays themselves, joined by `bytes.join` through
the buffer protocol: each int32/float32 buffer is copied exactly once, into the result, and
no per-token Python object exists. Nothing is imported beyond numpy.

It writes exactly what protobuf's serializer writes (the `protobuf` reference; parity tests
compare the bytes): fields in field-number order, proto3 defaults left out (stop_reason STOP =
0, empty `tokens`, empty top-k matrices, k/length 0), explicit-presence fields written when
set even if empty (`logprobs` always, `prompt_logprobs` and `topk_prompt_logprobs` when the
Completion has them). See `impl.encode.protobuf` for what the SDK makes of each case.
Caveat: little-endian output relies on `_common.check` converting to '<i4'/'<f4' (a no-op on
x86/ARM for the decoders' arrays).
"""

from __future__ import annotations

from impl.decode import Completion
from impl.encode._common import check, varint

# Tags: (field number << 3) | wire type; 2 = length-delimited, 0 = varint.
_RESPONSE_SEQUENCE = b"\x0a"
_RESPONSE_PROMPT_LOGPROBS = b"\x12"
_RESPONSE_TOPK = b"\x1a"
_SEQ_STOP_LENGTH = b"\x08\x01"  # stop_reason = LENGTH (STOP = 0 is not written)
_SEQ_TOKENS = b"\x12"
_SEQ_LOGPROBS = b"\x1a"
#: A whole empty sequence by stop code: only the present, empty `logprobs` field (+ LENGTH).
_EMPTY_SEQUENCE = (b"\x0a\x02\x1a\x00", b"\x0a\x04\x08\x01\x1a\x00")
_TOPK_TOKEN_IDS = b"\x0a"
_TOPK_LOGPROBS = b"\x12"
_TOPK_K = b"\x18"
_TOPK_LENGTH = b"\x20"


def _bytes_field(parts: list, tag: bytes, buffer, size: int) -> int:
    """Append tag, length and buffer; return how many bytes that adds."""
    length = varint(size)
    parts += (tag, length, buffer)
    return len(tag) + len(length) + size


class WireEncoder:
    """`encode(completion) -> bytes`, one copy of each buffer."""

    def encode(self, completion: Completion) -> bytes:
        checked = check(completion)
        parts: list = []
        for code, tokens, logprobs in checked.sequences:
            nbytes = tokens.nbytes  # == logprobs.nbytes: same length, 4 bytes each
            if not nbytes:  # empty `tokens` is not written; the (present) empty logprobs is
                parts.append(_EMPTY_SEQUENCE[code])
                continue
            length = varint(nbytes)
            field = 1 + len(length) + nbytes
            if code:
                parts += (_RESPONSE_SEQUENCE, varint(2 * field + 2), _SEQ_STOP_LENGTH)
            else:
                parts += (_RESPONSE_SEQUENCE, varint(2 * field))
            parts += (_SEQ_TOKENS, length, tokens, _SEQ_LOGPROBS, length, logprobs)
        if checked.prompt_logprobs is not None:
            prompt = checked.prompt_logprobs
            _bytes_field(parts, _RESPONSE_PROMPT_LOGPROBS, prompt, prompt.nbytes)
        if checked.topk is not None:
            token_ids, logprobs = checked.topk
            length, k = token_ids.shape
            body = []
            size = 0
            if token_ids.nbytes:
                size += _bytes_field(body, _TOPK_TOKEN_IDS, token_ids, token_ids.nbytes)
                size += _bytes_field(body, _TOPK_LOGPROBS, logprobs, logprobs.nbytes)
            for tag, value in ((_TOPK_K, k), (_TOPK_LENGTH, length)):
                if value:
                    encoded = varint(value)
                    body += (tag, encoded)
                    size += 1 + len(encoded)
            parts += (_RESPONSE_TOPK, varint(size))
            parts += body
        return b"".join(parts)


def create() -> WireEncoder:
    return WireEncoder()
