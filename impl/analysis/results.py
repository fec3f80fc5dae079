"""`make results`: refresh the committed results sample, the figures and the README's tables.

One command, three steps, all from the same runs:

1. `hotpath bench` twice, writing the sample under `--data` (default notebooks/data/):
   `bench-families.json` (decode, encode, pool, accesslog) and `bench-endtoend.json` (end to
   end). `--no-record`: the server's recorded picks stay as they were.
2. The notebooks rerun on that sample and rewrite `--figures` (default notebooks/figures/);
   every figure's footer names the commit, CPU and date of the run it plots.
3. The history figure (`impl.analysis.history`) is redrawn from the committed asv history
   (benchmarks/results/), unless `--only` or `--notebooks` asks for a part; nothing of it is
   measured here.
4. Each README table between `<!-- results:FAMILY -->` and `<!-- /results:FAMILY -->` is
   rewritten from the same sample, under a line naming the commit, the date, the command and
   the load average when the results were written.

Run it on a quiet machine (the figures are only as good as the load allows): `make results`
runs the default `hotpath bench`, `make results ARGS=--full` the long one. `--from-sample`
skips step 1 and redraws figures and tables from the sample already there; `--quick`,
`--only SECTION` and `--notebooks NAME` make the small runs the tests use.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from impl import registry
from impl.measure import format_seconds

ROOT = Path(__file__).resolve().parents[2]
#: the committed results sample
SAMPLE = ROOT / "notebooks" / "data"
#: sample file -> the `hotpath bench` sections it holds
SAMPLE_FILES: dict[str, tuple[str, ...]] = {
    "bench-families.json": registry.families(),
    "bench-endtoend.json": ("endtoend",),
}
_REGION = re.compile(r"(<!-- results:(\w+) -->\n).*?(<!-- /results:\2 -->)", re.S)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    length = parser.add_mutually_exclusive_group()
    length.add_argument(
        "--quick", action="store_true", help="`hotpath bench --quick` (a smoke run)"
    )
    length.add_argument("--full", action="store_true", help="`hotpath bench --full` (the long run)")
    parser.add_argument(
        "--from-sample",
        action="store_true",
        help="run no benchmark: redraw figures and tables from the sample already in --data",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="SECTION",
        choices=[name for names in SAMPLE_FILES.values() for name in names],
        help="measure only this section (repeatable); its sample file then holds only the "
        "sections named, so this needs a --data other than the committed sample",
    )
    parser.add_argument(
        "--notebooks",
        action="append",
        metavar="NAME",
        help="rerun only notebooks/NAME.ipynb (repeatable; default: every notebook)",
    )
    parser.add_argument("--data", type=Path, default=SAMPLE, help="sample directory (%(default)s)")
    parser.add_argument(
        "--figures", type=Path, default=ROOT / "notebooks" / "figures", help="(%(default)s)"
    )
    parser.add_argument(
        "--readme", type=Path, default=ROOT / "README.md", help="tables to rewrite (%(default)s)"
    )


def bench_commands(args: argparse.Namespace) -> list[tuple[list[str], Path]]:
    """The `hotpath bench` runs of step 1: (command, sample file it writes)."""
    length = ["--quick"] if args.quick else ["--full"] if args.full else []
    out = []
    for file_name, sections in SAMPLE_FILES.items():
        chosen = [name for name in sections if not args.only or name in args.only]
        if chosen:
            only = [flag for name in chosen for flag in ("--only", name)]
            path = args.data / file_name
            command = [sys.executable, "-m", "impl.cli", "bench", *length, *only]
            out.append(([*command, "--no-record", "--json", str(path)], path))
    return out


def refresh(args: argparse.Namespace) -> list[str]:
    """Steps 1-3; the README regions rewritten."""
    if args.only and not args.from_sample and args.data.resolve() == SAMPLE.resolve():
        raise SystemExit(
            "--only would leave the committed sample without the other sections; "
            "pass --data DIR for a partial run"
        )
    if not args.from_sample:
        args.data.mkdir(parents=True, exist_ok=True)
        for command, path in bench_commands(args):
            print(f"$ hotpath {' '.join(command[3:])}", file=sys.stderr, flush=True)
            subprocess.run(command, cwd=ROOT, check=True)
            if json.loads(path.read_text()).get("errors"):
                raise RuntimeError(f"a section failed; see {path} (the README is left alone)")
    os.environ.update(
        HOTPATH_RESULTS=str(args.data), HOTPATH_FIGURES=str(args.figures), MPLBACKEND="Agg"
    )
    from impl import analysis

    notebooks = [ROOT / "notebooks" / f"{name}.ipynb" for name in args.notebooks or ()]
    analysis.execute_notebooks(notebooks or None)
    return rewrite_readme(args.readme, analysis.load_results(args.data))


def rewrite_readme(readme: Path, results: dict[str, Any]) -> list[str]:
    """Replace every `results:FAMILY` region of `readme` that the results hold a section for."""
    done: list[str] = []

    def replace(match: re.Match[str]) -> str:
        family = match.group(2)
        table = markdown_table(results, family)
        if table is None:
            return match.group(0)
        done.append(family)
        return f"{match.group(1)}{table}\n{match.group(3)}"

    readme.write_text(_REGION.sub(replace, readme.read_text()))
    return done


def stamp(results: dict[str, Any], family: str) -> str:
    """The line under which a generated table stands: which run, when, how loaded."""
    from impl.analysis import section

    sec = section(results, family) or {}
    env = sec.get("environment", {})
    mode = " --quick" if sec.get("quick") else " --full" if sec.get("full") else ""
    load = env.get("load_average")
    loaded = f", load average {load[0]:.2f}" if load else ""
    return (
        f"_Measured by `hotpath bench{mode} --only {family}` at commit `{env.get('git_sha')}` "
        f"on {str(env.get('time', ''))[:10]} ({env.get('cpus')} × {env.get('cpu')}{loaded}); "
        f"`make results` regenerates this table, the sample and the figures._"
    )


def _grid(rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    lines.insert(1, "|" + "---|" * len(rows[0]))
    return "\n".join(lines)


def _columns(data: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["implementation"] for r in data))


def _time(row: dict[str, Any] | None, key: str = "seconds") -> str:
    if row is None or row.get(key) is None:
        return "–"
    return ("✗ " if row.get("parity") is False else "") + format_seconds(row[key])


def _decode(rows: list[dict[str, Any]]) -> list[list[object]]:
    data = [r for r in rows if r.get("seconds") is not None and r.get("tokens")]
    names = _columns(data)
    out: list[list[object]] = [["body", *names]]
    for key in dict.fromkeys((r["input"], r["size_bytes"]) for r in data):
        cells = {r["implementation"]: r for r in data if r["input"] == key[0]}
        row, size = next(iter(cells.values())), key[1]
        shown = f"{size / 1e3:.0f} KB" if size < 1e6 else f"{size / 1e6:.1f} MB"
        body = row["body"] + (f" ({row['render']})" if row.get("render", "json") != "json" else "")
        label = f"{body}, {row['tokens']} tokens ({shown})"
        out.append([label, *(_time(cells.get(name)) for name in names)])
    memory = {r["implementation"]: r for r in rows if r.get("peak_memory_bytes")}
    if memory:
        label = f"peak memory, {next(iter(memory.values()))['input']}"
        cells = [memory.get(name, {}).get("peak_memory_bytes") for name in names]
        out.append([label, *("–" if b is None else f"{b / 1e6:.0f} MB" for b in cells)])
    return out


def _encode(rows: list[dict[str, Any]]) -> list[list[object]]:
    encode = [r for r in rows if r.get("table") == "encode"]
    json_rows = [r for r in rows if r.get("table") == "json"]
    names, json_names = _columns(encode), _columns(json_rows)
    out: list[list[object]] = [["tokens", *names, "bytes", *(f"JSON: {n}" for n in json_names)]]
    for tokens in dict.fromkeys(r["tokens"] for r in encode):
        at = {r["implementation"]: r for r in encode if r["tokens"] == tokens}
        js = {r["implementation"]: r for r in json_rows if r["tokens"] == tokens}
        size = next(iter(at.values()))["size_bytes"]
        times = [_time(at.get(n)) for n in names] + [_time(js.get(n)) for n in json_names]
        out.append([tokens, *times[: len(names)], size, *times[len(names) :]])
    return out


def _pool(rows: list[dict[str, Any]]) -> list[list[object]]:
    counts = sorted({r["in_flight"] for r in rows if r.get("in_flight")})
    out: list[list[object]] = [["implementation (ms CPU per request)", *counts]]
    for name in _columns(rows):
        at = {r["in_flight"]: r for r in rows if r["implementation"] == name}
        cells = []
        for n in counts:
            value = (at.get(n) or {}).get("cpu_ms_per_request")
            bad = "! " if (at.get(n) or {}).get("ok") is False else ""
            cells.append("–" if value is None else f"{bad}{value:.3f}")
        out.append([name, *cells])
    return out


def _accesslog(rows: list[dict[str, Any]]) -> list[list[object]]:
    out: list[list[object]] = [
        ["handler", "handler alone", "whole `logger.info`", "listener thread", "uvicorn loop"]
    ]
    for r in rows:
        listener = f"{r['listener_us']:.2f} µs" if r.get("listener_us") else "–"
        loop = f"{r['server_loop_us']:.1f} µs/req" if r.get("server_loop_us") else "–"
        handle, info = f"{r['handle_us']:.2f} µs", f"{r['info_us']:.2f} µs"
        out.append([r["implementation"], handle, info, listener, loop])
    return out


def _endtoend(rows: list[dict[str, Any]]) -> list[list[object]]:
    out: list[list[object]] = [
        ["scenario", "picked vs", "their results/s", "picked results/s", "ratio"]
    ]
    for r in rows:
        versus = "baseline" if "baseline" in r else "inline"  # the off-loop row: inline decoding
        before = r[versus].get("results_per_second")
        after = r["picked"].get("results_per_second")
        ratio = f"{after / before:.1f}×" if before and after else "–"
        label = f"{r['scenario']} ({r['samples']} × {r['max_tokens']} tokens)"
        out.append([label, versus, f"{before or 0:,.1f}", f"{after or 0:,.1f}", ratio])
    return out


#: family -> its README table from the section's rows
TABLES: dict[str, Callable[[list[dict[str, Any]]], list[list[object]]]] = {
    "decode": _decode,
    "encode": _encode,
    "pool": _pool,
    "accesslog": _accesslog,
    "endtoend": _endtoend,
}


def markdown_table(results: dict[str, Any], family: str) -> str | None:
    """`family`'s README table and its stamp, or None when the results hold no such section."""
    from impl.analysis import section

    sec = section(results, family)
    if sec is None or family not in TABLES or not sec.get("rows"):
        return None
    return f"{stamp(results, family)}\n\n{_grid(TABLES[family](sec['rows']))}"


def run(args: argparse.Namespace) -> int:
    done = refresh(args)
    if not (args.only or args.notebooks):  # a whole run: the committed asv history too
        from impl.analysis import history

        history.main(["--out", str(args.figures / "history.png")])
    print(f"sample: {args.data}\nfigures: {args.figures}\nREADME tables: {', '.join(done)}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m impl.analysis.results",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
