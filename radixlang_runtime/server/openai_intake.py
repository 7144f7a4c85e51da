"""From a parsed OpenAI request (openai_records.py) to its runtime requests, and the pieces of an answer every
OpenAI-shaped route shares (/v1/completions, /v1/chat/completions, /v1/responses, /v1/messages).

Each choice is one runtime request (prompts x n of them, index = prompt * n + sample, rid f"{rid}-{index}"),
built whole by generate_input.openai_requests and never edited after. The intake runs on an intake thread
(TokenizerManager.run_intake): the chat template, tokenizing, the tools' parser and the forced-call grammar.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Optional

from radixlang_runtime.protocol.generate_input import GenerateRequest, openai_requests
from radixlang_runtime.protocol.image_input import ImageInput
from radixlang_runtime.protocol.limits import FieldError
from radixlang_runtime.protocol.logprob_format import normalize_logprob_args
from radixlang_runtime.protocol.reasoning_watch import GENERATION_TAIL, ChatWatch, ThinkingMarkers, prompt_begins
from radixlang_runtime.protocol.results import Cumulative, LogprobRequest
from radixlang_runtime.protocol.sampling_params import SamplingParams
from radixlang_runtime.server.chat_images import image_refs
from radixlang_runtime.server.chat_render import CHATML_TOOLS_TEMPLATE, chat_content_spans, continued_text, render_chat
from radixlang_runtime.server.http_common import ServerState, final_result
from radixlang_runtime.server.openai_reasoning import ReasoningPlan, reasoning_tokens, split_whole
from radixlang_runtime.server.openai_records import (COMPLETION_MAX_TOKENS, ChatRequest, CompletionRequest,
                                                     OpenAIOptions)
from radixlang_runtime.server.openai_tools import ToolPlan, forced_call_regex, with_parser


class Choices:
    """The runtime requests behind one OpenAI call."""

    def __init__(self, state: ServerState, reqs: list[GenerateRequest]):
        self.tm = state.tm
        self.reqs = reqs

    @classmethod
    def build(cls, state: ServerState, prompts: list[list[int]], req_options: OpenAIOptions, sampling: dict,
              top_logprobs: Optional[int] = None, echo: bool = False, rid: Optional[str] = None,
              chat_watch: Optional[ChatWatch] = None, images: Optional[list] = None) -> "Choices":
        """prompts x n requests, validated up front (openai_requests); admission first (503 before any work).
        One logprob request serves top_logprobs (output; the prompt's too with echo) and prompt_logprobs: the
        larger top count, each reply cutting its rows to its own."""
        prompt_top = req_options.prompt_logprobs

        def logprob_of(_i: int, ids: list[int]) -> Optional[LogprobRequest]:
            if top_logprobs is None and prompt_top is None:
                return None
            # without echo or prompt_logprobs only output logprobs: start at the last prompt position
            whole = echo or prompt_top is not None
            start, top = normalize_logprob_args(len(ids), True, 0 if whole else len(ids) - 1,
                                                max(top_logprobs or 0, prompt_top or 0))
            return LogprobRequest(start, top, with_text=True, ranks=prompt_top is not None)

        state.tm.lifecycle.admit()
        reqs = openai_requests(prompts, sampling, req_options.n, logprob_of, state.tm.limits,
                               rid or uuid.uuid4().hex, stream=False, bootstrap=req_options.bootstrap,
                               own_rid=req_options.rid is not None,
                               lora_id=req_options.lora_id, priority=req_options.priority, extras=req_options.extras,
                               encode_words=state.tm.encode_words, chat_watch=chat_watch, images=images)
        if req_options.rid is not None and (taken := [r.rid for r in reqs if r.rid in state.tm.states]):
            raise FieldError("rid", f"request id {taken[0]!r} is already in use")
        return cls(state, reqs)

    def streams(self) -> list[AsyncIterator[dict]]:
        return [self.tm.generate(dataclasses.replace(r, stream=True)) for r in self.reqs]

    async def finals(self) -> list[dict]:
        return await asyncio.gather(*(final_result(self.tm.generate(r)) for r in self.reqs))


@dataclass(frozen=True)
class CompletionIntake:
    choices: Choices
    echo_texts: Optional[list[str]]  # the prompts as text when echo
    logprobs: Optional[int]
    token_ids: bool = False  # logprobs name tokens "token_id:N" (return_tokens_as_token_ids)


@dataclass(frozen=True)
class ChatIntake:
    choices: Choices
    tools: ToolPlan  # its parser set
    think: Optional[ReasoningPlan]  # None: no reasoning split
    logprobs: bool
    top_logprobs: Optional[int]
    token_ids: bool = False  # logprobs name tokens "token_id:N" (return_tokens_as_token_ids)


def completion_intake(state: ServerState, req: CompletionRequest, rid: str) -> CompletionIntake:
    """A completions request -> its choices (prompts tokenized). On an intake thread."""
    tm = state.tm
    given = req.prompts  # echo: a text prompt comes back as written (no BOS)
    if req.suffix is not None:  # fill-in-the-middle: markers as ids, the texts plain (fim_templates.py)
        enc = tm.encoder
        suffix = enc.encode_literal(req.suffix)
        whole = [state.fim.prompt_ids(enc.encode_literal(p), suffix, enc.prefix_ids) for p in given]
    else:
        whole = [tm.encode_text(p) if isinstance(p, str) else list(p) for p in given]
    prompts = [req.options.truncated(p) for p in whole]
    room = tm.limits.room_after(max(map(len, prompts), default=0))  # the longest prompt's
    sampling = req.options.sampling_params(COMPLETION_MAX_TOKENS, room)
    choices = Choices.build(state, prompts, req.options, sampling, req.logprobs, req.echo, rid)
    texts = None
    if req.echo:  # after the requests checked the ids; a truncated prompt comes back as what ran
        texts = [g if isinstance(g, str) and p is w else tm.tokenizer.decode(p)
                 for g, p, w in zip(given, prompts, whole)]
    return CompletionIntake(choices, texts, req.logprobs, req.options.token_ids_in_logprobs)


def chat_prompt_ids(state: ServerState, req: ChatRequest,
                    tools: ToolPlan) -> tuple[list[int], Optional[str], list[ImageInput]]:
    """A chat request's messages rendered with its template variables and tools, then tokenized as the template
    wants (content's special-token text kept as text) -> (prompt ids, the template used, its images, whose
    placeholders the ids hold expanded). On an intake thread."""
    tm = state.tm
    variables = dict(req.template_vars)
    text, template = render_chat(tm.tokenizer, req.messages, state.args.chat_template, tools.tools or None,
                                 variables, req.turn, images=tm.images is not None)
    spans = chat_content_spans(tm.tokenizer, req.messages, template, text, tm.encoder.special_text_in, req.turn,
                               **variables, **({"tools": tools.tools} if tools.tools else {}))
    ids = tm.encode_chat(text, spans)
    refs = image_refs(req.messages) if tm.images is not None else []
    if not refs:
        return ids, template, []
    ids, images = tm.images.attach(ids, refs, "messages")
    return ids, template, images


def _content_stops(sampling: dict) -> list[str]:
    """The stop strings, validated as SamplingParams would (a reasoning split applies them to the content)."""
    return SamplingParams.from_dict({"stop": sampling.get("stop")}).stop_strs


def chat_intake(state: ServerState, req: ChatRequest, rid: str) -> ChatIntake:
    """A chat request -> its choices, its tools plan with its parser, its reasoning plan. On an intake thread."""
    tm = state.tm
    think = req.think
    ids, template, images = chat_prompt_ids(state, req, req.tools)
    if images and len(req.options.truncated(ids)) != len(ids):
        raise FieldError("truncate_prompt_tokens", "a prompt with images is not truncated")
    ids = req.options.truncated(ids)
    markers = ThinkingMarkers.from_wire(tm.limits.thinking_markers)
    prefix = continued_text(req.messages) if req.turn.continue_final_message else ""
    begins = None
    if markers is not None:  # from the prompt's tail: the generation prompt's markup and a continued message
        begins = prompt_begins(ids, markers, GENERATION_TAIL + (len(tm.encode_text(prefix)) + 1 if prefix else 0))
    if think is not None and begins is not None:  # the split begins where the scheduler's watch does
        think = dataclasses.replace(think, begins=begins)
    if think is not None and prefix:  # the split goes on from the prefilled text
        think = dataclasses.replace(think, prefix=prefix)
    tools = with_parser(req.tools, state.args.tool_call_parser,
                        template if template is not None else getattr(tm.tokenizer, "chat_template", None))
    room = tm.limits.room_after(len(ids))
    extra: dict = {}
    keeps_special = any(p is not None and p.keeps_special_tokens for p in (tools.parser, think and think.parser)) \
        or (think is not None and markers is not None and markers.special)
    if keeps_special and "skip_special_tokens" not in req.options.sampling:
        # the markup is special tokens ([TOOL_CALLS], <|python_tag|>, <|channel|>, [THINK], a model's <think>)
        extra["skip_special_tokens"] = False
    sampling = req.options.sampling_params(room, room, **extra)
    if tools.forced is not None:  # tool_choice required / a named function: the output is a call
        if not tm.limits.grammar:
            raise FieldError("tool_choice", f"tool_choice {tools.forced!r} constrains the output to a call: it "
                                            "needs a grammar backend (the server runs with --grammar-backend none)")
        if any(sampling.get(k) is not None for k in ("regex", "json_schema", "ebnf", "structural_tag")):
            raise FieldError("tool_choice", "a forced tool_choice cannot be combined with response_format, regex, "
                                            "json_schema or ebnf")
        call = forced_call_regex(tools, template == CHATML_TOOLS_TEMPLATE)
        # the call after the reasoning: the regex allows the block, unless a budget holds the grammar until the
        # block ends (reasoning_watch.py)
        held = sampling.get("thinking_token_budget") is not None
        sampling["regex"] = (think.regex_prefix() if think and not held else "") + call
    if think is not None and sampling.get("stop") is not None:  # applied to the content, not by the runtime
        think = dataclasses.replace(think, stops=_content_stops(sampling))
        sampling["stop"] = None
    # the client's grammar constrains the answer: it waits for the reasoning's end (a forced call's regex
    # already holds the reasoning block)
    watch = ChatWatch(think is not None and tools.forced is None, begins) if begins is not None else None
    choices = Choices.build(state, [ids], req.options, sampling, (req.top_logprobs or 0) if req.logprobs else None,
                            rid=rid, chat_watch=watch, images=[images] if images else None)
    return ChatIntake(choices, tools, think, req.logprobs, req.top_logprobs, req.options.token_ids_in_logprobs)


def finish_reason(reason: Optional[dict]) -> Optional[str]:
    """The runtime's finish_reason -> OpenAI's ("stop", "length", ...)."""
    if reason is None:
        return None
    return {"stop": "stop", "length": "length"}.get(reason.get("type"), reason.get("type"))


def usage(prompt_tokens: int, completion_tokens: int, cached: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached}}


def sum_usage(outs: list[dict], n: int, think: Optional[ReasoningPlan] = None,
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


async def until_stops(choices: Choices, think: ReasoningPlan) -> list[dict]:
    return list(await asyncio.gather(*(until_stop(g, think) for g in choices.streams())))


async def until_stop(gen: AsyncIterator[dict], think: ReasoningPlan) -> dict:
    """One streamed choice read until it finishes or its content reaches a stop string (then aborted):
    the last snapshot, its output logprob deltas joined and the input ones (sent once, first) kept,
    meta_info["cut"] set when a stop cut it."""
    rs, last, lps = think.stream(), None, {"output_token_logprobs": [], "output_top_logprobs": []}
    whole, inputs = Cumulative(), {}
    try:
        async for out in gen:
            whole.add(out)
            inputs.update({k: v for k, v in out["meta_info"].items() if k.startswith("input_")})  # the first's
            for k, v in lps.items():
                v += out["meta_info"].get(k) or []
            last = out
            rs.feed(out["text"], out["meta_info"]["finish_reason"] is not None)
            if rs.stopped:
                break
    finally:
        await gen.aclose()  # aborts the request when it has not finished
    meta = {**last["meta_info"], **inputs, **{k: v for k, v in lps.items() if k in last["meta_info"]},
            "cut": rs.stopped}
    return {**whole.snapshot(last), "meta_info": meta}


def think_message(plan: ToolPlan, think: ReasoningPlan, out: dict) -> tuple[dict, Optional[str]]:
    """A finished choice with reasoning -> (its message with reasoning_content, its finish_reason)."""
    split, cut = split_whole(think, out["text"])
    finish = "stop" if cut else finish_reason(out["meta_info"]["finish_reason"])
    message, finish = plan.message(split.content, finish)
    return {**message, "reasoning_content": split.reasoning or None}, finish
