"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

A request (responses_request.py) runs as the chat completion it maps to: the chat path's intake
(openai_intake.chat_intake: template, tools and tool_choice by grammar, reasoning split, sampling), its
finals / reasoning cut, its usage. `previous_response_id` prepends the stored conversation of that
response (responses_store.py), rendered first so the chain's earlier turns are a cached prefix. The
reply is a response object or, with `stream: true`, its typed events (responses_output.py): the reasoning
as its summary and sealed, the output's logprobs, as the request's OutputShape and `include` ask. Errors
are OpenAI's shape (http_common.error_response): 400 naming the field, 404 naming an unknown id.
"""

from __future__ import annotations

import time
from typing import AsyncIterator, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from radixlang_runtime.server.http_common import (ServerState, error_response, guard_stream, read_json,
                                                  stream_response)
from radixlang_runtime.server.openai_intake import (ChatIntake, chat_intake, finish_reason, sum_usage,
                                                    think_message, until_stop)
from radixlang_runtime.server.openai_logprobs import chat_logprobs
from radixlang_runtime.server.openai_records import parse_chat
from radixlang_runtime.server.responses_output import (ResponseEvents, conversation_turn, new_id, output_items,
                                                       response_object, response_usage, status_of)
from radixlang_runtime.server.responses_request import ResponsesRequest, parse_responses_body
from radixlang_runtime.server.responses_store import ResponseNotFound, ResponsesStore

router = APIRouter()


def responses_store(request: Request) -> ResponsesStore:
    """The app's store, made on first use from the server's flags (handlers run on the one event loop)."""
    app_state = request.app.state
    store = getattr(app_state, "responses_store", None)
    if store is None:
        args = app_state.server.args
        store = ResponsesStore(args.responses_store_max_entries, args.responses_store_max_bytes,
                               args.responses_store_ttl)
        app_state.responses_store = store
    return store


def _not_found(e: ResponseNotFound) -> Response:
    return error_response(404, str(e), e.param, "not_found")


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    state: ServerState = request.app.state.server
    store = responses_store(request)
    req = parse_responses_body(await read_json(request))
    history: list[dict] = []
    if req.previous_response_id is not None:
        try:
            history = store.get(req.previous_response_id, "previous_response_id").conversation
        except ResponseNotFound as e:
            return _not_found(e)
    chat = parse_chat(state, req.with_history(history))
    rid = new_id("resp")
    intake = await state.tm.run_intake(chat_intake, state, chat, rid, size=len(await request.body()))
    choices, plan, think = intake.choices, intake.tools, intake.think
    echo = req.echo_ran(choices.reqs[0].sampling.max_new_tokens)
    skeleton = response_object(rid, int(time.time()), state.served_model_name, echo, "in_progress", [], None)
    keep = _Keeper(store, req, history)
    if req.stream:
        return stream_response(guard_stream(_stream(intake, ResponseEvents(skeleton, req.shape), keep)))
    if think is None:
        outs = await choices.finals()
        message, finish = plan.message(outs[0]["text"], finish_reason(outs[0]["meta_info"]["finish_reason"]))
    else:
        outs = [await until_stop(choices.streams()[0], think)]
        message, finish = think_message(plan, think, outs[0])
    status, incomplete = status_of(finish)
    usage = response_usage(sum_usage(outs, 1, think, state.tm.tokenizer.decode))
    lps = _logprobs(intake, outs[0])
    final = response_object(rid, skeleton["created_at"], skeleton["model"], echo, status,
                            output_items(message, req.shape, lps), usage, incomplete)
    keep(final)
    return JSONResponse(final)


class _Keeper:
    """Stores a finished response (store: true) with its conversation: the chain so far, this input, its output."""

    def __init__(self, store: ResponsesStore, req: ResponsesRequest, history: list[dict]):
        self.store, self.req, self.history = store, req, history

    def __call__(self, final: dict) -> None:
        if self.req.store:
            self.store.put(final["id"], final, self.history + self.req.messages + conversation_turn(final["output"]))


def _logprobs(intake: ChatIntake, out: dict) -> list[dict]:
    """The output's (or a snapshot's) tokens' logprobs as chat's logprobs.content entries ([] unless asked)."""
    return chat_logprobs(out["meta_info"], intake.top_logprobs)["content"] if intake.logprobs else []


async def _stream(intake: ChatIntake, events: ResponseEvents, keep: _Keeper) -> AsyncIterator[bytes]:
    """The one choice's snapshots through the reasoning split and the tool-call parser (as the chat stream),
    as Responses events."""
    choices, plan, think = intake.choices, intake.tools, intake.think
    for e in events.start():
        yield e
    gen = choices.streams()[0]
    ts, rs = plan.stream(), think.stream() if think else None
    ids: list[int] = []
    last: Optional[dict] = None
    fin: Optional[str] = None
    try:
        async for out in gen:
            ids += out["output_ids"]
            fin = finish_reason(out["meta_info"]["finish_reason"])
            events.add_logprobs(_logprobs(intake, out))
            delta = out["text"]
            chunks: list[bytes] = []
            if rs is not None:
                split = rs.feed(delta, fin is not None)
                if rs.stopped:  # the content reached a stop string: as the non-streamed reply, "stop"
                    fin = "stop"
                chunks += events.reasoning(split.reasoning) if split.reasoning else []
                delta = split.content
            if ts is None:
                deltas = [{"content": delta}] if delta else []
            else:
                deltas = ts.feed(delta) + (ts.finish() if fin is not None else [])
                fin = ts.finish_reason(fin)
            for d in deltas:
                chunks += events.chat_delta(d)
            for c in chunks:
                yield c
            if fin is not None:
                last = {**out, "output_ids": ids}
                break
    finally:
        await gen.aclose()  # aborts the request when it has not finished (a stop string, the client gone)
    if last is None:
        raise RuntimeError("the request ended without a result")
    usage = response_usage(sum_usage([last], 1, think, choices.tm.tokenizer.decode))
    tail, final = events.finish(usage, fin)
    keep(final)
    for c in tail:
        yield c


@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> Response:
    try:
        return JSONResponse(responses_store(request).get(response_id).response)
    except ResponseNotFound as e:
        return _not_found(e)


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> Response:
    try:
        responses_store(request).delete(response_id)
    except ResponseNotFound as e:
        return _not_found(e)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})
