"""Instruction counts of the CPU-bound steps, under Valgrind, for a gate that sees 5%.

CPU time still varies between processes on a shared machine (caches, the VM, frequency), so
a timer-based gate can only catch large steps (docs/measurements.md). The number of instructions a
deterministic step executes does not depend on the machine's load: counted by Valgrind
(`--tool=cachegrind --cache-sim=no`, which counts each instruction and simulates nothing else),
the same step counts the same instructions in every fresh process, once the two sources of
drift are fixed: `PYTHONHASHSEED=0` (string hashing, hence dict and set layouts) and
`OPENBLAS_NUM_THREADS=1` (numpy's idle OpenBLAS threads spin, and are counted, otherwise).

`count(step)` runs `impl.ci.icount_steps STEP` under Valgrind in a fresh process; that process
forks a child making the measured call once between two children that do not, and the count is
the first's instructions minus the mean of the others' (see `impl.ci.icount_steps`), so
start-up, imports and input building are not counted. Valgrind runs the code tens of times
slower: most of a count's time is the imports.

    python -m impl.ci.icount [STEP ...] [--processes N]   # each step's count in N processes

prints each step's counts and their spread (max / min). Where Valgrind is not installed (Debian:
`apt-get install -y valgrind`), `unavailable_reason()` says so and the asv tracks are n/a.

Cache (opt-in: `HOTPATH_ICOUNT_CACHE=DIR`, set by `make gate-demo`): a count is kept under a key
of everything it depends on (the step, the bytes of every file of the `impl` package counted,
the interpreter, the installed distributions' versions, the implementations picked, the fixed
environment and Valgrind's version), and a later count of the same key reads it back instead of
counting again. Sound only because a count does not vary between processes (docs/ci.md:
instruction counts, 8 processes per step); the command above never reads the cache.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from impl.ci.icount_steps import STEPS

#: the environment that makes a count repeatable (see the module docstring)
FIXED_ENV = {"PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
#: seconds one counted process may take before it is stopped (a 262k decode is the longest)
TIMEOUT = 900


def unavailable_reason() -> str | None:
    """Why instructions cannot be counted here, or None."""
    if shutil.which("valgrind") is None:
        return "valgrind is not installed (Debian: apt-get install -y valgrind)"
    if not hasattr(os, "fork"):
        return "counting needs os.fork"
    return None


def summary(path: Path) -> int:
    """The instruction total of one cachegrind output file (its `summary:` line)."""
    match = re.search(r"^summary:\s+(\d+)", path.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"{path}: no summary line (did the process exit normally?)")
    return int(match.group(1))


def cache_key(step: str) -> str:
    """What a count of `step` in this interpreter depends on, hashed (see the module docstring)."""
    import impl
    from impl import pick

    digest = hashlib.sha256()
    package = Path(impl.__file__).resolve().parent
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    installed = importlib.metadata.distributions()
    versions = sorted(f"{d.metadata['Name']}=={d.version}" for d in installed)
    valgrind = subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout
    picks = {family: pick.pick(family).name for family in ("decode", "encode", "accesslog")}
    facts = [step, sys.version, sys.platform, versions, picks, FIXED_ENV, valgrind.strip()]
    digest.update(json.dumps(facts, sort_keys=True).encode())
    return digest.hexdigest()


def cached_count(step: str) -> int:
    """`count(step)`, read from the cache under HOTPATH_ICOUNT_CACHE when it holds this key
    (and written there after counting); a plain `count` when the variable is unset."""
    directory = os.environ.get("HOTPATH_ICOUNT_CACHE")
    if not directory:
        return count(step)
    path = Path(directory) / f"{step}-{cache_key(step)[:32]}.json"
    if path.is_file():
        return int(json.loads(path.read_text())["instructions"])
    instructions = count(step)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"step": step, "instructions": instructions}) + "\n")
    return instructions


def count(step: str, python: str = sys.executable) -> int:
    """Instructions of one call of `step` (a name in STEPS; the mean of its REPEATS calls),
    counted in a fresh process."""
    if step not in STEPS:
        raise ValueError(f"unknown step {step!r}; steps: {', '.join(STEPS)}")
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    env = {**os.environ, **FIXED_ENV}
    with tempfile.TemporaryDirectory(prefix="hotpath-icount-") as out:
        command = [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            f"--cachegrind-out-file={out}/cachegrind.%p",
            "--log-file=" + f"{out}/valgrind.%p.log",
            python,
            "-P",  # not the cwd first on sys.path: the installed impl is the one counted
            "-m",
            "impl.ci.icount_steps",
            step,
        ]
        done = subprocess.run(
            command, env=env, cwd=out, capture_output=True, text=True, timeout=TIMEOUT
        )
        if done.returncode != 0:
            logs = "".join(p.read_text()[-2000:] for p in Path(out).glob("valgrind.*.log"))
            raise RuntimeError(
                f"icount {step}: exit {done.returncode}\n{done.stderr[-4000:]}\n{logs}"
            )
        pids = json.loads(done.stdout.strip().splitlines()[-1])
        repeats = pids.pop("repeats")
        totals = {key: summary(Path(out, f"cachegrind.{pid}")) for key, pid in pids.items()}
    return round((totals["call"] - (totals["before"] + totals["after"]) / 2) / repeats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m impl.ci.icount",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("steps", nargs="*", help=f"default: all of {', '.join(STEPS)}")
    parser.add_argument(
        "--processes", type=int, default=1, help="fresh processes per step (default 1)"
    )
    args = parser.parse_args(argv)
    steps = args.steps or list(STEPS)
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        parser.error(f"unknown step(s) {', '.join(unknown)}; choose from {', '.join(STEPS)}")
    reason = unavailable_reason()
    if reason:
        print(f"icount: {reason}", file=sys.stderr)
        return 2
    print(f"| step | instructions in {args.processes} fresh processes | max / min |")
    print("|---|---|---|")
    for step in steps:
        counts = [count(step) for _ in range(args.processes)]
        spread = max(counts) / min(counts)
        shown = ", ".join(f"{c:,}" for c in sorted(set(counts)))
        print(f"| {step} | {shown} | {spread:.6f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
