"""get_weights_by_name: a served parameter's values by its checkpoint name (SGLang's route), as the model holds them.

The checkpoint name maps as the Llama-family loader maps it (`load_hf_state_dict`): "model." dropped, q/k/v_proj
read as their rows of the fused qkv_proj, gate/up_proj as their half of gate_up_proj, lm_head as the output head.
A linear kept in another layout (oneDNN-packed, dense tiles, int8) is read back through the layer itself: its
output on the identity matrix is the weight it computes with (W^T, bias subtracted), exact since every product is
by 1 or 0. The answer is SGLang's: the first truncate_size entries along dim 0 (a matrix's rows). Anything else
(tensor-parallel shards, GGUF blocks, other families' layouts) is refused by name.
"""

from __future__ import annotations

from typing import Optional

import torch

from radixlang_runtime.model.executor.weight_update import refusal

_FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def _resolve(model: torch.nn.Module, path: str) -> Optional[object]:
    obj: object = model
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _linear_weight(mod: torch.nn.Module, kind: str) -> torch.Tensor:
    """The [out, in] weight (kind "weight") or bias a linear-like module computes with."""
    direct = getattr(mod, kind, None)
    if isinstance(direct, torch.Tensor) and (kind == "bias" or direct.dim() == 2):
        return direct
    n_in = getattr(mod, "in_features", None)
    if n_in is None:
        raise ValueError(f"{type(mod).__name__} holds no {kind} to read")
    bias = getattr(mod, "bias", None)
    if kind == "bias":
        raise ValueError(f"{type(mod).__name__} has no bias")
    dtype = bias.dtype if isinstance(bias, torch.Tensor) else next(
        (t.dtype for t in (getattr(mod, "weight", None),) if isinstance(t, torch.Tensor)), None)
    dtype = dtype or (torch.float32 if getattr(mod, "packed", None) is None else mod.packed.dtype)
    device = bias.device if isinstance(bias, torch.Tensor) else next(
        (t.device for t in vars(mod).values() if isinstance(t, torch.Tensor)), torch.device("cpu"))
    with torch.no_grad():
        out = mod(torch.eye(n_in, dtype=dtype, device=device))  # [in, out] = W^T (+ bias)
        if isinstance(bias, torch.Tensor):
            out = out - bias
    return out.t()


def read_weight(runner, name: str) -> torch.Tensor:
    """The served values of checkpoint tensor `name` (ValueError naming it when there is no such tensor or
    its layout cannot be read)."""
    why = refusal(runner)
    if why is not None and (runner.tp is not None and runner.tp.size > 1 or runner.args.quantization == "gguf"):
        raise ValueError(f"get_weights_by_name: {why}")
    model, cfg = runner.model, runner.cfg
    path = name.removeprefix("model.")
    if path == "lm_head.weight":
        head = getattr(model, "head", None) or getattr(model, "lm_head", None)
        if head is None:  # tied: the embedding is the head
            return model.embed_tokens.weight
        return _linear_weight(head, "weight")
    parent, _, kind = path.rpartition(".")
    owner, _, leaf = parent.rpartition(".")
    part = None
    if leaf in _FUSED:
        fused, part = _FUSED[leaf]
        parent = f"{owner}.{fused}"
    mod = _resolve(model, parent)
    if isinstance(mod, torch.nn.Module) and not isinstance(getattr(mod, kind, None), torch.nn.Module):
        t = mod._parameters.get(kind) if kind in mod._parameters else None
        t = t if t is not None else _linear_weight(mod, kind)
    else:
        raise ValueError(f"get_weights_by_name: the served model has no parameter {name!r}")
    if part is None:
        return t
    d, sh = cfg.head_dim, runner.shard
    if leaf in ("q_proj", "k_proj", "v_proj"):
        sizes = [sh.q_count * d, sh.kv_count * d, sh.kv_count * d]
    else:
        sizes = [t.shape[0] // 2] * 2
    start = sum(sizes[:part])
    return t[start:start + sizes[part]]


def weights_by_name(runner, name: str, truncate_size: int = 100) -> list:
    """SGLang's answer: the tensor's first truncate_size entries along dim 0 as float lists (a 1-D tensor's
    values; a matrix's rows, each a list)."""
    t = read_weight(runner, name)
    return t.detach()[:max(0, int(truncate_size))].float().cpu().tolist()
