"""Chat templates: how roles render into text, and how a backend picks one.

Choice order (`pick_chat_template`): an explicit `chat_template_name=`; the model's own Jinja
template reported by the server (`/get_model_info`'s `chat_template`, or the Engine's tokenizer),
recognised by its markers; the model path matched by regexes (SGLang's rule, plus SmolLM2);
`default`. So the embedded SmolLM2 gets ChatML with no argument.
Invariant: a template's `stop_str` is added to every gen's stop list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import Enum, auto
from typing import Dict, List, Optional, Tuple


class ChatTemplateStyle(Enum):
    PLAIN = auto()
    LLAMA2 = auto()


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    default_system_prompt: Optional[str]
    role_prefix_and_suffix: Dict[str, Tuple[str, str]]
    stop_str: Tuple[str, ...] = ()
    image_token: str = "<image>"
    style: ChatTemplateStyle = ChatTemplateStyle.PLAIN

    def get_prefix_and_suffix(self, role: str, hist_messages: List[Dict]) -> Tuple[str, str]:
        prefix, suffix = self.role_prefix_and_suffix.get(role, ("", ""))
        if self.style == ChatTemplateStyle.LLAMA2:
            if role == "system" and not hist_messages:
                user_prefix, _ = self.role_prefix_and_suffix.get("user", ("", ""))
                return user_prefix + prefix, suffix
            if role == "user" and len(hist_messages) == 1 and hist_messages[0]["content"] is not None:
                return "", suffix
        return prefix, suffix

    def get_prompt(self, messages: List[Dict]) -> str:
        out = ""
        for i, m in enumerate(messages):
            content = m["content"]
            if m["role"] == "system" and content is None:
                if self.default_system_prompt is None:
                    continue
                content = self.default_system_prompt
            prefix, suffix = self.get_prefix_and_suffix(m["role"], messages[:i])
            out += f"{prefix}{content}{suffix}"
        return out


chat_template_registry: Dict[str, ChatTemplate] = {}


def register_chat_template(t: ChatTemplate) -> None:
    chat_template_registry[t.name] = t


def get_chat_template(name: str) -> ChatTemplate:
    if name not in chat_template_registry:
        raise ValueError(f"unknown chat template {name!r}; known: {', '.join(sorted(chat_template_registry))}")
    return chat_template_registry[name]


def _same(prefix: str, suffix: str) -> Dict[str, Tuple[str, str]]:
    return {r: (prefix.format(role=r), suffix) for r in ("system", "user", "assistant")}


for _t in (
    ChatTemplate("default", None, {"system": ("SYSTEM:", "\n"), "user": ("USER:", "\n"),
                                   "assistant": ("ASSISTANT:", "\n")}),
    ChatTemplate("claude", None, {"system": ("", ""), "user": ("\n\nHuman: ", ""),
                                  "assistant": ("\n\nAssistant:", "")}),
    ChatTemplate("chatml", None, _same("<|im_start|>{role}\n", "<|im_end|>\n"), ("<|im_end|>",)),
    ChatTemplate("qwen", "You are a helpful assistant.", _same("<|im_start|>{role}\n", "<|im_end|>\n"),
                 ("<|im_end|>",)),
    ChatTemplate("llama-3-instruct", None, _same("<|start_header_id|>{role}<|end_header_id|>\n\n", "<|eot_id|>"),
                 ("<|eot_id|>",), "<|image|>"),
    ChatTemplate("llama-2-chat", None, {"system": ("<<SYS>>\n", "\n<</SYS>>\n\n"), "user": ("[INST] ", " [/INST]"),
                                        "assistant": ("", " </s><s>")}, style=ChatTemplateStyle.LLAMA2),
    ChatTemplate("mistral", None, {"system": ("[SYSTEM_PROMPT] ", " [/SYSTEM_PROMPT]"), "user": ("[INST] ", " [/INST]"),
                                   "assistant": ("", " </s><s>")}, ("</s>",), "[IMG]"),
    ChatTemplate("vicuna_v1.1", "A chat between a curious user and an artificial intelligence assistant. "
                 "The assistant gives helpful, detailed, and polite answers to the user's questions.",
                 {"system": ("", " "), "user": ("USER:", " "), "assistant": ("ASSISTANT:", "</s>")}),
    ChatTemplate("gemma-it", None, {"system": ("", ""), "user": ("<start_of_turn>user\n", "<end_of_turn>\n"),
                                    "assistant": ("<start_of_turn>model\n", "<end_of_turn>\n")}, ("<end_of_turn>",)),
):
    register_chat_template(_t)

# (regex over the model path, template name), first match wins
_PATH_RULES = [
    (r"smollm|tinyllama|qwen.*vl|hermes|openhermes", "chatml"),
    (r"qwen.*(chat|instruct)", "qwen"),
    (r"llama-3.*instruct", "llama-3-instruct"),
    (r"llama-2.*chat|codellama.*instruct", "llama-2-chat"),
    (r"pixtral|(mistral|mixtral).*instruct", "mistral"),
    (r"vicuna|llava-v1\.5", "vicuna_v1.1"),
    (r"gemma.*it", "gemma-it"),
]

# (marker in a Jinja chat template, template name)
_JINJA_MARKERS = [
    ("<|im_start|>", "chatml"),
    ("<|start_header_id|>", "llama-3-instruct"),
    ("<start_of_turn>", "gemma-it"),
    ("[SYSTEM_PROMPT]", "mistral"),
    ("<<SYS>>", "llama-2-chat"),
]


def get_chat_template_by_model_path(model_path: Optional[str]) -> ChatTemplate:
    for pattern, name in _PATH_RULES:
        if model_path and re.search(pattern, model_path, re.IGNORECASE):
            return get_chat_template(name)
    return get_chat_template("default")


def from_jinja(jinja_template: str) -> Optional[ChatTemplate]:
    """The registered template whose markers the model's Jinja template uses, with the model's own
    default system prompt (what the template inserts when the first message is not a system one)."""
    for marker, name in _JINJA_MARKERS:
        if marker in jinja_template:
            base = get_chat_template(name)
            return replace(base, default_system_prompt=_default_system(jinja_template, base))
    return None


def _default_system(jinja_template: str, base: ChatTemplate) -> Optional[str]:
    try:
        import jinja2
    except ImportError:  # optional: without jinja2 the registered default stays
        return base.default_system_prompt
    try:
        env = jinja2.Environment()
        text = env.from_string(jinja_template).render(
            messages=[{"role": "user", "content": "\x00"}], add_generation_prompt=False,
            bos_token="", eos_token="")
    except Exception:  # a template that needs more context than we give: keep the registered default
        return base.default_system_prompt
    sys_prefix, sys_suffix = base.role_prefix_and_suffix["system"]
    head = text.split("\x00")[0]
    start = head.find(sys_prefix) if sys_prefix else -1
    if start < 0:
        return None
    body = head[start + len(sys_prefix):]
    end = body.find(sys_suffix) if sys_suffix else -1
    return body[:end] if end >= 0 else None


def pick_chat_template(name: Optional[str] = None, jinja_template: Optional[str] = None,
                       model_path: Optional[str] = None) -> ChatTemplate:
    if name:
        return get_chat_template(name)
    if jinja_template:
        t = from_jinja(jinja_template)
        if t is not None:
            return t
    return get_chat_template_by_model_path(model_path)
