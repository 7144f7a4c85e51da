"""Keys of KV page records (torch-free).

A record holds the K/V of `record_tokens` consecutive tokens (all layers) at a record-aligned position
of a token sequence. Its key is a hash chain: key(0) = the fingerprint's digest, key(i + 1) =
H(key(i) || ids of record i). So a key names the record's tokens *and* everything before them (KV
depends on the whole prefix), and the fingerprint (model weights, dtype, page and record sizes, KV
shape, TP rank, adapter) keeps one model from ever reading another's KV. Under a LoRA adapter the fingerprint's
`adapter` is the adapter's content hash (adapter_identity), so a prefix computed under one adapter is never
served to another, nor to the base, also across restarts that number the adapters differently; a request's
cache_salt puts the salt's digest in `salt`, so its records are only ever read under the same salt. The model part
is a content hash of the weight files (weights_digest.py) with config.json's bytes: equal names and sizes are
not enough.
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from dataclasses import asdict, dataclass
from typing import Optional

from radixlang_runtime.mem.tiers.weights_digest import weights_digest

FORMAT_VERSION = 2  # of the record layout (record.py) and of this chain; part of every fingerprint
KEY_BYTES = 16


@dataclass(frozen=True)
class KVFingerprint:
    model: str  # model_identity(model_dir): config + the weights' content hash, not the path
    dtype: str
    page_size: int
    record_tokens: int
    num_layers: int
    kv_heads: int  # of this TP rank
    head_dim: int
    tp_rank: int = 0
    tp_size: int = 1
    quantization: str = ""
    adapter: str = ""  # a LoRA adapter's identity (its content hash) when one is applied to the K/V
    salt: str = ""  # a cache_salt's digest (mem/cache_namespace.salt_hex) when the records are that salt's

    def digest(self) -> bytes:
        fields = asdict(self)
        if not self.salt:  # unsalted records keep the keys they had before salts existed
            del fields["salt"]
        text = json.dumps({**fields, "format": FORMAT_VERSION}, sort_keys=True)
        return hashlib.blake2b(text.encode(), digest_size=KEY_BYTES).digest()

    def record_bytes(self, itemsize: int) -> int:
        """Payload bytes of one record: [2 (K, V), layers, kv_heads, record_tokens, head_dim]."""
        return 2 * self.num_layers * self.kv_heads * self.record_tokens * self.head_dim * itemsize


def chain_keys(root: bytes, ids: list[int], record_tokens: int) -> list[bytes]:
    """Keys of the whole records of ids (len(ids) // record_tokens of them), record 0 first."""
    keys, key = [], root
    for start in range(0, len(ids) // record_tokens * record_tokens, record_tokens):
        key = hashlib.blake2b(key + array("q", ids[start:start + record_tokens]).tobytes(),
                              digest_size=KEY_BYTES).digest()
        keys.append(key)
    return keys


def model_identity(model_dir: str, digest_dir: Optional[str] = None) -> str:
    """What the model's KV depends on, independent of where it is stored: config.json's bytes and the
    weight files' content hash (weights_digest.py; digest_dir: where sidecars go when model_dir is not
    writable). A replica on another node with the same files agrees."""
    h = hashlib.blake2b(digest_size=KEY_BYTES)
    cfg = os.path.join(model_dir, "config.json")
    if os.path.isfile(cfg):
        with open(cfg, "rb") as f:
            h.update(f.read())
    h.update(b"\0weights:" + weights_digest(model_dir, digest_dir).encode())
    return h.hexdigest()


def adapter_identity(adapter_dir: str, digest_dir: Optional[str] = None) -> str:
    """A peft adapter directory's identity: adapter_config.json's bytes and its weight files' content hash."""
    h = hashlib.blake2b(digest_size=KEY_BYTES)
    with open(os.path.join(adapter_dir, "adapter_config.json"), "rb") as f:
        h.update(f.read())
    h.update(b"\0weights:" + weights_digest(adapter_dir, digest_dir).encode())
    return h.hexdigest()


def state_key(record_key: bytes) -> bytes:
    """The key of a hybrid model's state snapshot at the end of the record keyed record_key (mem/hicache.py)."""
    return hashlib.blake2b(b"state:" + record_key, digest_size=KEY_BYTES).digest()
