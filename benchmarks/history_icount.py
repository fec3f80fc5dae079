"""The gate's instruction count of one step, for any commit of the history (run under Valgrind).

`python -P benchmarks/history_icount.py STEP` is what `benchmarks/history.py` runs under
Valgrind, in the fresh process `impl.ci.icount.count` would run: it makes the module paths of
today's `impl/ci/icount_steps.py` importable against the installed commit (an older commit
kept its synthetic bodies under another path, `history_compat.SYNTHETIC`) and then runs that
file, from this checkout, as `impl.ci.icount` runs it. The steps, their inputs, the warm calls,
the forked before/call/after children and the subtraction are the gate's own, so a commit's
history count is the gate's count of that commit.
"""

from __future__ import annotations

import importlib.util
import runpy
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS_FILE = HERE.parent / "impl" / "ci" / "icount_steps.py"


def alias_synthetic() -> None:
    """Make `impl.workloads.synthetic` name the installed commit's synthetic-body module."""
    try:
        import impl.workloads.synthetic  # noqa: F401

        return
    except ImportError:
        pass
    spec = importlib.util.spec_from_file_location("history_compat", HERE / "history_compat.py")
    assert spec is not None and spec.loader is not None
    compat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compat)
    module = compat.first(compat.SYNTHETIC, "body_for")
    sys.modules.setdefault("impl.workloads", types.ModuleType("impl.workloads"))
    sys.modules["impl.workloads.synthetic"] = module


def main(step: str) -> None:
    alias_synthetic()
    sys.argv = [str(STEPS_FILE), step]
    runpy.run_path(str(STEPS_FILE), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1])
