"""The native /generate route (PROTOCOL.md): one parser of its body, plain and SSE answers.

parse_generate is the one parser of generate inputs on the server side (HTTP and the DSL's ZeroMQ
frontend use it): text or input_ids (one or a list), sampling_params (one or per prompt), rid, logprob
options; n > 1 fans out as rid-0, rid-1, ...
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from radixlang_runtime.generate_input import GenerateItem, parse_generate_input
from radixlang_runtime.limits import FieldError, need_bool, show
from radixlang_runtime.results import Cumulative
from radixlang_runtime.server.http_common import (SSE_DONE, BadRequest, ServerState, final_result, guard_stream,
                                                  merged, read_json, sse, stream_response)
from radixlang_runtime.server.tokenizer_manager import TokenizerManager


def parse_generate(tm: TokenizerManager, body: Any) -> tuple[list[GenerateItem], bool]:
    """The /generate body -> ([(input_ids, sampling, rid, logprob request)], whether the answer is a list).
    Tokenizes: callers run it on an intake thread (tm.run_intake)."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    need_bool(body.get("stream", False), "stream")
    items, as_list = parse_generate_input(body.get("text"), body.get("input_ids"), body.get("sampling_params"),
                                          body.get("rid"), body.get("return_logprob", False),
                                          body.get("logprob_start_len"), body.get("top_logprobs_num"),
                                          body.get("return_text_in_logprobs"), tm.encode_text, tm.limits)
    counts = Counter(it.rid for it in items if it.rid is not None)
    if dupes := sorted(r for r, c in counts.items() if c > 1):
        raise FieldError("rid", f"duplicate rid(s): {show(dupes)}")
    return items, as_list


def input_size(body: Any) -> int:
    """Characters / token ids of a generate body's prompts: picks its intake pool (tm.run_intake)."""
    prompt = body.get("text", body.get("input_ids")) if isinstance(body, dict) else None
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(len(p) if isinstance(p, (str, list)) else 1 for p in prompt)
    return 0


async def intake_generate(tm: TokenizerManager, body: Any) -> tuple[list[GenerateItem], bool]:
    """parse_generate on an intake thread (HTTP and the ZeroMQ frontend): the event loop never tokenizes."""
    return await tm.run_intake(parse_generate, tm, body, size=input_size(body))


async def generate_route(state: ServerState, request: Request) -> Response:
    tm = state.tm
    body = await read_json(request)
    items, as_list = await intake_generate(tm, body)
    if body.get("stream", False):  # the requests are admitted (tm.generate) before the headers go out
        gens = [tm.generate(ids, sp, rid, stream=True, logprob=lp) for ids, sp, rid, lp in items]
        return stream_response(guard_stream(_stream_generate(gens, as_list, state.args.incremental_streaming_output)))
    results = await asyncio.gather(*(final_result(tm.generate(ids, sp, rid, logprob=lp)) for ids, sp, rid, lp in items))
    return JSONResponse(results if as_list else results[0])


async def _stream_generate(gens: list[AsyncIterator[dict]], as_list: bool,
                           incremental: bool = False) -> AsyncIterator[bytes]:
    """One SSE event per update of any of the requests (cumulative text / output_ids, or deltas with
    --incremental-streaming-output: tm.generate's own); with several requests each event carries its `index`."""
    whole: dict[int, Cumulative] = {}  # index -> the text and ids so far (cumulative mode)
    async for i, out in merged(gens):
        if incremental:
            out.pop("text_trim", None)  # characters already sent stay sent
        else:
            acc = whole.setdefault(i, Cumulative())
            acc.add(out)
            out = acc.snapshot(out)
        if as_list:
            out["index"] = i
        yield sse(out)
    yield SSE_DONE


