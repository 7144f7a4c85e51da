"""Checkpoint tensors read on demand from a directory of *.safetensors, whole or as a row / column range.

A tensor-parallel rank reads only its slices (safetensors maps the file; `get_slice` copies just the
requested range), so no rank ever holds a full copy of the weights it does not serve.
"""

from __future__ import annotations

import glob
import os
from typing import Any, Callable, Optional

import torch
from torch import nn

Range = Optional[tuple[int, int]]  # [start, stop) along one dimension; None: all of it


class SafetensorsDir:
    def __init__(self, path: str):
        from safetensors import safe_open

        self.path = path  # the checkpoint directory
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in {path}")
        self._handles: list[Any] = [safe_open(f, framework="pt") for f in files]
        self._where: dict[str, tuple[Any, str]] = {}  # name -> (its file's handle, its name in that file)
        for h in self._handles:
            for name in h.keys():
                self._where[name] = (h, name)
        # a bare decoder's checkpoint (transformers' LlamaModel / Qwen3Model, as sentence-transformers saves it)
        # names its tensors without the causal LM's "model." prefix: both spellings find them
        if not any(n.startswith("model.") for n in self._where):
            self._where.update({"model." + n: w for n, w in list(self._where.items()) if n != "lm_head.weight"})

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        """Every tensor's name."""
        return list(self._where)

    def get(self, name: str, rows: Range = None, cols: Range = None) -> torch.Tensor:
        """The tensor `name`, or its rows [a, b) (dim 0) and/or columns [a, b) (dim 1)."""
        where = self._where.get(name)
        if where is None:
            raise ValueError(f"checkpoint is missing {name}")
        h, name = where
        if rows is None and cols is None:
            return h.get_tensor(name)
        sl = h.get_slice(name)
        r = slice(*rows) if rows is not None else slice(None)
        if cols is None:
            return sl[r]
        return sl[r, slice(*cols)]


def param_setter(module: nn.Module) -> tuple[dict[str, torch.Tensor], set[str], Callable[[str, Any], None]]:
    """A loader's (own parameters, names set so far, put): put(name, value) copies a checkpoint tensor into the
    parameter of that name, refusing a shape that differs. value may be a list of tensors: their concatenation
    along dim 0 (a fused projection), each copied into its rows with no concatenated copy in between."""
    own = dict(module.named_parameters())
    done: set[str] = set()

    def put(name: str, value: torch.Tensor | list[torch.Tensor]) -> None:
        p = own[name]
        if isinstance(value, list):
            rows = sum(t.shape[0] for t in value)
            if any(p.shape != (rows, *t.shape[1:]) for t in value):
                raise ValueError(f"weight {name}: expected shape {tuple(p.shape)}, got the rows of "
                                 f"{[tuple(t.shape) for t in value]}")
            with torch.no_grad():
                start = 0
                for t in value:
                    p[start:start + t.shape[0]].copy_(t)
                    start += t.shape[0]
        elif p.shape != value.shape:
            raise ValueError(f"weight {name}: expected shape {tuple(p.shape)}, got {tuple(value.shape)}")
        else:
            with torch.no_grad():
                p.copy_(value)
        done.add(name)

    return own, done, put
