"""`make profiles`: record every committed profile again at HEAD and stamp profiles/README.md.

Each entry of `PROFILES` is one `hotpath profile` command; they run one after another (a
profile recorded beside another run measures the other run too). Then the block between the
`RECORDED` markers of profiles/README.md is written again: for each profile its files, the
command that recorded it, the commit, date, machine and load average it was recorded at, and
its top frames by self share (`hotpath profile summarize`). Profiles of implementations that
are no longer recorded are deleted, so the folder holds only what the table lists.

`python profiles/record.py --only server` records the entries whose arguments start with
`server`; `--stamp-only` rewrites the block from the files as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from impl.profile import render_summary, summarize

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"
BEGIN = "<!-- RECORDED: written by `make profiles`; edit profiles/record.py, not this block -->"
END = "<!-- /RECORDED -->"

#: (family or `server`, arguments after `hotpath profile`): the reference, the picked
#: implementation and the one the `--baseline` server runs, per family; the server under the
#: small-result, long-output and long-queue scenarios, baseline and picked.
PROFILES: tuple[tuple[str, ...], ...] = (
    ("decode", "json", "--native"),
    ("decode", "simdjson", "--native"),
    ("decode", "picked", "--native"),
    ("encode", "validated", "--native"),
    ("encode", "protobuf", "--native"),
    ("encode", "picked", "--native"),
    ("pool", "httpx"),
    ("pool", "picked"),
    ("accesslog", "rich"),
    ("accesslog", "picked"),
    ("server", "--preset", "small-2048", "--baseline"),
    ("server", "--preset", "small-2048"),
    # the baseline decodes each 20 MB body with json: 64 of them show where its time goes
    ("server", "--preset", "long-512x262k", "--baseline", "--num-requests", "64"),
    ("server", "--preset", "long-512x262k"),
    # the headline preset scaled to 1024 results: the same bodies, engine and budget, minutes
    # instead of most of an hour
    ("server", "--preset", "long-queue-8192x212k", "--num-requests", "1024"),
)


def record(entries: tuple[tuple[str, ...], ...]) -> list[str]:
    """Run each entry's `hotpath profile` in turn; the commands that failed."""
    failed = []
    for entry in entries:
        command = [sys.executable, "-m", "impl.cli", "profile", *entry]  # into profiles/
        print(f"== hotpath profile {' '.join(entry)}", file=sys.stderr, flush=True)
        if subprocess.run(command, cwd=HERE.parent, check=False).returncode != 0:
            failed.append(" ".join(entry))
    return failed


def _recorded() -> list[tuple[Path, dict]]:
    """Each speedscope file here with its `hotpath` annotation, by name."""
    found = []
    for path in sorted(HERE.glob("*.speedscope.json")):
        facts = json.loads(path.read_text()).get("hotpath") or {}
        found.append((path, facts))
    return found


def block() -> str:
    """The RECORDED block: one section per profile, from the files' own annotations (the
    commits named are those the profiles were recorded at, not the one stamping them)."""
    recorded = _recorded()
    commits = sorted({(f.get("environment") or {}).get("git_sha") or "?" for _, f in recorded})
    at = ", ".join(f"`{c}`" for c in commits)
    lines = [BEGIN, "", f"Recorded by `make profiles` at {at}.", ""]
    for path, facts in recorded:
        name = path.name.removesuffix(".speedscope.json")
        env = facts.get("environment") or {}
        lines += [f"### {name}", ""]
        lines.append(f"[`{path.name}`]({path.name}) · [`{name}.svg`]({name}.svg)")
        lines.append("")
        lines.append("```")
        lines.append(facts.get("command") or f"hotpath profile {facts.get('target', '?')}")
        lines.append("```")
        lines.append("")
        described = ", ".join(
            str(part)
            for part in (
                f"input: {facts.get('input')}" if facts.get("input") else None,
                f"commit {env.get('git_sha', '?')[:7]}",
                env.get("time"),
                env.get("cpu"),
                f"load average {env.get('load_average')}" if env.get("load_average") else None,
            )
            if part
        )
        lines += [described, "", render_summary(summarize(path), 8), ""]
    lines.append(END)
    return "\n".join(lines)


def stamp() -> None:
    """Write the RECORDED block into README.md (appended if the markers are missing)."""
    text = README.read_text()
    new = block()
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    text = pattern.sub(lambda _: new, text) if pattern.search(text) else text + "\n" + new + "\n"
    README.write_text(text)


def prune(kept: set[str]) -> None:
    """Delete the profiles this list no longer records (`kept`: prefixes written this run)."""
    for path in HERE.glob("*.speedscope.json"):
        name = path.name.removesuffix(".speedscope.json")
        if name not in kept:
            path.unlink()
            (HERE / f"{name}.svg").unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make profiles", description=__doc__)
    parser.add_argument("--only", help="record only the entries whose arguments start so")
    parser.add_argument("--stamp-only", action="store_true", help="rewrite the README block")
    args = parser.parse_args(argv)
    entries = tuple(e for e in PROFILES if not args.only or " ".join(e).startswith(args.only))
    failed: list[str] = []
    if not args.stamp_only:
        before = {p: p.stat().st_mtime for p in HERE.glob("*.speedscope.json")}
        failed = record(entries)
        if not args.only and not failed:
            written = {
                p.name.removesuffix(".speedscope.json")
                for p in HERE.glob("*.speedscope.json")
                if before.get(p) != p.stat().st_mtime
            }
            prune(written)
    stamp()
    for entry in failed:
        print(f"FAILED hotpath profile {entry}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
