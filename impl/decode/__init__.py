"""Decode family: a vLLM `/v1/completions` body (bytes) into numpy buffers.

Contract: `registry.create("decode", name).decode(body, *, prompt_tokens=None,
topk_prompt_logprobs=0) -> Completion`. The reference (`json`) defines the semantics (see
docs/families.md, decode); every other decoder returns exactly the same arrays or raises
`DecodeError`, and no other exception escapes.
"""

from __future__ import annotations

from collections.abc import Sequence as _Seq
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from impl._table import Entry

StopReason = Literal["stop", "length"]

#: Deepest nesting of arrays and objects a body may have; the top-level object is depth 1.
#: vLLM bodies nest 6 deep. Every decoder rejects a deeper body with the same `DecodeError`,
#: whatever the interpreter's call stack would allow.
MAX_DEPTH = 64

#: Most digits an integer literal may have anywhere in a body (CPython's default
#: `sys.int_max_str_digits`, the reference's limit); every decoder rejects longer ones.
MAX_INT_DIGITS = 4300

#: Padding of a top-k prompt-logprob row past its last entry, and of a null position.
TOPK_PAD_TOKEN = 0
TOPK_PAD_LOGPROB = -99999.0


class DecodeError(ValueError):
    """The body is not a vLLM completion body of the expected shape."""


def decode_error(what: str, body: bytes | memoryview | str) -> DecodeError:
    """A `DecodeError` that says what was wrong and quotes at most 200 bytes of the body."""
    raw = body.encode("utf-8", "replace") if isinstance(body, str) else bytes(body[:201])
    quoted = raw[:200].decode("utf-8", "replace")
    more = "…" if len(raw) > 200 else ""
    return DecodeError(f"{what}; body starts {quoted!r}{more}")


@dataclass(frozen=True, eq=False)
class TopK:
    """Top-k prompt logprobs: row i holds ranks 1..k of prompt position i."""

    token_ids: np.ndarray  # int32 [n, k]
    logprobs: np.ndarray  # float32 [n, k]


@dataclass(frozen=True, eq=False)
class Sequence:
    """One generated sequence (one element of `choices`)."""

    tokens: np.ndarray  # int32, 1-D
    logprobs: np.ndarray  # float32, same length
    stop_reason: StopReason


@dataclass(frozen=True, eq=False)
class Completion:
    """A decoded completion body: what the server turns into one SampleResponse."""

    sequences: list[Sequence]
    prompt_logprobs: np.ndarray | None = None  # float32, NaN where undefined
    topk_prompt_logprobs: TopK | None = None


class Decoder(Protocol):
    """What every decoder is. A decoder whose parse runs without the GIL also sets a class
    attribute `releases_gil = True` (read it with `releases_gil(decoder)`)."""

    def decode(
        self,
        body: bytes,
        *,
        prompt_tokens: _Seq[int] | None = None,
        topk_prompt_logprobs: int = 0,
    ) -> Completion: ...


def releases_gil(decoder: object) -> bool:
    """True when `decoder` parses without holding the GIL, so threads can run it off the loop."""
    return bool(getattr(decoder, "releases_gil", False))


REFERENCE = "json"

#: what a compiled decoder needs when its extension did not build or import
_EXTENSION_HINT = (
    "a C++ compiler (Debian/Ubuntu: apt-get install g++), then reinstall hotpath "
    "(make install, or pip install -e .)"
)

IMPLEMENTATIONS: tuple[Entry, ...] = (
    Entry("json", "impl.decode.json", "stdlib json + numpy; the reference, written for clarity"),
    Entry("orjson", "impl.decode.orjson", "orjson.loads + numpy", ("orjson",), "fast"),
    Entry("ujson", "impl.decode.ujson", "ujson.loads + numpy", ("ujson",), "fast"),
    Entry(
        "msgspec",
        "impl.decode.msgspec",
        "typed msgspec.Struct decoding of only the needed fields",
        ("msgspec",),
        "fast",
    ),
    Entry(
        "fromstring",
        "impl.decode.fromstring",
        "numeric arrays located in the raw bytes and parsed by numpy; full-parse fallback",
    ),
    Entry(
        "simdjson",
        "impl.decode.simdjson",
        "pysimdjson; numeric arrays taken as buffers",
        ("simdjson",),
        "fast",
    ),
    Entry(
        "simdjson_nogil",
        "impl.decode.simdjson_nogil",
        "C++ over simdjson's stage 1 (built in), parses without the GIL; numpy buffers filled",
        ("impl.decode.simdjson_nogil",),  # imports the extension and checks its build
        hint=_EXTENSION_HINT,
    ),
    Entry(
        "onepass_nogil",
        "impl.decode.onepass_nogil",
        "C++ in one pass over the bytes (no index), parses without the GIL; numpy buffers filled",
        ("impl.decode.onepass_nogil",),  # imports the extension and checks its build
        hint=_EXTENSION_HINT,
    ),
    Entry(
        "onepass_nogil_avx2",
        "impl.decode.onepass_nogil_avx2",
        "onepass_nogil compiled for AVX2 (x86-64-v3 + PCLMUL), imported only where the CPU has it",
        ("impl.decode.onepass_nogil_avx2",),  # checks the CPU, then imports the extension
        hint="a C++ compiler (Debian/Ubuntu: apt-get install g++, then make install), on an x86-64 "
        "CPU with AVX2, BMI2, LZCNT and PCLMUL; onepass_nogil runs without them",
    ),
    Entry("auto", "impl.decode.auto", "per body class and size, the decoder measured fastest here"),
)

#: Fixed preference order when nothing was measured on this machine (fastest first).
PREFERENCE = (
    "onepass_nogil_avx2",
    "onepass_nogil",
    "simdjson_nogil",
    "simdjson",
    "fromstring",
    "msgspec",
    "orjson",
    "ujson",
    "json",
)
