"""The hot routes: asample and retrieve_future, pure ASGI over raw bytes (see `_raw.py`).

asample validates its body with msgspec, returns `request_id` and `sample_sequence_ids` at once
and leaves the forward to a background task; a repeated `(sampling_session_id, seq_id)` gets the
same future. retrieve_future holds a pending poll up to `--poll-hold` seconds, then answers
try_again; a result goes out as the stored protobuf bytes (`Accept: application/x-protobuf`) or
as its lazily derived JSON, and only a response handed to a still-connected client starts the
retrieved-TTL clock. A poll that sets `allow_metadata_only` first gets
`{"status": "complete_metadata", "response_payload_size"}` for a result of at least
`--metadata-first-bytes`, so the SDK can reserve its in-flight-bytes budget before the fetch.
"""

from __future__ import annotations

import functools
import time

import msgspec
import orjson

from impl.server import limits, schemas
from impl.server.job import SampleRejected, build_request
from impl.server.routes._raw import (
    JSON,
    PROTOBUF,
    ASGIApp,
    RawRoute,
    Receive,
    Scope,
    Send,
    client_gone,
    header,
    respond,
)
from impl.server.store import FAILED, PENDING, UNKNOWN_OWNER, StoreUnavailable

TRY_AGAIN = b'{"type":"try_again"}'
_ASAMPLE = msgspec.json.Decoder(schemas.AsampleRequest)
_RETRIEVE = msgspec.json.Decoder(schemas.RetrieveFutureRequest)


def _integral(value):
    """`value` with every integral float made an int (JSON Schema's integers include 1.0)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    return value


def _convert_integral_floats(body: bytes, decoder: msgspec.json.Decoder):
    """The body with `2.0` read as `2` where an integer is expected, or None (cold path)."""
    try:
        return msgspec.convert(_integral(orjson.loads(body)), decoder.type, strict=True)
    except (msgspec.ValidationError, orjson.JSONDecodeError):
        return None


async def _decode(
    decoder: msgspec.json.Decoder, scope: Scope, receive: Receive, send: Send, cap: int, flag: str
):
    """The validated body, or None after answering 413 (over `cap`), 400 (not JSON, or nested
    deeper than the request limit) or 422 (wrong shape); every message is short."""
    body = await limits.read_capped(scope, receive, cap)
    if isinstance(body, limits.OverCap):
        message = limits.error_body(limits.size_message(cap, flag))
        await respond(send, 413, message, headers=body.headers)
        return None
    if not body.isascii():  # msgspec skips ignored strings without checking their UTF-8
        try:
            body.decode()
        except UnicodeDecodeError as exc:
            message = f"malformed JSON body: invalid UTF-8 at byte {exc.start}"
            await respond(send, 400, limits.error_body(message))
            return None
    invalid = None
    try:
        request = decoder.decode(body)
    except msgspec.ValidationError as exc:
        request, invalid = None, exc
    except (msgspec.DecodeError, RecursionError) as exc:
        await respond(send, 400, limits.error_body(_not_json(exc)))
        return None
    if limits.nested_too_deep(body):
        message = f"JSON body nested deeper than {limits.MAX_REQUEST_DEPTH} levels"
        await respond(send, 400, limits.error_body(message))
        return None
    if invalid is not None and "got `float`" in str(invalid):
        request = _convert_integral_floats(body, decoder)
    if request is None:
        message = f"invalid request body: {limits.shorten(str(invalid))}"
        await respond(send, 422, limits.error_body(message))
    return request


def _not_json(exc: BaseException) -> str:
    if isinstance(exc, RecursionError) or "recursion" in str(exc).lower():
        return f"JSON body nested deeper than {limits.MAX_REQUEST_DEPTH} levels"
    return f"malformed JSON body: {limits.shorten(str(exc))}"


def _store_guard(handler: ASGIApp) -> ASGIApp:
    """`handler`, answering 503 with Retry-After while the shared store is unreachable (the
    request changed nothing there: the client retries it as it is)."""

    @functools.wraps(handler)
    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            return await handler(scope, receive, send)
        except StoreUnavailable as exc:
            retry_after = scope["state"]["server"].retry_after
            message = limits.error_body(limits.unavailable_message(exc))
            return await respond(send, 503, message, headers=((b"retry-after", retry_after),))

    return guarded


@_store_guard
async def asample(scope: Scope, receive: Receive, send: Send) -> None:
    """Submit a sample: answers `request_id` and one `sample_sequence_ids` entry per sample at
    once; the forward to the router runs in the background. A repeated
    `(sampling_session_id, seq_id)` returns the same future. 429 with Retry-After under
    backpressure (the server's room, or the caller's share of it); 404 for an unknown sampling
    session (or another caller's)."""
    state = scope["state"]["server"]
    caller = state.callers.caller(scope)
    if caller is None:
        return await respond(send, 401, state.callers.rejection)
    await state.intake.turn()  # a burst of submissions waits its turn (impl.server.intake)
    bounds = state.limits
    cap = bounds.asample_body_bytes
    request = await _decode(_ASAMPLE, scope, receive, send, cap, "--max-prompt-tokens")
    if request is None:
        return None
    problem = bounds.id_problem("sampling_session_id", request.sampling_session_id)
    if problem is None:
        prompt_tokens = sum(len(chunk.tokens) for chunk in request.prompt.chunks)
        if prompt_tokens > bounds.max_prompt_tokens:
            problem = (
                f"the prompt has {prompt_tokens} tokens; the limit is "
                f"{bounds.max_prompt_tokens} (--max-prompt-tokens)"
            )
    if problem is not None:
        return await respond(send, 422, limits.error_body(problem))
    owner = caller.name
    model = await state.sessions.base_model(request.sampling_session_id, owner)
    if model is None:
        message = (
            f"unknown sampling_session_id {limits.quote(request.sampling_session_id)}: "
            "create it first"
        )
        return await respond(send, 404, limits.error_body(message))
    store = state.store
    key = (request.sampling_session_id, request.seq_id)
    busy = store.pressure() or state.callers.refusal(caller, store.outstanding_of(owner))
    # A store that deduplicates in `create` is asked first only under pressure (a repeat of an
    # accepted sample is answered even then).
    record = None if store.dedup_on_create and busy is None else await store.lookup(key)
    if record is None:
        if busy is not None:
            caller.refused += 1
            if state.metrics is not None:
                state.metrics.rejected(busy)
            return await respond(
                send,
                429,
                limits.error_body(f"server busy: {busy}; retry later"),
                headers=((b"retry-after", state.retry_after),),
            )
        try:
            job = build_request(request, model)
        except SampleRejected as exc:
            message = f"invalid request body: {limits.shorten(str(exc))}"
            return await respond(send, 422, limits.error_body(message))
        record = await store.create(key, request.num_samples, job, owner)
        if record.fresh:  # else another process claimed the key a moment before
            state.forwards.submit(record, job)
    body = orjson.dumps(
        {"request_id": record.request_id, "sample_sequence_ids": record.sequence_ids}
    )
    return await respond(send, 200, body)


@_store_guard
async def retrieve_future(scope: Scope, receive: Receive, send: Send) -> None:
    """Poll a sample's future. Pending: held up to the poll hold, then `{"type": "try_again"}`.
    Done: SampleResponse protobuf for `Accept: application/x-protobuf`, else its JSON form.
    Failed: 200 `{"error", "category"}`. Unknown, evicted or another caller's request_id: 404."""
    state = scope["state"]["server"]
    caller = state.callers.caller(scope)
    if caller is None:
        return await respond(send, 401, state.callers.rejection)
    state.intake.finishing()  # a result may be going out: new asamples wait their turn
    bounds = state.limits
    request = await _decode(
        _RETRIEVE, scope, receive, send, bounds.max_body_bytes, "--max-body-bytes"
    )
    if request is None:
        return None
    problem = bounds.id_problem("request_id", request.request_id)
    if problem is not None:
        return await respond(send, 422, limits.error_body(problem))
    store, polls = state.store, state.polls
    record = await store.get(request.request_id)
    if record is None or record.owner not in (caller.name, UNKNOWN_OWNER):  # another's: 404
        polls["retrieve_future_not_found"] += 1
        message = (
            f"unknown request_id {limits.quote(request.request_id)}: never submitted here, or "
            "evicted after its retention time"
        )
        return await respond(send, 404, limits.error_body(message))
    if record.state == PENDING:
        await store.wait(record, state.poll_hold)
        if record.state == PENDING:
            polls["retrieve_future_try_again"] += 1
            return await respond(send, 200, TRY_AGAIN)
    started = time.perf_counter()  # the serve step: the finished record to the last byte
    if record.state == FAILED:
        polls["retrieve_future_failed"] += 1
        body = orjson.dumps({"error": record.error, "category": "server"})
        content_type = JSON
    else:
        if PROTOBUF in header(scope, b"accept"):
            body = await store.proto(record)
            content_type = PROTOBUF
        else:
            body = await store.json(record)
            content_type = JSON
        if request.allow_metadata_only and len(body) >= state.settings.metadata_first_bytes:
            polls["retrieve_future_metadata"] += 1
            metadata = b'{"status":"complete_metadata","response_payload_size":%d}' % len(body)
            return await respond(send, 200, metadata)
        polls["retrieve_future_payload"] += 1
    if store.clock_starts_on_build:  # the baseline's semantics: counted before it is sent
        await store.delivered(record)
        await respond(send, 200, body, content_type)
        return _served(state, record, content_type, started)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", content_type), (b"content-length", b"%d" % len(body))],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": True})
    # An empty chunk waits for the transport to drain a large body before the check below.
    await send({"type": "http.response.body", "body": b"", "more_body": True})
    if not client_gone(receive):
        await store.delivered(record)
    await send({"type": "http.response.body", "body": b""})
    return _served(state, record, content_type, started)


def _served(state, record, content_type: bytes, started: float) -> None:
    """Observe the serve step of a completed result (a failure's message is not a result)."""
    if state.metrics is not None and record.state != FAILED:
        fmt = "protobuf" if content_type == PROTOBUF else "json"
        state.metrics.serve[fmt](time.perf_counter() - started)


def _operation(request: type, responses: dict[int, dict]) -> dict:
    documented = {
        401: ("missing or invalid API key", schemas.ErrorDetail),
        400: (
            "malformed JSON: not JSON, invalid UTF-8, NaN/Infinity, or nested deeper than 32 "
            "levels",
            schemas.ErrorDetail,
        ),
        413: ("request body over this route's limit", schemas.ErrorDetail),
        422: ("the body does not match the schema, or an id over its limit", schemas.ErrorDetail),
    }
    out = {
        str(code): {"description": text, "content": schemas.json_content(schemas.ref(model))}
        for code, (text, model) in documented.items()
    }
    out.update({str(code): value for code, value in responses.items()})
    return {
        "requestBody": {"required": True, "content": schemas.json_content(schemas.ref(request))},
        "responses": out,
        "security": [{"APIKeyHeader": []}],
    }


def _json_response(description: str, schema: dict) -> dict:
    return {"description": description, "content": schemas.json_content(schema)}


_STORE_DOWN = {
    **_json_response("shared store unreachable: retry later", schemas.ref(schemas.ErrorDetail)),
    "headers": {"Retry-After": {"schema": {"type": "integer"}}},
}
ASAMPLE_DOC = _operation(
    schemas.AsampleRequest,
    {
        200: _json_response("the sample's future", schemas.ref(schemas.AsampleResponse)),
        404: _json_response("unknown sampling session", schemas.ref(schemas.ErrorDetail)),
        429: {
            **_json_response("backpressure: retry later", schemas.ref(schemas.ErrorDetail)),
            "headers": {"Retry-After": {"schema": {"type": "integer"}}},
        },
        503: _STORE_DOWN,
    },
)
RETRIEVE_DOC = _operation(
    schemas.RetrieveFutureRequest,
    {
        200: {
            "description": "the result (protobuf or JSON), a failure, try_again, or (with "
            "allow_metadata_only) the result's size first",
            "content": {
                "application/x-protobuf": {"schema": {"type": "string", "format": "binary"}},
                "application/json": {
                    "schema": {
                        "anyOf": [
                            schemas.ref(schemas.SampleResponseJSON),
                            schemas.ref(schemas.TryAgain),
                            schemas.ref(schemas.RequestFailed),
                            schemas.ref(schemas.CompleteMetadata),
                        ]
                    }
                },
            },
        },
        404: _json_response("unknown or evicted request_id", schemas.ref(schemas.ErrorDetail)),
        503: _STORE_DOWN,
    },
)


def routes() -> list[RawRoute]:
    return [
        RawRoute(
            "/api/v1/asample",
            asample,
            methods=["POST"],
            tags=["sampling"],
            openapi_extra=ASAMPLE_DOC,
        ),
        RawRoute(
            "/api/v1/retrieve_future",
            retrieve_future,
            methods=["POST"],
            tags=["sampling"],
            openapi_extra=RETRIEVE_DOC,
        ),
    ]
