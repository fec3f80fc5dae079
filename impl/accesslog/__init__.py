"""Access-log family: the `logging.Handler` behind uvicorn's access logger.

Contract: `registry.create("accesslog", name, stream=...)` gives a handler; every handler but
`null` writes one line per request with the same facts (client, method, path, HTTP version,
status). `uvicorn_log_config(name, stream=...)` gives the dict uvicorn's `log_config` takes.
"""

from __future__ import annotations

from impl._table import Entry

REFERENCE = "plain"

IMPLEMENTATIONS: tuple[Entry, ...] = (
    Entry("plain", "impl.accesslog.plain", "StreamHandler, one-line formatter; the reference"),
    Entry("rich", "impl.accesslog.rich", "rich.logging.RichHandler, the old default", ("rich",), "accesslog"),
    Entry("queue", "impl.accesslog.queue", "QueueHandler; a listener thread formats and writes"),
    Entry("null", "impl.accesslog.null", "access log off, for comparison"),
    Entry(
        "picologging",
        "impl.accesslog.picologging",
        "picologging's C StreamHandler",
        ("picologging",),
        "accesslog",
    ),
)

PREFERENCE = ("queue", "plain", "picologging", "rich")
