"""plain: the reference. A `logging.StreamHandler` writing one line per record.

Technique: the stdlib handler, formatted by `LineFormatter` (UTC time, cached per second, then
uvicorn's own message), written and flushed on the calling thread (the event loop, in uvicorn).
Why fast: no rendering, one f-string and one `write` + `flush` per request.
Caveats: the write is a syscall on the event loop; a slow or blocking stream (a full pipe with a
blocking reader) stalls the loop. A failed write is counted in `.errors`, never raised.
"""

from __future__ import annotations

import logging
import sys
from typing import IO

from impl.accesslog._common import CountsErrors, LineFormatter


class PlainHandler(CountsErrors, logging.StreamHandler):
    """StreamHandler + one-line formatter; failed writes are counted, not printed per line."""


def create(stream: IO[str] | None = None) -> logging.Handler:
    """A plain handler writing to `stream` (default: sys.stdout, as uvicorn's access handler)."""
    handler = PlainHandler(stream if stream is not None else sys.stdout)
    handler.setFormatter(LineFormatter())
    return handler
