"""A request's asks beside its prompt and sampling (torch-free), parsed once at every entrance:
- `cache_salt` (vLLM's field; SGLang's GenerateReqInput calls it `extra_key`, taken too): a non-empty string;
  the request reads and writes the prefix cache only in that salt's namespace (mem/cache_namespace.py);
- `return_hidden_states` (SGLang's): a boolean; the final layer's hidden states come back in
  meta_info.hidden_states (scheduler/hidden_states.py), on a server started with --enable-return-hidden-states.
The OpenAI routes take one value for the whole call (parse_extras); the native body and the Engine take one value
or, as SGLang's GenerateReqInput does for a list of prompts, a list of one value per prompt, which that prompt's
n samples share (prompt_extras). Every problem is a FieldError naming the field (HTTP 400).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from radixlang_runtime.protocol.limits import FieldError, RuntimeLimits, need_bool, need_str, per_prompt

MAX_SALT_LEN = 1024  # characters of a cache_salt
NATIVE_FIELDS = ("cache_salt", "extra_key", "return_hidden_states")  # what prompt_extras reads of a body


@dataclass(frozen=True)
class RequestExtras:
    cache_salt: Optional[str] = None  # None: the shared (unsalted) prefix cache namespace
    return_hidden_states: bool = False


def parse_cache_salt(value: Any, name: str = "cache_salt") -> Optional[str]:
    """None stays None; else a non-empty string of at most MAX_SALT_LEN characters."""
    if value is None:
        return None
    salt = need_str(value, name, MAX_SALT_LEN)
    if not salt:
        raise FieldError(name, f"{name} must be a non-empty string (leave it out for the shared cache)")
    return salt


def parse_return_hidden_states(value: Any, limits: RuntimeLimits, name: str = "return_hidden_states") -> bool:
    """SGLang's `return_hidden_states` (None: false); true on a server without --enable-return-hidden-states
    is refused naming the flag."""
    if value is None or not need_bool(value, name):
        return False
    if not limits.hidden_states:
        raise FieldError(name, f"{name} needs a server started with --enable-return-hidden-states")
    return True


def parse_extras(body: Mapping[str, Any], limits: RuntimeLimits, stream_hidden: bool = True) -> RequestExtras:
    """An OpenAI body's fields, one value each (vLLM's cache_salt is a string: a list is refused naming it).
    stream_hidden false: a streamed request's return_hidden_states is refused (the OpenAI routes return them on
    the non-streamed reply only)."""
    salt = parse_cache_salt(body.get("cache_salt"))
    hidden = parse_return_hidden_states(body.get("return_hidden_states"), limits)
    if hidden and not stream_hidden:
        raise FieldError("return_hidden_states", "return_hidden_states is returned on non-streamed replies of this "
                                                 "route only (stream: false; /generate streams them)")
    return RequestExtras(salt, hidden)


def prompt_extras(body: Mapping[str, Any], limits: RuntimeLimits, prompts: int,
                  is_list: bool) -> list[RequestExtras]:
    """The native fields (NATIVE_FIELDS of a /generate body or the Engine's arguments) -> one RequestExtras per
    prompt. Each field is one value for every prompt or, when the input is a list of prompts (is_list), a list
    of one value per prompt (per_prompt: its length is the prompts'), each element checked as a single value
    under its indexed name. SGLang's extra_key names the salt too: given with cache_salt, the two agree prompt by
    prompt."""
    def column(name: str) -> list[tuple[Any, str]]:
        value = body.get(name)
        if isinstance(value, list) and not is_list:
            raise FieldError(name, f"{name} as a list gives one value per prompt: it needs a list of prompts "
                                   "(text or input_ids as a list); give one value for a single prompt")
        names = [f"{name}[{i}]" for i in range(prompts)] if isinstance(value, list) else [name] * prompts
        return list(zip(per_prompt(value, prompts, name), names))

    out = []
    for (salt, salt_name), (key, key_name), (hidden, hidden_name) in zip(*map(column, NATIVE_FIELDS)):
        salt = parse_cache_salt(salt, salt_name)
        if key is not None:
            key = parse_cache_salt(key, key_name)
            if salt is not None and key != salt:
                raise FieldError(key_name, f"{key_name} and {salt_name} name the same thing: give one (or equal "
                                           "values)")
            salt = key
        out.append(RequestExtras(salt, parse_return_hidden_states(hidden, limits, hidden_name)))
    return out
