"""The gate's end-to-end stage (impl.ci.gate_e2e) and its demonstration case (gate_demo_e2e):
the verdict on the rounds' ratios, each commit's exported tree, and the demo's slowdown patch
served by a real server. The stage itself takes minutes (make gate, make gate-demo)."""

from __future__ import annotations

import shutil

import pytest

from impl.ci import e2e_rounds, gate, gate_demo, gate_demo_e2e, gate_e2e, repo, trees
from impl.harness import procs
from tests.support import asv_tiny as tiny
from tests.support.server import Api


def _run(side: str, round_: int, rps: float, p50: float) -> e2e_rounds.Run:
    return e2e_rounds.Run(side, round_, rps, p50, 0.0)


def test_verdict_takes_the_median_of_the_per_round_ratios():
    """Five rounds: one disturbed round (3x) does not fail an unchanged commit; a consistent
    1.5x does; the throughput ratio counts as much as the latency ratio."""
    unchanged = [
        _run("base", 0, 500, 0.030), _run("HEAD", 0, 490, 0.031),
        _run("HEAD", 1, 160, 0.090), _run("base", 1, 480, 0.030),  # another job's burst
        _run("base", 2, 510, 0.029), _run("HEAD", 2, 505, 0.029),
        _run("base", 3, 500, 0.030), _run("HEAD", 3, 495, 0.0305),
        _run("HEAD", 4, 500, 0.0295), _run("base", 4, 505, 0.030),
    ]  # fmt: skip
    pairs = gate_e2e.ratios(unchanged)
    assert len(pairs) == 5 and pairs[1][0] == pytest.approx(3.0)
    latency, throughput, worse = gate_e2e.verdict(pairs, 1.15)
    assert not worse and latency == pytest.approx(0.0305 / 0.030) and throughput < 1.1
    slow = [_run(r.side, r.round, r.results_per_second, r.p50) for r in unchanged]
    for run in slow:
        if run.side == "HEAD":
            run.p50 = 1.5 * next(b.p50 for b in slow if b.side == "base" and b.round == run.round)
    assert gate_e2e.verdict(gate_e2e.ratios(slow), 1.15)[2]
    fewer = [_run(r.side, r.round, r.results_per_second / 1.4, r.p50) for r in unchanged]
    fewer = [r if r.side == "HEAD" else unchanged[i] for i, r in enumerate(fewer)]
    assert gate_e2e.verdict(gate_e2e.ratios(fewer), 1.15)[2]  # results/s fell 1.4x


def test_a_round_missing_a_side_is_not_compared():
    assert gate_e2e.ratios([_run("base", 0, 1, 1), _run("HEAD", 1, 1, 1)]) == []


def test_each_commit_is_exported_once_with_the_compiled_decoders(tmp_path, monkeypatch):
    """A commit's tree holds its files (not the working tree's edits), is reused once made,
    and gets this tree's built extensions when the C++ sources are those of the commit."""
    root = tmp_path / "source"
    (root / "impl" / "decode" / "_native").mkdir(parents=True)
    (root / ".gitignore").write_text("*.so\n")
    (root / "setup.py").write_text("# builds nothing\n")
    (root / "impl" / "decode" / "_native" / "fast.cpp").write_text("// v1\n")
    (root / "impl" / "mod.py").write_text("VERSION = 1\n")
    tiny.git(root, "init", "-q", "-b", "main")
    tiny.git(root, "add", "-A")
    tiny.git(root, "commit", "-qm", "first")
    first = tiny.git(root, "rev-parse", "HEAD")
    (root / "impl" / "decode" / "_fast.so").write_bytes(b"\x7fELF v1")
    (root / "impl" / "mod.py").write_text("VERSION = 2\n")  # uncommitted
    monkeypatch.setattr(repo, "ROOT", root)
    work = tmp_path / "e2e"
    tree = trees.tree_of(first, work)
    assert tree == work / first
    assert (tree / "impl" / "mod.py").read_text() == "VERSION = 1\n"
    assert (tree / "impl" / "decode" / "_fast.so").read_bytes() == b"\x7fELF v1"
    (tree / "impl" / "mark").write_text("kept")
    assert trees.tree_of("HEAD", work) == tree and (tree / "impl" / "mark").exists()
    # Another commit with other C++ sources: this tree's build is not copied.
    (root / "impl" / "decode" / "_native" / "fast.cpp").write_text("// v2\n")
    tiny.git(root, "commit", "-qam", "second")
    (root / "impl" / "decode" / "_native" / "fast.cpp").write_text("// v3, being edited\n")
    second = trees.tree_of("HEAD", work)
    assert not (second / "impl" / "decode" / "_fast.so").exists()


def test_gate_lists_the_stage_and_refuses_too_few_rounds(capsys):
    assert gate.main(["--only", "e2e", "--list"]) == 0
    assert "end-to-end stage" in capsys.readouterr().out
    assert gate.main(["--only", "e2e", "--e2e-rounds", "2", "--list"]) == 2


def test_demo_e2e_case_is_only_with_its_factor(capsys):
    with pytest.raises(SystemExit):
        gate_demo.main(["--e2e-slowdown", "1.5", "--cases", "slow"])
    with pytest.raises(SystemExit):
        gate_demo.main(["--cases", "e2e"])
    with pytest.raises(ValueError, match="above 1"):
        gate_demo_e2e.patch(1.0)


@pytest.mark.slow
def test_demo_e2e_patch_still_serves_every_result(tmp_path, upstream):
    """The hot routes with the end-to-end slowdown appended: the server starts from that tree,
    and each sample's result comes back, exactly as from the unchanged server (the delay only
    postpones it)."""
    tree = tmp_path / "tree"
    shutil.copytree(repo.ROOT / "impl", tree / "impl", ignore=shutil.ignore_patterns("__pycache__"))
    module = tree / gate_demo_e2e.MODULE
    module.write_text(module.read_text() + gate_demo_e2e.patch(1.5))
    server = procs.start_server(upstream.url, extra=["--no-calibrate"], cwd=tree)
    try:
        api = Api(server.url)
        ssid = api.sampling_session()
        for seq_id in (1, 2, 3):
            request_id = api.asample(ssid, seq_id, seed=seq_id).json()["request_id"]
            response = api.result(request_id)
            assert response.status_code == 200
            assert response.headers["content-type"] == "application/x-protobuf"
            assert len(response.content) > 0
        api.close()
    finally:
        server.stop()
