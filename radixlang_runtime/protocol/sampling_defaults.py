"""The model's own sampling defaults: generation_config.json's temperature, top_p, top_k, min_p and
repetition_penalty, which the OpenAI-shaped routes (chat, completions, and through the chat route Responses and
Anthropic Messages) use where a request leaves the field unset (SGLang's `--sampling-defaults model`, its default;
vLLM's `--generation-config auto`). `--sampling-defaults openai` keeps the API's own defaults (temperature 1,
top_p 1, no top_k / min_p / repetition penalty). Native /generate, the DSL and the Engine take their sampling
params as sent.

An explicit `"do_sample": false` makes the default greedy (temperature 0; repetition_penalty kept, as transformers
applies it under greedy search too); transformers' `top_k: 0` (off) is -1 here. A value SamplingParams refuses
fails the server's start naming the file, rather than every request later. Torch-free.
"""

from __future__ import annotations

import json
import os
from typing import Any

from radixlang_runtime.protocol.sampling_params import SamplingParams

SAMPLING_DEFAULTS_MODES = ("model", "openai")
MODEL_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def sampling_defaults(model_dir: str, mode: str = "model") -> dict[str, Any]:
    """The defaults the model's generation_config.json asks for ({} without the file, or in mode "openai")."""
    if mode not in SAMPLING_DEFAULTS_MODES:
        raise ValueError(f"sampling_defaults must be one of {', '.join(SAMPLING_DEFAULTS_MODES)}; got {mode!r}")
    path = os.path.join(model_dir, "generation_config.json")
    if mode == "openai" or not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} cannot be read ({e}); start with --sampling-defaults openai to do without "
                         "it") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path} is not a JSON object; start with --sampling-defaults openai to do without it")
    out = {k: cfg[k] for k in MODEL_SAMPLING_FIELDS if cfg.get(k) is not None}
    if out.get("top_k") == 0:
        out["top_k"] = -1
    if cfg.get("do_sample") is False:
        out = {"temperature": 0.0, **{k: v for k, v in out.items() if k == "repetition_penalty"}}
    try:
        SamplingParams.from_dict(dict(out))
    except ValueError as e:
        raise ValueError(f"{path}: {e}; start with --sampling-defaults openai to leave the model's sampling "
                         "defaults out") from None
    return out
