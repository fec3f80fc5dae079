"""null: access log off, for comparison. Writes nothing, so it is never picked.

Technique: `logging.NullHandler`. Through `uvicorn_log_config("null")` the access logger gets no
handler at all, so uvicorn's `access_logger.hasHandlers()` is false and it skips the logging
call entirely: the server's cost with no access log. `create()` still gives a handler (a
NullHandler) for the per-record benchmark, where it measures the cost of the record alone.
Caveats: every line is lost by design; it fails the parity test's "one line per record".
"""

from __future__ import annotations

import logging
from typing import IO


def create(stream: IO[str] | None = None) -> logging.Handler:
    """A handler that drops every record (`stream` is accepted and ignored)."""
    return logging.NullHandler()
