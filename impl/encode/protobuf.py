"""The reference encoder: protobuf messages built from the numpy buffers, `SerializeToString()`.

Technique: one `tobytes()` per buffer into the generated `sample_pb2` messages (upb backend),
then protobuf serializes. Each buffer is copied four times plus arena regrowth (`tobytes`, into
the upb message, during serialization, into the returned bytes: profiles/README.md), but there
are no per-token Python objects, so it is already fast; it is the
reference because protobuf itself decides the bytes: field order, which default-valued fields
are left out (stop_reason STOP = 0, empty `tokens`, k/length 0) and which optional ones are
written although empty.

Presence, chosen for what the SDK (`tinker.proto.response_conv`) turns them into:
- `logprobs` of every sequence is always set (also when empty); the SDK reads empty bytes as
  `logprobs_np=None`, so an empty sequence comes back as tokens [] and logprobs None;
- `prompt_logprobs` is set iff the Completion has them (an empty array is written as a present
  empty field; the SDK reads empty and absent both as `prompt_logprobs_np=None`);
- `topk_prompt_logprobs` is set iff the Completion has them; the SDK gives None for a [0, k]
  or [n, 0] matrix, and per row None where the rank-1 cell is padding (token 0, -99999.0).
Dependency: protobuf (`hotpath[encode]`).
"""

from __future__ import annotations

from impl.decode import Completion
from impl.encode import sample_pb2
from impl.encode._common import check


class ProtobufEncoder:
    """`encode(completion) -> bytes` through generated protobuf messages."""

    def encode(self, completion: Completion) -> bytes:
        checked = check(completion)
        response = sample_pb2.SampleResponse()
        for code, tokens, logprobs in checked.sequences:
            seq = response.sequences.add()
            seq.stop_reason = code
            seq.tokens = tokens.tobytes()
            seq.logprobs = logprobs.tobytes()
        if checked.prompt_logprobs is not None:
            response.prompt_logprobs = checked.prompt_logprobs.tobytes()
        if checked.topk is not None:
            token_ids, logprobs = checked.topk
            topk = response.topk_prompt_logprobs
            topk.SetInParent()
            topk.token_ids = token_ids.tobytes()
            topk.logprobs = logprobs.tobytes()
            topk.length, topk.k = token_ids.shape
        return response.SerializeToString()


def create() -> ProtobufEncoder:
    return ProtobufEncoder()
