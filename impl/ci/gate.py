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

Then asv's comparison table (`asv continuous`'s, restricted to the gated parameter
combinations) decides: a `time_` benchmark is slower when HEAD's median is beyond the factor
(1.5) *and* asv's statistics (Mann-Whitney U on the samples) say the two sample sets differ; a
`track_` figure (one value) by the factor alone. Before deciding, the gate confirms: when a
`time_` benchmark is slower, or borderline (a ratio past the square root of the factor, 1.22,
so that a step the first rounds understated is not passed on their word), ROUNDS more
interleaved rounds are appended to both commits' samples and judged again; a `track_` figure
beyond the factor is measured again with the commits in the other order and fails only if it
is beyond the factor both times. A benchmark that ran on BASE and fails on HEAD, or has no
result on HEAD at all, also fails the gate; one that BASE could not run is reported as not
compared. Stored results of both commits are deleted first, so stale numbers are never
compared. `--json PATH` writes each benchmark's values, samples and ratios (and the first
run's, before any confirmation).
Then the instruction-count stage (`impl.ci.gate_icount`): the CPU-bound steps counted under
Valgrind in fresh processes on both commits, failing at a rise of 1.05x (`--icount-factor`);
the timers above stay for what counting cannot see (system calls, waiting, contention). A line
`Gate-accept: NAME` in a commit message of BASE..HEAD accepts an intended rise of NAME.
Then the end-to-end stage (`impl.ci.gate_e2e`): the base commit's server and HEAD's, each
from its own exported tree, under this tree's load client in interleaved rounds (>= 3 each) of
a closed loop of small samples, failing when HEAD's p50 latency rises or its results/s falls by
more than 1.3x (`--e2e-factor`), on the median of the per-round ratios: a delay on a sample's
path costs no CPU and passes the stages above.
`--only decode` gates one family's benchmarks and counts only (`make gate-demo` does); `--only
e2e` runs only the end-to-end stage.
Exit 0: pass (also for a first commit); 1: a slowdown or a failure; 2: the gate could not run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from impl import registry
from impl.ci import gate_e2e, gate_icount
from impl.measure import LARGEST_TOKENS

ROOT = Path(__file__).resolve().parents[2]
#: the fixed asv machine name of automated runs (results of different names never mix)
MACHINE = "hotpath-ci"
FACTOR = 1.5
#: interleaved rounds of each time_ benchmark per commit (asv's default is 2)
ROUNDS = 4
#: the input each family is gated on (asv param values as asv prints them)
DECODE_TOKENS, DECODE_BODY = LARGEST_TOKENS, "vllm"  # a realistic logprobs=1 body
ENCODE_TOKENS = LARGEST_TOKENS
POOL_IN_FLIGHT = 1024


def picked(family: str) -> str:
    """The implementation the server would pick here without calibrating (see impl.pick)."""
    from impl import pick

    return pick.pick(family).name


def gated(picks: dict[str, str]) -> list[tuple[str, tuple[Any, ...] | None]]:
    """The gate subset: (asv benchmark name, its parameter values or None when unparametrized)."""
    return [
        ("bench_decode.Decode.time_decode", (picks["decode"], DECODE_TOKENS, DECODE_BODY)),
        ("bench_encode.Encode.time_encode", (picks["encode"], ENCODE_TOKENS)),
        ("bench_pool.Forward.time_forward", (picks["pool"], POOL_IN_FLIGHT)),
        ("bench_accesslog.AccessRecord.time_logger_info", (picks["accesslog"],)),
        ("bench_endtoend.SmallResults.track_wall_ms_per_result", None),
        ("bench_endtoend.SmallResults.track_server_cpu_ms_per_sample", None),
    ]


def regex(name: str, params: tuple[Any, ...] | None) -> str:
    """The asv `-b` regex of one benchmark (asv matches `name(param, ...)` per combination)."""
    if params is None:
        return f"^{re.escape(name)}$"
    return f"^{re.escape(name)}\\({re.escape(', '.join(map(repr, params)))}\\)$"


def git(*args: str) -> str | None:
    """stdout of `git ARGS` in the repository, or None when it fails."""
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def base_of(head: str) -> str | None:
    """HEAD's first parent; in a shallow clone, fetched first. None: HEAD is a first commit."""
    parent = git("rev-parse", "--verify", "--quiet", f"{head}^")
    if parent is None and git("rev-parse", "--is-shallow-repository") == "true":
        print("gate: shallow clone, fetching the parent commit", flush=True)
        git("fetch", "--quiet", "--deepen=1")
        parent = git("rev-parse", "--verify", "--quiet", f"{head}^")
        if parent is None:
            raise SystemExit("gate: cannot fetch the parent of a shallow clone; clone in full")
    return parent


def asv(*args: str) -> list[str]:
    return [sys.executable, "-m", "asv", *args, "--config", str(ROOT / "asv.conf.json")]


def gated_results(commit: str, benchmarks: list[tuple[str, tuple[Any, ...] | None]]):
    """asv result rows of `commit` on MACHINE, cut down to the gated parameter combinations.

    Yields what `asv.commands.compare.Compare.print_table` reads: (name, params, values,
    stats, samples, version, machine, env), each with one parameter combination.
    """
    from asv.results import iter_results_for_machine_and_hash

    conf = asv_config()
    try:
        stored = list(iter_results_for_machine_and_hash(conf.results_dir, MACHINE, commit))
    except Exception:  # asv raises when the machine or commit has no results at all
        stored = []
    for result in stored:
        keys = result.get_all_result_keys()
        for name, params in benchmarks:
            if name not in keys:
                continue
            all_params = result.get_result_params(name)
            combos = list(itertools.product(*all_params))
            wanted = tuple(repr(p) for p in params) if params else ()
            if wanted not in combos:
                continue
            i = combos.index(wanted)
            values = result.get_result_value(name, all_params)
            stats = result.get_result_stats(name, all_params)
            samples = result.get_result_samples(name, all_params)
            yield (
                name,
                [[p] for p in wanted],
                [values[i]],
                [stats[i]],
                [samples[i]],
                result.benchmark_version.get(name),
                MACHINE,
                result.env_name,
            )


def asv_config():
    """asv.conf.json, its directories made absolute (asv takes them relative to the cwd)."""
    from asv.config import Config

    conf = Config.load(str(ROOT / "asv.conf.json"))
    for attr in ("results_dir", "html_dir", "env_dir", "benchmark_dir"):
        setattr(conf, attr, str(ROOT / getattr(conf, attr)))
    return conf


def measured(rows: list[tuple]) -> set[str]:
    """Names of the rows that hold a number (not failed, not n/a)."""
    return {row[0] for row in rows if row[2][0] is not None and row[2][0] == row[2][0]}


def ratios(base: str, head: str, benchmarks: list) -> dict[str, dict[str, Any]]:
    """Per gated benchmark: its value (asv's median) and samples on base and on HEAD, and
    HEAD / base."""
    values: dict[str, dict[str, Any]] = {
        name: {"base": None, "head": None, "ratio": None} for name, _ in benchmarks
    }
    for side, commit in (("base", base), ("head", head)):
        for row in gated_results(commit, benchmarks):
            value = row[2][0]
            values[row[0]][side] = value if value is not None and value == value else None
            values[row[0]][f"{side}_samples"] = row[4][0]
    for row in values.values():
        if row["base"] and row["head"] is not None:
            row["ratio"] = row["head"] / row["base"]
    return values


def slower(base: str, head: str, benchmarks: list, factor: float) -> set[str]:
    """Names of the gated benchmarks HEAD is slower on: asv's rule, row by row (its `+`)."""
    from asv.commands.compare import _is_result_better

    rows = [{row[0]: row for row in gated_results(c, benchmarks)} for c in (base, head)]
    found = set()
    for name in rows[0].keys() & rows[1].keys():
        b, h = rows[0][name], rows[1][name]
        if any(v is None or v != v for v in (b[2][0], h[2][0])):
            continue
        ss_base, ss_head = (b[3][0], b[4][0]), (h[3][0], h[4][0])
        if _is_result_better(b[2][0], h[2][0], ss_base, ss_head, factor, use_stats=True):
            found.add(name)
    return found


def compare(base: str, head: str, benchmarks: list, factor: float) -> tuple[bool, set, set]:
    """Print asv's comparison table; (HEAD worse?, names measured on base, names on HEAD)."""
    from asv.commands.compare import Compare

    rows_base = list(gated_results(base, benchmarks))
    rows_head = list(gated_results(head, benchmarks))
    if not rows_base or not rows_head:
        return False, measured(rows_base), measured(rows_head)
    worsened, _ = Compare.print_table(
        asv_config(),
        base,
        head,
        factor=factor,
        split=False,
        resultset_1=iter(rows_base),
        resultset_2=iter(rows_head),
        machine=MACHINE,
        use_stats=True,
        commit_names={base: "base", head: "HEAD"},
    )
    return bool(worsened), measured(rows_base), measured(rows_head)


def run_rounds(patterns: list[str], extra: list[str], hashes: Path) -> bool:
    """`asv run` of `patterns` on the commits in `hashes`; False if asv itself failed."""
    command = asv(
        "run",
        "--interleave-rounds",
        "--record-samples",
        "--machine",
        MACHINE,
        "--show-stderr",
        *extra,
        *[a for pattern in patterns for a in ("-b", pattern)],
        f"HASHFILE:{hashes}",
    )
    print("gate: " + " ".join(command), flush=True)
    status = subprocess.run(command, cwd=ROOT).returncode
    if status not in (0, 2):  # 2: some benchmark failed, read from the results below
        print(f"gate: ERROR - asv run exited {status} (build or discovery failed, above)")
        return False
    return True


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
        help="end-to-end slowdown that fails: p50 latency or results/s (default 1.3)",
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


def gate(args: argparse.Namespace) -> int:
    """The gate proper (see the module docstring); its exit status."""

    picks = {family: picked(family) for family in registry.families()}
    only = set(args.only.split(",")) if args.only else None
    benchmarks = [
        (name, params)
        for name, params in gated(picks)
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
    head = git("rev-parse", "--verify", args.head)
    if head is None:
        print(f"gate: {args.head} is not a commit of {ROOT}", file=sys.stderr)
        return 2
    base = git("rev-parse", "--verify", args.base) if args.base else base_of(head)
    if base is None:
        print(f"gate: PASS - {head[:8]} is the first commit, there is nothing to compare it to")
        return 0
    print(f"gate: {base[:8]} (base) vs {head[:8]} (HEAD), factor {args.factor}", flush=True)
    if not args.compare_only:
        subprocess.run(asv("machine", "--yes", "--machine", MACHINE), cwd=ROOT, check=True)
        hashes = ROOT / ".asv" / "gate-commits.txt"
        hashes.parent.mkdir(parents=True, exist_ok=True)
        hashes.write_text(f"{head}\n{base}\n")
        # Never compare stale numbers: drop stored results of both commits before the run.
        for commit in (head, base):
            for stale in (Path(asv_config().results_dir) / MACHINE).glob(f"{commit[:8]}-*.json"):
                stale.unlink()
        # time_ benchmarks: ROUNDS interleaved rounds (base, HEAD, HEAD, base, ...), each a
        # fresh process per commit; track_ ones (the loadtest, its own rounds inside): one.
        timed = [r for (name, _), r in zip(benchmarks, regexes, strict=True) if ".time_" in name]
        tracked = [r for r in regexes if r not in timed]
        stages = [(timed, ["-a", f"rounds={ROUNDS}"]), (tracked, [])]
        if no_valgrind is None:  # instruction counts: one fresh process per step and commit
            stages.append((counted, []))
        for patterns, extra in [(p, e) for p, e in stages if p]:  # asv runs all for none
            if not run_rounds(patterns, extra, hashes):
                return 2
    worse, on_base, on_head = compare(base, head, benchmarks, args.factor)
    first = ratios(base, head, benchmarks)
    found = slower(base, head, benchmarks, args.factor) if worse else set()
    if worse and not found:
        worse = False  # a failure on HEAD (asv's `!`) is reported below, not here
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
        # samples of both commits and asv's rule judges all of them; a real step stays,
        # a noise excursion of one run mostly does not. track_ (one value per commit, the two
        # loadtests run back to back): run again with the commits in the other order; it
        # fails only if it is beyond the factor in both runs.
        for why, names in (("slower than the factor", found), ("borderline", borderline)):
            if names:
                print(f"gate: {why}, confirming: " + ", ".join(sorted(names)), flush=True)
        if found - tracks or borderline:
            extra = ["-a", f"rounds={ROUNDS}", "--append-samples"]
            if not run_rounds(timed, extra, hashes):
                return 2
        if tracks:
            hashes.write_text(f"{base}\n{head}\n")
            if not run_rounds([regex(n, p) for n, p in benchmarks if n in tracks], [], hashes):
                return 2
        _, on_base, on_head = compare(base, head, benchmarks, args.factor)
        confirmed = slower(base, head, benchmarks, args.factor)
        found = {n for n in confirmed if ".time_" in n} | (confirmed & tracks)
        worse = bool(found)
        again = ratios(base, head, benchmarks)
        for name in sorted(tracks):
            then, now = first[name]["ratio"], again[name]["ratio"]
            held = "beyond it again: fails" if name in confirmed else "within it: passes"
            print(f"gate: {name}: {then:.2f}x in the first run, {now or 0:.2f}x again, {held}")
    messages = git("log", "--format=%B", f"{base}..{head}") or ""
    accepted = gate_icount.accepted_names(messages)
    if accepted:
        print("gate: accepted by commit message: " + ", ".join(accepted))
    params_of = dict(benchmarks)
    taken = {n for n in found if gate_icount.is_accepted(n, params_of[n], accepted)}
    if worse and taken:
        print("gate: slower but accepted: " + ", ".join(sorted(taken)))
        worse = bool(found - taken)
    if no_valgrind:
        print(f"\ngate: instruction counts skipped: {no_valgrind}")
        counts: dict[str, dict[str, Any]] = {}
    else:
        counts = gate_icount.values(base, head, gated_results, only)
    risen = gate_icount.compare(counts, args.icount_factor, accepted) if counts else set()
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
        steps = ", ".join(counts[name]["step"] for name in sorted(risen))
        print(f"gate: FAIL - instructions rose by {args.icount_factor}x or more: {steps}")
    if worse or risen:
        example = counts[min(risen)]["step"] if risen else min(found).rsplit(".", 1)[-1]
        print(gate_icount.HOW_TO_ACCEPT.format(example=example))
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
            "instruction_counts": counts,
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
