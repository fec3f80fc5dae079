"""`POST /api/v1/retrieve_futures`: the Tinker SDK 0.38 session poll (pure ASGI, see `_raw.py`).

With `sample_use_retrieve_futures` in client/config, the SDK runs one background poller per
sampling session (and clone) instead of one held `retrieve_future` per sample: it long-polls
here with the cursor of the previous answer and the ids it has fully retrieved, each sample
waits for its completion to be reported, then fetches its payload once with `retrieve_future`.
So the held polls cost one connection per session, not one per sample.

Semantics (the store keeps the log, `impl.server.store.completions`): completions at or before
`prev_cursor` are dropped as seen; the answer carries those after it (`finished` with the
payload's size, or `failed`) and the new `cursor`; with none, the poll is held up to `timeout`
(absent: `--poll-hold`; 0: answer at once, the SDK's ack-only poll). `retrieved_request_ids`
start those results' retrieved-TTL clock. A sampling session, its cursors and its acks belong
to the caller that created it. Errors: 404 for an unknown (or another caller's) sampling
session and 410 for a cursor this server never handed out (it restarted, losing the session's
results): both
end the SDK's poller, so its waiting samples fail instead of waiting forever; 400/413/422 for
a bad body, 401 without an API key, 503 with Retry-After while the shared store is away. On
the shared store the logs live in the engine, so a poll may reach any server process.
"""

from __future__ import annotations

import msgspec
import orjson

from impl.server import limits, schemas
from impl.server.routes._raw import RawRoute, Receive, Scope, Send, respond
from impl.server.routes.sampling import (
    _STORE_DOWN,
    _decode,
    _json_response,
    _operation,
    _store_guard,
)

_RETRIEVE_FUTURES = msgspec.json.Decoder(schemas.RetrieveFuturesRequest)


@_store_guard
async def retrieve_futures(scope: Scope, receive: Receive, send: Send) -> None:
    """Long-poll a sampling session's completions after `prev_cursor`: answers
    `{"completions": [...], "cursor"}` as soon as some are there (batched while the session
    has more pending), or an empty list after the hold. `retrieved_request_ids` acknowledge
    fetched results. 404: unknown (or another caller's) sampling session; 410: unknown cursor;
    503: the shared store is unreachable."""
    state = scope["state"]["server"]
    caller = state.callers.caller(scope)
    if caller is None:
        return await respond(send, 401, state.callers.rejection)
    state.intake.finishing()  # results may be going out: new asamples wait their turn
    cap, flag = state.limits.body_cap("/api/v1/retrieve_futures")
    request = await _decode(_RETRIEVE_FUTURES, scope, receive, send, cap, flag)
    if request is None:
        return None
    target = request.target
    session_id = target.sampling_session_id
    problem = state.limits.id_problem("sampling_session_id", session_id)
    if problem is not None:
        return await respond(send, 422, limits.error_body(problem))
    if await state.sessions.base_model(session_id, caller.name) is None:
        message = f"unknown sampling_session_id {limits.quote(session_id)}: create it first"
        return await respond(send, 404, limits.error_body(message))
    key = (session_id, target.cloned_sampler_id)
    store = state.store
    if request.retrieved_request_ids:
        await store.acknowledge(key, request.retrieved_request_ids)
    hold = state.poll_hold if request.timeout is None else min(request.timeout, state.poll_hold)
    answer = await store.session_completions(key, request.prev_cursor, hold)
    state.polls["retrieve_futures"] += 1
    if answer is None:
        message = (
            f"unknown cursor {request.prev_cursor} for sampling session {limits.quote(session_id)} "
            f"(clone {target.cloned_sampler_id}): not handed out by this server (it restarted "
            "and its results are gone); start a new sampling session"
        )
        return await respond(send, 410, limits.error_body(message))
    entries, cursor = answer
    state.polls["retrieve_futures_completions"] += len(entries)
    completions = [
        {
            "state": "finished",
            "request_id": e.request_id,
            "response_payload_uncompressed_size": e.size,
        }
        if e.state == "finished"
        else {"state": "failed", "request_id": e.request_id}
        for e in entries
    ]
    body = orjson.dumps({"completions": completions, "cursor": cursor})
    return await respond(send, 200, body)


RETRIEVE_FUTURES_DOC = _operation(
    schemas.RetrieveFuturesRequest,
    {
        200: _json_response(
            "the completions after prev_cursor (possibly none) and the new cursor",
            schemas.ref(schemas.RetrieveFuturesResponse),
        ),
        404: _json_response("unknown sampling session", schemas.ref(schemas.ErrorDetail)),
        410: _json_response(
            "a cursor this server never handed out", schemas.ref(schemas.ErrorDetail)
        ),
        503: _STORE_DOWN,
    },
)


def routes() -> list[RawRoute]:
    return [
        RawRoute(
            "/api/v1/retrieve_futures",
            retrieve_futures,
            methods=["POST"],
            tags=["sampling"],
            openapi_extra=RETRIEVE_FUTURES_DOC,
        )
    ]
