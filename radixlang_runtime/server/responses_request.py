"""A /v1/responses body, checked once, as the /v1/chat/completions body it runs as (no torch).

ResponsesRequest holds what the route needs: the chat body (messages, tools in chat's shape, tool_choice,
response_format, max_completion_tokens, temperature, top_p, parallel_tool_calls), the input items as chat
messages (kept for a `previous_response_id` chain), and the fields the response object echoes. So the
chat path's mechanisms run unchanged: chat_render (the template), openai_tools (tool_choice by grammar,
the tool-call parser), openai_reasoning, openai_records (one parse, as a chat body's).
Each field is honoured, a documented no-op (openai_hints.py, RESPONSES_FIELDS' comments) or refused by
name (400 naming it) unless null / at the value that leaves it off (_OFF_VALUES).
What the output items carry besides (OutputShape): `reasoning.summary` (the reasoning text as the reasoning
item's summary: no model summarizes it), `include` "reasoning.encrypted_content" (the reasoning sealed:
responses_sealed.py; an input reasoning item's is opened again onto the assistant turn it precedes, as that
message's `reasoning_content`, which the template may show) and "message.output_text.logprobs"
(the chat body's logprobs / top_logprobs, onto the output_text part).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from radixlang_runtime.protocol.limits import FieldError, need_bool, need_int, need_str, show
from radixlang_runtime.server.http_common import BadRequest
from radixlang_runtime.server.openai_hints import check_hint
from radixlang_runtime.server.openai_records import MAX_LOGPROBS
from radixlang_runtime.server.responses_output import OutputShape
from radixlang_runtime.server.responses_sealed import open_reasoning

MAX_METADATA_KEYS = 16  # OpenAI's limits on `metadata`
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512
MAX_RESPONSE_ID = 128
# Not implemented: taken only null or at the value that leaves them off, else 400 naming them.
_OFF_VALUES: dict[str, tuple] = {
    "background": (False,), "truncation": ("disabled",), "conversation": (), "prompt": (), "max_tool_calls": (),
    "context_management": (), "prompt_cache_options": (), "moderation": (), "service_tier": ("auto", "default"),
}
_HONOURED = ("model", "input", "instructions", "tools", "tool_choice", "text", "max_output_tokens", "temperature",
             "top_p", "parallel_tool_calls", "previous_response_id", "store", "stream", "stream_options", "reasoning",
             "include", "top_logprobs", "cache_salt")  # cache_salt: checked by the chat route it runs as
ENCRYPTED_REASONING, OUTPUT_LOGPROBS = "reasoning.encrypted_content", "message.output_text.logprobs"
INCLUDES = (ENCRYPTED_REASONING, OUTPUT_LOGPROBS)  # the `include` values served
SUMMARIES = ("auto", "concise", "detailed")  # reasoning.summary: each is the reasoning text itself; "none": off
# client_metadata: Codex's trace context (an object), taken and never echoed
_INFORMATIONAL = ("metadata", "user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
                  "client_metadata")
RESPONSES_FIELDS = {*_HONOURED, *_INFORMATIONAL, *_OFF_VALUES}
_TOOL_KEYS = {"type", "name", "description", "parameters", "strict"}
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")  # content parts read as text
_ROLES = ("user", "assistant", "system", "developer")


@dataclass
class ResponsesRequest:
    chat_body: dict  # the /v1/chat/completions body it runs as (messages set by the route: with_history)
    messages: list[dict]  # `input` as chat messages (the chain's next turn)
    instructions: Optional[str]
    previous_response_id: Optional[str]
    store: bool
    stream: bool
    echo: dict = field(default_factory=dict)  # the fields the response object repeats
    shape: OutputShape = field(default_factory=OutputShape)  # what the output items carry besides

    def with_history(self, history: list[dict]) -> dict:
        """The chat body over [instructions] + the chain so far + this input (the chain first: its rendered
        text is a prefix of this one's, so the radix cache holds it)."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions is not None else []
        return {**self.chat_body, "messages": system + history + self.messages}

    def echo_ran(self, max_new_tokens: int) -> dict:
        """The echo with a given max_output_tokens as the request runs it (lowered by the room after the prompt
        or by --override-generation-config's max_new_tokens), as vLLM repeats its sampling params' count."""
        if self.echo.get("max_output_tokens") is None:
            return self.echo
        return {**self.echo, "max_output_tokens": max_new_tokens}


def _check_off(body: dict) -> None:
    for name, off in _OFF_VALUES.items():
        v = body.get(name)
        if v is not None and not any(type(v) is type(o) and v == o for o in off):
            allowed = f" (only {' or '.join(json.dumps(o) for o in off)})" if off else ""
            raise FieldError(name, f"{name} is not supported by /v1/responses here{allowed}, got {show(v)}")


def parse_responses_body(body: Any) -> ResponsesRequest:
    """Raises FieldError / BadRequest (400) naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if unknown := sorted(set(body) - RESPONSES_FIELDS):
        raise FieldError(unknown[0], f"unknown field(s) for /v1/responses: {', '.join(show(u, 40) for u in unknown)}")
    _check_off(body)
    if body.get("input") is None:
        raise FieldError("input", "input is required: a string or a list of input items")
    instructions = body.get("instructions")
    if instructions is not None:
        need_str(instructions, "instructions")
    prev = body.get("previous_response_id")
    if prev is not None:
        need_str(prev, "previous_response_id", MAX_RESPONSE_ID)
    store = need_bool(_opt(body, "store", True), "store")
    stream = need_bool(_opt(body, "stream", False), "stream")
    so = _opt(body, "stream_options", {})
    if not isinstance(so, dict) or set(so) - {"include_obfuscation"}:
        raise FieldError("stream_options", f"stream_options takes only include_obfuscation, got {show(so)}")
    if so.get("include_obfuscation") is not None:  # a side-channel padding field: none is sent, the text is the same
        need_bool(so["include_obfuscation"], "stream_options.include_obfuscation")
    summary = _check_reasoning(body.get("reasoning"))
    include = _include(body.get("include"))
    check_hint("prompt_cache_retention", body.get("prompt_cache_retention"))
    for name in ("user", "safety_identifier", "prompt_cache_key"):
        if body.get(name) is not None:
            need_str(body[name], name)
    metadata = _metadata(body.get("metadata"))
    if body.get("client_metadata") is not None and not isinstance(body["client_metadata"], dict):
        raise FieldError("client_metadata", f"client_metadata must be an object, got {show(body['client_metadata'])}")
    tools = [_tool(t, i) for i, t in enumerate(_list(body.get("tools"), "tools"))]
    chat: dict[str, Any] = {k: body[k] for k in ("model", "temperature", "top_p", "parallel_tool_calls", "cache_salt")
                            if body.get(k) is not None}
    if tools:
        chat["tools"] = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in tools]
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = need_int(body["max_output_tokens"], "max_output_tokens", 1)
    top = _top_logprobs(body.get("top_logprobs"), include)
    if OUTPUT_LOGPROBS in include:  # the chat reply's logprobs, in Responses' shape on the output_text part
        chat.update(logprobs=True, top_logprobs=top)
    text = _text_config(body.get("text"))
    if text.get("format") is not None:
        chat["response_format"] = _response_format(text["format"])
    echo = {"instructions": instructions, "metadata": metadata, "user": body.get("user"), "store": store,
            "tools": tools, "tool_choice": body.get("tool_choice") or "auto",
            "text": {"format": text.get("format") or {"type": "text"}, "verbosity": text.get("verbosity")},
            "temperature": _opt(body, "temperature", 1.0), "top_p": _opt(body, "top_p", 1.0),
            "max_output_tokens": body.get("max_output_tokens"),
            "parallel_tool_calls": _opt(body, "parallel_tool_calls", True), "previous_response_id": prev,
            "reasoning": {"effort": (body.get("reasoning") or {}).get("effort"), "summary": summary},
            "top_logprobs": body.get("top_logprobs"),
            "truncation": "disabled", "background": False, "service_tier": "default",
            "prompt_cache_key": body.get("prompt_cache_key"), "safety_identifier": body.get("safety_identifier")}
    shape = OutputShape(summary not in (None, "none"), ENCRYPTED_REASONING in include)
    return ResponsesRequest(chat, input_messages(body["input"]), instructions, prev, store, stream, echo, shape)


def _opt(body: dict, name: str, default: Any) -> Any:
    v = body.get(name)
    return default if v is None else v


def _list(v: Any, name: str) -> list:
    if v is None:
        return []
    if not isinstance(v, list):
        raise FieldError(name, f"{name} must be a list, got {show(v)}")
    return v


def _check_reasoning(r: Any) -> Optional[str]:
    """reasoning.effort: a documented no-op (openai_hints); context: earlier turns' reasoning is never rendered
    (current_turn); summary (or the older generate_summary): one of SUMMARIES or "none" -> returned; another
    mode is refused."""
    if r is None:
        return None
    if not isinstance(r, dict) or set(r) - {"effort", "summary", "generate_summary", "context", "mode"}:
        raise FieldError("reasoning", f"reasoning takes effort, summary, context and mode, got {show(r)}")
    check_hint("reasoning_effort", r.get("effort"), "reasoning.effort")
    for k, off in (("summary", (*SUMMARIES, "none")), ("generate_summary", (*SUMMARIES, "none")),
                   ("context", ("auto", "current_turn")), ("mode", ("standard",))):
        if r.get(k) is not None and r[k] not in off:
            raise FieldError(f"reasoning.{k}", f"reasoning.{k} must be one of {', '.join(off)}, got {show(r[k])}")
    return r.get("summary") if r.get("summary") is not None else r.get("generate_summary")


def _include(v: Any) -> frozenset:
    names = _list(v, "include")
    if bad := [n for n in names if n not in INCLUDES]:
        raise FieldError("include", f"include takes {', '.join(INCLUDES)} here, got {show(bad[0])}")
    return frozenset(names)


def _top_logprobs(v: Any, include: frozenset) -> int:
    top = 0 if v is None else need_int(v, "top_logprobs", 0, MAX_LOGPROBS)
    if top and OUTPUT_LOGPROBS not in include:
        raise FieldError("top_logprobs", f"top_logprobs needs include [\"{OUTPUT_LOGPROBS}\"] (the logprobs come "
                                         "on the output_text parts)")
    return top


def _metadata(m: Any) -> Optional[dict]:
    if m is None:
        return None
    if not isinstance(m, dict) or len(m) > MAX_METADATA_KEYS:
        raise FieldError("metadata", f"metadata must be an object of at most {MAX_METADATA_KEYS} keys")
    for k, v in m.items():
        if len(k) > MAX_METADATA_KEY or not isinstance(v, str) or len(v) > MAX_METADATA_VALUE:
            raise FieldError("metadata", f"metadata: keys of at most {MAX_METADATA_KEY} characters, string values of "
                                         f"at most {MAX_METADATA_VALUE}; {show(k)} is not")
    return m


def _tool(t: Any, i: int) -> dict:
    """Responses' flat function tool; other tool types (web_search, file_search, mcp, ...) are refused."""
    where = f"tools[{i}]"
    if not isinstance(t, dict):
        raise FieldError("tools", f"{where} must be an object, got {show(t)}")
    if t.get("type") != "function":
        raise FieldError("tools", f"{where}: tool type {show(t.get('type'))} is not supported (only \"function\")")
    if unknown := sorted(set(t) - _TOOL_KEYS):
        raise FieldError("tools", f"{where}: unknown field(s) {', '.join(show(u, 40) for u in unknown)} (a function "
                                  "tool is {\"type\": \"function\", \"name\", \"description\", \"parameters\", "
                                  "\"strict\"})")
    return {k: v for k, v in t.items() if v is not None}


def _tool_choice(c: Any) -> Any:
    """Responses' tool_choice -> chat's (checked against the tools there: openai_tools.check_tools)."""
    if c in ("none", "auto", "required"):
        return c
    if isinstance(c, dict) and c.get("type") == "function" and set(c) <= {"type", "name"} \
            and isinstance(c.get("name"), str):
        return {"type": "function", "function": {"name": c["name"]}}
    raise FieldError("tool_choice", f"tool_choice must be \"none\", \"auto\", \"required\" or "
                                    f"{{\"type\": \"function\", \"name\"}}, got {show(c)}")


def _text_config(t: Any) -> dict:
    if t is None:
        return {}
    if not isinstance(t, dict) or set(t) - {"format", "verbosity"}:
        raise FieldError("text", f"text takes format and verbosity, got {show(t)}")
    check_hint("verbosity", t.get("verbosity"), "text.verbosity")
    return t


def _response_format(f: Any) -> dict:
    """text.format -> chat's response_format (its grammar: constrained/spec.spec_from_response_format)."""
    kind = f.get("type") if isinstance(f, dict) else None
    if kind in ("text", "json_object") and set(f) == {"type"}:
        return {"type": kind}
    if kind == "json_schema" and isinstance(f.get("schema"), dict) \
            and set(f) <= {"type", "name", "schema", "description", "strict"}:
        return {"type": "json_schema", "json_schema": {"name": f.get("name"), "schema": f["schema"]}}
    raise FieldError("text.format", "text.format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                                    f"{{\"type\": \"json_schema\", \"name\", \"schema\"}}, got {show(f)}")


def input_messages(items: Any) -> list[dict]:
    """`input` (a string or items) -> chat messages: messages by role, function_call items joined onto the
    assistant turn before them, function_call_output as `tool` messages; a reasoning item's text (its
    `encrypted_content` opened, a token this server did not seal a 400 naming it; else its `content`
    reasoning_text parts) becomes the `reasoning_content` of the assistant turn after it, for the template."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise FieldError("input", "input must be a string or a non-empty list of input items")
    out: list[dict] = []
    names: dict[str, str] = {}  # call_id -> function name
    thought: Optional[str] = None  # an opened reasoning item's text, for the next assistant turn
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise FieldError(where, f"{where} must be an object, got {show(item)}")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            if item.get("role") not in _ROLES:
                raise FieldError(f"{where}.role", f"{where}.role must be one of {', '.join(_ROLES)}")
            out.append({"role": item["role"], "content": _content(item.get("content"), f"{where}.content",
                                                                  images=item["role"] == "user")})
            if item["role"] == "assistant" and thought is not None:
                out[-1]["reasoning_content"], thought = thought, None
        elif kind == "function_call":
            call = _call(item, where)
            names[call["id"]] = call["function"]["name"]
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            if thought is not None:
                out[-1]["reasoning_content"], thought = thought, None
        elif kind == "function_call_output":
            call_id = need_str(item.get("call_id"), f"{where}.call_id")
            msg = {"role": "tool", "tool_call_id": call_id, "content": _content(item.get("output"), f"{where}.output")}
            if call_id in names:
                msg["name"] = names[call_id]
            out.append(msg)
        elif kind == "reasoning":
            if item.get("encrypted_content") is not None:
                thought = open_reasoning(item["encrypted_content"])
                if thought is None:
                    raise FieldError(f"{where}.encrypted_content", f"{where}.encrypted_content was not sealed by "
                                     "this server process (changed, from another server, or from before a restart)")
            elif item.get("content") is not None:
                thought = _reasoning_text(item["content"], f"{where}.content")
        else:
            raise FieldError(where, f"{where}: input item type {show(kind)} is not supported (message, function_call, "
                                    "function_call_output, reasoning)")
    return out


def _reasoning_text(parts: Any, where: str) -> Optional[str]:
    """A reasoning item's `content` [{type: reasoning_text, text}] -> its text (None when empty)."""
    if not isinstance(parts, list) or not all(isinstance(p, dict) and p.get("type") == "reasoning_text" and
                                              isinstance(p.get("text"), str) for p in parts):
        raise FieldError(where, f"{where} must be a list of {{\"type\": \"reasoning_text\", \"text\"}} parts")
    return "".join(p["text"] for p in parts) or None


def _call(item: dict, where: str) -> dict:
    name = need_str(item.get("name"), f"{where}.name")
    call_id = need_str(item.get("call_id"), f"{where}.call_id")
    args = need_str(item.get("arguments", "{}"), f"{where}.arguments")
    try:
        parsed = json.loads(args)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise FieldError(f"{where}.arguments", f"{where}.arguments must be JSON text of an object, got {show(args)}")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _content(content: Any, where: str, images: bool = False) -> Union[str, list]:
    """A message's content -> its text, or (images: a message that may hold input_image parts, and does) chat
    content parts with the images as image_url parts (server/chat_images.py)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise FieldError(where, f"{where} must be a string or a list of text parts")
    parts = []
    for j, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        key = "refusal" if kind == "refusal" else "text"
        if images and kind == "input_image":
            if not isinstance(p.get("image_url"), str):
                raise FieldError(f"{where}[{j}]", f"{where}[{j}]: an input_image needs image_url (a URL or a data "
                                                  "URL); file_id is not supported")
            parts.append({"type": "image_url", "image_url": {"url": p["image_url"]}})
            continue
        if kind not in _TEXT_PARTS or not isinstance(p.get(key), str):
            raise FieldError(f"{where}[{j}]", f"{where}[{j}]: content part type {show(kind)} is not supported (only "
                                              "input_text / output_text with a string `text`"
                                              f"{', input_image' if images else ''})")
        parts.append({"type": "text", "text": p[key]})
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts
