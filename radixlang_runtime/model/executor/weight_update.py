"""New weights for the served model without a restart (SGLang's update_weights_from_disk / _from_tensor).

A twin of the served model is built from the new tensors through the same load path the first load took (the
family's model class, its `load_hf_state_dict` with the q/k/v and gate/up fusing, then the same layout changes:
int8 quantization, oneDNN packing with or without dense tiles). Every tensor of the twin is then copied into the
served model's tensor of the same name, in place: CUDA graphs, the fused decode layer's pointers and the packed
linears keep their storage. Everything is read and checked before the first copy, so a refused update leaves the
old weights untouched:
- config.json must equal the served one in every field the model reads (torch_dtype aside: weights are cast);
- a checkpoint on disk must hold exactly the served checkpoint's tensor names, each of the same shape; tensors
  in process may be a bucket of them (the others keep their served values, read back: weight_read.py);
- layouts that are not a plain float load (a GGUF file, a pre-quantized checkpoint, tensor-parallel shards,
  the transformers implementation, LoRA-wrapped projections, a draft model) are refused by name.
The twin holds one more copy of the weights while the update runs.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Optional

import torch

from radixlang_runtime.model.loader.config import ModelConfig
from radixlang_runtime.model.loader.meta_build import build_on_meta
from radixlang_runtime.model.loader.weights import Range, SafetensorsDir
from radixlang_runtime.model.models import family_for

LOAD_FORMATS = (None, "auto", "safetensors")


class TensorSource:
    """In-memory (name, tensor) pairs read the way SafetensorsDir reads a checkpoint. With `rest` (a bucket of a
    larger update, as RL trainers send them): the served checkpoint's other names read through rest(name), the
    values the served model holds now, so a twin built from it differs from the served model only where given."""

    def __init__(self, named: Iterable[tuple[str, torch.Tensor]], rest: Optional[Callable[[str], torch.Tensor]] = None,
                 names: Iterable[str] = ()):
        self.tensors: dict[str, torch.Tensor] = {}
        for name, t in named:
            if not isinstance(name, str) or not isinstance(t, torch.Tensor):
                raise ValueError("named_tensors must be (name, torch.Tensor) pairs")
            self.tensors[name] = t.detach()
        self.given = list(self.tensors)
        self.rest = rest
        self.names = list(dict.fromkeys([*self.given, *names]))

    def __contains__(self, name: str) -> bool:
        return name in self.tensors or (self.rest is not None and name in self.names)

    def keys(self) -> list[str]:
        return list(self.names)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensors[name].shape)

    def get(self, name: str, rows: Range = None, cols: Range = None) -> torch.Tensor:
        t = self.tensors.get(name)
        if t is None and self.rest is not None and name in self.names:
            t = self.tensors[name] = self.rest(name).detach()  # read once: a fused parameter reads each part
        if t is None:
            raise ValueError(f"checkpoint is missing {name}")
        if rows is not None:
            t = t[rows[0]:rows[1]]
        return t if cols is None else t[:, cols[0]:cols[1]]


def _dir_shapes(tensors: SafetensorsDir) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape from the safetensors headers (nothing read)."""
    out = {}
    for name, (h, inner) in tensors._where.items():
        out[name] = tuple(h.get_slice(inner).get_shape())
    return out


def refusal(runner) -> Optional[str]:
    """Why the served model's weights cannot be replaced in place, or None."""
    cfg, args = runner.cfg, runner.args
    if runner.tp is not None and runner.tp.size > 1:
        return f"tensor-parallel shards (tp_size {runner.tp.size}) are not updated in place"
    if cfg.quant is not None:
        return f"a pre-quantized checkpoint ({cfg.quant.describe()}) is not updated in place"
    if args.quantization == "gguf":
        return "a GGUF-served model (its weights run as GGUF blocks) is not updated in place"
    if cfg.model_impl != "native":
        return f"the transformers implementation ({cfg.architecture}) is not updated in place"
    if runner.lora is not None:
        return "a model served with --enable-lora (LoRA-wrapped projections) is not updated in place"
    if runner.extra_kv is not None or runner.draft_model is not None:
        return "a model served with a draft model is not updated in place"
    return None


def check_config(runner, model_path: str) -> None:
    """model_path's config.json read as the served one was: any field that differs is refused by name."""
    if not os.path.isfile(os.path.join(model_path, "config.json")):
        raise ValueError(f"{model_path} has no config.json")
    new = ModelConfig.from_dir(model_path, runner.args.model_impl, runner.args.trust_remote_code)
    old = ModelConfig.from_dir(runner.model_dir, runner.args.model_impl, runner.args.trust_remote_code)
    differ = [f for f in old.__dataclass_fields__ if f != "torch_dtype" and getattr(old, f) != getattr(new, f)]
    if differ:
        shown = ", ".join(f"{f} ({getattr(old, f)!r} served, {getattr(new, f)!r} given)" for f in differ[:4])
        raise ValueError(f"the checkpoint's config differs from the served model's: {shown}")


def check_names(served: dict[str, tuple[int, ...]], given: dict[str, tuple[int, ...]]) -> None:
    """Exactly the served checkpoint's tensors, each of its shape; refusals name the first few."""
    if missing := sorted(set(served) - set(given)):
        raise ValueError(f"the checkpoint is missing {len(missing)} tensor(s): {', '.join(missing[:5])}")
    if extra := sorted(set(given) - set(served)):
        raise ValueError(f"the checkpoint has {len(extra)} tensor(s) the served model does not: "
                         f"{', '.join(extra[:5])}")
    if bad := [n for n in sorted(served) if served[n] != given[n]]:
        raise ValueError("tensor shape differs from the served model's: " + ", ".join(
            f"{n} {list(given[n])} (served {list(served[n])})" for n in bad[:5]))


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor the model's modules hold: parameters, buffers and plain tensor attributes (a packed linear's
    oneDNN weight and dense tiles), by dotted name."""
    out: dict[str, torch.Tensor] = {}
    for prefix, mod in model.named_modules():
        at = f"{prefix}." if prefix else ""
        for group in (mod._parameters, mod._buffers, vars(mod)):
            for k, v in group.items():
                if isinstance(v, torch.Tensor) and not k.startswith("_"):
                    out.setdefault(at + k, v)
    return out


def build_twin(runner, source: Any) -> torch.nn.Module:
    """A model of the served class loaded from `source` through the first load's steps and layout changes."""
    from radixlang_runtime.model.layers.packed_linear import PackedLinear

    served, cfg = runner.model, runner.cfg
    model_cls = family_for(cfg.architecture, cfg.model_impl).model_class
    # the served backend and rotary: neither holds a module tensor
    twin = build_on_meta(lambda: model_cls(cfg, runner.backend, served.rotary, runner.shard,
                                           runner.tp.all_reduce if runner.tp else None), runner.dtype, runner.device)
    twin.load_hf_state_dict(source)
    head = getattr(served, "head", None)
    if runner.args.quantization == "int8":
        twin.quantize_int8()
    elif isinstance(head, PackedLinear):
        twin.pack_for_cpu(head.tiles is not None)
    return twin.eval()


def copy_into(served: torch.nn.Module, twin: torch.nn.Module) -> int:
    """Check every twin tensor has a served one of its name, shape, dtype and layout, then copy them all;
    returns how many tensors were copied."""
    old, new = model_tensors(served), model_tensors(twin)
    pairs = []
    for name, t in new.items():
        o = old.get(name)
        if o is None or o.shape != t.shape or o.dtype != t.dtype or o.layout != t.layout:
            raise ValueError(f"the served model's layout differs from a fresh load at {name}")
        if o is not t:
            pairs.append((o, t))
    with torch.no_grad():
        for o, t in pairs:
            o.copy_(t)
    return len(pairs)


def _served_shapes(runner) -> dict[str, tuple[int, ...]]:
    return _dir_shapes(SafetensorsDir(runner.model_dir))


def _apply(runner, source: Any, given: dict[str, tuple[int, ...]]) -> int:
    if why := refusal(runner):
        raise ValueError(why)
    check_names(_served_shapes(runner), given)
    twin = build_twin(runner, source)
    try:
        return copy_into(runner.model, twin)
    finally:
        del twin


def update_from_disk(runner, model_path: str, load_format: Optional[str] = None) -> int:
    """Replace the served weights with model_path's (a directory of *.safetensors and its config.json); returns
    how many tensors were copied. ValueError / OSError: refused, the old weights untouched."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format {load_format!r} is not supported (auto or safetensors)")
    if why := refusal(runner):
        raise ValueError(why)
    if not os.path.isdir(model_path):
        raise ValueError(f"model_path {model_path!r} is not a directory")
    check_config(runner, model_path)
    tensors = SafetensorsDir(model_path)
    n = _apply(runner, tensors, _dir_shapes(tensors))
    runner.model_dir = model_path  # the served checkpoint from now on (what the next update is checked against)
    return n


def update_from_tensors(runner, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Replace the served weights named in named_tensors (checkpoint names: all of them, or a bucket of them as
    RL trainers send one after another; the others keep the values served now, read back with read_weight);
    returns how many model tensors were copied."""
    from radixlang_runtime.model.executor.weight_read import read_weight

    if why := refusal(runner):
        raise ValueError(why)
    served = _served_shapes(runner)
    source = TensorSource(named_tensors, lambda name: read_weight(runner, name), served)
    given = {n: source.shape(n) for n in source.given}
    if not given:
        raise ValueError("named_tensors is empty")
    check_names({n: s for n, s in served.items() if n in given}, given)  # known names, the served shapes
    twin = build_twin(runner, source)
    try:
        return copy_into(runner.model, twin)
    finally:
        del twin
