"""Access-log family: the `logging.Handler` behind uvicorn's access logger.

Contract: `registry.create("accesslog", name, stream=...)` gives a handler; every handler but
`null` writes one line per request with the same facts (client, method, path, HTTP version,
status). `uvicorn_log_config(name, stream=...)` gives the dict uvicorn's `log_config` takes.
"""

from __future__ import annotations

from typing import IO, Any

from impl._table import Entry

REFERENCE = "plain"

IMPLEMENTATIONS: tuple[Entry, ...] = (
    Entry("plain", "impl.accesslog.plain", "StreamHandler, one-line formatter; the reference"),
    Entry(
        "rich",
        "impl.accesslog.rich",
        "rich.logging.RichHandler, the old default",
        ("rich",),
        "accesslog",
    ),
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


def uvicorn_log_config(name: str, stream: IO[str] | None = None, **options: Any) -> dict[str, Any]:
    """The dict uvicorn's `log_config` takes: `uvicorn.access` through handler `name`.

    `uvicorn` and `uvicorn.error` keep uvicorn's default (one line per message on stderr). The
    access handler is built by dictConfig through the `()` factory, i.e. `registry.create(
    "accesslog", name, stream=stream, **options)` (`stream` None: sys.stdout). For `null` the
    access logger gets no handler, so uvicorn skips the logging call altogether (its
    `hasHandlers()` check).
    dictConfig closes the handlers of a previous configuration, which flushes `queue`.
    """
    from impl import registry

    registry.entry("accesslog", name)  # unknown name: LookupError now, not inside dictConfig
    handlers: dict[str, Any] = {
        "default": {
            "formatter": "default",
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stderr",
        }
    }
    access_handlers = []
    if name != "null":
        handlers["access"] = {
            "()": "impl.accesslog._common.handler_from_config",
            "name": name,
            "stream": stream,
            **options,
        }
        access_handlers.append("access")
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "default": {
                "()": "uvicorn.logging.DefaultFormatter",
                "fmt": "%(levelprefix)s %(message)s",
                "use_colors": None,
            },
            # Unused by our handlers (each sets its own formatter); present because uvicorn
            # writes `use_colors` into formatters["access"] when its use_colors flag is set.
            "access": {"format": "%(message)s"},
        },
        "handlers": handlers,
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"level": "INFO"},
            "uvicorn.access": {"handlers": access_handlers, "level": "INFO", "propagate": False},
        },
    }
