"""`python -m impl.decode.fuzz`: run the differential fuzzer (see the package docstring).

Batches of cases go to worker processes; batch i of a run is drawn from Random(f"{seed}:{i}"),
so `--seed S` replays a run. A worker that dies (a crash, or a sanitizer's report) breaks the
pool: each batch it may have been running is replayed in a process of its own that writes
every case to a file before decoding it, so the case that killed it is known and kept.
Exit status: 0 when every decoder agreed with the reference on every case, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from impl import registry
from impl.decode.fuzz import (
    COMPILED,
    REGRESSIONS,
    Case,
    compare,
    disagreement,
    minimize,
    save,
)
from impl.decode.fuzz.mutate import mutate, seeds

_STATE: dict = {}  # a worker's seeds and decoders, set once by _start


def _start(seed_bodies: list[tuple[str, bytes, int | None]], names: list[str]) -> None:
    _STATE["seeds"] = seed_bodies
    _STATE["reference"] = registry.create("decode", registry.reference("decode"))
    _STATE["decoders"] = {name: registry.create("decode", name) for name in names}


def _cases(seed: int, batch: int, size: int):
    """The cases of one batch, from its own seed."""
    rng = random.Random(f"{seed}:{batch}")
    for _ in range(size):
        name, body, k = rng.choice(_STATE["seeds"])
        mutated, how = mutate(rng, body)
        topk = rng.choice((0, 0, 1, 2, 3)) if k is not None else rng.choice((0, 0, 2))
        yield Case(mutated, topk, f"{how} of {name}")


def _run_batch(seed: int, batch: int, size: int) -> tuple[int, int, list[tuple[Case, str]]]:
    """(cases run, cases some decoder answered itself, [(shrunk case, what disagreed)])."""
    reference, decoders = _STATE["reference"], _STATE["decoders"]
    answered, found = 0, []
    for case in _cases(seed, batch, size):
        some, what = compare(case, reference, decoders)
        answered += some
        if what is not None:
            if len(found) < _SHRUNK_PER_BATCH:  # a bug found often: shrink a few, count all
                case = minimize(case, lambda c: disagreement(c, reference, decoders) is not None)
                what = disagreement(case, reference, decoders) or what
            found.append((case, what))
    return size, answered, found


_SHRUNK_PER_BATCH = 2


def _replay(seed: int, batch: int, size: int, names: list[str], current: Path) -> None:
    """Careful mode: the batch one case at a time, each written to `current` first."""
    _start(seeds(), names)
    for case in _cases(seed, batch, size):
        current.write_bytes(json.dumps({"k": case.k, "how": case.how}).encode() + b"\n" + case.body)
        disagreement(case, _STATE["reference"], _STATE["decoders"])
    current.unlink()


def _find_crash(seed: int, batch: int, size: int, names: list[str], out: Path) -> int:
    """Replay a batch that may have killed its worker; a case that kills the replay too is
    kept. The number of crashes found (0 or 1)."""
    with tempfile.TemporaryDirectory() as scratch:
        current = Path(scratch) / "current"
        command = [sys.executable, "-m", "impl.decode.fuzz", "--replay", f"{seed}:{batch}"]
        command += ["--batch", str(size), "--decoders", ",".join(names), "--current", str(current)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode == 0 or not current.exists():
            return 0
        header, _, body = current.read_bytes().partition(b"\n")
        meta = json.loads(header)
        report = [line for line in done.stderr.splitlines() if line.strip()][-12:]
        what = f"the process died (exit status {done.returncode}): " + " | ".join(report)
        path = save(Case(body, meta["k"], meta["how"]), what[:2000], out)
        print(f"fuzz: a case killed the process; kept as {path}", file=sys.stderr)
        print("\n".join(report), file=sys.stderr)
        return 1


def _names(spec: str) -> list[str]:
    if spec == "compiled":
        wanted = list(COMPILED)
    elif spec == "all":
        wanted = [n for n in registry.names("decode") if n != registry.reference("decode")]
    else:
        wanted = spec.split(",")
    names = []
    for name in wanted:
        reason = registry.unavailable_reason("decode", name)
        if reason is None:
            names.append(name)
        else:
            print(f"fuzz: {name} skipped: {reason}", file=sys.stderr)
    return names


def fuzz(args: argparse.Namespace) -> int:
    names = _names(args.decoders)
    if not names:
        print("fuzz: no decoder to check here (see above)", file=sys.stderr)
        return 1
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    seed_bodies = seeds()
    print(
        f"fuzz: seed {seed}; {', '.join(names)} against the reference on mutations of "
        f"{len(seed_bodies)} bodies, {args.processes} processes, "
        + (f"{args.cases:,} cases" if args.cases else f"{args.seconds:g} s"),
        flush=True,
    )
    started = time.monotonic()
    deadline = started + args.seconds
    ran = answered = disagreements = crashes = batch = 0
    last_report = started

    def more() -> bool:  # another batch wanted?
        return batch * args.batch < args.cases if args.cases else time.monotonic() < deadline

    while True:
        in_flight: dict = {}
        try:
            with ProcessPoolExecutor(
                args.processes, initializer=_start, initargs=(seed_bodies, names)
            ) as pool:
                while True:
                    while more() and len(in_flight) < 2 * args.processes:
                        in_flight[pool.submit(_run_batch, seed, batch, args.batch)] = batch
                        batch += 1
                    if not in_flight:
                        break
                    done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                    for future in done:
                        in_flight.pop(future)
                        count, some, found = future.result()
                        ran, answered = ran + count, answered + some
                        for case, what in found:
                            disagreements += 1
                            if disagreements <= args.keep:
                                path = save(case, what, args.regressions)
                                print(f"fuzz: DISAGREEMENT {what}\n  kept as {path}", flush=True)
                    if time.monotonic() - last_report >= args.progress:
                        last_report = time.monotonic()
                        rate = ran / (last_report - started)
                        print(f"fuzz: {ran:,} cases, {rate:,.0f}/s, {disagreements} disagreements")
            break
        except BrokenProcessPool:
            for lost in in_flight.values():
                crashes += _find_crash(seed, lost, args.batch, names, args.regressions)
            if not more():
                break
    seconds = time.monotonic() - started
    summary = {
        "seed": seed,
        "cases": ran,
        "seconds": round(seconds, 1),
        "answered_by_a_fast_path": answered,
        "disagreements": disagreements,
        "crashes": crashes,
        "decoders": names,
    }
    print(
        f"fuzz: {ran:,} cases in {seconds:.0f} s ({ran / max(seconds, 1e-9):,.0f}/s), "
        f"{answered / max(ran, 1):.0%} answered by a fast path (the rest handed over), "
        f"{disagreements} disagreements, {crashes} crashes",
        flush=True,
    )
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if disagreements or crashes else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m impl.decode.fuzz",
        description="Differential fuzzer: the compiled decoders against the reference on "
        "seeded mutations of realistic bodies. Every disagreement is kept as a regression "
        "case (tests/decode/test_regressions.py runs them). Exit 1 on any disagreement.",
    )
    add = parser.add_argument
    add("--seconds", type=float, default=60.0, help="how long to run (default 60)")
    add("--cases", type=int, default=0, help="stop after this many cases instead")
    add("--processes", type=int, default=os.cpu_count() or 1, help="workers (default: cores)")
    add("--seed", type=int, help="replay a run (default: a fresh random seed, printed)")
    add("--decoders", default="compiled", help="compiled (default), all, or names: a,b")
    add("--batch", type=int, default=400, help="cases per batch (default 400)")
    add("--regressions", type=Path, default=REGRESSIONS, help="where disagreements are kept")
    add("--keep", type=int, default=25, help="keep at most this many per run (default 25)")
    add("--progress", type=float, default=10.0, help="seconds between progress lines")
    add("--json", help="write the run's figures (cases, disagreements, ...) to this file")
    add("--replay", help=argparse.SUPPRESS)  # SEED:BATCH, one case at a time into --current
    add("--current", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.replay:
        seed, batch = (int(part) for part in args.replay.split(":"))
        _replay(seed, batch, args.batch, args.decoders.split(","), args.current)
        return 0
    return fuzz(args)


if __name__ == "__main__":
    sys.exit(main())
