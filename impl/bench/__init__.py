"""`hotpath bench`: every family's table (parity, time, ratio to the reference), recorded for picks.

Each family has a module `impl/bench/<family>.py` with `run(quick: bool) -> Section` (and an
optional keyword `full: bool`); this runner prints the sections, writes one JSON results file
(with the environment and each section's seconds, so every figure can be traced to what
produced it) and records the measurements `impl.pick` uses.

Three lengths: `--quick` (a smoke run, the shortest), the default (every table at the sizes
that matter) and `--full` (every size, more repeats, decode's peak-memory subprocesses, pool's
8192-in-flight point and a 200 s burst budget). docs/measurements.md has how long each took.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
import time
import traceback
from pathlib import Path

from impl import pick, registry
from impl.bench._common import Section
from impl.measure import environment

#: Sections in the order they run; each is `impl.bench.<name>`.
SECTIONS: tuple[str, ...] = (*registry.families(), "server", "runtime", "endtoend")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats: a smoke run")
    parser.add_argument(
        "--full",
        action="store_true",
        help="the long run: every size, more repeats, decode peak memory, pool at "
        "8192 in flight with a 200 s burst budget (HOTPATH_POOL_BUDGET overrides)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        metavar="SECTION",
        help=f"run only this section (repeatable; one of {', '.join(SECTIONS)})",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=Path(".hotpath/bench.json"),
        help="where to write the machine-readable results (default: %(default)s)",
    )
    parser.add_argument(
        "--no-record",
        action="store_true",
        help="do not record measurements for the server's picks "
        f"(default file: {pick.measurements_path()})",
    )


#: Printed last: where to go from the tables.
LOOK_NEXT = (
    "Where to look next: docs/harness.md says what each section measures; "
    "`hotpath loadtest --preset NAME --compare baseline --report r.json` for one scenario's "
    "full table (`--profile profiles/NAME` for a py-spy profile); "
    "`hotpath bench --full` for every size and the peak-memory table; "
    "`make asv` / `make gate` for history and regressions."
)


def _write(
    path: Path,
    sections: list[Section],
    errors: dict[str, str],
    args,
    started,
    timings: dict[str, float],
) -> float:
    """Write everything measured so far (called after every section, so a crash loses nothing)."""
    seconds = round(time.perf_counter() - started, 1)
    results = {
        "environment": environment(),
        "seconds": seconds,
        "quick": args.quick,
        "full": getattr(args, "full", False),
        "section_seconds": timings,
        "sections": [section.as_json() for section in sections],
        "errors": errors,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    return seconds


def _run_section(name: str, quick: bool, full: bool) -> Section:
    module = importlib.import_module(f"impl.bench.{name}")
    if full and "full" in inspect.signature(module.run).parameters:
        return module.run(quick=quick, full=True)
    return module.run(quick=quick)


def run(args: argparse.Namespace) -> int:
    sections: list[Section] = []
    errors: dict[str, str] = {}
    timings: dict[str, float] = {}
    full = getattr(args, "full", False)
    if full and args.quick:
        print("--full and --quick: --quick wins", file=sys.stderr)
        full = args.full = False
    started = time.perf_counter()
    for name in args.only or SECTIONS:
        print(f"== {name} ==", file=sys.stderr, flush=True)
        begun = time.perf_counter()
        try:
            section = _run_section(name, args.quick, full)
        except Exception as exc:  # one broken section must not lose the others' figures
            timings[name] = round(time.perf_counter() - begun, 1)
            errors[name] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
            print(f"\nsection {name} FAILED: {errors[name]}\n", flush=True)
            _write(args.json, sections, errors, args, started, timings)
            continue
        timings[name] = round(time.perf_counter() - begun, 1)
        sections.append(section)
        print(f"\n{section.title}\n{section.table}\n", flush=True)
        if section.notes:
            print(section.notes + "\n", flush=True)
        if section.measurements and not args.no_record:
            path = pick.record(section.family, section.measurements)
            print(f"(recorded {section.family} measurements for picks in {path})\n", flush=True)
        _write(args.json, sections, errors, args, started, timings)
    seconds = _write(args.json, sections, errors, args, started, timings)
    mode = "quick" if args.quick else "full" if full else "default"
    per_section = ", ".join(f"{name} {value:.0f} s" for name, value in timings.items())
    print(f"{LOOK_NEXT}\n")
    print(f"results: {args.json}  ({mode} run, {seconds} s: {per_section})")
    failed = [row for s in sections for row in s.rows if row.get("parity") is False]
    if failed:
        print(f"PARITY FAILURES: {len(failed)} rows differ from their reference", file=sys.stderr)
    if errors:
        print(f"SECTIONS FAILED: {', '.join(errors)}", file=sys.stderr)
    return 1 if failed or errors else 0
