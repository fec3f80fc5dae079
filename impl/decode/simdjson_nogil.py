"""A compiled decoder that parses without the GIL: C++ over simdjson's stage 1.

`impl/decode/_native/simdjson_nogil/` (`module.cpp`, its walk `walk.h`) with the parts it
shares with `onepass_nogil` (`_native/common/`; built by `setup.py` with the project's install,
with simdjson's own sources from the pysimdjson package compiled in: docs/native.md)
releases the GIL, runs simdjson's SIMD stage 1 over the body (UTF-8 validation, unescaped
control characters, and an index of every structural byte, in a reused per-thread buffer),
checks every backslash escape of the body in one memchr-driven sweep, then walks the index
once: it checks the JSON grammar of every value it skips (as Python's json would accept it,
MAX_DEPTH and MAX_INT_DIGITS included) and parses only what the Completion keeps into
int32/float32 buffers: `token_ids`, `token_logprobs` and, when the first choice has them,
prompt logprobs and top-k rows. It takes the GIL back only to copy those buffers into
pooled output buffers that numpy wraps (docs/decode.md). No DOM tape and no Python object
per value, so peak memory stays near the body's size (the index is 4 bytes per structural
byte), and a second Python thread keeps running while a 20 MB body decodes (`releases_gil = True`).

Where the time goes (262144-token body): stage 1, the escape sweep, and the walk, the most of
it, mostly on numbers never kept (`text_offset`, `top_logprobs`); `onepass_nogil` does without
the index and the sweep. So the walk does no per-byte loop where it can help it: a number's end is
known from the index, its grammar is checked from a 32-byte digit mask, a short integer in one word;
strings cost one look at their closing quote; kept logprobs are read eight or sixteen digits at a
time and rounded by Eisel-Lemire; skipped values go through one loop with an explicit stack, arrays
of scalars through a tighter one.

Exactness: logprobs are rounded correctly to a double (Eisel-Lemire; the C library's strtod
where that cannot decide), then `(float)`, the same double-then-float32 rounding as
the reference's numpy `astype`. The walk answers "not sure" for anything outside the common
shape (a duplicated or escaped key where it reads keys, an integer beyond 18 digits or a
logprob beyond 19 significant digits where it reads one, a wrong type, a length mismatch, lone
surrogates, invalid UTF-8, a logprob that over/underflows); those
bodies go to the reference, which decodes them or raises the right `DecodeError`. A UTF-8
BOM, a non-int `topk_prompt_logprobs` and `prompt_tokens` that are not plain integers go there
too.

The plain CPython C API binds it (`_nogil.py` on this side): one function (and `number`, for tests),
no build dependency beyond setuptools and simdjson's sources, and the GIL release is one explicit
`Py_BEGIN_ALLOW_THREADS` pair around code that touches no Python object. (simdjson's DOM parser with
a reused parser keeps a tape of a few times the body size; its On-Demand API skips values without
validating them.)
"""

from __future__ import annotations

from impl.decode import _simdjson_nogil
from impl.decode._nogil import CompiledDecoder, check_build

_EXTENSION = check_build(_simdjson_nogil)


def create() -> CompiledDecoder:
    return CompiledDecoder(_EXTENSION)
