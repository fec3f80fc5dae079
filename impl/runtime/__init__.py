"""Runtime family: the HTTP server that runs the server's own ASGI app on a listening socket.

Every request crosses the runtime first (its HTTP parser, its transport, its task per request),
so which one runs is a pick like the decoder's. Each runtime starts the same `create_app` with
the same settings and picks on a socket `hotpath serve` already listens on (the start-up
responder answers the probes there until the runtime takes over).

Contract: `registry.create("runtime", name)` gives a `Runtime`:

    runtime.serve(settings, picks, sock, starting) -> bool   # until SIGTERM/SIGINT; started?

`GUARANTEES` names what `hotpath serve` promises about HTTP; `LACKS` is the capability table:
the guarantees a runtime does not give, each with why. `lacking(name, settings)` is the part
of that row the settings ask for (a runtime without `--workers N` only lacks it with
`--workers` > 1). The automatic pick never chooses a runtime that lacks a guarantee the
settings ask for; an explicit `--runtime` is refused when it lacks `workers` or `drain`, and
otherwise runs with one warning per missing guarantee (logged, and listed on /healthz).
"""

from __future__ import annotations

import socket
from typing import Any, Protocol

from impl._table import Entry

REFERENCE = "uvicorn_httptools"

IMPLEMENTATIONS: tuple[Entry, ...] = (
    Entry(
        "uvicorn_httptools",
        "impl.runtime.uvicorn_httptools",
        "uvicorn + httptools under the server's HTTP limits (impl/server/protocol.py); reference",
    ),
    Entry(
        "uvicorn_h11",
        "impl.runtime.uvicorn_h11",
        "uvicorn + h11 (pure-Python parser; the head bounded by h11's incomplete-event size)",
        ("h11",),
        "server",
    ),
    Entry(
        "granian",
        "impl.runtime.granian",
        "granian's Rust HTTP server (hyper), ASGI interface, embedded in the server's event loop",
        ("granian",),
        "runtime",
    ),
)

PREFERENCE = ("uvicorn_httptools", "granian", "uvicorn_h11")

#: guarantee -> what `hotpath serve` promises
GUARANTEES: dict[str, str] = {
    "head_bytes": "a head over --max-header-bytes gets 431 with the JSON detail and closes",
    "header_count": "more than --max-headers fields get 431 with the JSON detail",
    "header_timeout": "a head slower than --header-timeout gets 408 (an idle new connection "
    "is closed without a word)",
    "body_timeout": "a body slower than --body-timeout gets 408",
    "body_limit": "a body over its route's cap gets 413 (checked by the app)",
    "keep_alive": "an idle connection stays open --keep-alive seconds, then closes",
    "drain": "on SIGTERM /readyz answers 503 for --drain-delay, held polls answer at once, "
    "then the runtime drains what is in flight",
    "starting": "/livez answers 200 during start-up on the same socket, none refused",
    "accesslog": "one line per request (not the probes) through the picked access-log handler",
    "workers": "--workers N: one runtime per process on an SO_REUSEPORT socket",
}

#: the capability table: runtime -> {guarantee it does not give: why}
LACKS: dict[str, dict[str, str]] = {
    "uvicorn_httptools": {},
    "uvicorn_h11": {
        "head_bytes": "h11 bounds only a head still incomplete in its buffer (past "
        "--max-header-bytes: 400, not 431); a head that arrives in one read is served whatever "
        "its size",
        "header_count": "h11 has no header-count limit: every field is parsed and handed on",
        "header_timeout": "uvicorn arms no timer before a head is complete (slowloris holds "
        "the connection)",
        "body_timeout": "uvicorn arms no timer while a body arrives",
    },
    "granian": {
        "head_bytes": "hyper refuses a head over its buffer (--max-header-bytes) with a bare "
        "431, no JSON detail",
        "header_count": "hyper's own field limit (100) answers a bare 431; --max-headers is "
        "not applied",
        "header_timeout": "hyper's header read timeout closes the connection without a 408",
        "body_timeout": "granian arms no timer while a body arrives",
        "keep_alive": "granian has no idle timeout of its own: hyper's header read timeout "
        "(--header-timeout) closes idle connections instead of --keep-alive",
    },
}

#: guarantees an explicit --runtime may not go without (the others run with a warning)
REQUIRED = ("drain", "workers")


class Runtime(Protocol):
    """What `registry.create("runtime", name)` gives."""

    name: str

    def serve(self, settings: Any, picks: Any, sock: socket.socket, starting: Any) -> bool:
        """Run the app with `settings` (`impl.server.settings.Settings`) and `picks` on the
        listening `sock` until SIGTERM/SIGINT, stopping the start-up responder `starting`
        (None for a --workers child) once it answers; whether it started."""
        ...


def lacking(name: str, settings: Any, accesslog: str | None = None) -> dict[str, str]:
    """The guarantees `settings` ask for that runtime `name` does not give (guarantee: why).

    `workers` is asked for only with --workers > 1, `accesslog` only when the access log is
    on (`accesslog`: the picked handler's name, None when not known yet)."""
    lacks = dict(LACKS[name])
    if getattr(settings, "workers", 1) <= 1:
        lacks.pop("workers", None)
    if accesslog == "null":
        lacks.pop("accesslog", None)
    return lacks
