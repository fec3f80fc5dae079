"""rich: `rich.logging.RichHandler`, the old default; the slow baseline.

Technique: every record is rendered as a rich Table row (time, level, message, source path
columns), highlighted and laid out to the console width, then written.
Why slow: the layout engine runs per record on the event loop, the largest share of a small
request's CPU (docs/measurements.md, the production server and the accesslog table).
Caveats: rich pads and wraps lines to the console width; `width` defaults to 1000 columns so a
request stays on one line (paths longer than that would wrap). Needs `rich` (extra accesslog).
Two failure modes of stock rich are changed so a broken stream cannot reach the request path:
on BrokenPipeError rich's Console dup2()s /dev/null over the process's stdout fd, goes quiet
(every later line silently dropped) and raises SystemExit out of `logger.info`; and after any
failed write it keeps the unwritten text in its buffer, to be re-sent with the next record
(unbounded growth while the stream stays broken). Here the failure is counted in `.errors`
and the buffer dropped (`Console._buffer`, a private attribute of rich).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import sys
from typing import IO

from rich.console import Console
from rich.logging import RichHandler

from impl.accesslog._common import CountsErrors


class _Console(Console):
    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")  # instead of dup2 + SystemExit


class RichAccessHandler(CountsErrors, RichHandler):
    """RichHandler with failed writes counted (and their text dropped), never raised."""

    def handleError(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            del self.console._buffer[:]
        super().handleError(record)


def create(stream: IO[str] | None = None, width: int = 1000) -> logging.Handler:
    """A RichHandler writing to `stream` (default sys.stdout) on a `width`-column console."""
    console = _Console(file=stream if stream is not None else sys.stdout, width=width)
    handler = RichAccessHandler(console=console)
    handler.setFormatter(logging.Formatter("%(message)s"))
    return handler
