"""Where a commit keeps what the history benchmarks use: the modules moved between commits.

asv takes the benchmarks from the current checkout and installs each measured commit's
package, so `benchmarks/history.py` cannot import today's module paths at the top: older
commits kept the body generators elsewhere. `first(...)` imports the first of the paths that
the installed commit has; where a commit has none of them, the benchmark's setup raises
NotImplementedError and asv records n/a for that commit.

Paths, newest first (each row was found in the commits' trees with `git show`):
- synthetic bodies: `impl.workloads.synthetic`, `impl.harness.workload`, `impl.harness.bodies`
- real-text bodies: `impl.workloads.realtext`, `impl.harness.realtext`
- the end-to-end harness: `impl.harness.load`, `presets`, `report` (unmoved)

A real-text body is generated once (by the newest generator the run meets) and kept at a
fixed path (`frozen_body`), so every commit decodes the same bytes, including the commits
older than the generator.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

SYNTHETIC = ("impl.workloads.synthetic", "impl.harness.workload", "impl.harness.bodies")
REALTEXT = ("impl.workloads.realtext", "impl.harness.realtext")
#: where the history's real-text body is kept, for every commit of the run
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "hotpath", "history")


def first(paths: tuple[str, ...], attribute: str) -> ModuleType:
    """The first module of `paths` that imports and has `attribute`; NotImplementedError
    (asv's n/a) naming the paths when the installed commit has none of them."""
    for path in paths:
        try:
            module = importlib.import_module(path)
        except ImportError:
            continue
        if hasattr(module, attribute):
            return module
    raise NotImplementedError(f"this commit has none of {', '.join(paths)} (with {attribute})")


def synthetic_body(tokens: int, kind: str = "vllm") -> bytes:
    """The seeded synthetic vLLM body of the installed commit's generator."""
    return first(SYNTHETIC, "body_for").body_for(tokens, kind=kind)


def frozen_body(kind: str, tokens: int, render: str = "json") -> bytes:
    """The real-text body (`kind`, `tokens`, `render`): read from CACHE, or generated there by
    the installed commit's generator when CACHE does not hold it yet."""
    path = CACHE / f"{kind}-{render}-{tokens}.json"
    try:
        return path.read_bytes()
    except OSError:
        pass
    realtext = first(REALTEXT, "body_for")
    reason = realtext.unavailable_reason(kind, render)
    if reason is not None:
        raise NotImplementedError(reason)
    body = realtext.body_for(tokens, kind=kind, render_as=render)
    _write(path, body)
    return body


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as out:  # atomic
        out.write(data)
    os.replace(out.name, path)


def guarded(make: Callable[[], object]) -> object:
    """`make()`, with an ImportError or AttributeError of an older commit turned into
    NotImplementedError (n/a) instead of a failure."""
    try:
        return make()
    except (ImportError, AttributeError, TypeError) as missing:
        raise NotImplementedError(f"not in this commit: {missing}") from missing
