"""The model's sampling defaults: generation_config.json's temperature, top_p, top_k, min_p, repetition_penalty
and max_new_tokens, which the OpenAI-shaped routes (chat, completions, and through the chat route Responses and
Anthropic Messages) use where a request leaves the field unset (SGLang's `--sampling-defaults model`, its default;
vLLM's `--generation-config auto`). max_new_tokens stands in for an unset max_tokens / max_completion_tokens
(Responses' max_output_tokens), as vLLM takes it; the file's value leaves a request's own count alone, while
`--override-generation-config`'s max_new_tokens is also a ceiling that lowers a request's larger count
(max_tokens_cap: vLLM's override_max_tokens under --generation-config auto / vllm, on chat, completions and
Responses). `--sampling-defaults openai` keeps the API's own defaults
(temperature 1, top_p 1, no top_k / min_p / repetition penalty, max_tokens what the route gives).
`--override-generation-config` (vLLM's flag: a JSON object of those fields) is merged over the file's values, with
or without the file and in either mode; a null there drops the file's value. Native /generate, the DSL and the
Engine take their sampling params as sent.

An explicit `"do_sample": false` makes the default greedy (temperature 0; repetition_penalty kept, as transformers
applies it under greedy search too); transformers' `top_k: 0` (off) is -1 here. A value the runtime refuses fails
the server's start naming the file or the flag, rather than every request later. Torch-free.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional

from radixlang_runtime.protocol.sampling_params import SamplingParams

SAMPLING_DEFAULTS_MODES = ("model", "openai")
MODEL_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
GENERATION_CONFIG_FIELDS = (*MODEL_SAMPLING_FIELDS, "max_new_tokens")  # what the server honours
OVERRIDE_FLAG = "--override-generation-config"


def sampling_defaults(model_dir: str, mode: str = "model", override: Any = None) -> dict[str, Any]:
    """The defaults the model's generation_config.json asks for ({} without the file, or in mode "openai"), with
    the override (a JSON object's text or a dict, --override-generation-config) merged over them."""
    if mode not in SAMPLING_DEFAULTS_MODES:
        raise ValueError(f"sampling_defaults must be one of {', '.join(SAMPLING_DEFAULTS_MODES)}; got {mode!r}")
    extra = parse_override(override)
    path = os.path.join(model_dir, "generation_config.json")
    found = _from_file(path) if mode == "model" and os.path.isfile(path) else {}
    merged = {**found, **extra}
    return {k: v for k, v in merged.items() if v is not None}


def _from_file(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} cannot be read ({e}); start with --sampling-defaults openai to do without "
                         "it") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path} is not a JSON object; start with --sampling-defaults openai to do without it")
    out = {k: cfg[k] for k in GENERATION_CONFIG_FIELDS if cfg.get(k) is not None}
    if cfg.get("do_sample") is False:
        out = {"temperature": 0.0, **{k: v for k, v in out.items() if k in ("repetition_penalty", "max_new_tokens")}}
    return _checked(out, f"{path}: ", "; start with --sampling-defaults openai to leave the model's sampling "
                                      "defaults out")


def parse_override(raw: Any) -> dict[str, Any]:
    """--override-generation-config: {} when unset; else its fields checked (unknown keys refused by name, a
    value the runtime refuses named with the flag), top_k 0 as -1, nulls kept (they drop the file's value)."""
    if raw is None:
        return {}
    cfg = raw
    if isinstance(raw, str):
        try:
            cfg = json.loads(raw)
        except ValueError as e:
            raise ValueError(f"{OVERRIDE_FLAG} must be a JSON object: {e}") from None
    if not isinstance(cfg, Mapping):
        raise ValueError(f'{OVERRIDE_FLAG} must be a JSON object such as {{"temperature": 0.5, "max_new_tokens": '
                         f'64}}; got {raw!r}')
    unknown = sorted(set(cfg) - set(GENERATION_CONFIG_FIELDS))
    if unknown:
        raise ValueError(f"{OVERRIDE_FLAG}: unknown key(s) {', '.join(map(repr, unknown))} (known: "
                         f"{', '.join(GENERATION_CONFIG_FIELDS)})")
    given = _checked({k: v for k, v in cfg.items() if v is not None}, f"{OVERRIDE_FLAG}: ", "")
    return {**{k: None for k, v in cfg.items() if v is None}, **given}


def _checked(values: dict[str, Any], prefix: str, advice: str) -> dict[str, Any]:
    """values as the runtime takes them (top_k 0 -> -1), or ValueError: prefix + what SamplingParams says + advice."""
    out = {**values, "top_k": -1} if values.get("top_k") == 0 else dict(values)
    n = out.get("max_new_tokens")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"{prefix}max_new_tokens must be an integer >= 1, got {n!r}{advice}")
    try:
        SamplingParams.from_dict(dict(out))
    except ValueError as e:
        raise ValueError(f"{prefix}{e}{advice}") from None
    return out


def max_tokens_cap(override: Any) -> Optional[int]:
    """--override-generation-config's max_new_tokens (None: unset or null): the most tokens a request of the
    OpenAI-shaped routes runs, whatever max tokens it asks for."""
    return parse_override(override).get("max_new_tokens")


def check_sampling_defaults_args(args: Any) -> None:
    """ServerArgs' --sampling-defaults and --override-generation-config, checked at start (ValueError)."""
    if args.sampling_defaults not in SAMPLING_DEFAULTS_MODES:
        raise ValueError(f"sampling_defaults must be model or openai; got {args.sampling_defaults!r}")
    parse_override(args.override_generation_config)
