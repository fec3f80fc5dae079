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
from pydantic import BaseModel, ConfigDict

Int32 = Annotated[int, Meta(ge=0, le=2**31 - 1)]


class EncodedTextChunk(Struct, tag_field="type", tag="encoded_text", kw_only=True):
    tokens: Annotated[list[Int32], Meta(min_length=1)]


class ModelInput(Struct, kw_only=True):
    chunks: Annotated[list[EncodedTextChunk], Meta(min_length=1)]


class SamplingParams(Struct, kw_only=True):
    max_tokens: Annotated[int, Meta(ge=1, le=1 << 20)] | None = None
    seed: Annotated[int, Meta(ge=0, le=2**63 - 1)] | None = None
    stop: str | list[str | Int32] | None = None
    temperature: Annotated[float, Meta(ge=0.0)] = 1.0
    top_k: Annotated[int, Meta(ge=-1)] = -1
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0


class AsampleRequest(Struct, kw_only=True):
    """`/api/v1/asample`: unknown fields are ignored (the SDK sends more than we use)."""

    sampling_session_id: str
    seq_id: Annotated[int, Meta(ge=0)]
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
    sampling_session_seq_id: int
    base_model: str


class CreateSamplingSessionResponse(_Model):
    type: Literal["create_sampling_session"] = "create_sampling_session"
    sampling_session_id: str


class HeartbeatRequest(_Model):
    session_id: str


class HeartbeatResponse(_Model):
    type: Literal["session_heartbeat"] = "session_heartbeat"


class TelemetryResponse(_Model):
    status: Literal["accepted"] = "accepted"
