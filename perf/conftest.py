"""pytest-benchmark suite (`make perf`): every family's workloads, implementations side by side.

Not collected by `make test` (pyproject's testpaths is `tests`). Each test sets
`benchmark.group` to "<family> <input>", so one run prints one table per family and input with
every implementation as a row, and stores `extra_info` (family, input, implementation) so the
`--benchmark-json` file says what each row measured (`impl.ci.perfjson.rows` reads it).
An implementation that cannot run here is skipped with its install hint; one whose output
differs from the reference's fails (no speed without correctness).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `benchmarks.common`: the seeded inputs asv uses too

from impl import registry  # noqa: E402


def create_or_skip(family: str, name: str, **options: Any) -> Any:
    """registry.create, or skip the test with the reason the implementation cannot run here."""
    reason = registry.unavailable_reason(family, name)
    if reason:
        pytest.skip(reason)
    return registry.create(family, name, **options)


def label(benchmark: Any, family: str, input_name: str, implementation: str, **extra: Any) -> None:
    """Group the row under "<family> <input>" and record what it measured in the JSON."""
    benchmark.group = f"{family} {input_name}"
    benchmark.extra_info.update(
        family=family, input=input_name, implementation=implementation, **extra
    )
