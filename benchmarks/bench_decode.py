"""Decode family: a vLLM completion body -> numpy arrays, per implementation, size and body kind.

Params are the registry table, not what is installed: an implementation that cannot run here,
or whose result differs from the reference on that body (checked once, in `setup_cache`),
raises NotImplementedError in setup and shows as n/a.
"""

from impl import registry
from impl.bench.decode import same

from .common import BODIES, TOKENS, decode_body

FAMILY = "decode"


class Decode:
    """One body decoded into a Completion (tokens int32, logprobs float32, stop reasons)."""

    params = (list(registry.names(FAMILY)), TOKENS, BODIES)
    param_names = ("implementation", "tokens", "body")
    timeout = 600

    def setup_cache(self):
        """Why each (implementation, tokens, body) cannot be timed, or None when it can."""
        reference = registry.create(FAMILY, registry.reference(FAMILY))
        verdicts = {}
        for tokens in TOKENS:
            for kind in BODIES:
                body = decode_body(tokens, kind)
                want = reference.decode(body)
                for name in registry.names(FAMILY):
                    reason = registry.unavailable_reason(FAMILY, name)
                    if reason is None:
                        got = registry.create(FAMILY, name).decode(body)
                        reason = None if same(got, want) else f"{name}: differs from the reference"
                    verdicts[name, tokens, kind] = reason
        return verdicts

    def setup(self, verdicts, implementation, tokens, body):
        reason = verdicts[implementation, tokens, body]
        if reason:
            raise NotImplementedError(reason)
        self.decoder = registry.create(FAMILY, implementation)
        self.body = decode_body(tokens, body)

    def time_decode(self, verdicts, implementation, tokens, body):
        self.decoder.decode(self.body)

    def peakmem_decode(self, verdicts, implementation, tokens, body):
        self.decoder.decode(self.body)
