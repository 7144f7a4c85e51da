"""The prefix cache's namespaces (torch-free): which requests may share cached K/V.

A request's radix keys are its token ids moved into its namespace's range: id + namespace_offset(lora_id,
salt_key). The LoRA adapter's id sits at NAMESPACE_SHIFT (above any vocabulary id), the request's
`cache_salt` (vLLM's field, SGLang's `extra_key`) as a 128-bit digest at SALT_SHIFT (above any adapter id).
So two requests share a node only when they run the same adapter with the same salt (or both without one);
the unsalted base model keeps the plain token ids. Keys are Python ints: the tree never turns them into
tensors. Whoever keys K/V outside the tree (the hicache tiers' record keys, the placement trees) reads the
namespace back with split_namespace and the token ids with TOKEN_MASK.
"""

from __future__ import annotations

import hashlib
from typing import Optional

NAMESPACE_SHIFT = 40  # the adapter id's bit (token ids are below 2**40)
SALT_SHIFT = 64  # the salt digest's bit (adapter ids are below 2**24)
TOKEN_MASK = (1 << NAMESPACE_SHIFT) - 1
LORA_MASK = (1 << (SALT_SHIFT - NAMESPACE_SHIFT)) - 1
SALT_BYTES = 16
_SALT_SET = 1 << (8 * SALT_BYTES)  # set in every salt key, so no salt's key is 0 (the unsalted namespace)


def salt_key(salt: Optional[str]) -> int:
    """A cache_salt's namespace number: 0 for None; else its blake2b digest (with a marker bit)."""
    if salt is None:
        return 0
    digest = hashlib.blake2b(salt.encode("utf-8"), digest_size=SALT_BYTES, person=b"radixlang-salt").digest()
    return int.from_bytes(digest, "big") | _SALT_SET


def namespace_offset(lora_id: int, salt: int) -> int:
    """What a request's token ids are moved by in the tree (salt: salt_key's value)."""
    return (lora_id << NAMESPACE_SHIFT) | (salt << SALT_SHIFT)


def namespaced(ids: list[int], lora_id: int = 0, salt: int = 0) -> list[int]:
    """ids as keys of the namespace (the ids themselves for the unsalted base)."""
    off = namespace_offset(lora_id, salt)
    return ids if not off else [t + off for t in ids]


def split_namespace(key: int) -> tuple[int, int]:
    """A key's (lora_id, salt key)."""
    return (key >> NAMESPACE_SHIFT) & LORA_MASK, key >> SALT_SHIFT


def salt_hex(salt: int) -> str:
    """A salt key as the tiers' fingerprints name it ("" for none): the digest, never the salt itself."""
    return "" if not salt else f"{salt ^ _SALT_SET:0{2 * SALT_BYTES}x}"
