"""The differential fuzzer's own parts (impl/decode/fuzz): its check, shrinking, kept cases and
mutations. Its runs against the compiled decoders are `make fuzz` and `make sanitize`."""

from __future__ import annotations

import random

import numpy as np

from impl import registry
from impl.decode import Completion, DecodeError, Sequence, fuzz
from impl.decode.fuzz import mutate
from impl.workloads import synthetic

REFERENCE = registry.create("decode", registry.reference("decode"))
BODY = synthetic.body_for(40, kind="vllm", seed=3)


class Fake:
    """A decoder whose fast path answers with a fixed result (None: hands every body over)."""

    def __init__(self, answer: Completion | BaseException | None) -> None:
        self.answer = answer

    def fast_path(self, body: bytes, prompt_tokens, k: int):
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    def decode(self, body: bytes, **_):  # not used: the fuzzer asks the fast path
        raise AssertionError


def _one_token() -> Completion:
    return Completion([Sequence(np.array([1], np.int32), np.array([0.0], np.float32), "stop")])


def test_compare_finds_each_kind_of_disagreement():
    good = fuzz.Case(BODY)
    bad = fuzz.Case(BODY[:-1])  # truncated: the reference raises
    right = REFERENCE.decode(BODY)
    assert fuzz.compare(good, REFERENCE, {"f": Fake(right)}) == (True, None)
    assert fuzz.compare(good, REFERENCE, {"f": Fake(None)}) == (False, None)  # handed over
    assert fuzz.compare(bad, REFERENCE, {"f": Fake(None)}) == (False, None)
    answered, what = fuzz.compare(bad, REFERENCE, {"f": Fake(right)})
    assert answered and "an answer where the reference raises DecodeError" in what
    found = fuzz.disagreement(good, REFERENCE, {"f": Fake(_one_token())})
    assert found == "f: sequence 0 tokens: shape (1,) != (40,)"
    raised = fuzz.disagreement(good, REFERENCE, {"f": Fake(RuntimeError("boom"))})
    assert raised.startswith("f: RuntimeError (boom)")
    # DecodeError from a fast path where the reference raises too: they agree
    assert fuzz.disagreement(bad, REFERENCE, {"f": Fake(DecodeError("x"))}) is None


def test_minimize_keeps_the_failure_and_shrinks():
    case = fuzz.Case(b"a" * 500 + b"XY" + b"b" * 500, k=2, how="test")
    small = fuzz.minimize(case, lambda c: b"XY" in c.body, seconds=5)
    assert small.body == b"XY" and small.k == 2 and small.how == "test"


def test_saved_cases_load_back_byte_for_byte(tmp_path):
    case = fuzz.Case(b'{"choices":[\xff\n"\x00', k=3, how="byte_flips of x")
    path = fuzz.save(case, "onepass_nogil: an answer", tmp_path)
    loaded, meta = fuzz.load(path)
    assert loaded == case and meta["found"] == "onepass_nogil: an answer"
    assert fuzz.regressions(tmp_path) == [path]
    assert fuzz.save(case, "again", tmp_path) == path  # one file per body and k


def test_mutations_are_seeded_and_aim_at_block_edges():
    first = [mutate.mutate(random.Random(f"7:{i}"), BODY) for i in range(200)]
    again = [mutate.mutate(random.Random(f"7:{i}"), BODY) for i in range(200)]
    assert first == again
    names = {how for _, how in first}
    assert {"replace_element", "shift_to_edge", "truncate", "byte_flips"} <= {
        part for how in names for part in how.split("+")
    }
    # shift_to_edge puts a malformed element's comma at a block's edge (63 or 64 from the start
    # of its array, or 31/32/62) in most of its cases
    rng = random.Random(5)
    edges = 0
    for _ in range(200):
        out = mutate.shift_to_edge(rng, BODY)
        edges += out != BODY
    assert edges > 150
    assert all(isinstance(body, bytes) for body, _ in first)


def test_every_kept_case_is_a_real_disagreement_or_crash():
    """The kept regression cases say what disagreed and how they were made."""
    for path in fuzz.regressions():
        case, meta = fuzz.load(path)
        assert meta["found"] and meta["how"] and case.body
