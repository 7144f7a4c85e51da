"""Fields the official OpenAI SDKs send by default that change nothing a served model outputs (no torch).

The OpenAI Agents SDK's default model settings send `verbosity` and a reasoning effort (chat:
`reasoning_effort`, responses: `text.verbosity`, `reasoning.effort`); `prompt_cache_retention` says how
long OpenAI keeps a cached prefix. They are hints to OpenAI's own models and caches: here they are taken
as documented no-ops (docs/RESPONSES_API.md), their values checked so a typo still answers 400 naming
the field. The radix cache keeps prefixes by its own policy; a reasoning model reasons as its chat
template and weights make it (no budget is enforced).
"""

from __future__ import annotations

from typing import Any

from radixlang_runtime.protocol.limits import FieldError, show

HINT_VALUES: dict[str, tuple[str, ...]] = {
    "verbosity": ("low", "medium", "high"),
    "reasoning_effort": ("none", "minimal", "low", "medium", "high", "xhigh", "max"),
    "prompt_cache_retention": ("in_memory", "24h"),
}


def check_hint(name: str, value: Any, where: str = "") -> None:
    """A hint's value is null or one OpenAI documents, else FieldError naming it (where: its path)."""
    if value is None:
        return
    allowed = HINT_VALUES[name]
    if value not in allowed or not isinstance(value, str):
        path = where or name
        raise FieldError(path, f"{path} must be one of {', '.join(allowed)}, got {show(value)}")


def check_hints(body: dict) -> None:
    """Every hint the body carries at its top level."""
    for name in HINT_VALUES:
        check_hint(name, body.get(name))
