"""A real Redis/Valkey Cluster for the tests: 3 primaries and 3 replicas on loopback ports.

Each node is `redis-server --cluster-enabled yes` (or valkey-server) in a temp dir of its own,
with an append-only file (a whole cluster stopped and started again keeps its data) and its
`nodes.conf`; `redis-cli --cluster create ... --cluster-replicas 1` joins them, and the fixture
waits for `cluster_state:ok` on every node. Every node is stopped by its PID (SIGTERM, then
SIGKILL), and its dir removed, pass or fail. A node's cluster bus is its port + 10000.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

import redis

#: a primary is deemed failed after this many ms without an answer (the replica takes over)
NODE_TIMEOUT_MS = 2000


def cli() -> str | None:
    """redis-cli (Debian's redis-tools, which redis-server depends on), or valkey-cli."""
    return shutil.which("redis-cli") or shutil.which("valkey-cli")


def _free_port() -> int:
    """A loopback port that is free, and so is its cluster bus port (+ 10000)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port > 55000:
            continue
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("127.0.0.1", port + 10000))
            return port
    raise RuntimeError("no free pair of loopback ports")


@dataclass
class Node:
    binary: str
    port: int
    directory: str
    extra: tuple[str, ...] = ()
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--dir", self.directory,
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", "no",
            "--daemonize", "no",
            "--loglevel", "warning",
            "--logfile", os.path.join(self.directory, "node.log"),
            *self.extra,
        ]  # fmt: skip
        # no parent-death signal: it follows the thread that started the node (a test's fault
        # thread restarts nodes), so the fixture's finalizer stops every node by PID
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"node {self.port} exited: {self.log()}")
            with contextlib.suppress(redis.RedisError, OSError):
                self.client().ping()
                return
            time.sleep(0.05)
        raise RuntimeError(f"node {self.port} did not answer: {self.log()}")

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send `sig` by PID; wait for the end when it is SIGKILL or SIGTERM."""
        if self.alive():
            os.kill(self.pid, sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                self.process.wait(10)

    def stop(self) -> None:
        """SIGTERM by PID (SIGCONT first: a stopped node would not see it), SIGKILL after 10 s."""
        if not self.alive():
            return
        os.kill(self.pid, signal.SIGCONT)
        os.kill(self.pid, signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.process.wait(10)

    def info(self, section: str) -> dict:
        return self.client().info(section)

    def log(self) -> str:
        with contextlib.suppress(OSError), open(os.path.join(self.directory, "node.log")) as f:
            return f.read()[-1500:]
        return "(no log)"


class Cluster:
    """3 primaries + 3 replicas (`size` nodes, `replicas` per primary) of one engine binary."""

    def __init__(self, binary: str, size: int = 6, replicas: int = 1) -> None:
        self.binary, self.size, self.replicas = binary, size, replicas
        self.root = tempfile.mkdtemp(prefix="hotpath-cluster-")
        self.nodes: list[Node] = []

    @property
    def url(self) -> str:
        """`--store` for the cluster: any one node (the first that is alive)."""
        node = next(n for n in self.nodes if n.alive())
        return f"redis://{node.address}"

    def start(self) -> Cluster:
        try:
            for i in range(self.size):
                directory = os.path.join(self.root, str(i))
                os.makedirs(directory)
                node = Node(self.binary, _free_port(), directory)
                self.nodes.append(node)
                node.start()
            tool = cli()
            if tool is None:
                raise RuntimeError("redis-cli is missing: apt-get install redis-tools")
            subprocess.run(
                [tool, "--cluster", "create", *(n.address for n in self.nodes),
                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
            self.wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ok(self, timeout: float = 60.0) -> None:
        """Until every live node says `cluster_state:ok` and knows one primary per shard with
        all its replicas in sync."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError, OSError):
                live = [n for n in self.nodes if n.alive()]
                infos = [n.client().cluster("INFO") for n in live]
                last = str(infos[0])
                if live and all(i.get("cluster_state") == "ok" for i in infos) and self._synced():
                    return
            time.sleep(0.1)
        raise RuntimeError(f"the cluster is not ok within {timeout:.0f} s: {last}")

    def _synced(self) -> bool:
        for node in self.nodes:
            if node.alive() and node.info("replication").get("role") == "slave":
                info = node.info("replication")
                if info.get("master_link_status") != "up":
                    return False
        return True

    def primaries(self) -> list[Node]:
        return [
            n for n in self.nodes if n.alive() and n.info("replication").get("role") == "master"
        ]

    def replicas_of(self, primary: Node) -> list[Node]:
        found = []
        for node in self.nodes:
            if node is primary or not node.alive():
                continue
            info = node.info("replication")
            if info.get("role") == "slave" and int(info.get("master_port") or 0) == primary.port:
                found.append(node)
        return found

    def cut_off(self, primary: Node, timeout: float = 10.0) -> list[Node]:
        """Stop `primary`'s replicas from replicating it, both processes alive: each replica is
        given a `masterauth` (the primary has no password, so the AUTH that opens every
        reconnect fails), then the primary drops its replica links (`CLIENT KILL TYPE
        replica`). The primary goes on answering writes that no replica gets; `reconnect`
        undoes it. Returns the replicas, once the primary counts none connected."""
        replicas = self.replicas_of(primary)
        for node in replicas:
            node.client().config_set("masterauth", "no-such-password")
        primary.client().execute_command("CLIENT", "KILL", "TYPE", "replica")
        deadline = time.monotonic() + timeout
        while primary.info("replication").get("connected_slaves"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{primary.address} keeps its replicas: {primary.log()}")
            time.sleep(0.02)
        return replicas

    def reconnect(self, replicas: list[Node]) -> None:
        """Undo `cut_off` on those of `replicas` that are alive (each may be a primary by now)."""
        for node in replicas:
            if node.alive():
                node.client().config_set("masterauth", "")

    def busiest_primary(self) -> Node:
        """The primary holding the most keys."""
        return max(self.primaries(), key=lambda n: n.client().dbsize())

    def node_at(self, port: int) -> Node:
        return next(n for n in self.nodes if n.port == port)

    def restart(self) -> None:
        """Stop every node (SIGTERM by PID) and start them again on their dirs: each reads its
        append-only file and nodes.conf back."""
        for node in self.nodes:
            node.stop()
        for node in self.nodes:
            node.start()
        self.wait_ok()

    def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def pids(self) -> list[int]:
        return [n.pid for n in self.nodes if n.process is not None]


@contextlib.contextmanager
def running(binary: str, **options: int):
    cluster = Cluster(binary, **options).start()
    try:
        yield cluster
    finally:
        cluster.stop()
