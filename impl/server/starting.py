"""The start-up responder: the probes answered before the app runs.

`hotpath serve` listens before it picks its implementations (a calibration of a few seconds
when nothing was measured here) and starts the app (the store, the decode or fetch processes):
meanwhile a thread answers on the listening socket, so an orchestrator sees a process that is
alive but not ready instead of a refused connection, and a client a 503 it retries:

- `GET /livez` → 200 `{"status": "ok"}`;
- `GET /readyz` and `GET /healthz` → 503 `{"status": "starting", "why": [...]}`;
- anything else → 503 `{"detail": "the server is starting (...); retry later"}` + Retry-After.

Each answer closes its connection. One server process hands the same listening socket to
uvicorn, so connections that arrive while it takes over wait in the backlog: none is refused.
The workers' supervisor (`--workers N`) answers on its held port until its workers listen,
then accepts and answers what is still queued before it closes that socket; a connection whose
SYN reaches it in the few microseconds between that last accept and the close is reset (the
kernel does not move it to the workers' sockets), and its client retries.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading

import orjson

#: Most bytes of a request head read before answering; seconds a client gets to send them.
HEAD_BYTES = 8192
HEAD_TIMEOUT = 1.0


def listening_socket(host: str, port: int, backlog: int) -> socket.socket:
    """A TCP socket bound to (host, port) and listening (SO_REUSEADDR, as uvicorn binds)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog)


class Starting:
    """Answers the probes on `sock` from a thread until `stop()` (module docstring)."""

    def __init__(self, sock: socket.socket, why: str) -> None:
        self.sock = sock
        #: what the server is doing (shown in every answer; the caller updates it)
        self.why = why
        self.answered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hotpath-starting", daemon=True)

    def start(self) -> Starting:
        self._thread.start()
        return self

    def stop(self, *, drain: bool = False) -> None:
        """Stop answering; with `drain`, first accept and answer what waits in the backlog
        (the socket is then closed by the caller, not handed over)."""
        self._stop.set()
        self._thread.join()
        if drain:
            self._accept_all()

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self.sock, selectors.EVENT_READ)
            while not self._stop.is_set():
                if selector.select(timeout=0.05):
                    self._accept_all()

    def _accept_all(self) -> None:
        blocking = self.sock.getblocking()
        self.sock.setblocking(False)
        try:
            while True:
                try:
                    conn, _ = self.sock.accept()
                except (BlockingIOError, InterruptedError):
                    return
                except OSError:  # closed under us
                    return
                with conn:
                    self._answer(conn)
        finally:
            with contextlib.suppress(OSError):
                self.sock.setblocking(blocking)

    def _answer(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.settimeout(HEAD_TIMEOUT)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < HEAD_BYTES:
                chunk = conn.recv(HEAD_BYTES - len(head))
                if not chunk:
                    break
                head += chunk
            conn.sendall(self.response(head))
            self.answered += 1

    def response(self, head: bytes) -> bytes:
        """The whole HTTP response to a request that starts with `head`."""
        method, _, rest = head.partition(b" ")
        path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
        retry = b""
        if method == b"GET" and path == b"/livez":
            status, body = b"200 OK", b'{"status":"ok"}'
        elif method == b"GET" and path in (b"/readyz", b"/healthz"):
            status = b"503 Service Unavailable"
            body = orjson.dumps({"status": "starting", "why": [self.why]})
        else:
            status, retry = b"503 Service Unavailable", b"retry-after: 1\r\n"
            body = orjson.dumps({"detail": f"the server is starting ({self.why}); retry later"})
        return b"".join(
            (
                b"HTTP/1.1 ",
                status,
                b"\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % len(body),
                retry,
                b"connection: close\r\n\r\n",
                body,
            )
        )
