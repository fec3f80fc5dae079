"""Shared pieces of the access-log handlers: uvicorn's record shape, the line format, parsing.

uvicorn's access logger (`uvicorn.access`) logs one record per response with the message
`'%s - "%s %s HTTP/%s" %d'` and the args (client_addr, method, full_path, http_version,
status_code) (uvicorn/protocols/http/httptools_impl.py). Every handler here writes that message,
so `parse_line` reads the same facts back from any of them.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import time
from typing import Any, NamedTuple

#: The message uvicorn's HTTP protocols pass to `access_logger.info`.
ACCESS_MESSAGE = '%s - "%s %s HTTP/%s" %d'
#: The same with the caller's NAME after the dash (`impl.server.callers.NameInAccessLog`).
NAMED_MESSAGE = '%s - %s "%s %s HTTP/%s" %d'
ACCESS_LOGGER = "uvicorn.access"

_LINE = re.compile(
    r'(?P<client>\S*) - (?:(?P<caller>[^\s"]+) )?"(?P<method>\S+) (?P<path>\S+) '
    r'HTTP/(?P<version>[0-9.]+)" (?P<status>\d{3})'
)


class Facts(NamedTuple):
    """What every access-log line must carry."""

    client: str
    method: str
    path: str
    http_version: str
    status: int
    #: the caller's NAME where the server notes it (`-`: no caller, or not noted)
    caller: str = "-"


def access_record(
    client: str, method: str, path: str, http_version: str, status: int
) -> logging.LogRecord:
    """A record built exactly as uvicorn's `access_logger.info(...)` call builds it."""
    return logging.getLogger(ACCESS_LOGGER).makeRecord(
        ACCESS_LOGGER,
        logging.INFO,
        "uvicorn/protocols/http/httptools_impl.py",
        482,
        ACCESS_MESSAGE,
        (client, method, path, http_version, status),
        None,
        "send",
    )


def facts_of(record: logging.LogRecord) -> Facts:
    """The facts a uvicorn access record carries (its args)."""
    client, method, path, version, status = record.args  # type: ignore[misc]
    return Facts(client, method, path, version, int(status))


def parse_line(line: str) -> Facts | None:
    """The facts of one written line, whatever columns a handler adds around the message."""
    match = _LINE.search(line)
    if match is None:
        return None
    return Facts(
        match["client"],
        match["method"],
        match["path"],
        match["version"],
        int(match["status"]),
        match["caller"] or "-",
    )


def parse_lines(text: str) -> list[Facts | None]:
    """One entry per non-blank line (None where a line carries no access facts)."""
    return [parse_line(line) for line in text.splitlines() if line.strip()]


class LineFormatter(logging.Formatter):
    """`2026-11-29T09:30:01.123Z <message>`: UTC time with ms, cached per second, then the message.

    Cheaper than `%(asctime)s` (one strftime per second instead of per record).
    """

    def __init__(self) -> None:
        super().__init__()
        self._second: tuple[int, str] = (-1, "")

    def format(self, record: logging.LogRecord) -> str:
        created = record.created
        second = int(created)
        cached = self._second
        if cached[0] != second:
            cached = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
            self._second = cached
        line = f"{cached[1]}.{int((created - second) * 1000):03d}Z {record.getMessage()}"
        if record.exc_info:  # never for uvicorn's access records; keep other records whole
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


class CountsErrors:
    """Mixin for a `logging.Handler`: a failed write is counted, reported once, never raised.

    logging's default `handleError` prints a traceback per failed record to stderr; on a
    server whose log pipe broke that is a traceback per request, on the event loop. Here the
    first failure prints one line to stderr and every failure adds to `errors` (lines lost).
    """

    errors: int = 0

    def flush(self) -> None:
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing to flush
            super().flush()  # type: ignore[misc]

    def handleError(self, record: logging.LogRecord) -> None:
        self.count_errors(1)

    def count_errors(self, lines: int) -> None:
        self.errors += lines
        if self.errors == lines:
            exc = sys.exc_info()[1]
            with contextlib.suppress(Exception):
                sys.stderr.write(
                    f"hotpath accesslog: {type(self).__name__} could not write a line "
                    f"({exc!r}); further failures are counted in .errors, not printed\n"
                )


def handler_from_config(name: str, **options: Any) -> logging.Handler:
    """The `()` factory `uvicorn_log_config` names: dictConfig calls it to build the handler."""
    from impl import registry

    return registry.create("accesslog", name, **options)
