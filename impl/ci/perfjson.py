"""Read a `make perf ARGS=--benchmark-json=PATH` file into flat rows for notebooks.

pytest-benchmark's JSON keeps each test's statistics under `stats` and what the perf suite
recorded under `extra_info` (family, input, implementation, and e.g. size_bytes or
cpu_ms_per_request); the rows here put both side by side, one per implementation and input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def rows(path: str | Path) -> list[dict[str, Any]]:
    """One row per benchmark: family, input, implementation, seconds (median, min, iqr), rounds."""
    data = json.loads(Path(path).read_text())
    out = []
    for bench in data.get("benchmarks", []):
        info, stats = dict(bench.get("extra_info") or {}), bench["stats"]
        out.append(
            {
                "family": info.pop("family", None),
                "input": info.pop("input", None),
                "implementation": info.pop("implementation", None),
                "group": bench.get("group"),
                "median_s": stats["median"],
                "min_s": stats["min"],
                "iqr_s": stats["iqr"],
                "rounds": stats["rounds"],
                **info,
                "commit": (data.get("commit_info") or {}).get("id"),
            }
        )
    return out
