"""Requests per second of the probes under `wrk`: /livez against /healthz (and /readyz).

Starts `hotpath serve` (one process, memory store, no calibration) and runs `wrk -t1 -c64
-d10s --latency` on /livez, /healthz and /readyz in turn, `--rounds` times (alternating, so
every path sees the same machine), and for each run the server process's CPU time per request
(`/proc/PID/schedstat`: less sensitive to other jobs on the cores than the rate). Prints req/s,
wrk's p50 and p99 latency, CPU per request, the ratio of /livez to /healthz per round, and the
load average. Needs `wrk` (`apt-get install wrk`). Run from the repository root:
`python -m impl.probes.probe_rates [--rounds 3] [--seconds 10]`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from _server import start_server, start_upstream

PATHS = ("/livez", "/healthz", "/readyz")
_RATE = re.compile(r"Requests/sec:\s+([0-9.]+)")
_COUNT = re.compile(r"(\d+) requests in")
_LATENCY = re.compile(r"^\s+(50|99)(?:\.000)?%\s+([0-9.]+)(us|ms|s)\s*$", re.M)
_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def run_wrk(url: str, seconds: int, pid: int) -> dict[str, float]:
    """One `wrk -t1 -c64` run: req/s, p50/p99 ms, non-2xx answers, server CPU µs/request."""
    before = cpu_seconds(pid)
    command = ["wrk", "-t1", "-c64", f"-d{seconds}s", "--latency", url]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    cpu = cpu_seconds(pid) - before
    rate, count = _RATE.search(output), _COUNT.search(output)
    if rate is None or count is None:
        raise RuntimeError(f"wrk said: {output}")
    figures = {"req_s": float(rate.group(1))}
    for q, value, unit in _LATENCY.findall(output):
        figures[f"p{q}_ms"] = round(float(value) * _UNIT[unit], 2)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    figures["non_2xx"] = int(non2xx.group(1)) if non2xx else 0
    figures["cpu_us_per_request"] = round(cpu / int(count.group(1)) * 1e6, 1)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("this probe needs wrk: apt-get install wrk")
    with start_upstream() as upstream, start_server(upstream.url) as server:
        print(f"load average at the start {os.getloadavg()}")
        for round_ in range(1, args.rounds + 1):
            figures = {path: run_wrk(server.url + path, args.seconds, server.pid) for path in PATHS}
            for path, row in figures.items():
                print(f"round {round_} {path:9} {row}")
            live, health = figures["/livez"], figures["/healthz"]
            print(
                f"round {round_}: /livez / /healthz = {live['req_s'] / health['req_s']:.1f}x "
                f"req/s, {health['cpu_us_per_request'] / live['cpu_us_per_request']:.1f}x "
                f"CPU per request; load average {os.getloadavg()}"
            )


if __name__ == "__main__":
    main()
