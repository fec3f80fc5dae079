"""What the embedded store's append-only file costs: the same load with and without it.

Runs `hotpath loadtest --preset small-2048 --server-workers 2 --store unix://SOCKET` against a
redis-server started the way the embedded store starts it (`impl.server.store.redis.embedded`),
once with its append-only file (`appendonly yes`, `appendfsync no`, as the embedded store runs)
and once with `--appendonly no`, alternating `--rounds` times. Prints per run: samples
completed and failed, results/s, the server processes' CPU per result, the redis-server's CPU
per result (from psutil: it is not a child of the server here) and the size of its files, with
the load average. Run from the repository root: `python -m impl.probes.store_aof [--rounds 2]`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import psutil

from impl.server.store.redis import embedded


def one(aof: bool, preset: str) -> dict:
    directory = tempfile.mkdtemp(prefix="hotpath-aof-")
    engine = embedded.start(directory=directory, extra=() if aof else ("--appendonly", "no"))
    try:
        process = psutil.Process(engine.pid)
        before = sum(process.cpu_times()[:2])
        report = os.path.join(directory, "report.json")
        command = [sys.executable, "-m", "impl.cli", "loadtest", "--preset", preset,
                   "--server-workers", "2", "--store", engine.url, "--no-progress",
                   "--report", report]  # fmt: skip
        subprocess.run(command, check=False, stdout=subprocess.DEVNULL)
        cpu = sum(process.cpu_times()[:2]) - before
        with open(report) as f:
            summary = json.load(f)["runs"][-1]["summary"]
        files = sum(
            os.path.getsize(os.path.join(root, name))
            for root, _, names in os.walk(directory)
            for name in names
            if "aof" in name
        )
        done = max(summary["completed"], 1)
        return {
            "appendonly": aof,
            "completed": summary["completed"],
            "failed": summary["failed"],
            "results_per_second": round(summary["results_per_second"], 1),
            "server_cpu_ms_per_result": round(summary["server_cpu_ms_per_result"], 3),
            "redis_cpu_ms_per_result": round(cpu * 1e3 / done, 3),
            "aof_mb": round(files / 2**20, 1),
            "load_average": [round(x, 1) for x in os.getloadavg()],
        }
    finally:
        engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--preset", default="small-2048")
    args = parser.parse_args()
    for _ in range(args.rounds):
        for aof in (False, True):
            print(json.dumps(one(aof, args.preset)), flush=True)


if __name__ == "__main__":
    main()
