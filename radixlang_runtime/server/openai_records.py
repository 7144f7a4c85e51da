"""The OpenAI generate bodies, parsed once into typed records: CompletionRequest (/v1/completions) and
ChatRequest (/v1/chat/completions; also what /v1/responses and /v1/messages translate into).

Parsing is the whole check: fields are strict (ROUTE_FIELDS: an unknown one answers 400 naming it), options
the runtime cannot honour yet (best_of, functions, ...: OFF_VALUES) answer 400 unless null or off,
informational ones (user, metadata, store) are taken and change nothing, as do the hints the SDKs send by
default (verbosity, reasoning_effort: openai_hints.py); a `model` other than the served name, "default" or a
LoRA adapter ("<served>:<adapter>" or the adapter's bare name, lora_spec.py) is ModelNotFound (404); SGLang's
`lora_path` names an adapter too. A completion's `suffix` (fill-in-the-middle) needs the server's FIM template
(fim_templates.py), a text prompt, and neither echo nor truncate_prompt_tokens. Every
error is a FieldError / BadRequest naming the field (HTTP 400 in OpenAI's error shape). The records are
frozen; the intake (openai_intake.py) reads them and never the body again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, Optional, Union

from radixlang_runtime.constrained.spec import GrammarSpec, spec_from_response_format, spec_from_structured_outputs
from radixlang_runtime.fim_templates import no_fim_message
from radixlang_runtime.lora_spec import LoraNotFound, lora_id_of, lora_id_of_model
from radixlang_runtime.protocol.generate_input import BOOTSTRAP_FIELDS, Bootstrap, parse_bootstrap, parse_priority
from radixlang_runtime.protocol.limits import (MAX_N, MAX_RID_LEN, FieldError, Truncation, need_bool, need_int,
                                               need_str, parse_truncation, show)
from radixlang_runtime.protocol.pooling_input import prompts_of
from radixlang_runtime.protocol.request_extras import RequestExtras, parse_extras
from radixlang_runtime.server.chat_render import TurnEnd, template_kwargs, turn_end
from radixlang_runtime.server.http_common import BadRequest, ServerState
from radixlang_runtime.server.openai_hints import HINT_VALUES, check_hints
from radixlang_runtime.server.openai_reasoning import ReasoningPlan, reasoning_plan
from radixlang_runtime.server.openai_tools import ToolPlan, check_tools

EXTENSIONS = ("top_k", "min_p", "repetition_penalty", "ignore_eos", "stop_token_ids", "skip_special_tokens",
              "no_stop_trim", "regex", "json_schema", "ebnf")
# vLLM's names: a grammar, no_stop_trim; allowed_token_ids, bad_words and thinking_token_budget pass as the native
# fields of those names
VLLM_FIELDS = ("structured_outputs", "include_stop_str_in_output", "allowed_token_ids", "bad_words",
               "thinking_token_budget")
_SAMPLING_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "stop", "seed", "max_tokens",
                    "min_tokens", "response_format", "logit_bias", *EXTENSIONS, *VLLM_FIELDS)
_INFORMATIONAL = ("user", "metadata", "store", "safety_identifier", "prompt_cache_key")  # taken; change no output
# Not implemented: taken only null or at the value that leaves them off, else 400 naming them.
OFF_VALUES: dict[str, tuple] = {
    "best_of": (1,), "functions": ([],), "function_call": ("none", "auto"),
    "modalities": (["text"],), "audio": (), "prediction": (), "web_search_options": (),
    "service_tier": ("auto", "default"),
}
_COMMON = {"model", "n", "stream", "stream_options", "priority", "lora_path", "truncate_prompt_tokens", "rid",
           "truncation_side",
           "return_tokens_as_token_ids", "prompt_logprobs", "cache_salt", "return_hidden_states",
           *_SAMPLING_FIELDS, *_INFORMATIONAL,
           *BOOTSTRAP_FIELDS}  # PD: the router's fields (generate_input.parse_bootstrap)
ROUTE_FIELDS = {  # every field a route knows; any other answers 400 naming it
    "/v1/completions": {*_COMMON, "prompt", "echo", "logprobs", "best_of", "suffix"},
    "/v1/chat/completions": {*_COMMON, "messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools",
                             "tool_choice", "parallel_tool_calls", "separate_reasoning", "stream_reasoning",
                             "chat_template_kwargs", "reasoning_effort",  # chat_render.template_kwargs
                             "add_generation_prompt", "continue_final_message",  # chat_render.turn_end
                             *HINT_VALUES, *(set(OFF_VALUES) - {"best_of"})},
}
MODEL_ALIASES = ("default",)  # besides the served model name; a missing `model` is taken too
MAX_LOGPROBS = 20  # OpenAI's cap of logprobs (completions) / top_logprobs (chat)
COMPLETION_MAX_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions


class ModelNotFound(LookupError):
    """An unknown `model`: 404 with OpenAI's code "model_not_found"."""


@dataclass(frozen=True)
class OpenAIOptions:
    """What both generate routes share, checked."""

    n: int
    stream: bool
    include_usage: bool  # stream_options.include_usage
    lora_id: int  # the adapter `model` names (0: the base model)
    bootstrap: Optional[Bootstrap]  # PD: the router's fields
    sampling: Mapping[str, Any]  # native sampling_params names (SamplingParams validates values), no max_new_tokens
    max_tokens: Optional[int]  # max_completion_tokens / max_tokens; None: the model's default, else the route's
    priority: int = 0  # --enable-priority-scheduling (generate_input.parse_priority)
    truncate_prompt_tokens: Optional[Truncation] = None  # vLLM's, with truncation_side (None: the whole prompt)
    token_ids_in_logprobs: bool = False  # vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:N"
    # vLLM's stream_options.continuous_usage_stats (with include_usage): every chunk carries its choice's usage
    continuous_usage: bool = False
    # SGLang's `rid`: the response's id and the runtime request id of a single choice (/abort_request names it);
    # several choices run as f"{rid}-{index}"
    rid: Optional[str] = None
    # vLLM's prompt_logprobs: per prompt token its logprob and rank plus this many top alternatives (None: off)
    prompt_logprobs: Optional[int] = None
    extras: RequestExtras = RequestExtras()  # cache_salt, SGLang's return_hidden_states (request_extras.py)
    # the model's default max tokens (--sampling-defaults model: generation_config.json's max_new_tokens, or
    # --override-generation-config's); None: the route's default
    model_max_tokens: Optional[int] = None
    # --override-generation-config's max_new_tokens: the most tokens any choice runs, its own max tokens included
    # (RuntimeLimits.max_tokens_cap); None: no ceiling
    max_tokens_cap: Optional[int] = None

    def truncated(self, ids: list[int]) -> list[int]:
        """A tokenized prompt cut to truncate_prompt_tokens tokens (its last unless truncation_side is right)."""
        t = self.truncate_prompt_tokens
        return ids if t is None else t.cut(ids)

    def sampling_params(self, default_max_tokens: int, room: int, **extra: Any) -> dict[str, Any]:
        """The native sampling_params of every choice (a fresh dict; the record stays as parsed). max_new_tokens:
        the request's own, else the model's default capped at room (what the context and the KV pool leave after
        the prompt), else the route's default_max_tokens; then at most max_tokens_cap (vLLM's get_max_tokens:
        the override's max_new_tokens lowers a larger count, the request's own too)."""
        mt = self.max_tokens
        if mt is None:
            mt = default_max_tokens if self.model_max_tokens is None else min(self.model_max_tokens, room)
        if self.max_tokens_cap is not None:
            mt = min(mt, self.max_tokens_cap)
        return {**self.sampling, "max_new_tokens": mt, **extra}


@dataclass(frozen=True)
class CompletionRequest:
    options: OpenAIOptions
    prompts: tuple[Union[str, list[int]], ...]  # one per prompt: its text or its token ids
    echo: bool
    logprobs: Optional[int]  # top logprobs per token (0..MAX_LOGPROBS); None: none
    suffix: Optional[str] = None  # fill-in-the-middle: the text after the middle (None: absent or "")


@dataclass(frozen=True)
class ChatRequest:
    options: OpenAIOptions
    messages: Any  # checked while rendered (chat_render.py: roles, content parts)
    tools: ToolPlan  # tools / tool_choice / parallel_tool_calls (its parser set by the intake)
    template_vars: Mapping[str, Any]  # chat_template_kwargs + reasoning_effort
    turn: TurnEnd  # add_generation_prompt / continue_final_message
    think: Optional[ReasoningPlan]  # --reasoning-parser's split (None: off, or separate_reasoning false)
    logprobs: bool
    top_logprobs: Optional[int]


def _opt(body: dict, name: str, default: Any) -> Any:
    v = body.get(name, default)
    return default if v is None else v


def sampling_fields(body: dict, defaults: Mapping[str, Any] = MappingProxyType({})) -> tuple[dict[str, Any],
                                                                                             Optional[int]]:
    """OpenAI sampling fields -> (native sampling_params without max_new_tokens, the max tokens asked or None).
    Fields whose names differ are checked here under their OpenAI (or vLLM) names; SamplingParams checks the
    rest. A constraint comes from one of response_format, structured_outputs, regex / json_schema / ebnf.
    defaults: what an unset temperature / top_p / top_k / min_p / repetition_penalty takes (--sampling-defaults
    model: the model's generation_config.json; else the API's own)."""
    specs = [(name, spec) for name, spec in (
        ("response_format", spec_from_response_format(body.get("response_format"))),  # ValueError (400) naming it
        ("structured_outputs", _field_spec(body, "structured_outputs"))) if spec is not None]
    max_tokens, name = body.get("max_completion_tokens"), "max_completion_tokens"
    if max_tokens is None:
        max_tokens, name = body.get("max_tokens"), "max_tokens"
    sp: dict[str, Any] = {
        "min_new_tokens": need_int(_opt(body, "min_tokens", 0), "min_tokens", 0),
        "temperature": _opt(body, "temperature", defaults.get("temperature", 1.0)),
        "top_p": _opt(body, "top_p", defaults.get("top_p", 1.0)),
        "presence_penalty": _opt(body, "presence_penalty", 0.0),
        "frequency_penalty": _opt(body, "frequency_penalty", 0.0),
        "stop": body.get("stop"),
        "sampling_seed": None if body.get("seed") is None else need_int(body["seed"], "seed"),
        "logit_bias": body.get("logit_bias"),  # {"token id": bias}: SamplingParams checks it (param logit_bias)
    }
    for name in ("allowed_token_ids", "bad_words", "thinking_token_budget"):  # SamplingParams checks them
        if body.get(name) is not None:
            sp[name] = body[name]
    for ext in EXTENSIONS:
        if body.get(ext) is not None:
            sp[ext] = body[ext]
        elif ext in defaults:  # top_k, min_p, repetition_penalty
            sp[ext] = defaults[ext]
    for field_name, spec in specs:  # the same grammar path as the native fields
        if len(specs) > 1 or any(sp.get(k) is not None for k in ("regex", "json_schema", "ebnf")):
            raise FieldError(field_name, f"pass one of response_format, structured_outputs or regex / json_schema / "
                                         f"ebnf, not {field_name} with another")
        sp[spec.kind] = spec.source
    if body.get("include_stop_str_in_output") is not None:
        keep = need_bool(body["include_stop_str_in_output"], "include_stop_str_in_output")
        if body.get("no_stop_trim") is not None and body["no_stop_trim"] != keep:
            raise FieldError("include_stop_str_in_output", "include_stop_str_in_output and no_stop_trim disagree "
                                                           "(the same switch under vLLM's and SGLang's names)")
        sp["no_stop_trim"] = keep
    return sp, None if max_tokens is None else need_int(max_tokens, name, 0)


def _field_spec(body: dict, name: str) -> Optional[GrammarSpec]:
    """structured_outputs -> its GrammarSpec, a ValueError as a FieldError naming the field."""
    try:
        return spec_from_structured_outputs(body.get(name))
    except ValueError as e:
        raise FieldError(name, str(e)) from None


def lora_of_model(state: ServerState, model: Any, lora_path: Any = None) -> int:
    """The LoRA adapter an OpenAI `model` names ("<served>:<adapter>" or the adapter's bare name; lora_spec.py),
    or SGLang's `lora_path` (an adapter's name) when given: its id, 0 for the base model; an unknown adapter is
    ModelNotFound (404) naming it in `model`, a 400 in `lora_path` (as on /generate), and a `model` naming another
    adapter than `lora_path` a 400."""
    adapters = state.tm.limits.lora_adapters
    try:
        got = lora_id_of_model(model, state.served_model_name, adapters) or 0
    except LoraNotFound as e:
        raise ModelNotFound(str(e)) from e
    if lora_path is None:
        return got
    try:
        named = lora_id_of(need_str(lora_path, "lora_path"), adapters)
    except LoraNotFound as e:
        raise FieldError("lora_path", str(e)) from None
    if got and got != named:
        raise FieldError("lora_path", f"lora_path {lora_path!r} and model {model!r} name different adapters")
    return named


def _options(state: ServerState, body: Any, route: str) -> OpenAIOptions:
    """The fields every OpenAI route shares: known names only, unimplemented ones off, the model served
    here, n, stream, stream_options, the PD fields and the sampling fields."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if unknown := sorted(set(body) - ROUTE_FIELDS[route]):
        raise FieldError(unknown[0], f"unknown field(s) for {route}: {', '.join(show(u, 40) for u in unknown)}")
    for name, off in OFF_VALUES.items():
        v = body.get(name)
        if v is not None and not any(type(v) is type(o) and v == o for o in off):
            allowed = f" (only {' or '.join(json.dumps(o) for o in off)})" if off else ""
            raise FieldError(name, f"{name} is not supported{allowed}, got {show(v)}")
    check_hints(body)  # verbosity, reasoning_effort, prompt_cache_retention: documented no-ops (openai_hints.py)
    model = body.get("model")
    lora_id = lora_of_model(state, model, body.get("lora_path"))
    if model is not None and need_str(model, "model") not in (state.served_model_name, *MODEL_ALIASES) \
            and lora_id == 0:
        raise ModelNotFound(f"The model {show(model)} does not exist: this server serves "
                            f"{state.served_model_name!r} (or {', '.join(map(repr, MODEL_ALIASES))})")
    n = need_int(_opt(body, "n", 1), "n", 1, MAX_N)
    stream = need_bool(_opt(body, "stream", False), "stream")
    so = _opt(body, "stream_options", {})
    if not isinstance(so, dict):
        raise FieldError("stream_options", "stream_options must be an object")
    if unknown := sorted(set(so) - {"include_usage", "continuous_usage_stats"}):
        raise FieldError("stream_options",
                         f"unknown field(s) in stream_options: {', '.join(show(u, 40) for u in unknown)}")
    include_usage = need_bool(_opt(so, "include_usage", False), "stream_options.include_usage")
    continuous = include_usage and need_bool(_opt(so, "continuous_usage_stats", False),
                                             "stream_options.continuous_usage_stats")
    limits = state.tm.limits
    bootstrap = parse_bootstrap(body, limits.disaggregation_mode, limits.disaggregation_prefill_peers)
    defaults = dict(limits.sampling_defaults)
    sampling, max_tokens = sampling_fields(body, defaults)
    return OpenAIOptions(n, stream, include_usage, lora_id, bootstrap, MappingProxyType(sampling), max_tokens,
                         parse_priority(body.get("priority"), limits),
                         parse_truncation(body, limits.context_len),
                         need_bool(_opt(body, "return_tokens_as_token_ids", False), "return_tokens_as_token_ids"),
                         continuous, _rid(body.get("rid")), _prompt_logprobs(body, stream),
                         parse_extras(body, limits, stream_hidden=not stream), defaults.get("max_new_tokens"),
                         limits.max_tokens_cap)


def _rid(rid: Any) -> Optional[str]:
    if rid is None:
        return None
    if not need_str(rid, "rid", MAX_RID_LEN):
        raise FieldError("rid", "rid must be a non-empty string")
    return rid


def _prompt_logprobs(body: dict, stream: bool) -> Optional[int]:
    """vLLM's prompt_logprobs: k in [0, MAX_LOGPROBS] top alternatives besides each prompt token; not with
    stream (vLLM refuses it there too), nor vLLM's -1 (the whole vocabulary)."""
    k = body.get("prompt_logprobs")
    if k is None:
        return None
    if k == -1 and type(k) is int:
        raise FieldError("prompt_logprobs", f"prompt_logprobs -1 (the whole vocabulary) is not supported: ask for "
                                            f"0 to {MAX_LOGPROBS} alternatives per prompt token")
    k = need_int(k, "prompt_logprobs", 0, MAX_LOGPROBS)
    if stream:
        raise FieldError("prompt_logprobs", "prompt_logprobs is not available with stream: true (the prompt's "
                                            "logprobs come with the whole answer)")
    return k


def _top(body: dict, name: str) -> Optional[int]:
    v = body.get(name)
    return None if v is None else need_int(v, name, 0, MAX_LOGPROBS)


def parse_completion(state: ServerState, body: Any) -> CompletionRequest:
    options = _options(state, body, "/v1/completions")
    prompts = tuple(prompts_of(body.get("prompt"), "prompt"))  # the one parser of OpenAI's input forms
    echo = need_bool(_opt(body, "echo", False), "echo")
    suffix = need_str(_opt(body, "suffix", ""), "suffix") or None
    if suffix is not None:
        _check_fill_in_middle(state, prompts, echo, options)
    return CompletionRequest(options, prompts, echo, _top(body, "logprobs"), suffix)


def _check_fill_in_middle(state: ServerState, prompts: tuple, echo: bool, options: OpenAIOptions) -> None:
    """A non-empty suffix: the server has a FIM template, the prompts are text, no echo (OpenAI refuses it with a
    suffix: the reply is only the middle), no truncate_prompt_tokens (it would cut the template's markers)."""
    if state.fim is None:
        raise FieldError("suffix", no_fim_message(state.tm.tokenizer))
    if echo:
        raise FieldError("echo", "echo is not supported with suffix (fill-in-the-middle answers only the middle)")
    if any(not isinstance(p, str) for p in prompts):
        raise FieldError("suffix", "suffix needs a text prompt (the prefix): token-id prompts are not taken with "
                                   "suffix; send the prefix as text")
    if options.truncate_prompt_tokens is not None:
        raise FieldError("truncate_prompt_tokens", "truncate_prompt_tokens is not supported with suffix (cutting "
                                                   "the fill-in-the-middle prompt would drop its markers)")


def parse_chat(state: ServerState, body: Any) -> ChatRequest:
    options = _options(state, body, "/v1/chat/completions")
    want_lp = need_bool(_opt(body, "logprobs", False), "logprobs")
    top = _top(body, "top_logprobs")
    if top and not want_lp:
        raise FieldError("top_logprobs", "top_logprobs needs logprobs: true")
    return ChatRequest(options, body.get("messages"), check_tools(body), MappingProxyType(template_kwargs(body)),
                       turn_end(body), reasoning_plan(state.args.reasoning_parser, body), want_lp, top)
