"""queue: the caller only enqueues the record; a listener thread formats and writes it.

Technique: the QueueHandler/QueueListener pattern, tightened for the event loop. The caller
(uvicorn's loop) does `deque.append(record)` and nothing else: no handler lock, no formatting
(stdlib `QueueHandler.prepare` formats on the caller, the very cost moved away here), no
syscall (a blocking `queue.get` in the listener would make every put a futex wake-up). One
daemon thread wakes every `interval` (10 ms), formats what accumulated with `LineFormatter` and
writes it with one `write` + `flush` per batch.
Why fast: only a deque append per request stays on the loop. Formatting still costs CPU in the same
process (under the GIL), but batched, off the request's critical path.
Lifecycle: `close()` (called by logging.shutdown at exit, by dictConfig when it reconfigures,
and by our own atexit hook) writes every queued record before returning; `flush()` waits until
everything queued so far is written. Records handled after close are written directly.
`pause()` writes what is queued and stops the listener, leaving the handler open (records queue
up until `resume()`, `flush()` or `close()`): threads do not survive a fork, so pause before one
and resume in each process after; the instruction count (impl.ci.icount_steps) pauses it so
nothing runs beside the counted calls.
SIGTERM: after its graceful shutdown uvicorn re-raises the signal with the handler it found at
start; with SIG_DFL the process dies at once, skipping atexit. So creating a queue handler on
the main thread while SIGTERM is SIG_DFL installs a handler that closes every queue handler and
then re-raises SIGTERM with SIG_DFL: same exit, no line lost.
Caveats: the queue is unbounded (a stream slower than the request rate grows memory rather than
losing lines); lines reach the stream up to `interval` late; a record's args are formatted on
the listener thread, fine for uvicorn's str/int args, not for mutable objects; SIGKILL loses
what is still queued.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import signal
import sys
import threading
import weakref
from collections import deque
from typing import IO

from impl.accesslog._common import CountsErrors, LineFormatter

_BATCH = 1024
_LIVE: weakref.WeakSet[QueueAccessHandler] = weakref.WeakSet()


def _close_all_then_die(signum: int, frame: object) -> None:
    """SIGTERM as SIG_DFL would handle it, after writing every queued line."""
    for handler in list(_LIVE):
        handler.close()
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


def _flush_on_sigterm() -> None:
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _close_all_then_die)


class QueueAccessHandler(CountsErrors, logging.Handler):
    """Appends to a deque on the caller; a listener thread wakes every `interval` s to write."""

    def __init__(self, stream: IO[str], interval: float = 0.01, close_timeout: float = 60.0):
        super().__init__()
        self.stream = stream
        self.interval = interval
        self.close_timeout = close_timeout
        self.written = 0  # lines written, for tests and benchmarks
        self.queue: deque[object] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._closed = False
        self._thread = self._start_listener()
        atexit.register(self.close)
        _LIVE.add(self)
        _flush_on_sigterm()

    def _start_listener(self) -> threading.Thread:
        thread = threading.Thread(target=self._listen, name="accesslog-listener", daemon=True)
        thread.start()
        return thread

    def handle(self, record: logging.LogRecord) -> bool:  # type: ignore[override]
        # No handler lock, no formatting, no syscall: deque.append is atomic under the GIL.
        if not self.filter(record):
            return False
        if self._closed:
            with self.lock:  # type: ignore[union-attr]
                self._write([record])
        else:
            self.queue.append(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self.handle(record)

    def _listen(self) -> None:
        while not self._stopping:
            self._wake.wait(self.interval)
            self._wake.clear()
            self._drain()
        self._drain()

    def _drain(self) -> None:
        popleft = self.queue.popleft
        while self.queue:
            batch = []
            with contextlib.suppress(IndexError):
                while len(batch) < _BATCH:
                    batch.append(popleft())
            records = [item for item in batch if isinstance(item, logging.LogRecord)]
            if records:
                self._write(records)
            for item in batch:
                if isinstance(item, threading.Event):
                    item.set()

    def _write(self, records: list[logging.LogRecord]) -> None:
        lines = []
        for record in records:
            try:
                lines.append(self.format(record))
            except Exception:
                self.handleError(record)
        if not lines:
            return
        lines.append("")
        try:
            self.stream.write("\n".join(lines))
            self.stream.flush()
        except Exception:
            self.count_errors(len(lines) - 1)
        else:
            self.written += len(lines) - 1

    def flush(self) -> None:
        """Wait until every record queued before this call is written (and flushed); while
        paused, write them on the caller."""
        if self._closed:
            return
        if not self._thread.is_alive():
            with self.lock:  # type: ignore[union-attr]
                self._drain()
            return
        done = threading.Event()
        self.queue.append(done)
        self._wake.set()
        done.wait(self.close_timeout)

    def pause(self) -> None:
        """Write everything queued and stop the listener; records handled from now on are
        queued until `resume()` (or written by `flush()`/`close()`). Idempotent."""
        with self.lock:  # type: ignore[union-attr]
            if self._closed or not self._thread.is_alive():
                return
            self._stopping = True
            self._wake.set()
            self._thread.join(self.close_timeout)
            self._stopping = False
            self._wake.clear()

    def resume(self) -> None:
        """Start a listener again after `pause()` (also in a forked child). Idempotent."""
        with self.lock:  # type: ignore[union-attr]
            if not self._closed and not self._thread.is_alive():
                self._thread = self._start_listener()

    def close(self) -> None:
        """Write everything queued, stop the listener; idempotent."""
        with self.lock:  # type: ignore[union-attr]
            if not self._closed:
                self._closed = True
                atexit.unregister(self.close)
                self._stopping = True
                self._wake.set()
                self._thread.join(self.close_timeout)
                if not self._thread.is_alive():
                    self._drain()  # records appended by a thread racing close()
        super().close()


def create(
    stream: IO[str] | None = None, interval: float = 0.01, close_timeout: float = 60.0
) -> logging.Handler:
    """A queue handler whose listener writes to `stream` (default sys.stdout) every `interval` s."""
    handler = QueueAccessHandler(
        stream if stream is not None else sys.stdout, interval, close_timeout
    )
    handler.setFormatter(LineFormatter())
    return handler
