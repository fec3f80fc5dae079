"""The text the real-text bodies are made of: code, prose and multilingual passages.

Every source is on every machine that runs hotpath, and nothing is fetched:

- `code`: CPython's own standard-library sources (`sysconfig`'s `stdlib` path: every `.py`
  file outside the test suites, IDLE and the turtle demos), in path order, one passage per
  file: its first 16 KB, cut at a line end (files are read when a body first draws them);
- `prose`: CPython's documentation topics, the text `help("TOPIC")` prints
  (`pydoc_data.topics`, English), one passage per topic, sorted by name;
- `multilingual`: impl/workloads/corpus/multilingual.txt, a short corpus written for this project
  (Chinese, Japanese, Korean, Russian, Ukrainian, Greek, Arabic, Hebrew, Hindi, Thai, European
  languages with diacritics, emoji chat lines; see corpus/README.md), one passage per paragraph.

The code and prose passages come from the running interpreter, so they change with its
version: a body of those kinds is the same for the same Python version (the bench records it).
"""

from __future__ import annotations

import os
import sysconfig
import tokenize
from functools import cache
from pathlib import Path

SOURCES = ("code", "prose", "multilingual")
CORPUS = Path(__file__).parent / "corpus" / "multilingual.txt"
#: a code passage is the start of a file, cut at a line end before this many characters
CODE_PASSAGE = 16384
_SKIPPED_DIRS = {"test", "tests", "idlelib", "turtledemo", "site-packages", "__pycache__"}


@cache
def _code_files() -> tuple[Path, ...]:
    # os.walk, not rglob: the skipped folders are never entered (site-packages sits inside the
    # stdlib folder, and listing it would be most of the first code body's render)
    stdlib = sysconfig.get_paths()["stdlib"]
    found = []
    for folder, dirs, files in os.walk(stdlib):
        dirs[:] = [d for d in dirs if d not in _SKIPPED_DIRS]
        found.extend(Path(folder, name) for name in files if name.endswith(".py"))
    return tuple(sorted(found))


@cache
def _prose() -> tuple[str, ...]:
    from pydoc_data.topics import topics

    return tuple(topics[name].strip() for name in sorted(topics))


@cache
def _multilingual() -> tuple[str, ...]:
    text = CORPUS.read_text(encoding="utf-8")
    return tuple(p.strip() for p in text.split("\n\n") if p.strip())


def count(source: str) -> int:
    """How many passages `source` (one of SOURCES) has here; LookupError for another name."""
    found = {"code": _code_files, "prose": _prose, "multilingual": _multilingual}.get(source)
    if found is None:
        raise LookupError(f"unknown text source {source!r}; known: {', '.join(SOURCES)}")
    if not found():
        raise RuntimeError(
            f"no {source} text found on this machine (see impl.workloads.textsources)"
        )
    return len(found())


@cache
def passage(source: str, index: int) -> str:
    """Passage `index` (0 <= index < count(source)) of `source`."""
    count(source)
    if source != "code":
        return (_prose if source == "prose" else _multilingual)()[index]
    with tokenize.open(_code_files()[index]) as f:  # honours a file's coding cookie
        text = f.read(CODE_PASSAGE + 1)
    if len(text) > CODE_PASSAGE:
        text = text[: text.rfind("\n", 0, CODE_PASSAGE) + 1 or CODE_PASSAGE]
    return text
