"""Which LoRA adapters a server serves and how a request names one (torch-free).

`--lora-paths name=path ...` (SGLang's flag) gives each adapter a name; the adapters are numbered 1, 2, ...
in the order given (0 is the base model). The number is the adapter's identity everywhere below the intake:
the request message carries it, the runner keys its weights by it and the radix cache keys its prefixes
by it (scheduler/request.Req.cache_ids), so a prefix computed under one adapter is never served to another.

A request names an adapter by:
- native /generate and the Engine: `lora_path` = the adapter's name (SGLang's field);
- OpenAI routes: `model` = "<served model>:<adapter>" (SGLang) or the adapter's bare name (vLLM).
An unknown name raises LoraNotFound (HTTP 404 naming it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence


class LoraNotFound(ValueError):
    """A request named an adapter this server does not serve (native routes: 400 on `lora_path`; OpenAI routes
    answer 404 model_not_found)."""

    param = "lora_path"


@dataclass(frozen=True)
class LoraSpec:
    name: str
    path: str
    lora_id: int  # 1, 2, ... in --lora-paths order


def parse_lora_paths(entries: Optional[list[str]]) -> list[LoraSpec]:
    """`name=path` entries (a bare path is named after its last directory) -> numbered specs."""
    out: list[LoraSpec] = []
    for i, entry in enumerate(entries or []):
        if not isinstance(entry, str) or not entry:
            raise ValueError(f"lora_paths entry {entry!r}: expected name=path")
        name, sep, path = entry.partition("=")
        if not sep:
            path, name = entry, entry.rstrip("/").rsplit("/", 1)[-1]
        if not name or not path or ":" in name:
            raise ValueError(f"lora_paths entry {entry!r}: expected name=path with a non-empty name without ':'")
        if any(s.name == name for s in out):
            raise ValueError(f"lora_paths: adapter name {name!r} given twice")
        out.append(LoraSpec(name, path, i + 1))
    return out


def lora_id_of(name: Optional[str], adapters: Sequence[Optional[str]]) -> int:
    """A native `lora_path` -> the adapter's id (None: the base model, 0). adapters: the names in id order
    (RuntimeLimits.lora_adapters; None where an adapter was unloaded: ids are never reused)."""
    if name is None:
        return 0
    if not isinstance(name, str):
        raise ValueError(f"lora_path must be an adapter's name (a string); got {name!r}")
    if name not in adapters:
        known = ", ".join(a for a in adapters if a is not None) or "none (start the server with --lora-paths name=path)"
        raise LoraNotFound(f"LoRA adapter {name!r} is not loaded; loaded adapters: {known}")
    return list(adapters).index(name) + 1


def lora_id_of_model(model: Optional[str], served: str, adapters: Sequence[Optional[str]]) -> Optional[int]:
    """An OpenAI `model`: "<served>:<adapter>" (SGLang) or a bare adapter name (vLLM) -> its id; None when the
    model names no adapter (the route's own model check decides). "<served>:<unknown>" raises LoraNotFound."""
    if not model or not isinstance(model, str):
        return None
    if model in adapters:
        return list(adapters).index(model) + 1
    base, sep, adapter = model.rpartition(":")
    if sep and base == served:
        return lora_id_of(adapter, adapters)
    return None

LORA_BACKENDS = ("csgmv", "torch_native", "triton")  # SGLang's --lora-backend names that apply here


def check_lora_args(args: Any) -> None:
    """ServerArgs' LoRA settings: what the runtime would not honour is refused by name (docs/LORA.md)."""
    if isinstance(args.lora_paths, str):
        args.lora_paths = [args.lora_paths]
    if args.lora_paths and not args.enable_lora:
        args.enable_lora = True  # SGLang: --lora-paths implies --enable-lora
    parse_lora_paths(args.lora_paths)  # names checked here, adapters read by the runner
    if args.max_lora_rank is not None and args.max_lora_rank < 1:
        raise ValueError(f"max_lora_rank must be >= 1; got {args.max_lora_rank}")
    if args.max_loras_per_batch < 1:
        raise ValueError(f"max_loras_per_batch must be >= 1; got {args.max_loras_per_batch}")
    if args.lora_backend not in LORA_BACKENDS:
        raise ValueError(f"lora_backend must be one of {', '.join(LORA_BACKENDS)}; got {args.lora_backend!r}")
    if args.max_loaded_loras is not None:
        if not args.enable_lora:
            raise ValueError("max_loaded_loras needs enable_lora (or lora_paths)")
        if args.max_loaded_loras < args.max_loras_per_batch:
            raise ValueError(f"max_loaded_loras ({args.max_loaded_loras}) must be >= max_loras_per_batch "
                             f"({args.max_loras_per_batch}): a batch's adapters are resident together")
    if not args.enable_lora:
        return
    for name, on in (("dp_size > 1", args.dp_size > 1),
                     ("model_impl transformers", args.model_impl == "transformers"),
                     ("speculative_algorithm " + str(args.speculative_algorithm),
                      args.speculative_algorithm not in (None, "NGRAM"))):
        if on:
            raise ValueError(f"{name} with enable_lora is not implemented")
