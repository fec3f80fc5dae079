"""Decode family: a vLLM completion body -> numpy arrays, per implementation, size and body kind.

Params are the registry table, not what is installed: an implementation that cannot run here,
or whose result differs from the reference on that body, raises NotImplementedError in setup
and shows as n/a. The parity check covers exactly the combination being timed, once per
process (asv re-runs `setup` before every sample); the reference's result on a body is cached
on disk (`reference_result`), keyed by the body and the installed decode package, so the slow
stdlib-json reference decodes each body once per commit, not in every round.

ROUNDS: one (asv's default is two processes per combination, interleaved). The 64 combinations
each run in a fresh process that builds its body and warms its decoder; one round keeps `make asv`
within its per-commit budget (benchmarks/README.md), at the price of the dashboard's figure coming
from one process, not two. The gate passes its own `-a rounds=4` for the combination it times.
`DecodeKind` adds 110 combinations at 262144 tokens: its body is generated once and read from disk
by the other processes before the timing.
"""

import hashlib
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from impl import decode, registry
from impl.decode.parity import same

from .common import BODIES, KINDS, RENDERS, TOKENS, decode_body, kind_body

FAMILY = "decode"
#: where reference results are kept between processes (and rounds, and runs)
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "hotpath", "decode-ref")
_verdicts: dict[tuple[str, int, str], str | None] = {}
_decoders: dict[str, object] = {}


def _package_digest() -> str:
    """The installed impl.decode sources, Python and numpy: what the reference's result uses."""
    digest = hashlib.sha256(f"{sys.version}|{np.__version__}".encode())
    for path in sorted(Path(decode.__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def reference_result(body: bytes) -> decode.Completion:
    """The reference decoder's Completion of `body`, decoded once and then read from CACHE."""
    path = CACHE / f"{hashlib.sha256(body).hexdigest()[:32]}-{_package_digest()}.pickle"
    try:
        return pickle.loads(path.read_bytes())
    except (OSError, EOFError, pickle.UnpicklingError):
        pass
    want = registry.create(FAMILY, registry.reference(FAMILY)).decode(body)
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=CACHE, delete=False) as out:  # atomic for concurrent runs
        out.write(pickle.dumps(want))
    os.replace(out.name, path)
    return want


def verdict(implementation: str, tokens: int, kind: str, render: str | None = None) -> str | None:
    """Why (implementation, tokens, kind[, render]) cannot be timed, or None; computed once per
    process. Without `render` the body is `decode_body`'s, with it `kind_body`'s.

    The decoder that passed is kept (`_decoders`) and warm: it has decoded this body once.
    """
    key = (implementation, tokens, kind, render)
    if key not in _verdicts:
        reason = registry.unavailable_reason(FAMILY, implementation)
        if reason is None:
            try:
                body = _body(tokens, kind, render)
            except NotImplementedError as absent:
                _verdicts[key] = str(absent)
                return _verdicts[key]
            decoder = _decoders.get(implementation) or registry.create(FAMILY, implementation)
            got = decoder.decode(body)
            if implementation != registry.reference(FAMILY) and not same(
                got, reference_result(body)
            ):
                reason = f"{implementation}: differs from the reference"
            else:
                _decoders[implementation] = decoder
        _verdicts[key] = reason
    return _verdicts[key]


def _body(tokens: int, kind: str, render: str | None) -> bytes:
    return decode_body(tokens, kind) if render is None else kind_body(kind, render, tokens)


class Decode:
    """One body decoded into a Completion (tokens int32, logprobs float32, stop reasons).

    Timer: `time.process_time`, the CPU time of this process. A decode is single-threaded and
    CPU-bound (no I/O, no threads), so its CPU time is its cost, while its wall time also
    counts the time the process waited for a core, which on a shared machine moves the 20 MB
    decode's wall time far more than its CPU time.
    Warm decoder: asv re-runs `setup` before every sample, so the decoder is created once per
    process and has decoded the body once before any sample (as in the server, which keeps
    one). A fresh decoder per sample would time its first call: simdjson's parser allocating and
    faulting in its buffers, a large share of the sample that a change cannot double.
    """

    params = (list(registry.names(FAMILY)), TOKENS, BODIES)
    param_names = ("implementation", "tokens", "body")
    timeout = 600
    timer = time.process_time
    rounds = 1  # ROUNDS: the module docstring

    def setup(self, implementation, tokens, body):
        reason = verdict(implementation, tokens, body)
        if reason:
            raise NotImplementedError(reason)
        self.decoder = _decoders[implementation]
        self.body = decode_body(tokens, body)

    def time_decode(self, implementation, tokens, body):
        self.decoder.decode(self.body)

    def peakmem_decode(self, implementation, tokens, body):
        self.decoder.decode(self.body)


class DecodeKind:
    """One 262144-token body of each kind and rendering of `impl.workloads.realtext` (real prose,
    code and multilingual text through a real tokenizer, the synthetic body; as json.dumps and
    as orjson render them), decoded as `Decode` does: same timer, warm decoder, parity first.

    110 combinations; the body is generated once and read from disk after that
    (`common.kind_body`), a kind without its package (mistral-common, orjson) is n/a.
    """

    params = (list(registry.names(FAMILY)), KINDS, RENDERS)
    param_names = ("implementation", "kind", "render")
    timeout = 600
    timer = time.process_time
    rounds = 1  # ROUNDS: the module docstring
    tokens = TOKENS[-1]

    def setup(self, implementation, kind, render):
        reason = verdict(implementation, self.tokens, kind, render)
        if reason:
            raise NotImplementedError(reason)
        self.decoder = _decoders[implementation]
        self.body = kind_body(kind, render, self.tokens)

    def time_decode(self, implementation, kind, render):
        self.decoder.decode(self.body)
