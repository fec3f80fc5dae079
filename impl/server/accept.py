"""Accept every waiting connection when the listening socket is readable, not one per loop turn.

libuv (under uvloop) accepts one connection per event-loop iteration since 1.45 (libuv pull
request 3696, "unix: don't accept() connections in a loop"): it relies on level-triggered
polling to report the next one on the next turn. A busy server's turn is long: with 16384
samples outstanding, one turn serves hundreds of polls, submits and fetches and takes a large part
of a second (the loop is not *late*: every timer still fires within a turn). A burst of a few
hundred new client connections then drains a few per second, and a load balancer's health check, a
fresh connection, waits behind them in the kernel's accept queue (strace shows one accept4 per turn,
never EAGAIN, while `ss` shows hundreds of connections queued: docs/experiments.md).

`EagerAccept` watches a duplicate of the listening descriptor (epoll keys on the descriptor, so
the duplicate is a second watcher beside libuv's) and, each time it is readable, accepts up to
`limit` connections at once, as asyncio's own selector loop does (`backlog` per wake-up), and
opens each one's transport at once with `connect_accepted_socket` and the server's protocol
factory (its first step runs in the same turn, as libuv's own accept does).
libuv's own watcher keeps accepting too; whichever comes second gets EAGAIN.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

log = logging.getLogger("hotpath.server")


class EagerAccept:
    """Accepts up to `limit` waiting connections per wake-up of a listening socket."""

    def __init__(
        self,
        listener: Any,
        protocol_factory: Callable[[], asyncio.Protocol],
        *,
        limit: int = 4096,
    ) -> None:
        self.protocol_factory = protocol_factory
        self.limit = max(1, limit)
        #: connections accepted here (libuv's own one-per-turn accepts are not counted)
        self.accepted = 0
        #: wake-ups that found more than one connection waiting
        self.bursts = 0
        self._sock = socket.socket(fileno=os.dup(listener.fileno()))
        self._sock.setblocking(False)
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._drain)

    def stop(self) -> None:
        """Stop accepting and close the duplicate (the server closes the listener itself)."""
        if self._loop is not None:
            with contextlib.suppress(ValueError, RuntimeError):
                self._loop.remove_reader(self._sock.fileno())
            self._loop = None
        self._sock.close()

    def stats(self) -> dict[str, int]:
        return {"accepted": self.accepted, "bursts": self.bursts}

    def _drain(self) -> None:
        taken = 0
        while taken < self.limit:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionAbortedError:
                continue
            except OSError as exc:  # EMFILE and the like: leave the rest to libuv's watcher
                log.warning("eager accept stopped for this turn: %s", exc)
                break
            taken += 1
            conn.setblocking(False)
            self._hand_over(conn)
        self.accepted += taken
        self.bursts += taken > 1

    def _hand_over(self, conn: socket.socket) -> None:
        """Open the connection's transport now, in this turn, as libuv's own accept does.

        `connect_accepted_socket` is a coroutine that opens the transport (and schedules
        `connection_made`) before its first await; run as a task it would start a turn later,
        and a fresh connection already needs three turns to be answered. So its first step runs
        here, and the rest (awaiting `connection_made`) when that future is done."""
        assert self._loop is not None
        coroutine = self._loop.connect_accepted_socket(self.protocol_factory, conn)
        self._step(coroutine, conn)

    def _step(self, coroutine: Any, conn: socket.socket) -> None:
        try:
            waiting = coroutine.send(None)
        except StopIteration:
            return  # the connection is open and its protocol has it
        except Exception as exc:  # the peer left first, or no descriptor for the transport
            conn.close()
            log.warning("eager accept: connection not opened: %s", exc)
            return
        waiting._asyncio_future_blocking = False  # as asyncio.Task does with what it awaits
        waiting.add_done_callback(lambda _: self._step(coroutine, conn))
