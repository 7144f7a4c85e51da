"""The transformers fallback's parity probe: before a checkpoint is served through transformers' modeling code
with its attention routed into the paged KV pool (models/transformers_fallback.py), the routing must compute
what transformers computes.

Two gates, both refusing by name:

- `refuse_unroutable(text_config, arch)`, on config.json before anything runs: attention the routing cannot
  represent (layer types other than full / sliding attention, e.g. Llama 4's chunked_attention; attention
  logit soft-capping; attention sinks; KV shared across layers; attention shapes set per layer, Gemma 4's
  per_layer_config; a cache_implementation that is not a plain per-layer cache);
- `run_parity_probe(...)`, at load: one short prompt (PROBE_TOKENS ids) through the first layers (every layer
  when the model is small) twice, in float32: once through the paged routing (the runtime's attention backend
  over a scratch KV pool), once through transformers' own eager attention with its own masks. Each decoder
  layer's output is compared; the first layer whose max abs difference exceeds the tolerance is refused with
  the architecture, the layer and the difference. The time it took is measured and reported (ProbeReport).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

PROBE_TOKENS = 24  # the probe prompt's length
WHOLE_MODEL_PARAMS = 50_000_000  # at most this many parameters: every layer runs in the probe; else PROBE_LAYERS
PROBE_LAYERS = 4
RTOL = 1e-4  # tolerance: RTOL * max(1, max |reference|) per layer output, in float32
ROUTED_LAYER_TYPES = ("full_attention", "sliding_attention")  # sliding: ModelConfig caps the context at the window
_SHAPES = ("head_dim", "num_key_value_heads", "num_attention_heads")  # attention shapes a per-layer config may set
PLAIN_CACHES = (None, "dynamic", "static", "hybrid", "sliding_window")  # per-layer caches of every position


@dataclass(frozen=True)
class ProbeReport:
    """What the parity probe ran and found (logged at load; the model keeps it as `probe_report`)."""

    layers: int  # decoder layers compared
    tokens: int  # the prompt's length
    max_abs_diff: float  # the largest difference over the compared layer outputs
    seconds: float  # the probe's wall time (both forwards)

    def describe(self) -> str:
        return (f"{self.layers} layers x {self.tokens} tokens in float32, max abs difference {self.max_abs_diff:.2e}, "
                f"{self.seconds * 1000:.0f} ms")


def refuse_unroutable(text: Any, arch: str) -> None:
    """transformers' text config -> ValueError naming the first attention feature the paged routing cannot run."""
    types = list(getattr(text, "layer_types", None) or [])
    for i, kind in enumerate(types):
        if kind not in ROUTED_LAYER_TYPES:
            chunk = getattr(text, "attention_chunk_size", None)
            extra = f" (attention_chunk_size {chunk})" if kind == "chunked_attention" and chunk else ""
            raise ValueError(f"{arch} cannot run with --model-impl transformers: layer {i} is {kind!r}{extra}, "
                             f"which the paged attention routing does not represent (it runs "
                             f"{' / '.join(ROUTED_LAYER_TYPES)} only)")
    for key, what in (("attn_logit_softcapping", "attention logit soft-capping"),
                      ("attention_sinks", "attention sinks"), ("num_kv_shared_layers", "KV shared across layers")):
        value = getattr(text, key, None)
        if value:
            raise ValueError(f"{arch} cannot run with --model-impl transformers: {key} {value!r} ({what}) is not "
                             "represented by the paged attention routing")
    varying = _varying_shapes(text)
    if varying:  # Gemma 4: head_dim per layer type; the pool has one shape for every layer
        raise ValueError(f"{arch} cannot run with --model-impl transformers: per_layer_config sets {varying} per "
                         "layer, which the paged KV pool (one head_dim and KV head count for every layer) does not "
                         "represent")
    cache = getattr(text, "cache_implementation", None)
    if cache not in PLAIN_CACHES:
        raise ValueError(f"{arch} cannot run with --model-impl transformers: cache_implementation {cache!r} is not a "
                         "per-layer cache of every position (the paged KV pool's layout)")


def _varying_shapes(text: Any) -> str:
    """The attention shapes (_SHAPES) a per_layer_config sets to more than one value, with the values ("" if none)."""
    per_layer = getattr(text, "per_layer_config", None) or []
    layers = list(per_layer.values()) if isinstance(per_layer, dict) else list(per_layer)

    def value(layer: Any, key: str) -> Any:
        return layer.get(key) if isinstance(layer, dict) else getattr(layer, key, None)

    values = {k: sorted({repr(value(layer, k)) for layer in layers}) for k in _SHAPES}
    return "; ".join(f"{k} {' / '.join(v)}" for k, v in values.items() if len(v) > 1)


def decoder_layers(model: nn.Module, num_layers: int) -> Optional[nn.ModuleList]:
    """The ModuleList holding the model's num_layers decoder layers (None when there is no single such list)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) == num_layers]
    return lists[0] if len(lists) == 1 else None


class _Stop(Exception):
    """Raised by the last compared layer's hook: the rest of the forward is not needed."""


def _capture(layers: nn.ModuleList, count: int, outs: list) -> list:
    def hook(index: int) -> Callable:
        def record(module: nn.Module, args: Any, output: Any) -> None:
            out = output[0] if isinstance(output, (tuple, list)) else output
            outs.append(out.detach().float().clone())
            if index == count - 1:  # the final norm and head never run (they keep the model's dtype)
                raise _Stop()
        return record
    return [layers[i].register_forward_hook(hook(i)) for i in range(count)]


def _run(forward: Callable[[], Any], layers: nn.ModuleList, count: int) -> list[torch.Tensor]:
    outs: list[torch.Tensor] = []
    handles = _capture(layers, count, outs)
    try:
        with torch.inference_mode():
            forward()
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    return outs


def run_parity_probe(hf: nn.Module, arch: str, num_layers: int, vocab_size: int,
                     routed: Callable[[torch.Tensor, torch.Tensor], Any],
                     reference: Callable[[torch.Tensor, torch.Tensor], Any]) -> ProbeReport:
    """routed(ids, positions) / reference(ids, positions): hf's forward through the paged routing / through
    transformers' eager attention. Compares the first layers' outputs in float32; ValueError on a mismatch."""
    start = time.perf_counter()
    layers = decoder_layers(hf, num_layers)
    if layers is None:
        raise ValueError(f"{arch} cannot run with --model-impl transformers: no list of its {num_layers} decoder "
                         "layers was found for the parity probe")
    params = sum(p.numel() for p in hf.parameters())
    count = num_layers if params <= WHOLE_MODEL_PARAMS else min(num_layers, PROBE_LAYERS)
    device = next(hf.parameters()).device
    ids = (torch.arange(PROBE_TOKENS, device=device) * 7919 + 13) % max(1, vocab_size - 1)
    pos = torch.arange(PROBE_TOKENS, device=device)
    embed = hf.get_input_embeddings()
    parts = [embed, *list(layers)[:count]]
    dtypes = [next(m.parameters()).dtype for m in parts]
    for m in parts:
        m.float()  # the probe's modules in float32 (a bf16 -> float32 -> bf16 round trip is exact)
    try:
        got = _run(lambda: routed(ids[None], pos[None]), layers, count)
        want = _run(lambda: reference(ids[None], pos[None]), layers, count)
    finally:
        for m, dtype in zip(parts, dtypes):
            m.to(dtype)
    if len(got) != count or len(want) != count:
        raise ValueError(f"{arch} cannot run with --model-impl transformers: the parity probe saw {len(got)} / "
                         f"{len(want)} of {count} layer outputs")
    worst = 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        diff = (g - w).abs().max().item()
        worst = max(worst, diff)
        if not diff <= RTOL * max(1.0, w.abs().max().item()):  # NaN fails too
            raise ValueError(f"{arch} cannot run with --model-impl transformers: the parity probe ({PROBE_TOKENS} "
                             f"tokens, float32) found layer {i}'s output through the paged attention routing "
                             f"differs from transformers' own attention by max abs difference {diff:.3g} (tolerance "
                             f"{RTOL:g} x max(1, |reference|))")
    return ProbeReport(count, PROBE_TOKENS, worst, time.perf_counter() - start)
