"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions.

Each choice is one runtime request (prompts x n of them, index = prompt * n + sample). Streams send
text deltas (the tokenizer manager's own), then an optional usage chunk
(`stream_options.include_usage`), then `data: [DONE]`. Fields are strict (ROUTE_FIELDS): an unknown
one answers 400 naming it, options the runtime cannot honour yet (best_of, suffix, functions,
...: _OFF_VALUES) answer 400 unless null or off, informational ones (user, metadata, store) are taken
and change nothing, as do the hints the SDKs send by default (verbosity, reasoning_effort: openai_hints.py);
a `model` other than the served name, "default" or a LoRA adapter ("<served>:<adapter>" or the adapter's
bare name, lora_spec.py) is 404 model_not_found. Parsing,
the chat template and tokenizing run on an intake thread (TokenizerManager.run_intake).
response_format json_schema / json_object (and the regex / json_schema extensions) constrain the output
through the grammar backend. Logprobs are the model's raw log_softmax (before temperature), in OpenAI's
shapes for completions and chat. Chat `tools` / `tool_choice` / `parallel_tool_calls`: openai_tools.py;
messages and the chat template: chat_render.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from typing import Any, AsyncIterator, Callable, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from radixlang_runtime.constrained.spec import spec_from_response_format
from radixlang_runtime.generate_input import BOOTSTRAP_FIELDS, GenerateRequest, openai_requests, parse_bootstrap, \
    with_lora
from radixlang_runtime.lora_spec import LoraNotFound, lora_id_of_model
from radixlang_runtime.limits import MAX_BATCH, MAX_N, FieldError, need_bool, need_int, need_str, show
from radixlang_runtime.logprob_format import normalize_logprob_args
from radixlang_runtime.results import Cumulative, LogprobRequest
from radixlang_runtime.server.chat_render import CHATML_TOOLS_TEMPLATE, chat_content_spans, render_chat, template_kwargs
from radixlang_runtime.server.client_watch import unless_client_gone
from radixlang_runtime.server.http_common import (SSE_DONE, BadRequest, ServerState, client_gone_counter, final_result,
                                                  guard_stream, merged, read_json, sse, stream_response)
from radixlang_runtime.server.openai_hints import HINT_VALUES, check_hints
from radixlang_runtime.server.openai_reasoning import ReasoningPlan, reasoning_plan, reasoning_tokens, split_whole
from radixlang_runtime.server.openai_tools import ToolPlan, check_tools, forced_call_regex, set_parser

_EXTENSIONS = ("top_k", "min_p", "repetition_penalty", "ignore_eos", "stop_token_ids", "skip_special_tokens",
               "no_stop_trim", "regex", "json_schema", "ebnf")
_SAMPLING_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "stop", "seed", "max_tokens",
                    "min_tokens", "response_format", "logit_bias", *_EXTENSIONS)
_INFORMATIONAL = ("user", "metadata", "store", "safety_identifier", "prompt_cache_key")  # taken; change no output
# Not implemented: taken only null or at the value that leaves them off, else 400 naming them.
_OFF_VALUES: dict[str, tuple] = {
    "best_of": (1,), "suffix": ("",), "functions": ([],), "function_call": ("none", "auto"),
    "modalities": (["text"],), "audio": (), "prediction": (), "web_search_options": (),
    "service_tier": ("auto", "default"),
}
_COMMON = {"model", "n", "stream", "stream_options", *_SAMPLING_FIELDS, *_INFORMATIONAL,
           *BOOTSTRAP_FIELDS}  # PD: the router's fields (generate_input.parse_bootstrap)
ROUTE_FIELDS = {  # every field a route knows; any other answers 400 naming it
    "/v1/completions": {*_COMMON, "prompt", "echo", "logprobs", "best_of", "suffix"},
    "/v1/chat/completions": {*_COMMON, "messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools",
                             "tool_choice", "parallel_tool_calls", "separate_reasoning", "stream_reasoning",
                             "chat_template_kwargs", "reasoning_effort",  # chat_render.template_kwargs
                             *HINT_VALUES, *(set(_OFF_VALUES) - {"best_of", "suffix"})},
}
MODEL_ALIASES = ("default",)  # besides the served model name; a missing `model` is taken too
MAX_LOGPROBS = 20  # OpenAI's cap of logprobs (completions) / top_logprobs (chat)


class ModelNotFound(LookupError):
    """An unknown `model`: 404 with OpenAI's code "model_not_found"."""


def _finish(reason: Optional[dict]) -> Optional[str]:
    if reason is None:
        return None
    return {"stop": "stop", "length": "length"}.get(reason.get("type"), reason.get("type"))


def _opt(body: dict, name: str, default: Any) -> Any:
    v = body.get(name, default)
    return default if v is None else v


def sampling_from_openai(body: dict, max_tokens_default: Optional[int], context_left: int) -> dict[str, Any]:
    """OpenAI request fields -> our sampling_params dict (SamplingParams validates the rest; the fields
    whose names differ are checked here, under their OpenAI names)."""
    spec = spec_from_response_format(body.get("response_format"))  # ValueError (400) naming the problem
    max_tokens = body.get("max_completion_tokens")
    name = "max_completion_tokens"
    if max_tokens is None:
        max_tokens, name = body.get("max_tokens"), "max_tokens"
    if max_tokens is None:  # completions: 16 (OpenAI's default); chat: whatever room is left
        max_tokens = max_tokens_default if max_tokens_default is not None else context_left
    sp: dict[str, Any] = {
        "max_new_tokens": need_int(max_tokens, name, 0),
        "min_new_tokens": need_int(_opt(body, "min_tokens", 0), "min_tokens", 0),
        "temperature": _opt(body, "temperature", 1.0),
        "top_p": _opt(body, "top_p", 1.0),
        "presence_penalty": _opt(body, "presence_penalty", 0.0),
        "frequency_penalty": _opt(body, "frequency_penalty", 0.0),
        "stop": body.get("stop"),
        "sampling_seed": None if body.get("seed") is None else need_int(body["seed"], "seed"),
        "logit_bias": body.get("logit_bias"),  # {"token id": bias}: SamplingParams checks it (param logit_bias)
    }
    for name in _EXTENSIONS:
        if body.get(name) is not None:
            sp[name] = body[name]
    if spec is not None:  # json_object / json_schema: the same grammar path as native json_schema
        if any(sp.get(k) is not None for k in ("regex", "json_schema", "ebnf")):
            raise BadRequest("pass either response_format or regex / json_schema / ebnf, not both")
        sp[spec.kind] = spec.source
    return sp


def usage(prompt_tokens: int, completion_tokens: int, cached: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached}}


def check_openai_body(state: ServerState, body: Any, route: str) -> dict:
    """The fields every OpenAI route shares: known names only, unimplemented ones off, the model
    served here, n, stream, stream_options. Raises BadRequest / FieldError (400), ModelNotFound (404)."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if unknown := sorted(set(body) - ROUTE_FIELDS[route]):
        raise FieldError(unknown[0], f"unknown field(s) for {route}: {', '.join(show(u, 40) for u in unknown)}")
    for name, off in _OFF_VALUES.items():
        v = body.get(name)
        if v is not None and not any(type(v) is type(o) and v == o for o in off):
            allowed = f" (only {' or '.join(json.dumps(o) for o in off)})" if off else ""
            raise FieldError(name, f"{name} is not supported{allowed}, got {show(v)}")
    check_hints(body)  # verbosity, reasoning_effort, prompt_cache_retention: documented no-ops (openai_hints.py)
    model = body.get("model")
    if model is not None and need_str(model, "model") not in (state.served_model_name, *MODEL_ALIASES) \
            and openai_lora_id(state, body) == 0:
        raise ModelNotFound(f"The model {show(model)} does not exist: this server serves "
                            f"{state.served_model_name!r} (or {', '.join(map(repr, MODEL_ALIASES))})")
    need_int(_opt(body, "n", 1), "n", 1, MAX_N)
    need_bool(_opt(body, "stream", False), "stream")
    so = _opt(body, "stream_options", {})
    if not isinstance(so, dict):
        raise FieldError("stream_options", "stream_options must be an object")
    if unknown := sorted(set(so) - {"include_usage"}):
        raise FieldError("stream_options",
                         f"unknown field(s) in stream_options: {', '.join(show(u, 40) for u in unknown)}")
    need_bool(_opt(so, "include_usage", False), "stream_options.include_usage")
    return body


def openai_lora_id(state: ServerState, body: Optional[dict]) -> int:
    """The LoRA adapter an OpenAI `model` names ("<served>:<adapter>" or the adapter's bare name; lora_spec.py):
    its id, 0 for the base model; an unknown adapter is ModelNotFound (404) naming it."""
    try:
        got = lora_id_of_model((body or {}).get("model"), state.served_model_name, state.tm.limits.lora_adapters)
    except LoraNotFound as e:
        raise ModelNotFound(str(e)) from e
    return got or 0


class _Choices:
    """The runtime requests behind one OpenAI call: prompts x n choices (generate_input.openai_requests:
    validated up front, rids f"{rid}-{index}", index = prompt * n + sample)."""

    def __init__(self, state: ServerState, prompts: list[list[int]], sp_dict: dict, n: int,
                 top_logprobs: Optional[int] = None, echo: bool = False, rid: Optional[str] = None,
                 body: Optional[dict] = None):
        self.tm = state.tm
        self.rid = rid or uuid.uuid4().hex

        def logprob_of(_i: int, ids: list[int]) -> Optional[LogprobRequest]:
            if top_logprobs is None:
                return None
            # without echo only output logprobs: start at the last prompt position
            start, top = normalize_logprob_args(len(ids), True, 0 if echo else len(ids) - 1, top_logprobs)
            return LogprobRequest(start, top, with_text=True)

        self.tm.lifecycle.admit()  # 503 before any work when no new work is admitted
        pd = parse_bootstrap(body or {}, self.tm.limits.disaggregation_mode,
                             self.tm.limits.disaggregation_prefill_peers)
        self.reqs: list[GenerateRequest] = with_lora(
            openai_requests(prompts, sp_dict, n, logprob_of, self.tm.limits, self.rid, stream=False, bootstrap=pd),
            openai_lora_id(state, body))

    def streams(self) -> list[AsyncIterator[dict]]:
        return [self.tm.generate(dataclasses.replace(r, stream=True)) for r in self.reqs]

    async def finals(self) -> list[dict]:
        return await asyncio.gather(*(final_result(self.tm.generate(r)) for r in self.reqs))


def _int_option(body: dict, name: str, hi: int) -> Optional[int]:
    v = body.get(name)
    return None if v is None else need_int(v, name, 0, hi)


def completion_logprobs(meta: dict, echo: bool, text_offset0: int = 0) -> dict:
    """meta_info entries -> OpenAI completions `logprobs` (tokens, token_logprobs, top_logprobs, text_offset)."""
    entries = meta.get("output_token_logprobs", [])
    tops = meta.get("output_top_logprobs") or [None] * len(entries)
    if echo and "input_token_logprobs" in meta:
        entries = meta["input_token_logprobs"] + entries
        tops = (meta.get("input_top_logprobs") or [None] * len(meta["input_token_logprobs"])) + tops
    tokens = [e[2] for e in entries]
    offsets, pos = [], text_offset0
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    return {"tokens": tokens, "token_logprobs": [e[0] for e in entries],
            "top_logprobs": [None if row is None else {e[2]: e[0] for e in row} for row in tops],
            "text_offset": offsets}


def chat_logprobs(meta: dict, with_top: bool) -> dict:
    entries = meta.get("output_token_logprobs", [])
    tops = meta.get("output_top_logprobs") or [[] for _ in entries]

    def item(e: list) -> dict:
        return {"token": e[2], "logprob": e[0], "bytes": list(e[2].encode())}

    return {"content": [{**item(e), "top_logprobs": [item(x) for x in row] if with_top else []}
                        for e, row in zip(entries, tops)]}


router = APIRouter()  # top-level handlers; the ServerState is the app's (request.app.state.server)


@router.get("/v1/models")
async def models(request: Request):
    state = request.app.state.server
    base = state.served_model_name
    return {"object": "list", "data": [{"id": base, "object": "model", "created": 0, "owned_by": "radixlang",
                                        "max_model_len": state.tm.limits.context_len}] + [
        {"id": name, "object": "model", "created": 0, "owned_by": "radixlang", "root": base, "parent": base,
         "max_model_len": state.tm.limits.context_len} for name in state.tm.limits.lora_adapters if name is not None]}


async def _accept(request: Request, route: str, rid_prefix: str) -> tuple[ServerState, dict, str, int, str]:
    """What both OpenAI generate routes start with: the checked body, the response id (`{rid_prefix}-hex`, the
    base of the choices' rids), the creation time and the served model name."""
    state: ServerState = request.app.state.server
    body = check_openai_body(state, await read_json(request), route)
    return state, body, f"{rid_prefix}-{uuid.uuid4().hex}", int(time.time()), state.served_model_name


# ------------------------------------------------------------------ completions
@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    state, body, rid, created, model = await _accept(request, "/v1/completions", "cmpl")
    tm = state.tm
    choices, texts, top = await tm.run_intake(_completion_intake, state, body, rid,
                                              size=len(await request.body()))
    n, echo = _opt(body, "n", 1), texts is not None
    if body.get("stream"):
        include_usage = bool(_opt(body, "stream_options", {}).get("include_usage"))
        return stream_response(guard_stream(_stream_completion(choices, rid, created, model, texts, n,
                                                               include_usage, top is not None)))
    outs = await unless_client_gone(request, choices.finals(), client_gone_counter(state))
    return JSONResponse({
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": i, "text": (texts[i // n] if echo else "") + o["text"],
                     "logprobs": completion_logprobs(o["meta_info"], echo) if top is not None else None,
                     "finish_reason": _finish(o["meta_info"]["finish_reason"])} for i, o in enumerate(outs)],
        "usage": _sum_usage(outs, n),
    })


async def _stream_completion(choices: _Choices, rid: str, created: int, model: str,
                             echo_texts: Optional[list[str]], n: int, include_usage: bool,
                             logprobs: bool) -> AsyncIterator[bytes]:
    finals: list[Optional[dict]] = [None] * len(choices.reqs)

    def chunk(i: int, text: str, finish: Optional[str], lp: Optional[dict] = None) -> bytes:
        return sse({"id": rid, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": i, "text": text, "logprobs": lp, "finish_reason": finish}]})

    if echo_texts:
        for i in range(len(choices.reqs)):
            yield chunk(i, echo_texts[i // n], None)
    async for i, out in merged(choices.streams()):
        delta = out["text"]  # a delta (a stop string cut after it streamed: what was sent stays)
        fin = _finish(out["meta_info"]["finish_reason"])
        if fin is not None:
            finals[i] = out
        lp = completion_logprobs(out["meta_info"], False) if logprobs else None
        if delta or fin is not None or (lp and lp["tokens"]):
            yield chunk(i, delta, fin, lp)
    if include_usage:
        yield sse({"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [],
                   "usage": _sum_usage([f for f in finals if f], n)})
    yield SSE_DONE


# ------------------------------------------------------------------ chat
@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    state, body, rid, created, model = await _accept(request, "/v1/chat/completions", "chatcmpl")
    tm = state.tm
    choices, want_lp, top, plan, think = await tm.run_intake(_chat_intake, state, body, rid,
                                                             size=len(await request.body()))
    n = _opt(body, "n", 1)
    if body.get("stream"):
        include_usage = bool(_opt(body, "stream_options", {}).get("include_usage"))
        return stream_response(guard_stream(_stream_chat(choices, rid, created, model, n, include_usage,
                                                         want_lp, bool(top), plan, think)))
    if think is None:
        outs = await unless_client_gone(request, choices.finals(), client_gone_counter(state))
        replies = [plan.message(o["text"], _finish(o["meta_info"]["finish_reason"])) for o in outs]
    else:
        outs = await unless_client_gone(request, _until_stops(choices, think), client_gone_counter(state))
        replies = [_think_message(plan, think, o) for o in outs]
    return JSONResponse({
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": i, "message": message,
                     "logprobs": chat_logprobs(o["meta_info"], bool(top)) if want_lp else None,
                     "finish_reason": finish} for i, (o, (message, finish)) in enumerate(zip(outs, replies))],
        "usage": _sum_usage(outs, n, think, tm.tokenizer.decode),
    })


async def _stream_chat(choices: _Choices, rid: str, created: int, model: str, n: int,
                       include_usage: bool, want_lp: bool, with_top: bool, plan: ToolPlan,
                       think: Optional[ReasoningPlan]) -> AsyncIterator[bytes]:
    def chunk(i: int, delta: dict, finish: Optional[str], lp: Optional[dict] = None) -> bytes:
        return sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}]})

    finals: list[Optional[dict]] = [None] * len(choices.reqs)
    ids: list[list[int]] = [[] for _ in choices.reqs]  # output ids so far (usage: the reasoning tokens)
    tools = [plan.stream() for _ in choices.reqs]  # None: plain text
    thinks = [think.stream() if think else None for _ in choices.reqs]  # None: no reasoning split
    held = [""] * len(choices.reqs)  # stream_reasoning false: the reasoning until it ends
    for i in range(len(choices.reqs)):
        yield chunk(i, {"role": "assistant", "content": ""}, None)
    async for i, out in merged(choices.streams()):
        if finals[i] is not None:  # cut by a stop string (its abort's last snapshot)
            continue
        delta = out["text"]  # a delta (a stop string cut after it streamed: what was sent stays)
        ids[i] += out["output_ids"]
        lp = chat_logprobs(out["meta_info"], with_top) if want_lp else None
        fin = _finish(out["meta_info"]["finish_reason"])
        deltas: list[dict] = []
        rs = thinks[i]
        if rs is not None:
            split = rs.feed(delta, fin is not None)
            if rs.stopped:  # the content reached a stop string (as the non-streamed reply: "stop")
                if fin is None:
                    choices.tm.abort(choices.reqs[i].rid)
                fin = "stop"
            held[i] += split.reasoning
            if held[i] and (think.stream_reasoning or not rs.parser.in_reasoning or fin is not None):
                deltas.append({"reasoning_content": held[i]})
                held[i] = ""
            delta = split.content
        ts = tools[i]
        if ts is None:
            deltas += [{"content": delta}] if delta else []
        else:  # the markup held back until decided; the rest of it when the choice ends
            deltas += ts.feed(delta) + (ts.finish() if fin is not None else [])
            fin = ts.finish_reason(fin)
        if lp and lp["content"] and not deltas:
            deltas = [{"content": ""}]  # logprobs travel with a delta
        for k, d in enumerate(deltas):
            yield chunk(i, d, None, lp if k == 0 else None)
        if fin is not None:
            finals[i] = {**out, "output_ids": ids[i]}
            yield chunk(i, {}, fin)
    if include_usage:
        yield sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [], "usage": _sum_usage([f for f in finals if f], n, think, choices.tm.tokenizer.decode)})
    yield SSE_DONE


async def _until_stops(choices: _Choices, think: ReasoningPlan) -> list[dict]:
    return list(await asyncio.gather(*(_until_stop(g, think) for g in choices.streams())))


async def _until_stop(gen: AsyncIterator[dict], think: ReasoningPlan) -> dict:
    """One streamed choice read until it finishes or its content reaches a stop string (then aborted):
    the last snapshot, its output logprob deltas joined, meta_info["cut"] set when a stop cut it."""
    rs, last, lps = think.stream(), None, {"output_token_logprobs": [], "output_top_logprobs": []}
    whole = Cumulative()
    try:
        async for out in gen:
            whole.add(out)
            for k, v in lps.items():
                v += out["meta_info"].get(k) or []
            last = out
            rs.feed(out["text"], out["meta_info"]["finish_reason"] is not None)
            if rs.stopped:
                break
    finally:
        await gen.aclose()  # aborts the request when it has not finished
    meta = {**last["meta_info"], **{k: v for k, v in lps.items() if k in last["meta_info"]}, "cut": rs.stopped}
    return {**whole.snapshot(last), "meta_info": meta}


def _think_message(plan: ToolPlan, think: ReasoningPlan, out: dict) -> tuple[dict, Optional[str]]:
    """A finished choice with reasoning -> (its message with reasoning_content, its finish_reason)."""
    split, cut = split_whole(think, out["text"])
    finish = "stop" if cut else _finish(out["meta_info"]["finish_reason"])
    message, finish = plan.message(split.content, finish)
    return {**message, "reasoning_content": split.reasoning or None}, finish


def _completion_intake(state: ServerState, body: dict,
                       rid: str) -> tuple[_Choices, Optional[list[str]], Optional[int]]:
    """A /v1/completions body -> (its choices, the prompts' texts when echo, logprobs). On an intake thread."""
    tm = state.tm
    prompt = body.get("prompt")
    given = [prompt] if isinstance(prompt, str) else prompt  # echo: a text prompt comes back as written (no BOS)
    if isinstance(prompt, str):
        prompts = [tm.encode_text(prompt)]
    elif isinstance(prompt, list) and prompt and len(prompt) > MAX_BATCH:
        raise FieldError("prompt", f"prompt may hold at most {MAX_BATCH} prompts, got {len(prompt)}")
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = [tm.encode_text(p) for p in prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        prompts = prompt
    else:
        raise FieldError("prompt", "prompt must be a string, a list of strings, a list of token ids or a list of "
                                   "such lists")
    echo = need_bool(_opt(body, "echo", False), "echo")
    top = _int_option(body, "logprobs", MAX_LOGPROBS)
    choices = _Choices(state, prompts, sampling_from_openai(body, 16, 0), _opt(body, "n", 1), top, echo, rid, body)
    texts = None
    if echo:  # after _Choices checked the ids
        texts = given if all(isinstance(p, str) for p in given) else [tm.tokenizer.decode(p) for p in prompts]
    return choices, texts, top


def chat_prompt_ids(state: ServerState, body: dict, plan: ToolPlan) -> tuple[list[int], Optional[str]]:
    """A chat body's messages rendered with its template variables and tools, then tokenized as the template
    wants (content's special-token text kept as text) -> (prompt ids, the template used). On an intake thread."""
    tm = state.tm
    variables = template_kwargs(body)
    text, template = render_chat(tm.tokenizer, body.get("messages"), state.args.chat_template, plan.tools or None,
                                 variables)
    spans = chat_content_spans(tm.tokenizer, body.get("messages"), template, text, tm.encoder.special_text_in,
                               **variables, **({"tools": plan.tools} if plan.tools else {}))
    return tm.encode_chat(text, spans), template


def _chat_intake(state: ServerState, body: dict, rid: str) -> tuple[_Choices, bool, Optional[int], ToolPlan,
                                                                    Optional[ReasoningPlan]]:
    """A /v1/chat/completions body -> (its choices, logprobs, top_logprobs, its tools plan, its reasoning
    plan). On an intake thread."""
    tm = state.tm
    plan = check_tools(body)
    think = reasoning_plan(state.args.reasoning_parser, body)
    ids, template = chat_prompt_ids(state, body, plan)
    set_parser(plan, state.args.tool_call_parser,
               template if template is not None else getattr(tm.tokenizer, "chat_template", None))
    room = min(tm.limits.context_len, tm.limits.num_slots) - len(ids)
    want_lp = need_bool(_opt(body, "logprobs", False), "logprobs")
    top = _int_option(body, "top_logprobs", MAX_LOGPROBS)
    if top and not want_lp:
        raise FieldError("top_logprobs", "top_logprobs needs logprobs: true")
    sp = sampling_from_openai(body, None, max(room, 0))
    keeps = [p for p in (plan.parser, think and think.parser) if p is not None and p.keeps_special_tokens]
    if keeps and body.get("skip_special_tokens") is None:
        sp["skip_special_tokens"] = False  # the markup is special tokens ([TOOL_CALLS], <|python_tag|>, <|channel|>)
    if plan.forced is not None:  # tool_choice required / a named function: the output is a call
        if not tm.limits.grammar:
            raise FieldError("tool_choice", f"tool_choice {plan.forced!r} constrains the output to a call: it needs a "
                                            "grammar backend (the server runs with --grammar-backend none)")
        if any(sp.get(k) is not None for k in ("regex", "json_schema", "ebnf", "structural_tag")):
            raise FieldError("tool_choice", "a forced tool_choice cannot be combined with response_format, regex, "
                                            "json_schema or ebnf")
        call = forced_call_regex(plan, template == CHATML_TOOLS_TEMPLATE)
        sp["regex"] = (think.regex_prefix() if think else "") + call  # the call after the reasoning
    choices = _Choices(state, [ids], sp, _opt(body, "n", 1), (top or 0) if want_lp else None, rid=rid, body=body)
    if think is not None and sp.get("stop") is not None:  # checked by _Choices; applied to the content only
        think.stops = choices.reqs[0].sampling.stop_strs
        choices.reqs = [dataclasses.replace(r, sampling=dataclasses.replace(r.sampling, stop=None))
                        for r in choices.reqs]
    return choices, want_lp, top, plan, think


def _sum_usage(outs: list[dict], n: int, think: Optional[ReasoningPlan] = None,
               decode: Optional[Callable[[list[int]], str]] = None) -> dict:
    """Prompt tokens count once per prompt (not per sample), as OpenAI reports them; with reasoning,
    completion_tokens_details.reasoning_tokens."""
    prompt = sum(o["meta_info"]["prompt_tokens"] for o in outs[::n])
    completion = sum(o["meta_info"]["completion_tokens"] for o in outs)
    cached = sum(o["meta_info"]["cached_tokens"] for o in outs[::n])
    u = usage(prompt, completion, cached)
    if think is not None and decode is not None:
        thought = sum(reasoning_tokens(think, o["output_ids"], decode) for o in outs)
        u["completion_tokens_details"] = {"reasoning_tokens": thought}
    return u
