"""Which implementation of each family the server runs, and why (logged, shown on /healthz).

Order of evidence (see `impl.pick`): an explicit flag or `HOTPATH_<FAMILY>` variable, else the
measurements `hotpath bench` recorded on this machine, else a short start-up calibration, else
the family's fixed preference order. `--baseline` replaces the automatic choice with the old
configuration (explicit flags still win). The automatic access-log pick never chooses `null`
(no access log is a comparison point, not a production setting); asking for it explicitly works.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any

from impl import pick, registry
from impl.server import baseline, calibration
from impl.server.settings import Settings

log = logging.getLogger("hotpath.server")


@dataclass(frozen=True)
class Picks:
    """One pick per family of `registry.families()` (a test keeps the fields in step)."""

    decode: pick.Pick
    encode: pick.Pick
    pool: pick.Pick
    accesslog: pick.Pick

    def as_json(self) -> dict[str, dict[str, str]]:
        return {
            f: {"name": getattr(self, f).name, "reason": getattr(self, f).reason}
            for f in registry.families()
        }


def choose(settings: Settings) -> Picks:
    """One pick per family; LookupError/UnavailableError for a bad explicit name."""
    chosen: dict[str, pick.Pick] = {}
    for family in registry.families():
        explicit = getattr(settings, family)
        if settings.baseline and explicit is None:
            name = baseline.IMPLEMENTATIONS[family]
            reason = registry.unavailable_reason(family, name)
            if reason:
                raise registry.UnavailableError(reason)
            chosen[family] = pick.Pick(
                family, name, "--baseline (the configuration before the fixes)"
            )
            continue
        exclude = ("null",) if family == "accesslog" else ()
        calibrator = calibration.calibrator(family) if settings.calibrate else None
        chosen[family] = pick.pick(family, explicit, calibrator=calibrator, exclude=exclude)
    picks = Picks(**chosen)
    for family in registry.families():
        p = getattr(picks, family)
        log.info("pick %s=%s: %s", family, p.name, p.reason)
    return picks


def choose_or_explain(settings: Settings) -> Picks | None:
    """`choose`, or None after printing for `hotpath serve` why a named one cannot run."""
    try:
        return choose(settings)
    except (LookupError, registry.UnavailableError) as exc:
        print(f"hotpath serve: {exc}", file=sys.stderr)
        return None


def create(picks: Picks, settings: Settings) -> dict[str, Any]:
    """The decoder, encoder and pool objects (call inside the running event loop)."""
    return {
        "decoder": registry.create("decode", picks.decode.name),
        "encoder": registry.create("encode", picks.encode.name),
        "pool": registry.create("pool", picks.pool.name, **pool_options(settings)),
    }


def pool_options(settings: Settings) -> dict[str, Any]:
    """The pool contract's options from the settings (fetch processes build their pools too)."""
    return {
        "max_connections": settings.upstream_connections,
        "connect_timeout": settings.connect_timeout,
        "read_timeout": settings.read_timeout,
    }
