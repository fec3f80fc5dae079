"""picologging: formatting and writing by picologging's C `StreamHandler`, behind a stdlib handler.

Technique: uvicorn's loggers are stdlib `logging.Logger`s and picologging's handlers are not
`logging.Handler`s (attaching one fails: "Argument must be a LogRecord"). So this is a stdlib
`logging.Handler` whose `emit` copies the stdlib record into a `picologging.LogRecord` and hands
it to picologging's C StreamHandler, which formats and writes it on the calling thread.
Why (a little) fast: picologging's C formatter and handler replace the stdlib's Python ones;
the stdlib record uvicorn creates, and the copy, are still paid.
Caveats (picologging 0.9.3 on CPython 3.11): without an explicit `datefmt`, `%(asctime)s`
prints uninitialised bytes and `%(msecs)d` is wrong, so the time is formatted with an explicit
datefmt to whole seconds, local time (the time the copy was made, microseconds after
uvicorn's record).
picologging raises on a failed write; the wrapper counts it in `.errors` instead. A record's
`exc_info` is not passed on (uvicorn's access records have none). Needs `picologging`.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import IO

import picologging as _pico

from impl.accesslog._common import CountsErrors


class PicologgingHandler(CountsErrors, logging.Handler):
    """A stdlib handler delegating format + write to a picologging StreamHandler."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__()
        self.stream = stream
        self.inner = _pico.StreamHandler(stream)
        self.inner.setFormatter(_pico.Formatter("%(asctime)s %(message)s", "%Y-%m-%dT%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            copy = _pico.LogRecord(
                record.name,
                record.levelno,
                record.pathname,
                record.lineno,
                record.msg,
                record.args,
                None,
            )
            self.inner.handle(copy)
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        with contextlib.suppress(Exception):
            self.inner.flush()


def create(stream: IO[str] | None = None) -> logging.Handler:
    """A picologging-backed handler writing to `stream` (default sys.stdout)."""
    return PicologgingHandler(stream if stream is not None else sys.stdout)
