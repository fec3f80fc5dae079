"""The gate's timer stage: asv's `time_` and `track_` benchmarks of both commits, compared.

`impl.ci.gate` runs `asv run --interleave-rounds` of the gated subset (`gated`) on both
commits (`run_rounds`), then this stage compares asv's stored results (`gated_results`), row
by row (`rows`): a benchmark is worse when HEAD's median is beyond the factor and, for a
`time_` benchmark (one with asv's statistics), the two sample sets differ
(`impl.ci.significance`); a benchmark that ran on the base and fails on HEAD broke; one whose
benchmark version differs between the commits, or that either commit could not run, is not
compared. `Timers` is the stage's `impl.ci.stage.Stage`; what confirms a slowdown before it
fails (more rounds, the commits in the other order) is `impl.ci.gate`'s.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from impl.ci import repo, significance
from impl.ci.stage import Row, Verdict, is_accepted, print_table
from impl.measure import LARGEST_TOKENS

#: the fixed asv machine name of automated runs (results of different names never mix)
MACHINE = "hotpath-ci"
FACTOR = 1.5
#: interleaved rounds of each time_ benchmark per commit (asv's default is 2)
ROUNDS = 4
#: the input each family is gated on (asv param values as asv prints them)
DECODE_TOKENS, DECODE_BODY = LARGEST_TOKENS, "vllm"  # a realistic logprobs=1 body
ENCODE_TOKENS = LARGEST_TOKENS
POOL_IN_FLIGHT = 1024

Benchmarks = list[tuple[str, tuple[Any, ...] | None]]


def picked(family: str) -> str:
    """The implementation the server would pick here without calibrating (see impl.pick)."""
    from impl import pick

    return pick.pick(family).name


def gated(picks: dict[str, str]) -> Benchmarks:
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


def asv(*args: str) -> list[str]:
    return [sys.executable, "-m", "asv", *args, "--config", str(repo.ROOT / "asv.conf.json")]


def asv_config() -> Any:
    """asv.conf.json, its directories made absolute (asv takes them relative to the cwd)."""
    from asv.config import Config

    conf = Config.load(str(repo.ROOT / "asv.conf.json"))
    for attr in ("results_dir", "html_dir", "env_dir", "benchmark_dir"):
        setattr(conf, attr, str(repo.ROOT / getattr(conf, attr)))
    return conf


def gated_results(commit: str, benchmarks: Benchmarks) -> Iterator[tuple[Any, ...]]:
    """asv result rows of `commit` on MACHINE, cut down to the gated parameter combinations.

    Each row: (name, params, values, stats, samples, version, machine, env), each with one
    parameter combination (the layout of asv's result iterators).
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


def measured(rows: list[tuple[Any, ...]]) -> set[str]:
    """Names of the rows that hold a number (not failed, not n/a)."""
    return {row[0] for row in rows if row[2][0] is not None and row[2][0] == row[2][0]}


def ratios(base: str, head: str, benchmarks: Benchmarks) -> dict[str, dict[str, Any]]:
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


def verdict(b: tuple[Any, ...] | None, h: tuple[Any, ...] | None, factor: float) -> Verdict:
    """The verdict of one benchmark from its stored rows on base (`b`) and HEAD (`h`)."""
    if b is not None and h is not None and None not in (b[5], h[5]) and b[5] != h[5]:
        return Verdict.NOT_COMPARED  # the benchmark itself changed: not comparable
    base = b[2][0] if b is not None else float("nan")
    head = h[2][0] if h is not None else float("nan")
    if base is not None and head is None:
        return Verdict.BROKE
    if base is None or head is None or base != base or head != head:
        return Verdict.NOT_COMPARED  # one side failed, or was skipped
    ss_base = (b[3][0], b[4][0]) if b is not None else (None, None)
    ss_head = (h[3][0], h[4][0]) if h is not None else (None, None)
    if significance.better(head, base, ss_head[0], ss_base[0], ss_head[1], ss_base[1], factor):
        return Verdict.BETTER
    if significance.better(base, head, ss_base[0], ss_head[0], ss_base[1], ss_head[1], factor):
        return Verdict.WORSE
    beyond = significance.better(base, head, None, None, None, None, factor)
    if beyond or significance.better(head, base, None, None, None, None, factor):
        return Verdict.NOISE  # beyond the factor, but the samples do not differ
    return Verdict.PASS


def _units() -> dict[str, str | None]:
    """Each benchmark's unit, from asv's benchmark list (empty when there is none yet)."""
    from asv.benchmarks import Benchmarks as Listed

    try:
        return {name: info.get("unit") for name, info in Listed.load(asv_config()).items()}
    except Exception:  # asv raises when the suite was never discovered
        return {}


def _cell(row: tuple[Any, ...] | None, unit: str | None) -> str:
    """A stored result as asv prints it: its median in its unit, ± half its interquartile range."""
    from asv.util import human_value

    if row is None:
        return "n/a"
    value, stats = row[2][0], row[3][0]
    err = (stats["q_75"] - stats["q_25"]) / 2 if stats and "q_25" in stats else None
    return human_value(value, unit, err=err)


def rows(
    base: str,
    head: str,
    benchmarks: Benchmarks,
    factor: float,
    accepts: Callable[[str], bool] = lambda name: False,
) -> list[Row]:
    """One row per gated benchmark stored on either commit; a worse one that `accepts`
    (a `Gate-accept:` line names it) is accepted."""
    stored = [{row[0]: row for row in gated_results(c, benchmarks)} for c in (base, head)]
    units = _units()
    out = []
    for name in sorted(stored[0].keys() | stored[1].keys()):
        b, h = stored[0].get(name), stored[1].get(name)
        found = verdict(b, h, factor)
        if found is Verdict.WORSE and accepts(name):
            found = Verdict.ACCEPTED
        values = [row[2][0] if row is not None else None for row in (b, h)]
        cells = (_cell(b, units.get(name)), _cell(h, units.get(name)))
        ratio = values[1] / values[0] if None not in values and values[0] else None
        out.append(Row(name, values[0], values[1], ratio, found, cells))
    return out


class Timers:
    """The timer stage of BASE and HEAD (`impl.ci.stage.Stage`): `measure` runs `benchmarks`'
    `time_` ones in ROUNDS interleaved rounds and the `track_` ones once; `compare` prints
    and returns the rows."""

    def __init__(
        self,
        base: str,
        head: str,
        benchmarks: Benchmarks,
        factor: float,
        hashes: Path,
        accepted: list[str] | None = None,
    ) -> None:
        self.base, self.head, self.benchmarks, self.factor = base, head, benchmarks, factor
        self.hashes, self.accepted = hashes, accepted or []
        self.title = f"benchmarks of {base[:8]} (base) and {head[:8]} (HEAD), factor {factor}"
        self.timed = [regex(n, p) for n, p in benchmarks if ".time_" in n]
        self.tracked = [regex(n, p) for n, p in benchmarks if ".time_" not in n]

    def measure(self) -> bool:
        """The first run of every benchmark; False when asv itself failed."""
        stages = [(self.timed, ["-a", f"rounds={ROUNDS}"]), (self.tracked, [])]
        return all(run_rounds(p, e, self.hashes) for p, e in stages if p)

    def compare(self) -> list[Row]:
        params = dict(self.benchmarks)
        found = rows(
            self.base,
            self.head,
            self.benchmarks,
            self.factor,
            lambda name: is_accepted(name, params.get(name), self.accepted),
        )
        if found:
            print_table(self.title, found)
        return found

    def measured(self) -> tuple[set[str], set[str]]:
        """Names of the benchmarks measured on the base and on HEAD."""
        return tuple(  # type: ignore[return-value]
            measured(list(gated_results(c, self.benchmarks))) for c in (self.base, self.head)
        )


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
    status = subprocess.run(command, cwd=repo.ROOT).returncode
    if status not in (0, 2):  # 2: some benchmark failed, read from the results below
        print(f"gate: ERROR - asv run exited {status} (build or discovery failed, above)")
        return False
    return True
