"""The CI regression gate: the previous commit and HEAD benchmarked in the same run, interleaved.

`python -m impl.ci.gate` (or `make gate`) runs `asv run --interleave-rounds` on BASE
(default: HEAD's first parent) and HEAD, on a small subset of `benchmarks/`: the decode of a
realistic 262k-token vLLM body by the picked decoder, the picked encoder on a 262k-token
completion, the picked pool at 1024 requests in flight, the picked access-log handler, and one
short end-to-end loadtest. asv builds each commit into its own wheel and installs it into one
virtualenv under `.asv/env` (the dependencies are installed once) and runs the benchmarks of
this working tree against both. The `time_` benchmarks run in ROUNDS rounds that alternate the
commits (base, HEAD, HEAD, base, ...), each round a fresh process, so a machine that slows down
during the run slows both sides; the loadtest runs once per commit, back to back.

The decode and encode benchmarks time CPU time (`time.process_time`) and the access-log one
the calling thread's CPU time (`time.thread_time`), so a process waiting for a core while other
jobs load the machine does not count (benchmarks/ says why in each class); the pool burst and
the loadtest are wall time across processes and stay noisier.

Then the timer stage (`impl.ci.gate_timers`, its table restricted to the gated parameter
combinations) decides by asv's comparison rule (`impl.ci.significance`): a `time_` benchmark is
slower when HEAD's median is beyond the factor (1.5) *and* a Mann-Whitney U test on the samples
says the two sample sets differ; a `track_` figure (one value) by the factor alone. Before
deciding, the gate confirms: when a `time_` benchmark is slower, or borderline (a ratio past
the square root of the factor, 1.22, so that a step the first rounds understated is not passed
on their word), ROUNDS more interleaved rounds are appended to both commits' samples and judged
again; a `track_` figure beyond the factor is measured again with the commits in the other
order and fails only if it is beyond the factor both times. A benchmark that ran on BASE and
fails on HEAD, or has no result on HEAD at all, also fails the gate; one that BASE could not
run is reported as not compared. Stored results of both commits are deleted first, so stale
numbers are never compared. `--json PATH` writes each benchmark's values, samples and ratios
(and the first run's, before any confirmation).
Then the instruction-count stage (`impl.ci.gate_icount`): the CPU-bound steps counted under
Valgrind in fresh processes on both commits, failing at a rise of 1.05x (`--icount-factor`);
the timers above stay for what counting cannot see (system calls, waiting, contention). A line
`Gate-accept: NAME` in a commit message of BASE..HEAD accepts an intended rise of NAME.
Then the end-to-end stage (`impl.ci.gate_e2e`): the base commit's server and HEAD's, each
from its own exported tree, under this tree's load client in interleaved rounds (>= 3 each) of
a closed loop of small samples, failing when HEAD's p50 latency rises or its results/s falls
beyond 1.15x (`--e2e-factor`) on the median of the per-round ratios and a signed-rank test over
the rounds confirms it (`impl.ci.e2e_verdict`): a delay on a sample's path costs no CPU and
passes the stages above. It compares HEAD so with the base and with a fixed reference commit
(`.ci/reference`, `--reference`), which catches a loss that came in steps each under the line.
The three stages share one shape (`impl.ci.stage`: measure, compare row by row, verdict, one
table); this module runs them in order and decides the exit status.
`--only decode` gates one family's benchmarks and counts only (`make gate-demo` does); `--only
e2e` runs only the end-to-end stage.
Exit 0: pass (also for a first commit); 1: a slowdown or a failure; 2: the gate could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from impl import registry
from impl.ci import gate_e2e, gate_icount, gate_timers, repo
from impl.ci.gate_timers import FACTOR, ROUNDS, Timers, ratios, regex, run_rounds
from impl.ci.repo import GitFailed, commit_of, git
from impl.ci.stage import HOW_TO_ACCEPT, Row, Verdict, accepted_names


def base_of(head: str) -> str | None:
    """HEAD's first parent; in a shallow clone, fetched first. None: HEAD is a first commit."""
    parent = commit_of(f"{head}^")
    if parent is None and git("rev-parse", "--is-shallow-repository") == "true":
        print("gate: shallow clone, fetching the parent commit", flush=True)
        with contextlib.suppress(GitFailed):
            git("fetch", "--quiet", "--deepen=1")
        parent = commit_of(f"{head}^")
        if parent is None:
            raise SystemExit("gate: cannot fetch the parent of a shallow clone; clone in full")
    return parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m impl.ci.gate", description=__doc__)
    parser.add_argument(
        "--factor", type=float, default=FACTOR, help="time/CPU slowdown that fails (default 1.5)"
    )
    parser.add_argument(
        "--icount-factor",
        type=float,
        default=gate_icount.ICOUNT_FACTOR,
        help="instruction-count rise that fails (default 1.05)",
    )
    parser.add_argument("--base", help="commit to compare against (default: HEAD's parent)")
    parser.add_argument("--head", default="HEAD", help="commit under test (default: HEAD)")
    parser.add_argument(
        "--only",
        metavar="FAMILY[,FAMILY]",
        help="gate only these families' benchmarks and instruction-count steps, e.g. decode "
        "(bench_decode, decode-*); families: decode, encode, pool, accesslog, endtoend, server; "
        "e2e: the end-to-end stage",
    )
    parser.add_argument(
        "--e2e-factor",
        type=float,
        default=gate_e2e.FACTOR,
        help="end-to-end line a slowdown of p50 latency or results/s must pass, confirmed by "
        f"a signed-rank test over the rounds (default {gate_e2e.FACTOR})",
    )
    parser.add_argument(
        "--reference",
        metavar="REV",
        help="the end-to-end stage also compares HEAD with this commit (default: the one "
        ".ci/reference names); none: with the base only",
    )
    parser.add_argument(
        "--e2e-rounds",
        type=int,
        default=gate_e2e.ROUNDS,
        help="interleaved end-to-end rounds per commit (default 3, at least 3)",
    )
    parser.add_argument("--list", action="store_true", help="print the asv -b regexes and stop")
    parser.add_argument(
        "--compare-only", action="store_true", help="compare stored results, run nothing"
    )
    parser.add_argument(
        "--json", type=Path, help="also write the verdict and each benchmark's values here"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    status = gate(args)
    print(f"gate: exit {status} after {time.monotonic() - started:.0f} s", flush=True)
    return status


def _worse(rows: list[Row]) -> set[str]:
    """Names of the rows beyond the factor, accepted or not."""
    return {row.name for row in rows if row.verdict in (Verdict.WORSE, Verdict.ACCEPTED)}


def gate(args: argparse.Namespace) -> int:
    """The gate proper (see the module docstring); its exit status."""

    picks = {family: gate_timers.picked(family) for family in registry.families()}
    only = set(args.only.split(",")) if args.only else None
    benchmarks = [
        (name, params)
        for name, params in gate_timers.gated(picks)
        if only is None or name.removeprefix("bench_").split(".")[0] in only
    ]
    regexes = [regex(name, params) for name, params in benchmarks]
    counted = [regex(name, params) for name, params in gate_icount.gated(only)]
    end_to_end = only is None or "e2e" in only
    if args.e2e_rounds < 3:
        print("gate: --e2e-rounds must be at least 3", file=sys.stderr)
        return 2
    if not benchmarks and not counted and not end_to_end:
        print(f"gate: --only {args.only}: nothing gated (see --help)", file=sys.stderr)
        return 2
    no_valgrind = gate_icount.skipped_reason()
    print("gate: picks " + ", ".join(f"{k}={v}" for k, v in picks.items()), flush=True)
    if args.list:
        stage = [f"end-to-end stage ({gate_e2e.__name__})"] if end_to_end else []
        print("\n".join(regexes + counted + stage))
        return 0
    head = commit_of(args.head)
    if head is None:
        print(f"gate: {args.head} is not a commit of {repo.ROOT}", file=sys.stderr)
        return 2
    base = commit_of(args.base) if args.base else base_of(head)
    if base is None:
        print(f"gate: PASS - {head[:8]} is the first commit, there is nothing to compare it to")
        return 0
    print(f"gate: {base[:8]} (base) vs {head[:8]} (HEAD), factor {args.factor}", flush=True)
    accepted = accepted_names(git("log", "--format=%B", f"{base}..{head}"))
    hashes = repo.ROOT / ".asv" / "gate-commits.txt"
    timers = Timers(base, head, benchmarks, args.factor, hashes, accepted)

    def count(steps: list[tuple[str, Any]]) -> bool:
        return run_rounds([regex(name, params) for name, params in steps], [], hashes)

    counts = gate_icount.Counts(
        base, head, args.icount_factor, accepted, only, gate_timers.gated_results, count
    )
    if not args.compare_only:
        command = gate_timers.asv("machine", "--yes", "--machine", gate_timers.MACHINE)
        subprocess.run(command, cwd=repo.ROOT, check=True)
        hashes.parent.mkdir(parents=True, exist_ok=True)
        hashes.write_text(f"{head}\n{base}\n")
        # Never compare stale numbers: drop stored results of both commits before the run.
        results = Path(gate_timers.asv_config().results_dir) / gate_timers.MACHINE
        for commit in (head, base):
            for stale in results.glob(f"{commit[:8]}-*.json"):
                stale.unlink()
        # time_ benchmarks: ROUNDS interleaved rounds (base, HEAD, HEAD, base, ...), each a
        # fresh process per commit; track_ ones (the loadtest, its own rounds inside): one;
        # instruction counts: one fresh process per step and commit.
        if not timers.measure() or (no_valgrind is None and counted and not counts.measure()):
            return 2
    rows = timers.compare()
    on_base, on_head = timers.measured()
    first = ratios(base, head, benchmarks)
    found = _worse(rows)
    # A time_ ratio past the square root of the factor (1.22 for 1.5) is borderline: one run
    # of a few rounds may under- or over-state it, so it is confirmed like a failure.
    borderline = {
        name
        for name, row in first.items()
        if ".time_" in name and name not in found and (row["ratio"] or 0) >= args.factor**0.5
    }
    if (found or borderline) and not args.compare_only:
        tracks = {name for name in found if ".time_" not in name}
        # Confirm before deciding. time_: ROUNDS more interleaved rounds are appended to the
        # samples of both commits and the rule judges all of them; a real step stays,
        # a noise excursion of one run mostly does not. track_ (one value per commit, the two
        # loadtests run back to back): run again with the commits in the other order; it
        # fails only if it is beyond the factor in both runs.
        for why, names in (("slower than the factor", found), ("borderline", borderline)):
            if names:
                print(f"gate: {why}, confirming: " + ", ".join(sorted(names)), flush=True)
        if found - tracks or borderline:
            extra = ["-a", f"rounds={ROUNDS}", "--append-samples"]
            if not run_rounds(timers.timed, extra, hashes):
                return 2
        if tracks:
            hashes.write_text(f"{base}\n{head}\n")
            if not run_rounds([regex(n, p) for n, p in benchmarks if n in tracks], [], hashes):
                return 2
        rows = timers.compare()
        on_base, on_head = timers.measured()
        confirmed = _worse(rows)
        found = {n for n in confirmed if ".time_" in n} | (confirmed & tracks)
        again = ratios(base, head, benchmarks)
        for name in sorted(tracks):
            then, now = first[name]["ratio"], again[name]["ratio"]
            held = "beyond it again: fails" if name in confirmed else "within it: passes"
            print(f"gate: {name}: {then:.2f}x in the first run, {now or 0:.2f}x again, {held}")
    if accepted:
        print("gate: accepted by commit message: " + ", ".join(accepted))
    taken = {row.name for row in rows if row.verdict is Verdict.ACCEPTED} & found
    if taken:
        print("gate: slower but accepted: " + ", ".join(sorted(taken)))
    worse = bool(found - taken)
    risen: set[str] = set()
    if no_valgrind:
        print(f"\ngate: instruction counts skipped: {no_valgrind}")
    elif counted:
        counted_rows = counts.compare()
        risen = {
            name for name, row in zip(counts.counts, counted_rows, strict=True) if row.verdict.fails
        }
    names = [name for name, _ in benchmarks]
    not_on_base = [name for name in names if name not in on_base]
    failed_head = [name for name in names if name not in on_head and name in on_base]
    missing_head = [name for name in names if name not in on_head and name not in on_base]
    if not_on_base:
        print("\ngate: not compared, no result on the base commit: " + ", ".join(not_on_base))
    if missing_head:
        print("gate: FAIL - no result on HEAD either: " + ", ".join(missing_head))
    if failed_head:
        print("gate: FAIL - ran on the base commit, fails on HEAD: " + ", ".join(failed_head))
    if worse:
        print(f"gate: FAIL - a gated benchmark is slower by more than {args.factor}x (table above)")
    if risen:
        steps = ", ".join(counts.counts[name]["step"] for name in sorted(risen))
        print(f"gate: FAIL - instructions rose by {args.icount_factor}x or more: {steps}")
    if worse or risen:
        example = counts.counts[min(risen)]["step"] if risen else min(found).rsplit(".", 1)[-1]
        print(HOW_TO_ACCEPT.format(example=example))
    status = 1 if worse or risen or failed_head or missing_head else 0
    e2e: dict[str, Any] = {}
    if end_to_end:
        e2e_status, e2e = gate_e2e.in_gate(base, head, args, accepted)
        status = max(status, e2e_status) if status != 1 else 1
    if args.json:
        summary = {
            "base": base,
            "head": head,
            "factor": args.factor,
            "icount_factor": args.icount_factor,
            "status": status,
            "benchmarks": ratios(base, head, benchmarks),
            "first_run": first,
            "instruction_counts": counts.counts,
            "accepted": accepted,
            "e2e": e2e,
        }
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    if status:
        return status
    print(
        f"gate: PASS - no gated benchmark slower by more than {args.factor}x"
        + ("" if no_valgrind else f", no instruction count up by {args.icount_factor}x")
        + (f", end to end within {args.e2e_factor}x" if e2e else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
