"""Encode family: Completion -> SampleResponse bytes, and stored bytes -> legacy JSON.

Inputs are `impl.encode.samples.sized(tokens)`: one seeded sequence of `tokens` tokens, built
from numpy arrays (no decoder involved). Params are the registry tables, not what is
installed; an implementation that cannot run here raises NotImplementedError in setup (n/a).
Both classes run one round (`rounds = 1`, one process per combination; asv's default is two),
within `make asv`'s per-commit budget (benchmarks/README.md); the gate passes `-a rounds=4` for
the `Encode` combination it times.
"""

import time

from impl import measure, registry
from impl.encode import (
    JSON_IMPLEMENTATIONS,
    json_implementation,
    json_unavailable_reason,
    samples,
)

TOKENS = list(measure.TOKENS)


class Encode:
    """One Completion into SampleResponse wire bytes, per implementation and size.

    Timer: `time.process_time`, the CPU time of this process: an encode is single-threaded and
    CPU-bound, so CPU time is its cost and excludes the time the process waited for a core on
    a loaded machine (which wall time counts, and which differs between asv's rounds).
    """

    params = (list(registry.names("encode")), TOKENS)
    param_names = ("implementation", "tokens")
    timeout = 120
    timer = time.process_time
    rounds = 1

    def setup(self, implementation, tokens):
        reason = registry.unavailable_reason("encode", implementation)
        if reason:
            raise NotImplementedError(reason)
        self.encoder = registry.create("encode", implementation)
        self.completion = samples.sized(tokens)
        reference = registry.create("encode", registry.reference("encode"))
        if self.encoder.encode(self.completion) != reference.encode(self.completion):
            raise NotImplementedError(f"{implementation}: bytes differ from the reference")

    def time_encode(self, implementation, tokens):
        self.encoder.encode(self.completion)

    def peakmem_encode(self, implementation, tokens):
        self.encoder.encode(self.completion)


class ProtoToJson:
    """Stored SampleResponse bytes into legacy JSON, per derivation and size."""

    params = ([row.name for row in JSON_IMPLEMENTATIONS], TOKENS)
    param_names = ("implementation", "tokens")
    timeout = 120
    rounds = 1

    def setup(self, implementation, tokens):
        reason = json_unavailable_reason(implementation)
        if reason:
            raise NotImplementedError(reason)
        self.derive = json_implementation(implementation)
        reference = registry.create("encode", registry.reference("encode"))
        self.data = reference.encode(samples.sized(tokens))

    def time_proto_to_json(self, implementation, tokens):
        self.derive(self.data)

    def peakmem_proto_to_json(self, implementation, tokens):
        self.derive(self.data)
