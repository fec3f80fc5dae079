"""The documentation a clone needs is in the clone: no pointer outside it, no dead link."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: names of documents that live outside the repository, and a path out of it
OUTSIDE = re.compile(r"DESIGN\.md|STYLE\.md|VLLM_BODY|TINKER_SDK|\.\./shared")
#: a Markdown link or image target that is a relative path
LINK = re.compile(r"\]\(((?!https?://|#)[^)\s#]+)(#[^)\s]*)?\)")


def _tracked() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (the file list comes from git ls-files)")
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def test_nothing_points_outside_the_repository():
    """Code, docstrings, --help texts and docs cite docs/, not documents a clone lacks."""
    this = Path(__file__).resolve()
    found = []
    for path in _tracked():
        if path == this or path.suffix not in {".py", ".md", ".proto", ".toml", ".ipynb", ""}:
            continue
        text = path.read_text(errors="replace")
        found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in OUTSIDE.finditer(text)]
    assert not found, found


#: every Markdown page a reader follows links from (top-level folders' READMEs included, not
#: those that tools write into hidden folders such as .pytest_cache)
PAGES = sorted(
    {ROOT / "README.md", ROOT / "CHANGELOG.md", *ROOT.glob("docs/*.md")}
    | {p for p in ROOT.glob("*/README.md") if not p.parent.name.startswith(".")}
)


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lowercased, punctuation dropped, spaces -."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("doc", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path):
    """Every relative link names a file that exists, and a `#section` in a .md file it has."""
    links = [(m.group(1), m.group(2)) for m in LINK.finditer(doc.read_text())]
    missing = [t for t, _ in links if not (doc.parent / t).exists()]
    assert not missing, missing
    dead = [
        f"{t}{anchor}"
        for t, anchor in links
        if anchor and t.endswith(".md") and anchor[1:] not in _anchors(doc.parent / t)
    ]
    assert not dead, dead


def test_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages and all(f"({page})" in index for page in pages)


# -- reference apart from history ------------------------------------------------------------
#
# The README, docs/ pages, docstrings and `--help` say what is true now. Measured figures live
# once, dated, in docs/measurements.md (the ledger); what was tried and left out, with its
# figures, in docs/experiments.md; the CHANGELOG is releases. CONTRIBUTING.md says where each
# thing goes. The checks below hold those lines where a regular expression can.

#: a reference to an issue tracker the clone does not have: "issue 30", "issues 13, 15",
#: "issue-28", "#41" (not a link's `#2026-12-01-...` anchor). Checked everywhere a reader of
#: the clone reads: the pages, impl/ and benchmarks/ (code, docstrings, --help texts), the
#: ledger, the experiments and the CHANGELOG too (they cite commits, which the clone has,
#: never issue numbers).
ISSUE = re.compile(r"\bissues?[ -]#?\d+|(?<![\w&/#(])#\d+\b(?!-)", re.I)


def _issue_sources() -> list[Path]:
    pages = {p for p in PAGES} | {ROOT / "CONTRIBUTING.md"}
    code = {
        p
        for p in _tracked()
        if p.suffix == ".py" and p.parts[len(ROOT.parts)] in {"impl", "benchmarks"}
    }
    return sorted(p for p in pages | code if p.exists())


def test_no_issue_numbers():
    """No "issue N" or "#N" in the pages, the code's docstrings and comments, or the ledger."""
    found = [
        f"{path.relative_to(ROOT)}:{n}: {m.group(0)}"
        for path in _issue_sources()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        for m in ISSUE.finditer(line)
    ]
    assert not found, found


#: A *measured figure* is a quantity whose shape says it was measured, not set:
#:  - a ratio or a share: a number followed by × or x ("26.0×", "0.8x"; not "128 x 262k", a
#:    dimension, nor "16 × it", a multiple of a setting) or %;
#:  - a rate: a number followed by a unit per second (GB/s, results/s, req/s, /s);
#:  - a time below a millisecond (µs, ns: nothing here is configured in those);
#:  - a load average ("load 0.9", "load average 6.5");
#:  - a range of a quantity ("58-63 ms", "40–160 ms", "1.0 to 1.9 s");
#:  - an approximate quantity ("~2 ms", "≈ 20 MB", "about 5 minutes");
#:  - a before/after ("71.6 s -> 2.7 s", "349 → 120 MB");
#:  - a quantity something took, cost or waited ("took 349 s", "costs 55 ms", "peaked at
#:    200 MB", "waited up to 1.9 s").
#: A plain quantity passes: "every 0.2 s", "45 s timeouts", "default 8000", "128 MiB" are
#: settings, and a page may state them; so does a ratio or share stated as a bound or a target
#: (`THRESHOLD`: "within 1.05x", "more than 2%").
_NUM = r"\d[\d,]*(?:\.\d+)?"
_UNIT = (
    r"(?:ns|µs|us|ms|s|sec|seconds?|min|minutes?|h|hours?|B|bytes|KB|kB|KiB|MB|MiB|GB|GiB|"
    r"TB|k|M)"
)
_RATE = r"(?:[KMG]i?B/s|[a-z]+/s|/s)"
_SPENT = r"took|takes|taking|cost|costs|costing|peaked at|peaks at|waited"
FIGURE = re.compile(
    "|".join(
        [
            rf"(?P<ratio>(?<![\w.]){_NUM}(?:×|x(?![\w])|\s?%))",
            rf"(?<![\w.]){_NUM}\s?{_RATE}",
            rf"(?<![\w.]){_NUM}\s?(?:µs|ns)\b",
            rf"\bload(?: average)? (?:of )?~?{_NUM}",
            rf"(?<![\w.]){_NUM}\s?(?:–|-|to)\s?{_NUM}\s?{_UNIT}\b",
            rf"(?:~|≈|\babout |\baround )\s?{_NUM}\s?{_UNIT}\b",
            rf"{_NUM}\s?{_UNIT}\s?(?:->|→)\s?{_NUM}",
            rf"\b(?:{_SPENT})\s(?:\S+\s){{0,3}}?{_NUM}\s?{_UNIT}\b",
        ]
    )
)


#: a ratio or share after one of these is a bound or a target, not a measurement ("within
#: 1.05x", "fails at a rise of 5%", "slower by more than 2%", "≤ 0.3×")
THRESHOLD = re.compile(
    r"(?:within|more than|less than|at least|at most|over|under|above|below|up to|beyond|"
    r"rise of|by|[≤≥<>]|<=|>=)\s*$"
)


def figures(text: str) -> list[str]:
    """The measured figures in `text` (the rule above)."""
    return [
        m.group(0)
        for m in FIGURE.finditer(text)
        if not (m.group("ratio") and THRESHOLD.search(text[max(0, m.start() - 20) : m.start()]))
    ]


def test_the_figure_rule():
    """The rule flags measurements and passes settings (so it can fail, and fails right)."""
    measured = [
        "it cost 55 ms of server CPU per result against 58-63 ms",
        "`make bench` took 349 s at 9f1f9ac",
        "a decode blocks the loop for at most ~2 ms",
        "26.0× the baseline",
        "real text 1.59–1.71 GB/s by median",
        "(load average 0.92)",
        "in production: 71.6 s -> 2.7 s",
        "the counter thread keeps 102% of its solo rate",
        "retrieve_future 29.4 µs",
        "results/s 0.9-1.2x processes",
        "a fresh-connection /healthz waited up to 1.9 s",
    ]
    settings = [
        "default 8000",
        "the store is pinged every 0.2 s",
        "poll them with 45 s timeouts",
        "128 x 262k-token bodies",
        "--max-body-bytes-in-flight (default 128 MiB)",
        "decode-262k and decode-128",
        "Python 3.11, 2 cores, tinker 0.38",
        "telemetry: 16 × it",
        "read and dropped, up to 64 MiB",
        "the gate fails at a rise of 1.05x",
        "a class gets its own pick only where it is slower by more than 2%",
        "peak memory ≤ 0.3× the body",
    ]
    assert all(figures(s) for s in measured), [s for s in measured if not figures(s)]
    assert not any(figures(s) for s in settings), {s: figures(s) for s in settings if figures(s)}


@pytest.mark.parametrize("command", ["serve", "router", "loadtest", "bench"])
def test_help_carries_no_measured_figures(command: str, capsys: pytest.CaptureFixture[str]):
    """`hotpath COMMAND --help` says what the command does, not what it measured once."""
    from impl import cli

    with pytest.raises(SystemExit) as exited:
        cli.main([command, "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert "usage: hotpath" in text
    found = [line.strip() for line in text.splitlines() if figures(line)]
    assert not found, found


#: the ledger and the experiments: the only pages that quote figures freely
LEDGER = ROOT / "docs" / "measurements.md"
EXPERIMENTS = ROOT / "docs" / "experiments.md"
#: profiles/README.md is the record of the committed profiles, stamped with commit and command
#: (`make profiles`), as generated as a results table
RECORDS = {LEDGER, EXPERIMENTS, ROOT / "profiles" / "README.md"}
#: a region a tool writes (`make results`: README's tables, stamped with their run)
GENERATED = re.compile(r"<!-- results:(\w+) -->.*?<!-- /results:\1 -->", re.S)
LINKS_LEDGER = re.compile(r"\]\((?:\.\./)*(?:docs/)?measurements\.md(?:#[^)]*)?\)")


#: a fenced code block: commands and their options, which state settings, not claims
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _blocks(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph, list item and table of a Markdown page; generated
    regions and fenced code left out (their lines kept blank, so line numbers hold)."""
    blank = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731
    text = FENCE.sub(blank, GENERATED.sub(blank, text))
    blocks: list[tuple[int, list[str]]] = []
    for n, line in enumerate(text.splitlines(), 1):
        starts_item = re.match(r"\s{0,3}(?:[-*]|\d+\.) ", line) is not None
        if not line.strip():
            blocks.append((n + 1, []))
        elif starts_item or not blocks:
            blocks.append((n, [line]))
        else:
            blocks[-1][1].append(line)
    return [(n, "\n".join(lines)) for n, lines in blocks if lines]


def quoted_without_ledger(text: str) -> list[str]:
    """Blocks of `text` that quote a measured figure and do not link into the ledger."""
    return [
        f"{n}: {', '.join(figures(block))}"
        for n, block in _blocks(text)
        if figures(block) and not LINKS_LEDGER.search(block)
    ]


@pytest.mark.parametrize(
    "doc", [p for p in PAGES if p not in RECORDS], ids=lambda p: str(p.relative_to(ROOT))
)
def test_pages_link_the_figures_they_quote(doc: Path):
    """A page quotes a measured figure only in a generated table or beside a link into the
    ledger (in the same paragraph, list item or table); the ledger holds it with its date,
    commit, machine, load and command."""
    found = quoted_without_ledger(doc.read_text())
    assert not found, found


def test_ledger_and_experiments_are_linked():
    """Both pages exist, are indexed, and the README and the CHANGELOG lead to them."""
    for page in (LEDGER, EXPERIMENTS):
        assert page.exists(), page
    readme = (ROOT / "README.md").read_text()
    assert "docs/measurements.md" in readme and "docs/experiments.md" in readme
    assert "CONTRIBUTING.md" in readme
    ledger = LEDGER.read_text()
    # every entry of the ledger says when, at which commit, on what machine, under what load
    entries = re.split(r"^### ", ledger, flags=re.M)[1:]
    assert entries
    for entry in entries:
        head = entry[:600]
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", head), entry[:80]
        assert re.search(r"`[0-9a-f]{7,}`", head), entry[:80]
        assert "machine" in head.lower() and "load" in head.lower(), entry[:80]


def test_changelog_is_releases():
    """The CHANGELOG is a short list of releases: an Unreleased section, then one section per
    version, newest first, the top one the version pyproject.toml carries."""
    text = (ROOT / "CHANGELOG.md").read_text()
    assert len(text.splitlines()) <= 400
    versions = re.findall(r"^## \[?(\d+\.\d+\.\d+)\]?", text, re.M)
    assert re.search(r"^## Unreleased", text, re.M)
    assert text.index("## Unreleased") < text.index(f"## {versions[0]}")
    project = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert project and versions and versions[0] == project.group(1)
    import impl

    assert impl.__version__ == project.group(1)
    assert versions == sorted(versions, key=lambda v: tuple(map(int, v.split("."))), reverse=True)
