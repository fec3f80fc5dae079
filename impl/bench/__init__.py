"""`hotpath bench`: every family's table (parity, time, ratio to the reference), recorded for picks.

Each family has a module `impl/bench/<family>.py` with `run(quick: bool) -> Section`; this
runner prints the sections, writes one JSON results file (with the environment, so every
figure can be traced to what produced it) and records the measurements `impl.pick` uses.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

from impl import pick
from impl.bench._common import Section, environment

#: Sections in the order they run; each is `impl.bench.<name>`.
SECTIONS: tuple[str, ...] = ("decode", "encode", "pool", "accesslog", "server", "endtoend")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="fewer sizes and repeats: under a minute"
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


def _write(path: Path, sections: list[Section], errors: dict[str, str], args, started) -> float:
    """Write everything measured so far (called after every section, so a crash loses nothing)."""
    seconds = round(time.perf_counter() - started, 1)
    results = {
        "environment": environment(),
        "seconds": seconds,
        "quick": args.quick,
        "sections": [section.as_json() for section in sections],
        "errors": errors,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    return seconds


def run(args: argparse.Namespace) -> int:
    sections: list[Section] = []
    errors: dict[str, str] = {}
    started = time.perf_counter()
    for name in args.only or SECTIONS:
        print(f"== {name} ==", file=sys.stderr, flush=True)
        try:
            module = importlib.import_module(f"impl.bench.{name}")
            section = module.run(quick=args.quick)
        except Exception as exc:  # one broken section must not lose the others' figures
            errors[name] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
            print(f"\nsection {name} FAILED: {errors[name]}\n", flush=True)
            _write(args.json, sections, errors, args, started)
            continue
        sections.append(section)
        print(f"\n{section.title}\n{section.table}\n", flush=True)
        if section.notes:
            print(section.notes + "\n", flush=True)
        if section.measurements and not args.no_record:
            path = pick.record(section.family, section.measurements)
            print(f"(recorded {section.family} measurements for picks in {path})\n", flush=True)
        _write(args.json, sections, errors, args, started)
    seconds = _write(args.json, sections, errors, args, started)
    print(f"results: {args.json}  ({seconds} s)")
    failed = [row for s in sections for row in s.rows if row.get("parity") is False]
    if failed:
        print(f"PARITY FAILURES: {len(failed)} rows differ from their reference", file=sys.stderr)
    if errors:
        print(f"SECTIONS FAILED: {', '.join(errors)}", file=sys.stderr)
    return 1 if failed or errors else 0
