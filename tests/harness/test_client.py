"""The SDK-shaped load client against a stand-in server that misbehaves on purpose (real sockets).

The stand-in (`tests/support/standin.py`, its own process) injects faults by sample number and
reports what it injected on /stats, so every figure of the client's report can be checked by
counting.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from impl.harness import load, presets, procs, report, watch
from impl.harness.client.config import ClientConfig, parse_sample_response
from tests.support.runs import few_samples

STANDIN = Path(__file__).parents[1] / "support" / "standin.py"
ROOT = Path(__file__).resolve().parents[2]


class Standin:
    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(STANDIN), "--port", "0", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        line = self.process.stdout.readline()
        assert line.startswith("standin listening on "), line
        self.url = line.split()[-1]

    def stats(self) -> dict:
        return watch.fetch_json(self.url + "/stats")

    def stop(self) -> None:
        procs.stop_pid(self.process, 5.0)


@pytest.fixture
def standin(request):
    started: list[Standin] = []

    def start(*args: str) -> Standin:
        started.append(Standin(*args))
        return started[-1]

    yield start
    for s in started:
        s.stop()


def _run(url: str, **changes) -> dict:
    scenario = presets.Scenario(num_requests=64, client_processes=2, timeout=60.0).with_overrides(
        **changes
    )
    return load.run_scenario(
        scenario,
        label="t",
        url=url,
        router_url=url,
        verify="exact",
        backoff_base=0.005,
        warmup=0,
        progress_bar=False,
    )


@pytest.mark.heavy
def test_clean_run_completes_and_checks_exact_tokens(standin):
    """64 samples, nothing injected: all complete, every token checked, no problems reported."""
    s = standin("--pending", "2")
    run = _run(s.url, max_tokens=24, num_samples=2)
    summary = report.summarize(run)
    assert summary["completed"] == 64 and summary["failed"] == 0, run["examples"]
    assert report.verdict(summary) == []
    assert run["retries"]["poll_try_again"] == 64 * 2
    assert run["tokens"] >= 64 * 24  # choice 0 is full length, choice 1 may stop early
    assert len(run["latencies"]) == 64
    assert s.stats()["forwards"] == 64
    assert summary["picks"] == {"decode": "standin"}
    assert summary["healthz_samples"] >= 1


@pytest.mark.heavy
def test_every_fault_is_counted_and_retried_like_the_sdk(standin):
    """Each injected fault shows up once in the report: retried (same seq_id) or failed by class."""
    s = standin(
        "--drop",
        "10",
        "--wrong",
        "13",
        "--error",
        "17",
        "--asample-fail",
        "429:5,503:7,reset:11",
        "--poll-fail",
        "503:3,reset:4,408:19",
        "--pending",
        "1",
    )
    run = _run(s.url)
    stats = s.stats()
    injected = stats["injected"]
    summary = report.summarize(run)
    # failures by class: exactly what the server did wrong
    assert run["failed"] == {
        "lost": injected["drop"],
        "wrong_result": injected["wrong"],
        "sample_error_server": injected["error"],
    }
    assert summary["completed"] == 64 - injected["drop"] - injected["wrong"] - injected["error"]
    # retries: one per injected transient fault, and asample retries reuse the seq_id
    retries = run["retries"]
    assert retries["asample_429"] == injected["asample_429"]
    assert retries["asample_503"] == injected["asample_503"]
    assert retries["asample_connection"] == injected["asample_reset"]
    assert retries["poll_503"] == injected["poll_503"]
    assert retries["poll_connection"] == injected["poll_reset"]
    assert stats["forwards"] == 64  # no sample generated twice
    assert stats["asample_calls"] == 64 + sum(
        v for k, v in injected.items() if k.startswith("asample_")
    )
    # the report carries what the upstream injected
    assert summary["router_injected"] == injected


@pytest.mark.heavy
def test_a_server_that_loses_results_is_caught(standin, capsys):
    """A stand-in that answers 404 for some results: the CLI reports it and exits non-zero."""
    s = standin("--drop", "8")
    code = load.run(
        _args(
            [
                "--url",
                s.url,
                "--router-url",
                s.url,
                "--num-requests",
                "32",
                "--client-processes",
                "1",
                "--no-progress",
                "--warmup",
                "0",
            ]
        )
    )
    out, err = capsys.readouterr()
    assert code == 1
    assert "lost=4" in out
    assert "PROBLEM" in err and "lost" in err


@pytest.mark.heavy
def test_timeout_bounds_the_run(standin):
    """Samples that never complete are reported as unfinished when --timeout passes."""
    s = standin("--pending", "1000000")
    run = _run(s.url, num_requests=16, timeout=2.0)
    # The worker stopped at its own deadline and said so; had it ignored --timeout, the
    # harness's hard stop (a minute later) would count its samples as client_crash instead.
    assert run["failed"] == {"unfinished": 16}
    assert run["examples"]["unfinished"] == "not done when the run's deadline passed"
    assert run["completed"] == 0
    assert run["wall_seconds"] >= 2.0  # held to the deadline, not given up early


@pytest.mark.heavy
def test_retries_are_bounded(standin):
    """An asample that fails every time stops after --tries with its class, not forever."""
    s = standin("--asample-fail", "503:1")  # only the first try of each fails...
    run = few_samples(s.url, tries=1, backoff_base=0.001, timeout=30.0)
    assert run["failed"] == {"asample_503": 8}  # ...but one try allows no retry


def test_wire_parser_matches_the_encoder():
    """The client's SampleResponse parser reads what the encode family's reference writes."""
    from impl import registry
    from impl.decode import Completion, Sequence

    reason = registry.unavailable_reason("encode", registry.reference("encode"))
    if reason:
        pytest.skip(reason)
    encoder = registry.create("encode", registry.reference("encode"))
    rng = np.random.default_rng(1)
    sequences = [
        Sequence(
            rng.integers(0, 128000, n, dtype=np.int32),
            rng.random(n, dtype=np.float32) * -5,
            "stop" if n % 2 else "length",
        )
        for n in (0, 1, 300, 70000)
    ]
    completion = Completion(
        sequences=sequences,
        prompt_logprobs=np.array([np.nan, -1.5], np.float32),
        topk_prompt_logprobs=None,
    )
    parsed = parse_sample_response(encoder.encode(completion))
    assert len(parsed) == len(sequences)
    for (stop, tokens, logprobs), seq in zip(parsed, sequences, strict=True):
        assert stop == (0 if seq.stop_reason == "stop" else 1)
        np.testing.assert_array_equal(tokens, seq.tokens)
        if len(seq.tokens):
            np.testing.assert_array_equal(logprobs, seq.logprobs)


def test_wire_parser_refuses_truncated_bytes():
    with pytest.raises((ValueError, IndexError)):
        parse_sample_response(b"\x0a\x10\x12\x08")


def test_client_configs_split_work_and_addresses():
    scenario = presets.Scenario(
        num_requests=10, client_processes=3, concurrency=400, max_outstanding=7
    )
    configs = load.client_configs("http://127.0.0.1:1", scenario)
    indices = sorted(i for c in configs for i in range(*c.indices))
    assert indices == list(range(10))
    assert len({c.source_address for c in configs}) == 3
    assert sum(c.max_outstanding for c in configs) == 7
    assert all(isinstance(c, ClientConfig) for c in configs)


def _args(argv: list[str]):
    import argparse

    parser = argparse.ArgumentParser()
    load.add_arguments(parser)
    return parser.parse_args(argv)
