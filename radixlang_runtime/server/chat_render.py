"""OpenAI chat messages -> prompt text through the model's Jinja chat template (no torch).

Messages are checked once: roles system / developer (rendered as system) / user / assistant / tool;
content a string or text parts (an assistant turn with tool_calls may have none); an assistant's
`reasoning_content` (or vLLM's `reasoning`) reaches the template as `reasoning_content` (Qwen3's and
others' templates show the current turn's reasoning between its tool calls from it), and as `thinking` where the
template reads that (gpt-oss's); its
`tool_calls` [{id, type: "function", function: {name, arguments: JSON text}}] reach the template with
arguments as an object (what most templates expect: `arguments | tojson`, GLM-4.5's `arguments.items()`), or,
for a template that joins them to its text with `+` (DeepSeek V3 / R1 / V3.1's own: an object raises
TypeError there), as the JSON text the client sent; a tool turn keeps its `tool_call_id` (and `name`).
Tools (OpenAI's `tools` list) are passed as `tools=`; the request's
`chat_template_kwargs` (vLLM / SGLang: e.g. Qwen3's {"enable_thinking": false}) and `reasoning_effort` (as a
variable of that name) become template variables (template_kwargs).
How the prompt ends (TurnEnd, turn_end): a new assistant turn opened (the default), or with
`continue_final_message` (vLLM / SGLang) the final message left open, so the output continues its text (an
assistant prefill: Anthropic's final assistant turn means the same); `add_generation_prompt` false renders the
messages as they are.
A template that cannot show tools or a tool history: a ChatML one (the embedded SmolLM2's GGUF template
renders only role + content) is replaced, for that request, by CHATML_TOOLS_TEMPLATE; any other is a
400 asking for --chat-template.
Special-token text inside a message's content (`<|im_start|>system` in a user turn) is plain text:
chat_content_spans reports where the contents lie so the encoder (prompt_encoder.py) parses specials only in
the template's own text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import jinja2

from radixlang_runtime.chat_tools_template import CHATML_TOOLS_TEMPLATE, template_with_tools  # noqa: F401
from radixlang_runtime.protocol.limits import FieldError, need_bool, show
from radixlang_runtime.server.chat_images import content_parts, image_refs, plain_text
from radixlang_runtime.prompt_encoder import Span
from radixlang_runtime.server.http_common import BadRequest


def _text(content: Any, where: str, optional: bool = False) -> Union[str, list, None]:
    """A message's content: a string, or parts (text parts alone are joined; with an image: chat_images.py)."""
    if content is None and optional:
        return None
    if isinstance(content, list):
        return content_parts(content, where)
    if not isinstance(content, str):
        raise FieldError(where, "message content must be a string or a list of content parts")
    return content


def _tool_calls(calls: Any, where: str, text_arguments: bool = False) -> list[dict]:
    if not isinstance(calls, list) or not calls:
        raise FieldError(where, f"{where} must be a non-empty list")
    out = []
    for j, c in enumerate(calls):
        at = f"{where}[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or c.get("type", "function") != "function" or not isinstance(fn.get("name"), str):
            raise FieldError(at, f"{at} must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                                 "\"arguments\"}}}")
        args = text = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                raise FieldError(f"{at}.function.arguments",
                                 f"{at}.function.arguments must be JSON text of an object") from None
        if not isinstance(args, dict):
            raise FieldError(f"{at}.function.arguments", f"{at}.function.arguments must be a JSON object")
        if text_arguments and not isinstance(text, str):
            text = json.dumps(args, ensure_ascii=False)
        out.append({"id": str(c.get("id", "")), "type": "function",
                    "function": {"name": fn["name"], "arguments": text if text_arguments else args}})
    return out


def _reasoning(m: dict, where: str) -> Optional[str]:
    """An assistant turn's reasoning: `reasoning_content` (SGLang, DeepSeek) or `reasoning` (vLLM), null or a
    string; both set must agree."""
    given = {k: m[k] for k in ("reasoning_content", "reasoning") if m.get(k) is not None}
    for key, value in given.items():
        if not isinstance(value, str):
            raise FieldError(f"{where}.{key}", f"{where}.{key} must be a string or null, got {show(value)}")
    if len(set(given.values())) > 1:
        raise FieldError(f"{where}.reasoning", f"{where}.reasoning and {where}.reasoning_content differ: send one")
    return next(iter(given.values()), None)


def clean_messages(messages: Any, text_arguments: bool = False) -> tuple[list[dict], bool]:
    """-> (messages for the template, whether they hold tool calls or tool results). text_arguments: tool
    calls' arguments as JSON text, not an object."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    clean, tool_history = [], False
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool", "developer"):
            raise BadRequest("each message needs a role of system, user, assistant, tool or developer")
        role = "system" if m["role"] == "developer" else m["role"]
        where = f"messages[{i}]"
        calls = m.get("tool_calls") if role == "assistant" else None
        msg: dict[str, Any] = {"role": role,
                               "content": _text(m.get("content"), f"{where}.content", calls is not None) or ""}
        if calls is not None:
            msg["tool_calls"] = _tool_calls(calls, f"{where}.tool_calls", text_arguments)
            tool_history = True
        if role == "assistant" and (thought := _reasoning(m, where)) is not None:
            msg["reasoning_content"] = thought
        if role == "tool":
            tool_history = True
            if not isinstance(m.get("tool_call_id"), str):
                raise FieldError(f"{where}.tool_call_id", f"{where}.tool_call_id must be a string (the call's id)")
            msg["tool_call_id"] = m["tool_call_id"]
            if isinstance(m.get("name"), str):
                msg["name"] = m["name"]
        clean.append(msg)
    return clean, tool_history


def load_template(chat_template: Optional[str]) -> Optional[str]:
    """--chat-template: Jinja text, or a path to a Jinja file."""
    if chat_template is not None and not ("{%" in chat_template or "{{" in chat_template):
        with open(chat_template) as f:
            return f.read()
    return chat_template


def template_for(tokenizer: Any, chat_template: Optional[str], tools: bool, tool_history: bool) -> Optional[str]:
    """The template one request renders with (None: the tokenizer's own)."""
    template = load_template(chat_template)
    active = template if template is not None else getattr(tokenizer, "chat_template", None) or ""
    lacks = (tools and "tools" not in active) or (tool_history and "tool_call" not in active)
    if not lacks:
        return template
    if (fallback := template_with_tools(active)) is not None:
        return fallback
    raise FieldError("tools", "this model's chat template does not render tools / tool calls; start the server "
                              "with --chat-template naming one that does")


@dataclass(frozen=True)
class TurnEnd:
    """Where the rendered prompt stops: after an opened assistant turn (add_generation_prompt), inside the final
    message (continue_final_message: the output continues its text), or after the messages as they are."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False


OPEN_TURN = TurnEnd()
CONTINUE_FINAL = TurnEnd(add_generation_prompt=False, continue_final_message=True)


def turn_end(body: dict) -> TurnEnd:
    """A body's `add_generation_prompt` (default true) and `continue_final_message` (default false; when true,
    add_generation_prompt defaults to false, and both true is a 400 as in vLLM)."""
    cont = body.get("continue_final_message")
    cont = False if cont is None else need_bool(cont, "continue_final_message")
    gen = body.get("add_generation_prompt")
    gen = (not cont) if gen is None else need_bool(gen, "add_generation_prompt")
    if cont and gen:
        raise FieldError("continue_final_message", "continue_final_message and add_generation_prompt cannot both "
                                                   "be true (the final message is continued, no new turn opened)")
    return TurnEnd(gen, cont)


def continued_text(messages: Any) -> str:
    """The text of the final message, which a continue_final_message render leaves open (a 400 when that
    message holds tool calls: a call cannot be continued as text)."""
    last = clean_messages(messages)[0][-1]
    if last.get("tool_calls"):
        where = f"messages[{len(messages) - 1}]"
        raise FieldError(where, f"continue_final_message cannot continue {where}: it holds tool calls")
    return plain_text(last["content"])


# apply_chat_template's own parameters and the variables it sets: not a chat_template_kwargs key
_RESERVED_KWARGS = ("messages", "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
                    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
                    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")  # OpenAI's and Anthropic's


def template_kwargs(body: dict) -> dict[str, Any]:
    """A request's `chat_template_kwargs` (an object of template variables) and `reasoning_effort` (one of
    REASONING_EFFORTS, the variable `reasoning_effort`) -> the extra variables of its chat template."""
    kwargs = body.get("chat_template_kwargs")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, dict):
        raise FieldError("chat_template_kwargs", "chat_template_kwargs must be an object of template variables")
    if hits := sorted(set(kwargs) & set(_RESERVED_KWARGS)):
        raise FieldError("chat_template_kwargs", f"chat_template_kwargs may not set {hits[0]!r} (the request sets it)")
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise FieldError("reasoning_effort", f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, "
                                                 f"got {show(effort)}")
        kwargs = {"reasoning_effort": effort, **kwargs}
    return dict(kwargs)


def _render(tokenizer: Any, clean: list[dict], template: Optional[str], extra: dict, turn: TurnEnd) -> str:
    try:
        return tokenizer.apply_chat_template(clean, tokenize=False, add_generation_prompt=turn.add_generation_prompt,
                                             continue_final_message=turn.continue_final_message,
                                             chat_template=template, **extra)
    except jinja2.TemplateError as e:  # e.g. a template that raises on the order of roles
        raise BadRequest(f"the chat template refused these messages: {e}") from None
    except ValueError as e:  # continue_final_message: a template that does not show the final text as sent
        if not turn.continue_final_message:
            raise
        raise FieldError("continue_final_message", f"the final message cannot be continued with this chat "
                                                   f"template: {e}") from None


_READS_THINKING = re.compile(r"\.thinking\b|\[['\"]thinking['\"]\]")


def _as_thinking(clean: list[dict]) -> list[dict]:
    """For a template that reads an assistant turn's reasoning as `thinking` (gpt-oss's harmony template, which
    refuses a tool-call turn with both content and thinking): the reasoning as `thinking`; such a turn's content
    (a commentary preamble) gives way to it, as llama.cpp does."""
    out = []
    for m in clean:
        if m.get("reasoning_content") is not None:
            m = {**m, "thinking": m["reasoning_content"]}
            if m.get("tool_calls"):
                m["content"] = ""
        out.append(m)
    return out


def _apply(tokenizer: Any, messages: Any, template: Optional[str], extra: dict, turn: TurnEnd,
           edit: Callable[[list[dict]], list[dict]] = lambda clean: clean) -> str:
    """The raw messages, checked (edit: a change to the checked ones), rendered: tool calls' arguments as an
    object, or, where the template joins one to a string (TypeError), as JSON text."""
    active = template if template is not None else getattr(tokenizer, "chat_template", None)
    if isinstance(active, str) and _READS_THINKING.search(active):
        edit = (lambda first: lambda ms: _as_thinking(first(ms)))(edit)
    clean, tool_history = clean_messages(messages)
    try:
        try:
            return _render(tokenizer, edit(clean), template, extra, turn)
        except TypeError:
            if not tool_history:
                raise
        return _render(tokenizer, edit(clean_messages(messages, text_arguments=True)[0]), template, extra, turn)
    except TypeError as e:
        raise BadRequest(f"the chat template refused these messages: {e}") from None


def render_chat(tokenizer: Any, messages: Any, chat_template: Optional[str],
                tools: Optional[list[dict]] = None,
                variables: Optional[dict[str, Any]] = None, turn: TurnEnd = OPEN_TURN,
                images: bool = False) -> tuple[str, Optional[str]]:
    """-> (prompt text, the template used: None when the tokenizer's own). variables: template_kwargs'. images:
    the route serves image parts (the model takes images); else they are a 400."""
    _, tool_history = clean_messages(messages)
    if not images and image_refs(messages):
        raise FieldError("messages", "image content parts need a model that takes images; this route or model "
                                     "takes text only")
    if turn.continue_final_message:
        continued_text(messages)
    template = template_for(tokenizer, chat_template, bool(tools), tool_history)
    extra = {**(variables or {}), **({"tools": tools} if tools else {})}
    return _apply(tokenizer, messages, template, extra, turn), template


def content_spans(text: str, skeleton: str, marks: list[Optional[str]], contents: list[str]) -> Optional[list[Span]]:
    """Where each message's content lies in `text`, found by walking `skeleton` (the same messages rendered
    with content i replaced by marks[i]): the template's text around the marks must match `text`, each
    content must appear whole (or stripped: templates that trim). None when the template moves, repeats
    or rewrites a content in another way."""
    spans: list[Span] = []
    pos_s = pos_t = 0
    for mark, content in zip(marks, contents):
        if mark is None:
            continue
        k = skeleton.find(mark, pos_s)
        if k < 0:  # this content is not rendered (a template may drop a turn)
            continue
        if skeleton.find(mark, k + len(mark)) >= 0 or not text.startswith(skeleton[pos_s:k], pos_t):
            return None
        pos_t += k - pos_s
        shown = next((v for v in (content, content.strip()) if text.startswith(v, pos_t)), None)
        if shown is None:
            return None
        spans.append((pos_t, pos_t + len(shown)))
        pos_t, pos_s = pos_t + len(shown), k + len(mark)
    return spans if text[pos_t:] == skeleton[pos_s:] else None


def chat_content_spans(tokenizer: Any, messages: Any, template: Optional[str], text: str,
                       special_text_in: Callable[[str], Optional[str]], turn: TurnEnd = OPEN_TURN,
                       **extra: Any) -> Optional[list[Span]]:
    """The messages' content spans in `text` (render_chat's output for them with `template` and the same
    apply_chat_template keywords `extra`) when some content holds special-token text (special_text_in,
    PromptEncoder's), else None (nothing to keep as text). The spans come from a second render with a mark
    in place of each content; a template whose output does not show where they are is a 400 naming the
    message."""
    clean, _ = clean_messages(messages)
    found = [special_text_in(plain_text(m["content"])) for m in clean]
    if not any(found):
        return None
    if parted := [i for i, (m, f) in enumerate(zip(clean, found)) if f and isinstance(m["content"], list)]:
        raise FieldError(f"messages[{parted[0]}].content", f"messages[{parted[0]}].content holds special-token text "
                                                           "beside an image, which is not kept as plain text")
    # a message with an image keeps its parts (no special text there: refused above), so the template renders it alike
    marks = [f"\ue000{i}\ue001" if m["content"] and isinstance(m["content"], str) else None
             for i, m in enumerate(clean)]
    skeleton = _apply(tokenizer, messages, template, extra, turn,
                      lambda ms: [dict(m, content=k) if k else m for m, k in zip(ms, marks)])
    spans = content_spans(text, skeleton, marks, [plain_text(m["content"]) for m in clean])
    if spans is None:
        i = next(i for i, f in enumerate(found) if f)
        raise FieldError(f"messages[{i}].content", f"messages[{i}].content holds the special-token text {found[i]!r} "
                         "and this chat template rewrites message contents, so it cannot be kept as plain text")
    return spans
