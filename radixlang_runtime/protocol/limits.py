"""What a request may ask for, checked before it reaches the scheduler (torch-free).

The in-process Engine and the server's TokenizerManager run the same checks, so a bad request gets
the same ValueError (HTTP 400) on both paths instead of reaching the scheduler.

The field checkers below (need_int, need_bool, need_float, need_str, need_int_list) are the one type
check of request fields (native /generate, OpenAI routes, /pin_prefix, the ZeroMQ frontend, the
Engine). Their rules: a boolean is a bool (not "no", not 0); an integer is an int that is not a bool
(Python's True is an int) and fits int64 unless the field says less (msgpack packs no more); a number
is finite; each raises FieldError naming the field and what it takes (HTTP 400, `param` = the field).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from radixlang_runtime.protocol.sampling_params import SamplingParams

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# What one request body may hold (README "Limits"); the body size itself is --max-request-body-bytes.
MAX_JSON_DEPTH = 64  # nesting of arrays / objects in a JSON body
MAX_N = 64  # samples per prompt (native sampling_params.n, OpenAI n)
MAX_BATCH = 1024  # runtime requests one body fans out into (prompts x n)
MAX_RID_LEN = 256  # characters of a request id
MAX_PIN_TTL_S = 86400.0  # a prefix pin's longest ttl_s (a day): a pin cannot block /flush_cache for ever
MAX_STOP_STRINGS = 16  # entries of `stop` (their length and stop_regex's limits: stop_regex.py)
MAX_STOP_TOKEN_IDS = 1024  # entries of `stop_token_ids`
MAX_LOGIT_BIAS = 1024  # entries of `logit_bias` (OpenAI's chat API takes up to 300)
MAX_ALLOWED_TOKEN_IDS = 1 << 20  # entries of `allowed_token_ids` (beyond any vocabulary)
MAX_BAD_WORDS = 128  # entries of `bad_words`


class FieldError(ValueError):
    """A request field is wrong: HTTP 400 with `param` = the field."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def show(value: Any, width: int = 60) -> str:
    """A short rendering of a bad value for an error message (never the whole 10 MB string)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (list, dict, str)) and len(value) > width:
        kind = type(value).__name__
        return f"a {kind} of length {len(value)}"
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def need_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise FieldError(name, f"{name} must be a boolean (true or false), got {show(value)}")
    return value


def need_int(value: Any, name: str, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(name, f"{name} must be an integer, got {show(value)}")
    if not lo <= value <= hi:
        raise FieldError(name, f"{name} must be an integer {_int_range(lo, hi)}, got {show(value)}")
    return value


def _int_range(lo: int, hi: int) -> str:
    if hi == INT64_MAX:
        return "in int64 range (-2^63 .. 2^63-1)" if lo == INT64_MIN else f">= {lo} (at most 2^63-1)"
    return f"in [{lo}, {hi}]"


def need_float(value: Any, name: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    """A finite number in [lo, hi] (an int is taken as a float), returned as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(name, f"{name} must be a number, got {show(value)}")
    try:
        f = float(value)
    except OverflowError:  # an int beyond any double
        f = math.inf
    if not math.isfinite(f):
        raise FieldError(name, f"{name} must be a finite number, got {show(value)}")
    if not lo <= f <= hi:
        raise FieldError(name, f"{name} must be in [{lo:g}, {hi:g}], got {show(value)}")
    return f


def need_str(value: Any, name: str, max_len: Optional[int] = None) -> str:
    """A str that is valid Unicode (no lone surrogate: it must encode as UTF-8), at most max_len chars."""
    if not isinstance(value, str):
        raise FieldError(name, f"{name} must be a string, got {show(value)}")
    if max_len is not None and len(value) > max_len:
        raise FieldError(name, f"{name} must be at most {max_len} characters, got {len(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise FieldError(name, f"{name} is not valid Unicode: a lone surrogate at position {e.start}") from None
    return value


TRUNCATION_SIDES = ("left", "right")


@dataclass(frozen=True)
class Truncation:
    """vLLM's truncate_prompt_tokens with its truncation_side: a longer prompt keeps `keep` tokens, its last
    ("left", the default: the start is cut) or its first ("right")."""

    keep: int
    side: str = "left"

    def cut(self, ids: list[int]) -> list[int]:
        if len(ids) <= self.keep:
            return ids
        return ids[len(ids) - self.keep:] if self.side == "left" else ids[:self.keep]


def parse_truncation(body: dict, context_len: int) -> Optional[Truncation]:
    """A body's truncate_prompt_tokens (generation and pooling routes): k >= 1 keeps k prompt tokens, -1 the
    context length's worth; truncation_side picks which (left: the last, right: the first; it changes nothing
    without truncate_prompt_tokens, as in vLLM). None: not set."""
    side = body.get("truncation_side")
    if side is not None and side not in TRUNCATION_SIDES:
        raise FieldError("truncation_side", f"truncation_side must be \"left\" (keep the last tokens) or \"right\" "
                                            f"(keep the first), got {show(side)}")
    value = body.get("truncate_prompt_tokens")
    if value is None:
        return None
    k = need_int(value, "truncate_prompt_tokens", -1, context_len)
    if k == 0:
        raise FieldError("truncate_prompt_tokens", "truncate_prompt_tokens must be -1 (the context length) or a "
                                                   f"number of tokens in [1, {context_len}], got 0")
    return Truncation(context_len if k == -1 else k, side or "left")


def need_int_list(value: Any, name: str, lo: int = INT64_MIN, hi: int = INT64_MAX,
                  max_len: Optional[int] = None) -> list[int]:
    """A list of ints in [lo, hi] (no bools), at most max_len entries."""
    if not isinstance(value, list):
        raise FieldError(name, f"{name} must be a list of integers, got {show(value)}")
    if max_len is not None and len(value) > max_len:
        raise FieldError(name, f"{name} may hold at most {max_len} entries, got {len(value)}")
    if all(type(t) is int and lo <= t <= hi for t in value):  # the common case, one pass
        return value
    for i, t in enumerate(value):
        need_int(t, f"{name}[{i}]", lo, hi)
    return value


def per_prompt(value: Any, prompts: int, name: str) -> list:
    """A field of a batch body given once for every prompt or as a list of one entry per prompt -> one entry per
    prompt; a list of another length is a FieldError naming the field and both lengths."""
    if isinstance(value, list):
        if len(value) != prompts:
            raise FieldError(name, f"{name} has {len(value)} entries for {prompts} prompts")
        return value
    return [value] * prompts


@dataclass(frozen=True)
class RuntimeLimits:
    context_len: int
    vocab_size: int
    num_slots: int  # KV pool size in tokens
    grammar: bool = True  # constrained decoding available (--grammar-backend other than none)
    grammar_backend: str = "auto"  # constrained/backends.py: which grammar kinds are accepted (auto: all)
    disaggregation_mode: str = "null"  # PD: prefill / decode servers need the router's bootstrap fields
    is_embedding: bool = False  # a pooling model (--is-embedding): only pooling requests (pooling_input.py)
    disaggregation_prefill_peers: tuple = ()  # PD decode: the (host, port) bootstraps it may name (empty: any)
    lora_adapters: tuple[str, ...] = ()  # the LoRA adapters' names in id order (lora_spec.py: id = index + 1)
    priority_scheduling: bool = False  # --enable-priority-scheduling: requests may carry a `priority`
    # the OpenAI-shaped routes' defaults for unset sampling fields, (name, value) pairs (sampling_defaults.py)
    sampling_defaults: tuple = ()
    reasoning_parser: str = ""  # --reasoning-parser ("": none)
    thinking_markers: tuple = ()  # its markers' token ids, ThinkingMarkers.to_wire (empty: none; reasoning_watch.py)
    speculative: bool = False  # --speculative-algorithm is set
    hidden_states: bool = False  # --enable-return-hidden-states: requests may ask return_hidden_states
    # --override-generation-config's max_new_tokens: the OpenAI-shaped routes' ceiling on max tokens, a request's
    # own count included (vLLM's override_max_tokens; sampling_defaults.max_tokens_cap); None: no ceiling
    max_tokens_cap: Optional[int] = None
    # image input (multimodal/image_prep.py): the placeholder token, the positions an image (a tile, for tiles) fills
    # and the pixel values' shape [channels, height, width] its vision tower takes (0 / (): a grid image, sized by
    # itself); -1 / 0 / (): a text-only model
    image_token_id: int = -1
    image_tokens: int = 0
    image_shape: tuple = ()
    image_unit: int = 0  # a grid image's side step in pixels (Mistral3: patch x merge); 0: fixed-size images
    image_layout: str = ""  # multimodal/vision_spec.VisionSpec.layout: fixed | grid | tiles | patches ("": text)
    image_merge: int = 1  # patches: merge x merge patches one feature (Qwen2.5-VL's spatial_merge_size)

    def room_after(self, prompt_len: int) -> int:
        """The tokens a prompt of this length leaves to generate: within the context and the KV pool (>= 0)."""
        return max(min(self.context_len, self.num_slots) - prompt_len, 0)


def check_request(ids: list[int], sp: "SamplingParams", limits: RuntimeLimits, ids_name: str = "input_ids",
                  pooling: bool = False, chat_watch: Any = None) -> None:
    """ids_name: the request field the ids came from (OpenAI's `prompt`), for the error; pooling: a pooling
    request (the only kind a --is-embedding server runs); chat_watch: a chat request's ChatWatch (its grammar
    held until the reasoning ends, where its output begins: reasoning_watch.py)."""
    if limits.is_embedding and not pooling:
        raise ValueError("this server runs a pooling model (--is-embedding, or a sequence classifier): it serves "
                         "the pooling routes (/v1/embeddings, /encode, /classify, /v1/score, /v1/rerank), not text "
                         "generation")
    if not ids:
        raise ValueError("the prompt is empty (no tokens)")
    # The length first: it bounds the per-token check below by the context length.
    if len(ids) + sp.max_new_tokens > limits.context_len:
        raise ValueError(
            f"prompt ({len(ids)} tokens) + max_new_tokens ({sp.max_new_tokens}) exceeds the context length "
            f"{limits.context_len}"
        )
    if len(ids) + sp.max_new_tokens > limits.num_slots:
        raise ValueError(
            f"prompt + max_new_tokens ({len(ids) + sp.max_new_tokens}) exceeds the KV pool "
            f"({limits.num_slots} tokens); raise --max-total-tokens"
        )
    if not all(type(t) is int and 0 <= t < limits.vocab_size for t in ids):
        raise FieldError(ids_name, f"{ids_name} must be token ids: integers in [0, {limits.vocab_size})")
    sp.check_vocab(limits.vocab_size)
    if sp.constrained and not limits.grammar:
        raise ValueError("regex / json_schema / ebnf / structural_tag need a grammar backend: the server runs with "
                         "--grammar-backend none")
    if sp.constrained:
        from radixlang_runtime.constrained.backends import refuse_unsupported

        refuse_unsupported(limits.grammar_backend, sp.grammar_kind)  # ebnf on outlines: a 400 naming both
    if limits.thinking_markers or sp.thinking_token_budget is not None:
        from radixlang_runtime.protocol.reasoning_watch import request_watch

        sp.reasoning_watch = request_watch(ids, sp.thinking_token_budget, sp.constrained, chat_watch, limits)
