"""The LoRA adapters a runner serves: every registered adapter (name, path, id) and which of them are resident
(their weights in the model's LoraLinears, model/lora_linear.LoraModel).

`--max-loaded-loras N` bounds the resident ones (None: no bound, every registered adapter stays resident).
When a request needs an adapter that is not resident, `ensure` makes room by evicting the least recently used
resident adapter that no running request uses (`busy`), then reads the adapter again from its path under the
same id (the radix keys carry the id, so its cached prefixes stay valid). An adapter whose files are gone is
evicted last (it could not come back); when reading an evicted adapter again fails, `ensure` raises
LoraReloadError naming the adapter and its path, and only the requests needing it fail (400).

With tensor parallelism rank 0's registry decides: after every change of its resident set (a run-time load, an
unload, an eviction, a reload) `on_change` broadcasts a LoraResident record, and the other ranks' registries
`mirror` it (each rank reads the adapter from its path and keeps its own part, model/layers/lora_tp.py), between
steps like every broadcast of rank 0.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from radixlang_runtime.lora_spec import LoraSpec, parse_lora_paths
from radixlang_runtime.model.loader.lora_adapter import LoraAdapter, load_adapter
from radixlang_runtime.model.layers.lora_linear import LoraModel

logger = logging.getLogger(__name__)


class LoraReloadError(ValueError):
    """An evicted adapter could not be read again from its path."""


@dataclass
class LoraCounts:
    loads: int = 0  # adapter reads (at start, run-time loads, reloads)
    evictions: int = 0  # resident adapters dropped to make room (the registry keeps them)
    reloads: int = 0  # evicted adapters read again for a request
    reload_failures: int = 0


@dataclass(frozen=True)
class LoraResident:
    """Rank 0 -> the other tensor-parallel ranks: the adapters to hold (every other one is dropped)."""

    specs: tuple[LoraSpec, ...]


class LoraRegistry:
    def __init__(self, model: LoraModel, num_layers: int, max_rank: Optional[int], dtype: torch.dtype,
                 device: torch.device, max_loaded: Optional[int] = None):
        self.model = model
        self.max_loaded = max_loaded
        self._read_args = (num_layers, max_rank or 1 << 30, dtype, device)
        self.specs: dict[int, LoraSpec] = {}  # every registered adapter by id
        self.lru: OrderedDict[int, None] = OrderedDict()  # resident ids, least recently used first
        self.counts = LoraCounts()
        self.next_id = 1  # ids are never reused: a reload under a name after an unload gets a new one
        self.on_change: Optional[Callable[[LoraResident], None]] = None  # rank 0 under TP: the broadcast

    def register_all(self, entries: Optional[list[str]]) -> None:
        """--lora-paths at start: each is read (checked) in order; past the cap the earliest ones give way."""
        for spec in parse_lora_paths(entries):
            self.register(spec.name, spec.path, busy=set())

    def register(self, name: str, path: str, busy: set[int]) -> int:
        """Read an adapter (every check of lora_adapter.load_adapter) and serve it under the next id; it is
        resident unless the cap is reached and every resident adapter is busy (then it is read again on its
        first request). Returns the id."""
        adapter = self._read(name, path, self.next_id)
        self.specs[adapter.lora_id] = LoraSpec(name, path, adapter.lora_id)
        self.next_id += 1
        if self._make_room(busy):
            self._keep(adapter)
        self._changed()
        logger.info("LoRA adapter %r (id %d): rank %d, alpha %g, targets %s%s", name, adapter.lora_id,
                    adapter.config.rank, adapter.config.alpha, ",".join(adapter.config.targets),
                    "" if adapter.lora_id in self.lru else " (not resident: --max-loaded-loras reached)")
        return adapter.lora_id

    def ensure(self, lora_id: int, busy: set[int]) -> bool:
        """Make lora_id resident; False when the cap is reached and every resident adapter is busy (the
        request waits). Raises LoraReloadError when the adapter cannot be read again."""
        if lora_id in self.lru:
            self.lru.move_to_end(lora_id)
            return True
        spec = self.specs.get(lora_id)
        if spec is None:
            raise LoraReloadError(f"LoRA adapter id {lora_id} is not registered")
        if not self._make_room(busy):
            return False
        try:
            adapter = self._read(spec.name, spec.path, lora_id)
        except (ValueError, OSError) as e:
            self.counts.reload_failures += 1
            raise LoraReloadError(f"LoRA adapter {spec.name!r} was evicted (--max-loaded-loras) and could not be "
                                  f"read again from {spec.path!r}: {e}") from e
        self.counts.reloads += 1
        self._keep(adapter)
        self._changed()
        logger.info("LoRA adapter %r (id %d) read again from %s", spec.name, lora_id, spec.path)
        return True

    def touch(self, lora_ids: list[int]) -> None:
        """A step ran these adapters: most recently used."""
        for lid in dict.fromkeys(lora_ids):
            if lid in self.lru:
                self.lru.move_to_end(lid)

    def drop(self, lora_id: int) -> None:
        """Unregister (unload_lora_adapter): weights and entry gone."""
        self.specs.pop(lora_id, None)
        if lora_id in self.lru:
            del self.lru[lora_id]
            self.model.unload(lora_id)
            self._changed()

    def mirror(self, msg: LoraResident) -> None:
        """Ranks > 0: hold exactly msg's adapters (rank 0's resident set), each read from its path."""
        want = {s.lora_id: s for s in msg.specs}
        for lid in [i for i in self.lru if i not in want]:
            del self.lru[lid]
            self.model.unload(lid)
        for lid, spec in want.items():
            self.specs[lid] = spec
            if lid not in self.lru:
                self._keep(self._read(spec.name, spec.path, lid))
        self.next_id = max(self.next_id, max(want, default=0) + 1)

    def __contains__(self, lora_id: int) -> bool:
        return lora_id in self.specs

    def stats(self) -> dict[str, Any]:
        return {"max_loaded_loras": self.max_loaded, "num_registered": len(self.specs),
                "num_resident": len(self.lru), "resident": [self.specs[i].name for i in self.lru],
                "loads": self.counts.loads, "evictions": self.counts.evictions, "reloads": self.counts.reloads,
                "reload_failures": self.counts.reload_failures}

    # ------------------------------------------------------------------ internals
    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(LoraResident(tuple(self.specs[i] for i in self.lru)))

    def _read(self, name: str, path: str, lora_id: int) -> LoraAdapter:
        adapter = load_adapter(name, path, lora_id, *self._read_args)
        self.counts.loads += 1
        return adapter

    def _keep(self, adapter: LoraAdapter) -> None:
        self.model.load(adapter)
        self.lru[adapter.lora_id] = None

    def _make_room(self, busy: set[int]) -> bool:
        """Below the cap, or one resident adapter evicted: the least recently used one that is not busy, among
        those whose files are still there first (an adapter whose files are gone is evicted only when no other
        is idle: its next request is then refused naming its path). False: every resident adapter is busy."""
        if self.max_loaded is None or len(self.lru) < self.max_loaded:
            return True
        idle = [lid for lid in self.lru if lid not in busy]
        if not idle:
            return False
        lid = next((i for i in idle if _readable(self.specs[i].path)), idle[0])
        del self.lru[lid]
        self.model.unload(lid)
        self.counts.evictions += 1
        logger.info("LoRA adapter %r (id %d) evicted (--max-loaded-loras %d)", self.specs[lid].name, lid,
                    self.max_loaded)
        return True


def _readable(path: str) -> bool:
    return all(os.access(os.path.join(path, f), os.R_OK)
               for f in ("adapter_config.json", "adapter_model.safetensors"))
