"""Who may sample, end to end: real `hotpath serve` processes on loopback sockets with an
`--api-keys` file of three callers (alice and bob by key, carol by sha256), the stand-in
upstream, httpx and the real Tinker SDK.

- an unknown key, the bare `tml-`, no key: 401 on every route;
- bob asking for alice's request ids, sessions, sampling sessions and `retrieve_futures` gets
  the very answer an id that never existed gets (status, headers and body, but the id), on the
  memory store and with `--workers 2` (embedded redis-server; fresh connections land on both
  processes); bob's retry of alice's sample is not deduplicated into her future;
- ids carry 128 random bits and never count;
- a key removed from the file answers 401 within a second (SIGHUP alone, with the file's
  mtime, size and inode kept; and an edit alone) in every process, while the others' samples
  complete; a file that does not parse keeps the keys before;
- a burst from alice past her share: 429 + Retry-After for her, 200 for bob;
- without a key file beyond loopback the server refuses to start, naming --api-keys;
- the access log and /metrics show NAMEs, never a key; the SDK samples exactly with a key.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest

from impl.server.store.ids import new_id
from impl.server.store.redis import embedded
from impl.workloads import synthetic
from tests.support.server import ROOT, Api, start_server

pytestmark = pytest.mark.heavy

KEYS = {
    "alice": "tml-alice-" + "a1" * 12,
    "bob": "tml-bob-" + "b2" * 12,
    "carol": "tml-carol-" + "c3" * 12,
}
DELAY_BASE = 800_000_000  # tests/support/fake_vllm.py: seed DELAY_BASE + ms answers after ms
STACKS = {"memory": (), "workers2": ("--workers", "2")}
shared = pytest.mark.skipif(embedded.binary() is None, reason=embedded.INSTALL_HINT)


def key_lines(names=("alice", "bob", "carol")) -> str:
    lines = ["# who may sample"]
    for name in names:
        key = KEYS[name]
        secret = "sha256:" + hashlib.sha256(key.encode()).hexdigest() if name == "carol" else key
        lines.append(f"{name} {secret}")
    return "\n".join(lines) + "\n"


def write_keys(path, names=("alice", "bob", "carol")) -> str:
    path.write_text(key_lines(names))
    return str(path)


class Fresh(Api):
    """An Api whose every request opens a new connection (with --workers 2, the kernel spreads
    them over both processes)."""

    def __init__(self, url: str, api_key: str) -> None:
        super().__init__(url, api_key=api_key)
        self.http.close()
        self.http = httpx.Client(
            base_url=url,
            headers={"X-API-Key": api_key},
            timeout=60,
            limits=httpx.Limits(max_keepalive_connections=0),
        )


@pytest.fixture(scope="module", params=[p if p == "memory" else pytest.param(p, marks=shared)
                                        for p in STACKS])  # fmt: skip
def stack(request, upstream, tmp_path_factory):
    path = write_keys(tmp_path_factory.mktemp("keys") / "keys.txt")
    with start_server(upstream.url, "--api-keys", path, *STACKS[request.param]) as server:
        yield server


def same_answer(mine: httpx.Response, never: httpx.Response, my_id: str, never_id: str) -> None:
    """Two answers are the same but for the id they quote."""
    assert mine.status_code == never.status_code == 404
    assert mine.text.replace(my_id, "ID") == never.text.replace(never_id, "ID")
    headers = [{k: v for k, v in r.headers.items() if k != "date"} for r in (mine, never)]
    assert headers[0] == headers[1]


def test_unknown_keys_and_the_bare_prefix_are_401_everywhere(stack):
    routes = [
        ("/api/v1/asample", {}),
        ("/api/v1/retrieve_future", {"request_id": "x"}),
        ("/api/v1/retrieve_futures", {"target": {"sampling_session_id": "x"}}),
        ("/api/v1/create_session", {"tags": []}),
        ("/api/v1/client/config", {}),
    ]
    hashed = "sha256:" + hashlib.sha256(KEYS["carol"].encode()).hexdigest()
    for key in ("tml-", "tml-mallory-0123456789abcdef", hashed, KEYS["alice"][:-1], None):
        headers = {} if key is None else {"X-API-Key": key}
        for path, body in routes:
            answer = httpx.post(stack.url + path, json=body, headers=headers, timeout=30)
            assert answer.status_code == 401, (key, path, answer.text)
            assert "--api-keys" in answer.json()["detail"]
    carol = Api(stack.url, api_key=KEYS["carol"])  # the hashed line's key itself works
    assert carol.post("/api/v1/create_session", {"tags": []}).status_code == 200
    carol.close()


def test_another_callers_ids_answer_like_ids_that_never_existed(stack, upstream):
    alice = Api(stack.url, api_key=KEYS["alice"])
    bob = Fresh(stack.url, KEYS["bob"])
    forwarded = len([e for e in upstream.get("/sent") if e["request"].get("seed") == 4242])
    ssid = alice.sampling_session()
    session = ssid.split(":sample:")[0]
    rid = alice.asample(ssid, 0, seed=4242).json()["request_id"]
    result = alice.result(rid)
    assert result.status_code == 200
    never = new_id()
    never_session = f"session-{new_id()}"
    never_ssid = f"{never_session}:sample:0"

    def futures(sampling: str) -> dict:
        return {"target": {"sampling_session_id": sampling}, "timeout": 0}

    def asample(sampling: str) -> dict:
        prompt = {"chunks": [{"type": "encoded_text", "tokens": [128000, 1, 2, 3]}]}
        params = {"max_tokens": 8, "seed": 4242, "temperature": 1.0}
        return {"sampling_session_id": sampling, "seq_id": 0, "num_samples": 1,
                "prompt": prompt, "sampling_params": params}  # fmt: skip

    probes = [  # (path, body for an id, the id, the never-existing id)
        ("/api/v1/retrieve_future", lambda i: {"request_id": i}, rid, never),
        ("/api/v1/session_heartbeat", lambda i: {"session_id": i}, session, never_session),
        (
            "/api/v1/create_sampling_session",
            lambda i: {"session_id": i, "sampling_session_seq_id": 1, "base_model": "m"},
            session,
            never_session,
        ),
        ("/api/v1/join_sampling_session", lambda i: {"sampling_session_id": i}, ssid, never_ssid),
        ("/api/v1/asample", asample, ssid, never_ssid),  # alice's very sample, retried by bob
        ("/api/v1/retrieve_futures", futures, ssid, never_ssid),
        (f"/api/v1/sessions/{session}/finish", lambda i: {}, session, never_session),
    ]
    for _ in range(4):  # fresh connections: with --workers 2, both processes answer
        for path, body, mine, other in probes:
            answer_mine = bob.post(path.replace("{session}", mine), body(mine))
            answer_never = bob.post(path.replace(session, other), body(other))
            same_answer(answer_mine, answer_never, mine, other)
    forwards = [e for e in upstream.get("/sent") if e["request"].get("seed") == 4242]
    assert len(forwards) == forwarded + 1  # bob's retry generated nothing, nor got hers
    again = alice.asample(ssid, 0, seed=4242).json()["request_id"]
    assert again == rid  # alice's own retry is deduplicated, as ever
    assert alice.result(rid).content == result.content  # untouched by bob's asking
    assert alice.post("/api/v1/session_heartbeat", {"session_id": session}).status_code == 200
    own = Api(stack.url, api_key=KEYS["bob"])
    bob_rid = own.asample(own.sampling_session(), 0, seed=4242).json()["request_id"]
    assert bob_rid != rid and own.result(bob_rid).status_code == 200
    for client in (alice, bob, own):
        client.close()


def counts_up(a: str, b: str) -> bool:
    """`b` is `a` with its trailing number plus one (what a counter hands out next)."""
    ma, mb = re.search(r"(\d+)$", a), re.search(r"(\d+)$", b)
    return bool(ma and mb and a[: ma.start()] == b[: mb.start()] and int(mb[1]) == int(ma[1]) + 1)


def shared_prefix(a: str, b: str) -> int:
    pairs = zip(a, b, strict=False)
    return sum(1 for _ in itertools.takewhile(lambda pair: pair[0] == pair[1], pairs))


def test_ids_carry_random_bits_and_never_count(stack):
    import base64

    alice = Api(stack.url, api_key=KEYS["alice"])
    ssid = alice.sampling_session()
    rids = [alice.asample(ssid, i, seed=7000 + i).json()["request_id"] for i in range(20)]
    sessions = [
        alice.post("/api/v1/create_session", {"tags": []}).json()["session_id"] for _ in range(20)
    ]
    tokens = rids + [s.removeprefix("session-") for s in sessions]
    assert all(s.startswith("session-") for s in sessions)
    for token in tokens:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        assert len(raw) * 8 >= 96, token
    assert len(set(tokens)) == len(tokens)
    for ids in (rids, sessions):
        assert not any(counts_up(a, b) for a, b in itertools.pairwise(ids))
        assert max(shared_prefix(a, b) for a, b in itertools.pairwise(ids)) < len("session-") + 6
    for rid in rids:
        assert alice.result(rid).status_code == 200
    alice.close()


def test_the_access_log_and_metrics_show_names_never_keys(stack):
    alice = Api(stack.url, api_key=KEYS["alice"])
    alice.sampling_session()
    metrics = ""
    deadline = time.monotonic() + 10
    while 'hotpath_caller_requests_total{caller="alice"}' not in metrics:
        assert time.monotonic() < deadline, metrics[-2000:]
        metrics = alice.http.get("/metrics").text  # synced before each scrape
        time.sleep(0.2)
    assert 'hotpath_caller_outstanding{caller="alice"}' in metrics
    time.sleep(0.5)  # the last access lines reach the pipe
    text = "".join(stack.lines)
    assert re.search(r' - alice "POST /api/v1/create_session HTTP/1.1" 200', text), text[-2000:]
    assert re.search(r' - - "POST /api/v1/\S+ HTTP/1.1" 401', text)  # refused: no NAME
    for key in KEYS.values():
        assert key not in text and key not in metrics and key not in stack.stderr()
    alice.close()


def test_the_sdk_samples_exactly_with_a_configured_key(stack):
    tinker = pytest.importorskip("tinker", reason="needs `pip install 'hotpath[sdk]'`")
    from tinker import types

    os.environ.setdefault("TINKER_TELEMETRY", "0")
    service = tinker.ServiceClient(base_url=stack.url, api_key=KEYS["bob"])
    client = service.create_sampling_client(base_model="fake/model").result()
    prompt = [128000, 5, 6, 7]
    response = client.sample(
        prompt=types.ModelInput.from_ints(prompt),
        sampling_params=types.SamplingParams(max_tokens=10, seed=31337, temperature=0.7),
        num_samples=2,
    ).result(timeout=60)
    expected = synthetic.generate(prompt, n=2, max_tokens=10, seed=31337)
    for seq, want in zip(response.sequences, expected, strict=True):
        assert np.array_equal(seq.tokens_np, want.tokens)
        assert np.array_equal(seq.logprobs_np, want.logprobs)
    service.close("success").result(timeout=30)


# -- reloads ------------------------------------------------------------------------------------


def _revoked_everywhere(url: str, key: str, started: float, deadline: float = 5.0) -> float:
    """Seconds from `started` until 8 requests in a row on fresh connections answer 401."""
    client = Fresh(url, key)
    streak = 0
    while streak < 8:
        assert time.monotonic() - started < deadline, "the removed key still works"
        status = client.post("/api/v1/create_session", {"tags": []}).status_code
        assert status in (200, 401)
        streak = streak + 1 if status == 401 else 0
        if streak == 1:
            first = time.monotonic()
    client.close()
    return first - started


def _sampling(url: str, names: tuple[str, ...], stop: threading.Event, out: list) -> None:
    """Samples of `names` in turn until `stop`; each outcome appended to `out`."""
    clients = {n: Api(url, api_key=KEYS[n]) for n in names}
    ssids = {n: c.sampling_session() for n, c in clients.items()}
    i = 0
    while not stop.is_set():
        for name, client in clients.items():
            i += 1
            rid = client.asample(ssids[name], i, seed=50_000 + i).json()["request_id"]
            out.append((name, client.result(rid, proto=False).json()["sequences"][0]["tokens"],
                        synthetic.generate([128000, 1, 2, 3], n=1, max_tokens=8,
                                        seed=50_000 + i)[0].tokens.tolist()))  # fmt: skip
    for client in clients.values():
        client.close()


def _grows(outcomes: list, count: int, thread: threading.Thread) -> None:
    """Wait until the sampling thread has `count` outcomes (failing if it died or stalled)."""
    deadline = time.monotonic() + 60
    while len(outcomes) < count:
        assert thread.is_alive() and time.monotonic() < deadline, outcomes[-3:]
        time.sleep(0.05)


@shared
def test_sighup_and_edits_revoke_a_key_within_a_second_in_every_process(upstream, tmp_path):
    path = tmp_path / "keys.txt"
    write_keys(path)
    with start_server(upstream.url, "--api-keys", str(path), "--workers", "2") as server:
        stop, done = threading.Event(), []
        others = threading.Thread(target=_sampling, args=(server.url, ("alice", "bob"), stop, done))
        others.start()
        _grows(done, 2, others)
        # SIGHUP alone: carol's line becomes a comment of the same length, mtime and inode kept
        before = os.stat(path)
        text = key_lines()
        carol = next(line for line in text.splitlines() if line.startswith("carol"))
        with open(path, "r+") as f:
            f.write(text.replace(carol, "#" + carol[1:]))
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = os.stat(path)
        assert (after.st_mtime_ns, after.st_size, after.st_ino) == (
            before.st_mtime_ns, before.st_size, before.st_ino)  # fmt: skip
        assert Api(server.url, api_key=KEYS["carol"]).post(
            "/api/v1/create_session", {"tags": []}).status_code == 200  # fmt: skip
        started = time.monotonic()
        os.kill(server.pid, signal.SIGHUP)  # the supervisor passes it to each worker
        assert _revoked_everywhere(server.url, KEYS["carol"], started) < 1.0
        _grows(done, len(done) + 2, others)  # alice and bob still sample after the reload
        stop.set()
        others.join(60)
        # an edit alone (a new file moved into place), no signal: bob goes, alice samples on
        stop, later = threading.Event(), []
        alone = threading.Thread(target=_sampling, args=(server.url, ("alice",), stop, later))
        alone.start()
        path.with_suffix(".new").write_text(key_lines(("alice",)))
        started = time.monotonic()
        os.replace(path.with_suffix(".new"), path)
        assert _revoked_everywhere(server.url, KEYS["bob"], started) < 1.0
        _grows(later, len(later) + 1, alone)
        stop.set()
        alone.join(60)
        # a file that does not parse keeps the keys before, and the log says why
        path.write_text("alice\n")
        os.kill(server.pid, signal.SIGHUP)
        time.sleep(1.0)
        alice = Fresh(server.url, KEYS["alice"])
        for _ in range(6):
            assert alice.post("/api/v1/create_session", {"tags": []}).status_code == 200
        assert "keeping the 1 callers loaded before" in server.stderr()
        assert alice.healthz()["callers"]["reload_error"]
        alice.close()
    assert {name for name, _, _ in done} == {"alice", "bob"} and len(done) >= 4
    assert {name for name, _, _ in later} == {"alice"}
    assert all(got == want for _, got, want in done + later)  # each one completed exactly


# -- the fair room ------------------------------------------------------------------------------


@pytest.mark.parametrize("store", ["memory", pytest.param("embedded", marks=shared)])
def test_a_burst_past_a_callers_share_is_429_for_it_alone(upstream, tmp_path, store):
    path = write_keys(tmp_path / "keys.txt")
    args = ("--api-keys", path, "--max-outstanding", "8", "--store", store)
    with start_server(upstream.url, *args) as server:
        alice, bob = Api(server.url, api_key=KEYS["alice"]), Api(server.url, api_key=KEYS["bob"])
        assert alice.healthz()["callers"]["share"] == 4  # half the room by default
        ssid = alice.sampling_session()
        slow = DELAY_BASE + 3000  # each stays pending 3 s at the upstream
        answers = [alice.asample(ssid, i, seed=slow + i) for i in range(6)]
        assert [a.status_code for a in answers] == [200] * 4 + [429] * 2
        assert answers[4].headers["retry-after"] == "1"
        assert "caller alice" in answers[4].json()["detail"] and "share: 4" in answers[4].text
        repeat = alice.asample(ssid, 0, seed=slow)  # a repeat of an accepted one still answers
        assert repeat.status_code == 200
        assert repeat.json()["request_id"] == answers[0].json()["request_id"]
        bob_ssid = bob.sampling_session()
        assert [bob.asample(bob_ssid, i, seed=slow + 10 + i).status_code for i in range(4)] == [
            200
        ] * 4
        metrics = alice.http.get("/metrics").text
        assert 'hotpath_caller_rejections_total{caller="alice"} 2.0' in metrics
        assert 'hotpath_caller_rejections_total{caller="bob"}' not in metrics or (
            'hotpath_caller_rejections_total{caller="bob"} 0.0' in metrics
        )
        assert 'hotpath_backpressure_rejections_total{limit="share"} 2.0' in metrics
        for answer in answers[:4]:
            assert alice.result(answer.json()["request_id"]).status_code == 200
        # her samples done: room again (the shared store's counts are refreshed every 0.2 s,
        # so a 429 is retried, as its Retry-After asks, a few times)
        for _ in range(20):
            again = alice.asample(ssid, 100, seed=101)
            if again.status_code != 429:
                break
            time.sleep(0.1)
        assert again.status_code == 200
        alice.close()
        bob.close()


# -- start-up -------------------------------------------------------------------------------------


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`hotpath serve` that is expected to refuse to start (it exits before it listens)."""
    return subprocess.run(
        [sys.executable, "-m", "impl.cli", "serve", "--port", "0", "--no-calibrate", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "HOTPATH_MEASUREMENTS": os.devnull, **(env or {})},
    )  # fmt: skip


def test_beyond_loopback_without_keys_it_refuses_to_start_naming_api_keys():
    done = _serve("--host", "0.0.0.0")
    assert done.returncode != 0
    assert "--api-keys" in done.stderr and "--allow-any-key" in done.stderr
    assert "listening" not in done.stdout


def test_a_missing_or_bad_key_file_is_a_clear_start_up_error(tmp_path):
    done = _serve("--api-keys", str(tmp_path / "nope.txt"))
    assert done.returncode == 2 and "cannot read the key file" in done.stderr
    assert "nope.txt" in done.stderr
    bad = tmp_path / "bad.txt"
    bad.write_text(f"alice {KEYS['alice']}\nbob\n")
    done = _serve(env={"HOTPATH_API_KEYS": str(bad)})
    assert done.returncode == 2 and "bad.txt line 2" in done.stderr
    assert KEYS["alice"] not in done.stderr


def test_without_keys_on_loopback_any_tml_key_works_and_the_start_up_says_so(upstream):
    with start_server(upstream.url) as server:
        assert "any X-API-Key starting with 'tml-' may sample" in server.stderr()
        mallory = Api(server.url, api_key="tml-mallory")
        alice = Api(server.url, api_key="tml-alice")
        ssid = alice.sampling_session()
        rid = alice.asample(ssid, 0, seed=99).json()["request_id"]
        assert alice.result(rid).status_code == 200
        assert mallory.retrieve(rid).status_code == 404  # each key a caller of its own
        bare = Api(server.url, api_key="tml-")
        assert bare.post("/api/v1/create_session", {"tags": []}).status_code == 401
        for client in (mallory, alice, bare):
            client.close()
