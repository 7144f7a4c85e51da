"""The request fields vLLM's pooling routes share (/v1/embeddings, /classify, /v1/rerank, /v1/score), parsed once
(torch-free; pooling_input.py builds the calls).

- Every route: model, user, request_id (the call's id: its requests are f"{id}-{i}"), priority (as the generation
  routes take it: generate_input.parse_priority), truncate_prompt_tokens and truncation_side
  (limits.parse_truncation: keep the last k tokens, or the first), use_activation (None: the model's default;
  false: embeddings unnormalized, classify / score the raw logits), cache_salt (request_extras.parse_cache_salt:
  the prompts reuse cached prefixes only of the same salt).
- /v1/embeddings and /classify take their prompts as `input` (vLLM's completion form, with add_special_tokens,
  default true) or as chat `messages` (its chat form: add_generation_prompt and continue_final_message default
  false, chat_template_kwargs, add_special_tokens default false), never both.
- vLLM's removed `normalize` is refused naming use_activation, as vLLM refuses it.
Every problem raises FieldError naming the field (HTTP 400).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Optional

from radixlang_runtime.protocol.generate_input import parse_priority
from radixlang_runtime.protocol.request_extras import RequestExtras, parse_cache_salt
from radixlang_runtime.protocol.limits import (MAX_RID_LEN, FieldError, RuntimeLimits, Truncation, need_bool,
                                               need_str, parse_truncation, show)

COMMON_FIELDS = {"model", "user", "request_id", "priority", "truncate_prompt_tokens", "truncation_side",
                 "use_activation", "cache_salt"}
INPUT_FIELDS = {"input", "add_special_tokens"}
CHAT_ONLY_FIELDS = {"messages", "add_generation_prompt", "continue_final_message", "chat_template_kwargs"}
PROMPT_FIELDS = INPUT_FIELDS | CHAT_ONLY_FIELDS  # the prompt of /v1/embeddings and /classify


@dataclass(frozen=True)
class PoolingOptions:
    rid: str  # the call's id (response `id`); request i is f"{rid}-{i}"
    truncation: Optional[Truncation] = None  # truncate_prompt_tokens, truncation_side
    use_activation: Optional[bool] = None  # None: the model's default
    priority: int = 0  # --enable-priority-scheduling's rank
    chat: bool = False  # the prompt is the body's `messages`
    add_special_tokens: bool = True  # input: tokenized with the model's special tokens; chat: added to the render
    extras: RequestExtras = RequestExtras()  # cache_salt


def refuse_unknown(body: Any, known: set[str], route: str) -> dict:
    if not isinstance(body, dict):
        raise FieldError("body", "the body must be a JSON object")
    if "normalize" in body and "normalize" not in known:
        raise FieldError("normalize", "normalize was removed from vLLM's pooling requests: use use_activation "
                                      "(false: the vector as pooled, not L2-normalized)")
    if unknown := sorted(set(body) - known):
        raise FieldError(unknown[0], f"unknown field(s) for {route}: {', '.join(show(u, 40) for u in unknown)}")
    return body


def pooling_options(body: dict, limits: RuntimeLimits, prefix: str, prompts: bool = False) -> PoolingOptions:
    """The shared fields of a body already checked by refuse_unknown; prompts: the route takes `input` or
    `messages` (their fields are checked here too)."""
    rid = body.get("request_id")
    if rid is not None and not need_str(rid, "request_id", MAX_RID_LEN):
        raise FieldError("request_id", "request_id must be a non-empty string")
    if body.get("user") is not None:
        need_str(body["user"], "user")
    act = body.get("use_activation")
    chat, add = False, True
    if prompts:
        chat = _prompt_form(body)
        add = body.get("add_special_tokens")
        add = (not chat) if add is None else need_bool(add, "add_special_tokens")
    return PoolingOptions(f"{prefix}-{rid if rid is not None else uuid.uuid4().hex}",
                          parse_truncation(body, limits.context_len),
                          None if act is None else need_bool(act, "use_activation"),
                          parse_priority(body.get("priority"), limits), chat, add,
                          RequestExtras(cache_salt=parse_cache_salt(body.get("cache_salt"))))


def _prompt_form(body: dict) -> bool:
    """True: the prompt is `messages`; False: `input`. Exactly one of them; chat fields only with messages."""
    has_input, has_chat = body.get("input") is not None, body.get("messages") is not None
    if has_input == has_chat:
        raise FieldError("input", "pass exactly one of input / messages" if has_input else
                                  "input is required (or messages, vLLM's chat form)")
    if not has_chat and (extra := sorted(k for k in CHAT_ONLY_FIELDS if body.get(k) is not None)):
        raise FieldError(extra[0], f"{extra[0]} goes with messages (a chat request), not with input")
    return has_chat
