"""Instruction counts (impl.ci.icount) and the gate's stage that judges them (impl.ci.gate_icount).

Counting needs Valgrind (`apt-get install -y valgrind`; .ci/run installs it): those tests skip
with that hint where it is missing. A count must be the measured call alone (a Python process
that only starts executes ~90 million instructions, so a count far below that has no start-up
in it), the same in two fresh processes, and follow the implementation the server picks.
"""

from __future__ import annotations

import re
import shutil

import pytest

from impl import pick
from impl.ci import gate_demo, gate_icount, icount, icount_steps
from impl.ci.stage import Verdict, accepted_names, is_accepted, label, print_table

needs_valgrind = pytest.mark.skipif(
    shutil.which("valgrind") is None,
    reason="valgrind is not installed (Debian: apt-get install -y valgrind)",
)


@pytest.mark.parametrize(
    "step", ["decode-128", "accesslog-record", "asample", "retrieve-try-again"]
)
@pytest.mark.heavy
def test_each_step_makes_its_call(step):
    """Each step builds a call that works outside Valgrind too (the routes answer 200)."""
    call = icount_steps.STEPS[step]()
    assert call() is not None or step == "accesslog-record"
    call()


@pytest.fixture(scope="module")
def record_count():
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed (Debian: apt-get install -y valgrind)")
    return icount.count("accesslog-record")


@needs_valgrind
@pytest.mark.slow
def test_count_is_the_call_alone_and_repeatable(record_count):
    """One access record: thousands of instructions, not the ~90M of a start-up; the same
    again within 0.1% (the issue's bound). With a real clock this step wandered up to 0.22%
    (the cached small ints of a record's milliseconds); frozen, 8 processes count the same."""
    assert 5_000 < record_count < 2_000_000
    again = icount.count("accesslog-record")
    assert max(again, record_count) / min(again, record_count) < 1.001


def test_frozen_clock_fixes_only_the_time():
    """The access-log step's clock: time() is fixed (at .500 s, an allocated millisecond int),
    everything else is the time module's."""
    import time

    clock = icount_steps.FrozenClock()
    assert clock.time() == icount_steps.FROZEN_CLOCK == clock.time()
    assert int((clock.time() % 1) * 1000) >= 257
    assert clock.gmtime is time.gmtime and clock.strftime is time.strftime


@needs_valgrind
@pytest.mark.slow
def test_count_follows_the_picked_implementation(record_count, monkeypatch):
    """HOTPATH_ACCESSLOG picks the handler (as for the server): a different handler counts
    differently; the null handler, which writes nothing, counts less."""
    if pick.pick("accesslog").name == "null":
        pytest.skip("the null handler is the pick here")
    monkeypatch.setenv("HOTPATH_ACCESSLOG", "null")
    assert icount.count("accesslog-record") < record_count


def test_without_valgrind_counting_says_how_to_install(monkeypatch):
    monkeypatch.setattr(icount.shutil, "which", lambda name: None)
    assert "apt-get install -y valgrind" in icount.unavailable_reason()
    with pytest.raises(RuntimeError, match="apt-get install -y valgrind"):
        icount.count("decode-128")
    with pytest.raises(ValueError, match="unknown step"):
        icount.count("no-such-step")


def test_accept_lines_name_benchmarks():
    """`Gate-accept:` lines, any case, comma or space separated, in any commit message."""
    messages = "decode: faster\n\nGate-accept: decode-262k, encode-262k\n\nfix\ngate-accept: all\n"
    assert accepted_names(messages) == ["decode-262k", "encode-262k", "all"]
    assert accepted_names("mentions Gate-accept: inline only") == []
    name, step = gate_icount.BENCHMARK, ("decode-262k",)
    assert is_accepted(name, step, ["decode-262k"])
    assert is_accepted(name, step, [label(name, step)])
    assert not is_accepted(name, ("decode-128",), ["decode-262k"])
    assert is_accepted("bench_decode.Decode.time_decode", None, ["time_decode"])
    assert is_accepted(name, ("asample",), ["all"])


def rows(**ratios):
    table = {}
    for step, ratio in ratios.items():
        step = step.replace("_", "-")
        head = None if ratio is None else 1000 * ratio
        params = (step,)
        ratio_value = None if ratio is None else head / 1000
        key = label(gate_icount.BENCHMARK, params)
        row = {"step": step, "params": params, "base": 1000, "head": head, "ratio": ratio_value}
        table[key] = row
    return table


def test_stage_fails_at_the_factor_unless_accepted(capsys):
    """1.05x fails at factor 1.05, 1.049x passes, an accepted rise passes, n/a on both commits
    is not judged, a step counted on the base but not on HEAD fails."""
    table = rows(decode_262k=1.05, decode_128=1.049, encode_262k=1.5, asample=None)
    table[label(gate_icount.BENCHMARK, ("asample",))]["base"] = None  # n/a on both
    broken = rows(retrieve_try_again=None)  # counted on the base, fails on HEAD
    counts = {**table, **broken}
    verdicts = {row.name: row.verdict for row in gate_icount.rows(counts, 1.05, ["encode-262k"])}
    assert verdicts == {
        "decode-262k": Verdict.WORSE,
        "decode-128": Verdict.PASS,
        "encode-262k": Verdict.ACCEPTED,
        "asample": Verdict.NOT_COMPARED,
        "retrieve-try-again": Verdict.BROKE,
    }
    print_table("instruction counts", gate_icount.rows(counts, 1.05, []), what="step", digits=4)
    out = capsys.readouterr().out
    for step, verdict in (("decode-262k", "FAIL"), ("decode-128", "pass"), ("asample", "n/a")):
        assert any(step in line and verdict in line for line in out.splitlines()), (step, out)


def test_values_reads_both_commits_per_step():
    """values() asks for each step on each commit; HEAD / base is the ratio."""
    stored = {("b", "decode-128"): 200.0, ("h", "decode-128"): 210.0, ("b", "asample"): 50.0}

    def results(commit, benchmarks):
        ((name, params),) = benchmarks
        value = stored.get((commit, params[0]))
        if value is not None:
            yield (name, [[repr(params[0])]], [value], [None], [None], None, "m", "env")

    table = gate_icount.values("b", "h", results)
    small = table[label(gate_icount.BENCHMARK, ("decode-128",))]
    assert (small["base"], small["head"], small["ratio"]) == (200.0, 210.0, 1.05)
    sample = table[label(gate_icount.BENCHMARK, ("asample",))]
    assert (sample["base"], sample["head"], sample["ratio"]) == (50.0, None, None)
    assert len(table) == len(icount_steps.STEPS)


def test_partial_slowdown_decodes_a_fraction_more(tmp_path):
    """--slowdown 1.5: after each body the decoder decodes a body of half its tokens; the
    result is still the body's own."""
    from impl import registry
    from impl.ci import gate_timers, repo
    from impl.decode.parity import same
    from impl.workloads.synthetic import body_for

    picked = gate_timers.picked("decode")
    source = (repo.ROOT / gate_demo.decoder_module(picked)).read_text()
    path = tmp_path / "patched.py"
    path.write_text(source + gate_demo.patch_for("slowdown", 1.5))
    decoder = gate_demo.load_module(path, "_test_gate_demo_partial").create()
    inner, decoded = decoder._decoder, []
    real = inner.decode
    inner.decode = lambda body, **options: decoded.append(real(body, **options)) or decoded[-1]
    body = body_for(128, kind="vllm")
    got = decoder.decode(body)
    assert [len(c.sequences[0].tokens) for c in decoded] == [128, 64]
    assert same(got, registry.create("decode", registry.reference("decode")).decode(body))
    with pytest.raises(ValueError, match="above 1"):
        gate_demo.patch_for("slowdown", 1.0)


@pytest.fixture(scope="module")
def counted_project(tmp_path_factory):
    """A tiny asv project whose track stands for an instruction count: 1000, 1040 (+4%), 1060
    (+6% on 1000), then 1060 again in a commit whose message accepts the rise."""
    from tests.support import asv_tiny as tiny

    repo = tmp_path_factory.mktemp("icountrepo")
    commits = tiny.project(repo, 3)
    (repo / "accepted.txt").write_text("x")
    tiny.git(repo, "add", "-A")
    tiny.git(repo, "commit", "-qm", "cost: intended\n\nGate-accept: track_value")
    commits.append(tiny.git(repo, "rev-parse", "HEAD"))
    for commit, value in zip(commits, ("1000", "1040", "1060", "1060"), strict=True):
        tiny.record(repo, "tiny-icount", commit, value)
    return repo, commits


@pytest.fixture
def counted_gate(counted_project, monkeypatch):
    """impl.ci.gate on the tiny project, its one track in the instruction-count stage."""
    from impl.ci import gate, gate_timers, repo
    from tests.support import asv_tiny as tiny

    project, commits = counted_project
    monkeypatch.setattr(repo, "ROOT", project)
    monkeypatch.setattr(gate_timers, "MACHINE", "tiny-icount")
    monkeypatch.setattr(gate_timers, "gated", lambda picks: [])
    monkeypatch.setattr(gate_timers, "picked", lambda family: "any")
    monkeypatch.setattr(gate_icount, "gated", lambda families=None: [(tiny.BENCH, None)])
    monkeypatch.setattr(gate_icount, "skipped_reason", lambda: None)
    return gate, commits


@pytest.mark.slow
def test_gate_fails_a_rise_at_the_factor_and_says_how_to_accept(counted_gate, capsys):
    gate, commits = counted_gate
    argv = ["--compare-only", "--base", commits[0]]
    assert gate.main([*argv, "--head", commits[1]]) == 0  # 1.04x
    assert gate.main([*argv, "--head", commits[2]]) == 1  # 1.06x
    out = capsys.readouterr().out
    assert "instructions rose by 1.05x or more: track_value" in out
    assert "Gate-accept: track_value" in out
    assert gate.main([*argv, "--head", commits[2], "--icount-factor", "1.1"]) == 0


@pytest.mark.heavy
def test_gate_passes_an_accepted_rise(counted_gate, capsys):
    """The same 1.06x rise passes when a commit in base..HEAD accepts it; it is still shown."""
    gate, commits = counted_gate
    assert gate.main(["--compare-only", "--base", commits[0], "--head", commits[3]]) == 0
    out = capsys.readouterr().out
    assert "accepted by commit message: track_value" in out
    assert re.search(r"track_value .*1\.0600 \| accepted", out), out


@pytest.mark.heavy
def test_cache_reads_back_the_same_key_only(tmp_path, monkeypatch):
    """HOTPATH_ICOUNT_CACHE: the first count of a key is made and written, a second is read back;
    another step is counted; without the variable every call counts."""
    made = []
    monkeypatch.setattr(icount, "count", lambda step: made.append(step) or 1000 + len(made))
    monkeypatch.setenv("HOTPATH_ICOUNT_CACHE", str(tmp_path))
    assert icount.cached_count("decode-128") == 1001
    assert icount.cached_count("decode-128") == 1001 and made == ["decode-128"]
    assert icount.cached_count("asample") == 1002 and made == ["decode-128", "asample"]
    monkeypatch.delenv("HOTPATH_ICOUNT_CACHE")
    assert icount.cached_count("decode-128") == 1003


@pytest.mark.heavy
def test_cache_key_follows_the_code_and_the_pick(monkeypatch):
    """The key changes with the step, with a file of the counted `impl` package, and with the
    implementation picked; it is stable otherwise."""
    import impl

    key = icount.cache_key("decode-128")
    assert icount.cache_key("decode-128") == key != icount.cache_key("decode-262k")
    monkeypatch.setenv("HOTPATH_DECODE", "json")
    picked_json = icount.cache_key("decode-128")
    monkeypatch.delenv("HOTPATH_DECODE")
    read_bytes = icount.Path.read_bytes
    target = icount.Path(impl.__file__).resolve()

    def edited(path):
        return read_bytes(path) + (b"# edited" if path == target else b"")

    monkeypatch.setattr(icount.Path, "read_bytes", edited)
    assert len({key, picked_json, icount.cache_key("decode-128")}) == 3


def test_only_gates_one_family():
    """`--only decode`: the decode steps; `server`: the routes; None: every step."""
    steps = {p[0] for _, p in gate_icount.gated({"decode"})}
    assert steps == {"decode-262k", "decode-128"}
    assert {p[0] for _, p in gate_icount.gated({"server"})} == {"asample", "retrieve-try-again"}
    assert len(gate_icount.gated()) == len(icount_steps.STEPS)


def test_server_step_freezes_only_what_it_says():
    """The route step: the loop's clock stands still, so no timer is due (none comes due
    during the calls), and the ids' random source (seeded while the app is built and during
    each call) is restored."""
    import asyncio
    import os

    from impl.server.store import ids

    urandom, source = os.urandom, ids.random_bytes
    call = icount_steps.STEPS["retrieve-try-again"]()
    call()
    loop = asyncio.get_event_loop()
    assert os.urandom is urandom and ids.random_bytes is source
    assert loop.time() == loop.time()
    assert not [t for t in loop._scheduled if not t.cancelled() and t.when() <= loop.time()]
