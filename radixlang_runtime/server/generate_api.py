"""The native protocol's router (PROTOCOL.md): /generate (plain / SSE), /model_info, /get_model_info,
/concate_and_append_request. Handlers are top-level functions over the service layer (services.py);
the ServerState is the app's (`request.app.state.server`, set by http_server.create_app).
"""

from __future__ import annotations

from typing import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from radixlang_runtime.protocol.results import Cumulative
from radixlang_runtime.server import services
from radixlang_runtime.server.client_watch import unless_client_gone
from radixlang_runtime.server.http_common import (SSE_DONE, BadRequest, ServerState, client_gone_counter, guard_stream,
                                                  read_json, sse, stream_response)

router = APIRouter()


def server_state(request: Request) -> ServerState:
    return request.app.state.server


@router.post("/generate")
async def generate(request: Request) -> Response:
    state = server_state(request)
    body = await read_json(request)
    reqs, as_list = await services.intake_generate(state, body)
    if reqs[0].stream:  # the requests are admitted (tm.generate) before the headers go out
        events = services.generate_events(services.generate_streams(state, reqs), as_list)
        return stream_response(guard_stream(_sse_events(events, state.args.incremental_streaming_output)))
    results = await unless_client_gone(request, services.generate_finals(state, reqs), client_gone_counter(state))
    return JSONResponse(results if as_list else results[0])


async def _sse_events(events: AsyncIterator[dict], incremental: bool = False) -> AsyncIterator[bytes]:
    """One SSE event per update of any of the requests (cumulative text / output_ids, or deltas with
    --incremental-streaming-output: tm.generate's own); with several requests each event carries its `index`."""
    whole: dict[int, Cumulative] = {}  # index -> the text and ids so far (cumulative mode)
    async for out in events:
        if incremental:
            out.pop("text_trim", None)  # characters already sent stay sent
        else:
            acc = whole.setdefault(out.get("index", 0), Cumulative())
            acc.add(out)
            out = acc.snapshot(out)
        yield sse(out)
    yield SSE_DONE


@router.get("/model_info")
@router.get("/get_model_info")
async def model_info(request: Request):
    return services.model_info(server_state(request))


@router.post("/concate_and_append_request")
async def concate_and_append(request: Request):
    body = await read_json(request)
    if not isinstance(body, dict) or not isinstance(body.get("src_rids"), list):
        raise BadRequest("concate_and_append_request needs {\"src_rids\": [...], \"dst_rid\": ...}")
    return {}  # the frontend already joined the texts; the radix cache shares the KV by itself
