"""The reference's check of vLLM's packed candidates (`logprobs.packed_top_logprobs`).

The Completion keeps no candidates, so a decoder reads nothing from the block; it still checks
it, so that a packed body that is not what vLLM writes is a `DecodeError` in every decoder
(docs/families.md, decode). A block that is present and not null must be an object with:

- `shape`: a list of two integers [tokens, k], tokens equal to the choice's token ids, k >= 1;
- `token_ids_dtype` exactly "<i4" and `logprobs_dtype` exactly "<f4";
- `token_ids_b64` and `logprobs_b64`: strings of standard base64 (A-Z a-z 0-9 + /, length a
  multiple of 4, at most two `=` only at the end) of exactly tokens * k * 4 bytes each.

Other members are ignored; the arrays' values are not read (any int32 and float32 bits). The
compiled decoders check the same in C++ (`_native/common/packed.h`) and hand anything they
doubt (an escaped string, an integer beyond int64) to the reference.
"""

from __future__ import annotations

from typing import Any

from impl.decode import decode_error

BLOCK = "packed_top_logprobs"
_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_DTYPES = (("token_ids_dtype", "<i4"), ("logprobs_dtype", "<f4"))


def base64_bytes(text: Any) -> int | None:
    """How many bytes `text` (standard padded base64) holds, or None if it is not that."""
    if type(text) is not str or len(text) % 4 or not text.isascii():
        return None
    raw = text.encode("ascii")
    pad = len(raw) - len(raw.rstrip(b"="))
    if pad > 2 or raw[: len(raw) - pad].translate(None, _ALPHABET):
        return None
    return len(raw) // 4 * 3 - pad


def check(block: Any, n_tokens: int, body: bytes | memoryview) -> None:
    """DecodeError unless a choice's packed block (None: absent or null) is as the module
    docstring says."""
    if block is None:
        return
    if type(block) is not dict:
        raise decode_error(f"'{BLOCK}' is not an object", body)
    shape = block.get("shape")
    if type(shape) is not list or len(shape) != 2 or {type(x) for x in shape} != {int}:
        raise decode_error(f"'{BLOCK}' has no [tokens, k] integer shape", body)
    tokens, k = shape
    if tokens != n_tokens or k < 1:
        raise decode_error(f"'{BLOCK}' shape {shape} for {n_tokens} tokens", body)
    for name, dtype in _DTYPES:
        if block.get(name) != dtype:
            raise decode_error(f"'{BLOCK}' {name} is not {dtype!r}", body)
    for name in ("token_ids_b64", "logprobs_b64"):
        size = base64_bytes(block.get(name))
        if size is None:
            raise decode_error(f"'{BLOCK}' {name} is not base64", body)
        if size != tokens * k * 4:
            raise decode_error(f"'{BLOCK}' {name} holds {size} bytes for shape {shape}", body)
