"""Client configuration and telemetry: what the SDK asks before and while it samples."""

from __future__ import annotations

from fastapi import APIRouter

from impl.server.routes.deps import AUTH_RESPONSES, AnyBody, ApiKey, ServerState
from impl.server.schemas import (
    ClientConfigRequest,
    ClientConfigResponse,
    DynamicConfigResponse,
    TelemetryResponse,
)

router = APIRouter(prefix="/api/v1", tags=["client"], responses=AUTH_RESPONSES)


@router.post("/client/config")
async def client_config(
    _: ClientConfigRequest, __: ApiKey, state: ServerState
) -> ClientConfigResponse:
    """Feature flags: `sample_max_concurrent_requests` caps each client's in-flight samples
    (per-request polling); `sample_use_retrieve_futures` and `sample_join_sampling_session`
    switch the SDK to the session protocol (`--session-poll`; never with `--baseline`:
    /healthz → `session_poll` says why)."""
    session = state.settings.session_poll_off() is None
    return ClientConfigResponse(
        sample_max_concurrent_requests=state.settings.sample_max_concurrent_requests,
        sample_use_retrieve_futures=session,
        sample_join_sampling_session=session,
    )


@router.post("/client/dynamic_config")
async def dynamic_config(_: ApiKey) -> DynamicConfigResponse:
    """Flags the SDK re-fetches periodically (explicit cancel is off: not supported here)."""
    return DynamicConfigResponse()


@router.post("/telemetry")
async def telemetry(_: ApiKey, __: AnyBody) -> TelemetryResponse:
    """SDK telemetry: accepted and dropped."""
    return TelemetryResponse()
