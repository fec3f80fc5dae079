"""Request and response shapes of the sampling API: validation at the edge and the OpenAPI schema.

The hot routes (asample, retrieve_future) decode their bodies with msgspec Structs (validation
in C, clear messages naming the JSON path), and the same Structs give their OpenAPI schema
(`openapi_components`), so the documented shape and the checked shape cannot drift apart.
The other routes use pydantic models the usual FastAPI way.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct
from pydantic import BaseModel, ConfigDict, Field

from impl.server.store.completions import CLONE_BLOCK

Int32 = Annotated[int, Meta(ge=0, le=2**31 - 1)]
#: The largest id or seed accepted: int64, less 1023 so that a JSON Schema reader that parses
#: numbers as doubles keeps the bound exact (2**63 - 1 reads back as 2**63, and schema-driven
#: clients then send 2**63, which the server must refuse).
INT64_MAX = 2**63 - 1024
#: The largest sampling-session sequence number: JSON's exact-integer range (the SDK counts
#: from 0). FastAPI's schema writes this bound as a double, and above 2**53 schema-driven
#: clients have sent values past it that the server then refused.
SAFE_INT_MAX = 2**53 - 1
#: One bound for a sample's `seq_id` on every route: what asample accepts, retrieve_futures can
#: poll (the clone of a seq_id is `seq_id // CLONE_BLOCK`, so CLONE_MAX is the clone of
#: SEQ_ID_MAX): a sample past 2**63 could never be polled.
SEQ_ID_MAX = INT64_MAX
CLONE_MAX = SEQ_ID_MAX // CLONE_BLOCK


class EncodedTextChunk(Struct, tag_field="type", tag="encoded_text", kw_only=True):
    tokens: Annotated[list[Int32], Meta(min_length=1)]


class ModelInput(Struct, kw_only=True):
    chunks: Annotated[list[EncodedTextChunk], Meta(min_length=1)]


class SamplingParams(Struct, kw_only=True):
    max_tokens: Annotated[int, Meta(ge=1, le=1 << 20)] | None = None
    seed: Annotated[int, Meta(ge=0, le=INT64_MAX)] | None = None
    stop: str | list[str | Int32] | None = None
    temperature: Annotated[float, Meta(ge=0.0)] = 1.0
    top_k: Annotated[int, Meta(ge=-1)] = -1
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0


class AsampleRequest(Struct, kw_only=True):
    """`/api/v1/asample`: unknown fields are ignored (the SDK sends more than we use)."""

    sampling_session_id: str
    seq_id: Annotated[int, Meta(ge=0, le=SEQ_ID_MAX)]
    prompt: ModelInput
    sampling_params: SamplingParams
    num_samples: Annotated[int, Meta(ge=1, le=256)] = 1
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: Annotated[int, Meta(ge=0, le=20)] = 0
    #: Not supported here; accepted only when unset (0 or null).
    topk_sample_logprobs: Annotated[int, Meta(ge=0, le=0)] = 0
    prompt_alt_tokens_k: Annotated[int, Meta(ge=0, le=0)] = 0
    target_prompt_logprobs: None = None
    prompt_logprobs_last_n: None = None


class AsampleResponse(Struct):
    request_id: str
    sample_sequence_ids: list[str]


class RetrieveFutureRequest(Struct, kw_only=True):
    request_id: str
    allow_metadata_only: bool = False


class SamplingSessionTarget(Struct, kw_only=True):
    """Whose completions to report: one sampling session, one clone of its SamplingClient
    (`cloned_sampler_id` = the clone's `seq_id // 1_000_000_000`; 0 for the original)."""

    type: Literal["sampling_session"] = "sampling_session"
    sampling_session_id: str
    cloned_sampler_id: Annotated[int, Meta(ge=0, le=CLONE_MAX)] = 0


class RetrieveFuturesRequest(Struct, kw_only=True):
    """`/api/v1/retrieve_futures`: one long-poll for a sampling session's completions."""

    target: SamplingSessionTarget
    #: the `cursor` of the previous answer (0: from the beginning); completions at or before
    #: it are dropped as seen
    prev_cursor: Annotated[int, Meta(ge=0, le=INT64_MAX)] = 0
    #: seconds to hold the poll while nothing completed (absent: the server's poll hold;
    #: 0: answer at once)
    timeout: Annotated[float, Meta(ge=0.0)] | None = None
    #: request ids whose results the client has fully retrieved (their retrieved-TTL starts)
    retrieved_request_ids: list[str] = []


class FutureFinished(Struct, tag_field="state", tag="finished"):
    request_id: str
    response_payload_uncompressed_size: int


class FutureFailed(Struct, tag_field="state", tag="failed"):
    request_id: str


class RetrieveFuturesResponse(Struct):
    completions: list[FutureFinished | FutureFailed]
    #: pass back as `prev_cursor` on the next poll
    cursor: int


class CompleteMetadata(Struct):
    """retrieve_future's metadata-first answer: fetch again (allow_metadata_only false)."""

    status: Literal["complete_metadata"]
    response_payload_size: int


class TryAgain(Struct):
    type: Literal["try_again"]


class RequestFailed(Struct):
    error: str
    category: Literal["server", "user", "unknown"]


class SampledSequenceJSON(Struct):
    stop_reason: Literal["stop", "length"]
    tokens: list[int]
    logprobs: list[float] | None


class SampleResponseJSON(Struct):
    """The legacy JSON form of a result (for clients that do not ask for protobuf)."""

    sequences: list[SampledSequenceJSON]
    prompt_logprobs: list[float | None] | None
    topk_prompt_logprobs: list[list[tuple[int, float]] | None] | None


class ErrorDetail(Struct):
    detail: str


HOT_SCHEMAS = (
    AsampleRequest,
    AsampleResponse,
    RetrieveFutureRequest,
    RetrieveFuturesRequest,
    RetrieveFuturesResponse,
    CompleteMetadata,
    TryAgain,
    RequestFailed,
    SampleResponseJSON,
    ErrorDetail,
)


def openapi_components() -> dict[str, Any]:
    """JSON schemas of the hot routes' Structs, for the app's `components.schemas`."""
    _, components = msgspec.json.schema_components(
        HOT_SCHEMAS, ref_template="#/components/schemas/{name}"
    )
    return components


def ref(cls: type) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{cls.__name__}"}


def json_content(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


# -- the other routes (pydantic, validated by FastAPI) ---------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ClientConfigRequest(_Model):
    sdk_version: str | None = None


class ClientConfigResponse(_Model):
    sample_max_concurrent_requests: int
    sample_use_retrieve_futures: bool = False
    sample_join_sampling_session: bool = False
    pjwt_auth_enabled: bool = False


class DynamicConfigResponse(_Model):
    refresh_interval_sec: int = 300
    sample_cancel_enabled: bool = False


class CreateSessionRequest(_Model):
    tags: list[str] = []
    user_metadata: dict[str, Any] | None = None
    sdk_version: str | None = None


class CreateSessionResponse(_Model):
    type: Literal["create_session"] = "create_session"
    session_id: str


class CreateSamplingSessionRequest(_Model):
    """Sampling from a base model (this server has no trained weights: no model_path)."""

    session_id: str
    sampling_session_seq_id: Annotated[int, Field(ge=0, le=SAFE_INT_MAX)]
    base_model: str


class CreateSamplingSessionResponse(_Model):
    type: Literal["create_sampling_session"] = "create_sampling_session"
    sampling_session_id: str


class JoinSamplingSessionRequest(_Model):
    sampling_session_id: str
    type: Literal["join_sampling_session"] = "join_sampling_session"


class JoinSamplingSessionResponse(_Model):
    type: Literal["join_sampling_session"] = "join_sampling_session"
    #: unique among the sampling session's clients (the original client is 0)
    client_counter: int


class HeartbeatRequest(_Model):
    session_id: str


class HeartbeatResponse(_Model):
    type: Literal["session_heartbeat"] = "session_heartbeat"


class TelemetryResponse(_Model):
    status: Literal["accepted"] = "accepted"
