"""Several hosts on one shared store: two test hosts in network namespaces of their own, each
running `hotpath serve --workers 2`, one store on a third, the router and the load client on the
switch that joins them. Every process of one host is killed mid-load: no sample is lost, and the
forwards that host held are taken over (counted by the store).

The network: namespaces `<p>-net` (a bridge, 198.18.0.1, with the fake router and the client),
`<p>-store` (198.18.0.20: redis-server or valkey-server on TCP), `<p>-a` (198.18.0.11) and
`<p>-b` (198.18.0.12), each joined to the bridge by a veth pair. 198.18.0.0/15 is the range set
aside for network benchmarks (RFC 2544); the namespaces have no route out, and nothing is added
to the namespace the tests run in. Needs root and `ip` (iproute2; `.ci/run` installs it): where
namespaces cannot be made the tests skip, saying why. A finalizer kills every process in the
namespaces (by PID, `ip netns pids`) and deletes them, whether the test passed or not.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from impl.server.store.redis import embedded
from tests.support import engines
from tests.support.server import ROOT, Process, start

HOSTS = {"a": "198.18.0.11", "b": "198.18.0.12"}
STORE, SWITCH = "198.18.0.20", "198.18.0.1"
SAMPLES = 240
HOSTS_CLIENT = os.path.join("tests", "support", "hosts_client.py")


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _why_no_namespaces() -> str | None:
    """None when network namespaces can be made here, else why not."""
    if shutil.which("ip") is None:
        return "needs `ip` (iproute2: apt-get install iproute2)"
    if os.geteuid() != 0:
        return "needs root to make network namespaces"
    probe = f"hp-probe-{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe)
    return None


WHY = _why_no_namespaces()
pytestmark = [
    pytest.mark.heavy,
    pytest.mark.skipif(WHY is not None, reason=WHY or ""),
    pytest.mark.skipif(embedded.binary() is None, reason=embedded.INSTALL_HINT),
]


class Network:
    """The namespaces and what runs in them; `close()` leaves nothing behind."""

    def __init__(self) -> None:
        self.prefix = f"hp{os.getpid() % 10000}{uuid.uuid4().hex[:4]}"
        self.made: list[str] = []
        self.processes: list[Process | subprocess.Popen] = []

    def ns(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def run(self, *args: str) -> None:
        done = _ip(*args)
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def build(self) -> None:
        for name in ("net", "store", "a", "b"):
            self.run("netns", "add", self.ns(name))
            self.made.append(self.ns(name))
            self.run("-n", self.ns(name), "link", "set", "lo", "up")
        net = self.ns("net")
        self.run("-n", net, "link", "add", "br0", "type", "bridge")
        self.run("-n", net, "addr", "add", f"{SWITCH}/24", "dev", "br0")
        self.run("-n", net, "link", "set", "br0", "up")
        for name, address in (("store", STORE), *HOSTS.items()):
            end = f"v{name}"
            self.run("-n", net, "link", "add", end, "type", "veth", "peer", "name", "eth0",
                     "netns", self.ns(name))  # fmt: skip
            self.run("-n", net, "link", "set", end, "master", "br0", "up")
            self.run("-n", self.ns(name), "addr", "add", f"{address}/24", "dev", "eth0")
            self.run("-n", self.ns(name), "link", "set", "eth0", "up")

    def command(self, name: str, *command: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns(name), *command]

    def kill_all(self, name: str) -> list[int]:
        """SIGKILL every process in namespace `name` (a host that dies); their PIDs."""
        pids = [int(p) for p in _ip("netns", "pids", self.ns(name)).stdout.split()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def close(self) -> None:
        for process in self.processes:
            with contextlib.suppress(OSError, ValueError):
                process.stop(5) if isinstance(process, Process) else process.kill()
        for name in self.made:  # whatever is still running in them
            self.kill_all(name.removeprefix(f"{self.prefix}-"))
        deadline = time.monotonic() + 10
        for name in self.made:
            while _ip("netns", "pids", name).stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.1)
            _ip("netns", "del", name)
        self.made.clear()


@pytest.fixture
def network(request):
    net = Network()
    request.addfinalizer(net.close)  # first: even a half-built network is taken down
    net.build()
    return net


def _serve(net: Network, host: str, store_url: str, router_url: str) -> Process:
    command = net.command(
        host, sys.executable, "-m", "impl.cli", "serve", "--host", HOSTS[host], "--port", "8000",
        "--allow-any-key",  # beyond loopback: the client's one tml- key, no key file
        "--router-url", router_url, "--store", store_url, "--workers", "2", "--store-lease", "1",
        "--no-calibrate", "--log-level", "warning",
    )  # fmt: skip
    process = start(command, re.compile(r"^hotpath-server listening on (\S+)$"),
                    env={"HOTPATH_MEASUREMENTS": os.devnull}, timeout=120)  # fmt: skip
    net.processes.append(process)
    return process


@pytest.mark.parametrize("engine", engines.params())
@pytest.mark.slow
def test_a_host_killed_mid_load_loses_no_sample(network: Network, engine: str) -> None:
    """240 samples over two hosts (2 server processes each) on one store; when half were
    accepted, every process of host a is SIGKILLed. Every sample completes with its tokens
    (the client re-submits to host b what host a did not answer, with the same seq_id), host b
    takes over the forwards host a held (the store's `takeovers` counter), and the store
    finished none twice beyond those takeovers."""
    net = network
    binary = embedded.binaries()[engine]
    store = subprocess.Popen(
        net.command("store", binary, "--bind", STORE, "--port", "6379", "--protected-mode", "no",
                    "--save", "", "--appendonly", "no", "--loglevel", "warning"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    net.processes.append(store)
    router = start(
        net.command("net", sys.executable, "-m", "impl.cli", "router", "--host", SWITCH,
                    "--port", "8100", "--mode", "latency", "--gen-seconds", "2",
                    "--max-num-seqs", "128", "--body", "synthetic"),
        re.compile(r"^hotpath-router listening on (\S+)$"),
    )  # fmt: skip
    net.processes.append(router)
    store_url = f"redis://{STORE}:6379/0"
    hosts = {name: _serve(net, name, store_url, router.url) for name in HOSTS}
    client = subprocess.Popen(
        net.command("net", sys.executable, os.path.join(ROOT, HOSTS_CLIENT),
                    "--hosts", hosts["a"].url, hosts["b"].url, "--samples", str(SAMPLES),
                    "--max-tokens", "64", "--pause", "1"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    net.processes.append(client)
    killed: list[int] = []
    for line in client.stdout:
        if line.strip() == "HALF":
            killed = net.kill_all("a")  # the whole host: supervisor, workers, fetch processes
            break
    out, err = client.communicate(timeout=300)
    assert client.returncode == 0, err[-3000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert len(killed) >= 3, killed  # a supervisor and its two workers, at least
    assert report["completed"] == SAMPLES, report
    assert report["failed"] == {}, report
    assert hosts["a"].url in report["dead"], report
    assert sum(report["accepted_by"].values()) >= SAMPLES
    store_counters = report["store"]
    assert store_counters["takeovers"] >= 1, store_counters  # host a had forwards in flight
    assert store_counters["finished_twice"] <= store_counters["takeovers"], store_counters
    assert store_counters["failed"] == 0, store_counters
