"""A compiled decoder that parses without the GIL: C++ over the system simdjson.

`impl/decode/_simdjson_nogil.cpp` with its parts `_simdjson_nogil_numbers.h`, `_walk.h` and
`_body.h` (built by `setup.py` with the project's install, against Debian's `libsimdjson-dev`)
releases the GIL, runs simdjson's SIMD stage 1 over the body (UTF-8 validation, unescaped
control characters, and an index of every structural byte, in a reused per-thread buffer),
checks every backslash escape of the body in one memchr-driven sweep, then walks the index
once: it checks the JSON grammar of every value it skips (as Python's json would accept it,
MAX_DEPTH and MAX_INT_DIGITS included) and parses only what the Completion keeps into
int32/float32 buffers: `token_ids`, `token_logprobs` and, when the first choice has them,
prompt logprobs and top-k rows. It takes the GIL back only to copy those buffers into
bytearrays that numpy wraps. No DOM tape and no Python object per value, so peak memory stays
near the body's size (the index is ~4 bytes per structural byte), and a second Python thread
keeps running while a 20 MB body decodes (`releases_gil = True`).

Where the time goes (262144-token body, ~3.9 M structural bytes): stage 1 about a quarter;
the walk the rest, mostly numbers never kept (`text_offset`, `top_logprobs`). So the walk does
no per-byte loop where it can help it: a number's end is known from the index, its grammar is
checked from a 32-byte digit mask, a short integer in one word; strings cost one look at their
closing quote; kept logprobs are read eight or sixteen digits at a time and rounded by
Eisel-Lemire; skipped values go through one loop with an explicit stack, arrays of scalars
through a tighter one.

Exactness: logprobs are rounded correctly to a double (Eisel-Lemire with simdjson's table; its
own parser where that cannot decide), then `(float)`, the same double-then-float32 rounding as
the reference's numpy `astype`. The walk answers "not sure" for anything outside the common
shape (a duplicated or escaped key where it reads keys, an integer beyond 18 digits or a
logprob beyond 19 significant digits where it reads one, a wrong type, a length mismatch, lone
surrogates, invalid UTF-8, a logprob that over/underflows); those
bodies go to the reference, which decodes them or raises the right `DecodeError`. A UTF-8
BOM, a non-int `topk_prompt_logprobs` and `prompt_tokens` that are not plain integers go there
too.

The plain CPython C API binds it: one function (and `number`, for tests), no build dependency
beyond setuptools and the system simdjson, and the GIL release is one explicit
`Py_BEGIN_ALLOW_THREADS` pair around code that touches no Python object. (simdjson's DOM parser
with a reused parser was as fast here as the first version of this walk but kept a tape of ~2.5x
the body size; its On-Demand API skips values without validating them.)
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np

from impl.decode import MAX_DEPTH, MAX_INT_DIGITS, Completion, Sequence, TopK
from impl.decode import _simdjson_nogil as _ext
from impl.decode._common import as_bytes, reference

if getattr(_ext, "API_VERSION", None) != 3:  # a build left over from an older source
    raise ImportError("impl.decode._simdjson_nogil is a stale build: reinstall hotpath")

_BOM = b"\xef\xbb\xbf"
_MAX_K = 1 << 16  # a larger top-k is left to the reference (it allocates n x k either way)
_NOT_PLAIN = object()


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


class SimdjsonNogilDecoder:
    releases_gil = True

    def decode(
        self, body: bytes, *, prompt_tokens: Seq[int] | None = None, topk_prompt_logprobs: int = 0
    ) -> Completion:
        body = as_bytes(body)
        k = topk_prompt_logprobs
        tokens = _prompt_buffer(prompt_tokens)
        got = None
        if tokens is not _NOT_PLAIN and type(k) is int and k <= _MAX_K and body[:3] != _BOM:
            got = _ext.decode(body, tokens, max(k, 0), MAX_DEPTH, MAX_INT_DIGITS)
        if got is None:
            return reference(body, prompt_tokens, k)
        raw_sequences, prompt, top_ids, top_lps = got
        sequences = [
            Sequence(
                np.frombuffer(ids, dtype=np.int32),
                np.frombuffer(lps, dtype=np.float32),
                "stop" if stop else "length",
            )
            for ids, lps, stop in raw_sequences
        ]
        if prompt is None:
            return Completion(sequences)
        prompt_logprobs = np.frombuffer(prompt, dtype=np.float32)
        topk = None
        if k > 0:
            shape = (len(prompt_logprobs), k)
            topk = TopK(
                np.frombuffer(top_ids, dtype=np.int32).reshape(shape),
                np.frombuffer(top_lps, dtype=np.float32).reshape(shape),
            )
        return Completion(sequences, prompt_logprobs, topk)


def create() -> SimdjsonNogilDecoder:
    return SimdjsonNogilDecoder()
