"""A family's model built on the meta device, then given real storage for its checkpoint: the one way a model is
made before load_hf_state_dict fills it (the runner's first load, a weight update's twin).

On the meta device torch's module initializers (nn.Linear's kaiming_uniform_, nn.Embedding's normal_) compute
nothing, yet still run through torch's Python references, whose first call imports torch._dynamo on every start
(docs/PERFORMANCE.md, "Server start"). Their values never exist (the storage is fresh, the checkpoint fills every
parameter), so torch.nn.init's functions are skipped while the modules are built (a torch function mode: this
thread only).
Module.to_empty's empty_like on a meta tensor is such a reference too (its first call imports sympy through
torch's symbolic shapes); torch.empty_strided, a factory, is not, and keeps each tensor's layout.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode


class _SkipInit(TorchFunctionMode):
    """torch.nn.init's in-place initializers return their tensor untouched; every other function runs."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]  # handle_torch_function passes it by keyword
        return func(*args, **kwargs)


def build_on_meta(make: Callable[[], nn.Module], dtype: torch.dtype, device: torch.device) -> nn.Module:
    """make() on the meta device without initializers, cast to dtype there (no float32 copy to convert), then given
    uninitialized storage on `device` (what Module.to_empty gives)."""
    with torch.device("meta"), _SkipInit():
        model = make()
    return model.to(dtype)._apply(lambda t: torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device))
