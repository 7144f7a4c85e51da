"""Anthropic Messages requests (/v1/messages, /v1/messages/count_tokens), parsed once into a MessagesRequest.

The request is checked field by field (a FieldError naming it: HTTP 400 in Anthropic's error shape) and
translated into the chat request the OpenAI route runs (chat_body): `system` (a string or text blocks) is
the first system message; content blocks map to chat messages (`text` -> content, an assistant's `tool_use`
-> tool_calls, a user's `tool_result` -> a `tool` message, an assistant's `thinking` -> its
`reasoning_content` (the template decides whether to show it), `redacted_thinking` is dropped); `tools`
[{name, description, input_schema}] -> functions; `tool_choice` auto / any / tool {name} / none -> auto /
required / a named function / none (any and tool are enforced by grammar as in chat),
disable_parallel_tool_use -> parallel_tool_calls false; stop_sequences -> stop; top_k as is;
`output_config` {format: {type: json_schema, schema}} -> response_format json_schema (grammar-enforced),
{effort} -> the template variable reasoning_effort (chat_render.template_kwargs); `thinking` {type: enabled,
budget_tokens} -> thinking_token_budget (the reasoning's end is forced when it is spent; Anthropic's bounds:
budget_tokens >= 1024 and < max_tokens) and the template variable enable_thinking true, {type: disabled} ->
enable_thinking false (a template that ignores it thinks all the same), each unless chat_template_kwargs sets
enable_thinking. A final assistant turn of text is a prefill: the reply continues it
(continue_final_message) and holds only the new text; as in Anthropic's API, that text may not end in
whitespace.
A user turn's image blocks (base64 or url sources) reach the chat route as image_url parts (a model that takes
images: docs/IMAGES.md; a text model refuses them there). Refused by name: document and other blocks, server
tools, and the other fields Anthropic has and this server does not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

from radixlang_runtime.protocol.limits import FieldError, need_bool, need_int, need_str, show

# Known fields of each route (others: 400 naming them). Informational ones change no output.
_INFORMATIONAL = ("metadata", "service_tier", "cache_control")  # cache_control: the radix cache caches anyway
_NOT_SUPPORTED = ("container", "mcp_servers", "context_management")
MESSAGES_FIELDS = {"model", "max_tokens", "messages", "system", "tools", "tool_choice", "stop_sequences",
                   "temperature", "top_p", "top_k", "stream", "chat_template_kwargs", "output_config", "thinking",
                   *_INFORMATIONAL,
                   *_NOT_SUPPORTED}
COUNT_TOKENS_FIELDS = {"model", "messages", "system", "tools", "tool_choice", "chat_template_kwargs",
                       "output_config", "cache_control", "thinking", *_NOT_SUPPORTED}
MIN_THINKING_BUDGET = 1024  # Anthropic's least budget_tokens
_REFUSED_BLOCKS = ("document", "search_result", "container_upload", "server_tool_use",
                   "web_search_tool_result")
_BLOCK_KEYS = {"text": {"type", "text", "cache_control", "citations"},
               "image": {"type", "source", "cache_control"},
               "tool_use": {"type", "id", "name", "input", "cache_control"},
               "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control"},
               "thinking": {"type", "thinking", "signature", "cache_control"},
               "redacted_thinking": {"type", "data", "cache_control"}}
MAX_STOP_SEQUENCES = 16


@dataclass
class MessagesRequest:
    model: Optional[str]
    messages: list[dict]  # chat messages (the system turn first when given)
    max_tokens: Optional[int] = None  # None only for count_tokens
    tools: list[dict] = field(default_factory=list)  # OpenAI function tools
    tool_choice: Any = None  # OpenAI's form (None: the default)
    parallel_tool_calls: Optional[bool] = None
    stop_sequences: list[str] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature / top_p / top_k as given
    stream: bool = False
    chat_template_kwargs: Optional[dict] = None
    response_format: Optional[dict] = None  # output_config.format
    reasoning_effort: Optional[str] = None  # output_config.effort
    prefill: bool = False  # the final message is an assistant's text, which the reply continues
    thinking_budget: Optional[int] = None  # thinking.budget_tokens (type enabled)

    def chat_body(self) -> dict[str, Any]:
        """The /v1/chat/completions body this request runs as (one choice)."""
        body: dict[str, Any] = {"model": self.model, "messages": self.messages, "max_tokens": self.max_tokens,
                                "stop": self.stop_sequences or None, **self.sampling}
        if self.tools:
            body["tools"] = self.tools
        for name in ("tool_choice", "parallel_tool_calls", "chat_template_kwargs", "response_format",
                     "reasoning_effort"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if self.prefill:
            body["continue_final_message"] = True
        if self.thinking_budget is not None:
            body["thinking_token_budget"] = self.thinking_budget
        return body


def parse_messages_request(body: Any, count_only: bool = False) -> MessagesRequest:
    """A /v1/messages (or count_tokens) body -> its MessagesRequest; FieldError / ValueError naming the problem."""
    route = "/v1/messages/count_tokens" if count_only else "/v1/messages"
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    if unknown := sorted(set(body) - (COUNT_TOKENS_FIELDS if count_only else MESSAGES_FIELDS)):
        raise FieldError(unknown[0], f"{unknown[0]}: Extra inputs are not permitted (unknown field(s) for {route}: "
                                     f"{', '.join(show(u, 40) for u in unknown)})")
    for name in _NOT_SUPPORTED:
        if body.get(name) is not None:
            raise FieldError(name, f"{name} is not supported by this server")
    model = body.get("model")
    if model is None:
        raise FieldError("model", "model: Field required")
    need_str(model, "model")
    max_tokens = None
    if not count_only:
        if body.get("max_tokens") is None:
            raise FieldError("max_tokens", "max_tokens: Field required")
        max_tokens = need_int(body["max_tokens"], "max_tokens", 1)
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise FieldError("metadata", "metadata must be an object")
    system = _system(body.get("system"))
    messages = ([{"role": "system", "content": system}] if system is not None else []) + _messages(body.get("messages"))
    tools = _tools(body.get("tools"))
    choice, parallel = _tool_choice(body.get("tool_choice"), [t["function"]["name"] for t in tools])
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or len(stops) > MAX_STOP_SEQUENCES or \
            not all(isinstance(s, str) and s for s in stops):
        raise FieldError("stop_sequences", f"stop_sequences must be a list of at most {MAX_STOP_SEQUENCES} "
                                           "non-empty strings")
    sampling = {k: body[k] for k in ("temperature", "top_p", "top_k") if body.get(k) is not None}
    stream = body.get("stream")
    budget, template_vars = _thinking(body.get("thinking"), max_tokens, body.get("chat_template_kwargs"))
    return MessagesRequest(model, messages, max_tokens, tools, choice, parallel, stops, sampling,
                           False if stream is None else need_bool(stream, "stream"), template_vars,
                           *_output_config(body.get("output_config")), prefill=_prefill(messages),
                           thinking_budget=budget)


def _thinking(config: Any, max_tokens: Optional[int], template_vars: Any) -> tuple[Optional[int], Any]:
    """thinking -> (thinking_token_budget or None, chat_template_kwargs with enable_thinking set unless given)."""
    if config is None:
        return None, template_vars
    if not isinstance(config, dict) or config.get("type") not in ("enabled", "disabled"):
        raise FieldError("thinking", f"thinking must be {{\"type\": \"enabled\", \"budget_tokens\": N}} or "
                                     f"{{\"type\": \"disabled\"}}, got {show(config)}")
    enabled = config["type"] == "enabled"
    if extra := sorted(set(config) - ({"type", "budget_tokens"} if enabled else {"type"})):
        raise FieldError("thinking", f"thinking.{extra[0]}: Extra inputs are not permitted")
    budget = None
    if enabled:
        if config.get("budget_tokens") is None:
            raise FieldError("thinking", "thinking.enabled.budget_tokens: Field required")
        budget = need_int(config["budget_tokens"], "thinking.budget_tokens", MIN_THINKING_BUDGET)
        if max_tokens is not None and max_tokens <= budget:
            raise FieldError("max_tokens", f"`max_tokens` must be greater than `thinking.budget_tokens` "
                                           f"({max_tokens} <= {budget})")
    if template_vars is None:
        template_vars = {}
    if isinstance(template_vars, dict) and "enable_thinking" not in template_vars:
        template_vars = {**template_vars, "enable_thinking": enabled}
    return budget, template_vars


def _prefill(messages: list[dict]) -> bool:
    """Whether the final message is an assistant's text for the reply to continue (Anthropic's prefill)."""
    last = messages[-1]
    if last["role"] != "assistant" or last.get("tool_calls"):
        return False
    if last["content"] != last["content"].rstrip():
        raise FieldError("messages", "messages: final assistant content cannot end with trailing whitespace")
    return True


def _output_config(config: Any) -> tuple[Optional[dict], Optional[str]]:
    """output_config -> (response_format, reasoning_effort)."""
    if config is None:
        return None, None
    if not isinstance(config, dict) or set(config) - {"format", "effort"}:
        raise FieldError("output_config", f"output_config must be {{\"format\", \"effort\"}}, got {show(config)}")
    fmt = config.get("format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or
                            not isinstance(fmt.get("schema"), dict) or set(fmt) - {"type", "schema"}):
        raise FieldError("output_config.format", "output_config.format must be {\"type\": \"json_schema\", "
                                                 "\"schema\": {...}}")
    effort = config.get("effort")
    if effort is not None and not isinstance(effort, str):
        raise FieldError("output_config.effort", "output_config.effort must be a string")
    rf = None if fmt is None else {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    return rf, effort


def _system(system: Any) -> Optional[str]:
    if system is None or isinstance(system, str):
        return system
    if isinstance(system, list):
        return "".join(_text_block(b, f"system[{i}]") for i, b in enumerate(system))
    raise FieldError("system", "system must be a string or a list of text blocks")


def _text_block(b: Any, where: str) -> str:
    if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
        raise FieldError(where, f"{where} must be a text block {{\"type\": \"text\", \"text\": ...}}, got {show(b)}")
    if extra := sorted(set(b) - _BLOCK_KEYS["text"]):
        raise FieldError(where, f"{where}.{extra[0]}: Extra inputs are not permitted")
    return b["text"]


def _block_type(b: Any, where: str) -> str:
    kind = b.get("type") if isinstance(b, dict) else None
    if kind in _REFUSED_BLOCKS:
        raise FieldError(where, f"{where}: {kind} content blocks are not supported by this server (text only)")
    if kind not in ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking"):
        raise FieldError(where, f"{where}: unknown content block type {show(kind, 40)} (text, image, tool_use, "
                                "tool_result, thinking)")
    if extra := sorted(set(b) - _BLOCK_KEYS.get(kind, set(b))):
        raise FieldError(where, f"{where}.{extra[0]}: Extra inputs are not permitted")
    return kind


def _messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise FieldError("messages", "messages must be a non-empty list of {role, content}")
    out: list[dict] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant") or set(m) - {"role", "content"}:
            raise FieldError(where, f"{where} must be {{\"role\": \"user\" | \"assistant\", \"content\"}}")
        content = m.get("content")
        if content == [] and (m["role"] == "user" or i < len(messages) - 1):  # a turn of no message at all
            raise FieldError(f"{where}.content", f"{where}.content: all messages must have non-empty content except "
                                                 "for the optional final assistant message")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
        elif isinstance(content, list):
            out += (_assistant if m["role"] == "assistant" else _user)(content, f"{where}.content")
        else:
            raise FieldError(f"{where}.content", f"{where}.content must be a string or a list of content blocks")
    return out


def _image_url(source: Any, where: str) -> str:
    """An image block's source -> the URL a chat image_url part takes (a data URL for base64 data)."""
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64" and isinstance(source.get("data"), str) and isinstance(source.get("media_type"), str):
        return f"data:{source['media_type']};base64,{source['data']}"
    if kind == "url" and isinstance(source.get("url"), str):
        return source["url"]
    raise FieldError(where, f"{where}: an image source must be {{\"type\": \"base64\", \"media_type\", \"data\"}} or "
                            f"{{\"type\": \"url\", \"url\"}}, got {show(kind, 40)}")


def _user(blocks: list, where: str) -> list[dict]:
    """A user turn's blocks -> a `tool` message per tool_result, then one user message with its text (with an
    image block: chat content parts, the images as image_url parts)."""
    out, texts = [], []
    for j, b in enumerate(blocks):
        at = f"{where}[{j}]"
        kind = _block_type(b, at)
        if kind == "text":
            texts.append({"type": "text", "text": need_str(b.get("text"), f"{at}.text")})
        elif kind == "image":
            texts.append({"type": "image_url", "image_url": {"url": _image_url(b.get("source"), f"{at}.source")}})
        elif kind == "tool_result":
            if not isinstance(b.get("tool_use_id"), str):
                raise FieldError(f"{at}.tool_use_id", f"{at}.tool_use_id must be a string (the tool_use's id)")
            c = b.get("content", "")
            text = c if isinstance(c, str) else "".join(_text_block(x, f"{at}.content[{k}]") for k, x in enumerate(c)) \
                if isinstance(c, list) else None
            if text is None:
                raise FieldError(f"{at}.content", f"{at}.content must be a string or a list of text blocks")
            if b.get("is_error") is not None and need_bool(b["is_error"], f"{at}.is_error"):
                text = "Error: " + text
            out.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": text})
        else:
            raise FieldError(at, f"{at}: a user turn holds text and tool_result blocks, not {kind}")
    if texts:
        plain = all(p["type"] == "text" for p in texts)
        out.append({"role": "user", "content": "".join(p["text"] for p in texts) if plain else texts})
    return out


def _assistant(blocks: list, where: str) -> list[dict]:
    texts, calls, thoughts = [], [], []
    for j, b in enumerate(blocks):
        at = f"{where}[{j}]"
        kind = _block_type(b, at)
        if kind == "text":
            texts.append(need_str(b.get("text"), f"{at}.text"))
        elif kind == "thinking":
            thoughts.append(need_str(b.get("thinking"), f"{at}.thinking"))
        elif kind == "tool_use":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str) or \
                    not isinstance(b.get("input"), dict):
                raise FieldError(at, f"{at}: a tool_use block needs id, name (strings) and input (an object)")
            calls.append({"id": b["id"], "type": "function",
                          "function": {"name": b["name"], "arguments": json.dumps(b["input"], ensure_ascii=False)}})
        elif kind == "tool_result":
            raise FieldError(at, f"{at}: tool_result blocks belong in a user turn")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    if thoughts:
        msg["reasoning_content"] = "".join(thoughts)
    return [msg]


def _tools(tools: Any) -> list[dict]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise FieldError("tools", f"tools must be a list, got {show(tools)}")
    out = []
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise FieldError(where, f"{where} must be an object {{name, description, input_schema}}")
        if t.get("type") not in (None, "custom"):
            raise FieldError(where, f"{where}: server tools ({show(t.get('type'), 40)}) are not supported by this "
                                    "server (client tools only: name, description, input_schema)")
        if extra := sorted(set(t) - {"type", "name", "description", "input_schema", "cache_control"}):
            raise FieldError(where, f"{where}.{extra[0]}: Extra inputs are not permitted")
        if not isinstance(t.get("input_schema"), dict):
            raise FieldError(f"{where}.input_schema", f"{where}.input_schema must be a JSON Schema object")
        fn = {"name": t.get("name"), **({} if t.get("description") is None else {"description": t["description"]}),
              "parameters": t["input_schema"]}  # OpenAI's key order: templates render the tools as JSON
        out.append({"type": "function", "function": fn})  # names and schemas: openai_tools.check_tools
    return out


def _tool_choice(choice: Any, names: list[str]) -> tuple[Any, Optional[bool]]:
    """Anthropic's tool_choice -> (OpenAI's tool_choice, parallel_tool_calls)."""
    if choice is None:
        return None, None
    kind = choice.get("type") if isinstance(choice, dict) else None
    keys = {"type", "disable_parallel_tool_use"} | ({"name"} if kind == "tool" else set())
    if kind not in ("auto", "any", "tool", "none") or set(choice) - keys:
        raise FieldError("tool_choice", "tool_choice must be {\"type\": \"auto\" | \"any\" | \"none\"} or "
                                        f"{{\"type\": \"tool\", \"name\"}}, got {show(choice)}")
    if kind in ("any", "tool") and not names:
        raise FieldError("tool_choice", f"tool_choice {kind} needs tools")
    if kind == "tool" and choice.get("name") not in names:
        raise FieldError("tool_choice", f"tool_choice names {show(choice.get('name'), 64)}, which is not in tools")
    parallel = choice.get("disable_parallel_tool_use")
    parallel = None if parallel is None else not need_bool(parallel, "tool_choice.disable_parallel_tool_use")
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or \
        {"type": "function", "function": {"name": choice["name"]}}
    return mapped, parallel
