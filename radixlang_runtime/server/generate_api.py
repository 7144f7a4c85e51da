"""The native /generate route (PROTOCOL.md): one parser of its body, plain and SSE answers.

parse_generate is the one parser of generate inputs on the server side (HTTP and the DSL's ZeroMQ
frontend use it): text or input_ids (one or a list), sampling_params (one or per prompt), rid, logprob
options; n > 1 fans out as rid-0, rid-1, ...
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from radixlang_runtime.generate_input import GenerateItem, parse_generate_input
from radixlang_runtime.server.http_common import (SSE_DONE, BadRequest, ServerState, final_result, guard_stream,
                                                  merged, read_json, sse, stream_response, text_delta)
from radixlang_runtime.server.tokenizer_manager import TokenizerManager


def parse_generate(tm: TokenizerManager, body: Any) -> tuple[list[GenerateItem], bool]:
    """The /generate body -> ([(input_ids, sampling, rid, logprob request)], whether the answer is a list)."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return parse_generate_input(body.get("text"), body.get("input_ids"), body.get("sampling_params"),
                                body.get("rid"), body.get("return_logprob", False), body.get("logprob_start_len"),
                                body.get("top_logprobs_num"), body.get("return_text_in_logprobs"),
                                tm.encode_text, tm.limits)


async def generate_route(state: ServerState, request: Request) -> Response:
    tm = state.tm
    body = await read_json(request)
    items, as_list = parse_generate(tm, body)
    if rid_dupes := {it[2] for it in items if it[2] is not None and sum(x[2] == it[2] for x in items) > 1}:
        raise BadRequest(f"duplicate rid(s): {sorted(rid_dupes)}")
    if body.get("stream"):  # the requests are admitted (tm.generate) before the headers go out
        gens = [tm.generate(ids, sp, rid, stream=True, logprob=lp) for ids, sp, rid, lp in items]
        return stream_response(guard_stream(_stream_generate(gens, as_list, state.args.incremental_streaming_output)))
    results = await asyncio.gather(*(final_result(tm.generate(ids, sp, rid, logprob=lp)) for ids, sp, rid, lp in items))
    return JSONResponse(results if as_list else results[0])


async def _stream_generate(gens: list[AsyncIterator[dict]], as_list: bool,
                           incremental: bool = False) -> AsyncIterator[bytes]:
    """One SSE event per update of any of the requests (cumulative text / output_ids, or deltas with
    --incremental-streaming-output); with several requests each event carries its `index`."""
    sent: dict[int, tuple[int, int]] = {}  # index -> (text chars, output ids) already sent (incremental mode)
    async for i, out in merged(gens):
        if incremental:
            t0, n0 = sent.get(i, (0, 0))
            ids = out["output_ids"]
            out["text"], t1 = text_delta(out["text"], t0)
            out["output_ids"] = ids[n0:]
            sent[i] = (t1, len(ids))
        if as_list:
            out["index"] = i
        yield sse(out)
    yield SSE_DONE


