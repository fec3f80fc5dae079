"""Sessions and sampling sessions: created before sampling, kept alive by heartbeats.

Each belongs to the caller that created it: another caller's id answers the same 404 as an id
that never existed (`impl.server.sessions`)."""

from __future__ import annotations

from fastapi import APIRouter

from impl.server import limits
from impl.server.routes.deps import (
    AUTH_RESPONSES,
    AnyBody,
    ApiError,
    ApiKey,
    ServerState,
    error_response,
)
from impl.server.schemas import (
    CreateSamplingSessionRequest,
    CreateSamplingSessionResponse,
    CreateSessionRequest,
    CreateSessionResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinSamplingSessionRequest,
    JoinSamplingSessionResponse,
)
from impl.server.state import State

_UNKNOWN = {404: error_response("unknown session")}
#: every session route reads or writes the shared store when there is one
_STORE_DOWN = {
    503: {
        **error_response("the shared store is unreachable: retry after Retry-After seconds"),
        "headers": {"Retry-After": {"schema": {"type": "integer"}}},
    }
}
router = APIRouter(prefix="/api/v1", tags=["sessions"], responses={**AUTH_RESPONSES, **_STORE_DOWN})


def _unknown(session_id: str) -> ApiError:
    return ApiError(
        404,
        f"unknown session_id {limits.quote(session_id)}: create it with /api/v1/create_session",
    )


def _check_ids(state: State, **ids: str) -> None:
    """422 for the first id longer than the server's limit."""
    for name, value in ids.items():
        problem = state.limits.id_problem(name, value)
        if problem is not None:
            raise ApiError(422, problem)


@router.post("/create_session")
async def create_session(
    request: CreateSessionRequest, caller: ApiKey, state: ServerState
) -> CreateSessionResponse:
    """A new session id. Tags: at most --max-tags, each at most --max-id-length characters."""
    most = state.limits.max_tags
    if len(request.tags) > most:
        raise ApiError(422, f"{len(request.tags)} tags; the limit is {most} (--max-tags)")
    for tag in request.tags:
        _check_ids(state, tag=tag)
    return CreateSessionResponse(session_id=await state.sessions.create(caller.name))


@router.post("/create_sampling_session", responses=_UNKNOWN)
async def create_sampling_session(
    request: CreateSamplingSessionRequest, caller: ApiKey, state: ServerState
) -> CreateSamplingSessionResponse:
    """A sampling session in a session; the same seq id gives the same sampling session id."""
    _check_ids(state, session_id=request.session_id, base_model=request.base_model)
    sampling_id = await state.sessions.create_sampling(
        request.session_id, request.sampling_session_seq_id, request.base_model, caller.name
    )
    if sampling_id is None:
        raise _unknown(request.session_id)
    return CreateSamplingSessionResponse(sampling_session_id=sampling_id)


@router.post("/join_sampling_session", responses={404: error_response("unknown sampling session")})
async def join_sampling_session(
    request: JoinSamplingSessionRequest, caller: ApiKey, state: ServerState
) -> JoinSamplingSessionResponse:
    """A new client of an existing sampling session (an unpickled SDK SamplingClient) gets its
    own `client_counter` (1, 2, ...; the original client is 0); the SDK numbers that client's
    samples from `client_counter * 1_000_000_000`, so clones never share a seq_id."""
    _check_ids(state, sampling_session_id=request.sampling_session_id)
    clone = await state.sessions.join(request.sampling_session_id, caller.name)
    if clone is None:
        raise ApiError(
            404,
            f"unknown sampling_session_id {limits.quote(request.sampling_session_id)}: create it "
            "with /api/v1/create_sampling_session",
        )
    return JoinSamplingSessionResponse(client_counter=clone)


@router.post("/session_heartbeat", responses=_UNKNOWN)
async def session_heartbeat(
    request: HeartbeatRequest, caller: ApiKey, state: ServerState
) -> HeartbeatResponse:
    """Keeps a session alive."""
    _check_ids(state, session_id=request.session_id)
    if not await state.sessions.heartbeat(request.session_id, caller.name):
        raise _unknown(request.session_id)
    return HeartbeatResponse()


@router.post("/sessions/{session_id}/finish", responses=_UNKNOWN)
async def finish_session(
    session_id: str, caller: ApiKey, state: ServerState, __: AnyBody
) -> dict[str, str]:
    """Ends a session and its sampling sessions (results already submitted stay retrievable)."""
    _check_ids(state, session_id=session_id)
    if not await state.sessions.finish(session_id, caller.name):
        raise _unknown(session_id)
    return {"status": "finished"}
