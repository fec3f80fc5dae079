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
    """One pick per family of `registry.all_families()` (a test keeps the fields in step)."""

    decode: pick.Pick
    encode: pick.Pick
    pool: pick.Pick
    accesslog: pick.Pick
    runtime: pick.Pick

    def as_json(self) -> dict[str, dict[str, Any]]:
        from impl.runtime import LACKS

        shown: dict[str, dict[str, Any]] = {
            f: {"name": getattr(self, f).name, "reason": getattr(self, f).reason}
            for f in registry.all_families()
        }
        shown["runtime"]["lacks"] = sorted(LACKS[self.runtime.name])
        return shown


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
    chosen["runtime"] = choose_runtime(settings, chosen["accesslog"].name)
    picks = Picks(**chosen)
    for family in registry.all_families():
        p = getattr(picks, family)
        log.info("pick %s=%s: %s", family, p.name, p.reason)
    return picks


def choose_runtime(settings: Settings, accesslog: str) -> pick.Pick:
    """The runtime pick (`impl.runtime`): an explicit `--runtime NAME` runs unless it lacks a
    guarantee of `runtime.REQUIRED` the settings ask for (then `UnavailableError`), with one
    warning per other guarantee it lacks; `auto` (or none given) chooses among the runtimes
    that lack none, from measurements, else the preference order."""
    from impl.runtime import REQUIRED, lacking

    explicit = settings.runtime
    if explicit is None and settings.baseline:
        name = baseline.IMPLEMENTATIONS["runtime"]
        return pick.Pick("runtime", name, "--baseline (the configuration before the fixes)")
    if explicit is not None and explicit != "auto":
        chosen = pick.pick("runtime", explicit)
        lacks = lacking(chosen.name, settings, accesslog)
        for guarantee in REQUIRED:
            if guarantee in lacks:
                raise registry.UnavailableError(
                    f"runtime {chosen.name} cannot give {guarantee}: {lacks[guarantee]}"
                )
        for guarantee, why in lacks.items():
            log.warning("runtime %s does not give %s: %s", chosen.name, guarantee, why)
        return chosen
    exclude = tuple(n for n in registry.names("runtime") if lacking(n, settings, accesslog))
    return pick.pick("runtime", "", exclude=exclude)  # "": not HOTPATH_RUNTIME (read already)


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
