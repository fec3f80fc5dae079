"""Choose the fastest available implementation of each family on this machine.

Order of evidence: an explicit name (the caller's flag or `HOTPATH_<FAMILY>`), else the
measurements `hotpath bench` recorded on this machine, else a short calibration (when the
caller passes one: the server passes `impl.server.calibration`'s), else the family's fixed
`PREFERENCE` order. Every pick carries the reason, so the server can log it and show it on
/healthz.

Measurements file (JSON, `HOTPATH_MEASUREMENTS` or ~/.cache/hotpath/measurements.json):

    {"machine": {...}, "families": {"decode": [
        {"input": "vllm-262144", "size_bytes": 20971520,
         "cost": {"json": 0.41, "orjson": 0.21, ...}},   # lower is better; parity failures left out
        ...]}}
"""

from __future__ import annotations

import importlib
import json
import math
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from impl import registry

#: candidate names -> measurement rows (`{"input", "size_bytes", "cost": {name: value}}`)
Calibrator = Callable[[list[str]], list[dict[str, Any]]]


@dataclass(frozen=True)
class Pick:
    family: str
    name: str
    reason: str


def measurements_path() -> Path:
    explicit = os.environ.get("HOTPATH_MEASUREMENTS")
    if explicit:
        return Path(explicit)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "hotpath" / "measurements.json"


def machine() -> dict[str, Any]:
    """What identifies this machine for the purpose of trusting recorded measurements."""
    return {
        "node": platform.node(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def load() -> dict[str, list[dict[str, Any]]]:
    """Recorded rows per family, or {} when none were recorded on this machine."""
    path = measurements_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if data.get("machine") != machine():
        return {}
    return data.get("families", {})


def record(family: str, rows: list[dict[str, Any]]) -> Path:
    """Replace `family`'s recorded rows (each `{"input", "size_bytes", "cost": {name: value}}`)."""
    path = measurements_path()
    families = load()
    families[family] = rows
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"machine": machine(), "families": families}, indent=1))
    tmp.replace(path)
    return path


def _candidates(family: str, exclude: tuple[str, ...]) -> list[str]:
    return [name for name in registry.available(family) if name not in exclude]


def fastest_in(rows: list[dict[str, Any]], candidates: list[str]) -> str | None:
    """The candidate with the lowest geometric mean of cost relative to each row's best."""
    scores: dict[str, list[float]] = {}
    for row in rows:
        cost = {name: value for name, value in row["cost"].items() if name in candidates}
        if not cost:
            continue
        best = min(cost.values())
        for name in candidates:
            # An implementation missing from a row (failed or not run) counts as 100x the best.
            ratio = cost[name] / best if name in cost and best > 0 else 100.0
            scores.setdefault(name, []).append(math.log(max(ratio, 1e-12)))
    if not scores:
        return None
    return min(scores, key=lambda name: (sum(scores[name]) / len(scores[name]), name))


def nearest_row(rows: list[dict[str, Any]], size_bytes: int) -> dict[str, Any] | None:
    """The measured row whose input size is closest to `size_bytes` on a log scale."""
    sized = [row for row in rows if row.get("size_bytes")]
    if not sized:
        return None
    target = math.log(max(size_bytes, 1))
    return min(sized, key=lambda row: abs(math.log(row["size_bytes"]) - target))


def pick(
    family: str,
    explicit: str | None = None,
    *,
    calibrator: Calibrator | None = None,
    exclude: tuple[str, ...] = (),
) -> Pick:
    """The implementation of `family` to run here, and why."""
    env_name = f"HOTPATH_{family.upper()}"
    if explicit is None and os.environ.get(env_name):
        explicit, source = os.environ[env_name], env_name
    else:
        source = "explicit flag"
    if explicit:
        registry.entry(family, explicit)
        reason = registry.unavailable_reason(family, explicit)
        if reason:
            raise registry.UnavailableError(reason)
        return Pick(family, explicit, f"{source} ({explicit})")

    candidates = _candidates(family, exclude)
    rows = load().get(family)
    if rows:
        name = fastest_in(rows, candidates)
        if name:
            return Pick(family, name, f"fastest in measurements recorded at {measurements_path()}")
    if calibrator is not None:
        rows = calibrator(candidates)
        name = fastest_in(rows, candidates) if rows else None
        if name:
            return Pick(
                family, name, "fastest in a start-up calibration (no measurements recorded)"
            )
    preference = importlib.import_module(f"impl.{family}").PREFERENCE
    for name in preference:
        if name in candidates:
            reason = "first available in the fixed preference order (nothing measured)"
            return Pick(family, name, reason)
    return Pick(family, registry.reference(family), "reference (nothing else available)")
