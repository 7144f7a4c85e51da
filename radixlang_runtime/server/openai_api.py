"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions.

A body is parsed once into its typed request (openai_records.py: every check, every error naming its field),
turned into runtime requests on an intake thread (openai_intake.py: the chat template, tokenizing, tools,
the reasoning split), then answered whole or streamed. Streams send text deltas (the tokenizer manager's
own), then an optional usage chunk (`stream_options.include_usage`; with vLLM's `continuous_usage_stats` every
chunk also carries its choice's usage so far), then `data: [DONE]`; a chat stream keeps
one ChatChoiceStream record per choice. response_format json_schema / json_object (and the regex /
json_schema extensions) constrain the output through the grammar backend. Logprobs are the model's raw
log_softmax (before temperature), in OpenAI's shapes for completions and chat (openai_logprobs.py), and
vLLM's prompt_logprobs (not streamed): per choice on completions, once on the chat response. Chat `tools` /
`tool_choice` / `parallel_tool_calls`: openai_tools.py; messages and the chat template: chat_render.py.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from radixlang_runtime.server.client_watch import unless_client_gone
from radixlang_runtime.server.http_common import (SSE_DONE, ServerState, client_gone_counter, guard_stream, merged,
                                                  read_json, sse, stream_response)
from radixlang_runtime.server.openai_intake import (ChatIntake, Choices, CompletionIntake, chat_intake,
                                                    completion_intake, finish_reason, sum_usage, think_message,
                                                    until_stops)
from radixlang_runtime.server.openai_logprobs import chat_logprobs, completion_logprobs, prompt_logprobs
from radixlang_runtime.server.openai_reasoning import ReasoningStream
from radixlang_runtime.server.openai_records import OpenAIOptions, parse_chat, parse_completion
from radixlang_runtime.server.openai_tools import ToolStream


router = APIRouter()  # top-level handlers; the ServerState is the app's (request.app.state.server)


@router.get("/v1/models")
async def models(request: Request):
    state = request.app.state.server
    base = state.served_model_name
    return {"object": "list", "data": [{"id": base, "object": "model", "created": 0, "owned_by": "radixlang",
                                        "max_model_len": state.tm.limits.context_len}] + [
        {"id": name, "object": "model", "created": 0, "owned_by": "radixlang", "root": base, "parent": base,
         "max_model_len": state.tm.limits.context_len} for name in state.tm.limits.lora_adapters if name is not None]}


@dataclass(frozen=True)
class Reply:
    """What every chunk and answer of one call carries."""

    rid: str  # the response id (`cmpl-hex` / `chatcmpl-hex`), the base of the choices' rids
    created: int
    model: str


def _reply(state: ServerState, prefix: str, rid: Optional[str]) -> Reply:
    """rid: SGLang's request field (the response's id), else `prefix-hex`."""
    return Reply(rid or f"{prefix}-{uuid.uuid4().hex}", int(time.time()), state.served_model_name)


# ------------------------------------------------------------------ completions
@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    state: ServerState = request.app.state.server
    req = parse_completion(state, await read_json(request))
    reply = _reply(state, "cmpl", req.options.rid)
    intake = await state.tm.run_intake(completion_intake, state, req, reply.rid, size=len(await request.body()))
    n = req.options.n
    if req.options.stream:
        return stream_response(guard_stream(_stream_completion(intake, reply, n, req.options)))
    outs = await unless_client_gone(request, intake.choices.finals(), client_gone_counter(state))
    texts, top, prompt_top = intake.echo_texts, intake.logprobs, req.options.prompt_logprobs
    choices = [{"index": i, "text": (texts[i // n] if texts else "") + o["text"],
                "logprobs": completion_logprobs(o["meta_info"], texts is not None, token_ids=intake.token_ids,
                                                top=top) if top is not None else None,
                "finish_reason": finish_reason(o["meta_info"]["finish_reason"])} for i, o in enumerate(outs)]
    if prompt_top is not None:
        for c, o in zip(choices, outs):
            c["prompt_logprobs"] = prompt_logprobs(o["meta_info"], prompt_top)
    with_hidden_states(choices, outs, req.options)
    return JSONResponse({"id": reply.rid, "object": "text_completion", "created": reply.created,
                         "model": reply.model, "choices": choices, "usage": sum_usage(outs, n)})


def with_hidden_states(choices: list[dict], outs: list[dict], options: OpenAIOptions) -> None:
    """return_hidden_states (SGLang's OpenAI field): each choice's `hidden_states` is the last row of its
    meta_info.hidden_states, the last generated token's input to the head but one ([] when only the prompt ran)."""
    if options.extras.return_hidden_states:
        for c, o in zip(choices, outs):
            rows = o["meta_info"]["hidden_states"]
            c["hidden_states"] = rows[-1] if len(rows) > 1 else []


def running_usage(choices: Choices) -> Callable[[int, Optional[dict]], dict]:
    """Per chunk (continuous_usage_stats): choice i's usage so far; out: its latest snapshot (None: none yet)."""
    def of(i: int, out: Optional[dict]) -> dict:
        meta = out["meta_info"] if out is not None else {}
        prompt = meta.get("prompt_tokens", len(choices.reqs[i].input_ids))
        completion = meta.get("completion_tokens", 0)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return of


async def _stream_completion(intake: CompletionIntake, reply: Reply, n: int,
                             options: OpenAIOptions) -> AsyncIterator[bytes]:
    choices = intake.choices
    finals: list[Optional[dict]] = [None] * len(choices.reqs)
    usage_of = running_usage(choices)

    def chunk(i: int, text: str, finish: Optional[str], lp: Optional[dict] = None,
              out: Optional[dict] = None) -> bytes:
        body = {"id": reply.rid, "object": "text_completion", "created": reply.created, "model": reply.model,
                "choices": [{"index": i, "text": text, "logprobs": lp, "finish_reason": finish}]}
        return sse({**body, "usage": usage_of(i, out)} if options.continuous_usage else body)

    if intake.echo_texts:
        for i in range(len(choices.reqs)):
            yield chunk(i, intake.echo_texts[i // n], None)
    async for i, out in merged(choices.streams()):
        delta = out["text"]  # a delta (a stop string cut after it streamed: what was sent stays)
        fin = finish_reason(out["meta_info"]["finish_reason"])
        if fin is not None:
            finals[i] = out
        lp = completion_logprobs(out["meta_info"], False, token_ids=intake.token_ids, top=intake.logprobs) \
            if intake.logprobs is not None else None
        if delta or fin is not None or (lp and lp["tokens"]):
            yield chunk(i, delta, fin, lp, out)
    if options.include_usage:
        yield sse({"id": reply.rid, "object": "text_completion", "created": reply.created, "model": reply.model,
                   "choices": [], "usage": sum_usage([f for f in finals if f], n)})
    yield SSE_DONE


# ------------------------------------------------------------------ chat
@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    state: ServerState = request.app.state.server
    req = parse_chat(state, await read_json(request))
    reply = _reply(state, "chatcmpl", req.options.rid)
    intake = await state.tm.run_intake(chat_intake, state, req, reply.rid, size=len(await request.body()))
    n = req.options.n
    if req.options.stream:
        return stream_response(guard_stream(_stream_chat(intake, reply, n, req.options)))
    think, tools = intake.think, intake.tools
    if think is None:
        outs = await unless_client_gone(request, intake.choices.finals(), client_gone_counter(state))
        replies = [tools.message(o["text"], finish_reason(o["meta_info"]["finish_reason"])) for o in outs]
    else:
        outs = await unless_client_gone(request, until_stops(intake.choices, think), client_gone_counter(state))
        replies = [think_message(tools, think, o) for o in outs]
    prompt_top = req.options.prompt_logprobs
    choices = [{"index": i, "message": message,
                "logprobs": chat_logprobs(o["meta_info"], intake.top_logprobs, intake.token_ids)
                if intake.logprobs else None,
                "finish_reason": finish} for i, (o, (message, finish)) in enumerate(zip(outs, replies))]
    with_hidden_states(choices, outs, req.options)
    return JSONResponse({
        "id": reply.rid, "object": "chat.completion", "created": reply.created, "model": reply.model,
        "choices": choices,
        "usage": sum_usage(outs, n, think, state.tm.tokenizer.decode),
        **({"prompt_logprobs": prompt_logprobs(outs[0]["meta_info"], prompt_top)} if prompt_top is not None else {}),
    })


@dataclass
class ChatChoiceStream:
    """One streamed chat choice's state."""

    tools: Optional[ToolStream]  # None: plain text
    think: Optional[ReasoningStream]  # None: no reasoning split
    ids: list[int] = field(default_factory=list)  # output ids so far (usage: the reasoning tokens)
    held: str = ""  # stream_reasoning false: the reasoning until it ends
    final: Optional[dict] = None  # the last snapshot once finished (or cut by a stop string)


def _chat_deltas(intake: ChatIntake, c: ChatChoiceStream, delta: str, fin: Optional[str],
                 abort: Callable[[], None]) -> tuple[list[dict], Optional[str]]:
    """One snapshot's text delta -> the chat deltas to send and the choice's finish_reason."""
    deltas: list[dict] = []
    rs = c.think
    if rs is not None:
        split = rs.feed(delta, fin is not None)
        if rs.stopped:  # the content reached a stop string (as the non-streamed reply: "stop")
            if fin is None:
                abort()
            fin = "stop"
        c.held += split.reasoning
        if c.held and (intake.think.stream_reasoning or not rs.parser.in_reasoning or fin is not None):
            deltas.append({"reasoning_content": c.held})
            c.held = ""
        delta = split.content
    if c.tools is None:
        deltas += [{"content": delta}] if delta else []
    else:  # the markup held back until decided; the rest of it when the choice ends
        deltas += c.tools.feed(delta) + (c.tools.finish() if fin is not None else [])
        fin = c.tools.finish_reason(fin)
    return deltas, fin


async def _stream_chat(intake: ChatIntake, reply: Reply, n: int, options: OpenAIOptions) -> AsyncIterator[bytes]:
    choices = intake.choices
    usage_of = running_usage(choices)
    last: list[Optional[dict]] = [None] * len(choices.reqs)  # each choice's latest snapshot

    def chunk(i: int, delta: dict, finish: Optional[str], lp: Optional[dict] = None) -> bytes:
        body = {"id": reply.rid, "object": "chat.completion.chunk", "created": reply.created, "model": reply.model,
                "choices": [{"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}]}
        return sse({**body, "usage": usage_of(i, last[i])} if options.continuous_usage else body)

    state = [ChatChoiceStream(intake.tools.stream(), intake.think.stream() if intake.think else None)
             for _ in choices.reqs]
    for i in range(len(choices.reqs)):
        yield chunk(i, {"role": "assistant", "content": ""}, None)
    async for i, out in merged(choices.streams()):
        c = state[i]
        if c.final is not None:  # cut by a stop string (its abort's last snapshot)
            continue
        last[i] = out
        c.ids += out["output_ids"]
        lp = chat_logprobs(out["meta_info"], intake.top_logprobs, intake.token_ids) if intake.logprobs else None
        deltas, fin = _chat_deltas(intake, c, out["text"], finish_reason(out["meta_info"]["finish_reason"]),
                                   lambda: choices.tm.abort(choices.reqs[i].rid))
        if lp and lp["content"] and not deltas:
            deltas = [{"content": ""}]  # logprobs travel with a delta
        for k, d in enumerate(deltas):
            yield chunk(i, d, None, lp if k == 0 else None)
        if fin is not None:
            c.final = {**out, "output_ids": c.ids}
            yield chunk(i, {}, fin)
    if options.include_usage:
        usage = sum_usage([c.final for c in state if c.final], n, intake.think, choices.tm.tokenizer.decode)
        yield sse({"id": reply.rid, "object": "chat.completion.chunk", "created": reply.created,
                   "model": reply.model, "choices": [], "usage": usage})
    yield SSE_DONE
