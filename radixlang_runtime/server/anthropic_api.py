"""Anthropic's Messages API: POST /v1/messages (plain / streamed) and /v1/messages/count_tokens.

A request (anthropic_records.MessagesRequest) runs as the one-choice chat request it translates to, through
the chat route's own intake (openai_api: the template, tools and a forced tool_choice's grammar, the
reasoning split, sampling); only the reply's shape is Anthropic's:
- `{"id": "msg_...", "type": "message", "role": "assistant", "content": [blocks], "model", "stop_reason",
  "stop_sequence", "usage"}`; blocks: `thinking` (with --reasoning-parser), `text`, `tool_use` {id, name,
  input}; stop_reason end_turn / max_tokens / stop_sequence (+ the string) / tool_use;
  usage: input_tokens (the prompt's uncached part), cache_read_input_tokens (the radix cache's part),
  cache_creation_input_tokens 0, output_tokens.
- streams: `event: message_start`, `ping`, per block content_block_start / content_block_delta (text_delta,
  thinking_delta, input_json_delta) / content_block_stop, then message_delta (stop_reason, usage) and
  message_stop; a failure after the headers is `event: error`.
count_tokens: the prompt's token count as /v1/messages would render it ({"input_tokens"}).
Errors: anthropic_errors (Anthropic's shape on these paths).
"""

from __future__ import annotations

import json
import uuid
from typing import Any, AsyncIterator, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from radixlang_runtime.protocol.limits import FieldError
from radixlang_runtime.server.anthropic_errors import anthropic_error
from radixlang_runtime.server.anthropic_records import MessagesRequest, parse_messages_request
from radixlang_runtime.server.http_common import ServerState, read_json, stream_response
from radixlang_runtime.server.openai_intake import chat_intake, chat_prompt_ids, finish_reason, until_stop
from radixlang_runtime.server.openai_reasoning import ReasoningPlan, split_whole
from radixlang_runtime.server.openai_records import MODEL_ALIASES, ModelNotFound, parse_chat
from radixlang_runtime.server.openai_tools import ToolPlan

router = APIRouter()
_STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}


def _request(state: ServerState, body: Any, count_only: bool = False) -> MessagesRequest:
    req = parse_messages_request(body, count_only)
    if req.model not in (state.served_model_name, *MODEL_ALIASES):
        raise ModelNotFound(f"model: {req.model!r} is not served here: this server serves "
                            f"{state.served_model_name!r} (or {', '.join(map(repr, MODEL_ALIASES))})")
    return req


@router.post("/v1/messages")
async def messages(request: Request) -> Response:
    state: ServerState = request.app.state.server
    req = _request(state, await read_json(request))
    mid = f"msg_{uuid.uuid4().hex}"
    intake = await state.tm.run_intake(chat_intake, state, parse_chat(state, req.chat_body()), mid,
                                       size=len(await request.body()))
    choices, plan, think = intake.choices, intake.tools, intake.think
    if req.stream:
        gen = choices.streams()[0]  # admitted now: a refused request is a plain 503, before any header
        events = message_events(gen, mid, state.served_model_name, plan, think, req.stop_sequences)
        return stream_response(_guarded(events))
    if think is None:
        out = (await choices.finals())[0]
        reasoning, content, cut = "", out["text"], False
    else:
        out = await until_stop(choices.streams()[0], think)
        split, cut = split_whole(think, out["text"])
        reasoning, content = split.reasoning, split.content
    finish = "stop" if cut else finish_reason(out["meta_info"]["finish_reason"])
    message, finish = plan.message(content, finish)
    blocks: list[dict] = [{"type": "thinking", "thinking": reasoning, "signature": ""}] if reasoning else []
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    blocks += [{"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                "input": json.loads(c["function"]["arguments"])} for c in message.get("tool_calls") or []]
    reason, sequence = _stop_reason(finish, out["meta_info"], think, out["text"], content, cut, req.stop_sequences)
    return JSONResponse({"id": mid, "type": "message", "role": "assistant", "content": blocks,
                         "model": state.served_model_name, "stop_reason": reason, "stop_sequence": sequence,
                         "usage": _usage(out["meta_info"])})


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> Response:
    state: ServerState = request.app.state.server
    req = _request(state, await read_json(request), count_only=True)
    n = await state.tm.run_intake(_count, state, req, size=len(await request.body()))
    return JSONResponse({"input_tokens": n})


def _count(state: ServerState, req: MessagesRequest) -> int:
    """The prompt /v1/messages renders for this request, in tokens (on an intake thread)."""
    chat = parse_chat(state, req.chat_body())
    ids, _, _ = chat_prompt_ids(state, chat, chat.tools)
    return len(ids)


def _usage(meta: dict, output_tokens: Optional[int] = None) -> dict[str, int]:
    cached = meta.get("cached_tokens", 0)
    return {"input_tokens": meta["prompt_tokens"] - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
            "output_tokens": meta["completion_tokens"] if output_tokens is None else output_tokens}


def _stop_reason(finish: Optional[str], meta: dict, think: Optional[ReasoningPlan], text: str, content: str,
                 cut: bool, stops: list[str]) -> tuple[Optional[str], Optional[str]]:
    """-> (stop_reason, stop_sequence). The runtime names the stop string it matched; with a reasoning split
    the stop strings are cut from the content (openai_reasoning): the one found where the content ends."""
    if cut and think is not None:
        whole = think.parser.parse(text).content
        hit = next((s for s in stops if whole.startswith(s, len(content))), None)
        return "stop_sequence", hit
    matched = (meta.get("finish_reason") or {}).get("matched")
    if finish == "stop" and isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return _STOP_REASONS.get(finish or "", finish), None


def event(kind: str, data: dict) -> bytes:
    """One server-sent event as Anthropic sends it: `event: <type>` then its JSON."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n".encode()


class _Blocks:
    """The content blocks of a streamed message: opens a block when the kind of delta changes, closes it."""

    def __init__(self) -> None:
        self.index, self.kind = -1, None

    def open(self, block: dict) -> list[bytes]:
        out = self.close()
        self.index, self.kind = self.index + 1, block["type"]
        return out + [event("content_block_start", {"index": self.index, "content_block": block})]

    def close(self) -> list[bytes]:
        if self.kind is None:
            return []
        self.kind = None
        return [event("content_block_stop", {"index": self.index})]

    def delta(self, delta: dict) -> bytes:
        return event("content_block_delta", {"index": self.index, "delta": delta})

    def text(self, text: str) -> list[bytes]:
        if not text:
            return []
        out = [] if self.kind == "text" else self.open({"type": "text", "text": ""})
        return out + [self.delta({"type": "text_delta", "text": text})]

    def thinking(self, text: str) -> list[bytes]:
        if not text:
            return []
        out = [] if self.kind == "thinking" else self.open({"type": "thinking", "thinking": "", "signature": ""})
        return out + [self.delta({"type": "thinking_delta", "thinking": text})]

    def chat_delta(self, d: dict) -> list[bytes]:
        """An OpenAI chat delta (ToolStream's) -> text / tool_use events."""
        out = self.text(d.get("content") or "")
        for call in d.get("tool_calls") or []:
            fn = call.get("function") or {}
            if call.get("id") is not None:
                out += self.open({"type": "tool_use", "id": call["id"], "name": fn.get("name"), "input": {}})
            if fn.get("arguments"):
                out.append(self.delta({"type": "input_json_delta", "partial_json": fn["arguments"]}))
        return out


async def message_events(gen: AsyncIterator[dict], mid: str, model: str, plan: ToolPlan,
                         think: Optional[ReasoningPlan], stops: list[str]) -> AsyncIterator[bytes]:
    """One request's snapshots (text deltas) -> the message's events, in Anthropic's order."""
    blocks, tools = _Blocks(), plan.stream()
    rs = think.stream() if think is not None else None
    last, text, content, cut, finish = None, "", "", False, None
    try:
        async for out in gen:
            meta = out["meta_info"]
            if last is None:
                start = {"id": mid, "type": "message", "role": "assistant", "content": [], "model": model,
                         "stop_reason": None, "stop_sequence": None, "usage": _usage(meta, 0)}
                yield event("message_start", {"message": start})
                yield event("ping", {})
            last, delta = out, out["text"]
            text += delta
            finish = finish_reason(meta["finish_reason"])
            if rs is not None:
                split = rs.feed(delta, finish is not None)
                cut = rs.stopped
                finish = "stop" if cut else finish
                for b in blocks.thinking(split.reasoning):
                    yield b
                delta = split.content
            content += delta
            if tools is None:
                pieces = blocks.text(delta)
            else:  # the call markup held back until decided; the rest of it when the message ends
                deltas = tools.feed(delta) + (tools.finish() if finish is not None else [])
                pieces = [b for d in deltas for b in blocks.chat_delta(d)]
                finish = tools.finish_reason(finish)
            for b in pieces:
                yield b
            if finish is not None:
                break
    finally:
        await gen.aclose()  # aborts the request when it has not finished (a stop cut it, the client left)
    if last is None:
        raise RuntimeError("the request ended without output")
    for b in blocks.close():
        yield b
    reason, sequence = _stop_reason(finish, last["meta_info"], think, text, content, cut, stops)
    yield event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence},
                                  "usage": _usage(last["meta_info"])})
    yield event("message_stop", {})


async def _guarded(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """After the headers went out an error can only travel as an event: Anthropic's `event: error`."""
    try:
        async for chunk in events:
            yield chunk
    except (ValueError, FieldError) as e:
        yield event("error", {"error": anthropic_error(400, str(e))["error"]})
    except Exception as e:  # noqa: BLE001 - the stream still ends well-formed
        yield event("error", {"error": anthropic_error(500, f"internal error: {e!r}")["error"]})
