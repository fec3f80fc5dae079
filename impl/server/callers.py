"""Who is asking: each request's caller, from its X-API-Key, in one digest and one dict lookup.

With `--api-keys FILE` (`impl.server.keyfile`) the callers are the NAMEs the file gives: a
request's key is hashed (SHA-256), the digest is looked up among the file's digests and the
entry found is confirmed with `hmac.compare_digest`, so no comparison ever runs on a key
itself and its timing can only tell digest bytes, which say nothing of a key. Any other key,
and no key, answers 401. Without a file (open mode: on loopback, or with `--allow-any-key`)
any key of `tml-` and at least one more character is accepted; each such key is a caller of
its own, named `anon-` and 16 hex digits of its digest (never the key).

The caller's NAME owns what it creates (sessions, sampling sessions, futures and their
completion logs); the routes answer another caller's ids with the same 404 as ids that never
existed. `Callers.refusal` is the fair room: a caller with its share (`--max-outstanding-per-
key`; by default half of `--max-outstanding`, or all of it when the file names one caller,
and no share in open mode, where anyone can mint keys) of samples pending gets 429 alone.

The file is read again on SIGHUP (`install_sighup`: every process of `--workers`, which the
supervisor forwards it to) and when its mtime, size or inode changes, checked every
`WATCH_INTERVAL` seconds on the event loop: a removed key answers 401 within a second. A file
that does not parse (or cannot be read) keeps the callers loaded before, and says why in the
log and on /healthz. The NAME of each request is in `CURRENT` for the access log
(`NameInAccessLog`: `client - NAME "POST /path HTTP/1.1" 200`).
"""

from __future__ import annotations

import asyncio
import contextvars
import hmac
import logging
import os
import signal
from typing import Any

from impl.accesslog._common import ACCESS_MESSAGE, NAMED_MESSAGE
from impl.server import keyfile
from impl.server.keyfile import KeyFileError, digest

log = logging.getLogger("hotpath.server")
#: seconds between two looks at the key file's mtime (a removed key answers 401 within a second)
WATCH_INTERVAL = 0.25
#: the metrics label of every open-mode caller (their names are unbounded; a file NAME cannot
#: be `*`)
OPEN_LABEL = "*"
#: open-mode callers remembered at once (their request counters); beyond, one is made per call
OPEN_CACHE = 4096
#: the NAME of the request being served (the access log's field), `-` before the key check
CURRENT: contextvars.ContextVar[str] = contextvars.ContextVar("hotpath_caller", default="-")
_OPEN_401 = (
    b'{"detail":"missing or invalid API key: send an X-API-Key header whose value starts '
    b"with 'tml-'\"}"
)
_CLOSED_401 = (
    b'{"detail":"missing or invalid API key: send an X-API-Key header with a key of this '
    b"server's --api-keys file\"}"
)
#: SIGHUPs received by this process (each Callers reloads once per new one)
_hangups = [0]


def install_sighup() -> None:
    """SIGHUP reloads every Callers of this process (and no longer ends the process)."""

    def hangup(signum: int, frame: Any) -> None:
        _hangups[0] += 1

    signal.signal(signal.SIGHUP, hangup)


class Caller:
    """One caller: its NAME, its metrics label and what this process counted of it."""

    __slots__ = ("label", "name", "refused", "requests")

    def __init__(self, name: str, label: str) -> None:
        self.name = name
        self.label = label
        self.requests = 0  # authenticated requests
        self.refused = 0  # asamples answered 429 (any limit: the room's or its share)


class Callers:
    """The callers of a key file (or open mode): `caller(scope)` per request, reloads."""

    def __init__(
        self, path: str | None, *, max_outstanding: int, per_key: int | None = None
    ) -> None:
        self.path = path
        self.open = path is None
        self.max_outstanding = max_outstanding
        self.per_key = per_key
        #: digest -> (digest, Caller): the file's keys
        self.by_digest: dict[bytes, tuple[bytes, Caller]] = {}
        self.named: dict[str, Caller] = {}
        #: every NAME the file gave since start (a NAME removed and added back keeps counting)
        self.known: dict[str, Caller] = {}
        self.anonymous: dict[bytes, Caller] = {}
        self.share: int | None = per_key
        self.rejection = _OPEN_401 if self.open else _CLOSED_401
        self.reloads = 0
        self.reload_error: str | None = None
        self._seen: tuple[int, int, int] | None = None
        self._hangups = _hangups[0]
        self._timer: asyncio.TimerHandle | None = None
        if path is not None:
            self._seen = _stat(path)
            self._install(keyfile.load(path))

    # -- the per-request check -------------------------------------------------------------
    def caller(self, scope: dict[str, Any]) -> Caller | None:
        """The caller of an ASGI request (its X-API-Key header), or None (answer 401)."""
        for name, value in scope["headers"]:
            if name == b"x-api-key":
                return self.identify(value)
        return None

    def identify(self, key: bytes) -> Caller | None:
        """The caller whose key is `key`, counted and noted for the access log; or None."""
        key_digest = digest(key)
        entry = self.by_digest.get(key_digest)
        if entry is not None and hmac.compare_digest(entry[0], key_digest):
            caller = entry[1]
        elif self.open and len(key) > 4 and key.startswith(b"tml-"):
            caller = self._anonymous(key_digest)
        else:
            return None
        caller.requests += 1
        CURRENT.set(caller.name)
        return caller

    def _anonymous(self, key_digest: bytes) -> Caller:
        caller = self.anonymous.get(key_digest)
        if caller is None:
            caller = Caller("anon-" + key_digest[:8].hex(), OPEN_LABEL)
            if len(self.anonymous) < OPEN_CACHE:
                self.anonymous[key_digest] = caller
        return caller

    def refusal(self, caller: Caller, outstanding: int) -> str | None:
        """Why `caller`'s asample must be refused (429) with `outstanding` of its samples
        pending, or None."""
        share = self.share
        if share is None or outstanding < share:
            return None
        return (
            f"{outstanding} samples of caller {caller.name} pending (its share: {share}, "
            "--max-outstanding-per-key)"
        )

    # -- the file --------------------------------------------------------------------------
    def _install(self, names: dict[bytes, str]) -> None:
        """Use `names` (digest -> NAME); a NAME kept from before keeps its counters."""
        known = self.known
        for name in names.values():
            if name not in known:
                known[name] = Caller(name, name)
        named = {name: known[name] for name in names.values()}
        self.by_digest = {d: (d, named[name]) for d, name in names.items()}
        self.named = named
        if self.per_key is None:
            whole = self.max_outstanding
            self.share = whole if len(named) == 1 else max(1, whole // 2)

    def reload(self) -> bool:
        """Read the file again; False (the callers before kept, the reason logged) when it
        cannot be read or does not parse."""
        if self.path is None:
            return False
        self._seen = _stat(self.path)
        try:
            names = keyfile.load(self.path)
        except KeyFileError as exc:
            if str(exc) != self.reload_error:
                log.error("%s; keeping the %d callers loaded before", exc, len(self.named))
            self.reload_error = str(exc)
            return False
        before = set(self.named)
        self._install(names)
        self.reloads += 1
        self.reload_error = None
        gone, new = sorted(before - set(self.named)), sorted(set(self.named) - before)
        log.info(
            "key file %s read again: %d callers (added: %s; removed: %s)",
            self.path,
            len(self.named),
            ", ".join(new) or "none",
            ", ".join(gone) or "none",
        )
        return True

    def check(self) -> None:
        """Reload when a SIGHUP came or the file changed since it was last read."""
        if self.path is None:
            return
        hangups = _hangups[0]
        if hangups != self._hangups or _stat(self.path) != self._seen:
            self._hangups = hangups
            self.reload()

    def start(self) -> None:
        """Watch the file on the running event loop (nothing to watch in open mode)."""
        if self.path is None:
            return
        loop = asyncio.get_running_loop()

        def tick() -> None:
            self.check()
            self._timer = loop.call_later(WATCH_INTERVAL, tick)

        self._timer = loop.call_later(WATCH_INTERVAL, tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- what is shown -----------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """/healthz (no key needed): the mode, how many callers (no NAME, never a key), the
        share and the last reload."""
        return {
            "mode": "open" if self.open else "key_file",
            "key_file": self.path,
            "callers": len(self.named),
            "share": self.share,
            "reloads": self.reloads,
            "reload_error": self.reload_error,
        }

    def tallies(self) -> dict[str, tuple[int, int]]:
        """label -> (requests, refused) counted by this process (open-mode callers summed)."""
        out = {name: (c.requests, c.refused) for name, c in self.known.items()}
        if self.anonymous:
            out[OPEN_LABEL] = (
                sum(c.requests for c in self.anonymous.values()),
                sum(c.refused for c in self.anonymous.values()),
            )
        return out


def _stat(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class NameInAccessLog(logging.Filter):
    """On uvicorn's access logger: each line gets the request's caller NAME after the client
    (`127.0.0.1:5000 - alice "POST /api/v1/asample HTTP/1.1" 200`; `-` before a key check)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == ACCESS_MESSAGE and isinstance(record.args, tuple):
            client, *rest = record.args
            record.msg = NAMED_MESSAGE
            record.args = (client, CURRENT.get(), *rest)
        return True
