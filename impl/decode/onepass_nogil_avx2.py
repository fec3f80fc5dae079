"""`onepass_nogil` built for AVX2: the same C++ source, compiled for x86-64-v3 with PCLMUL.

`impl/decode/_native/onepass_nogil/module_avx2.cpp` is its `module.cpp` compiled with
`-march=x86-64-v3 -mpclmul` (setup.py): the same walk, the same checks, the same answers (the
tests hold both to the reference), but each 64-byte block of the bulk checks is two 32-byte
AVX2 vectors instead of four SSE2 ones, each prefix XOR (which bytes are inside strings, inside
objects) one carry-less multiply instead of six shift-and-XORs, and bit scans single
instructions (LZCNT, TZCNT). That matters because the bulk checks (`top_logprobs` objects,
`token_logprobs`, `text_offset`, `token_ids`, `tokens`) cover most of a long body.

A module compiled for AVX2 may use it anywhere, even while it loads, so this wrapper imports
it only when the baseline build (`_onepass_nogil`) reports that the CPU has every instruction
set it was compiled for; elsewhere the decoder is unavailable with that reason and
`onepass_nogil` is the one to run.
"""

from __future__ import annotations

from impl.decode import _onepass_nogil
from impl.decode._nogil import CompiledDecoder, check_build

if not getattr(_onepass_nogil, "CPU_AVX2", False):
    raise ImportError("this CPU lacks AVX2, BMI1/2, LZCNT or PCLMUL: run onepass_nogil instead")

# imported only once the CPU is known to run it
from impl.decode import _onepass_nogil_avx2

_EXTENSION = check_build(_onepass_nogil_avx2)


def create() -> CompiledDecoder:
    return CompiledDecoder(_EXTENSION)
