"""A differential fuzzer for the compiled decoders: `make fuzz SECONDS=N`, or
`python -m impl.decode.fuzz --help`.

Seeded mutations (`mutate.py`) of realistic bodies of every kind and rendering; every compiled
decoder (`COMPILED`; `--decoders` for others) against the reference on each: the same arrays
bit for bit (`impl.decode.parity`), or both `DecodeError`. Anything else is a disagreement: a
different answer, an answer where the reference raises (or the other way round), another
exception, or a process that died (a crash, or a sanitizer's report under `make sanitize`).
Every disagreement is shrunk (`minimize`) and kept as a regression case in
`tests/fixtures/decode-regressions/` (`save`), which `tests/decode/test_regressions.py` runs
through every decoder.

Why a seeded mutation driver, not atheris or libFuzzer: the oracle is the reference, Python's
json, in the same process, and the bugs these walks have had sit where a mutation that knows
the body's shape aims directly (an element ending on a 64-byte block's edge, a number just
outside the form the bulk checks take), which coverage feedback finds only by chance: the bulk
checks are branch-free masks, so a malformed element at a block edge takes the same branches as
a valid one. libFuzzer needs clang (not on these machines, and CI would have to install it)
and a C++ harness without the Python reference; atheris guides by Python's coverage, and by the
C++'s only when it is built with clang's `-fsanitize=fuzzer-no-link`. Every batch of cases is
drawn from its own seed, so a run is replayed exactly from its `--seed`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from impl.decode import Completion, DecodeError, Decoder, parity

#: The decoders the fuzzer checks unless told otherwise: the compiled ones.
COMPILED = ("simdjson_nogil", "onepass_nogil", "onepass_nogil_avx2")
#: Where disagreements are kept (tests/decode/test_regressions.py runs them).
REGRESSIONS = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "decode-regressions"


@dataclass(frozen=True)
class Case:
    """A body, the top-k argument it is decoded with, and how the fuzzer made it."""

    body: bytes
    k: int = 0
    how: str = ""


def outcome(decoder: Decoder, case: Case) -> Completion | BaseException | None:
    """What `decoder` makes of the case: a Completion, or the exception it raised; for a
    compiled decoder, its fast path's own answer, None where it hands the body to the
    reference (the decoder then returns the reference's answer: nothing to compare)."""
    try:
        fast_path = getattr(decoder, "fast_path", None)
        if fast_path is not None:
            return fast_path(case.body, None, case.k)
        return decoder.decode(case.body, topk_prompt_logprobs=case.k)
    except Exception as exc:
        return exc


def compare(
    case: Case, reference: Decoder, decoders: Mapping[str, Decoder]
) -> tuple[bool, str | None]:
    """Whether any decoder answered `case` itself (rather than handing it to the reference),
    and the first one that does not answer it as the reference does, and how (None when every
    one does). The reference runs only when one answered: a body every fast path hands over
    is the reference's to decide, so nothing can differ."""
    got = {name: outcome(decoder, case) for name, decoder in decoders.items()}
    answered = {name: value for name, value in got.items() if value is not None}
    if not answered:
        return False, None
    try:
        want: Completion | BaseException = reference.decode(case.body, topk_prompt_logprobs=case.k)
    except Exception as exc:
        want = exc
    if not isinstance(want, Completion | DecodeError):
        return True, f"the reference raised {type(want).__name__}: {want}"
    for name, value in answered.items():
        if isinstance(want, DecodeError):
            if not isinstance(value, DecodeError):
                answer = "an answer" if isinstance(value, Completion) else type(value).__name__
                return True, f"{name}: {answer} where the reference raises DecodeError ({want})"
        elif not isinstance(value, Completion):
            return True, f"{name}: {type(value).__name__} ({value}) where the reference answers"
        elif (found := parity.difference(value, want)) is not None:
            return True, f"{name}: {found}"
    return True, None


def disagreement(case: Case, reference: Decoder, decoders: Mapping[str, Decoder]) -> str | None:
    """How the first decoder that does not answer `case` as the reference does differs, or
    None when every one does."""
    return compare(case, reference, decoders)[1]


def minimize(case: Case, fails: Callable[[Case], bool], seconds: float = 5.0) -> Case:
    """A smaller case that still `fails`: chunks of the body dropped, halves first, then
    smaller ones down to single bytes, while time lasts."""
    deadline = time.monotonic() + seconds
    body = case.body
    chunk = max(len(body) // 2, 1)
    while chunk >= 1 and time.monotonic() < deadline:
        at, dropped = 0, False
        while at < len(body) and time.monotonic() < deadline:
            shorter = body[:at] + body[at + chunk :]
            if fails(replace(case, body=shorter)):
                body, dropped = shorter, True
            else:
                at += chunk
        if not dropped:
            chunk //= 2
    return replace(case, body=body)


def save(case: Case, what: str, directory: Path = REGRESSIONS) -> Path:
    """Keep `case` as a regression case: one file, a JSON header line (the decode arguments,
    what disagreed, how it was made), then the body's bytes as they were."""
    digest = hashlib.sha256(case.body + b"k%d" % case.k).hexdigest()[:16]
    path = directory / f"{digest}.case"
    header = {"topk_prompt_logprobs": case.k, "found": what, "how": case.how}
    directory.mkdir(parents=True, exist_ok=True)
    path.write_bytes(json.dumps(header, ensure_ascii=True).encode() + b"\n" + case.body)
    return path


def load(path: Path) -> tuple[Case, dict]:
    """A regression case and its header."""
    header, _, body = path.read_bytes().partition(b"\n")
    meta = json.loads(header)
    return Case(body, int(meta.get("topk_prompt_logprobs", 0)), meta.get("how", "")), meta


def regressions(directory: Path = REGRESSIONS) -> list[Path]:
    """Every kept regression case, sorted."""
    return sorted(directory.glob("*.case"))
