"""Instructions executed by one call of each CPU-bound step, counted under Valgrind.

Each figure is counted in a fresh process with a fixed hash seed and one BLAS thread, around the
measured call only (`impl.ci.icount`: start-up, imports and input building are subtracted), so
it is the same in every process (docs/ci.md) and a 5% rise is visible where CPU time varies
by more than that between processes. Steps: the picked decoder on a 262k-token and a
128-token vLLM body, the picked encoder on a 262k-token completion, one access-log record
through the picked handler, and the server's asample (forward stubbed) and try_again poll
routes in-process. Where Valgrind is not installed, setup raises NotImplementedError (n/a)
with the install hint. One round: a count does not vary, so repeating it only costs time.
With HOTPATH_ICOUNT_CACHE set (`make gate-demo` sets it) a count already made of the same code
in the same environment is read back (impl.ci.icount says what the key holds).
"""

from impl.ci import icount
from impl.ci.icount_steps import STEPS


class InstructionCount:
    """Instructions of one warm call of each step (unit: instructions)."""

    params = (list(STEPS),)
    param_names = ("step",)
    number = 1
    repeat = 1
    rounds = 1
    timeout = 1800

    def setup(self, step):
        reason = icount.unavailable_reason()
        if reason:
            raise NotImplementedError(reason)

    def track_instructions(self, step):
        return icount.cached_count(step)

    track_instructions.unit = "instructions"
