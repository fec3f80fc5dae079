"""`Annotated` dependencies of the FastAPI routes: the server state and the caller's key check."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import Body, Depends, Request
from fastapi.security import APIKeyHeader

from impl.server.callers import Caller
from impl.server.schemas import ErrorDetail, json_content, ref
from impl.server.state import State


class ApiError(Exception):
    """An error answered as `{"detail": message}` with `status_code` (one handler in app.py)."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail


_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False)


async def _caller(request: Request, key: Annotated[str | None, Depends(_api_key_header)]) -> Caller:
    """The request's caller (`impl.server.callers`), or 401."""
    callers = request.state.server.callers
    caller = callers.identify(key.encode("latin-1")) if key else None
    if caller is None:
        raise ApiError(401, orjson.loads(callers.rejection)["detail"])
    return caller


async def _state(request: Request) -> State:
    return request.state.server


#: the caller of the request (its NAME owns what the route creates)
ApiKey = Annotated[Caller, Depends(_caller)]
#: A JSON object body the route accepts and ignores (telemetry, finish reasons).
AnyBody = Annotated[dict[str, Any], Body(default_factory=dict)]
ServerState = Annotated[State, Depends(_state)]


def error_response(description: str) -> dict[str, Any]:
    """An OpenAPI response in the one error shape, `{"detail": "..."}` (impl/server/limits.py)."""
    return {"description": description, "content": json_content(ref(ErrorDetail))}


#: Responses every authenticated route documents besides its own, all in the one error shape.
AUTH_RESPONSES: dict[int | str, dict] = {
    400: error_response(
        "malformed JSON: not JSON, invalid UTF-8, NaN/Infinity, an integer over 4300 digits, "
        "or nested deeper than 32 levels"
    ),
    401: error_response("missing or invalid API key"),
    413: error_response("request body over --max-body-bytes (telemetry: 16 times that)"),
    422: error_response("the body does not match the schema, or an id/tag list over its limit"),
}
