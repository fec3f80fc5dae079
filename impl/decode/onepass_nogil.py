"""A compiled decoder that parses without the GIL in one pass over the bytes: no index.

`impl/decode/_native/onepass_nogil/` (`module.cpp`, its walk `walk.h`, bulk checks in `bulk.h`)
with the parts it shares with `simdjson_nogil` (`_native/common/`: the body reader, number
shapes, float reading, escapes, UTF-8, the Python module; built by `setup.py` with the project's
install, from the project's own files alone) releases the GIL and reads the
body once, byte by byte where it must and 16 or 64 bytes at a time where it can: the same
grammar walk as `simdjson_nogil` (every skipped value validated as Python's json would accept
it, MAX_DEPTH and MAX_INT_DIGITS included; only `token_ids`, `token_logprobs` and prompt
logprobs parsed), but with no simdjson stage 1 in front of it. Strings are scanned for their
closing quote 16 bytes a step (escapes and control characters checked on the way, UTF-8 only
in a string with a non-ASCII byte: a short one byte by byte, a long one 16 or 32 bytes a
step); a number ends at the first byte JSON can follow it with, and its grammar is checked
from the same two loads.

Why it is faster than `simdjson_nogil` on long bodies: stage 1 writes a 4-byte index entry for
each of the millions of structural bytes of a 262144-token body, and the walk reads them back;
that pass and the whole-body escape sweep are a large part of the time. Going without them makes
each token's end depend on the token before (a chain the CPU cannot run ahead on), so the long
regular arrays are checked in bulk instead, 64 bytes at a time from byte-class masks: runs of
natural numbers (`text_offset`, `token_ids`) and of plain ASCII strings (`tokens`), each run
ending at its last comma; and, as a stream of 64-byte blocks whose masks carry into the next,
the kept `token_logprobs` and the `top_logprobs` objects (which bytes are in strings is a
prefix XOR of the quotes, which are in objects one of the braces, and the grammar is "what may
follow what" between the masks). Kept logprobs are then read where those masks put them,
without a branch on their digit count. What it cannot vouch for, it hands to the general
token-by-token walk and, where that cannot either, to the reference, exactly where
`simdjson_nogil` does (the same `common/reader.h` reader); the tests hold both to the reference.
No index also means less memory: peak growth is the output buffers (reused per thread), not 4
bytes per token.

This build is plain x86-64 (SSE2: four 16-byte vectors per block); `onepass_nogil_avx2` is the
same source compiled for AVX2, faster where the CPU has it.
"""

from __future__ import annotations

from impl.decode import _onepass_nogil
from impl.decode._nogil import CompiledDecoder, check_build

_EXTENSION = check_build(_onepass_nogil)


def create() -> CompiledDecoder:
    return CompiledDecoder(_EXTENSION)
