"""Fuzzing the server's request parsing with hypothesis: random and adversarial JSON (deep
nesting, NaN/Infinity, huge integers, long ids, invalid UTF-8, wrong types, random bytes)
against every route over one keep-alive connection. Never a 5xx, never a response over 4 KB,
the connection never dropped, the server healthy after.

hypothesis rather than atheris: the target is a server in another process reached over HTTP,
so coverage-guided in-process fuzzing has nothing to instrument; hypothesis generates the
structured adversarial inputs directly, shrinks a failure to a small body, and its example
budget (`max_examples`) bounds the run in `make test`.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.test_hostile import ALL_ROUTES, SMALL, Connection
from tests.support.server import start_server, start_upstream

pytestmark = pytest.mark.slow

FIELDS = (
    "request_id",
    "session_id",
    "sampling_session_id",
    "seq_id",
    "tags",
    "user_metadata",
    "prompt",
    "sampling_params",
    "num_samples",
    "base_model",
    "sampling_session_seq_id",
)


@pytest.fixture(scope="module")
def server():
    with start_upstream() as upstream, start_server(upstream.url, "--poll-hold", "0") as process:
        yield process


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),  # NaN / Infinity literals in the body
    st.text(max_size=40),
    st.integers(min_value=0, max_value=5000).map(lambda n: "i" * n),  # long ids
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner, max_size=4),
    ),
    max_leaves=12,
)


def _deep(levels: int, kind: str) -> bytes:
    if kind == "array":
        return b"[" * levels + b"]" * levels
    return b'{"a":' * levels + b"1" + b"}" * levels


adversarial = st.one_of(
    st.builds(
        lambda field, levels, kind: b'{"%s": ' % field.encode() + _deep(levels, kind) + b"}",
        st.sampled_from(FIELDS),
        st.integers(min_value=1, max_value=3000),
        st.sampled_from(["array", "object"]),
    ),
    st.builds(
        lambda field, digits: b'{"%s": %s}' % (field.encode(), b"7" * digits),
        st.sampled_from(FIELDS),
        st.integers(min_value=1, max_value=6000),
    ),
    st.builds(lambda raw: b'{"request_id": "' + raw + b'"}', st.binary(max_size=64)),
    st.binary(max_size=256),
)


def _body(value: object) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


bodies = st.one_of(values.map(_body), adversarial)


def test_fuzz_every_route(server):
    connection = Connection(server.url)

    @given(path=st.sampled_from(ALL_ROUTES), body=bodies)
    @settings(
        max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def check(path: str, body: bytes) -> None:
        status, raw = connection.post(path, body)
        assert status < 500, (status, raw[:300])
        assert len(raw) < SMALL, (status, len(raw))
        if status >= 400:
            assert isinstance(json.loads(raw)["detail"], str)
        assert connection.http.sock is not None, "the server closed the connection"
        assert connection.http.sock.getsockname() == connection.local

    try:
        check()
        assert connection.still_usable()
    finally:
        connection.close()
