"""The gate's end-to-end stage: a sample's whole path, the base commit's server against HEAD's.

The timers and instruction counts of `impl.ci.gate` gate the CPU-bound steps; a change that
makes each sample wait longer (a delay in the poll path, answers held for a batch, requests
queued behind others) costs no CPU and passes them. This stage runs the server of each commit
under the same load client, router and scenario, and compares what a user of the server sees:
results per second and the median latency of a sample.

- **Each commit's server, one harness.** Each commit is exported into `.asv/e2e/<commit>` and
  its server runs from there with this interpreter (`impl.ci.trees`: the compiled decoders
  copied or built, one implementation per family that both trees have, so neither
  calibrates). The fake router and the load client are this tree's, for both commits.
- **The scenario** (`SCENARIO`): a closed loop of 4 samples in flight (2 client processes of
  2) over 1000 small samples against an instant router. With so few in flight nothing queues
  behind other samples: a sample's latency is what the server does for it (asample, forward,
  decode, encode, store, the poll that reports it, its fetch) plus the loopback hops, and a
  delay anywhere on that path shows. (16 in flight saturated a loaded machine, which then hid
  a sleep on the path; small-2048 submits everything at once, so its latency is mostly the
  order in which queued samples are served.)
- **Rounds side by side** (`ROUNDS`, 5): one server per commit, started once; each round
  drives both at once, their client processes released together, so both meet the machine in
  the same seconds (runs one after the other, seconds apart, differ by more than the factor
  between two servers of the same commit on a loaded machine: docs/measurements.md). Per round,
  HEAD/base of the p50 latency and base/HEAD of results/s (>1: HEAD is worse). The verdict
  (`impl.ci.e2e_verdict`): worse when the median of the per-round ratios is beyond the line
  (1.15, `--factor`) and a signed-rank test over the paired rounds confirms it, so one round
  disturbed by another job does not decide. Beyond the line's square root, as many rounds
  again, and the verdict on all of them.
- **Against the parent and a fixed reference.** Then HEAD is compared the same way with the
  reference (`impl.ci.reference`: the commit `.ci/reference` names, `--reference REV`), which
  catches a loss that came in steps each under the line. A reference this repository lacks or
  cannot export or run is reported as not compared, saying why.

`python -m impl.ci.gate_e2e --base REV --head REV` runs the stage alone (`make gate` runs it
after the instruction counts; `--only e2e` runs only it); with `--preset NAME`, `--poll` and
`--background-load F` it compares two commits' servers on any loadtest preset, one run after
the other with a fresh server each (how the small-result latency bisection is re-measured).
Exit 0: pass (or not compared: the base's or the reference's server could not start); 1: slower
end to end than the base or the reference, or a sample lost or failed; 2: the stage could not
run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from impl.ci import repo
from impl.ci import trees as commit_trees
from impl.ci.e2e_rounds import NotStarted, Run, Servers, interleaved
from impl.ci.e2e_verdict import FACTOR, P_THRESHOLD, Judged, borderline, judge_rounds
from impl.ci.reference import FILE, NONE, BadReference, Reference, named, prepare
from impl.ci.stage import HOW_TO_ACCEPT, Row, is_accepted, print_table
from impl.harness import presets, procs

ROUNDS = 5
#: 1000 small samples, 4 in flight (2 per client process), instant router, minimal bodies
SCENARIO = presets.get("small-2048").with_overrides(
    num_requests=1000, max_outstanding=4, concurrency=4, timeout=240.0, healthz_interval=1.0
)


def ratios(runs: list[Run]) -> list[tuple[float, float]]:
    """Per round with both sides: (HEAD/base p50 latency, base/HEAD results/s); >1 is worse."""
    out = []
    for r in sorted({run.round for run in runs}):
        base = [x for x in runs if x.round == r and x.side == "base"]
        head = [x for x in runs if x.round == r and x.side == "HEAD"]
        if base and head:
            b, h = base[0], head[0]
            out.append((h.p50 / b.p50, b.results_per_second / h.results_per_second))
    return out


def judged(pairs: list[tuple[float, float]], factor: float) -> tuple[Judged, Judged]:
    """The rule (`impl.ci.e2e_verdict`) on the latency ratios and on the throughput ratios."""
    return (
        judge_rounds([p for p, _ in pairs], factor),
        judge_rounds([q for _, q in pairs], factor),
    )


def verdict(pairs: list[tuple[float, float]], factor: float) -> tuple[float, float, bool]:
    """(median latency ratio, median throughput ratio, HEAD worse: either figure worse by the
    rule, beyond the line and confirmed by the test over the rounds)."""
    latency, throughput = judged(pairs, factor)
    return latency.ratio, throughput.ratio, latency.worse or throughput.worse


class EndToEnd:
    """The end-to-end stage of two commits (`impl.ci.stage.Stage`): `measure` runs the rounds
    (and as many again when the first ones are beyond the factor or borderline: the confirmation)
    with a router and each commit's server, `compare` gives the two rows. `measure` raises
    NotStarted when a server did not start, RuntimeError when a run lost or failed samples."""

    def __init__(
        self,
        trees: dict[str, Path],
        flags: list[str],
        *,
        rounds: int,
        factor: float,
        scenario: Any,
        fresh: bool,
    ) -> None:
        self.trees, self.flags, self.rounds, self.factor = trees, flags, rounds, factor
        self.scenario, self.fresh = scenario, fresh
        self.title = (
            f"end to end (fail beyond {factor}x and p < {P_THRESHOLD}, medians of the per-round "
            "ratios)"
        )
        self.runs: list[Run] = []
        self.first: list[Run] = []

    def measure(self) -> bool:
        router = procs.start_router([*self.scenario.router_args(), "--seed", "0"])
        servers = Servers(self.trees, self.flags, router.url, self.fresh)
        at_once = not self.fresh
        try:
            self.runs = interleaved(servers, self.rounds, 0, self.scenario, at_once=at_once)
            self.first = list(self.runs)
            figures = judged(ratios(self.runs), self.factor)
            latency, throughput, worse = verdict(ratios(self.runs), self.factor)
            if borderline(figures, self.factor):
                why = "slower than the factor" if worse else "borderline"
                print(f"gate e2e: {why} ({latency:.2f}x latency, {throughput:.2f}x throughput), "
                      f"confirming with {self.rounds} more rounds", flush=True)  # fmt: skip
                rounds, scenario = self.rounds, self.scenario
                self.runs += interleaved(servers, rounds, rounds, scenario, at_once=at_once)
        finally:
            servers.stop()
            router.stop()
        return True

    def compare(self) -> list[Row]:
        return rows(self.runs, self.factor)


def rows(runs: list[Run], factor: float) -> list[Row]:
    """The stage's two rows: the p50 latency (ratio HEAD/base) and results/s (ratio base/HEAD),
    each side's median over its rounds, the ratio the median of the per-round ratios, the
    verdict `impl.ci.e2e_verdict`'s."""
    latency, throughput = judged(ratios(runs), factor)

    def median(side: str, value: str) -> float:
        return statistics.median(getattr(run, value) for run in runs if run.side == side)

    p50 = [median(side, "p50") * 1e3 for side in ("base", "HEAD")]
    rate = [median(side, "results_per_second") for side in ("base", "HEAD")]
    return [
        Row("p50 latency (ms)", *p50, latency.ratio, latency.verdict),
        Row("results/s (base/HEAD)", *rate, throughput.ratio, throughput.verdict),
    ]


def compare(
    base: str,
    head: str,
    trees: dict[str, Path],
    *,
    rounds: int,
    factor: float,
    scenario: Any,
    fresh: bool,
    what: str = "base",
) -> tuple[int, dict[str, Any]]:
    """Both servers in rounds, the table, the verdict: (0 pass or not compared, 1 slower or a
    sample lost; the summary for --json). `what` names the base side in what is printed (the
    base, or the reference)."""
    started = time.monotonic()
    flags = commit_trees.pins(list(trees.values()))
    print(
        f"gate e2e: {base[:8]} ({what}) vs {head[:8]} (HEAD), {rounds} interleaved rounds, "
        f"{scenario.num_requests} samples, {scenario.max_outstanding} in flight, factor "
        f"{factor}; servers with {' '.join(flags)}",
        flush=True,
    )
    end_to_end = EndToEnd(
        trees, flags, rounds=rounds, factor=factor, scenario=scenario, fresh=fresh
    )
    try:
        end_to_end.measure()
    except NotStarted as exc:
        if exc.side == "base":
            print(f"gate e2e: NOT COMPARED, the {what}'s server did not start: {exc}")
            return 0, {"compared": False, "why": f"the {what}'s server did not start"}
        print(f"gate e2e: FAIL - HEAD's server did not start: {exc}")
        return 1, {"compared": False, "why": "HEAD's server did not start"}
    except RuntimeError as exc:  # a run lost or failed samples
        print(f"gate e2e: FAIL - {exc}")
        return 1, {"compared": False, "why": str(exc)}
    runs = end_to_end.runs
    pairs = ratios(runs)
    latency, throughput = judged(pairs, factor)
    worse = latency.worse or throughput.worse
    shown = ", ".join(f"{p:.2f}/{q:.2f}" for p, q in pairs)
    print(
        f"gate e2e: per round HEAD/{what} p50 latency / {what}/HEAD results/s: {shown}; medians "
        f"{latency.ratio:.2f}x latency (p {latency.p:.3g}), {throughput.ratio:.2f}x throughput "
        f"(p {throughput.p:.3g}) ({time.monotonic() - started:.0f} s)"
    )
    title = end_to_end.title if what == "base" else f"against the reference, {end_to_end.title}"
    print_table(title, end_to_end.compare(), what="figure")
    summary = {
        "compared": True,
        "base": base,
        "head": head,
        "factor": factor,
        "latency_ratio": latency.ratio,
        "throughput_ratio": throughput.ratio,
        "latency_p": latency.p,
        "throughput_p": throughput.p,
        "failed": worse,
        "pairs": pairs,
        "first_run_pairs": ratios(end_to_end.first),
        "runs": [{k: v for k, v in vars(run).items() if k != "summary"} for run in runs],
    }
    if worse:
        print(
            f"gate e2e: FAIL - HEAD's server is slower end to end than the {what}'s beyond "
            f"{factor}x (p50 latency {latency.ratio:.2f}x, results/s {throughput.ratio:.2f}x)"
        )
        return 1, summary
    print(
        f"gate e2e: PASS - p50 latency {latency.ratio:.2f}x, results/s {throughput.ratio:.2f}x "
        f"the {what}'s"
    )
    return 0, summary


def stage(
    base: str,
    head: str,
    *,
    rounds: int = ROUNDS,
    factor: float = FACTOR,
    workdir: Path | None = None,
    json_path: Path | None = None,
    scenario: Any = SCENARIO,
    fresh: bool = False,
    reference: Reference | None = None,
) -> int:
    """The stage (see the module docstring): 0 pass or not compared, 1 slower, 2 could not run.
    `scenario`: another load than the gate's (`--preset`, for comparisons by hand); `fresh`: a
    new server for every run; `reference`: also compare HEAD with it (`impl.ci.reference`)."""
    workdir = workdir or repo.ROOT / ".asv" / "e2e"
    head_tree = commit_trees.tree_of(head, workdir)
    options = {"rounds": rounds, "factor": factor, "scenario": scenario, "fresh": fresh}
    trees = {"base": commit_trees.tree_of(base, workdir), "HEAD": head_tree}
    status, summary = compare(base, head, trees, **options)
    summary["base_status"] = status
    summary["reference"] = drift = prepare(reference, base, head, workdir)
    if "tree" in drift:
        print(flush=True)
        trees = {"base": drift.pop("tree"), "HEAD": head_tree}
        try:
            ref_status, compared = compare(
                drift["commit"], head, trees, **options, what="reference"
            )
        except subprocess.CalledProcessError as exc:  # its impl does not import here
            print(f"gate e2e: NOT COMPARED with the reference: its tree cannot run: {exc}\n"
                  f"{(exc.stderr or '')[-1500:]}")  # fmt: skip
            ref_status, compared = 0, {"compared": False, "why": f"cannot run: {exc}"}
        drift.update(compared, status=ref_status)
        status = max(status, ref_status)
    if json_path is not None:
        json_path.write_text(json.dumps(summary, indent=1) + "\n")
    return status


def in_gate(base: str, head: str, args: Any, accepted: list[str]) -> tuple[int, dict[str, Any]]:
    """The stage as `impl.ci.gate` runs it: (exit status, the summary its --json keeps). A
    `Gate-accept: e2e` line between base and HEAD accepts an intended slowdown against the base;
    one against the reference is accepted by moving the reference (`.ci/reference`)."""
    if args.compare_only:
        print("gate: the end-to-end stage is measured afresh, not with --compare-only")
        return 0, {}
    try:
        reference = named(getattr(args, "reference", None))
    except BadReference as exc:
        print(f"gate e2e: {exc}", file=sys.stderr)
        return 2, {}
    print(flush=True)
    path = repo.ROOT / ".asv" / "gate-e2e.json"
    path.unlink(missing_ok=True)
    status = stage(
        base,
        head,
        rounds=args.e2e_rounds,
        factor=args.e2e_factor,
        json_path=path,
        reference=reference,
    )
    summary = json.loads(path.read_text()) if path.exists() else {}
    path.unlink(missing_ok=True)
    against_base = summary.get("base_status", status)
    drifted = (summary.get("reference") or {}).get("status") == 1
    if against_base == 1 and is_accepted("e2e", None, accepted):
        print("gate: slower end to end but accepted by commit message (Gate-accept: e2e)")
        against_base = 0
    elif against_base == 1:
        print(HOW_TO_ACCEPT.format(example="e2e"))
    if drifted:
        print(
            "gate: slower than the reference: if the loss is intended, move the reference "
            f"({FILE}: the commit, and why) in a commit of its own, and run the gate again"
        )
    status = 1 if against_base == 1 or drifted else max(against_base, status)
    summary["status"] = status
    return status, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m impl.ci.gate_e2e",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--base", help="the base commit (default: HEAD's first parent)")
    parser.add_argument("--head", default="HEAD", help="the commit under test (default: HEAD)")
    parser.add_argument(
        "--rounds", type=int, default=ROUNDS, help=f"rounds per side (>= 3, default {ROUNDS})"
    )
    parser.add_argument(
        "--factor",
        type=float,
        default=FACTOR,
        help=f"the line a slowdown must pass, with the test over the rounds (default {FACTOR})",
    )
    parser.add_argument(
        "--reference",
        metavar="REV",
        help="also compare HEAD with this commit (default: the one .ci/reference names; without "
        "--preset only); none: compare with the base only",
    )
    parser.add_argument("--json", type=Path, help="write the runs and the verdict here")
    parser.add_argument(
        "--preset",
        choices=list(presets.PRESETS),
        help="compare the two servers on this loadtest preset instead of the gate's scenario "
        "(e.g. small-2048: the burst whose latency is the order samples are served in)",
    )
    parser.add_argument(
        "--poll", choices=("auto", "session", "request"), help="the load client's --poll"
    )
    parser.add_argument(
        "--background-load",
        type=float,
        metavar="FRACTION",
        help="run `hotpath loadtest --background-load`'s CPU burner for the whole comparison",
    )
    args = parser.parse_args(argv)
    if args.rounds < 3:
        parser.error("--rounds must be at least 3")
    head = repo.git("rev-parse", "--verify", args.head)
    base = repo.git("rev-parse", "--verify", args.base or f"{head}^")
    scenario = presets.get(args.preset) if args.preset else SCENARIO
    scenario = scenario.with_overrides(poll=args.poll)
    try:
        option = args.reference or (NONE if args.preset else None)
        reference = named(option)
    except BadReference as exc:
        parser.error(str(exc))
    from impl.harness import burner

    with burner.running(args.background_load, seconds=3 * 3600):
        return stage(
            base,
            head,
            rounds=args.rounds,
            factor=args.factor,
            json_path=args.json,
            scenario=scenario,
            fresh=args.preset is not None,
            reference=reference,
        )


if __name__ == "__main__":
    sys.exit(main())
