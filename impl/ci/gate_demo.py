"""Show, repeatably, that the regression gate catches a slowdown and passes unchanged code.

`python -m impl.ci.gate_demo` (or `make gate-demo`) works in a throwaway git repository under
`.asv/gate-demo/repo` (kept between runs, so asv's virtualenv there is built once). It commits a
snapshot of this working tree (tracked and untracked, not ignored, files) as the base, then two
commits on top of it:

- `slow`: the decoder the gate picks decodes every body twice (its module's `create()` returns
  a wrapper whose `decode` calls the real one twice); the demo times it directly, CPU time,
  against the unchanged decoder on the gated 262k-token body and prints the ratio;
- `unchanged`: one comment line added to the same module;
- `slowdown` (with `--slowdown F`, e.g. 1.08): the picked decoder also decodes, after each
  body, a body of (F - 1) times its generated tokens (a re-scan of part of the body: work
  proportional to the body, like a real regression), so a decode costs ~F times as much; the
  demo times it directly too, and the gate's instruction-count stage measures it;
- `e2e` (`--e2e-slowdown F`, e.g. 1.5, instead of the others): the server delivers each
  result after waiting (F - 1) times as long as the sample has been in it
  (`impl.ci.gate_demo_e2e`); with the unchanged commit, the gate runs its end-to-end stage
  only (`--only e2e`).

Each case runs the real gate (`python -m impl.ci.gate --base <snapshot> --head <case>
--only decode`, in the throwaway repository) `--runs` times, cases alternating, and a table
prints the gate's exit status, the decode ratios it measured (CPU time, and instructions of the
262k decode), whether its verdict was the expected one, and its wall time. Exit 0 only when
every verdict was correct. Gate logs: `.asv/gate-demo/logs/`. Nothing here touches this
repository's git state or its `.asv/results`.

What the demo gates, to stay practical (the three cases with the whole gate take the best
part of an hour): only what the changed module can affect, the decode family, i.e. `time_decode`
(CPU time, 4 interleaved rounds per commit, confirmed as in the full gate) and the `decode-262k` and
`decode-128` instruction counts; `--all-benchmarks` gates the whole subset as `make gate` does.
Every gate run measures the base again, interleaved with its head, since that is what makes
the timers' comparison fair under changing load. Instruction counts are read from a cache
(`impl.ci.icount`, HOTPATH_ICOUNT_CACHE=.asv/gate-demo/icount-cache) keyed by the code and the
environment counted: a count does not vary between processes, so the base is counted once and
each case commit once per invocation, and later runs reuse them (`--no-icount-cache`: count
afresh in every gate run). The timers' verdicts are measured anew in every run.

`--timers N` instead runs N fresh processes (like asv's rounds) that each time the gated decode
5 times by wall clock and CPU time at once, with a fresh decoder per call (the old benchmark)
and a warm one (the new), and prints how far the per-process medians spread.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from impl.ci import gate_demo_e2e, gate_timers
from impl.ci.repo import ROOT, git

#: who the throwaway repository's commits are by
AS_DEMO = ("-c", "user.name=gate-demo", "-c", "user.email=gate-demo@localhost")
WORKDIR = ROOT / ".asv" / "gate-demo"
DECODE = "bench_decode.Decode.time_decode"
DECODE_COUNT = "bench_icount.InstructionCount.track_instructions('decode-262k')"
EXPECTED = {"slow": 1, "unchanged": 0, "slowdown": 1, "e2e": 1}

#: appended to the picked decoder's module: create() now returns a decoder that decodes twice
SLOWDOWN = """

# gate demo: a deliberate 2x slowdown, every body is decoded twice
_create_once = create


class _DecodesTwice:
    def __init__(self, decoder):
        self._decoder = decoder

    def __getattr__(self, name):
        return getattr(self._decoder, name)

    def decode(self, body, **options):
        self._decoder.decode(body, **options)
        return self._decoder.decode(body, **options)


def create(**options):
    return _DecodesTwice(_create_once(**options))
"""
UNCHANGED = "\n# gate demo: an unchanged commit (this comment is the whole change)\n"

#: appended for `--slowdown F`: each decode also decodes a body of (F - 1) x its tokens
PARTIAL_SLOWDOWN = """

# gate demo: a deliberate slowdown of ~{factor}x: after each body, a body of {fraction:.1%} of
# its generated tokens is decoded too (a re-scan of part of the body)
_create_once = create


class _RescansPart:
    def __init__(self, decoder):
        self._decoder = decoder
        self._extra = {{}}

    def __getattr__(self, name):
        return getattr(self._decoder, name)

    def decode(self, body, **options):
        result = self._decoder.decode(body, **options)
        extra = self._extra.get(len(body))
        if extra is None:
            from impl.workloads.synthetic import body_for

            tokens = sum(len(sequence.tokens) for sequence in result.sequences)
            extra = body_for(max(1, round(tokens * {fraction!r})), kind="vllm")
            self._extra[len(body)] = extra
        self._decoder.decode(extra)
        return result


def create(**options):
    return _RescansPart(_create_once(**options))
"""


def patch_for(case: str, slowdown: float | None = None) -> str:
    """The text appended to the picked decoder's module for `case` (for `e2e`, to the hot
    routes' module, `gate_demo_e2e.MODULE`; `slowdown` is then the end-to-end factor)."""
    if case == "e2e":
        return gate_demo_e2e.patch(slowdown)
    if case == "slowdown":
        if slowdown is None or slowdown <= 1:
            raise ValueError("the slowdown case needs a factor above 1 (--slowdown 1.08)")
        return PARTIAL_SLOWDOWN.format(factor=slowdown, fraction=slowdown - 1)
    return SLOWDOWN if case == "slow" else UNCHANGED


def decoder_module(name: str) -> str:
    """Path (relative to the repository) of the module that implements decoder `name`."""
    from impl import registry

    return registry.entry("decode", name).module.replace(".", "/") + ".py"


def snapshot(repo: Path) -> str:
    """Commit this working tree's files into `repo` (created if needed); the commit's hash."""
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        git("init", "-q", "-b", "main", cwd=repo)
    elif git("rev-list", "-n1", "--all", cwd=repo):
        git("checkout", "-q", "-f", "-B", "main", cwd=repo)
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT)
    files = {f for f in listed.split("\0") if f and (ROOT / f).is_file()}
    for stale in set(git("ls-files", "-z", cwd=repo).split("\0")) - files - {""}:
        (repo / stale).unlink(missing_ok=True)
    for name in files:
        source, target = ROOT / name, repo / name
        if not target.is_file() or target.read_bytes() != source.read_bytes():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    # Built extensions are ignored, never committed (asv builds its own), but the gate process
    # runs in `repo` and picks from its impl: without them it would gate another decoder than
    # the one patched (a pure-Python decoder instead of a compiled one).
    ignored = ("--others", "--ignored", "--exclude-standard", "impl/*.so")
    built = git("ls-files", "-z", *ignored, cwd=ROOT)
    for name in filter(None, built.split("\0")):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, repo / name)
    git("add", "-A", cwd=repo)
    if git("status", "--porcelain", cwd=repo) or not git("rev-list", "-n1", "--all", cwd=repo):
        message = "gate demo: snapshot of the working tree"
        git(*AS_DEMO, "commit", "-q", "--allow-empty", "-m", message, cwd=repo)
    return git("rev-parse", "HEAD", cwd=repo)


def case_commit(repo: Path, base: str, module: str, case: str, patch: str | None = None) -> str:
    """A commit on `base` appending `patch` (default: `case`'s) to `module` (branch `case`);
    `repo` is left at base."""
    path = repo / module
    path.write_text(path.read_text() + (patch or patch_for(case)))
    git(*AS_DEMO, "commit", "-q", "-am", f"gate demo: {case}", cwd=repo)
    commit = git("rev-parse", "HEAD", cwd=repo)
    git("branch", "-f", case, commit, cwd=repo)
    git("reset", "-q", "--hard", base, cwd=repo)
    return commit


def load_module(path: Path, name: str) -> Any:
    """Import the file at `path` as module `name` (its imports come from this interpreter)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def direct_ratio(
    repo: Path, picked: str, module: str, case: str = "slow", rounds: int = 7
) -> tuple[float, float]:
    """CPU time of the `case` commit's decoder over the unchanged one on the gated body, best
    of `rounds` (the two alternate); and the unchanged decoder's best seconds."""
    from impl import registry
    from impl.workloads.synthetic import body_for

    body = body_for(gate_timers.DECODE_TOKENS, kind=gate_timers.DECODE_BODY)
    slow_path = repo.parent / f"{case}_decoder.py"
    slow_path.write_text(git("show", f"{case}:{module}", cwd=repo) + "\n")

    fast = registry.create("decode", picked)
    slow = load_module(slow_path, f"_gate_demo_{case}").create()
    slow.decode(body)  # the slowdown case builds its extra body on the first call
    best = {"fast": float("inf"), "slow": float("inf")}
    for _ in range(rounds):
        for key, decoder in (("fast", fast), ("slow", slow)):
            start = time.process_time()
            decoder.decode(body)
            best[key] = min(best[key], time.process_time() - start)
    return best["slow"] / best["fast"], best["fast"]


#: one asv-like round in a fresh process: 5 samples of the gated decode by a fresh decoder (the
#: old benchmark) and by a warm one (the new), each timed by wall clock and CPU time at once
ROUND = """
import json, statistics, sys, time
from impl import registry
from impl.workloads.synthetic import body_for
name, tokens, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
body = body_for(tokens, kind=kind)
warm = registry.create("decode", name)
warm.decode(body)
times = {"fresh wall": [], "fresh cpu": [], "warm wall": [], "warm cpu": []}
for _ in range(5):
    for how in ("fresh", "warm"):
        decoder = registry.create("decode", name) if how == "fresh" else warm
        wall, cpu = time.perf_counter(), time.process_time()
        decoder.decode(body)
        times[how + " cpu"].append(time.process_time() - cpu)
        times[how + " wall"].append(time.perf_counter() - wall)
print(json.dumps({key: statistics.median(values) for key, values in times.items()}))
"""


def timers(processes: int) -> None:
    """Print how much the per-round median of the gated decode moves between fresh processes
    (asv's rounds) by wall clock and by CPU time, with a fresh and with a warm decoder."""
    picked = gate_timers.picked("decode")
    args = [picked, str(gate_timers.DECODE_TOKENS), gate_timers.DECODE_BODY]
    rounds = []
    for _ in range(processes):
        done = subprocess.run(
            [sys.executable, "-c", ROUND, *args], cwd=ROOT, capture_output=True, text=True
        )
        if done.returncode:
            raise SystemExit(done.stderr)
        rounds.append(json.loads(done.stdout))
    print(f"gate-demo: {processes} fresh processes, median of 5 decodes each ({picked}, 20 MB)")
    print("| timer, decoder | per-process medians (ms) | max / min |")
    print("|---|---|---|")
    for key in rounds[0]:
        values = sorted(r[key] * 1e3 for r in rounds)
        shown = ", ".join(f"{v:.0f}" for v in values)
        print(f"| {key} | {shown} | {values[-1] / values[0]:.2f} |")


def run_gate(
    repo: Path, base: str, head: str, log: Path, summary: Path, options: list[str], cache: str
) -> tuple[int, float]:
    """The real gate in `repo` (its own code and asv files) with `options` (e.g. --only decode)
    and the instruction-count cache `cache` ("" for none); exit status and wall seconds."""
    command = [sys.executable, "-m", "impl.ci.gate", "--base", base, "--head", head, *options]
    # `-m` puts the cwd (the throwaway repository) first on sys.path: its impl, its asv files
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["HOTPATH_ICOUNT_CACHE"] = cache
    start = time.monotonic()
    with log.open("w") as out:
        status = subprocess.run(
            [*command, "--json", str(summary)], cwd=repo, env=env, stdout=out, stderr=out
        ).returncode
    return status, time.monotonic() - start


def e2e_calibrated(repo: Path, base: str, factor: float, logs: Path) -> str:
    """The e2e case's commit, its delay set so that it measures `factor` end to end here
    (`gate_demo_e2e.calibrate`); each measurement printed."""
    module = gate_demo_e2e.MODULE

    def commit(extra: float) -> str:
        return case_commit(repo, base, module, "e2e", gate_demo_e2e.patch(factor, extra))

    count = iter(range(1, 100))

    def measure(commit: str) -> tuple[float, float]:
        path = logs / f"achieved-{next(count)}.json"
        print(f"gate-demo: measuring the e2e commit's slowdown end to end ({path})", flush=True)
        return gate_demo_e2e.achieved(repo, base, commit, path)

    made, _, steps = gate_demo_e2e.calibrate(factor, commit, measure)
    for extra, latency, rate in steps:
        share = (latency - 1) / extra if extra else 0.0
        print(
            f"gate-demo: achieved with a delay of {extra:.3f}x the time in the server: p50 "
            f"{latency:.2f}x, results/s {rate:.2f}x (the delay scales {share:.0%} of a sample's "
            f"latency; asked {factor}x)",
            flush=True,
        )
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m impl.ci.gate_demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=2, help="gate runs per case (default 2)")
    parser.add_argument(
        "--cases",
        help="comma-separated cases to run, of: slow (2x), unchanged, slowdown (needs "
        "--slowdown; default: slow, unchanged, and slowdown when --slowdown is given)",
    )
    parser.add_argument(
        "--slowdown",
        type=float,
        metavar="F",
        help="also run a commit whose decoder does (F - 1) more work per body, e.g. 1.08",
    )
    parser.add_argument(
        "--e2e-slowdown",
        type=float,
        metavar="F",
        help="instead: the end-to-end stage (gate --only e2e) on a commit whose server makes "
        "each sample's path F times as long (a sleep before a result is delivered), e.g. 1.5, "
        "and on an unchanged commit",
    )
    parser.add_argument("--workdir", type=Path, default=WORKDIR, help="default .asv/gate-demo")
    parser.add_argument(
        "--all-benchmarks",
        action="store_true",
        help="gate the whole gate subset (as make gate does), not only the decode family",
    )
    parser.add_argument(
        "--no-icount-cache",
        action="store_true",
        help="count instructions afresh in every gate run (default: reuse a count of the same "
        "code and environment, under WORKDIR/icount-cache)",
    )
    parser.add_argument(
        "--timers",
        type=int,
        metavar="N",
        help="instead: time the gated decode in N fresh processes by wall clock and CPU time",
    )
    args = parser.parse_args(argv)
    if args.timers:
        timers(args.timers)
        return 0
    default = "slow,unchanged" + (",slowdown" if args.slowdown else "")
    if args.e2e_slowdown:
        default = "e2e,unchanged"
    cases = [c for c in (args.cases or default).split(",") if c]
    if args.e2e_slowdown and set(cases) - {"e2e", "unchanged"}:
        parser.error("--e2e-slowdown runs the cases e2e and unchanged only")
    if "e2e" in cases and not (args.e2e_slowdown and args.e2e_slowdown > 1):
        parser.error("the e2e case needs --e2e-slowdown F with F above 1 (e.g. 1.5)")
    if not cases or set(cases) - set(EXPECTED):
        parser.error(f"--cases: choose from {', '.join(EXPECTED)}")
    if "slowdown" in cases and not (args.slowdown and args.slowdown > 1):
        parser.error("the slowdown case needs --slowdown F with F above 1 (e.g. 1.08)")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    repo, logs = args.workdir.resolve() / "repo", args.workdir.resolve() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if repo == ROOT or repo in ROOT.parents:
        parser.error("--workdir must not hold this repository")

    options = [] if args.all_benchmarks else ["--only", "e2e" if args.e2e_slowdown else "decode"]
    options += ["--reference", "none"]  # the throwaway repository has the snapshot only
    cache = "" if args.no_icount_cache else str(args.workdir.resolve() / "icount-cache")
    picked = gate_timers.picked("decode")
    module = decoder_module(picked)
    base = snapshot(repo)
    there = subprocess.run(
        [sys.executable, "-c", "from impl.ci import gate_timers as g; print(g.picked('decode'))"],
        cwd=repo, capture_output=True, text=True,
    )  # fmt: skip
    if there.stdout.strip() != picked:
        raise SystemExit(
            f"gate-demo: the gate in {repo} would pick decoder {there.stdout.strip() or '?'}, "
            f"not {picked}, so it would not gate the patched one\n{there.stderr[-2000:]}"
        )
    made = sorted(set(cases) | ({"unchanged"} if args.e2e_slowdown else {"slow", "unchanged"}))
    commits = {
        c: case_commit(
            repo,
            base,
            gate_demo_e2e.MODULE if c == "e2e" else module,
            c,
            patch_for(c, args.e2e_slowdown if c == "e2e" else args.slowdown),
        )
        for c in made
    }
    if "e2e" in commits:  # the delay that makes the commit F times slower end to end here
        commits["e2e"] = e2e_calibrated(repo, base, args.e2e_slowdown, logs)
    print(f"gate-demo: repository {repo}, base {base[:8]} (snapshot of {ROOT})")
    shown = ", ".join(f"{case} {commit[:8]}" for case, commit in commits.items())
    print(f"gate-demo: picked decoder {picked} ({module}); commits {shown}")
    gated = "the whole gate subset" if args.all_benchmarks else f"--only {options[1]}"
    reuse = "counted afresh" if not cache else f"cached in {cache}"
    print(f"gate-demo: each gate run gates {gated}; instruction counts {reuse}")
    for case in [c for c in made if c not in ("unchanged", "e2e")]:
        ratio, seconds = direct_ratio(repo, picked, module, case)
        print(
            f"gate-demo: timed directly (CPU, best of 7): the {case} commit's decoder takes "
            f"{ratio:.2f}x the unchanged one's {seconds * 1e3:.1f} ms on the gated body"
        )
    rows = []
    for run in range(1, args.runs + 1):
        for case in cases:
            log = logs / f"{case}-{run}.log"
            summary = logs / f"{case}-{run}.json"
            summary.unlink(missing_ok=True)
            print(f"gate-demo: run {run}, {case}: gate running (log {log})", flush=True)
            status, wall = run_gate(repo, base, commits[case], log, summary, options, cache)
            written = json.loads(summary.read_text()) if summary.exists() else {}
            values = written.get("benchmarks", {})
            decode = values.get(DECODE, {})
            counted = written.get("instruction_counts", {}).get(DECODE_COUNT, {})
            others = [
                (row["ratio"], name.split(".")[-1])
                for name, row in values.items()
                if name != DECODE and row["ratio"] is not None
            ]
            correct = status == EXPECTED[case]
            decode = {**decode, "instructions": counted.get("ratio")}
            rows.append((run, case, EXPECTED[case], status, decode, max(others, default=None)))
            rows[-1] += (correct, wall, gate_demo_e2e.measured(written))
            print(f"gate-demo: run {run}, {case}: exit {status}, {wall:.0f} s", flush=True)
    print()
    print(
        "| run | case | expected exit | gate exit | decode ratio | decode instructions "
        "| largest other ratio | end to end (HEAD/base) | verdict correct | wall |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for run, case, expected, status, decode, other, correct, wall, e2e in rows:
        decode_text = "n/a"
        if decode.get("ratio") is not None:
            ms = f"{decode['base'] * 1e3:.0f} -> {decode['head'] * 1e3:.0f} ms"
            decode_text = f"{decode['ratio']:.2f}x ({ms})"
        other_text = "n/a" if other is None else f"{other[0]:.2f}x ({other[1]})"
        counted = decode.get("instructions")
        counted_text = "n/a" if counted is None else f"{counted:.4f}x"
        print(
            f"| {run} | {case} | {expected} | {status} | {decode_text} | {counted_text} "
            f"| {other_text} | {e2e} "
            f"| {'yes' if correct else 'NO'} | {wall / 60:.1f} min |"
        )
    wrong = sum(not row[6] for row in rows)
    print(f"\ngate-demo: {len(rows) - wrong} of {len(rows)} verdicts correct")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
