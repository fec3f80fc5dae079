"""What the compiled decoders (`simdjson_nogil`, `onepass_nogil`) share on the Python side.

Both extensions have the same two functions (`decode`, `number`; see
`impl/decode/_native/common/module.h`): `CompiledDecoder` checks the arguments the extension cannot
take (a prompt that is not plain integers, a huge top-k, a UTF-8 BOM: the reference decides
those), calls it without the GIL, and wraps the buffers it returns as numpy arrays. A body given as
a `memoryview` of the start of a `bytearray` with a NUL right after the body (a fetch
process's kept receive buffer, `impl.server.offloop.buffers`) is read in place; any other
non-bytes body is copied to bytes first.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from types import ModuleType

import numpy as np

from impl.decode import MAX_DEPTH, MAX_INT_DIGITS, Completion, Sequence, TopK
from impl.decode._common import as_bytes, reference

API_VERSION = 7  # the extensions' API_VERSION this wrapper speaks (_native/common/module.h)

_BOM = b"\xef\xbb\xbf"
# the arrays' dtypes as objects, given by position: np.frombuffer parses a dtype keyword and
# converts a scalar type on every call, a noticeable share of a 128-token body's decode
# (docs/measurements.md, the buffer pool entry)
_INT32 = np.dtype(np.int32)
_FLOAT32 = np.dtype(np.float32)
_frombuffer = np.frombuffer
_MAX_K = 1 << 16  # a larger top-k is left to the reference (it allocates n x k either way)
_NOT_PLAIN = object()


def check_build(extension: ModuleType) -> ModuleType:
    """The extension, or ImportError when it was built from an older source."""
    if getattr(extension, "API_VERSION", None) != API_VERSION:
        raise ImportError(f"{extension.__name__} is a stale build: reinstall hotpath")
    return extension


def _prompt_buffer(prompt_tokens: Seq[int] | None) -> bytes | object | None:
    """The caller's prompt as int64 bytes; `_NOT_PLAIN` when it is not a list of plain ints."""
    if prompt_tokens is None:
        return None
    if isinstance(prompt_tokens, np.ndarray):
        if prompt_tokens.ndim != 1 or prompt_tokens.dtype.kind not in "iu":
            return _NOT_PLAIN
        if prompt_tokens.dtype == np.uint64 and len(prompt_tokens) and prompt_tokens.max() >> 63:
            return _NOT_PLAIN
        return prompt_tokens.astype(np.int64).tobytes()
    values = list(prompt_tokens)
    if values and set(map(type, values)) != {int}:
        return _NOT_PLAIN
    try:
        return np.array(values, dtype=np.int64).tobytes()
    except OverflowError:
        return _NOT_PLAIN


def _address(buffer: memoryview | bytearray) -> int:
    return int(np.frombuffer(buffer, np.uint8).__array_interface__["data"][0])


def in_place(view: memoryview) -> bytearray | None:
    """The bytearray `view` shows the start of, when its byte right after the view is a NUL
    (the compiled walk reads it, as it reads a bytes object's): the body can be read in
    place. None for any other view (it is copied to bytes)."""
    whole = view.obj
    size = view.nbytes
    if type(whole) is not bytearray or not view.c_contiguous or view.itemsize != 1:
        return None
    if size == 0 or len(whole) <= size or whole[size] != 0 or _address(view) != _address(whole):
        return None
    return whole


class CompiledDecoder:
    """A decoder over one of the compiled extensions; it parses without the GIL."""

    releases_gil = True

    def __init__(self, extension: ModuleType) -> None:
        self._decode = extension.decode  # bound once: no module lookup per call

    def decode(
        self, body: bytes, *, prompt_tokens: Seq[int] | None = None, topk_prompt_logprobs: int = 0
    ) -> Completion:
        whole = in_place(body) if type(body) is memoryview else None
        if whole is not None:
            got = self.fast_path(whole, prompt_tokens, topk_prompt_logprobs, len(body))
        else:
            body = as_bytes(body)
            got = self.fast_path(body, prompt_tokens, topk_prompt_logprobs)
        if got is None:
            return reference(as_bytes(body), prompt_tokens, topk_prompt_logprobs)
        return got

    def fast_path(
        self,
        body: bytes | bytearray,
        prompt_tokens: Seq[int] | None,
        k: int,
        length: int = -1,
    ) -> Completion | None:
        """The compiled walk's own answer, or None where it hands the body to the reference
        (whose answer `decode` then returns; the fuzzer checks these answers alone). A
        bytearray `body` is read up to `length` (its byte there a NUL, `in_place`)."""
        tokens = _prompt_buffer(prompt_tokens)
        if tokens is _NOT_PLAIN or type(k) is not int or k > _MAX_K or body[:3] == _BOM:
            return None
        if length >= 0:
            got = self._decode(body, tokens, max(k, 0), MAX_DEPTH, MAX_INT_DIGITS, length)
        else:
            got = self._decode(body, tokens, max(k, 0), MAX_DEPTH, MAX_INT_DIGITS)
        if got is None:
            return None
        raw_sequences, prompt, top_ids, top_lps = got
        sequences = [
            Sequence(
                _frombuffer(ids, _INT32), _frombuffer(lps, _FLOAT32), "stop" if stop else "length"
            )
            for ids, lps, stop in raw_sequences
        ]
        if prompt is None:
            return Completion(sequences)
        prompt_logprobs = _frombuffer(prompt, _FLOAT32)
        topk = None
        if k > 0:
            shape = (len(prompt_logprobs), k)
            topk = TopK(
                _frombuffer(top_ids, _INT32).reshape(shape),
                _frombuffer(top_lps, _FLOAT32).reshape(shape),
            )
        return Completion(sequences, prompt_logprobs, topk)
