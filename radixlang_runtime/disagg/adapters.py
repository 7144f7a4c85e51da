"""PDAdapters (torch-free): which LoRA adapter a PD transfer's K/V was computed under, checked on both sides.

A request names its adapter by name on each server (`lora_path`), and each server numbers its adapters its own
way, so neither the name nor the id says which weights computed a K/V. The transfer carries the adapter's
content identity instead (mem/tiers/keys.adapter_identity: adapter_config.json and the weight files' hash; ""
for the base model): the decode puts its own in PDRegister, the prefill refuses a registration whose identity
differs from the one it prefilled under (PDFail naming the adapter, before any K/V is sent), and the decode
checks the prefill's in PDDone again before the request decodes. A request is never served under other
weights than the ones that computed its prefix.

On a decode server a request joins the running batch without passing the prefill admission, so the role
applies the admission's LoRA bounds itself before it registers (`ready`): at most max_loras_per_batch
distinct adapters among the running and receiving requests, and under --max-loaded-loras the adapter
resident (read again if evicted; one that cannot be read ends the request with 400 naming it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

IDENTITY_MAX = 128  # characters of an identity on the wire (a blake2b hex digest is far shorter)


@dataclass
class PDAdapters:
    name_of: Callable[[int], Optional[str]]  # adapter id -> its name here (None: not registered)
    identity_of: Callable[[int], Optional[str]]  # adapter id -> its content identity (None: files unreadable)
    max_per_batch: int = 8
    in_use: Callable[[], set[int]] = set  # the running requests' adapters
    residency: Optional[Callable[[int, set[int]], bool]] = None  # --max-loaded-loras: LoraRegistry.ensure
    _known: dict[int, str] = field(default_factory=dict)  # id -> identity (ids are never reused)

    def identity(self, lora_id: int) -> Optional[str]:
        """"" for the base; the adapter's content identity (computed once per id); None when unreadable."""
        if not lora_id:
            return ""
        if lora_id not in self._known:
            ident = self.identity_of(lora_id)
            if ident is None:
                return None
            self._known[lora_id] = ident
        return self._known[lora_id]

    def describe(self, lora_id: int) -> str:
        if not lora_id:
            return "the base model (no LoRA adapter)"
        return f"LoRA adapter {self.name_of(lora_id) or lora_id!r}"

    def mismatch(self, lora_id: int, theirs: str, peer_side: str) -> Optional[str]:
        """Why this request of adapter lora_id must not pair with a `peer_side` server ("prefill" / "decode")
        whose identity for it is `theirs`, or None when the identities agree."""
        mine = self.identity(lora_id)
        if mine is not None and mine == theirs:
            return None
        other = "the base model" if theirs == "" else f"adapter content {theirs[:16]}"
        here = ("files that cannot be read" if mine is None
                else "the base model" if mine == "" else f"adapter content {mine[:16]}")
        return (f"{self.describe(lora_id)} differs between the prefill and the decode server: this server has "
                f"{here}, the {peer_side} server {other} (load the same adapter files on both)")

    def ready(self, lora_id: int, receiving: set[int]) -> bool:
        """Whether a request of lora_id may start receiving now (max_loras_per_batch over the running and the
        receiving requests' adapters, then residency). ValueError: the adapter cannot be read again."""
        if not lora_id:
            return True
        busy = self.in_use() | receiving
        if lora_id in busy:
            return True
        if len(busy) >= self.max_per_batch:
            return False
        return True if self.residency is None else self.residency(lora_id, busy)
