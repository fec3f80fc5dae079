"""Seeded, cached inputs for the asv suites, generated outside the timed code.

Bodies come from `impl.harness.bodies.body_for` (seed 0, a 16-token prompt, one choice), the
same generator the fake router and the tests use. Append-only: add sizes or kinds, never change
what an existing (tokens, kind) produces, so results stay comparable across commits.
"""

from __future__ import annotations

from impl import measure
from impl.harness.bodies import body_for

#: Generated tokens per body (`impl.measure.TOKENS`), and body kinds (docs/vllm-body.md).
TOKENS = list(measure.TOKENS)
BODIES = ["minimal", "vllm"]


def decode_body(tokens: int, kind: str) -> bytes:
    """One seeded vLLM /v1/completions body (cached per process)."""
    return body_for(tokens, kind=kind)
