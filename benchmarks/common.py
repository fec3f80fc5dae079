"""Seeded, cached inputs for the asv suites, generated outside the timed code.

Bodies come from `impl.workloads.synthetic.body_for` and `impl.workloads.realtext.body_for`
(seed 0, a 16-token prompt, one choice), the same generators the fake router and the tests use.
Append-only: add sizes or kinds, never change what an existing (tokens, kind) produces, so
results stay comparable across commits. A real-text body is kept on disk between asv's
processes (`kind_body`), so only the first one pays for the tokenizer.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

from impl import measure
from impl.workloads import realtext
from impl.workloads.synthetic import body_for

#: Generated tokens per body (`impl.measure.TOKENS`), and body kinds (docs/vllm-body.md).
TOKENS = list(measure.TOKENS)
BODIES = ["minimal", "vllm"]
#: The body kinds of `impl.workloads.realtext` and their renderings (the DecodeKind params).
KINDS = list(realtext.KINDS)
RENDERS = list(realtext.RENDERS)
#: where real-text bodies are kept between processes
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "hotpath", "bodies")


def decode_body(tokens: int, kind: str) -> bytes:
    """One seeded vLLM /v1/completions body (cached per process)."""
    return body_for(tokens, kind=kind)


def _generator_digest() -> str:
    """The generator's sources, its corpus and the Python version (the stdlib is a source)."""
    here = Path(realtext.__file__).parent
    digest = hashlib.sha256(sys.version.encode())
    for path in sorted([*here.glob("*.py"), *here.glob("corpus/*")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def kind_body(kind: str, render: str, tokens: int = measure.LARGEST_TOKENS) -> bytes:
    """The body of `kind` in `render` (NotImplementedError with the hint where it cannot be
    made), generated once and then read from CACHE."""
    reason = realtext.unavailable_reason(kind, render)
    if reason is not None:
        raise NotImplementedError(reason)
    path = CACHE / f"{kind}-{render}-{tokens}-{_generator_digest()}.json"
    try:
        return path.read_bytes()
    except OSError:
        pass
    body = realtext.body_for(tokens, kind=kind, render_as=render)
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=CACHE, delete=False) as out:  # atomic for concurrent runs
        out.write(body)
    os.replace(out.name, path)
    return body
