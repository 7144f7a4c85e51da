"""A request's asks beside its prompt and sampling (torch-free), parsed once at every entrance:
- `cache_salt` (vLLM's field; SGLang's GenerateReqInput calls it `extra_key`, taken too): a non-empty string;
  the request reads and writes the prefix cache only in that salt's namespace (mem/cache_namespace.py);
- `return_hidden_states` (SGLang's): a boolean; the final layer's hidden states come back in
  meta_info.hidden_states (scheduler/hidden_states.py), on a server started with --enable-return-hidden-states.
Every problem is a FieldError naming the field (HTTP 400).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from radixlang_runtime.protocol.limits import FieldError, RuntimeLimits, need_bool, need_str

MAX_SALT_LEN = 1024  # characters of a cache_salt


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


def parse_return_hidden_states(value: Any, limits: RuntimeLimits) -> bool:
    """SGLang's `return_hidden_states` (None: false); true on a server without --enable-return-hidden-states
    is refused naming the flag."""
    if value is None or not need_bool(value, "return_hidden_states"):
        return False
    if not limits.hidden_states:
        raise FieldError("return_hidden_states",
                         "return_hidden_states needs a server started with --enable-return-hidden-states")
    return True


def parse_extras(body: dict, limits: RuntimeLimits, extra_key: bool = False,
                 stream_hidden: bool = True) -> RequestExtras:
    """The fields of a body; extra_key: the native body, where SGLang's name for the salt is taken too (both
    given must agree); stream_hidden false: a streamed request's return_hidden_states is refused (the OpenAI
    routes return them on the non-streamed reply only)."""
    salt = parse_cache_salt(body.get("cache_salt"))
    if extra_key and body.get("extra_key") is not None:
        key = parse_cache_salt(body["extra_key"], "extra_key")
        if salt is not None and key != salt:
            raise FieldError("extra_key", "extra_key and cache_salt name the same thing: give one (or equal values)")
        salt = key
    hidden = parse_return_hidden_states(body.get("return_hidden_states"), limits)
    if hidden and not stream_hidden:
        raise FieldError("return_hidden_states", "return_hidden_states is returned on non-streamed replies of this "
                                                 "route only (stream: false; /generate streams them)")
    return RequestExtras(salt, hidden)
