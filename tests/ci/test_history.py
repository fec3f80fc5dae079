"""The history subset reads what each commit has, and counts as the gate counts.

`benchmarks/history.py` runs against older commits' packages, so a module path a commit lacks
must turn into asv's n/a (NotImplementedError), and its instruction counts must be the gate's
(`impl.ci.icount`): the same fixed environment, and for a commit without `impl.ci.icount`
today's steps file run through `benchmarks/history_icount.py`.
"""

from __future__ import annotations

import shutil

import pytest

from benchmarks import history, history_compat
from impl.ci import icount


def test_fixed_environment_is_the_gates() -> None:
    assert history.FIXED_ENV == icount.FIXED_ENV


def test_every_registered_decoder_is_a_history_parameter() -> None:
    from impl import registry

    assert set(registry.names("decode")) <= set(history.DECODERS)


def test_counted_steps_are_gate_steps() -> None:
    assert set(history.ICOUNT_STEPS) <= set(icount.STEPS)


def test_first_takes_the_first_path_that_has_the_attribute() -> None:
    module = history_compat.first(("impl.no_such_module", "impl.registry"), "names")
    assert module.__name__ == "impl.registry"


def test_a_missing_path_is_not_available() -> None:
    with pytest.raises(NotImplementedError, match=r"impl\.no_such_module"):
        history_compat.first(("impl.no_such_module",), "body_for")
    with pytest.raises(NotImplementedError, match=r"impl\.registry"):
        history_compat.first(("impl.registry",), "no_such_attribute")


def test_guarded_turns_an_import_error_into_not_available() -> None:
    def missing() -> object:
        import impl.no_such_module  # noqa: F401

        return None

    with pytest.raises(NotImplementedError, match="not in this commit"):
        history_compat.guarded(missing)
    assert history_compat.guarded(lambda: 3) == 3


def test_frozen_body_is_read_back(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(history_compat, "CACHE", tmp_path)
    (tmp_path / "prose-json-128.json").write_bytes(b'{"kept": 1}')
    assert history_compat.frozen_body("prose", 128) == b'{"kept": 1}'


@pytest.mark.heavy
def test_synthetic_body_is_the_gates_input() -> None:
    from impl.workloads.synthetic import body_for

    assert history_compat.synthetic_body(128) == body_for(128, kind="vllm")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed")
def test_the_fallback_runner_counts_what_the_gate_counts(monkeypatch) -> None:
    """Without `impl.ci.icount` (an older commit), the runner counts within 0.5% of the gate.

    The two launch the same steps file differently (by path, not `-m`), which moves a count by
    a few dozen instructions of interpreter bookkeeping; the gate's 5% threshold is far above.
    """
    gate = icount.count("accesslog-record")
    monkeypatch.setattr(icount, "STEPS", {})  # count() then takes the fallback runner
    fallback = history.count("accesslog-record")
    assert abs(fallback - gate) <= 0.005 * gate, (fallback, gate)
